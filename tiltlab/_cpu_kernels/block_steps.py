"""Block steps of the scalar-predictor kernels (imported lazily: this module imports numba).

The kernels of :mod:`._scalar` walk each chunk of rows in blocks of about
``BLOCK_BYTES`` of ``X`` (:func:`block_rows`: the block stays in the core's cache between
its two reads, so ``X`` is read from memory once) and split the work on a block into
loops that LLVM vectorises:

1. the predictors ``z = X_blk theta`` (and ``u = X_blk v``), one vectorised dot product
   per row (:func:`dots`; rows of ``VBYTES`` to ``SHORT_BYTES`` bytes in whole vector
   registers, :mod:`._short`);
2. the loss and its derivatives for the whole block, branch-free, with the vectorisable
   ``exp``/``log1p`` of :mod:`._vmath` (:func:`._losses.loss_block`, generated from the
   table of :mod:`tiltlab.losses.table`);
3. the block's extremes and non-finite check (:func:`extremes`), after which the chunk's
   shift moves at most once per block, and the weights ``exp(t (l - c))`` (or their
   ``expm1``) for the whole block (:func:`weights_block`);
4. the block sums of the tilted state (:func:`sums`) and the rank-one updates
   ``acc += X_blk^T coef`` (:func:`axpy_rows`), again ``ROWS`` rows at a time; for rows
   of at most ``PREFETCH_ROW_BYTES`` the updates also prefetch the next block
   (:func:`ahead_rows`), so that ``X`` streams from memory while the block is worked on;
   rows of more than ``OVERLAP_ROW_BYTES`` take the next block's dot products in the
   same sweep as the updates (:func:`axpy_dots`), for the same reason;
   short rows (:func:`short_rows`) are updated in whole vector registers
   (:mod:`._short`), into accumulators padded to whole registers (:func:`padded_cols`).

A loop that LLVM is to vectorise must not test the prior inside an inlined ``exp``: it
does not split such a loop on the test (the body is too large to duplicate) and leaves
it scalar, so the weights and the Hessian-vector coefficients have loops of their own for
the uniform prior (at 1e6 x 20 the weights took a quarter of the time they took with the
test inside, measured with benchmarks/cpu_kernel_speed.py and copies of the kernel).

Steps 1-3 work in ``X``'s dtype: for float32 data the predictors, the losses, their
derivatives and the weights are float32 numbers computed in float32 arithmetic, with
the float32 ``exp``/``expm1``/``log1p`` of :mod:`._vmath32` (:func:`exp_t` and friends
pick the precision from the argument's type), so that a vector register holds 16 lanes
instead of 8 and the polynomials are half as long. The tilted state (the shift, the
sums ``s``, ``q`` and ``lsum``, the prior mass) and the vector accumulators stay in
float64, where the sum of many rows needs it; the shift is always one of the losses, so
it is exact in float32 and the weights ``exp(t (l - c))`` of a block and the state's
rescaling agree. Against float64 arithmetic this costs about one float32 rounding per
loss and weight (relative 1e-7, the size of the rounding of the float32 dot product
itself).

On the CPUs of :data:`WIDE_CPUS` (AVX-512 without a large clock penalty) the loss,
extremes and weight loops ask LLVM for 512-bit vectors (:func:`wide_vectors`), which
LLVM's cost model does not choose there by itself; they are elementwise loops
and the extremes, so their results are the same numbers either way (the block's prior
mass, a sum whose order the vector width would change, keeps 256-bit vectors).

Only the dot products and the block sums may reassociate their additions
(``fastmath={"reassoc"}``: no NaN/inf assumptions, so IEEE semantics otherwise hold, NaN
included); the dot products and the rank-one updates also contract their multiplications
and additions into fused multiply-adds (one rounding instead of two; at 2e4 x 1000
float64 a block in cache took a third less time for either); the order is fixed at
compile time, so results do not depend on the number of threads. The block extremes are
taken with ``{"nnan", "ninf"}`` (for the uniform prior with LLVM's ``maxnum`` and
``minnum``, flagged without NaN or signed zeros, so that the reductions vectorise: at
d = 20 a block's extremes took 0.3 ns a row instead of 1.6) only after a NaN-propagating
sum has shown that every loss on the support is finite. The ``exp``, ``expm1`` and ``log1p`` of the
losses and weights come from :mod:`._typed_math` (multiply-adds contracted). Everything
else is compiled without fastmath.

The steps taken once per block (the loss, extremes, weights and update loops) are
compiled once per signature and linked into every kernel that calls them, where LLVM
inlines them (numba's own inlining would type their bodies again in every kernel); the
small helpers and the scalar functions of the loops' bodies are inlined by numba.
Numba checks only a kernel's own file when it reuses cached machine code; the helpers here
are compiled into kernels of other files, so :mod:`._cache` clears the cached kernels when
any source file of the package changes.
"""

