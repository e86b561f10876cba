#!/usr/bin/env bash
# test_hostile_files.sh - issue 31, hostile input on the newest surfaces, with real
# dtrun processes: each case is a clear error naming the file, key or flag (exit 2
# before anything starts where it can be), never a crash, a hang, a huge read, a
# silently wrong model or a destroyed file.
#   files read: a directory or FIFO where a safetensors index, config.json, a config
#     or metrics.jsonl was expected; a 6 GB (sparse) meta.json; an --decode FIFO
#   files written: report.svg and metrics.jsonl through a planted symbolic link
#   pre-start checks: checkpoint.dir unwritable, data.train too short (naming it)
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T=$DT_TMP

make_text "$T/t.txt" 1 400
cat >"$T/c.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$T/t.txt", "val_fraction": 0.1},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_steps": 2,
 "device": "cpu", "threads": 1, "steps_per_print": 1, "eval": {"every_steps": 0},
 "checkpoint": {"dir": "$T/ck", "every_steps": 2, "resume": "never"}, "log": {"dir": "$T/log"}}
JSON

WANT_TIMEOUT=30 # want (lib.sh): a refusal before start, a hang killed after 30 s

# ---- checks before start ----
want "checkpoint.dir /dev/null: exit 2 before start" 2 "checkpoint.dir: /dev/null cannot be created" \
  "$DTRUN" "$T/c.json" checkpoint.dir=/dev/null
want "checkpoint.dir under /proc: exit 2 before start" 2 "checkpoint.dir: /proc/1/dtrun-ck cannot be written" \
  "$DTRUN" "$T/c.json" checkpoint.dir=/proc/1/dtrun-ck
printf 'hello' >"$T/short.txt"
want "data.train too short: exit 2 naming the file" 2 "data.train: $T/short.txt: 5 tokens in 1 file(s) give no training sample" \
  "$DTRUN" "$T/c.json" "data.train=$T/short.txt"
: >"$T/empty.txt"
want "data.train empty: exit 2 naming the file" 2 "data.train: $T/empty.txt: 0 tokens" "$DTRUN" "$T/c.json" "data.train=$T/empty.txt"
mkfifo "$T/cfg.fifo"
want "a config that is a FIFO: exit 2, no hang" 2 "not a regular file (a FIFO)" "$DTRUN" "$T/cfg.fifo"
want "a config that is a directory: exit 2" 2 "not a regular file (a directory)" "$DTRUN" "$T"

# ---- one run to have a checkpoint, an HF export and metrics ----
if timeout 120 "$DTRUN" "$T/c.json" >"$T/run.out" 2>&1 && [ -f "$T/ck/step_00000002/meta.json" ]; then pass "a small run saves"
else fail "a small run saves" "$(tail -5 "$T/run.out")"; fi
CK=$T/ck/step_00000002
timeout 60 "$DTRUN" export "$CK" --format hf -o "$T/hf" >"$T/out" 2>&1 || fail "export hf" "$(tail -3 "$T/out")"

# ---- files read ----
mkdir -p "$T/hfi" && cp "$T/hf/config.json" "$T/hfi/"
mkdir "$T/hfi/model.safetensors.index.json"
want "sample: an index that is a directory: exit 2 naming it" 2 "model.safetensors.index.json: not a regular file (a directory)" \
  "$DTRUN" sample "$T/hfi" --prompt-ids 1 --tokens 2
sed 's|"model": {[^}]*}|"model": {"pretrained": "'"$T/hfi"'"}|' "$T/c.json" >"$T/p.json"
want "pretrained: an index that is a directory: exit 2 naming it" 2 "model.safetensors.index.json: not a regular file (a directory)" \
  "$DTRUN" "$T/p.json"
rmdir "$T/hfi/model.safetensors.index.json" && mkfifo "$T/hfi/model.safetensors.index.json"
want "sample: an index that is a FIFO: exit 2, no hang" 2 "model.safetensors.index.json: not a regular file (a FIFO)" \
  "$DTRUN" sample "$T/hfi" --prompt-ids 1 --tokens 2
