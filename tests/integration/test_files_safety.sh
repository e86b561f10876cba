#!/usr/bin/env bash
# test_files_safety.sh - files never written or deleted outside their place, with
# real dtrun processes: `dtrun export -o` refuses targets that exist and are not a
# regular file (a symbolic link, a directory, a FIFO; a non-directory for --format
# hf) and an empty one, writes its temporaries under fresh names (a planted
# OUT.tmp link is never written through); `checkpoint.resume: never` onto a folder
# holding another run's checkpoints is exit 2 before any worker starts, naming the
# folder and the choices, unless `checkpoint.overwrite: true`, and then keep_last
# prunes only the new run's checkpoints; a FIFO as metrics.jsonl is an error, not
# a hang.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
L="$DTRUN --standalone --nproc_per_node 1"

make_text "$DT_TMP/text.txt" 5 2000
# cfg NAME STEPS EXTRA_CHECKPOINT_KEYS
cfg() {
  cat > "$DT_TMP/$1.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 16},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "train_steps": $2, "steps_per_print": 1,
 "threads": 1, "seed": 3, "eval": {"every_steps": 0},
 "checkpoint": {"dir": "$DT_TMP/ck", "every_steps": 1, "keep_last": 2 $3},
 "log": {"dir": "$DT_TMP/log_$1"}}
JSON
}
# expect2 NAME PATTERN COMMAND...: exit 2, PATTERN in the output, no worker started
expect2() {
  local name=$1 pat=$2; shift 2
  timeout 60 "$@" >"$DT_TMP/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$pat" "$DT_TMP/err" && ! grep -q "rank 0\]" "$DT_TMP/err"; then pass "$name"
  else fail "$name" "rc=$rc: $(head -4 "$DT_TMP/err")"; fi
}

cfg first 6 ', "resume": "auto"'
if $L "$DT_TMP/first.json" >"$DT_TMP/out" 2>&1 && [ -d "$DT_TMP/ck/step_00000006" ]; then pass "a first run saves"
else fail "a first run saves" "$(tail -5 "$DT_TMP/out")"; fi
CK="$DT_TMP/ck/step_00000006"

# ---- export targets ----
V="$DT_TMP/victim"
mkdir -p "$V" && echo original > "$V/file"
ln -s "$V/file" "$DT_TMP/link.safetensors"
expect2 "export -o a symbolic link refused" "symbolic link" $DTRUN export "$CK" -o "$DT_TMP/link.safetensors"
check "export -o link: the link's target untouched" grep -qx original "$V/file"
check "export -o link: the link is still a link" test -L "$DT_TMP/link.safetensors"
expect2 "export -o a directory refused" "is a directory" $DTRUN export "$CK" -o "$DT_TMP"
check "export -o a directory: no DIR.tmp written" test ! -e "$DT_TMP.tmp"
expect2 "export -o '' refused" "empty path" $DTRUN export "$CK" -o ''
mkfifo "$DT_TMP/fifo.safetensors"
expect2 "export -o a FIFO refused without hanging" "FIFO" $DTRUN export "$CK" -o "$DT_TMP/fifo.safetensors"
echo data > "$DT_TMP/afile"
expect2 "export --format hf -o a file refused" "not a directory" $DTRUN export "$CK" --format hf -o "$DT_TMP/afile"
ln -s "$V" "$DT_TMP/linkdir"
expect2 "export --format hf -o a link to a directory refused" "symbolic link" \
  $DTRUN export "$CK" --format hf -o "$DT_TMP/linkdir"
check "export hf -o link: nothing written in its target" test "$(ls "$V")" = file
# A planted OUT.tmp link: the export writes a fresh temporary, never through it.
ln -s "$V/file" "$DT_TMP/out.safetensors.tmp"
mkdir -p "$DT_TMP/hfout" && ln -s "$V/file" "$DT_TMP/hfout/config.json.tmp"
if $DTRUN export "$CK" -o "$DT_TMP/out.safetensors" >"$DT_TMP/err" 2>&1 && [ -f "$DT_TMP/out.safetensors" ] &&
   grep -qx original "$V/file"; then pass "export beside a planted OUT.tmp link writes only OUT"
