#!/usr/bin/env bash
# test_launch_multi.sh - several agents on one machine, each on its own loopback
# address (127.0.0.2, 127.0.0.3, ...), rendezvousing through node 0's store:
# environments of 2x2 and 3x1, assigned and fixed node ranks, failure propagation,
# a node killed mid-run, the store's node killed, a node that never arrives, a bad
# endpoint, duplicate and out-of-range node ranks, restarts and the exit barrier.
. "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
# Multi-node runs need the store (branch store); until it is merged, say so.
[ -f "$HERE/../../rendezvous/store_server.c" ] || { skip "$(basename "$0" .sh)" "the store (rendezvous/store_server.c) is not built in this tree yet"; finish; }
T="timeout -k 2 40"
cd "$DT_TMP"
FAST="--rdzv_conf join_timeout=20,heartbeat_interval=0.2 --monitor_interval 0.05"

# agents NNODES NPROC "FLAGS" PROGRAM...: starts NNODES agents in the background on
# 127.0.0.2.. with the endpoint on 127.0.0.2 and waits for them; agent i writes
# $DT_TMP/a$i.out / .err and its exit code to $DT_TMP/a$i.rc.
agents() {
  local nn=$1 np=$2 extra=$3; shift 3
  local port; port=$(free_port)
  local pids=()
  for ((i = nn - 1; i >= 0; i--)); do  # the others first: they wait for node 0
    ( $T "$DTRUN" --nnodes $nn --nproc_per_node $np --rdzv_endpoint 127.0.0.2:$port \
        --local_addr 127.0.0.$((i + 2)) $FAST $(eval echo "$extra") --exec "$@" \
        >"$DT_TMP/a$i.out" 2>"$DT_TMP/a$i.err"; echo $? >"$DT_TMP/a$i.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
}
rcs() { local s=""; for ((i = 0; i < $1; i++)); do s="$s$(cat "$DT_TMP/a$i.rc")"; done; echo "$s"; }

for shape in "2 2" "3 1"; do
  set -- $shape
  agents $1 $2 "" env
  if [ "$(rcs $1)" = "$(printf '0%.0s' $(seq $1))" ] && cat "$DT_TMP"/a*.out | python3 "$HERE/launch_check_env.py" $1 $2 $([ $2 -gt 1 ] && echo 1 || echo unset); then
    pass "env ${1}x$2 (assigned node ranks)"; else fail "env ${1}x$2" "rc=$(rcs $1) $(cat "$DT_TMP"/a*.err | tail -5)"; fi
  rm -f "$DT_TMP"/a*
done
# fixed node ranks, given in reverse of the addresses
agents 3 1 '--node_rank $((2 - i))' env
if [ "$(rcs 3)" = 000 ] && grep -q '^\[127.0.0.4 rank0\]:GROUP_RANK=0$' "$DT_TMP/a2.out" && grep -q '^\[127.0.0.2 rank2\]:GROUP_RANK=2$' "$DT_TMP/a0.out" \
   && cat "$DT_TMP"/a*.out | python3 "$HERE/launch_check_env.py" 3 1 unset; then pass "env 3x1 (fixed node ranks)"; else fail "fixed node ranks" "$(rcs 3)"; fi

# Time bounds in this file tell "at once" from waiting out the workers' 30 s sleep
# (or a 30 s watchdog), with room for a loaded one-core machine; they were a
# third to a half of these.
# a worker failing on node 1 stops node 0's workers too; both summarise, exit 1
s=$(date +%s%N)
agents 2 1 "" sh -c 'if [ $GROUP_RANK = 1 ]; then echo "bad input on node one" >&2; exit 7; fi; exec sleep 30'
ms=$(( ($(date +%s%N) - s) / 1000000 ))
if [ "$(rcs 2)" = 11 ] && [ $ms -lt 20000 ] && grep -q '  rank      : 1 (local_rank: 0)' "$DT_TMP/a0.err" \
   && grep -q '  host      : 127.0.0.3' "$DT_TMP/a0.err" && grep -q '  exitcode  : 7' "$DT_TMP/a0.err" \
   && grep -q 'bad input on node one' "$DT_TMP/a0.err"; then pass "failure on node 1 stops the group, summary on node 0 (${ms} ms)"
else fail "failure propagation" "rc=$(rcs 2) ms=$ms $(tail -5 "$DT_TMP/a0.err")"; fi

# restart across nodes: node 1's worker fails in round 0 only
agents 2 1 "--max_restarts 1" sh -c 'echo round=$TORCHELASTIC_RESTART_COUNT; [ $GROUP_RANK = 0 ] || [ $TORCHELASTIC_RESTART_COUNT = 1 ]'
if [ "$(rcs 2)" = 00 ] && grep -q 'rank0\]:round=1' "$DT_TMP/a0.out" && grep -q 'rank1\]:round=1' "$DT_TMP/a1.out"; then
  pass "restart on every node, round 1 succeeds"; else fail "multi-node restart" "rc=$(rcs 2)"; fi

# exit barrier: node 0 finishes at once but waits for node 1
s=$(date +%s%N)
agents 2 1 "" sh -c '[ $GROUP_RANK = 0 ] || sleep 1'
ms=$(( ($(date +%s%N) - s) / 1000000 ))
if [ "$(rcs 2)" = 00 ] && [ $ms -ge 1000 ]; then pass "exit barrier"; else fail "exit barrier" "rc=$(rcs 2) ms=$ms"; fi

# duplicate and out-of-range node ranks: every agent exits 2 naming the clash
agents 3 1 '--node_rank $(( i == 2 ? 1 : i ))' touch "$DT_TMP/started"
if [ "$(rcs 3)" = 222 ] && grep -q 'node_rank 1 is given to both' "$DT_TMP/a0.err" && [ ! -e "$DT_TMP/started" ]; then
  pass "duplicate node rank: all exit 2"; else fail "duplicate node rank" "rc=$(rcs 3) $(cat "$DT_TMP/a0.err")"; fi
agents 2 1 '--node_rank $(( i == 1 ? 5 : 0 ))' touch "$DT_TMP/started"
if [ "$(rcs 2)" = 22 ] && grep -q 'node_rank 5 on 127.0.0.3 is out of range for --nnodes 2' "$DT_TMP/a0.err" && [ ! -e "$DT_TMP/started" ]; then
  pass "out-of-range node rank: all exit 2"; else fail "out-of-range node rank" "rc=$(rcs 2) $(cat "$DT_TMP/a0.err" "$DT_TMP/a1.err")"; fi

# a node that never arrives: exit 3 after join_timeout, saying how many came
port=$(free_port); s=$(date +%s%N)
$T "$DTRUN" --nnodes 2 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.2 --rdzv_conf join_timeout=1 --exec touch "$DT_TMP/started" 2>"$DT_TMP/e"; rc=$?
ms=$(( ($(date +%s%N) - s) / 1000000 ))
if [ $rc -eq 3 ] && [ $ms -lt 15000 ] && grep -q '1 of 2 node(s) joined' "$DT_TMP/e" && [ ! -e "$DT_TMP/started" ]; then
  pass "missing node: exit 3 after join_timeout (${ms} ms)"; else fail "missing node" "rc=$rc $(cat "$DT_TMP/e")"; fi
# an endpoint nobody serves: exit 3 naming it and how long it tried
port=$(free_port); s=$(date +%s%N)
$T "$DTRUN" --nnodes 2 --node_rank 1 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.3 --rdzv_conf join_timeout=1 --exec true 2>"$DT_TMP/e"; rc=$?
ms=$(( ($(date +%s%N) - s) / 1000000 ))
if [ $rc -eq 3 ] && [ $ms -lt 15000 ] && grep -q "127.0.0.2:$port did not answer: tried for" "$DT_TMP/e"; then
  pass "dead endpoint: exit 3 (${ms} ms)"; else fail "dead endpoint" "rc=$rc $(cat "$DT_TMP/e")"; fi

# a node killed mid-run (agent SIGKILLed): its worker dies with it, node 0 declares
# it lost within 4 heartbeats and exits 1 with its rank in the summary
is_alive() { local st; st=$(awk '{print $3}' /proc/$1/stat 2>/dev/null) || return 1; [ -n "$st" ] && [ "$st" != Z ]; }
kill_node() { # KILLED_NODE: 0 (the store's host) or 1
  local port; port=$(free_port); rm -f "$DT_TMP/pid1" "$DT_TMP"/k*.rc
  for i in 1 0; do
    "$DTRUN" --nnodes 2 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.$((i + 2)) $FAST \
      --exec sh -c 'echo $$ > '"$DT_TMP/pid"'$GROUP_RANK; exec sleep 30' >/dev/null 2>"$DT_TMP/k$i.err" &
    eval "apid$i=$!"
  done
  ( sleep 30; kill -9 $apid0 $apid1 ) >/dev/null 2>&1 & local wd=$!
  for _ in $(seq 300); do [ -s "$DT_TMP/pid0" ] && [ -s "$DT_TMP/pid1" ] && break; sleep 0.02; done
  local victim; eval "victim=\$apid$1"; local other; eval "other=\$apid$((1 - $1))"
  s=$(date +%s%N); kill -9 $victim; wait $victim 2>/dev/null
  wait $other; krc=$?; kms=$(( ($(date +%s%N) - s) / 1000000 ))
  pkill -P $wd 2>/dev/null; kill $wd 2>/dev/null; wait $wd 2>/dev/null
  gone 10 "$(cat "$DT_TMP/pid$1")" "$(cat "$DT_TMP/pid$((1 - $1))")"; kalive=0; is_alive "$(cat "$DT_TMP/pid$1")" && kalive=1; is_alive "$(cat "$DT_TMP/pid$((1 - $1))")" && kalive=$((kalive + 2))
}
kill_node 1
if [ $krc -eq 1 ] && [ $kalive = 0 ] && [ $kms -lt 15000 ] && grep -q 'node 1 (127.0.0.3) lost' "$DT_TMP/k0.err" \
   && grep -q 'exitcode  : <N/A> (node lost)' "$DT_TMP/k0.err" && grep -q '  rank      : 1 (local_rank: 0)' "$DT_TMP/k0.err"; then
  pass "node 1 killed: declared lost in ${kms} ms, exit 1, no worker left"; else fail "node killed" "rc=$krc alive=$kalive ms=$kms $(tail -3 "$DT_TMP/k0.err")"; fi
kill_node 0
if [ $krc -eq 3 ] && [ $kalive = 0 ] && [ $kms -lt 20000 ] && grep -q 'lost the rendezvous store at 127.0.0.2' "$DT_TMP/k1.err"; then
  pass "store's node killed: the other exits 3 in ${kms} ms, no worker left"; else fail "host killed" "rc=$krc alive=$kalive ms=$kms $(tail -3 "$DT_TMP/k1.err")"; fi

# SIGTERM to node 1's agent: it forwards and exits 143; node 0 stops at once and,
# restarts or not, does not wait for a node that is going away
port=$(free_port); rm -f "$DT_TMP"/pid*
for i in 1 0; do
  "$DTRUN" --nnodes 2 --max_restarts 3 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.$((i + 2)) $FAST \
    --exec sh -c 'echo $$ > '"$DT_TMP/pid"'$GROUP_RANK; exec sleep 30' >/dev/null 2>"$DT_TMP/k$i.err" &
  eval "apid$i=$!"
done
( sleep 30; kill -9 $apid0 $apid1 ) >/dev/null 2>&1 & wd=$!
for _ in $(seq 300); do [ -s "$DT_TMP/pid0" ] && [ -s "$DT_TMP/pid1" ] && break; sleep 0.02; done
s=$(date +%s%N); kill -TERM $apid1; wait $apid1; rc1=$?; wait $apid0; rc0=$?; ms=$(( ($(date +%s%N) - s) / 1000000 ))
pkill -P $wd 2>/dev/null; kill $wd 2>/dev/null; wait $wd 2>/dev/null
if [ $rc1 = 143 ] && [ $rc0 = 1 ] && [ $ms -lt 15000 ] && grep -q 'the agent on 127.0.0.3 received SIGTERM' "$DT_TMP/k0.err"; then
  pass "SIGTERM to one agent: it exits 143, the other 1 without restarting (${ms} ms)"; else fail "agent signalled" "rc=$rc1/$rc0 ms=$ms $(tail -3 "$DT_TMP/k0.err")"; fi
finish
