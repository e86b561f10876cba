#!/usr/bin/env bash
# test_preflight.sh - the checks across nodes before any worker starts, with real
# agents on loopback addresses (127.0.0.2, 127.0.0.3, ...): a difference in each
# class (optimizer, model, data, parallel layout, version, a launch flag) is exit 2
# on every node naming the node, the key and both values, and no worker started; a
# matching job trains as before; --no-preflight skips the check; `dtrun check`
# prints its table per node (4 nodes, timed). In two network namespaces with a
# firewall rule (nft) that drops new connections into one of them except to the
# store's port: exit 3 on both nodes naming the pair, in under 10 s (skipped
# without root, ip netns or nft).
. "$(dirname "$0")/lib.sh"
T="timeout -k 2 40"
cd "$DT_TMP"
FAST="--rdzv_conf join_timeout=10,heartbeat_interval=0.2 --monitor_interval 0.05"

make_text "$DT_TMP/text.txt" 1 400
mkdir -p "$DT_TMP/other" && head -c 3000 "$DT_TMP/text.txt" >"$DT_TMP/other/text.txt"
cat >"$DT_TMP/cfg.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 16, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.1},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 2, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# pair NPROC "NODE0 ARGS" "NODE1 ARGS" [ENV1 [ENV0]]: node 0 on 127.0.0.2 (the store), node 1
# on 127.0.0.3 with its own arguments (and environment); a$i.out/.err/.rc. Each node
# logs to its own log.dir (a per-node key).
pair() {
  local np=$1 a0=$2 a1=$3 env1=${4:-} env0=${5:-}; local port; port=$(free_port)
  ( env $env1 $T "$DTRUN" --nnodes 2 --nproc_per_node $np --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.3 \
      $FAST $a1 >"$DT_TMP/a1.out" 2>"$DT_TMP/a1.err"; echo $? >"$DT_TMP/a1.rc" ) & local p1=$!
  env $env0 $T "$DTRUN" --nnodes 2 --nproc_per_node $np --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.2 \
    $FAST $a0 >"$DT_TMP/a0.out" 2>"$DT_TMP/a0.err"; echo $? >"$DT_TMP/a0.rc"
  wait $p1
}
rcs() { echo "$(cat "$DT_TMP/a0.rc")$(cat "$DT_TMP/a1.rc")"; }
# both NAME RC LINE: both nodes exited RC and printed LINE (fixed string), no worker ran
both() {
  local name=$1 rc=$2 line=$3
  if [ "$(rcs)" = "$rc$rc" ] && grep -qF -- "$line" "$DT_TMP/a0.err" && grep -qF -- "$line" "$DT_TMP/a1.err" \
     && ! grep -q 'step 1/' "$DT_TMP/a0.out" "$DT_TMP/a1.out"; then pass "$name"
  else fail "$name" "rc=$(rcs) $(tail -n 3 "$DT_TMP/a0.err" "$DT_TMP/a1.err")"; fi
}
C="$DT_TMP/cfg.json"

# one difference per class: exit 2 on every node, naming node, address, key and values
pair 1 "$C log.dir=$DT_TMP/l0" "$C log.dir=$DT_TMP/l1 optimizer.params.lr=0.01"
both "optimizer: lr differs on node 1 -> exit 2 on both" 2 \
  "dtrun: error: node 1 (127.0.0.3): optimizer.params.lr is 0.01, node 0 has 0.001"
pair 1 "$C log.dir=$DT_TMP/l0" "$C log.dir=$DT_TMP/l1 model.n_layer=2"
both "model: n_layer differs -> exit 2 naming model.n_layer" 2 \
  "dtrun: error: node 1 (127.0.0.3): model.n_layer is 2, node 0 has 1"
pair 1 "$C log.dir=$DT_TMP/l0" "$C log.dir=$DT_TMP/l1 data.train=$DT_TMP/other/text.txt"
both "data: a file of another size (same name) -> exit 2 naming it" 2 \
  "dtrun: error: node 1 (127.0.0.3): data.train file is text.txt (3000 bytes, header"
grep -qF "node 0 has text.txt ($(stat -c %s "$DT_TMP/text.txt") bytes, header" "$DT_TMP/a0.err" \
  && pass "data: node 0's size named too" || fail "data: node 0's size" "$(cat "$DT_TMP/a0.err")"
