#!/usr/bin/env bash
# gpu_check.sh - the one GPU run (under 8 minutes on one H200). Run on the GPU
# machine after scripts/gpu_pack.sh here: `bash scripts/gpu_check.sh` with
# carry [".carry"]. Uses the carried binaries (.carry/bin) and libraries
# (.carry/lib); with no .carry it builds there with `make` (needs our Debian
# libraries). Full logs go to $OUT (or /tmp/gpu_check); a short table is last.
#
#   0. dtrun links no CUDA library and loads libdtrun_cuda.so (beside it) on the GPU
#   1. the CPU emulator's own tests on the real GPU (tests/cuemu: same semantics?)
#   2. every CUDA op against the CPU op (tests/gpu/test_kernels_cuda*)
#   3. the NCCL communicator at world size 1, every op on device buffers; `dtrun
#      bench comm --device cuda` over NCCL (1 rank, 8 B..256 MiB) and over shared
#      memory with host staging (2 ranks sharing the GPU): bandwidth, every size exact
#   4. a small GPT trained 20 steps on the GPU vs the CPU from the same init:
#      losses within 1e-4 relative with bf16 off, 1e-2 with bf16 on
#   5. two ranks sharing the GPU through the shared-memory communicator (host
#      staging) vs two CPU ranks
#   6. GPT-2 124M bf16, seq 1024: tokens/s and MFU over 50 steps after 10 of
#      warm-up; peak memory against `dtrun plan`
#   7. the same model in PyTorch (bf16 autocast, torch.compile, fused AdamW), ratio
#   8. attention, cuBLAS path vs fused kernel (DTRUN_CUDA_ATTENTION=fused):
#      bench_cuda_layers --attention-only at B=8 and 32, and the GPT-2 run of 6
#      again with the fused kernel (30 steps, 10 of warm-up)
# Knobs: GPT2_BATCH (micro-batch, default 32), SKIP_TORCH=1, TORCH_TIMEOUT,
# SKIP_FUSED_GPT2=1.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
if [ -d .carry/bin ]; then
  BIN=$PWD/.carry/bin; export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
else
  make -s CUDA_ARCH="-gencode arch=compute_90,code=sm_90" dtrun libdtrun_cuda.so gpu-tests-build \
    build/tests/helpers/bench_cuda_layers \
    >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
  BIN=$PWD/build/tests/gpu; cp dtrun libdtrun_cuda.so build/tests/helpers/bench_cuda_layers "$BIN/"
  cp build/tests/cuemu/test_cuemu "$BIN/" 2>/dev/null
fi
DT=$BIN/dtrun
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
rows=()
row() { rows+=("$(printf '%-46s %-6s %s' "$1" "$2" "$3")"); }

# criterion NAME BINARY TIMEOUT: one row from a Criterion binary's synthesis line
criterion() {
  local name=$1 bin=$2 to=$3 log=$OUT/$(basename "$2").log
  if [ ! -x "$bin" ]; then row "$name" MISSING "$bin not built"; return; fi
  timeout "$to" "$bin" --jobs 4 >"$log" 2>&1; local rc=$?
  local syn; syn=$(grep -a Synthesis "$log" | sed 's/.*Synthesis: //')
  local res; res=$([ $rc -eq 0 ] && echo PASS || echo FAIL)
  case "$syn" in *"Tested: 0 "*) res=SKIP ;; esac
  [ $rc -eq 124 ] && syn="timed out after ${to}s"
  row "$name" "$res" "$syn"
}
# 0. the CUDA library: dtrun links none, finds libdtrun_cuda.so beside it, and a
#    short probe (what the agent runs for device cuda) loads it with its CUDA libraries.
cudalib=$(ldd "$DT" | grep -E 'libcudart|libcublas|libnccl')
if [ -z "$cudalib" ] && "$DT" --version | grep -q "cuda: $BIN/libdtrun_cuda.so" && "$DT" __cuda_probe >"$OUT/cuda_probe.log" 2>&1; then
  row "dtrun loads libdtrun_cuda.so on demand" PASS "$("$DT" --version)"
else row "dtrun loads libdtrun_cuda.so on demand" FAIL "ldd: ${cudalib:-none}; $("$DT" --version); $(tail -1 "$OUT/cuda_probe.log")"; fi
criterion "emulator semantics on the GPU (test_cuemu)" "$BIN/test_cuemu" 120
criterion "CUDA core ops vs CPU (matmul, adamw, ...)" "$BIN/test_kernels_cuda" 180
criterion "CUDA layer ops vs CPU (attention, ln, ...)" "$BIN/test_kernels_cuda_layers" 180
criterion "fused attention vs CPU (DTRUN_CUDA_ATTENTION)" "$BIN/test_attention_fused" 120
criterion "NCCL communicator, world size 1" "$BIN/test_comm_nccl" 120
criterion "plan = the trainer's CUDA arena (bytes)" "$BIN/test_plan_cuda" 60

