r"""Diagnostics of tilted objectives: curvature, step sizes, GLM statistics, d theta/dt.

Everything here reads a :class:`~tiltlab.TiltedObjective` and a parameter ``theta``
and answers a question the TERM paper's theory asks about them:

* **Curvature.** :func:`smoothness` (largest Hessian eigenvalue, the paper's
  :math:`\beta(t)`, optionally the supremum over a ball around ``theta``),
  :func:`strong_convexity` (smallest eigenvalue), :func:`condition_number` and
  :func:`classify_stationary_point` (the strict-saddle property of the paper's
  assumptions). Small problems use a dense symmetric eigensolver on
  ``objective.hessian``; large ones run Lanczos (``scipy.sparse.linalg.eigsh``) on
  ``objective.hvp`` without forming the Hessian.
* **Step size.** :func:`fit_step_size_rule` fits the convergence theorem's rule
  :math:`\alpha = 1/(C_1 + C_2 t)` to measured smoothness at several tilts;
  :func:`step_size` evaluates it.
* **GLM statistics.** :func:`glm_statistics` returns the paper's :math:`\Lambda`,
  :math:`\Gamma`, :math:`\mathcal M`, :math:`\mathcal V` for the exponential-family
  losses (squared, logistic), plus the tilted averages that generalise them to our
  per-sample cumulants (see below).
* **Tilted solutions.** :func:`solution_derivative` gives
  :math:`d\breve\theta/dt` at a stationary point from the implicit function theorem.
* **Weights.** :func:`weight_entropy`, :func:`effective_sample_size` and
  :func:`tilted_weight_stats`.

Mapping the paper's GLM to tiltlab's losses
-------------------------------------------
The paper (appendix "General Properties of the Objective for GLMs") assumes
``f(x; theta) = A(theta) - theta . T(x)`` with one cumulant ``A`` shared by all samples
and no ``theta``-free term. tiltlab's GLM losses are regression GLMs in the linear
predictor ``z_i = x_i . theta``:

.. math:: \ell_i(\theta) = A(x_i^\top\theta) - \theta^\top T_i + c(y_i),
          \qquad T_i = T(y_i)\, x_i ,

with ``A(z) = z**2, T(y) = 2y, c(y) = y**2`` for the squared loss (which carries no factor
1/2) and ``A = softplus, T(y) = y, c = 0`` for the logistic loss. So the cumulant
``A(x_i . theta)`` and the offset ``c(y_i)`` vary from sample to sample, and both enter
the tilted weights ``w_i ~ p_i exp(t l_i)``. Consequences, all checked numerically in
``tests/test_diagnostics.py``:

* :math:`\Gamma(t;\theta) = \log\sum_i p_i e^{-t\theta^\top T_i}` and the mean and
  covariance :math:`\mathcal M, \mathcal V` of ``T_i`` under
  :math:`\pi_i = p_i e^{-t\theta^\top T_i - \Gamma}` are defined exactly as in the paper
  (the prior ``p`` replaces ``1/N``); the lemmas on the partial derivatives of
  :math:`\Gamma` and :math:`\mathcal M` hold as stated, for any data.
* :math:`\Lambda = tR` equals :math:`tA + \Gamma` only when every sample has the same
  cumulant and the same offset (an intercept-only logistic model, say); then
  :math:`\pi` is the tilted weight vector ``w`` and every lemma holds as stated. In
  general the lemmas on :math:`\Lambda` hold with ``A``, its gradient and Hessian replaced
  by their ``w``-averages :math:`\bar A = \sum_i w_i (A(z_i) + c(y_i))`,
  :math:`\overline{\nabla A} = \sum_i w_i A'(z_i) x_i`,
  :math:`\overline{\nabla^2 A} = \sum_i w_i A''(z_i) x_i x_i^\top`, with
  :math:`\mathcal M, \mathcal V` replaced by the ``w``-mean and ``w``-covariance of
  ``T_i`` (fields ``tilted_M``, ``tilted_V``), and with extra covariance terms for the
  second derivatives (see :func:`solution_derivative`).

Conventions: ``Lambda`` is ``t`` times the tilted risk *without* the ridge penalty
(the paper has none); the solution derivative includes the ridge term. Arrays are
returned in the objective's namespace, dtype and device. Step-size constants are Python
floats (a step-size rule is a host-side setting).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._compat import (
    as_array,
    as_float_array,
    check_nonneg_weights,
    device,
    is_array_api_obj,
    namespace_of,
    normalize_axis,
    to_numpy,
)
from .objective import TiltedObjective
from .risk import tilted_risk, tilted_weights

__all__ = [
    "CurvatureEstimate",
    "StationaryPoint",
    "StepSizeRule",
    "GLMStatistics",
    "WeightStats",
    "smoothness",
    "strong_convexity",
    "condition_number",
    "classify_stationary_point",
    "fit_step_size_rule",
    "step_size",
    "glm_statistics",
    "solution_derivative",
    "weight_entropy",
    "effective_sample_size",
    "tilted_weight_stats",
]

#: Problems with at most this many parameters use the dense eigensolver / linear solver
#: under ``method="auto"``.
DENSE_LIMIT = 500

_METHODS = ("auto", "dense", "lanczos")


# ----------------------------------------------------------------------------------------
# result objects
# ----------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class StepSizeRule:
    """Constants of the step-size rule ``alpha(t) = 1 / (C1 + C2 t)``.

    Unpacks as ``C1, C2 = rule``; calling ``rule(t)`` gives the step size.

    Attributes
    ----------
    C1, C2 : float
        The fitted constants.
    ts, betas : numpy.ndarray
        The tilts and the smoothness ``beta(t)`` measured at them.
    fit : str
        ``"envelope"`` (``C1 + C2 t >= beta(t)`` at every sampled tilt) or ``"lstsq"``.
    """

    C1: float
    C2: float
    ts: np.ndarray
    betas: np.ndarray
    fit: str

    def __iter__(self):
        return iter((self.C1, self.C2))

    def __call__(self, t: Any) -> Any:
        return step_size(self.C1, self.C2, t)


@dataclass(frozen=True)
class GLMStatistics:
    r"""The paper's GLM quantities at ``(t, theta)`` and their per-sample generalisation.

    With ``T_i = T(y_i) x_i``, prior ``p`` and tilted weights ``w`` of the losses:

    Attributes
    ----------
    Lambda : 0-d array
        :math:`\Lambda(t;\theta) = t R(t;\theta) = \log\sum_i p_i e^{t\ell_i}` (no ridge).
    Gamma : 0-d array
        :math:`\Gamma(t;\theta) = \log\sum_i p_i e^{-t\theta^\top T_i}` (paper's definition).
    M : array (d,)
        :math:`\mathcal M = \sum_i \pi_i T_i` with
        :math:`\pi_i = p_i e^{-t\theta^\top T_i - \Gamma}` (paper's definition).
    V : array (d, d)
        :math:`\mathcal V = \sum_i \pi_i (T_i - \mathcal M)(T_i - \mathcal M)^\top`.
    statistic_weights : array (N,)
        :math:`\pi`.
    weights : array (N,)
        The tilted weights ``w`` of the losses (equal to ``pi`` when all samples share
        the cumulant and the offset, the paper's setting).
    tilted_M, tilted_V : arrays (d,), (d, d)
        Mean and covariance of ``T_i`` under ``w``.
    cumulant_mean : 0-d array
        :math:`\sum_i w_i (A(z_i) + c(y_i))` (the paper's :math:`A(\theta)`).
    cumulant_grad : array (d,)
        :math:`\sum_i w_i A'(z_i) x_i` (the paper's :math:`\nabla A`).
    cumulant_hess : array (d, d)
        :math:`\sum_i w_i A''(z_i) x_i x_i^\top` (the paper's :math:`\nabla^2 A`).
    """

    Lambda: Any
    Gamma: Any
    M: Any
    V: Any
    statistic_weights: Any
    weights: Any
    tilted_M: Any
    tilted_V: Any
    cumulant_mean: Any
    cumulant_grad: Any
    cumulant_hess: Any


@dataclass(frozen=True)
class WeightStats:
    """Tilted weights with their entropy and effective sample size.

    Attributes
    ----------
    weights : array (N,)
    entropy : 0-d array
        Shannon entropy (natural log); ``log N`` for uniform weights.
    effective_sample_size : 0-d array
        Kish's ``1 / sum w_i**2``; ``N`` for uniform weights.
    """

    weights: Any
    entropy: Any
    effective_sample_size: Any


# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------


def _check_objective(objective: Any) -> TiltedObjective:
    if not isinstance(objective, TiltedObjective):
        raise TypeError(f"`objective` must be a TiltedObjective, got {type(objective).__name__}")
    return objective


def _check_finite_tilts(objective: TiltedObjective) -> None:
    if not all(math.isfinite(t) for t in objective.tilts):
        raise ValueError(
            f"the Hessian is not defined at an infinite tilt (`objective` has tilts "
            f"{objective.tilts}); use a large finite tilt"
        )


def _theta_of(objective: TiltedObjective, theta: Any) -> Any:
    """``theta`` as an array of the objective's namespace, dtype and device."""
    xp = objective.xp
    th = as_float_array(theta, xp, name="theta", dev=objective.device)
    if objective.dtype is not None and th.dtype != objective.dtype:
        th = xp.astype(th, objective.dtype)
    if objective.shape is not None:
        size = int(np.prod(objective.shape))
        if tuple(th.shape) != tuple(objective.shape) and tuple(th.shape) != (size,):
            raise ValueError(
                f"`theta` must have shape {objective.shape} (or be flat of size {size}), "
                f"got {tuple(th.shape)}"
            )
    elif th.ndim != 1:
        raise ValueError(f"`theta` must be a 1-d parameter vector, got shape {tuple(th.shape)}")
    return th


def _n_params(th: Any) -> int:
    return int(np.prod(tuple(th.shape))) if th.ndim else 1


def _check_method(method: str, p: int) -> str:
    if method not in _METHODS:
        raise ValueError(f"`method` must be one of {_METHODS}, got {method!r}")
    if method == "auto":
        return "dense" if p <= DENSE_LIMIT else "lanczos"
    return method


def _has_linalg(xp: Any, name: str) -> bool:
    return hasattr(xp, "linalg") and hasattr(xp.linalg, name)


def _eigvalsh(H: Any, xp: Any) -> Any:
    """Ascending eigenvalues of a symmetric matrix, in ``H``'s namespace.

    Uses ``xp.linalg.eigvalsh`` where the namespace has it (NumPy, CuPy, PyTorch,
    array-api-strict); otherwise (Dask) a host copy goes through NumPy.
    """
    H = 0.5 * (H + H.T)
    if _has_linalg(xp, "eigvalsh"):
        return xp.linalg.eigvalsh(H)
    ev = np.linalg.eigvalsh(to_numpy(H).astype(np.float64))
    return xp.asarray(ev, dtype=H.dtype, device=device(H))


def _solve(H: Any, b: Any, xp: Any) -> Any:
    """Solve ``H x = b`` for a vector ``b`` (host NumPy when ``xp`` has no linalg)."""
    if _has_linalg(xp, "solve"):
        return xp.linalg.solve(H, b[:, None])[:, 0]
    x = np.linalg.solve(to_numpy(H).astype(np.float64), to_numpy(b).astype(np.float64))
    return xp.asarray(x, dtype=b.dtype, device=device(b))  # pragma: no cover


def _hvp_operator(objective: TiltedObjective, th: Any):
    """A SciPy LinearOperator (float64, host) applying the objective's Hessian."""
    from scipy.sparse.linalg import LinearOperator

    xp = objective.xp
    p = _n_params(th)
    dev = device(th)

    def matvec(v: np.ndarray) -> np.ndarray:
        vv = xp.asarray(np.ascontiguousarray(v, dtype=np.float64).reshape(-1), device=dev)
        vv = xp.reshape(xp.astype(vv, th.dtype), tuple(th.shape))
        out = objective.hvp(th, vv)
        return to_numpy(xp.reshape(out, (p,))).astype(np.float64)

    return LinearOperator((p, p), matvec=matvec, rmatvec=matvec, dtype=np.float64)


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


# ----------------------------------------------------------------------------------------
# curvature
# ----------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------
# step-size rule
# ----------------------------------------------------------------------------------------


def _path_points(objective: TiltedObjective, theta_or_path: Any, n: int) -> list[Any]:
    """One parameter per tilt: a sequence/stacked array of ``n`` points, or one point."""
    xp = objective.xp
    if not is_array_api_obj(theta_or_path) and isinstance(theta_or_path, Sequence):
        items = list(theta_or_path)
        if items and all(is_array_api_obj(e) or isinstance(e, Sequence) for e in items):
            if len(items) != n:
                raise ValueError(
                    f"`theta_or_path` holds {len(items)} points but `ts` has {n} tilts"
                )
            return [_theta_of(objective, e) for e in items]
    arr = as_float_array(theta_or_path, xp, name="theta_or_path", dev=objective.device)
    shape = tuple(arr.shape)
    single = (
        objective.shape is not None
        and (shape == tuple(objective.shape) or shape == (int(np.prod(objective.shape)),))
    ) or (objective.shape is None and arr.ndim == 1)
    if single:
        th = _theta_of(objective, arr)
        return [th] * n
    if shape[0] != n:
        raise ValueError(
            f"`theta_or_path` must be one parameter or {n} stacked parameters (one per "
            f"tilt); got shape {shape}"
        )
    return [_theta_of(objective, arr[j, ...]) for j in range(n)]


def fit_step_size_rule(
    objective: Any,
    theta_or_path: Any,
    ts: Any,
    *,
    fit: str = "envelope",
    radius: float = 0.0,
    n_samples: int = 16,
    seed: int = 0,
    method: str = "auto",
) -> StepSizeRule:
    r"""Fit the convergence theorem's step size :math:`\alpha(t) = 1/(C_1 + C_2 t)`.

    The theorem ("Convergence with t") takes :math:`C_1 + C_2 t \ge \beta(t)` for all
    :math:`t \ge 0`, where :math:`\beta(t)` grows at most linearly (smoothness lemma).
    This measures :math:`\beta(t_j)` with :func:`smoothness` on
    ``objective.with_tilt(t_j)`` at the given point(s) and fits the line.

    Parameters
    ----------
    objective : TiltedObjective
        A sample-level objective (its tilt is replaced by each ``t_j``).
    theta_or_path : array or sequence of arrays
        One parameter used at every tilt, or one parameter per tilt (e.g. the tilted
        solutions along a path; a list, or an array with a leading axis of ``len(ts)``).
        :math:`\beta(t)` is a local quantity: measure it near the solutions, where the
        paper's linear growth holds (at a fixed point far from them the tilted weights
        collapse onto one sample as ``t`` grows and the measured curvature can fall).
    ts : sequence of float
        At least two distinct, finite tilts ``>= 0``.
    fit : {"envelope", "lstsq"}, default "envelope"
        ``"envelope"``: the tightest upper envelope, i.e. the line with
        :math:`C_1, C_2 \ge 0` and :math:`C_1 + C_2 t_j \ge \beta(t_j)` for every ``j``
        that minimises :math:`\sum_j (C_1 + C_2 t_j)` (a linear programme, solved with
        ``scipy.optimize.linprog``); the step sizes are then safe at every sampled tilt.
        ``"lstsq"``: the least-squares line through the points (no guarantee).
    radius, n_samples, seed, method
        Passed to :func:`smoothness` (a ball around each point estimates the paper's
        neighbourhood supremum).

    Returns
    -------
    StepSizeRule
        Unpacks as ``C1, C2``; Python floats.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import fit_step_size_rule
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    >>> obj = TiltedObjective("squared", X, np.array([0.0, 2.0, 1.0]))
    >>> C1, C2 = fit_step_size_rule(obj, np.array([0.5, 0.25]), [0.0, 0.5, 1.0])
    >>> C1 > 0 and C2 >= 0
    True
    """
    obj = _check_objective(objective)
    if obj.is_hierarchical:
        raise NotImplementedError(
            "fit_step_size_rule varies the sample-level tilt; it does not support "
            "hierarchical objectives"
        )
    if fit not in ("envelope", "lstsq"):
        raise ValueError(f"`fit` must be 'envelope' or 'lstsq', got {fit!r}")
    tgrid = np.asarray(to_numpy(ts), dtype=np.float64).reshape(-1)
    if tgrid.size < 2 or np.unique(tgrid).size < 2:
        raise ValueError("`ts` must hold at least two distinct tilts")
    if not np.all(np.isfinite(tgrid)) or np.any(tgrid < 0):
        raise ValueError("`ts` must hold finite tilts t >= 0 (the step-size theorem's range)")
    points = _path_points(obj, theta_or_path, tgrid.size)
    betas = np.array(
        [
            float(
                to_numpy(
                    smoothness(
                        obj.with_tilt(float(t)),
                        th,
                        radius=radius,
                        n_samples=n_samples,
                        seed=seed,
                        method=method,
                    ).value
                )
            )
            for t, th in zip(tgrid, points, strict=True)
        ]
    )
    if fit == "lstsq":
        A = np.stack([np.ones_like(tgrid), tgrid], axis=1)
        (C1, C2), *_ = np.linalg.lstsq(A, betas, rcond=None)
    else:
        if not np.max(betas) > 0:
            raise ValueError(
                "the measured smoothness is not positive at any tilt; no step-size rule "
                "1/(C1 + C2 t) applies"
            )
        from scipy.optimize import linprog

        res = linprog(
            c=[tgrid.size, float(np.sum(tgrid))],
            A_ub=-np.stack([np.ones_like(tgrid), tgrid], axis=1),
            b_ub=-betas,
            bounds=[(0, None), (0, None)],
            method="highs",
        )
        if not res.success:  # pragma: no cover - the programme is always feasible
            raise RuntimeError(f"the envelope fit failed: {res.message}")
        C1, C2 = (float(v) for v in res.x)
        C2 = max(C2, 0.0)
        # remove the solver's feasibility slack so the envelope holds exactly
        C1 = max(C1, float(np.max(betas - C2 * tgrid)))
    return StepSizeRule(float(C1), float(C2), tgrid, betas, fit)


def step_size(C1: Any, C2: Any, t: Any) -> Any:
    r"""The convergence theorem's step size :math:`\alpha = 1/(C_1 + C_2 t)`.

    Parameters
    ----------
    C1, C2 : float or array
        Constants, e.g. from :func:`fit_step_size_rule`.
    t : float or array
        Tilt(s); arrays give elementwise step sizes in their namespace.

    Returns
    -------
    float or array

    Raises
    ------
    ValueError
        For Python numbers when ``C1 + C2 t`` is not a positive finite number.

    Examples
    --------
    >>> from tiltlab.diagnostics import step_size
    >>> step_size(2.0, 0.5, 4.0)
    0.25
    """
    scalars = all(
        isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
        for v in (C1, C2, t)
    )
    if scalars:
        den = float(C1) + float(C2) * float(t)
        if not (math.isfinite(den) and den > 0):
            raise ValueError(f"`C1` + `C2` * `t` must be a positive finite number, got {den!r}")
        return 1.0 / den
    return 1.0 / (C1 + C2 * t)


# ----------------------------------------------------------------------------------------
# GLM statistics and the derivative of the tilted solution
# ----------------------------------------------------------------------------------------


def _require_sample_level(obj: TiltedObjective, what: str) -> None:
    if obj.is_hierarchical:
        raise NotImplementedError(
            f"{what} supports sample-level objectives only; for a hierarchical objective "
            "the solution depends on several tilts (differentiate a tilt path numerically "
            "instead, e.g. central differences of solutions)"
        )


def _require_glm(obj: TiltedObjective) -> None:
    loss = obj.loss
    if not (getattr(loss, "is_glm", False) and loss.is_linear and loss.n_outputs == 1):
        raise ValueError(
            f"the {loss.name} loss of `objective` is not a scalar GLM loss (A(z) - T(y) z "
            "+ c(y)); GLM statistics need e.g. the squared or logistic loss"
        )


def _prior(obj: TiltedObjective, th: Any) -> Any:
    """Normalised prior weights of a sample-level objective (the weights at t = 0)."""
    return obj.with_tilt(0.0).weights(th)


def _wcov(U: Any, W: Any, w: Any) -> Any:
    """Weighted cross-covariance sum_i w_i (u_i - ubar)(v_i - vbar)^T of rows of U, W."""
    Uc = U - (w @ U)[None, :] if U.ndim == 2 else U - w @ U
    Wc = W - (w @ W)[None, :] if W.ndim == 2 else W - w @ W
    if U.ndim == 1:
        return Wc.T @ (w * Uc) if W.ndim == 2 else w @ (Uc * Wc)
    if W.ndim == 1:
        return Uc.T @ (w * Wc)
    return Uc.T @ (w[:, None] * Wc)


def _glm_parts(obj: TiltedObjective, theta: Any) -> dict[str, Any]:
    _require_sample_level(obj, "glm_statistics")
    _require_glm(obj)
    if not math.isfinite(obj.t):
        raise ValueError(f"GLM statistics need a finite tilt; `objective` has t={obj.t}")
    xp = obj.xp
    th = xp.reshape(_theta_of(obj, theta), (obj.n_features,))
    X, y = obj.X, obj.y
    loss: Any = obj.loss  # a GLM loss: has cumulant/statistic/offset
    t = float(obj.t)
    z = X @ th
    A, A1, A2 = loss.cumulant(z, xp=xp)
    tau = as_array(loss.statistic(y, xp=xp), xp, name="y", dtype=th.dtype)
    c = as_array(loss.offset(y, xp=xp), xp, name="y", dtype=th.dtype)
    ell = obj.losses(th)
    p = _prior(obj, th)
    # Gamma and pi: the tilted risk/weights of the "losses" s_i = -theta . T_i
    s = -(tau * z)
    Gamma = t * tilted_risk(s, t, weights=p, xp=xp)
    pi = tilted_weights(s, t, weights=p, xp=xp)
    Lambda = t * tilted_risk(ell, t, weights=p, xp=xp)
    w = tilted_weights(ell, t, weights=p, xp=xp)
    T = tau[:, None] * X
    M = pi @ T
    V = _wcov(T, T, pi)
    Mw = w @ T
    Vw = _wcov(T, T, w)
    return {
        "xp": xp,
        "th": th,
        "t": t,
        "X": X,
        "A": A,
        "A1": A1,
        "A2": A2,
        "c": c,
        "ell": ell,
        "T": T,
        "w": w,
        "stats": GLMStatistics(
            Lambda=Lambda,
            Gamma=Gamma,
            M=M,
            V=0.5 * (V + V.T),
            statistic_weights=pi,
            weights=w,
            tilted_M=Mw,
            tilted_V=0.5 * (Vw + Vw.T),
            cumulant_mean=xp.sum(w * (A + c)),
            cumulant_grad=X.T @ (w * A1),
            cumulant_hess=X.T @ ((w * A2)[:, None] * X),
        ),
    }


def glm_statistics(objective: Any, theta: Any) -> GLMStatistics:
    r"""The paper's GLM quantities :math:`\Lambda, \Gamma, \mathcal M, \mathcal V` at ``theta``.

    For a scalar GLM loss :math:`\ell_i = A(x_i^\top\theta) - \theta^\top T_i + c(y_i)`
    with :math:`T_i = T(y_i) x_i` (squared: :math:`A(z) = z^2`, :math:`T = 2y`,
    :math:`c = y^2`, no factor 1/2; logistic: :math:`A = \mathrm{softplus}`,
    :math:`T = y`, :math:`c = 0`) and prior weights :math:`p` (the paper's :math:`1/N`):

    * :math:`\Lambda(t;\theta) = t R(t;\theta) = \log \sum_i p_i e^{t\ell_i}`
      (empirical cumulant generating function; the ridge penalty is not included);
    * :math:`\Gamma(t;\theta) = \log \sum_i p_i e^{-t\theta^\top T_i}`
      (empirical log-partition function);
    * :math:`\mathcal M = \sum_i \pi_i T_i`,
      :math:`\mathcal V = \sum_i \pi_i (T_i - \mathcal M)(T_i - \mathcal M)^\top` with
      :math:`\pi_i = p_i e^{-t\theta^\top T_i - \Gamma(t;\theta)}`.

    These follow the paper's definitions exactly; its lemmas on the partial derivatives
    of :math:`\Gamma` and :math:`\mathcal M` (:math:`\partial_t\Gamma = -\theta^\top
    \mathcal M`, :math:`\nabla_\theta\Gamma = -t\mathcal M`, :math:`\partial_t\mathcal M
    = -\mathcal V\theta`, :math:`\nabla_\theta\mathcal M = -t\mathcal V`) hold for any
    data. The paper's identity :math:`\Lambda = tA(\theta) + \Gamma` needs one cumulant
    shared by all samples and no offset; for regression GLMs the fields ``weights``,
    ``tilted_M``, ``tilted_V`` and ``cumulant_*`` hold the ``w``-averaged versions that
    make the lemmas on :math:`\Lambda` hold (e.g.
    :math:`\partial_t\Lambda = \bar A - \theta^\top \bar{\mathcal M}` and
    :math:`\nabla_\theta\Lambda = t(\overline{\nabla A} - \bar{\mathcal M})`); see the
    module notes and :class:`GLMStatistics`.

    Parameters
    ----------
    objective : TiltedObjective
        Sample-level objective with a scalar GLM loss (``loss.is_glm``) at a finite tilt.
    theta : array of shape (d,)

    Returns
    -------
    GLMStatistics
        Arrays in the objective's namespace, dtype and device.

    Raises
    ------
    ValueError
        Non-GLM loss or infinite tilt.
    NotImplementedError
        Hierarchical objective.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective, tilted_risk
    >>> from tiltlab.diagnostics import glm_statistics
    >>> X = np.ones((4, 1))                       # intercept only: the paper's setting
    >>> y = np.array([0, 1, 1, 1])
    >>> obj = TiltedObjective("logistic", X, y, t=1.5)
    >>> st = glm_statistics(obj, np.array([0.3]))
    >>> A = np.logaddexp(0.0, 0.3)                # softplus, shared by all samples
    >>> bool(np.isclose(st.Lambda, 1.5 * A + st.Gamma))
    True
    """
    obj = _check_objective(objective)
    return _glm_parts(obj, theta)["stats"]


def _general_rhs(obj: TiltedObjective, th: Any) -> Any:
    """Cov_w(l, grad l) = sum_i w_i (l_i - lbar) grad l_i, flattened (p,)."""
    xp = obj.xp
    t = float(obj.t)
    p = _prior(obj, th)
    if obj.loss.is_linear:
        z = obj.X @ xp.reshape(th, obj.shape)
        ell, d1, _ = obj.loss.derivatives(z, obj.y, validate=False, xp=xp)
        w = tilted_weights(ell, t, weights=p, xp=xp)
        u = w * (ell - xp.sum(w * ell))
        coef = u[:, None] * d1 if d1.ndim == 2 else u * d1
        b = obj.X.T @ coef
    else:
        callable_loss: Any = obj.loss
        ell, J = callable_loss.value_and_grad(th, obj.X, obj.y, xp=xp)
        w = tilted_weights(ell, t, weights=p, xp=xp)
        b = (w * (ell - xp.sum(w * ell))) @ J
    return xp.reshape(b, (_n_params(th),))


def solution_derivative(
    objective: Any,
    theta: Any,
    *,
    method: str = "general",
    solver: str = "auto",
) -> Any:
    r"""Derivative :math:`d\breve\theta/dt` of the tilted solution, at a solution ``theta``.

    Differentiating the stationarity condition
    :math:`\nabla F(t;\breve\theta(t)) = \sum_i w_i \nabla\ell_i + \lambda\breve\theta = 0`
    in ``t``, with :math:`\partial w_i/\partial t = w_i(\ell_i - \sum_j w_j \ell_j)`:

    .. math:: \frac{d\breve\theta}{dt} = -H^{-1}\,\mathrm{Cov}_w(\ell, \nabla\ell),
              \qquad \mathrm{Cov}_w(\ell, \nabla\ell)
              = \sum_i w_i (\ell_i - \bar\ell)\,\nabla\ell_i ,

    with ``H`` the objective's Hessian (tilted Hessian lemma, ridge included). No
    :math:`1/t` factor appears (the paper's derivation through :math:`\Lambda = tR`
    multiplies both sides by ``t``), and the formula holds at ``t = 0`` too. For
    linear-predictor losses the covariance is ``X^T (w (l - lbar) l')``, without forming
    per-sample gradients.

    ``method="glm"`` evaluates the closed form of the paper's lemma "Derivative of the
    solution with respect to tilt", :math:`-(\nabla^2 A + t\mathcal V)^{-1}\mathcal V\theta`,
    generalised to per-sample cumulants: with :math:`a_i = A'(z_i)x_i`,
    :math:`B_i = A(z_i) + c(y_i)`, ``w``-averages and ``w``-covariances,

    .. math:: \frac{d\breve\theta}{dt} = -\big(\overline{\nabla^2 A} + t(\bar{\mathcal V}
              + E) + \lambda I\big)^{-1} (\bar{\mathcal V}\theta + e),

    :math:`E = \mathrm{Cov}_w(a) - \mathrm{Cov}_w(a, T) - \mathrm{Cov}_w(T, a)`,
    :math:`e = \mathrm{Cov}_w(\ell, a) - \mathrm{Cov}_w(B, T)`. The corrections ``E`` and
    ``e`` vanish when all samples share the cumulant and the offset (the paper's
    setting), leaving the paper's formula (plus the ridge).

    The result is the derivative of the curve of stationary points through ``theta``;
    it is meaningful only where ``theta`` is one (gradient near zero) and ``H`` is
    invertible (e.g. at a strict local minimum).

    Parameters
    ----------
    objective : TiltedObjective
        Sample-level objective at a finite tilt. ``method="general"``: any loss with a
        Hessian; ``method="glm"``: a scalar GLM loss (squared, logistic).
    theta : array
        A stationary point of ``objective``.
    method : {"general", "glm"}, default "general"
    solver : {"auto", "dense", "iterative"}, default "auto"
        Linear solve with ``H`` (``method="general"``): ``"dense"`` forms the Hessian and
        solves with ``xp.linalg.solve``; ``"iterative"`` runs MINRES
        (``scipy.sparse.linalg.minres``, host) on ``objective.hvp``; ``"auto"`` is dense
        for at most 500 parameters.

    Returns
    -------
    array
        :math:`d\breve\theta/dt` in ``theta``'s shape, namespace and dtype.

    Raises
    ------
    NotImplementedError
        Hierarchical objective (the solution then depends on several tilts).
    ValueError
        Infinite tilt, bad ``method``/``solver``, or ``method="glm"`` with a non-GLM loss.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.optimize import minimize
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import solution_derivative
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    >>> obj = TiltedObjective("squared", X, np.array([0.0, 1.0, 1.0, 5.0]), t=0.5)
    >>> def solve(o):
    ...     f = lambda th: tuple(np.asarray(v) for v in o.value_and_gradient(th))
    ...     return minimize(f, np.zeros(2), jac=True, method="BFGS", options={"gtol": 1e-12}).x
    >>> th = solve(obj)
    >>> fd = (solve(obj.with_tilt(0.5 + 1e-4)) - solve(obj.with_tilt(0.5 - 1e-4))) / 2e-4
    >>> bool(np.allclose(solution_derivative(obj, th), fd, atol=1e-6))
    True
    >>> bool(np.allclose(solution_derivative(obj, th, method="glm"), fd, atol=1e-6))
    True
    """
    obj = _check_objective(objective)
    if method not in ("general", "glm"):
        raise ValueError(f"`method` must be 'general' or 'glm', got {method!r}")
    if solver not in ("auto", "dense", "iterative"):
        raise ValueError(f"`solver` must be 'auto', 'dense' or 'iterative', got {solver!r}")
    _require_sample_level(obj, "solution_derivative")
    _check_finite_tilts(obj)
    xp = obj.xp
    th = _theta_of(obj, theta)
    p = _n_params(th)
    if method == "glm":
        parts = _glm_parts(obj, th)
        st, t, w, T, X = parts["stats"], parts["t"], parts["w"], parts["T"], parts["X"]
        a = parts["A1"][:, None] * X
        B = parts["A"] + parts["c"]
        cov_aT = _wcov(a, T, w)
        E = _wcov(a, a, w) - cov_aT - cov_aT.T
        e = _wcov(parts["ell"], a, w) - _wcov(B, T, w)
        H = st.cumulant_hess + t * (st.tilted_V + E)
        if obj.l2:
            H = H + obj.l2 * xp.eye(p, dtype=H.dtype, device=device(H))
        rhs = st.tilted_V @ parts["th"] + e
        return xp.reshape(-_solve(0.5 * (H + H.T), rhs, xp), tuple(th.shape))
    b = _general_rhs(obj, th)
    use_dense = solver == "dense" or (solver == "auto" and p <= DENSE_LIMIT)
    if use_dense:
        H = obj.hessian(th)
        return xp.reshape(-_solve(H, b, xp), tuple(th.shape))
    from scipy.sparse.linalg import minres

    op = _hvp_operator(obj, th)
    b_host = to_numpy(b).astype(np.float64)
    sol, info = minres(op, b_host, rtol=1e-12, maxiter=20 * p)
    if info != 0:  # pragma: no cover - depends on conditioning
        raise RuntimeError(f"MINRES did not converge (info={info}); try solver='dense'")
    out = xp.asarray(-sol, device=device(th))
    return xp.reshape(xp.astype(out, th.dtype), tuple(th.shape))


# ----------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------


def _prepare_weights(weights: Any, axis: int, xp: Any) -> tuple[Any, Any, int]:
    xp = namespace_of(weights=weights) if xp is None else xp
    w = as_float_array(weights, xp, name="weights")
    if w.ndim == 0:
        raise ValueError("`weights` must have at least one dimension (got a scalar)")
    if any(s == 0 for s in w.shape):
        raise ValueError(f"`weights` must not be empty (shape {tuple(w.shape)})")
    ax = normalize_axis(axis, w.ndim)
    check_nonneg_weights(w, xp, name="weights", axis=ax)
    return xp, w / xp.sum(w, axis=ax, keepdims=True), ax


def weight_entropy(weights: Any, *, axis: int = -1, xp: Any = None) -> Any:
    r"""Shannon entropy :math:`-\sum_i w_i \log w_i` (natural log, :math:`0\log 0 = 0`).

    The weights are normalised to sum to one along ``axis`` first. The entropy lies in
    ``[0, log N]``: ``log N`` for uniform weights, 0 for a single non-zero weight.

    Parameters
    ----------
    weights : array
        Non-negative weights, not all zero along ``axis``.
    axis : int, default -1
        The sample axis.
    xp : namespace, optional
        Inferred from ``weights``.

    Returns
    -------
    array
        The entropy, reduced along ``axis``, in the namespace, dtype and device of
        ``weights`` (integer input promoted to the default float).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.diagnostics import weight_entropy
    >>> bool(np.isclose(weight_entropy(np.full(4, 0.25)), np.log(4)))
    True
    >>> float(weight_entropy(np.array([0.0, 1.0, 0.0])))
    0.0
    """
    xp, q, ax = _prepare_weights(weights, axis, xp)
    pos = q > 0
    logq = xp.log(xp.where(pos, q, xp.ones_like(q)))
    return 0.0 - xp.sum(xp.where(pos, q * logq, xp.zeros_like(q)), axis=ax)


def effective_sample_size(weights: Any, *, axis: int = -1, xp: Any = None) -> Any:
    r"""Kish's effective sample size :math:`(\sum_i w_i)^2 / \sum_i w_i^2`.

    For normalised weights this is :math:`1/\sum_i w_i^2`: ``N`` for uniform weights, 1
    for a single non-zero weight.

    Parameters
    ----------
    weights : array
        Non-negative weights, not all zero along ``axis``.
    axis : int, default -1
    xp : namespace, optional

    Returns
    -------
    array
        Reduced along ``axis``, in the namespace, dtype and device of ``weights``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.diagnostics import effective_sample_size
    >>> float(effective_sample_size(np.ones(5)))
    5.0
    >>> float(effective_sample_size(np.array([0.0, 2.0, 0.0])))
    1.0
    """
    xp, q, ax = _prepare_weights(weights, axis, xp)
    # scale by the largest weight (not the sum): exact for equal weights, no underflow
    s = q / xp.max(q, axis=ax, keepdims=True)
    total = xp.sum(s, axis=ax)
    return total * total / xp.sum(s * s, axis=ax)


def tilted_weight_stats(objective: Any, theta: Any) -> WeightStats:
    """Tilted weights of ``objective`` at ``theta``, their entropy and effective size.

    Works for sample-level and hierarchical objectives (the per-sample weights of
    ``objective.weights``).

    Parameters
    ----------
    objective : TiltedObjective
    theta : array

    Returns
    -------
    WeightStats

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import tilted_weight_stats
    >>> obj = TiltedObjective("squared", np.ones((3, 1)), np.array([0.0, 1.0, 2.0]))
    >>> float(tilted_weight_stats(obj, np.array([1.0])).effective_sample_size)
    3.0
    >>> s = tilted_weight_stats(obj.with_tilt(5.0), np.array([1.0]))
    >>> bool(s.effective_sample_size < 3.0)
    True
    """
    obj = _check_objective(objective)
    w = obj.weights(_theta_of(obj, theta))
    return WeightStats(w, weight_entropy(w, xp=obj.xp), effective_sample_size(w, xp=obj.xp))
