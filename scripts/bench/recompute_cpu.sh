#!/usr/bin/env bash
# recompute_cpu.sh - activation recomputation on the CPU: a GPT of hidden
# 768, 12 layers, seq 512, micro-batch 8 (text data, vocabulary 256), 3 steps on 2
# threads, with activation_checkpointing.policy none, selective and full: rank 0's
# peak memory, activation bytes (the arena) and mean step time of steps 2-3, and the
# ratios to none. Target: full <= 0.5x activation bytes at <= 1.4x step time. The
# arena equals `dtrun plan`'s formula byte for byte (tests/test_recompute.c).
# Usage: scripts/bench/recompute_cpu.sh [STEPS]  (slow: about a minute a step on 2 cores)
set -eu
cd "$(dirname "$0")/../.."
make -s dtrun
STEPS=${1:-3}
D=$(mktemp -d /tmp/dtrun-recompute.XXXXXX)
trap 'rm -rf "$D"' EXIT
python3 - "$D/text.txt" <<'PY'
import random, sys
random.seed(1)
w = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(w) for _ in range(random.randint(3, 9))) + ".\n" for _ in range(40000)))
PY
cat > "$D/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 512, "vocab_size": 256},
 "data": {"train": "$D/text.txt", "val_fraction": 0.01}, "train_micro_batch_size_per_gpu": 8,
 "train_steps": $STEPS, "steps_per_print": 1, "eval": {"every_steps": 0}, "threads": 2, "seed": 1,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
for p in none selective full; do
  ./dtrun --standalone --nproc_per_node 1 "$D/gpt.json" log.dir="$D/$p" activation_checkpointing.policy=$p >"$D/$p.out" 2>&1 ||
    { tail -5 "$D/$p.out"; exit 1; }
done
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
rows = {}
for p in ("none", "selective", "full"):
    s = json.load(open(f"{d}/{p}/summary.json"))
    r = s["ranks"][0]
    m = [json.loads(l) for l in open(f"{d}/{p}/metrics.jsonl")]
    steps = [x["step_ms"] for x in m if x["step"] >= 2] or [m[-1]["step_ms"]]
    rows[p] = (r["peak_bytes"], r["activation_bytes"], sum(steps) / len(steps), m[-1]["loss"])
n = rows["none"]
print(f"{'policy':10} {'peak MB':>9} {'activations MB':>15} {'x none':>7} {'step ms':>9} {'x none':>7} {'loss':>8}")
for p, (peak, act, ms, loss) in rows.items():
    print(f"{p:10} {peak / 1e6:9.1f} {act / 1e6:15.1f} {act / n[1]:7.3f} {ms:9.0f} {ms / n[2]:7.3f} {loss:8.4f}")
f = rows["full"]
print(f"target full <= 0.5x activations at <= 1.4x step time: {'met' if f[1] <= 0.5 * n[1] and f[2] <= 1.4 * n[2] else 'NOT met'}")
PY