pair 2 "$C log.dir=$DT_TMP/l0" "$C log.dir=$DT_TMP/l1 tensor_parallel.size=2"
both "parallel layout: tensor_parallel.size differs -> exit 2" 2 \
  "dtrun: error: node 1 (127.0.0.3): tensor_parallel.size is 2, node 0 has 1"
pair 1 "$C log.dir=$DT_TMP/l0" "$C log.dir=$DT_TMP/l1" DTRUN_TEST_BUILD_ID=not-this-build
both "version: another build on node 1 -> exit 2" 2 \
  "dtrun: error: node 1 (127.0.0.3): dtrun.build is not-this-build, node 0 has "
pair 1 "--exec true" "--max_restarts 2 --exec true"
both "--exec: --max_restarts differs -> exit 2" 2 \
  "dtrun: error: node 1 (127.0.0.3): --max_restarts is 2, node 0 has 0"

# a matching job trains as before (the per-node keys may differ), with the time logged
pair 1 "$C log.dir=$DT_TMP/m0 threads=1" "$C log.dir=$DT_TMP/m1 threads=2"
if [ "$(rcs)" = 00 ] && grep -q 'step 2/2' "$DT_TMP/a0.out" \
   && grep -Eq 'preflight: 2 node\(s\) agree on [0-9]+ key\(s\), every pair connects, store at 127.0.0.2:[0-9]+ \([0-9]+ ms\)' "$DT_TMP/a0.err" \
   && grep -q 'preflight: 2 node(s) agree' "$DT_TMP/a1.err"; then pass "matching nodes (log.dir, threads differ) train"
else fail "matching nodes train" "rc=$(rcs) $(tail -n 3 "$DT_TMP/a0.err" "$DT_TMP/a1.err")"; fi

# --no-preflight: the issue's job (lr differs) is not checked and trains
pair 1 "--no-preflight $C log.dir=$DT_TMP/n0" "--no-preflight $C log.dir=$DT_TMP/n1 optimizer.params.lr=0.01"
if [ "$(rcs)" = 00 ] && grep -q 'step 2/2' "$DT_TMP/a0.out" && ! grep -q preflight "$DT_TMP/a0.err" "$DT_TMP/a1.err"; then
  pass "--no-preflight skips the check"; else fail "--no-preflight" "rc=$(rcs) $(tail -n 3 "$DT_TMP/a0.err")"; fi
# --no-preflight on one node only: the other learns it from the record and skips too
# (it used to wait 15 s for a record that never came, then exit 3)
t0=$(date +%s.%N)
pair 1 "$C log.dir=$DT_TMP/o0" "--no-preflight $C log.dir=$DT_TMP/o1 optimizer.params.lr=0.01"
dt=$(echo "$(date +%s.%N) - $t0" | bc)
if [ "$(rcs)" = 00 ] && grep -q 'step 2/2' "$DT_TMP/a0.out" && [ "$(echo "$dt < 10" | bc)" = 1 ] \
   && grep -qF 'preflight: node 1 (127.0.0.3) was launched with --no-preflight: no node checks the job' "$DT_TMP/a0.err"; then
  pass "--no-preflight on one node: every node skips, named (${dt%.*} s)"
else fail "--no-preflight on one node" "rc=$(rcs) ${dt}s $(tail -n 3 "$DT_TMP/a0.err")"; fi

# dtrun check: 4 nodes on 127.0.0.2..5, the table on every node, exit 0, no worker
port=$(free_port); pids=()
for i in 3 2 1; do
  ( $T "$DTRUN" check --nnodes 4 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.$((i + 2)) \
      $FAST "$C" log.dir="$DT_TMP/c$i" >"$DT_TMP/c$i.out" 2>"$DT_TMP/c$i.err"; echo $? >"$DT_TMP/c$i.rc" ) & pids+=($!)
done
$T "$DTRUN" check --nnodes 4 --nproc_per_node 1 --rdzv_endpoint 127.0.0.2:$port --local_addr 127.0.0.2 \
  $FAST "$C" log.dir="$DT_TMP/c0" >"$DT_TMP/c0.out" 2>"$DT_TMP/c0.err"; echo $? >"$DT_TMP/c0.rc"
