#!/usr/bin/env bash
# test_lora.sh - LoRA (lora.r > 0) on the tiny random Llama of tests/fixtures/lora
# (written by scripts/compat/peft_check.py with PEFT; numpy only here):
#   - forward and one AdamW step equal PEFT's within 1e-5, the PEFT export's names
#     and adapter_config.json (scripts/compat/lora_compare.py)
#   - `export --format hf --merge` equals the base + alpha/r B A of the PEFT export
#   - ddp, zero2 and fsdp on 2 ranks train as 1 rank with the same global batch (adapters
#     and losses within 1e-5), and the adapters are all dp holds (model-state bytes)
#   - activation recomputation (full on 1 rank and under fsdp, selective) gives the
#     adapters of the run without it, bitwise
#   - an int8 base: trains, its loss within 2e-2 of the fp32 base's, summary.json's
#     lora_base bytes = int8 linears + 4 bytes of scale per row + fp32 others
#   - on the emulated CUDA device (dtrun-emu, when built): bf16 and int8 bases train
#     within bf16 rounding of the CPU
#   - resume of a LoRA checkpoint equals the uninterrupted run
#   - `dtrun plan --lora-r 4 --base-dtype int8` prints the int8 run's model-state bytes
#   - bad lora config: exit 2 naming the key, before any worker starts
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
FIX=tests/fixtures/lora

python3 scripts/compat/lora_compare.py "$DTRUN" "$FIX" "$DT_TMP/peft" || DT_FAILS=$((DT_FAILS + 1))

# A helper: runs dtrun with lora_compare's config plus overrides; prints the last loss.
cat >"$DT_TMP/run.py" <<'PY'
import json, os, sys
sys.path.insert(0, "scripts/compat")
import numpy as np, hf_compare, lora_compare
dtrun, work, nproc, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
over = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
lora = over.pop("lora", {})
os.makedirs(work, exist_ok=True)
if over.pop("big_data", False):  # 257 tokens: 16 windows of 16, enough for 2 ranks x 2 x 3 steps
    shard = os.path.join(work, "big.bin")
    hf_compare.write_shard(shard, np.random.default_rng(5).integers(0, 97, 257).tolist())
    over["data"] = {"train": shard, "val": shard}
loss, out = lora_compare.train(dtrun, "tests/fixtures/lora", work, steps, nproc, lora, **over)
print(loss)
PY
run() { python3 "$DT_TMP/run.py" "$DTRUN" "$DT_TMP/$1" "$2" "$3" "${4:-{\}}" 2>"$DT_TMP/$1.err"; }

# merged export = base + alpha/r B A (from the PEFT export of the same checkpoint)
if ! "$DTRUN" export "$DT_TMP/peft/ckpt" -o "$DT_TMP/merged" --format hf --merge >"$DT_TMP/merge.out" 2>&1; then
  fail "export --format hf --merge" "$(tail -2 "$DT_TMP/merge.out")"
elif why=$(python3 - "$FIX/base/model.safetensors" "$DT_TMP/peft/peft/adapter_model.safetensors" \
    "$DT_TMP/merged/model.safetensors" 2>&1 <<'PY'
import sys
sys.path.insert(0, "scripts/compat")
import numpy as np, hf_compare
base, ad, merged = (hf_compare.read_safetensors(p) for p in sys.argv[1:4])
assert set(merged) == set(base), f"tensors {sorted(set(merged) ^ set(base))[:4]}"
worst, n = 0.0, 0
for k, w in base.items():
    want = w.astype(np.float64)
    a = "base_model.model." + k[:-len(".weight")] + ".lora_A.weight"
    if a in ad:
        want = want + 8 / 4 * ad[a.replace("lora_A", "lora_B")].astype(np.float64) @ ad[a].astype(np.float64)
        n += 1
    worst = max(worst, float(np.abs(merged[k] - want).max()))
assert n == 14, f"{n} adapted weights, expected 14"
assert worst <= 1e-6, f"max |diff| {worst:.2e}"
PY
); then pass "export --format hf --merge: every weight = base + alpha/r B A (14 adapted)"
else fail "export --format hf --merge" "$(echo "$why" | tail -1)"; fi

