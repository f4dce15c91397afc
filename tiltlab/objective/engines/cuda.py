"""The fused CUDA engine (CuPy): value and gradient in one kernel that reads ``X`` once
(:mod:`tiltlab._cupy_kernels`), for losses that give a device expression.

Registered for CuPy arrays in ``tiltlab/_backends.py``; everything it declines (other
losses, priors, hierarchies, Hessians, ``fused = False`` on the objective) goes on to the
next engines.
"""

from __future__ import annotations

from typing import Any

from ... import _cupy_kernels
from ...losses import LOSS_NAMES, get_loss
from .base import ENGINES, Context, Engine

__all__ = ["FUSED_CUDA", "FusedCudaEngine", "device_expressions"]


def device_expressions() -> dict[str, str]:
    """Device statements of the registered losses that have them, in registry order."""
    out = {}
    for name in LOSS_NAMES:
        expr = get_loss(name).device_expression
        if expr is not None:
            out[name] = expr
    return out


class FusedCudaEngine(Engine):
    """One CUDA kernel per value and gradient (see :mod:`tiltlab._cupy_kernels`)."""

    name = "fused CUDA"

    def applies(self, problem: Any) -> bool:
        if not problem.is_linear or problem.groups is not None:
            return False
        if problem.weights is not None or problem.loss.device_expression is None:
            return False
        return _cupy_kernels.supported(problem.X, problem.tilts[0], problem.shape)

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        if not ctx.fused:
            return None
        exprs = device_expressions()
        name = problem.loss.name
        if exprs.get(name) != problem.loss.device_expression:
            exprs = {name: problem.loss.device_expression}
        out = _cupy_kernels.value_and_gradient(
            problem.X, problem.y, theta, problem.tilts[0], name, exprs
        )
        if out is None:
            return None
        ctx.count(1)
        r, g = out
        if problem.l2:
            r = r + 0.5 * problem.l2 * problem.xp.sum(theta * theta)
            g = g + problem.l2 * theta
        return r, g


#: The fused CUDA engine (CuPy data), one instance shared by every objective.
FUSED_CUDA = FusedCudaEngine()
ENGINES.register("cupy", FUSED_CUDA)
