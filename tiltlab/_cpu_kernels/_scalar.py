"""Fused kernels for the scalar-predictor losses (squared, absolute, Huber, logistic,
hinge, squared hinge): value and gradient, one-pass Hessian-vector products and the
linearised product. See :mod:`._rows` for the chunk state and its conventions."""

from __future__ import annotations

import math

import numpy as np

from ._rows import (
    _JIT,
    LAZY_LIMIT,
    SUB_BLOCK,
    _chunk,
    _dot,
    _dot2,
    _flush,
    _loss,
    _weight_parts,
    prange,
)


@_JIT
def vg_scalar(X, y, p, theta, t, code, param, n_chunks, want_grad, per_sample, state, G, out):
    """Chunk states and unnormalised gradients; ``out`` (n, 3) receives the per-sample
    loss, first and second derivative when ``per_sample`` (the linearised state)."""
    n, d = X.shape
    has_p = p.shape[0] > 0
    zero = np.zeros(1, dtype=X.dtype)[0]
    for k in prange(n_chunks):
        r0, r1 = _chunk(n, n_chunks, k)
        acc = G[k]
        blk = np.zeros(d, dtype=X.dtype)
        cbuf = np.zeros(2, dtype=X.dtype)  # casts a float64 coefficient to X's dtype
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
        inblk = 0
        for i in range(r0, r1):
            pi = p[i] if has_p else 1.0
            if pi == 0.0:
                if per_sample:
                    out[i, 0] = 0.0
                    out[i, 1] = 0.0
                    out[i, 2] = 0.0
                continue
            z = np.float64(_dot(X, i, theta, zero))
            l, d1, d2 = _loss(code, z, y[i], param)
            if per_sample:
                out[i, 0] = l
                out[i, 1] = d1
                out[i, 2] = d2
            if not (math.isfinite(l) and math.isfinite(d1)):
                bad = 1.0
                continue
            hi = max(hi, l)
            lo = min(lo, l)
            if mass == 0.0:
                c = l
                cg = l
                rg = 1.0
            elif (t > 0.0 and l > c) or (t <= 0.0 and l < c):
                du = t * (c - l)
                r = math.exp(du)
                q = mass * math.expm1(du) + q * r
                s = s * r
                lsum += mass * (c - l)
                c = l
                if t * (c - cg) > LAZY_LIMIT:
                    if want_grad:
                        _flush(blk, acc)
                        f = math.exp(t * (cg - c))
                        for j in range(d):
                            acc[j] *= f
                    cg = c
                    rg = 1.0
                else:
                    rg = math.exp(t * (c - cg))
            if qlive and abs(t) * (hi - lo) > 1.0:
                qlive = False
            e, e1 = _weight_parts(t, l, c, qlive)
            mass += pi
            s += pi * e
            q += pi * e1
            lsum += pi * (l - c)
            if want_grad:
                cbuf[0] = pi * e * rg * d1
                coef = cbuf[0]
                for j in range(d):
                    blk[j] += coef * X[i, j]
                inblk += 1
                if inblk == SUB_BLOCK:
                    _flush(blk, acc)
                    inblk = 0
        if want_grad:
            _flush(blk, acc)
            if mass > 0.0 and cg != c:
                f = math.exp(t * (cg - c))
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


@_JIT
def hvp_scalar(X, y, p, theta, v, t, code, param, n_chunks, state, A, G):
    """One pass for a Hessian-vector product: chunk states, ``A = sum pe (l'' u + t l' a) x``
    and ``G = sum pe l' x`` (vectors), ``av = sum pe a`` (state column 8), with
    ``u = x . v`` and ``a = l' u``."""
    n, d = X.shape
    has_p = p.shape[0] > 0
    zero = np.zeros(1, dtype=X.dtype)[0]
    tilted = t != 0.0
    for k in prange(n_chunks):
        r0, r1 = _chunk(n, n_chunks, k)
        accA = A[k]
        accG = G[k]
        blkA = np.zeros(d, dtype=X.dtype)
        blkG = np.zeros(d, dtype=X.dtype)
        cbuf = np.zeros(2, dtype=X.dtype)
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
        inblk = 0
        for i in range(r0, r1):
            pi = p[i] if has_p else 1.0
            if pi == 0.0:
                continue
            zz, uu = _dot2(X, i, theta, v, zero)
            z = np.float64(zz)
            u = np.float64(uu)
            l, d1, d2 = _loss(code, z, y[i], param)
            if not (math.isfinite(l) and math.isfinite(d1)):
                bad = 1.0
                continue
            hi = max(hi, l)
            lo = min(lo, l)
            if mass == 0.0:
                c = l
                cg = l
                rg = 1.0
            elif (t > 0.0 and l > c) or (t <= 0.0 and l < c):
                du = t * (c - l)
                r = math.exp(du)
                q = mass * math.expm1(du) + q * r
                s = s * r
                av = av * r
                lsum += mass * (c - l)
                c = l
                if t * (c - cg) > LAZY_LIMIT:
                    _flush(blkA, accA)
                    _flush(blkG, accG)
                    f = math.exp(t * (cg - c))
                    for j in range(d):
                        accA[j] *= f
                        accG[j] *= f
                    cg = c
                    rg = 1.0
                else:
                    rg = math.exp(t * (c - cg))
            if qlive and abs(t) * (hi - lo) > 1.0:
                qlive = False
            e, e1 = _weight_parts(t, l, c, qlive)
            pe = pi * e
            mass += pi
            s += pe
            q += pi * e1
            lsum += pi * (l - c)
            a = d1 * u
            av += pe * a
            pg = pe * rg
            if tilted:
                cbuf[0] = pg * (d2 * u + t * d1 * a)
                cbuf[1] = pg * d1
                ca = cbuf[0]
                cgr = cbuf[1]
                for j in range(d):
                    xj = X[i, j]
                    blkA[j] += ca * xj
                    blkG[j] += cgr * xj
            else:
                cbuf[0] = pg * d2 * u
                ca = cbuf[0]
                for j in range(d):
                    blkA[j] += ca * X[i, j]
            inblk += 1
            if inblk == SUB_BLOCK:
                _flush(blkA, accA)
                if tilted:
                    _flush(blkG, accG)
                inblk = 0
        _flush(blkA, accA)
        _flush(blkG, accG)
        if mass > 0.0 and cg != c:
            f = math.exp(t * (cg - c))
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


@_JIT
def linear_hvp_scalar(X, alpha, beta, v, gv, n_chunks, A):
    """``sum_i (alpha_i u_i - beta_i gv) x_i`` with ``u = x . v``: one pass over ``X``."""
    n, d = X.shape
    zero = np.zeros(1, dtype=X.dtype)[0]
    for k in prange(n_chunks):
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
