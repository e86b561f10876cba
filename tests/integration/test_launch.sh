#!/usr/bin/env bash
# test_launch.sh - the launcher on one node with real processes: worker environment,
# log prefixing and files, exit codes, the failure summary, signals, restarts,
# orphan-freedom when the agent is SIGKILLed, and bad command lines.
. "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
PROBE=${DTRUN_TEST_BUILD:-$HERE/../../build}/tests/helpers/launch_probe
T="timeout -k 2 30"
cd "$DT_TMP"
# bg ARGS...: starts dtrun in the background as $pid (the agent itself, so that
# signals reach it) with a watchdog that SIGKILLs it after 30 s.
bg() { "$DTRUN" "$@" & pid=$!; ( sleep 30; kill -9 $pid ) >/dev/null 2>&1 & wd=$!; }
# is_alive PID: running and not a zombie (a sandbox's pid 1 may never reap).
is_alive() { local st; st=$(awk '{print $3}' /proc/$1/stat 2>/dev/null) || return 1; [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
# the watchdog and its sleep, by their ids
bg_end() { pkill -P $wd 2>/dev/null; kill $wd 2>/dev/null; wait $wd 2>/dev/null; }

# ---- environment of every rank ----
for np in 1 4; do
  out=$(env -u OMP_NUM_THREADS $T "$DTRUN" --nproc_per_node $np --exec env 2>"$DT_TMP/err"); rc=$?
  omp=unset; [ $np -gt 1 ] && omp=1
  if [ $rc -eq 0 ] && printf '%s\n' "$out" | python3 "$HERE/launch_check_env.py" 1 $np $omp; then
    pass "env 1x$np"; else fail "env 1x$np" "rc=$rc"; fi
done
# --exec with several workers and no OMP_NUM_THREADS: the notice appears once
out=$(env -u OMP_NUM_THREADS $T "$DTRUN" --nproc_per_node 3 --exec true 2>&1)
[ "$(printf '%s\n' "$out" | grep -c 'OMP_NUM_THREADS is not set: the 3 workers on this node each get OMP_NUM_THREADS=1')" = 1 ] &&
  pass "omp notice once" || fail "omp notice once" "$out"
# a user's OMP_NUM_THREADS is kept, and then there is nothing to say
out=$(OMP_NUM_THREADS=7 $T "$DTRUN" --nproc_per_node 2 --exec sh -c 'echo omp=$OMP_NUM_THREADS' 2>&1)
[ "$(printf '%s\n' "$out" | grep -c ']:omp=7$')" = 2 ] && ! printf '%s\n' "$out" | grep -q 'OMP_NUM_THREADS is not set' &&
  pass "omp kept" || fail "omp kept" "$out"

# ---- standalone: a free port each time, never a fixed one ----
p1=$($T "$DTRUN" --standalone --exec sh -c 'echo $MASTER_PORT' 2>/dev/null | sed 's/.*://')
p2=$($T "$DTRUN" --standalone --exec sh -c 'echo $MASTER_PORT' 2>/dev/null | sed 's/.*://')
if [ -n "$p1" ] && [ "$p1" != 29500 ] && [ "$p1" != "$p2" ]; then pass "standalone free port"; else fail "standalone free port" "$p1 $p2"; fi

# ---- log lines: prefixed, whole, complete, with concurrent writers ----
$T "$DTRUN" --nproc_per_node 4 --exec "$PROBE" lines 3000 >"$DT_TMP/o" 2>"$DT_TMP/e"; rc=$?
good=$(grep -Ec '^\[rank([0-3])\]:R\1 out L[0-9]+ abcdefghijklmnopqrstuvwxyz0123456789 END$' "$DT_TMP/o")
goode=$(grep -Ec '^\[rank([0-3])\]:R\1 err L[0-9]+ abcdefghijklmnopqrstuvwxyz0123456789 END$' "$DT_TMP/e")
total=$(wc -l <"$DT_TMP/o")
if [ $rc -eq 0 ] && [ "$good" = 12000 ] && [ "$total" = 12000 ] && [ "$goode" = 12000 ]; then
  pass "12000+12000 concurrent lines whole and prefixed"
else fail "concurrent lines" "rc=$rc good=$good/$total err=$goode"; fi

# ---- --log_dir/--tee/--redirects/--local_ranks_filter ----
$T "$DTRUN" --nproc_per_node 2 --rdzv_id run1 --log_dir "$DT_TMP/logs" --tee 3 --exec sh -c 'echo out$RANK; echo err$RANK >&2' >"$DT_TMP/o" 2>"$DT_TMP/e"
if [ "$(cat "$DT_TMP/logs/run1/attempt_0/1/stdout.log")" = out1 ] && [ "$(cat "$DT_TMP/logs/run1/attempt_0/0/stderr.log")" = err0 ] \
   && grep -qx '\[rank1\]:out1' "$DT_TMP/o" && grep -qx '\[rank0\]:err0' "$DT_TMP/e"; then pass "tee: files and console"; else fail "tee"; fi
$T "$DTRUN" --nproc_per_node 2 --rdzv_id run2 --log_dir "$DT_TMP/logs" --redirects 1 --exec sh -c 'echo out$RANK; echo err$RANK >&2' >"$DT_TMP/o" 2>"$DT_TMP/e"
if [ "$(cat "$DT_TMP/logs/run2/attempt_0/0/stdout.log")" = out0 ] && ! grep -q out "$DT_TMP/o" && grep -qx '\[rank1\]:err1' "$DT_TMP/e" \
   && [ ! -e "$DT_TMP/logs/run2/attempt_0/0/stderr.log" ]; then pass "redirects 1: stdout to files only"; else fail "redirects"; fi
$T "$DTRUN" --nproc_per_node 3 --local_ranks_filter 1 --exec sh -c 'echo out$RANK' >"$DT_TMP/o" 2>/dev/null
[ "$(cat "$DT_TMP/o")" = "[rank1]:out1" ] && pass "local_ranks_filter" || fail "local_ranks_filter" "$(cat "$DT_TMP/o")"

# ---- exit codes and the failure summary ----
$T "$DTRUN" --nproc_per_node 3 --exec sh -c 'if [ $RANK = 2 ]; then echo "boom on two" >&2; exit 3; fi; sleep 5' >/dev/null 2>"$DT_TMP/e"; rc=$?
if [ $rc -eq 1 ] && grep -q '^sh FAILED' "$DT_TMP/e" && grep -q 'Root Cause (first observed failure):' "$DT_TMP/e" \
   && grep -q '  rank      : 2 (local_rank: 2)' "$DT_TMP/e" && grep -q '  exitcode  : 3 (pid: [0-9]*)' "$DT_TMP/e" \
   && grep -q '  boom on two' "$DT_TMP/e" && grep -q '<NO_OTHER_FAILURES>' "$DT_TMP/e"; then
  pass "exit 1 with summary (exit code, rank, stderr tail)"; else fail "summary" "rc=$rc $(cat "$DT_TMP/e")"; fi
$T "$DTRUN" --nproc_per_node 2 --exec sh -c 'kill -SEGV $$' >/dev/null 2>"$DT_TMP/e"; rc=$?
if [ $rc -eq 1 ] && grep -q 'exitcode  : -11 (pid: [0-9]*) (SIGSEGV)' "$DT_TMP/e" && grep -q 'Signal 11 (SIGSEGV) received by PID' "$DT_TMP/e"; then
  pass "signal death in summary"; else fail "signal summary" "$(cat "$DT_TMP/e")"; fi
$T "$DTRUN" --nproc_per_node 1 --exec "$PROBE" errorfile >/dev/null 2>"$DT_TMP/e"; rc=$?
if [ $rc -eq 1 ] && grep -q 'error_file: .*/attempt_0/0/error.json' "$DT_TMP/e" && grep -q 'ValueError: bad batch on rank 0' "$DT_TMP/e"; then
  pass "error file traceback in summary"; else fail "error file" "$(cat "$DT_TMP/e")"; fi
$T "$DTRUN" --nproc_per_node 2 --exec sh -c 'exit 5' >/dev/null 2>"$DT_TMP/e"
c=$(grep -c '  exitcode  : 5' "$DT_TMP/e")
[ "$c" -ge 1 ] && grep -q '^Failures:' "$DT_TMP/e" && pass "failures section" || fail "failures section"

# ---- restarts ----
$T "$DTRUN" --nproc_per_node 2 --max_restarts 2 --exec sh -c 'echo count=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS; [ $TORCHELASTIC_RESTART_COUNT -ge 2 ]' >"$DT_TMP/o" 2>"$DT_TMP/e"; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'count=0 max=2' "$DT_TMP/o")" -ge 1 ] && [ "$(grep -c 'count=2 max=2' "$DT_TMP/o")" = 2 ] \
   && grep -q 'restart 2 of 2' "$DT_TMP/e"; then pass "restart count reaches 2 then success"; else fail "restarts" "rc=$rc"; fi
$T "$DTRUN" --max_restarts 1 --exec sh -c 'echo try $TORCHELASTIC_RESTART_COUNT; exit 1' >"$DT_TMP/o" 2>"$DT_TMP/e"; rc=$?
[ $rc -eq 1 ] && [ "$(cat "$DT_TMP/o" | tr '\n' ' ')" = "[rank0]:try 0 [rank0]:try 1 " ] && pass "restarts exhausted: exit 1" || fail "restarts exhausted" "rc=$rc"

# ---- signals ----
wait_ready() { for _ in $(seq 200); do [ "$(grep -c ready "$1" 2>/dev/null)" -ge "$2" ] && return 0; sleep 0.02; done; return 1; }
for sig in TERM INT HUP QUIT USR1 USR2; do
  rm -f "$DT_TMP/trap" "$DT_TMP/o"
  DTRUN_SHUTDOWN_TIMEOUT=5 bg --nproc_per_node 2 --exec "$PROBE" trap "$DT_TMP/trap" >"$DT_TMP/o" 2>/dev/null
  wait_ready "$DT_TMP/o" 2; kill -$sig $pid; wait $pid; rc=$?; bg_end
  num=$(kill -l $sig)
  if [ $rc -eq $((128 + num)) ] && [ "$(sort "$DT_TMP/trap" | tr '\n' ' ')" = "0 got SIG$sig 1 got SIG$sig " ]; then
    pass "SIG$sig forwarded to every worker, exit $((128 + num))"; else fail "SIG$sig" "rc=$rc $(cat "$DT_TMP/trap" 2>/dev/null)"; fi
done
# grace period then SIGKILL (worker ignores SIGTERM)
rm -f "$DT_TMP/o"
DTRUN_SHUTDOWN_TIMEOUT=0.5 bg --exec sh -c 'trap "" TERM; echo ready; while :; do sleep 0.05; done' >"$DT_TMP/o" 2>/dev/null
wait_ready "$DT_TMP/o" 1; s=$(date +%s%N); kill -TERM $pid; wait $pid; rc=$?; bg_end; ms=$(( ($(date +%s%N) - s) / 1000000 ))
# The bounds tell "after the 0.5 s grace" and "at once" from the 20 s timeout, with
# room for a loaded one-core machine (they were 3 s).
[ $rc -eq 143 ] && [ $ms -lt 10000 ] && pass "SIGKILL after DTRUN_SHUTDOWN_TIMEOUT (${ms} ms)" || fail "grace" "rc=$rc ms=$ms"
# a second Ctrl-C kills at once
rm -f "$DT_TMP/o"
DTRUN_SHUTDOWN_TIMEOUT=20 bg --exec sh -c 'trap "" INT; echo ready; while :; do sleep 0.05; done' >"$DT_TMP/o" 2>/dev/null
wait_ready "$DT_TMP/o" 1; s=$(date +%s%N); kill -INT $pid; sleep 0.2; kill -INT $pid; wait $pid; rc=$?; bg_end; ms=$(( ($(date +%s%N) - s) / 1000000 ))
[ $rc -eq 130 ] && [ $ms -lt 10000 ] && pass "second SIGINT kills at once (${ms} ms)" || fail "second SIGINT" "rc=$rc ms=$ms"

# ---- SIGKILL to the agent leaves no worker alive ----
rm -f "$DT_TMP/pids"
bg --nproc_per_node 3 --exec sh -c 'echo $$ >> '"$DT_TMP/pids"'; exec sleep 20' >/dev/null 2>&1
for _ in $(seq 200); do [ "$( { wc -l <"$DT_TMP/pids"; } 2>/dev/null || echo 0)" -ge 3 ] && break; sleep 0.02; done
kill -9 $pid; wait $pid 2>/dev/null; bg_end
gone 10 $(cat "$DT_TMP/pids")  # each worker dies of its parent-death signal, as soon as the kernel gets to it
alive=0; for p in $(cat "$DT_TMP/pids"); do is_alive $p && alive=$((alive + 1)); done
[ "$(wc -l <"$DT_TMP/pids")" = 3 ] && [ $alive = 0 ] && pass "agent SIGKILLed: no worker survives" || fail "orphans" "alive=$alive"

# ---- bad command lines: exit 2, a message, nothing started ----
bad() { # NAME NEEDLE ARGS...
  local n=$1 needle=$2; shift 2
  rm -f "$DT_TMP/started"
  out=$($T "$DTRUN" "$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q -- "$needle" && [ ! -e "$DT_TMP/started" ]; then pass "bad: $n"; else fail "bad: $n" "rc=$rc $out"; fi
}
bad "unknown flag" "--nproc_per_nod" --nproc_per_nod 2 --exec touch "$DT_TMP/started"
bad "contradiction" "--standalone contradicts --master_port" --standalone --master_port 5000 --exec touch "$DT_TMP/started"
bad "missing program" "not found in PATH" --exec no-such-program-xyz
bad "missing config" "none.json: expected a readable JSON file" "$DT_TMP/none.json"
echo '{"a": [1,' >"$DT_TMP/bad.json"
bad "config not JSON" "expected valid JSON" "$DT_TMP/bad.json"
echo '{"train_steps": 1, "log": {"dir": "'"$DT_TMP"'/trainlog"}}' >"$DT_TMP/ok.json"
bad "bad override" "train_stepz" "$DT_TMP/ok.json" train_stepz=2
# a config runs the built-in trainer as rank 0's worker (dtrun __worker CONFIG ...)
out=$($T "$DTRUN" "$DT_TMP/ok.json" train_steps=2 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^\[rank0\]:step 2/2' && [ -s "$DT_TMP/trainlog/metrics.jsonl" ]; then
  pass "config launches the trainer"; else fail "config launch" "rc=$rc $out"; fi
# the built-in trainer sizes its threads from the config: no OMP notice, even for
# several workers with OMP_NUM_THREADS unset
out=$(env -u OMP_NUM_THREADS $T "$DTRUN" --nproc_per_node 2 "$DT_TMP/ok.json" train_steps=1 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^\[rank0\]:step 1/1' && ! printf '%s\n' "$out" | grep -q 'OMP_NUM_THREADS'; then
  pass "no omp notice for the built-in trainer"; else fail "no omp notice for the built-in trainer" "rc=$rc $out"; fi
# the store raises the agent's soft descriptor limit; workers (select() users under
# --exec) get the limit dtrun was started with
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 1000 ]; then
  out=$( (ulimit -Sn 1000; $T "$DTRUN" --standalone --nproc_per_node 1 --exec sh -c 'ulimit -Sn') 2>&1); rc=$?
  if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qx '\[rank0\]:1000'; then
    pass "workers keep the soft fd limit dtrun started with"
  else fail "workers keep the soft fd limit dtrun started with" "rc=$rc $out"; fi
else skip "workers keep the soft fd limit" "hard limit $hard"; fi
bad "no arguments" "usage:"
bad "flags only" "nothing to launch" --nproc_per_node 2
finish
