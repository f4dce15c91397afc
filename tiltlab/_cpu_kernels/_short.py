"""Dot products and rank-one updates of short rows in whole vector registers (imported
lazily: this module imports numba).

LLVM's loop vectoriser takes 4 vectors of 4 float64 or 8 float32 at a time (16 or 32
columns) in its main loop; rows of fewer entries run in its narrower epilogue and scalar
remainder, with a loop and its checks per row (at d = 20 the float32 dot products of a
row ran as five 4-lane steps on one chain, the updates as two 8-lane steps and four scalar
ones). The functions here emit the vector code themselves (numba intrinsics, plain LLVM
vector instructions, no target-specific ones), one register width ``W`` at a time
(:func:`lanes`: 32 bytes, 8 float32 or 4 float64 numbers):

* :func:`vdot` / :func:`vdot2`: ``X[i] . v`` (and ``X[i] . w``) for ``W <= d``: the
  full chunks of ``W`` columns (a single vector: in two registers, even and odd chunks),
  then one chunk ending at column ``d``, whose lanes that
  the full chunks took are set to zero before the product (a select, so that the sum is
  that of the ``d`` products: no ``0 * inf``), then the ``W`` lanes summed pairwise;
* :func:`vdot4`: the dot products of 4 rows with one vector side by side, one register
  per row, the four reduced together (pairwise sums within 128-bit halves, the pattern
  of the ``hadd`` instructions, then the two halves added); :func:`vdot2x4` the same
  along two vectors in one sweep (each vector's four sums as :func:`vdot4`'s);
* :func:`vaxpy4` / :func:`vaxpy2x4` / :func:`vaxpy2x2`: the rank-one updates of 4 rows
  (4 or 2 rows with two coefficient vectors) into an accumulator padded to a whole number of chunks
  (:func:`padded`): the last chunk reads past the end of the rows, into the next row of
  ``X`` (the caller makes sure one exists, or that ``d`` is a multiple of ``W``), and its
  lanes past column ``d`` are set to zero before they are added, so the padding stays 0.
  Each entry is summed in the same order as by the scalar loops
  (``(c0 x0 + c1 x1) + (c2 x2 + c3 x3)``).

The order of every sum is fixed when the kernel is compiled (it depends on ``d`` and the
dtype only), so the results do not depend on the number of threads. ``X`` must be
C-contiguous (the kernels' ``X`` always is).
"""

from __future__ import annotations

#: bytes per vector chunk (AVX2's 256-bit registers; narrower targets split them)
VBYTES = 32
#: rows of at most this many bytes use the functions here (longer rows: LLVM's loops);
#: 2048 rather than 256: LLVM's loops leave a scalar remainder of each row (at d = 100
#: float32, 4 of the 100 columns after three steps of 32). Value and gradient at 2e5 x 100
#: (rows of 800 and 400 bytes) took 1.33-1.42 matvecs against 1.38-1.61 in LLVM's loops,
#: Hessian-vector products 1.42-1.53 against 1.55-1.78; at rows of 1600 bytes (1e5 x 200
#: float64, 5e4 x 400 float32) 1.38-1.50 against 1.46-1.60, products 1.70-1.85 against
#: 1.93-2.11; 0.01-0.15 less at rows of 320 to 1024 bytes (benchmarks/cpu_kernel_speed.py,
#: one thread, side by side, two runs each). Longer rows take the next block's dot
#: products along with the updates (block_steps.OVERLAP_ROW_BYTES, also 2048).
SHORT_BYTES = 2048
#: rows of up to this many whole chunks before the last (up to 256 bytes) have those
#: chunks in straight-line code, one case per count (:func:`_chunks`); longer rows loop
SWITCH_CHUNKS = 256 // VBYTES


def lanes(itemsize):
    """Numbers per chunk: 8 float32 or 4 float64."""
    return VBYTES // itemsize


def padded(d, itemsize):
    """``d`` rounded up to a whole number of chunks."""
    w = VBYTES // itemsize
    return (d + w - 1) // w * w


