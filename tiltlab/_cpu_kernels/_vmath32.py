"""Branch-free ``exp``, ``expm1`` and ``log1p`` in float32 that LLVM vectorises (numba).

The float32 counterparts of :mod:`._vmath` for the kernels' float32 data: the same
algorithms (range reduction by ``ln 2`` with a two-part constant, a short Taylor
polynomial, the power of two built from its exponent bits; ``log1p`` through the
mantissa in ``[sqrt(2)/2, sqrt(2))`` and the series of ``2 atanh(s)``), with every
constant and every operation in float32, so that a vector register holds twice as many
lanes as in float64 and the polynomials are half as long (degree 8 for ``expm1`` on
``|r| <= ln(2)/2``: truncation below ``1e-9`` relative; four terms of the ``atanh``
series: below ``1e-8``).

The functions take and return float32 values (a float64 argument would promote the
arithmetic: callers convert first). ``k * LN2_HI_F`` is exact for ``|k| < 2**15`` (the
high part has 9 significant bits); arguments are clamped to ``+-150`` (``exp`` overflows
float32 above 88.73 and underflows below -103.98), so the power of two is built in two
factors whose exponents stay in the normal range. IEEE semantics otherwise hold as in
:mod:`._vmath`: NaN propagates, ``exp`` overflows to ``inf`` and underflows through the
subnormals to 0, ``log1p(-1) = -inf`` and ``log1p(x < -1) = NaN``. The errors against
NumPy's float32 functions stay within 2 units in the last place over the whole float32
range (tests/test_cpu_vmath32.py).
"""

from __future__ import annotations

import numpy as np

