#!/usr/bin/env bash
# test_train.sh - the trainer as users run it: losses fall, files follow the
# contract, runs are deterministic, bad configs and data exit 2 naming the problem.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
W="$DTRUN __worker"

# A small text corpus made here: enough structure for a tiny GPT to learn.
make_text "$DT_TMP/text.txt" 0 6000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 8, "train_steps": 150, "steps_per_print": 10,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
 "eval": {"every_steps": 50, "batches": 4}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}, "log": {"dir": "$DT_TMP/run1"}}
JSON

if $W "$DT_TMP/gpt.json" >"$DT_TMP/out1" 2>&1; then pass "gpt trains (exit 0)"; else fail "gpt trains" "$(tail -5 "$DT_TMP/out1")"; fi
python3 - "$DT_TMP/run1" <<'PY' && pass "loss starts at ln(256), falls below the unigram entropy; metrics keys" || fail "loss curve and metrics keys"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
need = {"step", "loss", "lr", "tokens_per_s", "step_ms", "compute_ms", "comm_ms", "data_ms", "grad_norm"}
assert all(need <= set(r) for r in rows), "missing keys"
assert abs(rows[0]["loss"] - math.log(256)) < 0.1, rows[0]["loss"]
text = open(sys.argv[1] + "/../text.txt", "rb").read()
from collections import Counter
c = Counter(text); n = len(text)
h = -sum(v / n * math.log(v / n) for v in c.values())
assert rows[-1]["step"] == 150
assert rows[-1]["loss"] < h - 0.5, (rows[-1]["loss"], h)
vals = [r["val_loss"] for r in rows if "val_loss" in r]
assert len(vals) == 3 and vals[-1] < h, vals
s = json.load(open(sys.argv[1] + "/summary.json"))
ms = s["ranks"][0]["model_state_bytes"]
assert ms["total"] == 16 * s["n_params"], ms
PY
sed "s#$DT_TMP/run1#$DT_TMP/run2#" "$DT_TMP/gpt.json" > "$DT_TMP/gpt2.json"
$W "$DT_TMP/gpt2.json" train_steps=20 >/dev/null 2>&1
$W "$DT_TMP/gpt.json" train_steps=20 log.dir="$DT_TMP/run3" >/dev/null 2>&1
if cmp -s <(cut -d, -f1-2 "$DT_TMP/run2/metrics.jsonl") <(cut -d, -f1-2 "$DT_TMP/run3/metrics.jsonl"); then
  pass "same seed, same losses"; else fail "same seed, same losses"; fi

if $W configs/mlp-tiny.json log.dir="$DT_TMP/mlp" >"$DT_TMP/mlp.out" 2>&1 && grep -q "step 20/20" "$DT_TMP/mlp.out"; then
  pass "mlp trains"; else fail "mlp trains" "$(tail -3 "$DT_TMP/mlp.out")"; fi

# Bad input: exit 2 and a message that names the key or the file.
expect2() { # name pattern command...
  local name=$1 pat=$2; shift 2
  "$@" >"$DT_TMP/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$pat" "$DT_TMP/err"; then pass "$name"; else fail "$name" "rc=$rc: $(head -3 "$DT_TMP/err")"; fi
}
expect2 "unknown key names it" "optimizer.params.lrr" $W "$DT_TMP/gpt.json" optimizer.params.lrr=1
expect2 "missing data file named" "no file matches" $W "$DT_TMP/gpt.json" data.train=/nonexistent/x.txt
printf 'garbage!' > "$DT_TMP/bad.bin"; head -c 3000 /dev/zero >> "$DT_TMP/bad.bin"
expect2 "bad shard magic named" "bad.bin: not a token shard" $W "$DT_TMP/gpt.json" data.train="$DT_TMP/bad.bin" model.vocab_size=0
expect2 "batch identity checked" "train_batch_size" $W "$DT_TMP/gpt.json" train_batch_size=7
# On a terminal rank 0 redraws one live line between logged steps; on a pipe only
# whole lines (and no carriage returns) come out.
if command -v script >/dev/null; then
  script -qc "$DTRUN --standalone --nproc_per_node 1 configs/mlp-tiny.json train_steps=12 steps_per_print=5 log.dir=$DT_TMP/live" /dev/null > "$DT_TMP/tty.out" 2>&1
  if grep -q $'\r\[rank0\]:step 3/12 .*\033\[K' "$DT_TMP/tty.out" && grep -q $'\033\[K\[rank0\]:step 5/12' "$DT_TMP/tty.out"; then
    pass "live progress line on a terminal"; else fail "live progress line on a terminal" "$(cat -v "$DT_TMP/tty.out" | head -5)"; fi
else skip "live progress line on a terminal" "no script(1)"; fi
"$DTRUN" --standalone --nproc_per_node 1 configs/mlp-tiny.json train_steps=12 steps_per_print=5 log.dir="$DT_TMP/plain" > "$DT_TMP/pipe.out" 2>&1
if ! grep -q $'\r' "$DT_TMP/pipe.out" && [ "$(grep -c 'step [0-9]*/12' "$DT_TMP/pipe.out")" -eq 4 ] && [ "$(wc -l < "$DT_TMP/plain/metrics.jsonl")" -eq 4 ]; then
  pass "plain lines on a pipe"; else fail "plain lines on a pipe" "$(cat -v "$DT_TMP/pipe.out" | head)"; fi
# --print-config: the config resolved for the launch's world size; nothing starts.
out=$("$DTRUN" --nproc_per_node 2 --print-config configs/mlp-tiny.json optimizer.params.lr=0.5 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s' "$out" | python3 -c 'import json,sys; c=json.load(sys.stdin); assert c["train_batch_size"] == 16 and c["optimizer"]["params"]["lr"] == 0.5' \
   && ! printf '%s' "$out" | grep -q '\[rank'; then pass "--print-config resolves for the world size, starts nothing"
else fail "--print-config" "rc=$rc $out"; fi
# device cuda where no GPU is visible: the launcher refuses before starting anything (exit 2),
# naming the device and CUDA_VISIBLE_DEVICES; the worker alone says the same.
CUDA_VISIBLE_DEVICES= DTRUN_CUEMU_GPUS=0 "$DTRUN" --standalone --nproc_per_node 1 "$DT_TMP/gpt.json" device=cuda \
  >"$DT_TMP/nocuda.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "device cuda: .*CUDA_VISIBLE_DEVICES=)" "$DT_TMP/nocuda.out" && grep -q "nothing was started" "$DT_TMP/nocuda.out"
then pass "device=cuda without a visible GPU: launcher exits 2 naming it"
else fail "device=cuda without a visible GPU" "rc $rc: $(tail -3 "$DT_TMP/nocuda.out")"; fi
CUDA_VISIBLE_DEVICES=-1 DTRUN_CUEMU_GPUS=0 $W "$DT_TMP/gpt.json" device=cuda >"$DT_TMP/nocuda_w.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "device cuda: " "$DT_TMP/nocuda_w.out"
then pass "device=cuda without a visible GPU: worker exits 2 naming it"
else fail "device=cuda without a visible GPU (worker)" "rc $rc: $(tail -3 "$DT_TMP/nocuda_w.out")"; fi

finish
