#!/usr/bin/env bash
# run_all.sh - what `make bench` runs: every benchmark that needs nothing but dtrun.
set -euo pipefail
cd "$(dirname "$0")/../.."
./dtrun bench store
