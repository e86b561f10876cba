#!/usr/bin/env bash
# test_ckpt.sh - checkpoints as users meet them: a run killed and resumed gives the
# uninterrupted run's losses (directly, and under the launcher with --max_restarts
# at random steps), SIGTERM preemption then resume, a corrupt latest falls back to
# the previous checkpoint, bad resume paths and wrong models are named, and
# `dtrun sample` / `dtrun export` work on the result.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
W="$DTRUN __worker"

make_text "$DT_TMP/text.txt" 1 4000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 8, "train_steps": 60, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}},
 "gradient_clipping": 1.0, "threads": 1, "seed": 5,
 "checkpoint": {"dir": "$DT_TMP/ck0", "every_steps": 10, "keep_last": 2, "resume": "auto"},
 "log": {"dir": "$DT_TMP/run0"}}
JSON
expect2() { # name pattern command...
  local name=$1 pat=$2; shift 2
  "$@" >"$DT_TMP/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$pat" "$DT_TMP/err"; then pass "$name"; else fail "$name" "rc=$rc: $(head -3 "$DT_TMP/err")"; fi
}
# Losses (step, loss) of a run's metrics, one per line.
same_losses() { # name run_dir
  if cmp -s <(losses "$DT_TMP/run0") <(losses "$2"); then pass "$1"; else fail "$1" "$(diff <(losses "$DT_TMP/run0") <(losses "$2") | head -4)"; fi
}

$W "$DT_TMP/gpt.json" >"$DT_TMP/o0" 2>&1 || fail "uninterrupted run" "$(tail -3 "$DT_TMP/o0")"
if [ "$(cat "$DT_TMP/ck0/latest")" = step_00000060 ] && [ -f "$DT_TMP/ck0/step_00000060/meta.json" ] &&
   [ -f "$DT_TMP/ck0/step_00000050/shard_00000.bin" ] && [ ! -e "$DT_TMP/ck0/step_00000040" ] &&
   grep -q "saved to .* GB/s" "$DT_TMP/o0"; then
  pass "checkpoints every 10 steps and at the end, keep_last 2, time and GB/s logged"
else fail "checkpoint directory layout" "$(ls "$DT_TMP/ck0")"; fi
python3 - "$DT_TMP/ck0/step_00000060/meta.json" <<'PY' && pass "meta.json holds step, config, world, strategy, tensors, ranges, data, rng, scheduler" || fail "meta.json contents"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["step"] == 60 and m["world_size"] == 1 and m["strategy"] == "ddp"
assert m["config"]["train_steps"] == 60 and m["config"]["model"]["n_embd"] == 32
assert m["tensors"][0]["name"] == "wte.weight" and m["tensors"][0]["shape"] == [256, 32]
rs = m["shards"][0]["ranges"]
assert {r["buffer"] for r in rs} == {"params", "m", "v"} and all(r["count"] == m["n_params"] for r in rs)
assert "epoch" in m["data"] and m["data"]["cursor"] > 0 and len(m["rng"]["state"]) == 4
assert m["scheduler"]["step"] == 60 and m["optimizer"]["adam_step"] == 60
PY

# Killed at step 27 (SIGKILL, no chance to save), resumed by the next run.
sed "s#$DT_TMP/ck0#$DT_TMP/ck1#; s#$DT_TMP/run0#$DT_TMP/run1#" "$DT_TMP/gpt.json" > "$DT_TMP/g1.json"
DTRUN_FAULT_KILL_STEP=27 $W "$DT_TMP/g1.json" >"$DT_TMP/o1" 2>&1
rc=$?
$W "$DT_TMP/g1.json" >"$DT_TMP/o1b" 2>&1
if [ $rc -eq 137 ] && grep -q "resumed from .*step_00000020" "$DT_TMP/o1b"; then
  same_losses "killed at step 27, resumed from step 20: identical losses" "$DT_TMP/run1"
else fail "kill and resume" "rc=$rc $(grep -i checkpoint "$DT_TMP/o1b" | head -3)"; fi

