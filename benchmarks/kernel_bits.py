"""Whether a change to the fused CPU kernels kept their results bit for bit: every output
of the kernels on a fixed grid of problems, saved from one build and compared with
another on the same machine.

The grid: both dtypes; rows of 3, 20, 100 and 300 entries (narrower than a vector
register; whole registers in straight-line code, then in a loop over them; float64 rows
of 300 in LLVM's loops with the next block's dot products overlapped); every loss of
``LOSS_CODES``; the uniform prior and a prior with zeros; tilts -5, -0.01, 0, 1e-9, 0.5
and 3 (both tilt regimes, the small-tilt series, the untilted mean); each dtype and
width draws its data from a seed of its own. For each problem it keeps the value and
gradient, the Hessian-vector product, the linearised product, the group states of seven
groups (with their gradient and product sums) and the chunk states: about 16,000 arrays.

Bits are a property of one build on one machine (the CPU decides the vector width and
the fused multiply-adds), so the two runs must be on the same machine; across machines
only the tests' tolerances apply. A change that reorders a reassociated sum changes
bits on purpose; the comparison then reports the largest relative difference.

Usage::

    git stash; python benchmarks/kernel_bits.py /tmp/before.npz; git stash pop
    python benchmarks/kernel_bits.py /tmp/after.npz --against /tmp/before.npz

It exits with status 1 when an array differs.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from tiltlab._cpu_kernels import LOSS_CODES, FusedProblem

TILTS = (-5.0, -0.01, 0.0, 1e-9, 0.5, 3.0)
WIDTHS = (3, 20, 100, 300)
STATE_FIELDS = ("shift", "hi", "lo", "mass", "s", "q", "lsum")


def _targets(rng, loss, n, dtype, theta, v):
    """Labels and the parameters (matrices for the multinomial loss)."""
    if loss == "multinomial":
        y = rng.integers(0, 3, n).astype(np.float64)
        return y, np.tile(theta[:, None], (1, 3)), np.tile(v[:, None], (1, 3))
    if loss in ("logistic", "hinge", "squared_hinge"):
        return (rng.random(n) < 0.3).astype(dtype), theta, v
    if loss == "poisson":
        return rng.poisson(1.0, n).astype(dtype), theta, v
    return rng.standard_normal(n).astype(dtype), theta, v


def outputs(n=3001):
    """Every output of the grid, by name."""
    out = {}
    codes = (np.arange(n) % 7).astype(np.int64)
    for dtype in (np.float64, np.float32):
        for d in WIDTHS:
            rng = np.random.default_rng([np.dtype(dtype).itemsize, d])
            X = rng.standard_normal((n, d)).astype(dtype)
            theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
            v = rng.standard_normal(d).astype(dtype)
            for loss in LOSS_CODES:
                y, T, V = _targets(rng, loss, n, dtype, theta, v)
                for prior in (None, "zeros"):
                    p = None
                    if prior:
                        p = rng.random(n)
                        p[rng.random(n) < 0.2] = 0.0
                    fp = FusedProblem(loss, X, y, p)
                    for t in TILTS:
                        k = f"{np.dtype(dtype).name}-{d}-{loss}-{prior}-{t}"
                        r = fp.value_and_gradient(T, t)
                        if r is None:
                            out[k + "-declined"] = np.zeros(1)
                            continue
                        out[k + "-value"] = np.asarray(r[0])
                        out[k + "-gradient"] = r[1]
                        out[k + "-hvp"] = fp.hvp(T, V, t)
                        out[k + "-linearized-hvp"] = fp.linearize(T, t).hvp(V)
                        gs = fp.group_states(T, t, codes, 7, gradient=True)
                        if gs is not None:
                            for f in STATE_FIELDS:
                                out[k + f"-groups-{f}"] = getattr(gs, f)
                            for i, a in enumerate(gs.sums):
                                out[k + f"-groups-gradient-{i}"] = a
                        hs = fp.group_states(T, t, codes, 7, hvp_vector=V)
                        if hs is not None:
                            for i, a in enumerate(hs.sums):
                                out[k + f"-groups-hvp-{i}"] = a
                        bs = fp.block_states(T, t, gradient=True)
                        for f in ("shift", "s", "q", "lsum"):
                            out[k + f"-chunks-{f}"] = getattr(bs, f)
    return out


def compare(new, old):
    """Names that differ (NaN equal to NaN), and the largest relative difference."""
    missing = sorted(set(old) ^ set(new))
    differ = [
        k for k in sorted(set(old) & set(new)) if not np.array_equal(old[k], new[k], equal_nan=True)
    ]
    worst = 0.0
    for k in differ:
        a = np.asarray(old[k], dtype=np.float64)
        b = np.asarray(new[k], dtype=np.float64)
        if a.shape == b.shape:
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.abs(a - b) / np.maximum(np.abs(a), np.finfo(np.float64).tiny)
            worst = max(worst, float(np.nanmax(rel)))
    return missing, differ, worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="where to save this build's outputs (.npz)")
    ap.add_argument("--against", help="outputs saved from another build (.npz)")
    args = ap.parse_args(argv)
    out = outputs()
    np.savez(args.out, **out)
    print(f"{len(out)} arrays saved to {args.out}")
    if not args.against:
        return 0
    with np.load(args.against) as f:
        old = {k: f[k] for k in f.files}
    missing, differ, worst = compare(out, old)
    for k in missing:
        print(f"in one run only: {k}")
    for k in differ[:20]:
        print(f"differs: {k}")
    print(
        f"{len(differ)} of {len(out)} arrays differ (largest relative difference "
        f"{worst:.3g}); {len(missing)} in one run only"
    )
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
