#!/usr/bin/env bash
# test_recompute.sh - activation recomputation (activation_checkpointing) through the
# real launcher: 20 steps of gpt and llama with each policy (selective, full, full
# every 2) equal the run without, bitwise (metrics losses and the DTRUN_DUMP_PARAMS
# dump); the same with FSDP on 2 ranks (a recomputed block's unit gathered again in
# the backward), TP 2 (the recompute's collectives) and 2 pipeline stages; each
# policy's activation_bytes in summary.json smaller as the arena formula says
# (full < selective < none); DeepSpeed's section alone means full and its no-effect
# keys warn; bad values are errors naming the key; on the emulated GPU within the
# usual tolerance.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 120"

make_text "$DT_TMP/text.txt" 1 3000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 3, "n_head": 4, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
cat > "$DT_TMP/llama.json" <<JSON
{"model": {"type": "llama", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 64, "seq_len": 32, "vocab_size": 256,
           "max_position_embeddings": 64},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# run NAME MODEL NPROC ARGS...: trains, dumps the whole model's parameters to $DT_TMP/NAME.bin
run() {
  local name=$1 model=$2 np=$3; shift 3
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "${BIN:-$DTRUN}" --standalone --nproc_per_node "$np" \
    "$DT_TMP/$model.json" log.dir="$DT_TMP/$name" "$@" >"$DT_TMP/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "run $name: exit $rc: $(tail -5 "$DT_TMP/$name.out")"
  return $rc
}
# bitwise NAME REF: every logged loss and the parameter dump of NAME equal REF's exactly
bitwise() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" <<'PY'
import json, sys
a, b = sys.argv[1], sys.argv[2]
la = [(j["step"], j["loss"]) for j in map(json.loads, open(a + "/metrics.jsonl"))]
lb = [(j["step"], j["loss"]) for j in map(json.loads, open(b + "/metrics.jsonl"))]
assert len(la) == 20 and la == lb, (la[:3], lb[:3])
pa, pb = open(a + ".bin", "rb").read(), open(b + ".bin", "rb").read()
assert len(pa) > 0 and pa == pb, "parameters differ"
PY
}
# close NAME REF TOL: losses and parameters within TOL relative (the emulated GPU)
close() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" "$3" <<'PY'
import json, sys, numpy as np
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
la = {j["step"]: j["loss"] for j in map(json.loads, open(a + "/metrics.jsonl"))}
lb = {j["step"]: j["loss"] for j in map(json.loads, open(b + "/metrics.jsonl"))}
dl = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in lb)
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
print(f"losses {dl:.1e}, parameters {dp:.1e} relative")
assert dl < tol and dp < tol, (dl, dp)
PY
}
# acts NAME: rank 0's activation_bytes in summary.json
acts() { python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["ranks"][0]["activation_bytes"]))' "$DT_TMP/$1/summary.json"; }
policy_of() { python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["activation_checkpointing"]; print(a["policy"], a["every"], a["checkpointed_blocks"])' "$DT_TMP/$1/summary.json"; }

# ---- one rank: each policy bitwise, gpt and llama ----
for m in gpt llama; do
  run "$m-none" $m 1 || fail "$m none runs"
  for p in selective full; do
    run "$m-$p" $m 1 activation_checkpointing.policy=$p && check "$m $p: losses and parameters bitwise" bitwise "$m-$p" "$m-none" || fail "$m $p runs"
  done
  run "$m-every2" $m 1 activation_checkpointing.policy=full activation_checkpointing.every=2 &&
    check "$m full every 2: bitwise" bitwise "$m-every2" "$m-none" || fail "$m every 2 runs"
  n=$(acts "$m-none"); s=$(acts "$m-selective"); f=$(acts "$m-full"); e=$(acts "$m-every2")
  check "$m activation bytes: full ($f) < every 2 ($e) < none ($n), full < selective ($s) < none" \
    test "$f" -lt "$e" -a "$e" -lt "$n" -a "$f" -lt "$s" -a "$s" -lt "$n"
  check "$m summary.json names the policy" test "$(policy_of "$m-every2")" = "full 2 2"
done

# ---- FSDP on 2 ranks: the recomputed unit gathered again in the backward ----
for m in gpt llama; do
  run "$m-fsdp-none" $m 2 strategy=fsdp zero_optimization.overlap_comm=true || fail "$m fsdp none runs"
  run "$m-fsdp-full" $m 2 strategy=fsdp zero_optimization.overlap_comm=true activation_checkpointing.policy=full &&
    check "$m fsdp 2 ranks, full: bitwise" bitwise "$m-fsdp-full" "$m-fsdp-none" || fail "$m fsdp full runs"
done
run gpt-zero2-sel gpt 2 strategy=zero2 activation_checkpointing.policy=selective &&
  run gpt-zero2-none gpt 2 strategy=zero2 && check "gpt zero2 2 ranks, selective: bitwise" bitwise gpt-zero2-sel gpt-zero2-none
run gpt-ddp-full gpt 2 strategy=ddp activation_checkpointing.policy=full activation_checkpointing.every=2 &&
  run gpt-ddp-none gpt 2 strategy=ddp && check "gpt ddp 2 ranks, full every 2: bitwise" bitwise gpt-ddp-full gpt-ddp-none
# the use sequence knows the recompute: with prefetch, no gather waits on demand beyond the run without
ondemand() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["overlap"]["gathers_on_demand"])' "$DT_TMP/$1/summary.json"; }
check "fsdp full: no more on-demand gathers than without ($(ondemand gpt-fsdp-full) vs $(ondemand gpt-fsdp-none))" \
  test "$(ondemand gpt-fsdp-full)" -le "$(ondemand gpt-fsdp-none)"