wait "${pids[@]}"
secs=$(sed -n 's/^preflight: 4 node(s), \([0-9.]*\) s$/\1/p' "$DT_TMP/c0.out")
if [ "$(cat "$DT_TMP"/c?.rc | tr -d '\n')" = 0000 ] && grep -q '^node  address' "$DT_TMP/c3.out" \
   && [ "$(grep -cE '^[0-3] +127\.0\.0\.[2-5] .* ok \(3 peer\(s\)\) ' "$DT_TMP/c0.out")" = 4 ] \
   && [ -n "$secs" ] && python3 -c "import sys; sys.exit(float('$secs') >= 2.0)" \
   && [ ! -e "$DT_TMP/c0/metrics.jsonl" ]; then pass "dtrun check: table of 4 nodes in ${secs} s"
else fail "dtrun check table" "rc=$(cat "$DT_TMP"/c?.rc | tr -d '\n') $(cat "$DT_TMP/c0.out") $(tail -n 3 "$DT_TMP/c0.err")"; fi
# check with a difference: exit 2 and the table says which column
pair 1 "check $C log.dir=$DT_TMP/l0" "check $C log.dir=$DT_TMP/l1 optimizer.params.lr=0.01"
if [ "$(rcs)" = 22 ] && grep -qE '^1 +127\.0\.0\.3 .* !=' "$DT_TMP/a0.out" && grep -q 'optimizer.params.lr is 0.01' "$DT_TMP/a1.err"; then
  pass "dtrun check with a difference: exit 2, the table marks it"; else fail "check difference" "rc=$(rcs) $(cat "$DT_TMP/a0.out")"; fi
# warnings, not refusals: node 0's clock 7 s ahead (a test facility), node 1 short of
# memory and pinned to one CPU for 2 ranks
pair 2 "check $C log.dir=$DT_TMP/l0" "check $C log.dir=$DT_TMP/l1" "DTRUN_TEST_MEM_AVAILABLE=4096 taskset -c 0" DTRUN_TEST_CLOCK_SKEW=7
if [ "$(rcs)" = 00 ] && grep -q 'WARN: preflight: node 1 (127.0.0.3) clock is -7.0 s off node 0.s' "$DT_TMP/a0.err" \
   && grep -q 'WARN: preflight: node 1 (127.0.0.3) has 4 KiB of memory available, its ranks need' "$DT_TMP/a1.err" \
   && grep -q 'WARN: preflight: node 1 (127.0.0.3) has 1 CPU slot(s) for --nproc_per_node 2 on a CPU run' "$DT_TMP/a0.err" \
   && grep -qE '^1 +127\.0\.0\.3 .* -7\.[0-9]+ s ! +1/2 LOW .* needs .* LOW' "$DT_TMP/a0.out"; then
  pass "clock 7 s off, too little memory, too few CPU slots: warnings naming the node"
else fail "clock and memory warnings" "rc=$(rcs) $(cat "$DT_TMP/a0.out") $(tail -n 3 "$DT_TMP/a0.err" "$DT_TMP/a1.err")"; fi
"$DTRUN" check --help | grep -q '^usage: dtrun check' && pass "dtrun check --help: exit 0" || fail "dtrun check --help"
"$DTRUN" check --no-preflight "$C" 2>"$DT_TMP/e"; [ $? = 2 ] && grep -q 'contradicts --no-preflight' "$DT_TMP/e" \
  && pass "check --no-preflight: exit 2" || fail "check --no-preflight" "$(cat "$DT_TMP/e")"

# the communicator's health check before the first step (2 nodes x 2 ranks on
# loopback): every figure printed by rank 0; under a --preflight_min_busbw floor it
# is exit 3 on both nodes naming the node, with no step taken and no restart
pair 2 "$C log.dir=$DT_TMP/h0" "$C log.dir=$DT_TMP/h1"
if [ "$(rcs)" = 00 ] && grep -qE 'preflight: all-reduce of 1 MiB over 4 rank\(s\) \(hier\): busbw [0-9.]+ GB/s, results exact' "$DT_TMP/a0.err" \
   && grep -qE 'preflight: node 1 \(ranks 2-3\): within the node [0-9.]+ GB/s busbw, to node 0 [0-9.]+ GB/s' "$DT_TMP/a0.err"; then
  pass "health check: the all-reduce, within each node and to node 0, printed"
