#!/usr/bin/env bash
# tp_cpu.sh [DTRUN] - tensor parallelism against data parallelism on this machine's CPU:
# a GPT whose layers are big enough that compute dominates
# (n_embd 1024, 4 layers, 16 heads, seq 256), the same global batch of 4 sequences on
#   1 rank  (micro-batch 4, 2 threads)
#   DP=2    (ddp, micro-batch 2 per rank, 1 thread each)
#   FSDP=2  (fsdp, micro-batch 2 per rank, 1 thread each)
#   TP=2    (micro-batch 4, 1 thread each), and TP=2 with sequence parallelism
# and prints the median step time (steps 2..N), the exposed TP communication per step
# (metrics.jsonl tp_comm_ms) and the peak memory and activation bytes per rank
# (summary.json). Runs alternate (noisy 2-core VM): ROUNDS=3 by default.
set -euo pipefail
DTRUN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/dtrun}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
W=$(mktemp -d /tmp/dtrun-tpbench.XXXXXX)
trap 'rm -rf "$W"' EXIT
python3 -c "
import random; random.seed(7)
words = 'the quick brown fox jumps over a lazy dog while seven tired cats sleep'.split()
open('$W/text.txt','w').write(''.join(' '.join(random.choice(words) for _ in range(8)) + '.\n' for _ in range(40000)))"
cat >"$W/cfg.json" <<JSON
{"model": {"type": "gpt", "n_layer": 4, "n_head": 16, "n_embd": 1024, "seq_len": 256, "vocab_size": 256},
 "data": {"train": "$W/text.txt"}, "train_batch_size": 4, "train_steps": $STEPS, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "eval": {"every_steps": 0},
 "checkpoint": {"every_steps": 0, "resume": "never"}, "sample_tokens": 0}
JSON
declare -A NP=([one]=1 [dp2]=2 [fsdp2]=2 [tp2]=2 [tp2sp]=2)
declare -A KV=(
  [one]="threads=2 train_micro_batch_size_per_gpu=4"
  [dp2]="threads=1 strategy=ddp train_micro_batch_size_per_gpu=2"
  [fsdp2]="threads=1 strategy=fsdp train_micro_batch_size_per_gpu=2"
  [tp2]="threads=1 tensor_parallel.size=2 train_micro_batch_size_per_gpu=4"
  [tp2sp]="threads=1 tensor_parallel.size=2 tensor_parallel.sequence_parallel=true train_micro_batch_size_per_gpu=4"
)
ORDER="one dp2 fsdp2 tp2 tp2sp"
for r in $(seq "$ROUNDS"); do
  for n in $ORDER; do
    # shellcheck disable=SC2086
    "$DTRUN" --standalone --nproc_per_node "${NP[$n]}" "$W/cfg.json" ${KV[$n]} log.dir="$W/$n.$r" \
      >"$W/$n.$r.out" 2>&1 || { echo "run $n failed:"; tail -5 "$W/$n.$r.out"; exit 1; }
  done
done
python3 - "$W" "$ROUNDS" $ORDER <<'PY'
import json, statistics, sys
w, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'run':8} {'step ms (median, range over rounds)':>36} {'tp comm ms':>11} {'comm ms':>8} {'peak MB/rank':>13} {'act MB/rank':>12} {'state MB/rank':>14}")
for n in names:
    meds, tps, comms = [], [], []
    for r in range(1, rounds + 1):
        m = [json.loads(l) for l in open(f"{w}/{n}.{r}/metrics.jsonl")][1:]
        meds.append(statistics.median(x["step_ms"] for x in m))
        tps.append(statistics.median(x.get("tp_comm_ms", 0) for x in m))
        comms.append(statistics.median(x["comm_ms"] for x in m))
    s = json.load(open(f"{w}/{n}.1/summary.json"))
    peak = max(x["peak_bytes"] for x in s["ranks"]) / 1e6
    act = max(x["activation_bytes"] for x in s["ranks"]) / 1e6
    st = max(x["model_state_bytes"]["total"] for x in s["ranks"]) / 1e6
    print(f"{n:8} {statistics.median(meds):14.0f} ({min(meds):6.0f} .. {max(meds):6.0f}) {'':9} {statistics.median(tps):11.1f} {statistics.median(comms):8.1f} {peak:13.1f} {act:12.1f} {st:14.1f}")
PY
