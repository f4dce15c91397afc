"""``tiltlab.minimize``: one entry point for every solver.

The driver only validates its arguments, asks the solver for its first state, calls
``step`` until ``terminate`` (or a budget, or the callback) ends the run, and builds the
result from what ``finish`` returns. Early stopping on a validation objective is the
:class:`~._bestsofar.BestSoFar` wrapper around the solver.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._base import Solver
from ._bestsofar import BestSoFar
from ._checks import (
    check_int,
    check_objective,
    check_positive,
    check_real,
    check_seed,
    check_tolerance,
)
from ._count import CountedObjective
from ._external import driver_for
from ._linalg import norm, to_float, working_eps
from ._result import OptimizeResult, SolverState, Status
from ._stop import Progress, StopRule, default_tol, track, value_converged
from .agd import AcceleratedGradient
from .gd import GradientDescent
from .lbfgs import LBFGS
from .newton import Newton
from .stochastic import StochasticTERM

__all__ = ["minimize", "METHODS", "default_tol"]

#: The solvers of :func:`minimize` by ``method`` name.
METHODS: dict[str, type[Solver]] = {
    "gd": GradientDescent,
    "agd": AcceleratedGradient,
    "lbfgs": LBFGS,
    "newton": Newton,
    "stochastic": StochasticTERM,
}

_HISTORY = ("fun", "grad_norm", "step", "n_passes", "time")


def minimize(
    objective: Any,
    theta0: Any = None,
    *,
    method: str = "lbfgs",
    tol: float | None = None,
    atol: float = 0.0,
    ftol: float | None = None,
    max_iter: int | None = None,
    max_passes: float | None = None,
    validation: Any = None,
    patience: int | None = None,
    callback: Callable[[SolverState], Any] | None = None,
    progress: bool = False,
    seed: Any = None,
    warm_state: Any = None,
    **options: Any,
) -> OptimizeResult:
    """Minimise a :class:`~tiltlab.TiltedObjective`.

    Parameters
    ----------
    objective : TiltedObjective
        The objective (any backend; the solver runs in its namespace and device).
    theta0 : array, optional
        Starting point (default zeros).
    method : {"lbfgs", "gd", "agd", "newton", "stochastic"}
        ``"gd"``: the paper's batch algorithms (sample-level or hierarchical, as the
        objective says), with ``step="armijo"`` (default), ``"fixed"`` (``lr=``) or
        ``"rule"`` (``alpha = 1/(C1 + C2 t)``, ``C1=``, ``C2=``). ``"agd"``: accelerated
        gradient with restart. ``"lbfgs"``: limited-memory BFGS (``memory=``).
        ``"newton"``: exact tilted Hessian (``hessian="dense"|"cg"|"auto"``).
        ``"stochastic"``: the paper's minibatch algorithms (``lr=``, ``batch_size=``,
        ``lam=``).
    tol : float, optional
        Stop when ``||grad|| <= tol * g_scale + atol``, with ``g_scale`` the larger of
        ``||grad(0)||`` and ``||grad(theta0)||``: a fixed scale of the problem, so that
        a warm start (a good ``theta0``, as in :func:`tilt_path`) saves iterations
        instead of tightening the test. Default: ``1e-8`` in float64 and ``eps**(2/3)``
        of the working dtype otherwise (``2.4e-5`` in float32). Finite and non-negative,
        as ``atol``.
    atol : float, default 0
        The absolute term of the gradient test.
    ftol : float, optional
        A value test besides the gradient test: stop with status ``VALUE_CONVERGED`` (a
        success) when the objective fell by less than ``ftol * max(|f_old|, |f|)`` over
        the last 30 iterations (``f_old`` the value 30 iterations earlier). For
        non-smooth losses (``"absolute"``, ``"hinge"``, ``"pinball"``), whose kinks no
        gradient test can certify; off by default.
    max_iter : int, optional
        Iteration budget (default depends on the method).
    max_passes : float, optional
        Budget in full passes over the data (positive).
    validation : TiltedObjective, optional
        A second objective of the same parameter shape (e.g. the validation split with
        the same tilt), evaluated after every iteration; the iterate with the lowest
        validation value is returned, and ``fun``, ``jac``, ``nit`` and the status
        describe it (status ``EARLY_STOPPED`` when it is not the last iterate).
    patience : int, optional
        With ``validation``: stop after this many iterations without improvement.
    callback : callable, optional
        ``callback(state)`` after each iteration; a true return value (``True``, ``1``,
        ``np.True_``) stops the run.
    progress : bool, default False
        Show a tqdm progress bar.
    seed : int, optional
        Seed of the stochastic method (runs are reproducible under a seed).
    warm_state : SolverState, optional
        ``result.solver_state`` of a run on a neighbouring problem (same parameter
        shape and method): the solver starts with what that run learned (L-BFGS
        correction pairs, step sizes), as :func:`tilt_path` does from tilt to tilt.
    **options
        Method options (see each method's class).

    Returns
    -------
    OptimizeResult
        ``x, fun, jac, nit, nfev, success, status, message, n_passes, history``
        (``nfev``: the evaluations of ``objective`` the run made, line-search trials,
        Hessian-vector products and the solver's own estimates included);
        ``success`` is ``status.success``. Besides ``CONVERGED``, a run that can make no
        further progress at the rounding level of its dtype with a gradient norm at the
        attainable level (``sqrt(eps) * g_scale``) stops with ``PRECISION`` ("converged
        to working precision", a success).

    Notes
    -----
    Separable classification data: where a hyperplane separates the classes, the
    logistic (and any other margin) loss without a penalty has no minimiser. Its
    infimum, zero, is approached as ``||theta||`` grows along a separating direction,
    and its gradient vanishes on the way; no solver detects this. The gradient test,
    relative to ``g_scale``, is then met at a large ``theta`` whose size depends on
    ``tol`` and on the method, and the run reports ``CONVERGED``: only the direction of
    such a ``theta`` means something. Pass a ridge penalty (``l2 > 0`` in
    :class:`~tiltlab.TiltedObjective`), which makes the minimiser exist and be unique,
    wherever the classes may be separable (few samples, many features).

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> rng = np.random.default_rng(0)
    >>> X = np.c_[np.ones(50), rng.normal(size=50)]
    >>> y = X @ np.array([1.0, 2.0]) + 0.1 * rng.normal(size=50)
    >>> res = tl.minimize(tl.TiltedObjective("squared", X, y, t=-1.0))
    >>> res.success, np.round(res.x, 1).tolist()
    (True, [1.0, 2.0])
    """
    args = dict(method=method, tol=tol, atol=atol, ftol=ftol, max_iter=max_iter,
                max_passes=max_passes, validation=validation, patience=patience,
                callback=callback, progress=progress, seed=seed,
                warm_state=warm_state)  # fmt: skip
    _check_arguments(objective, args)
    drive = driver_for(objective)  # a backend that runs the solvers itself (Dask)
    if drive is not None:
        return drive(minimize, objective, theta0, **args, **options)
    solver = METHODS[method].configure(seed=seed, **options)
    if theta0 is not None:
        _check_finite_start(theta0)
    x0 = objective.zeros() if theta0 is None else objective.check_theta(theta0, name="theta0")
    if warm_state is not None:
        _check_warm_state(warm_state, x0)
    if validation is not None:
        _check_validation(validation, x0)
        solver = BestSoFar(solver, validation, patience)
    return _run(solver, objective, x0, theta0 is not None, args)


def _run(solver: Solver, objective: Any, x0: Any, warm_x: bool, args: dict) -> OptimizeResult:
    """The loop: ``init``, then ``step`` until ``terminate``, a budget or the callback."""
    method, validation, callback = args["method"], args["validation"], args["callback"]
    max_iter = args["max_iter"]
    if max_iter is None:
        max_iter = METHODS[method].default_max_iter
    max_passes = args["max_passes"]
    passes = _pass_counter(objective, validation)
    objective = CountedObjective(objective)  # every evaluation of the run is counted
    t_start = time.perf_counter()
    state = solver.init(objective, x0, max_iter=max_iter, warm=args["warm_state"])
    eps = working_eps(x0)
    tol = default_tol(eps) if args["tol"] is None else args["tol"]
    g_scale = _gradient_scale(objective, state, warm_x)
    rule = StopRule.make(tol, args["atol"], g_scale, eps, ftol=args["ftol"] or 0.0)
    history: dict[str, list] = {k: [] for k in _HISTORY}
    add_f, add_g, add_step, add_passes, add_time = (history[k].append for k in _HISTORY)
    clock = time.perf_counter
    extra = type(solver).record is not Solver.record  # the solver records more (validation)

    def record(st: SolverState) -> None:
        add_f(st.fun_float)
        add_g(st.grad_norm)
        add_step(st.step)
        add_passes(passes())
        add_time(clock() - t_start)
        if extra:
            for key, value in solver.record(st).items():
                history.setdefault(key, []).append(value)

    record(state)
    progress = Progress.start(state.fun_float, state.grad_norm)
    status, detail = state.failed, state.detail
    bar = _progress_bar(args["progress"], max_iter, f"tiltlab {method}")
    try:
        while status is None:
            status, detail = solver.terminate(state, rule, progress)
            if status is not None:
                break
            if state.nit >= max_iter:
                status = Status.MAX_ITER
                break
            new = solver.step(objective, state)
            if new.failed is not None:
                state, status, detail = solver.failure(state, new, rule)
                break
            state = new
            progress = track(progress, state, eps)
            record(state)
            if bar is not None:
                _update_bar(bar, state)
            if callback is not None and callback(state):
                status = Status.CONVERGED if rule.converged(state) else Status.CALLBACK
            elif value_converged(history["fun"], state, rule):
                status = Status.CONVERGED if rule.converged(state) else Status.VALUE_CONVERGED
            elif max_passes is not None and passes() >= max_passes:
                status = Status.CONVERGED if rule.converged(state) else Status.MAX_PASSES
    finally:
        if bar is not None:
            bar.close()
    n_run = state.nit
    final, status, detail = solver.finish(objective, state, status, detail)
    return OptimizeResult(
        x=final.x, fun=final.fun, jac=final.jac, nit=final.nit, nfev=objective.n_evals,
        success=status.success, status=status, message=status.describe(final.nit, detail),
        n_passes=float(passes()), history=history, method=method,
        best_iteration=final.nit if validation is not None else None, n_iter_run=n_run,
        lbfgs_pairs=solver.export_pairs(final), solver_state=final,
    )  # fmt: skip


def _check_arguments(objective: Any, args: dict[str, Any]) -> None:
    """Validate ``minimize``'s arguments in place (types, ranges, names in backticks)."""
    ftol = args["ftol"]
    check_objective(objective, "objective")
    method = args["method"]
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"`method` must be one of {sorted(METHODS)}, got {method!r}")
    args["atol"] = check_tolerance(args["atol"], "atol")
    if args["tol"] is not None:
        args["tol"] = check_tolerance(args["tol"], "tol")
    if args["ftol"] is not None:
        args["ftol"] = check_real(args["ftol"], "ftol")
        if not args["ftol"] < float("inf"):
            raise ValueError(f"`ftol` must be finite (0 turns the value test off), got {ftol}")
    if args["max_iter"] is not None:
        args["max_iter"] = check_int(args["max_iter"], "max_iter", 0)
    if args["max_passes"] is not None:
        args["max_passes"] = check_positive(args["max_passes"], "max_passes")
    if args["patience"] is not None:
        args["patience"] = check_int(args["patience"], "patience", 1)
        if args["validation"] is None:
            raise ValueError("`patience` needs `validation`")
    if args["validation"] is not None:
        check_objective(args["validation"], "validation")
    check_seed(args["seed"])
    if args["callback"] is not None and not callable(args["callback"]):
        raise TypeError(f"`callback` must be callable, got {type(args['callback']).__name__}")
    if args["warm_state"] is not None and not isinstance(args["warm_state"], SolverState):
        raise TypeError(
            f"`warm_state` must be the `solver_state` of an earlier result, got "
            f"{type(args['warm_state']).__name__}"
        )


def _check_finite_start(theta0: Any) -> None:
    """A start on the host with NaN or infinite entries raises a ``ValueError`` naming
    ``theta0`` (the first evaluation would name its own argument, ``theta``); an array on
    a device is left to that evaluation's check, which reads no more than it does."""
    if isinstance(theta0, (np.ndarray, list, tuple, float, int)):
        start = np.asarray(theta0)
        if start.dtype.kind in "fc" and not bool(np.isfinite(start).all()):
            raise ValueError("`theta0` contains NaN or infinite values")


def _check_warm_state(warm_state: SolverState, x0: Any) -> None:
    wshape = tuple(getattr(warm_state.x, "shape", ()))
    if wshape != tuple(x0.shape):
        raise ValueError(
            f"`warm_state` must come from a run on parameters of the objective's shape "
            f"{tuple(x0.shape)}, got the state of a run on parameters of shape {wshape}"
        )


def _check_validation(validation: Any, x0: Any) -> None:
    vshape = tuple(validation.zeros().shape)
    if vshape != tuple(x0.shape):
        raise ValueError(
            f"`validation` must have the objective's parameter shape {tuple(x0.shape)}, "
            f"got an objective with parameters of shape {vshape}"
        )


def _pass_counter(objective: Any, validation: Any) -> Callable[[], float]:
    """Passes over the data since now; validation passes weigh by the data's sizes."""
    start, val_start, scale = objective.n_passes, 0, 0.0
    if validation is not None:
        val_start = validation.n_passes
        if validation.n_samples and objective.n_samples:
            scale = validation.n_samples / objective.n_samples

    def passes() -> float:
        extra = (validation.n_passes - val_start) * scale if validation is not None else 0
        return objective.n_passes - start + extra

    return passes


def _gradient_scale(objective: Any, state: SolverState, warm_x: bool) -> float:
    """The fixed scale of the stopping test: ``||grad||`` at zero and at ``theta0``."""
    g_scale = state.grad_norm
    if warm_x and state.failed is None:
        try:
            _, g = objective.value_and_gradient(objective.zeros())
            g_zero = to_float(norm(g, objective.xp))
        except (ValueError, ArithmeticError, FloatingPointError):
            return g_scale
        if g_zero == g_zero and g_zero < float("inf"):
            g_scale = max(g_scale, g_zero)
    return g_scale


def _progress_bar(enabled: bool, total: int, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


def _update_bar(bar: Any, state: SolverState) -> None:
    if bar is not None:
        bar.update(1)
        bar.set_postfix(fun=f"{state.fun_float:.6g}", grad=f"{state.grad_norm:.2e}", refresh=False)