# data parallel: 2 ranks x A1 == 1 rank x A2 (3 steps)
same() { # adapters and last loss of two runs within 1e-5
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" <<'PY'
import sys
sys.path.insert(0, "scripts/compat")
import numpy as np, hf_compare
a, b = (hf_compare.read_safetensors(d + "/peft/adapter_model.safetensors") for d in sys.argv[1:3])
assert set(a) == set(b)
e = max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)
assert e <= 1e-5, f"adapters differ by {e:.2e}"
PY
}
if l1=$(run dp1 1 3 '{"big_data": true, "gradient_accumulation_steps": 2}'); then
  for s in ddp zero2 fsdp; do
    if l2=$(run dp2_$s 2 3 "{\"big_data\": true, \"gradient_accumulation_steps\": 1, \"strategy\": \"$s\"}") &&
       why=$(same dp1 dp2_$s 2>&1) &&
       python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-5)" "$l1" "$l2"; then
      pass "lora $s: 2 ranks x A1 == 1 rank x A2 (adapters and loss within 1e-5: $l1 vs $l2)"
    else
      fail "lora $s: 2 ranks vs 1 rank" "$l1 vs $l2; $why $(tail -2 "$DT_TMP/dp2_$s.err")"
    fi
  done
else
  fail "lora: 1-rank reference" "$(tail -3 "$DT_TMP/dp1.err")"
fi

# recomputation through the LoRA linear helpers (the merge of both into the block
# functions): policy full, on 1 rank and under fsdp (its gather order with the
# recompute's uses), gives the adapters of the run without it bit for bit
for c in "dp1 1 2 full" "dp2_fsdp 2 1 full" "dp1 1 2 selective"; do
  set -- $c
  name=rc_$1_$4
  ex="{\"big_data\": true, \"gradient_accumulation_steps\": $3, \"activation_checkpointing\": {\"policy\": \"$4\"}"
  [ "$1" = dp2_fsdp ] && ex="$ex, \"strategy\": \"fsdp\""
  if [ -f "$DT_TMP/$1/peft/adapter_model.safetensors" ] && run "$name" "$2" 3 "$ex}" >/dev/null &&
     cmp -s "$DT_TMP/$1/peft/adapter_model.safetensors" "$DT_TMP/$name/peft/adapter_model.safetensors"; then
    pass "lora with activation_checkpointing.policy $4 ($1): adapters equal the run without, bitwise"
  else
    fail "lora with activation_checkpointing.policy $4 ($1)" "$(tail -2 "$DT_TMP/$name.err" 2>/dev/null)"
  fi
done

# int8 base: trains, close to the fp32 base, base bytes as the formula
if l8=$(run int8 1 1 '{"lora": {"base_dtype": "int8"}}'); then
  if why=$(python3 - "$l8" "$FIX" "$DT_TMP/int8/log/summary.json" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "scripts/compat")
import hf_compare
loss, fix, summ = float(sys.argv[1]), sys.argv[2], sys.argv[3]
want = float(hf_compare.read_safetensors(fix + "/expected.safetensors")["loss"])
assert abs(loss - want) <= 2e-2, f"int8 loss {loss} vs fp32 {want}"
base = hf_compare.read_safetensors(fix + "/base/model.safetensors")
lin = [k for k in base if ".layers." in k and base[k].ndim == 2]
exp_b = sum(base[k].size + 4 * base[k].shape[0] for k in lin)
# the others in fp32; the vocabulary padded to 128 rows (vocab_pad_multiple 64)
exp_b += sum(4 * (v.size if k not in ("model.embed_tokens.weight", "lm_head.weight") else 128 * v.shape[1])
             for k, v in base.items() if k not in lin)
ms = json.load(open(summ))
ms = ms["memory"]["ranks"][0]["model_state_bytes"] if "memory" in ms else ms["ranks"][0]["model_state_bytes"]
assert ms["lora_base"] == exp_b, f"lora_base {ms['lora_base']} vs formula {exp_b}"
assert ms["expected"] == exp_b + 16 * 4096, f"expected {ms['expected']} vs {exp_b} + 16 x 4096"
PY
); then pass "int8 base: loss within 2e-2 of fp32's ($l8), base bytes and model state as the formula"
  else fail "int8 base" "$(echo "$why" | tail -1)"; fi
