"""Stopping tests: the gradient test, and stall detection at the rounding level."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ._result import SolverState, Status

__all__ = ["StopRule", "Progress", "default_tol", "track", "stall_status"]


def default_tol(eps: float) -> float:
    """Default relative gradient tolerance for a floating-point type of epsilon ``eps``.

    ``1e-8`` in float64; ``eps**(2/3)`` in lower precision (``2.4e-5`` in float32): the
    gradient of a float32 objective is reliably resolved to about ``sqrt(eps)`` (3.5e-4)
    relative, often further; runs that stall between the two stop with status
    ``PRECISION`` (converged to working precision), so the default never spins.
    """
    return 1e-8 if eps <= 1e-15 else eps ** (2.0 / 3.0)


@dataclass(frozen=True)
class StopRule:
    """When a run has converged, and when a stall counts as converged.

    ``threshold`` is the gradient-norm target ``tol * g_scale + atol``; ``attainable``
    the gradient norm a run can resolve in its working precision
    (``max(threshold, sqrt(eps) * g_scale + atol)``): a run that stops making progress
    below it has converged to working precision.
    """

    threshold: float
    attainable: float
    eps: float
    stall_limit: int = 10

    @classmethod
    def make(cls, tol: float, atol: float, g_scale: float, eps: float) -> StopRule:
        threshold = tol * g_scale + atol
        return cls(threshold, max(threshold, math.sqrt(eps) * g_scale + atol), eps)

    def converged(self, state: SolverState) -> bool:
        return not state.stale and state.grad_norm <= self.threshold


class Progress(NamedTuple):
    """The best value and gradient norm so far and the iterations without improving."""

    f_best: float
    g_best: float
    stalled: int = 0


def track(progress: Progress, state: SolverState, eps: float) -> Progress:
    """Update ``progress`` with a new iterate.

    An iterate improves when its value drops below the best beyond rounding
    (``8 eps |f_best|``) or its gradient norm drops below the best.
    """
    f, g = state.fun_float, state.grad_norm
    better = f < progress.f_best - 8 * eps * abs(progress.f_best) or g < progress.g_best
    return Progress(
        min(progress.f_best, f), min(progress.g_best, g), 0 if better else progress.stalled + 1
    )


def stall_status(
    progress: Progress, state: SolverState, rule: StopRule
) -> tuple[Status | None, str]:
    """``PRECISION`` or ``LINE_SEARCH_FAILED`` for a run that stopped improving.

    A run stalled for ``stall_limit`` iterations with a gradient norm at the attainable
    level has converged to working precision; one stalled four times as long above it
    has failed. Otherwise ``(None, "")``.
    """
    n = progress.stalled
    if rule.converged(state) or n < rule.stall_limit:
        return None, ""
    if state.grad_norm <= rule.attainable:
        return Status.PRECISION, ""
    if n >= 4 * rule.stall_limit:
        return Status.LINE_SEARCH_FAILED, (
            f"no decrease of the value beyond rounding nor of the gradient norm in {n} "
            f"iterations; gradient norm {state.grad_norm:.3g}"
        )
    return None, ""