from __future__ import annotations

import numpy as np

from ._rows import _flush
from ._short import (
    SHORT_BYTES,
    VBYTES,
    vaxpy2x2,
    vaxpy2x4,
    vaxpy4,
    vdot,
    vdot2,
    vdot2x4,
    vdot4,
)
from ._state_steps import state_fold, state_weight_t

try:  # pragma: no branch - the engine is only chosen when numba imports
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from ._cache import jit

    @intrinsic
    def _prefetch(typingctx, arr, offset):
        """Prefetch the cache line at byte ``offset`` of the array's data (LLVM's
        ``llvm.prefetch``: a hint, which does not fault at any address)."""
        if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
            return None
        sig = types.void(arr, types.intp)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i8p = ir.IntType(8).as_pointer()
            ptr = builder.gep(builder.bitcast(ary.data, i8p), [args[1]])
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            # the name without the pointer type's suffix: LLVM renames it to the one its
            # pointers need (p0i8 with typed pointers, p0 with opaque ones)
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch")
            builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, all cache levels, data
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def wide_vectors(typingctx):
        """Let LLVM's loop vectoriser use 512-bit vectors in the calling function where the
        target CPU is one of :data:`WIDE_CPUS` (the function attribute
        ``"prefer-vector-width"="512"``; elsewhere nothing)."""

        def codegen(context, builder, signature, args):
            if _target_cpu() in WIDE_CPUS:
                # llvmlite names only LLVM's enumerated attributes; a string attribute is
                # written as given
                set.add(builder.function.attributes, '"prefer-vector-width"="512"')
            return context.get_dummy_value()

        return types.void(), codegen

    def _minmax(name):
        @intrinsic
        def minmax(typingctx, a, b):
            """LLVM's ``llvm.NAME`` on two floats of one type, flagged without NaN or
            signed zeros (so that LLVM vectorises a reduction over them: the callers
            have checked that the numbers are finite)."""
            if not isinstance(a, types.Float) or a != b:
                return None

            def codegen(context, builder, signature, args):
                ty = context.get_value_type(signature.return_type)
                fnty = ir.FunctionType(ty, [ty, ty])
                suffix = "f32" if a.bitwidth == 32 else "f64"
                fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.{name}.{suffix}")
                return builder.call(fn, args, fastmath=("nnan", "nsz"))

            return a(a, b), codegen

        return minmax

    _fmax = _minmax("maxnum")
    _fmin = _minmax("minnum")

    _INLINE = jit(fastmath=False, error_model="numpy", inline="always")
    #: the steps taken once per block (the loss, extremes, weights and update loops):
    #: compiled once per signature and linked into each kernel that calls them, where
    #: LLVM inlines them; inlined by numba instead (its ``inline="always"``, which types
    #: the body again at every call site), the cold compile of the kernels took a fifth
    #: more time, for the same machine code speed (benchmarks/cpu_kernel_speed.py)
    _STEP = jit(fastmath=False, error_model="numpy", nogil=True)
    _REASSOC = jit(fastmath={"reassoc"}, error_model="numpy", nogil=True)
    _FMA = jit(fastmath={"reassoc", "contract"}, error_model="numpy", nogil=True)
    _CONTRACT = jit(fastmath={"contract"}, error_model="numpy", nogil=True)
    _FINITE = jit(fastmath={"nnan", "ninf"}, error_model="numpy", nogil=True)
    #: the kernels: chunks ``k0 <= k < k1``, without the GIL (threads run disjoint chunk
    #: ranges at once, see the package); IEEE division (no zero checks that would stop the
    #: vectorisation of the inlined block loops)
    KERNEL = jit(fastmath=False, error_model="numpy", nogil=True)
