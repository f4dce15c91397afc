"""Finite-difference checks of the tilted gradient and Hessian and of the derivative of
the solution with respect to the tilt."""

from __future__ import annotations

import numpy as np

from .path_data import (
    _host,
    _PathData,
)
from .records import _SAFETY, PropertyCheck, _Violations

__all__: list[str] = []


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
        h = d.eps ** (1 / 3) * max(1.0, float(np.linalg.norm(th)))

        def f(z, o=o):
            return float(_host(o.value(d.native(z))))

        for u in _directions(th.size):
            fd1 = (f(th + h * u) - f(th - h * u)) / (2 * h)
            fd2 = (f(th + 2 * h * u) - f(th - 2 * h * u)) / (4 * h)
            tol = _SAFETY * abs(fd1 - fd2) + 100 * d.eps * (f0 + 1.0) / h
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
        h = d.eps ** (1 / 3) * max(1.0, float(np.linalg.norm(th)))
        gscale = d.G[k] + d.l2 * d.theta_norm[k] + 1.0

        def grad(z, o=o):
            return _host(o.gradient(d.native(z))).reshape(-1)

        for u in _directions(th.size):
            fd1 = (grad(th + h * u) - grad(th - h * u)) / (2 * h)
            fd2 = (grad(th + 2 * h * u) - grad(th - 2 * h * u)) / (4 * h)
            tol = _SAFETY * np.abs(fd1 - fd2).max() + 100 * d.eps * gscale / h
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