# bench NAME NPROC FLAGS...: `dtrun bench comm --device cuda` on device buffers, one
# row: PASS when every size was exact; the largest size's time and bandwidths, and
# the device-to-device copy bandwidth the bench measured as the reference.
bench() {
  local name=$1 np=$2 log=$OUT/bench_$2.log; shift 2
  timeout 180 "$DT" --standalone --nproc_per_node "$np" bench comm --device cuda "$@" >"$log" 2>&1; local rc=$?
  local last; last=$(grep -E '^\[rank0\]: +[0-9]+ ' "$log" | tail -1 | sed 's/^\[rank0\]: *//')
  local copy; copy=$(grep -o 'device-to-device copy of 64 MiB on GPU [0-9]*, best of 5): [0-9.]* GB/s' "$log" | sed 's/.*: //')
  if [ $rc -eq 0 ] && grep -q 'out of bounds values: 0 OK' "$log" && [ -n "$last" ]; then
    set -- $last
    row "$name" PASS "$1 B: ${5} us, algbw $6, busbw $7 GB/s; d2d copy $copy"
  else row "$name" FAIL "exit $rc: $(tail -2 "$log" | tr '\n' ' ' | cut -c1-120)"; fi
}
bench "bench comm all_reduce, NCCL, 1 rank, 256M" 1 --backend nccl --max 256M
bench "bench comm all_reduce, 2 ranks share GPU, shm" 2 --backend shm --max 64M

# A small text corpus (deterministic), and a small GPT over it.
python3 - "$OUT/text.txt" <<'PY'
import random, sys
r = random.Random(7)
words = [''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(2, 8))) for _ in range(400)]
with open(sys.argv[1], 'w') as f:
    for _ in range(60000):
        f.write(' '.join(r.choice(words) for _ in range(r.randint(3, 12))) + '.\n')
PY
cat >"$OUT/small.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 128, "seq_len": 64, "vocab_size": 256},
 "data": {"train": "$OUT/text.txt", "val_fraction": 0.01},
 "train_micro_batch_size_per_gpu": 8, "train_steps": 20, "steps_per_print": 5,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
 "seed": 3, "threads": 4, "eval": {"every_steps": 0}, "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
# train NAME NPROC KEY=VALUE...: runs the small GPT, logs in $OUT/NAME
train() {
  local name=$1 np=$2; shift 2
  timeout 180 "$DT" --standalone --nproc_per_node "$np" "$OUT/small.json" log.dir="$OUT/$name" "$@" \
    >"$OUT/$name.log" 2>&1
}
# compare NAME A B TOL: max relative difference of the losses of runs A and B
compare() {
  python3 - "$OUT/$2/metrics.jsonl" "$OUT/$3/metrics.jsonl" "$4" <<'PY'
import json, sys
try:
    a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
    b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
except OSError as e:
    print(f"FAIL no metrics: {e}")
    sys.exit(0)
tol = float(sys.argv[3])
d = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"{'PASS' if d <= tol else 'FAIL'} max rel diff {d:.2e} over {len(a)} steps (tol {tol:g}); "
      f"loss {a[0]:.4f} -> {a[-1]:.4f}" if a else "FAIL no metrics")
PY
}
train cpu1 1 device=cpu
train gpu1_fp32 1 device=cuda bf16.enabled=false
train gpu1_bf16 1 device=cuda bf16.enabled=true
r=$(compare x gpu1_fp32 cpu1 1e-4); row "GPT 20 steps, GPU fp32 vs CPU" "${r%% *}" "${r#* }"
r=$(compare x gpu1_bf16 cpu1 1e-2); row "GPT 20 steps, GPU bf16 vs CPU" "${r%% *}" "${r#* }"
train cpu2 2 device=cpu comm.backend=shm
train gpu2_shm 2 device=cuda bf16.enabled=false comm.backend=shm
r=$(compare x gpu2_shm cpu2 1e-4); row "2 ranks sharing the GPU (shm staging) vs CPU" "${r%% *}" "${r#* }"

# GPT-2 124M throughput: the preset with the corpus above, one micro-batch per step.
B=${GPT2_BATCH:-32}
python3 - "$OUT" "$B" <<'PY'
import json, sys
out, b = sys.argv[1], int(sys.argv[2])
c = json.load(open("configs/gpt2-124m.json"))
c["data"] = {"train": out + "/text.txt", "val_fraction": 0.01}
c.update(train_steps=60, steps_per_print=10, train_micro_batch_size_per_gpu=b, gradient_accumulation_steps=1,
         train_batch_size=b, device="cuda")