except ImportError:  # pragma: no cover - exercised where numba is absent

    def _INLINE(f):
        return f

    def _prefetch(arr, offset):
        return None

    def wide_vectors():
        return None

    _fmax = max
    _fmin = min

    _STEP = _REASSOC = _FINITE = _FMA = _CONTRACT = _INLINE
    KERNEL = _INLINE

#: LLVM target CPUs on which the loss, extremes and weight loops use 512-bit vectors
#: (:func:`wide_vectors`): they have AVX-512, LLVM's cost model prefers 256-bit vectors on
#: them by default, and they run 512-bit arithmetic without the large clock reductions of
#: the first AVX-512 CPUs (Skylake, Cascade Lake and Cooper Lake are left out, unmeasured).
#: On an Emerald Rapids core, value and gradient at 1e6 x 20 took 1.45 matvecs against
#: 1.56 (logistic, float64; float32 1.38 against 1.47) and 1.66 against 1.93 (Poisson;
#: float32 1.72 against 1.91); the squared loss and 2e5 x 100 within the noise
#: (benchmarks/cpu_kernel_speed.py --threads 1 --cpu-time, side by side)
WIDE_CPUS = frozenset(
    {
        "icelake-client",
        "icelake-server",
        "tigerlake",
        "rocketlake",
        "sapphirerapids",
        "emeraldrapids",
        "graniterapids",
        "graniterapids-d",
    }
)


def _target_cpu():
    """The CPU numba compiles for: ``NUMBA_CPU_NAME`` if set (other than ``host``), else
    the host's."""
    from llvmlite import binding
    from numba.core import config

    name = config.CPU_NAME
    return name if name and name != "host" else binding.get_host_cpu_name()


#: most rows per block (2048: at d = 20 a float32 block of 1632 rows, 128 KiB, spreads
#: the per-block work over three times as many rows as 512 did: 5-9% less time)
BLOCK = 2048
#: rows whose rank-one updates are summed in X's dtype before they are added into the
#: float64 accumulators (the rounding of a float32 sum grows with its length)
FLUSH_ROWS = 512
#: bytes of X per block (it stays in the L2 cache between the dot products and the
#: updates; larger blocks spread the per-block work over more rows: 128 KiB measured best
#: of 16-128 KiB with benchmarks/cpu_kernel_speed.py)
BLOCK_BYTES = 131072
_DBL_MAX = 1.7976931348623157e308
_FLT_MAX = 3.4028234663852886e38
#: fewest rows per block while the block stays within 4 * BLOCK_BYTES: the loss and weight
#: loops of a block vectorise over its rows (16 float32 lanes, unrolled 4 times: 64), and
#: 32-row blocks of long float32 rows ran them as scalar remainders (2e4 x 1000 float32:
#: 0.1 matvecs slower; 64-row blocks, 256-512 KiB, made d = 1000 8% faster in both dtypes)
MIN_BLOCK = 64
#: rows whose updates are taken together
ROWS = 4
#: rows of at least this many entries (and longer than short rows) take their dot
#: products four rows at a time, each load of ``v`` serving four rows: value and gradient
#: at 2e4 x 1000 1.56-1.69 matvecs against 2.12-2.17 one row at a time, at 2e5 x 100
#: 1.41-1.56 against 1.51-1.61 (one thread, side by side)
LONG_ROW = 64
#: rows of at most this many bytes have the next block prefetched during the rank-one
#: updates of the current one (:func:`ahead_rows`): 2e5 x 100 (800 and 400 bytes) value
#: and gradient 1.37-1.61 matvecs against 1.57-1.87 without (one thread, side by side);
#: 8000-byte rows were within the noise either way
PREFETCH_ROW_BYTES = 1024
#: rows of more than this many bytes have the next block's dot products taken in the
#: sweep of the current block's rank-one updates (:func:`axpy_dots`): at 1600-byte rows
#: (1e5 x 200 float64, 5e4 x 400 float32) value and gradient took 1.46-1.55 matvecs
#: without against 1.60-1.77 with (one thread, side by side under load); from 2400-byte
#: rows on the overlap gains (2e4 x 1000, see :func:`axpy_dots`)
OVERLAP_ROW_BYTES = 2048


