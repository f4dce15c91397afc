"""Input checks of the fused CPU kernels.

:func:`_bind` validates the data once (what :class:`FusedProblem` keeps) and :func:`_at`
adds one ``theta`` and tilt. The chunk states a pass writes are merged by the rule of
:mod:`tiltlab.accumulator` (:meth:`._states.KernelStates.merged`, vectorised over the
chunks in a fixed order: the result does not depend on threads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._loss_codes import LABELS, PARAMS, SCALAR_CODES

#: losses served by the kernels, and their codes in the loops: the scalar losses of the
#: table (tiltlab/losses/table.py, generated into ._loss_codes) and the multinomial loss
LOSS_CODES = {**SCALAR_CODES, "multinomial": len(SCALAR_CODES)}

#: chunks: at least this many rows each, at most MAX_CHUNKS of them
CHUNK_ROWS = 512
MAX_CHUNKS = 128


def default_chunks(n: int) -> int:
    """Number of row chunks for ``n`` rows (a function of ``n`` only).

    Examples
    --------
    >>> from tiltlab._cpu_kernels import default_chunks
    >>> default_chunks(100), default_chunks(10_000), default_chunks(10**7)
    (1, 19, 128)
    """
    return int(min(MAX_CHUNKS, max(1, n // CHUNK_ROWS)))


# ---------------------------------------------------------------------------------------
# input checks


@dataclass(frozen=True)
class _Problem:
    loss: str
    code: int
    X: np.ndarray
    y: np.ndarray  # X's dtype (float64 class labels for the multinomial loss)
    p: np.ndarray  # empty: uniform prior
    theta: np.ndarray
    t: float
    param: float
    n_chunks: int


def _loss_name(loss: Any) -> str:
    if not isinstance(loss, str):
        raise TypeError(f"`loss` must be a loss name, got {type(loss).__name__}")
    key = loss.strip().lower().replace("-", "_")
    if key not in LOSS_CODES:
        raise ValueError(f"`loss`: the fused kernels serve {', '.join(LOSS_CODES)}; got {loss!r}")
    return key


def _bind(
    loss: Any, X: Any, y: Any, prior: Any, loss_params: Any, n_chunks: Any
) -> tuple[_Problem, float]:
    """Validate the data once; returns the problem (no ``theta`` yet) and the largest
    class label (multinomial; -1 otherwise)."""
    name = _loss_name(loss)
    if not isinstance(X, np.ndarray):
        raise TypeError(f"`X` must be a NumPy array, got {type(X).__name__}")
    if X.dtype not in (np.float32, np.float64):
        raise TypeError(f"`X` must be float32 or float64, got {X.dtype}")
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"`X` must be a non-empty 2-d array, got shape {X.shape}")
    n, d = X.shape
    X = np.ascontiguousarray(X)
    y = np.asarray(y)
    if y.shape != (n,):
        raise ValueError(f"`y` must have shape ({n},) (one target per row of `X`), got {y.shape}")
    yf = np.ascontiguousarray(y, dtype=np.float64)
    ymax = -1.0
    if name == "multinomial":
        if not np.all((yf >= 0) & (yf == np.floor(yf))):
            raise ValueError("`y` must hold integer class labels in [0, K)")
        ymax = float(np.max(yf))
    elif LABELS[name] == "binary":
        if not np.all((yf == 0) | (yf == 1)):
            raise ValueError(f"`y` must hold binary labels 0 or 1 for the {name} loss")
    elif not np.all(np.isfinite(yf)):
        raise ValueError("`y` must be finite")
    elif LABELS[name] == "nonnegative" and not np.all(yf >= 0):
        raise ValueError(f"`y` must be non-negative for the {name} loss")
    if prior is None:
        p = np.zeros(0, dtype=np.float64)
    else:
        p = np.ascontiguousarray(prior, dtype=np.float64)
        if p.shape != (n,):
            raise ValueError(f"`prior` must have shape ({n},), got {p.shape}")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or not np.any(p > 0):
            raise ValueError("`prior` must be finite, non-negative and not all zero")
    params = dict(loss_params or {})
    param = 0.0
    if name in PARAMS:
        key, default, lo, hi = PARAMS[name]
        param = float(params.pop(key, default))
        if not (lo < param < hi):
            raise ValueError(
                f"`loss_params`: `{key}` of the {name} loss must lie in ({lo}, {hi}), got {param}"
            )
    if params:
        raise TypeError(f"`loss_params`: the {name} loss takes no {sorted(params)}")
    if n_chunks is None:
        n_chunks = default_chunks(n)
    elif (
        isinstance(n_chunks, bool) or not isinstance(n_chunks, (int, np.integer)) or (n_chunks < 1)
    ):
        raise ValueError(f"`n_chunks` must be a positive integer, got {n_chunks!r}")
    if name != "multinomial":  # targets in X's dtype (as the generic path casts them)
        yf = np.ascontiguousarray(yf, dtype=X.dtype)
    empty = np.zeros(0, dtype=X.dtype)
    return _Problem(name, LOSS_CODES[name], X, yf, p, empty, 0.0, param, int(n_chunks)), ymax


def _at(base: _Problem, ymax: float, theta: Any, t: Any) -> _Problem:
    """The bound problem at one ``theta`` and tilt (cheap checks: O(d))."""
    d = base.X.shape[1]
    theta = np.asarray(theta)
    if not np.issubdtype(theta.dtype, np.floating) and not np.issubdtype(theta.dtype, np.integer):
        raise TypeError(f"`theta` must be real, got {theta.dtype}")
    if base.loss == "multinomial":
        if theta.ndim != 2 or theta.shape[0] != d:
            raise ValueError(
                f"`theta` must have shape ({d}, K) for the multinomial loss, got {theta.shape}"
            )
        if ymax >= theta.shape[1]:
            raise ValueError(f"`y` must hold integer class labels in [0, {theta.shape[1]})")
    elif theta.shape != (d,):
        raise ValueError(f"`theta` must have shape ({d},), got {theta.shape}")
    theta = np.ascontiguousarray(theta, dtype=base.X.dtype)
    if isinstance(t, (bool, np.bool_, str, bytes)):
        raise TypeError(f"`t` must be a real number, got {t!r}")
    try:
        t = float(t)
    except (TypeError, ValueError):
        raise TypeError(f"`t` must be a real number, got {t!r}") from None
    if not math.isfinite(t):
        raise ValueError(f"`t` must be finite for the fused kernels, got {t}")
    return replace(base, theta=theta, t=t)


def _direction(v: Any, pb: _Problem) -> np.ndarray:
    v = np.asarray(v)
    if v.shape != pb.theta.shape:
        raise ValueError(f"`v` must have the shape of `theta` {pb.theta.shape}, got {v.shape}")
    return np.ascontiguousarray(v, dtype=pb.X.dtype)
