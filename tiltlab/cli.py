"""The ``tiltlab`` console command.

``tiltlab demo``
    The paper's 2-D point-estimation toy with outliers: for a grid of tilts, the tilted
    solution and its tilted risk, min, mean and max loss and the effective sample size.
``tiltlab reproduce robust-regression [--seeds 5] [--noise 0.2 0.4 0.8] [--json PATH]``
    The paper's robust-regression table (Table 1) on the shipped Drug Discovery data,
    printed beside the published numbers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

__all__ = ["main", "demo_point_estimation"]

DEMO_TILTS = (-np.inf, -10.0, -2.0, -0.5, 0.0, 0.5, 2.0, 10.0, np.inf)


def demo_point_estimation(
    tilts: Sequence[float] = DEMO_TILTS,
    *,
    n: int = 100,
    outlier_fraction: float = 0.2,
    seed: int = 0,
) -> list[dict]:
    """Solve the 2-D point-estimation toy over a grid of tilts.

    The per-sample loss of a point estimate ``theta`` is ``||x_i - theta||^2``. Finite
    tilts are solved with :func:`tiltlab.tilt_path` (Newton, continuation from ``t = 0``
    outwards); ``t = +inf`` is the min-max point (the centre of the smallest enclosing
    ball, a convex problem solved by SciPy) and ``t = -inf`` the sample nearest the most
    negative finite solution (where continuation ends).

    Returns
    -------
    list of dict
        One row per tilt with keys ``t, theta, tilted_risk, min, mean, max, ess``.
    """
    from scipy.optimize import minimize as scipy_minimize

    from .datasets import point_estimation_2d, point_estimation_objective
    from .diagnostics import effective_sample_size
    from .risk import tilted_risk, tilted_weights
    from .solvers import tilt_path

    points, _ = point_estimation_2d(n=n, outlier_fraction=outlier_fraction, seed=seed)
    objective = point_estimation_objective(points)
    start = points.mean(axis=0)
    finite = [float(t) for t in tilts if np.isfinite(t)]
    thetas: dict[float, np.ndarray] = {}
    if finite:
        path = tilt_path(objective, finite, method="newton", tol=1e-10, theta0=start)
        thetas.update({t: np.asarray(x) for t, x in zip(finite, path.x, strict=True)})
    for t in (float(t) for t in tilts if not np.isfinite(t)):
        if t > 0:  # minimise the maximum loss: smallest enclosing ball (convex)
            res = scipy_minimize(
                lambda th: float(np.max(objective.losses(th))),
                start,
                method="Nelder-Mead",
                options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
            )
            thetas[t] = res.x
        else:  # minimise the minimum loss: the sample nearest the most negative solution
            neg = [thetas[k] for k in sorted(thetas) if k < 0] or [start]
            thetas[t] = points[int(np.argmin(objective.losses(neg[0])))].copy()
    out = []
    for t in (float(t) for t in tilts):
        ell = np.asarray(objective.losses(thetas[t]))
        out.append(
            {
                "t": t,
                "theta": thetas[t],
                "tilted_risk": float(tilted_risk(ell, t)),
                "min": float(ell.min()),
                "mean": float(ell.mean()),
                "max": float(ell.max()),
                "ess": float(effective_sample_size(tilted_weights(ell, t))),
            }
        )
    return out


def _cmd_demo(args: argparse.Namespace) -> int:
    rows = demo_point_estimation(n=args.n, outlier_fraction=args.outliers, seed=args.seed)
    print(
        "tiltlab demo: 2-D point estimation, inliers around (1, 1), "
        f"{args.outliers:.0%} outliers, n = {args.n}, seed = {args.seed}"
    )
    print("per-sample loss ||x_i - theta||^2; theta(t) minimises the t-tilted risk\n")
    header = f"{'t':>8} {'theta':>18} {'R(t)':>10} {'min':>9} {'mean':>9} {'max':>9} {'ESS':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        th = f"({r['theta'][0]:6.3f}, {r['theta'][1]:6.3f})"
        print(
            f"{r['t']:>8g} {th:>18} {r['tilted_risk']:>10.4f} {r['min']:>9.4f} "
            f"{r['mean']:>9.4f} {r['max']:>9.4f} {r['ess']:>7.1f}"
        )
    print(
        "\nNegative tilts suppress the outliers (theta moves to (1, 1), the ESS shrinks to "
        "the inliers);\npositive tilts pull theta towards the min-max point."
    )
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    import json

    from .reproduce import ROBUST_METHODS, format_robust_table, robust_regression

    if args.experiment != "robust-regression":  # pragma: no cover - argparse restricts
        raise SystemExit(f"unknown experiment {args.experiment!r}")
    methods = args.methods or list(ROBUST_METHODS)
    print(
        f"tiltlab reproduce robust-regression: Drug Discovery (4085 x 411), {args.seeds} "
        f"seed(s), noise {', '.join(f'{p:.0%}' for p in args.noise)}"
    )
    print(
        "clean test RMSE, mean (standard error over seeds); the paper's Table 1 beside it\n",
        flush=True,
    )
    rows = robust_regression(
        seeds=args.seeds, noise=args.noise, methods=methods, progress=not args.no_progress
    )
    print(format_robust_table(rows))
    print(
        "\nTERM: squared loss, t = -2, L-BFGS with early stopping on the noisy validation "
        "split.\nGenie ERM is the oracle fit on the clean rows only."
    )
    if args.json:
        keys = ("method", "noise", "test_rmse_mean", "test_rmse_se", "seconds")
        out = {
            "rows": [
                {k: r[k] for k in keys}
                | {
                    "test_rmse": r["test_rmse"],
                    "paper_mean": r["paper_mean"],
                    "paper_se": r["paper_se"],
                }
                for r in rows
            ]
        }
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiltlab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the 2-D point-estimation toy over a grid of tilts")
    demo.add_argument("--n", type=int, default=100, help="number of points (default 100)")
    demo.add_argument("--outliers", type=float, default=0.2, help="outlier fraction (default 0.2)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_cmd_demo)
    rep = sub.add_parser("reproduce", help="reproduce a table of the TERM paper")
    rep.add_argument(
        "experiment",
        choices=["robust-regression"],
        help="robust-regression: Table 1 on the Drug Discovery data",
    )
    rep.add_argument("--seeds", type=int, default=5, help="number of seeds (default 5)")
    rep.add_argument(
        "--noise",
        type=float,
        nargs="+",
        default=[0.2, 0.4, 0.8],
        help="noise fractions (default 0.2 0.4 0.8)",
    )
    rep.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="subset of ERM L1 Huber STIR CRR TERM 'Genie ERM'",
    )
    rep.add_argument("--json", default=None, help="write the rows to this JSON file")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    rep.set_defaults(func=_cmd_reproduce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiltlab`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
