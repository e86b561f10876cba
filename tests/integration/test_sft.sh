#!/usr/bin/env bash
# test_sft.sh - chat fine-tuning through real dtrun processes: `dtrun tokenize --chat`
# renders the committed conversations (tests/fixtures/chat/sft) with a real chat
# template (Qwen2.5's) and writes each shard's loss mask (assistant turns trained,
# one document start per conversation, whole documents per shard); a tiny llama
# trained on them at 1 rank (accumulation 2) equals DP 2, TP 2, PP 2, FSDP 2 and full
# recomputation (losses and final parameters within 1e-5: the loss is the mean over
# the global batch's trained tokens); packed (3 documents in 1 sequence) equals padded
# (1 document per sequence, 3 sequences) step by step; the masked batch's loss and
# gradient norm equal transformers' with labels -100 on the tiny random Llama 3 and
# Qwen2 (scripts/compat/sft_hf.py's committed expectations); LoRA adapters trained on
# the conversations give PEFT's validation loss (scripts/compat/sft_lora_peft.py), fsdp
# 2 ranks equal to 1; bad masks are refused
# naming the file; `dtrun sample --chat` answers.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 90"
TOK=tests/fixtures/tok/qwen2/tokenizer.json
TPL=tests/fixtures/chat/qwen2.5

if $T "$DTRUN" tokenize --chat --tokenizer $TOK --template $TPL tests/fixtures/chat/sft/chat.jsonl \
     -o "$DT_TMP/chat" --val-tokens 400 >"$DT_TMP/tok.out" 2>&1 &&
   python3 - "$DT_TMP" <<'PY'
import glob, json, sys, numpy as np
d = sys.argv[1]
docs = 0
for b in sorted(glob.glob(d + "/chat_*.bin")):
    t = np.fromfile(b, np.uint16)[512:]
    m = np.fromfile(b + ".mask", np.uint8)
    assert list(m[:12].view(np.int32)[:3]) == [20261205, 1, len(t)], "mask header"
    m = m[1024:]
    assert len(m) == len(t) and m[0] & 2, "mask length and first document start"
    docs += int((m & 2).astype(bool).sum())
    assert 0.2 < (m & 1).mean() < 0.8, ("share trained", (m & 1).mean())
    # <|im_start|> (id of the tokenizer's added token) never trained; every trained run ends with <|im_end|> + "\n"
    tok = json.load(open("tests/fixtures/tok/qwen2/tokenizer.json"))
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert not (m[t == ids["<|im_start|>"]] & 1).any(), "an <|im_start|> is trained"
    assert (m[t == ids["<|im_end|>"]] & 1).sum() > 0, "no <|im_end|> trained"
assert docs == 56, docs
PY
then pass "tokenize --chat: 56 conversations, masks beside the shards (assistant turns and their <|im_end|> trained)"
else fail "tokenize --chat" "$(tail -3 "$DT_TMP/tok.out")"; fi

cat > "$DT_TMP/llama.json" <<JSON
{"model": {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 128, "seq_len": 128, "vocab_size": 1000},
 "data": {"train": "$DT_TMP/chat_train_*.bin", "val": "$DT_TMP/chat_val_*.bin"},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_steps": 8, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 4, "batches": 2}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
run() {
  local name=$1 np=$2 cfg=$3; shift 3
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "$DTRUN" --standalone --nproc_per_node "$np" "$cfg" "$@" \
    log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1
}
same() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" "$3" <<'PY'
import json, sys, numpy as np
a, b, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ra = [json.loads(l) for l in open(a + "/metrics.jsonl")]
rb = [json.loads(l) for l in open(b + "/metrics.jsonl")]
la, lb = [r["loss"] for r in ra], [r["loss"] for r in rb]
assert len(la) == len(lb) == n, (len(la), len(lb))
va = [r["val_loss"] for r in ra if r.get("val_loss") is not None]
vb = [r["val_loss"] for r in rb if r.get("val_loss") is not None]
assert len(va) == len(vb), ("validations", va, vb)
dv = max([abs(x - y) / abs(y) for x, y in zip(va, vb)] + [0.0])
assert dv < 1e-5, ("val loss", va, vb)
assert la[-1] < la[0], ("it learns", la)
dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
print(f"  loss {la[0]:.4f} -> {la[-1]:.4f}, max relative loss difference {dl:.2e}, parameters {dp:.2e}"
      + (f", {len(va)} validations {dv:.2e}" if va else ""))
assert dl < 1e-5 and dp < 1e-5, ("loss", dl, "params", dp)
PY
}
if run ref 1 "$DT_TMP/llama.json" && grep -q "documents in .* sequences of 128 positions: .* real tokens (packing efficiency)" "$DT_TMP/ref.out"
then pass "1 rank trains on masked packed data and prints the packing efficiency"
else fail "1 rank on masked data" "$(tail -3 "$DT_TMP/ref.out")"; fi
# (validation: 2 batches of 2 at 1 rank, 1 batch of 2 per replica at DP 2: the same 4 sequences)
for c in "dp 2 gradient_accumulation_steps=1 eval.batches=1" "tp 2 tensor_parallel.size=2" "pp 2 pipeline.stages=2" \
         "fsdp 2 strategy=fsdp gradient_accumulation_steps=1 eval.batches=1" "recompute 1 activation_checkpointing.policy=full"; do
  set -- $c; name=$1; np=$2; shift 2
  if run "$name" "$np" "$DT_TMP/llama.json" "$@" && same "$name" ref 8; then pass "masked $name ($np ranks: $*) == 1 rank"
  else fail "masked $name == 1 rank" "$(tail -3 "$DT_TMP/$name.out")"; fi
