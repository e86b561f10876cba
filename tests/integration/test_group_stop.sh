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
# Two nodes (one agent each on 127.0.0.2/.3), SIGTERM to node 0's agent only (a
# scheduler's preemption reaching one node): node 1's agent learns it from the
# store and stops its worker with a plain SIGTERM, not the group-failure one, so
# every rank reaches the preemption save. Rank 1 sleeps 1.5 s per step so that
# its agent's stop lands while it is still in the step.
port=$(free_port)
for i in 0 1; do
  term=0; [ $i = 0 ] && term=5 # node 0's worker sends SIGTERM to its agent after step 5
  env DTRUN_FAULT_TERM_PARENT_STEP=$term DTRUN_TEST_SLOW_RANK=1:1500 timeout -k 2 60 "$DTRUN" \
    --nnodes 2 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.$((i + 2)) \
    --rdzv_conf join_timeout=20,heartbeat_interval=0.2 --monitor_interval 0.05 "$DT_TMP/g.json" comm.backend=tcp \
    train_micro_batch_size_per_gpu=8 checkpoint.dir="$DT_TMP/ck3" log.dir="$DT_TMP/run3" >"$DT_TMP/n$i" 2>&1 &
  np[$i]=$!
done
wait ${np[0]}; rc0=$?
wait ${np[1]}; rc1=$?
ps=$(sed -n 's/.*checkpoint: step \([0-9]*\) (SIGTERM) saved to.*/\1/p' "$DT_TMP/n0")
if [ $rc0 -eq 143 ] && [ -n "$ps" ] && [ "$(cat "$DT_TMP/ck3/latest" 2>/dev/null)" = "$(printf step_%08d "$ps")" ] &&
   ! grep -q "without a preemption save" "$DT_TMP/n1"; then
  pass "SIGTERM to node 0's agent only: node 1's worker stopped plainly, step $ps saved on both nodes"
else fail "preemption signal on one node of two" "rc=$rc0/$rc1 ps=$ps latest=$(cat "$DT_TMP/ck3/latest" 2>/dev/null) $(grep -h 'preemption save\|failed' "$DT_TMP/n0" "$DT_TMP/n1" | head -3)"; fi
finish
