r"""Numerical checks of the TERM paper's properties along a tilt path.

:func:`check_path` takes a :class:`~tiltlab.TiltPath` (solutions :math:`\breve\theta(t)`
of a tilted objective over a grid of tilts) and checks, one record per property, the
statements of the paper's appendices "General Properties of the Objective/Solutions for
GLMs" and "TERM as an Approximate Superquantile Method" (SPEC section 6);
:func:`format_checks` prints the records as a table and :func:`tradeoff_curves` returns
the data of the paper's trade-off figure.

Notation: :math:`\ell_i(\theta)` the per-sample losses, ``p`` the prior (uniform by
default), :math:`R(t;\theta)` the tilted risk, :math:`F_t(\theta) = R(t;\theta) +
\tfrac{\lambda}{2}\|\theta\|^2` the objective (ridge ``lambda = objective.l2``), and
:math:`\breve\theta(t)` its minimiser, the path. With a ridge the path minimises
:math:`F_t`, so the statements derived from the sign theorem (the risk at a fixed tilt
``tau``, and its limits ``tau = 0`` (mean), ``+inf`` (max), ``-inf`` (min)) are checked for
the *penalised* quantities :math:`R(\tau;\theta) + \tfrac{\lambda}{2}\|\theta\|^2`; with
``l2 = 0`` these are the paper's quantities.

What holds, and what the paper states wrongly
----------------------------------------------
*Theorems for any smooth losses* (checked, and they hold on every valid path):

* ``objective_monotone_in_t`` -- :math:`R(t;\theta)` is non-decreasing in ``t`` for each
  fixed ``theta`` (a power-mean inequality; no GLM assumption is needed).
* ``optimal_objective_monotone`` -- :math:`\min_\theta F_t` is non-decreasing in ``t``.
* ``quantile_ordering`` -- :math:`Q^0 \le Q^1 \le Q^2 \le Q^3`
  (:func:`tiltlab.bounds.quantile_curves`, :func:`tiltlab.bounds.min_tail_fraction`).
* ``stationarity`` (each path point is a strict local minimum), ``gradient_fd`` and
  ``hessian_fd`` (tilted gradient and Hessian lemmas against finite differences) and
  ``solution_derivative_fd`` (:math:`d\breve\theta/dt = -H^{-1}\mathrm{Cov}_w(\ell,
  \nabla\ell)` against finite differences of re-solved solutions): the preconditions and
  lemmas the rest builds on.

*Claims that are not theorems.* The sign theorem ("d/dt R(tau; theta(t)) < 0 iff
t < tau", the theorem labelled ``thm:Lambda``) and everything the paper derives from it
(trade-offs, variance reduction, cosine similarity, weight uniformity) rest on the last
step of its proof, which treats
:math:`\breve\theta^\top \mathcal V(t) (\nabla^2 A + t\mathcal V(t))^{-1}
(\int_\tau^t \mathcal V)\,\breve\theta` as sign-definite. A product of two positive
semi-definite matrices is not positive semi-definite, so the step holds only where the
two matrices coincide, i.e. locally (``t -> tau``; ``t = 0`` for the variance and cosine
statements whose proofs use :math:`\mathcal V_0`). Counterexamples, with tight solves
(gradient norms below 1e-12; violations far above any tolerance):

* In the paper's own setting, :math:`f(x_i;\theta) = \|\theta\|^2 - 2\theta^\top x_i`
  (``A = ||theta||^2``, ``T(x) = 2x``, no ridge), with 2-D Gaussian data
  (``numpy.random.default_rng(s)``, ``n = rng.integers(5, 20)`` points
  ``rng.normal(size=(n, 2)) @ rng.normal(size=(2, 2)) + 2 rng.normal(size=2)``): the
  max-loss *increases* by 0.020 between ``t = 0.25`` and ``0.30`` (seed 38) and already
  at ``t = 0+`` (seed 546: d/dt max-loss = 1.47 at ``t = 0``; the max/mean trade-off has
  no local form near ``t = 0``, because the max-loss is the risk at ``tau = +inf``), the
  mean loss *decreases* by 0.0062 from ``t = 2.05`` to ``2.10`` (seed 15), for ``t < 0``
  *both* halves of the min/mean trade-off fail (seed 31: the mean loss rises by 0.29 from
  ``t = -10`` to ``t = -1.58``; the min half fails on the squared-loss test path), the loss variance
  increases for ``t > 0`` (seed 15, by 0.012) and for ``t < 0``; the entropy of
  fixed-tilt weights decreases in ``t`` (seed 33, ``tau = -20``).
* The paper claims its GLM assumption covers the squared and logistic losses; it does
  not (their cumulant depends on the sample through ``x_i``), and there the claims fail on
  ordinary data too: regularised least squares (``tests/test_theory.py``, data
  ``x ~ N(0, 1)``, ``y = 1.5 x + 0.5 + 0.7 N(0, 1)``, ``n = 40``): the loss variance
  increases for ``t >= 2.5`` (0.06570 at ``t = 2.5`` to 0.06614 at ``t = 4``) and the
  min-loss is not monotone for ``t < 0`` (residuals cross zero: 7.7e-4 at ``t = -1.5``,
  2.3e-4 at ``t = -1``); regularised logistic regression: the cosine similarity decreases for
  ``t < 0`` and the fixed-tilt weight entropy is not monotone. On the paper's own
  linear-regression toy (:func:`tiltlab.datasets.linear_regression_outliers` with
  ``n=50, seed=0``, ``l2=1e-6``) the max-loss *rises* from 11.33 at ``t = 0.0215`` to 12.32
  at ``t = 0.251``, where the objective is convex (notebook
  ``notebooks/superquantile_and_tradeoffs.ipynb``).

Each such record's description says so. On many paths the claims still hold (the sign
theorem and the max/mean trade-off hold on the logistic and squared-loss test paths), which
is what the figure of the paper shows; :func:`check_path` reports what the data say.

*Corrected statements* (theorems for any twice-differentiable losses with a positive
definite Hessian at the path, ridge included; checked by the ``*_local`` records). With
:math:`c_\tau = \sum_i w_i(\tau)(\ell_i - \bar\ell_w)\nabla\ell_i` and
:math:`\breve\theta'(\tau) = -H^{-1}c_\tau` (:func:`tiltlab.diagnostics.solution_derivative`):

* ``risk_sign_local`` -- :math:`t \mapsto F_\tau(\breve\theta(t))` has a stationary minimum
  at ``t = tau``: its derivative vanishes there and has the sign of ``t - tau`` for ``t``
  near ``tau`` (second derivative :math:`\breve\theta'^\top H\breve\theta' \ge 0`). The
  sign theorem holds in this local form only.
* ``variance_local`` -- :math:`\frac{d}{dt}\mathrm{Var}_p\,\ell(\breve\theta(t))|_{t=0}
  = -2 c_0^\top H^{-1} c_0 \le 0`: the variance decreases through ``t = 0``; nothing more.
* ``cosine_local`` -- at ``t = 0``,
  :math:`\frac{d}{dt}s = (m\,c_0^\top H^{-1}c_0 + \lambda\,\mathrm{Var}\,
  \breve\theta^\top H^{-1}c_0)/q^3` (``m`` the mean, ``q`` the root-mean-square loss):
  non-negative when ``m >= 0`` and there is no ridge, and only then. With losses of
  mean ``m < 0`` (the paper's point-estimation GLM, whose losses
  :math:`\|\theta\|^2 - 2\theta^\top x_i` are negative near the data) the cosine
  *decreases* through ``t = 0``; the record then fails and says so (the cosine is defined
  for losses of any sign, so the check is never skipped for negative losses).
* ``entropy_local`` -- :math:`\frac{d}{dt} H(w(\tau;\breve\theta(t)))|_{t=\tau}
  = \tau^2 c_\tau^\top H^{-1} c_\tau \ge 0` (the paper's "more uniform weights" holds at
  the path point itself; the paper's strict ``> 0`` also fails at ``tau = 0``, where the
  weights are uniform for every ``theta``).
* The min-loss trade-off (theorem ``thm:tradeoff-2``) has, besides the gap above, slips
  in its proof: it writes the max-loss :math:`\widehat R` for the min-loss
  :math:`\widecheck R` in the limit ``t -> -inf``, restricts ``tau, t`` to
  :math:`\mathbb R^+` where :math:`\mathbb R^-` is meant, names the solution
  :math:`\widetilde\theta`, and keeps a strict inequality through a limit. The statement
  as printed (min non-decreasing, mean non-increasing in ``t < 0``) is what is checked.

Tolerances
----------
Every comparison allows for the accuracy of the solver. For path point ``k`` the error
of the solution is estimated as :math:`\delta\theta_k = \|g_k\| / \mu_k`, with
:math:`g_k` the gradient *reported by the solver* (``path.results[k].jac``; recomputed
only when a result has none) and :math:`\mu_k` the smallest eigenvalue of the
objective's Hessian there. A statistic :math:`q(\ell)` of the losses moves by at most
:math:`\|\partial q/\partial\ell\|_1\, G_k\,\delta\theta_k` (``G_k`` the largest
per-sample gradient norm; the ridge adds :math:`\lambda\|\theta_k\|\delta\theta_k`), so a
comparison of ``q`` at points ``j`` and ``k`` passes when it fails by at most::

    10 * (S_j G_j dtheta_j + S_k G_k dtheta_k) + rtol * (|q_j| + |q_k|),

``S = ||dq/dl||_1`` computed exactly for each statistic and ``rtol`` (default ``1e-10``)
covering floating-point rounding. The local rates (``*_local``) are sums with
cancellation; their tolerance is ``1e-8`` times the rate's magnitude bound built from the
absolute values of every term (per-sample coefficients before cancellation times
per-sample gradient norms, and ``||H^-1||``), so a rate of ``1e-78`` computed from terms
of ``1e-60`` reads as rounding, not as a broken theorem. Finite-difference checks use a
Richardson estimate of their truncation error (steps ``h`` and ``2h``) plus the solution
error over the step. A path whose solutions are wrong (say, shuffled across tilts) fails
the stationarity record and the monotonicity records, since its reported gradients are small.

Backends: any (the objective is evaluated in its namespace); the checks run on the host
in float64 with NumPy and SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._compat import to_numpy

__all__ = [
    "PropertyCheck",
    "PROPERTIES",
    "check_path",
    "format_checks",
    "tradeoff_curves",
]

_SAFETY = 10.0
_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class PropertyCheck:
    """Outcome of one property check along a tilt path.

    Attributes
    ----------
    name : str
        Short identifier (see :data:`PROPERTIES`).
    holds : bool
        True when every comparison passed within its tolerance (or the check did not
        apply; the description then says why).
    worst_violation : float
        The largest amount by which a comparison failed, in the units of the checked
        quantity; 0 when the property holds.
    description : str
        What was checked, on which tilts, and notes (not-a-theorem warnings, skips).
    reference : str
        The paper's statement it checks (theorem title and label).
    tolerance : float
        The tolerance of the worst comparison (of the worst failing one, if any).
    parts : tuple of (str, bool, float)
        For statements made of several halves (the trade-offs): ``(label, holds,
        worst_violation)`` of each half, e.g. ``("min", False, 5e-4), ("mean", True, 0.0)``.
    """

    name: str
    holds: bool
    worst_violation: float
    description: str
    reference: str
    tolerance: float = 0.0
    parts: tuple = ()


#: Names of the checks of :func:`check_path`, in the order they are reported.
PROPERTIES: tuple[str, ...] = (
    "stationarity",
    "objective_monotone_in_t",
    "optimal_objective_monotone",
    "risk_sign",
    "risk_sign_local",
    "max_mean_tradeoff",
    "min_mean_tradeoff",
    "variance_decreasing",
    "variance_local",
    "cosine_increasing",
    "cosine_local",
    "entropy_increasing",
    "entropy_local",
    "gradient_fd",
    "hessian_fd",
    "solution_derivative_fd",
    "quantile_ordering",
)

_NOT_A_THEOREM = (
    " Not a theorem: the paper's proof treats a product of two positive semi-definite "
    "matrices as sign-definite; it can fail on valid data (see tiltlab.theory)."
)


# ---------------------------------------------------------------------------
# per-path data


class _Violations:
    """Accumulates comparisons: (amount by which a statement fails, tolerance)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_tol = 0.0
        self.max_ratio = -np.inf
        self.count = 0

    def add(self, excess: Any, tol: Any) -> None:
        excess = np.atleast_1d(np.asarray(excess, dtype=np.float64))
        tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), excess.shape)
        if excess.size == 0:
            return
        self.count += excess.size
        bad = excess > tol
        if np.any(bad):
            k = int(np.argmax(np.where(bad, excess, -np.inf)))
            if excess[k] > self.worst:
                self.worst, self.worst_tol = float(excess[k]), float(tol[k])
        elif self.worst == 0.0:
            k = int(np.argmax(excess - tol))
            self.worst_tol = max(self.worst_tol, float(tol[k]))

    def record(
        self, name: str, description: str, reference: str, parts: tuple = ()
    ) -> PropertyCheck:
        return PropertyCheck(
            name=name,
            holds=self.worst == 0.0,
            worst_violation=self.worst,
            description=description,
            reference=reference,
            tolerance=self.worst_tol,
            parts=parts,
        )


