#!/usr/bin/env bash
# run_all.sh - what `make bench` runs: every benchmark that needs nothing but dtrun.
set -euo pipefail
cd "$(dirname "$0")/../.."
./dtrun bench store
TORCH_RUNS=0 scripts/bench/launch_startup.sh   # dtrun only; TORCH_RUNS=5 adds torchrun
scripts/bench/launch_rdzv.sh
./dtrun --standalone --nproc_per_node 2 bench comm --backend shm --max 32M
