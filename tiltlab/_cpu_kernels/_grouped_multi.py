"""A fused kernel for per-group tilted states of the multinomial loss (imported lazily:
this module imports numba).

:func:`group_multi` is :func:`._grouped.group_scalar` for the multinomial loss
(``theta`` of shape ``(d, K)``, integer labels ``y``, the loss ``log sum_k exp(z_k) -
z_y`` of the predictor ``z = x theta``): it reads each row of ``X`` once and keeps one
tilted state per group with the same conventions (columns shift, hi, lo, mass, s, q,
lsum, non-finite flag, av; an exact running shift per group, ``q`` kept for every group).

The vector sums are ``G x d x K`` float64 accumulators (each row's outer product added to
its group's entry): the gradient ``sum pe x d1^T`` with ``d1 = softmax(z) - onehot(y)``
(the loss's derivative in ``z``) and, for a Hessian-vector product along ``V`` (``u = x
V``, ``a = d1 . u``, ``hz = s * u - s (s . u)`` the per-sample Hessian in ``z`` applied to
``u``), ``sum pe x (hz + t a d1)^T``, ``sum pe x d1^T`` and ``av = sum pe a`` (state
column 8): the sums of :func:`tiltlab.objective.blocks.hvp_coefficients`. As in
:mod:`._rows`, each group's vector sums follow a lazy second shift and are brought to the
exact shift at the end.

The predictors ``x theta`` (and ``x V``) are taken in ``X``'s dtype with the row helpers
of :mod:`._rows` (as :func:`._multinomial.vg_multi`); the softmax, the loss, the
derivatives and the fold into the group's state are float64. The rows are walked in order
by one thread (a Dask chunk is one task): the result does not depend on the number of
threads.
"""

from __future__ import annotations

import math

import numpy as np

from ._grouped import fold_loss
from ._rows import _INLINE, _JIT, _matvec_row, _softmax_row
from ._state_steps import state_factor


@_INLINE
def _scale(A, B, g, f, both):
    """``A[g] *= f`` (and ``B[g]`` with ``both``)."""
    d, K = A.shape[1], A.shape[2]
    for j in range(d):
        for kk in range(K):
            A[g, j, kk] *= f
    if both:
        for j in range(d):
            for kk in range(K):
                B[g, j, kk] *= f


@_JIT
def group_multi(X, y, p, codes, theta, v, t, want_grad, want_hvp, state, A, B, k0, k1):
    """Per-group multinomial states (``state``: ``G x 9``, zeros on entry) and sums (zeros
    on entry): ``A`` (``G x d x K``) the gradient sums (or the first Hessian-product sums
    with ``want_hvp``), ``B`` (``G x d x K``) the second Hessian-product sums (any 3-d
    shape unless ``want_hvp``; ``A`` too without vectors). A non-finite loss on the
    support sets the flag (column 7) of its group and stops the pass.
    ``k0, k1`` are the launcher's chunk range (one chunk: the whole of ``X``)."""
    n, d = X.shape
    K = theta.shape[1]
    G = state.shape[0]
    has_p = p.shape[0] > 0
    zv = np.zeros(K, dtype=X.dtype)
    uv = np.zeros(K, dtype=X.dtype)
    z = np.zeros(K)
    sm = np.zeros(K)
    d1 = np.zeros(K)
    ca = np.zeros(K)
    cb = np.zeros(K)
    cg = np.zeros(G)  # the lazy shift of each group's vector sums
    rg = np.ones(G)  # exp(t (shift - cg))
    vectors = want_grad or want_hvp
    for i in range(n):
        pi = p[i] if has_p else 1.0
        if not pi > 0.0:
            continue
        _matvec_row(X, i, theta, zv)
        for kk in range(K):
            z[kk] = zv[kk]
        yi = int(y[i])
        lo_, oth = _softmax_row(z, yi, sm)
        g = codes[i]
        st = state[g]
        if not math.isfinite(lo_):
            st[7] = 1.0
            return
        pe, f = fold_loss(st, lo_, pi, t, cg, rg, g, vectors)
        if f != 1.0:  # the group's vector sums move to its shift
            _scale(A, B, g, f, want_hvp)
        if not vectors:
            continue
        for kk in range(K):
            d1[kk] = sm[kk]
        d1[yi] = -oth  # sm[y] - 1, without the cancellation
        w = pe * rg[g]  # p exp(t (l - cg))
        if want_hvp:
            _matvec_row(X, i, v, uv)
            su = 0.0
            a = 0.0
            for kk in range(K):
                su += sm[kk] * np.float64(uv[kk])
                a += d1[kk] * np.float64(uv[kk])
            st[8] += pe * a
            for kk in range(K):
                hz = sm[kk] * np.float64(uv[kk]) - sm[kk] * su
                ca[kk] = w * (hz + t * a * d1[kk])
                cb[kk] = w * d1[kk]
            for j in range(d):
                xj = np.float64(X[i, j])
                for kk in range(K):
                    A[g, j, kk] += xj * ca[kk]
                    B[g, j, kk] += xj * cb[kk]
        else:
            for kk in range(K):
                cb[kk] = w * d1[kk]
            for j in range(d):
                xj = np.float64(X[i, j])
                for kk in range(K):
                    A[g, j, kk] += xj * cb[kk]
    if vectors:
        for g in range(G):
            if state[g, 3] > 0.0 and cg[g] != state[g, 0]:
                _scale(A, B, g, state_factor(t, cg[g], state[g, 0]), want_hvp)
