#!/usr/bin/env bash
# test_elastic.sh - elastic resize that keeps the math (--nnodes 2:3, loopback agents):
#   1. three agents; node 2's agent is SIGKILLed mid-run: the two survivors
#      re-rendezvous and resume from the latest checkpoint at world size 2 with the
#      global batch kept (accumulation 2 -> 3); each step's loss from there on is
#      within 1e-5 relative of a 2-node run resumed from a copy of that checkpoint;
#   2. node 2's agent comes back while the 2-node round runs: it waits, the workers
#      stop at the next checkpoint, all three resume at world size 3;
#   metrics.jsonl rows carry world_size (3, then 2, then 3), summary.json lists both
#   resizes; the resize time (kill -> first step at world size 2) is printed;
#   3. two of three nodes lost: the host exits 3 naming both.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
make_text "$DT_TMP/text.txt" 1 4000
# micro-batch 4 x accumulation 2 x 3 ranks: the run's global batch is 24 (2 ranks: accumulation 3)
cfg() { cat <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
 "train_steps": $3, "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1,
 "seed": 5, "eval": {"every_steps": 0}, "checkpoint": {"dir": "$1", "every_steps": 20, "keep_last": 0, "resume": "${4:-auto}"},
 "log": {"dir": "$2"}}
JSON
}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])'; }
flags() { echo "--nnodes 2:3 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$1 --max_restarts 3 --rdzv_conf heartbeat_interval=0.2,join_timeout=${2:-30},last_call_timeout=1"; }
rows() { cat "$1" 2>/dev/null | wc -l; }
STEPS=1500
cfg "$DT_TMP/ck" "$DT_TMP/log" $STEPS > "$DT_TMP/e.json"