mkdir -p "$T/hfc" && cp "$T/hf/model.safetensors" "$T/hfc/" && mkfifo "$T/hfc/config.json"
want "sample: a config.json that is a FIFO: exit 2, no hang" 2 "config.json: not a regular file (a FIFO)" \
  "$DTRUN" sample "$T/hfc" --prompt-ids 1 --tokens 2
mkdir -p "$T/big/step_00000002" && cp "$CK"/shard_* "$T/big/step_00000002/" && truncate -s 6G "$T/big/step_00000002/meta.json"
want "a 6 GB meta.json: refused by its size, unread" 2 "meta.json is 6442450944 bytes" \
  "$DTRUN" export "$T/big/step_00000002" -o "$T/big.safetensors"
mkdir -p "$T/rf" && mkfifo "$T/rf/metrics.jsonl"
want "report: metrics.jsonl a FIFO: no hang" 2 "metrics.jsonl: not a regular file (a FIFO)" "$DTRUN" report "$T/rf"
want "tokenize --decode a FIFO: exit 2, no hang" 2 "not a regular file (a FIFO)" \
  "$DTRUN" tokenize --tokenizer tests/fixtures/tok/gpt2 --decode "$T/cfg.fifo"
want "tokenize: an input file that is a FIFO: exit 2, no hang" 2 "not a regular file (a FIFO)" \
  "$DTRUN" tokenize --tokenizer tests/fixtures/tok/gpt2 "$T/cfg.fifo" -o "$T/tokfifo"

# ---- a checkpoint that disagrees with its folder; NaN weights ----
mkdir -p "$T/ck9" && cp -r "$CK" "$T/ck9/step_00000005"
want "resume from a step_5 folder whose meta.json says 2: exit 2 naming both" 2 "step is 2 but its folder step_00000005 is step 5" \
  "$DTRUN" "$T/c.json" "checkpoint.resume=$T/ck9/step_00000005" train_steps=4 checkpoint.every_steps=0
want "export of that checkpoint: exit 2 naming both" 2 "step is 2 but its folder step_00000005 is step 5" \
  "$DTRUN" export "$T/ck9/step_00000005" -o "$T/x.safetensors"
cp -r "$T/hf" "$T/hfnan"
python3 - "$T/hfnan/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
for e in json.loads(b[8:8 + n]).values():  # every weight NaN
    if 'data_offsets' not in e: continue
    s, t = e['data_offsets']; w = 4 if e['dtype'] == 'F32' else 2
    nan = struct.pack('<f', float('nan')) if w == 4 else b'\xc0\x7f'
    for o in range(8 + n + s, 8 + n + t, w): b[o:o + w] = nan
open(p, 'wb').write(b)
PY
want "sample from NaN weights: an error naming the step, not token 0 for ever" 2 "generation step 1 (position 0): the logits are not finite" \
  "$DTRUN" sample "$T/hfnan" --prompt-ids 1 --tokens 5 --ids

# ---- export: never over its own source; a new hf export swapped in whole ----
cp "$CK/meta.json" "$T/meta.saved"
want "export -o its own meta.json: exit 2, the source kept" 2 "is inside the checkpoint" \
  "$DTRUN" export "$CK" -o "$CK/meta.json"
check "export -o its own meta.json: meta.json unchanged" cmp -s "$CK/meta.json" "$T/meta.saved"
want "export --format hf -o a folder holding the source: exit 2" 2 "holds the checkpoint" \
  "$DTRUN" export "$CK" --format hf -o "$T/ck"
echo "my notes" >"$T/hf/README.md"
cp "$T/hf/config.json" "$T/hf.config.saved" && cp "$T/hf/model.safetensors" "$T/hf.weights.saved"
DTRUN_TEST_EXPORT_PAUSE=30 "$DTRUN" export "$CK" --format hf --dtype bf16 -o "$T/hf" >"$T/out" 2>&1 &
EXP=$!
for _ in $(seq 200); do ls "$T"/hf.tmp.*/config.json >/dev/null 2>&1 && break; sleep 0.05; done
kill -KILL $EXP 2>/dev/null; wait $EXP 2>/dev/null
if cmp -s "$T/hf/config.json" "$T/hf.config.saved" && cmp -s "$T/hf/model.safetensors" "$T/hf.weights.saved" &&
   timeout 30 "$DTRUN" sample "$T/hf" --prompt-ids 1 --tokens 2 >"$T/out" 2>&1; then
  pass "export hf killed mid-write: the old export whole and loadable"
