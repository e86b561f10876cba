#!/usr/bin/env bash
# test_node_return.sh - a node lost in a multi-node run comes back: two agents on
# loopback addresses with --max_restarts 2 and checkpoints; node 1's agent is
# SIGKILLed mid-run (its worker dies with it), node 0 starts round 1 and waits,
# node 1's agent is launched again and joins round 1, both resume from the latest
# checkpoint, and every step's loss equals the uninterrupted run's.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
make_text "$DT_TMP/text.txt" 1 4000
cfg() { cat <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 8, "train_steps": 150,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "eval": {"every_steps": 0}, "checkpoint": {"dir": "$1", "every_steps": 10, "resume": "auto"},
 "log": {"dir": "$2"}}
JSON
}
cfg "$DT_TMP/ck0" "$DT_TMP/log0" > "$DT_TMP/a.json"
cfg "$DT_TMP/ck1" "$DT_TMP/log1" > "$DT_TMP/b.json"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])'; }
flags() { echo "--nnodes 2 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$1 --rdzv_conf heartbeat_interval=0.2,join_timeout=30 --max_restarts 2"; }

R=$(flags "$(port)")
timeout 120 "$DTRUN" $R --local_addr 127.0.0.2 --node_rank 0 "$DT_TMP/a.json" > "$DT_TMP/u0.out" 2>&1 &
timeout 120 "$DTRUN" $R --local_addr 127.0.0.3 --node_rank 1 "$DT_TMP/a.json" > "$DT_TMP/u1.out" 2>&1
wait
[ -s "$DT_TMP/log0/metrics.jsonl" ] || fail "uninterrupted 2-node run" "$(tail -3 "$DT_TMP/u0.out")"

R=$(flags "$(port)")
timeout 120 "$DTRUN" $R --local_addr 127.0.0.2 --node_rank 0 "$DT_TMP/b.json" > "$DT_TMP/n0.out" 2>&1 & a0=$!
"$DTRUN" $R --local_addr 127.0.0.3 --node_rank 1 "$DT_TMP/b.json" > "$DT_TMP/n1.out" 2>&1 & a1=$!
deadline=$((SECONDS + 60))
while [ "$(cat "$DT_TMP/log1/metrics.jsonl" 2>/dev/null | wc -l)" -lt 45 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
kill -9 $a1; wait $a1 2>/dev/null
sleep 0.5
timeout 120 "$DTRUN" $R --local_addr 127.0.0.3 --node_rank 1 "$DT_TMP/b.json" > "$DT_TMP/n1b.out" 2>&1; rc1=$?
wait $a0; rc0=$?
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "joining it (restart count 1)" "$DT_TMP/n1b.out"; then
  pass "node 1 returns and joins the round in progress"
else fail "node 1 returns" "rc0=$rc0 rc1=$rc1 $(tail -2 "$DT_TMP/n0.out") $(tail -2 "$DT_TMP/n1b.out")"; fi
if python3 - "$DT_TMP" <<'PY'
import json, sys
d = sys.argv[1]
a = [json.loads(l) for l in open(d + "/log0/metrics.jsonl")]
b = {}
for l in open(d + "/log1/metrics.jsonl"):
    r = json.loads(l); b[r["step"]] = r["loss"]
assert a[-1]["step"] == 150 and max(b) == 150
assert all(b.get(r["step"]) == r["loss"] for r in a), "losses differ"
PY
then pass "resumed run has the uninterrupted run's losses at every step"; else fail "same losses after the node returned"; fi
finish
