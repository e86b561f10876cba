#!/usr/bin/env bash
# hf_load.sh [OUT_DIR] - loading Hugging Face weights (model.pretrained): throughput
# and memory. Makes a ~400 MB fp32 GPT (8 layers, n_embd 1024, bytes vocabulary) from a
# random init with dtrun itself (1 step, checkpoint, `export --format hf`), then starts
# one training step from it at 1 rank (ddp) and at 2 ranks (fsdp), twice each (the
# first run warms the page cache), and prints each rank's log line: bytes read, time,
# GB/s of file bytes, host RSS before loading, peak RSS (VmHWM) after, and the model
# state the strategy allocates (fsdp: 16 bytes per parameter / ranks on the CPU).
# The loading itself holds one 16 MiB chunk and never the whole model: the peak over
# "before" should be about the model state, at 2 ranks about half of the 1-rank one.
#   make -j2 dtrun && scripts/bench/hf_load.sh
set -eu
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-$PWD/dtrun}
OUT=${1:-$(mktemp -d /tmp/dtrun-hfload.XXXXXX)}
mkdir -p "$OUT"
python3 - "$OUT/text.txt" <<'PY'
import random, sys
random.seed(1)
w = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(w) for _ in range(6)) + ".\n" for _ in range(4000)))
PY
common='"data": {"train": "'$OUT'/text.txt"}, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
 "train_steps": 1, "threads": 1, "eval": {"every_steps": 0}, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}'
cat > "$OUT/make.json" <<JSON
{"model": {"type": "gpt", "n_layer": 8, "n_head": 16, "n_embd": 1024, "seq_len": 64, "vocab_size": 256,
           "vocab_pad_multiple": 64},
 $common, "checkpoint": {"dir": "$OUT/ck", "every_steps": 1, "resume": "never"}, "log": {"dir": "$OUT/log_make"}}
JSON
if [ ! -f "$OUT/hf/model.safetensors" ]; then
  "$DTRUN" __worker "$OUT/make.json" >"$OUT/make.out" 2>&1
  "$DTRUN" export "$OUT/ck" -o "$OUT/hf" --format hf
fi
ls -l "$OUT/hf"
for strat in ddp fsdp; do
  cat > "$OUT/load_$strat.json" <<JSON
{"model": {"pretrained": "$OUT/hf"}, "strategy": "$strat", $common,
 "checkpoint": {"dir": "$OUT/ck_$strat", "every_steps": 0, "resume": "never"}, "log": {"dir": "$OUT/log_$strat"}}
JSON
done
for run in 1 2; do
  echo "== 1 rank (ddp), run $run"
  "$DTRUN" --standalone --nproc_per_node 1 "$OUT/load_ddp.json" 2>&1 | grep "pretrained:"
  echo "== 2 ranks (fsdp), run $run"
  "$DTRUN" --standalone --nproc_per_node 2 "$OUT/load_fsdp.json" 2>&1 | grep "pretrained:"
done
echo "files in $OUT"