# Several ranks (dp): saved by 2 ranks with fsdp, a rank SIGKILLed and the group
# restarted gives the same losses; resumed at other world sizes and strategies
# (3 zero1, 1 ddp, 2 zero2): the same samples, losses within 1e-5 relative.
sed "s#$DT_TMP/ck0#$DT_TMP/mk0#; s#$DT_TMP/run0#$DT_TMP/mrun0#; s#\"train_micro_batch_size_per_gpu\": 8#\"train_batch_size\": 24, \"train_micro_batch_size_per_gpu\": 4#; s#\"train_steps\": 60#\"train_steps\": 30#" \
  "$DT_TMP/gpt.json" > "$DT_TMP/m.json"
"$DTRUN" --nproc_per_node 2 "$DT_TMP/m.json" strategy=fsdp >"$DT_TMP/om0" 2>&1 || fail "2-rank fsdp run" "$(tail -3 "$DT_TMP/om0")"
k=$(python3 -c "import random; print(random.randint(11, 29))")
DTRUN_FAULT_KILL_STEP=$k DTRUN_FAULT_KILL_RANK=1 "$DTRUN" --nproc_per_node 2 --max_restarts 2 "$DT_TMP/m.json" strategy=fsdp \
  checkpoint.dir="$DT_TMP/mk1" log.dir="$DT_TMP/mrun1" >"$DT_TMP/om1" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "SIGKILL to rank 1" "$DT_TMP/om1" && grep -q "resumed from" "$DT_TMP/om1" &&
   cmp -s <(losses "$DT_TMP/mrun0") <(losses "$DT_TMP/mrun1"); then
  pass "2 ranks fsdp: rank 1 SIGKILLed at step $k, group restarted and resumed: same losses"
else fail "2-rank kill and resume (step $k)" "rc=$rc $(grep -i "resumed\|error" "$DT_TMP/om1" | head -3)"; fi
for ws in "3 zero1" "1 ddp" "2 zero2"; do
  set -- $ws
  rm -rf "$DT_TMP/mk2"; mkdir -p "$DT_TMP/mk2"; cp -r "$DT_TMP/mk0/step_00000020" "$DT_TMP/mk2/"; echo step_00000020 > "$DT_TMP/mk2/latest"
  "$DTRUN" --nproc_per_node $1 "$DT_TMP/m.json" strategy=$2 checkpoint.dir="$DT_TMP/mk2" log.dir="$DT_TMP/mrun$1$2" \
    >"$DT_TMP/om2" 2>&1
  if grep -q "resumed from .*step_00000020 (step 20, saved by 2 rank(s) with fsdp)" "$DT_TMP/om2" &&
     python3 - "$DT_TMP/mrun0/metrics.jsonl" "$DT_TMP/mrun$1$2/metrics.jsonl" <<'PY'; then
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
assert sorted(b) == list(range(21, 31)), sorted(b)
assert max(abs(a[s] - b[s]) / abs(a[s]) for s in range(21, 31)) < 1e-5
PY
    pass "saved by 2 ranks fsdp, resumed by $1 with $2: losses within 1e-5"
  else fail "reshard 2 fsdp -> $1 $2" "$(grep -i "resumed\|error" "$DT_TMP/om2" | head -3)"; fi
done

# Preemption at 2 ranks (zero1): both ranks stop after the same step and save.
DTRUN_FAULT_TERM_PARENT_STEP=13 "$DTRUN" --nproc_per_node 2 "$DT_TMP/m.json" strategy=zero1 checkpoint.dir="$DT_TMP/mk3" \
  log.dir="$DT_TMP/mrun3" >"$DT_TMP/om3" 2>&1
rc=$?
"$DTRUN" --nproc_per_node 2 "$DT_TMP/m.json" strategy=zero1 checkpoint.dir="$DT_TMP/mk3" log.dir="$DT_TMP/mrun3" \
  >"$DT_TMP/om4" 2>&1
"$DTRUN" --nproc_per_node 2 "$DT_TMP/m.json" strategy=zero1 checkpoint.dir="$DT_TMP/mk4" log.dir="$DT_TMP/mrun4" \
  >/dev/null 2>&1
if [ $rc -eq 143 ] && grep -q "(SIGTERM) saved" "$DT_TMP/om3" && grep -q "resumed from" "$DT_TMP/om4" &&
   cmp -s <(losses "$DT_TMP/mrun3") <(losses "$DT_TMP/mrun4"); then
  pass "2 ranks zero1: SIGTERM preemption saved, relaunch resumed: same losses"
