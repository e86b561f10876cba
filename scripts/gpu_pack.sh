#!/usr/bin/env bash
# gpu_pack.sh - packs what scripts/gpu_check.sh runs on the GPU machine into ONE
# compressed archive, .carry/gpu_check.tar.gz (.carry/ is ignored by git), and
# fails if it is 60 MiB or more (the GPU machine receives 64 MiB in all, tracked
# tree included). Then, there: `bash scripts/gpu_check.sh` with carry [".carry"].
#
# In it: bin/ - dtrun, libdtrun_cuda.so beside it (dtrun loads it from its own
# folder), and the test binaries the check runs (tests/gpu/test_*, the emulator's
# own tests built for the GPU); lib/ - the shared libraries they need that a bare
# GPU machine may lack (OpenBLAS, which dtrun loads with dlopen, libuv, cJSON,
# Criterion, libgfortran, ..., found with ldd); lib-fallback/ - glibc's libmvec
# (which must match the machine's glibc) and the gcc runtime (libstdc++, libgcc_s,
# libgomp; the machine's is as new or newer), which gpu_check.sh copies into lib/
# one by one only when that machine lacks them. Not packed: glibc
# and the CUDA libraries (cudart, cuBLAS, NCCL), which gpu_check.sh finds on that
# machine (or in PyTorch's nvidia/*/lib folders).
#
# The real build is made in a clean clone of HEAD for x86-64-v3 and sm_90, so that
# flags for the GPU host never mix with this tree's objects. With GPU_CHECK_EMU=1
# it packs the emulator build of this tree instead (dtrun-emu, libdtrun_cuda_emu.so,
# build-emu/tests/...) into .carry/gpu_check_emu.tar.gz, which `GPU_CHECK_EMU=1
# bash scripts/gpu_check.sh` unpacks and runs here: the same packing, unpacking
# and preflight as on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT_MIB=60
jobs=$(nproc 2>/dev/null || echo 2)
stage=$(mktemp -d /tmp/dtrun-pack.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/pk/bin" "$stage/pk/lib" "$stage/pk/lib-fallback"
if [ "${GPU_CHECK_EMU:-0}" = 1 ]; then
  archive=.carry/gpu_check_emu.tar.gz
  make -s -j"$jobs" dtrun-emu libdtrun_cuda_emu.so emu
  cp dtrun-emu "$stage/pk/bin/dtrun"
  cp libdtrun_cuda_emu.so "$stage/pk/bin/"
  cp build-emu/tests/gpu/test_* build-emu/tests/cuemu/test_cuemu "$stage/pk/bin/"
else
  archive=.carry/gpu_check.tar.gz
  src=$stage/src
  git clone -q . "$src"
  make -s -j"$jobs" -C "$src" ARCH=-march=x86-64-v3 \
    CUDA_ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90" \
    dtrun libdtrun_cuda.so gpu-tests-build
  cp "$src/dtrun" "$src/libdtrun_cuda.so" "$stage/pk/bin/"
  cp "$src"/build/tests/gpu/test_* "$src"/build/tests/cuemu/test_cuemu "$stage/pk/bin/" 2>/dev/null || true
fi
# Build leftovers beside the binaries (objects, dependency files) are not packed.
rm -f "$stage"/pk/bin/*.o "$stage"/pk/bin/*.d
ls "$stage"/pk/bin/test_* >/dev/null
# OpenBLAS is not linked but loaded with dlopen (kernels/cpu/cpu_blas.c): packed by name,
# and its own libraries (libgfortran, libquadmath) through ldd as the others.
# awk reads to the end: an early exit would kill ldconfig with SIGPIPE, a failure under pipefail.
blas=$(ldconfig -p | awk '/libopenblas\.so\.0 .*x86-64/ && !found {print $NF; found = 1}')
[ -n "$blas" ] || { echo "gpu_pack: no libopenblas.so.0 here (scripts/install-deps.sh)" >&2; exit 1; }
cp -L "$blas" "$stage/pk/lib/libopenblas.so.0"
for b in "$stage"/pk/bin/* "$stage/pk/lib/libopenblas.so.0"; do
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*) ;;
      libcuda.so*|libcudart*|libcublas*|libnccl*) ;;
      # glibc's libmvec must match the machine's glibc, and the machine's gcc runtime is
      # as new as ours or newer (its CUDA libraries may need it): used only when missing
      libmvec.so*|libstdc++.so*|libgcc_s.so*|libgomp.so*) cp -L -n "$lib" "$stage/pk/lib-fallback/" ;;
      *) cp -L -n "$lib" "$stage/pk/lib/" ;;
    esac
  done
done
strip --strip-debug "$stage"/pk/bin/* "$stage"/pk/lib/* "$stage"/pk/lib-fallback/* 2>/dev/null || true
rm -rf .carry/bin .carry/lib  # the layout before this script made one archive
mkdir -p .carry
rm -f "$archive"
tar -C "$stage/pk" -czf "$archive" .
bytes=$(stat -c %s "$archive")
echo "gpu_pack: $archive is $((bytes / 1024)) KiB ($(tar -tzf "$archive" | grep -vc '/$') files)"
if [ "$bytes" -ge $((LIMIT_MIB * 1024 * 1024)) ]; then
  echo "gpu_pack: FAIL: $archive is not under $LIMIT_MIB MiB" >&2
  exit 1
fi
