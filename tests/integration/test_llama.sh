#!/usr/bin/env bash
# test_llama.sh - a tiny llama (grouped-query attention: 4 query heads, 2 key/value
# heads; 2 layers, hidden 32, intermediate 48, bytes of text) trained through the real
# launcher: 2 ranks with accumulation 1 equal 1 rank with accumulation 2 (losses and
# final parameters within 1e-5 relative after 20 steps) under ddp, zero1, zero2 and
# fsdp, untied (the head in the last FSDP unit) and tied with q/k/v biases (the head
# is unit 0 again); every rank's model-state bytes in summary.json equal the
# strategy's formula; a checkpoint resumes at another world size and strategy and
# `dtrun sample` reads it (its float and bool keys come back from meta.json); a
# vocabulary of 128256 trains on uint16 token shards; on the emulated CUDA device
# (dtrun-emu) it tracks the CPU in fp32 and bf16, both attention kinds, and fsdp.
# Final parameters come from DTRUN_DUMP_PARAMS=PATH (see test_dp.sh).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 60"

make_text "$DT_TMP/text.txt" 2 3000
cat > "$DT_TMP/llama.json" <<JSON
{"model": {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 48, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
TIED="model.tie_word_embeddings=true model.attention_bias=true"

# run NAME NPROC ARGS...: trains, dumps parameters to $DT_TMP/NAME.bin, log in $DT_TMP/NAME
run() {
  local name=$1 np=$2; shift 2
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "$DTRUN" --standalone --nproc_per_node "$np" "$DT_TMP/llama.json" \
    "$@" log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1
}
# same NAME REF: losses and final parameters within 1e-5 relative (L2; 1e-4 elementwise
# of the largest, as test_dp.sh: a key bias has an exactly zero true gradient)
same() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" <<'PY'
import json, sys, numpy as np
a, b = sys.argv[1], sys.argv[2]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl")]
assert len(la) == len(lb) == 20, (len(la), len(lb))
assert la[-1] < la[0] - 0.5, ("it learns", la[0], la[-1])
dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
assert pa.size == pb.size, (pa.size, pb.size)
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
dmax = float(np.abs(pa - pb).max() / np.abs(pb).max())
assert dl < 1e-5 and dp < 1e-5 and dmax < 1e-4, ("loss", dl, "params", dp, "max", dmax)
PY
}
# mem NAME STRATEGY NPARAMS: the parameter count, and every rank's model-state bytes
# equal the formula (CPU fp32, Ψp padded: ddp 16Ψ, zero1 8Ψp+8Ψp/N, zero2 4Ψp+12Ψp/N,
# fsdp 16Ψp/N)
mem() {
  python3 - "$DT_TMP/$1/summary.json" "$2" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); st = sys.argv[2]
P, Pp, W, N = s["n_params"], s["padded_params"], s["world_size"], s["n_shards"]
assert P == int(sys.argv[3]), ("parameters", P, sys.argv[3])
assert 0 <= Pp - P < s["n_buckets"] * N, (P, Pp)
want = {"ddp": 16 * P, "zero1": 8 * Pp + 8 * Pp // N, "zero2": 4 * Pp + 12 * Pp // N, "fsdp": 16 * Pp // N}[st]
assert len(s["ranks"]) == W, len(s["ranks"])
for r in s["ranks"]:
    ms = r["model_state_bytes"]
    assert ms["total"] == want == ms["expected"], (r["rank"], ms, want)
    assert r["peak_bytes"] >= ms["total"] + r["activation_bytes"]
PY
}

# The table: embed 256x32 + 2 x (32 + q 32x32 + k, v 16x32 + o 32x32 + 32 + gate, up
# 48x32 + down 32x48) + norm 32 + lm_head 256x32; tied: no lm_head, q/k/v biases 64.
UNTIED=$((256 * 32 + 2 * (32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 32 + 3 * 48 * 32) + 32 + 256 * 32))
TIEDN=$((UNTIED - 256 * 32 + 2 * 64))

run l1 1 gradient_accumulation_steps=2 || fail "llama reference" "$(tail -3 "$DT_TMP/l1.out")"
for s in ddp zero1 zero2 fsdp; do
  if run l2_$s 2 strategy=$s && same l2_$s l1 && mem l2_$s $s $UNTIED; then
    pass "llama $s: 2 ranks == 1 rank x A2 (GQA, untied head), memory formula"
  else fail "llama $s 2 ranks" "$(tail -3 "$DT_TMP/l2_$s.out")"; fi
done
run t1 1 $TIED gradient_accumulation_steps=2 || fail "tied llama reference" "$(tail -3 "$DT_TMP/t1.out")"
for s in zero2 fsdp; do
  if run t2_$s 2 $TIED strategy=$s && same t2_$s t1 && mem t2_$s $s $TIEDN; then
    pass "llama $s: 2 ranks == 1 rank x A2 (tied head, q/k/v biases), memory formula"
  else fail "tied llama $s 2 ranks" "$(tail -3 "$DT_TMP/t2_$s.out")"; fi
done

# --- checkpoint: 10 steps on 2 ranks (fsdp), resumed on 1 rank (ddp) to step 20,
# equals the uninterrupted 1-rank run; sample reads it
ck="$DT_TMP/ck"
if run c2 2 strategy=fsdp train_steps=10 checkpoint.dir="$ck" checkpoint.every_steps=10 \
   && run c1 1 gradient_accumulation_steps=2 checkpoint.dir="$ck" checkpoint.resume=auto \
   && python3 - "$DT_TMP/c1" "$DT_TMP/l1" <<'PY'
import json, sys, numpy as np
got = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
ref = {m["step"]: m["loss"] for m in map(json.loads, open(sys.argv[2] + "/metrics.jsonl"))}
assert got[0]["step"] == 11 and got[-1]["step"] == 20, (got[0]["step"], got[-1]["step"])
for m in got: assert abs(m["loss"] - ref[m["step"]]) <= 1e-5 * ref[m["step"]], (m["step"], m["loss"], ref[m["step"]])
pa, pb = np.fromfile(sys.argv[1] + ".bin", np.float32), np.fromfile(sys.argv[2] + ".bin", np.float32)
assert float(np.linalg.norm(pa - pb) / np.linalg.norm(pb)) < 1e-5
PY
then pass "llama checkpoint: fsdp x2 to step 10, resumed on 1 rank (ddp) == uninterrupted"
else fail "llama checkpoint resume" "$(tail -3 "$DT_TMP/c1.out")"; fi
if $T "$DTRUN" sample "$ck" --tokens 16 --temperature 0 >"$DT_TMP/sample.out" 2>&1 && [ -s "$DT_TMP/sample.out" ]; then
  pass "dtrun sample reads a llama checkpoint"
else fail "llama sample" "$(tail -3 "$DT_TMP/sample.out")"; fi

# --- a vocabulary beyond uint16 (Llama 3's 128256) trains on uint16 token shards (ids
# below 65536): the loss starts at ln(128256) and falls; the head's padded width is exact
python3 - "$DT_TMP/tok.bin" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(3)
toks = np.tile(rng.integers(0, 65536, 64, dtype=np.uint16), 40)  # a repeating pattern to learn
hdr = np.zeros(256, np.int32); hdr[:3] = (20240520, 1, toks.size)
open(sys.argv[1], "wb").write(hdr.tobytes() + toks.tobytes())
PY
if run v1 1 data.train="$DT_TMP/tok.bin" model.vocab_size=128256 train_steps=8 optimizer.params.lr=1e-2 \
   && python3 - "$DT_TMP/v1" <<'PY'
import json, math, sys
la = [json.loads(l)["loss"] for l in open(sys.argv[1] + "/metrics.jsonl")]
s = json.load(open(sys.argv[1] + "/summary.json"))
assert abs(la[0] - math.log(128256)) < 0.05, la[0]
assert la[-1] < la[0] - 0.5, la
assert s["n_params"] == 2 * 128256 * 32 + 2 * (32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 32 + 3 * 48 * 32) + 32, s["n_params"]
PY
then pass "llama with vocab 128256 trains on uint16 token shards (loss from ln V down)"
else fail "llama vocab 128256 on shards" "$(tail -3 "$DT_TMP/v1.out")"; fi

# --- the CUDA device (the emulator build, dtrun-emu; see test_cuda_emu.sh): the same
# llama on the "GPU" tracks the CPU from the same initialisation, fp32 within 1e-4,
# bf16 within 1e-2, both attention kinds; fsdp on 2 ranks sharing the GPU (staged
# through host buffers) against fsdp on 2 CPU ranks; tied with biases too
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}
# close A B TOL: losses within TOL relative, step by step, and falling
close() {
  python3 - "$DT_TMP/$1/metrics.jsonl" "$DT_TMP/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
d = max(abs(x - y) / abs(y) for x, y in zip(a, b))
assert d <= float(sys.argv[3]) and a[-1] < a[0] - 0.5, (d, a[0], a[-1])
PY
}
# emu NAME NPROC ARGS...: a run of the emulator build (parameters dumped as run does)
emu() {
  local name=$1 np=$2; shift 2
  # A hang guard of 300 s, as test_cuda_emu.sh's: the emulator runs the GPU's
  # threads on the CPU, and 2 emulated fsdp ranks of 20 steps took over 60 s on a
  # loaded machine (the guard killed a healthy run at step 13).
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" timeout -k 2 300 "$EMU" --standalone --nproc_per_node "$np" "$DT_TMP/llama.json" \
    device=cuda "$@" log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1
}
if [ ! -x "$EMU" ]; then
  skip "llama on the CUDA device (emulator)" "no $EMU (the emulator build is not part of SAN runs)"
