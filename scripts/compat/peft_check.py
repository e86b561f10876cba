#!/usr/bin/env python3
"""peft_check.py - dtrun's LoRA against PEFT on a tiny random Llama: writes the
fixtures of tests/integration/test_lora.sh (tests/fixtures/lora/, numpy-only checks
in scripts/compat/lora_compare.py) and, given dtrun, checks that PEFT loads the
adapter dtrun exports and computes dtrun's numbers.

Fixture (fixed seeds, fp32, eager attention):
  base/                 config.json + model.safetensors: LlamaForCausalLM, 32 wide,
                        2 layers, 4 heads, 2 key/value heads, vocab 97, untied
  adapter_init/         adapter_config.json + adapter_model.safetensors: PEFT's
                        LoraConfig(r=4, lora_alpha=8, every linear module of the
                        blocks), A as PEFT initialises it, B set to normal(0, 0.05)
                        (PEFT's zero B would leave the adapters out of the forward
                        and A without gradient)
  expected.safetensors  batch_tokens (B*T+1) int32: row b is tokens [b*T, b*T+T]
                        (inputs, then shifted targets), the windows dtrun cuts;
                        loss () fp64: mean cross-entropy at the initial adapter;
                        logits (B*T, V) fp32 at the initial adapter;
                        after.NAME fp32: every adapter tensor after one AdamW step
                        (lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.01) of
                        the adapters only (the base frozen), NAME as PEFT saves it
The script refuses a fixture with a gradient element in (0, 1e-7) in magnitude
(Adam's first step is lr * sign(g) up to eps: rounding could flip a tiny one).

usage:
  peft_check.py [--out DIR]        write the fixtures (default tests/fixtures/lora)
  peft_check.py --check DTRUN      fresh fixtures in a temporary folder; dtrun trains
                                   one step from adapter_init (lora_compare.py's checks),
                                   exports --format peft; PEFT loads that adapter onto
                                   the base: its loss and logits on the batch equal
                                   dtrun's after-step loss (the second step's) within 1e-5;
                                   GPT-2 (Conv1D) with an fp32 and an int8 base the same
                                   way (PEFT on a base quantized as dtrun does)
Needs torch, transformers, peft, safetensors; runs offline.
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
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import hf_compare  # noqa: E402
import lora_compare  # noqa: E402

B, T = 2, 16
R, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.01


def base_model():
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()


def loss_of(model, tokens):
    x = torch.tensor(tokens[:B * T + 1])
    inp = torch.stack([x[b * T:b * T + T] for b in range(B)])
    tgt = torch.stack([x[b * T + 1:b * T + T + 1] for b in range(B)])
    logits = model(input_ids=inp).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1)), logits


def write(out):
    os.makedirs(out, exist_ok=True)
    model = base_model()
    model.save_pretrained(os.path.join(out, "base"), safe_serialization=True)
    torch.manual_seed(2)
    peft_model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(os.path.join(out, "adapter_init"))
    for extra in ("README.md",):  # PEFT's model card: not needed
        if os.path.exists(os.path.join(out, "adapter_init", extra)):
            os.remove(os.path.join(out, "adapter_init", extra))
    # the first batch seed whose gradient has no element in (0, 1e-7) (see above)
    for seed in range(3, 40):
        tokens = torch.randint(0, 97, (B * T + 1,), generator=torch.Generator().manual_seed(seed)).tolist()
        peft_model.zero_grad()
        peft_model.train()
        loss, logits = loss_of(peft_model, tokens)
        params = [p for p in peft_model.parameters() if p.requires_grad]
        loss.backward()
        if not any((((p.grad.abs() > 0) & (p.grad.abs() < 1e-7)).any().item() for p in params)):
            break
    else:
        raise SystemExit("refused: every batch seed gives gradient elements in (0, 1e-7)")
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    opt.step()
    exp = {"batch_tokens": np.array(tokens, dtype=np.int32), "loss": np.array(loss.item(), dtype=np.float64),
           "logits": logits.detach().reshape(B * T, -1).numpy().astype(np.float32)}
    for name, p in peft_model.named_parameters():
        if p.requires_grad:  # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
            exp["after." + name.replace(".default", "")] = p.detach().numpy().astype(np.float32)
    save_file(exp, os.path.join(out, "expected.safetensors"))
    print(f"wrote {out}: loss {loss.item():.6f}, {sum(p.numel() for p in params)} adapter parameters")


def check(dtrun, work):
    fix = os.path.join(work, "fixture")
    write(fix)
    ok = lora_compare.check_fixture(dtrun, fix, os.path.join(work, "run"))
    # PEFT loads dtrun's exported adapter onto the base: the loss it computes on the
    # batch equals the loss dtrun reports at its second step (same batch, adapter after one step).
    exported = os.path.join(work, "run", "peft")
    loss2 = lora_compare.train(dtrun, fix, os.path.join(work, "run2"), steps=2)[0]
    base = AutoModelForCausalLM.from_pretrained(os.path.join(fix, "base"), attn_implementation="eager").float()
    model = PeftModel.from_pretrained(base, exported).eval()
    exp = hf_compare.read_safetensors(os.path.join(fix, "expected.safetensors"))
    with torch.no_grad():
        loss, _ = loss_of(model, [int(v) for v in exp["batch_tokens"]])
    ok = hf_compare.report(abs(loss.item() - loss2) <= 1e-5,
                           "PEFT loads dtrun's exported adapter: its loss equals dtrun's step-2 loss within 1e-5",
                           f"{loss.item():.8f} vs {loss2:.8f}") and ok
    return ok


def check_gpt2(dtrun, work, base_dtype):
    """GPT-2 (tests/fixtures/hf/gpt2; c_attn, c_proj, c_fc, Conv1D): 3 dtrun steps
    from PEFT's init; PEFT loads the step-2 adapter onto the base (for int8, the base
    quantized per output row as dtrun does) and its loss equals dtrun's step-3 loss."""
    fix = os.path.join(ROOT, "tests", "fixtures", "hf", "gpt2")
    os.makedirs(work, exist_ok=True)
    exp = hf_compare.read_safetensors(os.path.join(fix, "expected.safetensors"))
    tokens = [int(v) for v in exp["batch_tokens"]]
    shard = os.path.join(work, "b.bin")
    hf_compare.write_shard(shard, tokens)
    nb, nt = 2, (len(tokens) - 1) // 2
    cfg = {"model": {"pretrained": fix, "seq_len": nt},
           "lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn", "c_proj", "c_fc"], "base_dtype": base_dtype},
           "data": {"train": shard, "val": shard}, "train_micro_batch_size_per_gpu": nb,
           "gradient_accumulation_steps": 1, "train_steps": 3,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}, "scheduler": {"type": "none"},
           "gradient_clipping": 0.0, "steps_per_print": 1, "eval": {"every_steps": 0}, "threads": 1, "device": "cpu",
           "checkpoint": {"dir": os.path.join(work, "ckpt"), "every_steps": 2, "resume": "never"},
           "log": {"dir": os.path.join(work, "log")}}
    with open(os.path.join(work, "c.json"), "w") as f:
        json.dump(cfg, f)
    hf_compare.run([dtrun, "--nproc_per_node", "1", os.path.join(work, "c.json")])
    rows = [json.loads(line) for line in open(os.path.join(work, "log", "metrics.jsonl"))]
    out = os.path.join(work, "peft")
    hf_compare.run([dtrun, "export", os.path.join(work, "ckpt", "step_00000002"), "-o", out, "--format", "peft"])
    base = AutoModelForCausalLM.from_pretrained(fix, attn_implementation="eager").float()
    if base_dtype == "int8":
        with torch.no_grad():
            for n, p in base.named_parameters():
                if p.ndim == 2 and ".h." in n:  # Conv1D (in, out): dtrun's rows are its columns
                    w = p.data.t()
                    sc = w.abs().amax(1, keepdim=True) / 127
                    sc[sc == 0] = 1
                    p.data.copy_((torch.round(w / sc).clamp(-127, 127) * sc).t())
    model = PeftModel.from_pretrained(base, out).eval()
    x = torch.tensor(tokens)
    inp = torch.stack([x[b * nt:b * nt + nt] for b in range(nb)])
    tgt = torch.stack([x[b * nt + 1:b * nt + nt + 1] for b in range(nb)])
    with torch.no_grad():
        lg = model(input_ids=inp).logits
    loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)).item()
    return hf_compare.report(abs(loss - rows[2]["loss"]) <= 1e-5,
                             f"gpt2 {base_dtype} base: PEFT on dtrun's exported adapter gives dtrun's loss within 1e-5",
                             f"{loss:.8f} vs {rows[2]['loss']:.8f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "lora"))
    ap.add_argument("--check", metavar="DTRUN")
    a = ap.parse_args()
    if a.check:
        with tempfile.TemporaryDirectory() as work:
            ok = check(os.path.abspath(a.check), work)
            for bd in ("fp32", "int8"):
                ok = check_gpt2(os.path.abspath(a.check), os.path.join(work, "gpt2_" + bd), bd) and ok
            return 0 if ok else 1
    write(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
