#!/usr/bin/env bash
# store_vs_torch.sh - the same load driver (`dtrun bench store --connect`) against
# our store server (`dtrun store`, its own process) and against torch's libuv
# TCPStore server (a python process), then the tables and the ratios.
#
# torch is run twice:
#   torch       TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
#               wait_for_workers=False): torch's libuv server listens on "::", so
#               clients show up as ::ffff:127.0.0.1, and it looks up a host name for
#               every accepted peer on its event loop; where that reverse lookup goes
#               to an unreachable DNS server (as in our sandbox) the loop stalls for
#               the resolver timeout (5 s).
#   torch-v4fd  the same server given an IPv4 socket already listening on 127.0.0.1
#               (master_listen_fd=...): peers are 127.0.0.1, found in /etc/hosts, no
#               stall. This is torch at its best and the fair comparison.
# Needs torch. Usage: scripts/bench/store_vs_torch.sh [--conns 64,1024,4096] [--reps N]
set -euo pipefail
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-./dtrun}
ARGS=("$@")
TMP=$(mktemp -d /tmp/dtrun-store-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Reads the port from the "... HOST:PORT" first line a background server prints.
first_port() {
  local f=$1 line=""
  for _ in $(seq 1 400); do
    line=$(head -n1 "$f" 2>/dev/null || true)
    [ -n "$line" ] && break
    sleep 0.05
  done
  [ -n "$line" ] || { echo "store_vs_torch: server did not start ($f)" >&2; exit 1; }
  echo "${line##*:}"
}

start_torch() { # $1: plain | v4fd
  python3 - "$1" <<'EOF' &
import datetime, signal, socket, sys, time
import torch.distributed as dist
kw = dict(is_master=True, use_libuv=True, wait_for_workers=False,
          timeout=datetime.timedelta(seconds=120))
if sys.argv[1] == "v4fd":
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.bind(("127.0.0.1", 0))
    ls.listen(4096)
    s = dist.TCPStore("127.0.0.1", ls.getsockname()[1], master_listen_fd=ls.fileno(), **kw)
else:
    s = dist.TCPStore("127.0.0.1", 0, **kw)
print(f"torch store listening on 127.0.0.1:{s.port}", flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(3600)
EOF
}

bench() { # $1 name, $2 port
  echo "== $1 (127.0.0.1:$2)"
  "$DTRUN" bench store --timeout 20 --connect "127.0.0.1:$2" "${ARGS[@]}" | tee "$TMP/$1.tab"
  echo
}

"$DTRUN" store --host 127.0.0.1 --port 0 >"$TMP/dtrun.out" 2>"$TMP/dtrun.err" &
pids+=($!)
bench dtrun "$(first_port "$TMP/dtrun.out")"

start_torch v4fd >"$TMP/torch-v4fd.out" 2>"$TMP/torch-v4fd.err"
pids+=($!)
bench torch-v4fd "$(first_port "$TMP/torch-v4fd.out")"

start_torch plain >"$TMP/torch.out" 2>"$TMP/torch.err"
pids+=($!)
bench torch "$(first_port "$TMP/torch.out")"

rows() { awk '($1=="barrier"||$1=="setget") && $2~/^[0-9]+$/ {print $1"/"$2, $3}' "$1" | sort; }
ratio() { # dtrun value, torch value, test -> "N.NNx" (>1: dtrun faster)
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {
    if (a == "timeout") print "dtrun t/o";
    else if (b == "timeout") print "torch t/o";
    else printf "%.2fx\n", (t == "barrier") ? b / a : a / b }'
}
echo "== ratios (>1 = dtrun faster; barrier in seconds, setget in round trips/s)"
printf '%-8s %6s %12s %12s %12s %10s %10s\n' test conns dtrun torch-v4fd torch \
  "vs v4fd" "vs torch"
join -j1 <(rows "$TMP/dtrun.tab") <(rows "$TMP/torch-v4fd.tab") |
  join -j1 - <(rows "$TMP/torch.tab") | sort -t/ -k1,1r -k2n |
  while read -r key d v p; do
    t=${key%/*}; n=${key#*/}
    printf '%-8s %6s %12s %12s %12s %10s %10s\n' "$t" "$n" "$d" "$v" "$p" \
      "$(ratio "$d" "$v" "$t")" "$(ratio "$d" "$p" "$t")"
  done
