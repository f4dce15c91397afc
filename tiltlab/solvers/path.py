"""Tilt paths: solutions along a grid of tilts with warm starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._compat import to_numpy
from ._continuation import Continuation
from ._minimize import minimize
from ._result import OptimizeResult, Status

__all__ = ["tilt_path", "TiltPath"]


@dataclass
class TiltPath:
    """Solutions of a tilted objective along a grid of tilts.

    Attributes
    ----------
    ts : ndarray of shape (T,)
        The tilts, in the order given.
    x : array of shape (T,) + theta.shape
        One solution per tilt (in the objective's namespace).
    results : list of OptimizeResult
        The solver's result at each tilt.
    stats : dict of ndarray
        Per tilt: ``mean``, ``max``, ``min``, ``variance`` of the losses at the solution
        under the objective's prior weights (``min``/``max`` over samples of positive
        weight), ``risk`` (the tilted objective value), ``entropy`` and ``ess`` of the
        tilted weights.
    objective : TiltedObjective
        The objective (its tilt is the last one solved).
    n_passes : float
        Passes over the data made by the whole path: every solve, and the predictions
        and tangents between them.
    """

    ts: np.ndarray
    x: Any
    results: list[OptimizeResult]
    stats: dict[str, np.ndarray]
    objective: Any = field(repr=False)
    n_passes: float = 0.0

    def __len__(self) -> int:
        return len(self.ts)

    def solution(self, t: float) -> Any:
        """The solution at tilt ``t`` (one of ``ts``)."""
        k = int(np.flatnonzero(self.ts == t)[0]) if np.any(self.ts == t) else None
        if k is None:
            raise ValueError(f"`t`={t} is not on the path")
        return self.x[k]

    @property
    def success(self) -> bool:
        """Every solve along the path converged."""
        return all(r.success for r in self.results)


def _order(ts: np.ndarray) -> list[int]:
    """Solve order: t >= 0 upwards from 0, then t < 0 downwards from 0."""
    pos = sorted((i for i in range(ts.size) if ts[i] >= 0), key=lambda i: ts[i])
    neg = sorted((i for i in range(ts.size) if ts[i] < 0), key=lambda i: -ts[i])
    return pos + neg


def _check_ts(ts: Any) -> np.ndarray:
    """``ts`` as a 1-d float64 array of finite tilts (numbers from any array library)."""
    if isinstance(ts, (str, bytes)):
        raise TypeError(f"`ts` must be a 1-d sequence of numbers, got the string {ts!r}")
    try:
        arr = np.asarray(to_numpy(ts)) if hasattr(ts, "shape") else np.asarray(ts)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`ts` must be a 1-d sequence of numbers: {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(
            f"`ts` must be a 1-d sequence of real numbers, got values of dtype {arr.dtype}"
        )
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"`ts` must be a non-empty 1-d sequence of tilts, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("`ts` must be finite (the solvers need a smooth objective)")
    return arr


def tilt_path(
    objective: Any,
    ts: Sequence[float],
    *,
    method: str = "lbfgs",
    warm_start: bool = True,
    theta0: Any = None,
    progress: bool = False,
    predictor: str = "tangent",
    **kwargs: Any,
) -> TiltPath:
    """Solve ``objective`` along the tilts ``ts`` with warm starts.

    Tilts at or above zero are solved upwards from ``t = 0`` and tilts below zero
    downwards from ``t = 0`` (continuation), so the path of solutions stays on one
    continuous branch even where the objective is non-convex (``t < 0``). The solution
    at ``t = 0`` is computed first when ``0`` is not in ``ts``.

    Each solve starts from a prediction of its solution. With ``predictor="tangent"``
    the path's tangent ``d theta/dt = -H^{-1} d(grad F)/dt`` is computed at every solved
    point (conjugate gradients on Hessian-vector products, or one dense Hessian for
    ``method="newton"`` with a dense Hessian) and the next solution is predicted by
    cubic Hermite extrapolation through the last two points and their tangents; with
    ``"secant"``, by linear extrapolation through the last two solutions. Of the
    prediction and the last solution, the one with the smaller gradient norm is used.
    Each solve also inherits the previous solver state (``warm_state`` of
    :func:`tiltlab.minimize`), except L-BFGS's correction pairs under the tangent
    predictor: the pairs of the end of a run describe curvature at the rounding level of
    the previous tilt and slowed the next run down. L-BFGS starts instead from exact
    curvature pairs of the last tangent solve: the Ritz vectors of the lowest Ritz values
    of the Hessian on the solve's Krylov subspace and their Hessian products (as many as
    its ``memory``; no extra pass over the data), which describe the directions it
    resolves last. Objectives without a tangent (non-linear models, a point of
    non-positive curvature) fall back to the secant. The predictions' cost is counted in
    ``TiltPath.n_passes``.

    Parameters
    ----------
    objective : TiltedObjective
        Sample-level objective; its ``t`` is varied (shares the data, no copy).
    ts : sequence of float
        Finite tilts.
    method : str, default "lbfgs"
        Passed to :func:`tiltlab.minimize`, with the other keyword arguments.
    warm_start : bool, default True
        Start each solve from a prediction (``False``: from ``theta0`` or zero).
    theta0 : array, optional
        Start of the ``t = 0`` solve.
    progress : bool, default False
        Show a progress bar over the tilts.
    predictor : {"tangent", "secant"}, default "tangent"
        How the next solution is predicted (see above).

    Returns
    -------
    TiltPath

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> X = np.c_[np.ones(20), np.linspace(0, 1, 20)]
    >>> y = X @ np.array([0.0, 1.0]); y[-1] += 5
    >>> path = tl.tilt_path(tl.TiltedObjective("squared", X, y), [-2.0, 0.0, 2.0])
    >>> bool(path.stats["max"][2] <= path.stats["max"][1] <= path.stats["max"][0])
    True
    """
    ts_arr = _check_ts(ts)
    if predictor not in ("tangent", "secant"):
        raise ValueError(f"`predictor` must be 'tangent' or 'secant', got {predictor!r}")
    if objective.is_hierarchical:
        raise NotImplementedError(
            "tilt_path varies the sample-level tilt; build one "
            "objective per tilts tuple for hierarchical paths"
        )
    xp = objective.xp
    base = objective.with_tilt(0.0)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=ts_arr.size, desc="tilt path", leave=False)
    results: dict[int, OptimizeResult] = {}
    start = base.zeros() if theta0 is None else base.check_theta(theta0, name="theta0")
    # anchor at t = 0, then continue outwards in both directions
    anchor = minimize(base, start, method=method, **kwargs)
    cont = Continuation(method, kwargs, warm_start and predictor == "tangent")
    origin = cont.point(base, 0.0, anchor, more=bool(np.any(ts_arr != 0.0)))
    passes = float(base.n_passes)
    for direction in ("pos", "neg"):
        todo = [i for i in _order(ts_arr) if (ts_arr[i] >= 0) == (direction == "pos")]
        todo = [i for i in todo if ts_arr[i] != 0.0]
        for i in range(ts_arr.size):
            if ts_arr[i] == 0.0:
                results[i] = anchor
        branch = [origin]  # the solved points of this branch, nearest to 0 first
        warm = anchor.solver_state
        for n, i in enumerate(todo):
            t = float(ts_arr[i])
            obj = objective.with_tilt(t)
            x = cont.predict(obj, branch, t) if warm_start else start
            extra = cont.solver_options(warm, branch[-1]) if warm_start else {}
            res = _solve(obj, x, method, kwargs, extra)
            results[i] = res
            more = warm_start and n + 1 < len(todo)
            branch.append(cont.point(obj, t, res, more=more, branch=branch))
            warm = res.solver_state
            passes += float(obj.n_passes)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    ordered = [results[i] for i in range(ts_arr.size)]
    X = xp.stack([r.x for r in ordered], axis=0)
    stats = _path_stats(objective, ts_arr, ordered)
    return TiltPath(
        ts=ts_arr, x=X, results=ordered, stats=stats, objective=objective, n_passes=passes
    )


def _solve(obj: Any, x: Any, method: str, kwargs: dict, extra: dict) -> OptimizeResult:
    """One tilt's solve with the warm-start options ``extra``.

    Where the warm run's line search fails (the carried curvature can be wrong at the
    rounding level of the new tilt), the run goes on from where it stopped with a fresh
    memory; the result reports both runs' iterations, evaluations, passes and history.
    """
    res = minimize(obj, x, method=method, **{**kwargs, **extra})
    if not extra or res.status is not Status.LINE_SEARCH_FAILED:
        return res
    again = minimize(obj, res.x, method=method, **kwargs)
    offset = {"n_passes": res.n_passes, "time": (res.history.get("time") or [0.0])[-1]}
    history = {
        k: list(res.history.get(k, [])) + [v + offset.get(k, 0.0) for v in vals]
        for k, vals in again.history.items()
    }
    runs = [r.n_iter_run for r in (res, again)]
    return dataclasses.replace(
        again,
        nit=res.nit + again.nit,
        nfev=res.nfev + again.nfev,
        n_passes=res.n_passes + again.n_passes,
        history=history,
        n_iter_run=None if None in runs else sum(runs),
    )


def _path_stats(objective: Any, ts: np.ndarray, results: list[OptimizeResult]):
    """Per-tilt statistics of the losses at each solution, under the prior weights.

    With prior weights ``p`` (uniform when the objective has none) the mean is
    ``sum p_i l_i``, the variance ``sum p_i (l_i - mean)^2``, and the minimum and maximum
    run over the samples of positive weight: the distribution the objective averages.
    """
    keys = ("mean", "max", "min", "variance", "risk", "entropy", "ess")
    from scipy.stats import entropy  # on first use: keeps `import tiltlab` light

    out = {k: np.empty(ts.size) for k in keys}
    for i, (t, r) in enumerate(zip(ts, results, strict=True)):
        obj = objective.with_tilt(float(t))
        ell = to_numpy(obj.losses(r.x)).astype(np.float64)
        w = to_numpy(obj.weights(r.x)).astype(np.float64)
        prior = obj.prior()  # after an evaluation, which prepares it
        if prior is None:
            q = np.full(ell.size, 1.0 / ell.size)
        else:
            q = to_numpy(prior).astype(np.float64)
            q = q / q.sum()
        support = ell[q > 0]
        mean = float(np.dot(q, ell))
        out["mean"][i] = mean
        out["max"][i] = support.max()
        out["min"][i] = support.min()
        out["variance"][i] = float(np.dot(q, (ell - mean) ** 2))
        out["risk"][i] = float(to_numpy(r.fun))
        out["entropy"][i] = float(entropy(w))
        out["ess"][i] = float(1.0 / np.sum(w * w))  # Kish's effective sample size
    return out
