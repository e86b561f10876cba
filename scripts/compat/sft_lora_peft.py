#!/usr/bin/env python3
"""sft_lora_peft.py - LoRA fine-tuning on conversations, checked against PEFT.

The chain a user runs, end to end:
  1. `dtrun tokenize --chat` renders tests/fixtures/chat/sft/chat.jsonl (56
     conversations) with Qwen2.5's chat template (tests/fixtures/chat/qwen2.5) and the
     tiny tokenizer of tests/fixtures/tok/qwen2: token shards, and beside each its
     loss mask (the assistant turns trained), a validation tail of VAL_TOKENS tokens;
  2. `dtrun` trains LoRA adapters (r 4, alpha 8, the seven linear modules) on a
     frozen tiny random Qwen2 (tests/fixtures/chat/sft/base, vocabulary 1000: the
     tokenizer's) for STEPS steps, packed sequences of T positions, the loss over the
     trained tokens only, and evaluates the whole validation set at the end
     (eval.batches = its sequences, printed in dtrun's data line);
  3. `dtrun export --format peft` writes adapter_config.json + adapter_model.safetensors;
  4. PEFT loads that adapter onto the base (PeftModel.from_pretrained) and computes
     the loss of every validation conversation alone (labels -100 where the mask does
     not train, each conversation cut at T + 1 tokens as dtrun cuts it), summed over
     the trained tokens of all of them / their count: it must equal dtrun's final
     validation loss within 1e-5 (relative). Packing does not change the loss of a
     conversation (block-causal attention, positions restarting), so the conversations
     alone give the packed sequences' loss.
The same run on 2 ranks (fsdp, accumulation halved) must give the same losses,
validation loss and adapters (relative L2) within 1e-5.

usage:
  sft_lora_peft.py --write DTRUN     (torch, transformers, peft) make the base, run the
                                     chain, write tests/fixtures/chat/sft/lora_expected.json
                                     (PEFT's validation loss at dtrun's adapters)
  sft_lora_peft.py --check DTRUN [--no-torch] [WORK]
                                     run the chain; with torch + peft, PEFT's loss at the
                                     exported adapter against dtrun's; always the committed
                                     PEFT loss against dtrun's (numpy only: `make test`,
                                     tests/integration/test_sft.sh) and 2 ranks against 1
"""
import glob
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from hf_compare import read_safetensors, report, run  # noqa: E402

FIX = os.path.join(ROOT, "tests/fixtures/chat/sft")
BASE = os.path.join(FIX, "base")
EXPECTED = os.path.join(FIX, "lora_expected.json")
TOK = os.path.join(ROOT, "tests/fixtures/tok/qwen2/tokenizer.json")
TPL = os.path.join(ROOT, "tests/fixtures/chat/qwen2.5")
T, STEPS, ACCUM, VAL_TOKENS = 128, 10, 4, 1000
R, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL = 1e-5


def make_base():
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(7)
    cfg = Qwen2Config(vocab_size=1000, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32, max_position_embeddings=256,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    shutil.rmtree(BASE, ignore_errors=True)
    model.save_pretrained(BASE, safe_serialization=True)
    for extra in os.listdir(BASE):  # config.json + model.safetensors only
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(BASE, extra))
    print(f"wrote {BASE}")


def tokenize(dtrun, work):
    out = os.path.join(work, "chat")
    run([dtrun, "tokenize", "--chat", "--tokenizer", TOK, "--template", TPL, os.path.join(FIX, "chat.jsonl"),
         "-o", out, "--val-tokens", str(VAL_TOKENS), "--force"])
    return out


def val_sequences(dtrun, work, data):
    """The validation set's packed sequences, from dtrun's data line (a 1-step run)."""
    probe = os.path.join(work, "probe")
    cfg = config(work, data, probe, steps=1, nproc=1, eval_batches=1)
    out = run([dtrun, "--nproc_per_node", "1", write_config(probe, cfg)])
    m = re.search(r"validation: (\d+) sequences", out)
    if not m:
        raise RuntimeError("dtrun's data line does not say the validation sequences:\n" + out[-600:])
    return int(m.group(1))


def config(work, data, run_dir, steps, nproc, eval_batches, strategy="ddp"):
    return {
        "model": {"pretrained": BASE, "seq_len": T},
        "lora": {"r": R, "alpha": ALPHA, "dropout": 0.0, "target_modules": TARGETS, "base_dtype": "fp32"},
        "data": {"train": data + "_train_*.bin", "val": data + "_val_*.bin"},
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ACCUM // nproc, "train_steps": steps,
        "strategy": strategy,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.01}},
        "scheduler": {"type": "none"}, "gradient_clipping": 1.0, "steps_per_print": 1,
        "eval": {"every_steps": steps, "batches": eval_batches}, "threads": 1, "seed": 1, "device": "cpu",
        "checkpoint": {"dir": os.path.join(run_dir, "ckpt"), "every_steps": steps, "resume": "never"},
        "log": {"dir": os.path.join(run_dir, "log")},
    }


def write_config(run_dir, cfg):
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "train.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def train(dtrun, work, data, name, nproc, n_val, strategy="ddp"):
    """Trains, exports the PEFT adapter; returns (metrics rows, adapter dir)."""
    run_dir = os.path.join(work, name)
    if n_val % nproc:
        raise RuntimeError(f"{n_val} validation sequences do not split over {nproc} ranks: change VAL_TOKENS")
    cfg = config(work, data, run_dir, STEPS, nproc, n_val // nproc, strategy)
    run([dtrun, "--nproc_per_node", str(nproc), write_config(run_dir, cfg)])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "log", "metrics.jsonl"))]
    out = os.path.join(run_dir, "peft")
    run([dtrun, "export", os.path.join(run_dir, "ckpt"), "-o", out, "--format", "peft"])
    return rows, out


