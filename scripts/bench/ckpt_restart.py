#!/usr/bin/env python3
"""ckpt_restart.py - time from a worker's death to training steps resuming.

Runs `dtrun --nproc_per_node N --max_restarts 1 CONFIG` with DTRUN_FAULT_KILL_STEP=K
(the worker logs a line and SIGKILLs itself after step K), timestamps every output
line as it arrives, and reports: death -> agent notices, -> restarted worker resumes
from the checkpoint (its "resumed from" line, with load time), -> first step line
after the restart; and how the survivors of the first group stopped (the agent's
group-failure stop, a collective's error, a preemption save attempt). usage: ckpt_restart.py CONFIG KILL_STEP [NPROC] [KEY=VALUE ...]
"""
import os
import re
import subprocess
import sys
import time

cfg, k = sys.argv[1], sys.argv[2]
nproc = sys.argv[3] if len(sys.argv) > 3 else "1"
extra = sys.argv[4:]
dtrun = os.environ.get("DTRUN", os.path.join(os.path.dirname(__file__), "../../dtrun"))
env = dict(os.environ, DTRUN_FAULT_KILL_STEP=k)
p = subprocess.Popen([dtrun, "--nproc_per_node", nproc, "--max_restarts", "1", cfg, "steps_per_print=1"] + extra,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
t = {}
stops = set()
for line in p.stdout:
    now = time.monotonic()
    if "death" in t and "resumed" not in t:
        if "without a preemption save" in line:
            stops.add("group-failure stop")
        elif "training failed" in line:
            stops.add("collective error")
        elif "(SIGTERM)" in line or "preempted by signal" in line:
            stops.add("preemption save attempt")
    if "fault injection" in line and "death" not in t:
        t["death"] = now
    elif "death" in t and "failed; stopping" in line and "noticed" not in t:
        t["noticed"] = now
    elif "death" in t and "resumed from" in line and "resumed" not in t:
        t["resumed"] = now
        m = re.search(r"in ([0-9.]+) s", line)
        t["load_s"] = float(m.group(1)) if m else float("nan")
    elif "resumed" in t and re.search(r"step \d+/\d+", line) and "first_step" not in t:
        t["first_step"] = now
p.wait()
if not {"death", "resumed", "first_step"} <= set(t):
    sys.exit(f"missing events: {t} (exit {p.returncode})")
print(f"ranks {nproc}, killed after step {k}: agent noticed after {t.get('noticed', float('nan')) - t['death']:.3f} s, "
      f"checkpoint loaded after {t['resumed'] - t['death']:.3f} s (load {t['load_s']:.3f} s), "
      f"first step printed {t['first_step'] - t['death']:.3f} s after the death; exit {p.returncode}; "
      f"survivors: {', '.join(sorted(stops)) or 'none seen'}")
