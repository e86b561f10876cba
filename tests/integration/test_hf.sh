#!/usr/bin/env bash
# test_hf.sh - Hugging Face weights in and out with real dtrun processes: a trained
# tiny GPT exported with --format hf (config.json, generation_config.json,
# model.safetensors), trained from with model.pretrained (lr 1e-30: export again gives
# the same bytes, so every tensor went in and came out unchanged), sharded exports
# (--max-shard-size) and bf16 exports that load back identically, ZeRO-1/2 and FSDP
# at 2 ranks from pretrained weights equal to 1 rank, checkpoint.resume winning over
# them, the emulated GPU's bf16 masters, a llama (GQA, biases) through fsdp, and every
# bad input refused with exit 2 before any worker starts, naming the file and tensor
# or key.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
W="$DTRUN __worker"
L="$DTRUN --standalone --nproc_per_node 1"

make_text "$DT_TMP/text.txt" 3 3000
# cfg NAME EXTRA_JSON: a config training from $DT_TMP/NAME's model section
cfg() {
  cat > "$DT_TMP/$1.json" <<JSON
{"model": $2,
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "train_steps": ${3:-1}, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": ${4:-1e-30}, "weight_decay": 0}},
 "threads": 1, "seed": 11, "eval": {"every_steps": 0},
 "checkpoint": {"dir": "$DT_TMP/ck_$1", "every_steps": ${3:-1}, "resume": "never"},
 "log": {"dir": "$DT_TMP/run_$1"}}
JSON
}
# expect2 NAME PATTERN COMMAND...: exit 2, PATTERN in the output, no worker started
expect2() {
  local name=$1 pat=$2; shift 2
  "$@" >"$DT_TMP/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$pat" "$DT_TMP/err" && ! grep -q "rank 0\]" "$DT_TMP/err"; then pass "$name"
  else fail "$name" "rc=$rc: $(head -4 "$DT_TMP/err")"; fi
}
# tensors_equal A B: the two weight sets hold the same tensors (names, shapes, fp32 values)
tensors_equal() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys, os
import numpy as np
def load(d):
    files = [os.path.join(d, "model.safetensors")]
    ix = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(ix):
        files = sorted({os.path.join(d, f) for f in json.load(open(ix))["weight_map"].values()})
    out = {}
    for f in files:
        b = open(f, "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        for k, v in h.items():
            if k == "__metadata__": continue
            s, e = v["data_offsets"]
            raw = b[8 + n + s:8 + n + e]
            if v["dtype"] == "F32": a = np.frombuffer(raw, np.float32)
            else: a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            out[k] = (tuple(v["shape"]), a)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
for k in a:
    assert a[k][0] == b[k][0], (k, a[k][0], b[k][0])
    assert np.array_equal(a[k][1], b[k][1]), (k, np.abs(a[k][1] - b[k][1]).max())
PY
}

# --- a trained tiny GPT, exported for transformers
cfg base '{"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256}' 12 3e-3
$W "$DT_TMP/base.json" >"$DT_TMP/o_base" 2>&1 || fail "base run" "$(tail -3 "$DT_TMP/o_base")"
if "$DTRUN" export "$DT_TMP/ck_base" -o "$DT_TMP/hf" --format hf >"$DT_TMP/oe" 2>&1 &&
   python3 - "$DT_TMP/hf" <<'PY'
import json, os, sys
d = sys.argv[1]
c = json.load(open(os.path.join(d, "config.json")))
assert c["architectures"] == ["GPT2LMHeadModel"] and c["model_type"] == "gpt2", c
assert (c["n_embd"], c["n_layer"], c["n_head"], c["vocab_size"], c["n_positions"]) == (32, 2, 2, 256, 32), c
assert c["torch_dtype"] == "float32" and c["tie_word_embeddings"] is True, c
json.load(open(os.path.join(d, "generation_config.json")))
assert os.path.exists(os.path.join(d, "model.safetensors"))
assert not os.path.exists(os.path.join(d, "model.safetensors.index.json"))
PY
then pass "export --format hf: config.json (GPT2LMHeadModel, sizes, fp32 as trained), generation_config.json, model.safetensors"
else fail "export --format hf" "$(cat "$DT_TMP/oe")"; fi

# --- in and out again: lr 1e-30 keeps the weights (no change survives fp32 rounding), so the
# second export equals the first
cfg rt "{\"pretrained\": \"$DT_TMP/hf\"}"
$W "$DT_TMP/rt.json" >"$DT_TMP/o_rt" 2>&1 || fail "pretrained run" "$(tail -3 "$DT_TMP/o_rt")"
"$DTRUN" export "$DT_TMP/ck_rt" -o "$DT_TMP/hf_rt" --format hf >/dev/null 2>&1
if cmp -s "$DT_TMP/hf/model.safetensors" "$DT_TMP/hf_rt/model.safetensors" && grep -q "pretrained: .* GB/s" "$DT_TMP/o_rt"; then
  pass "export -> model.pretrained -> export: the same bytes (every tensor in and out unchanged), load rate logged"
