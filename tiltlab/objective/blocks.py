"""Pieces of a blocked evaluation that every engine shares (the eager one-pass engine and the
per-chunk work of the Dask engine): the block-size policy, the per-sample coefficients of a
block's Hessian-vector product, and the accumulator state of a block at zero tilt.
"""

from __future__ import annotations

from typing import Any

from .._compat import on_accelerator
from ..accumulator import mean_state

__all__ = ["BLOCK_BYTES", "block_rows", "hvp_coefficients", "itemsize", "mean_state"]

#: target size in bytes of one block of rows of ``X`` on CPU backends. Measured on a
#: 2-core machine under load (benchmarks/engine_speed.py), cache-sized blocks
#: (256 KiB - 2 MiB) lost to per-block overhead; 32 MiB blocks bound the temporaries
#: and cost no more than one block.
BLOCK_BYTES = 1 << 25


def itemsize(dtype: Any, xp: Any) -> int:
    """Bytes per element of a floating ``dtype`` of ``xp``."""
    try:
        return int(xp.finfo(dtype).bits) // 8
    except Exception:  # pragma: no cover - non-float dtypes
        return 8


def block_rows(
    n: int, d: int, dtype: Any, xp: Any, dev: Any, *, target_bytes: int = BLOCK_BYTES
) -> int:
    """Rows of an ``n x d`` matrix per block: about ``target_bytes`` of it (at least 256
    rows) on CPU backends, all of it on a GPU (whose kernels block internally).

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> block_rows(10_000, 100, xp.float64, xp, "cpu", target_bytes=80_000)
    256
    >>> block_rows(10, 100, xp.float64, xp, "cpu")
    10
    """
    n = max(int(n), 1)
    if on_accelerator(xp, dev):
        return n
    row = max(int(d), 1) * itemsize(dtype, xp)
    return min(n, max(256, int(target_bytes) // row))


def hvp_coefficients(pe: Any, d1: Any, d2: Any, u: Any, a: Any, hz: Any, t: float):
    """Per-sample coefficients of a block's Hessian-vector product pieces.

    With unnormalised tilted weights ``pe``, loss derivatives ``d1``/``d2`` in the
    predictor (``hz``: the multinomial loss's per-sample Hessian applied to ``u``, else
    None), the direction's predictor ``u = X v`` and ``a = l' . u``, returns ``(c, g)``
    such that ``X^T c`` sums ``w (l'' u + t l' a)`` and ``X^T g`` sums ``w l'``; the
    Hessian-vector product is ``X^T c / s - t (X^T g / s)(sum w a / s)``.
    """
    if hz is not None:  # multinomial: (n, K) coefficients
        c = pe[:, None] * hz
        if t != 0.0:
            c = c + (t * pe * a)[:, None] * d1
        return c, pe[:, None] * d1
    c = pe * (d2 * u + t * d1 * a) if t != 0.0 else pe * d2 * u
    return c, pe * d1
