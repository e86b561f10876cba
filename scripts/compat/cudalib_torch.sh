#!/usr/bin/env bash
# cudalib_torch.sh [VENV] - dtrun's CUDA library finds its CUDA dependencies in an
# installed PyTorch when the system has none: in a private mount namespace every
# folder of the system's CUDA (ldconfig's, /usr/local/cuda) is hidden, then
# `dtrun __cuda_probe` (what the agent runs before starting GPU workers) must fail
# naming libcudart without PyTorch, and load libdtrun_cuda.so with VIRTUAL_ENV set
# to a venv holding torch (its nvidia/*/lib folders: cudart, cuBLAS(Lt), NCCL).
#   python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch
#   scripts/compat/cudalib_torch.sh /tmp/torchvenv
# Needs root (unshare -m) and a CUDA build (libdtrun_cuda.so beside dtrun). Not part
# of `make test`: it needs torch.
set -u
cd "$(dirname "$0")/../.."
VENV=${1:?usage: cudalib_torch.sh VENV (a venv holding torch)}
DTRUN=${DTRUN:-$PWD/dtrun}
[ -f "$(dirname "$DTRUN")/libdtrun_cuda.so" ] || { echo "no libdtrun_cuda.so beside $DTRUN (make, with nvcc)"; exit 2; }
ls -d "$VENV"/lib/python3*/site-packages/nvidia/*/lib >/dev/null 2>&1 || { echo "no torch CUDA wheels in $VENV"; exit 2; }
hide=$(mktemp)
trap 'rm -f "$hide"' EXIT
cat >"$hide" <<'SH'
empty=$(mktemp -d)
dirs=$( { ldconfig -p | grep -E 'libcudart|libcublas|libnccl' | awk '{print $NF}' | xargs -r -n1 dirname
          readlink -f /usr/local/cuda; } | sort -u)
for d in $dirs; do [ -d "$d" ] && mount --bind "$empty" "$d"; done
"$@"
SH
fails=0
out=$(env -u VIRTUAL_ENV unshare -m --propagation private bash "$hide" "$DTRUN" __cuda_probe 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q 'needs libcudart' <<<"$out"; then echo "PASS: system CUDA hidden, no torch: the probe fails naming libcudart"
else echo "FAIL: system CUDA hidden, no torch: rc=$rc $out"; fails=1; fi
out=$(VIRTUAL_ENV=$VENV unshare -m --propagation private bash "$hide" "$DTRUN" __cuda_probe 2>&1); rc=$?
if [ $rc -eq 0 ]; then echo "PASS: system CUDA hidden, VIRTUAL_ENV=$VENV: libdtrun_cuda.so loads with torch's CUDA libraries"
else echo "FAIL: system CUDA hidden, torch venv: rc=$rc $out"; fails=1; fi
exit $fails
