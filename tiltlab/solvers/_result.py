"""Result object and status codes shared by every solver."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Status", "OptimizeResult", "SolverState"]


class Status(enum.IntEnum):
    """Why a solver stopped. ``Status.X.describe(k)`` gives a readable message."""

    CONVERGED = 0
    MAX_ITER = 1
    NONFINITE = 2
    LINE_SEARCH_FAILED = 3
    CALLBACK = 4
    EARLY_STOPPED = 5
    MAX_PASSES = 6
    PRECISION = 7
    COMPLETED = 8
    DIVERGED = 9

    def describe(self, iteration: int | None = None, detail: str = "") -> str:
        k = "" if iteration is None else f" at iteration {iteration}"
        msg = {
            Status.CONVERGED: "converged: gradient norm below tolerance",
            Status.MAX_ITER: "max_iter reached before convergence; raise max_iter",
            Status.NONFINITE: f"non-finite objective value or gradient{k}; lower the step size "
            "or check the data",
            Status.LINE_SEARCH_FAILED: f"line search failed{k}: no sufficient decrease found "
            "(the iterate is as accurate as float precision allows, or the gradient is wrong)",
            Status.CALLBACK: f"stopped by the callback{k}",
            Status.EARLY_STOPPED: f"chosen by validation (early stopping): the iterate{k} with "
            "the lowest validation objective is returned; fun, jac and nit describe it",
            Status.MAX_PASSES: f"max_passes reached{k}; raise max_passes",
            Status.PRECISION: f"converged to working precision{k}: no further decrease of the "
            "objective is possible at the rounding level of its floating-point type, and the "
            "gradient norm is at the attainable level",
            Status.COMPLETED: f"completed the stochastic step budget{k} (a stochastic method "
            "has no convergence test); raise max_iter for a more accurate solution",
            Status.DIVERGED: f"diverged{k}: the objective became non-finite or rose far above "
            "its starting value even with a lowered step",
        }[self]
        return msg + (f" ({detail})" if detail else "")

    @property
    def success(self) -> bool:
        """The one definition of success: ``OptimizeResult.success == status.success``.

        Success: ``CONVERGED`` (tolerance met), ``PRECISION`` (converged as far as the
        floating-point type allows), ``EARLY_STOPPED`` (the best validation iterate was
        returned) and ``COMPLETED`` (a stochastic run finished its step budget).
        """
        return self in (Status.CONVERGED, Status.EARLY_STOPPED, Status.PRECISION, Status.COMPLETED)


@dataclass
class SolverState:
    """What a solver step hands back to the driver (and to callbacks).

    ``x``, ``fun`` and ``jac`` are arrays of the objective's namespace; ``fun_float``
    and ``grad_norm`` are host floats for logging and termination tests. ``stale`` marks
    a state whose ``fun`` and ``jac`` belong to an earlier iterate (stochastic steps
    between full evaluations). ``memo`` is the solver's own typed state (L-BFGS
    correction pairs, step sizes, ...), which a warm start can hand to the next run.
    """

    x: Any
    fun: Any
    jac: Any
    fun_float: float
    grad_norm: float
    nit: int = 0
    step: float = float("nan")
    failed: Status | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)
    memo: Any = field(default=None, repr=False)
    stale: bool = False


@dataclass
class OptimizeResult:
    """Result of :func:`tiltlab.minimize` (SciPy's field names, plus passes and history).

    Attributes
    ----------
    x : array
        The solution (the best validation iterate when ``validation`` was given).
    fun : array
        Objective value at ``x`` (0-d array).
    jac : array
        Gradient at ``x``.
    nit : int
        Iterations that produced ``x`` (with ``validation``: the best iteration; the run
        may have gone on, see ``n_iter_run``).
    nfev : int
        Objective evaluations (values, gradients or Hessian products) made.
    success : bool
        Always ``status.success``.
    status : Status
    message : str
        Describes ``x`` (and, with validation, why the run stopped).
    n_passes : float
        Full passes over the data (each product with ``X`` or ``X^T`` counts one;
        validation passes count in proportion to the validation set's size).
    history : dict of lists
        Per iteration: ``fun``, ``grad_norm``, ``step``, ``n_passes``, ``time`` and,
        with validation, ``validation``.
    method : str
    best_iteration : int or None
        With ``validation``: the iteration of ``x``.
    n_iter_run : int or None
        Iterations the run made in all (with ``validation`` it may exceed ``nit``).
    lbfgs_pairs : tuple or None
        ``method="lbfgs"``: the correction pairs ``(S, Y)`` at ``x`` (the ``pairs``
        option of a later run accepts them).
    solver_state : SolverState or None
        The solver's state at ``x``; ``minimize(..., warm_state=result.solver_state)``
        starts a neighbouring problem with what this run learned (as :func:`tilt_path`
        does from tilt to tilt).
    """

    x: Any
    fun: Any
    jac: Any
    nit: int
    nfev: int
    success: bool
    status: Status
    message: str
    n_passes: float
    history: dict
    method: str = ""
    best_iteration: int | None = None
    n_iter_run: int | None = None
    #: lbfgs only: the final correction pairs ``(S, Y)``, for warm starts (not shown)
    lbfgs_pairs: Any = field(default=None, repr=False)
    solver_state: Any = field(default=None, repr=False)

    def __repr__(self) -> str:
        try:
            from .._compat import to_numpy

            f = float(to_numpy(self.fun))
        except Exception:  # pragma: no cover - a result built by hand without fun
            f = float("nan")
        return (
            f"OptimizeResult(method={self.method!r}, success={self.success}, "
            f"status={self.status.name}, fun={f:.6g}, nit={self.nit}, "
            f"n_passes={self.n_passes:g}, message={self.message!r})"
        )
