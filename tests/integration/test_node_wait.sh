#!/usr/bin/env bash
# test_node_wait.sh - a multi-node job whose other node never comes, or cannot start
# (issue 39: one node failing at start-up left the others waiting join_timeout
# without a word):
#   - node 0 alone says every DTRUN_WAIT_REPORT_S who has joined and that it waits,
#     then times out naming the count;
#   - node 1 whose config is refused (exit 2) tells node 0 through the store: node 0
#     exits 2 at once naming node 1 and the reason, not after join_timeout;
#   - node 1 whose store never comes says it cannot reach it yet, then times out.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
make_text "$DT_TMP/t.txt" 1 300
cat > "$DT_TMP/c.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 16, "vocab_size": 256},
 "data": {"train": "$DT_TMP/t.txt"}, "train_micro_batch_size_per_gpu": 2, "train_steps": 3, "threads": 1,
 "checkpoint": {"dir": "$DT_TMP/ck", "every_steps": 0}, "log": {"dir": "$DT_TMP/log"}}
JSON
export DTRUN_WAIT_REPORT_S=1

# node 0 alone
P=$(free_port)
s=$SECONDS
timeout 60 "$DTRUN" --nnodes 2 --node_rank 0 --rdzv_endpoint 127.0.0.1:$P --rdzv_conf join_timeout=4 \
  "$DT_TMP/c.json" >"$DT_TMP/a.out" 2>&1; rc=$?
n=$(grep -c "rendezvous round 0 at 127.0.0.1:$P: 1 of 2 node(s) joined after [0-9]* s (node 0 .*); waiting up to join_timeout 4 s" "$DT_TMP/a.out")
if [ $rc = 3 ] && [ "$n" -ge 2 ] && grep -q "timed out after 4 s (join_timeout): 1 of 2 node(s) joined" "$DT_TMP/a.out"; then
  pass "node 0 alone: $n 'waiting' lines naming who joined, then exit 3 at join_timeout"
else fail "node 0 alone" "rc=$rc lines=$n $(tail -3 "$DT_TMP/a.out")"; fi

# node 1's config refused: node 0 learns it through the store
P=$(free_port)
s=$SECONDS
timeout 60 "$DTRUN" --nnodes 2 --node_rank 0 --rdzv_endpoint 127.0.0.1:$P --rdzv_conf join_timeout=60 \
  "$DT_TMP/c.json" >"$DT_TMP/b0.out" 2>&1 & n0=$!
sleep 1
timeout 60 "$DTRUN" --nnodes 2 --node_rank 1 --rdzv_endpoint 127.0.0.1:$P --local_addr 127.0.0.1 \
  "$DT_TMP/c.json" data.train="$DT_TMP/none.txt" >"$DT_TMP/b1.out" 2>&1; rc1=$?
wait $n0; rc0=$?
took=$((SECONDS - s))
if [ $rc1 = 2 ] && [ $rc0 = 2 ] && [ $took -lt 20 ] &&
   grep -q "a node cannot start: node_rank 1 (127.0.0.1): config .*c.json is not valid: data.train: no file matches" "$DT_TMP/b0.out" &&
   ! grep -q '^\[rank' "$DT_TMP/b0.out"; then
  pass "node 1's config refused: node 0 exits 2 in ${took} s naming node 1 and the reason (join_timeout 60 s)"
else fail "node 1 refused, node 0 told" "rc0=$rc0 rc1=$rc1 ${took}s $(tail -2 "$DT_TMP/b0.out")"; fi

# node 1 and no store: it says so while it retries
P=$(free_port)
timeout 60 "$DTRUN" --nnodes 2 --node_rank 1 --rdzv_endpoint 127.0.0.1:$P --rdzv_conf join_timeout=4 \
  "$DT_TMP/c.json" >"$DT_TMP/c.out" 2>&1; rc=$?
n=$(grep -c "store at 127.0.0.1:$P not reachable yet (connect error: Connection refused): retrying until the timeout" "$DT_TMP/c.out")
if [ $rc = 3 ] && [ "$n" -ge 2 ] && grep -q "the rendezvous endpoint 127.0.0.1:$P did not answer: tried for 4.0 s (join_timeout 4 s)" "$DT_TMP/c.out"; then
  pass "node 1 without a store: $n 'not reachable yet' lines, then exit 3"
else fail "node 1 without a store" "rc=$rc lines=$n $(tail -3 "$DT_TMP/c.out")"; fi
finish
