#!/usr/bin/env bash
# test_ckpt_async.sh - checkpoint.async: periodic saves written by a background
# thread give the same files and bytes as synchronous ones (1 rank, 2 ranks fsdp);
# training goes on while a write is held; a process killed in the middle of the
# background write (or in rank 0's background commit, before `latest`) leaves
# `latest` at the previous complete checkpoint and the resumed run has the
# uninterrupted run's losses; rank 0 commits only once the
# slowest rank's shard is durable; a preemption while a write is pending waits for
# it, commits it and saves synchronously.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
W="$DTRUN __worker"

make_text "$DT_TMP/text.txt" 1 4000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 8, "train_steps": 40, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "threads": 1, "seed": 5,
 "checkpoint": {"dir": "$DT_TMP/ck0", "every_steps": 10, "keep_last": 0, "resume": "auto"},
 "log": {"dir": "$DT_TMP/run0"}}
JSON
# same_tree NAME SYNC_DIR ASYNC_DIR: the same step folders, shards byte for byte,
# meta.json equal but for the save time and the run id.
same_tree() {
  python3 - "$2" "$3" <<'PY' && pass "$1" || fail "$1"
import json, os, sys
a, b = sys.argv[1], sys.argv[2]
sa, sb = sorted(os.listdir(a)), sorted(os.listdir(b))
assert sa == sb, (sa, sb)
assert open(f"{a}/latest").read() == open(f"{b}/latest").read()
n = 0
for d in sa:
    if not d.startswith("step_"): continue
    fa, fb = sorted(os.listdir(f"{a}/{d}")), sorted(os.listdir(f"{b}/{d}"))
    assert fa == fb, (d, fa, fb)
    for f in fa:
        if f == "meta.json":
            ma, mb = (json.load(open(f"{x}/{d}/{f}")) for x in (a, b))
            for m in (ma, mb): # the save time, the run id, and the config's folders and async flag
                m.pop("saved_at"); m.pop("run_id"); m["config"].pop("log")
                for k in ("dir", "async"): m["config"]["checkpoint"].pop(k)
            assert ma == mb, d
        else:
            assert open(f"{a}/{d}/{f}", "rb").read() == open(f"{b}/{d}/{f}", "rb").read(), (d, f)
            n += 1
assert n >= 4, n
PY
}

# 1 rank: synchronous vs async, the same checkpoints and losses.
$W "$DT_TMP/gpt.json" >"$DT_TMP/o0" 2>&1 || fail "synchronous run" "$(tail -3 "$DT_TMP/o0")"
$W "$DT_TMP/gpt.json" checkpoint.async=true checkpoint.dir="$DT_TMP/ck1" log.dir="$DT_TMP/run1" >"$DT_TMP/o1" 2>&1 ||
  fail "async run" "$(tail -3 "$DT_TMP/o1")"
if grep -q "step 10 (every_steps, async) saved to .*training blocked .* ms" "$DT_TMP/o1" &&
   grep -q "step 40 (final) saved to" "$DT_TMP/o1" && cmp -s <(losses "$DT_TMP/run0") <(losses "$DT_TMP/run1"); then
  pass "async saves logged with the time training was blocked; final save synchronous; same losses"
else fail "async run's log and losses" "$(grep checkpoint "$DT_TMP/o1" | head -3)"; fi
same_tree "1 rank: async checkpoints are the synchronous ones, same files and bytes" "$DT_TMP/ck0" "$DT_TMP/ck1"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['ckpt_async_saves']==3 and s['ckpt_blocked_ms']>0 and s['ckpt_write_ms']>0" \
  "$DT_TMP/run1/summary.json" && pass "summary.json: ckpt_async_saves, ckpt_blocked_ms, ckpt_write_ms" ||
  fail "summary.json async figures" "$(head -c 400 "$DT_TMP/run1/summary.json")"

# 2 ranks fsdp, rank 1's writes held 1.5 s: the same bytes, and rank 0 commits
# only after rank 1's shard is written.
M="$DT_TMP/gpt.json strategy=fsdp train_batch_size=16"
"$DTRUN" --nproc_per_node 2 $M checkpoint.dir="$DT_TMP/mk0" log.dir="$DT_TMP/mr0" >"$DT_TMP/m0" 2>&1 ||
  fail "2-rank synchronous run" "$(tail -3 "$DT_TMP/m0")"
