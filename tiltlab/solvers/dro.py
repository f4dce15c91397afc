r"""Distributionally robust fits: :func:`minimize_dro`.

KL ball
-------
For a radius ``r > 0`` the worst case over the distributions ``q`` within KL divergence
``r`` of the prior ``p`` is, by duality,

.. math:: V(\theta) = \sup_{\mathrm{KL}(q\|p) \le r} E_q[\ell(\theta)]
          = \min_{t > 0}\; R_t(\theta) + r / t,

attained at the tilted weights of the minimising ``t``. With ``s = 1/t`` the objective
``F(theta, s) = s log E_p[exp(l(theta) / s)] + r s`` is the perspective of a convex
function of ``theta``, so it is jointly convex in ``(theta, s)`` for convex losses, and
the minimisations over ``theta`` and ``t`` commute: ``min_theta V`` is the exact optimum.
Its gradient in ``theta`` is the tilted gradient at ``t`` and its derivative in ``s`` is
``r - KL(w_t || p)``, with ``KL(w_t || p) = t (E_w[l] - R_t)``.

On eager libraries the fit minimises ``V`` itself, a smooth convex function of ``theta``
(a partial minimum of a jointly convex one): each evaluation computes the losses (one
pass over the data), solves ``KL(w_t || p) = r`` for ``t`` by safeguarded Newton steps
in ``log t`` on the loss vector (``d KL / d t = t Var_w(l)``), warm-started from the
previous evaluation's tilt, and returns ``R_t + r/t`` with the tilted gradient at that
``t`` (the envelope theorem; one more pass). The solver sees a problem conditioned like
one TERM fit at the optimal tilt. On Dask, where each Newton step would be a graph, the
fit is one smooth solve in ``(theta, s)`` jointly, each evaluation one graph giving the
value, the gradient in ``theta`` and the derivative in ``s``, with the solver on the
client. ``method="newton"`` keeps the older scheme: TERM fits warm-started one from
the other inside a root search over ``t`` (fixed-point, secant and bracketing steps on
``g(t) = tilt_for_kl(losses(theta*(t)), r)``).

The min-max limit: where the radius reaches ``log(1/P*)`` (``P*`` the prior mass tied at
the largest loss) near the optimum, ``V`` decreases with ``t`` for ever and the optimum is
``min_theta max_i l_i`` over the support. The tilt is capped at ``t_cap = 1e4 / scale``
(``scale`` the losses' spread, or their mean magnitude, at the start): the fit minimises
the robust value over ``t <= t_cap``, within about ``log(1/p_min) / t_cap`` of the min-max
value, reports ``t = inf`` and says so in its message; ``fun`` and ``weights`` are the
exact worst case at the returned ``x``.

CVaR
----
:mod:`tiltlab.solvers._cvar` (the smoothing continuation).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import is_lazy, real_number, tiny_sqrt, to_numpy
from ..accumulator import risk_of_exponents
from ..objective.protocol import check_objective as _check_objective
from ..risk import tilt_for_kl, tilted_risk, tilted_weights
from ._checks import check_tolerance
from ._count import CountedObjective
from ._cvar import compute_together, cvar_fit, penalty
from ._linalg import working_eps
from ._minimize import METHODS, minimize
from ._result import OptimizeResult, Status
from ._stop import default_tol

__all__ = ["minimize_dro", "DROResult"]

#: the gradient tolerance of the fits far from the root (relative, as ``minimize``'s)
_LOOSE = 1e-3
#: the gradient tolerance of the TERM fit that moves a tied start off its ties
_WARM = 1e-2
#: the most Newton steps for the tilt of one evaluation, and their stopping test on
#: ``log KL - log r`` (the value is stationary in the tilt: its error is of its square)
_NEWTON_STEPS = 60
_KL_RTOL = 1e-10


@dataclass(repr=False)
class DROResult(OptimizeResult):
    """Result of :func:`minimize_dro`: an :class:`OptimizeResult` with the worst case.

    Attributes
    ----------
    x, jac, nit, nfev, success, status, message, n_passes, method
        As for :class:`OptimizeResult`; ``jac`` is a (sub)gradient of the robust
        objective at ``x``, ``nit`` and ``nfev`` add up the inner solves.
    fun : array
        The robust value at ``x`` (0-d): the worst-case expected loss over the KL ball, or
        the CVaR, plus the ridge term.
    t : float
        KL: the optimal tilt (``inf`` where the optimum is the min-max limit); CVaR: NaN.
    weights : array
        The worst-case distribution at ``x`` (shape ``(N,)``, sums to one).
    history : dict of lists
        KL: one entry per iteration (``"newton"``: per TERM fit), with ``t`` the tilt
        of the iterate and ``fun`` its robust value (on Dask, the joint objective, an
        upper bound of it); CVaR: one per smoothing stage, ``mu`` the smoothing and
        ``fun`` the exact CVaR at the stage's point. Also ``nit``, ``n_passes``
        (cumulative) and ``time``.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> X = np.c_[np.ones(40), np.linspace(-1, 1, 40)]
    >>> res = tl.minimize_dro(tl.TiltedObjective("squared", X, X[:, 1] ** 2), kl=0.1)
    >>> res.success, bool(res.t > 0), round(float(np.sum(res.weights)), 12)
    (True, True, 1.0)
    """

    t: float = math.nan
    weights: Any = None

    def __repr__(self) -> str:
        return super().__repr__().replace("OptimizeResult(", f"DROResult(t={self.t:.6g}, ", 1)


def minimize_dro(
    objective: Any,
    *,
    kl: Any = None,
    cvar: Any = None,
    theta0: Any = None,
    method: str = "lbfgs",
    tol: float | None = None,
    max_outer: int = 60,
    **options: Any,
) -> DROResult:
    r"""Fit a model to its worst case: a KL ball of radius ``kl``, or the CVaR at ``cvar``.

    KL (``kl=r``): minimises :math:`\sup\{E_q[\ell(\theta)] : \mathrm{KL}(q\|p) \le r\}
    = \min_{t>0} R_t(\theta) + r/t` (plus the ridge term), exactly: the minimisations in
    ``theta`` and ``t`` commute. One smooth solve: in ``theta`` with the tilt solved on the
    loss vector at each evaluation (eager libraries), or jointly in ``(theta, 1/t)``
    (Dask, one graph per evaluation); module notes.

    CVaR (``cvar=alpha``): minimises :math:`\eta + \frac{1}{\alpha}\sum_i p_i
    (\ell_i(\theta) - \eta)_+` (plus the ridge term) over ``theta`` and ``eta``, the mean
    of the worst ``alpha`` of the prior mass. Non-smooth at the ``eta`` of each sample
    (and at the kinks of the absolute and hinge losses); solved by a smoothing
    continuation that converges to the exact minimiser (:mod:`tiltlab.solvers._cvar`),
    never by a tilted surrogate. ``cvar=1`` is the mean (ERM).

    Parameters
    ----------
    objective : TiltedObjective
        Its loss, data, prior weights and ridge term are fitted; its tilt is ignored.
        Sample-level objectives only (no ``groups``).
    kl : float, optional
        The KL radius ``r >= 0`` (``0``: ERM).
    cvar : float, optional
        The tail fraction ``alpha`` in ``(0, 1]``. Exactly one of ``kl`` and ``cvar``.
    theta0 : array, optional
        Starting point (default zeros).
    method : {"lbfgs", "gd", "agd", "newton"}
        The solver (KL: of the robust objective; ``"newton"``: of TERM fits inside a
        root search over ``t``. CVaR: of the smoothed problems, where ``"newton"`` is
        not available).
    tol : float, optional
        The gradient tolerance (as for :func:`minimize`). KL with ``"newton"``: the
        outer root stops when the tilt moves by less than ``max(1e-7, 10 tol)``
        (relative); the value is stationary in ``t``, so its error is of the order of
        that squared.
    max_outer : int, default 60
        KL with ``"newton"``: the most TERM fits; CVaR: the most smoothing stages.
    **options
        Passed to :func:`minimize` for each inner solve (``max_iter``, ``memory``...).

    Returns
    -------
    DROResult
        ``x``, ``fun`` (the robust value at ``x``), ``t`` (KL: the optimal tilt, ``inf``
        where the optimum is the min-max limit; CVaR: NaN), ``weights`` (the worst-case
        distribution at ``x``), ``status``, ``message`` and ``history``.

    Raises
    ------
    TypeError
        Both or neither of ``kl`` and ``cvar``; not a sample-level
        :class:`~tiltlab.TiltedObjective`.
    ValueError
        ``kl`` negative or not finite; ``cvar`` outside ``(0, 1]``; an unknown
        ``method``.

    See Also
    --------
    tiltlab.tilt_for_kl : The tilt at a radius for a fixed loss vector.
    tiltlab.bounds.entropic_value_at_risk : The KL worst case of a fixed loss vector.
    tiltlab.bounds.superquantile : The CVaR of a fixed loss vector.

    Notes
    -----
    ``t = inf`` (KL): where the radius reaches the divergence of the prior restricted to
    the largest losses at every ``theta`` near the optimum, the robust value decreases
    with ``t`` for ever and the optimum is ``min_theta max_i l_i`` over the support. The
    fit then minimises over tilts up to ``1e4`` over the losses' scale at the start,
    within about ``log(1/p_min) / t`` of the min-max value, and says so in its message;
    ``fun`` and ``weights`` are the exact worst case at ``x``.

    On Dask each evaluation is one task graph (KL and CVaR), the solver's iterates on
    the client; the start and the end read the loss vector once each.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> rng = np.random.default_rng(0)
    >>> X = np.c_[np.ones(200), rng.normal(size=200)]
    >>> y = (X[:, 1] + 0.5 * rng.normal(size=200) > 0).astype(float)
    >>> obj = tl.TiltedObjective("logistic", X, y)
    >>> res = tl.minimize_dro(obj, kl=0.2)
    >>> res.success, bool(res.t > 0)
    (True, True)
    >>> erm = tl.minimize(obj)
    >>> bool(res.fun <= tl.bounds.entropic_value_at_risk(obj.losses(erm.x), radius=0.2))
    True
    >>> tail = tl.minimize_dro(obj, cvar=0.1)  # the mean of the worst 10%
    >>> bool(tail.fun >= tl.bounds.superquantile(obj.losses(tail.x), 0.0))
    True
    """
    _check_objective(objective, "objective")
    missing = [m for m in ("with_tilt", "losses", "prior", "problem") if not hasattr(objective, m)]
    if missing:
        raise TypeError(
            f"`objective` must be a tiltlab.TiltedObjective (no {', '.join(missing)}), "
            f"got {type(objective).__name__}"
        )
    if objective.is_hierarchical:
        raise TypeError("`objective` must be sample-level (no `groups`) for minimize_dro")
    if (kl is None) == (cvar is None):
        raise TypeError("pass exactly one of `kl` (a KL radius) and `cvar` (a tail fraction)")
    if not isinstance(method, str) or method not in METHODS or method == "stochastic":
        raise ValueError(
            f"`method` must be one of {sorted(set(METHODS) - {'stochastic'})}, got {method!r}"
        )
    if isinstance(max_outer, bool) or not isinstance(max_outer, int) or max_outer < 1:
        raise ValueError(f"`max_outer` must be an integer >= 1, got {max_outer!r}")
    if tol is not None:
        tol = check_tolerance(tol, "tol")
    if kl is not None:
        r = real_number(kl, "kl")
        if not (r >= 0 and math.isfinite(r)):
            raise ValueError(f"`kl` must be a finite radius >= 0, got {kl!r}")
        if (
            r > 0.0
            and method != "newton"
            and (objective.problem.is_linear or not is_lazy(objective.xp))
        ):
            return _counted(_kl_smooth, objective, r, theta0, method, tol, options)
        return _counted(_kl_fit, objective, r, theta0, method, tol, max_outer, options)
    a = real_number(cvar, "cvar")
    if not 0.0 < a <= 1.0:
        raise ValueError(f"`cvar` must be a tail fraction in (0, 1], got {cvar!r}")
    if method == "newton":
        raise ValueError("`method`='newton' is not available for `cvar` (a first-order method)")
    fit = _counted(cvar_fit, objective, a, theta0, method, tol, max_outer, options)
    return DROResult(**fit)


def _counted(fit: Any, objective: Any, *args: Any) -> Any:
    """``fit(objective, *args)``, its ``nfev`` completed with the evaluations of
    ``objective`` it made outside its inner solves (loss vectors, values, gradients)."""
    counted = CountedObjective(objective)
    res = fit(counted, *args)
    if isinstance(res, dict):
        res["nfev"] += counted.n_evals
    else:
        res.nfev += counted.n_evals
    return res


# ---------------------------------------------------------------------------
# KL


class _Fits:
    """TERM fits along the outer iteration: each warm-started from the last."""

    def __init__(self, objective, method, tol, options, theta0):
        self.objective, self.method, self.tol, self.options = objective, method, tol, options
        self.x, self.state = theta0, None
        self.nit = self.nfev = 0
        self.passes = 0.0
        self.last: OptimizeResult | None = None
        self.t0 = time.perf_counter()
        self.history: dict[str, list] = {k: [] for k in ("t", "fun", "nit", "n_passes", "time")}

    def fit(self, t: float, tol: float | None = None) -> OptimizeResult:
        obj = self.objective.with_tilt(t)
        self.tol_used = self.tol if tol is None else tol
        res = minimize(obj, self.x, method=self.method, tol=self.tol_used,
                       warm_state=self.state, **self.options)  # fmt: skip
        self.x, self.state, self.last = res.x, res.solver_state, res
        self.nit += res.nit
        self.nfev += res.nfev
        self.passes += res.n_passes
        return res

    def record(self, t: float, fun: float) -> None:
        h = self.history
        h["t"].append(t)
        h["fun"].append(fun)
        h["nit"].append(self.last.nit if self.last is not None else 0)
        h["n_passes"].append(self.passes)
        h["time"].append(time.perf_counter() - self.t0)


def _worst_case(
    objective: Any, x: Any, r: float, weights: bool = True
) -> tuple[Any, Any, float, Any]:
    """(robust value with the ridge term, worst-case weights, tilt, losses) at ``x``."""
    ell = objective.losses(x)
    prior = objective.prior()
    lazy = is_lazy(objective.xp)
    if lazy:  # one graph for the losses; the root search and the weights on the host
        ell, prior = to_numpy(ell), None if prior is None else to_numpy(prior)
    t = float(to_numpy(tilt_for_kl(ell, r, weights=prior)))
    w = tilted_weights(ell, t, weights=prior) if weights else None
    if t == 0.0:
        value = tilted_risk(ell, 0.0, weights=prior)
    elif math.isinf(t):
        value = tilted_risk(ell, math.inf, weights=prior)
    else:
        value = tilted_risk(ell, t, weights=prior) + r / t
    if lazy:
        xp = objective.xp
        value = xp.asarray(np.asarray(value), dtype=objective.dtype)
        w = None if w is None else xp.asarray(np.asarray(w), dtype=objective.dtype)
    pen = penalty(objective, x)
    if pen is not None:
        value = value + pen[0]
    return value, w, t, ell


def _spread(ell: Any, prior: Any, xp: Any) -> float:
    on = ell if prior is None else xp.where(prior > 0, ell, xp.zeros_like(ell))
    lo = ell if prior is None else xp.where(prior > 0, ell, xp.max(on) + xp.zeros_like(ell))
    return float(to_numpy(xp.max(on) - xp.min(lo)))


class _JointKL:
    """``F(theta, s) = R_{1/s}(theta) + r s`` (plus the ridge term) as an objective of
    the flat parameter ``(theta, s)``: value, gradient in ``theta`` (the tilted gradient)
    and derivative in ``s``, ``r - KL(w_t || p)``, from one evaluation (one pass over the
    data; one graph on Dask, with the parameters on the client). Below ``s = 1 / t_cap``
    it is continued flat in ``s`` (the min-max limit)."""

    def __init__(self, objective: Any, r: float, t_cap: float, shape: tuple):
        self.objective, self.r, self.t_cap = objective, r, t_cap
        self.data_xp = objective.xp
        self.lazy = is_lazy(self.data_xp)
        self.pr = objective.problem
        self.shape = shape
        self.size = int(math.prod(self.shape))
        self.n_passes = 0.0
        p = objective.prior()
        self.p = None if p is None else p / self.data_xp.sum(p)
        self.dtype = self.pr.dtype
        if self.lazy:  # the solver runs on the client, in NumPy
            self.xp, self.device = np, "cpu"
            self.dtype = np.dtype(to_numpy(self.data_xp.zeros((), dtype=self.pr.dtype)).dtype)
        else:
            self.xp, self.device = self.data_xp, self.pr.device
        self.tiny = tiny_sqrt(self.pr.dtype, self.data_xp)

    def zeros(self) -> Any:
        return self.xp.zeros((self.size + 1,), dtype=self.dtype, device=self.device)

    def check_theta(self, theta: Any, name: str = "theta") -> Any:
        out = self.xp.asarray(theta, dtype=self.dtype, device=self.device)
        if tuple(out.shape) != (self.size + 1,):
            raise ValueError(f"`{name}` must have shape {(self.size + 1,)}, got {out.shape}")
        return out

    def split(self, phi: Any) -> tuple[Any, float]:
        return self.xp.reshape(phi[: self.size], self.shape), float(to_numpy(phi[self.size]))

    def join(self, theta: Any, s: float) -> Any:
        xp = self.xp
        th = xp.reshape(xp.asarray(theta, dtype=self.dtype, device=self.device), (-1,))
        return xp.concat([th, xp.asarray([s], dtype=self.dtype, device=self.device)])

    def value_and_gradient(self, phi: Any) -> tuple[Any, Any]:
        theta, s = self.split(phi)
        capped = not s * self.t_cap > 1.0
        t = self.t_cap if capped else 1.0 / s  # flat in s beyond the cap (min-max limit)
        ell, back = _losses(self.objective, self.pr, theta, self.shape)
        gap, risk, w = _tilted(ell, self.p, t, self.data_xp, self.tiny)
        value = risk + self.r / t
        dv = 0.0 * gap if capped else self.r - t * gap
        g = back(w)
        value, g, dv = compute_together(value, g, dv)
        self.n_passes += 2
        pen = penalty(self.objective, theta) if not self.lazy else self._ridge(theta)
        if pen is not None:
            value, g = value + pen[0], g + pen[1]
        xs = self.xp
        grad = xs.concat(
            [
                xs.reshape(xs.asarray(g, dtype=self.dtype, device=self.device), (-1,)),
                xs.reshape(xs.asarray(dv, dtype=self.dtype, device=self.device), (1,)),
            ]
        )
        return xs.asarray(value, dtype=self.dtype, device=self.device), grad

    def _ridge(self, theta: Any) -> tuple[Any, Any] | None:
        l2 = self.objective.l2
        return None if not l2 else (0.5 * l2 * np.sum(theta * theta), l2 * theta)

    def tilt(self, s: float) -> float:
        return self.t_cap if not s * self.t_cap > 1.0 else 1.0 / s

    def value(self, phi: Any) -> Any:
        return self.value_and_gradient(phi)[0]

    def gradient(self, phi: Any) -> Any:
        return self.value_and_gradient(phi)[1]

    def hvp(self, phi: Any, v: Any) -> Any:  # pragma: no cover - first-order methods only
        raise NotImplementedError("the joint KL objective has no Hessian products")

    hessian = linearize = hvp


def _tilted(ell: Any, p: Any, t: float, xp: Any, tiny: float) -> tuple[Any, Any, Any]:
    """``(E_w[l] - R_t, R_t, w)`` at the tilt ``t > 0`` (``p`` normalised or None), without
    host reads: ``KL(w_t || p) = t (E_w[l] - R_t)``. The risk follows the tilted
    reduction's rule; the gap is formed about the shift (the largest loss)."""
    wsum = (lambda a: xp.mean(a)) if p is None else (lambda a: xp.sum(p * a))
    if p is None:
        hi, lo = xp.max(ell), xp.min(ell)
        d = ell - hi
    else:
        on = p > 0
        hi = xp.max(xp.where(on, ell, xp.full_like(ell, -math.inf)))
        lo = xp.min(xp.where(on, ell, xp.full_like(ell, math.inf)))
        d = xp.where(on, ell - hi, xp.zeros_like(ell))
    u = t * d
    risk = risk_of_exponents(u, p, hi, t * (hi - lo), wsum(ell), t, xp, tiny=tiny)
    e = xp.exp(u)
    w = e / (xp.sum(e) if p is None else xp.sum(p * e))
    if p is not None:
        w = p * w
    return xp.sum(w * d) - (risk - hi), risk, w


