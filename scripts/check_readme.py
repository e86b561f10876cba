#!/usr/bin/env python3
"""check_readme.py - runs every command block of README.md from a fresh clone and
prints one row per command: PASS, REFUSED (a GPU-only command on a machine without
a GPU, refused with exit 2 naming the GPU), or FAIL with the exit code and the last
line it printed.

    scripts/check_readme.py [--clone DIR] [--no-build] [--steps N] [--timeout S] [--only REGEX]

It clones the checkout's HEAD into DIR (default: a new folder under $TMPDIR), runs
`make` there (the binary users get) unless --no-build, puts the clone's root first on
PATH (where `dtrun` is built; `make install` would put it on PATH too) and runs each
command in the clone's root with bash, in README order, so that a command may use what
an earlier one made. A block is a command block when its first line starts with a
command (dtrun, ./dtrun, make, scripts/..., for, sbatch, an ENV=VALUE prefix); output
blocks and JSON are skipped. Backslash continuations are joined; a block with a loop
runs as one command.

Adaptations, each said in the row: a command that trains (a launch of a config)
gets `train_steps=N` (--steps, default 50) so that the check takes minutes, not hours;
`make run` gets the same through scripts/demo.sh's arguments (DEMO_ARGS). A line that
only sets a shell variable (TOK=...) is kept for the rest of its block. A server
(`dtrun store`) passes when it is still running and listening after 3 s, and is then
stopped. The test suites (`make test`, `make fuzz`) are SKIP rows unless --long; so is a
command whose program is not installed here (sbatch, tensorboard), with its name, and
so is a SLURM client without a cluster and a compat script without its PyPI peer (torch).
Nothing else is changed. Exit status: 0 when every row passes, is skipped, or is a
clear refusal (a GPU-only command without a GPU; a download without a network, exit 3).
"""
import argparse
import signal
import socket
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CMD_START = re.compile(r"^((\./)?dtrun(\s|$)|make(\s|$)|scripts/|for |sbatch |srun |python3 |pip |git |cd |[A-Z_]+=\S+ )")


def command_blocks(text):
    for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
        body = m.group(1)
        lines = [l for l in body.split("\n")]
        first = next((l for l in lines if l.strip()), "")
        if not CMD_START.match(first.strip()):
            continue
        yield text.count("\n", 0, m.start()) + 1, body