# ---- TP 2 (with and without sequence parallelism) and 2 pipeline stages ----
for m in gpt llama; do
  run "$m-tp-none" $m 2 tensor_parallel.size=2 || fail "$m tp none runs"
  run "$m-tp-full" $m 2 tensor_parallel.size=2 activation_checkpointing.policy=full &&
    check "$m TP 2, full: bitwise" bitwise "$m-tp-full" "$m-tp-none" || fail "$m tp full runs"
done
run gpt-sp-none gpt 2 tensor_parallel.size=2 tensor_parallel.sequence_parallel=true &&
  run gpt-sp-sel gpt 2 tensor_parallel.size=2 tensor_parallel.sequence_parallel=true activation_checkpointing.policy=selective &&
  check "gpt TP 2 sequence parallel, selective: bitwise" bitwise gpt-sp-sel gpt-sp-none
for m in gpt llama; do
  run "$m-pp-none" $m 2 pipeline.stages=2 gradient_accumulation_steps=2 || fail "$m pp none runs"
  run "$m-pp-full" $m 2 pipeline.stages=2 gradient_accumulation_steps=2 activation_checkpointing.policy=full &&
    check "$m PP 2, full: bitwise" bitwise "$m-pp-full" "$m-pp-none" || fail "$m pp full runs"
done

# ---- the config: DeepSpeed's section, warnings, errors naming the key ----
run ds gpt 1 activation_checkpointing.partition_activations=true train_steps=2 &&
  check "DeepSpeed's section alone means full" test "$(policy_of ds)" = "full 1 3" &&
  check "a key without effect warns, naming it" grep -q "activation_checkpointing.partition_activations is accepted and has no effect" "$DT_TMP/ds.out"
run nck gpt 1 activation_checkpointing.number_checkpoints=2 train_steps=2 &&
  check "number_checkpoints 2 of 3 blocks: every 2" test "$(policy_of nck)" = "full 2 2"
bad() {
  local name=$1 key=$2; shift 2
  $T "$DTRUN" --standalone --nproc_per_node 1 "$DT_TMP/gpt.json" log.dir="$DT_TMP/bad" "$@" >"$DT_TMP/bad.out" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -q "$key" "$DT_TMP/bad.out"; then pass "$name"; else fail "$name" "exit $rc: $(tail -2 "$DT_TMP/bad.out")"; fi
}
bad "unknown policy: exit 2 naming the key" "activation_checkpointing.policy" activation_checkpointing.policy=most
bad "every 0: exit 2 naming the key" "activation_checkpointing.every" activation_checkpointing.every=0
bad "number_checkpoints above the blocks: exit 2 naming the key" "activation_checkpointing.number_checkpoints" activation_checkpointing.number_checkpoints=9
bad "mlp with a policy: exit 2 naming the key" "activation_checkpointing.policy" model.type=mlp activation_checkpointing.policy=full data.train=null

# ---- the emulated GPU (tests/cuemu): within the usual tolerance ----
if [ -x ./dtrun-emu ]; then
  for p in selective full; do
    BIN=./dtrun-emu run "emu-gpt-$p" gpt 1 device=cuda bf16.enabled=false train_steps=5 activation_checkpointing.policy=$p &&
      BIN=./dtrun-emu run emu-gpt-none gpt 1 device=cuda bf16.enabled=false train_steps=5 &&
      check "emulated GPU, gpt $p: within 1e-5 of none" close "emu-gpt-$p" emu-gpt-none 1e-5
  done
  BIN=./dtrun-emu run emu-llama-full llama 1 device=cuda bf16.enabled=false train_steps=5 activation_checkpointing.policy=full &&
    BIN=./dtrun-emu run emu-llama-none llama 1 device=cuda bf16.enabled=false train_steps=5 &&
    check "emulated GPU, llama full: within 1e-5 of none" close emu-llama-full emu-llama-none 1e-5
else
  skip "emulated GPU" "build dtrun-emu and build-emu/libdtrun_cuda.so (make -j2 dtrun-emu libdtrun_cuda_emu.so)"
fi
finish
