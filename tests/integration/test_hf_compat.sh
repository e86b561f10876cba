#!/usr/bin/env bash
# test_hf_compat.sh - dtrun against what transformers computed on the same tiny
# models (tests/fixtures/hf, written by scripts/compat/hf_models.py; numpy only here):
# logits of a prompt within 1e-4, 24 greedy ids, one AdamW step's loss and weights
# within 1e-5, for llama (GQA), llama3 (rope_scaling), qwen2 (biases, tied) and
# gpt2; the KV cache gives the ids of full forwards at one position per token; a
# config.json in transformers 5's form (rope_parameters) reads as the published one.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
FIX=tests/fixtures/hf

for n in llama llama3 qwen2 gpt2; do
  python3 scripts/compat/hf_compare.py "$DTRUN" "$FIX/$n" "$DT_TMP/$n" "$n" || DT_FAILS=$((DT_FAILS + 1))
done

# The cached and the uncached sampler agree on every fixture, and the cache costs
# one position per token: 8 prompt positions + 23 (the 24th id is never run).
prompt=3,17,42,5,88,61,9,70
for n in llama qwen2 gpt2; do
  a=$("$DTRUN" sample "$FIX/$n" --device cpu --prompt-ids $prompt --temperature 0 --tokens 24 --ids 2>"$DT_TMP/ea")
  b=$("$DTRUN" sample "$FIX/$n" --device cpu --prompt-ids $prompt --temperature 0 --tokens 24 --ids --no-cache 2>"$DT_TMP/eb")
  if [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "31 positions computed (KV cache)" "$DT_TMP/ea"; then
    pass "$n: KV-cache ids equal full-forward ids, 31 positions for 8 + 24"
  else
    fail "$n: KV cache vs full forwards" "cached '$a' ($(tail -1 "$DT_TMP/ea")), full '$b' ($(tail -1 "$DT_TMP/eb"))"
  fi
done

# transformers >= 5 writes rope_theta and rope_scaling as one rope_parameters object.
cp -r "$FIX/qwen2" "$DT_TMP/qwen2_v5"
python3 - "$DT_TMP/qwen2_v5/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_parameters"] = {"rope_theta": c.pop("rope_theta"), "rope_type": "default"}
c.pop("rope_scaling", None)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
if ! "$DTRUN" sample "$DT_TMP/qwen2_v5" --device cpu --prompt-ids $prompt --tokens 0 --logits >"$DT_TMP/v5.txt" 2>"$DT_TMP/v5.err"; then
  fail "qwen2: config.json with rope_parameters (transformers 5)" "$(tail -2 "$DT_TMP/v5.err")"
elif why=$(python3 - "$DT_TMP/v5.txt" "$FIX/qwen2/expected.safetensors" 2>&1 <<'PY'
import sys
sys.path.insert(0, "scripts/compat")
import numpy as np, hf_compare
got = np.loadtxt(sys.argv[1])
want = hf_compare.read_safetensors(sys.argv[2])["logits"]
assert got.shape == want.shape, f"logits shape {got.shape}, expected {want.shape}"
err = np.abs(got - want).max()
assert err <= 1e-4, f"logits max |diff| {err:.2e} (rope_theta read?)"
PY
); then pass "qwen2: config.json with rope_parameters (transformers 5) gives transformers' logits"
else fail "qwen2: config.json with rope_parameters (transformers 5)" "$(echo "$why" | tail -1)"; fi

# Bad input to sample: exit 2 naming the problem.
"$DTRUN" sample "$FIX/llama" --prompt-ids 3,400 --tokens 1 >/dev/null 2>"$DT_TMP/e1"; rc=$?
if [ $rc -eq 2 ] && grep -q "400 is outside the vocabulary \[0, 97)" "$DT_TMP/e1"; then pass "prompt id past the vocab: exit 2"
else fail "prompt id past the vocab" "rc $rc: $(cat "$DT_TMP/e1")"; fi
"$DTRUN" sample "$FIX/llama" --prompt-ids 3,x --tokens 1 >/dev/null 2>"$DT_TMP/e2"; rc=$?
if [ $rc -eq 2 ] && grep -q "not a list of token ids" "$DT_TMP/e2"; then pass "--prompt-ids not ids: exit 2"
else fail "--prompt-ids not ids" "rc $rc: $(cat "$DT_TMP/e2")"; fi
finish
