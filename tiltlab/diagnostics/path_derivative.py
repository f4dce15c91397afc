r"""The derivative :math:`d\breve\theta/dt` of the tilted solution path (implicit
function theorem)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import (
    device,
    to_numpy,
)
from ..objective import TiltedObjective
from ..risk import tilted_weights
from ._checks import (
    DENSE_LIMIT,
    _check_finite_tilts,
    _check_objective,
    _n_params,
    _theta_of,
)
from ._linalg import _hvp_operator, _solve
from .glm import _glm_parts, _prior, _require_sample_level, _wcov

__all__ = [
    "solution_derivative",
]


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

    See Also
    --------
    tiltlab.tilt_path : The solutions it differentiates.
    tiltlab.theory.check_path : Checks it against finite differences.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.optimize import minimize
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import solution_derivative
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    >>> obj = TiltedObjective("squared", X, np.array([0.0, 1.0, 1.0, 5.0]), t=0.5)

    Compared with central differences of solutions. BFGS stops where the rounding of the
    value hides any further decrease, at a gradient norm near 1e-8 here: solutions off by
    up to 1e-8 / 0.72 (the smallest Hessian eigenvalue), the quotient by up to 1e-4. So
    Newton steps on the gradient finish each solve to rounding (the Hessian only
    preconditions: the fixed point is the zero of the gradient). What remains is the
    quotient's truncation error, ``h**2 / 6`` times the path's third derivative (about 30
    here): 5e-8 at ``h = 1e-4``, well inside ``atol=1e-6``.

    >>> def solve(o):
    ...     f = lambda th: tuple(np.asarray(v) for v in o.value_and_gradient(th))
    ...     th = minimize(f, np.zeros(2), jac=True, method="BFGS").x
    ...     for _ in range(4):
    ...         th = th - np.linalg.solve(o.hessian(th), o.gradient(th))
    ...     return th
    >>> th = solve(obj)
    >>> bool(np.linalg.norm(obj.gradient(th)) < 1e-13)
    True
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
