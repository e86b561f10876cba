#!/usr/bin/env python3
"""hf_export_check.py - `dtrun export --format hf` against transformers itself.

Trains a tiny model with dtrun on CPU (a GPT and a GQA llama on generated text),
exports the checkpoint with --format hf as one
fp32 file, as fp32 shards (--max-shard-size) and in bf16, and for each directory:
  - transformers.AutoModelForCausalLM.from_pretrained(DIR) loads it with no
    missing, unexpected or mismatched keys;
  - the sharded and bf16 models give the fp32 model's logits (bf16 within its
    rounding);
  - greedy generation in transformers gives dtrun's own greedy text
    (`dtrun sample --temperature 0`) for the same byte prompt;
then model.pretrained=DIR (the HF directory back into dtrun, lr 1e-30) exported
again gives the same tensors.
And the other way: tiny models made by transformers itself and saved with
save_pretrained (GPT2Config; LlamaConfig with GQA and Llama 3 rope_scaling; Qwen2Config
with its q/k/v biases and tied embeddings; MistralConfig), fp32 and bf16, go through
model.pretrained and dtrun's export and come out as the same state dict.

Needs torch and transformers, so it is not part of `make test`:
    python3 scripts/compat/hf_export_check.py [--dtrun ./dtrun] [--gpt-only]
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


def read_st(d):
    """{name: fp32 tensor} of DIR's safetensors (one file or shards)."""
    from safetensors.torch import load_file
    ix = os.path.join(d, "model.safetensors.index.json")
    files = [os.path.join(d, "model.safetensors")]
    if os.path.exists(ix):
        files = sorted({os.path.join(d, f) for f in json.load(open(ix))["weight_map"].values()})
    out = {}
    for f in files:
        out.update({k: v.float() for k, v in load_file(f).items()})
    return out


def check_hf_made(dtrun, tmp, gpt_only):
    T = transformers
    small = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    models = {"gpt2": T.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=2, n_positions=64)}
    if not gpt_only:
        models["llama3"] = T.LlamaConfig(**small, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32})
        models["qwen2"] = T.Qwen2Config(**small, tie_word_embeddings=True, rope_theta=1e6)
        models["mistral"] = T.MistralConfig(**small, sliding_window=None)
    for name, conf in models.items():
        for dtype in (torch.float32, torch.bfloat16):
            d = f"{tmp}/made_{name}_{str(dtype)[6:]}"
            m = T.AutoModelForCausalLM.from_config(conf)
            with torch.no_grad():  # no zeros (biases): the lr 1e-30 step below moves only zeros
                for p in m.parameters():
                    p.normal_(0, 0.05)
            m = m.to(dtype)
            m.save_pretrained(d)
            want = read_st(d)
            cfg = {"model": {"pretrained": d, "seq_len": 32}, "device": "cpu", "threads": 2,
                   "data": {"train": f"{tmp}/text.txt"}, "train_micro_batch_size_per_gpu": 2, "train_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-30, "weight_decay": 0}},
                   "eval": {"every_steps": 0}, "checkpoint": {"dir": d + "_ck", "every_steps": 1, "resume": "never"},
                   "log": {"dir": d + "_log"}}
            with open(d + ".json", "w") as f:
                json.dump(cfg, f)
            run(dtrun, "__worker", d + ".json")
            run(dtrun, "export", d + "_ck", "-o", d + "_out", "--format", "hf", "--dtype", "fp32")
            got = read_st(d + "_out")
            if name == "gpt2":  # ours has seq_len rows of wpe
                want = {k.removeprefix("transformer."): v for k, v in want.items()}
                want["wpe.weight"] = want["wpe.weight"][:32]
            diff = set(want) ^ set(got)
            same = not diff and all(torch.equal(want[k], got[k]) for k in want)
            check(f"{name} saved by transformers ({str(dtype)[6:]}) -> model.pretrained -> export: the same state dict",
                  same, f"names {sorted(diff)[:4]}" if diff else
                  str([k for k in want if not torch.equal(want[k], got[k])][:4]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", default=os.path.join(os.path.dirname(__file__), "../../dtrun"))
    ap.add_argument("--gpt-only", action="store_true", help="skip the llama family")
    a = ap.parse_args()
    dtrun = os.path.abspath(a.dtrun)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        make_text(f"{tmp}/text.txt")
        check_model(dtrun, tmp, "gpt", {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 48,
                                         "vocab_size": 256})
        check_hf_made(dtrun, tmp, a.gpt_only)
        if not a.gpt_only:
            check_model(dtrun, tmp, "llama", {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                                              "num_attention_heads": 4, "num_key_value_heads": 2,
                                              "intermediate_size": 64, "seq_len": 48, "vocab_size": 256,
                                              "max_position_embeddings": 64})
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
