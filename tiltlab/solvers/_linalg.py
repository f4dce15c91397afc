"""Small array-API helpers shared by the solvers (inner products, norms, line search)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import device, to_numpy

__all__ = [
    "vdot",
    "norm",
    "to_float",
    "to_floats",
    "armijo",
    "approx_wolfe",
    "host_solve",
    "power_iteration",
    "working_eps",
    "value_rtol",
]


def working_eps(x: Any) -> float:
    """Machine epsilon of ``x``'s floating-point type (float64's for other dtypes)."""
    try:
        return float(np.finfo(to_numpy_dtype(x)).eps)
    except (TypeError, ValueError):
        return float(np.finfo(np.float64).eps)


def to_numpy_dtype(x: Any) -> Any:
    name = str(getattr(x, "dtype", "float64")).rsplit(".", 1)[-1]
    return np.dtype(name)


def value_rtol(eps: float) -> float:
    """Relative change of an objective value below which it is rounding noise.

    ``1e-12`` in float64 (a sum of many rounded terms), ``64 eps`` in lower precision
    (``7.6e-6`` in float32).
    """
    return max(1e-12, 64.0 * eps)


def approx_wolfe(
    f_new: float, f: float, dslope_new: float, slope: float, *, c1: float = 1e-4, eps: float = 1e-12
) -> bool:
    """Hager and Zhang's approximate Wolfe test, robust to rounding in ``f``.

    Near a minimiser the decrease a step can make falls below the rounding error of
    ``f`` and the exact sufficient-decrease test fails for every step; this test
    accepts a step that does not raise ``f`` beyond rounding and whose directional
    derivative ``dslope_new`` shows the step did not overshoot.
    """
    return (
        (f_new <= f + eps * abs(f))
        and (dslope_new <= (1 - 2 * c1) * -slope)
        and (dslope_new >= 0.9 * slope)
    )


def vdot(a: Any, b: Any, xp: Any) -> Any:
    """Inner product of two arrays of any (equal) shape, as a 0-d array."""
    if a.ndim == 1:
        return a @ b  # one BLAS call, no temporary
    return xp.sum(a * b)


def norm(a: Any, xp: Any) -> Any:
    return xp.sqrt(vdot(a, a, xp))


def to_float(a: Any) -> float:
    """Host float of a 0-d array (the one synchronisation point per iteration)."""
    return float(to_numpy(a))


def to_floats(*scalars: Any, xp: Any) -> list[float]:
    """Host floats of several 0-d arrays with one device-to-host transfer."""
    if len(scalars) == 1:
        return [to_float(scalars[0])]
    return [float(v) for v in to_numpy(xp.stack(list(scalars))).astype(np.float64)]


def armijo(
    objective: Any,
    x: Any,
    f: float,
    g: Any,
    d: Any,
    step: float,
    xp: Any,
    *,
    c1: float = 1e-4,
    shrink: float = 0.5,
    max_halvings: int = 60,
    feps: float = 1e-12,
):
    """Backtracking line search along ``d`` from ``x`` (sufficient decrease).

    ``feps`` is the relative rounding level of objective values (:func:`value_rtol`):
    where the decrease a step promises is below it, the decrease is estimated from the
    directional derivatives at both ends (trapezoidal rule) instead of the rounded values.

    Returns ``(step, x_new, f_new, g_new, n_evals)``; ``step`` is 0 when it failed.
    """
    slope = to_float(vdot(g, d, xp))
    if not slope < 0:
        return 0.0, x, None, None, 0
    evals = 0
    for _ in range(max_halvings):
        x_new = x + step * d
        f_new, g_new = objective.value_and_gradient(x_new)
        evals += 1
        fn, dnew = to_floats(f_new, vdot(g_new, d, xp), xp=xp)
        if math.isfinite(fn):
            if -c1 * step * slope > feps * abs(f):  # the decrease test can resolve it
                if fn <= f + c1 * step * slope:
                    return step, x_new, f_new, g_new, evals
            elif fn <= f + feps * abs(f) and 0.5 * (slope + dnew) <= c1 * slope:
                # below the rounding level of f: the trapezoidal estimate of the change,
                # step * (slope + dnew) / 2, from the directional derivatives at both ends
                # must meet the sufficient-decrease test instead
                return step, x_new, f_new, g_new, evals
        step *= shrink
    return 0.0, x, None, None, evals


def host_solve(A: Any, b: Any, xp: Any, *, shift_to_pd: bool = True) -> Any:
    """Solve ``A x = b`` for a small symmetric ``A`` on the host (NumPy/LAPACK).

    With ``shift_to_pd`` the matrix is shifted by ``(delta - lambda_min) I`` when it is
    not safely positive definite, so that ``x`` is a descent direction for ``-b``
    (modified Newton). The result comes back in ``b``'s namespace and device.
    """
    An = to_numpy(A).astype(np.float64)
    bn = to_numpy(b).astype(np.float64)
    An = 0.5 * (An + An.T)
    if shift_to_pd:
        evals, evecs = np.linalg.eigh(An)
        scale = max(1.0, float(np.max(np.abs(evals))))
        floor = 1e-10 * scale
        evals = np.maximum(np.abs(evals), floor)  # flip negative curvature, floor tiny ones
        sol = evecs @ ((evecs.T @ bn) / evals)
    else:
        sol = np.linalg.solve(An, bn)
    return xp.asarray(sol.astype(to_numpy(b).dtype), device=device(b))


def power_iteration(hvp: Any, x0: Any, xp: Any, *, n_iter: int = 30, seed: int = 0) -> float:
    """Estimate the largest |eigenvalue| of the Hessian at a point by power iteration."""
    rng = np.random.default_rng(seed)
    v = xp.asarray(
        rng.standard_normal(tuple(x0.shape)).astype(to_numpy(x0).dtype), device=device(x0)
    )
    v = v / norm(v, xp)
    lam = 0.0
    for _ in range(n_iter):
        w = hvp(v)
        lam = to_float(norm(w, xp))
        if lam == 0 or not math.isfinite(lam):
            break
        v = w / lam
    return lam
