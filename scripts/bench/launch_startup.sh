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

# median_ms RUNS CMD...: median wall time in ms of RUNS runs (output discarded),
# timed around the child alone (no shell or `date` forks inside the interval).
median_ms() {
  local n=$1; shift
  python3 - "$n" "$@" <<'PY'
import statistics, subprocess, sys, time
n, cmd = int(sys.argv[1]), sys.argv[2:]
ts = []
for _ in range(n):
    t = time.perf_counter()
    if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        sys.exit("failed: " + " ".join(cmd))
    ts.append((time.perf_counter() - t) * 1e3)
print("%.2f" % statistics.median(ts))
PY
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
