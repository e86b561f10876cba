#!/usr/bin/env bash
# test_fused_attention_ptx.sh - what the fused attention's tensor-core kernels compile
# to for sm_90, from the PTX the build keeps (Makefile: -keep for
# kernels/cuda/cuda_attention_fused.cu) and ptxas -v on it:
#  - every WMMA load and store in the PTX names the shared state space
#    (kernels/cuda/cuda_wmma.cuh): a generic wmma.load becomes 8 generic LD.E per
#    fragment, a .shared one a single LDSM; each WMMA kernel has such loads;
#  - the forward and both backward WMMA kernels (each fragment count the backward is
#    built for) use at most 128 registers a thread, so 4 blocks of 128 threads fit
#    the 64K registers of an SM (232 registers allowed 2), and spill nothing.
# The SASS itself (LDSM/LD.E counts) is scripts/bench/sass_fused.sh, which needs
# cuobjdump from PyPI. Skipped without the CUDA build (SAN=1, NO_CUDA=1, no nvcc).
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${DTRUN_TEST_BUILD:-$ROOT/build}
ptx=$BUILD_DIR/kernels/cuda/keep/cuda_attention_fused.compute_90.ptx
PTXAS=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
if [ ! -f "$ptx" ] || [ ! -x "$PTXAS" ]; then
  skip "fused attention PTX and registers" "no kept PTX under $BUILD_DIR (CUDA library not built) or no ptxas"
  finish
fi

# Per WMMA kernel: its wmma.load/store count and how many lack .shared.
report=$(python3 - "$ptx" <<'EOF'
import re, sys
entry = None
counts = {}
for line in open(sys.argv[1]):
    m = re.match(r'\s*\.visible \.entry (\S+)\(', line) or re.match(r'\s*\.entry (\S+)\(', line)
    if m:
        entry = m.group(1)
        continue
    if entry and 'wmma' in entry and re.search(r'\bwmma\.(load|store)\.', line):
        c = counts.setdefault(entry, [0, 0])
        c[0] += 1
        if '.shared.' not in line:
            c[1] += 1
for e, (n, generic) in sorted(counts.items()):
    print(e, n, generic)
EOF
)
nk=$(printf '%s\n' "$report" | grep -c . || true)
# fa_forward_wmma_kernel<32, 64>, fa_dkdv_wmma_kernel<1..4>, fa_dq_wmma_kernel<1..4>
[ "$nk" -eq 10 ] && pass "10 WMMA kernels in the PTX (forward for 32 and 64 query rows, dk/dv and dq for 1 to 4 fragments per warp)" ||
  fail "10 WMMA kernels in the PTX" "found $nk: $report"
bad=$(printf '%s\n' "$report" | awk '$2 == 0 || $3 != 0')
[ -z "$bad" ] && pass "every WMMA load and store of the WMMA kernels names shared memory ($(printf '%s\n' "$report" | awk '{n += $2} END {print n}') in all)" ||
  fail "every WMMA load and store names shared memory" "kernel, loads+stores, generic: $bad"

# Registers and spills per WMMA kernel from ptxas -v (the build's own sm_90 compile).
res=$("$PTXAS" -arch=sm_90 -v "$ptx" -o "$DT_TMP/fa.cubin" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "ptxas compiles the kept PTX" "rc $rc: $(printf '%s\n' "$res" | tail -3)"
regs=$(printf '%s\n' "$res" | awk '
  /Compiling entry function/ { match($0, /'\''[^'\'']+'\''/); f = substr($0, RSTART + 1, RLENGTH - 2) }
  /spill stores/ { sp[f] = $0 }
  /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); r = substr($0, RSTART + 5, RLENGTH - 15) + 0;
                            if (f ~ /wmma/) print f, r, (sp[f] ~ / 0 bytes spill stores, 0 bytes spill loads/ ? 0 : 1) }')
nr=$(printf '%s\n' "$regs" | grep -c . || true)
over=$(printf '%s\n' "$regs" | awk '$2 > 128 || $3 != 0')
if [ "$nr" -eq 10 ] && [ -z "$over" ]; then
  pass "every WMMA kernel fits 128 registers without spilling, 4 blocks per SM (most: $(printf '%s\n' "$regs" | awk 'm < $2 {m = $2} END {print m}'))"
else
  fail "every WMMA kernel fits 128 registers without spilling" "$nr kernels; over or spilling: $over"
fi
finish