else fail "export beside a planted OUT.tmp link writes only OUT" "$(head -3 "$DT_TMP/err")"; fi
if $DTRUN export "$CK" --format hf -o "$DT_TMP/hfout" >"$DT_TMP/err" 2>&1 && [ -f "$DT_TMP/hfout/config.json" ] &&
   grep -qx original "$V/file"; then pass "export hf beside a planted config.json.tmp link writes only the folder"
else fail "export hf beside a planted config.json.tmp link writes only the folder" "$(head -3 "$DT_TMP/err")"; fi

# ---- resume: never onto another run's checkpoints ----
cfg second 2 ', "resume": "never"'
expect2 "resume never onto another run's checkpoints refused" "checkpoint.overwrite" $L "$DT_TMP/second.json"
check "the refusal names the folder" grep -qF "$DT_TMP/ck" "$DT_TMP/err"
check "the refusal names resume as a choice" grep -qF "checkpoint.resume" "$DT_TMP/err"
check "the first run's checkpoint is untouched" test -f "$CK/meta.json"
cfg third 4 ', "resume": "never", "overwrite": true'
if $L "$DT_TMP/third.json" >"$DT_TMP/out" 2>&1; then pass "checkpoint.overwrite true runs"
else fail "checkpoint.overwrite true runs" "$(tail -5 "$DT_TMP/out")"; fi
# The first run left steps 5 and 6 (keep_last 2); the second run, 4 steps with
# keep_last 2, keeps its 3 and 4 and deletes its own 1 and 2, never the first's.
python3 - "$DT_TMP/ck" > "$DT_TMP/ids" <<'PY'
import json, os, sys
d = sys.argv[1]
for n in sorted(os.listdir(d)):
    if n.startswith("step_") and not n.endswith(".tmp"):
        print(n, json.load(open(os.path.join(d, n, "meta.json"))).get("run_id", "-"))
PY
id_of() { awk -v s="$1" '$1==s {print $2}' "$DT_TMP/ids"; }
check "keep_last of the new run: steps 3, 4, 5, 6 left" \
  test "$(awk '{print $1}' "$DT_TMP/ids" | tr '\n' ' ')" = "step_00000003 step_00000004 step_00000005 step_00000006 "
check "every checkpoint has a run id" test -z "$(awk '$2=="-"' "$DT_TMP/ids")"
check "steps 5 and 6 are the first run's, 3 and 4 the new run's" \
  test "$(id_of step_00000005)" = "$(id_of step_00000006)" -a "$(id_of step_00000003)" = "$(id_of step_00000004)" \
  -a "$(id_of step_00000003)" != "$(id_of step_00000005)"
cfg fourth 5 ', "resume": "auto"'
if $L "$DT_TMP/fourth.json" >"$DT_TMP/out" 2>&1 && grep -q "resumed from .*step_00000004" "$DT_TMP/out"; then
  pass "resume auto continues the newest run"
else fail "resume auto continues the newest run" "$(grep -i checkpoint "$DT_TMP/out" | tail -3)"; fi

# ---- a FIFO as metrics.jsonl ----
mkdir -p "$DT_TMP/log_fifo" && mkfifo "$DT_TMP/log_fifo/metrics.jsonl"
cat > "$DT_TMP/fifo.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 16},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "train_steps": 1,
 "threads": 1, "eval": {"every_steps": 0}, "log": {"dir": "$DT_TMP/log_fifo"}}
JSON
timeout 20 $L "$DT_TMP/fifo.json" >"$DT_TMP/err" 2>&1; rc=$?
if [ $rc -ne 124 ] && [ $rc -ne 0 ] && grep -q "metrics.jsonl.*FIFO" "$DT_TMP/err"; then pass "a FIFO as metrics.jsonl is an error naming it"
else fail "a FIFO as metrics.jsonl is an error naming it" "rc=$rc: $(grep -i metrics "$DT_TMP/err" | head -3)"; fi
finish
