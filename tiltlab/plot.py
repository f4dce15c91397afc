"""Matplotlib helpers for tilt paths, trade-off curves, superquantile curves and groups.

Matplotlib is imported inside the functions, so ``import tiltlab.plot`` works without it;
every function draws on the axes it is given (or on new ones), returns them, and never
calls ``plt.show()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._compat import to_numpy

__all__ = [
    "plot_tradeoffs",
    "plot_quantile_curves",
    "plot_path",
    "plot_group_report",
    "tilt_axis_scale",
]


def _new_axes(n: int, width: float = 6.0, height: float = 3.2):
    """``n`` panels stacked in one column (readable in a page or a notebook)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(n, 1, figsize=(width, height * n), squeeze=False)
    fig.set_layout_engine("constrained")
    return list(axes[:, 0])


def tilt_axis_scale(t: Any) -> tuple[str, dict]:
    """The x-axis scale for tilts ``t``: linear, or logarithmic for log-spaced tilts.

    Tilts whose nonzero magnitudes span more than two decades get a logarithmic axis
    (``"log"`` when all are positive, else ``"symlog"``, linear within the smallest
    nonzero magnitude of zero); other grids keep a linear axis.

    Parameters
    ----------
    t : array_like
        The tilts (infinite ones are ignored).

    Returns
    -------
    scale : str
        ``"linear"``, ``"log"`` or ``"symlog"``, for ``Axes.set_xscale``.
    kwargs : dict
        Its keyword arguments (``linthresh`` for ``"symlog"``).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.plot import tilt_axis_scale
    >>> tilt_axis_scale([-2.0, -1.0, 0.0, 1.0, 2.0])
    ('linear', {})
    >>> tilt_axis_scale(np.logspace(-2, 1, 7))
    ('log', {})
    >>> tilt_axis_scale([-10.0, -0.01, 0.0, 0.01, 10.0])
    ('symlog', {'linthresh': 0.01})
    """
    t = np.asarray(t, dtype=np.float64).ravel()
    mag = np.abs(t[np.isfinite(t) & (t != 0)])
    if mag.size < 2 or mag.max() <= 100.0 * mag.min():
        return "linear", {}
    if np.all(t[np.isfinite(t)] > 0):
        return "log", {}
    return "symlog", {"linthresh": float(mag.min())}


def _set_tilt_axis(ax: Any, t: Any) -> None:
    scale, kwargs = tilt_axis_scale(t)
    ax.set_xscale(scale, **kwargs)


def plot_tradeoffs(path_or_curves: Any, ax: Any = None) -> Any:
    """The paper's trade-off figure: loss statistics of the tilted solutions against ``t``.

    Three panels: mean, max and min loss; the loss variance; the entropy of the tilted
    weights ``w(t; theta(t))`` (with the cosine similarity of the loss vector and the
    all-ones vector on a second axis). Log-spaced tilts get a logarithmic axis
    (:func:`tilt_axis_scale`).

    Parameters
    ----------
    path_or_curves : TiltPath or dict
        A tilt path, or the output of :func:`tiltlab.theory.tradeoff_curves`.
    ax : Axes or sequence of 3 Axes, optional
        Where to draw. One ``Axes`` gets only the mean/max/min panel; by default a new
        figure with three panels is made.

    Returns
    -------
    list of Axes
        The axes drawn on (one or three).

    See Also
    --------
    tiltlab.theory.tradeoff_curves : The data drawn.
    plot_path : The solutions themselves.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.plot import plot_tradeoffs
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> obj = tl.TiltedObjective("squared", X, X[:, 0] ** 2)
    >>> path = tl.tilt_path(obj, [-1.0, 0.0, 1.0])
    >>> len(plot_tradeoffs(path))
    3
    """
    from .theory import tradeoff_curves

    curves = path_or_curves if isinstance(path_or_curves, Mapping) else None
    if curves is None:
        curves = tradeoff_curves(path_or_curves)
    for key in ("t", "mean", "max", "min"):
        if key not in curves:
            raise ValueError(f"`path_or_curves` lacks {key!r}; pass a path or tradeoff_curves()")
    if ax is None:
        axes = _new_axes(3)
    elif isinstance(ax, Sequence) or isinstance(ax, np.ndarray):
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        if len(axes) not in (1, 3):
            raise ValueError(f"`ax` must be one Axes or three, got {len(axes)}")
    else:
        axes = [ax]
    t = np.asarray(curves["t"])
    a0 = axes[0]
    a0.plot(t, curves["max"], "-o", ms=3, label="max loss")
    a0.plot(t, curves["mean"], "-o", ms=3, label="mean loss")
    a0.plot(t, curves["min"], "-o", ms=3, label="min loss")
    a0.axvline(0.0, color="0.7", lw=0.8)
    a0.set_xlabel("tilt t")
    a0.set_ylabel("loss at the t-tilted solution")
    a0.legend(fontsize="small")
    _set_tilt_axis(a0, t)
    if len(axes) == 3:
        a1, a2 = axes[1], axes[2]
        a1.plot(t, curves["variance"], "-o", ms=3, color="C3")
        a1.axvline(0.0, color="0.7", lw=0.8)
        a1.set_xlabel("tilt t")
        a1.set_ylabel("variance of the losses")
        _set_tilt_axis(a1, t)
        a2.plot(t, curves["entropy"], "-o", ms=3, color="C4", label="weight entropy")
        a2.axvline(0.0, color="0.7", lw=0.8)
        a2.set_xlabel("tilt t")
        a2.set_ylabel("entropy of w(t; theta(t))")
        _set_tilt_axis(a2, t)
        if "cosine" in curves and np.any(np.isfinite(curves["cosine"])):
            tw = a2.twinx()
            tw.plot(t, curves["cosine"], "--", color="C5", label="cosine(loss, 1)")
            tw.set_ylabel("cosine similarity with 1")
            lines = a2.get_lines()[:1] + tw.get_lines()
            a2.legend(lines, [ln.get_label() for ln in lines], fontsize="small")
    return axes


