#!/usr/bin/env bash
# test_stragglers.sh - the slowest rank at every logged step: one rank slowed by the
# test hook (DTRUN_TEST_SLOW_RANK=RANK:MS sleeps in its compute) is named in
# metrics.jsonl (slowest_rank, slowest_ms, median_ms), in the straggler warning and
# in summary.json's per-rank statistics, also under tensor parallelism (the gather
# spans every rank of the world); a run without the hook warns about nobody.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

make_text "$DT_TMP/text.txt" 0 3000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 16, "steps_per_print": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# run NAME NPROC [KEY=VALUE...]: the job's output in $DT_TMP/NAME.out, its logs in $DT_TMP/NAME
run() {
  local name=$1 np=$2; shift 2
  timeout 120 "$DTRUN" --standalone --nproc_per_node "$np" "$DT_TMP/gpt.json" log.dir="$DT_TMP/$name" "$@" \
    >"$DT_TMP/$name.out" 2>&1
}

# check_run NAME SLOW_RANK (-1: none): metrics rows, the warning, the summary
check_run() {
  python3 - "$DT_TMP/$1" "$2" "$DT_TMP/$1.out" <<'PY'
import json, re, sys
d, slow, out = sys.argv[1], int(sys.argv[2]), open(sys.argv[3]).read()
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert len(rows) == 9, len(rows)  # step 1 and every 2nd of 16
assert all({"slowest_rank", "slowest_ms", "median_ms"} <= set(r) for r in rows), rows[0]
warned = re.findall(r"straggler: rank (\d+) ", out)
s = json.load(open(d + "/summary.json"))["step_time"]
assert s["logged_steps"] == 9, s
ranks = s["ranks"]
assert [r["rank"] for r in ranks] == list(range(len(ranks))), ranks
for r in ranks:
    assert r["p50_compute_ms"] <= r["p90_compute_ms"] <= r["max_compute_ms"], r
if slow < 0:
    assert warned == [] and s["stragglers"] == [], (warned, s["stragglers"])
    sys.exit(0)
# the slowed rank sleeps 200 ms in a step of a few ms: the slowest at every logged step
assert all(r["slowest_rank"] == slow for r in rows), [r["slowest_rank"] for r in rows]
assert all(r["slowest_ms"] >= 180 and r["median_ms"] < 120 for r in rows), [(r["slowest_ms"], r["median_ms"]) for r in rows]
assert warned == [str(slow)], warned  # once, after 5 logged steps in a row
assert s["stragglers"] == [slow], s
assert ranks[slow]["times_slowest"] == 9 and ranks[slow]["p50_compute_ms"] >= 380, ranks[slow]
assert all(r["max_compute_ms"] < 250 for r in ranks if r["rank"] != slow), ranks
PY
}

if DTRUN_TEST_SLOW_RANK=2:400 run slow 3 && check_run slow 2; then
  pass "rank 2 slowed by 400 ms: slowest_rank in metrics, the warning and summary name it"
else fail "slowed rank named" "$(tail -5 "$DT_TMP/slow.out")"; fi

if run quiet 3 && check_run quiet -1; then
  pass "no hook: metrics carry slowest_rank/median_ms, nobody is warned about"
else fail "quiet run" "$(tail -5 "$DT_TMP/quiet.out")"; fi

# tensor parallel 2 x data parallel 2: rank 3 (TP rank 1 of DP rank 1) is gathered too
if DTRUN_TEST_SLOW_RANK=3:400 run tp 4 tensor_parallel.size=2 train_batch_size=4 && check_run tp 3; then
  pass "TP 2 x DP 2: the world's rank 3 named"
else fail "TP layout" "$(tail -5 "$DT_TMP/tp.out")"; fi

if DTRUN_TEST_SLOW_RANK=oops run bad 1; [ $? -ne 0 ] && grep -q "DTRUN_TEST_SLOW_RANK" "$DT_TMP/bad.out"; then
  pass "a malformed DTRUN_TEST_SLOW_RANK is an error naming it"
else fail "malformed hook" "$(tail -3 "$DT_TMP/bad.out")"; fi
finish
