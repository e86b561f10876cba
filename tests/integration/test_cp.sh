#!/usr/bin/env bash
# test_cp.sh - context parallelism (context_parallel.size: ring attention) through real
# dtrun processes: a tiny gpt and a tiny llama (GQA) trained at CP 2 and CP 4, and CP 2
# with DP 2, TP 2 (with sequence parallelism), PP 2, FSDP and activation recomputation
# (full and selective), and Ulysses (context_parallel.mode ulysses: all-to-all over
# heads) alone, with DP 2, TP 2, PP 2 and full recomputation, each against 1 rank with
# the same global batch: losses, validation losses and final parameters within 1e-5
# (relative); the emulated CUDA device (ring and Ulysses); masked packed conversations
# at CP 2 (the documents' boundaries cross the chunks); LoRA at CP 2 and CP 2 x DP 2;
# text data's end-of-run sample; a CP 2 checkpoint resumed at CP 1 and at CP 4 equals
# the uninterrupted run; bad layouts refused before start naming the key.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 120"

python3 - "$DT_TMP/d.bin" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(7)
# a learnable stream: a repeated random phrase of 23 tokens with noise
base = rng.integers(0, 200, 23)
toks = np.concatenate([base if rng.random() < 0.8 else rng.integers(0, 256, 23) for _ in range(900)])
h = np.zeros(256, np.int32); h[:3] = [20240520, 1, len(toks)]
open(sys.argv[1], "wb").write(h.tobytes() + toks.astype(np.uint16).tobytes())
PY
cat > "$DT_TMP/llama.json" <<JSON
{"model": {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "seq_len": 64,
           "vocab_size": 256},
 "data": {"train": "$DT_TMP/d.bin", "val_fraction": 0.1},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_steps": 6, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}}, "gradient_clipping": 1.0,
 "eval": {"every_steps": 3, "batches": 2}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
sed -e 's/"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,/"type": "gpt", "n_embd": 32, "n_layer": 2, "n_head": 4,/' \
    -e 's/"num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "seq_len": 64,/"seq_len": 64,/' \
    "$DT_TMP/llama.json" > "$DT_TMP/gpt.json"

run() { # NAME NPROC CONFIG [KEY=VALUE ...]
  local name=$1 np=$2 cfg=$3; shift 3
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "$DTRUN" --standalone --nproc_per_node "$np" "$cfg" "$@" \
    log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1
}
same() { # RUN_A RUN_B [any]: losses, validation losses and parameters within 1e-5 (and
          # the loss falls, unless any: LoRA on a random base barely moves in 6 steps)
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" "${3:-learns}" <<'PY'
import json, sys, numpy as np
a, b = sys.argv[1], sys.argv[2]
ra = [json.loads(l) for l in open(a + "/metrics.jsonl")]
rb = [json.loads(l) for l in open(b + "/metrics.jsonl")]
la, lb = [r["loss"] for r in ra], [r["loss"] for r in rb]
assert len(la) == len(lb) > 1, (len(la), len(lb))
assert sys.argv[3] == "any" or la[-1] < la[0], ("it learns", la)
dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
va = [r["val_loss"] for r in ra if r.get("val_loss") is not None]
vb = [r["val_loss"] for r in rb if r.get("val_loss") is not None]
assert len(va) == len(vb), ("validations", va, vb)
dv = max([abs(x - y) / abs(y) for x, y in zip(va, vb)] + [0.0])
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
assert pa.size == pb.size > 0, (pa.size, pb.size)
dp = float(np.linalg.norm(pa.astype(np.float64) - pb) / np.linalg.norm(pb))
print(f"  loss {la[0]:.4f} -> {la[-1]:.4f}, max relative loss difference {dl:.2e}, validation {dv:.2e}, "
      f"parameters {dp:.2e}")
assert dl < 1e-5 and dv < 1e-5 and dp < 1e-5, ("loss", dl, "val", dv, "params", dp)
PY
}

# every layout on llama (GQA); gpt (a position table, no GQA) on the ring's and
# Ulysses' main layouts
L_CASES=("cp2 2 context_parallel.size=2" "cp4 4 context_parallel.size=4"
  "cp2_dp2 4 context_parallel.size=2 gradient_accumulation_steps=1 eval.batches=1"
  "cp2_tp2 4 context_parallel.size=2 tensor_parallel.size=2 tensor_parallel.sequence_parallel=true"
  "cp2_pp2 4 context_parallel.size=2 pipeline.stages=2"
  "cp2_fsdp 2 context_parallel.size=2 strategy=fsdp"
  "cp2_full 2 context_parallel.size=2 activation_checkpointing.policy=full"
  "cp2_sel 2 context_parallel.size=2 activation_checkpointing.policy=selective"
  "u2 2 context_parallel.size=2 context_parallel.mode=ulysses"
  "u2_dp2 4 context_parallel.size=2 context_parallel.mode=ulysses gradient_accumulation_steps=1 eval.batches=1"
  "u2_full 2 context_parallel.size=2 context_parallel.mode=ulysses activation_checkpointing.policy=full"
  "u2_pp2 4 context_parallel.size=2 context_parallel.mode=ulysses pipeline.stages=2")
# (gpt's 4 heads: Ulysses at CP 4 and at TP 2 x CP 2)
G_CASES=("cp2 2 context_parallel.size=2" "cp4 4 context_parallel.size=4"
  "cp2_tp2 4 context_parallel.size=2 tensor_parallel.size=2 tensor_parallel.sequence_parallel=true"
  "cp2_pp2 4 context_parallel.size=2 pipeline.stages=2" "cp2_fsdp 2 context_parallel.size=2 strategy=fsdp"
  "cp2_dp2 4 context_parallel.size=2 gradient_accumulation_steps=1 eval.batches=1"
  "cp2_full 2 context_parallel.size=2 activation_checkpointing.policy=full"
  "u4 4 context_parallel.size=4 context_parallel.mode=ulysses"
  "u2_tp2 4 context_parallel.size=2 context_parallel.mode=ulysses tensor_parallel.size=2")
# (validation: 2 batches of 2 at DP 1, 1 batch per replica at DP 2: the same 4 sequences)
for m in gpt llama; do
  cfg="$DT_TMP/$m.json"
  if ! run "${m}_ref" 1 "$cfg"; then fail "$m: 1 rank" "$(tail -3 "$DT_TMP/${m}_ref.out")"; continue; fi
  if [ $m = gpt ]; then cases=("${G_CASES[@]}"); else cases=("${L_CASES[@]}"); fi
  for c in "${cases[@]}"; do
    set -- $c; name=${m}_$1; np=$2; shift 2
    if run "$name" "$np" "$cfg" "$@" && out=$(same "$name" "${m}_ref"); then
      pass "$m $name ($np ranks: $*) == 1 rank$(tr -d '\n' <<<"$out")"
    else fail "$m $name == 1 rank" "$(tail -3 "$DT_TMP/$name.out"; echo "${out:-}")"; fi
  done
done

# the CUDA device on the emulator (dtrun-emu: kernels/cuda on the CPU): the ring's CUDA
# block kernels and Ulysses over the device's attention, fp32 equal to the emulated 1
# rank, bf16 within its rounding
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}
if [ -x "$EMU" ]; then
  erun() { local name=$1 np=$2; shift 2
    DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "$EMU" --standalone --nproc_per_node "$np" "$DT_TMP/llama.json" \
      device=cuda "$@" log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1; }
  if erun emu_ref 1 bf16.enabled=false && erun emu_cp2 2 bf16.enabled=false context_parallel.size=2 &&
     out=$(same emu_cp2 emu_ref) && erun emu_u2 2 bf16.enabled=false context_parallel.size=2 \
       context_parallel.mode=ulysses && out2=$(same emu_u2 emu_ref)
  then pass "emulated CUDA, fp32: CP 2 ring and Ulysses == 1 rank$(tr -d '\n' <<<"$out$out2")"
  else fail "emulated CUDA CP 2" "$(tail -3 "$DT_TMP/emu_cp2.out" "$DT_TMP/emu_u2.out" 2>/dev/null; echo "${out:-}")"; fi
  if erun emub_ref 1 bf16.enabled=true && erun emub_cp2 2 bf16.enabled=true context_parallel.size=2 &&
     python3 - "$DT_TMP/emub_cp2" "$DT_TMP/emub_ref" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(sys.argv[2] + "/metrics.jsonl")]
