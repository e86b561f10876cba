"""gpu_torch_gpt2.py - the peer for dtrun's GPU throughput: GPT-2 124M (the same
model as dtrun's trainer, scripts/bench/torch_gpt.py) trained by PyTorch on one
GPU with bf16 autocast, torch.compile and fused AdamW, as llm.c's and nanoGPT's
reference runs do. Prints one JSON line: tokens/s over the timed steps, MFU
against the GPU's dense bf16 peak (same FLOPs per token as dtrun: 6N + attention),
peak memory.

  python3 scripts/bench/gpu_torch_gpt2.py --batch 64 --steps 50 --warmup 10
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import build_gpt  # noqa: E402

PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    C, T, V, L, H = 768, a.seq, 50304, 12, 12  # vocab padded to 50304 as dtrun pads 50257
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    model = build_gpt(C, T, V, L, H).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)
    step_fn = torch.compile(model) if not a.no_compile else model
    x = torch.randint(0, 50257, (a.batch, T), device=dev)
    y = torch.randint(0, 50257, (a.batch, T), device=dev)
    t_compile = time.time()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            torch.cuda.synchronize()
            t_compile = time.time() - t_compile
    torch.cuda.synchronize()
    dt = time.time() - t0
    tok_s = a.batch * T * a.steps / dt
    # FLOPs per token as dtrun's dt_model_flops_per_token (runtime/model/model.c): 6 per
    # parameter except the position embedding, + 12 L T C for attention (llm.c's count).
    flops_tok = 6 * (n_params - T * C) + 12 * L * T * C
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK.items() if k in name), 0)
    print(json.dumps({"name": name, "batch": a.batch, "seq": T, "params": n_params, "tokens_per_s": tok_s,
                      "mfu": tok_s * flops_tok / peak if peak else None, "step_ms": 1e3 * dt / a.steps,
                      "first_step_s": t_compile, "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
                      "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