class _ProjectedKL:
    """``V(theta) = min_{0 < t <= t_cap} R_t(theta) + r / t`` (plus the ridge term), the
    robust value with the tilt eliminated: for each ``theta`` the tilt solves
    ``KL(w_t || p) = r`` by safeguarded Newton steps in ``log t`` on the loss vector,
    warm-started from the last evaluation's. By the envelope theorem the gradient is
    the tilted gradient at that tilt (one pass over the data for the losses, one for the
    gradient). Eager libraries (a host read per Newton step)."""

    def __init__(self, objective: Any, r: float, t_cap: float, t0: float, shape: tuple):
        self.objective, self.r, self.t_cap, self.t = objective, r, t_cap, t0
        self.xp = objective.xp
        self.pr = objective.problem
        self.shape = shape
        self.n_passes = 0.0
        p = objective.prior()
        self.p = None if p is None else p / self.xp.sum(p)
        self.tiny = tiny_sqrt(self.pr.dtype, self.xp)
        self.eps = float(self.xp.finfo(self.pr.dtype).eps)
        self.inner = 0

    def zeros(self) -> Any:
        return self.xp.zeros(self.shape, dtype=self.pr.dtype, device=self.pr.device)

    def check_theta(self, theta: Any, name: str = "theta") -> Any:
        return self.objective.check_theta(theta, name=name)

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        ell, back = _losses(self.objective, self.pr, theta, self.shape)
        t, risk, w = self._root(ell)
        value = risk + self.r / t
        g = back(w)
        self.n_passes += 2
        pen = penalty(self.objective, theta)
        if pen is not None:
            value, g = value + pen[0], g + pen[1]
        return value, g

    def at(self, theta: Any) -> tuple[Any, Any, float]:
        """(robust value with the ridge term, worst-case weights, tilt) at ``theta``."""
        ell, _ = _losses(self.objective, self.pr, theta, self.shape)
        t, risk, w = self._root(ell)
        pen = penalty(self.objective, theta)
        value = risk + self.r / t
        return (value if pen is None else value + pen[0]), w, t

    def _root(self, ell: Any) -> tuple[float, Any, Any]:
        """The tilt in ``(0, t_cap]`` nearest ``KL(w_t || p) = r`` and ``R_t``, ``w_t``
        there. The Newton steps read ``log Z``, ``E_w[d]`` and ``Var_w(d)`` of the
        shifted losses ``d = l - max l`` (``KL = t E_w[d] - log Z``); the risk and the
        weights at the tilt found are formed once, by the tilted reduction's rule."""
        xp, r, p = self.xp, self.r, self.p
        if p is None:
            d = ell - xp.max(ell)
        else:
            hi = xp.max(xp.where(p > 0, ell, xp.full_like(ell, -math.inf)))
            d = xp.where(p > 0, ell - hi, xp.zeros_like(ell))
        wsum = (lambda a: xp.mean(a)) if p is None else (lambda a: xp.sum(p * a))
        tol = max(_KL_RTOL, 64.0 * self.eps)
        logr, x = math.log(r), math.log(min(self.t, self.t_cap))
        lo = hi_x = None  # log-tilts below and above the root
        x_cap = math.log(self.t_cap)
        for _ in range(_NEWTON_STEPS):
            t = math.exp(x)
            self.inner += 1
            e = xp.exp(t * d)
            z, m1, m2 = (wsum(e), wsum(e * d), wsum(e * d * d))
            z, m1, m2 = (float(v) for v in to_numpy(xp.stack([z, m1, m2])))
            if not (z > 0 and math.isfinite(m1) and math.isfinite(m2)):
                break  # overflowing losses: the value is not finite either
            m1, var = m1 / z, max(m2 / z - (m1 / z) ** 2, 0.0)
            kl = t * m1 - math.log(z)
            h = math.log(kl) - logr if kl > 0 else -math.inf
            if h < 0:
                lo = x
                if x >= x_cap - 1e-12:  # the radius is not reached below the cap
                    break
            else:
                hi_x = x
            if abs(h) <= tol:
                break
            slope = t * t * var / kl if kl > 0 else 0.0  # d h / d log t
            step = -h / slope if slope > 0 and math.isfinite(h) else 1.0
            x_new = min(x + max(min(step, 2.0), -2.0), x_cap)
            if lo is not None and hi_x is not None and not min(lo, hi_x) < x_new < max(lo, hi_x):
                x_new = 0.5 * (lo + hi_x)
            done = abs(x_new - x) <= max(0.1 * math.sqrt(tol), 4.0 * self.eps) * max(1.0, abs(x))
            x = x_new
            if done:  # Newton's next error is of the order of this step squared
                break
        t = math.exp(x)
        self.t = t
        _, risk, w = _tilted(ell, p, t, xp, self.tiny)
        return t, risk, w

    def value(self, theta: Any) -> Any:
        return self.value_and_gradient(theta)[0]

    def gradient(self, theta: Any) -> Any:
        return self.value_and_gradient(theta)[1]

    def hvp(self, theta: Any, v: Any) -> Any:  # pragma: no cover - first-order methods only
        raise NotImplementedError("the robust KL objective has no Hessian products")

    hessian = linearize = hvp


