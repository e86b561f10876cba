#!/usr/bin/env bash
# test_trace.sh - the job timeline (log.trace) through the real launcher: a TP=2 x DP=2
# run and a PP=2 run each write rank files and a merged trace.json that pass the schema
# check (trace_check.py: events well formed, spans nested per track, every op on each
# rank of its communicator with the same sequence number, rank 0's data/comm/compute
# sums within 5% of metrics.jsonl at every logged step); the pipeline's waits are in
# it; `dtrun trace` after the fact writes the same file; `dtrun report --step` draws a
# well-formed timeline.svg (and the last step by default); log.trace_steps keeps the
# last N steps; log.trace off writes no trace; bad input (a corrupt rank file, no
# trace, a step that is not a number or not in the trace, an -o that is a link) is
# exit 2 naming what is wrong.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 60"
CHECK="python3 tests/integration/trace_check.py"

make_text "$DT_TMP/text.txt" 1 2000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 6, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# run NAME NPROC ARGS...: trains into $DT_TMP/NAME, its output in $DT_TMP/NAME.out
run() {
  local name=$1 np=$2; shift 2
  $T "$DTRUN" --standalone --nproc_per_node "$np" "$DT_TMP/gpt.json" log.dir="$DT_TMP/$name" "$@" \
    >"$DT_TMP/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "run $name: exit $rc: $(tail -5 "$DT_TMP/$name.out")"
  return $rc
}
# svg_ok FILE STEP: parses as XML, says the step, draws spans of every rank
svg_ok() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
text = " ".join(t.text or "" for t in root.iter(ns + "text"))
assert f"step {sys.argv[2]} " in text, text[:200]
assert all(f"rank {r} " in text for r in range(int(sys.argv[3]))), text[:400]
spans = [r for r in root.iter(ns + "rect") if r.find(ns + "title") is not None]
assert len(spans) > 10, len(spans)
PY
}

if run tp 4 tensor_parallel.size=2 log.trace=true; then
  check "TP=2 x DP=2: trace.json passes the schema check, phase sums equal metrics.jsonl" \
    $CHECK "$DT_TMP/tp" --ranks 4 --steps 1-6
  check "TP=2 x DP=2: one rank file per rank" test "$(ls "$DT_TMP/tp/trace")" = "$(printf 'rank_%d.json\n' 0 1 2 3)"
  if "$DTRUN" trace "$DT_TMP/tp" -o "$DT_TMP/tp_after.json" >"$DT_TMP/after.out" 2>&1 &&
     cmp -s "$DT_TMP/tp/trace.json" "$DT_TMP/tp_after.json"; then
    pass "dtrun trace after the fact writes the same events as the in-run merge"
  else fail "dtrun trace after the fact" "$(cat "$DT_TMP/after.out")"; fi
  if "$DTRUN" report "$DT_TMP/tp" --step 3 >"$DT_TMP/rep.out" 2>&1 && svg_ok "$DT_TMP/tp/timeline.svg" 3 4 &&
     "$DTRUN" report "$DT_TMP/tp" >>"$DT_TMP/rep.out" 2>&1 && svg_ok "$DT_TMP/tp/timeline.svg" 6 4; then
    pass "dtrun report --step 3 draws step 3 of every rank; no --step: the last step"
  else fail "dtrun report --step" "$(cat "$DT_TMP/rep.out")"; fi
else fail "TP=2 x DP=2 run with log.trace"; fi

# 4 layers over 2 stages, 4 micro-batches; each pass sleeps 2 ms so the waits are clear
if DTRUN_PP_TEST_DELAY_MS=2 run pp 2 model.n_layer=4 pipeline.stages=2 gradient_accumulation_steps=4 \
     log.trace=true; then
  check "PP=2: trace.json passes the schema check, phase sums equal metrics.jsonl" $CHECK "$DT_TMP/pp" --ranks 2
  check "PP=2: the passes, the waits for the neighbour and the channels' sends and receives are in it" python3 -c '
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
assert any(e["cat"] == "bubble" and e["name"].startswith("recv") for e in ev)
assert any(e["name"].startswith("backward mb3") for e in ev)
assert {"send", "recv"} <= {e["name"] for e in ev if e["cat"] == "op" and e["args"]["peer"] >= 0}' "$DT_TMP/pp/trace.json"
  pp_report() { "$DTRUN" report "$DT_TMP/pp" >/dev/null && svg_ok "$DT_TMP/pp/timeline.svg" 6 2; }
  check "PP=2: dtrun report draws its timeline" pp_report
