"""Measured bias of the minibatch tilted-gradient estimators on the Drug Discovery data.

At a fixed linear model theta, the exact full-data tilted gradient of the squared losses
l_i = (x_i theta - y_i)^2 is

    g = sum_i w_i grad l_i,   w = tilted_weights(l, t),   grad l_i = 2 (x_i theta - y_i) x_i.

Each estimator of ``tiltlab.minibatch.MinibatchTilt`` is fed a stream of minibatches drawn
uniformly (without replacement inside a batch, independent batches) and returns batch
weights; the batch gradient is sum_{i in B} w_i grad l_i. After ``--burn-in`` batches (the
state of the running and variational estimators reaches its stationary regime) the mean of
``--batches`` batch gradients is compared with g:

    relative error = ||mean_k g_k - g|| / ||g||,

next to its Monte Carlo noise floor sqrt(trace Cov(g_k) / K) / ||g||: an error near the floor
is no measurable bias. The script also prints the effective sample size 1/sum(w^2) of the
exact weights: on this data the positive tilts put almost all the weight on a few samples
with the largest losses (ESS ~1-2 at t = 1 and 10), which a small batch rarely contains, so
every estimator is far off there until the batch is a sizeable share of the data.
Estimators: ``plug-in`` (every batch normalised by its own tilted risk,
the usual hand-written TiltedLoss; the running estimator with lam = 1), ``running`` (the
paper's running normaliser, lam = 0.1), ``mlmc`` (multilevel Monte Carlo, base batch B/4 and
3 levels: batches of B/2, B and 2B, mean size 0.86 B) and ``variational`` (lam = 0.1).

Data: ``load_drug_discovery(seed=0, noise=0.2)`` training split (3268 x 411, 20% of the
targets replaced by N(5, 5) draws); theta is the ridge least-squares fit (ridge 1e-3) of
that split, so the losses hold the outliers that t = -2 suppresses and t = 10 magnifies.

Run:
    python benchmarks/minibatch_bias.py                     # table on stdout
    python benchmarks/minibatch_bias.py --json bias.json --plot figures/
    python benchmarks/minibatch_bias.py --quick             # fewer batches and sizes
    python benchmarks/minibatch_bias.py --replot bias.json --plot figures/
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

import tiltlab
from tiltlab.datasets import load_drug_discovery
from tiltlab.minibatch import MinibatchTilt

TILTS = (-2.0, 1.0, 10.0)
SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
ESTIMATORS = ("plug-in", "running", "mlmc", "variational")


def problem(seed: int = 0):
    data = load_drug_discovery(seed=seed, noise=0.2)
    X, y = data.X_train, data.y_train
    d = X.shape[1]
    theta = np.linalg.solve(X.T @ X + 1e-3 * np.eye(d), X.T @ y)
    return X, y, theta


def make_estimator(name: str, t: float, batch_size: int, n: int) -> tuple[MinibatchTilt, int]:
    """The estimator and the base size of its batches (mlmc draws its own sizes)."""
    if name == "plug-in":
        return MinibatchTilt(t, lam=1.0), batch_size
    if name == "running":
        return MinibatchTilt(t, lam=0.1), batch_size
    if name == "variational":
        return MinibatchTilt(t, estimator="variational", lam=0.1), batch_size
    base = max(1, batch_size // 4)
    return MinibatchTilt(t, estimator="mlmc", base_batch_size=base, max_level=3), base


def measure(X, y, theta, t, name, batch_size, *, batches, burn_in, rng):
    n = X.shape[0]
    resid = X @ theta - y
    losses = resid**2
    exact = X.T @ (tiltlab.tilted_weights(losses, t) * 2 * resid)
    tilt, _ = make_estimator(name, t, batch_size, n)
    total = batches + burn_in
    if name == "mlmc":
        draws = iter(tilt.batch_sampler(n, num_batches=total, seed=rng))
    else:
        draws = (rng.choice(n, size=min(batch_size, n), replace=False) for _ in range(total))
    grads, sizes = [], []
    for k, idx in enumerate(draws):
        idx = np.asarray(idx)
        try:
            w = tilt.weights(losses[idx])
        except ValueError as exc:  # the variational weights overflow far from eta
            return {
                "t": t,
                "estimator": name,
                "batch_size": batch_size,
                "mean_batch_size": float("nan"),
                "relative_error": float("nan"),
                "noise_floor": float("nan"),
                "batches": k,
                "failed": str(exc),
            }
        if k >= burn_in:
            grads.append(X[idx].T @ (w * 2 * resid[idx]))
            sizes.append(idx.size)
    grads = np.array(grads)
    norm = np.linalg.norm(exact)
    with np.errstate(over="ignore", invalid="ignore"):  # the variational weights can explode
        mean = grads.mean(axis=0)
        floor = np.sqrt(np.trace(np.cov(grads.T)) / len(grads)) / norm
    return {
        "t": t,
        "estimator": name,
        "batch_size": batch_size,
        "mean_batch_size": float(np.mean(sizes)),
        "relative_error": float(np.linalg.norm(mean - exact) / norm),
        "noise_floor": float(floor),
        "batches": len(grads),
    }


def plot(rows, directory):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    tilts = sorted({r["t"] for r in rows})
    fig, axes = plt.subplots(1, len(tilts), figsize=(4.2 * len(tilts), 3.6), sharey=True)
    for ax, t in zip(np.atleast_1d(axes), tilts, strict=True):
        for name in ESTIMATORS:
            sel = [r for r in rows if r["t"] == t and r["estimator"] == name]
            if not sel:
                continue
            sizes = [r["mean_batch_size"] for r in sel]
            line = ax.loglog(sizes, [r["relative_error"] for r in sel], "o-", label=name)[0]
            ax.loglog(sizes, [r["noise_floor"] for r in sel], ":", color=line.get_color())
        ax.set_ylim(1e-3, 10.0)  # the variational estimator leaves the scale at t > 0
        ax.set_title(f"t = {t:g}")
        ax.set_xlabel("mean batch size")
    np.atleast_1d(axes)[0].set_ylabel("relative error of the mean gradient")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(
        "Drug Discovery (20% noisy targets), fixed ridge fit; dotted: Monte Carlo noise floor; "
        "values above 10 are off the scale",
        fontsize=9,
    )
    fig.tight_layout()
    path = os.path.join(directory, "minibatch_bias.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000, help="measured batches per cell")
    parser.add_argument("--burn-in", type=int, default=100)
    parser.add_argument("--tilts", type=float, nargs="+", default=list(TILTS))
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="300 batches, sizes 8, 64, 512")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--plot", help="write minibatch_bias.png into this folder")
    parser.add_argument("--replot", help="only redraw the figure from a --json file")
    args = parser.parse_args(argv)
    if args.replot:
        with open(args.replot, encoding="utf-8") as fh:
            rows = json.load(fh)["rows"]
        print("figure:", plot(rows, args.plot or "."))
        return rows
    if args.quick:
        args.batches, args.sizes = 300, [8, 64, 512]
    X, y, theta = problem(args.seed)
    rows = []
    start = time.perf_counter()
    print(f"{'t':>6} {'estimator':>12} {'batch':>6} {'mean B':>8} {'rel. error':>11} {'floor':>9}")
    for t in args.tilts:
        w = tiltlab.tilted_weights((X @ theta - y) ** 2, t)
        print(
            f"t = {t:g}: effective sample size of the exact weights 1/sum(w^2) = "
            f"{1 / np.sum(w**2):.1f} of {X.shape[0]}"
        )
        for name in args.estimators:
            for size in args.sizes:
                rng = np.random.default_rng([args.seed, size, int(1000 * t) % 2**31])
                row = measure(
                    X, y, theta, t, name, size, batches=args.batches, burn_in=args.burn_in, rng=rng
                )
                rows.append(row)
                print(
                    f"{t:>6g} {name:>12} {size:>6} {row['mean_batch_size']:>8.1f} "
                    f"{row['relative_error']:>11.3e} {row['noise_floor']:>9.2e}",
                    flush=True,
                )
    elapsed = time.perf_counter() - start
    print(f"{elapsed:.1f} s")
    meta = {
        "benchmark": "minibatch_bias",
        "data": "load_drug_discovery(seed, noise=0.2) training split",
        "batches": args.batches,
        "burn_in": args.burn_in,
        "seed": args.seed,
        "seconds": elapsed,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    if args.plot:
        print("figure:", plot(rows, args.plot))
    return rows


if __name__ == "__main__":
    main()