def _losses(objective: Any, pr: Any, theta: Any, shape: tuple):
    """The losses at ``theta`` and the map ``c -> sum_i c_i grad l_i(theta)``."""
    xp = objective.xp
    if not pr.is_linear:
        idx = xp.arange(objective.n_samples, device=pr.device)
        ell, vjp = objective.batch_losses_and_vjp(xp.reshape(theta, (-1,)), idx)
        return ell, lambda c: xp.reshape(vjp(c), shape)
    X, y = pr.X, pr.y
    z = X @ theta
    ell, d1 = pr.loss.value_and_d1(z, y, validate=False, xp=xp)

    def back(c):
        return X.T @ (c[:, None] * d1 if d1.ndim == 2 else c * d1)

    return ell, back


def _start_tilt(ell: Any, prior: Any, r: float) -> tuple[float, float, bool]:
    """(a starting tilt, the tilt cap ``1e4 / scale``, whether the losses at the start
    reach no radius ``r`` at any tilt (ties at the largest loss, as at ``theta = 0`` of
    a classifier), from the losses at the start."""
    l_all = np.asarray(to_numpy(ell), dtype=np.float64).reshape(-1)
    ph = None if prior is None else np.asarray(to_numpy(prior), dtype=np.float64).reshape(-1)
    lh = l_all if ph is None else l_all[ph > 0]
    spread = float(np.max(lh) - np.min(lh)) if lh.size else 0.0
    scale = max(spread, float(np.mean(np.abs(lh))) if lh.size else 0.0, 1e-300)
    t_cap = 1e4 / scale
    t0 = float(tilt_for_kl(l_all, r, weights=ph))
    tied = not t0 < math.inf
    if not 0.0 < t0 < t_cap:
        sd = float(np.std(lh)) if lh.size else 0.0
        t0 = math.sqrt(2.0 * r) / (sd if sd > 0 else scale)  # KL ~ t^2 Var / 2
    return min(t0, 0.5 * t_cap), t_cap, tied


