"""``tiltlab.minimize``: one entry point for every solver."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ._base import Solver
from ._result import OptimizeResult, SolverState, Status
from .agd import AcceleratedGradient
from .gd import GradientDescent
from .lbfgs import LBFGS
from .newton import Newton
from .stochastic import StochasticTERM

__all__ = ["minimize", "METHODS"]

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


def minimize(
    objective: Any,
    theta0: Any = None,
    *,
    method: str = "lbfgs",
    tol: float = 1e-8,
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
    tol : float, default 1e-8
        Stop when ``||grad|| <= tol * ||grad(theta0)|| + atol``.
    atol : float, default 0
    max_iter : int, optional
        Iteration budget (default depends on the method).
    max_passes : float, optional
        Budget in full passes over the data.
    validation : TiltedObjective, optional
        A second objective (e.g. the validation split with the same tilt), evaluated
        after every iteration; the iterate with the lowest validation value is returned.
    patience : int, optional
        With ``validation``: stop after this many iterations without improvement.
    callback : callable, optional
        ``callback(state)`` after each iteration; returning ``True`` stops the run.
    progress : bool, default False
        Show a tqdm progress bar.
    seed : int, optional
        Seed of the stochastic method (runs are reproducible under a seed).
    **options
        Method options (see each method's class).

    Returns
    -------
    OptimizeResult
        ``x, fun, jac, nit, nfev, success, status, message, n_passes, history``.

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
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {sorted(METHODS)}, got {method!r}")
    if not tol >= 0 or not atol >= 0:
        raise ValueError("`tol` and `atol` must be non-negative")
    if patience is not None and validation is None:
        raise ValueError("`patience` needs `validation`")
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
    if max_iter is None:
        max_iter = cls.default_max_iter
    if int(max_iter) < 0:
        raise ValueError("`max_iter` must be non-negative")
    max_iter = int(max_iter)
    if hasattr(solver, "max_iter"):
        solver.max_iter = max_iter
    x0 = objective.zeros() if theta0 is None else objective._theta(theta0, name="theta0")
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
    history: dict[str, list] = {"fun": [], "grad_norm": [], "step": [], "n_passes": [], "time": []}
    if validation is not None:
        history["validation"] = []
    best = (math.inf, state, 0)

    def record(st: SolverState) -> None:
        nonlocal best
        history["fun"].append(st.fun_float)
        history["grad_norm"].append(st.grad_norm)
        history["step"].append(st.step)
        history["n_passes"].append(passes())
        history["time"].append(time.perf_counter() - t_start)
        if validation is not None:
            v = float(validation.value(st.x))
            history["validation"].append(v)
            if v < best[0]:
                best = (v, st, st.nit)

    record(state)
    threshold = tol * state.grad_norm + atol
    bar = _progress_bar(progress, max_iter, f"tiltlab {method}")
    status = Status.MAX_ITER
    detail = ""
    try:
        if state.failed is not None:
            status = state.failed
        else:
            for _ in range(max_iter):
                if state.grad_norm <= threshold:
                    status = Status.CONVERGED
                    break
                new = solver.step(objective, state)
                if new.failed is not None:
                    status, detail = new.failed, new.detail
                    if new.failed is Status.NONFINITE:
                        state = SolverState(
                            state.x,
                            state.fun,
                            state.jac,
                            state.fun_float,
                            state.grad_norm,
                            nit=new.nit,
                        )
                    break
                state = new
                record(state)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        fun=f"{state.fun_float:.6g}", grad=f"{state.grad_norm:.2e}", refresh=False
                    )
                if callback is not None and callback(state) is True:
                    status = Status.CALLBACK
                    break
                if patience is not None and state.nit - best[2] >= patience:
                    status = Status.EARLY_STOPPED
                    break
                if max_passes is not None and passes() >= max_passes:
                    status = Status.MAX_PASSES
                    break
            else:
                if state.grad_norm <= threshold:
                    status = Status.CONVERGED
    finally:
        if bar is not None:
            bar.close()
    final = state
    best_it = None
    if validation is not None and best[1] is not None and best[0] < math.inf:
        final = best[1]
        best_it = best[2]
        if status is Status.MAX_ITER and patience is not None:
            status = Status.MAX_ITER
    success = status.success or (
        status in (Status.CALLBACK, Status.MAX_PASSES) and final.grad_norm <= threshold
    )
    if validation is not None and status in (
        Status.MAX_ITER,
        Status.MAX_PASSES,
        Status.LINE_SEARCH_FAILED,
    ):
        # with a validation split the best iterate is the answer the user asked for
        success = True
    message = status.describe(state.nit, detail)
    if method == "stochastic" and status is Status.MAX_ITER:
        success = True
        message = (
            f"completed {max_iter} stochastic steps (final gradient norm "
            f"{final.grad_norm:.3g}); raise max_iter for a more accurate solution"
        )
    return OptimizeResult(
        x=final.x,
        fun=final.fun,
        jac=final.jac,
        nit=state.nit,
        nfev=len(history["fun"]),
        success=bool(success),
        status=status,
        message=message,
        n_passes=float(passes()),
        history=history,
        method=method,
        best_iteration=best_it,
    )
