"""``python -m tiltlab._cpu_kernels KEY``: compile the kernel named by ``KEY``
(:func:`.warmup.key`) into the cache and mark it ready; what :func:`.warmup.start` runs in
a background process."""

from __future__ import annotations

import sys

import numpy as np

from . import warmup
from .fused import FusedProblem


def _compile(name: str) -> None:
    """Compile the kernel ``name`` by calling it on a small problem of the same types."""
    kernel, _, rest = name.partition("-")
    dtype, _, ro = rest.partition("-")
    X = np.ones((8, 2), dtype=np.dtype(dtype))
    if ro:
        X.setflags(write=False)
    multi = kernel.endswith("_multi")
    y = np.zeros(8) if multi else np.ones(8)
    theta = np.zeros((2, 2) if multi else 2)
    fp = FusedProblem("multinomial" if multi else "squared", X, y)
    if kernel.startswith("vg_"):
        fp.value_and_gradient(theta, 1.0)
    elif kernel.startswith("hvp_"):
        fp.hvp(theta, theta, 1.0)
    elif kernel.startswith("group_"):  # one compile serves value, gradient and hvp
        fp.group_states(theta, 1.0, np.zeros(8, dtype=np.int64), 1, gradient=True)
    else:
        raise ValueError(f"unknown kernel {name!r}")


if __name__ == "__main__":  # pragma: no cover - run in a background process
    try:
        _compile(sys.argv[1])
    finally:
        warmup._release(sys.argv[1])
