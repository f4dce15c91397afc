"""The numba loops of the fused CPU engine (imported lazily: this module imports numba).

Every kernel walks the rows of ``X`` in a fixed number of contiguous chunks (``prange``
over chunks, never over threads), reads each row once and writes one small state per
chunk; the caller merges the chunk states in a fixed order. The chunk split depends on
the number of rows and the chunk count only, so the results are the same bit for bit
whatever the number of threads.

Per chunk, the tilted state follows :mod:`tiltlab.accumulator`: an exact running shift
``c`` (the largest loss for ``t > 0``, the smallest for ``t <= 0``) with ``s``, ``q`` and
``lsum`` rescaled each time it moves (scalars: cheap). The vector accumulators (gradient,
Hessian-vector product) are kept relative to a second, lazy shift ``cg`` that follows
``c`` only when the weights would otherwise exceed ``exp(LAZY_LIMIT)``: rows sorted by
loss then cost one rescale of a ``d``-vector per ``LAZY_LIMIT / |t|`` of loss range, not
one per row. Vector sums are taken in ``X``'s dtype over sub-blocks of ``SUB_BLOCK`` rows
and added into float64 accumulators (float32 input stays accurate over long chunks);
every scalar (the predictor after the dot product, the loss, its derivatives, the state)
is float64.

Without numba the same functions run as plain Python (slow; for tiny examples only).
"""

from __future__ import annotations

import math

import numpy as np

try:  # pragma: no branch - the engine is only chosen when numba imports
    import numba

    _JIT = numba.njit(parallel=True, fastmath=False, cache=True, nogil=True)
    _INLINE = numba.njit(fastmath=False, cache=True, inline="always")
    # The dot products alone may reassociate their sums (and nothing else: no NaN or inf
    # assumptions, no contraction) so that LLVM vectorises them. The order is fixed when
    # the kernel is compiled: results still do not depend on the number of threads.
    _DOT = numba.njit(fastmath={"reassoc"}, cache=True, nogil=True)
    prange = numba.prange
except ImportError:  # pragma: no cover - exercised where numba is absent

    def _JIT(f):
        return f

    def _INLINE(f):
        return f

    _DOT = _INLINE
    prange = range

#: loss codes (the order of :data:`LOSS_CODES` in the package)
SQUARED, ABSOLUTE, HUBER, LOGISTIC, HINGE, SQUARED_HINGE = 0, 1, 2, 3, 4, 5

#: rows per sub-block of the vector sums (taken in X's dtype, then added in float64)
SUB_BLOCK = 128
#: the vector accumulators' shift follows the exact one when weights pass exp(LAZY_LIMIT)
LAZY_LIMIT = 16.0

#: columns of a chunk state: shift, hi, lo, mass, s, q, lsum, non-finite flag, av
STATE_COLS = 9


@_DOT
def _dot(X, i, v, zero):
    """``X[i] . v`` in ``X``'s dtype (vectorised)."""
    s = zero
    for j in range(X.shape[1]):
        s += X[i, j] * v[j]
    return s


@_DOT
def _dot2(X, i, v, w, zero):
    """``(X[i] . v, X[i] . w)`` in one sweep over the row."""
    a = zero
    b = zero
    for j in range(X.shape[1]):
        xj = X[i, j]
        a += xj * v[j]
        b += xj * w[j]
    return a, b


@_INLINE
def _loss(code, z, y, param):
    """Value and first and second derivatives in ``z`` of a scalar-predictor loss."""
    if code == SQUARED:
        r = z - y
        return r * r, 2.0 * r, 2.0
    if code == LOGISTIC:
        e = math.exp(-abs(z))
        inv = 1.0 / (1.0 + e)
        small = e * inv
        if z >= 0.0:
            s, sc = inv, small
        else:
            s, sc = small, inv
        value = (max(z, 0.0) - y * z) + math.log1p(e)
        return value, (1.0 - y) * s - y * sc, s * sc
    if code == ABSOLUTE:
        r = z - y
        sg = 1.0 if r > 0.0 else (-1.0 if r < 0.0 else 0.0)
        return abs(r), sg, 0.0
    if code == HUBER:
        r = z - y
        a = abs(r)
        if a <= param:
            return 0.5 * r * r, r, 1.0
        sg = 1.0 if r > 0.0 else -1.0
        return param * (a - 0.5 * param), param * sg, 0.0
    # hinge and squared hinge: margin m = 1 - (2y - 1) z
    sgn = 2.0 * y - 1.0
    m = 1.0 - sgn * z
    if code == HINGE:
        if m > 0.0:
            return m, -sgn, 0.0
        return 0.0, 0.0, 0.0
    if m > 0.0:
        return m * m, -2.0 * sgn * m, 2.0
    return 0.0, 0.0, 0.0