def _as_quantile_curves(curves: Any, a: Any) -> Mapping[str, Any]:
    """The curves of a path (computed at ``a``), or the given mapping, checked."""
    from .solvers import TiltPath

    if isinstance(curves, TiltPath):
        if a is None:
            raise ValueError("`a` is required when `curves` is a TiltPath")
        from .bounds import quantile_curves

        return quantile_curves(curves, a)
    if not isinstance(curves, Mapping):
        raise TypeError(
            "`curves` must be the dict of tiltlab.bounds.quantile_curves or a TiltPath, "
            f"got {type(curves).__name__}"
        )
    return curves


def plot_quantile_curves(
    curves: Mapping[str, Any], a: Any = None, ax: Any = None, Q0: Any = None
) -> Any:
    """The paper's superquantile figure: ``Q1``, ``Q2``, ``Q3`` (and ``Q0``) against ``a``.

    Parameters
    ----------
    curves : dict or TiltPath
        Output of :func:`tiltlab.bounds.quantile_curves`, or a
        :class:`~tiltlab.solvers.TiltPath` whose curves are computed at ``a``.
    a : 1-d array, optional
        Thresholds (default ``curves["a"]``; required with a path).
    ax : Axes, optional
        Where to draw (default: a new figure).
    Q0 : 1-d array, optional
        The exact minimum :func:`tiltlab.bounds.min_tail_fraction`, drawn as well.

    Returns
    -------
    Axes

    See Also
    --------
    tiltlab.bounds.quantile_curves : The data drawn.
    tiltlab.bounds.min_tail_fraction : The exact curve.

    Notes
    -----
    ``Q3`` (the bound) is drawn clipped to ``[0, 1.05]``: above one it is vacuous.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.bounds import quantile_curves
    >>> from tiltlab.plot import plot_quantile_curves
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> obj = tl.TiltedObjective("squared", X, X[:, 0] ** 2)
    >>> path = tl.tilt_path(obj, [-1.0, 0.0, 1.0])
    >>> a = np.linspace(0.001, 0.05, 20)
    >>> ax = plot_quantile_curves(quantile_curves(path, a), a)
    >>> ax.get_xlabel()
    'threshold a'
    """
    curves = _as_quantile_curves(curves, a)
    if ax is None:
        ax = _new_axes(1, width=5.0, height=3.6)[0]
    if a is None:
        a = curves["a"]
    aa = np.asarray(to_numpy(a) if hasattr(a, "__array_namespace__") else a, dtype=np.float64)
    for key in ("Q1", "Q2", "Q3"):
        if np.shape(curves[key]) != aa.shape:
            raise ValueError(f"`a` has shape {aa.shape} but curves[{key!r}] has another")
    if Q0 is not None:
        ax.step(aa, np.asarray(Q0), where="post", color="k", lw=1.8, label="Q0 (global optimum)")
    ax.step(aa, curves["Q1"], where="post", color="C0", label="Q1 (best on the path)")
    ax.step(aa, curves["Q2"], where="post", color="C1", ls="--", label="Q2 = Q(a; theta(t~))")
    ax.plot(aa, np.minimum(curves["Q3"], 1.05), color="C2", label="Q3 (tilted bound)")
    ax.set_ylim(-0.02, 1.07)
    ax.set_xlabel("threshold a")
    ax.set_ylabel("share of losses >= a")
    ax.legend(fontsize="small")
    return ax


