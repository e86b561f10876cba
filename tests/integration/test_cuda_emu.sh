#!/usr/bin/env bash
# test_cuda_emu.sh - the CUDA device end to end, on machines without a GPU: the
# trainer built against the CPU emulator of CUDA (dtrun-emu: kernels/cuda/*.cu
# compiled by g++ with tests/cuemu, see tests/cuemu/cuemu.h) runs a small GPT on
# the "GPU" and is compared with the CPU trainer (the plain dtrun) from the same
# initialisation: losses within 1e-4 relative in fp32, 1e-2 with bf16 (the
# issue's whole-model bounds); two ranks sharing the one emulated GPU through the
# shared-memory communicator against two CPU ranks, with device memory made
# unreadable from the host (DTRUN_CUEMU_HOST_GUARD) so the ranks must stage
# through host buffers as on a real GPU; bf16 master
# weights survive a checkpoint and resume bitwise; model state is 16 bytes per
# parameter; ZeRO-2 and FSDP match their CPU runs; device auto picks the GPU and
# falls back to the CPU without one; the fused attention (DTRUN_CUDA_ATTENTION=fused)
# trains as the CPU does too.
# The emulator build is part of `make test` but not of `make test SAN=1`.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EMU=${DTRUN_EMU:-$ROOT/dtrun-emu}
if [ ! -x "$EMU" ]; then
  skip "CUDA device on the emulator" "no $EMU (the emulator build is not part of SAN runs)"
  finish
fi

make_text "$DT_TMP/text.txt" 3 4000
cat >"$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 4, "train_steps": 12, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 0}, "threads": 1, "seed": 11,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
# run NAME BINARY NPROC KEY=VALUE...: a launch; logs under $DT_TMP/NAME
run() {
  local name=$1 bin=$2 np=$3; shift 3
  timeout 300 "$bin" --standalone --nproc_per_node "$np" "$DT_TMP/gpt.json" log.dir="$DT_TMP/$name" "$@" \
    >"$DT_TMP/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "run $name: exit $rc: $(tail -5 "$DT_TMP/$name.out")"
  return $rc
}
# close NAME A B TOL: the losses of runs A and B agree within TOL (relative), step by step
close() {
  python3 - "$DT_TMP/$2/metrics.jsonl" "$DT_TMP/$3/metrics.jsonl" "$4" <<'PY' && pass "$1" || fail "$1"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(a) == len(b) == 12, (len(a), len(b))
d = max(abs(x - y) / abs(y) for x, y in zip(a, b))
print(f"max relative difference {d:.2e} (tolerance {tol:g}); loss {a[0]:.4f} -> {a[-1]:.4f}")
assert d <= tol, d
assert a[-1] < a[0] - 0.3, "the loss does not fall"
PY
}

run cpu1 "$DTRUN" 1 device=cpu || fail "cpu reference run"
if run emu_fp32 "$EMU" 1 device=cuda bf16.enabled=false; then
  grep -q '"device":[[:space:]]*"cuda"' "$DT_TMP/emu_fp32/summary.json" && pass "device=cuda trains on the (emulated) GPU" ||
    fail "device=cuda trains on the (emulated) GPU" "summary: $(head -c 300 "$DT_TMP/emu_fp32/summary.json")"
  close "GPU fp32 vs CPU: losses within 1e-4" emu_fp32 cpu1 1e-4
else fail "device=cuda, fp32"; fi

if run emu_bf16 "$EMU" 1 device=cuda bf16.enabled=true; then
  close "GPU bf16 vs CPU: losses within 1e-2" emu_bf16 cpu1 1e-2
  python3 - "$DT_TMP/emu_bf16/summary.json" <<'PY' && pass "bf16: model state 16 bytes per parameter (2 param + 2 grad + 4 master + 8 Adam)" || fail "bf16 model state bytes"
import json, sys
s = json.load(open(sys.argv[1]))
ms = s["ranks"][0]["model_state_bytes"]
n = s["padded_params"]
print(ms, n)
assert ms["params"] == 2 * n and ms["grads"] == 2 * n and ms["master"] == 4 * n and ms["optim"] == 8 * n, ms
assert ms["total"] == ms["expected"] == 16 * n
PY
else fail "device=cuda, bf16"; fi

