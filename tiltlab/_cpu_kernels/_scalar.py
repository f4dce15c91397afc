"""Fused kernels for the scalar-predictor losses (squared, absolute, Huber, logistic,
hinge, squared hinge): value and gradient, one-pass Hessian-vector products and the
linearised product. See :mod:`._rows` for the chunk state and its conventions and
:mod:`.block_steps` for the vectorised steps on a block of rows."""

from __future__ import annotations

import numpy as np

from ._losses import loss_block
from ._rows import LAZY_LIMIT, SUB_BLOCK, _chunk, _dot, _flush
from ._state_steps import state_factor, state_move
from .block_steps import (
    BLOCK,
    KERNEL,
    ahead_rows,
    axpy2_rows,
    axpy_dots,
    axpy_rows,
    block_rows,
    dots,
    dots2,
    extremes,
    overlaps,
    padded_cols,
    sums,
    weights_block,
    wsum,
)


@KERNEL
def vg_scalar(
    X, y, p, theta, t, code, param, n_chunks, want_grad, per_sample, state, G, out, k0, k1
):
    """Chunk states and unnormalised gradients; ``out`` (n, 3) receives the per-sample
    loss, first and second derivative when ``per_sample`` (the linearised state)."""
    n, d = X.shape
    has_p = p.shape[0] > 0
    zero = np.zeros(1, dtype=X.dtype)[0]
    step = block_rows(d, X.itemsize)
    ahead = ahead_rows(d, X.itemsize, step)
    end = _chunk(n, n_chunks, k1 - 1)[1]
    pipe = want_grad and overlaps(d, X.itemsize)
    for k in range(k0, k1):
        r0, r1 = _chunk(n, n_chunks, k)
        acc = G[k]
        blk = np.zeros(padded_cols(d, X.itemsize), dtype=X.dtype)
        z = np.empty(BLOCK, dtype=X.dtype)
        zn = np.empty(BLOCK if pipe else 0, dtype=X.dtype)
        ready = False  # z holds the block's predictors (from the previous block's updates)
        lv = np.empty(BLOCK, dtype=X.dtype)
        d1 = np.empty(BLOCK, dtype=X.dtype)
        d2 = np.empty(BLOCK, dtype=X.dtype)
        e = np.empty(BLOCK, dtype=X.dtype)
        e1 = np.empty(BLOCK, dtype=X.dtype)
        coef = np.empty(BLOCK, dtype=X.dtype)
        c = 0.0
        cg = 0.0
        rg = 1.0
        hi = -np.inf
        lo = np.inf
        mass = 0.0
        s = 0.0
        q = 0.0
        lsum = 0.0
        bad = 0.0
        qlive = True
        for i0 in range(r0, r1, step):
            nb = min(step, r1 - i0)
            if not ready:
                dots(X, i0, nb, theta, z, zero)
            ready = False
            loss_block(code, z, y, i0, nb, param, lv, d1, d2)
            bhi, blo, bmass, nbad = extremes(p, has_p, i0, nb, lv, d1)
            if per_sample:
                for b in range(nb):
                    on = (p[i0 + b] if has_p else 1.0) > 0.0
                    out[i0 + b, 0] = lv[b] if on else 0.0
                    out[i0 + b, 1] = d1[b] if on else 0.0
                    out[i0 + b, 2] = d2[b] if on else 0.0
            if nbad > 0:
                bad = 1.0
                break
            if bmass == 0.0:
                continue
            hi = max(hi, bhi)
            lo = min(lo, blo)
            new = bhi if t > 0.0 else blo
            if mass == 0.0:
                c = new
                cg = new
                rg = 1.0
            elif (t > 0.0 and new > c) or (t <= 0.0 and new < c):
                r, s, q, lsum = state_move(t, c, new, mass, s, q, lsum)
                c = new
                if t * (c - cg) > LAZY_LIMIT:
                    if want_grad:
                        f = state_factor(t, cg, c)
                        for j in range(d):
                            acc[j] *= f
                    cg = c
                    rg = 1.0
                else:
                    rg = state_factor(t, c, cg)
            if qlive and abs(t) * (hi - lo) > 1.0:
                qlive = False
            weights_block(p, has_p, i0, nb, t, c, qlive, lv, e, e1)
            bs, bq, bl = sums(p, has_p, i0, nb, lv, c, e, e1)
            mass += bmass
            s += bs
            q += bq
            lsum += bl
            if want_grad and has_p:
                for b in range(nb):
                    coef[b] = (p[i0 + b] * e[b]) * rg * d1[b] if e[b] != 0.0 else 0.0
            elif want_grad:  # in X's dtype (e is 0 only where exp underflows: d1 is finite)
                rgx = coef.dtype.type(rg)
                for b in range(nb):
                    coef[b] = (e[b] * rgx) * d1[b]
            if pipe and i0 + step < r1:  # the next block's dot products along
                nn = min(step, r1 - i0 - step)
                axpy_dots(X, i0, nb, coef, blk, i0 + step, nn, theta, zn, zero)
                _flush(blk, acc)
                z, zn = zn, z
                ready = True
            elif want_grad:
                axpy_rows(X, i0, nb, coef, blk, acc, ahead, end)
        if want_grad and mass > 0.0 and cg != c:
            f = state_factor(t, cg, c)
            for j in range(d):
                acc[j] *= f
        st = state[k]
        st[0] = c
        st[1] = hi
        st[2] = lo
        st[3] = mass
        st[4] = s
        st[5] = q if qlive else np.nan
        st[6] = lsum
        st[7] = bad
        st[8] = 0.0


