"""What `TiltedLoss(distributed=True)` costs per step: the all-gather of the batch
statistics (``6 * n_groups`` numbers per process) between two CPU processes (gloo).

Each process calls the loss on its batch of 512 per-sample losses (forward and backward
of the loss alone, so the exchange is not hidden behind a model), alternating
``distributed=True`` and ``distributed=False`` step by step; rank 0 prints the medians
and their difference, the cost of the exchange.

Run: ``OMP_NUM_THREADS=1 python benchmarks/torch_loss_distributed.py [--steps 300]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tiltlab.torch import TiltedLoss


def worker(rank: int, world: int, init: str, steps: int, warmup: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    variants = {
        "sample level, t=-2": dict(t=-2.0),
        "group level, 10 groups": dict(tilts=(1.0, 0.0), n_groups=10),
    }
    g = torch.Generator().manual_seed(rank)
    losses = torch.rand(512, generator=g, dtype=torch.float32)
    groups = torch.randint(0, 10, (512,), generator=g)
    rows = []
    for name, kwargs in variants.items():
        fns = {flag: TiltedLoss(distributed=flag, **kwargs) for flag in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        for i in range(warmup + steps):
            for flag, fn in fns.items():
                leaf = losses.clone().requires_grad_(True)
                dist.barrier()
                t0 = time.perf_counter()
                out = fn(leaf, groups=groups if "tilts" in kwargs else None)
                out.backward()
                elapsed = time.perf_counter() - t0
                if i >= warmup:
                    times[flag].append(elapsed)
        local, shared = statistics.median(times[False]), statistics.median(times[True])
        rows.append((name, local, shared))
    if rank == 0:
        print(f"torch {torch.__version__}, gloo, {world} processes, load {os.getloadavg()}")
        print(f"median of {steps} interleaved steps, 512 losses per process (loss only)")
        print(f"{'loss':28s} {'one process ms':>15s} {'distributed ms':>15s} {'sync ms':>9s}")
        for name, local, shared in rows:
            print(
                f"{name:28s} {1e3 * local:15.3f} {1e3 * shared:15.3f} {1e3 * (shared - local):9.3f}"
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(worker, args=(2, init, args.steps, args.warmup), nprocs=2, join=True)


if __name__ == "__main__":
    main()