d = max(abs(x - y) / y for x, y in zip(a, b))
assert len(a) == len(b) == 6 and d < 2e-3 and a[-1] < a[0], (d, a, b)
print(f"  max relative loss difference {d:.1e}")
PY
  then pass "emulated CUDA, bf16: CP 2 within bf16 rounding of 1 rank"
  else fail "emulated CUDA bf16 CP 2" "$(tail -3 "$DT_TMP/emub_cp2.out")"; fi
else skip "CP on the emulated CUDA device" "no $EMU (the emulator build is not part of SAN runs)"; fi

# the start line names the layout
if grep -q "context parallel 4" "$DT_TMP/llama_cp4.out"; then pass "the start line says context parallel 4"
else fail "start line" "$(grep -m1 'model,' "$DT_TMP/llama_cp4.out")"; fi

# masked packed conversations: the documents cross the chunks of the ring
TOK=tests/fixtures/tok/qwen2/tokenizer.json
if $T "$DTRUN" tokenize --chat --tokenizer $TOK --template tests/fixtures/chat/qwen2.5 \
     tests/fixtures/chat/sft/chat.jsonl -o "$DT_TMP/chat" --val-tokens 400 >"$DT_TMP/tok.out" 2>&1; then
  sed -e "s|\"train\": \"$DT_TMP/d.bin\", \"val_fraction\": 0.1|\"train\": \"$DT_TMP/chat_train_*.bin\", \"val\": \"$DT_TMP/chat_val_*.bin\"|" \
      -e 's/"seq_len": 64,/"seq_len": 128,/' -e 's/"max_position_embeddings": 64/"max_position_embeddings": 128/' \
      -e 's/"vocab_size": 256/"vocab_size": 1000/' "$DT_TMP/llama.json" > "$DT_TMP/chat.json"
  if run chat_ref 1 "$DT_TMP/chat.json" && run chat_cp2 2 "$DT_TMP/chat.json" context_parallel.size=2 &&
     out=$(same chat_cp2 chat_ref) && run chat_cp2dp2 4 "$DT_TMP/chat.json" context_parallel.size=2 \
       gradient_accumulation_steps=1 eval.batches=1 && out2=$(same chat_cp2dp2 chat_ref) &&
     run chat_u2 2 "$DT_TMP/chat.json" context_parallel.size=2 context_parallel.mode=ulysses &&
     out3=$(same chat_u2 chat_ref)
  then pass "masked packed conversations: CP 2, CP 2 x DP 2 and Ulysses CP 2 == 1 rank$(tr -d '\n' <<<"$out$out2$out3")"
  else fail "masked packed conversations at CP 2" "$(tail -3 "$DT_TMP/chat_cp2.out" "$DT_TMP/chat_cp2dp2.out" 2>/dev/null; echo "${out:-}")"; fi
  # LoRA on a frozen Qwen2 (attention biases, tied head) at CP 2 and CP 2 x DP 2
  cat > "$DT_TMP/lora.json" <<JSON
{"model": {"pretrained": "tests/fixtures/chat/sft/base", "seq_len": 128},
 "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "base_dtype": "fp32",
          "target_modules": ["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]},
 "data": {"train": "$DT_TMP/chat_train_*.bin", "val": "$DT_TMP/chat_val_*.bin"},
 "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "train_steps": 6, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "gradient_clipping": 1.0,
 "eval": {"every_steps": 3, "batches": 2}, "threads": 1, "seed": 1, "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
  if run lora_ref 1 "$DT_TMP/lora.json" && run lora_cp2 2 "$DT_TMP/lora.json" context_parallel.size=2 &&
     out=$(same lora_cp2 lora_ref any) && run lora_cp2dp2 4 "$DT_TMP/lora.json" context_parallel.size=2 \
       gradient_accumulation_steps=2 eval.batches=1 && out2=$(same lora_cp2dp2 lora_ref any)
  then pass "LoRA on conversations: CP 2 and CP 2 x DP 2 == 1 rank (adapters)$(tr -d '\n' <<<"$out$out2")"
  else fail "LoRA at CP 2" "$(tail -3 "$DT_TMP/lora_cp2.out" "$DT_TMP/lora_cp2dp2.out" 2>/dev/null; echo "${out:-}")"; fi
else fail "tokenize --chat" "$(tail -3 "$DT_TMP/tok.out")"; fi

# a checkpoint of CP 2 resumed at CP 1 and at CP 4 == the uninterrupted run
resumed_same() { # RUN: steps 4-6 and the final parameters as llama_ref's (1e-5)
  python3 - "$DT_TMP/$1" "$DT_TMP/llama_ref" "$DT_TMP/$1.bin" "$DT_TMP/llama_ref.bin" <<'PY'
import json, sys, numpy as np
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1] + "/metrics.jsonl")}
r = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2] + "/metrics.jsonl")}
assert sorted(b) == [4, 5, 6], sorted(b)
d = max(abs(b[s] - r[s]) / r[s] for s in b)
pa, pb = np.fromfile(sys.argv[3], np.float32), np.fromfile(sys.argv[4], np.float32)
dp = float(np.linalg.norm(pa.astype(np.float64) - pb) / np.linalg.norm(pb))
assert d < 1e-5 and dp < 1e-5, (d, dp)
PY
}
ck="checkpoint.dir=$DT_TMP/ck"
if run ck_a 2 "$DT_TMP/llama.json" context_parallel.size=2 "$ck" checkpoint.every_steps=3 train_steps=3 &&
   run ck_b 1 "$DT_TMP/llama.json" "$ck" checkpoint.resume=auto && grep -q "resum" "$DT_TMP/ck_b.out" &&
   resumed_same ck_b
