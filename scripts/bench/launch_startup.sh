#!/usr/bin/env bash
# launch_startup.sh - wall time of launching and reaping 4 no-op workers:
#   dtrun --standalone --nproc_per_node=4 --exec true           (median of RUNS, default 20)
#   torchrun --standalone --nproc_per_node=4 --no-python true   (median of TORCH_RUNS, default 5;
#                                                                 skipped if torchrun is absent)
set -euo pipefail
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-./dtrun}
RUNS=${RUNS:-20}
TORCH_RUNS=${TORCH_RUNS:-5}

# median_ms RUNS CMD...: median wall time in ms of RUNS runs (output discarded)
median_ms() {
  local n=$1; shift
  for ((i = 0; i < n; i++)); do
    local s; s=$(date +%s%N)
    "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; return 1; }
    echo $(( $(date +%s%N) - s ))
  done | sort -n | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.2f\n", m / 1e6}'
}

"$DTRUN" --standalone --nproc_per_node=4 --exec true >/dev/null 2>&1  # warm the page cache
d=$(median_ms "$RUNS" "$DTRUN" --standalone --nproc_per_node=4 --exec true)
echo "dtrun    --standalone --nproc_per_node=4 --exec true: median ${d} ms of $RUNS runs"
if [ "$TORCH_RUNS" -gt 0 ] && command -v torchrun >/dev/null; then
  t=$(median_ms "$TORCH_RUNS" torchrun --standalone --nproc_per_node=4 --no-python true)
  echo "torchrun --standalone --nproc_per_node=4 --no-python true: median ${t} ms of $TORCH_RUNS runs"
  awk -v d="$d" -v t="$t" 'BEGIN {printf "ratio torchrun/dtrun: %.0fx\n", t / d}'
else
  echo "torchrun: skipped (TORCH_RUNS=0 or torchrun not installed)"
fi