def _host(x: Any) -> np.ndarray:
    return np.asarray(to_numpy(x), dtype=np.float64)


class _PathData:
    """Host-side quantities of a path, computed once (solutions sorted by tilt)."""

    def __init__(self, path: Any, rtol: float, fd_step: float):
        for attr in ("ts", "x", "objective"):
            if not hasattr(path, attr):
                raise TypeError(f"`path` must be a TiltPath (from tiltlab.tilt_path); no `{attr}`")
        obj = path.objective
        if getattr(obj, "is_hierarchical", False):
            raise NotImplementedError("check_path checks sample-level tilt paths")
        ts = np.asarray(path.ts, dtype=np.float64)
        if ts.ndim != 1 or ts.size < 2:
            raise ValueError("`path` needs at least two tilts")
        if not np.all(np.isfinite(ts)):
            raise ValueError("`path` tilts must be finite")
        order = np.argsort(ts, kind="stable")
        keep = np.concatenate([[True], np.diff(ts[order]) > 0])  # drop repeated tilts
        self.index = order[keep]
        self.ts = ts[self.index]
        self.obj = obj
        self.xp = obj.xp
        self.rtol = rtol
        self.fd_step = fd_step
        self.l2 = float(getattr(obj, "l2", 0.0))
        results = list(getattr(path, "results", None) or [None] * ts.size)
        self.x_native = [path.x[int(k), ...] for k in self.index]
        self.theta = np.stack([_host(x).reshape(-1) for x in self.x_native])
        self.shape = tuple(self.x_native[0].shape)
        T = self.ts.size
        self.L = np.stack([_host(obj.losses(x)) for x in self.x_native])  # (T, N)
        n = self.L.shape[1]
        prior = obj.prior() if hasattr(obj, "prior") else None
        self.p = np.full(n, 1.0 / n) if prior is None else _host(prior)
        self.uniform = prior is None or bool(np.allclose(self.p, 1.0 / n, rtol=0, atol=1e-15))
        self.pen = 0.5 * self.l2 * np.sum(self.theta**2, axis=1)
        self.theta_norm = np.linalg.norm(self.theta, axis=1)
        self.g_now = np.empty(T)
        self.g_rep = np.empty(T)
        self.mu = np.empty(T)
        self.G = np.empty(T)
        self.H: list[np.ndarray] = []
        for k, x in enumerate(self.x_native):
            o = obj.with_tilt(float(self.ts[k]))
            self.g_now[k] = float(np.linalg.norm(_host(o.gradient(x))))
            res = results[int(self.index[k])]
            jac = getattr(res, "jac", None)
            self.g_rep[k] = self.g_now[k] if jac is None else float(np.linalg.norm(_host(jac)))
            try:
                H = _host(o.hessian(x))
            except (NotImplementedError, ValueError, TypeError) as exc:
                raise TypeError(
                    "check_path needs an objective with Hessians (a linear-predictor loss, or "
                    f"a CallableLoss with `hess`): {exc}"
                ) from None
            H = 0.5 * (H + H.T)
            self.H.append(H)
            self.mu[k] = float(np.linalg.eigvalsh(H)[0])
            self.G[k] = float(np.max(_sample_grad_norms(o, x)))
        # solution error estimate (floored so that a singular Hessian gives a large error)
        hscale = np.array([max(np.abs(H).max(), 1e-300) for H in self.H])
        self.dtheta = self.g_rep / np.maximum(self.mu, 1e-8 * hscale)
        self._derivs: list[np.ndarray] | None = None
        self._resolved: dict[float, np.ndarray] = {}
        self._resolved_err: dict[float, float] = {}

    # -- helpers -------------------------------------------------------------------------

    def native(self, theta_host: np.ndarray) -> Any:
        xp, obj = self.xp, self.obj
        arr = xp.asarray(theta_host.reshape(self.shape), dtype=obj.dtype, device=obj.device)
        return arr

    def err(self, k: int, S: Any = 1.0, penalised: bool = False) -> Any:
        """First-order change of a loss statistic with ||dq/dl||_1 = S from solution error."""
        e = np.asarray(S) * self.G[k] * self.dtheta[k]
        if penalised:
            e = e + self.l2 * self.theta_norm[k] * self.dtheta[k]
        return e

    def derivs(self) -> list[np.ndarray]:
        """d theta / dt at each path point (general formula)."""
        if self._derivs is None:
            from .diagnostics import solution_derivative

            self._derivs = [
                _host(solution_derivative(self.obj.with_tilt(float(t)), x)).reshape(-1)
                for t, x in zip(self.ts, self.x_native, strict=True)
            ]
        return self._derivs

    def resolve(self, t: float, start: np.ndarray) -> tuple[np.ndarray, float]:
        """A tight solve at tilt ``t`` warm-started at ``start``: (solution, error bound)."""
        key = float(t)
        if key not in self._resolved:
            from .solvers import minimize

            o = self.obj.with_tilt(key)
            # Newton to about machine precision of the gradient (scale: per-sample gradients)
            atol = 100 * _EPS * float(np.max(self.G) + self.l2 * np.max(self.theta_norm) + 1.0)
            res = minimize(
                o, self.native(start), method="newton", tol=1e-12, atol=atol, max_iter=50
            )
            x = _host(res.x).reshape(-1)
            g = float(np.linalg.norm(_host(o.gradient(res.x))))
            H = _host(o.hessian(res.x))
            mu = float(np.linalg.eigvalsh(0.5 * (H + H.T))[0])
            self._resolved[key] = x
            self._resolved_err[key] = g / max(mu, 1e-8 * max(np.abs(H).max(), 1e-300))
        return self._resolved[key], self._resolved_err[key]

    def vjp(self, k_or_theta: Any, t: float, coef: np.ndarray) -> np.ndarray:
        """sum_i coef_i grad l_i(theta) (ridge not included)."""
        x = self.x_native[k_or_theta] if isinstance(k_or_theta, int) else k_or_theta
        return _host(_sample_vjp(self.obj.with_tilt(float(t)), x, coef)).reshape(-1)


