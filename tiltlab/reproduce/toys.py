"""The toy panels of the paper's first figure and its trade-off figure, over a range of t.

Three toys from :mod:`tiltlab.datasets.toys`, each solved along a grid of tilts with
:func:`tiltlab.tilt_path` (warm-started continuation from ``t = 0``):

* ``point-estimation``: 2-D points around (1, 1) with 20% outliers around (4, 4), loss
  ``||x_i - theta||^2`` (:func:`~tiltlab.datasets.point_estimation_objective`); metric
  ``distance_to_inlier_center``;
* ``linear-regression``: a line with a block of 20% gross outliers, squared loss; metric
  ``rmse_inliers`` (the fit's error on the inliers);
* ``logistic-regression``: two Gaussian classes with a 1:9 imbalance, logistic loss;
  metrics ``accuracy_rare`` and ``accuracy_common``.

For every toy and tilt the rows also give the loss statistics of the paper's trade-off
figure: ``mean_loss``, ``max_loss``, ``min_loss`` and ``loss_variance`` (split ``train``).
The paper prints no numbers for these figures (``paper_mean`` is null); what it states,
and what the tests check, is the direction: negative tilts suppress the outliers, the max
loss falls and the min loss rises with ``t``, and the mean loss is smallest at ``t = 0``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np

from ._common import (
    Reproduction,
    format_grid,
    make_row,
    progress_bar,
    require_matplotlib,
    seed_list,
)

__all__ = ["TOY_TILTS", "TOY_TILTS_QUICK", "toys"]

#: The tilts of the full run.
TOY_TILTS = (-10.0, -5.0, -2.0, -1.0, -0.5, -0.2, -0.1, 0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: The tilts with ``quick=True``.
TOY_TILTS_QUICK = (-2.0, 0.0, 2.0)
_TOYS = ("point-estimation", "linear-regression", "logistic-regression")


def _toy(name: str, seed: int):
    """``(objective, extra)`` of one toy; ``extra`` holds the data for metrics and plots."""
    from ..datasets import (
        linear_regression_outliers,
        logistic_imbalanced,
        point_estimation_2d,
        point_estimation_objective,
    )
    from ..objective import TiltedObjective

    if name == "point-estimation":
        points, inlier = point_estimation_2d(n=100, outlier_fraction=0.2, seed=seed)
        return point_estimation_objective(points), {"X": points, "inlier": inlier}
    if name == "linear-regression":
        X, y, inlier = linear_regression_outliers(n=100, outlier_fraction=0.2, seed=seed)
        return TiltedObjective("squared", X, y), {"X": X, "y": y, "inlier": inlier}
    X, y = logistic_imbalanced(n=200, rare_fraction=0.1, seed=seed)
    return TiltedObjective("logistic", X, y), {"X": X, "y": y}


def _metrics(name: str, theta: np.ndarray, extra: dict) -> dict[str, float]:
    if name == "point-estimation":
        return {"distance_to_inlier_center": float(np.linalg.norm(theta - 1.0))}
    if name == "linear-regression":
        X, y, inl = extra["X"], extra["y"], extra["inlier"]
        return {"rmse_inliers": float(np.sqrt(np.mean((X[inl] @ theta - y[inl]) ** 2)))}
    X, y = extra["X"], extra["y"]
    pred = (X @ theta >= 0).astype(np.float64)
    return {
        "accuracy_rare": float(np.mean(pred[y == 1] == 1)),
        "accuracy_common": float(np.mean(pred[y == 0] == 0)),
    }


def toys(
    seeds: int | Sequence[int] = 1,
    *,
    quick: bool = False,
    tilts: Sequence[float] | None = None,
    progress: bool = False,
) -> Reproduction:
    """The three toy problems of the paper's first figure over a grid of tilts.

    Parameters
    ----------
    seeds : int or sequence of int, default 1
        Data seeds (the paper shows one draw); with several, rows give mean and standard
        error over draws and the figures show the first.
    quick : bool, default False
        Three tilts (-2, 0, 2) instead of fifteen from -10 to 10.
    tilts : sequence of float, optional
        Finite tilts to use instead.
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    Reproduction
        Rows per toy (``setting = "<toy>, t=<t>"``), with the loss statistics and the
        toy's own metric; ``curves`` holds the solutions for the figures.

    See Also
    --------
    tiltlab.reproduce.run : Runs an experiment by its command name.
    :func:`~tiltlab.reproduce.convergence` : Convergence with the tilt.

    Examples
    --------
    >>> from tiltlab.reproduce import toys
    >>> rep = toys(quick=True)
    >>> by = {(r["setting"], r["metric"]): r["mean"] for r in rep.rows}
    >>> d = "distance_to_inlier_center"
    >>> by[("point-estimation, t=-2", d)] < by[("point-estimation, t=0", d)]
    True
    """
    from ..solvers import tilt_path

    seeds_ = seed_list(seeds)
    ts = [float(t) for t in (tilts if tilts is not None else
                             (TOY_TILTS_QUICK if quick else TOY_TILTS))]  # fmt: skip
    if not ts or not all(np.isfinite(ts)):
        raise ValueError(f"`tilts` must be a non-empty list of finite numbers, got {ts}")
    values: dict[tuple[str, float, str], list[float]] = {}
    curves: dict[str, dict] = {}
    bar = progress_bar(progress, len(seeds_) * len(_TOYS), "toys")
    started = time.perf_counter()
    for s in seeds_:
        for name in _TOYS:
            bar.set_postfix_str(f"seed={s} {name}")
            objective, extra = _toy(name, s)
            kw = {"method": "newton", "tol": 1e-10}
            if name == "point-estimation":
                kw["theta0"] = extra["X"].mean(axis=0)
            path = tilt_path(objective, ts, **kw)
            thetas = [np.asarray(x) for x in path.x]
            for k, t in enumerate(path.ts):
                stats = {
                    "mean_loss": path.stats["mean"][k],
                    "max_loss": path.stats["max"][k],
                    "min_loss": path.stats["min"][k],
                    "loss_variance": path.stats["variance"][k],
                }
                stats.update(_metrics(name, thetas[k], extra))
                for metric, v in stats.items():
                    values.setdefault((name, float(t), metric), []).append(float(v))
            if s == seeds_[0]:
                curves[name] = {"ts": np.asarray(path.ts), "thetas": thetas, **extra}
            bar.update(1)
    bar.close()
    rows = [
        make_row("TERM", f"{name}, t={t:g}", metric, "train", vals)
        for (name, t, metric), vals in values.items()
    ]
    seconds = time.perf_counter() - started
    table = format_grid(
        rows,
        row_of=lambda r: r["metric"],
        col_of=lambda r: "t=" + r["setting"].split("t=")[1],
        block_of=lambda r: r["setting"].split(",")[0],
        row_header="metric",
        show_se=False,
    )
    notes = (
        "Paper: figure 1 (toys) and the appendix trade-off figure; it prints no numbers, "
        "so only the directions compare:\nnegative t moves the estimate and the line to the "
        "inliers, the max loss falls and the min loss rises from\nt = -2 through 0 to 2, and "
        "the mean loss is smallest at t = 0. Along the whole grid the min loss is not "
        "monotone\nfor t < 0 (the paper's min/mean trade-off for t < 0 does not hold as "
        "printed; see tiltlab.theory).\nOn the logistic toy, sample-level tilting changes the rare "
        "class's accuracy little\n(class-level tilting, as in hiv1-fairness, is the tool for "
        "imbalance). The toy data are tiltlab's seeded re-creations\n(the paper's draws "
        "are not published), so the pictures match in shape, not point for point. "
        f"{len(seeds_)} seed(s), {seconds:.1f} s."
    )
    return Reproduction(
        experiment="toys",
        rows=rows,
        title=(
            f"tiltlab reproduce toys: point estimation, linear and logistic regression over "
            f"{len(ts)} tilts, {len(seeds_)} seed(s)\n(means over seeds; standard errors in "
            "the JSON)"
        ),
        table=table,
        notes=notes,
        curves=curves,
        plotter=_plot,
    )


def _plot(rep: Reproduction, directory: str) -> list[str]:
    plt = require_matplotlib()
    cmap = plt.get_cmap("coolwarm")
    c = rep.curves
    ts = c["point-estimation"]["ts"]
    lim = max(abs(float(ts.min())), abs(float(ts.max())), 1e-12)

    def colour(t: float):
        return cmap(0.5 + 0.5 * np.sign(t) * (abs(t) / lim) ** 0.5)

    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
    pe = c["point-estimation"]
    ax = axes[0]
    ax.scatter(*pe["X"][pe["inlier"]].T, s=10, c="tab:green", label="inliers")
    ax.scatter(*pe["X"][~pe["inlier"]].T, s=10, c="tab:brown", label="outliers")
    for t, th in zip(pe["ts"], pe["thetas"], strict=True):
        ax.plot(*th, "o", ms=7, mec="k", color=colour(t))
    ax.set_title("(a) point estimation")
    ax.legend(loc="upper left", fontsize=8)
    lr = c["linear-regression"]
    ax = axes[1]
    x = lr["X"][:, 0]
    ax.scatter(x[lr["inlier"]], lr["y"][lr["inlier"]], s=10, c="tab:green")
    ax.scatter(x[~lr["inlier"]], lr["y"][~lr["inlier"]], s=10, c="tab:brown")
    grid = np.linspace(x.min(), x.max(), 2)
    for t, th in zip(lr["ts"], lr["thetas"], strict=True):
        ax.plot(grid, th[0] * grid + th[1], color=colour(t), lw=1.5)
    ax.set_title("(b) linear regression with outliers")
    lg = c["logistic-regression"]
    ax = axes[2]
    X, y = lg["X"], lg["y"]
    ax.scatter(*X[y == 0, :2].T, s=10, c="tab:blue", label="common")
    ax.scatter(*X[y == 1, :2].T, s=10, c="tab:orange", label="rare")
    gx = np.linspace(X[:, 0].min(), X[:, 0].max(), 2)
    for t, th in zip(lg["ts"], lg["thetas"], strict=True):
        if abs(th[1]) > 1e-12:
            ax.plot(gx, -(th[0] * gx + th[2]) / th[1], color=colour(t), lw=1.5)
    ax.set_ylim(X[:, 1].min() - 0.5, X[:, 1].max() + 0.5)
    ax.set_title("(c) logistic regression, imbalanced classes")
    ax.legend(loc="upper left", fontsize=8)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-lim, lim))
    fig.colorbar(sm, ax=axes, label="t (colour scale ~ sign(t) sqrt|t|)")
    path = os.path.join(directory, "toys.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)

    by = {(r["setting"], r["metric"]): r["mean"] for r in rep.rows}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), layout="constrained")
    for i, name in enumerate(("point-estimation", "logistic-regression")):
        tt = c[name]["ts"]
        get = {m: [by[(f"{name}, t={t:g}", m)] for t in tt]
               for m in ("mean_loss", "max_loss", "min_loss", "loss_variance")}  # fmt: skip
        ax = axes[i, 0]
        for m, style in (("max_loss", "r-o"), ("mean_loss", "k-o"), ("min_loss", "b-o")):
            ax.plot(tt, get[m], style, ms=3, label=m.replace("_", " "))
        ax.set_xlabel("t")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_title(f"{name}: average vs max/min loss")
        ax.legend(fontsize=8)
        ax = axes[i, 1]
        ax.plot(tt, get["loss_variance"], "g-o", ms=3)
        ax.set_xlabel("t")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_yscale("log")
        ax.set_title(f"{name}: variance of the losses")
    path = os.path.join(directory, "toys_tradeoffs.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
    return paths
