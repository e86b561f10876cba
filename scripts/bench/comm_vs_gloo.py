#!/usr/bin/env python3
"""comm_vs_gloo.py - all_reduce bus bandwidth: dtrun's communicator against
torch.distributed's gloo backend on this machine.

For each world size (default 2 and 4) it runs gloo all_reduce (fp32, sum) over
loopback with torch.multiprocessing (one process per rank, one thread each),
then `dtrun __bench_comm_rank --nproc N` with the shm and tcp backends on the
same sizes, and prints busbw (GB/s, nccl-tests factor 2(n-1)/n) per size and
the ratios ours / gloo. Needs torch (pip install torch); not part of make test.

usage: scripts/bench/comm_vs_gloo.py [--ranks 2,4] [--min 8] [--max 32M]
       [--iters 20] [--warmup 5] [--backends shm,tcp]
"""
import argparse, os, re, socket, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--ranks", default="2,4")
ap.add_argument("--min", default="8")
ap.add_argument("--max", default="32M")
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--backends", default="shm,tcp")
ap.add_argument("--repeat", type=int, default=1,
                help="run everything this many times, alternating, and keep each size's best time "
                     "(for a shared, noisy machine)")
ap.add_argument("--quiet-wait", type=float, default=0,
                help="before each run wait up to this many seconds for a second with all CPUs >= 90%% idle")
ap.add_argument("--extra", default="", help="extra flags for dtrun's bench, e.g. '--conns 2'")
ap.add_argument("--dtrun", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "dtrun"))
args = ap.parse_args()


def parse_size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)B?", s.strip(), re.I)
    if not m:
        sys.exit(f"bad size {s!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


def sizes():
    s, out = parse_size(args.min), []
    while s <= parse_size(args.max):
        out.append(s)
        s *= 2
    return out


def cpu_idle_1s():
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t1, i1 = snap()
    time.sleep(1)
    t2, i2 = snap()
    return (i2 - i1) / max(1, t2 - t1)


def wait_quiet():
    """Waits (up to --quiet-wait s) for a second in which the machine is >= 90% idle."""
    end = time.time() + args.quiet_wait
    while args.quiet_wait > 0 and time.time() < end:
        if cpu_idle_1s() >= 0.9:
            return


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_worker(rank, world, port, szs, iters, warmup, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res = {}
    for size in szs:
        count = max(1, size // 4)
        t = torch.ones(count, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / iters
        worst = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        res[size] = worst.item()
    if rank == 0:
        q.put(res)
    dist.destroy_process_group()


def run_gloo(world, szs):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=gloo_worker, args=(r, world, port, szs, args.iters, args.warmup, q))
             for r in range(world)]
    for p in procs:
        p.start()
    res = q.get()
    for p in procs:
        p.join()
    return res


def run_ours(world, backend, szs):
    cmd = [args.dtrun, "__bench_comm_rank", "--nproc", str(world), "--backend", backend, "--op", "all_reduce",
           "--min", str(szs[0]), "--max", str(szs[-1]), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    cmd += args.extra.split()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    res, copy = {}, None
    for line in out.splitlines():
        m = re.search(r"memcpy of 64 MiB.*?: ([\d.]+) GB/s", line)
        if m:
            copy = float(m.group(1))
        f = re.sub(r"^\[rank0\]:", "", line).split()  # rank 0's lines carry the agent's prefix
        if len(f) == 8 and f[0].isdigit():
            res[int(f[0])] = float(f[4]) * 1e-6
    return res, copy


def main():
    szs = sizes()
    backends = [b for b in args.backends.split(",") if b]
    for world in [int(x) for x in args.ranks.split(",")]:
        factor = 2.0 * (world - 1) / world
        busbw = lambda size, t: size / t / 1e9 * factor
        best = lambda a, b: {k: min(a.get(k, 1e30), b.get(k, 1e30)) for k in set(a) | set(b)}
        gloo, ours, copy, loads = {}, {b: {} for b in backends}, 0.0, []
        for _ in range(args.repeat):
            loads.append(os.getloadavg()[0])
            wait_quiet()
            gloo = best(gloo, run_gloo(world, szs))
            for b in backends:
                wait_quiet()
                r, c = run_ours(world, b, szs)
                ours[b] = best(ours[b], r)
                copy = max(copy, c or 0.0)
        print(f"\n# all_reduce fp32 sum, {world} ranks, busbw GB/s (factor {factor:.2f}), best of {args.repeat};"
              f" memcpy bandwidth {copy} GB/s (best); load average {min(loads):.2f}..{max(loads):.2f}")
        hdr = f"{'size(B)':>10} {'gloo':>8}" + "".join(f" {b:>8} {b + '/gloo':>9}" for b in backends)
        print(hdr)
        for size in szs:
            g = busbw(size, gloo[size])
            row = f"{size:>10} {g:>8.3f}"
            for b in backends:
                t = ours[b].get(size)
                o = busbw(size, t) if t else float("nan")
                row += f" {o:>8.3f} {o / g:>9.2f}"
            print(row)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
