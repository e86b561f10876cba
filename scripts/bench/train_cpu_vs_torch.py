#!/usr/bin/env python3
"""train_cpu_vs_torch.py - CPU training throughput: dtrun against PyTorch.

Builds the same GPT-2-style model (pre-LN blocks, tanh GELU, tied LM head, vocab 256
padded to 256) in PyTorch (eager, fp32, AdamW) and in dtrun, trains each for a few
steps on the same text with the same micro-batch, and prints tokens/s of both and
the ratio. Needs torch (pip install torch); not part of `make test`.

usage: scripts/bench/train_cpu_vs_torch.py [--threads 1] [--steps 12] [--layers 6]
       [--heads 6] [--dim 384] [--seq 256] [--batch 8]
"""
import argparse, json, math, os, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--heads", type=int, default=6)
ap.add_argument("--dim", type=int, default=384)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--dtrun", default=os.path.join(os.path.dirname(__file__), "..", "..", "dtrun"))
ap.add_argument("--data", default="runs/data/fortunes.txt")
ap.add_argument("--skip-torch", action="store_true")
args = ap.parse_args()


def bench_torch():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    C, T, V, L, H = args.dim, args.seq, 256, args.layers, args.heads

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt import build_gpt
    model = build_gpt(C, T, V, L, H)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(0)
    times = []
    for step in range(args.warmup + args.steps):
        ix = torch.randint(len(data) - T - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix]); y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    return args.batch * T / med, med * 1e3, sum(p.numel() for p in model.parameters())


def bench_dtrun():
    cfg = {
        "model": {"type": "gpt", "n_layer": args.layers, "n_head": args.heads, "n_embd": args.dim,
                  "seq_len": args.seq, "vocab_size": 256},
        "data": {"train": args.data},
        "train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
        "train_steps": args.warmup + args.steps, "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
        "threads": args.threads, "device": "cpu",
    }
    with tempfile.TemporaryDirectory() as d:
        cfg["log"] = {"dir": d}
        path = os.path.join(d, "bench.json")
        json.dump(cfg, open(path, "w"))
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        r = subprocess.run([args.dtrun, "--standalone", "--nproc_per_node", "1", path], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"dtrun failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    ms = sorted(r["step_ms"] for r in rows if r["step"] > args.warmup)
    med = ms[len(ms) // 2]
    return args.batch * args.seq / (med / 1e3), med


print(f"model: n_layer {args.layers}, n_head {args.heads}, d_model {args.dim}, seq {args.seq}, "
      f"micro-batch {args.batch}, vocab 256, fp32, {args.threads} thread(s), median of {args.steps} steps")
dt_tps, dt_ms = bench_dtrun()
print(f"dtrun   : {dt_tps:9.0f} tokens/s  ({dt_ms:7.1f} ms/step)")
if not args.skip_torch:
    th_tps, th_ms, nparams = bench_torch()
    print(f"pytorch : {th_tps:9.0f} tokens/s  ({th_ms:7.1f} ms/step)  [{nparams} params, eager]")
    print(f"ratio dtrun/pytorch: {dt_tps / th_tps:.2f}x")
