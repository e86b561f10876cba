#!/usr/bin/env bash
# launch_rdzv.sh - N agents (default 64), each on its own loopback address
# 127.0.0.2.., rendezvous through the first one's store, each with one worker
# (`date +%s%N`, which prints when it started). Reports the time from the first
# agent's launch to the last worker's start, and the total until all agents exited.
set -euo pipefail
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-$PWD/dtrun}
N=${N:-64}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
t0=$(date +%s%N)
pids=()
for ((i = 0; i < N; i++)); do
  timeout -k 2 60 "$DTRUN" --nnodes "$N" --nproc_per_node 1 --rdzv_endpoint "127.0.0.2:$port" \
    --local_addr "127.0.0.$((i + 2))" --rdzv_conf join_timeout=30 --exec date +%s%N \
    >"$dir/$i.out" 2>"$dir/$i.err" &
  pids+=($!)
done
launched=$(date +%s%N)
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
t1=$(date +%s%N)
[ $bad -eq 0 ] || { echo "$bad agent(s) failed:"; cat "$dir"/*.err | grep -v WARN | head; exit 1; }
last=$(cat "$dir"/*.out | sed 's/.*]://' | sort -n | tail -1)
n=$(cat "$dir"/*.out | wc -l)
echo "rendezvous of $N agents on loopback: $n workers; all started $(( (last - t0) / 1000000 )) ms after the first launch" \
     "(launching the $N agents took $(( (launched - t0) / 1000000 )) ms); all agents exited after $(( (t1 - t0) / 1000000 )) ms"