def plot_path(path: Any, ax: Any = None, *, coords: Sequence[int] | None = None) -> Any:
    """Components of the tilted solutions ``theta(t)`` against ``t``.

    Parameters
    ----------
    path : TiltPath
    ax : Axes, optional
        Where to draw (default: a new figure).
    coords : sequence of int, optional
        Which (flattened) parameter components to draw (default: all, up to ten).

    Returns
    -------
    Axes

    See Also
    --------
    plot_tradeoffs : The loss statistics along the same path.
    tiltlab.tilt_path : Computes the path.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.plot import plot_path
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> obj = tl.TiltedObjective("squared", X, X[:, 0] ** 2)
    >>> path = tl.tilt_path(obj, [-1.0, 0.0, 1.0])
    >>> [line.get_label() for line in plot_path(path).get_lines()][:2]
    ['theta[0]', 'theta[1]']
    """
    if not hasattr(path, "ts") or not hasattr(path, "x"):
        raise TypeError("`path` must be a TiltPath (from tiltlab.tilt_path)")
    if ax is None:
        ax = _new_axes(1, width=5.0, height=3.6)[0]
    t = np.asarray(path.ts, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    X = np.asarray(to_numpy(path.x), dtype=np.float64).reshape(t.size, -1)
    if coords is None:
        coords = range(min(X.shape[1], 10))
    for j in coords:
        if not 0 <= int(j) < X.shape[1]:
            raise ValueError(f"`coords` entry {j} is out of range for {X.shape[1]} parameters")
        ax.plot(t[order], X[order, int(j)], "-o", ms=3, label=f"theta[{int(j)}]")
    ax.axvline(0.0, color="0.7", lw=0.8)
    ax.set_xlabel("tilt t")
    ax.set_ylabel("tilted solution")
    ax.legend(fontsize="small")
    _set_tilt_axis(ax, t)
    return ax


def plot_group_report(report: Mapping[str, Any], ax: Any = None, *, max_groups: int = 40) -> Any:
    """A per-group report as two bar panels, groups sorted by risk (largest first).

    The top panel compares each group's share of the data (``"mass"``) with its weight in
    the outer tilt (``"weight"``): a positive outer tilt moves weight to the groups of
    large risk, a negative one away from them. The bottom panel shows the share of each
    group's samples that the inner tilt effectively keeps (``"ess"``), with the group's
    risk on a second axis.

    Parameters
    ----------
    report : mapping
        A :func:`tiltlab.diagnostics.group_report` (arrays of any backend).
    ax : sequence of two Axes, optional
        Where to draw (default: a new figure).
    max_groups : int, optional
        Draw at most this many groups: the largest and the smallest risks, half each.

    Returns
    -------
    list of Axes
        The two panels.

    See Also
    --------
    tiltlab.diagnostics.group_report : Computes the report.
    tiltlab.diagnostics.format_group_report : The same as a table.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> from tiltlab.diagnostics import group_report
    >>> from tiltlab.plot import plot_group_report
    >>> l = np.array([0.1, 0.2, 0.3, 2.0, 2.5, 9.0])
    >>> top, bottom = plot_group_report(group_report(l, [0, 0, 0, 1, 1, 1], (1.0, -1.0)))
    >>> [t.get_text() for t in top.get_xticklabels()]
    ['1', '0']
    """
    keys = ("group", "risk", "mass", "weight", "ess")
    missing = [k for k in keys if k not in report]
    if missing:
        raise ValueError(f"`report` lacks the entries {missing} (pass a group_report)")
    if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 2:
        raise ValueError(f"`max_groups` must be an integer of at least 2, got {max_groups!r}")
    host = {k: np.asarray(report[k]) if k == "group" else to_numpy(report[k]) for k in keys}
    order = np.argsort(-np.asarray(host["risk"], dtype=np.float64), kind="stable")
    if order.size > max_groups:
        half = max_groups // 2
        order = np.concatenate([order[:half], order[order.size - (max_groups - half) :]])
    if ax is None:
        ax = _new_axes(2, width=max(5.0, 0.35 * order.size + 2.0), height=2.8)
    top, bottom = ax
    x = np.arange(order.size)
    labels = [str(v) for v in host["group"][order]]
    top.bar(x - 0.2, host["mass"][order], width=0.4, label="mass (share of data)")
    top.bar(x + 0.2, host["weight"][order], width=0.4, label="weight (outer tilt)")
    top.set_ylabel("share")
    top.legend(fontsize="small")
    bottom.bar(x, host["ess"][order], width=0.6, color="0.6", label="ESS fraction")
    bottom.set_ylim(0.0, 1.05)
    bottom.set_ylabel("ESS / group size")
    twin = bottom.twinx()
    twin.plot(x, host["risk"][order], "o", color="C3", ms=4, label="risk")
    twin.set_ylabel("risk (inner tilt)")
    for a in (top, bottom):
        a.set_xticks(x)
        a.set_xticklabels(labels, rotation=90 if order.size > 12 else 0)
    bottom.set_xlabel("group (largest risk first)")
    return [top, bottom]