else fail "health check printed" "rc=$(rcs) $(grep preflight "$DT_TMP/a0.err")"; fi
pair 2 "--preflight_min_busbw 100000 --max_restarts 2 $C log.dir=$DT_TMP/h0" "--preflight_min_busbw 100000 --max_restarts 2 $C log.dir=$DT_TMP/h1"
if [ "$(rcs)" = 33 ] && grep -qE 'preflight: error: node 1 \(ranks 2-3\): [0-9.]+ GB/s (to|from) node 0 is under the floor of 100000.00 GB/s' "$DT_TMP/a0.err" \
   && ! grep -q 'step 1/' "$DT_TMP/a0.out" "$DT_TMP/a1.out" && ! grep -q 'restarting the workers' "$DT_TMP/a0.err"; then
  pass "health check under --preflight_min_busbw: exit 3 on both, node named, no step, no restart"
else fail "health check floor" "rc=$(rcs) $(grep preflight "$DT_TMP/a0.err")"; fi
pair 1 "--preflight_min_busbw 1 --exec true" "--exec true"
both "--preflight_min_busbw differs -> exit 2" 2 "dtrun: error: node 1 (127.0.0.3): --preflight_min_busbw is 0, node 0 has 1"
"$DTRUN" --preflight_min_busbw nan --exec true 2>"$DT_TMP/e"; [ $? = 2 ] && grep -q 'preflight_min_busbw: expected GB/s' "$DT_TMP/e" \
  && pass "--preflight_min_busbw nan: exit 2" || fail "--preflight_min_busbw nan" "$(cat "$DT_TMP/e")"

# GPU health on the CUDA emulator's build (its GPUs' names, memory and ECC counts
# come from DTRUN_CUEMU_*, where a real node's come from NVML)
EMU=${DTRUN_EMU:-$(dirname "$DTRUN")/dtrun-emu}
if [ -x "$EMU" ]; then
  DTRUN_CUEMU_GPUS=2 DTRUN_CUEMU_ECC=0,3 $T "$EMU" --nproc_per_node 2 --exec touch "$DT_TMP/gpu_started" 2>"$DT_TMP/e"; rc=$?
  [ $rc = 3 ] && grep -qF 'dtrun: error: node 0 (' "$DT_TMP/e" && grep -qF 'GPU 1 (cuemu) has 3 uncorrectable ECC error(s)' "$DT_TMP/e" \
    && [ ! -e "$DT_TMP/gpu_started" ] && pass "GPU with uncorrectable ECC errors: exit 3 naming node and GPU, nothing started" \
    || fail "GPU ECC" "rc=$rc $(cat "$DT_TMP/e")"
  DTRUN_CUEMU_GPUS=2 DTRUN_CUEMU_ECC=0,3 $T "$EMU" --nproc_per_node 1 --exec touch "$DT_TMP/gpu_started" 2>"$DT_TMP/e"; rc=$?
  [ $rc = 0 ] && [ -e "$DT_TMP/gpu_started" ] && pass "a bad GPU no rank uses (--nproc_per_node 1) does not stop the job" \
    || fail "unused bad GPU" "rc=$rc $(cat "$DT_TMP/e")"
  port=$(free_port)
  ( DTRUN_CUEMU_GPUS=2 DTRUN_CUEMU_GPU_NAME="NVIDIA A100" $T "$EMU" check --nnodes 2 --nproc_per_node 2 --rdzv_endpoint 127.0.0.2:$port \
      --local_addr 127.0.0.3 $FAST >"$DT_TMP/g1.out" 2>"$DT_TMP/g1.err"; echo $? >"$DT_TMP/a1.rc" ) & p1=$!
  DTRUN_CUEMU_GPUS=2 DTRUN_CUEMU_GPU_NAME="NVIDIA H100" $T "$EMU" check --nnodes 2 --nproc_per_node 2 --rdzv_endpoint 127.0.0.2:$port \
      --local_addr 127.0.0.2 $FAST >"$DT_TMP/g0.out" 2>"$DT_TMP/g0.err"; echo $? >"$DT_TMP/a0.rc"; wait $p1
  if [ "$(rcs)" = 00 ] && grep -qE '^0 +127\.0\.0\.2 .* 2 x NVIDIA H100 80 GiB ok$' "$DT_TMP/g0.out" \
     && grep -qE '^1 +127\.0\.0\.3 .* 2 x NVIDIA A100 80 GiB ok !$' "$DT_TMP/g0.out" \
     && grep -qF "preflight: node 1 (127.0.0.3) its GPUs are NVIDIA A100, node 0's are NVIDIA H100" "$DT_TMP/g0.err"; then
    pass "dtrun check: each node's GPUs in the table, another model than node 0's warned"
  else fail "GPU table" "rc=$(rcs) $(cat "$DT_TMP/g0.out") $(tail -n 3 "$DT_TMP/g0.err")"; fi
