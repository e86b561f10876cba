#!/usr/bin/env bash
# gpu_pack.sh - builds here for sm_90 and packs what the GPU machine needs into
# .carry/ (ignored by git): ./dtrun and the CUDA library beside it (libdtrun_cuda.so,
# which dtrun loads from its own folder), the GPU test binaries, the CUDA op benchmarks and the shared
# libraries they use that a bare GPU machine lacks (libuv, cJSON, OpenBLAS,
# Criterion, ...; not libc or the CUDA/NCCL libraries, which that machine has).
# Then: run scripts/gpu_check.sh there with carry [".carry"].
set -euo pipefail
cd "$(dirname "$0")/.."
# Built in a clean clone of HEAD, so that flags for the GPU host (plain x86-64-v3,
# sm_90) never mix with this tree's objects.
src=$(mktemp -d /tmp/dtrun-pack.XXXXXX)
trap 'rm -rf "$src"' EXIT
git clone -q . "$src"
make -s -C "$src" ARCH=-march=x86-64-v3 \
  CUDA_ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90" dtrun libdtrun_cuda.so gpu-tests-build \
  build/tests/helpers/bench_cuda_core build/tests/helpers/bench_cuda_layers
rm -rf .carry && mkdir -p .carry/bin .carry/lib
cp "$src/dtrun" "$src/libdtrun_cuda.so" .carry/bin/
for t in "$src"/build/tests/gpu/test_* "$src"/build/tests/cuemu/test_* "$src"/build/tests/helpers/bench_cuda_*; do
  case "$t" in *.d|*.o|*'*'*) ;; *) cp "$t" .carry/bin/ ;; esac
done
for b in .carry/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libresolv.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda*|libcudart*|libcublas*|libnccl*|libstdc++*|libgcc_s*) ;;
      *) cp -L -n "$lib" .carry/lib/ ;;
    esac
  done
done
strip --strip-debug .carry/bin/*
du -sh .carry | awk '{print "gpu_pack: .carry is " $1}'