else fail "round trip" "$(tail -3 "$DT_TMP/o_rt")"; fi
# the step-1 loss of the pretrained run is the trained model's, not a fresh one's (~ln 256 = 5.5)
if python3 - "$DT_TMP/run_rt/metrics.jsonl" "$DT_TMP/run_base/metrics.jsonl" <<'PY'
import json, sys
rt = [json.loads(l)["loss"] for l in open(sys.argv[1])]
base = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert abs(rt[0] - base[-1]) < 0.5 and rt[0] < 4.5, (rt, base[-1])
PY
then pass "the pretrained run starts at the trained model's loss"
else fail "pretrained starting loss"; fi

# --- shards: a tiny --max-shard-size cuts the tensors into files named by an index
"$DTRUN" export "$DT_TMP/ck_base" -o "$DT_TMP/hf_sh" --format hf --max-shard-size 30KB >"$DT_TMP/oe" 2>&1
n=$(ls "$DT_TMP/hf_sh" | grep -c '^model-0000[0-9]-of-0000[0-9].safetensors$')
if [ "$n" -ge 3 ] && [ ! -e "$DT_TMP/hf_sh/model.safetensors" ] && tensors_equal "$DT_TMP/hf" "$DT_TMP/hf_sh" &&
   python3 -c "import json,sys; m=json.load(open('$DT_TMP/hf_sh/model.safetensors.index.json')); sys.exit(not (m['metadata']['total_size'] > 0 and len(m['weight_map']) == 28))"; then
  pass "--max-shard-size 30KB: $n shards + index.json (total_size, weight_map), the same tensors"
else fail "sharded export" "n=$n $(cat "$DT_TMP/oe")"; fi
cfg sh "{\"pretrained\": \"$DT_TMP/hf_sh\"}"
$W "$DT_TMP/sh.json" >"$DT_TMP/o_sh" 2>&1 && "$DTRUN" export "$DT_TMP/ck_sh" -o "$DT_TMP/hf_sh2" --format hf >/dev/null 2>&1
if cmp -s "$DT_TMP/hf/model.safetensors" "$DT_TMP/hf_sh2/model.safetensors"; then
  pass "a sharded set loads back identically"
else fail "sharded load" "$(tail -3 "$DT_TMP/o_sh")"; fi

# --- bf16: exported rounded, loaded exactly (bf16 -> fp32 -> bf16 is the identity)
"$DTRUN" export "$DT_TMP/ck_base" -o "$DT_TMP/hf_bf" --format hf --dtype bf16 >/dev/null 2>&1
cfg bf "{\"pretrained\": \"$DT_TMP/hf_bf\"}"
$W "$DT_TMP/bf.json" >"$DT_TMP/o_bf" 2>&1 && "$DTRUN" export "$DT_TMP/ck_bf" -o "$DT_TMP/hf_bf2" --format hf --dtype bf16 >/dev/null 2>&1
if grep -q '"torch_dtype":.*"bfloat16"' "$DT_TMP/hf_bf/config.json" && grep -q '"BF16"' "$DT_TMP/hf_bf/model.safetensors" &&
   cmp -s "$DT_TMP/hf_bf/model.safetensors" "$DT_TMP/hf_bf2/model.safetensors"; then
  pass "--dtype bf16: BF16 tensors, torch_dtype bfloat16, loaded and exported again unchanged"
else fail "bf16 export" "$(tail -3 "$DT_TMP/o_bf")"; fi

# --- zero1, zero2 and fsdp at 2 ranks from pretrained weights == 1 rank (same global batch)
cfg f1 "{\"pretrained\": \"$DT_TMP/hf\"}" 4 1e-3
DTRUN_DUMP_PARAMS="$DT_TMP/p1.bin" $W "$DT_TMP/f1.json" >"$DT_TMP/o_f1" 2>&1
for strat in zero1 zero2 fsdp; do
  sed -e "s/\"threads\": 1/\"threads\": 1, \"strategy\": \"$strat\"/" -e "s#ck_f1#ck_$strat#; s#run_f1#run_$strat#" \
    "$DT_TMP/f1.json" >"$DT_TMP/$strat.json"
  DTRUN_DUMP_PARAMS="$DT_TMP/p_$strat.bin" "$DTRUN" --standalone --nproc_per_node 2 "$DT_TMP/$strat.json" >"$DT_TMP/o_$strat" 2>&1
  if python3 - "$DT_TMP" "$strat" <<'PY'
