#!/usr/bin/env python3
"""hf_compare.py - checks dtrun against one Hugging Face fixture directory that
scripts/compat/hf_models.py wrote (config.json, model.safetensors and
expected.safetensors: what transformers computed). Needs numpy only, so `make test`
runs it (tests/integration/test_hf_compat.sh) without torch.

Checks, each printed as PASS:/FAIL: (tests/integration/lib.sh's convention):
  logits   `dtrun sample DIR --prompt-ids ... --tokens 0 --logits`: every prompt
           position's logits equal transformers' within 1e-4
  greedy   `dtrun sample DIR --prompt-ids ... --temperature 0 --tokens 24 --ids`: the
           same 24 ids as model.generate(do_sample=False)
  train    one step of `dtrun` from model.pretrained=DIR on a token shard that holds
           exactly the fixture's batch (2 windows of 16+1 tokens at stride 16, both in
           the one micro-batch of 2), AdamW as in torch, constant lr, no clipping:
           the loss within 1e-5, and every weight of the checkpoint (through `dtrun
           export`) equal to the fixture's initial weight + delta within 1e-5 (but
           the elements marked skip.NAME: zero gradient in exact arithmetic)

usage: hf_compare.py DTRUN FIXTURE_DIR WORK_DIR [NAME]
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
          "U16": np.uint16, "U8": np.uint8}
LOGITS_TOL, WEIGHT_TOL, LOSS_TOL = 1e-4, 1e-5, 1e-5


def read_safetensors(path):
    """name -> numpy array (BF16 widened to fp32)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def report(ok, name, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}: {name}{'' if ok or not detail else ': ' + detail}")
    if ok and detail:
        print(f"  ({detail})")
    sys.stdout.flush()
    return ok


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return r.stdout


def dtrun_logits(dtrun, source, prompt):
    """(P, V) logits dtrun prints for every prompt position (--logits, one line each)."""
    out = run([dtrun, "sample", source, "--device", "cpu", "--prompt-ids", ",".join(map(str, prompt)),
               "--tokens", "0", "--logits"])
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return np.array([[float(v) for v in r] for r in rows], dtype=np.float64)


def dtrun_greedy(dtrun, source, prompt, n):
    out = run([dtrun, "sample", source, "--device", "cpu", "--prompt-ids", ",".join(map(str, prompt)),
               "--temperature", "0", "--tokens", str(n), "--ids"])
    return [int(v) for v in out.strip().split(",") if v]


