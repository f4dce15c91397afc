"""Training-step time with `TiltedLoss` against a plain mean loss (CPU, PyTorch).

A small MLP (32 -> hidden -> hidden -> 10, ReLU, Adam; ``--hidden``, default 64) on
batches of 512: one step is forward,
loss, backward and the optimiser step. The plain step (``CrossEntropyLoss()``) and the
tilted steps (``TiltedLoss(CrossEntropyLoss(reduction="none"), ...)``) alternate, step by
step, in one process, and the script prints the median time of each and its ratio to the
plain step's median. The group-level losses take the class labels as groups (10 groups).
With ``--general`` the group-level loss also runs on the general path (the array-API
kernels shared with :class:`~tiltlab.minibatch.MinibatchTilt`, the path of data-parallel
training) next to its few-operation path, for comparison. With ``--compile`` each step
function is also compiled (``torch.compile``, default inductor backend) and measured the
same way.

Run: ``OMP_NUM_THREADS=1 python benchmarks/torch_loss_step.py [--steps 300] [--hidden 64]
[--general] [--compile]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

from tiltlab.minibatch import linear_schedule
from tiltlab.torch import TiltedLoss


def make_step(loss_fn, compiled: bool, seed: int, hidden: int):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(32, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def forward_backward(X, y):
        loss = loss_fn(model(X), y)
        loss.backward()
        return loss

    fb = torch.compile(forward_backward) if compiled else forward_backward

    def step(X, y):
        opt.zero_grad(set_to_none=True)
        loss = fb(X, y)
        opt.step()
        return loss

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--general", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ce = nn.CrossEntropyLoss(reduction="none")

    def by_class(tilts, general=False):
        loss = TiltedLoss(ce, tilts=tilts, n_groups=10)
        loss._lean_group = not general  # the general path: what distributed=True runs
        return lambda out, y: loss(out, y, groups=y)

    variants = {
        "mean loss": nn.CrossEntropyLoss(),
        "TiltedLoss t=-2": TiltedLoss(ce, t=-2.0),
        "TiltedLoss ramp 0 -> -2": TiltedLoss(ce, t=linear_schedule(0.0, -2.0, 1000)),
        "TiltedLoss tilts=(1, 0), 10 classes": by_class((1.0, 0.0)),
        "TiltedLoss tilts=(1, -1), 10 classes": by_class((1.0, -1.0)),
    }
    if args.general:
        variants["tilts=(1, 0), general path"] = by_class((1.0, 0.0), general=True)
        variants["tilts=(1, -1), general path"] = by_class((1.0, -1.0), general=True)
    modes = [False, True] if args.compile else [False]
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(512, 32, generator=g), torch.randint(0, 10, (512,), generator=g)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()}")
    for compiled in modes:
        steps = {
            name: make_step(fn, compiled, seed=k, hidden=args.hidden)
            for k, (name, fn) in enumerate(variants.items())
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        for i in range(args.warmup + args.steps):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step(X, y)
                elapsed = time.perf_counter() - t0
                if i >= args.warmup:
                    times[name].append(elapsed)
        base = statistics.median(times["mean loss"])
        label = "compiled (inductor)" if compiled else "eager"
        print(
            f"\n{label}: median of {args.steps} interleaved steps, batch 512, hidden {args.hidden}"
        )
        print(f"{'loss':40s} {'median ms':>10s} {'ratio':>7s}")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:40s} {1e3 * med:10.3f} {med / base:7.2f}")


if __name__ == "__main__":
    main()