@_INLINE
def _softmax_row(z, y, s):
    """Multinomial value at one row; fills ``s`` with the softmax and returns the value
    and the mass of the classes other than ``y`` (relative to the largest ``z``)."""
    K = z.shape[0]
    amax = 0
    for k in range(1, K):
        if z[k] > z[amax]:
            amax = k
    m = z[amax]
    total = 0.0
    rest = 0.0
    others = 0.0
    for k in range(K):
        e = math.exp(z[k] - m)
        s[k] = e
        total += e
        if k != amax:
            rest += e
        if k != y:
            others += e
    for k in range(K):
        s[k] = s[k] / total
    value = (m - z[y]) + math.log1p(rest)
    return value, others / total


@_INLINE
def _chunk(n, n_chunks, k):
    return (k * n) // n_chunks, ((k + 1) * n) // n_chunks


@_INLINE
def _flush(blk, acc):
    for j in range(blk.shape[0]):
        acc[j] += blk[j]
        blk[j] = 0


@_INLINE
def _flush2(blk, acc):
    for j in range(blk.shape[0]):
        for k in range(blk.shape[1]):
            acc[j, k] += blk[j, k]
            blk[j, k] = 0


@_INLINE
def _weight_parts(t, l, c, qlive):
    """``(exp(u), expm1(u))`` for ``u = t (l - c) <= 0`` with one transcendental.

    ``qlive``: the chunk is still in the small-tilt regime ``|t| (hi - lo) <= 1`` (then
    ``u >= -1`` and ``expm1(u) + 1`` is accurate); once it leaves it, so does the merged
    state, ``q`` is never read and only ``exp`` is taken.
    """
    if t == 0.0:
        return 1.0, 0.0  # the prior-weighted mean: no exponentials
    u = t * (l - c)
    if qlive:
        e1 = math.expm1(u)
        return e1 + 1.0, e1
    return math.exp(u), 0.0


# ---------------------------------------------------------------------------------------
# value, gradient and per-sample outputs (scalar-predictor losses)


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


# ---------------------------------------------------------------------------------------
# multinomial (theta of shape (d, K), integer labels)


@_INLINE
def _matvec_row(X, i, Th, zv):
    """``zv = X[i] @ Th`` for one row (rows of ``Th`` are contiguous: vectorised over K)."""
    K = Th.shape[1]
    for kk in range(K):
        zv[kk] = 0
    for j in range(X.shape[1]):
        xj = X[i, j]
        for kk in range(K):
            zv[kk] += xj * Th[j, kk]


@_JIT
def vg_multi(X, y, p, theta, t, n_chunks, want_grad, per_sample, state, G, out_l, out_s):
    """Multinomial chunk states and unnormalised gradients (``G`` of shape
    ``(n_chunks, d, K)``); per-sample losses and softmax rows when ``per_sample``."""
    n, d = X.shape
    K = theta.shape[1]
    has_p = p.shape[0] > 0
    for k in prange(n_chunks):
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
                du = t * (c - l)
                r = math.exp(du)
                q = mass * math.expm1(du) + q * r
                s = s * r
                lsum += mass * (c - l)
                c = l
                if t * (c - cg) > LAZY_LIMIT:
                    if want_grad:
                        _flush2(blk, acc)
                        f = math.exp(t * (cg - c))
                        for j in range(d):
                            for kk in range(K):
                                acc[j, kk] *= f
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
                f = math.exp(t * (cg - c))
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
def hvp_multi(X, y, p, theta, V, t, n_chunks, state, A, G):
    """Multinomial one-pass Hessian-vector product pieces (see :func:`hvp_scalar`), with
    the per-sample Hessian in ``z`` applied as ``s * u - s (s . u)``."""
    n, d = X.shape
    K = theta.shape[1]
    has_p = p.shape[0] > 0
    tilted = t != 0.0
    for k in prange(n_chunks):
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
                du = t * (c - l)
                r = math.exp(du)
                q = mass * math.expm1(du) + q * r
                s = s * r
                av = av * r
                lsum += mass * (c - l)
                c = l
                if t * (c - cg) > LAZY_LIMIT:
                    _flush2(blkA, accA)
                    _flush2(blkG, accG)
                    f = math.exp(t * (cg - c))
                    for j in range(d):
                        for kk in range(K):
                            accA[j, kk] *= f
                            accG[j, kk] *= f
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
            f = math.exp(t * (cg - c))
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
def linear_hvp_multi(X, w, D1, S, t, V, gv, n_chunks, A):
    """Multinomial linearised product: per row ``u = x @ V``,
    ``c = w (s*u - s (s.u) + t d1 (d1.u - gv))``, ``A += x c^T``."""
    n, d = X.shape
    K = V.shape[1]
    for k in prange(n_chunks):
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
