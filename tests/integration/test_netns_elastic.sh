#!/usr/bin/env bash
# test_netns_elastic.sh - elastic scale-down across a cut link: three agents
# (--nnodes 2:3, the built-in trainer, checkpoints every 20 steps) in three network
# namespaces on a bridge (10.200.0.1 hosts the store, .2, .3: addresses that exist
# only inside the namespaces this script creates and deletes). Mid-run the link of
# node 10.200.0.3 goes down:
#   - the other two re-rendezvous and finish at world size 2 with the global batch
#     kept (metrics.jsonl world_size 3 then 2, every step once; summary.json's resize
#     3 -> 2, accumulation 2 -> 3, train_batch_size 24);
#   - the cut-off agent does not hang: it exits 3 naming the lost store within
#     seconds, and says so once (not every tick of the stop).
# Both bounds need the stop after a failure to skip the preemption save (branch
# i21-ckpt, "Worker death: ... DT_STOP_GROUP_FAILURE"): without it each side's worker
# blocks in the save's collective with the cut node and is killed after the 30 s grace.
# Needs root and `ip netns`; skipped with a message otherwise.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
A=dte$$a; B=dte$$b; C=dte$$c
cleanup() { for ns in $A $B $C; do ip netns del $ns 2>/dev/null; done; rm -rf "$DT_TMP"; }
trap cleanup EXIT
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add $A 2>/dev/null; then
  skip "netns elastic" "needs root and ip netns (network namespaces not permitted here)"; finish
fi
# node 0's namespace holds the bridge; one veth pair per other node
ip netns add $B && ip netns add $C && ip -n $A link add br0 type bridge \
  && ip link add vA1 netns $A type veth peer name vB netns $B && ip link add vA2 netns $A type veth peer name vC netns $C \
  && ip -n $A link set vA1 master br0 && ip -n $A link set vA2 master br0 \
  && ip -n $A addr add 10.200.0.1/24 dev br0 && ip -n $B addr add 10.200.0.2/24 dev vB && ip -n $C addr add 10.200.0.3/24 dev vC \
  && for x in "$A br0" "$A vA1" "$A vA2" "$A lo" "$B vB" "$B lo" "$C vC" "$C lo"; do set -- $x; ip -n $1 link set $2 up || exit 1; done \
  || { skip "netns elastic" "could not set up the bridge and veth pairs"; finish; }
make_text "$DT_TMP/text.txt" 1 4000
# micro-batch 4 x accumulation 2 x 3 ranks: global batch 24 (2 ranks: accumulation 3)
STEPS=600
cat > "$DT_TMP/e.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
 "train_steps": $STEPS, "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1,
 "seed": 5, "eval": {"every_steps": 0}, "checkpoint": {"dir": "$DT_TMP/ck", "every_steps": 20, "keep_last": 0, "resume": "auto"},
 "log": {"dir": "$DT_TMP/log"}}
JSON
R="--nnodes 2:3 --nproc_per_node 1 --rdzv_endpoint 10.200.0.1:29400 --max_restarts 3
   --rdzv_conf heartbeat_interval=0.2,join_timeout=20,last_call_timeout=1"
ip netns exec $A timeout -k 2 60 "$DTRUN" $R --local_addr 10.200.0.1 "$DT_TMP/e.json" > "$DT_TMP/n0.out" 2>&1 & a0=$!
ip netns exec $B timeout -k 2 60 "$DTRUN" $R --local_addr 10.200.0.2 "$DT_TMP/e.json" > "$DT_TMP/n1.out" 2>&1 & a1=$!
ip netns exec $C timeout -k 2 60 "$DTRUN" $R --local_addr 10.200.0.3 "$DT_TMP/e.json" > "$DT_TMP/n2.out" 2>&1 & a2=$!
M="$DT_TMP/log/metrics.jsonl"
deadline=$((SECONDS + 30))
while [ "$(cat "$M" 2>/dev/null | wc -l)" -lt 50 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
t0=$(date +%s.%N)
ip -n $C link set vC down
wait $a2; rc2=$?; s2=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $t0))")
wait $a0; rc0=$?; wait $a1; rc1=$?; s=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $t0))")

if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "done: $STEPS steps" "$DT_TMP/n0.out" && python3 -c "import sys; sys.exit(not $s < 25)" \
   && grep -q "elastic resize: world size 3 -> 2, gradient accumulation 2 -> 3 (global batch 24 kept)" "$DT_TMP/n0.out"; then
  pass "link of 10.200.0.3 cut: the other two finish at world size 2, global batch 24 kept (${s} s after the cut)"
else fail "scale-down across a cut link" "rc=$rc0/$rc1 $(tail -4 "$DT_TMP/n0.out") $(tail -3 "$DT_TMP/n1.out")"; fi
if python3 - "$DT_TMP" "$STEPS" <<'PY'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(d + "/log/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, steps + 1)), "steps not 1..%d once each" % steps
ws = [r["world_size"] for r in rows]
runs = [w for i, w in enumerate(ws) if i == 0 or ws[i - 1] != w]
assert runs == [3, 2], "world_size runs %s" % runs
rz = json.load(open(d + "/log/summary.json"))["resizes"]
assert len(rz) == 1 and (rz[0]["from_world_size"], rz[0]["to_world_size"]) == (3, 2), rz
assert (rz[0]["from_accumulation"], rz[0]["to_accumulation"]) == (2, 3) and rz[0]["train_batch_size"] == 24, rz
S = rz[0]["resumed_step"]
assert S % 20 == 0 and S >= 40, S
assert all(r["world_size"] == (2 if r["step"] > S else 3) for r in rows), "rows after step %d not at 2" % S
PY
then pass "metrics world_size 3 then 2 from the resumed checkpoint on; summary.json has the resize 3 -> 2 (accumulation 2 -> 3)"
else fail "metrics and summary after the cut"; fi
# the log line and the exit's error line, not one per tick of the stop
nlost=$(grep -c "lost the rendezvous store at 10.200.0.1:29400" "$DT_TMP/n2.out")
if [ $rc2 -eq 3 ] && python3 -c "import sys; sys.exit(not $s2 < 20)" && [ "$nlost" -eq 2 ] \
   && grep -q "^dtrun: error: lost the rendezvous store at 10.200.0.1:29400 (node 0)" "$DT_TMP/n2.out"; then
  pass "the cut-off agent exits 3 naming the lost store ${s2} s after the cut (said $nlost time(s))"
else fail "cut-off agent" "rc=$rc2 after ${s2} s, said $nlost times: $(tail -3 "$DT_TMP/n2.out")"; fi
finish