# The fused attention kernel (kernels/cuda/cuda_attention_fused.cu; HS = 16 here, so
# bf16 runs its tensor-core build) trains to the same losses as the CPU.
if DTRUN_CUDA_ATTENTION=fused run emu_fused_fp32 "$EMU" 1 device=cuda bf16.enabled=false; then
  close "GPU fp32, fused attention, vs CPU: losses within 1e-4" emu_fused_fp32 cpu1 1e-4
else fail "device=cuda, fp32, DTRUN_CUDA_ATTENTION=fused"; fi
if DTRUN_CUDA_ATTENTION=fused run emu_fused_bf16 "$EMU" 1 device=cuda bf16.enabled=true; then
  close "GPU bf16, fused attention, vs CPU: losses within 1e-2" emu_fused_bf16 cpu1 1e-2
else fail "device=cuda, bf16, DTRUN_CUDA_ATTENTION=fused"; fi
DTRUN_CUDA_ATTENTION=flash run emu_attn_bad "$EMU" 1 device=cuda bf16.enabled=false
rc=$?
[ $rc -ne 0 ] && grep -q "DTRUN_CUDA_ATTENTION='flash'" "$DT_TMP/emu_attn_bad.out" &&
  pass "an unknown DTRUN_CUDA_ATTENTION fails, named (exit $rc)" ||
  fail "an unknown DTRUN_CUDA_ATTENTION fails, named" "exit $rc: $(tail -3 "$DT_TMP/emu_attn_bad.out")"

run cpu2 "$DTRUN" 2 device=cpu comm.backend=shm || fail "cpu reference run, 2 ranks"
if DTRUN_CUEMU_HOST_GUARD=1 run emu2_shm "$EMU" 2 device=cuda bf16.enabled=false comm.backend=shm; then
  close "2 ranks sharing one GPU through shm (host staging) vs 2 CPU ranks: within 1e-4" emu2_shm cpu2 1e-4
  grep -q "share 1 GPU" "$DT_TMP/emu2_shm.out" && pass "ranks sharing a GPU are told so" ||
    fail "ranks sharing a GPU are told so" "$(head -5 "$DT_TMP/emu2_shm.out")"
else fail "2 ranks on one GPU (shm)"; fi

# bf16.stochastic_rounding: the bf16 copies of the masters are rounded stochastically;
# training still tracks the CPU, differs from rounding to nearest, and repeats bit for bit.
if run emu_sr "$EMU" 1 device=cuda bf16.enabled=true bf16.stochastic_rounding=true &&
   run emu_sr2 "$EMU" 1 device=cuda bf16.enabled=true bf16.stochastic_rounding=true; then
  close "bf16 with stochastic rounding vs CPU: within 1e-2" emu_sr cpu1 1e-2
  if cmp -s "$DT_TMP/emu_sr/metrics.jsonl" "$DT_TMP/emu_bf16/metrics.jsonl"; then
    fail "stochastic rounding changes the bf16 parameters" "same losses as rounding to nearest"
  else pass "stochastic rounding changes the bf16 parameters"; fi
  python3 - "$DT_TMP/emu_sr/metrics.jsonl" "$DT_TMP/emu_sr2/metrics.jsonl" <<'PY' && pass "stochastic rounding is deterministic run to run" || fail "stochastic rounding is deterministic"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:3])
assert a == b, (a, b)
PY
else fail "bf16 stochastic rounding runs"; fi

# communication_data_type: gradients cast to another dtype for their reduction and back
# (bf16 compute reduced in fp32 on the GPU; fp32 compute over a bf16 wire on the CPU).
if run emu2_bf16_f32wire "$EMU" 2 device=cuda bf16.enabled=true communication_data_type=fp32 &&
   run cpu2_bf16wire "$DTRUN" 2 device=cpu communication_data_type=bf16; then
  close "GPU bf16 compute, fp32 reductions, 2 ranks vs CPU: within 1e-2" emu2_bf16_f32wire cpu2 1e-2
  close "CPU fp32 compute over a bf16 wire, 2 ranks vs fp32 wire: within 1e-2" cpu2_bf16wire cpu2 1e-2
  python3 - "$DT_TMP/cpu2_bf16wire/summary.json" <<'PY' && pass "bf16 wire: a bf16 copy of the gradients is the comm buffer" || fail "bf16 wire comm buffer"
