"""The vectorisable ``exp``, ``expm1``, ``log1p`` and ``log`` in the precision of their
argument, as the kernels use them, and constants in that precision (:func:`like_t`)
(imported lazily: this module imports numba where it can).

:func:`exp_t`, :func:`expm1_t` and :func:`log1p_unit_t` take the float32 functions of
:mod:`._vmath32` for float32 arguments (:func:`log_t`: the float64 ``vlog`` rounded to
float32) and the float64 ones of :mod:`._vmath` otherwise
(plain Python where numba is absent). Compiled, they are overloads built with
``fastmath={"contract"}`` alone: their multiplications and additions fuse into
multiply-adds where the CPU has them (one rounding instead of two). No other fast-math
assumption is made, so IEEE semantics hold (NaN propagates, overflow gives infinity,
underflow goes through the subnormals), and the errors stay within the functions' bound
of two units in the last place (tests/test_cpu_vmath.py and tests/test_cpu_vmath32.py
run on both builds). At d = 20 the contraction halved the time of the float64 logistic
loss and of the weights of a block in cache (8.9 to 4.7 and 4.2 to 2.0 ns a row; float32
2.6 to 1.8 and 1.2 to 0.8).
"""

from __future__ import annotations

import numpy as np

from ._vmath import vexp, vexpm1, vlog, vlog1p_unit
from ._vmath32 import vexpf, vexpm1f, vlog1p_unitf


def exp_t(x):
    """``exp`` in the precision of ``x`` (:mod:`._vmath32` for float32)."""
    return vexpf(x) if isinstance(x, np.float32) else vexp(x)


def expm1_t(x):
    """``expm1`` in the precision of ``x``."""
    return vexpm1f(x) if isinstance(x, np.float32) else vexpm1(x)


def log_t(x):
    """``log`` in the precision of ``x``: float32 through the float64 :func:`vlog`, rounded
    once to float32 (there is no float32 one of its own)."""
    return np.float32(vlog(np.float64(x))) if isinstance(x, np.float32) else vlog(x)


def like_t(x, v):
    """The number ``v`` in the precision of ``x`` (float32 for a float32 ``x``)."""
    return np.float32(v) if isinstance(x, np.float32) else np.float64(v)


def _vlog_single(x):
    return np.float32(vlog(np.float64(x)))


def log1p_unit_t(x):
    """``log1p`` on ``[0, 1]`` in the precision of ``x``."""
    return vlog1p_unitf(x) if isinstance(x, np.float32) else vlog1p_unit(x)


try:  # pragma: no branch - the engine is only chosen when numba imports
    from numba import types
    from numba.extending import overload

    from ._cache import jit

    _INLINE_SINGLE = jit(fastmath=False, error_model="numpy", inline="always")

    def _typed(stub, f32, f64):
        """Compile ``stub`` as ``f32`` for float32 arguments and ``f64`` otherwise."""

        @overload(stub, jit_options={"fastmath": {"contract"}, "error_model": "numpy"})
        def _impl(x):
            if x == types.float32:

                def single(x):
                    return f32(x)

                return single

            def double(x):
                return f64(x)

            return double

    @overload(like_t, jit_options={"error_model": "numpy"})
    def _like_impl(x, v):
        if x == types.float32:
            return lambda x, v: np.float32(v)
        return lambda x, v: np.float64(v)

    _typed(exp_t, vexpf, vexp)
    _typed(expm1_t, vexpm1f, vexpm1)
    _typed(log1p_unit_t, vlog1p_unitf, vlog1p_unit)
    _typed(log_t, _INLINE_SINGLE(_vlog_single), vlog)
except ImportError:  # pragma: no cover - exercised where numba is absent
    pass
