#!/usr/bin/env python3
"""trace_check.py - the schema check of a dtrun job timeline (log.trace), stdlib only.

usage: trace_check.py LOG_DIR [--ranks N] [--steps A-B]

Checks LOG_DIR/trace.json: a trace-event JSON ({"traceEvents": [...], "displayTimeUnit":
"ms"}); every event well formed (name, ph, and for "X" events ts, dur >= 0, pid, tid, cat,
args.step); a process_name "rank N (host)" per rank and a thread_name per track; spans
properly nested per (pid, tid) track; every op (cat "op") present on each rank of its
communicator with the same sequence number (a collective: the same op and count on each;
a point-to-point channel: one send and one recv); and, for every step of
LOG_DIR/metrics.jsonl the trace holds, rank 0's sums within 5%: its data spans = data_ms,
its comm spans = comm_ms, its step span = step_ms, the step less both = compute_ms.
Prints one line of figures; exits 1 naming the first failure.
"""
import json
import re
import sys
from collections import defaultdict

EPS_US = 0.002  # ts and dur are written to 1 ns: a child's end may pass its parent's by 2 ns


def fail(msg):
    print("trace_check: FAIL: " + msg)
    sys.exit(1)


def main():
    args = sys.argv[1:]
    if not args:
        fail("usage: trace_check.py LOG_DIR [--ranks N] [--steps A-B]")
    d, want_ranks, want_steps = args[0], None, None
    if "--ranks" in args:
        want_ranks = int(args[args.index("--ranks") + 1])
    if "--steps" in args:
        a, b = args[args.index("--steps") + 1].split("-")
        want_steps = set(range(int(a), int(b) + 1))
    try:
        tr = json.load(open(d + "/trace.json"))
    except (OSError, ValueError) as e:
        fail(f"trace.json: {e}")
    if not isinstance(tr, dict) or not isinstance(tr.get("traceEvents"), list):
        fail("no traceEvents list")
    if tr.get("displayTimeUnit") != "ms":
        fail("displayTimeUnit is not ms")
    procs, threads, spans = {}, {}, []
    for i, e in enumerate(tr["traceEvents"]):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e.get("ph") not in ("X", "M"):
            fail(f"event {i}: no name or ph not X/M: {e}")
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            fail(f"event {i}: pid/tid not integers: {e}")
        if e["ph"] == "M":
            if e["name"] == "process_name":
                procs[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        for k in ("ts", "dur"):
            if not isinstance(e.get(k), (int, float)):
                fail(f"event {i}: {k} is not a number: {e}")
        if e["dur"] < 0:
            fail(f"event {i}: dur < 0: {e}")
        if e.get("cat") not in ("step", "data", "compute", "comm", "bubble", "op", "ckpt"):
            fail(f"event {i}: unknown cat: {e}")
        if not isinstance(e.get("args", {}).get("step"), int):
            fail(f"event {i}: args.step missing: {e}")
        spans.append(e)
    ranks = sorted({e["pid"] for e in spans})
    if want_ranks is not None and ranks != list(range(want_ranks)):
        fail(f"ranks {ranks}, wanted 0..{want_ranks - 1}")
    for r in ranks:
        if not re.fullmatch(rf"rank {r} \(.*\)", procs.get(r, "")):
            fail(f"rank {r}: process_name {procs.get(r)!r}")
    # nesting per track
    tracks = defaultdict(list)
    for e in spans:
        tracks[(e["pid"], e["tid"])].append(e)
    for key, evs in tracks.items():
        if key not in threads:
            fail(f"track {key}: no thread_name")
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            end = e["ts"] + e["dur"]
            while stack and e["ts"] >= stack[-1] - EPS_US:
                stack.pop()
            if stack and end > stack[-1] + EPS_US:
                fail(f"track {threads[key]!r} of rank {key[0]}: {e['name']} at {e['ts']} ends at {end}, after its "
                     f"parent's end {stack[-1]}")
            stack.append(end)
    # every op on every rank of its communicator, with the same sequence number
    ops = [e for e in spans if e["cat"] == "op"]
    by_comm = defaultdict(lambda: defaultdict(list))
    for e in ops:
        a = e["args"]
        for k in ("op", "count", "bytes", "dtype", "peer", "comm", "seq", "step"):
            if k not in a:
                fail(f"op {e['name']} on rank {e['pid']}: args.{k} missing")
        by_comm[a["comm"]][a["seq"]].append(e)
    n_checked = 0
    for comm, seqs in by_comm.items():
        members = {e["pid"] for evs in seqs.values() for e in evs}
        p2p = ".p" in comm and all(e["args"]["peer"] >= 0 for evs in seqs.values() for e in evs)
        for seq, evs in seqs.items():
            have = sorted(e["pid"] for e in evs)
            if have != sorted(members):
                fail(f"comm {comm} #{seq} ({evs[0]['name']}): on ranks {have}, its communicator's are "
                     f"{sorted(members)}")
            if p2p:
                if sorted(e["name"] for e in evs) != ["recv", "send"]:
                    fail(f"channel {comm} #{seq}: {[e['name'] for e in evs]}, not one send and one recv")
            elif len({(e["name"], e["args"]["count"]) for e in evs}) != 1:
                fail(f"comm {comm} #{seq}: the ranks ran {[(e['name'], e['args']['count']) for e in evs]}")
            n_checked += 1
    # rank 0's phase sums against metrics.jsonl
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    ph = [e for e in spans if e["pid"] == 0 and threads.get((0, e["tid"])) == "phases"]
    steps = {e["args"]["step"]: e for e in ph if e["cat"] == "step"}
    if want_steps is not None and set(steps) != want_steps:
        fail(f"rank 0's steps {sorted(steps)}, wanted {sorted(want_steps)}")
    compared, worst = 0, 0.0
    for m in rows:
        s = steps.get(m["step"])
        if s is None:
            continue
        lo, hi = s["ts"], s["ts"] + s["dur"]
        inside = [e for e in ph if e["ts"] >= lo - EPS_US and e["ts"] + e["dur"] <= hi + EPS_US]
        data = sum(e["dur"] for e in inside if e["cat"] == "data") / 1e3
        comm = sum(e["dur"] for e in inside if e["cat"] == "comm") / 1e3
        step = s["dur"] / 1e3
        compute = max(0.0, step - data - comm)
        for name, got, want in (("step_ms", step, m["step_ms"]), ("data_ms", data, m["data_ms"]),
                                ("comm_ms", comm, m["comm_ms"]), ("compute_ms", compute, m["compute_ms"])):
            err = abs(got - want)
            if err > 0.05 * abs(want) + 1e-3:
                fail(f"step {m['step']}: the trace's {name} {got:.4f} vs metrics.jsonl's {want:.4f}")
            worst = max(worst, err / max(abs(want), 1e-3))
        compared += 1
    if compared == 0:
        fail("no step of metrics.jsonl is in the trace")
    print(f"trace_check: ok: {len(spans)} spans of {len(ranks)} rank(s) on {len(tracks)} tracks, {n_checked} ops "
          f"matched across ranks, {compared} steps' phase sums within {100 * worst:.2f}% of metrics.jsonl")


if __name__ == "__main__":
    main()
