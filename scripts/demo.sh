#!/usr/bin/env bash
# demo.sh - what `make run` does: the most real thing dtrun can do so far.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f configs/demo.json ] && ./dtrun --help >/dev/null 2>&1 && [ -f runtime/trainer.c ]; then
  exec ./dtrun --standalone --nproc_per_node 2 configs/demo.json
fi
echo "The trainer is not built yet; running the rendezvous store benchmark instead."
exec ./dtrun bench store
