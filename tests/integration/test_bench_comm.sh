#!/usr/bin/env bash
# test_bench_comm.sh - `dtrun __bench_comm_rank --nproc N`: the real binary starts a
# store and N ranks, prints the nccl-tests-style table with every size checked.
. "$(dirname "$0")/lib.sh"

for spec in "2 shm all_reduce f32" "3 tcp reduce_scatter bf16" "4 shm all_gather f32" "2 tcp broadcast f32"; do
  set -- $spec
  out=$("$DTRUN" __bench_comm_rank --nproc "$1" --backend "$2" --op "$3" --dtype "$4" \
        --min 8 --max 256K --factor 8 --iters 2 --warmup 1 2>&1); rc=$?
  rows=$(printf '%s\n' "$out" | awk 'NF == 8 && $1 ~ /^[0-9]+$/' | wc -l)
  wrong=$(printf '%s\n' "$out" | awk 'NF == 8 && $1 ~ /^[0-9]+$/ { s += $8 } END { print s + 0 }')
  if [ $rc -eq 0 ] && [ "$rows" -eq 6 ] && [ "$wrong" -eq 0 ] && printf '%s\n' "$out" | grep -q 'memcpy of 64 MiB'; then
    pass "bench $spec"
  else
    fail "bench $spec" "rc $rc rows $rows wrong $wrong: $out"
  fi
done

out=$("$DTRUN" __bench_comm_rank --nproc 2 --op all_scatter 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q 'bad value for --op: "all_scatter"'; then pass "bad --op is a usage error"
else fail "bad --op is a usage error" "rc $rc: $out"; fi

out=$(env -u RANK -u MASTER_ADDR "$DTRUN" __bench_comm_rank --max 64K 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q 'MASTER_ADDR'; then pass "no launcher env names the variable"
else fail "no launcher env names the variable" "rc $rc: $out"; fi
# Through the launcher, as users run it: dtrun [launch flags] bench comm [flags].
out=$(timeout 60 "$DTRUN" --standalone --nproc_per_node 2 bench comm --op reduce_scatter --min 1K --max 32K --iters 3 --warmup 1 2>&1); rc=$?
rows=$(printf '%s\n' "$out" | grep -cE '^\[rank0\]: +[0-9]+ ')
wrong=$(printf '%s\n' "$out" | grep -E '^\[rank0\]: +[0-9]+ ' | awk '{s += $NF} END {print s + 0}')
if [ $rc -eq 0 ] && [ "$rows" -eq 6 ] && [ "$wrong" -eq 0 ]; then pass "launcher: bench comm on 2 ranks"
else fail "launcher: bench comm on 2 ranks" "rc $rc rows $rows: $out"; fi
finish
