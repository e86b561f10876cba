#!/usr/bin/env python3
"""train_cpu_vs_torch.py - CPU training throughput: dtrun against PyTorch eager.

Builds the same model in PyTorch (fp32, AdamW) and in dtrun, trains each for a few
steps on the same text with the same micro-batch, and prints the median tokens/s of
both and the ratio. Needs torch (and transformers for --model llama); not part of
`make test`.
  --model gpt:   GPT-2 style (pre-LN blocks, tanh GELU, tied head; scripts/bench/torch_gpt.py)
  --model llama: transformers' LlamaForCausalLM with its default attention (RMSNorm,
                 RoPE, SwiGLU, grouped-query attention --kv-heads, untied head)
Vocabulary 256 (bytes of the text) for both.

usage: scripts/bench/train_cpu_vs_torch.py [--model gpt|llama] [--threads 1] [--steps 12]
       [--layers L] [--heads H] [--dim D] [--seq 256] [--batch 8] [--kv-heads K] [--ffn I]
  defaults: gpt 6 layers, 6 heads, dim 384; llama 8 layers, 8 heads (2 kv), dim 512, ffn 1408
"""
import argparse, json, os, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--layers", type=int)
ap.add_argument("--heads", type=int)
ap.add_argument("--dim", type=int)
ap.add_argument("--kv-heads", type=int, default=2)
ap.add_argument("--ffn", type=int, default=1408)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--dtrun", default=os.path.join(os.path.dirname(__file__), "..", "..", "dtrun"))
ap.add_argument("--data", default="runs/data/fortunes.txt")
ap.add_argument("--skip-torch", action="store_true")
args = ap.parse_args()
llama = args.model == "llama"
for k, g, l in (("layers", 6, 8), ("heads", 6, 8), ("dim", 384, 512)):
    if getattr(args, k) is None:
        setattr(args, k, l if llama else g)
V = 256


def torch_model():
    if llama:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=V, hidden_size=args.dim, intermediate_size=args.ffn,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq,
                          tie_word_embeddings=False)
        m = LlamaForCausalLM(cfg).float().train()
        return m, lambda x, y: m(input_ids=x, labels=x).loss, f"attention {m.config._attn_implementation}"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt import build_gpt
    m = build_gpt(args.dim, args.seq, V, args.layers, args.heads)
    return m, m, "torch_gpt.py"


def bench_torch():
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, loss_fn, what = torch_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(0)
    T, times = args.seq, []
    for step in range(args.warmup + args.steps):
        ix = torch.randint(len(data) - T - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix]); y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        t0 = time.perf_counter()
        loss = loss_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    return args.batch * T / med, med * 1e3, sum(p.numel() for p in model.parameters()), what


def bench_dtrun():
    if llama:
        model = {"type": "llama", "hidden_size": args.dim, "num_hidden_layers": args.layers,
                 "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
                 "intermediate_size": args.ffn, "max_position_embeddings": args.seq}
    else:
        model = {"type": "gpt", "n_layer": args.layers, "n_head": args.heads, "n_embd": args.dim}
    model.update({"seq_len": args.seq, "vocab_size": V})
    cfg = {
        "model": model, "data": {"train": args.data},
        "train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
        "train_steps": args.warmup + args.steps, "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
        "eval": {"every_steps": 0}, "checkpoint": {"every_steps": 0, "resume": "never"},
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
    ms = sorted(r["step_ms"] for r in rows if "step_ms" in r and r["step"] > args.warmup)
    med = ms[len(ms) // 2]
    return args.batch * args.seq / (med / 1e3), med


shape = f"{args.layers} layers, {args.heads} heads" + (f" ({args.kv_heads} kv), ffn {args.ffn}" if llama else "")
print(f"{args.model}: {shape}, dim {args.dim}, seq {args.seq}, micro-batch {args.batch}, vocab {V}, fp32, "
      f"{args.threads} thread(s), median of {args.steps} steps")
dt_tps, dt_ms = bench_dtrun()
print(f"dtrun   : {dt_tps:9.0f} tokens/s  ({dt_ms:7.1f} ms/step)")
if not args.skip_torch:
    th_tps, th_ms, nparams, what = bench_torch()
    print(f"pytorch : {th_tps:9.0f} tokens/s  ({th_ms:7.1f} ms/step)  [{nparams} params, eager, {what}]")
    print(f"ratio dtrun/pytorch: {dt_tps / th_tps:.2f}x")
