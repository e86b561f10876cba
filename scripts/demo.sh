#!/usr/bin/env bash
# demo.sh - what `make run` does: prepares the demo corpus (Debian's fortunes,
# installed by install-deps.sh) and trains the character-level GPT of
# configs/demo.json on 2 CPU ranks with DDP, ending with generated text.
# It runs on the CPU on any machine (configs/demo.json sets device cpu).
# Extra arguments are config overrides, e.g. `scripts/demo.sh train_steps=200`; so are
# the words of DEMO_ARGS (`DEMO_ARGS=train_steps=200 make run`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prepare_demo_data.sh
# shellcheck disable=SC2086 # DEMO_ARGS: words on purpose
exec ./dtrun --standalone --nproc_per_node 2 configs/demo.json ${DEMO_ARGS:-} "$@"
