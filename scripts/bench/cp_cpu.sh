#!/usr/bin/env bash
# cp_cpu.sh - context parallelism on this machine's CPU cores.
#
# 1. The same sequence length at CP 1 and CP 2 (ring and Ulysses): tokens/s of the
#    whole run and per rank, the step's exposed communication (metrics.jsonl comm_ms:
#    the time a rank waited on the ring or the all-to-all), and each rank's activation
#    bytes (summary.json). CP 1 runs with as many threads as CP 2 has ranks in all, and
#    with one.
# 2. A sequence 4x longer than the longest CP 1 fits: the memory check (dtrun plan's
#    bytes against the memory available) refuses CP 1 at LONG tokens, and CP 4 trains
#    it (one step), with its activation bytes per rank.
# Medians over STEPS steps after the first. Usage: [T=4096] [LONG=32768] scripts/bench/cp_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DTRUN=${DTRUN:-./dtrun}
T=${T:-4096}
LONG=${LONG:-32768}
STEPS=${STEPS:-6}
TMP=$(mktemp -d /tmp/dtrun-cp-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

python3 - "$TMP/d.bin" <<'PY'
import sys, numpy as np
n = 2_000_000
h = np.zeros(256, np.int32); h[:3] = [20240520, 1, n]
t = np.random.default_rng(0).integers(0, 256, n).astype(np.uint16)
open(sys.argv[1], "wb").write(h.tobytes() + t.tobytes())
PY
cfg() { # SEQ_LEN HEADS LAYERS WIDTH
  cat <<JSON
{"model": {"type": "llama", "hidden_size": $4, "num_hidden_layers": $3, "num_attention_heads": $2,
           "num_key_value_heads": $2, "intermediate_size": $((4 * $4)), "max_position_embeddings": $1,
           "seq_len": $1, "vocab_size": 256},
 "data": {"train": "$TMP/d.bin", "val_fraction": 0.01},
 "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_steps": $STEPS, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "eval": {"every_steps": 0}, "seed": 3,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
}
cfg "$T" 8 4 128 > "$TMP/same.json"

figures() { # LOG_DIR NPROC LABEL
  python3 - "$1" "$2" "$3" <<'PY'
import json, statistics, sys
d, n, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")][1:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
comm = statistics.median(r.get("comm_ms", 0.0) for r in rows)
step = statistics.median(r["step_ms"] for r in rows)
s = json.load(open(d + "/summary.json"))
act = max(r["activation_bytes"] for r in s["ranks"])
print(f"| {label} | {n} | {tps:,.0f} | {tps / n:,.0f} | {step:,.0f} | {comm:,.1f} | {act / 2**20:,.1f} |")
PY
}

echo "## 1. seq_len $T, llama 128 wide x 4 layers, 8 heads, micro-batch 1 ($(nproc) cores)"
echo
echo "| run | ranks | tokens/s | per rank | step ms | exposed comm ms | activation MiB per rank |"
echo "|---|---|---|---|---|---|---|"
run() { # LABEL NPROC THREADS [KEY=VALUE...]
  local label=$1 np=$2 th=$3; shift 3
  "$DTRUN" --standalone --nproc_per_node "$np" "$TMP/same.json" threads="$th" "$@" log.dir="$TMP/$np.$th.$*" \
    >"$TMP/out" 2>&1 || { echo "| $label | failed: $(tail -1 "$TMP/out") |"; return; }
  figures "$TMP/$np.$th.$*" "$np" "$label"
}
run "CP 1, 1 thread" 1 1
run "CP 1, $(nproc) threads" 1 "$(nproc)"
run "CP 2 ring, 1 thread each" 2 1 context_parallel.size=2
run "CP 2 Ulysses, 1 thread each" 2 1 context_parallel.size=2 context_parallel.mode=ulysses

echo
echo "## 2. seq_len $LONG: CP 1 against the memory check, then CP 4 (llama 64 wide x 2 layers, 4 heads)"
echo
cfg "$LONG" 4 2 64 > "$TMP/long.json"
if "$DTRUN" --standalone --nproc_per_node 1 "$TMP/long.json" train_steps=1 threads=2 log.dir="$TMP/l1" \
     >"$TMP/l1.out" 2>&1; then
  echo "CP 1 at $LONG tokens trained (it fits here: raise LONG)"
else
  echo "CP 1 at $LONG tokens: $(grep -m1 -o 'not enough memory[^;]*' "$TMP/l1.out" || tail -1 "$TMP/l1.out")"
fi
half=$((LONG / 4))
if "$DTRUN" --standalone --nproc_per_node 1 "$TMP/long.json" model.seq_len=$half model.max_position_embeddings=$half \
     train_steps=1 threads=2 log.dir="$TMP/lq" >"$TMP/lq.out" 2>&1; then
  echo "CP 1 at $half tokens (a quarter) fits and trains"
else
  echo "CP 1 at $half tokens: $(grep -m1 -o 'not enough memory[^;]*' "$TMP/lq.out" || tail -1 "$TMP/lq.out")"
fi
t0=$(date +%s.%N)
if "$DTRUN" --standalone --nproc_per_node 4 "$TMP/long.json" train_steps=1 threads=1 context_parallel.size=4 \
     log.dir="$TMP/l4" >"$TMP/l4.out" 2>&1; then
  python3 - "$TMP/l4" "$t0" "$LONG" <<'PY'
import json, sys, time
s = json.load(open(sys.argv[1] + "/summary.json"))
act = max(r["activation_bytes"] for r in s["ranks"])
print(f"CP 4 at {sys.argv[3]} tokens trains: 1 step, loss {s['final_loss']:.4f}, {time.time() - float(sys.argv[2]):.0f} s "
      f"wall with start, activation {act / 2**20:,.1f} MiB per rank")
PY
else
  echo "CP 4 at $LONG tokens failed: $(tail -3 "$TMP/l4.out")"
fi
