#!/usr/bin/env bash
# test_flight.sh - hang and desync reports from the flight recorder, with real
# workers (3 ranks on shared memory, comm.timeout_s 3):
#   - rank 1 SIGSTOPped mid-run: the job fails within the timeout plus seconds
#     (not the 30 s shutdown grace: the stop sends SIGCONT), the summary's root
#     cause is rank 1 and names the op the others wait in, and every rank's
#     flight dump exists and parses;
#   - rank 1 skips a collective of each kind (DTRUN_TEST_SKIP_COLLECTIVE): the desync is named;
#   - `dtrun debug dump RUN_DIR` on a running job writes the dumps and the job
#     finishes.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
CFG=configs/mlp-tiny.json
rank_pid() { # AGENT_PID RANK: the worker's pid
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}
dumps_parse() { # DIR N: N dumps that parse, each with entries
  python3 - "$1" "$2" <<'PY'
import json, sys
for r in range(int(sys.argv[2])):
    d = json.load(open("%s/rank_%05d.json" % (sys.argv[1], r)))
    assert d["rank"] == r and d["entries"] and all(e["op"] and e["seq"] > 0 for e in d["entries"]), r
PY
}

# ---- a stopped rank --------------------------------------------------------
# The bound on the exit (25 s after the stop; it was 15) tells the 3 s op timeout
# from the 30 s shutdown grace, with room for a loaded one-core machine.
"$DTRUN" --standalone --nproc_per_node 3 --log_dir "$DT_TMP/logs" --rdzv_id stop "$CFG" train_steps=10000000 \
  steps_per_print=1000 comm.timeout_s=3 eval.every_steps=0 log.dir="$DT_TMP/m1" > "$DT_TMP/stop.out" 2>&1 & a=$!
deadline=$((SECONDS + 30))
while [ ! -s "$DT_TMP/m1/metrics.jsonl" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
sleep 0.5
p1=$(rank_pid $a 1)
kill -STOP "$p1"
t0=$(date +%s.%N)
wait $a; rc=$?
took=$(python3 -c "import sys; print('%.1f' % ($(date +%s.%N) - $t0))")
root=$(sed -n '/^Root Cause/,$p' "$DT_TMP/stop.out")
if [ $rc -eq 1 ] && python3 -c "import sys; sys.exit(not $took < 25)" \
   && grep -q "the rank the others waited for" <<<"$root" && grep -q "rank      : 1 (local_rank: 1)" <<<"$root" \
   && grep -Eq "(ranks 0,2 wait in [a-z_]+ #[0-9]+ .*rank 1 never entered it .*process stopped|ranks 0,2 wait in [a-z_]+ #[0-9]+ .* for rank 1, which entered it but its process is stopped) \(SIGSTOP\)" <<<"$root"; then
  pass "a SIGSTOPped rank is the root cause, with the op ($took s from the stop to the exit)"
else fail "stopped rank" "rc=$rc took=$took $(tail -12 "$DT_TMP/stop.out")"; fi
check "every rank's flight dump exists and parses" dumps_parse "$DT_TMP/logs/stop/flight" 3

# ---- a rank that skips a collective -------------------------------------------
# Rank 1 skips one op of each kind (ddp: all_gather #1, all_reduce #2, the checkpoint's
# barrier #19; fsdp: reduce_scatter #8, and all_gather #2, where its prefetched ops ran
# ahead): every case names rank 1 as the root cause with the desync, at once (the
# shared-memory backend sees the other op under the same number), no rank crashes.
for c in "ddp 1 all_gather" "ddp 2 all_reduce" "ddp 19 barrier" "fsdp 8 reduce_scatter" "fsdp 2 all_gather"; do
  set -- $c
  DTRUN_TEST_SKIP_COLLECTIVE=1:$2 "$DTRUN" --standalone --nproc_per_node 3 --log_dir "$DT_TMP/logs" --rdzv_id skip$1$2 \
    "$CFG" strategy=$1 train_steps=20 checkpoint.every_steps=5 checkpoint.dir="$DT_TMP/ck$1$2" comm.timeout_s=20 \
    eval.every_steps=0 log.dir="$DT_TMP/m2$1$2" > "$DT_TMP/skip.out" 2>&1; rc=$?
  root=$(sed -n '/^Root Cause/,$p' "$DT_TMP/skip.out")
  if [ $rc -eq 1 ] && grep -q "rank      : 1 " <<<"$root" && grep -q "skips $3 #$2 " "$DT_TMP/skip.out" \
     && grep -Eq "desync at #$2: rank 1 in [a-z_]+ #$2( \(count [0-9]+, f32\))?( \(then on to #[0-9]+\))?; the others \(ranks 0,2\) in $3 #$2" <<<"$root" \
     && ! grep -q SIGSEGV "$DT_TMP/skip.out"; then
    pass "$1: rank 1 skips $3 #$2: named as the desync, no crash"
  else fail "$1: skipped $3 #$2" "rc=$rc $(grep -E 'skips|SIGSEGV' "$DT_TMP/skip.out" | head -2) $(grep traceback <<<"$root")"; fi
done

# ---- dtrun debug dump on a running job ------------------------------------------
"$DTRUN" --standalone --nproc_per_node 2 --log_dir "$DT_TMP/logs" --rdzv_id live "$CFG" train_steps=100000 \
  steps_per_print=20000 eval.every_steps=0 log.dir="$DT_TMP/m3" > "$DT_TMP/live.out" 2>&1 & a=$!
deadline=$((SECONDS + 30))
while [ ! -s "$DT_TMP/m3/metrics.jsonl" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
"$DTRUN" debug dump "$DT_TMP/logs/live" > "$DT_TMP/dump.out" 2>&1; drc=$?
wait $a; rc=$?
if [ $drc -eq 0 ] && grep -q "ranks 0-1 written to" "$DT_TMP/dump.out" && dumps_parse "$DT_TMP/logs/live/flight" 2 \
   && [ $rc -eq 0 ] && grep -q "done: 100000 steps" "$DT_TMP/live.out"; then
  pass "dtrun debug dump writes the dumps and the job goes on"
else fail "debug dump" "drc=$drc rc=$rc $(cat "$DT_TMP/dump.out") $(tail -3 "$DT_TMP/live.out")"; fi
"$DTRUN" debug dump "$DT_TMP/nonexistent" > "$DT_TMP/dump2.out" 2>&1; drc=$?
if [ $drc -eq 2 ] && grep -q "no endpoint file" "$DT_TMP/dump2.out"; then pass "debug dump of no run: exit 2 naming it"
else fail "debug dump of no run" "drc=$drc $(cat "$DT_TMP/dump2.out")"; fi
for bad in inf nan abc 0; do # a timeout that is no number of seconds: exit 2 naming the flag (inf waited forever)
  timeout 20 "$DTRUN" debug dump --rdzv_endpoint 127.0.0.1:1 --rdzv_id x --timeout $bad > "$DT_TMP/dump3.out" 2>&1
  drc=$?
  if [ $drc -eq 2 ] && grep -q -- "--timeout '$bad'" "$DT_TMP/dump3.out"; then pass "debug dump --timeout $bad: exit 2 naming it"
  else fail "debug dump --timeout $bad" "drc=$drc $(cat "$DT_TMP/dump3.out")"; fi
done
finish