done

# packed == padded: three conversations, one packed sequence vs three padded ones
head -3 tests/fixtures/chat/sft/chat.jsonl > "$DT_TMP/three.jsonl"
$T "$DTRUN" tokenize --chat --tokenizer $TOK --template $TPL "$DT_TMP/three.jsonl" -o "$DT_TMP/three" >/dev/null 2>&1
cat > "$DT_TMP/three.json" <<JSON
{"model": {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512, "seq_len": 512,
           "vocab_size": 1000},
 "data": {"train": "$DT_TMP/three_train_*.bin", "val_fraction": 0},
 "train_micro_batch_size_per_gpu": 1, "train_steps": 4, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "eval": {"every_steps": 0}, "threads": 1, "seed": 3,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
if run packed 1 "$DT_TMP/three.json" && grep -q "3 documents in 1 sequences" "$DT_TMP/packed.out" &&
   run padded 1 "$DT_TMP/three.json" data.packing=false train_micro_batch_size_per_gpu=3 &&
   grep -q "3 documents in 3 sequences" "$DT_TMP/padded.out" && same packed padded 4
then pass "packed (3 documents in 1 sequence) == padded (3 sequences): losses and parameters"
else fail "packed == padded" "$(tail -3 "$DT_TMP/packed.out" "$DT_TMP/padded.out")"; fi

if out=$(python3 scripts/compat/sft_hf.py --check "$DTRUN" --no-torch "$DT_TMP/hf" 2>&1) && ! grep -q FAIL <<<"$out"
then pass "masked batch == transformers with labels -100 (llama3, qwen2): $(grep -o 'relative [^)]*' <<<"$out" | tr '\n' ' ')"
else fail "masked batch == transformers" "$out"; fi

# LoRA on the conversations: PEFT's loss at the adapters dtrun trains (committed by
# scripts/compat/sft_lora_peft.py --write, which loads dtrun's PEFT export), fsdp 2 == 1
if out=$(timeout -k 2 120 python3 scripts/compat/sft_lora_peft.py --check "$DTRUN" --no-torch "$DT_TMP/lora" 2>&1) &&
   [ "$(grep -c '^PASS' <<<"$out")" = 3 ] && ! grep -q FAIL <<<"$out"
then pass "lora sft on packed conversations == PEFT's loss, fsdp 2 == 1 rank: $(grep -o '^  (.*' <<<"$out" | tr -d '\n')"
else fail "lora sft" "$(tail -4 <<<"$out")"; fi

# bad masks: refused before start, naming the file
cp "$DT_TMP/three_train_000000.bin" "$DT_TMP/bad_train_000000.bin"
head -c 1100 "$DT_TMP/three_train_000000.bin.mask" > "$DT_TMP/bad_train_000000.bin.mask"
want "a truncated mask is refused naming it" 2 "bad_train_000000.bin.mask" \
  "$DTRUN" --standalone --nproc_per_node 1 "$DT_TMP/three.json" data.train="$DT_TMP/bad_train_*.bin"
cp "$DT_TMP/chat_train_000000.bin" "$DT_TMP/mix_train_000000.bin"; cp "$DT_TMP/chat_train_000000.bin.mask" "$DT_TMP/mix_train_000000.bin.mask"
cp "$DT_TMP/three_train_000000.bin" "$DT_TMP/mix_train_000001.bin"
want "shards with and without masks are refused" 2 "mixes shards with a loss mask and without" \
  "$DTRUN" --standalone --nproc_per_node 1 "$DT_TMP/three.json" data.train="$DT_TMP/mix_train_*.bin"
want "tokenize --mask without --chat is refused" 2 "go with --chat" \
  "$DTRUN" tokenize --tokenizer $TOK --mask last tests/fixtures/chat/sft/chat.jsonl -o "$DT_TMP/x"
want "a conversation without a chat template is refused naming the line" 2 "chat.jsonl:1:" \
  "$DTRUN" tokenize --chat --tokenizer $TOK tests/fixtures/chat/sft/chat.jsonl -o "$DT_TMP/y"

# sample --chat on the trained checkpoint's weights
run ck 1 "$DT_TMP/three.json" checkpoint.dir="$DT_TMP/ckpt" checkpoint.every_steps=4 >/dev/null 2>&1
if out=$($T "$DTRUN" sample "$DT_TMP/ckpt" --tokenizer $TOK --chat --template $TPL --prompt "hello" --tokens 8 \
           --temperature 0 --ids 2>"$DT_TMP/sample.err") && [ -n "$out" ]
then pass "sample --chat renders the conversation and generates ($out)"
else fail "sample --chat" "$(tail -3 "$DT_TMP/sample.err")"; fi
finish
