r"""CVaR fits for :func:`~tiltlab.solvers.dro.minimize_dro`: a smoothing continuation.

The objective

.. math:: F(\theta, \eta) = \eta + \frac{1}{\alpha}\sum_i p_i\,(\ell_i(\theta) - \eta)_+
          + \tfrac{\lambda}{2}\|\theta\|^2

is convex and piecewise smooth. Write each sample's excess as a maximum of smooth
pieces, :math:`(\ell_i - \eta)_+ = \max(0, a_{i1} - \eta, \dots, a_{iJ} - \eta)`: one
piece :math:`a_{i1} = \ell_i` for a smooth loss, the two linear pieces of the absolute
loss (``z - y`` and ``y - z``) or of the hinge (``1 - s z`` and ``0``), whose own kinks
are then smoothed too. The continuation replaces each maximum by
:math:`\mu \log(1 + \sum_j e^{(a_{ij} - \eta)/\mu})`, which lies between the maximum and
the maximum plus :math:`\mu \log(J + 1)`: so

.. math:: F \le F_\mu \le F + \mu\log(J+1)/\alpha,

and a point that minimises :math:`F_\mu` is within :math:`\mu\log(J+1)/\alpha` of the
minimum of ``F``. At ``alpha = 1`` (the mean) a loss of one piece is one ERM fit (with
the value test of :func:`~tiltlab.minimize`, ``ftol``, where the loss has kinks); the
absolute and hinge losses take the continuation, which smooths their kinks. ``mu``
falls by 10 from stage to stage, each stage a smooth solve
warm-started from the last, down to ``1e-9 * alpha`` of the losses' scale (float64;
``50 eps`` of it in lower precision): the returned point is exact to that bound plus the
last stage's own accuracy. The fit claims convergence (``CONVERGED``) only where the last
stage met its gradient test; a last stage that stopped on its value test (``ftol``: the
value no longer fell over a window of iterations, as it stops falling for a first-order
method on a sharp smoothing far from its minimum) certifies no accuracy, and the fit
says so with status ``VALUE_CONVERGED``. The value reported is the exact CVaR at the
point (its losses sorted once on the host).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .._compat import is_lazy, to_numpy
from ._minimize import minimize
from ._result import Status

__all__ = ["compute_together", "cvar_fit", "cvar_host", "penalty"]

#: the factor by which the smoothing falls from one stage to the next
_FACTOR = 10.0


def cvar_host(l: np.ndarray, p: np.ndarray | None, alpha: float) -> tuple[float, float, np.ndarray]:
    """(CVaR, VaR, worst-case weights) of a loss vector on the host (float64): the weights
    put ``p_i / alpha`` on the largest losses until ``alpha`` of the mass is taken (the
    last sample taken gets the remainder)."""
    n = l.size
    pm = np.full(n, 1.0 / n) if p is None else p / np.sum(p)
    order = np.argsort(-l, kind="stable")
    ps = pm[order]
    before = np.cumsum(ps) - ps
    take = np.clip(alpha - before, 0.0, ps)
    q = np.zeros(n)
    q[order] = take / alpha
    last = int(np.flatnonzero(take > 0)[-1]) if np.any(take > 0) else 0
    return float(np.dot(q, l)), float(l[order][last]), q


class _SmoothedCVaR:
    """``F_mu(theta, eta)`` as an objective of the flat parameter ``(theta, eta)``."""

    def __init__(self, objective: Any, alpha: float, mu: float):
        self.objective, self.alpha, self.mu = objective, alpha, mu
        self.dx = objective.xp  # the data's namespace
        self.pr = objective.problem  # not `problem`: no driver may take this for a TiltedObjective
        self.lazy = is_lazy(self.dx)
        if self.lazy:  # the solver runs on the client, in NumPy; one graph per evaluation
            self.xp, self.dtype, self.device = np, _host_dtype(self.dx, self.pr.dtype), "cpu"
        else:
            self.xp, self.dtype, self.device = self.dx, self.pr.dtype, self.pr.device
        self.shape = tuple(objective.zeros().shape)
        self.size = int(math.prod(self.shape))
        self.n_passes = 0.0
        self.n_samples = objective.n_samples
        self.kind = _kind(self.pr)
        self.prior = objective.prior()

    # -- parameters ------------------------------------------------------------------
    def zeros(self) -> Any:
        return self.xp.zeros((self.size + 1,), dtype=self.dtype, device=self.device)

    def check_theta(self, theta: Any, name: str = "theta") -> Any:
        out = self.xp.asarray(theta, dtype=self.dtype, device=self.device)
        if tuple(out.shape) != (self.size + 1,):
            raise ValueError(f"`{name}` must have shape {(self.size + 1,)}, got {out.shape}")
        return out

    def split(self, phi: Any) -> tuple[Any, Any]:
        xp = self.xp
        return xp.reshape(phi[: self.size], self.shape), phi[self.size]

    # -- evaluation ------------------------------------------------------------------
    def join(self, theta: Any, eta: float) -> Any:
        xp = self.xp
        th = xp.reshape(xp.asarray(theta, dtype=self.dtype, device=self.device), (-1,))
        return xp.concat([th, xp.asarray([eta], dtype=self.dtype, device=self.device)])

    def value_and_gradient(self, phi: Any) -> tuple[Any, Any]:
        xp, mu = self.dx, self.mu
        theta, eta = self.split(phi)
        pieces, back = self._pieces(theta)
        m = xp.zeros_like(pieces[0][0])
        for a, _ in pieces:
            m = xp.maximum(m, a - eta)
        e0 = xp.exp(-m / mu)
        es = [xp.exp((a - eta - m) / mu) for a, _ in pieces]
        S = e0
        for e in es:
            S = S + e
        h = m + mu * xp.log(S)
        p = self.prior
        wsum = (lambda v: xp.mean(v)) if p is None else (lambda v: xp.sum(p * v))
        value = eta + wsum(h) / self.alpha
        pis = [e / S for e in es]
        tail = pis[0]
        for q in pis[1:]:
            tail = tail + q
        d_eta = 1.0 - wsum(tail) / self.alpha
        scale = (1.0 / (self.alpha * self.n_samples)) if p is None else (p / self.alpha)
        g = back([scale * q for q in pis], [d for _, d in pieces])
        value, g, d_eta = compute_together(value, g, d_eta)  # one graph on Dask
        pen = penalty(self.objective, theta) if not self.lazy else _numpy_ridge(self, theta)
        if pen is not None:
            value, g = value + pen[0], g + pen[1]
        xs, kw = self.xp, dict(dtype=self.dtype, device=self.device)
        grad = xs.concat([xs.reshape(xs.asarray(g, **kw), (-1,)),
                          xs.reshape(xs.asarray(d_eta, **kw), (1,))])  # fmt: skip
        return xs.asarray(value, **kw), grad

    def _pieces(self, theta: Any):
        """The pieces ``a_ij`` with their derivatives, and the map from per-piece
        coefficients ``c_ij`` to ``sum_ij c_ij grad a_ij`` (the gradient in theta)."""
        xp, pr = self.dx, self.pr
        if self.kind == "parameter":
            idx = xp.arange(self.n_samples, device=pr.device)
            ell, vjp = self.objective.batch_losses_and_vjp(xp.reshape(theta, (-1,)), idx)
            self.n_passes += 2

            def back_p(cs, _ds):
                return xp.reshape(vjp(cs[0]), self.shape)

            return [(ell, None)], back_p
        X, y = pr.X, pr.y
        z = X @ theta
        self.n_passes += 2
        if self.kind == "absolute":
            one = xp.ones_like(z)
            pieces = [(z - y, one), (y - z, -one)]
        elif self.kind == "hinge":
            s = 2.0 * y - 1.0
            pieces = [(1.0 - s * z, -s), (xp.zeros_like(z), xp.zeros_like(z))]
        else:
            ell, d1, _ = pr.loss.derivatives(z, y, validate=False, xp=xp)
            pieces = [(ell, d1)]

        def back(cs, ds):
            coef = None
            for c, d in zip(cs, ds, strict=True):
                term = c[:, None] * d if d.ndim == 2 else c * d
                coef = term if coef is None else coef + term
            return X.T @ coef

        return pieces, back

    def value(self, phi: Any) -> Any:
        return self.value_and_gradient(phi)[0]

    def gradient(self, phi: Any) -> Any:
        return self.value_and_gradient(phi)[1]

    def hvp(self, phi: Any, v: Any) -> Any:  # pragma: no cover - first-order methods only
        raise NotImplementedError("the smoothed CVaR objective has no Hessian products")

    hessian = linearize = hvp


def _kind(problem: Any) -> str:
    if not problem.is_linear:
        return "parameter"
    name = getattr(problem.loss, "name", "")
    if name in ("absolute", "hinge") and type(problem.loss).__name__ in (
        "AbsoluteLoss",
        "HingeLoss",
    ):
        return name
    return "smooth"


def _host(a: Any) -> np.ndarray:
    return np.asarray(to_numpy(a), dtype=np.float64).reshape(-1)


def cvar_fit(objective, alpha, theta0, method, tol, max_stages, options) -> dict:
    """Minimise the CVaR at ``alpha`` (module notes); the fields of a DROResult."""
    xp = objective.xp
    t_start = time.perf_counter()
    prior = objective.prior()
    p_host = None if prior is None else _host(prior)
    x0 = objective.zeros() if theta0 is None else objective.check_theta(theta0, name="theta0")
    history: dict[str, list] = {k: [] for k in ("mu", "fun", "nit", "n_passes", "time")}
    if alpha == 1.0 and _kind(objective.problem) == "smooth":  # the mean: the ERM fit
        erm = dict(options)
        if not getattr(objective.problem.loss, "smooth", True):
            # a kinked loss of one piece (pinball): no gradient test certifies its kinks,
            # the value test ends the solve where the value stops falling (minimize's
            # ftol for non-smooth losses)
            erm.setdefault("ftol", max(1e-10, 4.0 * float(xp.finfo(objective.dtype).eps)))
        res = minimize(objective.with_tilt(0.0), x0, method=method, tol=tol, **erm)
        value = objective.with_tilt(0.0).value(res.x)
        res.nfev += 1
        w = _weights(objective, np.ones(1), p_host, mean=True)
        history.update(mu=[0.0], fun=[float(to_numpy(value))], nit=[res.nit],
                       n_passes=[res.n_passes], time=[time.perf_counter() - t_start])  # fmt: skip
        return dict(x=res.x, fun=value, jac=res.jac, nit=res.nit, nfev=res.nfev,
                    success=res.success, status=res.status, message=res.message,
                    n_passes=res.n_passes, history=history, method=method, t=math.nan,
                    weights=w)  # fmt: skip
    l0 = _host(objective.losses(x0))
    _, eta0, _ = cvar_host(l0, p_host, alpha)
    scale = max(abs(eta0), float(np.mean(np.abs(l0))), float(np.std(l0)), 1e-300)
    eps = float(xp.finfo(objective.dtype).eps)
    mu_end = max(1e-9 * alpha, 50.0 * eps) * scale
    mu = scale
    smooth = _SmoothedCVaR(objective, alpha, mu)
    phi = smooth.join(to_numpy(x0) if smooth.lazy else x0, eta0)
    nit = nfev = 0
    passes = 0.0
    state = None
    status, detail = Status.MAX_ITER, f"max_outer={max_stages} smoothing stages"
    res = None
    for _ in range(max_stages):
        smooth.mu = mu
        # a stage ends where its value settles well inside the smoothing's own error
        stage = dict(options)
        stage.setdefault("ftol", max(0.1 * mu * alpha / scale, 4.0 * eps))
        res = minimize(smooth, phi, method=method, tol=tol, warm_state=state, **stage)
        phi, state = res.x, res.solver_state
        nit, nfev, passes = nit + res.nit, nfev + res.nfev, passes + res.n_passes
        theta, _ = smooth.split(phi)
        lh = _host(objective.losses(_theta_of(objective, smooth, theta)))
        history["mu"].append(mu)
        history["fun"].append(cvar_host(lh, p_host, alpha)[0] + _ridge(objective, theta))
        history["nit"].append(res.nit)
        history["n_passes"].append(passes)
        history["time"].append(time.perf_counter() - t_start)
        if res.status in (Status.NONFINITE, Status.DIVERGED):
            status, detail = res.status, f"smoothing mu = {mu:.3g}"
            break
        if mu <= mu_end:
            pieces = 3 if smooth.kind in ("absolute", "hinge") else 2
            status, detail = _final_status(res.status, mu * math.log(pieces) / alpha,
                                           len(history["mu"]) > 1)  # fmt: skip
            break
        mu = max(mu / _FACTOR, mu_end)
    theta, _ = smooth.split(phi)
    x = _theta_of(objective, smooth, theta)
    lh = _host(objective.losses(x))
    value, _, q = cvar_host(lh, p_host, alpha)
    value += _ridge(objective, theta)
    jac = _theta_of(objective, smooth, res.jac[: smooth.size])
    return dict(
        x=x, fun=xp.asarray(value, dtype=objective.dtype, device=objective.device), jac=jac,
        nit=nit, nfev=nfev, success=status.success, status=status,
        message=status.describe(nit, detail), n_passes=passes, history=history,
        method=method, t=math.nan,
        weights=xp.asarray(q, dtype=objective.dtype, device=objective.device),
    )  # fmt: skip


def _final_status(last: Status, bound: float, continued: bool) -> tuple[Status, str]:
    """The fit's status and detail from the status of its last, sharpest smooth solve.

    The minimiser of the last smoothing is within ``bound`` of the minimum; what the
    fit claims beyond that is what its last solve's stopping test certifies. Its
    gradient test does (``CONVERGED``; ``PRECISION`` at the attainable level, or where
    no decrease was left at rounding level after a continuation); its value test does
    not: a first-order method's value stops falling by ``ftol`` over the test's window
    far from the minimum of a sharp smoothing, whose curvature grows as ``1 / mu``.
    """
    if last is Status.LINE_SEARCH_FAILED and continued:
        last = Status.PRECISION  # at the sharpest smoothing no decrease is left
    within = f"the last smoothing's minimiser is within {bound:.2g} of the minimum"
    if last is Status.CONVERGED:
        return (
            last,
            f"within {bound:.2g} of the minimum plus the error of the last smooth "
            "solve, which met its gradient test",
        )
    if last is Status.PRECISION:
        return last, f"{within}; the last smooth solve converged to working precision"
    if last is Status.VALUE_CONVERGED:
        return last, (
            f"{within}, but the last smooth solve stopped on its value test, which bounds "
            "no error: the fit's accuracy is not certified (first-order methods slow down "
            "as the smoothing sharpens; method='lbfgs' meets the gradient test sooner)"
        )
    return last, f"{within}; the last smooth solve did not converge"


def penalty(objective: Any, theta: Any) -> tuple[Any, Any] | None:
    """The objective's ridge term at ``theta``: ``(value, gradient)``, or None without one.
    An objective with its own ``penalty(theta)`` (a ridge that spares an intercept) gives
    it; otherwise ``l2 / 2 ||theta||^2``."""
    own = getattr(objective, "penalty", None)
    if own is not None:
        return own(theta)
    if not objective.l2:
        return None
    return 0.5 * objective.l2 * objective.xp.sum(theta * theta), objective.l2 * theta


def _ridge(objective: Any, theta: Any) -> float:
    pen = penalty(objective, objective.xp.reshape(theta, tuple(objective.zeros().shape)))
    return 0.0 if pen is None else float(to_numpy(pen[0]))


def _weights(objective: Any, q: np.ndarray, p_host: Any, *, mean: bool) -> Any:
    n = objective.n_samples
    w = (np.full(n, 1.0 / n) if p_host is None else p_host / np.sum(p_host)) if mean else q
    return objective.xp.asarray(w, dtype=objective.dtype, device=objective.device)


def _theta_of(objective: Any, smooth: _SmoothedCVaR, flat: Any) -> Any:
    """A flat parameter of the solver as the objective's parameter (its library)."""
    if smooth.lazy:
        return objective.check_theta(np.reshape(np.asarray(flat), smooth.shape), name="theta")
    return smooth.xp.reshape(flat, smooth.shape)


def _host_dtype(xp: Any, dtype: Any) -> Any:
    return np.dtype(to_numpy(xp.zeros((), dtype=dtype)).dtype)


def _numpy_ridge(smooth: Any, theta: Any) -> tuple[Any, Any] | None:
    """The ridge term of a parameter held on the client (NumPy)."""
    l2 = smooth.objective.l2
    return None if not l2 else (0.5 * l2 * np.sum(theta * theta), l2 * theta)


def compute_together(*arrays: Any) -> tuple:
    """Lazy (Dask) arrays computed together, in one graph, as NumPy arrays; others pass
    through."""
    if any(type(a).__module__.startswith("dask") for a in arrays):
        import dask

        return tuple(np.asarray(a) for a in dask.compute(*arrays))
    return arrays
