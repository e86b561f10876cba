#!/usr/bin/env bash
# pp_cpu.sh [DTRUN] - pipeline schedules on this machine's CPU: a
# GPT of 8 layers (n_embd 256, 8 heads, seq 128, micro-batch 2) on 4 pipeline stages of
# 2 layers each, GPipe, 1F1B and interleaved (2 chunks of 1 layer per rank) at m = 4, 8
# and 16 micro-batches per step, 1 thread per rank; prints the median step time (steps
# 2..N), the measured bubble (metrics.jsonl pp_bubble: the share of the pipeline's span a
# stage did not compute, mean over stages) against the formula, stage 0's activation
# arenas and bytes, and the P2P bytes per step. DELAY_MS=F adds F ms of sleep per
# forward and 2F per backward on every stage (balanced stages whose time does not
# depend on how many processes share the 2 cores): the schedules' own bubble. Runs
# alternate (noisy 2-core VM): ROUNDS=2 by default.
set -euo pipefail
DTRUN=${1:-$(cd "$(dirname "$0")/../.." && pwd)/dtrun}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-5}
MS=${MS:-4 8 16}
W=$(mktemp -d /tmp/dtrun-ppbench.XXXXXX)
trap 'rm -rf "$W"' EXIT
python3 -c "
import random; random.seed(7)
words = 'the quick brown fox jumps over a lazy dog while seven tired cats sleep'.split()
open('$W/text.txt','w').write(''.join(' '.join(random.choice(words) for _ in range(8)) + '.\n' for _ in range(40000)))"
cat >"$W/cfg.json" <<JSON
{"model": {"type": "gpt", "n_layer": 8, "n_head": 8, "n_embd": 256, "seq_len": 128, "vocab_size": 256},
 "data": {"train": "$W/text.txt"}, "train_micro_batch_size_per_gpu": 2, "train_steps": $STEPS, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "eval": {"every_steps": 0}, "threads": 1,
 "checkpoint": {"every_steps": 0, "resume": "never"}, "sample_tokens": 0}
JSON
RUNS=""
for m in $MS; do
  for s in gpipe 1f1b interleaved; do RUNS="$RUNS $s:$m"; done
  RUNS="$RUNS one:$m"
done
for r in $(seq "$ROUNDS"); do
  for x in $RUNS; do
    s=${x%%:*} m=${x##*:}
    if [ "$s" = one ]; then np=1 kv=""; else np=4 kv="pipeline.stages=4 pipeline.schedule=$s"; fi
    [ "$s" = interleaved ] && kv="$kv pipeline.virtual_stages=2"
    # shellcheck disable=SC2086
    DTRUN_PP_TEST_DELAY_MS=${DELAY_MS:-0} "$DTRUN" --standalone --nproc_per_node $np "$W/cfg.json" \
      gradient_accumulation_steps=$m $kv log.dir="$W/$s.$m.$r" >"$W/$s.$m.$r.out" 2>&1 ||
      { echo "run $s m=$m failed:"; tail -5 "$W/$s.$m.$r.out"; exit 1; }
  done
done
python3 - "$W" "$ROUNDS" $RUNS <<'PY'
import json, statistics, sys
w, rounds, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'schedule':12} {'m':>3} {'step ms (median; range)':>26} {'bubble':>7} {'formula':>8} {'arenas s0':>9} {'act MB s0':>9} {'P2P MB/step':>11}")
for x in runs:
    s, m = x.split(":")
    meds, bub = [], []
    for r in range(1, rounds + 1):
        rows = [j for j in map(json.loads, open(f"{w}/{s}.{m}.{r}/metrics.jsonl")) if j["step"] >= 2]
        meds.append(statistics.median(j["step_ms"] for j in rows))
        if s != "one": bub.append(statistics.mean(j["pp_bubble"] for j in rows))
    summ = json.load(open(f"{w}/{s}.{m}.1/summary.json"))
    r0 = summ["ranks"][0]
    if s == "one":
        print(f"{'1 rank':12} {m:>3} {statistics.median(meds):10.1f} ({min(meds):.0f}-{max(meds):.0f}){'':>9} {'':>7} {'':>8} {'':>9} {r0['activation_bytes']/1e6:9.1f}")
        continue
    last = json.loads(open(f"{w}/{s}.{m}.1/metrics.jsonl").readlines()[-1])
    print(f"{s:12} {m:>3} {statistics.median(meds):10.1f} ({min(meds):.0f}-{max(meds):.0f}){'':>9} {statistics.mean(bub):7.3f} "
          f"{last['pp_bubble_ideal']:8.3f} {r0['pipeline']['activation_arenas']:9d} {r0['activation_bytes']/1e6:9.1f} "
          f"{last['p2p_bytes']/1e6:11.2f}")
PY
