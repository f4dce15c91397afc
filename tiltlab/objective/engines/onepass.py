"""The one-pass block engine: value and gradient, or a Hessian-vector product, reading each
block of rows of ``X`` once (eager backends, sample-level finite tilt).

Per block, ``z_b = X_b @ theta``; the block's losses and derivatives fold into a tilted
accumulator (:mod:`tiltlab.accumulator`), and ``X_b^T c_b`` is taken while ``X_b`` is hot.
The per-sample temporaries stay O(block), not O(N).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...accumulator import NonFiniteLosses, block_state, finalize_risk, merge, normalized_sums
from ..blocks import BLOCK_BYTES, block_rows, hvp_coefficients, mean_state
from .base import Context, Engine

__all__ = ["ONE_PASS", "OnePassEngine", "check_block_rows", "rows_per_block"]


def rows_per_block(
    problem: Any, override: int | None = None, target_bytes: int = BLOCK_BYTES
) -> int:
    """Rows of ``X`` per block for ``problem`` (``override`` when set, at most ``n``)."""
    n = problem.n_samples or 1
    if override:
        return min(int(override), n)
    d = problem.n_features or 1
    return block_rows(n, d, problem.dtype, problem.xp, problem.device, target_bytes=target_bytes)


def check_block_rows(value: Any) -> int | None:
    """A user's rows per block: a positive integer, or None for the policy."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
    ):
        raise ValueError(f"`block_rows` must be a positive integer or None, got {value!r}")
    return None if value is None else int(value)


class OnePassEngine(Engine):
    """Sample-level, finite tilt, prior prepared: one read of ``X`` per evaluation.

    The context's ``block_rows`` (None: the policy of
    :func:`~tiltlab.objective.blocks.block_rows`) sets the block size.
    """

    name = "one-pass"

    def applies(self, problem: Any) -> bool:
        if not problem.is_linear or problem.groups is not None or not problem.ready:
            return False
        return math.isfinite(problem.tilts[0])

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        out = self._sweep(
            problem, theta, None, ctx, rows_per_block(problem, ctx.block_rows, ctx.block_bytes)
        )
        if out is None:
            return None
        r, (g,) = out
        if problem.l2:
            r = r + 0.5 * problem.l2 * problem.xp.sum(theta * theta)
            g = g + problem.l2 * theta
        return r, g

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        out = self._sweep(
            problem, theta, v, ctx, rows_per_block(problem, ctx.block_rows, ctx.block_bytes)
        )
        if out is None:
            return None
        hv = out[1][0]
        return hv + problem.l2 * v if problem.l2 else hv

    def _sweep(self, problem: Any, th: Any, V: Any, ctx: Context, B: int) -> Any:
        """Value and gradient (``V is None``) or Hessian-vector product along ``V``; None
        for overflowing losses (the generic engine then gives IEEE results)."""
        xp, loss = problem.xp, problem.loss
        X, y, p, t = problem.X, problem.y, problem.prior, float(problem.tilts[0])
        n = problem.n_samples
        multi = th.ndim == 2
        if V is not None:
            k = th.shape[1] if multi else 1
            TV = xp.concat([th, V], axis=1) if multi else xp.stack([th, V], axis=1)
        state = None
        for r0 in range(0, n, B):
            r1 = min(n, r0 + B)
            whole = (r0, r1) == (0, n)
            Xb = X if whole else X[r0:r1, ...]
            yb = y if whole else y[r0:r1, ...]
            pb = None if p is None else (p if whole else p[r0:r1])
            if V is None:
                z = Xb @ th
                ell, d1 = loss.value_and_d1(z, yb, validate=False, xp=xp)

                def sums(pe, Xb=Xb, d1=d1):
                    coef = pe[:, None] * d1 if multi else pe * d1
                    return (Xb.T @ coef,)
            else:
                zu = Xb @ TV
                if multi:
                    z, u = zu[:, :k], zu[:, k:]
                else:
                    z, u = zu[:, 0], zu[:, 1]
                ell, d1, d2 = loss.derivatives(z, yb, validate=False, xp=xp)
                if multi:
                    hz = loss.hvp_z(z, yb, u, validate=False, xp=xp)
                    a = xp.sum(d1 * u, axis=1)
                else:
                    a = d1 * u

                def sums(pe, Xb=Xb, d1=d1, d2=d2, u=u, a=a, hz=(hz if multi else None)):
                    c, gcoef = hvp_coefficients(pe, d1, d2, u, a, hz, t)
                    return (Xb.T @ c, Xb.T @ gcoef, xp.sum(pe * a))

            try:
                if t == 0.0:
                    st = mean_state(ell, pb, xp, sums)
                else:
                    st = block_state(ell, pb, t, xp, sums=sums)
            except NonFiniteLosses:
                return None
            state = st if state is None else merge(state, st)
        ctx.count(1)
        if t == 0.0:
            value = state.shift + state.lsum / state.mass
        else:
            value = finalize_risk(state, xp, problem.dtype)
        parts = normalized_sums(state)
        if V is None:
            return value, parts
        A, G, av = parts
        return value, (A - t * G * av if t != 0.0 else A,)


#: The one-pass blocked engine, one instance shared by every objective.
ONE_PASS = OnePassEngine()
