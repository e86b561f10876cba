#!/usr/bin/env bash
# observe_overhead.sh - what watching a run costs: tokens/s of the demo
# (configs/demo.json: GPT 4 x 128, micro-batch 16 x 128 tokens, a line every 10 steps)
# over 2 ranks (DDP: the trace records every bucket's all-reduce too) with
# TensorBoard and the timeline (tensorboard.enabled, log.trace) both on, and both off,
# RUNS runs of each interleaved (on, off, on, off ...: a busy machine's drift hits
# both alike), STEPS steps a run; prints each run's tokens/s (summary.json), the
# medians and their ratio.
#   scripts/bench/observe_overhead.sh [RUNS] [STEPS]     (defaults 5, 40)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5} STEPS=${2:-40}
DTRUN=${DTRUN:-./dtrun}
T=$(mktemp -d /tmp/dtrun-observe-bench.XXXXXX)
trap 'rm -rf "$T"' EXIT
scripts/prepare_demo_data.sh
for i in $(seq "$RUNS"); do
  for tr in true false; do
    "$DTRUN" --standalone --nproc_per_node 2 configs/demo.json log.dir="$T/$tr$i" log.trace=$tr tensorboard.enabled=$tr \
      threads=1 train_steps="$STEPS" eval.every_steps=0 checkpoint.every_steps=0 sample_tokens=0 \
      checkpoint.resume=never >"$T/$tr$i.out" 2>&1 || { tail -5 "$T/$tr$i.out"; exit 1; }
  done
done
python3 - "$T" "$RUNS" "$STEPS" <<'PY'
import json, statistics, sys
t, runs, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tps = {tr: [json.load(open(f"{t}/{tr}{i}/summary.json"))["tokens_per_s"] for i in range(1, runs + 1)]
       for tr in ("true", "false")}
on, off = statistics.median(tps["true"]), statistics.median(tps["false"])
print(f"demo (configs/demo.json), 2 ranks x 1 thread, {steps} steps, {runs} runs each")
print("tensorboard + log.trace on : " + " ".join(f"{x:.0f}" for x in tps["true"]) + f"  median {on:.0f} tokens/s")
print("tensorboard + log.trace off: " + " ".join(f"{x:.0f}" for x in tps["false"]) + f"  median {off:.0f} tokens/s")
print(f"on / off = {on / off:.4f} ({100 * (on / off - 1):+.2f}%)")
PY
