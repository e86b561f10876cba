#!/usr/bin/env bash
# gpu_check.sh - the one GPU run (under 8 minutes on one H200). Run on the GPU
# machine after scripts/gpu_pack.sh here: `bash scripts/gpu_check.sh` with
# carry [".carry"]. Uses the carried binaries (.carry/bin) and libraries
# (.carry/lib); with no .carry it builds there with `make` (needs our Debian
# libraries). Full logs go to $OUT (or /tmp/gpu_check); a short table is last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
if [ -d .carry/bin ]; then
  BIN=$PWD/.carry/bin; export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
else
  make -s CUDA_ARCH="-gencode arch=compute_90,code=sm_90" dtrun gpu-tests >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
  BIN=$PWD/build/tests/gpu; cp dtrun "$BIN/" 2>/dev/null
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
rows=()
row() { rows+=("$(printf '%-44s %-8s %s' "$1" "$2" "$3")"); }

# 1. NCCL communicator at world size 1, every op on device buffers.
if [ -x "$BIN/test_comm_nccl" ]; then
  timeout 120 "$BIN/test_comm_nccl" >"$OUT/test_comm_nccl.log" 2>&1; rc=$?
  syn=$(grep -a Synthesis "$OUT/test_comm_nccl.log" | sed 's/.*Synthesis: //')
  res=$([ $rc -eq 0 ] && echo PASS || echo FAIL); case "$syn" in *"Tested: 0 "*) res=SKIP ;; esac
  row "NCCL comm, world size 1 (every op)" "$res" "$syn"
else row "NCCL comm, world size 1" "MISSING" "build/tests/gpu/test_comm_nccl not built"; fi

# 2. CUDA op table against the CPU ops (tests/gpu/test_kernels_cuda).
if [ -x "$BIN/test_kernels_cuda" ]; then
  timeout 180 "$BIN/test_kernels_cuda" >"$OUT/test_kernels_cuda.log" 2>&1; rc=$?
  row "CUDA kernels vs CPU reference" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" "$(grep -a Synthesis "$OUT/test_kernels_cuda.log" | sed 's/.*Synthesis: //')"
else row "CUDA kernels vs CPU reference" "NOT BUILT" "the CUDA backend (issue 6) is not in this version"; fi

# 3. Training on the GPU: one rank over NCCL, two ranks sharing the GPU through the CPU communicator.
if "$BIN/dtrun" --version | grep -q cuda && "$BIN/dtrun" config configs/mlp-tiny.json device=cuda >/dev/null 2>&1 \
   && [ -x "$BIN/test_kernels_cuda" ]; then
  timeout 120 "$BIN/dtrun" --standalone --nproc_per_node 1 configs/mlp-tiny.json device=cuda log.dir="$OUT/nccl1" >"$OUT/train_nccl1.log" 2>&1
  row "train, 1 rank, NCCL" "$([ $? -eq 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$OUT/train_nccl1.log")"
  timeout 120 "$BIN/dtrun" --standalone --nproc_per_node 2 configs/mlp-tiny.json device=cuda comm.backend=shm log.dir="$OUT/shm2" >"$OUT/train_shm2.log" 2>&1
  row "train, 2 ranks on one GPU, shm comm" "$([ $? -eq 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$OUT/train_shm2.log")"
else row "GPU training (NCCL 1 rank; 2 ranks via shm)" "NOT BUILT" "needs the CUDA backend (issue 6)"; fi

# 4. Throughput: GPT-2 124M, bf16 (when the CUDA backend exists).
if [ -x "$BIN/test_kernels_cuda" ]; then
  timeout 300 "$BIN/dtrun" --standalone --nproc_per_node 1 configs/gpt2-124m.json device=cuda train_steps=60 \
    steps_per_print=10 data.train="${GPT2_DATA:-runs/data/fortunes.txt}" model.vocab_size=50257 log.dir="$OUT/gpt2" >"$OUT/gpt2.log" 2>&1
  row "GPT-2 124M bf16 throughput" "$([ $? -eq 0 ] && echo DONE || echo FAIL)" "$(grep -a 'step 60/' "$OUT/gpt2.log" | tail -1)"
else row "GPT-2 124M bf16 throughput" "NOT BUILT" "needs the CUDA backend (issue 6)"; fi

echo; echo "GPU: $(cat "$OUT/gpu.txt")"
printf '%-44s %-8s %s\n' "check" "result" "detail"
printf '%s\n' "${rows[@]}"
