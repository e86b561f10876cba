#!/usr/bin/env python3
"""hf_models.py - tiny random models built with transformers, saved as Hugging Face
directories, with what transformers computes on them: the fixtures of dtrun's
compatibility checks (tests/fixtures/hf/, tests/integration/test_hf_compat.sh).

Models (fixed seeds, fp32, eager attention; vocab 97 is not a multiple of 64, so
dtrun's vocabulary padding is exercised):
  llama    LlamaConfig, grouped-query attention (4 heads, 2 key/value heads), untied
  llama3   LlamaConfig with rope_scaling llama3 (original_max_position_embeddings 64,
           so every band of the piecewise rescale is hit), 1 key/value head, theta 5e5
  qwen2    Qwen2Config: q/k/v biases, tied embeddings, theta 1e6
  gpt2     GPT2Config: 32 wide, 2 layers, 4 heads, 32 positions

Each fixture directory holds config.json + model.safetensors (save_pretrained), and
expected.safetensors:
  prompt_ids (P) int32, logits (P, V) fp32   logits of every prompt position
  greedy_ids (24) int32                      model.generate(do_sample=False), no eos
  batch_tokens (B*T+1) int32                 the training batch: row b is tokens
                                             [b*T, b*T+T] (inputs, then shifted targets),
                                             the windows dtrun's data loader cuts
  loss () fp64                               mean cross-entropy over the B*T targets
  delta.NAME fp16                            updated - initial weight after one AdamW
                                             step (lr 1e-3, betas (0.9, 0.95), eps 1e-8,
                                             weight decay 0); fp16 keeps the files small
                                             and the update (about lr) to ~1e-6
  skip.NAME uint8 (same shape)               1 where the gradient is zero in exact
                                             arithmetic (GPT-2's key bias): rounding
                                             noise there makes any step in [-lr, lr]
The script refuses a fixture whose greedy steps have a top-2 logit margin under 1e-3
or whose gradient has an element in (0, 1e-7) in magnitude: Adam's first step is
lr * g / (|g| + eps), which moves by lr * eps * dg / (|g| + eps)^2 for a rounding
difference dg (~1e-8 here): under 1e-5 only when |g| >= ~1e-7. Below, float rounding
could legitimately flip a token or an Adam step and the checks would be flaky.

usage:
  hf_models.py [--out DIR]            write the fixtures (default tests/fixtures/hf)
  hf_models.py --check DTRUN          build the fixtures fresh in a temporary folder and
                                      run dtrun against them (scripts/compat/hf_compare.py)
                                      plus `dtrun export --format hf` -> from_pretrained
Needs torch, transformers and safetensors (pip install torch transformers safetensors); runs offline.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import hf_compare  # noqa: E402

PROMPT = [3, 17, 42, 5, 88, 61, 9, 70]
GEN_TOKENS = 24
B, T = 2, 16
LR, BETAS, EPS = 1e-3, (0.9, 0.95), 1e-8

ROPE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def configs():
    common = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return {
        "llama": (1, LlamaConfig(**common, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5,
                                 max_position_embeddings=64, tie_word_embeddings=False)),
        "llama3": (2, LlamaConfig(**common, num_key_value_heads=1, rope_theta=500000.0, rms_norm_eps=1e-6,
                                  max_position_embeddings=128, rope_scaling=dict(ROPE_LLAMA3),
                                  tie_word_embeddings=False)),
        "qwen2": (3, Qwen2Config(**common, num_key_value_heads=2, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                 max_position_embeddings=64, tie_word_embeddings=True)),
        "gpt2": (4, GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                               eos_token_id=None, tie_word_embeddings=True)),
    }


def randomize(model, seed):
    """Weights far from transformers' tiny init (std 0.02 gives near-uniform logits and
    near-tied argmaxes): norms 1 + N(0, 0.1), biases N(0, 0.1), matrices
    N(0, gain/sqrt(fan_in)), embeddings N(0, 0.5)."""
    g = torch.Generator().manual_seed(seed)
    conv1d = model.config.model_type == "gpt2"
    # With tied embeddings a token's own row dominates its logits unless the blocks
    # outweigh the embedding: greedy would repeat the last prompt token forever.
    gain = 2.5 if model.config.tie_word_embeddings else 0.7
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name or ".ln_" in name:
                p.copy_(1 + 0.1 * z if name.endswith("weight") else 0.1 * z)
            elif p.ndim == 1:
                p.copy_(0.1 * z)
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.copy_(0.5 * z)
            else:
                fan_in = p.shape[0] if conv1d else p.shape[1]
                p.copy_(gain / fan_in ** 0.5 * z)


def structural_zero(model, name):
    """Elements whose gradient is zero in exact arithmetic, so what a float computes
    there is rounding noise (an Adam step of anything in [-lr, lr]): GPT-2's key bias
    (q.(k + b) shifts every score of a query by the same q.b, which softmax ignores).
    None when there are none. Llama's key bias is rotated by RoPE: a real gradient."""
    if model.config.model_type == "gpt2" and name.endswith("attn.c_attn.bias"):
        C = model.config.n_embd
        mask = torch.zeros(3 * C, dtype=torch.bool)
        mask[C:2 * C] = True
        return mask
    return None


def min_grad(model):
    """The smallest nonzero gradient magnitude outside the structural zeros."""
    small = 1.0
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.abs()
        mask = structural_zero(model, name)
        if mask is not None:
            g = g[~mask]
        if (g != 0).any():
            small = min(small, float(g[g != 0].min()))
    return small