@KERNEL
def hvp_scalar(X, y, p, theta, v, t, code, param, n_chunks, state, A, G, k0, k1):
    """One pass for a Hessian-vector product: chunk states, ``A = sum pe (l'' u + t l' a) x``
    and ``G = sum pe l' x`` (vectors), ``av = sum pe a`` (state column 8), with
    ``u = x . v`` and ``a = l' u``."""
    n, d = X.shape
    has_p = p.shape[0] > 0
    zero = np.zeros(1, dtype=X.dtype)[0]
    tilted = t != 0.0
    step = block_rows(d, X.itemsize)
    ahead = ahead_rows(d, X.itemsize, step)
    end = _chunk(n, n_chunks, k1 - 1)[1]
    for k in range(k0, k1):
        r0, r1 = _chunk(n, n_chunks, k)
        accA = A[k]
        accG = G[k]
        blkA = np.zeros(padded_cols(d, X.itemsize), dtype=X.dtype)
        blkG = np.zeros(padded_cols(d, X.itemsize), dtype=X.dtype)
        z = np.empty(BLOCK, dtype=X.dtype)
        u = np.empty(BLOCK, dtype=X.dtype)
        a = np.empty(BLOCK, dtype=X.dtype)
        lv = np.empty(BLOCK, dtype=X.dtype)
        d1 = np.empty(BLOCK, dtype=X.dtype)
        d2 = np.empty(BLOCK, dtype=X.dtype)
        e = np.empty(BLOCK, dtype=X.dtype)
        e1 = np.empty(BLOCK, dtype=X.dtype)
        ca = np.empty(BLOCK, dtype=X.dtype)
        cb = np.empty(BLOCK, dtype=X.dtype)
        c = 0.0
        cg = 0.0
        rg = 1.0
        hi = -np.inf
        lo = np.inf
        mass = 0.0
        s = 0.0
        q = 0.0
        lsum = 0.0
        av = 0.0
        bad = 0.0
        qlive = True
        for i0 in range(r0, r1, step):
            nb = min(step, r1 - i0)
            dots2(X, i0, nb, theta, v, z, u, zero)
            loss_block(code, z, y, i0, nb, param, lv, d1, d2)
            bhi, blo, bmass, nbad = extremes(p, has_p, i0, nb, lv, d1)
            if nbad > 0:
                bad = 1.0
                break
            if bmass == 0.0:
                continue
            hi = max(hi, bhi)
            lo = min(lo, blo)
            new = bhi if t > 0.0 else blo
            if mass == 0.0:
                c = new
                cg = new
                rg = 1.0
            elif (t > 0.0 and new > c) or (t <= 0.0 and new < c):
                r, s, q, lsum = state_move(t, c, new, mass, s, q, lsum)
                av = av * r
                c = new
                if t * (c - cg) > LAZY_LIMIT:
                    f = state_factor(t, cg, c)
                    for j in range(d):
                        accA[j] *= f
                        accG[j] *= f
                    cg = c
                    rg = 1.0
                else:
                    rg = state_factor(t, c, cg)
            if qlive and abs(t) * (hi - lo) > 1.0:
                qlive = False
            weights_block(p, has_p, i0, nb, t, c, qlive, lv, e, e1)
            bs, bq, bl = sums(p, has_p, i0, nb, lv, c, e, e1)
            for b in range(nb):
                a[b] = d1[b] * u[b]
            av += wsum(p, has_p, i0, nb, e, a)
            mass += bmass
            s += bs
            q += bq
            lsum += bl
            if has_p:
                for b in range(nb):
                    on = e[b] != 0.0
                    pg = (p[i0 + b] * e[b]) * rg
                    ca[b] = pg * (d2[b] * u[b] + t * d1[b] * a[b]) if on else 0.0
                    cb[b] = pg * d1[b] if on else 0.0
            else:  # a loop of its own (vectorised; with the prior's test inside it is not)
                for b in range(nb):
                    on = e[b] != 0.0
                    pg = e[b] * rg
                    ca[b] = pg * (d2[b] * u[b] + t * d1[b] * a[b]) if on else 0.0
                    cb[b] = pg * d1[b] if on else 0.0
            if tilted:
                axpy2_rows(X, i0, nb, ca, cb, blkA, blkG, accA, accG, ahead, end)
            else:
                axpy_rows(X, i0, nb, ca, blkA, accA, ahead, end)
        if mass > 0.0 and cg != c:
            f = state_factor(t, cg, c)
            for j in range(d):
                accA[j] *= f
                accG[j] *= f
        st = state[k]
        st[0] = c
        st[1] = hi
        st[2] = lo
        st[3] = mass
        st[4] = s
        st[5] = q if qlive else np.nan
        st[6] = lsum
        st[7] = bad
        st[8] = av


@KERNEL
def linear_hvp_scalar(X, alpha, beta, v, gv, n_chunks, A, k0, k1):
    """``sum_i (alpha_i u_i - beta_i gv) x_i`` with ``u = x . v``: one pass over ``X``, row
    by row (no transcendentals: each row's dot product and update while it is in cache)."""
    n, d = X.shape
    zero = np.zeros(1, dtype=X.dtype)[0]
    for k in range(k0, k1):
        r0, r1 = _chunk(n, n_chunks, k)
        acc = A[k]
        blk = np.zeros(d, dtype=X.dtype)
        cbuf = np.zeros(1, dtype=X.dtype)
        inblk = 0
        for i in range(r0, r1):
            if alpha[i] == 0.0 and beta[i] == 0.0:
                continue
            u = np.float64(_dot(X, i, v, zero))
            cbuf[0] = alpha[i] * u - beta[i] * gv
            coef = cbuf[0]
            for j in range(d):
                blk[j] += coef * X[i, j]
            inblk += 1
            if inblk == SUB_BLOCK:
                _flush(blk, acc)
                inblk = 0
        _flush(blk, acc)