else
  run c1ref 1 gradient_accumulation_steps=2 device=cpu || fail "cpu reference"
  for k in cublas fused; do
    if DTRUN_CUDA_ATTENTION=$k emu e_$k 1 gradient_accumulation_steps=2 bf16.enabled=false && close e_$k c1ref 1e-4 \
       && DTRUN_CUDA_ATTENTION=$k emu eb_$k 1 gradient_accumulation_steps=2 bf16.enabled=true && close eb_$k c1ref 1e-2; then
      pass "llama on the GPU ($k attention): fp32 within 1e-4 of the CPU, bf16 within 1e-2"
    else fail "llama on the GPU ($k attention)" "$(tail -3 "$DT_TMP/e_$k.out" "$DT_TMP/eb_$k.out")"; fi
  done
  if run cf2 2 $TIED strategy=fsdp device=cpu && DTRUN_CUEMU_HOST_GUARD=1 emu ef2 2 $TIED strategy=fsdp bf16.enabled=false \
     && close ef2 cf2 1e-4; then
    pass "llama fsdp on the GPU, 2 ranks (tied, biases), fp32 within 1e-4 of fsdp on CPU"
  else fail "llama fsdp on the GPU" "$(tail -3 "$DT_TMP/ef2.out")"; fi
fi

finish