def _record(
    history: dict,
    t: float,
    state: Any,
    nit: int,
    passes: float,
    t_start: float,
    fun: float | None = None,
) -> None:
    history["t"].append(t)
    history["fun"].append(state.fun_float if fun is None else fun)
    history["nit"].append(nit + state.nit)
    history["n_passes"].append(passes)
    history["time"].append(time.perf_counter() - t_start)


def _kl_smooth(objective, r, theta0, method, tol, options) -> DROResult:
    """KL fit as one smooth solve: in ``theta`` with the tilt eliminated (eager
    libraries), or jointly in ``(theta, s = 1/t)`` (Dask) (module notes)."""
    x0 = objective.zeros() if theta0 is None else objective.check_theta(theta0, name="theta0")
    t_start = time.perf_counter()
    history: dict[str, list] = {k: [] for k in ("t", "fun", "nit", "n_passes", "time")}
    t0, t_cap, tied = _start_tilt(objective.losses(x0), objective.prior(), r)
    nit = nfev = 0
    passes = 0.0
    if not is_lazy(objective.xp):
        proj = _ProjectedKL(objective, r, t_cap, t0, tuple(x0.shape))

        def record(state):
            _record(history, proj.t, state, nit, passes + proj.n_passes, t_start)

        res = minimize(proj, x0, method=method, tol=tol, callback=record, **options)
        x, jac = res.x, res.jac
        value, w, t = proj.at(x)
        nfev += 1  # the robust value at x
        at_cap = t >= t_cap * (1.0 - 1e-12)
        if at_cap:  # the robust value at x, whose own tilt lies beyond the cap
            value, w, t, _ = _worst_case(objective, x, r)
    else:
        if tied:
            # ties at the start: the derivative in s is r there whatever s, and the joint
            # solve would first run to the cap; a loose TERM fit at the guess leaves them
            warm = minimize(objective.with_tilt(t0), x0, method=method, tol=_WARM, **options)
            x0, nit, nfev, passes = warm.x, warm.nit, warm.nfev, warm.n_passes
            _record(history, t0, warm, 0, passes, t_start, fun=float(warm.fun) + r / t0)
            t0, t_cap, _ = _start_tilt(objective.losses(x0), objective.prior(), r)
        joint = _JointKL(objective, r, t_cap, tuple(x0.shape))
        phi0 = joint.join(to_numpy(x0), 1.0 / t0)

        def record(state):
            t = joint.tilt(float(to_numpy(state.x[joint.size])))
            _record(history, t, state, nit, passes + joint.n_passes, t_start)

        res = minimize(joint, phi0, method=method, tol=tol, callback=record, **options)
        theta, s = joint.split(res.x)
        x = objective.check_theta(theta, name="theta")
        jac = objective.check_theta(np.reshape(res.jac[: joint.size], joint.shape), name="jac")
        at_cap = not s * t_cap > 1.0
        value, w, t, _ = _worst_case(objective, x, r)
    status, detail = res.status, ""
    if at_cap or t >= t_cap:
        at_x = f"{t:.6g}" if t < math.inf else "inf (its largest losses tie)"
        detail = (f"the optimal tilt reaches the cap t = {t_cap:.6g} (1e4 over the losses' "
                  f"scale at the start): the optimum is taken as the min-max limit "
                  f"t = inf, and x minimises the robust value over t <= {t_cap:.6g}, within "
                  f"about log(1/p_min) / {t_cap:.6g} of it; fun and weights are the worst "
                  f"case at x, whose own tilt is {at_x}")  # fmt: skip
        t = math.inf
    return DROResult(
        x=x, fun=value, jac=jac, nit=nit + res.nit, nfev=nfev + res.nfev,
        success=status.success, status=status, message=status.describe(nit + res.nit, detail),
        n_passes=passes + res.n_passes,
        history=history, method=method, t=t, weights=w,
    )  # fmt: skip