else
  skip "GPU health" "no $EMU (the emulator build is not part of SAN runs)"
fi

# a blocked pair, in network namespaces with a firewall rule
A=dtp$$a; B=dtp$$b
nscleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$DT_TMP"; }
trap nscleanup EXIT
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v nft >/dev/null || ! ip netns add $A 2>/dev/null; then
  skip "blocked pair" "needs root, ip netns and nft (scripts/install-deps.sh installs nftables)"; finish
fi
ip netns add $B && ip link add vA netns $A type veth peer name vB netns $B \
  && ip -n $A addr add 10.200.0.1/24 dev vA && ip -n $B addr add 10.200.0.2/24 dev vB \
  && ip -n $A link set vA up && ip -n $B link set vB up && ip -n $A link set lo up && ip -n $B link set lo up \
  && ip netns exec $B nft add table inet dtpf && ip netns exec $B nft add chain inet dtpf in '{ type filter hook input priority 0; }' \
  && ip netns exec $B nft add rule inet dtpf in iifname vB tcp dport != 29400 ct state new drop \
  || { skip "blocked pair" "could not set up the namespaces and the rule"; finish; }
s=$(date +%s%N)
ip netns exec $B $T "$DTRUN" --nnodes 2 --rdzv_endpoint 10.200.0.1:29400 --local_addr 10.200.0.2 $FAST \
  --exec touch "$DT_TMP/started" >"$DT_TMP/b.out" 2>"$DT_TMP/b.err" & pb=$!
ip netns exec $A $T "$DTRUN" --nnodes 2 --rdzv_endpoint 10.200.0.1:29400 --local_addr 10.200.0.1 $FAST \
  --exec touch "$DT_TMP/started" >"$DT_TMP/a.out" 2>"$DT_TMP/a.err"; rca=$?
wait $pb; rcb=$?; ms=$(( ($(date +%s%N) - s) / 1000000 ))
line='dtrun: error: node 0 (10.200.0.1) cannot reach node 1 (10.200.0.2) at 10.200.0.2:'
if [ $rca$rcb = 33 ] && [ $ms -lt 10000 ] && grep -qF "$line" "$DT_TMP/a.err" && grep -qF "$line" "$DT_TMP/b.err" \
   && [ ! -e "$DT_TMP/started" ]; then pass "blocked pair: exit 3 on both nodes naming the pair (${ms} ms)"
else fail "blocked pair" "rc=$rca$rcb ms=$ms $(tail -n 2 "$DT_TMP/a.err" "$DT_TMP/b.err")"; fi

# a slow link: the rule gone, node 1's side shaped to 200 Mbit/s (tc tbf); under a
# floor of 0.05 GB/s the health check is exit 3 on both nodes naming node 1's link
ip netns exec $B nft delete table inet dtpf
if ! ip netns exec $B tc qdisc add dev vB root tbf rate 200mbit burst 64kb latency 400ms 2>/dev/null; then
  skip "slow link" "tc could not shape the link"; finish
fi
ip netns exec $B $T "$DTRUN" --nnodes 2 --rdzv_endpoint 10.200.0.1:29401 --local_addr 10.200.0.2 $FAST \
  --preflight_min_busbw 0.05 "$C" log.dir="$DT_TMP/s1" >"$DT_TMP/b.out" 2>"$DT_TMP/b.err" & pb=$!
ip netns exec $A $T "$DTRUN" --nnodes 2 --rdzv_endpoint 10.200.0.1:29401 --local_addr 10.200.0.1 $FAST \
  --preflight_min_busbw 0.05 "$C" log.dir="$DT_TMP/s0" >"$DT_TMP/a.out" 2>"$DT_TMP/a.err"; rca=$?
wait $pb; rcb=$?
if [ $rca$rcb = 33 ] && grep -qE 'preflight: error: node 1 \(ranks 1-1\): 0\.0[0-9]+ GB/s to node 0 is under the floor of 0\.05 GB/s' "$DT_TMP/a.err" \
   && ! grep -q 'step 1/' "$DT_TMP/a.out" "$DT_TMP/b.out"; then
  pass "slow link (200 Mbit/s) under --preflight_min_busbw 0.05: exit 3 on both, node 1 named, no step"
else fail "slow link" "rc=$rca$rcb $(grep preflight "$DT_TMP/a.err")"; fi
finish