def val_documents(data):
    """Every validation conversation: (tokens, mask), cut at T + 1 tokens as dtrun cuts."""
    docs = []
    for path in sorted(glob.glob(data + "_val_*.bin")):
        tok = np.fromfile(path, np.uint16)[512:].astype(np.int64)
        mask = np.fromfile(path + ".mask", np.uint8)[1024:]
        starts = list(np.flatnonzero(mask & 2)) + [len(tok)]
        for a, b in zip(starts[:-1], starts[1:]):
            b = min(b, a + T + 1)
            if b - a >= 2:
                docs.append((tok[a:b], mask[a:b]))
    return docs


def peft_loss(adapter, docs):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, adapter).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for tok, mask in docs:
            ids = torch.tensor(tok)[None]
            trained = torch.tensor((mask[1:] & 1).astype(bool))
            logits = model(input_ids=ids[:, :-1]).logits[0].float()
            ce = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            total += float(ce[trained].double().sum())
            count += int(trained.sum())
    return total / count, count


def have_peft():
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def chain(dtrun, work, use_peft):
    """Runs the chain; returns (ok, figures)."""
    data = tokenize(dtrun, work)
    n_val = val_sequences(dtrun, work, data)
    rows, adapter = train(dtrun, work, data, "one", 1, n_val)
    val = rows[-1].get("val_loss")
    losses = [r["loss"] for r in rows]
    ok = report(val is not None and losses[-1] < losses[0],
                f"lora sft: {STEPS} steps on masked packed conversations learn, validation over {n_val} sequences",
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, val {val}")
    fig = {"val_loss_dtrun": val, "val_sequences": n_val, "loss_first": losses[0], "loss_last": losses[-1]}
    docs = val_documents(data)
    fig["val_documents"] = len(docs)
    if use_peft:
        want, count = peft_loss(adapter, docs)
        fig["val_loss_peft"], fig["trained_tokens"] = want, count
        rel = abs(val - want) / abs(want)
        ok = report(rel <= TOL, f"lora sft: PEFT loads the export; its loss on the {len(docs)} validation "
                    f"conversations ({count} trained tokens) equals dtrun's within {TOL:g}",
                    f"{val:.8f} vs PEFT {want:.8f} (relative {rel:.1e})") and ok
    two, adapter2 = train(dtrun, work, data, "two", 2, n_val, strategy="fsdp")
    a, b = read_safetensors(os.path.join(adapter, "adapter_model.safetensors")), \
        read_safetensors(os.path.join(adapter2, "adapter_model.safetensors"))
    if set(a) == set(b):  # relative L2 over every adapter tensor
        va = np.concatenate([a[k].astype(np.float64).ravel() for k in sorted(a)])
        vb = np.concatenate([b[k].astype(np.float64).ravel() for k in sorted(a)])
        dp = float(np.linalg.norm(va - vb) / np.linalg.norm(va))
    else:
        dp = float("inf")
    dl = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(two, rows))
    dv = abs(two[-1]["val_loss"] - val) / abs(val)
    ok = report(len(two) == len(rows) and max(dp, dl, dv) <= TOL,
                "lora sft: fsdp on 2 ranks == 1 rank (losses, validation loss, adapters)",
                f"loss {dl:.1e}, val {dv:.1e}, adapters (relative L2) {dp:.1e}") and ok
    return ok, fig


def main():
    args = sys.argv[1:]
    no_torch = "--no-torch" in args
    if no_torch:
        args.remove("--no-torch")
    mode = args[0] if args else ""
    if mode not in ("--write", "--check") or len(args) < 2:
        print(__doc__.split("usage:")[1].rstrip(), file=sys.stderr)
        return 2
    dtrun = os.path.abspath(args[1])
    work = args[2] if len(args) > 2 else tempfile.mkdtemp(prefix="sft_lora.")
    os.makedirs(work, exist_ok=True)
    if mode == "--write":
        make_base()
        ok, fig = chain(dtrun, work, True)
        if not ok:
            return 1
        fig["made_by"] = "scripts/compat/sft_lora_peft.py --write: PEFT's loss at the adapters dtrun trained"
        with open(EXPECTED, "w") as f:
            json.dump(fig, f, indent=1)
            f.write("\n")
        print(f"wrote {EXPECTED}")
        return 0
    use_peft = have_peft() and not no_torch
    try:
        ok, fig = chain(dtrun, work, use_peft)
    except RuntimeError as e:
        return 0 if report(False, "lora sft chain", str(e)) else 1
    with open(EXPECTED) as f:
        exp = json.load(f)
    rel = abs(fig["val_loss_dtrun"] - exp["val_loss_peft"]) / abs(exp["val_loss_peft"])
    ok = report(rel <= TOL and fig["val_documents"] == exp["val_documents"],
                f"lora sft: dtrun's validation loss equals PEFT's committed one (lora_expected.json) within {TOL:g}",
                f"{fig['val_loss_dtrun']:.8f} vs {exp['val_loss_peft']:.8f} (relative {rel:.1e})") and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