def _kl_fit(objective, r, theta0, method, tol, max_outer, options) -> DROResult:
    x0 = objective.zeros() if theta0 is None else objective.check_theta(theta0, name="theta0")
    final_tol = default_tol(working_eps(x0)) if tol is None else tol
    fits = _Fits(objective, method, final_tol, options, x0)
    xtol = max(1e-7, 10.0 * final_tol)
    # inexact fits while the tilt is far from the root, exact ones near it
    res = fits.fit(0.0, None if r == 0.0 else max(final_tol, _LOOSE))  # ERM: g(0) < root
    if r == 0.0:
        return _kl_result(objective, fits, r, Status.CONVERGED if res.success else res.status,
                          "radius 0: the ERM fit")  # fmt: skip
    value, _, g, ell = _worst_case(objective, res.x, r, weights=False)
    fits.record(0.0, float(to_numpy(value)))
    t_cap = 1e4 / max(_spread(ell, objective.prior(), objective.xp), 1e-300)
    lo = hi = None  # (s, rho) with rho > 0 (below the root) and rho < 0
    prev = None
    s = math.log(min(g, t_cap)) if g > 0 else math.log(t_cap)
    detail, status = "", Status.MAX_ITER
    inner = _LOOSE
    for _ in range(max_outer):
        t = math.exp(s)
        res = fits.fit(t, max(final_tol, inner))
        value, _, g, ell = _worst_case(objective, res.x, r, weights=False)
        fits.record(t, float(to_numpy(value)))
        rho = (math.log(g) - s) if math.isfinite(g) else math.inf
        if g == 0.0:  # pragma: no cover - equal losses at the fit
            rho = -math.inf
        if abs(rho) <= xtol:
            if fits.tol_used > final_tol:  # the root of an inexact fit: refine it
                inner = 0.0
                continue
            status = Status.CONVERGED if res.success else res.status
            break
        inner = min(inner, 0.1 * rho * rho) if math.isfinite(rho) else inner
        if rho > 0:
            if s >= math.log(t_cap) - 1e-12:
                status, detail = (
                    Status.CONVERGED if res.success else res.status,
                    (
                        "the optimum is the min-max limit t = inf; x is the fit at "
                        f"t = {t:.6g} (t * spread = 1e4)"
                    ),
                )
                fits.history["t"][-1] = math.inf
                return _kl_result(objective, fits, r, status, detail, t_inf=True)
            lo = (s, rho) if lo is None or s > lo[0] else lo
        else:
            hi = (s, rho) if hi is None or s < hi[0] else hi
        s_new = _next_s(s, rho, prev, lo, hi, t_cap)
        prev = (s, rho)
        if lo is not None and hi is not None and abs(hi[0] - lo[0]) <= xtol:
            status = Status.CONVERGED if res.success else res.status
            break
        s = s_new
    else:
        detail = f"max_outer={max_outer} TERM fits"
    return _kl_result(objective, fits, r, status, detail)


