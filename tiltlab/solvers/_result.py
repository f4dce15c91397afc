"""Result object and status codes shared by every solver."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Status", "OptimizeResult", "SolverState"]


class Status(enum.IntEnum):
    """Why a solver stopped: the ``status`` of an :class:`OptimizeResult`.

    An integer enumeration (SciPy's results also carry an integer status). Each member's
    :meth:`describe` says what it means and what to do about it; :attr:`success` tells
    whether the returned iterate can be used as a solution.

    See Also
    --------
    OptimizeResult : The result that carries the status.
    tiltlab.minimize : The solver driver that sets it.

    Examples
    --------
    >>> from tiltlab import Status
    >>> Status.MAX_ITER.success
    False
    >>> Status.MAX_ITER.describe()
    'max_iter reached before convergence; raise max_iter'
    >>> Status(0).name
    'CONVERGED'
    """

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
    VALUE_CONVERGED = 10

    def describe(self, iteration: int | None = None, detail: str = "") -> str:
        """A readable message: what the status means and what to do about it.

        Parameters
        ----------
        iteration : int, optional
            The iteration at which the solver stopped, quoted in the message where it
            helps (not in ``CONVERGED`` or ``MAX_ITER``, whose iteration is ``nit``).
        detail : str, optional
            Extra text appended in parentheses (the solver's own diagnosis).

        Returns
        -------
        str
            The message; :class:`OptimizeResult` stores it as ``message``.

        Examples
        --------
        >>> from tiltlab import Status
        >>> Status.CALLBACK.describe(12)
        'stopped by the callback at iteration 12'
        >>> Status.MAX_PASSES.describe(3, detail="budget 10")
        'max_passes reached at iteration 3; raise max_passes (budget 10)'
        """
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
            Status.DIVERGED: f"diverged{k}: the objective rose far above its starting value "
            "(or became non-finite) with the steps taken; lower the step size",
            Status.VALUE_CONVERGED: f"converged in value{k}: the objective fell by less than "
            "`ftol` (relative) over the last iterations; the gradient test was not met (at the "
            "kinks of a non-smooth loss it cannot be)",
        }[self]
        return msg + (f" ({detail})" if detail else "")

    @property
    def success(self) -> bool:
        """The one definition of success: ``OptimizeResult.success == status.success``.

        Success: ``CONVERGED`` (tolerance met), ``PRECISION`` (converged as far as the
        floating-point type allows), ``EARLY_STOPPED`` (the best validation iterate was
        returned), ``COMPLETED`` (a stochastic run finished its step budget) and
        ``VALUE_CONVERGED`` (the value test that ``ftol`` asked for was met).
        """
        return self in (
            Status.CONVERGED,
            Status.EARLY_STOPPED,
            Status.PRECISION,
            Status.COMPLETED,
            Status.VALUE_CONVERGED,
        )


@dataclass
class SolverState:
    """What a solver step hands back to the driver (and to callbacks).

    ``x``, ``fun`` and ``jac`` are arrays of the objective's namespace; ``fun_float``
    and ``grad_norm`` are host floats for logging and termination tests. Solvers written
    for :func:`tiltlab.minimize` return one from ``init`` and from each ``step``.

    Attributes
    ----------
    x : array
        The current iterate.
    fun : array
        The objective value at ``x`` (0-d array).
    jac : array
        The gradient at ``x``.
    fun_float : float
        ``fun`` as a host float.
    grad_norm : float
        The Euclidean norm of ``jac``, as a host float.
    nit : int
        Iterations made so far.
    step : float
        The step length of the last iteration (NaN before the first).
    failed : Status or None
        Set by a step that cannot go on (``NONFINITE``, ``LINE_SEARCH_FAILED``,
        ``PRECISION``); the driver then stops with this status.
    detail : str
        Extra text for the message of ``failed``.
    extra : dict
        Solver-specific values kept between steps (a momentum...).
    memo : object
        The solver's own typed state (L-BFGS correction pairs, step sizes, ...), which a
        warm start can hand to the next run.
    stale : bool
        Whether ``fun`` and ``jac`` belong to an earlier iterate (stochastic steps between
        full evaluations).

    See Also
    --------
    OptimizeResult : What the driver returns at the end.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.solvers import SolverState
    >>> s = SolverState(np.zeros(2), np.asarray(1.0), np.ones(2), 1.0, 2**0.5)
    >>> s.nit, s.failed
    (0, None)
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
        Objective evaluations made: each value, value and gradient, gradient,
        Hessian-vector product (of a linearisation too), dense Hessian or loss vector
        counts one, line-search trials and a solver's own estimates (a step size from
        power iteration) included. Minibatches of the stochastic method are not
        evaluations of the objective (``n_passes`` counts their cost), nor are the values
        of a ``validation`` objective.
    success : bool
        Always ``status.success``.
    status : Status
        Why the run stopped; its :meth:`Status.describe` is the ``message``.
    message : str
        Describes ``x`` (and, with validation, why the run stopped).
    n_passes : float
        Full passes over the data (each product with ``X`` or ``X^T`` counts one;
        validation passes count in proportion to the validation set's size).
    history : dict of lists
        Per iteration: ``fun``, ``grad_norm``, ``step``, ``n_passes``, ``time`` and,
        with validation, ``validation``.
    method : str
        The method that ran (``"lbfgs"``, ``"newton"``, ``"agd"``, ``"gd"`` or
        ``"stochastic"``).
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

    See Also
    --------
    tiltlab.minimize : Returns it.
    Status : The values of ``status``.
    scipy.optimize.OptimizeResult : SciPy's result, whose field names these follow.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> X = np.c_[np.ones(20), np.linspace(0, 1, 20)]
    >>> res = tl.minimize(tl.TiltedObjective("squared", X, 1 + 2 * X[:, 1], t=-1.0))
    >>> res.success, res.status.name, res.method
    (True, 'CONVERGED', 'lbfgs')
    >>> np.round(res.x, 4)
    array([1., 2.])
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
