#!/usr/bin/env python3
"""block_vs_torch.py - PyTorch eager fp32 reference for tests/helpers/bench_kernels.

Times, on the same shapes: one GPT-2 block forward + backward, and one full training
step (forward, backward, AdamW) of the n_layer-6 GPT (nanoGPT-style model with
F.scaled_dot_product_attention, tied LM head). Prints ms and tokens/s.
usage: block_vs_torch.py [--threads N] [--iters K] [-B 8] [-T 256] [-C 384]
                         [--heads 6] [--layers 6] [--vocab 256]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, C, NH, L):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


CPU_SHARE = []


def timed(fn, iters):
    """Median wall ms of fn; records process CPU time / wall time (per thread)."""
    fn()
    out = []
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    CPU_SHARE.append((time.process_time() - c0) / (time.perf_counter() - w0) / torch.get_num_threads())
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=256)
    ap.add_argument("-C", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    blk = Block(a.C, a.heads)
    x = torch.randn(a.B, a.T, a.C, requires_grad=True)
    dout = torch.randn(a.B, a.T, a.C) * 0.01

    def block_step():
        blk.zero_grad(set_to_none=False)
        blk(x).backward(dout)

    ms_block = timed(block_step, a.iters)

    Vp = (a.vocab + 63) // 64 * 64
    model = GPT(Vp, a.T, a.C, a.heads, a.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    idx = torch.randint(0, a.vocab, (a.B, a.T))

    def train_step():
        opt.zero_grad(set_to_none=False)
        model(idx, idx).backward()
        opt.step()

    ms_step = timed(train_step, a.iters)
    ntok = a.B * a.T
    print(f"torch {torch.__version__} threads={a.threads} B={a.B} T={a.T} C={a.C} "
          f"heads={a.heads} layers={a.layers}")
    print(f"block fwd+bwd   {ms_block:8.2f} ms")
    print(f"model step      {ms_step:8.2f} ms -> {ntok / ms_step * 1e3:.0f} tokens/s")
    print(f"cpu/wall        {min(CPU_SHARE):8.2f} (process CPU time / (wall time * threads))")


if __name__ == "__main__":
    main()