def write_shard(path, tokens):
    """An llm.c token shard (header of 256 int32: magic, version, count; uint16 ids)."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def hf_to_export_name(name):
    """Our export names are Hugging Face's without GPT-2's 'transformer.' prefix."""
    return name[len("transformer."):] if name.startswith("transformer.") else name


def one_step(dtrun, pretrained, shard, T, B, work, lr=1e-3):
    """One AdamW step of dtrun from the HF directory `pretrained` on a token shard (its
    checkpoint in work/ckpt, its log in work/log); returns the step's metrics row."""
    cfg = {
        "model": {"pretrained": os.path.abspath(pretrained), "seq_len": T},
        "data": {"train": shard, "val": shard, "prefetch": 0},
        "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1, "train_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.0}},
        "scheduler": {"type": "none"}, "gradient_clipping": 0.0, "steps_per_print": 1,
        "eval": {"every_steps": 0}, "threads": 1, "seed": 1, "device": "cpu",
        "checkpoint": {"dir": os.path.join(work, "ckpt"), "every_steps": 1, "resume": "never"},
        "log": {"dir": os.path.join(work, "log")},
    }
    path = os.path.join(work, "train.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    run([dtrun, "--nproc_per_node", "1", path])
    return [json.loads(line) for line in open(os.path.join(work, "log", "metrics.jsonl"))][-1]


def train_step(dtrun, fixture, work, exp):
    tokens = exp["batch_tokens"]
    B = 2
    T = (len(tokens) - 1) // B
    shard = os.path.join(work, "batch.bin")
    write_shard(shard, tokens)
    loss = one_step(dtrun, fixture, shard, T, B, work)["loss"]
    export = os.path.join(work, "step1.safetensors")
    run([dtrun, "export", os.path.join(work, "ckpt"), "-o", export])
    return loss, read_safetensors(export)


def check_fixture(dtrun, fixture, work, name=None):
    """Runs the three checks on one fixture; True when all pass."""
    name = name or os.path.basename(os.path.normpath(fixture))
    exp = read_safetensors(os.path.join(fixture, "expected.safetensors"))
    init = read_safetensors(os.path.join(fixture, "model.safetensors"))
    prompt = [int(v) for v in exp["prompt_ids"]]
    ok = True
    try:
        ours = dtrun_logits(dtrun, fixture, prompt)
        want = exp["logits"].astype(np.float64)
        if ours.shape != want.shape:
            ok = report(False, f"{name}: logits", f"shape {ours.shape}, expected {want.shape}") and ok
        else:
            err = float(np.abs(ours - want).max())
            ok = report(err <= LOGITS_TOL, f"{name}: logits equal transformers' within {LOGITS_TOL:g}",
                        f"max |diff| {err:.2e}") and ok
    except RuntimeError as e:
        ok = report(False, f"{name}: logits", str(e))
    try:
        ids = dtrun_greedy(dtrun, fixture, prompt, len(exp["greedy_ids"]))
        want = [int(v) for v in exp["greedy_ids"]]
        ok = report(ids == want, f"{name}: greedy {len(want)} ids equal transformers' generate",
                    f"got {ids}, expected {want}" if ids != want else "") and ok
    except RuntimeError as e:
        ok = report(False, f"{name}: greedy ids", str(e))
    try:
        loss, after = train_step(dtrun, fixture, work, exp)
        want = float(exp["loss"])
        ok = report(abs(loss - want) <= LOSS_TOL, f"{name}: one AdamW step: loss equals torch's within {LOSS_TOL:g}",
                    f"{loss:.8f} vs {want:.8f}") and ok
        worst, where, missing, skipped = 0.0, "", [], 0
        for k, w0 in init.items():
            ek = hf_to_export_name(k)
            if ek not in after:
                missing.append(ek)
                continue
            expect = w0.astype(np.float64) + exp["delta." + k].astype(np.float64)
            got = after[ek].astype(np.float64)
            if got.shape != expect.shape and got.ndim == 2 and got.shape[1] == expect.shape[1] \
                    and got.shape[0] < expect.shape[0]:
                # model.seq_len below n_positions: dtrun has the first seq_len rows of
                # wpe; the rows it lacks saw no gradient in torch either
                if np.any(exp["delta." + k][got.shape[0]:] != 0):
                    missing.append(ek + " (rows beyond seq_len changed in torch)")
                expect = expect[:got.shape[0]]
            if got.shape != expect.shape:
                missing.append(f"{ek} shape {got.shape} vs {expect.shape}")
                continue
            diff = np.abs(got - expect)
            if "skip." + k in exp:  # gradient zero in exact arithmetic (hf_models.py)
                keep = exp["skip." + k][:diff.shape[0]] == 0
                skipped += int((~keep).sum())
                diff = diff[keep]
            e = float(diff.max())
            if e > worst:
                worst, where = e, ek
        ok = report(not missing and worst <= WEIGHT_TOL,
                    f"{name}: one AdamW step: every updated weight equals torch's within {WEIGHT_TOL:g}",
                    (f"missing/mismatched {missing[:4]}; " if missing else "") +
                    f"max |diff| {worst:.2e} at {where}" +
                    (f"; {skipped} elements of zero exact gradient skipped" if skipped else "")) and ok
    except RuntimeError as e:
        ok = report(False, f"{name}: one training step", str(e))
    return ok


def main():
    if len(sys.argv) not in (4, 5):
        print(__doc__.split("usage: ")[1].strip(), file=sys.stderr)
        return 2
    dtrun, fixture, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    return 0 if check_fixture(os.path.abspath(dtrun), fixture, work, sys.argv[4] if len(sys.argv) > 4 else None) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
