#!/usr/bin/env bash
# restart_time.sh - time from a worker's death to the first step after the restart,
# for one or more dtrun binaries: the demo model (configs/demo.json) on 2 ranks,
# --max_restarts 1, rank 1 SIGKILLed by the fault hook after step 25
# (DTRUN_FAULT_KILL_STEP/RANK), a checkpoint every 20 steps; REPS runs per binary
# through ckpt_restart.py, each run's line, then the median per binary and how the
# survivors stopped.
# Usage: scripts/bench/restart_time.sh [DTRUN ...] (default ./dtrun); REPS (default
# 5). The corpus is runs/data/fortunes.txt when present, else a generated one.
set -eu
cd "$(dirname "$0")/../.."
REPS=${REPS:-5}
[ $# -gt 0 ] || set -- "$PWD/dtrun"
D=$(mktemp -d /tmp/dtrun-restart.XXXXXX)
trap 'rm -rf "$D"' EXIT
data=$PWD/runs/data/fortunes.txt
if [ ! -s "$data" ]; then
  data=$D/text.txt
  python3 - "$data" <<'PY'
import random, sys
random.seed(1)
words = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(words) for _ in range(random.randint(3, 9))) + ".\n"
                                     for _ in range(20000)))
PY
fi
# The binaries take turns (load on the machine drifts alike for all).
for i in $(seq "$REPS"); do
  k=0
  for bin in "$@"; do
    k=$((k + 1))
    rm -rf "$D/run"
    DTRUN=$bin DTRUN_FAULT_KILL_RANK=1 python3 scripts/bench/ckpt_restart.py configs/demo.json 25 2 \
      "data.train=$data" train_steps=30 checkpoint.every_steps=20 checkpoint.resume=auto eval.every_steps=0 \
      sample_tokens=0 "checkpoint.dir=$D/run/ckpt" "log.dir=$D/run" | sed "s|^|$bin: |" | tee -a "$D/lines$k"
  done
done
k=0
for bin in "$@"; do
  k=$((k + 1))
  python3 - "$D/lines$k" "$bin" <<'PY'
import re, statistics, sys
text = open(sys.argv[1]).read()
v = [float(m.group(1)) for m in re.finditer(r"first step printed ([0-9.]+) s after", text)]
lo = [float(m.group(1)) for m in re.finditer(r"checkpoint loaded after ([0-9.]+) s", text)]
stops = {}
for m in re.finditer(r"survivors: (.*)", text): stops[m.group(1)] = stops.get(m.group(1), 0) + 1
print(f"{sys.argv[2]}: median {statistics.median(v):.3f} s from the death to the first step after the restart "
      f"(min {min(v):.3f}, max {max(v):.3f}, {len(v)} runs; checkpoint loaded after a median "
      f"{statistics.median(lo):.3f} s); survivors: "
      + ", ".join(f"{k} x{n}" for k, n in sorted(stops.items())))
PY
done