import json, sys
s = json.load(open(sys.argv[1]))
r = s["ranks"][0]
assert r["comm_buffer_bytes"] >= 2 * s["padded_params"], r
PY
else fail "communication_data_type runs"; fi

# ZeRO-2 and FSDP on the GPU: gradient shards accumulate on the device, FSDP units
# gather on it (two ranks sharing the GPU, staged), against the same strategy on CPU.
for st in zero2 fsdp; do
  run "cpu2_$st" "$DTRUN" 2 device=cpu strategy=$st || fail "cpu reference run, $st"
  if DTRUN_CUEMU_HOST_GUARD=1 run "emu2_$st" "$EMU" 2 device=cuda bf16.enabled=false strategy=$st; then
    close "$st on the GPU, 2 ranks, fp32 vs CPU: within 1e-4" "emu2_$st" "cpu2_$st" 1e-4
  else fail "$st on the GPU, 2 ranks"; fi
done
if DTRUN_CUEMU_HOST_GUARD=1 run emu2_fsdp_bf16 "$EMU" 2 device=cuda bf16.enabled=true strategy=fsdp; then
  close "fsdp on the GPU, 2 ranks, bf16 vs CPU: within 1e-2" emu2_fsdp_bf16 cpu2_fsdp 1e-2
else fail "fsdp bf16 on the GPU, 2 ranks"; fi

# NCCL needs a GPU per rank: asked for with two ranks on one GPU, it is refused by name.
DTRUN_CUEMU_GPUS=1 run nccl_shared "$EMU" 2 device=cuda comm.backend=nccl train_steps=2
if grep -q "comm.backend nccl needs one GPU per rank, but 2 ranks share 1 GPU" "$DT_TMP/nccl_shared.out"; then
  pass "comm.backend nccl with two ranks on one GPU: refused, naming why"
else fail "comm.backend nccl with two ranks on one GPU" "$(tail -3 "$DT_TMP/nccl_shared.out")"; fi

# bf16 with fp32 masters: stop at step 6 with a checkpoint, resume, and land on the
# same losses as the uninterrupted run (the masters, not the bf16 copies, are saved).
C="checkpoint.dir=$DT_TMP/ck checkpoint.every_steps=6"
if run ck_full "$EMU" 1 device=cuda bf16.enabled=true && run ck_a "$EMU" 1 device=cuda bf16.enabled=true $C train_steps=6 &&
   run ck_b "$EMU" 1 device=cuda bf16.enabled=true $C checkpoint.resume=auto; then
  python3 - "$DT_TMP/ck_full/metrics.jsonl" "$DT_TMP/ck_b/metrics.jsonl" <<'PY' && pass "bf16 resume from a checkpoint: steps 7-12 bitwise equal to the uninterrupted run" || fail "bf16 resume"
import json, sys
full = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
res = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
tail = [s for s in res if s > 6]
assert tail == list(range(7, 13)), tail
bad = [(s, full[s], res[s]) for s in tail if full[s] != res[s]]
assert not bad, bad
PY
else fail "bf16 checkpoint runs"; fi

# device auto: the GPU when one is visible, else the CPU.
if run auto_gpu "$EMU" 1 device=auto train_steps=2; then
  grep -q '"device":[[:space:]]*"cuda"' "$DT_TMP/auto_gpu/summary.json" && pass "device=auto picks the visible GPU" ||
    fail "device=auto picks the visible GPU"
else fail "device=auto with a GPU"; fi
if DTRUN_CUEMU_GPUS=0 run auto_cpu "$EMU" 1 device=auto train_steps=2; then
  grep -q '"device":[[:space:]]*"cpu"' "$DT_TMP/auto_cpu/summary.json" && pass "device=auto without a GPU falls back to the CPU" ||
    fail "device=auto without a GPU falls back to the CPU"
else fail "device=auto without a GPU"; fi
finish