else
  fail "int8 base run" "$(tail -3 "$DT_TMP/int8.err")"
fi

# `dtrun plan --lora-r 4 --base-dtype int8` prints the model-state bytes the int8 run allocated
planned=$("$DTRUN" plan "$DT_TMP/int8/train.json" --lora-r 4 --base-dtype int8 2>&1 | awk '/model-state bytes/ {print $3}')
measured=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); s=s.get('memory', s); print(int(s['ranks'][0]['model_state_bytes']['expected']))" \
  "$DT_TMP/int8/log/summary.json" 2>/dev/null)
if [ -n "$planned" ] && [ "$planned" = "$measured" ]; then pass "plan --lora-r 4 --base-dtype int8: $planned model-state bytes, as the run"
else fail "plan --lora-r --base-dtype int8" "plan '$planned', run '$measured'"; fi
# plan's tables and recommendation are the LoRA run's (issue 32): --json's rows hold
# the adapters' states plus the frozen base, sharded by the strategy like parameters
"$DTRUN" plan --json "$DT_TMP/int8/train.json" --lora-r 4 --base-dtype int8 --gpus 1,2 >"$DT_TMP/pj.out" 2>"$DT_TMP/pj.err"; rc=$?
if [ $rc = 0 ] && why=$(python3 - "$DT_TMP/pj.out" "$measured" 2>&1 <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); measured = float(sys.argv[2])
lo = j["lora"]
assert lo["r"] == 4 and lo["base"] == "int8", lo
assert lo["state_bytes_ddp"] == measured, f"state_bytes_ddp {lo['state_bytes_ddp']} vs the run's {measured}"
A = lo["trainable_params"]
rows = {(r["strategy"], r["gpus"]): r for r in j["rows"]}
d1 = rows[("ddp", 1)]
st = d1["memory_bytes"]["model_states"]
assert abs(st - (measured + lo["sink_bytes"])) < 1, f"ddp 1-GPU row's states {st} vs the run's {measured} + sink {lo['sink_bytes']}"
z2 = rows[("zero2", 2)]
g = z2["memory_bytes"]["grads"]
assert abs(g - 4 * A / 2) < 64, f"zero2 on 2 GPUs: grads {g}, the adapters' {4 * A} halved"
assert all(r.get("tp", 1) == 1 for r in j["rows"]), "a TP row in a LoRA plan"
assert j["recommendation"]["cheapest"] is not None
PY
); then pass "plan --json --lora-r: the rows are the LoRA run's (ddp = the run's model state + sink; zero2 halves the adapters' grads)"
else fail "plan --json --lora-r" "rc=$rc $why $(tail -2 "$DT_TMP/pj.err")"; fi
"$DTRUN" plan "$DT_TMP/int8/train.json" --lora-r 4 --tp 2 --gpus 2 >"$DT_TMP/pt.out" 2>"$DT_TMP/pt.err"; rc=$?
[ $rc = 2 ] && grep -q -- "--lora-r: LoRA runs with data parallelism only; TP size 2" "$DT_TMP/pt.err" &&
  pass "plan --lora-r with --tp 2: exit 2 naming both" || fail "plan --lora-r --tp 2" "rc=$rc $(cat "$DT_TMP/pt.err")"

# the emulated CUDA device (bf16 compute; the LoRA gemm and int8 matmuls of
# kernels/cuda/cuda_lora.cu): 3 steps within bf16 rounding of the CPU's
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}
if [ ! -x "$EMU" ]; then
  skip "lora on the emulated CUDA device" "no $EMU"
else
  for bd in bf16 int8; do
    cpu_bd=$([ $bd = int8 ] && echo int8 || echo fp32)
    if lc=$(run cpu3_$bd 1 3 "{\"lora\": {\"base_dtype\": \"$cpu_bd\"}}") &&
       lg=$(python3 "$DT_TMP/run.py" "$EMU" "$DT_TMP/emu_$bd" 1 3 \
            "{\"device\": \"cuda\", \"bf16\": {\"enabled\": true}, \"lora\": {\"base_dtype\": \"$bd\"}}" \
            2>"$DT_TMP/emu_$bd.err") &&
       python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 2e-3)" "$lc" "$lg"; then
      pass "lora on the emulated GPU, $bd base: step-3 loss within 2e-3 of the CPU's ($lg vs $lc)"
    else
      fail "lora on the emulated GPU, $bd base" "cpu '$lc' gpu '$lg': $(tail -2 "$DT_TMP/emu_$bd.err")"
    fi
  done
