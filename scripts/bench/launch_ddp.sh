#!/usr/bin/env bash
# launch_ddp.sh - scripts/bench/ddp_gloo.py (an unmodified torchrun-style DDP script
# on gloo) under `dtrun --exec` and under torchrun; the losses must be identical.
set -euo pipefail
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-./dtrun}
NP=${NP:-2}
PYTHON=${PYTHON:-python3} # a python with torch (pip install torch); torchrun from the same environment
echo "== dtrun --standalone --nproc_per_node $NP --exec $PYTHON scripts/bench/ddp_gloo.py"
s=$(date +%s%N)
"$DTRUN" --standalone --nproc_per_node "$NP" --exec "$PYTHON" scripts/bench/ddp_gloo.py 2>/dev/null | tee /tmp/ddp_dtrun.$$
echo "(wall $(( ($(date +%s%N) - s) / 1000000 )) ms)"
echo "== torchrun --standalone --nproc_per_node $NP scripts/bench/ddp_gloo.py"
s=$(date +%s%N)
torchrun --standalone --nproc_per_node "$NP" --tee 3 scripts/bench/ddp_gloo.py 2>/dev/null | tee /tmp/ddp_torchrun.$$
echo "(wall $(( ($(date +%s%N) - s) / 1000000 )) ms)"
a=$(grep -o 'step [0-9] loss [0-9.]*' /tmp/ddp_dtrun.$$); b=$(grep -o 'step [0-9] loss [0-9.]*' /tmp/ddp_torchrun.$$)
rm -f /tmp/ddp_dtrun.$$ /tmp/ddp_torchrun.$$
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "losses identical"; else echo "losses DIFFER"; exit 1; fi