try:  # pragma: no branch - the engine is only chosen when numba imports
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _I32 = ir.IntType(32)
    _I8P = ir.IntType(8).as_pointer()

    def _info(context, aryty):
        elt = context.get_value_type(aryty.dtype)
        w = VBYTES * 8 // aryty.dtype.bitwidth
        return elt, w, ir.VectorType(elt, w)

    def _row(builder, ary, i, elt):
        """Pointer to ``X[i, 0]``."""
        s0 = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
        p = builder.gep(builder.bitcast(ary.data, _I8P), [builder.mul(i, s0)])
        return builder.bitcast(p, elt.as_pointer())

    def _load(builder, base, off, vty, align):
        p = builder.gep(base, [off])
        return builder.load(builder.bitcast(p, vty.as_pointer()), align=align)

    def _splat(builder, x, vty):
        v = builder.insert_element(ir.Constant(vty, ir.Undefined), x, _I32(0))
        return builder.shuffle_vector(
            v, v, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count)
        )

    def _lanes_ge(builder, w, r, intp):
        """Lane mask ``l >= r`` for ``l < w``."""
        vi = ir.VectorType(intp, w)
        idx = ir.Constant(vi, list(range(w)))
        return builder.icmp_signed(">=", idx, _splat(builder, r, vi))

    def _hsum(builder, acc, w):
        """Pairwise sum of the lanes: halves added until one is left."""
        while w > 1:
            h = w // 2
            vi = ir.VectorType(_I32, h)
            lo = builder.shuffle_vector(acc, acc, ir.Constant(vi, list(range(h))))
            hi = builder.shuffle_vector(acc, acc, ir.Constant(vi, list(range(h, w))))
            acc = builder.fadd(lo, hi)
            w = h
        return builder.extract_element(acc, _I32(0))

    def _chunks(builder, full, intp, body):
        """``body(j)`` for the full chunks ``j < full`` in order, with ``j`` a constant:
        a switch on ``full`` with one straight-line case per count up to
        ``SWITCH_CHUNKS - 1`` (rows of up to 256 bytes), so that the
        offsets are constants and no loop runs per row (with a loop, the dot products of a
        block in cache took 1.9 times as long at d = 20 float32, 2 times in float64: the
        loop's setup cost more than its two to five chunks of arithmetic); other counts
        take a loop."""
        after = builder.append_basic_block("chunks.after")
        fallback = builder.append_basic_block("chunks.loop")
        sw = builder.switch(full, fallback)
        for k in range(SWITCH_CHUNKS):
            case = builder.append_basic_block(f"chunks.{k}")
            sw.add_case(ir.Constant(intp, k), case)
            builder.position_at_end(case)
            for j in range(k):
                body(ir.Constant(intp, j))
            builder.branch(after)
        builder.position_at_end(fallback)
        with cgutils.for_range(builder, full) as loop:
            body(loop.index)
        builder.branch(after)
        builder.position_at_end(after)

    def _dots_ir(context, builder, xty, x, i, vecs):
        """Row ``i`` of ``x`` dotted with each 1-d array of ``vecs`` (values, types). One
        vector: the even full chunks summed in one register, the odd ones and the tail in
        another (two chains of additions), the two added; two vectors: one register each
        (two chains already). Then the lanes summed pairwise."""
        elt, w, vty = _info(context, xty)
        align = xty.dtype.bitwidth // 8
        intp = context.get_value_type(types.intp)
        xa = context.make_array(xty)(context, builder, x)
        d = cgutils.unpack_tuple(builder, xa.shape, 2)[1]
        row = _row(builder, xa, i, elt)
        bases = [context.make_array(t)(context, builder, a).data for a, t in vecs]
        zero = ir.Constant(vty, [0.0] * w)
        even = [cgutils.alloca_once_value(builder, zero) for _ in vecs]
        odd = [cgutils.alloca_once_value(builder, zero) for _ in vecs] if len(vecs) == 1 else even
        wc = ir.Constant(intp, w)
        one = ir.Constant(intp, 1)
        full = builder.sdiv(builder.sub(d, one), wc)  # chunks before the tail

        def add(accs, off, xv):
            for acc, base in zip(accs, bases, strict=True):
                prod = builder.fmul(xv, _load(builder, base, off, vty, align))
                builder.store(builder.fadd(builder.load(acc), prod), acc)

        def chunk(j):  # even chunks into one register, odd ones into the other
            off = builder.mul(j, wc)
            xv = _load(builder, row, off, vty, align)
            if isinstance(j, ir.Constant):
                add(odd if j.constant % 2 else even, off, xv)
                return
            with builder.if_else(builder.trunc(j, ir.IntType(1))) as (is_odd, is_even):
                with is_odd:
                    add(odd, off, xv)
                with is_even:
                    add(even, off, xv)

        _chunks(builder, full, intp, chunk)
        off = builder.sub(d, wc)
        taken = builder.sub(builder.mul(full, wc), off)  # lanes the full chunks took
        xv = builder.select(
            _lanes_ge(builder, w, taken, intp), _load(builder, row, off, vty, align), zero
        )
        add(odd, off, xv)
        if odd is even:
            return [_hsum(builder, builder.load(a), w) for a in even]
        return [
            _hsum(builder, builder.fadd(builder.load(a), builder.load(b)), w)
            for a, b in zip(even, odd, strict=True)
        ]

    def _dots4_ir(context, builder, xty, x, i, vecs):
        """Rows ``i .. i + 3`` of ``x`` dotted with each 1-d array of ``vecs`` (values,
        types): one register per row and vector, the four rows' sums of a vector reduced
        together (pairwise within the rows, the rows side by side). Returns the sums per
        vector, four each."""
        elt, w, vty = _info(context, xty)
        align = xty.dtype.bitwidth // 8
        intp = context.get_value_type(types.intp)
        xa = context.make_array(xty)(context, builder, x)
        d = cgutils.unpack_tuple(builder, xa.shape, 2)[1]
        rows = [_row(builder, xa, builder.add(i, ir.Constant(intp, r)), elt) for r in range(4)]
        bases = [context.make_array(t)(context, builder, a).data for a, t in vecs]
        zero = ir.Constant(vty, [0.0] * w)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(4)] for _ in vecs]
        wc = ir.Constant(intp, w)
        full = builder.sdiv(builder.sub(d, ir.Constant(intp, 1)), wc)

        def add(off, mask):
            xs = []
            for row in rows:
                xv = _load(builder, row, off, vty, align)
                xs.append(xv if mask is None else builder.select(mask, xv, zero))
            for base, vaccs in zip(bases, accs, strict=True):
                vv = _load(builder, base, off, vty, align)
                for acc, xv in zip(vaccs, xs, strict=True):
                    builder.store(builder.fadd(builder.load(acc), builder.fmul(xv, vv)), acc)

        _chunks(builder, full, intp, lambda j: add(builder.mul(j, wc), None))
        off = builder.sub(d, wc)
        taken = builder.sub(builder.mul(full, wc), off)
        add(off, _lanes_ge(builder, w, taken, intp))

        def hadd(p, q, n):  # in 128-bit halves: (p0+p1, q0+q1, p2+p3, q2+q3, ...) like vhadd
            m = 128 // xty.dtype.bitwidth  # lanes per 128 bits
            ev, od = [], []
            for h in range(0, n, m):
                for k in range(0, m, 2):
                    ev.append(h + k)
                    od.append(h + k + 1)
                for k in range(0, m, 2):
                    ev.append(n + h + k)
                    od.append(n + h + k + 1)
            vi = ir.VectorType(_I32, n)
            return builder.fadd(
                builder.shuffle_vector(p, q, ir.Constant(vi, ev)),
                builder.shuffle_vector(p, q, ir.Constant(vi, od)),
            )

        def reduce4(a):
            if w == 4:  # float64: [a0 01, a1 01, a0 23, a1 23], then the halves
                t0 = hadd(a[0], a[1], 4)
                t1 = hadd(a[2], a[3], 4)
                vi = ir.VectorType(_I32, 4)
                s = builder.fadd(
                    builder.shuffle_vector(t0, t1, ir.Constant(vi, [0, 1, 4, 5])),
                    builder.shuffle_vector(t0, t1, ir.Constant(vi, [2, 3, 6, 7])),
                )
            else:  # float32: two in-half pair sums, then the halves
                t0 = hadd(a[0], a[1], 8)
                t1 = hadd(a[2], a[3], 8)
                u = hadd(t0, t1, 8)
                vi = ir.VectorType(_I32, 4)
                s = builder.fadd(
                    builder.shuffle_vector(u, u, ir.Constant(vi, [0, 1, 2, 3])),
                    builder.shuffle_vector(u, u, ir.Constant(vi, [4, 5, 6, 7])),
                )
            return [builder.extract_element(s, _I32(r)) for r in range(4)]

        return [reduce4([builder.load(acc) for acc in vaccs]) for vaccs in accs]

    @intrinsic
    def vdot4(typingctx, X, i, v):
        """``(X[i] . v, ..., X[i + 3] . v)``: four rows side by side."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(v, types.Array)):
            return None
        tup = types.UniTuple(X.dtype, 4)
        sig = tup(X, types.intp, v)

        def codegen(context, builder, signature, args):
            vals = _dots4_ir(context, builder, X, args[0], args[1], [(args[2], v)])[0]
            return context.make_tuple(builder, tup, vals)

        return sig, codegen

    @intrinsic
    def vdot2x4(typingctx, X, i, v, w):
        """``(X[i] . v, ..., X[i + 3] . v, X[i] . w, ..., X[i + 3] . w)``: four rows side
        by side along two vectors in one sweep (each vector's sums as :func:`vdot4`'s)."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(v, types.Array)):
            return None
        tup = types.UniTuple(X.dtype, 8)
        sig = tup(X, types.intp, v, w)

        def codegen(context, builder, signature, args):
            sv, sw = _dots4_ir(
                context, builder, X, args[0], args[1], [(args[2], v), (args[3], w)]
            )
            return context.make_tuple(builder, tup, sv + sw)

        return sig, codegen

    @intrinsic
    def vdot(typingctx, X, i, v):
        """``X[i] . v`` in whole chunks (``W <= d``; see the module)."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(v, types.Array)):
            return None
        sig = X.dtype(X, types.intp, v)

        def codegen(context, builder, signature, args):
            return _dots_ir(context, builder, X, args[0], args[1], [(args[2], v)])[0]

        return sig, codegen

    @intrinsic
    def vdot2(typingctx, X, i, v, w):
        """``(X[i] . v, X[i] . w)`` in one sweep over the row."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(v, types.Array)):
            return None
        tup = types.UniTuple(X.dtype, 2)
        sig = tup(X, types.intp, v, w)

        def codegen(context, builder, signature, args):
            a, c = _dots_ir(context, builder, X, args[0], args[1], [(args[2], v), (args[3], w)])
            return context.make_tuple(builder, tup, [a, c])

        return sig, codegen

    def _axpy_ir(context, builder, xty, x, i, coefs, accs):
        """``acc_m[:d] += sum_r coefs[m][r] X[i + r]`` for each accumulator ``m`` (padded
        arrays), rows summed in the order ``((c0 x0 + c1 x1) + (c2 x2 + c3 x3))``."""
        elt, w, vty = _info(context, xty)
        align = xty.dtype.bitwidth // 8
        intp = context.get_value_type(types.intp)
        xa = context.make_array(xty)(context, builder, x)
        d = cgutils.unpack_tuple(builder, xa.shape, 2)[1]
        nrow = len(coefs[0])
        rows = [_row(builder, xa, builder.add(i, ir.Constant(intp, r)), elt) for r in range(nrow)]
        cs = [[_splat(builder, c, vty) for c in cm] for cm in coefs]
        bases = [context.make_array(t)(context, builder, a).data for a, t in accs]
        zero = ir.Constant(vty, [0.0] * w)
        wc = ir.Constant(intp, w)
        full = builder.sdiv(builder.sub(d, ir.Constant(intp, 1)), wc)

        def chunk(off, mask):
            xs = [_load(builder, r, off, vty, align) for r in rows]
            for cm, base in zip(cs, bases, strict=True):
                terms = [builder.fmul(c, xv) for c, xv in zip(cm, xs, strict=True)]
                while len(terms) > 1:  # pairwise: (t0 + t1) + (t2 + t3)
                    terms = [builder.fadd(terms[k], terms[k + 1]) for k in range(0, len(terms), 2)]
                s = terms[0] if mask is None else builder.select(mask, terms[0], zero)
                p = builder.bitcast(builder.gep(base, [off]), vty.as_pointer())
                builder.store(builder.fadd(builder.load(p, align=align), s), p, align=align)

        _chunks(builder, full, intp, lambda j: chunk(builder.mul(j, wc), None))
        off = builder.mul(full, wc)
        # lanes l < d - off are columns of the row; the others are set to zero
        vi = ir.VectorType(intp, w)
        idx = ir.Constant(vi, list(range(w)))
        mask = builder.icmp_signed("<", idx, _splat(builder, builder.sub(d, off), vi))
        chunk(off, mask)

    @intrinsic
    def vaxpy4(typingctx, X, i, c0, c1, c2, c3, acc):
        """``acc[:d] += c0 X[i] + ... + c3 X[i + 3]`` (``acc`` padded; row ``i + 4``
        must exist unless ``d`` is a multiple of ``W``)."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(acc, types.Array)):
            return None
        dt = X.dtype
        sig = types.void(X, types.intp, dt, dt, dt, dt, acc)

        def codegen(context, builder, signature, args):
            _axpy_ir(context, builder, X, args[0], args[1], [args[2:6]], [(args[6], acc)])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def vaxpy2x2(typingctx, X, i, a0, a1, b0, b1, acc_a, acc_b):
        """``acc_a[:d] += a0 X[i] + a1 X[i + 1]`` and ``acc_b[:d] += b0 X[i] + b1 X[i + 1]``
        (padded; row ``i + 2`` must exist unless ``d`` is a multiple of ``W``)."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(acc_a, types.Array)):
            return None
        dt = X.dtype
        sig = types.void(X, types.intp, dt, dt, dt, dt, acc_a, acc_b)

        def codegen(context, builder, signature, args):
            _axpy_ir(
                context,
                builder,
                X,
                args[0],
                args[1],
                [args[2:4], args[4:6]],
                [(args[6], acc_a), (args[7], acc_b)],
            )
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def vaxpy2x4(typingctx, X, i, a0, a1, a2, a3, b0, b1, b2, b3, acc_a, acc_b):
        """``acc_a[:d] += a0 X[i] + ... + a3 X[i + 3]`` and ``acc_b[:d] += b0 X[i] + ... +
        b3 X[i + 3]`` (padded; row ``i + 4`` must exist unless ``d`` is a multiple of
        ``W``): each chunk of the four rows loaded once for both, and each accumulator
        read and written once per four rows."""
        if not (isinstance(X, types.Array) and X.ndim == 2 and isinstance(acc_a, types.Array)):
            return None
        dt = X.dtype
        sig = types.void(X, types.intp, *([dt] * 8), acc_a, acc_b)

        def codegen(context, builder, signature, args):
            _axpy_ir(
                context,
                builder,
                X,
                args[0],
                args[1],
                [args[2:6], args[6:10]],
                [(args[10], acc_a), (args[11], acc_b)],
            )
            return context.get_dummy_value()

        return sig, codegen

