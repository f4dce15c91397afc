r"""Curvature of tilted objectives: smoothness, strong convexity, condition number and
the second-order classification of stationary points."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import (
    device,
    to_numpy,
)
from ..objective import TiltedObjective
from ._checks import _check_finite_tilts, _check_method, _check_objective, _n_params, _theta_of
from ._linalg import _eigvalsh, _hvp_operator

__all__ = [
    "CurvatureEstimate",
    "StationaryPoint",
    "smoothness",
    "strong_convexity",
    "condition_number",
    "classify_stationary_point",
]


@dataclass(frozen=True)
class CurvatureEstimate:
    """An extreme Hessian eigenvalue, at ``theta`` or over a sampled ball around it.

    Attributes
    ----------
    value : 0-d array
        The largest (``which="largest"``) or smallest (``which="smallest"``) eigenvalue,
        maximised (resp. minimised) over the evaluated points.
    n_evaluated : int
        Number of points whose Hessian was examined (``theta`` itself plus the samples).
    point : array
        The evaluated point attaining ``value`` (``theta``'s shape).
    which : str
        ``"largest"`` or ``"smallest"``.
    method : str
        The eigensolver used: ``"dense"`` or ``"lanczos"``.
    """

    value: Any
    n_evaluated: int
    point: Any
    which: str
    method: str

    @property
    def argmax(self) -> Any:
        """The point of largest curvature (for :func:`smoothness` results)."""
        if self.which != "largest":
            raise AttributeError("`argmax` is defined for smoothness results; use `argmin`")
        return self.point

    @property
    def argmin(self) -> Any:
        """The point of smallest curvature (for :func:`strong_convexity` results)."""
        if self.which != "smallest":
            raise AttributeError("`argmin` is defined for strong_convexity results; use `argmax`")
        return self.point


@dataclass(frozen=True)
class StationaryPoint:
    """Second-order classification of a (candidate) stationary point.

    Attributes
    ----------
    kind : str
        ``"local minimum"``, ``"strict saddle"``, ``"local maximum"`` or ``"degenerate"``.
    eigenvalues : array
        Hessian eigenvalues in ascending order (all of them with the dense solver; the
        smallest and the largest with Lanczos).
    gradient_norm : 0-d array
        Euclidean norm of the objective's gradient at the point.
    is_stationary : bool
        ``gradient_norm <= grad_tol``. ``kind`` describes the Hessian either way, but it
        only classifies a stationary point when this is True.
    tol, grad_tol : float
        The thresholds used.
    """

    kind: str
    eigenvalues: Any
    gradient_norm: Any
    is_stationary: bool
    tol: float
    grad_tol: float


def _lanczos_extreme(objective: TiltedObjective, th: Any, which: str, seed: int) -> Any:
    """Extreme eigenvalue by Lanczos (``eigsh``) on ``objective.hvp``."""
    from scipy.sparse.linalg import eigsh

    xp = objective.xp
    p = _n_params(th)
    if p == 1:
        v = xp.reshape(xp.ones_like(th), tuple(th.shape))
        return xp.reshape(objective.hvp(th, v), ())
    op = _hvp_operator(objective, th)
    v0 = np.random.default_rng(seed).standard_normal(p)
    ev = eigsh(
        op,
        k=1,
        which="LA" if which == "largest" else "SA",
        v0=v0,
        tol=0.0,
        return_eigenvectors=False,
    )
    return xp.asarray(float(ev[0]), dtype=th.dtype, device=device(th))


def _extreme(objective: TiltedObjective, th: Any, which: str, method: str, seed: int) -> Any:
    if method == "dense":
        ev = _eigvalsh(objective.hessian(th), objective.xp)
        return ev[-1] if which == "largest" else ev[0]
    return _lanczos_extreme(objective, th, which, seed)


def _ball_points(th: Any, radius: float, n: int, seed: int, xp: Any) -> Any:
    """``theta`` followed by ``n`` points drawn uniformly in the ball of ``radius``."""
    p = _n_params(th)
    flat = xp.reshape(th, (1, p))
    if n == 0 or radius == 0.0:
        return flat
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((n, p))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    # uniform in the ball: the radius has density ~ r^(p-1), i.e. r = R * U^(1/p)
    offsets = dirs * (radius * rng.random(n) ** (1.0 / p))[:, None]
    off = xp.asarray(offsets, device=device(th))
    off = xp.astype(off, th.dtype)
    return xp.concat([flat, flat + off], axis=0)


def _curvature(
    objective: Any,
    theta: Any,
    which: str,
    radius: float,
    n_samples: int,
    seed: int,
    method: str,
) -> CurvatureEstimate:
    obj = _check_objective(objective)
    _check_finite_tilts(obj)
    xp = obj.xp
    th = _theta_of(obj, theta)
    if not (
        isinstance(radius, (int, float, np.floating, np.integer))
        and math.isfinite(radius)
        and radius >= 0
    ):
        raise ValueError(f"`radius` must be a finite non-negative number, got {radius!r}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 0:
        raise ValueError(f"`n_samples` must be a non-negative integer, got {n_samples!r}")
    p = _n_params(th)
    solver = _check_method(method, p)
    points = _ball_points(th, float(radius), int(n_samples), seed, xp)
    m = int(points.shape[0])
    values = xp.stack(
        [
            _extreme(obj, xp.reshape(points[j, :], tuple(th.shape)), which, solver, seed)
            for j in range(m)
        ]
    )
    best = xp.argmax(values) if which == "largest" else xp.argmin(values)
    value = xp.max(values) if which == "largest" else xp.min(values)
    # select the row without integer indexing by an array (keeps lazy backends lazy)
    rows = xp.arange(m, device=device(values))
    mask = xp.astype(rows == xp.astype(best, rows.dtype), points.dtype)
    point = xp.reshape(xp.sum(mask[:, None] * points, axis=0), tuple(th.shape))
    return CurvatureEstimate(value, m, point, which, solver)


def smoothness(
    objective: Any,
    theta: Any,
    *,
    radius: float = 0.0,
    n_samples: int = 64,
    seed: int = 0,
    method: str = "auto",
) -> CurvatureEstimate:
    r"""Smoothness :math:`\beta`: the largest eigenvalue of the objective's Hessian.

    With ``radius > 0`` this estimates the paper's
    :math:`\beta(t) = \sup_{\theta' \in B(\theta, r)} \lambda_{\max}(\nabla^2 F(\theta'))`
    (lemma "Smoothness of R(t; theta) in the vicinity of the final solution") by taking
    the maximum over ``theta`` and ``n_samples`` points drawn uniformly in the ball. A
    sampled supremum is a lower bound of the true one; ``n_evaluated`` reports how many
    points it rests on.

    Parameters
    ----------
    objective : TiltedObjective
        Any objective with a Hessian (linear-predictor losses, or callable losses with
        per-sample Hessians), sample-level or hierarchical, at finite tilts.
    theta : array
        The centre point, in the objective's parameter shape (or flat).
    radius : float, default 0.0
        Radius of the ball; 0 evaluates at ``theta`` only.
    n_samples : int, default 64
        Points sampled in the ball when ``radius > 0``.
    seed : int, default 0
        Seed of the NumPy generator drawing the points (and Lanczos start vectors).
    method : {"auto", "dense", "lanczos"}, default "auto"
        ``"dense"``: symmetric eigenvalues of ``objective.hessian`` with
        ``xp.linalg.eigvalsh`` (a NumPy host copy for namespaces without it, e.g. Dask).
        ``"lanczos"``: ``scipy.sparse.linalg.eigsh`` on a ``LinearOperator`` wrapping
        ``objective.hvp``; vectors travel to the host and back each product, so it suits
        large parameter counts, where the Hessian would be costly to form.
        ``"auto"``: dense for at most 500 parameters, else Lanczos.

    Returns
    -------
    CurvatureEstimate
        ``value`` (0-d array of the objective's namespace and dtype), ``n_evaluated``,
        ``point`` (also available as ``argmax``), ``which="largest"``, ``method``.

    Raises
    ------
    ValueError
        Infinite tilt, bad ``radius``, ``n_samples`` or ``method``, wrong ``theta`` shape.

    See Also
    --------
    strong_convexity : The smallest Hessian eigenvalue.
    condition_number : Their ratio.
    fit_step_size_rule : Fits the paper's step-size rule to it.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import smoothness
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    >>> obj = TiltedObjective("squared", X, np.array([0.0, 1.0, 3.0]), t=0.0)
    >>> res = smoothness(obj, np.zeros(2))
    >>> bool(np.isclose(res.value, np.linalg.eigvalsh(2 * X.T @ X / 3)[-1]))
    True
    >>> smoothness(obj.with_tilt(1.0), np.zeros(2), radius=0.5, n_samples=8).n_evaluated
    9
    """
    return _curvature(objective, theta, "largest", radius, n_samples, seed, method)


def strong_convexity(
    objective: Any,
    theta: Any,
    *,
    radius: float = 0.0,
    n_samples: int = 64,
    seed: int = 0,
    method: str = "auto",
) -> CurvatureEstimate:
    r"""Strong convexity: the smallest eigenvalue of the objective's Hessian.

    With ``radius > 0``, the minimum over ``theta`` and ``n_samples`` points drawn
    uniformly in the ball around it. For ``t > 0`` and convex losses the tilted Hessian
    lemma gives :math:`\nabla^2 F \succeq \sum_i w_i \nabla^2 \ell_i + \lambda I`, so the
    value is at least the ridge ``l2`` (plus the losses' own curvature). Negative values
    mean non-convexity (possible for ``t < 0``).

    Parameters
    ----------
    objective, theta, radius, n_samples, seed, method
        As for :func:`smoothness` (Lanczos uses ``which="SA"``).

    Returns
    -------
    CurvatureEstimate
        ``which="smallest"``; the minimising point is ``point`` (or ``argmin``).

    See Also
    --------
    smoothness : The largest Hessian eigenvalue.
    classify_stationary_point : Minimum, maximum or saddle.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import strong_convexity
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.standard_normal((20, 3)), rng.integers(0, 2, 20)
    >>> obj = TiltedObjective("logistic", X, y, t=2.0, l2=0.1)
    >>> bool(strong_convexity(obj, np.ones(3)).value >= 0.1)
    True
    """
    return _curvature(objective, theta, "smallest", radius, n_samples, seed, method)


def condition_number(objective: Any, theta: Any, *, method: str = "auto") -> Any:
    r"""Condition number :math:`\lambda_{\max}/\lambda_{\min}` of the Hessian at ``theta``.

    Parameters
    ----------
    objective : TiltedObjective
    theta : array
    method : {"auto", "dense", "lanczos"}, default "auto"
        As for :func:`smoothness`.

    Returns
    -------
    0-d array
        The ratio, or ``inf`` where the Hessian is not positive definite
        (:math:`\lambda_{\min} \le 0`), in the objective's namespace and dtype.

    See Also
    --------
    smoothness : The numerator.
    strong_convexity : The denominator.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import condition_number
    >>> X = np.diag([1.0, 2.0])
    >>> obj = TiltedObjective("squared", X, np.zeros(2))
    >>> float(condition_number(obj, np.zeros(2)))
    4.0
    """
    obj = _check_objective(objective)
    _check_finite_tilts(obj)
    xp = obj.xp
    th = _theta_of(obj, theta)
    solver = _check_method(method, _n_params(th))
    if solver == "dense":
        ev = _eigvalsh(obj.hessian(th), xp)
        lo, hi = ev[0], ev[-1]
    else:
        lo = _lanczos_extreme(obj, th, "smallest", 0)
        hi = _lanczos_extreme(obj, th, "largest", 0)
    pos = lo > 0
    safe = xp.where(pos, lo, xp.ones_like(lo))
    return xp.where(pos, hi / safe, xp.full_like(hi, math.inf))


def classify_stationary_point(
    objective: Any,
    theta: Any,
    *,
    tol: float | None = None,
    grad_tol: float | None = None,
    method: str = "auto",
) -> StationaryPoint:
    r"""Classify a stationary point by the signs of its Hessian eigenvalues.

    The paper's strict-saddle assumption asks that every local minimum have a positive
    definite Hessian and every other stationary point a negative eigenvalue. With
    :math:`\lambda_{\min} \le \dots \le \lambda_{\max}` and eigenvalues within ``tol``
    of zero counted as zero:

    * ``"local minimum"``: :math:`\lambda_{\min} > \mathrm{tol}` (strict local minimum);
    * ``"local maximum"``: :math:`\lambda_{\max} < -\mathrm{tol}`;
    * ``"strict saddle"``: :math:`\lambda_{\min} < -\mathrm{tol}` otherwise (a direction
      of negative curvature exists, so gradient methods escape);
    * ``"degenerate"``: :math:`|\lambda_{\min}| \le \mathrm{tol}` (second-order test
      inconclusive; the strict-saddle property fails there).

    This reads the eigenvalues back to the host (it returns a Python string).

    Parameters
    ----------
    objective : TiltedObjective
    theta : array
        The candidate stationary point.
    tol : float, optional
        Zero threshold for eigenvalues. Default: ``sqrt(eps) * max(1, max |lambda|)``.
    grad_tol : float, optional
        Stationarity threshold for the gradient norm. Default: ``10 * sqrt(eps)``
        (about 1.5e-7 in float64, 3.5e-3 in float32).
    method : {"auto", "dense", "lanczos"}, default "auto"
        Eigensolver, as for :func:`smoothness`.

    Returns
    -------
    StationaryPoint

    See Also
    --------
    strong_convexity : The smallest eigenvalue alone.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import classify_stationary_point
    >>> X = np.array([[1.0, 0.0], [1.0, 0.0]])
    >>> y = np.array([1.0, -1.0])
    >>> obj = TiltedObjective("squared", X, y, t=-5.0, l2=0.1)
    >>> classify_stationary_point(obj, np.zeros(2)).kind
    'strict saddle'
    >>> classify_stationary_point(obj.with_tilt(0.0), np.zeros(2)).kind
    'local minimum'
    """
    obj = _check_objective(objective)
    _check_finite_tilts(obj)
    xp = obj.xp
    th = _theta_of(obj, theta)
    solver = _check_method(method, _n_params(th))
    if solver == "dense":
        ev = _eigvalsh(obj.hessian(th), xp)
    else:
        ev = xp.stack(
            [_lanczos_extreme(obj, th, "smallest", 0), _lanczos_extreme(obj, th, "largest", 0)]
        )
    g = obj.gradient(th)
    gnorm = xp.sqrt(xp.sum(g * g))
    ev_host = to_numpy(ev).astype(np.float64)
    eps = float(xp.finfo(th.dtype).eps)
    lo, hi = float(ev_host[0]), float(ev_host[-1])
    if tol is None:
        tol = math.sqrt(eps) * max(1.0, float(np.max(np.abs(ev_host))))
    if grad_tol is None:
        grad_tol = 10.0 * math.sqrt(eps)
    for name, val in (("tol", tol), ("grad_tol", grad_tol)):
        if not (math.isfinite(val) and val >= 0):
            raise ValueError(f"`{name}` must be a finite non-negative number, got {val!r}")
    if lo > tol:
        kind = "local minimum"
    elif hi < -tol:
        kind = "local maximum"
    elif lo < -tol:
        kind = "strict saddle"
    else:
        kind = "degenerate"
    stationary = float(to_numpy(gnorm)) <= grad_tol
    return StationaryPoint(kind, ev, gnorm, stationary, float(tol), float(grad_tol))
