#!/usr/bin/env bash
# store_vs_torch.sh - the same load driver (`dtrun bench store --connect`) against
# our store server (`dtrun store`, its own process) and against torch's libuv
# TCPStore server (a python process), then both tables and the ratios.
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

# Reads "... HOST:PORT" from the first line a background command prints.
first_port() {
  local f=$1 line=""
  for _ in $(seq 1 200); do
    line=$(head -n1 "$f" 2>/dev/null || true)
    [ -n "$line" ] && break
    sleep 0.05
  done
  [ -n "$line" ] || { echo "store_vs_torch: server did not start" >&2; exit 1; }
  echo "${line##*:}"
}

# ours
"$DTRUN" store --host 127.0.0.1 --port 0 >"$TMP/ours.out" 2>"$TMP/ours.err" &
pids+=($!)
ours_port=$(first_port "$TMP/ours.out")

# torch's libuv server
python3 - >"$TMP/torch.out" 2>"$TMP/torch.err" <<'EOF' &
import datetime, signal, sys, time
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=120))
print(f"torch store listening on 127.0.0.1:{s.port}", flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(3600)
EOF
pids+=($!)
torch_port=$(first_port "$TMP/torch.out")

echo "== dtrun store (127.0.0.1:$ours_port)"
"$DTRUN" bench store --timeout 20 --connect "127.0.0.1:$ours_port" "${ARGS[@]}" | tee "$TMP/ours.tab"
echo
echo "== torch TCPStore, libuv backend (127.0.0.1:$torch_port)"
"$DTRUN" bench store --timeout 20 --connect "127.0.0.1:$torch_port" "${ARGS[@]}" | tee "$TMP/torch.tab"
echo
echo "== ratio (torch / dtrun for barrier times, dtrun / torch for round trips; >1 = dtrun faster)"
printf '%-8s %6s %12s %12s %8s\n' test conns dtrun torch ratio
join -j1 \
  <(awk '$1=="barrier"||$1=="setget"{print $1"/"$2, $3}' "$TMP/ours.tab" | sort) \
  <(awk '$1=="barrier"||$1=="setget"{print $1"/"$2, $3}' "$TMP/torch.tab" | sort) |
  sort -t/ -k1,1 -k2n |
  awk '{ split($1, k, "/");
         if ($2 == "timeout" || $3 == "timeout") r = ($3 == "timeout") ? "torch timed out" : "dtrun timed out";
         else r = sprintf("%.2fx", (k[1] == "barrier") ? $3 / $2 : $2 / $3);
         printf "%-8s %6s %12s %12s %8s\n", k[1], k[2], $2, $3, r }'