then pass "a CP 2 checkpoint resumed at CP 1 continues as the uninterrupted run (steps 4-6, parameters)"
else fail "CP 2 checkpoint -> CP 1" "$(tail -3 "$DT_TMP/ck_a.out" "$DT_TMP/ck_b.out")"; fi
# (the same checkpoint: resume reads step 3 again into a new log)
if run ck_c 4 "$DT_TMP/llama.json" context_parallel.size=4 "$ck" checkpoint.resume="$DT_TMP/ck/step_00000003" &&
   resumed_same ck_c
then pass "the CP 2 checkpoint resumed at CP 4 continues as the uninterrupted run"
else fail "CP 2 checkpoint -> CP 4" "$(tail -3 "$DT_TMP/ck_c.out")"; fi

# text data at CP 2: the end-of-run sample runs the whole model on rank 0
python3 -c "
import random; random.seed(1); w = 'the cat sat on a mat and then ran far away from home'.split()
open('$DT_TMP/t.txt', 'w').write('\n'.join(' '.join(random.choice(w) for _ in range(12)) for _ in range(400)))"
if run text_cp2 2 "$DT_TMP/gpt.json" context_parallel.size=2 data.train="$DT_TMP/t.txt" train_steps=2 \
     sample_tokens=24 && grep -q -- "---- sample (24 characters)" "$DT_TMP/text_cp2.out"
then pass "text data at CP 2: trains and prints its end-of-run sample"
else fail "sample at CP 2" "$(tail -4 "$DT_TMP/text_cp2.out")"; fi

# refused before start, naming the key
want "a seq_len CP does not cut in 2C chunks is refused" 2 "context_parallel.size 3: model.seq_len 64 is not a multiple" \
  "$DTRUN" --standalone --nproc_per_node 3 "$DT_TMP/llama.json" context_parallel.size=3
want "CP that does not divide the world is refused" 2 "context_parallel.size" \
  "$DTRUN" --standalone --nproc_per_node 3 "$DT_TMP/llama.json" context_parallel.size=2
want "Ulysses with key/value heads CP does not divide is refused" 2 "context_parallel.mode \"ulysses\" at context_parallel.size 4" \
  "$DTRUN" --standalone --nproc_per_node 4 "$DT_TMP/llama.json" context_parallel.size=4 context_parallel.mode=ulysses
want "CP with hsdp is refused" 2 "context_parallel.size 2 with strategy \"hsdp\"" \
  "$DTRUN" --standalone --nproc_per_node 2 "$DT_TMP/llama.json" context_parallel.size=2 strategy=hsdp
finish
