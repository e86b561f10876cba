#!/usr/bin/env bash
# test_flight_multi.sh - hang reports across nodes: two agents on loopback
# addresses (127.0.0.2 hosts the store, 127.0.0.3), 2 ranks per node, the built-in
# trainer with comm.timeout_s 3:
#   - rank 3 (node 1, local rank 1) SIGSTOPped mid-run: BOTH agents exit 1 within
#     the timeout plus seconds (not the 30 s shutdown grace), each agent's failure
#     summary has rank 3 on 127.0.0.3 as the root cause with the op, and the
#     analysis combines both nodes' records: node 0's summary names rank 3 (only
#     node 1 posted it) and node 1's names ranks of node 0 waiting for it; each
#     node's flight dumps exist (ranks 0-1 on node 0, 2-3 on node 1);
#   - the same with --max_restarts 1: the group restarts (the stopped process is
#     gone: SIGCONT with the stop) and finishes, both agents exit 0.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])'; }
rank_pid() { # AGENT_PID RANK: the worker's pid
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}
# run_pair ID STEPS EXTRA TIMEOUT1: both agents in the background ($a0 $a1); rank 3 stopped
# once node 0 has printed a step; t0 is the time of the stop
run_pair() {
  local R="--nnodes 2 --nproc_per_node 2 --rdzv_endpoint 127.0.0.2:$(port) --rdzv_id $1 $3
           --rdzv_conf heartbeat_interval=0.2,join_timeout=20"
  local C="configs/mlp-tiny.json train_steps=$2 steps_per_print=500 eval.every_steps=0"
  timeout 60 "$DTRUN" $R --local_addr 127.0.0.2 --log_dir "$DT_TMP/l0" $C comm.timeout_s=3 log.dir="$DT_TMP/$1.m0" > "$DT_TMP/$1.n0" 2>&1 & a0=$!
  timeout 60 "$DTRUN" $R --local_addr 127.0.0.3 --log_dir "$DT_TMP/l1" $C comm.timeout_s=$4 log.dir="$DT_TMP/$1.m1" > "$DT_TMP/$1.n1" 2>&1 & a1=$!
  local deadline=$((SECONDS + 30))
  while [ ! -s "$DT_TMP/$1.m0/metrics.jsonl" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  sleep 0.5
  # the worker is the child of node 1's agent (under `timeout`)
  p3=$(rank_pid "$(pgrep -P $a1 | head -1)" 3)
  [ -n "$p3" ] && kill -STOP "$p3"
  t0=$(date +%s.%N)
}
since() { python3 -c "print('%.1f' % ($(date +%s.%N) - $1))"; }

# ---- rank 3 on node 1 stopped: both nodes fail within the timeout, rank 3 the root cause ----
# Node 1's ranks wait 20 s, node 0's 3 s: node 0 always fails first, and node 1 only
# stops (and posts its records) when it sees node 0's stop request, the order in
# which node 0's summary was printed from node 0's records alone (rank 0 blamed).
run_pair stop 10000000 "" 20
wait $a0; rc0=$?; s0=$(since $t0); wait $a1; rc1=$?; s1=$(since $t0)
[ -n "$p3" ] || fail "found rank 3's worker on node 1"
ok=1
for n in 0 1; do
  root=$(sed -n '/^Root Cause/,$p' "$DT_TMP/stop.n$n")
  grep -q "the rank the others waited for" <<<"$root" && grep -q "host      : 127.0.0.3" <<<"$root" \
    && grep -q "rank      : 3 (local_rank: 1)" <<<"$root" \
    && grep -Eq "communicator [0-9.a-z]+: (ranks? [0-9,]+ waits? in [a-z_]+ #[0-9]+ .*rank 3 never entered it .*process stopped|ranks? [0-9,]+ waits? in [a-z_]+ #[0-9]+ .* for rank 3, which entered it but its process is stopped) \(SIGSTOP\)" <<<"$root" \
    || { ok=0; echo "--- node $n summary:"; tail -14 "$DT_TMP/stop.n$n"; }
done
if [ $rc0 -eq 1 ] && [ $rc1 -eq 1 ] && [ $ok = 1 ] && python3 -c "import sys; sys.exit(not ($s0 < 15 and $s1 < 15))"; then
  pass "rank 3 stopped on node 1: both agents exit 1 (${s0} s, ${s1} s after the stop), each summary names rank 3 and the op"
else fail "stopped rank across nodes" "rc=$rc0/$rc1 took=$s0/$s1 ok=$ok"; fi
# the analysis combines the nodes: on node 1, ranks of node 0 (0 or 1) are listed as waiting for rank 3
root1=$(sed -n '/^Root Cause/,$p' "$DT_TMP/stop.n1")
if grep -Eq "communicator [0-9.a-z]+: ranks? ([0-9]+,)*[01](,[0-9]+)* waits? in [a-z_]+ #[0-9]+ .*(rank 3 never entered it|for rank 3, which entered it)" <<<"$root1"; then
  pass "node 1's analysis has node 0's waiting ranks (every agent's records from the store)"
else fail "combined analysis on node 1" "$root1"; fi
dumps() { python3 - "$@" <<'PY'
import json, sys
d = sys.argv[1]
for r in map(int, sys.argv[2:]):
    j = json.load(open("%s/rank_%05d.json" % (d, r)))
    assert j["rank"] == r and j["entries"] and all(e["op"] and e["seq"] > 0 for e in j["entries"]), r
PY
}
if dumps "$DT_TMP/l0/stop/flight" 0 1 && dumps "$DT_TMP/l1/stop/flight" 2 3 \
   && grep -q '"process":[[:space:]]*"stopped (SIGSTOP)"' "$DT_TMP/l1/stop/flight/rank_00003.json"; then
  pass "each node's flight dumps exist (ranks 0-1 on node 0, 2-3 on node 1; rank 3 stopped)"
else fail "flight dumps per node" "$(ls -R "$DT_TMP/l0/stop" "$DT_TMP/l1/stop" 2>&1 | head)"; fi

# ---- the same with --max_restarts 1: the group restarts and finishes ----
run_pair again 3000 "--max_restarts 1" 3
wait $a0; rc0=$?; wait $a1; rc1=$?; s=$(since $t0)
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "restarting the workers (restart 1 of 1)" "$DT_TMP/again.n0" \
   && grep -q "restarting the workers (restart 1 of 1)" "$DT_TMP/again.n1" && grep -q "done: 3000 steps" "$DT_TMP/again.n0" \
   && [ -n "$p3" ] && ! kill -0 "$p3" 2>/dev/null; then
  pass "with --max_restarts 1 the group restarts and finishes (${s} s after the stop); the stopped worker is gone"
else fail "restart after a stopped rank" "rc=$rc0/$rc1 $(tail -4 "$DT_TMP/again.n0") $(tail -4 "$DT_TMP/again.n1")"; fi
finish
