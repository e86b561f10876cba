#!/usr/bin/env bash
# test_mem_check.sh - out of memory before it happens: before the first step every
# rank compares `dtrun plan`'s bytes with what it can get and refuses with exit 2
# naming the shortfall, the biggest consumer and the cheapest change that fits; the
# change it suggests really fits (the config run with it passes the same limit);
# DTRUN_SKIP_MEMORY_CHECK=1 skips it; a config that fits is not refused; a long sequence
# refused at CP 1 is accepted at CP 4 (priced at its context_parallel.size); a LoRA run
# (the tiny Llama of tests/fixtures/lora) is priced too: the frozen base, the adapters'
# state and the base's arena, refused when too big, trained when it fits. On the CPU
# with a lowered limit (DTRUN_TEST_MEM_AVAILABLE, and a real cgroup memory limit when
# this machine lets us create one), on the emulated GPU with a small memory
# (DTRUN_CUEMU_MEM_GB).
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
make_text "$DT_TMP/text.txt" 0 2000
# activations dominate (micro-batch 8): the cheapest change is a smaller micro-batch
cat > "$DT_TMP/act.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 8, "train_steps": 2,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
# model state dominates (2 ranks, DDP): the cheapest change is a sharding strategy
cat > "$DT_TMP/state.json" <<JSON
{"model": {"type": "gpt", "n_layer": 4, "n_head": 2, "n_embd": 128, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 1, "train_steps": 2,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# refused NAME OUT: exit 2 was checked by the caller; the message's parts
refused() {
  grep -q "not enough memory: the run needs .* short by " "$2" &&
    grep -q "the biggest consumer is the $3" "$2" &&
    grep -q "the cheapest change that fits: $4" "$2"
}
# the suggestion's KEY=VALUE overrides from an output
suggestion() { sed -n 's/.*the cheapest change that fits: \(.*\): [0-9.]* [kMG]*B per .*/\1/p' "$1" | head -1; }

# ---- CPU, one rank (the worker's own check) ----
W="$DTRUN __worker"
# refused_then_fits TAG CONFIG MEM WHAT LABEL [lora]: with DTRUN_TEST_MEM_AVAILABLE=MEM
# the worker exits 2 naming the shortfall, the activations and a smaller micro-batch;
# the change it suggests trains under the same limit; the bytes it names are the run's
# (summary.json: model states, with lora_base for a LoRA run, + arena + comm buffers).
refused_then_fits() {
  local tag=$1 cfg=$2 mem=$3 what=$4 label=$5 lora=${6:-}
  DTRUN_TEST_MEM_AVAILABLE=$mem $W "$cfg" log.dir="$DT_TMP/${tag}0" >"$DT_TMP/${tag}0.out" 2>&1; rc=$?
  if [ $rc -eq 2 ] && refused "${tag}0" "$DT_TMP/${tag}0.out" activations "train_micro_batch_size_per_gpu="; then
    pass "$label: $what: exit 2 naming the shortfall, the activations and a smaller micro-batch"
  else fail "$label: refused" "rc=$rc $(tail -4 "$DT_TMP/${tag}0.out")"; fi
  sug=$(suggestion "$DT_TMP/${tag}0.out")
  # shellcheck disable=SC2086
  if [ -n "$sug" ] && DTRUN_TEST_MEM_AVAILABLE=$mem $W "$cfg" log.dir="$DT_TMP/${tag}1" $sug \
       >"$DT_TMP/${tag}1.out" 2>&1 && grep -q "step 2/2" "$DT_TMP/${tag}1.out"; then
    pass "$label: the suggestion ($sug) fits under the same limit and trains"
  else fail "$label: the suggestion fits" "'$sug': $(tail -3 "$DT_TMP/${tag}1.out")"; fi
  python3 - "$DT_TMP/${tag}0.out" "$DT_TMP/${tag}1" "$lora" <<'PY' && pass "$label: the bytes named are the run's (summary.json${lora:+, lora_base in them})" || fail "$label: bytes = the run's"
import json, re, sys
s = json.load(open(sys.argv[2] + "/summary.json"))["ranks"][0]
m = re.search(r"the cheapest change that fits: .*?: ([0-9.]+) ([kMG]?B) per", open(sys.argv[1]).read())
need = float(m.group(1)) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)]
have = s["model_state_bytes"]["total"] + s["activation_bytes"] + s["comm_buffer_bytes"]
if sys.argv[3]:
    assert s["model_state_bytes"]["lora_base"] > 0
assert abs(need - have) <= 0.01 * have, (need, have)
PY
}
refused_then_fits a "$DT_TMP/act.json" 1500000 "1.5 MB" cpu
if DTRUN_SKIP_MEMORY_CHECK=1 DTRUN_TEST_MEM_AVAILABLE=1500000 $W "$DT_TMP/act.json" log.dir="$DT_TMP/a2" \
     >"$DT_TMP/a2.out" 2>&1; then pass "cpu: DTRUN_SKIP_MEMORY_CHECK=1 skips the check"
