#!/usr/bin/env python3
"""llama_cpu_vs_torch.py - CPU training throughput of a Llama-shaped model: dtrun
against PyTorch eager (transformers' LlamaForCausalLM, its default attention).

The same model in both (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied
head, vocab 256 on text), fp32, AdamW, the same micro-batch and sequence; prints the
median tokens/s of each and the ratio. Needs torch and transformers (pip install
torch transformers); not part of `make test`.

usage: scripts/bench/llama_cpu_vs_torch.py [--threads 1] [--steps 8] [--layers 8]
       [--dim 512] [--heads 8] [--kv-heads 2] [--ffn 1408] [--seq 256] [--batch 8]
"""
import argparse, json, os, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--dim", type=int, default=512)
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--kv-heads", type=int, default=2)
ap.add_argument("--ffn", type=int, default=1408)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--dtrun", default=os.path.join(os.path.dirname(__file__), "..", "..", "dtrun"))
ap.add_argument("--data", default="runs/data/fortunes.txt")
ap.add_argument("--skip-torch", action="store_true")
args = ap.parse_args()
V = 256


def bench_torch():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=args.dim, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(0)
    T = args.seq
    times = []
    for step in range(args.warmup + args.steps):
        ix = torch.randint(len(data) - T - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix])
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    return args.batch * T / med, med * 1e3, sum(p.numel() for p in model.parameters()), \
        model.config._attn_implementation


def bench_dtrun():
    cfg = {
        "model": {"type": "llama", "hidden_size": args.dim, "num_hidden_layers": args.layers,
                  "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
                  "intermediate_size": args.ffn, "seq_len": args.seq, "vocab_size": V,
                  "max_position_embeddings": args.seq},
        "data": {"train": args.data},
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


print(f"llama: {args.layers} layers, hidden {args.dim}, {args.heads} heads, {args.kv_heads} kv heads, "
      f"intermediate {args.ffn}, seq {args.seq}, micro-batch {args.batch}, vocab {V}, fp32, "
      f"{args.threads} thread(s), median of {args.steps} steps")
dt_tps, dt_ms = bench_dtrun()
print(f"dtrun   : {dt_tps:9.0f} tokens/s  ({dt_ms:7.1f} ms/step)")
if not args.skip_torch:
    th_tps, th_ms, nparams, attn = bench_torch()
    print(f"pytorch : {th_tps:9.0f} tokens/s  ({th_ms:7.1f} ms/step)  [{nparams} params, eager, attention {attn}]")
    print(f"ratio dtrun/pytorch: {dt_tps / th_tps:.2f}x")