DTRUN_CKPT_ASYNC_DELAY_MS=1500:1 "$DTRUN" --nproc_per_node 2 $M checkpoint.async=true checkpoint.dir="$DT_TMP/mk1" \
  log.dir="$DT_TMP/mr1" >"$DT_TMP/m1" 2>&1 || fail "2-rank async run" "$(tail -3 "$DT_TMP/m1")"
same_tree "2 ranks fsdp: async checkpoints are the synchronous ones" "$DT_TMP/mk0" "$DT_TMP/mk1"
after=$(sed -n 's/.*step 10 (every_steps, async) saved to .*committed \([0-9.]*\) s after the step.*/\1/p' "$DT_TMP/m1")
if [ -n "$after" ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 1.5 else 1)" "$after" &&
   cmp -s <(losses "$DT_TMP/mr0") <(losses "$DT_TMP/mr1"); then
  pass "2 ranks: rank 0 committed step 10 ${after} s after it, once rank 1's held write was done; same losses"
else fail "2-rank commit after the slowest shard" "after='$after' $(grep 'step 10' "$DT_TMP/m1" | head -2)"; fi

# Killed in the middle of the background write of step 20 (held 1 s so training
# runs on meanwhile): latest stays at step 10; the next run resumes from it.
sed "s#$DT_TMP/ck0#$DT_TMP/ck2#; s#$DT_TMP/run0#$DT_TMP/run2#" "$DT_TMP/gpt.json" > "$DT_TMP/g2.json"
DTRUN_CKPT_ASYNC_DELAY_MS=1000 DTRUN_CKPT_KILL_AT=shard_range:20 $W "$DT_TMP/g2.json" checkpoint.async=true \
  >"$DT_TMP/o2" 2>&1
rc=$?
last=$(losses "$DT_TMP/run2" | tail -1 | cut -d' ' -f1)
if [ $rc -eq 137 ] && [ "$(cat "$DT_TMP/ck2/latest")" = step_00000010 ] && [ -d "$DT_TMP/ck2/step_00000020.tmp" ] &&
   [ ! -e "$DT_TMP/ck2/step_00000020" ] && [ "${last:-0}" -gt 20 ]; then
  pass "killed during the background write of step 20 (training had reached step $last): latest still step 10"
else fail "kill during the background write" "rc=$rc latest=$(cat "$DT_TMP/ck2/latest" 2>/dev/null) last=$last $(ls "$DT_TMP/ck2")"; fi
$W "$DT_TMP/g2.json" checkpoint.async=true >"$DT_TMP/o2b" 2>&1
if grep -q "resumed from .*step_00000010" "$DT_TMP/o2b" && cmp -s <(losses "$DT_TMP/run0") <(losses "$DT_TMP/run2"); then
  pass "resumed from step 10: the uninterrupted run's losses"
else fail "resume after the killed write" "$(grep -i 'resum\|error' "$DT_TMP/o2b" | head -3)"; fi

# Killed in rank 0's background commit of step 20, before `latest` moves: latest
# stays at step 10 (the renamed step_00000020 is complete but not named); the next
# run resumes from step 10 with the uninterrupted run's losses.
sed "s#$DT_TMP/ck0#$DT_TMP/ck4#; s#$DT_TMP/run0#$DT_TMP/run4#" "$DT_TMP/gpt.json" > "$DT_TMP/g4.json"
DTRUN_CKPT_KILL_AT=before_latest:20 $W "$DT_TMP/g4.json" checkpoint.async=true >"$DT_TMP/o4" 2>&1
rc=$?
if [ $rc -eq 137 ] && [ "$(cat "$DT_TMP/ck4/latest")" = step_00000010 ] && ! grep -q "step 20 (every_steps, async) saved" "$DT_TMP/o4"; then
  pass "killed in the background commit of step 20 before latest: latest still step 10"