except ImportError:  # pragma: no cover - exercised where numba is absent
    vdot = None  # replaced below by the plain-Python versions


# plain-Python versions (where numba is absent; the same sums, for tiny examples)
def vdot_py(X, i, v):
    """``X[i] . v`` (plain Python)."""
    s = X.dtype.type(0)
    for j in range(X.shape[1]):
        s += X[i, j] * v[j]
    return s


def vdot2_py(X, i, v, w):
    """``(X[i] . v, X[i] . w)`` (plain Python)."""
    return vdot_py(X, i, v), vdot_py(X, i, w)


def vdot4_py(X, i, v):
    """The dot products of rows ``i .. i + 3`` with ``v`` (plain Python)."""
    return tuple(vdot_py(X, i + r, v) for r in range(4))


def vdot2x4_py(X, i, v, w):
    """The dot products of rows ``i .. i + 3`` with ``v``, then with ``w`` (plain Python)."""
    a = vdot4_py(X, i, v)
    b = vdot4_py(X, i, w)
    return a + b


def vaxpy4_py(X, i, c0, c1, c2, c3, acc):
    """``acc[:d] += c0 X[i] + ... + c3 X[i + 3]`` in the order of the register code."""
    for j in range(X.shape[1]):
        acc[j] += (c0 * X[i, j] + c1 * X[i + 1, j]) + (c2 * X[i + 2, j] + c3 * X[i + 3, j])


def vaxpy2x2_py(X, i, a0, a1, b0, b1, acc_a, acc_b):
    """The two updates of :func:`vaxpy2x2` (plain Python)."""
    for j in range(X.shape[1]):
        acc_a[j] += a0 * X[i, j] + a1 * X[i + 1, j]
        acc_b[j] += b0 * X[i, j] + b1 * X[i + 1, j]


def vaxpy2x4_py(X, i, a0, a1, a2, a3, b0, b1, b2, b3, acc_a, acc_b):
    """The two updates of :func:`vaxpy2x4` in the order of the register code."""
    vaxpy4_py(X, i, a0, a1, a2, a3, acc_a)
    vaxpy4_py(X, i, b0, b1, b2, b3, acc_b)


if vdot is None:  # pragma: no cover - exercised where numba is absent
    vdot, vdot2, vdot4, vdot2x4 = vdot_py, vdot2_py, vdot4_py, vdot2x4_py
    vaxpy4, vaxpy2x2, vaxpy2x4 = vaxpy4_py, vaxpy2x2_py, vaxpy2x4_py
