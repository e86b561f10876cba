#!/usr/bin/env python3
"""torch_store.py - drives dtrun's store server with PyTorch's own TCPStore client.

Starts `./dtrun store --host 127.0.0.1 --port 0`, reads the bound port from its
first line, connects torch.distributed.TCPStore(is_master=False) (with the libuv
client setting and without), exercises every command torch's client has that
our server implements, and checks every answer. One line per check; exits 1 on
any failure. Needs torch; not part of `make test`.

usage: scripts/compat/torch_store.py [DTRUN]   (default ./dtrun)
"""
import datetime
import os
import subprocess
import sys
import threading
import time

import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTRUN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "dtrun")

failures = 0


def check(name, cond, detail=""):
    global failures
    print(("PASS: " if cond else "FAIL: ") + name + ("" if cond else f" ({detail})"), flush=True)
    if not cond:
        failures += 1


def run_checks(host, port, use_libuv):
    tag = f"[use_libuv={use_libuv}]"
    s = dist.TCPStore(host, port, is_master=False, use_libuv=use_libuv,
                      timeout=datetime.timedelta(seconds=10))
    p = "libuv/" if use_libuv else "legacy/"

    s.set(p + "a", "hello")
    check(f"{tag} set + get", s.get(p + "a") == b"hello")
    s.set(p + "a", b"\x00\xffbin")
    check(f"{tag} set overwrites, binary value", s.get(p + "a") == b"\x00\xffbin")

    check(f"{tag} add on missing key starts at 0", s.add(p + "cnt", 5) == 5)
    check(f"{tag} add accumulates", s.add(p + "cnt", -2) == 3)
    check(f"{tag} add stores decimal text", s.get(p + "cnt") == b"3")

    r = s.compare_set(p + "cas", "", "first")
    check(f"{tag} compare_set missing + empty expected sets desired", r == b"first",
          repr(r))
    r = s.compare_set(p + "cas_absent", "x", "y")
    check(f"{tag} compare_set missing + non-empty expected returns expected", r == b"x",
          repr(r))
    check(f"{tag} compare_set missing + non-empty expected leaves key absent",
          not s.check([p + "cas_absent"]))
    r = s.compare_set(p + "cas", "first", "second")
    check(f"{tag} compare_set present + equal swaps", r == b"second", repr(r))
    r = s.compare_set(p + "cas", "nope", "third")
    check(f"{tag} compare_set present + different keeps value", r == b"second", repr(r))

    t0 = time.monotonic()
    try:
        s.wait([p + "never"], datetime.timedelta(milliseconds=300))
        check(f"{tag} wait with timeout raises", False, "no exception")
    except Exception as e:  # torch raises DistStoreError (a RuntimeError)
        dt = time.monotonic() - t0
        check(f"{tag} wait with timeout raises after ~0.3 s", 0.25 < dt < 5,
              f"{dt:.2f} s, {e}")
    s.set(p + "after_wait", "ok")
    check(f"{tag} connection usable after a wait timeout", s.get(p + "after_wait") == b"ok")
    s.wait([p + "a", p + "cnt"])
    check(f"{tag} wait on existing keys returns", True)

    s.multi_set([p + "m1", p + "m2", p + "m3"], ["v1", b"v2", "v3"])
    got = s.multi_get([p + "m1", p + "m2", p + "m3"])
    check(f"{tag} multi_set + multi_get", got == [b"v1", b"v2", b"v3"], repr(got))

    check(f"{tag} check present keys", s.check([p + "m1", p + "m2"]))
    check(f"{tag} check with a missing key", not s.check([p + "m1", p + "missing"]))

    s.append(p + "app", "ab")
    s.append(p + "app", "cd")
    check(f"{tag} append creates then appends", s.get(p + "app") == b"abcd")

    n0 = s.num_keys()
    s.set(p + "extra", "1")
    check(f"{tag} num_keys counts a new key", s.num_keys() == n0 + 1,
          f"{n0} -> {s.num_keys()}")
    check(f"{tag} delete_key existing", s.delete_key(p + "extra") is True)
    check(f"{tag} delete_key missing", s.delete_key(p + "extra") is False)
    check(f"{tag} num_keys after delete", s.num_keys() == n0)

    if hasattr(s, "list_keys"):
        try:
            keys = s.list_keys()
            check(f"{tag} list_keys", p + "m1" in keys and p + "extra" not in keys,
                  repr(keys[:5]))
        except Exception as e:  # older torch without LIST_KEYS
            check(f"{tag} list_keys", False, str(e))
    return s


def main():
    proc = subprocess.Popen([DTRUN, "store", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        prefix = "dtrun store listening on "
        if not line.startswith(prefix):
            print(f"FAIL: server did not start: {line!r}")
            return 1
        host, port = line[len(prefix):].rsplit(":", 1)
        port = int(port)
        print(f"server: {line}")
        import torch
        print(f"torch {torch.__version__}")
        stores = [run_checks(host, port, use_libuv) for use_libuv in (True, False)]
        # Cross-client: a value set by one client is seen by the other.
        stores[0].set("shared", "x")
        check("cross-client visibility", stores[1].get("shared") == b"x")
        # get blocks until another client sets the key.
        t = threading.Timer(0.3, lambda: stores[1].set("late", "arrived"))
        t0 = time.monotonic()
        t.start()
        got = stores[0].get("late")
        t.join()
        check("get waits for a later set from another client",
              got == b"arrived" and time.monotonic() - t0 >= 0.25, repr(got))
        # A real process group: two gloo ranks rendezvous through our store.
        worker = (
            "import datetime, sys, torch, torch.distributed as dist\n"
            "rank = int(sys.argv[1])\n"
            "s = dist.TCPStore(sys.argv[2], int(sys.argv[3]), is_master=False,\n"
            "                  timeout=datetime.timedelta(seconds=30))\n"
            "dist.init_process_group('gloo', store=s, rank=rank, world_size=2)\n"
            "t = torch.tensor([float(rank + 1)])\n"
            "dist.all_reduce(t)\n"
            "dist.barrier()\n"
            "print(t.item())\n"
            "dist.destroy_process_group()\n")
        procs = [subprocess.Popen([sys.executable, "-c", worker, str(r), host, str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        ok = all(p.returncode == 0 for p in procs) and all(o[0].strip() == "3.0" for o in outs)
        check("init_process_group(gloo, world_size=2) + all_reduce through our store", ok,
              "; ".join(f"rc={p.returncode} out={o[0].strip()!r} err={o[1].strip()[-200:]!r}"
                        for p, o in zip(procs, outs)))
    finally:
        proc.terminate()
        rc = proc.wait(timeout=10)
    check("server exits 0 on SIGTERM", rc == 0, f"rc={rc}")
    print(f"{'OK' if failures == 0 else 'FAILED'}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
