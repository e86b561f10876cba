#!/usr/bin/env bash
# test_tensorboard.sh - tensorboard.enabled: rank 0's event files hold every figure
# of metrics.jsonl (read back by dtrun's own reader, `dtrun report --tensorboard`,
# which applies TensorBoard's restart rule), for a run whose rank 1 is SIGKILLed
# after a checkpoint and restarted by --max_restarts (one curve, no step twice), and
# for a fresh run into the same folder (it replaces the curves); the event files
# are flushed at every logged step (read while the run goes on); bad keys are
# refused before any worker starts, naming the key; off writes nothing.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

make_text "$DT_TMP/text.txt" 1 3000
cat > "$DT_TMP/g.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 4, "train_steps": 30, "steps_per_print": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "eval": {"every_steps": 10, "batches": 2},
 "checkpoint": {"dir": "$DT_TMP/ck", "every_steps": 10, "resume": "auto"},
 "tensorboard": {"enabled": true},
 "log": {"dir": "$DT_TMP/run"}}
JSON

# same RUN_DIR [TB_DIR]: every metrics.jsonl figure is the event files' scalar of the
# same step (float32), every scalar has its metrics.jsonl figure, no step twice
same() {
  "$DTRUN" report --tensorboard "${2:-$1}" >"$DT_TMP/tb.jsonl" 2>"$DT_TMP/tb.err" || { cat "$DT_TMP/tb.err"; return 1; }
  python3 - "$1/metrics.jsonl" "$DT_TMP/tb.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tb = [json.loads(l) for l in open(sys.argv[2])]
steps = [r["step"] for r in rows]
assert len(set(steps)) == len(steps), "metrics.jsonl repeats a step: %s" % steps
assert [t["step"] for t in tb] == steps, ([t["step"] for t in tb], steps)
n = 0
for r, t in zip(rows, tb):
    want = {}
    for k, v in r.items():
        if k == "step" or v is None:
            continue
        if isinstance(v, list):
            for i, x in enumerate(v):
                want["%s/rank_%d" % (k, i)] = x
        else:
            want[k] = v
    got = {tag.split("/", 1)[1] if not tag.split("/")[-1].startswith("rank_") else tag: v
           for tag, v in t.items() if tag != "step"}
    assert set(got) == set(want), (r["step"], sorted(set(got) ^ set(want)))
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-6, abs_tol=1e-30), (r["step"], k, got[k], v)
        n += 1
assert n >= 10 * len(rows), (n, len(rows))  # loss, lr, times, speed, ranks...
PY
}

DTRUN_FAULT_KILL_STEP=17 DTRUN_FAULT_KILL_RANK=1 "$DTRUN" --nproc_per_node 2 --max_restarts 1 "$DT_TMP/g.json" \
  >"$DT_TMP/o1" 2>&1
rc=$?
nfiles=$(ls "$DT_TMP/run/tensorboard" 2>/dev/null | grep -c tfevents)
if [ $rc -eq 0 ] && grep -q "resumed from" "$DT_TMP/o1" && [ "$nfiles" = 2 ] && same "$DT_TMP/run"; then
  pass "rank 1 killed at step 17, restarted from step 10: the event files hold metrics.jsonl's figures, each step once"
else fail "killed and restarted run" "rc=$rc files=$nfiles $(tail -2 "$DT_TMP/o1")"; fi

# A fresh run (resume never) into the same folder: its curves replace the old ones.
"$DTRUN" --nproc_per_node 1 "$DT_TMP/g.json" checkpoint.resume=never checkpoint.overwrite=true train_steps=12 \
  optimizer.params.lr=1e-3 >"$DT_TMP/o2" 2>&1
