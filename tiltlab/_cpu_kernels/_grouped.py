"""A fused kernel for per-group tilted states (imported lazily: this module imports numba).

For scalar-predictor losses and a partition of the rows into ``G`` groups (int64 codes in
``[0, G)``), :func:`group_scalar` reads each row of ``X`` once and keeps one tilted state
per group, with the conventions of the chunk states of :mod:`._rows` (columns: shift, hi,
lo, mass, s, q, lsum, non-finite flag, av): an exact running shift per group (the largest
loss for ``t > 0``, the smallest for ``t <= 0``) with ``s = sum p exp(t (l - shift))``,
``q = sum p expm1(t (l - shift))`` and ``lsum = sum p (l - shift)`` rescaled each time it
moves. ``q`` is bounded by the group's mass (every exponent is at most 0), so it is kept
for every group; the reader uses it only where the group's spread allows it, as
:class:`tiltlab.accumulator.GroupState` does.

The vector sums are per group too (``G x d`` float64 accumulators, each row added to its
group's row): the gradient ``sum p exp(t (l - shift)) l' x`` and, for a Hessian-vector
product along ``v`` (``u = x . v``, ``a = l' u``), ``sum pe (l'' u + t l' a) x``,
``sum pe l' x`` and ``av = sum pe a`` (state column 8). As in :mod:`._rows`, each group's
vector sums follow a lazy second shift that moves only when the weights would exceed
``exp(LAZY_LIMIT)``, and are brought to the exact shift at the end.

The predictors and the losses come from the block steps of :mod:`.block_steps` (in ``X``'s
dtype, a block of rows at a time); the fold of each row into its group is scalar and in
float64. The rows are walked in order by one thread (a Dask chunk is one task): the result
does not depend on the number of threads. The multinomial loss has a kernel of its own,
with the same conventions (:mod:`._grouped_multi`).
"""

from __future__ import annotations

import math

import numpy as np

from ._losses import loss_block
from ._rows import _INLINE, LAZY_LIMIT
from ._state_steps import (
    state_factor,
    state_fold,
    state_move,
    state_weight,
    state_weight_t,
)
from .block_steps import BLOCK, KERNEL, block_rows, dots, dots2


@_INLINE
def fold_loss(st, loss, pi, t, cg, rg, g, vectors):
    """Fold one loss of prior weight ``pi > 0`` into its group's state ``st`` (the columns
    of the module doc): the first loss of the group sets its shift, a later one moves it
    when it passes it (the sums rescaled); with ``vectors`` the lazy shift ``cg[g]`` of
    the group's vector sums and ``rg[g] = exp(t (shift - cg[g]))`` follow. Returns
    ``(pe, f)``: ``pe = pi exp(t (loss - shift))`` and the factor by which the caller
    multiplies the group's vector sums now (1.0: they keep their lazy shift)."""
    f = 1.0
    if st[3] == 0.0:
        st[0] = loss
        st[1] = loss
        st[2] = loss
        cg[g] = loss
        rg[g] = 1.0
    else:
        if loss > st[1]:
            st[1] = loss
        if loss < st[2]:
            st[2] = loss
        new = st[1] if t > 0.0 else st[2]
        c = st[0]
        if new != c:
            r, st[4], st[5], st[6] = state_move(t, c, new, st[3], st[4], st[5], st[6])
            st[8] *= r
            st[0] = new
            if vectors and t * (new - cg[g]) > LAZY_LIMIT:
                f = state_factor(t, cg[g], new)
                cg[g] = new
                rg[g] = 1.0
            elif vectors:
                rg[g] = state_factor(t, new, cg[g])
    # the group's q is kept at every spread (the regime is read when the states merge):
    # exp(u) for the weight, expm1(u) for q
    e = state_weight(t, loss, st[0], False)[0]
    e1 = state_weight(t, loss, st[0], True)[1]
    st[3], st[4], st[5], st[6] = state_fold(pi, loss, st[0], e, e1, st[3], st[4], st[5], st[6])
    return pi * e, f


@_INLINE
def block_weights(lv, codes, state, i0, nb, t, x, e1):
    """``e1 = expm1(t (l - shift_g))`` in float64 for the rows of a block, at the shifts
    their groups have once the block's losses moved them (every exponent is at most 0):
    the group shifts gathered in one loop, the ``expm1`` of the whole block in a second
    loop that LLVM vectorises (:mod:`._vmath`)."""
    for b in range(nb):
        x[b] = state[codes[i0 + b], 0]
    for b in range(nb):
        e1[b] = state_weight_t(t, np.float64(lv[b]), x[b], True)[1]