else fail "kill during the background commit" "rc=$rc latest=$(cat "$DT_TMP/ck4/latest" 2>/dev/null) $(ls "$DT_TMP/ck4")"; fi
$W "$DT_TMP/g4.json" checkpoint.async=true >"$DT_TMP/o4b" 2>&1
if grep -q "resumed from .*step_00000010" "$DT_TMP/o4b" && cmp -s <(losses "$DT_TMP/run0") <(losses "$DT_TMP/run4"); then
  pass "resumed from step 10 after the killed commit: the uninterrupted run's losses"
else fail "resume after the killed commit" "$(grep -i 'resum\|error' "$DT_TMP/o4b" | head -3)"; fi

# Preempted (SIGTERM to the agent after step 22; the ranks stop at the same step,
# 22 or 23) while the write of step 20 is held: the preemption save waits for it,
# step 20 is committed first, then the preemption step is saved and latest.
DTRUN_CKPT_ASYNC_DELAY_MS=1500 DTRUN_FAULT_TERM_PARENT_STEP=22 "$DTRUN" --nproc_per_node 2 $M checkpoint.async=true \
  checkpoint.dir="$DT_TMP/mk3" log.dir="$DT_TMP/mr3" >"$DT_TMP/m3" 2>&1
rc=$?
ps=$(sed -n 's/.*checkpoint: step \([0-9]*\) (SIGTERM) saved to.*/\1/p' "$DT_TMP/m3")
l20=$(grep -n 'step 20 (every_steps, async) saved' "$DT_TMP/m3" | cut -d: -f1)
lps=$(grep -n '(SIGTERM) saved to' "$DT_TMP/m3" | cut -d: -f1)
if [ $rc -eq 143 ] && [ -n "$ps" ] && [ "$ps" -gt 20 ] && [ -f "$DT_TMP/mk3/step_00000020/meta.json" ] &&
   [ "$(cat "$DT_TMP/mk3/latest")" = "$(printf step_%08d "$ps")" ] && [ -n "$l20" ] && [ "$l20" -lt "$lps" ]; then
  pass "SIGTERM while step 20's write is pending: it is committed first, then step $ps saved synchronously"
else fail "preemption with a pending async save" "rc=$rc ps=$ps latest=$(cat "$DT_TMP/mk3/latest" 2>/dev/null) $(grep -i 'checkpoint:\|error' "$DT_TMP/m3" | cut -c1-160 | head -4)"; fi

# An elastic resize at a checkpoint boundary (a node waits to join: the worker's
# resize flag) while that boundary's async write is held: the save is committed
# before the worker exits 75, so the group resumes from it at the new size.
touch "$DT_TMP/resize_flag"
sed "s#$DT_TMP/ck0#$DT_TMP/ck5#; s#$DT_TMP/run0#$DT_TMP/run5#" "$DT_TMP/gpt.json" > "$DT_TMP/g5.json"
DTRUN_ELASTIC=1:2 DTRUN_RESIZE_FILE="$DT_TMP/resize_flag" DTRUN_CKPT_ASYNC_DELAY_MS=1000 timeout 60 $W "$DT_TMP/g5.json" \
  checkpoint.async=true train_batch_size=8 >"$DT_TMP/o5" 2>&1
rc=$?
if [ $rc -eq 75 ] && [ "$(cat "$DT_TMP/ck5/latest" 2>/dev/null)" = step_00000010 ] && [ -f "$DT_TMP/ck5/step_00000010/meta.json" ] &&
   grep -q "step 10 (every_steps, async) saved" "$DT_TMP/o5"; then
  pass "elastic resize at step 10 with its async write pending: committed (latest step 10) before exit 75"
else fail "elastic resize with a pending async save" "rc=$rc latest=$(cat "$DT_TMP/ck5/latest" 2>/dev/null) $(ls "$DT_TMP/ck5" | tr '\n' ' ')"; fi

expect_rc2() {
  "$@" >"$DT_TMP/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -q "checkpoint.async" "$DT_TMP/err"; then pass "checkpoint.async=maybe: exit 2 naming the key"
  else fail "bad checkpoint.async" "rc=$rc $(head -2 "$DT_TMP/err")"; fi
}
expect_rc2 "$DTRUN" --nproc_per_node 1 "$DT_TMP/gpt.json" checkpoint.async=maybe
finish