else fail "2-rank preemption" "rc=$rc $(grep -i "preempt\|resumed\|error" "$DT_TMP/om3" "$DT_TMP/om4" | head -4)"; fi

# Killed in the middle of saving step 30 (after its shard, before meta.json):
# latest still names step 20, the next run resumes from it.
sed "s#$DT_TMP/ck0#$DT_TMP/cks#; s#$DT_TMP/run0#$DT_TMP/runs#" "$DT_TMP/gpt.json" > "$DT_TMP/gs.json"
DTRUN_CKPT_KILL_AT=before_meta:30 $W "$DT_TMP/gs.json" >"$DT_TMP/os" 2>&1
if [ "$(cat "$DT_TMP/cks/latest")" = step_00000020 ] && [ -d "$DT_TMP/cks/step_00000030.tmp" ]; then
  $W "$DT_TMP/gs.json" >"$DT_TMP/os2" 2>&1
  if grep -q "resumed from .*step_00000020" "$DT_TMP/os2" && [ ! -e "$DT_TMP/cks/step_00000030.tmp" ]; then
    same_losses "SIGKILL during a save: previous checkpoint used, same losses, leftovers cleaned" "$DT_TMP/runs"
  else fail "resume after a killed save" "$(grep -i checkpoint "$DT_TMP/os2" | head -3)"; fi
else fail "kill during save" "$(ls "$DT_TMP/cks") $(tail -2 "$DT_TMP/os")"; fi

# Under the launcher: a worker SIGKILLed at a random step, --max_restarts 2.
for seed in 1 2 3; do
  k=$(python3 -c "import random; random.seed($seed); print(random.randint(2, 59))")
  sed "s#$DT_TMP/ck0#$DT_TMP/ckr$seed#; s#$DT_TMP/run0#$DT_TMP/runr$seed#" "$DT_TMP/gpt.json" > "$DT_TMP/gr.json"
  DTRUN_FAULT_KILL_STEP=$k "$DTRUN" --nproc_per_node 1 --max_restarts 2 "$DT_TMP/gr.json" >"$DT_TMP/or" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "restarting the workers (restart 1 of 2)" "$DT_TMP/or"; then
    same_losses "launcher: SIGKILL at step $k, restart, resume: same losses as uninterrupted" "$DT_TMP/runr$seed"
  else fail "launcher restart after SIGKILL at step $k" "rc=$rc $(tail -3 "$DT_TMP/or")"; fi
done

# Preemption: the agent gets SIGTERM (sent here by the worker at step 33, as a
# scheduler would), forwards it; the worker finishes the step, saves, exits 0;
# the agent exits 128+15. The next launch resumes.
sed "s#$DT_TMP/ck0#$DT_TMP/ckp#; s#$DT_TMP/run0#$DT_TMP/runp#" "$DT_TMP/gpt.json" > "$DT_TMP/gp.json"
DTRUN_FAULT_TERM_PARENT_STEP=33 "$DTRUN" --nproc_per_node 1 "$DT_TMP/gp.json" >"$DT_TMP/op" 2>&1
rc=$?
saved=$(cat "$DT_TMP/ckp/latest" 2>/dev/null)
if [ $rc -eq 143 ] && grep -q "preempted by signal 15: stopped after step" "$DT_TMP/op" &&
   grep -q "(SIGTERM) saved" "$DT_TMP/op" && [ "$saved" != step_00000030 ] && [ -n "$saved" ]; then
  pass "SIGTERM to the agent: worker saved $saved and exited 0, agent exit 143"
else fail "SIGTERM preemption" "rc=$rc latest=$saved $(tail -3 "$DT_TMP/op")"; fi
"$DTRUN" --nproc_per_node 1 "$DT_TMP/gp.json" >"$DT_TMP/op2" 2>&1
if grep -q "resumed from .*$saved" "$DT_TMP/op2"; then same_losses "relaunch after preemption resumes: same losses" "$DT_TMP/runp"
else fail "relaunch after preemption" "$(tail -3 "$DT_TMP/op2")"; fi

