"""``tilted_risk`` and ``tilted_weights`` of one-dimensional CuPy losses as one-pass
reductions over the tilted state (``tilt.cuh``), and the extremes of a loss vector.

``tilted_state_blocks`` folds the losses into one state per block (each thread an online
state: a running shift, moved when a loss passes it, and the sums relative to it), and
``tilted_state_finish`` (one block) merges them and finishes the risk by the rule of
:mod:`tiltlab.accumulator` (the mean near ``t = 0``, ``log1p`` of the ``expm1`` sums
while ``|t| (hi - lo) <= 1``, the shifted log otherwise). The weights take one more
elementwise pass. No extreme is read on the host: a status written next to the result
says whether every loss was finite, and is read once when ``check_finite`` asks for it
(NaN and infinite losses then raise the library's error); with ``check_finite=False``
nothing is read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import check_finite as _check_finite
from . import source

__all__ = ["extremes", "tilted_risk", "tilted_weights"]

#: threads per block of the reductions (``TL_BLOCK_THREADS`` in kernels.cu)
BLOCK_THREADS = 256
#: the most blocks of the first stage (the finish merges their states in one block)
MAX_BLOCKS = 1024
FINISH_THREADS = 512


def _host_tilt(t: Any) -> float | None:
    """A finite non-zero Python/NumPy real tilt as a float, else None."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)):
        return None
    v = float(t)
    return v if v != 0.0 and math.isfinite(v) else None


def _served(losses: Any, t: Any, axis: int, weights: Any) -> float | None:
    try:
        import cupy
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(losses, cupy.ndarray) or losses.ndim != 1 or weights is not None:
        return None
    if axis not in (0, -1) or losses.shape[0] == 0:
        return None
    if losses.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    return _host_tilt(t)


def _state(l: Any, t: float) -> tuple[Any, Any, Any]:
    """The two launches of the reduction: ``(module, losses, out)``, ``out`` = (risk,
    status, shift, normaliser) on the device."""
    import cupy

    mod = source.module(source.reduction_source(l.dtype))
    n = int(l.shape[0])
    blocks = max(1, min(MAX_BLOCKS, -(-n // (BLOCK_THREADS * 8))))
    parts = cupy.empty((blocks, 7), dtype=l.dtype)
    out = cupy.empty(4, dtype=l.dtype)
    T = l.dtype.type
    tiny = math.sqrt(float(np.finfo(l.dtype).tiny))
    lc = cupy.ascontiguousarray(l)
    mod.get_function("tilted_state_blocks")(
        (blocks,), (BLOCK_THREADS,), (lc, cupy.int64(n), T(t), parts)
    )
    mod.get_function("tilted_state_finish")(
        (1,), (FINISH_THREADS,), (parts, cupy.int64(blocks), T(t), T(tiny), out)
    )
    return mod, lc, out


def _check(l: Any, out: Any, check: bool) -> None:
    """The one read (with ``check``): the status; non-finite losses raise the library's
    error (found again by its check, on this failing path only)."""
    if check and out[1:2].get()[0] != 0:
        import cupy

        _check_finite(l, cupy, name="losses", skip="check_finite=False")


def tilted_risk(
    losses: Any,
    t: Any,
    *,
    axis: int = -1,
    weights: Any = None,
    keepdims: bool = False,
    check_finite: bool = True,
) -> Any:
    """The tilted risk of 1-d CuPy losses at a finite non-zero host tilt (uniform prior),
    or None for every other case (the generic path serves it)."""
    tt = _served(losses, t, axis, weights)
    if tt is None:
        return None
    _, lc, out = _state(losses, tt)
    _check(lc, out, check_finite)
    r = out[0]
    return r.reshape(1) if keepdims else r


def tilted_weights(
    losses: Any, t: Any, *, axis: int = -1, weights: Any = None, check_finite: bool = True
) -> Any:
    """The tilted weights of 1-d CuPy losses at a finite non-zero host tilt (uniform
    prior), or None for every other case."""
    import cupy

    tt = _served(losses, t, axis, weights)
    if tt is None:
        return None
    mod, lc, out = _state(losses, tt)
    n = int(lc.shape[0])
    w = cupy.empty_like(lc)
    blocks = max(1, min(4 * MAX_BLOCKS, -(-n // BLOCK_THREADS)))
    mod.get_function("tilted_weights_apply")(
        (blocks,), (BLOCK_THREADS,), (lc, cupy.int64(n), lc.dtype.type(tt), out, w)
    )
    _check(lc, out, check_finite)
    return w


def _split(x: Any, k: int = 1024):
    """``x`` as (k, m) rows plus a tail: a reduction along the rows runs in k blocks."""
    n = x.shape[0]
    m = n // k
    if m < 256:
        return None, x
    return x[: m * k].reshape(k, m), x[m * k :]


def extremes(l: Any) -> tuple[float, float]:
    """(max, min) of a 1-d CuPy array, read to the host in one transfer."""
    import cupy

    head, tail = _split(l)
    if head is None:
        both = cupy.stack([l.max(), l.min()])
    else:
        parts = [head.max(axis=1), head.min(axis=1)]
        if tail.size:
            parts = [cupy.concatenate([parts[0], tail]), cupy.concatenate([parts[1], tail])]
        both = cupy.stack([parts[0].max(), parts[1].min()])
    hi, lo = (float(v) for v in both.get())
    return hi, lo
