#!/usr/bin/env bash
# lora_cpu.sh - LoRA r=16 (every linear module) against full fine-tuning on a
# Llama-shaped CPU model: trainable parameters, model-state bytes (summary.json's
# expected, which `dtrun plan --lora-r` prints too) and tokens/s (the mean of
# metrics.jsonl's tokens_per_s past the first 3 steps). The base is the model after a
# few full steps, exported as a Hugging Face directory (LoRA needs model.pretrained).
# usage: scripts/bench/lora_cpu.sh [DTRUN] [WORK]   (env: HIDDEN LAYERS STEPS THREADS)
set -euo pipefail
DTRUN=${1:-$PWD/dtrun}
W=${2:-$(mktemp -d /tmp/dtrun-lora-bench.XXXXXX)}
HIDDEN=${HIDDEN:-512} LAYERS=${LAYERS:-8} STEPS=${STEPS:-12} THREADS=${THREADS:-2}
mkdir -p "$W"
python3 - "$W/text.txt" <<'PY'
import random, sys
random.seed(1)
words = ["the", "model", "adapter", "frozen", "base", "rank", "low", "train", "step", "loss", "of", "a", "and"]
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(400000)))
PY
cfg() { # name, extra JSON merged into the config
  python3 - "$W/$1.json" "$W" "$HIDDEN" "$LAYERS" "$STEPS" "$THREADS" "$2" <<'PY'
import json, sys
path, w, hidden, layers, steps, threads, extra = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7]), sys.argv[7]
c = {"model": {"type": "llama", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
               "num_key_value_heads": hidden // 128, "intermediate_size": hidden * 8 // 3 // 64 * 64,
               "max_position_embeddings": 256, "seq_len": 256, "vocab_size": 256},
     "data": {"train": w + "/text.txt"}, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
     "train_steps": steps, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "scheduler": {"type": "none"},
     "steps_per_print": 1, "eval": {"every_steps": 0}, "threads": threads, "device": "cpu",
     "checkpoint": {"dir": w + "/ckpt_" + path.split("/")[-1][:-5], "every_steps": 0, "resume": "never", "overwrite": True},
     "log": {"dir": w + "/log_" + path.split("/")[-1][:-5]}}
for k, v in json.loads(extra).items():
    if isinstance(v, dict) and isinstance(c.get(k), dict): c[k].update(v)
    else: c[k] = v
json.dump(c, open(path, "w"), indent=1)
PY
}
cfg full '{"checkpoint": {"every_steps": 1000000}}'
"$DTRUN" --nproc_per_node 1 "$W/full.json" >"$W/full.out" 2>&1
"$DTRUN" export "$W/ckpt_full" -o "$W/base" --format hf >/dev/null
TARGETS='["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]'
for bd in fp32 int8; do
  cfg lora_$bd "{\"model\": {\"pretrained\": \"$W/base\", \"type\": null, \"hidden_size\": null, \"num_hidden_layers\": null, \"num_attention_heads\": null, \"num_key_value_heads\": null, \"intermediate_size\": null, \"max_position_embeddings\": null, \"vocab_size\": null}, \"lora\": {\"r\": 16, \"alpha\": 32, \"target_modules\": $TARGETS, \"base_dtype\": \"$bd\"}}"
  python3 - "$W/lora_$bd.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"] = {k: v for k, v in c["model"].items() if v is not None}
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
  "$DTRUN" --nproc_per_node 1 "$W/lora_$bd.json" >"$W/lora_$bd.out" 2>&1
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
print(f"{'run':<12} {'trainable':>12} {'model-state B':>14} {'tokens/s':>10}")
for name in ("full", "lora_fp32", "lora_int8"):
    rows = [json.loads(l) for l in open(f"{w}/log_{name}/metrics.jsonl")]
    s = json.load(open(f"{w}/log_{name}/summary.json"))
    s = s.get("memory", s)
    ms = s["ranks"][0]["model_state_bytes"]["expected"]
    tps = [r["tokens_per_s"] for r in rows[3:]]
    out = open(f"{w}/{name}.out").read()
    import re
    m = re.search(r"(\d+) trainable parameters", out)
    trainable = int(m.group(1)) if m else ms // 16
    print(f"{name:<12} {trainable:>12} {int(ms):>14} {sum(tps) / len(tps):>10.0f}")
PY