def commands(body):
    """The block's commands: continuations joined, comments dropped; a loop whole."""
    if re.search(r"^\s*(for|while) ", body, re.M):
        yield body.strip()
        return
    cur = ""
    for line in body.split("\n"):
        s = line.rstrip()
        if not cur and (not s.strip() or s.strip().startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        yield cur.strip()
        cur = ""
    if cur.strip():
        yield cur.strip()


def adapt(cmd, steps):
    """(command, note): a launch of a config trains steps steps."""
    code = re.sub(r"\s+#.*$", "", cmd)  # a trailing comment
    if re.match(r"^make run\b", code):
        return f"DEMO_ARGS='train_steps={steps}' {code}", f"train_steps={steps}"
    words = code.split()
    is_launch = words and words[0] in ("dtrun", "./dtrun") and any(w.endswith(".json") for w in words) \
        and not any(w in ("plan", "config", "check", "sample", "export", "report", "tokenize", "bench", "trace")
                    for w in words[1:3])
    if is_launch and "--exec" not in words:
        m = re.search(r"\btrain_steps=(\d+)", code)
        if not m:
            return code + f" train_steps={steps}", f"train_steps={steps}"
        if int(m.group(1)) > steps:
            return code[:m.start()] + f"train_steps={steps}" + code[m.end():], f"train_steps={steps}"
    return code, ""


ASSIGN = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\S+)\s*(#.*)?$")
LONG = re.compile(r"^make (test|fuzz)\b")
SHELL_WORDS = ("for", "while", "if", "cd", "export")
SERVER = re.compile(r"^dtrun store\b")


def serve_check(run, cwd, env):
    """(rc, out): a server command still running and listening after 3 s is rc 0."""
    m = re.search(r"--port (\d+)", run)
    port = int(m.group(1)) if m else 29500
    p = subprocess.Popen(["bash", "-c", "exec " + run], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    time.sleep(3)
    alive = p.poll() is None
    listening = False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        listening = True
    except OSError:
        pass
    if alive:
        os.killpg(p.pid, signal.SIGTERM)
    out = p.communicate(timeout=30)[0].decode(errors="replace")
    if alive and listening:
        return 0, out + f"\n(a server: running and listening on port {port} after 3 s, then stopped)"
    return (p.returncode or 1), out + f"\n(a server: alive {alive}, listening on {port} {listening})"


def absent_peer(cmd, out):
    """Why a command that needs what this machine lacks could not run, or None: a
    SLURM client without a cluster, a compat script without its PyPI peer."""
    if re.match(r"^(sbatch|srun|salloc|squeue) ", cmd) and \
            re.search(r"Could not establish a configuration source|Unable to contact slurm controller", out):
        return "no SLURM cluster here: scripts/slurm/check.sh runs the script under one"
    m = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", out)
    if re.match(r"^python3 scripts/compat/", cmd) and m:
        return f"needs {m.group(1)} from PyPI (pip install {m.group(1)})"
    return None


def gpu_refusal(out):
    return re.search(r"no GPU|device cuda|needs a GPU|CUDA library|no CUDA", out) is not None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clone")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--only")
    ap.add_argument("--long", action="store_true", help="also the benchmark scripts (scripts/bench/*)")
    a = ap.parse_args()
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    clone = a.clone or tempfile.mkdtemp(prefix="dtrun-readme-")
    if not os.path.exists(os.path.join(clone, ".git")):
        subprocess.run(["git", "clone", "-q", repo, clone], check=True)
    env = dict(os.environ, PATH=clone + os.pathsep + os.environ.get("PATH", ""))
    if not a.no_build:
        t0 = time.time()
        r = subprocess.run(["make"], cwd=clone, env=env, capture_output=True, text=True)
        print(f"build: make in {clone}: exit {r.returncode}, {time.time() - t0:.0f} s", flush=True)
        if r.returncode:
            print(r.stdout[-2000:], r.stderr[-2000:])
            return 1
    text = open(os.path.join(clone, "README.md")).read()
    rows, bad = [], 0
    for line, body in command_blocks(text):
        block_vars = ""
        block_refused = False
        for cmd in commands(body):
            m = ASSIGN.match(cmd)
            if m:
                block_vars += f"{m.group(1)}={m.group(2)}; "
                continue
            run, note = adapt(cmd, a.steps)
            if a.only and not re.search(a.only, cmd):
                continue
            skip = None
            prog = cmd.split()[0]
            if re.match(r"^scripts/bench/", cmd) and not a.long:
                skip = "a benchmark: --long runs it"
            elif LONG.match(cmd) and not a.long:
                skip = "a test suite: --long runs it"
            elif "/" not in prog and "=" not in prog and prog not in SHELL_WORDS and \
                    shutil.which(prog, path=env["PATH"]) is None:
                skip = f"{prog} is not installed here"
            if skip:
                row = f"{'SKIP':<8} {line:>5}  {0:6.1f}s  {'':<6} {cmd.split(chr(10))[0][:90]}  [{skip}]"
                print(row, flush=True)
                rows.append(row)
                continue
            run = block_vars + run
            t0 = time.time()
            if SERVER.match(cmd):
                rc, out = serve_check(run, clone, env)
            else:
                try:
                    r = subprocess.run(["bash", "-c", run], cwd=clone, env=env, capture_output=True,
                                       timeout=a.timeout)
                    rc, out = r.returncode, (r.stdout + r.stderr).decode(errors="replace")
                except subprocess.TimeoutExpired as e:
                    rc, out = 124, (e.stdout or b"").decode(errors="replace")
            took = time.time() - t0
            last = next((l for l in reversed(out.strip().split("\n")) if l.strip()), "")[:150]
            skip_why = absent_peer(cmd, out) if rc != 0 else None
            if rc == 0:
                res = "PASS"
            elif skip_why:
                res = "SKIP"
                note = skip_why
            elif rc == 2 and block_refused and re.search(r"no file matches", out):
                res = "REFUSED"
                note = "its data comes from the refused download above"
            elif rc == 2 and gpu_refusal(out):
                res = "REFUSED"
            elif rc == 3 and re.search(r"cannot be reached|no network|offline", out):
                res = "REFUSED"
            else:
                res, bad = "FAIL", bad + 1
            shown = cmd.split("\n")[0][:90]
            row = f"{res:<8} {line:>5}  {took:6.1f}s  rc={rc:<3} {shown}" + (f"  [{note}]" if note else "")
            block_refused = block_refused or res == "REFUSED"
            if res not in ("PASS", "SKIP"):
                row += f"\n{'':>25}{last}"
            print(row, flush=True)
            rows.append(row)
    print(f"\n{len(rows)} command(s): {sum(r.startswith('PASS') for r in rows)} pass, "
          f"{sum(r.startswith('REFUSED') for r in rows)} refused (no GPU or no network), "
          f"{sum(r.startswith('SKIP') for r in rows)} skipped, {bad} fail; clone {clone}")
    if not a.clone:
        shutil.rmtree(clone, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
