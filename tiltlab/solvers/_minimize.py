"""``tiltlab.minimize``: one entry point for every solver."""

from __future__ import annotations

import math
import numbers
import operator
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._compat import to_numpy
from ._base import Solver, make_state
from ._linalg import norm, to_float, working_eps
from ._result import OptimizeResult, SolverState, Status
from .agd import AcceleratedGradient
from .gd import GradientDescent
from .lbfgs import LBFGS
from .newton import Newton
from .stochastic import StochasticTERM

__all__ = ["minimize", "METHODS", "default_tol"]

METHODS: dict[str, type[Solver]] = {
    "gd": GradientDescent,
    "agd": AcceleratedGradient,
    "lbfgs": LBFGS,
    "newton": Newton,
    "stochastic": StochasticTERM,
}


def _progress_bar(enabled: bool, total: int, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


_OBJECTIVE_ATTRS = ("value_and_gradient", "value", "zeros", "_theta", "xp", "n_passes")


def _check_objective(obj: Any, name: str) -> None:
    missing = [a for a in _OBJECTIVE_ATTRS if not hasattr(obj, a)]
    if missing:
        raise TypeError(
            f"`{name}` must be a tiltlab.TiltedObjective, got {type(obj).__name__} "
            f"(no {', '.join(missing)})"
        )


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"`{name}` must be an integer, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            out = int(value)
        else:
            raise TypeError(f"`{name}` must be an integer, got {value!r}") from None
    if out < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    return int(out)


def _check_real(value: Any, name: str) -> float:
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (numbers.Real, np.generic)):
        raise TypeError(f"`{name}` must be a real number, got {value!r}")
    out = float(value)
    if not out >= 0:
        raise ValueError(f"`{name}` must be a non-negative number, got {value!r}")
    return out


def _check_seed(seed: Any) -> None:
    if seed is None or isinstance(seed, (np.random.Generator, np.random.SeedSequence)):
        return
    if isinstance(seed, bool) or not isinstance(seed, (numbers.Integral, np.integer)):
        raise TypeError(
            f"`seed` must be None, a non-negative integer or a numpy.random.Generator, got {seed!r}"
        )
    if int(seed) < 0:
        raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}")


def default_tol(eps: float) -> float:
    """Default relative gradient tolerance for a floating-point type of epsilon ``eps``.

    ``1e-8`` in float64; ``eps**(2/3)`` in lower precision (``2.4e-5`` in float32): the
    gradient of a float32 objective is reliably resolved to about ``sqrt(eps)`` (3.5e-4)
    relative, often further; runs that stall between the two stop with status
    ``PRECISION`` (converged to working precision), so the default never spins.
    """
    return 1e-8 if eps <= 1e-15 else eps ** (2.0 / 3.0)


