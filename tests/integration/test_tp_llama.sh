#!/usr/bin/env bash
# test_tp_llama.sh - llama under tensor parallelism (Megatron), through the
# real launcher: a tiny llama (hidden 64, 2 layers, 4 query heads and 2 key/value
# heads, intermediate 128, bytes of text) trained 20 steps at tensor_parallel.size 2
# (each rank 2 query heads and their one key/value head, half the MLP and half the
# vocabulary rows), with and without sequence parallelism, untied and tied with q/k/v
# biases, equals the same model at TP 1 (losses within 1e-5 relative, the gathered
# final parameters within 1e-5 relative L2); TP 4 with 4 key/value heads and sequence
# parallelism, and TP 2 x DP 2 (ddp, fsdp) against 1 rank with accumulation 2, too;
# a TP size that does not divide num_key_value_heads is refused before anything
# starts, naming the key; on the emulated CUDA device (dtrun-emu) TP 2 in fp32 equals
# the CPU at TP 1 as closely, and in bf16 TP 2 with sequence parallelism tracks TP 1 on
# the same device (losses within 2e-2 relative).
# Final parameters come from DTRUN_DUMP_PARAMS=PATH (see test_dp.sh).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 60"
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}

make_text "$DT_TMP/text.txt" 2 3000
cat > "$DT_TMP/llama.json" <<JSON
{"model": {"type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
TIED="model.tie_word_embeddings=true model.attention_bias=true"
TP2="tensor_parallel.size=2"
SP="tensor_parallel.sequence_parallel=true"

# run NAME NPROC ARGS...: trains, dumps parameters to $DT_TMP/NAME.bin, log in $DT_TMP/NAME
run() {
  local name=$1 np=$2; shift 2
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "${BIN:-$DTRUN}" --standalone --nproc_per_node "$np" \
    "$DT_TMP/llama.json" "$@" log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1
}
# same NAME REF [TOL]: losses within TOL relative (1e-5) step by step, the loss falls,
# and (unless TOL is given: bf16) the final parameters within 1e-5 relative L2;
# prints the figures
same() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" "${3:-}" <<'PY'
import json, sys, numpy as np
a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl")]
assert len(la) == len(lb) == 20, (len(la), len(lb))
assert la[-1] < la[0] - 0.5, ("it learns", la[0], la[-1])
dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
if tol:
    print(f"  loss {la[0]:.4f} -> {la[-1]:.4f}, max relative loss difference {dl:.2e}")
    assert dl < float(tol), ("loss", dl)
    sys.exit(0)
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
assert pa.size == pb.size, (pa.size, pb.size)
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
print(f"  loss {la[0]:.4f} -> {la[-1]:.4f}, max relative loss difference {dl:.2e}, parameters {dp:.2e}")
assert dl < 1e-5 and dp < 1e-5, ("loss", dl, "params", dp)
PY
}
# layout NAME TP SP DP: summary.json's parallel layout
layout() {
  python3 - "$DT_TMP/$1/summary.json" "$2" "$3" "$4" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["parallel"]
want = {"tensor_parallel": int(sys.argv[2]), "sequence_parallel": sys.argv[3] == "1", "context_parallel": 1, "pipeline_parallel": 1, "data_parallel": int(sys.argv[4])}
assert p == want, (p, want)
PY
}
# case NAME NPROC REF "TP SP DP" ARGS...: a run with that layout that must equal run REF
case_() {
  local name=$1 np=$2 ref=$3 lay=$4; shift 4
  local what="$name: $np ranks ($*) == $ref"
  if run "$name" "$np" "$@" && same "$name" "$ref" && layout "$name" $lay; then pass "$what"
  else fail "$what" "$(tail -3 "$DT_TMP/$name.out")"; fi
}

# --- GQA, untied: TP 2 (one key/value head per rank), with and without sequence parallelism
run t1 1 || fail "llama TP 1 reference" "$(tail -3 "$DT_TMP/t1.out")"
case_ tp2 2 t1 "2 0 1" $TP2
case_ tp2_sp 2 t1 "2 1 1" $TP2 $SP

# --- tied head with q/k/v biases (Qwen2-like): the head is the vocabulary-parallel embedding
run b1 1 $TIED || fail "llama tied TP 1 reference" "$(tail -3 "$DT_TMP/b1.out")"
case_ tp2_tied 2 b1 "2 0 1" $TIED $TP2
case_ tp2_tied_sp 2 b1 "2 1 1" $TIED $TP2 $SP

# --- TP 4 (4 key/value heads: one query and one key/value head per rank), sequence parallel
H4="model.num_key_value_heads=4 model.attention_bias=true"
run h1 1 $H4 || fail "llama MHA TP 1 reference" "$(tail -3 "$DT_TMP/h1.out")"
case_ tp4_sp 4 h1 "4 1 1" $H4 tensor_parallel.size=4 $SP

# --- TP 2 x DP 2 (the DP group reduces over ranks {0,2} and {1,3}) == 1 rank x A2
run a1 1 gradient_accumulation_steps=2 || fail "llama A2 reference" "$(tail -3 "$DT_TMP/a1.out")"
case_ tp2dp2_ddp 4 a1 "2 1 2" $TP2 $SP strategy=ddp
case_ tp2dp2_fsdp 4 a1 "2 0 2" $TP2 strategy=fsdp

# --- Hugging Face weights (model.pretrained) under TP: each rank reads its piece of
# every tensor from the safetensors; TP 2 (with SP) from the same directory equals TP 1
if run src 1 train_steps=3 checkpoint.dir="$DT_TMP/src_ck" checkpoint.every_steps=3 &&
   "$DTRUN" export "$DT_TMP/src_ck" -o "$DT_TMP/hf" --format hf --dtype fp32 >"$DT_TMP/export.out" 2>&1; then
  run p1 1 model.pretrained="$DT_TMP/hf" || fail "llama from pretrained, TP 1" "$(tail -3 "$DT_TMP/p1.out")"
  case_ pt2 2 p1 "2 1 1" model.pretrained="$DT_TMP/hf" $TP2 $SP
else fail "llama pretrained source" "$(tail -3 "$DT_TMP/src.out" "$DT_TMP/export.out")"; fi

# --- a TP size that does not divide the key/value heads: refused before any worker
$T "$DTRUN" --standalone --nproc_per_node 4 "$DT_TMP/llama.json" tensor_parallel.size=4 \
  log.dir="$DT_TMP/bad" >"$DT_TMP/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "tensor_parallel.size: 4 does not divide model.num_key_value_heads (2)" "$DT_TMP/bad.out" \
   && ! grep -q "\[rank" "$DT_TMP/bad.out"; then
  pass "tensor_parallel.size 4 with 2 key/value heads: refused naming the key (exit 2, no worker)"
else fail "TP 4 with 2 key/value heads" "rc=$rc $(tail -2 "$DT_TMP/bad.out")"; fi

# --- the emulated CUDA device in bf16: TP 2 with sequence parallelism tracks TP 1
if [ ! -x "$EMU" ]; then
  skip "llama TP on the emulated CUDA device" "no $EMU (the emulator build is not part of SAN runs)"
else
  # fp32: the CUDA ops (xent_vp, the embedding's -1 rows, the collectives staged
  # through host buffers) against the CPU at TP 1, as tightly as CPU TP 2
  if BIN=$EMU run ef_sp 2 device=cuda bf16.enabled=false $TP2 $SP && same ef_sp t1 && layout ef_sp 2 1 1 \
     && BIN=$EMU run ef_tied 2 device=cuda bf16.enabled=false $TIED $TP2 && same ef_tied b1; then
    pass "emulated CUDA, fp32: TP 2 (sequence parallel; tied with biases) == CPU TP 1 (1e-5)"
  else fail "emulated CUDA fp32 TP 2" "$(tail -3 "$DT_TMP/ef_sp.out" "$DT_TMP/ef_tied.out")"; fi
  EMUARGS="device=cuda bf16.enabled=true"
  if BIN=$EMU run e1 1 $EMUARGS && BIN=$EMU run e2 2 $EMUARGS $TP2 $SP && same e2 e1 2e-2; then
    pass "emulated CUDA, bf16: TP 2 with sequence parallelism == TP 1 (losses within 2e-2)"
  else fail "emulated CUDA TP 2" "$(tail -3 "$DT_TMP/e2.out" "$DT_TMP/e1.out")"; fi
fi
finish