# ---- 1 and 2: lose node 2, finish on 2 nodes, node 2 rejoins ----
R=$(flags "$(port)")
timeout 120 "$DTRUN" $R --local_addr 127.0.0.2 "$DT_TMP/e.json" > "$DT_TMP/n0.out" 2>&1 & a0=$!
timeout 120 "$DTRUN" $R --local_addr 127.0.0.3 "$DT_TMP/e.json" > "$DT_TMP/n1.out" 2>&1 & a1=$!
"$DTRUN" $R --local_addr 127.0.0.4 "$DT_TMP/e.json" > "$DT_TMP/n2.out" 2>&1 & a2=$!
M="$DT_TMP/log/metrics.jsonl"
deadline=$((SECONDS + 40))
while [ "$(rows "$M")" -lt 50 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
t_kill=$(date +%s.%N)
logged_at_kill=$(rows "$M")  # steps 1..this were logged before the loss: lost unless checkpointed
kill -9 $a2; wait $a2 2>/dev/null
# the first row at world size 2 is the first step after the resize
while ! grep -q '"world_size":2' "$M" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
t_resumed=$(date +%s.%N)
# node 2 returns once the 2-node round has run a few steps
while [ "$(grep -c '"world_size":2' "$M" 2>/dev/null)" -lt 30 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
timeout 120 "$DTRUN" $R --local_addr 127.0.0.4 "$DT_TMP/e.json" > "$DT_TMP/n2b.out" 2>&1 & a2=$!
wait $a0; rc0=$?; wait $a1; rc1=$?; wait $a2; rc2=$?
echo "resize time (node 2 SIGKILLed -> first step at world size 2): $(python3 -c "print('%.2f' % ($t_resumed - $t_kill))") s"
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then pass "3 -> 2 -> 3 nodes: every agent exits 0"
else fail "3 -> 2 -> 3 nodes" "rc=$rc0/$rc1/$rc2 $(tail -3 "$DT_TMP/n0.out") $(tail -3 "$DT_TMP/n2b.out")"; fi
grep -q "elastic resize: world size 3 -> 2, gradient accumulation 2 -> 3 (global batch 24 kept)" "$DT_TMP/n0.out" &&
  grep -q "elastic resize: world size 2 -> 3, gradient accumulation 3 -> 2 (global batch 24 kept)" "$DT_TMP/n0.out" &&
  grep -q "waits to be admitted" "$DT_TMP/n2b.out" \
  && pass "both resizes logged (sizes, accumulation, global batch kept); the returning node waited" \
  || fail "resize log lines" "$(grep -i "elastic\|wait" "$DT_TMP/n0.out" "$DT_TMP/n2b.out" | head -8)"
# the resize did not use up --max_restarts: only the loss of node 2 did
grep -q "restarting the workers (restart 1 of 3)" "$DT_TMP/n0.out" && ! grep -q "restart 2 of 3" "$DT_TMP/n0.out" \
  && pass "the scale-up is not counted against --max_restarts" || fail "restart count" "$(grep restart "$DT_TMP/n0.out")"

# the step the survivors resumed from, and the 2-node reference resumed from a copy of it
S=$(python3 -c "import json; print(json.load(open('$DT_TMP/log/summary.json'))['resizes'][0]['resumed_step'])" 2>/dev/null)
if [ -n "$S" ] && [ -d "$DT_TMP/ck/$(printf step_%08d "$S")" ]; then
  mkdir -p "$DT_TMP/ref_ck"; cp -r "$DT_TMP/ck/$(printf step_%08d "$S")" "$DT_TMP/ref_ck/"
  E=$(python3 -c "import json; print(json.load(open('$DT_TMP/log/summary.json'))['resizes'][1]['resumed_step'])")
  cfg "$DT_TMP/ref_ck" "$DT_TMP/ref_log" "$E" "$DT_TMP/ref_ck/$(printf step_%08d "$S")" > "$DT_TMP/ref.json"
  R2=$(flags "$(port)")
  timeout 120 "$DTRUN" $R2 --local_addr 127.0.0.2 "$DT_TMP/ref.json" > "$DT_TMP/r0.out" 2>&1 & b0=$!
  timeout 120 "$DTRUN" $R2 --local_addr 127.0.0.3 "$DT_TMP/ref.json" > "$DT_TMP/r1.out" 2>&1; rr1=$?
  wait $b0; rr0=$?
  [ $rr0 -eq 0 ] && [ $rr1 -eq 0 ] || fail "reference 2-node run" "$(tail -3 "$DT_TMP/r0.out")"
else fail "summary.json resizes[0].resumed_step" "$(cat "$DT_TMP/log/summary.json" 2>/dev/null | head -c 300)"; fi
if python3 - "$DT_TMP" "$STEPS" "$logged_at_kill" <<'PY'
import json, sys
d, steps, logged_at_kill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(d + "/log/metrics.jsonl")]
ws = [r["world_size"] for r in rows]
assert [r["step"] for r in rows] == list(range(1, steps + 1)), "steps not 1..%d once each" % steps
runs = [w for i, w in enumerate(ws) if i == 0 or ws[i - 1] != w]
assert runs == [3, 2, 3], "world_size runs %s" % runs
s = json.load(open(d + "/log/summary.json"))
rz = s["resizes"]
assert [(r["from_world_size"], r["to_world_size"]) for r in rz] == [(3, 2), (2, 3)], rz
assert all(r["train_batch_size"] == 24 for r in rz), rz
assert [(r["from_accumulation"], r["to_accumulation"]) for r in rz] == [(2, 3), (3, 2)], rz
S, E = rz[0]["resumed_step"], rz[1]["resumed_step"]
assert S % 20 == 0 and E % 20 == 0 and E > S, (S, E)
# steps lost: at least those logged after the checkpoint before the kill; none at the
# scale-up (the workers stop right after the boundary's save)
assert rz[0]["steps_lost"] >= logged_at_kill - S, (rz[0], logged_at_kill)
assert rz[1]["steps_lost"] == 0, rz[1]
# the 2-node rows are exactly the steps S+1..E; the 3-node rows after E
assert all(r["world_size"] == 2 for r in rows if S < r["step"] <= E), "rows between the resizes not at 2"
assert all(r["world_size"] == 3 for r in rows if r["step"] > E or r["step"] <= S)
ref = {r["step"]: r["loss"] for r in map(json.loads, open(d + "/ref_log/metrics.jsonl"))}
got = {r["step"]: r["loss"] for r in rows}
bad = [(k, got[k], ref.get(k)) for k in range(S + 1, E + 1)
       if ref.get(k) is None or abs(got[k] - ref[k]) > 1e-5 * abs(ref[k])]
assert not bad, "losses differ from the 2-node reference: %s" % bad[:3]
print("resized at step", S, "and", E, "; compared", E - S, "steps")
PY
then pass "world_size per row 3/2/3, summary resizes, losses after the resize = the 2-node reference (1e-5)"
else fail "metrics, summary and losses after the resizes"; fi

# ---- a worker resumed at a size where no integer accumulation keeps the run's batch: exit 1 ----
out=$(env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.2 MASTER_PORT=1 DTRUN_ELASTIC=2:3 \
      timeout 20 "$DTRUN" __worker "$DT_TMP/e.json" train_micro_batch_size_per_gpu=8 2>&1); rc=$?
if [ $rc -eq 1 ] && [[ $out == *"world size 2"*"train_batch_size (from the checkpoint's meta.json) 24 is not a multiple of train_micro_batch_size_per_gpu 8 x 2"* ]]; then
  pass "resume at world size 2 with micro 8 and the run's batch 24: exit 1 naming the sizes"
else fail "no integer accumulation" "rc=$rc $out"; fi

# ---- before anything starts: a train_batch_size some node count in MIN..MAX cannot reach ----
cfg "$DT_TMP/ck4" "$DT_TMP/log4" 10 > "$DT_TMP/g.json"
out=$("$DTRUN" --nnodes 2:4 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$(port) --local_addr 127.0.0.2 \
      "$DT_TMP/g.json" train_batch_size=24 gradient_accumulation_steps=auto 2>&1); rc=$?
if [ $rc -eq 2 ] && [[ $out == *"train_batch_size 24 with --nnodes 2:4"*"4 node(s) = world size 4 (4 x 4)"* ]] &&
   [[ $out != *"3 node(s)"* ]] && [ ! -e "$DT_TMP/log4" ]; then
  pass "train_batch_size 24 with --nnodes 2:4 (micro 4): exit 2 before start naming world size 4"
else fail "elastic batch check before start" "rc=$rc $out"; fi

# ---- 3: two of three nodes lost -> exit 3 naming them ----
cfg "$DT_TMP/ck3" "$DT_TMP/log3" 100000 > "$DT_TMP/f.json"
R=$(flags "$(port)" 5)
timeout 60 "$DTRUN" $R --local_addr 127.0.0.2 "$DT_TMP/f.json" > "$DT_TMP/f0.out" 2>&1 & a0=$!
"$DTRUN" $R --local_addr 127.0.0.3 "$DT_TMP/f.json" > "$DT_TMP/f1.out" 2>&1 & a1=$!
"$DTRUN" $R --local_addr 127.0.0.4 "$DT_TMP/f.json" > "$DT_TMP/f2.out" 2>&1 & a2=$!
deadline=$((SECONDS + 30))
while [ "$(rows "$DT_TMP/log3/metrics.jsonl")" -lt 20 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
kill -9 $a1 $a2; wait $a1 $a2 2>/dev/null
wait $a0; rc=$?
line=$(grep "lost and not back:" "$DT_TMP/f0.out")
if [ $rc -eq 3 ] && [[ $line == *"(127.0.0.3)"* ]] && [[ $line == *"(127.0.0.4)"* ]] && [[ $line == *"1 of 2 node(s) joined"* ]]; then
  pass "2 of 3 nodes lost with --nnodes 2:3: exit 3 naming both"
else fail "2 of 3 lost" "rc=$rc $(tail -3 "$DT_TMP/f0.out")"; fi

# ---- 4: no train_batch_size, started on 2 of --nnodes 2:3: the launcher picks the
# smallest batch every size keeps (4 x lcm(2, 3) = 24, not the 16 of 2 nodes that 3
# could not keep) and says so; a resume whose checkpoint holds a batch some size
# cannot keep is exit 2 naming it, before anything starts
cfg "$DT_TMP/ckg" "$DT_TMP/logg" 3 > "$DT_TMP/g.json"
R=$(flags "$(port)" 10)
timeout 60 "$DTRUN" $R --local_addr 127.0.0.3 "$DT_TMP/g.json" log.dir="$DT_TMP/logg1" > "$DT_TMP/g1.out" 2>&1 & a1=$!
timeout 60 "$DTRUN" $R --local_addr 127.0.0.2 "$DT_TMP/g.json" > "$DT_TMP/g0.out" 2>&1; rc=$?; wait $a1
if [ $rc -eq 0 ] && grep -q 'elastic: --nnodes 2:3 and no train_batch_size: train_batch_size=24, the smallest global batch that 2 to 3 nodes all keep' "$DT_TMP/g0.out" \
   && grep -q 'world 2, micro-batch 4 x accumulation 3' "$DT_TMP/g0.out"; then
  pass "no train_batch_size with --nnodes 2:3: 24 picked and said, 2 nodes run accumulation 3"
else fail "elastic batch picked" "rc=$rc $(grep -E 'elastic|micro-batch' "$DT_TMP/g0.out" | head -3)"; fi
"$DTRUN" --nproc_per_node 1 "$DT_TMP/g.json" log.dir="$DT_TMP/logh" checkpoint.dir="$DT_TMP/ckh" gradient_accumulation_steps=4 \
  checkpoint.every_steps=1 train_steps=1 >/dev/null 2>&1
"$DTRUN" $(flags "$(port)" 10) --local_addr 127.0.0.2 "$DT_TMP/g.json" checkpoint.dir="$DT_TMP/ckh" > "$DT_TMP/h0.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "the run's train_batch_size (from the checkpoint a resume starts from) 16 with --nnodes 2:3" "$DT_TMP/h0.out"; then
  pass "resume of a 16-sample run with --nnodes 2:3: exit 2 naming the run's batch"
else fail "elastic resume batch" "rc=$rc $(tail -2 "$DT_TMP/h0.out")"; fi

# ---- 5: steps lost are counted from the last step done, not the last one logged: one
# log line per 1000 steps, checkpoints every 100, node 2 SIGKILLed a few steps after
# the step-100 checkpoint (the kill landing on a boundary would lose none: 1 in 100)
cfg "$DT_TMP/ckl" "$DT_TMP/logl" 1000 | sed 's/"steps_per_print": 1,/"steps_per_print": 1000,/; s/"every_steps": 20,/"every_steps": 100,/' > "$DT_TMP/l.json"
R=$(flags "$(port)")
timeout 60 "$DTRUN" $R --local_addr 127.0.0.2 "$DT_TMP/l.json" > "$DT_TMP/l0.out" 2>&1 & a0=$!
timeout 60 "$DTRUN" $R --local_addr 127.0.0.3 "$DT_TMP/l.json" > "$DT_TMP/l1.out" 2>&1 & a1=$!
"$DTRUN" $R --local_addr 127.0.0.4 "$DT_TMP/l.json" > "$DT_TMP/l2.out" 2>&1 & a2=$!
deadline=$((SECONDS + 30))
while [ ! -e "$DT_TMP/ckl/step_00000100" ] && [ $SECONDS -lt $deadline ]; do sleep 0.01; done
sleep 0.05; kill -9 $a2; wait $a2 2>/dev/null
wait $a0; rc0=$?; wait $a1
lost=$(sed -n 's/.*resumed from the checkpoint of step \([0-9]*\), \([0-9]*\) step(s) lost.*/\1 \2/p' "$DT_TMP/l0.out" | head -1)
if [ $rc0 -eq 0 ] && [ -n "$lost" ] && [ "${lost#* }" -gt 0 ] && [ "${lost#* }" -lt 1000 ]; then
  pass "steps lost counted from the last step done (resumed at ${lost% *}, ${lost#* } lost; none was logged)"
else fail "steps lost" "rc=$rc0 lost='$lost' $(grep -E 'elastic resize' "$DT_TMP/l0.out")"; fi
finish
