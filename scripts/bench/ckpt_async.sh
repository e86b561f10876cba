#!/usr/bin/env bash
# ckpt_async.sh - checkpoint.async against synchronous saves for the GPT-2 124M
# state (12 layers, 768 wide, vocab 50257: fp32 params + Adam m + v, ~1.5 GB):
# the same short run twice on one rank, 3 periodic saves each (steps 3, 6, 9; the
# final save at step 10 is synchronous in both), and prints the mean time a
# synchronous save takes against the mean time training was blocked per async save
# (summary.json's ckpt_blocked_ms; ckpt_write_ms is the background write). The
# model's seq_len is 64 instead of 1024 to keep the CPU steps short: 0.7M fewer
# position parameters (0.6%), the printed n_params is the real count.
# Usage: scripts/bench/ckpt_async.sh [DIR] (DIR on the disk to measure, default
# /tmp; needs ~4 GB free). DTRUN (default ./dtrun) is the binary measured.
set -eu
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-$PWD/dtrun}
D=$(mktemp -d "${1:-/tmp}/dtrun-ckasync.XXXXXX")
trap 'rm -rf "$D"' EXIT
python3 - "$D/text.txt" <<'PY'
import random, sys
random.seed(1)
words = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(words) for _ in range(random.randint(3, 9))) + ".\n"
                                     for _ in range(4000)))
PY
cat > "$D/g.json" <<JSON
{"model": {"type": "gpt", "n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 64, "vocab_size": 50257},
 "data": {"train": "$D/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 1, "train_steps": 10, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
 "seed": 5, "checkpoint": {"dir": "$D/ck", "every_steps": 3, "keep_last": 1, "resume": "never"},
 "log": {"dir": "$D/run"}}
JSON
echo "disk: $(df -h "$D" | tail -1 | awk '{print $1}'), dtrun: $DTRUN"
"$DTRUN" __worker "$D/g.json" >"$D/sync.log" 2>&1 || { tail -5 "$D/sync.log"; exit 1; }
sync_ms=$(python3 - "$D/sync.log" <<'PY'
import re, sys
t = [float(m.group(1)) for m in re.finditer(r"checkpoint: step [369] \(every_steps\) saved to \S+ in ([0-9.]+) s", open(sys.argv[1]).read())]
assert len(t) == 3, t
print("%.1f" % (sum(t) / len(t) * 1e3))
PY
)
n_params=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["n_params"])' "$D/run/summary.json")
rm -rf "$D/ck" "$D/run"
"$DTRUN" __worker "$D/g.json" checkpoint.async=true >"$D/async.log" 2>&1 || { tail -5 "$D/async.log"; exit 1; }
grep "async) saved to" "$D/async.log" | sed 's/^.*checkpoint: /  async: /'
python3 - "$D/run/summary.json" "$sync_ms" "$n_params" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); sync_ms = float(sys.argv[2])
assert s["ckpt_async_saves"] == 3, s.get("ckpt_async_saves")
b, w = s["ckpt_blocked_ms"], s["ckpt_write_ms"]
print(f"GPT-2 124M state ({int(sys.argv[3])} params, {12 * int(sys.argv[3]) / 1e9:.2f} GB), 3 periodic saves each:")
print(f"  synchronous save: {sync_ms:.1f} ms per save (training blocked for all of it)")
print(f"  checkpoint.async: ckpt_blocked_ms {b:.1f} per save ({100 * b / sync_ms:.1f}% of synchronous), "
      f"ckpt_write_ms {w:.1f} in the background")
PY
