#!/usr/bin/env bash
# adamw_cpu.sh - the host AdamW step of optimizer offload (zero_optimization.offload_optimizer)
# in GB/s of optimizer state touched per second (bf16 gradient and parameter, fp32 master,
# m, v: 28 bytes per element), on 1 and 2 threads, beside a streaming triad on the same
# threads: the memory bandwidth the step can get (about 11.5 GB/s per core here).
# usage: scripts/bench/adamw_cpu.sh [ELEMS]   (default 8388608: 235 MB touched per step)
set -eu
cd "$(dirname "$0")/../.."
make -s -j2 build/tests/helpers/bench_host_adamw
for th in 1 2; do
  build/tests/helpers/bench_host_adamw --threads "$th" --elems "${1:-8388608}"
done
build/tests/helpers/bench_host_adamw --threads 2 --elems "${1:-8388608}" --dtype fp32
