#!/usr/bin/env python3
"""tokenize_vs_hf.py - tokens/s of dtrun's tokenizer against Hugging Face
`tokenizers` at 1 thread, same tokenizer, same text.

Trains a byte-level BPE tokenizer (GPT-2 pre-tokenizer by default, or --kind
llama3|qwen2|mistral as in scripts/compat/tokenizer_check.py) with --vocab tokens on
the demo corpus, then encodes every non-empty line of the corpus (--repeat times):
tokenizers with encode_batch under RAYON_NUM_THREADS=1, dtrun through
build/tests/helpers/tok_encode --bench (documents parsed before the clock starts).
Prints both rates and their ratio; the token totals must agree.

Run (a Python with torch/tokenizers installed): python3 scripts/bench/tokenize_vs_hf.py [--kind gpt2] [--vocab 8000]
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts", "compat"))
import tokenizer_check  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "runs/data/fortunes.txt"))
    ap.add_argument("--kind", default="gpt2", choices=["gpt2", "llama3", "qwen2", "mistral"])
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--helper", default=os.path.join(ROOT, "build/tests/helpers/tok_encode"))
    args = ap.parse_args()
    if not os.path.exists(args.corpus):
        subprocess.run([os.path.join(ROOT, "scripts/prepare_demo_data.sh")], check=True)
    subprocess.run(["make", "-s", "-C", ROOT, "-j2", "build/tests/helpers/tok_encode"], check=True)
    text = open(args.corpus, encoding="utf-8", errors="replace").read()
    lines = [l for l in text.split("\n") if l.strip()] * args.repeat
    tok, _ = tokenizer_check.train(args.kind, lines[:50000], args.vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tp, dp = os.path.join(tmp, "tokenizer.json"), os.path.join(tmp, "docs.jsonl")
        tok.save(tp)
        with open(dp, "w", encoding="utf-8") as f:
            for l in lines:
                f.write(json.dumps({"text": l}, ensure_ascii=False) + "\n")
        tok.encode_batch(lines[:1000], add_special_tokens=False)  # warm up
        t0 = time.perf_counter()
        enc = tok.encode_batch(lines, add_special_tokens=False)
        hf_s = time.perf_counter() - t0
        hf_tokens = sum(len(e.ids) for e in enc)
        best = None
        for _ in range(3):
            out = subprocess.run([args.helper, tp, dp, "--bench"], capture_output=True, text=True, check=True).stdout
            ndocs, ntok, secs = out.split()
            best = float(secs) if best is None else min(best, float(secs))
        dt_tokens = int(ntok)
    if dt_tokens != hf_tokens:
        sys.exit("tokenize_vs_hf: token totals differ: dtrun %d, tokenizers %d" % (dt_tokens, hf_tokens))
    mb = len(text.encode()) * args.repeat / 1e6
    print("%s BPE, vocab %d, %d lines, %.1f MB, %d tokens (1 thread)" % (args.kind, args.vocab, len(lines), mb,
                                                                         hf_tokens))
    print("tokenizers: %.2f s  %.2f M tokens/s" % (hf_s, hf_tokens / hf_s / 1e6))
    print("dtrun:      %.2f s  %.2f M tokens/s" % (best, dt_tokens / best / 1e6))
    print("dtrun / tokenizers: %.2fx" % (hf_s / best))


if __name__ == "__main__":
    main()
