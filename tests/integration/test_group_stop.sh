#!/usr/bin/env bash
# test_group_stop.sh - a worker that dies (not a preemption): the agent stops the
# survivors with a SIGTERM queued with DT_STOP_GROUP_FAILURE, they exit without a
# preemption save, the restarted group resumes from the last checkpoint and ends
# with the uninterrupted run's losses; a real SIGTERM to the agent still saves.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

make_text "$DT_TMP/text.txt" 1 4000
cat > "$DT_TMP/g.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "train_steps": 40, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "threads": 1, "seed": 5, "comm": {"backend": "shm"},
 "checkpoint": {"dir": "$DT_TMP/ck0", "every_steps": 10, "keep_last": 0, "resume": "auto"},
 "log": {"dir": "$DT_TMP/run0"}}
JSON
losses() { python3 -c 'import json,sys; [print(json.loads(l)["step"], repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1/metrics.jsonl"; }
"$DTRUN" --nproc_per_node 2 "$DT_TMP/g.json" >"$DT_TMP/o0" 2>&1 || fail "uninterrupted run" "$(tail -3 "$DT_TMP/o0")"

# Rank 1 SIGKILLed after step 25. Rank 0 may see rank 1's exit in a collective
# before the agent's signal arrives (then it fails on the collective, also without
# a save): up to 3 tries for the signal to be the one that stops it.
signalled=0
for try in 1 2 3; do
  rm -rf "$DT_TMP/ck1" "$DT_TMP/run1"
  DTRUN_FAULT_KILL_STEP=25 DTRUN_FAULT_KILL_RANK=1 "$DTRUN" --nproc_per_node 2 --max_restarts 1 "$DT_TMP/g.json" \
    checkpoint.dir="$DT_TMP/ck1" log.dir="$DT_TMP/run1" >"$DT_TMP/o1" 2>&1
  rc=$?
  if grep -q "preempted by signal\|(SIGTERM\|checkpoint of step .* failed" "$DT_TMP/o1" || [ -e "$DT_TMP/ck1/step_00000025" ]; then
    fail "survivors attempted a preemption save after rank 1 died" "$(grep -i 'preempt\|SIGTERM\|failed' "$DT_TMP/o1" | head -3)"
    break
  fi
  if grep -q "^\[rank0\]:dtrun worker: the agent stops the group after a failure: exiting without a preemption save" "$DT_TMP/o1"; then
    signalled=1
    break
  fi
done
if [ $signalled = 1 ]; then pass "rank 1 died: rank 0 stopped by the agent's group-failure SIGTERM without a save (try $try)"
else fail "group-failure stop never reached rank 0 in 3 tries" "$(grep 'rank0' "$DT_TMP/o1" | grep -iv 'step [0-9]*/' | tail -3)"; fi
if [ $rc -eq 0 ] && grep -q "restarting the workers (restart 1 of 1)" "$DT_TMP/o1" &&
   grep -q "resumed from .*step_00000020" "$DT_TMP/o1" && cmp -s <(losses "$DT_TMP/run0") <(losses "$DT_TMP/run1"); then
  pass "restarted from step 20: the uninterrupted run's losses"
else fail "restart after the group stop" "rc=$rc $(grep -i 'resum\|restart' "$DT_TMP/o1" | head -3)"; fi

# A SIGTERM to the agent (a scheduler's) is a preemption: the workers save.
DTRUN_FAULT_TERM_PARENT_STEP=22 "$DTRUN" --nproc_per_node 2 "$DT_TMP/g.json" checkpoint.dir="$DT_TMP/ck2" \
  log.dir="$DT_TMP/run2" >"$DT_TMP/o2" 2>&1
rc=$?
if [ $rc -eq 143 ] && grep -q "checkpoint: step 2[23] (SIGTERM) saved to" "$DT_TMP/o2" &&
   ! grep -q "without a preemption save" "$DT_TMP/o2"; then
  pass "SIGTERM to the agent: still a preemption save, exit 143"
else fail "SIGTERM preemption" "rc=$rc $(grep -i 'SIGTERM\|preempt' "$DT_TMP/o2" | head -3)"; fi
finish
