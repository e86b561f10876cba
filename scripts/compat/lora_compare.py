#!/usr/bin/env python3
"""lora_compare.py - checks dtrun's LoRA against the PEFT fixture that
scripts/compat/peft_check.py wrote (tests/fixtures/lora). numpy only, so `make test`
runs it (tests/integration/test_lora.sh).

Checks, each printed as PASS:/FAIL: (tests/integration/lib.sh's convention):
  loss     one step of `dtrun` with lora (r 4, alpha 8, every linear module, fp32 base
           from base/, adapters from adapter_init/ through lora.init): the loss (the
           forward at the initial adapter) equals PEFT's within 1e-5
  adapter  `dtrun export --format peft` of that step: every lora_A / lora_B equals
           PEFT's after one AdamW step within 1e-5, under PEFT's names, and
           adapter_config.json says r, lora_alpha, target_modules, peft_type LORA

usage: lora_compare.py DTRUN FIXTURE_DIR WORK_DIR
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_compare  # noqa: E402

B, T = 2, 16
TOL = 1e-5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def config(fix, work, steps, lora=None, **over):
    exp = hf_compare.read_safetensors(os.path.join(fix, "expected.safetensors"))
    shard = os.path.join(work, "batch.bin")
    hf_compare.write_shard(shard, [int(v) for v in exp["batch_tokens"]])
    cfg = {
        "model": {"pretrained": os.path.abspath(os.path.join(fix, "base")), "seq_len": T},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": TARGETS, "base_dtype": "fp32",
                 "init": os.path.abspath(os.path.join(fix, "adapter_init"))},
        "data": {"train": shard, "val": shard},
        "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1, "train_steps": steps,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.01}},
        "scheduler": {"type": "none"}, "gradient_clipping": 0.0, "steps_per_print": 1,
        "eval": {"every_steps": 0}, "threads": 1, "seed": 1, "device": "cpu",
        "checkpoint": {"dir": os.path.join(work, "ckpt"), "every_steps": steps, "resume": "never"},
        "log": {"dir": os.path.join(work, "log")},
    }
    cfg["lora"].update(lora or {})
    cfg.update(over)
    return cfg


def train(dtrun, fix, work, steps=1, nproc=1, lora=None, **over):
    """Runs dtrun; returns (last loss, exported PEFT dir)."""
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "train.json")
    with open(path, "w") as f:
        json.dump(config(fix, work, steps, lora, **over), f, indent=1)
    hf_compare.run([dtrun, "--nproc_per_node", str(nproc), path])
    rows = [json.loads(line) for line in open(os.path.join(work, "log", "metrics.jsonl"))]
    out = os.path.join(work, "peft")
    hf_compare.run([dtrun, "export", os.path.join(work, "ckpt"), "-o", out, "--format", "peft"])
    return rows[-1]["loss"], out


def check_fixture(dtrun, fix, work):
    exp = hf_compare.read_safetensors(os.path.join(fix, "expected.safetensors"))
    ok = True
    try:
        loss, out = train(dtrun, fix, work)
    except RuntimeError as e:
        return hf_compare.report(False, "lora: one training step", str(e))
    want = float(exp["loss"])
    ok = hf_compare.report(abs(loss - want) <= TOL, f"lora: forward at PEFT's adapter: loss equals PEFT's within {TOL:g}",
                           f"{loss:.8f} vs {want:.8f}") and ok
    got = hf_compare.read_safetensors(os.path.join(out, "adapter_model.safetensors"))
    worst, where, missing = 0.0, "", []
    for k, v in exp.items():
        if not k.startswith("after."):
            continue
        name = k[len("after."):]
        if name not in got or got[name].shape != v.shape:
            missing.append(name)
            continue
        e = float(np.abs(got[name].astype(np.float64) - v.astype(np.float64)).max())
        if e > worst:
            worst, where = e, name
    extra = [k for k in got if "after." + k not in exp]
    ok = hf_compare.report(not missing and not extra and worst <= TOL,
                           f"lora: one AdamW step: every exported adapter tensor equals PEFT's within {TOL:g}",
                           (f"missing {missing[:3]}; " if missing else "") + (f"extra {extra[:3]}; " if extra else "") +
                           f"max |diff| {worst:.2e} at {where}") and ok
    cfg = json.load(open(os.path.join(out, "adapter_config.json")))
    good = cfg.get("peft_type") == "LORA" and cfg.get("r") == 4 and cfg.get("lora_alpha") == 8 and \
        sorted(cfg.get("target_modules", [])) == sorted(TARGETS)
    ok = hf_compare.report(good, "lora: adapter_config.json names LORA, r, lora_alpha and the targets",
                           json.dumps(cfg)[:300]) and ok
    return ok


def main():
    if len(sys.argv) != 4:
        print(__doc__.split("usage: ")[1].strip(), file=sys.stderr)
        return 2
    dtrun, fix, work = sys.argv[1:4]
    return 0 if check_fixture(os.path.abspath(dtrun), fix, work) else 1


if __name__ == "__main__":
    sys.exit(main())