# checkpoint.resume never (the demo presets' setting, with overwrite): a restart of
# the same launch resumes from this launch's own checkpoint (it used to start over at
# step 1), never from another run's in the same folder (ck0's step 60 copied in).
cp -r "$DT_TMP/ck0" "$DT_TMP/ckn"
sed "s#$DT_TMP/ck0#$DT_TMP/ckn#; s#$DT_TMP/run0#$DT_TMP/runn#; s#\"resume\": \"auto\"#\"resume\": \"never\", \"overwrite\": true#" \
  "$DT_TMP/gpt.json" > "$DT_TMP/gn.json"
DTRUN_FAULT_KILL_STEP=27 "$DTRUN" --nproc_per_node 1 --max_restarts 1 "$DT_TMP/gn.json" >"$DT_TMP/on" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "restarting the workers (restart 1 of 1)" "$DT_TMP/on" \
   && grep -q "resumed from .*step_00000020" "$DT_TMP/on" && ! grep -q "resumed from .*step_00000060" "$DT_TMP/on"; then
  same_losses "resume never: a restart resumes from its own step 20, not another run's: same losses" "$DT_TMP/runn"
else fail "resume never: restart" "rc=$rc $(grep -E 'resumed|restarting|step 1/' "$DT_TMP/on" | head -4)"; fi
# ... and its preemption message says what the next launch does, with the override
DTRUN_FAULT_TERM_PARENT_STEP=33 "$DTRUN" --nproc_per_node 1 "$DT_TMP/gn.json" log.dir="$DT_TMP/runq" >"$DT_TMP/oq" 2>&1; rc=$?
if [ $rc -eq 143 ] && grep -qF 'checkpoint saved; checkpoint.resume is "never", so the next launch of this config starts again at step 1 (checkpoint.resume=auto continues from it)' "$DT_TMP/oq"; then
  "$DTRUN" --nproc_per_node 1 "$DT_TMP/gn.json" log.dir="$DT_TMP/runq2" train_steps=36 >"$DT_TMP/oq1" 2>&1
  "$DTRUN" --nproc_per_node 1 "$DT_TMP/gn.json" log.dir="$DT_TMP/runq3" train_steps=36 checkpoint.resume=auto >"$DT_TMP/oq2" 2>&1
  if ! grep -q "resumed from" "$DT_TMP/oq1" && grep -q "step 1/36" "$DT_TMP/oq1" && grep -q "resumed from .*step_0000003[3-6]" "$DT_TMP/oq2"; then
    pass "resume never: the preemption message tells the truth (next launch at step 1; resume=auto continues)"
  else fail "resume never: next launches" "$(grep -E 'resumed|step 1/' "$DT_TMP/oq1" "$DT_TMP/oq2" | head -4)"; fi
else fail "resume never: preemption message" "rc=$rc $(grep preempted "$DT_TMP/oq")"; fi

# A corrupt latest: auto-resume warns and falls back to the previous one.
cp -r "$DT_TMP/ck1" "$DT_TMP/ckc"
python3 - "$DT_TMP/ckc/step_00000060/shard_00000.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(8192); b = f.read(1); f.seek(8192); f.write(bytes([b[0] ^ 0x40]))
PY
# The only checkpoint corrupt: after the partial read, a fresh start from
# re-initialised state, as if there had been no checkpoint.
mkdir -p "$DT_TMP/cko" && cp -r "$DT_TMP/ckc/step_00000060" "$DT_TMP/ckc/latest" "$DT_TMP/cko/"
$W "$DT_TMP/g1.json" checkpoint.dir="$DT_TMP/cko" log.dir="$DT_TMP/runo" >"$DT_TMP/oo" 2>&1
if grep -q "checksum mismatch" "$DT_TMP/oo" && grep -q "starting from step 0" "$DT_TMP/oo"; then
  same_losses "only checkpoint corrupt: warning, fresh start with the uninterrupted run's losses" "$DT_TMP/runo"
else fail "only checkpoint corrupt" "$(grep -i checkpoint "$DT_TMP/oo" | head -3)"; fi
expect2 "resume from an explicit corrupt checkpoint: exit 2 naming the file" "shard_00000.bin: checksum mismatch" \
  $W "$DT_TMP/g1.json" checkpoint.dir="$DT_TMP/x" checkpoint.resume="$DT_TMP/ckc/step_00000060"
