"""Row-level helpers of the fused CPU kernels (imported lazily: this module imports numba).

Every kernel walks the rows of ``X`` in a fixed number of contiguous chunks (``prange``
over chunks, never over threads), reads each row once and writes one small state per
chunk; the caller merges the chunk states in a fixed order. The chunk split depends on
the number of rows and the chunk count only, so the results are the same bit for bit
whatever the number of threads.

Per chunk, the tilted state follows :mod:`tiltlab.accumulator`: an exact running shift
``c`` (the largest loss for ``t > 0``, the smallest for ``t <= 0``) with ``s``, ``q`` and
``lsum`` rescaled each time it moves (scalars: cheap; the scalar-loss kernels move it at
most once per block of rows, to the block's extreme, see :mod:`.block_steps`). The vector
accumulators (gradient, Hessian-vector product) are kept relative to a second, lazy shift
``cg`` that follows ``c`` only when the weights would otherwise exceed
``exp(LAZY_LIMIT)``: rows sorted by loss then cost one rescale of a ``d``-vector per
``LAZY_LIMIT / |t|`` of loss range, not one per row. Vector sums are taken in ``X``'s
dtype over sub-blocks of ``SUB_BLOCK`` rows (``FLUSH_ROWS`` in :mod:`.block_steps`) and added
into float64 accumulators (float32 input stays accurate over long chunks). Dot products
are taken in ``X``'s dtype (vectorised, see ``_DOT``); the scalar-loss kernels keep the
predictor, the loss, its derivatives and the weights in ``X``'s dtype too (see
:mod:`.block_steps`), the multinomial kernels in float64; the tilted state is float64.

The kernels themselves live in :mod:`._scalar` (scalar-predictor losses, in blocks of
rows with the vectorised steps of :mod:`.block_steps`) and :mod:`._multinomial` (row by
row). Without numba the same functions run as plain Python (slow; for tiny examples
only).

Numba checks only a kernel's own file when it reuses cached machine code; the helpers here
are inlined into kernels of other files, so :mod:`._cache` clears the cached kernels when
any source file of the package changes.
"""

from __future__ import annotations

import math

from ._state_steps import state_weight

try:  # pragma: no branch - the engine is only chosen when numba imports
    from ._cache import jit

    _JIT = jit(fastmath=False, nogil=True)
    _INLINE = jit(fastmath=False, inline="always")
    # The dot products alone may reassociate their sums (and nothing else: no NaN or inf
    # assumptions, no contraction) so that LLVM vectorises them. The order is fixed when
    # the kernel is compiled: results still do not depend on the number of threads.
    _DOT = jit(fastmath={"reassoc"}, nogil=True)
except ImportError:  # pragma: no cover - exercised where numba is absent

    def _JIT(f):
        return f

    def _INLINE(f):
        return f

    _DOT = _INLINE

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
    for j in range(acc.shape[0]):  # blk may be longer (padded, its padding 0)
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
    state, ``q`` is never read and only ``exp`` is taken (the state table's ``weight``).
    """
    if t == 0.0:
        return 1.0, 0.0  # the prior-weighted mean: no exponentials
    return state_weight(t, l, c, qlive)


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