rc=$?
if [ $rc -eq 0 ] && same "$DT_TMP/run" && [ "$(tail -1 "$DT_TMP/tb.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')" = 12 ]; then
  pass "a fresh run into the same log.dir: TensorBoard shows its 12 steps, not the old run's 30"
else fail "fresh run over an old one" "rc=$rc $(tail -2 "$DT_TMP/o2")"; fi

# Flushed at every logged step: read while the run goes on (rank 0 sleeps 150 ms a step).
DTRUN_TEST_SLOW_RANK=0:150 "$DTRUN" --nproc_per_node 1 "$DT_TMP/g.json" log.dir="$DT_TMP/live" \
  checkpoint.dir="$DT_TMP/ck_live" steps_per_print=1 >"$DT_TMP/o3" 2>&1 &
pid=$!
live=no
for _ in $(seq 100); do
  sleep 0.1
  n=$(cat "$DT_TMP/live/metrics.jsonl" 2>/dev/null | wc -l)
  if [ "${n:-0}" -ge 5 ]; then
    got=$("$DTRUN" report --tensorboard "$DT_TMP/live" 2>/dev/null | wc -l)
    n2=$(wc -l <"$DT_TMP/live/metrics.jsonl")
    kill -0 $pid 2>/dev/null && [ "$got" -ge "$n" ] && [ "$got" -le "$n2" ] && live=yes
    break
  fi
done
wait $pid
if [ $live = yes ]; then pass "the event file holds every logged step while the run goes on ($got steps read live)"
else fail "live event file" "metrics rows ${n:-?}, event steps ${got:-?}"; fi

# Where the files go: output_path/job_name; refused before start when they cannot be.
"$DTRUN" --nproc_per_node 1 "$DT_TMP/g.json" log.dir="$DT_TMP/r4" checkpoint.dir="$DT_TMP/ck4" train_steps=4 \
  tensorboard.output_path="$DT_TMP/tb4" tensorboard.job_name=exp1 >"$DT_TMP/o4" 2>&1
if ls "$DT_TMP/tb4/exp1" | grep -q tfevents && [ ! -e "$DT_TMP/r4/tensorboard" ] && same "$DT_TMP/r4" "$DT_TMP/tb4/exp1"; then
  pass "tensorboard.output_path and job_name place the files"
else fail "output_path/job_name" "$(ls -R "$DT_TMP/tb4" 2>&1 | head -3)"; fi

refused() { # name pattern key=value...
  local name=$1 pat=$2; shift 2
  "$DTRUN" --nproc_per_node 1 "$DT_TMP/g.json" log.dir="$DT_TMP/r5" "$@" >"$DT_TMP/o5" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$pat" "$DT_TMP/o5" && ! grep -q "step 1/" "$DT_TMP/o5"; then pass "$name"
  else fail "$name" "rc=$rc $(head -3 "$DT_TMP/o5")"; fi
}
refused "job_name with a slash: exit 2 naming tensorboard.job_name" "tensorboard.job_name" tensorboard.job_name=a/b
refused "job_name '..': exit 2 naming tensorboard.job_name" "tensorboard.job_name" tensorboard.job_name=..
touch "$DT_TMP/afile"
refused "output_path under a file: exit 2 naming tensorboard.output_path" "tensorboard.output_path" \
  tensorboard.output_path="$DT_TMP/afile/x"

"$DTRUN" --nproc_per_node 1 "$DT_TMP/g.json" log.dir="$DT_TMP/r6" checkpoint.dir="$DT_TMP/ck6" train_steps=2 \
  tensorboard.enabled=false >"$DT_TMP/o6" 2>&1
if [ -f "$DT_TMP/r6/metrics.jsonl" ] && [ ! -e "$DT_TMP/r6/tensorboard" ] && ! grep -q "ignoring.*tensorboard" "$DT_TMP/o6"; then
  pass "tensorboard.enabled false: no event file; the keys are not reported as ignored"
else fail "tensorboard off" "$(ls "$DT_TMP/r6")"; fi

"$DTRUN" report --tensorboard "$DT_TMP/r6" >"$DT_TMP/o7" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "no TensorBoard event file" "$DT_TMP/o7"; then pass "report --tensorboard on a folder without events: exit 2 saying so"
else fail "report --tensorboard without events" "rc=$rc $(cat "$DT_TMP/o7")"; fi
finish
