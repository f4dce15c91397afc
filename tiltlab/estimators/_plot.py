"""Plot of a tilt search: the cross-validated score against ``t`` (matplotlib, optional)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_tilt_scores"]


def plot_tilt_scores(search: Any, ax: Any = None) -> Any:
    """Mean held-out score (with one standard deviation over the folds) against ``t``.

    The tilt axis is symmetric-logarithmic (linear near 0, logarithmic beyond the smallest
    non-zero tilt of the grid); the chosen tilt ``t_`` is marked.

    Parameters
    ----------
    search : TiltedRegressorCV or TiltedClassifierCV
        A fitted search.
    ax : matplotlib Axes, optional
        Where to draw (default: new axes).

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> from tiltlab.estimators import TiltedRegressorCV, plot_tilt_scores
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 2)); y = X @ np.array([1.0, 2.0]); y[:6] += 20
    >>> ax = plot_tilt_scores(TiltedRegressorCV(ts=[-1.0, 0.0, 1.0], cv=3).fit(X, y))
    >>> ax.get_xlabel()
    'tilt t'
    """
    if not hasattr(search, "cv_results_"):
        raise ValueError("`search` must be a fitted TiltedRegressorCV or TiltedClassifierCV")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(5.0, 3.4), layout="constrained")
    res = search.cv_results_
    ts = np.asarray(res["t"], dtype=float)
    order = np.argsort(ts)
    mean = np.asarray(res["mean_test_score"], dtype=float)[order]
    std = np.asarray(res["std_test_score"], dtype=float)[order]
    ts = ts[order]
    ax.plot(ts, mean, marker="o", color="C0", label="mean held-out score")
    ax.fill_between(ts, mean - std, mean + std, color="C0", alpha=0.2, label="+-1 sd over folds")
    ax.axvline(search.t_, color="C3", linestyle="--", label=f"chosen t = {search.t_:g}")
    nonzero = np.abs(ts[ts != 0])
    if nonzero.size:
        ax.set_xscale("symlog", linthresh=float(nonzero.min()))
    ax.set_xlabel("tilt t")
    scoring = getattr(search, "scoring_", "score")
    ax.set_ylabel(f"score ({scoring})" if isinstance(scoring, str) else "score")
    ax.legend(loc="best", fontsize="small")
    return ax
