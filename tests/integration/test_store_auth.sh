#!/usr/bin/env bash
# test_store_auth.sh - a rendezvous strangers cannot join (issue 20): agents with the
# same token work (--exec and the built-in trainer, one node and two); a client
# without the token gets nothing but a close, logged with its address; --exec
# workers (no token) are let in from a joined node's address only; a node with
# another token exits 3 while the others go on; a token file others may read is
# exit 2; `dtrun store` listens on 127.0.0.1 unless told; --rdzv_conf bind=ADDR;
# --master_addr '' is exit 2. Several agents share this machine on 127.0.0.2..
. "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CLIENT="python3 $HERE/store_client.py"
T="timeout -k 2 60"
cd "$DT_TMP"
umask 077
echo "the job's secret" > tok
echo "another job's secret" > tok2
FAST="join_timeout=20,heartbeat_interval=0.2"

# A listener on PORT in /proc/net/tcp: prints its local address (hex, as the kernel).
listen_addr() { awk -v p=$(printf '%04X' "$1") '$4 == "0A" && substr($2, index($2, ":") + 1) == p { print substr($2, 1, index($2, ":") - 1) }' /proc/net/tcp; }

# 1. two nodes, same token, --exec workers that speak torch's protocol without a token
P=$(free_port)
for i in 1 0; do
  ( $T "$DTRUN" --nnodes 2 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$P --local_addr 127.0.0.$((i + 2)) \
      --rdzv_conf token_file=tok,$FAST --monitor_interval 0.05 --exec sh -c "$CLIENT \$MASTER_ADDR \$MASTER_PORT" \
      >"a$i.out" 2>"a$i.err"; echo $? >"a$i.rc" ) &
done
wait
if [ "$(cat a0.rc a1.rc)" = "$(printf '0\n0')" ] && grep -q 'rank0\]:pong' a0.out && grep -q 'rank1\]:pong' a1.out; then
  pass "same token: 2 nodes join, --exec workers from joined nodes are served"
else fail "same token, 2 nodes" "rc=$(cat a0.rc a1.rc | tr '\n' ' ') $(tail -n 3 a0.err a1.err a0.out a1.out)"; fi

# 2. the built-in trainer on two nodes with a token (its workers authenticate)
P=$(free_port)
for i in 1 0; do
  ( $T "$DTRUN" --nnodes 2 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$P --local_addr 127.0.0.$((i + 2)) \
      --rdzv_conf token_file=tok,$FAST "$ROOT/configs/mlp-tiny.json" train_steps=4 log.dir="$DT_TMP/m$i" \
      checkpoint.dir="$DT_TMP/mc$i" >"t$i.out" 2>&1; echo $? >"t$i.rc" ) &
done
wait
if [ "$(cat t0.rc t1.rc)" = "$(printf '0\n0')" ] && grep -q 'step 4/4' t0.out; then pass "same token: the built-in trainer on 2 nodes"
else fail "trainer with a token" "rc=$(cat t0.rc t1.rc | tr '\n' ' ') $(tail -n 3 t0.out t1.out)"; fi

# 3. a stranger without the token, from another address, while a job runs: a close, no
# byte, a log line with its address; nothing it sent was stored
P=$(free_port)
$T "$DTRUN" --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $P --rdzv_conf token_file=tok \
   --exec sh -c 'while [ ! -e go ]; do sleep 0.05; done; echo done' >s.out 2>s.err &
apid=$!
# The job runs until the stranger has tried (the file go), not for a fixed time
# that a slow machine could use up before the client connects.
for _ in $(seq 100); do [ -n "$(listen_addr $P)" ] && break; sleep 0.1; done
got=$($CLIENT 127.0.0.1 $P 127.0.0.9 2>&1)
touch go
wait $apid; arc=$?
if [ "$got" = "closed after 0 bytes" ] && [ $arc = 0 ] && grep -q 'closing connection from 127.0.0.9:[0-9]*: not authenticated' s.err; then
  pass "a client without the token gets only a close, logged with its address"