@KERNEL
def group_scalar(
    X, y, p, codes, theta, v, t, code, param, want_grad, want_hvp, state, A, B, k0, k1
):
    """Per-group states (``state``: ``G x 9``, zeros on entry) and sums (zeros on entry):
    ``A`` (``G x d``) the gradient sums (or the first Hessian-product sums with
    ``want_hvp``), ``B`` (``G x d``) the second Hessian-product sums (any shape unless
    ``want_hvp``; ``A`` too without vectors). A non-finite loss on the support sets the
    flag (column 7) of its group and stops the pass.
    ``k0, k1`` are the launcher's chunk range (one chunk: the whole of ``X``).

    A block of rows at a time: the predictors and losses (:mod:`.block_steps`), then the
    shifts of the block's groups moved to cover its losses (a compare a row; the sums of
    the rows folded before rescaled when a shift moves), the weights of the whole block
    at those shifts (:func:`block_weights`, vectorised), and last each row folded into
    its group's sums. The result is the state of :func:`fold_loss` folding the rows one
    by one, up to rounding."""
    n, d = X.shape
    G = state.shape[0]
    has_p = p.shape[0] > 0
    zero = np.zeros(1, dtype=X.dtype)[0]
    step = block_rows(d, X.itemsize)
    z = np.empty(BLOCK, dtype=X.dtype)
    u = np.zeros(BLOCK, dtype=X.dtype)
    lv = np.empty(BLOCK, dtype=X.dtype)
    d1 = np.empty(BLOCK, dtype=X.dtype)
    d2 = np.empty(BLOCK, dtype=X.dtype)
    x = np.empty(BLOCK)
    e1 = np.empty(BLOCK)
    cg = np.zeros(G)  # the lazy shift of each group's vector sums
    rg = np.ones(G)  # exp(t (shift - cg))
    seen = np.zeros(G, dtype=np.bool_)
    vectors = want_grad or want_hvp
    for i0 in range(0, n, step):
        nb = min(step, n - i0)
        if want_hvp:
            dots2(X, i0, nb, theta, v, z, u, zero)
        else:
            dots(X, i0, nb, theta, z, zero)
        loss_block(code, z, y, i0, nb, param, lv, d1, d2)
        for b in range(nb):  # the groups' shifts cover the block's losses
            i = i0 + b
            pi = p[i] if has_p else 1.0
            if not pi > 0.0:
                continue
            lo_ = np.float64(lv[b])
            g = codes[i]
            if not (math.isfinite(lo_) and math.isfinite(np.float64(d1[b]))):
                state[g, 7] = 1.0
                return
            # the first loss of the group sets its shift, a later one moves it when it
            # passes it (the sums of the rows folded so far rescaled); the lazy shift of
            # the group's vector sums follows (written out here: the same steps in an
            # inlined function took twice the time of the whole loop)
            f = 1.0
            if not seen[g]:
                seen[g] = True
                state[g, 0] = lo_
                state[g, 1] = lo_
                state[g, 2] = lo_
                cg[g] = lo_
                rg[g] = 1.0
                continue
            if lo_ > state[g, 1]:
                state[g, 1] = lo_
            if lo_ < state[g, 2]:
                state[g, 2] = lo_
            new = state[g, 1] if t > 0.0 else state[g, 2]
            c = state[g, 0]
            if new == c:
                continue
            r, state[g, 4], state[g, 5], state[g, 6] = state_move(
                t, c, new, state[g, 3], state[g, 4], state[g, 5], state[g, 6]
            )
            state[g, 8] *= r
            state[g, 0] = new
            if vectors and t * (new - cg[g]) > LAZY_LIMIT:
                f = state_factor(t, cg[g], new)
                cg[g] = new
                rg[g] = 1.0
            elif vectors:
                rg[g] = state_factor(t, new, cg[g])
            if f != 1.0:  # the group's vector sums move to its shift
                for j in range(d):
                    A[g, j] *= f
                if want_hvp:
                    for j in range(d):
                        B[g, j] *= f
        block_weights(lv, codes, state, i0, nb, t, x, e1)
        for b in range(nb):
            i = i0 + b
            pi = p[i] if has_p else 1.0
            if not pi > 0.0:
                continue
            g = codes[i]
            m1 = e1[b]
            pe = pi * (m1 + 1.0)
            state[g, 3], state[g, 4], state[g, 5], state[g, 6] = state_fold(
                pi, np.float64(lv[b]), state[g, 0], m1 + 1.0, m1,
                state[g, 3], state[g, 4], state[g, 5], state[g, 6],
            )  # fmt: skip
            if not vectors:
                continue
            g1 = np.float64(d1[b])
            w = pe * rg[g]  # p exp(t (l - cg))
            if want_hvp:
                ub = np.float64(u[b])
                a = g1 * ub
                state[g, 8] += pe * a
                ca = w * (np.float64(d2[b]) * ub + t * g1 * a)
                cb = w * g1
                for j in range(d):
                    xj = np.float64(X[i, j])
                    A[g, j] += ca * xj
                    B[g, j] += cb * xj
            else:
                cb = w * g1
                for j in range(d):
                    A[g, j] += cb * np.float64(X[i, j])
    if vectors:
        for g in range(G):
            if state[g, 3] > 0.0 and cg[g] != state[g, 0]:
                f = state_factor(t, cg[g], state[g, 0])
                for j in range(d):
                    A[g, j] *= f
                if want_hvp:
                    for j in range(d):
                        B[g, j] *= f