try:  # pragma: no branch - the kernels are only used when numba imports
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from ._cache import jit

    _INLINE = jit(fastmath=False, error_model="numpy", inline="always")

    @intrinsic
    def _as_float(typingctx, bits):
        """The float32 whose bit pattern is the low 32 bits of the integer ``bits``."""
        if not isinstance(bits, types.Integer):
            return None
        sig = types.float32(bits)

        def codegen(context, builder, signature, args):
            low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
            return builder.bitcast(low, ir.FloatType())

        return sig, codegen

    @intrinsic
    def _as_bits(typingctx, x):
        """The int32 bit pattern of the float32 ``x``."""
        if x != types.float32:
            return None
        sig = types.int32(types.float32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return sig, codegen

except ImportError:  # pragma: no cover - exercised where numba is absent
    import struct

    def _INLINE(f):
        return f

    def _as_float(bits):
        return np.float32(struct.unpack("<f", struct.pack("<I", int(bits) & 0xFFFFFFFF))[0])

    def _as_bits(x):
        return struct.unpack("<i", struct.pack("<f", float(x)))[0]


_F = np.float32
#: 1 / ln 2
INV_LN2_F = _F(1.4426950408889634)
#: ln 2 = LN2_HI_F + LN2_LO_F; LN2_HI_F = 355/512 has 9 significant bits
LN2_HI_F = _F(0.693359375)
LN2_LO_F = _F(-2.1219444005469057e-4)
#: 1.5 * 2**23: adding and subtracting it rounds a float32 of magnitude < 2**22
_ROUND_F = _F(12582912.0)
SQRT2_F = _F(1.4142135623730951)
#: arguments are clamped to +-_CLAMP_F (exp overflows / underflows well before)
_CLAMP_F = _F(150.0)
_FLT_MAX = _F(np.finfo(np.float32).max)
_INF_F = _F(np.inf)
_NAN_F = _F(np.nan)
_ZERO = _F(0.0)
_HALF = _F(0.5)
_ONE = _F(1.0)
_TWO = _F(2.0)
_MANT_F = (1 << 23) - 1
_ONE_BITS = 127 << 23
#: Taylor coefficients 1/k! (k = 3..8) and the atanh series 2/(2k+1) (k = 1..4)
_C3, _C4, _C5, _C6, _C7, _C8 = (_F(1.0 / f) for f in (6, 24, 120, 720, 5040, 40320))
_S1, _S2, _S3, _S4 = (_F(2.0 / m) for m in (3, 5, 7, 9))


@_INLINE
def _pow2f(k):
    """``2.0**k`` in float32 for an integer ``k`` in ``[-126, 127]``."""
    return _as_float((k + 127) << 23)


@_INLINE
def _expm1_reducedf(r):
    """``expm1(r)`` for ``|r| <= ln(2) / 2`` (Taylor to degree 8, by Estrin's scheme as in
    :mod:`._vmath`)."""
    r2 = r * r
    r4 = r2 * r2
    p = ((_HALF + r * _C3) + r2 * (_C4 + r * _C5)) + r4 * ((_C6 + r * _C7) + r2 * _C8)
    return r + r2 * p


@_INLINE
def _reducef(x):
    """``x = k ln 2 + r`` with ``|r| <= ln(2) / 2``: returns ``(k, r)`` (``x`` clamped)."""
    xc = min(max(x, -_CLAMP_F), _CLAMP_F)
    kf = (xc * INV_LN2_F + _ROUND_F) - _ROUND_F
    r = (xc - kf * LN2_HI_F) - kf * LN2_LO_F
    return np.int32(kf), r


@_INLINE
def vexpf(x):
    """``exp(x)`` (float32), vectorisable; NaN in, NaN out."""
    k, r = _reducef(x)
    k1 = k >> 1
    out = ((_expm1_reducedf(r) + _ONE) * _pow2f(k1)) * _pow2f(k - k1)
    return out if x == x else x


@_INLINE
def vexpm1f(x):
    """``expm1(x)`` (float32), vectorisable; accurate near 0 (``k = 0`` keeps ``r = x``)."""
    k, r = _reducef(x)
    em = _expm1_reducedf(r)
    kk = min(max(k, -24), 24)
    two = _pow2f(kk)
    near = two * em + (two - _ONE)  # 2^k - 1 is exact in float32 for |k| <= 24
    k1 = k >> 1
    far = ((em + _ONE) * _pow2f(k1)) * _pow2f(k - k1) - _ONE
    out = near if (k >= -24 and k <= 24) else far
    out = x if x == _ZERO else out  # keeps the sign of -0.0
    return out if x == x else x


@_INLINE
def _log1p_seriesf(f):
    """``log(1 + f)`` for ``f`` in ``[sqrt(2)/2 - 1, sqrt(2) - 1]`` (float32)."""
    s = f / (_TWO + f)
    z = s * s
    # R = 2 atanh(s) / s - 2 = sum_{k>=1} 2 z^k / (2k + 1), to z^4 (|z| <= 0.0295)
    p = _S4
    p = p * z + _S3
    p = p * z + _S2
    p = p * z + _S1
    big_r = p * z
    hfsq = _HALF * f * f
    return f - (hfsq - s * (hfsq + big_r))


@_INLINE
def vlog1pf(x):
    """``log1p(x)`` (float32), vectorisable; ``-inf`` at -1, NaN below, NaN in, NaN out."""
    u = _ONE + x
    uc = u if (u > _ZERO and u <= _FLT_MAX) else _ONE  # bit tricks on finite u > 0 only
    bits = _as_bits(uc)
    k = ((bits >> 23) & 255) - 127
    m = _as_float((bits & _MANT_F) | _ONE_BITS)  # in [1, 2)
    big = m > SQRT2_F
    m = _HALF * m if big else m
    k = k + 1 if big else k
    f = m - _ONE  # exact
    corr = (x - (u - _ONE)) / uc  # the rounding of 1 + x, relative to it
    kf = np.float32(k)
    out = kf * LN2_HI_F + (_log1p_seriesf(f) + (kf * LN2_LO_F + corr))
    out = x if x == _ZERO else out  # keeps the sign of -0.0
    out = u if u > _FLT_MAX else out  # inf
    out = -_INF_F if u == _ZERO else out
    out = _NAN_F if (u < _ZERO or x != x) else out
    return out


@_INLINE
def vlog1p_unitf(x):
    """``log1p(x)`` (float32) for ``0 <= x <= 1`` only (the softplus of a non-positive
    argument): no bit manipulation, and ``1 / (1 + x)`` shared with a caller that computes
    it too."""
    u = _ONE + x
    big = u > SQRT2_F
    f = (_HALF * u if big else u) - _ONE  # exact
    corr = (x - (u - _ONE)) * (_ONE / u)  # the rounding of 1 + x, relative to it
    kf = _ONE if big else _ZERO
    return kf * LN2_HI_F + (_log1p_seriesf(f) + (kf * LN2_LO_F + corr))
