#!/usr/bin/env python3
"""TensorBoard's own reader against dtrun's event files (issue 37's check).

  python3 scripts/compat/tensorboard_check.py [./dtrun]      (pip install tensorboard)

Runs dtrun (2 ranks, a small GPT on generated text) and reads its event files with
tensorboard's EventAccumulator, the reader TensorBoard's server is built on:
  live     while the run goes on (rank 0 slowed by DTRUN_TEST_SLOW_RANK), every step
           metrics.jsonl holds is already in the event file, with the same values;
  restart  rank 1 SIGKILLed at step 17 and the group restarted by --max_restarts from
           the step-10 checkpoint: one curve per tag, each step once, every tag equal
           to metrics.jsonl (float32), every metrics.jsonl figure present;
  resumed  the finished run continued to 40 steps by a second launch (resume auto);
  config   the text "config" is the run's config.json.
Prints one line per check and exits 1 when one fails.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from tensorboard.backend.event_processing import event_accumulator as ea

DTRUN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "./dtrun")
failed = 0


def report(ok, name, detail=""):
    global failed
    print(("ok:   " if ok else "FAIL: ") + name + ("" if ok else ": " + detail))
    failed += 0 if ok else 1


def accumulate(d):
    acc = ea.EventAccumulator(d, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def expected(rows):
    """metrics.jsonl's figures as (tag, step) -> value, tags as dtrun names them."""
    out = {}
    for r in rows:
        for k, v in r.items():
            if k == "step" or v is None:
                continue
            if isinstance(v, list):
                for i, x in enumerate(v):
                    out[("%s/rank_%d" % (k, i), r["step"])] = x
            else:
                out[(k, r["step"])] = v
    return out


def compare(acc, rows, exact_steps=True):
    """'' when every scalar equals metrics.jsonl's figure and vice versa, else why."""
    want = expected(rows)
    got = {}
    for tag in acc.Tags()["scalars"]:
        key = tag if tag.split("/")[-1].startswith("rank_") else tag.split("/", 1)[1]
        steps = [e.step for e in acc.Scalars(tag)]
        if len(set(steps)) != len(steps):
            return "%s repeats steps %s" % (tag, steps)
        for e in acc.Scalars(tag):
            got[(key, e.step)] = e.value
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing:
        return "not in the event files: %s" % missing[:5]
    if extra and exact_steps:
        return "not in metrics.jsonl: %s" % extra[:5]
    for k, v in want.items():
        if not math.isclose(got[k], v, rel_tol=1e-6, abs_tol=1e-30):
            return "%s at step %d: %r in the event file, %r in metrics.jsonl" % (k[0], k[1], got[k], v)
    return ""


def rows_of(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    tmp = tempfile.mkdtemp(prefix="dt_tbcheck_")
    text = os.path.join(tmp, "text.txt")
    words = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
    import random
    random.seed(1)
    with open(text, "w") as f:
        for _ in range(3000):
            f.write(" ".join(random.choice(words) for _ in range(random.randint(3, 9))) + ".\n")
    cfg = {"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
           "data": {"train": text, "val_fraction": 0.05}, "train_micro_batch_size_per_gpu": 4,
           "train_steps": 30, "steps_per_print": 1, "threads": 1, "seed": 5,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "eval": {"every_steps": 10, "batches": 2},
           "checkpoint": {"dir": os.path.join(tmp, "ck"), "every_steps": 10, "resume": "auto"},
           "tensorboard": {"enabled": True}, "log": {"dir": os.path.join(tmp, "run")}}
    path = os.path.join(tmp, "g.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    tb = os.path.join(tmp, "run", "tensorboard")

    # live: read while rank 0 sleeps 100 ms a step
    env = dict(os.environ, DTRUN_TEST_SLOW_RANK="0:100")
    live_dir = os.path.join(tmp, "live")
    p = subprocess.Popen([DTRUN, "--nproc_per_node", "2", path, "log.dir=" + live_dir,
                          "checkpoint.dir=" + os.path.join(tmp, "ck_live")],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    why = "no metrics row within 60 s"
    for _ in range(600):
        time.sleep(0.1)
        try:
            rows = rows_of(live_dir)
        except OSError:
            continue
        if len(rows) >= 5 and p.poll() is None:
            acc = accumulate(os.path.join(live_dir, "tensorboard"))
            rows_then = rows_of(live_dir)
            steps = {e.step for e in acc.Scalars("train/loss")}
            # every row written before the read is in the file; one written meanwhile may be too
            why = compare(acc, [r for r in rows_then if r["step"] in steps], exact_steps=True)
            if not why and not {r["step"] for r in rows} <= steps:
                why = "steps %s in metrics.jsonl, %s in the event file" % (sorted(r["step"] for r in rows), sorted(steps))
            still = p.poll() is None
            if not why and not still:
                why = "the run ended before the read: not live"
            break
    p.wait()
    report(not why, "live: EventAccumulator reads every logged step while the run goes on", why)

    # restart
    env = dict(os.environ, DTRUN_FAULT_KILL_STEP="17", DTRUN_FAULT_KILL_RANK="1")
    r = subprocess.run([DTRUN, "--nproc_per_node", "2", "--max_restarts", "1", path], env=env,
                       capture_output=True, text=True)
    files = sorted(f for f in os.listdir(tb) if "tfevents" in f) if os.path.isdir(tb) else []
    why = "exit %d" % r.returncode if r.returncode else ("%d event files, want 2" % len(files) if len(files) != 2 else "")
    if not why:
        why = compare(accumulate(tb), rows_of(os.path.join(tmp, "run")))
    report(not why, "restart: rank 1 killed at step 17, restarted from step 10: one curve, equal to metrics.jsonl", why)

    # resumed by a second launch to 40 steps
    r = subprocess.run([DTRUN, "--nproc_per_node", "2", path, "train_steps=40"], capture_output=True, text=True)
    acc = accumulate(tb)
    why = "exit %d" % r.returncode if r.returncode else compare(acc, rows_of(os.path.join(tmp, "run")))
    if not why and [e.step for e in acc.Scalars("train/loss")] != list(range(1, 41)):
        why = "steps %s" % [e.step for e in acc.Scalars("train/loss")]
    report(not why, "resumed: a second launch to 40 steps continues the same curves (steps 1..40 once)", why)

    # config text
    texts = acc.Tensors("config") if "config" in acc.Tags().get("tensors", []) else []
    why = "no text 'config'" if not texts else ""
    if texts:
        md = texts[-1].tensor_proto.string_val[0].decode()
        body = "\n".join(l[4:] for l in md.split("\n"))
        with open(os.path.join(tmp, "run", "config.json")) as f:
            on_disk = json.load(f)
        if json.loads(body) != on_disk:
            why = "the text differs from config.json"
    report(not why, "config: the text 'config' is the run's config.json", why)
    print("%d checks failed" % failed if failed else "all checks passed", "(%s)" % tmp)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