@_INLINE
def ahead_rows(d, itemsize, step):
    """How far ahead (in rows) the rank-one updates prefetch ``X``: one block (``step``
    rows) for rows of at most ``PREFETCH_ROW_BYTES``, else 0 (none).

    The loss, weight and update loops of a block take long while ``X`` does not stream; a
    prefetch of the next block's rows spread over the updates (a few lines per group of
    ``ROWS`` rows) lets memory and computation overlap. Rows of up to 1 KiB gain from it
    (measured with benchmarks/cpu_kernel_speed.py at 1e6 x 20 and 2e5 x 100); with
    rows of several KiB the prefetches compete with the updates' reads from L2 for the
    line-fill buffers, and no gain was measured."""
    return step if d * itemsize <= PREFETCH_ROW_BYTES else 0


@_INLINE
def _prefetch_rows(X, i, rows, end):
    """Prefetch the rows ``[i, min(i + rows, end))`` of the C-contiguous ``X`` (one hint
    per 64-byte line)."""
    row = X.shape[1] * X.itemsize
    a = i * row
    b = min(i + rows, end) * row
    for off in range(a - a % 64, b, 64):
        _prefetch(X, off)


@_INLINE
def short_rows(X):
    """Whether the rows of ``X`` take the whole-register code of :mod:`._short`:
    C-contiguous rows of ``VBYTES`` to ``SHORT_BYTES`` bytes."""
    row = X.shape[1] * X.itemsize
    return VBYTES <= row <= SHORT_BYTES and X.strides[1] == X.itemsize and X.strides[0] == row


@_INLINE
def padded_cols(d, itemsize):
    """Length of a vector accumulator of ``d`` entries for :func:`axpy_rows`: for short
    rows ``d`` rounded up to whole chunks of ``VBYTES`` (the chunks of :mod:`._short`
    update it whole; the padding stays 0), else ``d``."""
    if d * itemsize > SHORT_BYTES:
        return d
    w = VBYTES // itemsize
    return (d + w - 1) // w * w


