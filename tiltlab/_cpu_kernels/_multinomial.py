"""Fused kernels for the multinomial loss (``theta`` of shape ``(d, K)``, integer labels):
value and gradient, one-pass Hessian-vector products and the linearised product. See
:mod:`._rows` for the chunk state and its conventions."""

from __future__ import annotations

import math

import numpy as np

from ._rows import (
    _JIT,
    LAZY_LIMIT,
    SUB_BLOCK,
    _chunk,
    _flush2,
    _matvec_row,
    _softmax_row,
    _weight_parts,
)
from ._state_steps import state_factor, state_fold, state_move


@_JIT
def vg_multi(X, y, p, theta, t, n_chunks, want_grad, per_sample, state, G, out_l, out_s, k0, k1):
    """Multinomial chunk states and unnormalised gradients (``G`` of shape
    ``(n_chunks, d, K)``); per-sample losses and softmax rows when ``per_sample``."""
    n, d = X.shape
    K = theta.shape[1]
    has_p = p.shape[0] > 0
    for k in range(k0, k1):
        r0, r1 = _chunk(n, n_chunks, k)
        acc = G[k]
        blk = np.zeros((d, K), dtype=X.dtype)
        zv = np.zeros(K, dtype=X.dtype)
        z = np.zeros(K)
        sm = np.zeros(K)
        coef = np.zeros(K, dtype=X.dtype)
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
                    out_l[i] = 0.0
                    for kk in range(K):
                        out_s[i, kk] = 0.0
                continue
            _matvec_row(X, i, theta, zv)
            for kk in range(K):
                z[kk] = zv[kk]
            yi = int(y[i])
            l, oth = _softmax_row(z, yi, sm)
            if per_sample:
                out_l[i] = l
                for kk in range(K):
                    out_s[i, kk] = sm[kk]
            if not math.isfinite(l):
                bad = 1.0
                continue
            hi = max(hi, l)
            lo = min(lo, l)
            if mass == 0.0:
                c = l
                cg = l
                rg = 1.0
            elif (t > 0.0 and l > c) or (t <= 0.0 and l < c):
                r, s, q, lsum = state_move(t, c, l, mass, s, q, lsum)
                c = l
                if t * (c - cg) > LAZY_LIMIT:
                    if want_grad:
                        _flush2(blk, acc)
                        f = state_factor(t, cg, c)
                        for j in range(d):
                            for kk in range(K):
                                acc[j, kk] *= f
                    cg = c
                    rg = 1.0
                else:
                    rg = state_factor(t, c, cg)
            if qlive and abs(t) * (hi - lo) > 1.0:
                qlive = False
            e, e1 = _weight_parts(t, l, c, qlive)
            mass, s, q, lsum = state_fold(pi, l, c, e, e1, mass, s, q, lsum)
            if want_grad:
                pw = pi * e * rg
                for kk in range(K):
                    coef[kk] = pw * sm[kk]
                coef[yi] = -pw * oth
                for j in range(d):
                    xj = X[i, j]
                    for kk in range(K):
                        blk[j, kk] += xj * coef[kk]
                inblk += 1
                if inblk == SUB_BLOCK:
                    _flush2(blk, acc)
                    inblk = 0
        if want_grad:
            _flush2(blk, acc)
            if mass > 0.0 and cg != c:
                f = state_factor(t, cg, c)
                for j in range(d):
                    for kk in range(K):
                        acc[j, kk] *= f
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
def hvp_multi(X, y, p, theta, V, t, n_chunks, state, A, G, k0, k1):
    """Multinomial one-pass Hessian-vector product pieces (see :func:`hvp_scalar`), with
    the per-sample Hessian in ``z`` applied as ``s * u - s (s . u)``."""
    n, d = X.shape
    K = theta.shape[1]
    has_p = p.shape[0] > 0
    tilted = t != 0.0
    for k in range(k0, k1):
        r0, r1 = _chunk(n, n_chunks, k)
        accA = A[k]
        accG = G[k]
        blkA = np.zeros((d, K), dtype=X.dtype)
        blkG = np.zeros((d, K), dtype=X.dtype)
        zv = np.zeros(K, dtype=X.dtype)
        uv = np.zeros(K, dtype=X.dtype)
        z = np.zeros(K)
        sm = np.zeros(K)
        d1 = np.zeros(K)
        ca = np.zeros(K, dtype=X.dtype)
        cgr = np.zeros(K, dtype=X.dtype)
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
            _matvec_row(X, i, theta, zv)
            _matvec_row(X, i, V, uv)
            for kk in range(K):
                z[kk] = zv[kk]
            yi = int(y[i])
            l, oth = _softmax_row(z, yi, sm)
            if not math.isfinite(l):
                bad = 1.0
                continue
            hi = max(hi, l)
            lo = min(lo, l)
            if mass == 0.0:
                c = l
                cg = l
                rg = 1.0
            elif (t > 0.0 and l > c) or (t <= 0.0 and l < c):
                r, s, q, lsum = state_move(t, c, l, mass, s, q, lsum)
                av = av * r
                c = l
                if t * (c - cg) > LAZY_LIMIT:
                    _flush2(blkA, accA)
                    _flush2(blkG, accG)
                    f = state_factor(t, cg, c)
                    for j in range(d):
                        for kk in range(K):
                            accA[j, kk] *= f
                            accG[j, kk] *= f
                    cg = c
                    rg = 1.0
                else:
                    rg = state_factor(t, c, cg)
            if qlive and abs(t) * (hi - lo) > 1.0:
                qlive = False
            e, e1 = _weight_parts(t, l, c, qlive)
            pe = pi * e
            mass, s, q, lsum = state_fold(pi, l, c, e, e1, mass, s, q, lsum)
            su = 0.0
            a = 0.0
            for kk in range(K):
                d1[kk] = sm[kk]
                su += sm[kk] * uv[kk]
            d1[yi] = -oth
            for kk in range(K):
                a += d1[kk] * uv[kk]
            av += pe * a
            pg = pe * rg
            for kk in range(K):
                hz = sm[kk] * uv[kk] - sm[kk] * su
                ca[kk] = pg * (hz + t * a * d1[kk])
                cgr[kk] = pg * d1[kk]
            for j in range(d):
                xj = X[i, j]
                for kk in range(K):
                    blkA[j, kk] += xj * ca[kk]
                if tilted:
                    for kk in range(K):
                        blkG[j, kk] += xj * cgr[kk]
            inblk += 1
            if inblk == SUB_BLOCK:
                _flush2(blkA, accA)
                _flush2(blkG, accG)
                inblk = 0
        _flush2(blkA, accA)
        _flush2(blkG, accG)
        if mass > 0.0 and cg != c:
            f = state_factor(t, cg, c)
            for j in range(d):
                for kk in range(K):
                    accA[j, kk] *= f
                    accG[j, kk] *= f
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
def linear_hvp_multi(X, w, D1, S, t, V, gv, n_chunks, A, k0, k1):
    """Multinomial linearised product: per row ``u = x @ V``,
    ``c = w (s*u - s (s.u) + t d1 (d1.u - gv))``, ``A += x c^T``."""
    n, d = X.shape
    K = V.shape[1]
    for k in range(k0, k1):
        r0, r1 = _chunk(n, n_chunks, k)
        acc = A[k]
        blk = np.zeros((d, K), dtype=X.dtype)
        uv = np.zeros(K, dtype=X.dtype)
        cc = np.zeros(K, dtype=X.dtype)
        inblk = 0
        for i in range(r0, r1):
            wi = w[i]
            if wi == 0.0:
                continue
            _matvec_row(X, i, V, uv)
            su = 0.0
            a = 0.0
            for kk in range(K):
                su += S[i, kk] * uv[kk]
                a += D1[i, kk] * uv[kk]
            for kk in range(K):
                cc[kk] = wi * (S[i, kk] * uv[kk] - S[i, kk] * su + t * D1[i, kk] * (a - gv))
            for j in range(d):
                xj = X[i, j]
                for kk in range(K):
                    blk[j, kk] += xj * cc[kk]
            inblk += 1
            if inblk == SUB_BLOCK:
                _flush2(blk, acc)
                inblk = 0
        _flush2(blk, acc)