else fail "cpu: skip" "$(tail -3 "$DT_TMP/a2.out")"; fi
if $W "$DT_TMP/act.json" log.dir="$DT_TMP/a3" >"$DT_TMP/a3.out" 2>&1; then pass "cpu: a config that fits runs"
else fail "cpu: fits" "$(tail -3 "$DT_TMP/a3.out")"; fi

# a worker started by hand whose node (LOCAL_WORLD_SIZE 1) cannot hold its TP group: plan's
# arithmetic fails inside the check, and its message names the config's key, not plan's --tp
WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 DTRUN_TEST_MEM_AVAILABLE=1500000 timeout 60 \
  $W "$DT_TMP/state.json" log.dir="$DT_TMP/tp0" tensor_parallel.size=2 >"$DT_TMP/tp0.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "tensor_parallel.size 2: does not divide the 1 GPUs per node" "$DT_TMP/tp0.out" &&
   ! grep -q -- "--tp" "$DT_TMP/tp0.out"; then
  pass "cpu: TP 2 over a node of 1 rank: exit 2 naming tensor_parallel.size (not --tp)"
else fail "cpu: TP 2 over a node of 1 rank" "rc=$rc $(tail -2 "$DT_TMP/tp0.out")"; fi

# ---- CPU, two ranks through the launcher: the host's memory shared, exit 2 from dtrun ----
DTRUN_TEST_MEM_AVAILABLE=42000000 timeout 120 "$DTRUN" --standalone --nproc_per_node 2 --max_restarts 2 \
  "$DT_TMP/state.json" log.dir="$DT_TMP/s0" >"$DT_TMP/s0.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && refused s0 "$DT_TMP/s0.out" "optimizer state" "strategy=" && grep -q "shared by 2 ranks" "$DT_TMP/s0.out" &&
   grep -q "refused the job before training (exit 2; not restarted): .*not enough memory" "$DT_TMP/s0.out" &&
   ! grep -q "Root Cause\|flight recorder" "$DT_TMP/s0.out" && ! grep -q "restarting the workers" "$DT_TMP/s0.out"; then
  pass "2 ranks sharing 42 MB: dtrun exits 2 (no restart) with one line, the rank's message names the optimizer state and a strategy"
else fail "2 ranks refused" "rc=$rc $(tail -8 "$DT_TMP/s0.out")"; fi
sug=$(suggestion "$DT_TMP/s0.out")
# shellcheck disable=SC2086
if [ -n "$sug" ] && DTRUN_TEST_MEM_AVAILABLE=42000000 timeout 120 "$DTRUN" --standalone --nproc_per_node 2 \
     "$DT_TMP/state.json" log.dir="$DT_TMP/s1" $sug >"$DT_TMP/s1.out" 2>&1; then
  pass "2 ranks: the suggestion ($sug) fits under the same limit and trains"
else fail "2 ranks: the suggestion fits" "'$sug': $(tail -3 "$DT_TMP/s1.out")"; fi

