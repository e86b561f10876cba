#!/usr/bin/env bash
# prepare_fineweb.sh - the corpus configs/gpt2-124m.json trains on: FineWeb 10B
# tokenized with GPT-2's tokenizer, as llm.c's shards (fineweb_val_000000.bin and
# fineweb_train_00000N.bin, 100M tokens each), downloaded into runs/data/fineweb10B/
# from the Hugging Face dataset kjj0/fineweb10B-gpt2 (the shards modded-nanogpt uses).
#
#   scripts/prepare_fineweb.sh [N]      N training shards (default 8: 800M tokens, 1.6 GB)
#
# Needs a network that reaches huggingface.co: without one it says so and exits 3,
# and how to run the preset on data a clone has instead. Shards already there (of the
# size the server gives) are kept; a partial download resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8}
case $n in ''|*[!0-9]*) echo "prepare_fineweb.sh: N must be a number of shards (1-103), got '$n'" >&2; exit 2 ;; esac
[ "$n" -ge 1 ] && [ "$n" -le 103 ] || { echo "prepare_fineweb.sh: N must be 1-103, got $n" >&2; exit 2; }
base=${FINEWEB_URL:-https://huggingface.co/datasets/kjj0/fineweb10B-gpt2/resolve/main}
out=runs/data/fineweb10B
mkdir -p "$out"
if ! curl -sfI --max-time 15 "$base/fineweb_val_000000.bin" >/dev/null; then
  cat >&2 <<MSG
prepare_fineweb.sh: cannot reach $base (no network, or a proxy in the way):
nothing was downloaded. To run the preset on data this clone has instead:
  scripts/prepare_demo_data.sh
  dtrun tokenize --tokenizer tests/fixtures/tok/gpt2 runs/data/fortunes.txt -o runs/data/fortunes-gpt2
  dtrun --standalone --nproc_per_node 1 configs/gpt2-124m.json device=cpu \\
        'data.train=runs/data/fortunes-gpt2_train_*.bin' data.val=null train_batch_size=1 \\
        train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=1 model.seq_len=256 train_steps=5
(the 124M model on a CPU: about 1.2 s a step of 256 tokens on 2 cores)
MSG
  exit 3
fi
files=(fineweb_val_000000.bin)
for ((i = 1; i <= n; i++)); do files+=("$(printf 'fineweb_train_%06d.bin' "$i")"); done
for f in "${files[@]}"; do
  echo "prepare_fineweb.sh: $out/$f"
  curl -fL --retry 3 -C - -o "$out/$f.part" "$base/$f" || { echo "prepare_fineweb.sh: download of $f failed" >&2; exit 3; }
  mv "$out/$f.part" "$out/$f"
done
echo "prepare_fineweb.sh: ${#files[@]} shard(s) in $out; train with: dtrun --standalone --nproc_per_node 8 configs/gpt2-124m.json"
