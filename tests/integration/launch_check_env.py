#!/usr/bin/env python3
"""launch_check_env.py NNODES NPROC OMP_EXPECTED < output of `dtrun ... --exec env`
from every agent: checks every variable of every rank (torchrun's set, docs/interface.md).
Lines look like "[rank3]:KEY=VALUE" or "[host rank3]:KEY=VALUE". Exit 0 when all good."""
import re, sys

nnodes, nproc, omp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
world = nnodes * nproc
env = {}
for line in sys.stdin:
    m = re.match(r"^\[(?:(\S+) )?rank(\d+)\]:([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.rstrip("\n"))
    if m:
        env.setdefault(int(m.group(2)), {})[m.group(3)] = (m.group(4), m.group(1))
errors = []
if sorted(env) != list(range(world)):
    errors.append(f"ranks seen {sorted(env)}, expected 0..{world - 1}")
ports, ids, addrs = set(), set(), set()
for r, e in env.items():
    def want(k, v):
        got = e.get(k, (None,))[0]
        if got != str(v):
            errors.append(f"rank {r}: {k}={got!r}, expected {v!r}")
    want("RANK", r); want("LOCAL_RANK", r % nproc); want("WORLD_SIZE", world)
    want("LOCAL_WORLD_SIZE", nproc); want("GROUP_RANK", r // nproc); want("ROLE_RANK", r)
    want("ROLE_NAME", "default"); want("ROLE_WORLD_SIZE", world); want("GROUP_WORLD_SIZE", nnodes)
    want("TORCHELASTIC_RESTART_COUNT", 0); want("TORCHELASTIC_MAX_RESTARTS", 0)
    want("TORCHELASTIC_USE_AGENT_STORE", "True"); want("DTRUN_NNODES", nnodes)
    if omp == "unset":
        if "OMP_NUM_THREADS" in e: errors.append(f"rank {r}: OMP_NUM_THREADS set")
    else:
        want("OMP_NUM_THREADS", omp)
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
              "DTRUN_RUN_DIR"):
        if not e.get(k, ("",))[0]:
            errors.append(f"rank {r}: {k} missing")
    ports.add(e.get("MASTER_PORT", ("",))[0]); ids.add(e.get("TORCHELASTIC_RUN_ID", ("",))[0])
    addrs.add(e.get("MASTER_ADDR", ("",))[0])
    if not e.get("MASTER_PORT", ("0",))[0].isdigit() or int(e["MASTER_PORT"][0]) <= 0:
        errors.append(f"rank {r}: MASTER_PORT {e.get('MASTER_PORT')}")
    host = e.get("RANK", (None, None))[1]
    if nnodes > 1 and not host:
        errors.append(f"rank {r}: multi-node lines must carry the host")
for what, s in (("MASTER_PORT", ports), ("TORCHELASTIC_RUN_ID", ids), ("MASTER_ADDR", addrs)):
    if len(s) != 1: errors.append(f"{what} differs between ranks: {s}")
for e in errors[:20]:
    print("env check:", e)
sys.exit(1 if errors else 0)
