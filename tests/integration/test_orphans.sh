#!/usr/bin/env bash
# test_orphans.sh - nothing a worker started outlives the job: each --exec worker is
# `sh -c 'sleep M & ...; sleep M; wait'` (a background grandchild beside a foreground
# one), and after Ctrl-C, after a failed rank, after the agent is SIGKILLed and after a
# worker exits 0 leaving a child behind, no `sleep M` of this test is left running.
# M is a duration unique to each case (sleep accepts fractions), so that the processes
# of this test are found by their command line and nothing else is touched.
. "$(dirname "$0")/lib.sh"
cd "$DT_TMP"
# bg ARGS...: dtrun in the background as $pid with a watchdog that SIGKILLs it after 60 s.
bg() { "$DTRUN" "$@" & pid=$!; ( sleep 60; kill -9 $pid ) >/dev/null 2>&1 & wd=$!; }
bg_end() { pkill -P $wd 2>/dev/null; kill $wd 2>/dev/null; wait $wd 2>/dev/null; }
# pids_of M: the live processes whose command line is exactly `sleep M` (a zombie's
# command line is empty, so a dead process the sandbox never reaps does not count).
pids_of() { pgrep -x -f "sleep ${1//./\\.}"; }
count() { pids_of "$1" | wc -l; }
# wait_count M N SECONDS: until exactly N `sleep M` are alive; fails after SECONDS.
wait_count() {
  local i
  for i in $(seq $(( $3 * 20 ))); do [ "$(count "$1")" -eq "$2" ] && return 0; sleep 0.05; done
  return 1
}
# reap M: kills what a failing case left (by pid, only this test's sleeps).
reap() { local p; for p in $(pids_of "$1"); do kill -9 "$p" 2>/dev/null; done; }
case_no=0
mark() { case_no=$((case_no + 1)); echo "100.$$$case_no"; }

# ---- Ctrl-C: the background sleeps ignore SIGINT (sh does that to `&` jobs) ----
M=$(mark)
DTRUN_SHUTDOWN_TIMEOUT=5 bg --nproc_per_node 2 --exec sh -c "sleep $M & sleep $M; wait" >/dev/null 2>&1
if wait_count "$M" 4 10; then
  kill -INT $pid; wait $pid; rc=$?; bg_end
  if wait_count "$M" 0 5; then pass "SIGINT: nothing left (exit $rc)"
  else fail "SIGINT" "rc=$rc, $(count "$M") sleep(s) left"; fi
else kill -9 $pid; wait $pid; bg_end; fail "SIGINT" "the 4 sleeps never started"; fi
reap "$M"

# ---- one rank fails: its own background sleep outlives it unless its group is killed ----
M=$(mark)
bg --nproc_per_node 2 --exec sh -c "sleep $M & if [ \"\$RANK\" = 1 ]; then while [ ! -e go ]; do sleep 0.05; done; exit 1; fi; sleep $M; wait" >/dev/null 2>&1
if wait_count "$M" 3 10; then
  touch go; wait $pid; rc=$?; bg_end
  if [ $rc -eq 1 ] && wait_count "$M" 0 5; then pass "failed rank: nothing left (exit 1)"
  else fail "failed rank" "rc=$rc, $(count "$M") sleep(s) left"; fi
else kill -9 $pid; wait $pid; bg_end; fail "failed rank" "the 3 sleeps never started"; fi
rm -f go; reap "$M"

# ---- the agent is SIGKILLed: PDEATHSIG reaches only the shells ----
M=$(mark)
bg --nproc_per_node 2 --exec sh -c "sleep $M & sleep $M; wait" >/dev/null 2>&1
if wait_count "$M" 4 10; then
  kill -9 $pid; wait $pid 2>/dev/null; bg_end
  if wait_count "$M" 0 5; then pass "agent SIGKILLed: nothing left"
  else fail "agent SIGKILLed" "$(count "$M") sleep(s) left"; fi
else kill -9 $pid; wait $pid; bg_end; fail "agent SIGKILLed" "the 4 sleeps never started"; fi
reap "$M"

# ---- every worker exits 0 and leaves a child behind: the job is over, so is the child ----
M=$(mark)
out=$(timeout -k 2 30 "$DTRUN" --nproc_per_node 2 --exec sh -c "sleep $M & exit 0" 2>&1); rc=$?
if [ $rc -eq 0 ] && wait_count "$M" 0 5; then pass "exit 0: nothing left"
else fail "exit 0" "rc=$rc, $(count "$M") sleep(s) left: $out"; fi
reap "$M"

# ---- a restart: the failed attempt's leftovers are gone before the next attempt starts ----
M=$(mark)
P="sleep ${M//./\\.}"
out=$(timeout -k 2 30 "$DTRUN" --nproc_per_node 2 --max_restarts 1 --exec sh -c \
  "if [ \$TORCHELASTIC_RESTART_COUNT = 1 ]; then pgrep -x -f '$P' >/dev/null && exit 3; exit 0; fi; sleep $M & exit 1" 2>&1); rc=$?
if [ $rc -eq 0 ] && wait_count "$M" 0 5; then pass "restart: the first attempt's leftovers died before the second"
else fail "restart" "rc=$rc, $(count "$M") sleep(s) left: $out"; fi
reap "$M"

# ---- a grandchild that left the worker's process group (setsid) while the agent lives ----
M=$(mark)
DTRUN_SHUTDOWN_TIMEOUT=5 bg --nproc_per_node 2 --exec sh -c "setsid sleep $M & sleep $M; wait" >/dev/null 2>&1
if wait_count "$M" 4 10; then
  kill -TERM $pid; wait $pid; rc=$?; bg_end
  if wait_count "$M" 0 5; then pass "setsid grandchild: nothing left (exit $rc)"
  else fail "setsid grandchild" "rc=$rc, $(count "$M") sleep(s) left"; fi
else kill -9 $pid; wait $pid; bg_end; fail "setsid grandchild" "the 4 sleeps never started"; fi
reap "$M"

# ---- ... and the agent is SIGKILLed: the guardian finds it by its environment ----
M=$(mark)
bg --nproc_per_node 2 --exec sh -c "setsid sleep $M & sleep $M; wait" >/dev/null 2>"$DT_TMP/guard.err"
if wait_count "$M" 4 10; then
  kill -9 $pid; wait $pid 2>/dev/null; bg_end
  said() { grep -q 'the agent (pid [0-9]*) died: killed 2 worker process group(s), then [1-9][0-9]* process(es) by the job'"'"'s environment' "$DT_TMP/guard.err"; }
  for _ in $(seq 100); do said && break; sleep 0.05; done
  if wait_count "$M" 0 5 && said
  then pass "setsid grandchild, agent SIGKILLed: nothing left, the guardian says so"
  else fail "setsid grandchild, agent SIGKILLed" "$(count "$M") sleep(s) left: $(cat "$DT_TMP/guard.err")"; fi
else kill -9 $pid; wait $pid; bg_end; fail "setsid grandchild, agent SIGKILLed" "the 4 sleeps never started"; fi
reap "$M"

finish
