#!/usr/bin/env bash
# tokenize_bench.sh - dtrun tokenize's tokens/s at --jobs 1 and 2 against Hugging
# Face tokenizers' encode_batch at 1 and 2 threads (scripts/bench/tokenize_cli_vs_hf.py),
# on the demo corpus and on a ~100 MB text made by repeating it with its fortunes
# shuffled (runs/data/fortunes_100mb.txt, seeded: the same bytes every time).
# Needs a python3 with tokenizers (PY=...); out of `make test`.
#   scripts/bench/tokenize_bench.sh [TOKENIZER.json]   (default: one trained on the corpus)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
[ -x ./dtrun ] || make -j2 dtrun >/dev/null
scripts/prepare_demo_data.sh
big=runs/data/fortunes_100mb.txt
if [ ! -s "$big" ]; then
  python3 - runs/data/fortunes.txt "$big" <<'PY'
import random, sys
docs = [d for d in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if d.strip()]
rng = random.Random(16)
out, n = [], 0
while n < 100_000_000:
    rng.shuffle(docs)
    for d in docs:
        out.append(d); n += len(d) + 2
        if n >= 100_000_000: break
open(sys.argv[2], "w", encoding="utf-8").write("\n\n".join(out) + "\n")
PY
fi
tok=()
[ $# -ge 1 ] && tok=(--tokenizer "$1")
for f in runs/data/fortunes.txt "$big"; do
  "$PY" scripts/bench/tokenize_cli_vs_hf.py "$f" "${tok[@]}" --jobs 1,2 --repeat "${REPEAT:-3}"
done
