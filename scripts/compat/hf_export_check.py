#!/usr/bin/env python3
"""hf_export_check.py - `dtrun export --format hf` against transformers itself.

Trains a tiny model with dtrun on CPU (a GPT on generated text; with --llama also a
llama model, once dtrun has one), exports the checkpoint with --format hf as one
fp32 file, as fp32 shards (--max-shard-size) and in bf16, and for each directory:
  - transformers.AutoModelForCausalLM.from_pretrained(DIR) loads it with no
    missing, unexpected or mismatched keys;
  - the sharded and bf16 models give the fp32 model's logits (bf16 within its
    rounding);
  - greedy generation in transformers gives dtrun's own greedy text
    (`dtrun sample --temperature 0`) for the same byte prompt;
then model.pretrained=DIR (the HF directory back into dtrun, lr 1e-30) exported
again gives the same tensors.

Needs torch and transformers, so it is not part of `make test`:
    /opt/torchvenv/bin/python scripts/compat/hf_export_check.py [--dtrun ./dtrun] [--llama]
Prints PASS/FAIL lines; exits 1 on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

FAILS = 0


def check(name, ok, detail=""):
    global FAILS
    print(("PASS: " if ok else "FAIL: ") + name + ("" if ok else ": " + detail), flush=True)
    FAILS += 0 if ok else 1


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def make_text(path):
    import random
    random.seed(3)
    words = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
    with open(path, "w") as f:
        for _ in range(3000):
            f.write(" ".join(random.choice(words) for _ in range(random.randint(3, 9))) + ".\n")


def load(d):
    m, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True,
                                                                dtype=torch.float32)
    return m.eval(), info


def check_model(dtrun, tmp, name, model_json):
    cfg = {"model": model_json, "data": {"train": f"{tmp}/text.txt", "val_fraction": 0.05},
           "train_micro_batch_size_per_gpu": 8, "train_steps": 80, "steps_per_print": 20,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 2, "seed": 5,
           "eval": {"every_steps": 0}, "device": "cpu",
           "checkpoint": {"dir": f"{tmp}/{name}_ck", "every_steps": 80, "resume": "never"},
           "log": {"dir": f"{tmp}/{name}_run"}}
    with open(f"{tmp}/{name}.json", "w") as f:
        json.dump(cfg, f)
    run(dtrun, "__worker", f"{tmp}/{name}.json")
    ck = f"{tmp}/{name}_ck"
    dirs = {"fp32": f"{tmp}/{name}_hf", "shards": f"{tmp}/{name}_hf_sh", "bf16": f"{tmp}/{name}_hf_bf"}
    run(dtrun, "export", ck, "-o", dirs["fp32"], "--format", "hf")
    run(dtrun, "export", ck, "-o", dirs["shards"], "--format", "hf", "--max-shard-size", "40KB")
    run(dtrun, "export", ck, "-o", dirs["bf16"], "--format", "hf", "--dtype", "bf16")
    check(f"{name}: sharded export has an index",
          os.path.exists(f"{dirs['shards']}/model.safetensors.index.json"))

    prompt = list(b"the quick brown")
    ids = torch.tensor([prompt])
    logits = {}
    for kind, d in dirs.items():
        m, info = load(d)
        bad = {k: v for k, v in info.items() if v}
        check(f"{name} {kind}: from_pretrained loads with no missing/unexpected/mismatched keys", not bad, str(bad))
        with torch.no_grad():
            logits[kind] = m(ids).logits[0]
        if kind == "fp32":
            with torch.no_grad():
                out = m.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)[0, len(prompt):]
            hf_text = bytes(out.tolist()).decode("latin-1")
            ours = run(dtrun, "sample", ck, "--prompt", "the quick brown", "--tokens", "24", "--temperature", "0",
                       "--device", "cpu")
            ours = ours[len("the quick brown"):] if ours.startswith("the quick brown") else ours
            check(f"{name}: transformers' greedy 24 tokens == dtrun sample --temperature 0",
                  hf_text == ours[:len(hf_text)], f"hf {hf_text!r} dtrun {ours!r}")
    d = (logits["shards"] - logits["fp32"]).abs().max().item()
    check(f"{name}: sharded export, same logits", d == 0.0, f"max diff {d}")
    d = (logits["bf16"] - logits["fp32"]).abs().max().item()
    scale = logits["fp32"].abs().max().item()
    check(f"{name}: bf16 export, logits within bf16 rounding ({d:.3g} of {scale:.3g})", d < 0.05 * scale + 0.05)

    # back into dtrun and out again
    cfg["model"] = {"pretrained": dirs["fp32"]}
    cfg["train_steps"] = 1
    cfg["optimizer"]["params"] = {"lr": 1e-30, "weight_decay": 0}
    cfg["checkpoint"] = {"dir": f"{tmp}/{name}_ck2", "every_steps": 1, "resume": "never"}
    with open(f"{tmp}/{name}_rt.json", "w") as f:
        json.dump(cfg, f)
    run(dtrun, "__worker", f"{tmp}/{name}_rt.json")
    run(dtrun, "export", f"{tmp}/{name}_ck2", "-o", f"{tmp}/{name}_hf2", "--format", "hf")
    a = open(f"{dirs['fp32']}/model.safetensors", "rb").read()
    b = open(f"{tmp}/{name}_hf2/model.safetensors", "rb").read()
    check(f"{name}: HF dir -> model.pretrained -> export: the same bytes", a == b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", default=os.path.join(os.path.dirname(__file__), "../../dtrun"))
    ap.add_argument("--llama", action="store_true", help="also a llama model (needs dtrun's llama)")
    a = ap.parse_args()
    dtrun = os.path.abspath(a.dtrun)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        make_text(f"{tmp}/text.txt")
        check_model(dtrun, tmp, "gpt", {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 48,
                                         "vocab_size": 256})
        if a.llama:
            check_model(dtrun, tmp, "llama", {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                                              "num_attention_heads": 4, "num_key_value_heads": 2,
                                              "intermediate_size": 64, "seq_len": 48, "vocab_size": 256,
                                              "max_position_embeddings": 64})
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