@_INLINE
def block_rows(d, itemsize):
    """Rows per block: a block of ``X`` of about ``BLOCK_BYTES`` (it stays in cache between
    its two reads), but at least ``MIN_BLOCK`` rows while that stays within
    ``4 * BLOCK_BYTES``; a multiple of 8 rows in ``[8, BLOCK]``; depends on ``d`` and the
    dtype only (never on threads)."""
    row = d * itemsize
    rows = (BLOCK_BYTES // row) // 8 * 8
    rows = max(rows, min(MIN_BLOCK, (4 * BLOCK_BYTES // row) // 8 * 8))
    return max(8, min(BLOCK, rows))


@_FMA
def dots(X, i0, nb, v, out, zero):
    """``out[b] = X[i0 + b] . v`` for ``b < nb`` (in ``X``'s dtype). Short rows in whole
    registers (:mod:`._short`), four rows side by side from ``2 W`` entries on (``W``
    numbers a register: at ``d = 20`` 4-9% less time at 1e6 x 20 than one row at a time
    in registers); longer rows in LLVM's loops, four rows at a time from ``LONG_ROW``
    entries on (each load of ``v`` then serves four rows), the remainder one at a time."""
    d = X.shape[1]
    if short_rows(X):
        b = 0
        if d > 2 * (VBYTES // X.itemsize):  # four rows side by side
            while b + 4 <= nb:
                a0, a1, a2, a3 = vdot4(X, i0 + b, v)
                out[b] = a0
                out[b + 1] = a1
                out[b + 2] = a2
                out[b + 3] = a3
                b += 4
        while b < nb:
            out[b] = vdot(X, i0 + b, v)
            b += 1
        return
    b = 0
    if d >= LONG_ROW:  # four long rows share each load of v
        while b + 4 <= nb:
            i = i0 + b
            a0 = zero
            a1 = zero
            a2 = zero
            a3 = zero
            for j in range(d):
                vj = v[j]
                a0 += X[i, j] * vj
                a1 += X[i + 1, j] * vj
                a2 += X[i + 2, j] * vj
                a3 += X[i + 3, j] * vj
            out[b] = a0
            out[b + 1] = a1
            out[b + 2] = a2
            out[b + 3] = a3
            b += 4
    while b < nb:
        i = i0 + b
        a = zero
        for j in range(d):
            a += X[i, j] * v[j]
        out[b] = a
        b += 1


@_FMA
def dots2(X, i0, nb, v, w, out_v, out_w, zero):
    """:func:`dots` along two vectors in one sweep over the block (short rows four side by
    side from ``2 W`` entries on, as there); other rows two at a time (four sums in one
    sweep: each is vectorised and added in the same order as alone; at 2e5 x 100 float64
    the one-pass Hessian-vector product takes 20% less time, at 2e4 x 1000 7-17%)."""
    d = X.shape[1]
    b = 0
    if short_rows(X):
        if d > 2 * (VBYTES // X.itemsize):  # four rows side by side, as in dots
            while b + 4 <= nb:
                a0, a1, a2, a3, c0, c1, c2, c3 = vdot2x4(X, i0 + b, v, w)
                out_v[b] = a0
                out_v[b + 1] = a1
                out_v[b + 2] = a2
                out_v[b + 3] = a3
                out_w[b] = c0
                out_w[b + 1] = c1
                out_w[b + 2] = c2
                out_w[b + 3] = c3
                b += 4
        while b < nb:
            a, c = vdot2(X, i0 + b, v, w)
            out_v[b] = a
            out_w[b] = c
            b += 1
        return
    while b + 2 <= nb:
        i = i0 + b
        a0 = zero
        a1 = zero
        c0 = zero
        c1 = zero
        for j in range(d):
            x0 = X[i, j]
            x1 = X[i + 1, j]
            a0 += x0 * v[j]
            a1 += x1 * v[j]
            c0 += x0 * w[j]
            c1 += x1 * w[j]
        out_v[b] = a0
        out_v[b + 1] = a1
        out_w[b] = c0
        out_w[b + 1] = c1
        b += 2
    while b < nb:
        i = i0 + b
        a = zero
        c = zero
        for j in range(d):
            x = X[i, j]
            a += x * v[j]
            c += x * w[j]
        out_v[b] = a
        out_w[b] = c
        b += 1


@_STEP
def axpy_rows(X, i0, nb, coef, blk, acc, ahead, end):
    """``acc += sum_b coef[b] X[i0 + b]``, summed in ``X``'s dtype in ``blk`` (zero on
    entry and exit) over ``FLUSH_ROWS`` rows at a time, then added into ``acc``; with
    ``ahead > 0`` the rows ``ahead`` further on (below ``end``) are prefetched meanwhile."""
    for s0 in range(0, nb, FLUSH_ROWS):
        _axpy(X, i0 + s0, min(FLUSH_ROWS, nb - s0), coef, s0, blk, ahead, end)
        _flush(blk, acc)


@_INLINE
def overlaps(d, itemsize):
    """Whether the rank-one updates of a block take the next block's dot products along
    (:func:`axpy_dots`): rows of more than ``OVERLAP_ROW_BYTES`` (not short, not
    prefetched, blocks of at most ``FLUSH_ROWS`` rows)."""
    return d * itemsize > OVERLAP_ROW_BYTES


@_FMA
def axpy_dots(X, i0, nb, coef, blk, j0, nj, v, out, zero):
    """``blk += sum_b coef[b] X[i0 + b]`` for ``b < nb <= FLUSH_ROWS`` (in ``X``'s dtype)
    and ``out[b] = X[j0 + b] . v`` for ``b < nj`` (the next block's predictors), four rows
    of each in one sweep over the columns: the next block streams from memory while the
    current one, in cache, is updated (rather than one after the other; at 2e4 x 1000
    float64 value and gradient took 1.31-1.48 matvecs against 1.33-1.78, float32 1.54-1.75
    against 1.61-1.76, one thread, side by side under load). The rows past the last
    group of four of either block take :func:`dots` and :func:`_axpy`."""
    d = X.shape[1]
    g = min(nb, nj) // 4 * 4
    for b in range(0, g, 4):
        i = i0 + b
        k = j0 + b
        c0 = coef[b]
        c1 = coef[b + 1]
        c2 = coef[b + 2]
        c3 = coef[b + 3]
        a0 = zero
        a1 = zero
        a2 = zero
        a3 = zero
        for j in range(d):
            vj = v[j]
            a0 += X[k, j] * vj
            a1 += X[k + 1, j] * vj
            a2 += X[k + 2, j] * vj
            a3 += X[k + 3, j] * vj
            blk[j] += (c0 * X[i, j] + c1 * X[i + 1, j]) + (c2 * X[i + 2, j] + c3 * X[i + 3, j])
        out[b] = a0
        out[b + 1] = a1
        out[b + 2] = a2
        out[b + 3] = a3
    if nj > g:
        dots(X, j0 + g, nj - g, v, out[g:], zero)
    if nb > g:  # the arguments typed as in axpy_rows's call (no literal: one compile)
        none = np.intp(0)
        _axpy(X, i0 + g, nb - g, coef, np.intp(g), blk, none, none)


@_STEP
def axpy2_rows(X, i0, nb, ca, cb, blk_a, blk_b, acc_a, acc_b, ahead, end):
    """:func:`axpy_rows` with two coefficient vectors in one sweep over the block."""
    for s0 in range(0, nb, FLUSH_ROWS):
        _axpy2(X, i0 + s0, min(FLUSH_ROWS, nb - s0), ca, cb, s0, blk_a, blk_b, ahead, end)
        _flush(blk_a, acc_a)
        _flush(blk_b, acc_b)


@_CONTRACT
def _axpy(X, i0, nb, coef, c0_at, acc, ahead, end):
    """``acc += sum_b coef[c0_at + b] X[i0 + b]`` (elementwise over the columns:
    vectorised), ``ROWS`` rows at a time (prefetching the rows ``ahead`` further on)."""
    n, d = X.shape
    b = 0
    if short_rows(X):  # in whole registers (a loop of its own: the loop below unchanged)
        whole = d % (VBYTES // X.itemsize) == 0
        # the last chunk may read row i + ROWS: a group that ends X's rows goes below
        while b + ROWS <= nb and (whole or i0 + b + ROWS < n):
            i = i0 + b
            if ahead > 0:
                _prefetch_rows(X, i + ahead, ROWS, end)
            c = c0_at + b
            vaxpy4(X, i, coef[c], coef[c + 1], coef[c + 2], coef[c + 3], acc)
            b += ROWS
    while b + ROWS <= nb:
        i = i0 + b
        if ahead > 0:
            _prefetch_rows(X, i + ahead, ROWS, end)
        c0 = coef[c0_at + b]
        c1 = coef[c0_at + b + 1]
        c2 = coef[c0_at + b + 2]
        c3 = coef[c0_at + b + 3]
        for j in range(d):
            acc[j] += (c0 * X[i, j] + c1 * X[i + 1, j]) + (c2 * X[i + 2, j] + c3 * X[i + 3, j])
        b += ROWS
    while b < nb:
        i = i0 + b
        c0 = coef[c0_at + b]
        for j in range(d):
            acc[j] += c0 * X[i, j]
        b += 1


@_CONTRACT
def _axpy2(X, i0, nb, ca, cb, c0_at, acc_a, acc_b, ahead, end):
    """:func:`_axpy` with two coefficient vectors: short rows four at a time in whole
    registers (each chunk of ``X`` loaded once for both vectors, each accumulator chunk
    read and written once per four rows: at d = 20 float32 the updates of a block in
    cache took 40% less time than two rows at a time), then two at a time; other rows two
    at a time."""
    n, d = X.shape
    b = 0
    if short_rows(X):  # in whole registers (a loop of its own: the loop below unchanged)
        whole = d % (VBYTES // X.itemsize) == 0
        while b + ROWS <= nb and (whole or i0 + b + ROWS < n):  # may read row i + ROWS
            i = i0 + b
            if ahead > 0:
                _prefetch_rows(X, i + ahead, ROWS, end)
            c = c0_at + b
            vaxpy2x4(
                X, i, ca[c], ca[c + 1], ca[c + 2], ca[c + 3],
                cb[c], cb[c + 1], cb[c + 2], cb[c + 3], acc_a, acc_b,
            )  # fmt: skip
            b += ROWS
        while b + 2 <= nb and (whole or i0 + b + 2 < n):  # the last chunk may read row i + 2
            i = i0 + b
            if ahead > 0:
                _prefetch_rows(X, i + ahead, 2, end)
            c = c0_at + b
            vaxpy2x2(X, i, ca[c], ca[c + 1], cb[c], cb[c + 1], acc_a, acc_b)
            b += 2
    while b + 2 <= nb:
        i = i0 + b
        if ahead > 0:
            _prefetch_rows(X, i + ahead, 2, end)
        a0 = ca[c0_at + b]
        a1 = ca[c0_at + b + 1]
        b0 = cb[c0_at + b]
        b1 = cb[c0_at + b + 1]
        for j in range(d):
            x0 = X[i, j]
            x1 = X[i + 1, j]
            acc_a[j] += a0 * x0 + a1 * x1
            acc_b[j] += b0 * x0 + b1 * x1
        b += 2
    while b < nb:
        i = i0 + b
        a0 = ca[c0_at + b]
        b0 = cb[c0_at + b]
        for j in range(d):
            acc_a[j] += a0 * X[i, j]
            acc_b[j] += b0 * X[i, j]
        b += 1


@_STEP
def extremes(p, has_p, i0, nb, l, d1):
    """Largest and smallest loss of the block's rows on the prior's support, their prior
    mass, and whether any of them has a non-finite loss or derivative (the extremes are
    only meaningful when not)."""
    mass, probe = _mass_probe(p, has_p, i0, nb, l, d1)
    if probe != 0.0:  # NaN: a non-finite value on the support
        return np.inf, -np.inf, mass, 1
    hi, lo = _finite_extremes(p, has_p, i0, nb, l)
    return hi, lo, mass, 0


@_REASSOC
def _mass_probe(p, has_p, i0, nb, l, d1):
    """The block's prior mass, and ``sum (l - l) + (d1 - d1)`` over the support (in the
    losses' dtype): 0 when all are finite, NaN otherwise (NaN propagates under
    reassociation)."""
    zero = l.dtype.type(0.0)
    mass = 0.0
    probe = zero
    for b in range(nb):
        pb = p[i0 + b] if has_p else 1.0
        mass += pb
        probe += ((l[b] - l[b]) + (d1[b] - d1[b])) if pb > 0.0 else zero
    return mass, probe


@_FINITE
def _finite_extremes(p, has_p, i0, nb, l):
    """Largest and smallest ``l`` on the prior's support, all of them finite (checked by
    the caller: the function is compiled assuming no NaN or infinity, which lets LLVM
    vectorise the two reductions; rows off the support count as -+ the dtype's largest
    finite number). Compared in the losses' dtype (16 lanes for float32)."""
    wide_vectors()
    top = l.dtype.type(_FLT_MAX if l.itemsize == 4 else _DBL_MAX)
    hi = -top
    lo = top
    if not has_p:  # vectorised (LLVM's maxnum/minnum)
        for b in range(nb):
            hi = _fmax(hi, l[b])
            lo = _fmin(lo, l[b])
        return hi, lo
    for b in range(nb):
        pb = p[i0 + b] if has_p else 1.0
        on = pb > 0.0
        lb = l[b]
        hi = max(hi, lb if on else -top)
        lo = min(lo, lb if on else top)
    return hi, lo


@_STEP
def weights_block(p, has_p, i0, nb, t, c, qlive, l, e, e1):
    """``e = exp(t (l - c))`` and, in the small-tilt regime, ``e1 = expm1(t (l - c))``
    (0 off the prior's support), in the dtype of the buffers: for float32 data ``t`` is
    rounded to float32 here, and ``c`` is one of the losses (exact in float32).

    The uniform prior has loops of its own: with the prior's test inside one loop, LLVM
    does not split the loop (its body, the inlined ``exp``, is too large to duplicate) and
    leaves it scalar (measured 3-4 times slower at 1e6 x 20)."""
    wide_vectors()
    zero = e.dtype.type(0.0)
    one = e.dtype.type(1.0)
    tt = e.dtype.type(t)
    cc = e.dtype.type(c)
    if t == 0.0:
        for b in range(nb):
            pb = p[i0 + b] if has_p else 1.0
            e[b] = one if pb > 0.0 else zero
            e1[b] = zero
    elif qlive and has_p:
        for b in range(nb):
            eb, m1 = state_weight_t(tt, l[b], cc, True)
            on = p[i0 + b] > 0.0
            e[b] = eb if on else zero
            e1[b] = m1 if on else zero
    elif qlive:
        for b in range(nb):
            e[b], e1[b] = state_weight_t(tt, l[b], cc, True)
    elif has_p:
        for b in range(nb):
            eb = state_weight_t(tt, l[b], cc, False)[0]
            e[b] = eb if p[i0 + b] > 0.0 else zero
            e1[b] = zero
    else:
        for b in range(nb):
            e[b] = state_weight_t(tt, l[b], cc, False)[0]
            e1[b] = zero


@_REASSOC
def sums(p, has_p, i0, nb, l, c, e, e1):
    """Block sums ``sum p e``, ``sum p e1`` and ``sum p (l - c)`` over the support."""
    s = 0.0
    q = 0.0
    lsum = 0.0
    for b in range(nb):
        pb = p[i0 + b] if has_p else 1.0
        on = pb > 0.0  # e, e1 are 0 off the support; l - c may not be finite there
        s, q, lsum = state_fold(pb, l[b] if on else c, c, e[b], e1[b], 0.0, s, q, lsum)[1:]
    return s, q, lsum


@_REASSOC
def wsum(p, has_p, i0, nb, e, a):
    """``sum p e a`` over the block (``e`` is 0 off the support)."""
    out = 0.0
    for b in range(nb):
        pb = p[i0 + b] if has_p else 1.0
        out += (pb * e[b]) * a[b] if e[b] != 0.0 else 0.0
    return out