def _sample_grad_norms(obj: Any, x: Any) -> np.ndarray:
    """||grad l_i(theta)|| for every sample."""
    xp = obj.xp
    if obj.loss.is_linear:
        th = xp.reshape(x, obj.shape)
        z = obj.X @ th
        _, d1, _ = obj.loss.derivatives(z, obj.y, validate=False, xp=xp)
        xn = np.linalg.norm(_host(obj.X), axis=1)
        d1h = _host(d1)
        dn = np.abs(d1h) if d1h.ndim == 1 else np.linalg.norm(d1h, axis=1)
        return dn * xn
    _, J = obj.loss.value_and_grad(x, obj.X, obj.y, xp=xp)
    Jh = _host(J)
    return np.linalg.norm(Jh.reshape(Jh.shape[0], -1), axis=1)


def _sample_vjp(obj: Any, x: Any, coef: np.ndarray) -> Any:
    xp = obj.xp
    c = xp.asarray(coef, dtype=obj.dtype, device=obj.device)
    if obj.loss.is_linear:
        th = xp.reshape(x, obj.shape)
        z = obj.X @ th
        _, d1, _ = obj.loss.derivatives(z, obj.y, validate=False, xp=xp)
        cd = c[:, None] * d1 if d1.ndim == 2 else c * d1
        return obj.X.T @ cd
    _, J = obj.loss.value_and_grad(x, obj.X, obj.y, xp=xp)
    return c @ J