def _next_s(s, rho, prev, lo, hi, t_cap) -> float:
    """The next log-tilt: a secant step on rho(s) = log g(e^s) - s, kept inside the
    bracket (bisection where it would leave it), or a fixed-point step while no point
    above the root is known."""
    cap = math.log(t_cap)
    cand = None
    if math.isfinite(rho) and prev is not None and math.isfinite(prev[1]) and prev[1] != rho:
        cand = s - rho * (s - prev[0]) / (rho - prev[1])
    if lo is not None and hi is not None:
        a, b = min(lo[0], hi[0]), max(lo[0], hi[0])
        if cand is None or not a < cand < b:
            # regula falsi between the bracket's ends, or the midpoint
            fa, fb = lo[1], hi[1]
            cand = lo[0] - fa * (hi[0] - lo[0]) / (fb - fa) if math.isfinite(fa) else None
            if cand is None or not a < cand < b or abs(cand - s) < 1e-3 * (b - a):
                cand = 0.5 * (a + b)
        return cand
    if rho > 0:  # below the root: at least the fixed-point step, at most a few of them
        fixed = s + (rho if math.isfinite(rho) else 2.0)
        if cand is None or cand < fixed:
            cand = fixed
        return min(cand, fixed + 4.0 * (fixed - s), cap)
    # above the root without a point below (a warm start beyond it): step back
    fixed = s + rho
    return max(cand, fixed - 4.0 * abs(rho)) if cand is not None and cand < s else fixed


def _kl_result(objective, fits, r, status, detail, t_inf=False) -> DROResult:
    res = fits.last
    value, w, t, _ = _worst_case(objective, res.x, r)
    if t_inf:
        t = math.inf
    # the gradient of the robust objective at x: the TERM gradient at the tilt of x
    # (envelope theorem); at t = inf or 0 the one of the last fit
    jac = res.jac
    if 0.0 < t < math.inf:
        jac = objective.with_tilt(t).gradient(res.x)
        fits.nfev += 1
    success = status.success
    return DROResult(
        x=res.x, fun=value, jac=jac, nit=fits.nit, nfev=fits.nfev, success=success,
        status=status, message=status.describe(fits.nit, detail), n_passes=fits.passes,
        history=fits.history, method=fits.method, t=t, weights=w,
    )  # fmt: skip
