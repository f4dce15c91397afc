"""Limited-memory BFGS with a weak-Wolfe line search, written on the array API.

The inverse-Hessian product uses the compact representation of Byrd, Nocedal and
Schnabel (1994): with the stored pairs stacked as rows of ``S`` and ``Y`` (``m x p``),
``H g = gamma g + [S; Y]^T w`` where the ``2m`` coefficients ``w`` follow from the small
matrices ``S Y^T`` and ``Y Y^T`` and the projections ``S g``, ``Y g`` by two ``m x m``
triangular solves on the host. One iteration therefore costs the objective's
evaluations plus one ``(2m+3) x p`` by ``p x 2`` product on the device and one
device-to-host transfer per line-search trial and per iteration (instead of the
``4m`` dependent inner products of the two-loop recursion, each a synchronisation on a
GPU).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import device, materialize, to_numpy
from ._base import Solver
from ._linalg import approx_wolfe, to_floats, to_numpy_dtype, vdot
from ._result import SolverState, Status

__all__ = ["LBFGS", "wolfe_search"]


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
    """Bracketing/bisection search for a step meeting the weak Wolfe conditions.

    ``slope`` is ``g . d`` when the caller knows it. Returns
    ``(step, x_new, f_new, g_new, dnew, n_evals)`` with ``dnew = g_new . d``; ``step`` is 0
    if no step was found.
    """
    if slope is None:
        (slope,) = to_floats(vdot(g, d, xp), xp=xp)
    if not slope < 0:
        return 0.0, x, None, None, 0.0, 0
    lo, hi = 0.0, math.inf
    best = None
    evals = 0
    for _ in range(max_evals):
        x_new = x + step * d
        f_new, g_new = objective.value_and_gradient(x_new)
        evals += 1
        fn, dnew = to_floats(f_new, vdot(g_new, d, xp), xp=xp)
        decrease = fn <= f + c1 * step * slope
        if math.isfinite(fn) and not decrease and approx_wolfe(fn, f, dnew, slope, c1=c1, eps=feps):
            return step, x_new, f_new, g_new, dnew, evals  # decrease below rounding: accept
        if not (math.isfinite(fn) and math.isfinite(dnew)) or not decrease:
            hi = step
        else:
            best = (step, x_new, f_new, g_new, dnew, evals)
            if dnew < c2 * slope:
                lo = step
            else:
                return best
        step = 0.5 * (lo + hi) if math.isfinite(hi) else 2.0 * lo
        if hi - lo < 1e-16 * max(1.0, hi):
            break
    if best is not None:  # sufficient decrease without curvature: still progress
        return (*best[:5], evals)
    return 0.0, x, None, None, 0.0, evals


class LBFGS(Solver):
    """L-BFGS (compact representation) with a weak-Wolfe line search.

    Options
    -------
    memory : int, default 10
        Number of correction pairs kept.
    pairs : tuple of two lists of arrays, optional
        Initial correction pairs ``(S, Y)`` (flattened steps and gradient changes, oldest
        first), e.g. ``result.lbfgs_pairs`` of a neighbouring problem: :func:`tilt_path`
        passes them from tilt to tilt, so that each solve starts with the curvature
        learned at the previous tilt.
    """

    name = "lbfgs"
    default_max_iter = 2000

    def __init__(self, memory: int = 10, pairs: Any = None, **options: Any):
        super().__init__(**options)
        if isinstance(memory, bool) or int(memory) != memory or int(memory) < 1:
            raise ValueError(f"`memory` must be a positive integer, got {memory!r}")
        self.memory = int(memory)
        self.pairs = pairs

    def _reset(self) -> None:
        self.S: list = []  # flattened s_i, oldest first
        self.Y: list = []
        self.SY = np.zeros((0, 0))  # SY[i, j] = s_i . y_j
        self.YY = np.zeros((0, 0))
        self.Sg = np.zeros(0)  # s_i . g, y_i . g at the current point
        self.Yg = np.zeros(0)

    def init(self, objective: Any, x0: Any):
        self._reset()
        state = super().init(objective, x0)
        self.shape = tuple(x0.shape)
        self.np_dtype = to_numpy_dtype(x0)
        self.gg = state.grad_norm**2
        if self.pairs is not None and state.failed is None:
            self._seed_pairs(objective.xp, state.jac)
        return state

    def _seed_pairs(self, xp: Any, g: Any) -> None:
        """Start from given correction pairs (e.g. of a neighbouring tilt on a path)."""
        S, Y = list(self.pairs[0])[-self.memory :], list(self.pairs[1])[-self.memory :]
        if not S or len(S) != len(Y):
            return
        m = len(S)
        rows = xp.stack(S + Y)
        P = to_numpy(rows @ xp.stack(Y + [xp.reshape(g, (-1,))], axis=1)).astype(np.float64)
        SY, YY, Sg, Yg = P[:m, :m], P[m:, :m], P[:m, m], P[m:, m]
        if not (np.all(np.isfinite(P)) and np.all(np.diag(SY) > 0)):
            return
        self.S, self.Y = S, Y
        self.SY, self.YY = np.triu(SY), YY
        self.Sg, self.Yg = Sg, Yg

    def export_pairs(self) -> tuple[list, list]:
        """The stored correction pairs ``(S, Y)`` (flattened arrays, oldest first)."""
        return list(self.S), list(self.Y)

    def _coefficients(self) -> tuple[float, np.ndarray, np.ndarray] | None:
        """``H g = gamma g + cS . S + cY . Y`` (host), or None without pairs."""
        m = len(self.S)
        if m == 0:
            return None
        R = self.SY  # kept upper triangular (s_i . y_j for i <= j)
        D = np.diag(self.SY)
        gamma = float(self.SY[-1, -1] / self.YY[-1, -1])
        # m x m (m <= memory) triangular systems: LAPACK directly, without SciPy's checks
        p1 = np.linalg.solve(R, self.Sg)
        cS = np.linalg.solve(R.T, D * p1 + gamma * (self.YY @ p1) - gamma * self.Yg)
        cY = -gamma * p1
        return gamma, cS, cY

    def _direction(self, g: Any, xp: Any) -> tuple[Any, float]:
        """(d = -H g, its slope g . d computed on the host)."""
        coef = self._coefficients()
        if coef is None:
            return -g, -self.gg
        gamma, cS, cY = coef
        w = np.concatenate([cS, cY])
        slope = -(gamma * self.gg + float(cS @ self.Sg) + float(cY @ self.Yg))
        rows = xp.stack(self.S + self.Y)  # (2m, p)
        wd = xp.asarray(w.astype(self.np_dtype), device=device(g))
        hg = gamma * xp.reshape(g, (-1,)) + wd @ rows
        return xp.reshape(-hg, self.shape), slope

    def step(self, objective: Any, state: SolverState) -> SolverState:
        xp = objective.xp
        d, slope = self._direction(state.jac, xp)
        (d,) = materialize(d)
        if not (slope < 0 and math.isfinite(slope)):  # lost descent: reset memory
            self._reset()
            d, slope = -state.jac, -self.gg
        step0 = 1.0 if self.S else min(1.0, 1.0 / max(state.grad_norm, 1e-300))
        step, x, f, g, dnew, _ = wolfe_search(
            objective,
            state.x,
            state.fun_float,
            state.jac,
            d,
            step0,
            xp,
            slope=slope,
            feps=self.feps,
        )
        if step == 0.0:
            if self.S:  # retry once along the steepest descent direction
                self._reset()
                return self.step(objective, state)
            out = SolverState(
                state.x, state.fun, state.jac, state.fun_float, state.grad_norm, nit=state.nit + 1
            )
            out.failed = Status.LINE_SEARCH_FAILED
            return out
        # keep the stored pairs concrete: lazy (Dask) pairs would chain every past direction
        x, f, g = materialize(x, f, g)
        s = xp.reshape(x - state.x, (-1,))
        yv = xp.reshape(g - state.jac, (-1,))
        gf = xp.reshape(g, (-1,))
        s, yv = materialize(s, yv)
        # one product and one transfer: every inner product this iteration needs
        rows = xp.stack(self.S + self.Y + [s, yv, gf])
        prod = rows @ xp.stack([yv, gf], axis=1)
        host = to_numpy(xp.concat([xp.reshape(prod, (-1,)), xp.reshape(f, (1,))]))
        host = host.astype(np.float64)
        fn = float(host[-1])
        P = host[:-1].reshape(-1, 2)
        m = len(self.S)
        Sy, Yy = P[:m, 0], P[m : 2 * m, 0]
        sy, yy = P[2 * m, 0], P[2 * m + 1, 0]
        Sg, Yg = P[:m, 1], P[m : 2 * m, 1]
        sg, yg, gg = P[2 * m, 1], P[2 * m + 1, 1], P[2 * m + 2, 1]
        gn = math.sqrt(max(gg, 0.0))
        self.gg = gg
        if sy > 1e-12 * yy and sy > 0 and math.isfinite(sy) and math.isfinite(yy):
            k = m + 1
            SY = np.zeros((k, k))
            SY[:m, :m] = self.SY
            SY[:m, m] = Sy
            SY[m, m] = sy
            # s_m . y_i (i < m) is not needed: only the upper triangle and diagonal are used
            YY = np.zeros((k, k))
            YY[:m, :m] = self.YY
            YY[:m, m] = YY[m, :m] = Yy
            YY[m, m] = yy
            self.S.append(s)
            self.Y.append(yv)
            self.SY, self.YY = SY, YY
            self.Sg = np.append(Sg, sg)
            self.Yg = np.append(Yg, yg)
            if k > self.memory:
                self.S.pop(0)
                self.Y.pop(0)
                self.SY, self.YY = self.SY[1:, 1:], self.YY[1:, 1:]
                self.Sg, self.Yg = self.Sg[1:], self.Yg[1:]
        else:
            self.Sg, self.Yg = Sg, Yg
        out = SolverState(x=x, fun=f, jac=g, fun_float=fn, grad_norm=gn, nit=state.nit + 1)
        out.step = step
        if not (math.isfinite(fn) and math.isfinite(gn)):
            out.failed = Status.NONFINITE
        return out