def minimize(
    objective: Any,
    theta0: Any = None,
    *,
    method: str = "lbfgs",
    tol: float | None = None,
    atol: float = 0.0,
    max_iter: int | None = None,
    max_passes: float | None = None,
    validation: Any = None,
    patience: int | None = None,
    callback: Callable[[SolverState], Any] | None = None,
    progress: bool = False,
    seed: Any = None,
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
        of the working dtype otherwise (``2.4e-5`` in float32).
    atol : float, default 0
    max_iter : int, optional
        Iteration budget (default depends on the method).
    max_passes : float, optional
        Budget in full passes over the data.
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
    **options
        Method options (see each method's class).

    Returns
    -------
    OptimizeResult
        ``x, fun, jac, nit, nfev, success, status, message, n_passes, history``;
        ``success`` is ``status.success``. Besides ``CONVERGED``, a run that can make no
        further progress at the rounding level of its dtype with a gradient norm at the
        attainable level (``sqrt(eps) * g_scale``) stops with ``PRECISION`` ("converged
        to working precision", a success).

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
    _check_objective(objective, "objective")
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"`method` must be one of {sorted(METHODS)}, got {method!r}")
    atol = _check_real(atol, "atol")
    if tol is not None:
        tol = _check_real(tol, "tol")
    if max_passes is not None:
        max_passes = _check_real(max_passes, "max_passes")
    if patience is not None:
        patience = _check_int(patience, "patience", 1)
        if validation is None:
            raise ValueError("`patience` needs `validation`")
    _check_seed(seed)
    if callback is not None and not callable(callback):
        raise TypeError(f"`callback` must be callable, got {type(callback).__name__}")
    from ..distributed import client_minimize, is_dask_objective  # issue-12 hook

    if is_dask_objective(objective):  # issue-12 hook: Dask data, client-driven solver
        return client_minimize(
            minimize, objective, theta0, method=method, tol=tol, atol=atol,
            max_iter=max_iter, max_passes=max_passes, validation=validation,
            patience=patience, callback=callback, progress=progress, seed=seed, **options,
        )
    cls = METHODS[method]
    if method == "stochastic":
        options["seed"] = seed
    solver = cls(**options)
    max_iter = cls.default_max_iter if max_iter is None else _check_int(max_iter, "max_iter", 0)
    if hasattr(solver, "max_iter"):
        solver.max_iter = max_iter
    x0 = objective.zeros() if theta0 is None else objective._theta(theta0, name="theta0")
    if validation is not None:
        _check_objective(validation, "validation")
        vshape = tuple(validation.zeros().shape)
        if vshape != tuple(x0.shape):
            raise ValueError(
                f"`validation` must have the objective's parameter shape {tuple(x0.shape)}, "
                f"got an objective with parameters of shape {vshape}"
            )
    passes_start = objective.n_passes
    val_start = validation.n_passes if validation is not None else 0
    val_scale = 0.0
    if validation is not None and validation.n_samples and objective.n_samples:
        val_scale = validation.n_samples / objective.n_samples

    def passes() -> float:
        extra = (validation.n_passes - val_start) * val_scale if validation is not None else 0
        return objective.n_passes - passes_start + extra

    t_start = time.perf_counter()
    state = solver.init(objective, x0)
    eps = working_eps(x0)
    if tol is None:
        tol = default_tol(eps)
    # the fixed scale of the stopping test: the gradient at zero (and at theta0)
    g_scale = state.grad_norm
    if theta0 is not None and state.failed is None:
        g_zero = _grad_norm_at_zero(objective)
        if math.isfinite(g_zero):
            g_scale = max(g_scale, g_zero)
    threshold = tol * g_scale + atol
    # gradient norm attainable in the working precision: a stall below it is success
    attainable = max(threshold, math.sqrt(eps) * g_scale + atol)
    history: dict[str, list] = {"fun": [], "grad_norm": [], "step": [], "n_passes": [], "time": []}
    if validation is not None:
        history["validation"] = []
    best: tuple[float, SolverState | None, int] = (math.inf, None, 0)

    def record(st: SolverState) -> None:
        nonlocal best
        history["fun"].append(st.fun_float)
        history["grad_norm"].append(st.grad_norm)
        history["step"].append(st.step)
        history["n_passes"].append(passes())
        history["time"].append(time.perf_counter() - t_start)
        if validation is not None:
            v = float(to_numpy(validation.value(st.x)))
            history["validation"].append(v)
            if v < best[0]:
                best = (v, st, st.nit)

    def converged(st: SolverState) -> bool:
        return not st.extra.get("stale", False) and st.grad_norm <= threshold

    record(state)
    bar = _progress_bar(progress, max_iter, f"tiltlab {method}")
    status = Status.MAX_ITER
    detail = ""
    stall, stall_limit = 0, 10
    f_best, g_best = state.fun_float, state.grad_norm
    try:
        if state.failed is not None:
            status = state.failed
        else:
            for _ in range(max_iter):
                if converged(state):
                    status = Status.CONVERGED
                    break
                new = solver.step(objective, state)
                if new.failed is not None:
                    status, detail = new.failed, new.detail
                    if status is Status.LINE_SEARCH_FAILED and state.grad_norm <= attainable:
                        status, detail = Status.PRECISION, ""
                    state = SolverState(
                        state.x,
                        state.fun,
                        state.jac,
                        state.fun_float,
                        state.grad_norm,
                        nit=new.nit if status is Status.NONFINITE else state.nit,
                        extra=state.extra,
                    )
                    break
                state = new
                record(state)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        fun=f"{state.fun_float:.6g}", grad=f"{state.grad_norm:.2e}", refresh=False
                    )
                if solver.checks_gradient:
                    # stall: neither the value (beyond rounding) nor the gradient norm improves
                    if state.fun_float < f_best - 8 * eps * abs(f_best) or state.grad_norm < g_best:
                        stall = 0
                    else:
                        stall += 1
                    f_best = min(f_best, state.fun_float)
                    g_best = min(g_best, state.grad_norm)
                    if not converged(state) and (
                        (stall >= stall_limit and state.grad_norm <= attainable)
                        or stall >= 4 * stall_limit
                    ):
                        if state.grad_norm <= attainable:
                            status = Status.PRECISION
                        else:
                            status = Status.LINE_SEARCH_FAILED
                            detail = (
                                f"no decrease of the value beyond rounding nor of the gradient "
                                f"norm in {stall} iterations; gradient norm {state.grad_norm:.3g}"
                            )
                        break
                if callback is not None and callback(state):
                    status = Status.CONVERGED if converged(state) else Status.CALLBACK
                    break
                if patience is not None and state.nit - best[2] >= patience:
                    status = Status.EARLY_STOPPED
                    break
                if max_passes is not None and passes() >= max_passes:
                    status = Status.CONVERGED if converged(state) else Status.MAX_PASSES
                    break
            else:
                if converged(state):
                    status = Status.CONVERGED
    finally:
        if bar is not None:
            bar.close()
    n_run = state.nit
    if method == "stochastic" and status in (Status.MAX_ITER, Status.MAX_PASSES):
        # a stochastic run has no convergence test: finishing its budget is its end
        detail = "max_passes reached" if status is Status.MAX_PASSES else ""
        status = Status.COMPLETED
    final = state
    best_it = None
    if validation is not None and best[1] is not None:
        final = best[1]
        best_it = best[2]
        if final is not state and status is not Status.NONFINITE:
            if status is Status.EARLY_STOPPED:  # stopped by patience
                why = f"no validation improvement in `patience`={patience} iterations"
            else:
                why = status.describe(n_run, detail)
            status = Status.EARLY_STOPPED
            detail = f"the run made {n_run} iterations and stopped with: {why}"
    if final.extra.get("stale", False):  # stochastic steps carry the last full evaluation
        f, g = objective.value_and_gradient(final.x)
        final = make_state(final.x, f, g, objective.xp, nit=final.nit, step=final.step)
    message = status.describe(final.nit, detail)
    return OptimizeResult(
        x=final.x,
        fun=final.fun,
        jac=final.jac,
        nit=final.nit,
        nfev=len(history["fun"]),
        success=status.success,
        status=status,
        message=message,
        n_passes=float(passes()),
        history=history,
        method=method,
        best_iteration=best_it,
        n_iter_run=n_run,
        lbfgs_pairs=solver.export_pairs() if hasattr(solver, "export_pairs") else None,
    )


def _grad_norm_at_zero(objective: Any) -> float:
    """||grad F(0)|| (one evaluation); NaN when it cannot be evaluated."""
    try:
        _, g = objective.value_and_gradient(objective.zeros())
        return to_float(norm(g, objective.xp))
    except (ValueError, ArithmeticError, FloatingPointError):
        return math.nan
