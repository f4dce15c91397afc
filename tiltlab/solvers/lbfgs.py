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

The host side allocates no matrices either: ``S Y^T`` (its diagonal and the inverse of
its upper triangle) and ``Y Y^T`` are windows of ``2m x 2m`` buffers that move by one
row and column per update. On NumPy the vectors are used as they are (no transfer, no
stacking, products written into the buffer rows in place); on every other library the
same steps run through the array API (the tests check that the two paths agree). The
solver's own work per iteration is then a few tens of microseconds at ``m = 10``
(``benchmarks/lbfgs_vs_scipy.py`` times it against SciPy's L-BFGS-B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import (
    array_namespace,
    device,
    is_lazy,
    is_numpy_namespace,
    materialize,
    to_numpy,
)
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

    ``slots[i]`` is the buffer row of the ``i``-th pair, oldest first. The host matrices
    (the inverse ``Rinv`` of the upper triangle of ``S Y^T``, its diagonal ``D`` and
    ``Y Y^T``) are the window ``[lo, lo + k)`` of ``2m x 2m`` buffers: a new pair is
    written as the next row and column, the oldest is dropped by moving the window, and
    the window goes back to the start of the buffers once in ``m`` updates; so an update
    allocates no matrices and the direction reads them as views. The row buffer is owned
    by one run and updated in place.
    """

    #: whether the objective's loss is smooth (set by :meth:`LBFGS.start`)
    smooth = True

    def __init__(self, xp: Any, g: Any, memory: int, feps: float):
        self.xp, self.m, self.feps = xp, memory, feps
        self.shape = tuple(g.shape)
        self.np_dtype = to_numpy_dtype(g)
        p = math.prod(self.shape)
        self.rows = xp.zeros((2 * memory + 3, p), dtype=g.dtype, device=device(g))
        self._init_host()
        self.gg = 0.0
        self.reset()

    def _init_host(self) -> None:
        """Host buffers and the flags of the backend's fast paths."""
        xp, m = self.xp, self.m
        #: NumPy: flat views, ``out=`` and host floats without a transfer
        self.host_arrays = is_numpy_namespace(xp)
        self.flat = len(self.shape) == 1
        self.lazy = is_lazy(xp)
        self.f64 = self.np_dtype == np.float64
        self._Ri = np.zeros((2 * m, 2 * m))  # inverse of the upper triangle of S Y^T
        self._YY = np.zeros((2 * m, 2 * m))
        self._D = np.zeros(2 * m)  # s_i . y_i
        self.w = np.zeros(2 * m, dtype=self.np_dtype)
        self._index: dict[tuple[int, int], tuple] = {}

    def __getstate__(self) -> dict:
        # a namespace module does not pickle: it is found again from the buffer
        return {k: v for k, v in self.__dict__.items() if k not in ("xp", "_index")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.xp = array_namespace(self.rows)
        self._index = {}

    def reset(self) -> None:
        self.k = 0  # pairs stored
        self.head = 0  # buffer row of the oldest pair
        self.lo = 0  # first row and column of the host window
        self.sy = self.yy = 1.0  # s . y and y . y of the newest pair (gamma = sy / yy)
        self.Sg = np.zeros(0)  # s_i . g, y_i . g at the current point
        self.Yg = np.zeros(0)
        self.w[:] = 0

    def _indices(self) -> tuple:
        """``(order, yorder, take)`` for the current ``head`` and ``k``: the buffer rows
        of the pairs (of ``s`` and of ``y``, oldest first) and the columns of the update's
        product that give, in order, ``S.``, ``s.``, ``Y.`` and ``y.`` (cached)."""
        key = (self.head, self.k)
        out = self._index.get(key)
        if out is None:
            m, k = self.m, self.k
            order = np.array([(self.head + i) % m for i in range(k)], dtype=np.intp)
            take = np.concatenate([order, [2 * m], order + m, [2 * m + 1]]).astype(np.intp)
            out = self._index[key] = (order, order + m, take)
        return out

    @property
    def slots(self) -> list[int]:
        """The buffer rows of the pairs, oldest first."""
        return self._indices()[0].tolist()

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
        self.reset()
        self.k = k
        self._Ri[:k, :k] = np.linalg.inv(np.triu(SY))
        self._YY[:k, :k] = YY
        self._D[:k] = np.diag(SY)
        self.sy, self.yy = float(SY[-1, -1]), float(YY[-1, -1])
        self.Sg, self.Yg = P[:k, k], P[self.m : self.m + k, k]

    def export(self) -> tuple[list, list]:
        """Copies of the pairs ``(S, Y)`` (flattened arrays, oldest first)."""
        xp = self.xp
        S = [xp.asarray(self.rows[i, :], copy=True) for i in self.slots]
        Y = [xp.asarray(self.rows[self.m + i, :], copy=True) for i in self.slots]
        return S, Y

    def floats(self, f: Any, slope: Any) -> tuple[float, float]:
        """Host floats of a value and a slope (one transfer off NumPy)."""
        if self.host_arrays:
            return float(f), float(slope)
        fa, da = to_floats(f, slope, xp=self.xp)
        return fa, da

    def direction(self, g: Any) -> tuple[Any, float]:
        """``(d, g . d)`` with ``d = -H g`` (the slope computed on the host)."""
        k = self.k
        if k == 0:
            return -g, -self.gg
        w = slice(self.lo, self.lo + k)
        Rinv, YY, D = self._Ri[w, w], self._YY[w, w], self._D[w]
        gamma = self.sy / self.yy
        Sg, Yg = self.Sg, self.Yg
        # H g = gamma g + S^T cS + Y^T cY with cS = Rinv^T (D p + gamma YY p - gamma Yg),
        # cY = -gamma p and p = Rinv Sg; the negated coefficients are formed directly
        # (negation is exact, so d = -H g is the same to the last bit). ``.dot`` is ``@``
        # with less call overhead (the same BLAS calls); the product with the
        # transposed triangle stays ``@`` (it evaluates that view differently)
        p1 = Rinv.dot(Sg)
        cS = Rinv.T @ (gamma * Yg - (D * p1 + gamma * YY.dot(p1)))  # -cS
        cY = gamma * p1  # -cY
        slope = float(-gamma * self.gg + cS.dot(Sg) + cY.dot(Yg))
        order, yorder, _ = self._indices()
        self.w[order] = cS
        self.w[yorder] = cY
        R = self.rows[: 2 * self.m, :]
        if self.host_arrays:
            gf = g if self.flat else g.reshape(-1)
            d = -gamma * gf + self.w.dot(R)
            return (d if self.flat else d.reshape(self.shape)), slope
        xp = self.xp
        wd = xp.asarray(self.w, device=device(g))
        d = -gamma * xp.reshape(g, (-1,)) + wd @ R
        return xp.reshape(d, self.shape), slope

    def _products(self, x: Any, x_old: Any, g: Any, g_old: Any, f: Any):
        """Store ``s``, ``y`` and ``g`` in the last three rows and return, on the host,
        their products with every row (``y.`` in row 0, ``g.`` in row 1) and ``f``."""
        xp, m, rows = self.xp, self.m, self.rows
        if self.host_arrays:
            flat = self.flat
            np.subtract(x if flat else x.reshape(-1), x_old if flat else x_old.reshape(-1),
                        out=rows[2 * m])  # fmt: skip
            np.subtract(g if flat else g.reshape(-1), g_old if flat else g_old.reshape(-1),
                        out=rows[2 * m + 1])  # fmt: skip
            rows[2 * m + 2] = g if flat else g.reshape(-1)
            prod = rows[2 * m + 1 :].dot(rows.T)
            return (prod if self.f64 else prod.astype(np.float64)), float(f)
        rows[2 * m, :] = xp.reshape(x - x_old, (-1,))
        rows[2 * m + 1, :] = xp.reshape(g - g_old, (-1,))
        rows[2 * m + 2, :] = xp.reshape(g, (-1,))
        prod = rows @ xp.stack([rows[2 * m + 1, :], rows[2 * m + 2, :]], axis=1)
        host = to_numpy(xp.concat([xp.reshape(prod, (-1,)), xp.reshape(f, (1,))]))
        host = host.astype(np.float64)
        return host[:-1].reshape(-1, 2).T, float(host[-1])

    def update(self, x: Any, x_old: Any, g: Any, g_old: Any, f: Any) -> tuple[float, float]:
        """Store the pair ``(x - x_old, g - g_old)`` if its curvature is positive;
        returns ``(f, ||g||)``.

        One product gives every inner product needed, one transfer brings them (and
        the value) to the host.
        """
        m, k = self.m, self.k
        P, fh = self._products(x, x_old, g, g_old, f)
        order, yorder, take = self._indices()
        Q = P.take(take, axis=1)  # [S., s., Y., y.] against y (row 0) and g (row 1)
        sy, yy = float(Q[0, k]), float(Q[0, 2 * k + 1])
        gg = float(P[1, 2 * m + 2])
        self.gg = gg
        gn = math.sqrt(max(gg, 0.0))
        if not (sy > 1e-12 * yy and sy > 0 and math.isfinite(sy) and math.isfinite(yy)):
            self.Sg, self.Yg = Q[1, :k], Q[1, k + 1 : 2 * k + 1]
            return fh, gn
        lo = self.lo
        if lo + k == 2 * m:  # the window reached the end of the buffers: back to the start
            w = slice(lo, lo + k)
            self._Ri[:k, :k] = self._Ri[w, w]
            self._YY[:k, :k] = self._YY[w, w]
            self._D[:k] = self._D[w]
            lo = self.lo = 0
        j = lo + k  # the new pair's row and column
        Sy, Yy = Q[0, :k], Q[0, k + 1 : 2 * k + 1]
        # the inverse of the bordered triangle [[R, c], [0, sy]]: [[Ri, -Ri c / sy], [0, 1/sy]]
        self._Ri[lo:j, j] = self._Ri[lo:j, lo:j].dot(Sy) / -sy  # -(a / b) = a / -b exactly
        self._Ri[j, lo:j] = 0.0
        self._Ri[j, j] = 1.0 / sy
        self._YY[lo:j, j] = Yy
        self._YY[j, lo : j + 1] = Q[0, k + 1 : 2 * k + 2]  # Y . y and y . y
        self._D[j] = sy  # the diagonal of S Y^T (its strict upper triangle enters through Rinv)
        self.sy, self.yy = sy, yy
        rows = self.rows
        if k == m:  # full: the oldest pair's slot takes the new one
            slot = self.head
            self.head = (self.head + 1) % m
            self.lo = lo + 1  # a trailing block of a triangular inverse is its inverse
            self.Sg, self.Yg = Q[1, 1 : k + 1], Q[1, k + 2 :]
        else:
            slot = k
            self.k = k + 1
            self.Sg, self.Yg = Q[1, : k + 1], Q[1, k + 1 :]
        rows[slot, :] = rows[2 * m, :]
        rows[m + slot, :] = rows[2 * m + 1, :]
        return fh, gn


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
    >>> X = np.c_[np.ones(5), np.arange(5.0)]
    >>> obj = tl.TiltedObjective("squared", X, np.arange(5.0))
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
        if pairs.lazy:
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
        step0 = 1.0 if pairs.k else (inv_g if unit else min(1.0, inv_g))
        x0, evaluate, floats = state.x, objective.value_and_gradient, pairs.floats
        trial: list[Any] = [None, None, None]
        if pairs.host_arrays and pairs.flat:  # NumPy vectors: host floats as they are

            def phi(a: float) -> tuple[float, float]:
                x = x0 + d if a == 1.0 else x0 + a * d  # 1.0 * d is d: one operation fewer
                f, g = evaluate(x)
                trial[:] = x, f, g
                return float(f), float(g.dot(d))

        else:

            def phi(a: float) -> tuple[float, float]:
                x = x0 + a * d
                f, g = evaluate(x)
                trial[:] = x, f, g
                return floats(f, vdot(g, d, xp))

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
            if pairs.k:  # retry once along the steepest descent direction
                pairs.reset()
                return self.step(objective, state)
            return failed_state(state, Status.LINE_SEARCH_FAILED)
        x, f, g = trial
        if pairs.lazy:  # keep the iterate concrete: a lazy graph would chain every direction
            x, f, g = materialize(x, f, g)
        fn, gn = pairs.update(x, x0, g, state.jac, f)
        out = SolverState(x=x, fun=f, jac=g, fun_float=fn, grad_norm=gn, nit=state.nit + 1)
        out.step, out.memo = res.step, pairs
        if not (math.isfinite(fn) and math.isfinite(gn)):
            out.failed = Status.NONFINITE
        return out