$W "$DT_TMP/g1.json" checkpoint.dir="$DT_TMP/ckc" train_steps=70 log.dir="$DT_TMP/runc" >"$DT_TMP/oc" 2>&1
if grep -q "shard_00000.bin: checksum mismatch.*trying the previous one" "$DT_TMP/oc" &&
   grep -q "resumed from .*step_00000050" "$DT_TMP/oc"; then pass "flipped byte in latest: warning naming the file, fallback to step 50"
else fail "fallback from a corrupt latest" "$(grep -i checkpoint "$DT_TMP/oc" | head -3)"; fi

expect2 "resume with another model: exit 2 naming the tensor" "wte.weight is (256, 32) .* (256, 48)" \
  $W "$DT_TMP/g1.json" model.n_embd=48 checkpoint.resume="$DT_TMP/ck1"
mkdir -p "$DT_TMP/ck1/step_00000099.tmp"
expect2 "resume from a .tmp directory: incomplete" "incomplete" \
  $W "$DT_TMP/g1.json" checkpoint.resume="$DT_TMP/ck1/step_00000099.tmp"
$W "$DT_TMP/g1.json" model.n_embd=48 train_steps=3 log.dir="$DT_TMP/runm" >"$DT_TMP/om" 2>&1
if grep -q "does not match the model" "$DT_TMP/om" && grep -q "starting from step 0" "$DT_TMP/om" &&
   grep -q "step 3/3" "$DT_TMP/om"; then pass "auto-resume with another model: warning, fresh start"
else fail "auto-resume with another model" "$(tail -3 "$DT_TMP/om")"; fi

# An unwritable checkpoint directory: every save reports the problem, training
# goes on to the end, and the run fails (exit 1) because its final save failed.
touch "$DT_TMP/a-file"
$W "$DT_TMP/g1.json" checkpoint.dir="$DT_TMP/a-file/ck" checkpoint.resume=never train_steps=25 log.dir="$DT_TMP/runu" \
  >"$DT_TMP/ou" 2>&1
rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c "cannot create directory $DT_TMP/a-file/ck.*training continues" "$DT_TMP/ou")" -eq 2 ] &&
   grep -q "step 25/25" "$DT_TMP/ou" && grep -q "checkpoint of step 25 (final) failed" "$DT_TMP/ou"; then
  pass "unwritable checkpoint dir: clear errors, training continues, exit 1 at the failed final save"
else fail "unwritable checkpoint dir" "rc=$rc $(tail -3 "$DT_TMP/ou")"; fi

# sample and export
out=$("$DTRUN" sample "$DT_TMP/ck0" --prompt "the quick" --tokens 40 --seed 3 2>"$DT_TMP/se")
if [ "${out:0:9}" = "the quick" ] && [ ${#out} -ge 49 ] &&
   [ "$out" = "$("$DTRUN" sample "$DT_TMP/ck0" --prompt "the quick" --tokens 40 --seed 3 2>/dev/null)" ]; then
  pass "dtrun sample: prompt continued, same seed same text"
else fail "dtrun sample" "$out $(cat "$DT_TMP/se")"; fi
# A token-shard model (GPT-2 vocab, no tokenizer here): ids in, ids out.
python3 - "$DT_TMP/tok.bin" <<'PY'
import random, struct, sys
random.seed(2)
toks = [random.randrange(50257) for _ in range(4000)]
hdr = struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253))
open(sys.argv[1], "wb").write(hdr + struct.pack("<%dH" % len(toks), *toks))
PY
$W "$DT_TMP/g1.json" data.train="$DT_TMP/tok.bin" model.vocab_size=0 train_steps=2 checkpoint.every_steps=2 \
  checkpoint.dir="$DT_TMP/ckt" log.dir="$DT_TMP/runt" >"$DT_TMP/ot" 2>&1
out=$("$DTRUN" sample "$DT_TMP/ckt" --prompt "50256 464" --tokens 5 2>"$DT_TMP/ste")
if echo "$out" | grep -Eq '^[0-9]+( [0-9]+){4}$' && grep -q "no tokenizer" "$DT_TMP/ste"; then
  pass "dtrun sample on a GPT-2-vocab checkpoint: token ids in and out, said so"
