"""Stopping tests: the gradient test, and stall detection at the rounding level."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ._result import SolverState, Status

__all__ = ["StopRule", "Progress", "default_tol", "track", "stall_status", "value_converged"]


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
    #: the relative decrease of the value over ``value_window`` iterations below which a
    #: run has converged in value (0: no value test)
    ftol: float = 0.0
    #: long enough to span the plateaus of quasi-Newton runs on a kinked function (runs of
    #: 10-20 iterations with no decrease, after which the value falls again)
    value_window: int = 30

    @classmethod
    def make(
        cls, tol: float, atol: float, g_scale: float, eps: float, ftol: float = 0.0
    ) -> StopRule:
        threshold = tol * g_scale + atol
        attainable = max(threshold, math.sqrt(eps) * g_scale + atol)
        return cls(threshold, attainable, eps, ftol=ftol)

    def converged(self, state: SolverState) -> bool:
        return not state.stale and state.grad_norm <= self.threshold


class Progress(NamedTuple):
    """The best value and gradient norm so far, the iterations without improving, and
    the value at the start (a run that stalls far above it has diverged)."""

    f_best: float
    g_best: float
    stalled: int = 0
    f_start: float = math.nan

    @classmethod
    def start(cls, f: float, g: float) -> Progress:
        """The progress of a run that starts with value ``f`` and gradient norm ``g``."""
        return cls(f, g, 0, f)

    @property
    def f_high(self) -> float:
        """The value above which a stalled run has diverged: the start value plus its own
        magnitude (``inf`` for an unknown or non-finite start)."""
        f0 = self.f_start
        return f0 + max(abs(f0), 1e-12) if math.isfinite(f0) else math.inf


def track(progress: Progress, state: SolverState, eps: float) -> Progress:
    """Update ``progress`` with a new iterate.

    An iterate improves when its value drops below the best beyond rounding
    (``8 eps |f_best|``) or its gradient norm drops below the best.
    """
    f, g = state.fun_float, state.grad_norm
    better = f < progress.f_best - 8 * eps * abs(progress.f_best) or g < progress.g_best
    return Progress(
        min(progress.f_best, f),
        min(progress.g_best, g),
        0 if better else progress.stalled + 1,
        progress.f_start,
    )


def stall_status(
    progress: Progress, state: SolverState, rule: StopRule
) -> tuple[Status | None, str]:
    """``PRECISION``, ``DIVERGED`` or ``LINE_SEARCH_FAILED`` for a run that stopped
    improving.

    A run stalled for ``stall_limit`` iterations with a gradient norm at the attainable
    level has converged to working precision; one stalled as long with a value far
    above its start (:attr:`Progress.f_high`: a step too large for the problem, as a
    fixed step can be) has diverged; one stalled four times as long otherwise has
    failed. Otherwise ``(None, "")``.
    """
    n = progress.stalled
    if rule.converged(state) or n < rule.stall_limit:
        return None, ""
    if state.grad_norm <= rule.attainable:
        return Status.PRECISION, ""
    if state.fun_float > progress.f_high:
        return Status.DIVERGED, (
            f"the value rose from {progress.f_start:.3g} to {state.fun_float:.3g} and did not "
            f"decrease in {n} iterations; gradient norm {state.grad_norm:.3g}"
        )
    if n >= 4 * rule.stall_limit:
        return Status.LINE_SEARCH_FAILED, (
            f"no decrease of the value beyond rounding nor of the gradient norm in {n} "
            f"iterations; gradient norm {state.grad_norm:.3g}"
        )
    return None, ""


def value_converged(values: list[float], state: SolverState, rule: StopRule) -> bool:
    """Whether the value test of ``rule.ftol`` is met at ``state``.

    ``values`` are the objective values of the run so far, the last one ``state``'s. The
    test compares the value with the one ``value_window`` iterations earlier:
    ``f_old - f <= ftol * max(|f_old|, |f|)`` (relative, so that it means the same for any
    scale of the loss). A value that rose counts as no decrease.

    Examples
    --------
    >>> from tiltlab.solvers._stop import StopRule, value_converged
    >>> from tiltlab.solvers._result import SolverState
    >>> rule = StopRule.make(1e-8, 0.0, 1.0, 2.2e-16, ftol=1e-6)
    >>> st = SolverState(x=None, fun=None, jac=None, fun_float=1.0, grad_norm=0.5)
    >>> value_converged([1.0 + 1e-9] + [1.0] * 30, st, rule)
    True
    >>> value_converged([1.1] + [1.0] * 30, st, rule)
    False
    """
    n = rule.value_window
    if not rule.ftol > 0 or state.stale or len(values) <= n:
        return False
    f_old, f = values[-1 - n], state.fun_float
    return f_old - f <= rule.ftol * max(abs(f_old), abs(f))
