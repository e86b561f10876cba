#!/usr/bin/env python3
"""safetensors_check.py - loads a `dtrun export` file with the safetensors package
(pip install safetensors) and checks it is a Hugging Face GPT-2 state dict: names,
shapes, dtype, Conv1D weights stored (in, out). Then runs GPT-2's forward in plain
torch, treating the weights exactly as transformers' GPT2LMHeadModel does (Conv1D:
y = x @ W + b; lm_head tied to wte), and prints the greedy continuation of a byte
prompt as text, so a test can compare it with `dtrun sample --temperature 0`. When the
transformers package is installed, the file is also loaded into GPT2LMHeadModel
(strict) and its logits compared with ours.

usage: safetensors_check.py FILE.safetensors --n_head H [--prompt TEXT] [--tokens N]
"""
import argparse
import math
import re
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def forward(sd, idx, n_layer, n_head):
    T = idx.shape[1]
    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    C = x.shape[-1]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(n_layer):
        p = f"h.{i}."
        h = torch.nn.functional.layer_norm(x, (C,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], 1e-5)
        qkv = h @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(1, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // n_head)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(1, T, C)
        x = x + y @ sd[p + "attn.c_proj.weight"] + sd[p + "attn.c_proj.bias"]
        h = torch.nn.functional.layer_norm(x, (C,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], 1e-5)
        h = torch.nn.functional.gelu(h @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
    x = torch.nn.functional.layer_norm(x, (C,), sd["ln_f.weight"], sd["ln_f.bias"], 1e-5)
    return x @ sd["wte.weight"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--prompt", default="\n")
    ap.add_argument("--tokens", type=int, default=20)
    a = ap.parse_args()

    with safe_open(a.file, framework="pt") as f:
        meta = f.metadata()
        keys = list(f.keys())
    assert meta.get("format") == "pt", meta
    sd = load_file(a.file)
    assert all(t.dtype == torch.float32 for t in sd.values()), "dtype"
    assert "lm_head.weight" not in sd, "lm_head is tied to wte and not stored"
    n_layer = 1 + max(int(m.group(1)) for k in keys if (m := re.match(r"h\.(\d+)\.", k)))
    V, C = sd["wte.weight"].shape
    T = sd["wpe.weight"].shape[0]
    want = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(n_layer):
        p = f"h.{i}."
        want.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                     p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                     p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                     p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
                     p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    got = {k: tuple(v.shape) for k, v in sd.items()}
    assert got == want, f"names/shapes differ: {set(got.items()) ^ set(want.items())}"
    print(f"ok: {len(sd)} tensors, GPT-2 layout, n_layer {n_layer}, n_embd {C}, vocab {V}, n_positions {T}",
          file=sys.stderr)

    ids = list(a.prompt.encode())[-T:]
    out = []
    with torch.no_grad():
        for _ in range(a.tokens):
            logits = forward(sd, torch.tensor([ids[-T:]]), n_layer, a.n_head)
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            ids.append(tok)
    # The same bytes `dtrun sample --temperature 0 --prompt TEXT` prints.
    text = a.prompt.encode() + bytes(c if c in (9, 10) or c >= 32 else ord("?") for c in out) + b"\n"
    sys.stdout.buffer.write(text)
    sys.stdout.flush()

    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("transformers not installed: GPT2LMHeadModel load skipped", file=sys.stderr)
        return
    cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=n_layer, n_head=a.n_head,
                     activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model = GPT2LMHeadModel(cfg).eval()
    model.transformer.load_state_dict(sd, strict=False)
    x = torch.tensor([list(a.prompt.encode())[-T:]])
    with torch.no_grad():
        diff = (model(x).logits - forward(sd, x, n_layer, a.n_head)).abs().max().item()
    assert diff < 1e-4, diff
    print(f"ok: GPT2LMHeadModel logits match (max diff {diff:.2e})", file=sys.stderr)


if __name__ == "__main__":
    main()