else fail "dtrun sample token ids" "$out $(tail -2 "$DT_TMP/ste") $(tail -2 "$DT_TMP/ot")"; fi
expect2 "dtrun sample: a text prompt for a token model is named" "not a list of token ids" \
  "$DTRUN" sample "$DT_TMP/ckt" --prompt "hello"
expect2 "dtrun sample of a missing checkpoint: exit 2 naming it" "nothing-here" "$DTRUN" sample "$DT_TMP/nothing-here"
expect2 "dtrun sample bad flag value" "temperature" "$DTRUN" sample "$DT_TMP/ck0" --temperature hot
if "$DTRUN" export "$DT_TMP/ck0" -o "$DT_TMP/m.safetensors" >"$DT_TMP/oe" 2>&1 && [ -s "$DT_TMP/m.safetensors" ]; then
  pass "dtrun export writes a safetensors file"
else fail "dtrun export" "$(cat "$DT_TMP/oe")"; fi
expect2 "dtrun export without -o" "no -o FILE" "$DTRUN" export "$DT_TMP/ck0"
if python3 -c "import safetensors, torch" 2>/dev/null; then
  "$DTRUN" sample "$DT_TMP/ck0" --prompt "the quick" --tokens 30 --temperature 0 >"$DT_TMP/s1" 2>/dev/null
  if python3 scripts/compat/safetensors_check.py "$DT_TMP/m.safetensors" --n_head 2 --prompt "the quick" --tokens 30 \
       >"$DT_TMP/s2" 2>"$DT_TMP/s2e" && cmp -s "$DT_TMP/s1" "$DT_TMP/s2"; then
    pass "safetensors package loads the export; GPT-2 forward in HF's layout gives dtrun's greedy text"
  else fail "safetensors check" "$(cat "$DT_TMP/s2e" | tail -3) | $(head -c 80 "$DT_TMP/s1") | $(head -c 80 "$DT_TMP/s2")"; fi
else skip "safetensors python check" "pip install safetensors"; fi
# One run per checkpoint folder, on any launcher: a second run into the folder of a
# run in progress is exit 2 naming the first (pid and host), from the launcher
# before any worker and from a bare worker (what `srun dtrun` per task would start);
# once the first ends, the folder is free again.
sed "s#$DT_TMP/ck0#$DT_TMP/ckl#; s#$DT_TMP/run0#$DT_TMP/runl#" "$DT_TMP/gpt.json" > "$DT_TMP/gl.json"
"$DTRUN" --nproc_per_node 1 "$DT_TMP/gl.json" train_steps=100000 steps_per_print=100000 >"$DT_TMP/ol1" 2>&1 & p1=$!
deadline=$((SECONDS + 20))
while ! grep -q "^pid " "$DT_TMP/ckl/.dtrun.lock" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
"$DTRUN" --nproc_per_node 1 "$DT_TMP/gl.json" log.dir="$DT_TMP/runl2" >"$DT_TMP/ol2" 2>&1; rc2=$?
$W "$DT_TMP/gl.json" log.dir="$DT_TMP/runl3" >"$DT_TMP/ol3" 2>&1; rc3=$?
kill -TERM $p1; wait $p1
"$DTRUN" --nproc_per_node 1 "$DT_TMP/gl.json" log.dir="$DT_TMP/runl4" train_steps=2 checkpoint.resume=never checkpoint.overwrite=true >"$DT_TMP/ol4" 2>&1; rc4=$?
if [ $rc2 -eq 2 ] && grep -q "checkpoint.dir is in use by another run (pid [0-9]* on $(hostname)" "$DT_TMP/ol2" \
   && ! grep -q "step 1/" "$DT_TMP/ol2" && [ $rc3 -eq 2 ] && grep -q "in use by another run" "$DT_TMP/ol3" && [ $rc4 -eq 0 ]; then
  pass "checkpoint.dir of a run in progress: exit 2 naming it (launcher and bare worker); free once it ends"
else fail "checkpoint.dir lock" "rc=$rc2/$rc3/$rc4 $(tail -2 "$DT_TMP/ol2") $(tail -2 "$DT_TMP/ol3") $(tail -2 "$DT_TMP/ol4")"; fi
finish