def hub_style_config(path):
    """transformers 5 writes rope_theta/rope_scaling as one rope_parameters object;
    published checkpoints (and transformers 4) keep them at the top level. The llama
    fixtures use the published form; tests/integration/test_hf_compat.sh also reads
    one rewritten back into transformers 5's form."""
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters", None)
    if rp is not None:
        cfg["rope_theta"] = rp.get("rope_theta", 10000.0)
        kind = rp.get("rope_type", "default")
        cfg["rope_scaling"] = None if kind == "default" else {k: v for k, v in rp.items() if k != "rope_theta"}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def build(name, out_dir):
    seed, cfg = configs()[name]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize(model, seed)
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    if name != "gpt2":
        hub_style_config(os.path.join(out_dir, "config.json"))
    # The directory must load back as the same model (the config rewrite included).
    back = AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32)
    V = cfg.vocab_size
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        logits = model(prompt).logits[0].float()
        again = back(prompt).logits[0].float()
    assert torch.equal(logits, again), f"{name}: the saved directory loads as a different model"

    gen = model.generate(prompt, do_sample=False, max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS,
                         eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    greedy = gen.sequences[0, len(PROMPT):].tolist()
    assert len(greedy) == GEN_TOKENS
    margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in gen.scores)
    if len(set(greedy)) < 8:
        raise SystemExit(f"{name}: greedy ids {greedy} repeat too much to test anything")
    if margin < 1e-3:
        raise SystemExit(f"{name}: greedy top-2 margin {margin:.2e} < 1e-3: change the seed or prompt")

    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    # The first batch seed whose gradient keeps clear of rounding (see the top).
    for batch_seed in range(100 + seed, 100 + seed + 50 * 1000, 1000):
        gb = torch.Generator().manual_seed(batch_seed)
        tokens = torch.randint(0, V, (B * T + 1,), generator=gb)
        x = torch.stack([tokens[b * T:b * T + T] for b in range(B)])
        y = torch.stack([tokens[b * T + 1:b * T + T + 1] for b in range(B)])
        opt.zero_grad()
        out = model(x).logits
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, V), y.reshape(-1))
        loss.backward()
        small = min_grad(model)
        if small >= 1e-7:
            break
    else:
        raise SystemExit(f"{name}: every batch seed tried has a gradient element under 1e-7")
    opt.step()
    after = model.state_dict()

    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "np") as f:
        saved = list(f.keys())
    exp = {
        "prompt_ids": np.array(PROMPT, dtype=np.int32),
        "logits": logits.numpy().astype(np.float32),
        "greedy_ids": np.array(greedy, dtype=np.int32),
        "batch_tokens": tokens.numpy().astype(np.int32),
        "loss": np.array(loss.item(), dtype=np.float64),
    }
    worst = 0.0
    for k in saved:
        d = (after[k] - before[k]).numpy()
        h = d.astype(np.float16)
        worst = max(worst, float(np.abs(h.astype(np.float64) - d.astype(np.float64)).max()))
        exp["delta." + k] = h
        mask = structural_zero(model, k)
        if mask is not None:
            exp["skip." + k] = mask.numpy().astype(np.uint8)
    assert worst < 2e-6, f"{name}: fp16 deltas lose {worst:.2e}"
    meta = {"model": name, "batch": f"{B}x{T}", "optimizer": f"AdamW lr={LR} betas={BETAS} eps={EPS} wd=0",
            "greedy_margin": f"{margin:.3e}", "min_grad": f"{small:.3e}", "batch_seed": str(batch_seed), "delta_fp16_error": f"{worst:.2e}",
            "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    # one metadata key: the writer's map does not keep the order of several
    save_file(exp, os.path.join(out_dir, "expected.safetensors"), metadata={"info": json.dumps(meta)})
    return meta


def roundtrip_check(dtrun, fixture, work, name):
    """dtrun export --format hf of the trained checkpoint loads in transformers and gives
    the logits dtrun gives for the same checkpoint."""
    ckpt = os.path.join(work, "ckpt")
    out = os.path.join(work, "hf_export")
    r = subprocess.run([dtrun, "export", ckpt, "-o", out, "--format", "hf", "--dtype", "fp32"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return hf_compare.report(False, f"{name}: export --format hf", r.stderr.strip()[-300:])
    try:
        ours = hf_compare.dtrun_logits(dtrun, ckpt, PROMPT)
        model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32)
        with torch.no_grad():
            theirs = model(torch.tensor([PROMPT])).logits[0].float().numpy()
    except Exception as e:  # noqa: BLE001 (any failure of the round trip is its FAIL line)
        return hf_compare.report(False, f"{name}: export --format hf -> from_pretrained", f"{type(e).__name__}: {e}")
    err = float(np.abs(ours - theirs).max())
    return hf_compare.report(err <= 1e-4, f"{name}: export --format hf -> from_pretrained: same logits",
                             f"max |diff| {err:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "hf"))
    ap.add_argument("--check", metavar="DTRUN", help="run dtrun against freshly built fixtures")
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    names = [n for n in configs() if not args.only or n in args.only.split(",")]
    if not args.check:
        for n in names:
            meta = build(n, os.path.join(args.out, n))
            print(n, " ".join(f"{k}={v}" for k, v in meta.items() if k != "model"))
        return 0
    fails = 0
    with tempfile.TemporaryDirectory(prefix="hf_models.") as tmp:
        for n in names:
            fix = os.path.join(tmp, "fixtures", n)
            build(n, fix)
            work = os.path.join(tmp, "work", n)
            os.makedirs(work)
            ok = hf_compare.check_fixture(os.path.abspath(args.check), fix, work, n)
            ok = roundtrip_check(os.path.abspath(args.check), fix, work, n) and ok
            fails += not ok
    print(f"hf_models --check: {len(names) - fails}/{len(names)} models pass")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
