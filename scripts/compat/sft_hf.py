#!/usr/bin/env python3
"""sft_hf.py - the loss mask against transformers: a masked batch (labels -100 where
the mask does not train) on the tiny random Llama 3 and Qwen2 of tests/fixtures/hf.

Writes (needs torch + transformers), for each model NAME:
  tests/fixtures/chat/hf_mask/NAME.json  {"tokens", "mask", "seq_len", "loss",
      "grad_norm"}: two documents of seq_len + 1 tokens, each with a prompt of a few
      untrained tokens then trained ones (the mask bytes of `dtrun tokenize --chat`:
      bit 0 trained, bit 1 document start); transformers' loss (its
      ForCausalLMLoss: the mean over the labels that are not -100) and the global norm
      of the gradient of every weight, in float64 from the float32 model.
Checks (--check DTRUN: needs numpy only; tests/integration/test_sft.sh runs the same
check in `make test` through sft_check()): one step of dtrun on those ids and mask
(data.packing on: each document fills its own sequence):
the step's loss and gradient norm equal transformers' within 1e-5 (relative); with
torch present also one AdamW step (lr 1e-3) and every exported weight against torch's
within 1e-5.

usage: sft_hf.py [--write] [--check DTRUN] [--no-torch] [WORK]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from hf_compare import hf_to_export_name, one_step, read_safetensors, report, run, write_shard  # noqa: E402

MODELS = ["llama3", "qwen2"]
T = 16
LR = 1e-3


def fixture_path(name):
    return os.path.join(ROOT, "tests/fixtures/chat/hf_mask", name + ".json")


def make_batch(vocab, seed):
    rng = np.random.default_rng(seed)
    tokens, mask = [], []
    for d, prompt in enumerate([5, 9]):
        ids = rng.integers(0, vocab, size=T + 1)
        tokens += [int(v) for v in ids]
        mask += [2 if k == 0 else (1 if k > prompt else 0) for k in range(T + 1)]
    return tokens, mask


def write(name):
    import torch
    from transformers import AutoModelForCausalLM

    fdir = os.path.join(ROOT, "tests/fixtures/hf", name)
    model = AutoModelForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager")
    model.train()
    vocab = model.config.vocab_size
    tokens, mask = make_batch(vocab, 36 + len(name))
    ids = torch.tensor(tokens, dtype=torch.long).view(2, T + 1)
    m = torch.tensor(mask).view(2, T + 1)
    labels = torch.where((m[:, 1:] & 1) == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    logits = model(input_ids=ids[:, :T]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    gn = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    out = {"model": name, "tokens": tokens, "mask": mask, "seq_len": T, "loss": float(loss), "grad_norm": gn,
           "made_by": "scripts/compat/sft_hf.py with transformers: cross_entropy(ignore_index=-100), mean"}
    os.makedirs(os.path.dirname(fixture_path(name)), exist_ok=True)
    with open(fixture_path(name), "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {fixture_path(name)}: loss {out['loss']:.6f}, grad norm {gn:.6f}")


def write_mask(path, mask):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20261205, 1, len(mask)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(mask, dtype=np.uint8).tobytes())


def dtrun_step(dtrun, name, exp, work, lr):
    shard = os.path.join(work, "batch.bin")
    write_shard(shard, exp["tokens"])
    write_mask(shard + ".mask", exp["mask"])
    return one_step(dtrun, os.path.join(ROOT, "tests/fixtures/hf", name), shard, T, 2, work, lr)


def check(dtrun, name, work):
    with open(fixture_path(name)) as f:
        exp = json.load(f)
    os.makedirs(work, exist_ok=True)
    try:
        row = dtrun_step(dtrun, name, exp, work, LR)
    except RuntimeError as e:
        return report(False, f"{name}: masked batch", str(e))
    dl = abs(row["loss"] - exp["loss"]) / abs(exp["loss"])
    dg = abs(row["grad_norm"] - exp["grad_norm"]) / abs(exp["grad_norm"])
    return report(dl <= 1e-5 and dg <= 1e-5,
                  f"{name}: masked batch: loss and gradient norm equal transformers' (labels -100) within 1e-5",
                  f"loss {row['loss']:.7f} vs {exp['loss']:.7f}, grad norm {row['grad_norm']:.7f} vs "
                  f"{exp['grad_norm']:.7f} (relative {dl:.1e}, {dg:.1e})")


def check_weights(dtrun, name, work):
    """One AdamW step: every exported weight equals torch's (needs torch)."""
    import torch
    from transformers import AutoModelForCausalLM

    with open(fixture_path(name)) as f:
        exp = json.load(f)
    fdir = os.path.join(ROOT, "tests/fixtures/hf", name)
    model = AutoModelForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager")
    vocab = model.config.vocab_size
    ids = torch.tensor(exp["tokens"]).view(2, T + 1)
    m = torch.tensor(exp["mask"]).view(2, T + 1)
    labels = torch.where((m[:, 1:] & 1) == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    loss = torch.nn.functional.cross_entropy(model(input_ids=ids[:, :T]).logits.float().reshape(-1, vocab),
                                             labels.reshape(-1), ignore_index=-100)
    loss.backward()
    opt.step()
    want = {hf_to_export_name(k): v.detach().numpy() for k, v in model.state_dict().items()}
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    dtrun_step(dtrun, name, exp, work, LR)
    export = os.path.join(work, "step1.safetensors")
    run([dtrun, "export", os.path.join(work, "ckpt"), "-o", export])
    got = read_safetensors(export)
    worst, where = 0.0, ""
    for k, w in got.items():
        if k not in want:
            continue
        d = float(np.abs(w.astype(np.float64) - want[k]).max())
        if d > worst:
            worst, where = d, k
    return report(worst <= 1e-5, f"{name}: one masked AdamW step: every weight equals torch's within 1e-5",
                  f"max |diff| {worst:.2e} at {where}")


def main():
    args = sys.argv[1:]
    dtrun = None
    if "--write" in args:
        args.remove("--write")
        for n in MODELS:
            write(n)
    no_torch = "--no-torch" in args
    if no_torch:
        args.remove("--no-torch")
    if "--check" in args:
        i = args.index("--check")
        dtrun = args[i + 1]
        del args[i:i + 2]
    if not dtrun:
        return 0
    work = args[0] if args else tempfile.mkdtemp(prefix="sft_hf.")
    ok = True
    for n in MODELS:
        ok = check(dtrun, n, os.path.join(work, n)) and ok
        try:
            import torch  # noqa: F401
            have_torch = True
        except ImportError:
            have_torch = False
        if have_torch and not no_torch:
            ok = check_weights(dtrun, n, os.path.join(work, n + "_step")) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