# ---- context parallelism: a long sequence priced at its CP size ----
# seq 1024 on the CPU: CP 1's T² attention probabilities (4·B·NH·T² per layer, 42.7 MB in
# all) do not fit 30 MB; at CP 4 each of the 4 ranks sharing it (6.75 MB usable) holds a
# quarter of each sequence and the log-sum-exp only (4.0 MB): accepted, and trained. Priced
# as CP 1 it would be refused.
cat > "$DT_TMP/long.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "seq_len": 1024, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 1, "train_steps": 2,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
DTRUN_TEST_MEM_AVAILABLE=30000000 timeout 120 "$DTRUN" --standalone --nproc_per_node 1 "$DT_TMP/long.json" \
  log.dir="$DT_TMP/cp1" >"$DT_TMP/cp1.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "not enough memory: the run needs 42.67 MB per rank" "$DT_TMP/cp1.out" &&
   grep -q "the biggest consumer is the activations" "$DT_TMP/cp1.out"; then
  pass "seq 1024 at CP 1 in 30 MB: refused (42.67 MB, the activations)"
else fail "seq 1024 at CP 1 refused" "rc=$rc $(tail -4 "$DT_TMP/cp1.out")"; fi
if DTRUN_TEST_MEM_AVAILABLE=30000000 timeout 120 "$DTRUN" --standalone --nproc_per_node 4 "$DT_TMP/long.json" \
     context_parallel.size=4 log.dir="$DT_TMP/cp4" >"$DT_TMP/cp4.out" 2>&1 && grep -q "step 2/2" "$DT_TMP/cp4.out" &&
   python3 - "$DT_TMP/cp4/summary.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
# (comm_buffer_bytes left out: the CPU communicators' own buffers, which plan does not price)
need = max(x["model_state_bytes"]["total"] + x["activation_bytes"] for x in r)
assert len(r) == 4 and need <= 30e6 * 0.9 / 4, need
PY
then pass "the same at CP 4 on 4 ranks sharing 30 MB: accepted (a rank's T/4 rows, no T² probabilities) and trained"
else fail "seq 1024 at CP 4 accepted" "$(tail -4 "$DT_TMP/cp4.out")"; fi

# ---- LoRA: the adapters trained, the frozen base replicated, the base's arena ----
python3 - "$DT_TMP/lora.bin" <<'PY'
import random, struct, sys
rng = random.Random(5)
with open(sys.argv[1], "wb") as f:  # an llm.c token shard: 256 int32 of header, uint16 ids
    f.write(struct.pack("<256i", 20240520, 1, 2000, *([0] * 253)))
    f.write(struct.pack("<2000H", *(rng.randrange(97) for _ in range(2000))))