c["scheduler"]["params"]["warmup_num_steps"] = 10
c["eval"] = {"every_steps": 0}
c["checkpoint"] = {"every_steps": 0, "resume": "never"}
c["log"] = {"dir": out + "/gpt2"}
json.dump(c, open(out + "/gpt2.json", "w"), indent=1)
PY
# gpt2 NAME STEPS LABEL [VAR=VALUE...]: trains $OUT/gpt2.json for STEPS steps with
# the environment additions, logs in $OUT/NAME; one row (tokens/s and MFU after
# step 10, peak memory against `dtrun plan` under the same environment). Sets $ours.
gpt2() {
  local name=$1 steps=$2 label=$3; shift 3
  env "$@" timeout 300 "$DT" --standalone --nproc_per_node 1 "$OUT/gpt2.json" train_steps="$steps" \
    log.dir="$OUT/$name" >"$OUT/$name.log" 2>&1; local rc=$?
  env "$@" "$DT" plan "$OUT/gpt2.json" --gpus 1 --gpu h200 --strategy zero1 --json >"$OUT/$name.plan.json" \
    2>"$OUT/$name.plan.err"
  ours=$(python3 - "$OUT/$name" "$OUT/$name.plan.json" "$rc" <<'PY'
import json, sys
d, plan, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    timed = [r for r in rows if r["step"] > 10]
    tok = sum(r["tokens_per_s"] for r in timed) / len(timed)
    mfu = sum(r.get("mfu", 0) for r in timed) / len(timed)
    s = json.load(open(d + "/summary.json"))
    peak = s["ranks"][0]["peak_bytes"]
    try:
        p = json.load(open(plan))["rows"][0]["memory_bytes"]["total"]
        mem = f"peak {peak/1e9:.1f} GB, plan {p/1e9:.1f} GB ({100*(peak-p)/p:+.0f}%)"
    except Exception as e:
        mem = f"peak {peak/1e9:.1f} GB, plan: {e}"
    print(f"DONE {tok:.0f} {100*mfu:.1f} {mem}")
except Exception as e:
    print(f"FAIL 0 0 exit {rc}: {e}")
PY
)
  set -- $ours
  row "$label" "$1" "$2 tok/s | MFU $3% | ${*:4}"
}
gpt2 gpt2 60 "GPT-2 124M bf16 B=$B, tokens/s | MFU"
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  timeout "${TORCH_TIMEOUT:-240}" python3 scripts/bench/gpu_torch_gpt2.py --batch "$B" --steps 50 --warmup 10 \
    >"$OUT/torch.log" 2>&1
  t=$(python3 -c 'import json,sys; l=[x for x in open(sys.argv[1]) if x.startswith("{")]; d=json.loads(l[-1]); print(f"{d[\"tokens_per_s\"]:.0f} {100*(d[\"mfu\"] or 0):.1f} {d[\"peak_mem_gb\"]:.1f}")' "$OUT/torch.log" 2>/dev/null)
  if [ -n "$t" ]; then
    set -- $t
    ratio=$(python3 -c "print(f'{float(\"${ours#* }\".split()[0]) / $1:.2f}')" 2>/dev/null)
    row "PyTorch compile, same model, tokens/s | MFU" DONE "$1 tok/s | MFU $2% | peak $3 GB | dtrun/torch ${ratio}x"
  else row "PyTorch compile, same model" FAIL "$(tail -2 "$OUT/torch.log" | tr '\n' ' ' | cut -c1-120)"; fi
fi

# Attention: the cuBLAS path against the fused kernel, op level and whole model.
for ab in 8 32; do
  if [ -x "$BIN/bench_cuda_layers" ]; then
    timeout 120 "$BIN/bench_cuda_layers" --attention-only --iters 10 -B "$ab" >"$OUT/bench_attention_B$ab.log" 2>&1
    a=$(awk '/attention_(forward|backward)/{n=$1; if ($1=="fused") n="fused " $2; for(i=1;i<=NF;i++) if ($i=="ms") m=$(i-1); printf "%s%s %s ms", sep, n, m; sep=", "}' "$OUT/bench_attention_B$ab.log")
    row "attention B=$ab T=1024 NH=12 HS=64 bf16" "$([ -n "$a" ] && echo DONE || echo FAIL)" "${a:-$(tail -1 "$OUT/bench_attention_B$ab.log")}"
  else row "attention B=$ab, cuBLAS vs fused" MISSING "$BIN/bench_cuda_layers not built"; fi
done
if [ "${SKIP_FUSED_GPT2:-0}" != 1 ]; then
  gpt2 gpt2_fused 30 "GPT-2 124M bf16 B=$B, fused attention" DTRUN_CUDA_ATTENTION=fused
fi

echo; echo "GPU: $(cat "$OUT/gpu.txt")"
printf '%-46s %-6s %s\n' "check" "result" "detail"
printf '%s\n' "${rows[@]}"
