#!/usr/bin/env python3
"""make_sft_fixture.py - writes tests/fixtures/chat/sft/chat.jsonl: a small chat
fine-tuning set for `make test` (tests/integration/test_sft.sh): conversations of
one to three user/assistant turns, some with a system message, a few prompt/completion
lines, their words drawn from the tokenizer fixtures' documents so that the tiny
tokenizers (tests/fixtures/tok/*) cut them into ordinary tokens. Deterministic.

usage: make_sft_fixture.py [OUT]   (default tests/fixtures/chat/sft/chat.jsonl)
"""
import json
import os
import random
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/fixtures/chat/sft/chat.jsonl")
words = []
for line in open(os.path.join(root, "tests/fixtures/tok/qwen2/docs.jsonl")):
    words += [w for w in json.loads(line)["text"].split() if w.isascii() and "<|" not in w]
rng = random.Random(36)


def sentence(lo, hi):
    return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))


lines = []
for i in range(48):
    msgs = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": "You are a helpful assistant."})
    for _ in range(1 + i % 3):
        msgs.append({"role": "user", "content": sentence(3, 12) + "?"})
        msgs.append({"role": "assistant", "content": sentence(4, 24) + "."})
    lines.append({"messages": msgs})
for i in range(8):
    lines.append({"prompt": sentence(3, 10) + " ->", "completion": " " + sentence(3, 12)})
with open(out, "w") as f:
    for l in lines:
        f.write(json.dumps(l, ensure_ascii=False) + "\n")
print(f"wrote {len(lines)} lines to {out}")