else fail "export hf killed mid-write: the old export whole and loadable" "$(head -3 "$T/out")"; fi
rm -rf "$T"/hf.tmp.*
if timeout 30 "$DTRUN" export "$CK" --format hf --dtype bf16 -o "$T/hf" >"$T/out" 2>&1 && grep -q bfloat16 "$T/hf/config.json" &&
   grep -qx "my notes" "$T/hf/README.md" && [ -z "$(ls -d "$T"/hf.* 2>/dev/null | grep -v saved)" ]; then
  pass "export hf over an export: replaced whole, the user's README.md kept, no staging left"
else fail "export hf over an export: replaced whole, the user's README.md kept, no staging left" "$(head -3 "$T/out"; ls "$T")"; fi
# A full disk: a tmpfs holding the old (fp32) export with no room for a second
# (bf16) one beside it; in place, the bf16 config.json went beside fp32 weights.
mkdir -p "$T/full"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=120k tmpfs "$T/full" 2>/dev/null; then
  if timeout 30 "$DTRUN" export "$CK" --format hf --dtype fp32 -o "$T/full/hf" >"$T/out" 2>&1; then
    cp "$T/full/hf/config.json" "$T/full.config.saved"
    timeout 30 "$DTRUN" export "$CK" --format hf --dtype bf16 -o "$T/full/hf" >"$T/out" 2>&1; rc=$?
    if [ $rc -ne 0 ] && grep -q "unchanged" "$T/out" && cmp -s "$T/full/hf/config.json" "$T/full.config.saved" &&
       [ "$(ls "$T/full")" = hf ] && timeout 30 "$DTRUN" sample "$T/full/hf" --prompt-ids 1 --tokens 2 >/dev/null 2>&1; then
      pass "export hf onto a full disk: an error, the old export whole, no staging left"
    else fail "export hf onto a full disk: an error, the old export whole, no staging left" "rc=$rc $(head -3 "$T/out"; ls "$T/full")"; fi
  else fail "export hf onto a small tmpfs" "$(head -3 "$T/out")"; fi
  umount "$T/full"
else skip "export hf onto a full disk" "needs root to mount a small tmpfs"; fi
# A save that runs out of space leaves no partial step_N.tmp behind (it would keep
# the disk full for the next save).
mkdir -p "$T/full2"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=200k tmpfs "$T/full2" 2>/dev/null; then
  timeout 60 "$DTRUN" "$T/c.json" "checkpoint.dir=$T/full2/ck" checkpoint.every_steps=1 "log.dir=$T/log3" >"$T/out" 2>&1
  if grep -q "No space left" "$T/out" && [ -z "$(ls "$T/full2/ck")" ]; then pass "a save onto a full disk leaves no step_N.tmp"
  else fail "a save onto a full disk leaves no step_N.tmp" "$(ls -R "$T/full2/ck"; grep -i error "$T/out" | head -2)"; fi
  umount "$T/full2"
else skip "a save onto a full disk" "needs root to mount a small tmpfs"; fi

# ---- files written: never through a planted link ----
echo original >"$T/victim"
ln -s "$T/victim" "$T/log/report.svg"
if timeout 30 "$DTRUN" report "$T/log" >"$T/out" 2>&1 && grep -qx original "$T/victim" && [ -f "$T/log/report.svg" ] &&
   [ ! -L "$T/log/report.svg" ]; then pass "report: a planted report.svg link is replaced, its target untouched"
else fail "report: a planted report.svg link is replaced, its target untouched" "$(head -3 "$T/out"; head -c 100 "$T/victim")"; fi
rm -rf "$T/log2" && mkdir -p "$T/log2" && ln -s "$T/victim" "$T/log2/metrics.jsonl"
timeout 60 "$DTRUN" "$T/c.json" "log.dir=$T/log2" checkpoint.every_steps=0 >"$T/out" 2>&1
check "training: a planted metrics.jsonl link is not written through" grep -qx original "$T/victim"

finish
