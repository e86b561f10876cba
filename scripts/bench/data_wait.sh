#!/usr/bin/env bash
# data_wait.sh - data wait per step against a slow reader, with and without
# read-ahead. The slow reader is dtrun's benchmark knob DTRUN_DATA_DELAY_US (every
# sample read sleeps that long, in the reader: the read-ahead thread or, with
# data.prefetch 0, the step itself) — a stand-in for throttled storage that behaves
# the same on every machine. Prints step_ms and data_ms per step for each
# data.prefetch and the warnings rank 0 gave.
#   scripts/bench/data_wait.sh [DELAY_US] [STEPS]     (defaults 5000, 12)
set -euo pipefail
cd "$(dirname "$0")/../.."
DELAY=${1:-5000} STEPS=${2:-12}
DTRUN=${DTRUN:-./dtrun}
T=$(mktemp -d /tmp/dtrun-dw.XXXXXX)
trap 'rm -rf "$T"' EXIT
python3 - "$T/text.txt" <<'PY'
import random, sys
random.seed(1)
w = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(w) for _ in range(6)) + ".\n" for _ in range(4000)))
PY
cat > "$T/c.json" <<JSON
{"model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128, "seq_len": 128, "vocab_size": 256},
 "data": {"train": "$T/text.txt"}, "train_micro_batch_size_per_gpu": 4, "train_steps": $STEPS,
 "steps_per_print": 1, "eval": {"every_steps": 0}, "threads": 1, "seed": 3,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
echo "slow reader: DTRUN_DATA_DELAY_US=$DELAY per sample, 4 samples per micro-batch"
for p in 0 1 2 4; do
  DTRUN_DATA_DELAY_US=$DELAY "$DTRUN" __worker "$T/c.json" log.dir="$T/p$p" data.prefetch=$p >"$T/p$p.out" 2>&1
  python3 scripts/bench/data_wait_report.py "$T/p$p/metrics.jsonl" "$p"
  grep "for data from" "$T/p$p.out" | sed 's/^/   /' || true
done
