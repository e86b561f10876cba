#!/usr/bin/env python3
"""chat_tokenize_vs_hf.py - tokens/s of `dtrun tokenize --chat` against transformers'
apply_chat_template(tokenize=True) (with `tokenizers` underneath) on the same
conversations: the committed chat set (tests/fixtures/chat/sft) repeated N times, the
repo's Qwen2-style tokenizer and the Qwen2.5 template. Checks that both give the same
ids, then prints one row with the ratio. Needs transformers.

usage: chat_tokenize_vs_hf.py DTRUN [REPEAT (default 200)] [JOBS (default 1)]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from transformers import PreTrainedTokenizerFast

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
dtrun, rep = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
jobs = sys.argv[3] if len(sys.argv) > 3 else "1"
tok_path = os.path.join(root, "tests/fixtures/tok/qwen2/tokenizer.json")
tpl = os.path.join(root, "tests/fixtures/chat/qwen2.5")
cfg = json.load(open(os.path.join(tpl, "tokenizer_config.json")))
convs = [json.loads(l)["messages"] for l in open(os.path.join(root, "tests/fixtures/chat/sft/chat.jsonl"))
         if "messages" in l]
work = tempfile.mkdtemp(prefix="chatbench.")
inp = os.path.join(work, "in.jsonl")
with open(inp, "w") as f:
    for _ in range(rep):
        for c in convs:
            f.write(json.dumps({"messages": c}) + "\n")
n_conv = rep * len(convs)

hf = PreTrainedTokenizerFast(tokenizer_file=tok_path)
hf.chat_template = cfg["chat_template"]
t0 = time.perf_counter()
ids = [hf.apply_chat_template(c, tokenize=True) for _ in range(rep) for c in convs]
hf_s = time.perf_counter() - t0
ids = [i["input_ids"] if isinstance(i, dict) or hasattr(i, "keys") else i for i in ids]
n_tok = sum(len(i) for i in ids)

t0 = time.perf_counter()
subprocess.run([dtrun, "tokenize", "--chat", "--tokenizer", tok_path, "--template", tpl, inp, "-o",
                os.path.join(work, "out"), "--jobs", jobs], check=True, capture_output=True)
dt_s = time.perf_counter() - t0
got = np.fromfile(os.path.join(work, "out_train_000000.bin"), np.uint16)[512:]
want = np.concatenate([np.asarray(i) for i in ids])
assert np.array_equal(got, want), "ids differ from apply_chat_template's"
print(f"{n_conv} conversations, {n_tok} tokens, same ids: transformers apply_chat_template "
      f"{n_tok / hf_s / 1e3:.1f}k tokens/s, dtrun tokenize --chat (jobs {jobs}, whole process) "
      f"{n_tok / dt_s / 1e3:.1f}k tokens/s, ratio {hf_s / dt_s:.1f}x")
