"""Limited-memory BFGS with a Moré-Thuente strong Wolfe line search, on the array API.

The inverse-Hessian product uses the compact representation of Byrd, Nocedal and
Schnabel (1994): with the stored pairs ``s_i, y_i`` as rows of ``S`` and ``Y``,
``H g = gamma g + S^T cS + Y^T cY`` where the ``2m`` coefficients follow from the small
matrices ``S Y^T`` and ``Y Y^T`` and the projections ``S g``, ``Y g`` by two ``m x m``
triangular solves on the host.

The pairs live in one buffer of ``2m + 3`` rows allocated at the start of a run (a ring
of ``m`` slots for ``s`` and for ``y``, and three rows for the new step, gradient change
and gradient), so an iteration allocates no ``m x p`` arrays: it costs the objective's
evaluations, one ``(2m+3) x p`` by ``p x 2`` product giving every inner product the
update needs, one ``2m``-vector by ``2m x p`` product for the direction, and one
device-to-host transfer per line-search trial and per iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import array_namespace, device, materialize, to_numpy
from ._base import Solver, failed_state
from ._checks import check_int
from ._linalg import approx_wolfe, to_floats, to_numpy_dtype, value_rtol, vdot, working_eps
from ._linesearch import LineSearchResult, strong_wolfe
from ._result import SolverState, Status

__all__ = ["LBFGS", "wolfe_search"]

#: SciPy's L-BFGS-B constants: sufficient decrease, curvature, interval width
_FTOL, _GTOL, _XTOL = 1e-3, 0.9, 0.1


def wolfe_search(
    objective: Any,
    x: Any,
    f: float,
    g: Any,
    d: Any,
    step: float,
    xp: Any,
    *,
    slope: float | None = None,
    c1: float = 1e-4,
    c2: float = 0.9,
    max_evals: int = 40,
    feps: float = 1e-12,
):
    """Line search along ``d`` from ``x`` for a step meeting the strong Wolfe conditions.

    Moré and Thuente's algorithm (``tiltlab.solvers._linesearch.strong_wolfe``) on
    ``phi(a) = objective(x + a d)``, accepting also steps that meet Hager and Zhang's
    approximate Wolfe test where the decrease is below the rounding level ``feps`` of
    the values. ``slope`` is ``g . d`` when the caller knows it.

    Returns
    -------
    tuple
        ``(step, x_new, f_new, g_new, dnew, n_evals)`` with ``dnew = g_new . d``;
        ``step`` is 0 (and ``x_new`` is ``x``) when no step lowered the objective.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.solvers.lbfgs import wolfe_search
    >>> obj = tl.TiltedObjective("squared", np.ones((3, 1)), np.array([1.0, 2.0, 3.0]))
    >>> f, g = obj.value_and_gradient(np.zeros(1))
    >>> step, x, f_new, *_ = wolfe_search(obj, np.zeros(1), float(f), g, -g, 1.0, obj.xp)
    >>> bool(step > 0 and f_new < f)
    True
    """
    if slope is None:
        (slope,) = to_floats(vdot(g, d, xp), xp=xp)
    if not slope < 0:
        return 0.0, x, None, None, 0.0, 0
    trial: dict[str, Any] = {}

    def phi(a: float) -> tuple[float, float]:
        x_new = x + a * d
        f_new, g_new = objective.value_and_gradient(x_new)
        trial.update(x=x_new, f=f_new, g=g_new)
        fa, da = to_floats(f_new, vdot(g_new, d, xp), xp=xp)
        return fa, da

    res = strong_wolfe(
        phi, f, slope, step, ftol=c1, gtol=c2, max_evals=max_evals,
        accept=lambda fa, da, a: approx_wolfe(fa, f, da, slope, c1=c1, eps=feps),
    )  # fmt: skip
    if res.converged or (math.isfinite(res.value) and res.value < f):
        return res.step, trial["x"], trial["f"], trial["g"], res.slope, res.n_evals
    return 0.0, x, None, None, 0.0, res.n_evals


def _bisection(phi: Any, f0: float, slope: float, step: float, feps: float) -> LineSearchResult:
    """Bracketing and bisection for a weak Wolfe step (sufficient decrease, curvature).

    Doubles the step until the curvature condition holds or the decrease fails, then
    bisects the bracket. Returns the last step with sufficient decrease found (not
    ``converged``) when no weak Wolfe step is found in 40 trials.
    """
    lo, hi = 0.0, math.inf
    best = None
    for k in range(1, 41):
        a_last = step
        fa, da = phi(step)
        decrease = fa <= f0 + _FTOL * step * slope
        if math.isfinite(fa) and not decrease and approx_wolfe(fa, f0, da, slope, eps=feps):
            return LineSearchResult(step, fa, da, k, True, "accepted")
        if not (math.isfinite(fa) and math.isfinite(da)) or not decrease:
            hi = step
        elif da < _GTOL * slope:
            lo = step
            best = (step, fa, da)
        else:
            return LineSearchResult(step, fa, da, k, True)
        step = 0.5 * (lo + hi) if math.isfinite(hi) else 2.0 * lo
        if hi - lo < 1e-16 * max(1.0, hi):
            break
    if best is not None:
        if best[0] != a_last:  # the trial arrays must be those of the step returned
            fa, da = phi(best[0])
            k += 1
        return LineSearchResult(best[0], fa, da, k, False, "no curvature")
    return LineSearchResult(a_last, fa, da, k, False, "bisection")


class _Pairs:
    """The correction pairs of a run: the row buffer (device) and small matrices (host).

    Host arrays are in chronological order (oldest first); ``slots[i]`` is the buffer
    row of the ``i``-th pair. The buffer is owned by one run and updated in place.
    """

    #: whether the objective's loss is smooth (set by :meth:`LBFGS.start`)
    smooth = True

    def __init__(self, xp: Any, g: Any, memory: int, feps: float):
        self.xp, self.m, self.feps = xp, memory, feps
        self.shape = tuple(g.shape)
        self.np_dtype = to_numpy_dtype(g)
        p = math.prod(self.shape)
        self.rows = xp.zeros((2 * memory + 3, p), dtype=g.dtype, device=device(g))
        self.slots: list[int] = []
        self.gg = 0.0
        self.reset()

    def __getstate__(self) -> dict:
        # a namespace module does not pickle: it is found again from the buffer
        return {k: v for k, v in self.__dict__.items() if k != "xp"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.xp = array_namespace(self.rows)

    def reset(self) -> None:
        self.slots: list[int] = []
        self.SY = np.zeros((0, 0))  # s_i . y_j (upper triangle used)
        self.Rinv = np.zeros((0, 0))  # inverse of the upper triangle of SY
        self.YY = np.zeros((0, 0))
        self.Sg = np.zeros(0)  # s_i . g, y_i . g at the current point
        self.Yg = np.zeros(0)

    def seed(self, S: list, Y: list, g: Any) -> None:
        """Start from given pairs (flattened, oldest first), e.g. of a neighbouring tilt."""
        S, Y = list(S)[-self.m :], list(Y)[-self.m :]
        if not S or len(S) != len(Y):
            return
        xp, k = self.xp, len(S)
        for i in range(k):
            self.rows[i, :] = xp.reshape(S[i], (-1,))
            self.rows[self.m + i, :] = xp.reshape(Y[i], (-1,))
        Ycols = xp.stack([self.rows[self.m + i, :] for i in range(k)] + [xp.reshape(g, (-1,))])
        P = to_numpy(self.rows[: 2 * self.m, :] @ xp.permute_dims(Ycols, (1, 0)))
        P = P.astype(np.float64)
        SY, YY = P[:k, :k], P[self.m : self.m + k, :k]
        if not (np.all(np.isfinite(P)) and np.all(np.diag(SY) > 0)):
            return
        self.slots = list(range(k))
        self.SY, self.YY = np.triu(SY), YY
        self.Rinv = np.linalg.inv(self.SY)
        self.Sg, self.Yg = P[:k, k], P[self.m : self.m + k, k]

    def export(self) -> tuple[list, list]:
        """Copies of the pairs ``(S, Y)`` (flattened arrays, oldest first)."""
        xp = self.xp
        S = [xp.asarray(self.rows[i, :], copy=True) for i in self.slots]
        Y = [xp.asarray(self.rows[self.m + i, :], copy=True) for i in self.slots]
        return S, Y

    def direction(self, g: Any) -> tuple[Any, float]:
        """``(d, g . d)`` with ``d = -H g`` (the slope computed on the host)."""
        xp, k = self.xp, len(self.slots)
        if k == 0:
            return -g, -self.gg
        Rinv, D = self.Rinv, np.diag(self.SY)
        gamma = float(self.SY[-1, -1] / self.YY[-1, -1])
        p1 = Rinv @ self.Sg
        cS = Rinv.T @ (D * p1 + gamma * (self.YY @ p1) - gamma * self.Yg)
        cY = -gamma * p1
        slope = -float(gamma * self.gg + cS @ self.Sg + cY @ self.Yg)
        w = np.zeros(2 * self.m, dtype=self.np_dtype)
        idx = np.asarray(self.slots, dtype=np.intp)
        w[idx] = cS
        w[idx + self.m] = cY
        wd = xp.asarray(w, device=device(g))
        hg = gamma * xp.reshape(g, (-1,)) + wd @ self.rows[: 2 * self.m, :]
        return xp.reshape(-hg, self.shape), slope

    def update(self, s: Any, yv: Any, g: Any, f: Any) -> tuple[float, float]:
        """Store the new pair if its curvature is positive; returns ``(f, ||g||)``.

        One product gives every inner product needed, one transfer brings them (and
        the value) to the host.
        """
        xp, m, k = self.xp, self.m, len(self.slots)
        rows = self.rows
        rows[2 * m, :] = xp.reshape(s, (-1,))
        rows[2 * m + 1, :] = xp.reshape(yv, (-1,))
        rows[2 * m + 2, :] = xp.reshape(g, (-1,))
        prod = rows @ xp.stack([rows[2 * m + 1, :], rows[2 * m + 2, :]], axis=1)
        host = to_numpy(xp.concat([xp.reshape(prod, (-1,)), xp.reshape(f, (1,))]))
        host = host.astype(np.float64)
        P = host[:-1].reshape(-1, 2)
        order = self.slots
        Sy, Yy = P[order, 0], P[[m + i for i in order], 0]
        Sg, Yg = P[order, 1], P[[m + i for i in order], 1]
        sy, yy = float(P[2 * m, 0]), float(P[2 * m + 1, 0])
        sg, yg, gg = float(P[2 * m, 1]), float(P[2 * m + 1, 1]), float(P[2 * m + 2, 1])
        self.gg = gg
        if not (sy > 1e-12 * yy and sy > 0 and math.isfinite(sy) and math.isfinite(yy)):
            self.Sg, self.Yg = Sg, Yg
            return float(host[-1]), math.sqrt(max(gg, 0.0))
        SY = np.zeros((k + 1, k + 1))
        SY[:k, :k] = self.SY
        SY[:k, k] = Sy
        SY[k, k] = sy  # s_k . y_i (i < k) is not needed: only the upper triangle is used
        YY = np.zeros((k + 1, k + 1))
        YY[:k, :k] = self.YY
        YY[:k, k] = YY[k, :k] = Yy
        YY[k, k] = yy
        Sg, Yg = np.append(Sg, sg), np.append(Yg, yg)
        # the inverse of the bordered triangle [[R, c], [0, sy]]: [[Ri, -Ri c / sy], [0, 1/sy]]
        Rinv = np.zeros((k + 1, k + 1))
        Rinv[:k, :k] = self.Rinv
        Rinv[:k, k] = -(self.Rinv @ Sy) / sy
        Rinv[k, k] = 1.0 / sy
        if k == m:  # full: the oldest pair's slot takes the new one
            slot = order[0]
            order = order[1:]
            # a trailing block of a triangular inverse is the inverse of the trailing block
            SY, YY, Sg, Yg, Rinv = SY[1:, 1:], YY[1:, 1:], Sg[1:], Yg[1:], Rinv[1:, 1:]
        else:
            slot = k
        rows[slot, :] = rows[2 * m, :]
        rows[m + slot, :] = rows[2 * m + 1, :]
        self.slots = [*order, slot]
        self.SY, self.YY, self.Sg, self.Yg, self.Rinv = SY, YY, Sg, Yg, Rinv
        return float(host[-1]), math.sqrt(max(gg, 0.0))


@dataclass(frozen=True)
class LBFGS(Solver):
    """L-BFGS (compact representation) with a strong Wolfe line search.

    Options
    -------
    memory : int, default 10
        Number of correction pairs kept.
    pairs : tuple of two lists of arrays, optional
        Initial correction pairs ``(S, Y)`` (flattened steps and gradient changes, oldest
        first), e.g. ``result.lbfgs_pairs`` of a neighbouring problem. A ``warm_state``
        given to :func:`tiltlab.minimize` does the same (:func:`tilt_path` passes it
        from tilt to tilt, so that each solve starts with the curvature learned at the
        previous tilt).

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> obj = tl.TiltedObjective("squared", np.c_[np.ones(5), np.arange(5.0)], np.arange(5.0))
    >>> res = tl.minimize(obj, method="lbfgs", memory=3)
    >>> res.success, (np.round(res.x, 6) + 0.0).tolist()
    (True, [0.0, 1.0])
    """

    name = "lbfgs"
    default_max_iter = 2000

    memory: int = 10
    pairs: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", check_int(self.memory, "memory", 1))

    def start(self, objective: Any, state: SolverState, *, max_iter: int, warm: Any) -> _Pairs:
        pairs = _Pairs(objective.xp, state.jac, self.memory, value_rtol(working_eps(state.x)))
        pairs.smooth = bool(getattr(getattr(objective, "loss", None), "smooth", True))
        pairs.gg = state.grad_norm**2
        given = self.pairs
        if given is None and isinstance(warm, SolverState) and isinstance(warm.memo, _Pairs):
            given = warm.memo.export()  # the curvature learned on the neighbouring problem
        if given is not None:
            pairs.seed(given[0], given[1], state.jac)
        return pairs

    def export_pairs(self, state: SolverState) -> Any:
        return state.memo.export() if isinstance(state.memo, _Pairs) else None

    def step(self, objective: Any, state: SolverState) -> SolverState:
        xp, pairs = objective.xp, state.memo
        d, slope = pairs.direction(state.jac)
        (d,) = materialize(d)
        if not (slope < 0 and math.isfinite(slope)):  # lost descent: reset the memory
            pairs.reset()
            d, slope = -state.jac, -pairs.gg
        # without pairs: the first step of a run has unit length (1 / ||g|| along -g), as
        # in SciPy's L-BFGS-B, whose iterates this then follows; after a reset, and on a
        # loss with kinks (where the weak Wolfe bisection below takes over), the step is
        # at most that and at most 1
        inv_g = 1.0 / max(state.grad_norm, 1e-300)
        unit = state.nit == 0 and pairs.smooth
        step0 = 1.0 if pairs.slots else (inv_g if unit else min(1.0, inv_g))
        trial: dict[str, Any] = {}

        def phi(a: float) -> tuple[float, float]:
            x = state.x + a * d
            f, g = objective.value_and_gradient(x)
            trial.update(x=x, f=f, g=g)
            fa, da = to_floats(f, vdot(g, d, xp), xp=xp)
            return fa, da

        f0, feps = state.fun_float, pairs.feps
        res = strong_wolfe(
            phi, f0, slope, step0, ftol=_FTOL, gtol=_GTOL, xtol=_XTOL, max_evals=20,
            accept=lambda f, g, a: approx_wolfe(f, f0, g, slope, c1=_FTOL, eps=feps),
        )  # fmt: skip
        if not res.converged:
            # no strong Wolfe point (a kink of a non-smooth loss, or rounding): Lewis and
            # Overton's weak Wolfe bisection, the search for non-smooth functions
            res = _bisection(phi, f0, slope, step0, feps)
        if not (res.converged or (math.isfinite(res.value) and res.value < f0)):
            if pairs.slots:  # retry once along the steepest descent direction
                pairs.reset()
                return self.step(objective, state)
            return failed_state(state, Status.LINE_SEARCH_FAILED)
        # keep the iterate concrete: lazy (Dask) arrays would chain every past direction
        x, f, g = materialize(trial["x"], trial["f"], trial["g"])
        fn, gn = pairs.update(x - state.x, g - state.jac, g, f)
        out = SolverState(x=x, fun=f, jac=g, fun_float=fn, grad_norm=gn, nit=state.nit + 1)
        out.step, out.memo = res.step, pairs
        if not (math.isfinite(fn) and math.isfinite(gn)):
            out.failed = Status.NONFINITE
        return out