fi

# resume: a LoRA checkpoint (the adapters and their moments) resumed by path gives the
# uninterrupted run's step-3 loss, bit for bit (the base is read from model.pretrained again)
if why=$(python3 - "$DTRUN" "$DT_TMP/resume" 2>&1 <<'PY'
import json, os, subprocess, sys
sys.path.insert(0, "scripts/compat")
import lora_compare
dtrun, w = sys.argv[1:3]
os.makedirs(w, exist_ok=True)
cfg = lora_compare.config("tests/fixtures/lora", w, 3)
cfg["checkpoint"]["every_steps"] = 1
json.dump(cfg, open(w + "/a.json", "w"))
subprocess.run([dtrun, "--nproc_per_node", "1", w + "/a.json"], check=True, capture_output=True)
cfg["checkpoint"].update(resume=w + "/ckpt/step_00000002", dir=w + "/ckpt2")
cfg["log"]["dir"] = w + "/log2"
json.dump(cfg, open(w + "/b.json", "w"))
subprocess.run([dtrun, "--nproc_per_node", "1", w + "/b.json"], check=True, capture_output=True)
a = [json.loads(l) for l in open(w + "/log/metrics.jsonl")][-1]
b = [json.loads(l) for l in open(w + "/log2/metrics.jsonl")][-1]
assert a["step"] == b["step"] == 3 and a["loss"] == b["loss"], f"{a['loss']} vs {b['loss']}"
PY
); then pass "lora: resumed from step 2 by path, step 3's loss equals the uninterrupted run's"
else fail "lora resume" "$(echo "$why" | tail -2)"; fi

# bad configs: exit 2 naming the key
cp "$DT_TMP/peft/train.json" "$DT_TMP/good.json"
bad() { # name, expected text, overrides... (NP: ranks, 1 by default)
  local n=$1 want=$2; shift 2
  "$DTRUN" --nproc_per_node "${NP:-1}" "$DT_TMP/good.json" "$@" >"$DT_TMP/bad.out" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$want" "$DT_TMP/bad.out"; then pass "bad config: $n: exit 2 naming it"
  else fail "bad config: $n" "rc $rc: $(tail -2 "$DT_TMP/bad.out")"; fi
}
bad "no model.pretrained" "lora.r: LoRA fine-tunes a pretrained model" model.pretrained=null model.type=llama
bad "dropout" "lora.dropout: only 0" lora.dropout=0.1
bad "unknown target" "lora.target_modules: qq_proj is not a linear module" lora.target_modules=q_proj,qq_proj
NP=2 bad "tensor parallelism" "lora.r: LoRA runs with data parallelism only" tensor_parallel.size=2 \
  train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=1 train_batch_size=2
bad "bf16 base on cpu" "lora.base_dtype: bf16" lora.base_dtype=bf16
# lora.init's adapter_config.json (PEFT's, beside the weights) against the lora section:
# another alpha or set of modules, or an option dtrun does not implement, named
bad "adapter's lora_alpha" "adapter_init/adapter_config.json: lora_alpha is 8, the config's lora.alpha is 16" \
  lora.alpha=16
bad "adapter's target_modules" "adapter_config.json: target_modules is \[q_proj, up_proj" lora.target_modules=q_proj,v_proj
mkdir -p "$DT_TMP/adapter"
cp "$FIX/adapter_init/adapter_model.safetensors" "$DT_TMP/adapter/"
for c in 'use_rslora:true:use_rslora is true' 'bias:"all":bias is "all"' 'fan_in_fan_out:true:fan_in_fan_out is true'; do
  IFS=: read -r key val want <<<"$c"
  python3 - "$FIX/adapter_init/adapter_config.json" "$DT_TMP/adapter/adapter_config.json" "$key" "$val" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c[sys.argv[3]] = json.loads(sys.argv[4])
json.dump(c, open(sys.argv[2], "w"))
PY
  bad "adapter with $key $val" "adapter/adapter_config.json: $want" lora.init="$DT_TMP/adapter"
done
finish
