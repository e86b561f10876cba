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
# The machine may be shared, so dtrun and torch-v4fd are measured in alternating
# rounds (ROUNDS, default 5) and each row is the median over the rounds; the CPU
# time each server process used over all its rounds is printed as well. The plain
# torch server is measured once (its stalls make rounds slow).
# Needs torch. Usage: [ROUNDS=N] scripts/bench/store_vs_torch.sh [--conns 64,1024,4096]
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
ulimit -Hn 65536 2>/dev/null || true  # root may raise it: 16384 clients take 2 fds each in the driver
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

# Over 2048 clients the driver connects from several loopback addresses (127.0.0.1,
# .2, ...: at most half of our store's per-peer cap from each, as clients on several
# hosts would be). torch looks a name up for every peer, and 127.0.0.2 is not in
# /etc/hosts, so each would go to DNS; as root, torch-v4fd runs in a private mount
# namespace whose /etc/hosts names them all (torch at its best, again).
{ cat /etc/hosts; for i in $(seq 2 16); do echo "127.0.0.$i store-bench-$i"; done; } \
  >"$TMP/hosts"
v4fd_run=(python3)
if unshare -m sh -c 'mount --bind "$0" /etc/hosts' "$TMP/hosts" 2>/dev/null; then
  v4fd_run=(unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec python3 "$@"' "$TMP/hosts")
else
  echo "store_vs_torch: no mount namespace (not root?): torch-v4fd rows over 2048" \
    "clients include its DNS lookups of 127.0.0.2, ..." >&2
fi

start_torch() { # $1: plain | v4fd
  local run=(python3)
  [ "$1" = v4fd ] && run=("${v4fd_run[@]}")
  "${run[@]}" - "$1" <<'EOF' &
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

ROUNDS=${ROUNDS:-5}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# bench NAME PID PORT: one round against that server, rows appended to NAME.all.
bench() {
  local a b
  a=$(cpu_ticks "$2")
  "$DTRUN" bench store --reps 1 --timeout 20 --connect "127.0.0.1:$3" "${ARGS[@]}" \
    >"$TMP/$1.last"
  b=$(cpu_ticks "$2")
  echo $((b - a)) >>"$TMP/$1.cpu"
  awk '($1=="barrier"||$1=="setget") && $2~/^[0-9]+$/ {print $1"/"$2, $3}' "$TMP/$1.last" \
    >>"$TMP/$1.all"
}
# median NAME: "test/conns median" per row ("timeout" if any round timed out).
median() {
  sort -k1,1 -k2g "$TMP/$1.all" | awk '
    { k = $1; if (!(k in n)) order[++m] = k; v[k, ++n[k]] = $2; if ($2 == "timeout") to[k] = 1 }
    END { for (i = 1; i <= m; i++) { k = order[i];
            print k, (k in to) ? "timeout" : v[k, int((n[k] + 1) / 2)] } }' | sort
}

"$DTRUN" store --host 127.0.0.1 --port 0 >"$TMP/dtrun.out" 2>"$TMP/dtrun.err" &
dtrun_pid=$!
pids+=($dtrun_pid)
dtrun_port=$(first_port "$TMP/dtrun.out")
start_torch v4fd >"$TMP/torch-v4fd.out" 2>"$TMP/torch-v4fd.err"
v4_pid=$!
pids+=($v4_pid)
v4_port=$(first_port "$TMP/torch-v4fd.out")
start_torch plain >"$TMP/torch.out" 2>"$TMP/torch.err"
plain_pid=$!
pids+=($plain_pid)
plain_port=$(first_port "$TMP/torch.out")

echo "driver: dtrun bench store ${ARGS[*]} (one round = --reps 1), $ROUNDS alternating rounds"
for r in $(seq 1 "$ROUNDS"); do
  bench dtrun "$dtrun_pid" "$dtrun_port"
  bench torch-v4fd "$v4_pid" "$v4_port"
  echo "round $r done"
done
# Its stalls may fail a row (no reply within 1 s): that row is printed as "-".
bench torch "$plain_pid" "$plain_port" ||
  echo "torch (plain): the round stopped early; rows it did not reach are '-'"

for n in dtrun torch-v4fd torch; do median "$n" >"$TMP/$n.med"; done
sum() { awk '{s += $1} END {printf "%.2f", s / 100}' "$1"; }
echo
echo "server CPU seconds (user+sys) over all rounds: dtrun $(sum "$TMP/dtrun.cpu"), " \
  "torch-v4fd $(sum "$TMP/torch-v4fd.cpu") ($ROUNDS rounds each)"
echo
ratio() { # dtrun value, torch value, test -> "N.NNx" (>1: dtrun faster)
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {
    if (a == "-" || b == "-") print "-";
    else if (a == "timeout") print "dtrun t/o";
    else if (b == "timeout") print "torch t/o";
    else printf "%.2fx\n", (t == "barrier") ? b / a : a / b }'
}
echo "medians (barrier: seconds until all released; setget: round trips/s; ratio >1 = dtrun faster)"
printf '%-8s %6s %12s %12s %12s %10s %10s\n' test conns dtrun torch-v4fd torch \
  "vs v4fd" "vs torch"
join -j1 -a1 -e - -o auto "$TMP/dtrun.med" "$TMP/torch-v4fd.med" |
  join -j1 -a1 -e - -o auto - "$TMP/torch.med" |
  sort -t/ -k1,1r -k2n |
  while read -r key d v p; do
    t=${key%/*}; n=${key#*/}
    printf '%-8s %6s %12s %12s %12s %10s %10s\n' "$t" "$n" "$d" "$v" "$p" \
      "$(ratio "$d" "$v" "$t")" "$(ratio "$d" "$p" "$t")"
  done
