#!/usr/bin/env python3
"""ddp_gloo.py - a few DDP steps of a small MLP on gloo, for comparing launchers.

Unmodified torchrun-style script: init_process_group("gloo") with env://, so it uses
the launcher's store (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE).
Same seeds everywhere, so the losses are identical under dtrun --exec and torchrun:
  dtrun --standalone --nproc_per_node 2 --exec python3 scripts/bench/ddp_gloo.py
  torchrun --standalone --nproc_per_node 2 scripts/bench/ddp_gloo.py
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    x = torch.randn(64, 16, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    for step in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step} loss {mean.item() / world:.6f}", flush=True)
    if rank == 0:
        print(f"world {world} restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
              f"agent_store {os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}", flush=True)
    # Every rank is done with gloo before any rank tears its pairs down: a rank that
    # exits while its peer is still inside destroy_process_group closes the sockets
    # under gloo's loop thread, which then aborts the peer ("terminate called without
    # an active exception"; seen in 1 of 10 runs across network namespaces).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
