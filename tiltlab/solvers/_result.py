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
            Status.EARLY_STOPPED: f"early stopping{k}: the validation objective did not improve "
            "for `patience` iterations; the best iterate is returned",
            Status.MAX_PASSES: f"max_passes reached{k}; raise max_passes",
        }[self]
        return msg + (f" ({detail})" if detail else "")

    @property
    def success(self) -> bool:
        return self in (Status.CONVERGED, Status.EARLY_STOPPED)


@dataclass
class SolverState:
    """What a solver step hands back to the driver (and to callbacks).

    ``x``, ``fun`` and ``jac`` are arrays of the objective's namespace; ``fun_float``
    and ``grad_norm`` are host floats for logging and termination tests.
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
        Iterations made.
    nfev : int
        Objective evaluations (values, gradients or Hessian products) made.
    success : bool
    status : Status
    message : str
    n_passes : float
        Full passes over the data (each product with ``X`` or ``X^T`` counts one;
        validation passes count in proportion to the validation set's size).
    history : dict of lists
        Per iteration: ``fun``, ``grad_norm``, ``step``, ``n_passes``, ``time`` and,
        with validation, ``validation``.
    method : str
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

    def __repr__(self) -> str:
        f = self.history["fun"][-1] if self.history.get("fun") else float("nan")
        return (
            f"OptimizeResult(method={self.method!r}, success={self.success}, "
            f"status={self.status.name}, fun={f:.6g}, nit={self.nit}, "
            f"n_passes={self.n_passes:g}, message={self.message!r})"
        )