def _tilted_risks(L: np.ndarray, p: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """R(tau; l_k) for every tau (rows) and path point k (columns)."""
    from .risk import tilted_risk

    return np.asarray(tilted_risk(L, taus, weights=p))  # (n_tau, T)


def _tilted_weights(l: np.ndarray, p: np.ndarray, tau: float) -> np.ndarray:
    from .risk import tilted_weights

    return np.asarray(tilted_weights(l, float(tau), weights=p))


def _entropy(w: np.ndarray) -> float:
    nz = w[w > 0]
    return float(-(nz * np.log(nz)).sum())


# ---------------------------------------------------------------------------
# the checks


def _check_stationarity(d: _PathData) -> PropertyCheck:
    v = _Violations()
    scale = d.G + d.l2 * d.theta_norm
    tol = np.maximum(_SAFETY * d.g_rep, 1e3 * _EPS * np.maximum(scale, 1.0))
    v.add(d.g_now, tol)
    hscale = np.array([np.abs(H).max() for H in d.H])
    v.add(-d.mu, 0.0)  # the smallest Hessian eigenvalue must be positive
    bad_mu = np.sum(d.mu <= 1e-14 * hscale)
    desc = (
        "Each path point is a strict local minimum of its objective: the recomputed gradient "
        "norm is within 10x the solver's reported one, and the Hessian is positive definite. "
        f"Largest recomputed gradient norm {d.g_now.max():.2e} (reported {d.g_rep.max():.2e}); "
        f"smallest Hessian eigenvalue {d.mu.min():.3e}."
    )
    if bad_mu:
        desc += f" {bad_mu} point(s) without a positive definite Hessian."
    return v.record(
        "stationarity",
        desc,
        "Assumption 'strict saddle' and Lemma 'grad Lambda(t; theta(t)) = 0' (app. GLM solutions)",
    )


def _check_objective_monotone(d: _PathData) -> PropertyCheck:
    v = _Violations()
    R = _tilted_risks(d.L, d.p, d.ts)  # (tau, k)
    for k in range(d.ts.size):
        vals = R[:, k]
        excess = vals[:-1] - vals[1:]
        v.add(excess, d.rtol * (np.abs(vals[:-1]) + np.abs(vals[1:])) + 1e-300)
    return v.record(
        "objective_monotone_in_t",
        "R(t; theta) is non-decreasing in t at every fixed path solution theta, over all path "
        "tilts (holds for any losses: power-mean inequality).",
        "Theorem 'Tilted objective is increasing with t' (thm: obj-increasing)",
    )


def _check_optimal_objective(d: _PathData) -> PropertyCheck:
    v = _Violations()
    R = _tilted_risks(d.L, d.p, d.ts)
    F = np.diag(R) + d.pen
    for k in range(d.ts.size - 1):
        # the value error at a near-stationary point is about ||g|| * dtheta
        tol = _SAFETY * (d.g_rep[k] * d.dtheta[k] + d.g_rep[k + 1] * d.dtheta[k + 1])
        tol += d.rtol * (abs(F[k]) + abs(F[k + 1]))
        v.add(F[k] - F[k + 1], tol)
    return v.record(
        "optimal_objective_monotone",
        "The optimal objective F(t) = min_theta R(t; theta) (+ ridge) is non-decreasing in t "
        "along the path (holds for any losses).",
        "Theorem 'Optimal tilted objective is increasing with t' (thm: opt-obj-increasing)",
    )


def _pen_label(d: _PathData) -> str:
    return " (+ ridge penalty)" if d.l2 else ""


def _check_risk_sign(d: _PathData) -> PropertyCheck:
    v = _Violations()
    R = _tilted_risks(d.L, d.p, d.ts) + d.pen[None, :]
    for j, tau in enumerate(d.ts):
        vals = R[j]
        for k in range(d.ts.size - 1):
            diff = vals[k + 1] - vals[k]
            tol = _SAFETY * (d.err(k, 1.0, True) + d.err(k + 1, 1.0, True))
            tol += d.rtol * (abs(vals[k]) + abs(vals[k + 1]))
            if d.ts[k + 1] <= tau:
                v.add(diff, tol)  # must not increase before tau
            elif d.ts[k] >= tau:
                v.add(-diff, tol)  # must not decrease after tau
    return v.record(
        "risk_sign",
        "For every path tilt tau, t -> R(tau; theta(t))"
        + _pen_label(d)
        + " is non-increasing for t <= tau and non-decreasing for t >= tau (differences "
        "between consecutive path solutions)." + _NOT_A_THEOREM + " The local form holds "
        "(risk_sign_local).",
        "Theorem 'd/dt R(tau; theta(t)) < 0 iff t < tau, = 0 iff t = tau' (thm:Lambda)",
    )


def _check_risk_sign_local(d: _PathData) -> PropertyCheck:
    v = _Violations()
    h = d.fd_step
    for k, tau in enumerate(d.ts):
        o = d.obj.with_tilt(float(tau))
        f0 = float(_host(o.value(d.x_native[k])))
        for s in (-1.0, 1.0):
            th, e = d.resolve(tau + s * h, d.theta[k])
            f1 = float(_host(o.value(d.native(th))))
            # F_tau(theta(tau +- h)) >= F_tau(theta(tau)): a stationary minimum at t = tau
            g1 = float(np.linalg.norm(_host(o.gradient(d.native(th)))))
            tol = _SAFETY * (d.g_rep[k] * d.dtheta[k] + g1 * e) + d.rtol * (abs(f0) + abs(f1))
            v.add(f0 - f1, tol)
    return v.record(
        "risk_sign_local",
        f"Corrected sign theorem: for every path tilt tau, t -> R(tau; theta(t)){_pen_label(d)} "
        f"has a minimum at t = tau, checked against tight re-solves at tau +- {h:g} "
        "(its derivative vanishes at tau and has the sign of t - tau nearby).",
        "Theorem thm:Lambda, local form (the proof's quadratic form is sign-definite as t -> tau)",
    )


def _monotone(v: _Violations, d: _PathData, ks: Sequence[int], q: np.ndarray, S, increasing, pen):
    for a, b in zip(ks[:-1], ks[1:], strict=True):
        diff = q[b] - q[a]
        tol = _SAFETY * (d.err(a, S[a], pen) + d.err(b, S[b], pen))
        tol += d.rtol * (abs(q[a]) + abs(q[b]))
        v.add(-diff if increasing else diff, tol)


def _parts_tuple(parts: dict[str, _Violations]) -> tuple:
    return tuple((label, part.worst == 0.0, part.worst) for label, part in parts.items())


def _parts_note(parts: dict[str, _Violations]) -> str:
    out = []
    for label, part in parts.items():
        state = "holds" if part.worst == 0.0 else f"fails by up to {part.worst:.3g}"
        out.append(f"{label} part {state}")
    return " (" + "; ".join(out) + ")."


def _two_parts(d, ks, first, second) -> tuple[_Violations, dict[str, _Violations]]:
    """Check two monotonicity statements; (combined, per part)."""
    ones = np.ones(d.ts.size)
    parts = {}
    for label, q, increasing in (first, second):
        part = _Violations()
        _monotone(part, d, ks, q, ones, increasing, True)
        parts[label] = part
    both = _Violations()
    for part in parts.values():
        both.add(part.worst, part.worst_tol)
    return both, parts


def _check_max_mean(d: _PathData) -> PropertyCheck:
    ks = [k for k in range(d.ts.size) if d.ts[k] >= 0]
    v, parts = _two_parts(
        d, ks, ("max", d.L.max(axis=1) + d.pen, False), ("mean", d.L @ d.p + d.pen, True)
    )
    desc = (
        f"For t >= 0: the max-loss{_pen_label(d)} is non-increasing and the mean loss"
        f"{_pen_label(d)} non-decreasing along the path ({len(ks)} tilts)"
        + _parts_note(parts)
        + _NOT_A_THEOREM
        + " It has no local form at t = 0: the max-loss is the risk at tau = +inf, far "
        "from t, and d/dt max-loss can be positive already at t = 0+ on valid data."
    )
    if len(ks) < 2:
        desc += " Skipped: fewer than two tilts >= 0."
    return v.record(
        "max_mean_tradeoff",
        desc,
        "Theorem 'Average- vs. max-loss tradeoff' (thm:tradeoff)",
        _parts_tuple(parts),
    )


def _check_min_mean(d: _PathData) -> PropertyCheck:
    ks = [k for k in range(d.ts.size) if d.ts[k] <= 0]
    v, parts = _two_parts(
        d, ks, ("min", d.L.min(axis=1) + d.pen, True), ("mean", d.L @ d.p + d.pen, False)
    )
    desc = (
        f"For t <= 0: the min-loss{_pen_label(d)} is non-decreasing and the mean loss"
        f"{_pen_label(d)} non-increasing along the path ({len(ks)} tilts), as the theorem "
        "is printed; its proof also swaps max for min, R^+ for R^-, and keeps '>' through a "
        "limit" + _parts_note(parts) + _NOT_A_THEOREM
    )
    if len(ks) < 2:
        desc += " Skipped: fewer than two tilts <= 0."
    return v.record(
        "min_mean_tradeoff",
        desc,
        "Theorem 'Average- vs. min-loss tradeoff' (thm:tradeoff-2)",
        _parts_tuple(parts),
    )


def _variance_parts(l: np.ndarray, p: np.ndarray) -> tuple[float, float, np.ndarray]:
    m = float(p @ l)
    var = float(p @ (l - m) ** 2)
    return m, var, 2.0 * p * (l - m)  # d var / d l


def _check_variance(d: _PathData) -> PropertyCheck:
    v = _Violations()
    var = np.empty(d.ts.size)
    S = np.empty(d.ts.size)
    for k in range(d.ts.size):
        _, var[k], dv = _variance_parts(d.L[k], d.p)
        S[k] = np.abs(dv).sum()
    _monotone(v, d, list(range(d.ts.size)), var, S, False, False)
    return v.record(
        "variance_decreasing",
        "The (prior-weighted) variance of the losses is non-increasing along the whole path, "
        "as the theorem states (for every t)." + _NOT_A_THEOREM + " Corrected: variance_local.",
        "Theorem 'Variance reduction' (thm: variance-reduction)",
    )


def _zero_point(d: _PathData) -> tuple[Any, np.ndarray, np.ndarray, str]:
    """(native theta, host theta, d theta/dt) at t = 0 (re-solved if 0 is not on the path)."""
    from .diagnostics import solution_derivative

    hits = np.flatnonzero(d.ts == 0.0)
    if hits.size:
        k = int(hits[0])
        return d.x_native[k], d.theta[k], d.derivs()[k], "the path point t = 0"
    k = int(np.argmin(np.abs(d.ts)))
    th, _ = d.resolve(0.0, d.theta[k])
    x = d.native(th)
    dth = _host(solution_derivative(d.obj.with_tilt(0.0), x)).reshape(-1)
    return x, th, dth, "t = 0 (re-solved: 0 is not on the path)"


def _local_tol(
    d: _PathData,
    t: float,
    x: Any,
    grad_q: np.ndarray,
    dq_abs: np.ndarray,
    dth: np.ndarray,
    c_abs: np.ndarray,
) -> float:
    """Tolerance of a local rate ``grad_q . dth`` that scales with its rounding error.

    ``grad_q = sum_i dq_i grad l_i`` and ``dth = -H^-1 c`` (``c = sum_i c_i grad l_i``)
    are sums with cancellation (a rate of 1e-78 can be built from terms of 1e-70), so
    the rounding error is bounded through the sums of absolute values ``dq_abs`` and
    ``c_abs`` (each coefficient's magnitude before cancellation) times the per-sample
    gradient norms, with ``||H^-1|| = 1 / mu``.
    """
    o = d.obj.with_tilt(float(t))
    G = _sample_grad_norms(o, x)
    H = _host(o.hessian(x))
    ev = np.linalg.eigvalsh(0.5 * (H + H.T))
    mu = max(float(ev[0]), 1e-12 * max(float(np.abs(ev).max()), 1e-300))
    gq, nd = float(np.linalg.norm(grad_q)), float(np.linalg.norm(dth))
    A = float(dq_abs @ G)
    B = float(c_abs @ G) / mu
    return 1e-8 * (gq * nd + A * nd + gq * B) + 1e-300


def _check_variance_local(d: _PathData) -> PropertyCheck:
    v = _Violations()
    x0, th0, dth, where = _zero_point(d)
    l = _host(d.obj.losses(x0))
    _, _, dv = _variance_parts(l, d.p)
    grad_var = d.vjp(x0, 0.0, dv)  # = 2 c_0
    rate = float(grad_var @ dth)
    m = float(d.p @ l)
    c_abs = d.p * (np.abs(l) + abs(m))
    tol = _local_tol(d, 0.0, x0, grad_var, 2 * c_abs, dth, c_abs)
    v.add(rate, tol)
    return v.record(
        "variance_local",
        f"Corrected variance reduction: d/dt Var(l(theta(t))) at {where} equals "
        f"-2 c0' H^-1 c0 <= 0 (computed: {rate:.4g}).",
        "Theorem thm: variance-reduction, local form at t = 0 (where V(t) = V_0)",
    )


def _cosine_parts(l: np.ndarray, p: np.ndarray) -> tuple[float, np.ndarray]:
    m = float(p @ l)
    q = math.sqrt(float(p @ (l * l)))
    s = m / q
    ds = p / q - m * p * l / q**3
    return s, ds


_COSINE_REF = (
    "Theorem 'Cosine similarity of the loss vector and the all-ones vector increases "
    "with t' (thm: cosine-similarity)"
)


def _check_cosine(d: _PathData) -> PropertyCheck:
    v = _Violations()
    # the cosine E l / sqrt(E l^2) is defined for losses of any sign (not for all-zero ones)
    ks = [k for k in range(d.ts.size) if np.any(d.L[k] != 0)]
    s = np.zeros(d.ts.size)
    S = np.zeros(d.ts.size)
    for k in ks:
        s[k], ds = _cosine_parts(d.L[k], d.p)
        S[k] = np.abs(ds).sum()
    _monotone(v, d, ks, s, S, True, False)
    desc = (
        "The cosine similarity of the loss vector with the all-ones vector (prior-weighted: "
        "E l / sqrt(E l^2)) is non-decreasing along the whole path." + _NOT_A_THEOREM
    )
    if np.any(d.L < 0):
        desc += (
            " The losses take negative values here; the cosine is still defined, and the "
            "local form (cosine_local) needs a non-negative mean loss."
        )
    if len(ks) < d.ts.size:
        desc += f" {d.ts.size - len(ks)} point(s) with all-zero losses left out."
    return v.record("cosine_increasing", desc, _COSINE_REF)


def _check_cosine_local(d: _PathData) -> PropertyCheck:
    v = _Violations()
    x0, _, dth, where = _zero_point(d)
    l = _host(d.obj.losses(x0))
    ref = "Theorem thm: cosine-similarity, local form at t = 0"
    if np.all(l == 0):
        return PropertyCheck(
            "cosine_local", True, 0.0, "Skipped: all losses are zero at t = 0 (no cosine).", ref
        )
    _, ds = _cosine_parts(l, d.p)
    grad_s = d.vjp(x0, 0.0, ds)
    rate = float(grad_s @ dth)
    m = float(d.p @ l)
    q = math.sqrt(float(d.p @ (l * l)))
    ds_abs = d.p / q + abs(m) * d.p * np.abs(l) / q**3
    tol = _local_tol(d, 0.0, x0, grad_s, ds_abs, dth, d.p * (np.abs(l) + abs(m)))
    v.add(-rate, tol)
    cond = m >= 0 and d.l2 == 0
    desc = (
        f"Corrected cosine statement: d/dt s(l(theta(t)), 1) at {where} equals "
        "(m c0' H^-1 c0 + lambda Var theta' H^-1 c0) / q^3 (m the mean and q the root mean "
        "square loss, lambda the ridge), which is >= 0 when m >= 0 and lambda = 0 (the "
        f"theorem's real condition; the paper states none). Here m = {m:.4g}, "
        f"lambda = {d.l2:g}; computed rate {rate:.4g}."
    )
    if not cond:
        desc += " The condition does not hold here, so the sign is not guaranteed" + (
            ": with m < 0 the cosine decreases through t = 0, as the formula predicts."
            if m < 0
            else "."
        )
    return v.record("cosine_local", desc, ref)


def _entropy_parts(l: np.ndarray, p: np.ndarray, tau: float) -> tuple[float, np.ndarray]:
    w = _tilted_weights(l, p, tau)
    H = _entropy(w)
    logw = np.log(np.where(w > 0, w, 1.0))
    dH = -tau * w * (logw + H)  # d H / d l (uniform prior)
    return H, dH


def _uniform_only(name: str, ref: str) -> PropertyCheck:
    return PropertyCheck(
        name,
        True,
        0.0,
        "Not applicable: the weight-entropy statements assume uniform prior weights.",
        ref,
    )


_ENTROPY_REF = (
    "Theorem 'Gradient weights become more uniform by increasing t' (thm: uniform_gradient_weights)"
)


def _check_entropy(d: _PathData) -> PropertyCheck:
    if not d.uniform:
        return _uniform_only("entropy_increasing", _ENTROPY_REF)
    v = _Violations()
    taus = [float(t) for t in d.ts if t != 0]
    for tau in taus:
        Hs = np.empty(d.ts.size)
        S = np.empty(d.ts.size)
        for k in range(d.ts.size):
            Hs[k], dH = _entropy_parts(d.L[k], d.p, tau)
            S[k] = np.abs(dH).sum()
        _monotone(v, d, list(range(d.ts.size)), Hs, S, True, False)
    return v.record(
        "entropy_increasing",
        "For every non-zero path tilt tau, the entropy H(w(tau; theta(t))) of the tau-tilted "
        "weights at the path solution theta(t) is non-decreasing in t (the theorem's "
        "statement; at tau = 0 the weights are uniform and H = log N for every t, so its "
        "strict '> 0' fails there; tau = 0 is left out)." + _NOT_A_THEOREM,
        _ENTROPY_REF,
    )


def _check_entropy_local(d: _PathData) -> PropertyCheck:
    if not d.uniform:
        return _uniform_only("entropy_local", _ENTROPY_REF + ", local form")
    v = _Violations()
    worst_rate = np.inf
    for k, tau in enumerate(d.ts):
        if tau == 0:
            continue
        _, dH = _entropy_parts(d.L[k], d.p, float(tau))
        grad_H = d.vjp(k, float(tau), dH)  # = -tau^2 c_tau
        rate = float(grad_H @ d.derivs()[k])
        worst_rate = min(worst_rate, rate)
        w = _tilted_weights(d.L[k], d.p, float(tau))
        logw = np.log(np.where(w > 0, w, 1.0))
        Hw = _entropy(w)
        dH_abs = abs(tau) * w * (np.abs(logw) + Hw)  # before cancellation in log w + H
        lbar = float(w @ d.L[k])
        c_abs = w * (np.abs(d.L[k]) + abs(lbar))
        tol = _local_tol(d, float(tau), d.x_native[k], grad_H, dH_abs, d.derivs()[k], c_abs)
        v.add(-rate, tol)
    return v.record(
        "entropy_local",
        "Corrected weight-uniformity statement: for every non-zero path tilt tau, "
        "d/dt H(w(tau; theta(t))) at t = tau equals tau^2 c' H^-1 c >= 0 "
        f"(smallest computed rate {worst_rate:.4g}).",
        _ENTROPY_REF + ", local form at t = tau",
    )


def _directions(p: int, seed: int = 0) -> np.ndarray:
    if p <= 20:
        return np.eye(p)
    rng = np.random.default_rng(seed)
    D = rng.standard_normal((5, p))
    return D / np.linalg.norm(D, axis=1, keepdims=True)


def _check_gradient_fd(d: _PathData) -> PropertyCheck:
    v = _Violations()
    for k, t in enumerate(d.ts):
        o = d.obj.with_tilt(float(t))
        th = d.theta[k]
        g = _host(o.gradient(d.x_native[k])).reshape(-1)
        f0 = abs(float(_host(o.value(d.x_native[k]))))
        h = _EPS ** (1 / 3) * max(1.0, float(np.linalg.norm(th)))

        def f(z, o=o):
            return float(_host(o.value(d.native(z))))

        for u in _directions(th.size):
            fd1 = (f(th + h * u) - f(th - h * u)) / (2 * h)
            fd2 = (f(th + 2 * h * u) - f(th - 2 * h * u)) / (4 * h)
            tol = _SAFETY * abs(fd1 - fd2) + 100 * _EPS * (f0 + 1.0) / h
            v.add(abs(float(g @ u) - fd1), tol)
    return v.record(
        "gradient_fd",
        "The objective's gradient agrees with central differences of its value at every path "
        "point (coordinate directions, or 5 random ones for more than 20 parameters).",
        "Lemma 'Tilted gradient' (lemma:TERM-gradient)",
    )


def _check_hessian_fd(d: _PathData) -> PropertyCheck:
    v = _Violations()
    for k, t in enumerate(d.ts):
        o = d.obj.with_tilt(float(t))
        th = d.theta[k]
        h = _EPS ** (1 / 3) * max(1.0, float(np.linalg.norm(th)))
        gscale = d.G[k] + d.l2 * d.theta_norm[k] + 1.0

        def grad(z, o=o):
            return _host(o.gradient(d.native(z))).reshape(-1)

        for u in _directions(th.size):
            fd1 = (grad(th + h * u) - grad(th - h * u)) / (2 * h)
            fd2 = (grad(th + 2 * h * u) - grad(th - 2 * h * u)) / (4 * h)
            tol = _SAFETY * np.abs(fd1 - fd2).max() + 100 * _EPS * gscale / h
            hv_dense = d.H[k] @ u
            hv = _host(o.hvp(d.x_native[k], d.native(u))).reshape(-1)
            v.add(np.abs(hv_dense - fd1).max(), tol)
            v.add(np.abs(hv - fd1).max(), tol)
    return v.record(
        "hessian_fd",
        "The objective's Hessian (dense and Hessian-vector products) agrees with central "
        "differences of its gradient at every path point.",
        "Lemma 'Tilted Hessian and strong convexity' (lem: Hessian)",
    )


def _check_solution_derivative(d: _PathData) -> PropertyCheck:
    v = _Violations()
    h = d.fd_step
    for k, t in enumerate(d.ts):
        th = d.theta[k]
        sols = {s: d.resolve(t + s * h, th) for s in (-2.0, -1.0, 1.0, 2.0)}
        fd1 = (sols[1.0][0] - sols[-1.0][0]) / (2 * h)
        fd2 = (sols[2.0][0] - sols[-2.0][0]) / (4 * h)
        exact = d.derivs()[k]
        trunc = np.linalg.norm(fd1 - fd2)
        solve_err = (sols[1.0][1] + sols[-1.0][1]) / (2 * h)
        tol = _SAFETY * (trunc + solve_err) + 1e-7 * max(1.0, float(np.linalg.norm(exact)))
        v.add(float(np.linalg.norm(exact - fd1)), tol)
    return v.record(
        "solution_derivative_fd",
        "d theta/dt = -H^-1 Cov_w(l, grad l) (tiltlab.diagnostics.solution_derivative) at each "
        f"path point agrees with central differences of tight re-solves at t +- {h:g} "
        "(warm-started at the path point; Richardson estimate of the truncation error).",
        "Lemma 'Derivative of the solution with respect to tilt' (lem:implicit-func-theorem)",
    )


def _check_quantiles(path: Any, a: Any, q0: Any) -> PropertyCheck:
    ref = "Theorem 'Q0 <= Q1 <= Q2 <= Q3' (thm:Q-opt) and Theorem thm:Q (the tail bound)"
    if a is None:
        return PropertyCheck(
            "quantile_ordering",
            True,
            0.0,
            "Skipped: pass `a` (thresholds) to check Q1 <= Q2 <= Q3 (and `q0`, or an "
            "objective for which tiltlab.bounds.min_tail_fraction applies, for Q0).",
            ref,
        )
    from .bounds import min_tail_fraction, quantile_curves

    curves = quantile_curves(path, a)
    note = ""
    if q0 is None:
        try:
            q0 = min_tail_fraction(path.objective, curves["a"])
        except (NotImplementedError, ValueError, TypeError) as exc:
            note = f" Q0 not computed ({exc}); only Q1 <= Q2 <= Q3 was checked."
    v = _Violations()
    if q0 is not None:
        q0 = np.broadcast_to(np.asarray(q0, dtype=np.float64), curves["Q1"].shape)
        v.add(q0 - curves["Q1"], 1e-12)
    v.add(curves["Q1"] - curves["Q2"], 1e-12)
    v.add(curves["Q2"] - curves["Q3"], 1e-12 * np.maximum(1.0, np.abs(curves["Q3"])))
    return v.record(
        "quantile_ordering",
        f"Q0 <= Q1 <= Q2 <= Q3 at {np.size(curves['a'])} thresholds (Q1..Q3 over the path's "
        "tilts, tiltlab.bounds.quantile_curves; Q0 exact, tiltlab.bounds.min_tail_fraction)."
        + note,
        ref,
    )


_CHECKS = {
    "stationarity": _check_stationarity,
    "objective_monotone_in_t": _check_objective_monotone,
    "optimal_objective_monotone": _check_optimal_objective,
    "risk_sign": _check_risk_sign,
    "risk_sign_local": _check_risk_sign_local,
    "max_mean_tradeoff": _check_max_mean,
    "min_mean_tradeoff": _check_min_mean,
    "variance_decreasing": _check_variance,
    "variance_local": _check_variance_local,
    "cosine_increasing": _check_cosine,
    "cosine_local": _check_cosine_local,
    "entropy_increasing": _check_entropy,
    "entropy_local": _check_entropy_local,
    "gradient_fd": _check_gradient_fd,
    "hessian_fd": _check_hessian_fd,
    "solution_derivative_fd": _check_solution_derivative,
}


def check_path(
    path: Any,
    *,
    rtol: float | None = None,
    fd_step: float = 1e-4,
    include: Iterable[str] | None = None,
    a: Any = None,
    q0: Any = None,
) -> list[PropertyCheck]:
    r"""Check the paper's properties of tilted solutions numerically along a tilt path.

    One :class:`PropertyCheck` per property in :data:`PROPERTIES` (or in ``include``),
    in that order. The module docstring lists the properties, which of them are
    theorems and which are claims of the paper that fail on valid data (with their
    corrected, local forms), and the tolerance rule.

    Parameters
    ----------
    path : TiltPath
        Output of :func:`tiltlab.tilt_path` for a sample-level objective whose Hessian
        is available (linear-predictor losses, or a ``CallableLoss`` with ``hess``). Tilts
        are sorted (repeated ones dropped) before checking.
    rtol : float, optional
        Relative allowance for floating-point rounding in every comparison (default
        ``1e-10``). The solver's accuracy is allowed for separately (see Tolerances in the
        module docstring), through ``path.results[k].jac``.
    fd_step : float, default 1e-4
        Tilt step of the finite differences of re-solved solutions (``d theta/dt`` and the
        local sign check); steps ``h`` and ``2h`` are used.
    include : iterable of str, optional
        Names of the checks to run (default: all of :data:`PROPERTIES`).
    a : float or 1-d array, optional
        Thresholds for ``quantile_ordering`` (skipped, with ``holds=True`` and a note, when
        not given).
    q0 : array, optional
        :math:`Q^0(a)` if known (e.g. from :func:`tiltlab.bounds.min_tail_fraction` on
        point-estimation data); otherwise it is computed when the objective allows it.

    Returns
    -------
    list of PropertyCheck

    Notes
    -----
    Cost: a dense Hessian and its eigenvalues at every path point, four Newton re-solves
    per path point (finite differences in ``t``), and up to ``4 p`` objective evaluations
    per point for the gradient/Hessian checks (5 random directions when ``p > 20``). Meant
    for small and medium parameter counts (up to a few hundred).

    Raises
    ------
    TypeError
        ``path`` is not a tilt path, or its objective has no Hessian.
    ValueError
        Unknown names in ``include``, bad ``rtol``/``fd_step``, fewer than two tilts.
    NotImplementedError
        Hierarchical objectives.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.theory import check_path, format_checks
    >>> rng = np.random.default_rng(0)
    >>> X = np.c_[rng.normal(size=30), np.ones(30)]
    >>> y = X @ np.array([1.0, 0.5]) + 0.3 * rng.normal(size=30)
    >>> obj = tl.TiltedObjective("squared", X, y, l2=1e-3)
    >>> path = tl.tilt_path(obj, np.linspace(-1, 2, 7), method="newton", tol=1e-12)
    >>> checks = check_path(path, include=["objective_monotone_in_t", "solution_derivative_fd"])
    >>> [(c.name, c.holds) for c in checks]
    [('objective_monotone_in_t', True), ('solution_derivative_fd', True)]
    >>> print(format_checks(checks).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    property                   holds  worst violation  tolerance  reference
    """
    if rtol is None:
        rtol = 1e-10
    if not (isinstance(rtol, (int, float)) and np.isfinite(rtol) and rtol >= 0):
        raise ValueError(f"`rtol` must be a non-negative number, got {rtol!r}")
    if not (isinstance(fd_step, (int, float)) and np.isfinite(fd_step) and fd_step > 0):
        raise ValueError(f"`fd_step` must be a positive number, got {fd_step!r}")
    names = list(PROPERTIES) if include is None else list(include)
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown names in `include`: {unknown}; choose from {list(PROPERTIES)}")
    data = _PathData(path, float(rtol), float(fd_step))
    out = []
    for name in PROPERTIES:
        if name not in names:
            continue
        if name == "quantile_ordering":
            out.append(_check_quantiles(path, a, q0))
        else:
            out.append(_CHECKS[name](data))
    return out


def format_checks(records: Iterable[PropertyCheck], *, descriptions: bool = False) -> str:
    """A plain-text table of :func:`check_path` records.

    Parameters
    ----------
    records : iterable of PropertyCheck
    descriptions : bool, default False
        Also list each record's description under the table.

    Returns
    -------
    str

    Examples
    --------
    >>> from tiltlab.theory import PropertyCheck, format_checks
    >>> rec = PropertyCheck("demo", False, 0.25, "a demo record", "Theorem X", 1e-9)
    >>> print(format_checks([rec]))  # doctest: +NORMALIZE_WHITESPACE
    property  holds  worst violation  tolerance  reference
    --------  -----  ---------------  ---------  ---------
    demo      NO     2.50e-01         1.00e-09   Theorem X
    """
    records = list(records)
    rows = [("property", "holds", "worst violation", "tolerance", "reference")]
    for r in records:
        rows.append(
            (
                r.name,
                "yes" if r.holds else "NO",
                f"{r.worst_violation:.2e}",
                f"{r.tolerance:.2e}",
                r.reference,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for j, row in enumerate(rows):
        cells = [row[i].ljust(widths[i]) for i in range(4)] + [row[4]]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join(["-" * widths[i] for i in range(4)] + ["-" * 9]))
    if descriptions:
        lines.append("")
        lines.extend(f"{r.name}: {r.description}" for r in records)
    return "\n".join(lines)


def tradeoff_curves(path: Any) -> dict[str, np.ndarray]:
    """Data of the paper's trade-off figure: loss statistics at the path's solutions.

    Parameters
    ----------
    path : TiltPath

    Returns
    -------
    dict of ndarray
        Sorted by tilt (repeated tilts dropped), one entry per tilt: ``"t"``, ``"mean"``,
        ``"max"``, ``"min"``, ``"variance"`` of the losses (prior-weighted mean and
        variance; the losses of the loss function, without the ridge), ``"cosine"`` (the
        cosine similarity with the all-ones vector, ``E l / sqrt(E l^2)``; NaN where all
        losses are zero), ``"entropy"`` (of the path's own tilted weights
        ``w(t; theta(t))``, ``log N`` at ``t = 0``), ``"risk"`` (the tilted risk
        ``R(t; theta(t))``) and ``"objective"`` (``R`` plus the ridge penalty).

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.theory import tradeoff_curves
    >>> X = np.c_[np.linspace(0, 1, 20), np.ones(20)]
    >>> y = X[:, 0] + np.where(np.arange(20) < 3, 2.0, 0.0)
    >>> path = tl.tilt_path(tl.TiltedObjective("squared", X, y), [2.0, 0.0, -1.0])
    >>> c = tradeoff_curves(path)
    >>> c["t"].tolist(), bool(c["max"][2] <= c["max"][1])
    ([-1.0, 0.0, 2.0], True)
    """
    for attr in ("ts", "x", "objective"):
        if not hasattr(path, attr):
            raise TypeError(f"`path` must be a TiltPath (from tiltlab.tilt_path); no `{attr}`")
    obj = path.objective
    ts = np.asarray(path.ts, dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    keep = np.concatenate([[True], np.diff(ts[order]) > 0])
    idx = order[keep]
    L = np.stack([_host(obj.losses(path.x[int(k), ...])) for k in idx])
    n = L.shape[1]
    prior = obj.prior() if hasattr(obj, "prior") else None
    p = np.full(n, 1.0 / n) if prior is None else _host(prior)
    t = ts[idx]
    mean = L @ p
    rms = np.sqrt((L * L) @ p)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosine = np.where(rms > 0, mean / np.where(rms > 0, rms, 1.0), np.nan)
    R = np.diag(_tilted_risks(L, p, t))
    l2 = float(getattr(obj, "l2", 0.0))
    pen = np.array([0.5 * l2 * float(np.sum(_host(path.x[int(k), ...]) ** 2)) for k in idx])
    entropy = np.array([_entropy(_tilted_weights(L[j], p, t[j])) for j in range(t.size)])
    return {
        "t": t,
        "mean": mean,
        "max": L.max(axis=1),
        "min": L.min(axis=1),
        "variance": ((L - mean[:, None]) ** 2) @ p,
        "cosine": cosine,
        "entropy": entropy,
        "risk": R,
        "objective": R + pen,
    }