else fail "PP=2 run with log.trace"; fi

if run ring 2 log.trace=true log.trace_steps=3; then
  check "log.trace_steps 3 keeps steps 4..6 of 6 (the ring), each rank's ops still matched" \
    $CHECK "$DT_TMP/ring" --ranks 2 --steps 4-6
else fail "log.trace_steps run"; fi

if run off 2; then
  check "log.trace off: no trace written" test ! -e "$DT_TMP/off/trace" -a ! -e "$DT_TMP/off/trace.json"
  out=$("$DTRUN" report "$DT_TMP/off" --step 2 2>&1); rc=$?
  check "report --step without a trace: exit 2 saying so" test $rc = 2 -a "${out#*has no trace.json}" != "$out"
else fail "run without log.trace"; fi

# bad input
if [ -d "$DT_TMP/tp" ]; then
  out=$("$DTRUN" report "$DT_TMP/tp" --step three 2>&1); rc=$?
  check "report --step three: exit 2 naming the value" test $rc = 2 -a "${out#*not \"three\"}" != "$out"
  out=$("$DTRUN" report "$DT_TMP/tp" --step 99 2>&1); rc=$?
  check "report --step 99: exit 2 naming the steps held" test $rc = 2 -a "${out#*holds steps 1..6}" != "$out"
  cp -r "$DT_TMP/tp" "$DT_TMP/bad"
  head -c 300 "$DT_TMP/tp/trace/rank_2.json" >"$DT_TMP/bad/trace/rank_2.json"
  out=$("$DTRUN" trace "$DT_TMP/bad" 2>&1); rc=$?
  check "dtrun trace with a cut rank file: exit 2 naming it" test $rc = 2 -a "${out#*rank_2.json: not JSON}" != "$out"
  rm "$DT_TMP/bad/trace/rank_3.json"
  out=$("$DTRUN" trace "$DT_TMP/bad" 2>&1); rc=$?
  check "dtrun trace with a rank file missing: exit 2" test $rc = 2
  echo '{"traceEvents": [{"name": "x", "ph": "X", "pid": 0, "tid": 1, "ts": 1, "dur": -5}]}' >"$DT_TMP/bad/trace.json"
  out=$("$DTRUN" report "$DT_TMP/bad" 2>&1); rc=$?
  check "report with a corrupt trace.json: exit 2 naming the event" test $rc = 2 -a "${out#*event 0}" != "$out"
  echo keep >"$DT_TMP/target"
  ln -s "$DT_TMP/target" "$DT_TMP/link.json"
  out=$("$DTRUN" trace "$DT_TMP/tp" -o "$DT_TMP/link.json" 2>&1); rc=$?
  check "dtrun trace -o a symbolic link: refused, the target untouched" test $rc = 2 -a "$(cat "$DT_TMP/target")" = keep
  ln -sf "$DT_TMP/target" "$DT_TMP/tp/timeline.svg"
  "$DTRUN" report "$DT_TMP/tp" >/dev/null 2>&1
  check "timeline.svg planted as a link: replaced, never written through" test "$(cat "$DT_TMP/target")" = keep
fi
"$DTRUN" trace --help >/dev/null; check "dtrun trace --help: exit 0" test $? = 0
"$DTRUN" report --help >/dev/null; check "dtrun report --help: exit 0" test $? = 0
"$DTRUN" trace >/dev/null 2>&1; check "dtrun trace without a folder: exit 2" test $? = 2
finish
