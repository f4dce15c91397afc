"""The fused CPU engine (numba): value, gradient and Hessian-vector products that read each
row of ``X`` once in one compiled loop, on all cores (:mod:`tiltlab._cpu_kernels`).

Registered for NumPy arrays in ``tiltlab/_backends.py``. It serves sample-level problems
with a finite tilt and a loss the kernels know, when numba is installed (the ``cpu`` extra)
and the problem is large enough for compiled code to pay (:func:`~tiltlab._cpu_kernels.use_fused`);
everything else, and a call whose losses are not finite, goes on to the next engines.
``fused = False`` on the objective turns it off.
"""

from __future__ import annotations

import math
from typing import Any

from ... import _cpu_kernels
from .base import ENGINES, Context, Engine

__all__ = ["FUSED_CPU", "FusedCpuEngine"]

_CACHE_KEY = "fused_cpu"


def _loss_params(loss: Any) -> dict | None:
    return {"delta": float(loss.delta)} if loss.name == "huber" else None


class FusedCpuEngine(Engine):
    """Compiled one-pass loops over the rows of ``X`` (see :mod:`tiltlab._cpu_kernels`)."""

    name = "fused CPU"

    def applies(self, problem: Any) -> bool:
        if not problem.is_linear or problem.groups is not None or not problem.ready:
            return False
        if problem.loss.name not in _cpu_kernels.LOSS_CODES:
            return False
        if not math.isfinite(problem.tilts[0]):
            return False
        n, d = problem.n_samples or 0, problem.n_features or 0
        k = problem.shape[1] if problem.shape is not None and len(problem.shape) == 2 else 1
        return _cpu_kernels.use_fused(n, d, k)

    def _bound(self, problem: Any) -> Any:
        fused = problem.cache.get(_CACHE_KEY)
        if fused is None:
            fused = _cpu_kernels.FusedProblem(
                problem.loss.name,
                problem.X,
                problem.y,
                problem.prior,
                loss_params=_loss_params(problem.loss),
            )
            problem.cache[_CACHE_KEY] = fused
        return fused

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        if not ctx.fused:
            return None
        r = self._bound(problem).value(theta, float(problem.tilts[0]))
        if r is None:
            return None
        ctx.count(1)
        return r + 0.5 * problem.l2 * (theta * theta).sum() if problem.l2 else r

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        if not ctx.fused:
            return None
        out = self._bound(problem).value_and_gradient(theta, float(problem.tilts[0]))
        if out is None:
            return None
        ctx.count(1)
        r, g = out
        if problem.l2:
            r = r + 0.5 * problem.l2 * (theta * theta).sum()
            g = g + problem.l2 * theta
        return r, g

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        if not ctx.fused:
            return None
        hv = self._bound(problem).hvp(theta, v, float(problem.tilts[0]))
        if hv is None:
            return None
        ctx.count(1)
        return hv + problem.l2 * v if problem.l2 else hv


#: The fused CPU engine (compiled kernels, NumPy data), one instance shared by every objective.
FUSED_CPU = FusedCpuEngine()
ENGINES.register("numpy", FUSED_CPU)