else fail "stranger refused" "got='$got' rc=$arc $(tail -n 3 s.err)"; fi

# 4. a node with another token exits 3 saying so; the other two nodes run the job
P=$(free_port)
for i in 2 1 0; do
  tf=tok; [ $i = 2 ] && tf=tok2
  ( $T "$DTRUN" --nnodes 2 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$P --local_addr 127.0.0.$((i + 2)) \
      --rdzv_conf token_file=$tf,$FAST --monitor_interval 0.05 --exec sh -c 'sleep 3; echo ran' \
      >"w$i.out" 2>"w$i.err"; echo $? >"w$i.rc" ) &
  [ $i = 2 ] && sleep 1  # it reaches the store while the others are joining
done
wait
if [ "$(cat w2.rc)" = 3 ] && grep -q "refused this node's token" w2.err && ! grep -q '\[rank\|rank[0-9]\]' w2.out \
   && [ "$(cat w0.rc w1.rc)" = "$(printf '0\n0')" ] && grep -q 'rank0\]:ran' w0.out && grep -q 'rank1\]:ran' w1.out; then
  pass "a node with another token exits 3 (token refused); the others go on"
else fail "wrong token" "rc=$(cat w0.rc w1.rc w2.rc | tr '\n' ' ') $(tail -n 2 w2.err w0.err)"; fi

# 5. a token file the group or others may read: exit 2, nothing started (also from the environment)
cp tok loose && chmod 644 loose
"$DTRUN" --nproc_per_node 1 --rdzv_conf token_file=loose --exec echo started >l.out 2>&1; rc=$?
DTRUN_RDZV_TOKEN_FILE=loose "$DTRUN" --nproc_per_node 1 --exec echo started >l2.out 2>&1; rc2=$?
chmod 640 loose
"$DTRUN" --nproc_per_node 1 --rdzv_conf token_file=loose --exec echo started >l3.out 2>&1; rc3=$?
if [ $rc = 2 ] && [ $rc2 = 2 ] && [ $rc3 = 2 ] && grep -q 'chmod 600' l.out && grep -q 'chmod 600' l2.out \
   && grep -q 'the group' l3.out && ! grep -qx started l.out l2.out l3.out; then
  pass "a group- or world-readable token file is exit 2"
else fail "loose token file" "rc=$rc/$rc2/$rc3 $(cat l.out l3.out)"; fi

# 6. dtrun store listens on 127.0.0.1 unless told otherwise
"$DTRUN" store --port 0 >st.out 2>&1 &
spid=$!
for _ in $(seq 50); do grep -q listening st.out && break; sleep 0.1; done
sp=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' st.out)
la=$([ -n "$sp" ] && listen_addr "$sp")
kill $spid; wait $spid 2>/dev/null
if [ -n "$sp" ] && [ "$la" = 0100007F ]; then pass "dtrun store listens on 127.0.0.1 by default"
else fail "dtrun store default address" "$(cat st.out) listener=$la"; fi

# 7. --rdzv_conf bind=ADDR: the store listens there (seen from the worker)
P=$(free_port)
out=$("$DTRUN" --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $P --rdzv_conf bind=0.0.0.0 \
      --exec sh -c "awk '\$4 == \"0A\" {print \$2}' /proc/net/tcp" 2>&1)
if echo "$out" | grep -q "00000000:$(printf '%04X' $P)"; then pass "--rdzv_conf bind=0.0.0.0 listens on every interface"
else fail "bind" "$out"; fi

# 8. --master_addr '' is bad usage (it used to start with MASTER_ADDR= empty)
"$DTRUN" --nproc_per_node 1 --master_addr '' --exec echo started >e.out 2>&1; rc=$?
if [ $rc = 2 ] && grep -q 'master_addr is empty' e.out && ! grep -qx started e.out; then pass "--master_addr '' is exit 2"
else fail "--master_addr ''" "rc=$rc $(cat e.out)"; fi
finish