import json, sys
import numpy as np
d, s = sys.argv[1], sys.argv[2]
a, b = np.fromfile(d + "/p1.bin", np.float32), np.fromfile(d + "/p_" + s + ".bin", np.float32)
assert a.size == b.size and a.size > 0
assert np.abs(a - b).max() < 1e-5, np.abs(a - b).max()
la = [json.loads(l)["loss"] for l in open(d + "/run_f1/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(d + "/run_" + s + "/metrics.jsonl")]
assert len(la) == len(lb) == 4 and max(abs(x - y) for x, y in zip(la, lb)) < 1e-5, (la, lb)
assert la[0] < 4.5, la  # the trained model's loss, not a fresh one's
PY
  then pass "$strat at 2 ranks from pretrained weights == 1 rank (losses, final parameters)"
  else fail "$strat from pretrained" "$(tail -3 "$DT_TMP/o_$strat")"; fi
done

# --- checkpoint.resume wins when a checkpoint exists: the rt run resumed goes on from its step
sed -e 's/"resume": "never"/"resume": "auto"/' -e 's/"train_steps": 1,/"train_steps": 2,/' "$DT_TMP/rt.json" >"$DT_TMP/rt2.json"
$W "$DT_TMP/rt2.json" >"$DT_TMP/o_rt2" 2>&1
if grep -q "resumed from .*step_00000001" "$DT_TMP/o_rt2"; then pass "checkpoint.resume wins over model.pretrained"
else fail "resume over pretrained" "$(grep -i "resum\|error" "$DT_TMP/o_rt2" | head -3)"; fi

# --- the CUDA device (emulated): bf16 compute with fp32 masters filled from the files, 2 ranks
# under fsdp: the checkpoint's fp32 masters export to the same bytes; the meta.json of a
# bf16 run makes bf16 export's default
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}
if [ -x "$EMU" ]; then
  sed -e 's/"threads": 1/"threads": 1, "strategy": "fsdp", "device": "cuda", "bf16": {"enabled": true}/' \
      -e "s#ck_rt#ck_emu#; s#run_rt#run_emu#" "$DT_TMP/rt.json" >"$DT_TMP/emu.json"
  timeout 300 "$EMU" --standalone --nproc_per_node 2 "$DT_TMP/emu.json" >"$DT_TMP/o_emu" 2>&1 &&
    "$DTRUN" export "$DT_TMP/ck_emu" -o "$DT_TMP/hf_emu" --format hf --dtype fp32 >/dev/null 2>&1 &&
    "$DTRUN" export "$DT_TMP/ck_emu" -o "$DT_TMP/hf_emu_def" --format hf >/dev/null 2>&1
  if cmp -s "$DT_TMP/hf/model.safetensors" "$DT_TMP/hf_emu/model.safetensors" &&
     grep -q '"torch_dtype":.*"bfloat16"' "$DT_TMP/hf_emu_def/config.json"; then
    pass "emulated GPU, bf16, fsdp 2 ranks: fp32 masters from the files export unchanged; default export dtype bf16"
  else fail "pretrained on the emulated GPU" "$(tail -3 "$DT_TMP/o_emu")"; fi
else skip "pretrained on the emulated GPU" "no $EMU"; fi

# --- llama (GQA, q/k/v biases, untied head): out, in, out again unchanged, sharded and at 2 ranks fsdp
cfg lb '{"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "attention_bias": true, "rope_theta": 500000.0, "seq_len": 32, "max_position_embeddings": 64, "vocab_size": 256}' 6 3e-3
$W "$DT_TMP/lb.json" >"$DT_TMP/o_lb" 2>&1 || fail "llama base run" "$(tail -3 "$DT_TMP/o_lb")"
"$DTRUN" export "$DT_TMP/ck_lb" -o "$DT_TMP/lhf" --format hf >/dev/null 2>&1
"$DTRUN" export "$DT_TMP/ck_lb" -o "$DT_TMP/lhf_sh" --format hf --max-shard-size 20KB >/dev/null 2>&1
cfg lr "{\"pretrained\": \"$DT_TMP/lhf_sh\"}"
sed -e 's/"threads": 1/"threads": 1, "strategy": "fsdp"/' "$DT_TMP/lr.json" >"$DT_TMP/lr2.json"
"$DTRUN" --standalone --nproc_per_node 2 "$DT_TMP/lr2.json" >"$DT_TMP/o_lr" 2>&1 &&
  "$DTRUN" export "$DT_TMP/ck_lr" -o "$DT_TMP/lhf2" --format hf >/dev/null 2>&1
if python3 -c "import json,sys; c=json.load(open('$DT_TMP/lhf/config.json')); sys.exit(not (c['architectures'] == ['LlamaForCausalLM'] and c['num_key_value_heads'] == 2 and c['attention_bias'] is True and c['rope_theta'] == 500000 and c['tie_word_embeddings'] is False))" &&
   cmp -s "$DT_TMP/lhf/model.safetensors" "$DT_TMP/lhf2/model.safetensors"; then
  pass "llama: LlamaForCausalLM config.json; sharded export -> fsdp at 2 ranks from it -> export: the same bytes"
else fail "llama round trip" "$(tail -3 "$DT_TMP/o_lr")"; fi
expect2 "a float key beside pretrained that disagrees names both values" \
  "model.rope_theta: the config says 10000, $DT_TMP/lhf_sh/config.json says 500000" $L "$DT_TMP/lr.json" model.rope_theta=10000

# --- bad inputs: exit 2 before any worker, naming what is wrong
bad() { # NAME: a copy of hf to spoil
  rm -rf "$DT_TMP/bad_$1"; cp -r "$DT_TMP/hf" "$DT_TMP/bad_$1"
  cfg "b_$1" "{\"pretrained\": \"$DT_TMP/bad_$1\"}"
}
# spoil DIR PYTHON: rewrite DIR/model.safetensors's header with PYTHON (h = the header dict)
spoil() {
  python3 - "$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
exec(sys.argv[2])
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
}
bad nocfg; rm "$DT_TMP/bad_nocfg/config.json"
expect2 "missing config.json" "bad_nocfg/config.json" $L "$DT_TMP/b_nocfg.json"
bad type; sed -i 's/"gpt2"/"bert"/' "$DT_TMP/bad_type/config.json"
expect2 "unsupported model_type: named, the supported listed" 'model_type "bert": expected one of llama, mistral, qwen2, gpt2' $L "$DT_TMP/b_type.json"
bad miss; spoil "$DT_TMP/bad_miss" 'del h["h.1.mlp.c_fc.bias"]'
expect2 "missing tensor named with its shape" "tensor h.1.mlp.c_fc.bias (expected shape (128))" $L "$DT_TMP/b_miss.json"
bad shape; spoil "$DT_TMP/bad_shape" 'h["h.0.attn.c_attn.weight"]["shape"] = [96, 32]'
expect2 "wrong shape: name, expected, found" "tensor h.0.attn.c_attn.weight: expected shape (32, 96), found (96, 32)" $L "$DT_TMP/b_shape.json"
bad trunc; truncate -s -100 "$DT_TMP/bad_trunc/model.safetensors"
expect2 "truncated file" "truncated" $L "$DT_TMP/b_trunc.json"
bad lie; spoil "$DT_TMP/bad_lie" 'h["ln_f.bias"]["data_offsets"] = h["ln_f.weight"]["data_offsets"]'
expect2 "header that lies about offsets" "overlap in the data area" $L "$DT_TMP/b_lie.json"
bad dtype; spoil "$DT_TMP/bad_dtype" 'h["wpe.weight"]["dtype"] = "I32"'
expect2 "a dtype dtrun does not read" "tensor wpe.weight: dtype I32 is not one dtrun reads" $L "$DT_TMP/b_dtype.json"
cfg b_key "{\"pretrained\": \"$DT_TMP/hf\", \"n_embd\": 64}"
expect2 "a key beside pretrained that disagrees names both values" "model.n_embd: the config says 64, $DT_TMP/hf/config.json says 32" $L "$DT_TMP/b_key.json"
expect2 "the same from the command line" "model.n_layer: the config says 3" $L "$DT_TMP/rt.json" model.n_layer=3
expect2 "seq_len past n_positions" "model.seq_len: expected at most 32" $L "$DT_TMP/rt.json" model.seq_len=64
expect2 "dtrun config checks the tensors too" "tensor h.1.mlp.c_fc.bias" "$DTRUN" config "$DT_TMP/b_miss.json"
cfg ok_key "{\"pretrained\": \"$DT_TMP/hf\", \"type\": \"gpt\", \"n_embd\": 32, \"seq_len\": 16}"
if "$DTRUN" config "$DT_TMP/ok_key.json" >"$DT_TMP/oc" 2>&1 && grep -q '"seq_len":[[:space:]]*16' "$DT_TMP/oc"; then
  pass "agreeing keys and a shorter seq_len beside pretrained are accepted (wpe's first rows)"
else fail "agreeing keys" "$(head -3 "$DT_TMP/oc")"; fi
finish
