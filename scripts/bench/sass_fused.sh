#!/usr/bin/env bash
# sass_fused.sh - what the fused attention's kernels are in sm_90 machine code:
# per kernel, registers a thread, blocks of 128 threads an SM's 64K registers
# allow, shared memory per block at HS 64 and 128 with the blocks it allows (228 KiB
# an SM on H100/H200), and the instruction counts that show how tiles are read:
# generic LD.E (a generic wmma.load: 8 per fragment), LDSM (one per bf16 fragment
# from shared memory), LDS, HMMA, and barriers. Static counts of the code, not of
# execution. The GPU is not needed. fa_forward_wmma_kernel<64> runs for HS <= 64 only,
# <32> for larger heads. blk/SM is the smaller of what the registers
# (allocated 8 a thread at a time) and the shared memory at HS 64 allow, at most 16.
#
# Usage: scripts/bench/sass_fused.sh [REV]  (REV: also compile the file as it was at
# that git revision, e.g. 03c9df7, and print its table first)
# Needs nvcc (CUDA 13 here) and git for REV. cuobjdump and nvdisasm, which this CUDA
# install lacks, come from PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm
# wheels into ~/.cache/dtrun/cutools (DTRUN_CUTOOLS) the first time.
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
TOOLS=${DTRUN_CUTOOLS:-$HOME/.cache/dtrun/cutools}
# cuobjdump -sass runs nvdisasm: both from PyPI when this CUDA install lacks them.
CUOBJDUMP=$(command -v cuobjdump || true)
if [ -z "$CUOBJDUMP" ] || ! command -v nvdisasm >/dev/null; then
  if [ -z "$(find "$TOOLS" -name nvdisasm -type f 2>/dev/null)" ]; then
    mkdir -p "$TOOLS/whl"
    python3 -m pip download -q --no-deps -d "$TOOLS/whl" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >&2
    for w in "$TOOLS"/whl/*.whl; do python3 -m zipfile -e "$w" "$TOOLS"; done
    find "$TOOLS" -path '*/bin/*' -type f -exec chmod +x {} +
  fi
  CUOBJDUMP=$(find "$TOOLS" -name cuobjdump -type f | head -1)
  export PATH=$(dirname "$CUOBJDUMP"):$PATH
fi
D=$(mktemp -d /tmp/dtrun-sass.XXXXXX)
trap 'rm -rf "$D"' EXIT

table() { # table SOURCE_DIR LABEL
  local src=$1
  "$NVCC" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I"$src" -DDT_USE_CUDA \
    -c "$src/kernels/cuda/cuda_attention_fused.cu" -o "$D/fa.o"
  "$CUOBJDUMP" -res-usage "$D/fa.o" >"$D/res.txt"
  "$CUOBJDUMP" -sass "$D/fa.o" >"$D/fa.sass"
  echo "== $2"
  python3 - "$D/res.txt" "$D/fa.sass" "$src/kernels/cuda/cuda_attention_fused.cu" <<'PY'
import re, sys, subprocess
res, sass, cu = sys.argv[1:4]
def short(name):
    n = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
    n = re.sub(r"\(.*", "", n).replace("__nv_bfloat16", "bf16").replace("void ", "")
    return n
regs = {}
fn = None
for line in open(res):
    m = re.search(r"Function (\S+):", line)
    if m: fn = m.group(1); continue
    m = re.search(r"REG:(\d+)", line)
    if m and fn: regs[fn] = int(m.group(1))
counts = {}
fn = None
for line in open(sass):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); counts[fn] = {}; continue
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)", line)
    if m and fn:
        op = m.group(1)
        k = ("LD.E" if op.startswith("LD.") else "LDSM" if op.startswith("LDSM") else
             "LDS" if op.startswith("LDS") else "HMMA" if op.startswith("HMMA") else
             "BAR" if op.startswith("BAR.SYNC") else None)
        if k: counts[fn][k] = counts[fn].get(k, 0) + 1
# Shared memory per block (the host-side formulas of the .cu, evaluated for HS).
T, S_LD, P_LD = 32, 36, 40
def smem(kind, HS, qr):
    hsp, hso, hp = HS + 8, HS + 4, HS + 1
    if kind == "fwd_wmma": return qr*hsp*2 + 2*T*hsp*2 + qr*S_LD*4 + qr*P_LD*2 + qr*hso*4 + 2*qr*4
    if kind == "bwd_wmma": return 4*T*hsp*2 + 2*T*S_LD*4 + 2*T*P_LD*2 + 2*T*4
    if kind == "fwd": return 4*(3*T*hp + T*(T+1) + 2*T)
    if kind == "bwd": return 4*(4*T*hp + 2*T*(T+1) + 2*T)
    return 0
def kind(n):
    w = "wmma" in n
    if "forward" in n: return "fwd_wmma" if w else "fwd"
    if "dkdv" in n or "dq" in n: return "bwd_wmma" if w else "bwd"
    return None
SM_SMEM, SM_REGS = 228 * 1024, 65536
def blocks_regs(r):  # registers go out per warp in units of 256 (8 a thread)
    per_warp = ((r * 32 + 255) // 256) * 256
    return min(16, (SM_REGS // per_warp) // 4)
def blocks_smem(b): return min(16, SM_SMEM // (b + 1024)) if b else 16
print(f"{'kernel':40s} {'regs':>4s} {'blk/SM':>6s} {'smem64':>7s} {'smem128':>8s} {'LD.E':>5s} {'LDSM':>5s} {'LDS':>4s} {'HMMA':>5s} {'BAR':>4s}")
for f in counts:
    n = short(f)
    if "rowdot" in n: continue
    k = kind(n)
    c = counts[f]
    r = regs.get(f, 0)
    qr = 64 if "<64>" in n else 32  # query rows of the forward WMMA kernel (64: HS <= 64 only)
    s64, s128 = smem(k, 64, qr), smem(k, 128, qr)
    b = min(blocks_regs(r), blocks_smem(s64))
    print(f"{n:40s} {r:4d} {b:6d} {s64/1024:6.1f}K {s128/1024:7.1f}K {c.get('LD.E',0):5d} {c.get('LDSM',0):5d} "
          f"{c.get('LDS',0):4d} {c.get('HMMA',0):5d} {c.get('BAR',0):4d}")
PY
}

if [ $# -ge 1 ]; then
  mkdir -p "$D/base"
  git archive "$1" kernels common | tar -x -C "$D/base"
  table "$D/base" "kernels/cuda/cuda_attention_fused.cu at $1"
fi
table "$ROOT" "kernels/cuda/cuda_attention_fused.cu (working tree)"