PY
cat > "$DT_TMP/lora.json" <<JSON
{"model": {"pretrained": "$ROOT/tests/fixtures/lora/base", "seq_len": 16},
 "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "base_dtype": "fp32", "target_modules": ["q_proj", "v_proj", "down_proj"]},
 "data": {"train": "$DT_TMP/lora.bin"}, "train_micro_batch_size_per_gpu": 8, "train_steps": 2,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "threads": 1, "seed": 5,
 "device": "cpu", "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
refused_then_fits l "$DT_TMP/lora.json" 800000 "800 kB" lora lora
if DTRUN_TEST_MEM_AVAILABLE=3000000 $W "$DT_TMP/lora.json" log.dir="$DT_TMP/l2" >"$DT_TMP/l2.out" 2>&1 &&
   grep -q "step 2/2" "$DT_TMP/l2.out"; then pass "lora: a run that fits in 3 MB trains"
else fail "lora: fits" "$(tail -3 "$DT_TMP/l2.out")"; fi

# ---- a real cgroup memory limit (v1 or v2), when this machine lets us make one ----
cg=""
if [ -w /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory/dtrun-test-$$" 2>/dev/null; then
  cg=/sys/fs/cgroup/memory/dtrun-test-$$
  echo $((200 * 1024 * 1024)) > "$cg/memory.limit_in_bytes" 2>/dev/null || cg_bad=1
elif [ -w /sys/fs/cgroup/cgroup.procs ] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null &&
     mkdir "/sys/fs/cgroup/dtrun-test-$$" 2>/dev/null; then
  cg=/sys/fs/cgroup/dtrun-test-$$
  echo $((200 * 1024 * 1024)) > "$cg/memory.max" 2>/dev/null || cg_bad=1
fi
if [ -z "$cg" ] || [ -n "${cg_bad:-}" ]; then
  skip "cgroup memory limit" "cannot create a memory cgroup here"
else
  # 200 MB for a model of 16 x 12.9M parameters' state: refused naming the cgroup's limit
  sh -c "echo \$\$ > $cg/cgroup.procs && exec $DTRUN __worker $DT_TMP/state.json model.n_embd=512 model.n_layer=4 \
    log.dir=$DT_TMP/c0" >"$DT_TMP/c0.out" 2>&1; rc=$?
  if [ $rc -eq 2 ] && grep -q "left under this cgroup's memory" "$DT_TMP/c0.out" && grep -q "short by" "$DT_TMP/c0.out"; then
    pass "cgroup limit of 200 MB: refused naming the cgroup's limit"
  else fail "cgroup limit" "rc=$rc $(tail -4 "$DT_TMP/c0.out")"; fi
  # the same 200 MB nearly full of clean page cache (a 185 MB file written from inside it):
  # the kernel reclaims it, so a config of a few MB fits (it was refused: usage counted the cache)
  sh -c "echo \$\$ > $cg/cgroup.procs && exec dd if=/dev/zero of=$DT_TMP/cache.bin bs=1M count=185 conv=fsync" \
    2>/dev/null
  sh -c "echo \$\$ > $cg/cgroup.procs && exec $DTRUN __worker $DT_TMP/state.json log.dir=$DT_TMP/c1" \
    >"$DT_TMP/c1.out" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "step 2/2" "$DT_TMP/c1.out"; then
    pass "cgroup of 200 MB full of page cache: a config that fits is not refused"
  else fail "cgroup page cache" "rc=$rc $(tail -4 "$DT_TMP/c1.out")"; fi
  rm -f "$DT_TMP/cache.bin"
  rmdir "$cg" 2>/dev/null
fi

# ---- the emulated GPU with a small memory ----
EMU=${DTRUN_EMU:-$ROOT/dtrun-emu}
if [ ! -x "$EMU" ]; then
  skip "emulated GPU" "no $EMU"
else
  E() { DTRUN_CUEMU_MEM_GB=$1 timeout 120 "$EMU" __worker "${@:2}"; }
  # 0.0387 GiB: the 32 MiB cuBLASLt workspace leaves about 8 MB free; micro-batch 64 needs 18 MB
  E 0.0387 "$DT_TMP/act.json" device=cuda train_micro_batch_size_per_gpu=64 log.dir="$DT_TMP/g0" >"$DT_TMP/g0.out" 2>&1; rc=$?
  if [ $rc -eq 2 ] && grep -q "free on GPU 0" "$DT_TMP/g0.out" && refused g0 "$DT_TMP/g0.out" "activations" "train_micro_batch_size_per_gpu="; then
    pass "emulated GPU with 8 MB free: exit 2 naming its free memory, the activations and a change"
  else fail "emulated GPU refused" "rc=$rc $(tail -4 "$DT_TMP/g0.out")"; fi
  sug=$(suggestion "$DT_TMP/g0.out")
  # shellcheck disable=SC2086
  if [ -n "$sug" ] && E 0.0387 "$DT_TMP/act.json" device=cuda train_micro_batch_size_per_gpu=64 log.dir="$DT_TMP/g1" $sug >"$DT_TMP/g1.out" 2>&1; then
    pass "emulated GPU: the suggestion ($sug) fits in the same memory and trains"
  else fail "emulated GPU: suggestion" "'$sug': $(tail -3 "$DT_TMP/g1.out")"; fi
  if E 1 "$DT_TMP/act.json" device=cuda train_micro_batch_size_per_gpu=64 log.dir="$DT_TMP/g2" >"$DT_TMP/g2.out" 2>&1; then
    pass "emulated GPU of 1 GB: the config fits and runs"
  else fail "emulated GPU fits" "$(tail -3 "$DT_TMP/g2.out")"; fi
fi
finish
