"""Shared helpers of the regression baselines: input checks and a cached row-space basis."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import scipy.linalg

__all__: list[str] = []


def _as_problem(X, y, x_name: str = "X", y_name: str = "y") -> tuple[np.ndarray, np.ndarray]:
    try:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
    except TypeError as exc:  # e.g. a CuPy array, which refuses implicit host copies
        raise TypeError(
            f"`{x_name}` and `{y_name}` must be convertible to NumPy arrays (these baselines "
            f"run on the host): {exc}"
        ) from exc
    if X.ndim != 2:
        raise ValueError(f"`{x_name}` must be 2-D (n, d), got shape {X.shape}")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise ValueError(
            f"`{y_name}` must be 1-D with one entry per row of `{x_name}`, got shape "
            f"{y.shape} for `{x_name}` of shape {X.shape}"
        )
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"`{x_name}` must be non-empty, got shape {X.shape}")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ValueError(f"`{x_name}` and `{y_name}` must be finite")
    return X, y


def _check_iterations(value, name: str) -> int:
    """A positive integer (not a bool) for the iteration cap ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
    return int(value)


def _check_tolerance(value, name: str) -> float:
    """A non-negative finite number for the tolerance ``name``."""
    if not (value >= 0 and np.isfinite(value)):
        raise ValueError(f"`{name}` must be a non-negative finite number, got {value!r}")
    return float(value)


class _RowSpace:
    """Thin SVD ``X = U diag(s) Vt`` restricted to the numerical rank of ``X``."""

    def __init__(self, X: np.ndarray):
        U, s, Vt = scipy.linalg.svd(X, full_matrices=False, check_finite=False)
        tol = max(X.shape) * np.finfo(np.float64).eps * (s[0] if s.size else 0.0)
        r = int(np.sum(s > tol))
        self.U, self.s, self.Vt = U[:, :r], s[:r], Vt[:r]
        for a in (self.U, self.s, self.Vt):  # shared through the cache: never modified
            a.flags.writeable = False

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """Minimum-norm least-squares solution ``pinv(X) @ rhs``."""
        return self.Vt.T @ ((self.U.T @ rhs) / self.s)

    def project(self, w: np.ndarray) -> np.ndarray:
        """Projection of ``w`` onto the row space of ``X`` (keeps ``X @ w``)."""
        return self.Vt.T @ (self.Vt @ w)


_ROW_SPACES: OrderedDict[tuple, _RowSpace] = OrderedDict()
_CACHE_SIZE = 4


def _row_space(X: np.ndarray) -> _RowSpace:
    """:class:`_RowSpace` of ``X``, cached by content for the last few matrices.

    A reproduction fits several baselines to the same design; the thin SVD (the largest
    cost of the cheap baselines) is computed once. The key is a BLAKE2 digest of the bytes,
    so a modified array never hits a stale entry.
    """
    X = np.ascontiguousarray(X)
    key = (X.shape, hashlib.blake2b(X.data, digest_size=16).hexdigest())
    basis = _ROW_SPACES.get(key)
    if basis is None:
        basis = _RowSpace(X)
        _ROW_SPACES[key] = basis
        while len(_ROW_SPACES) > _CACHE_SIZE:
            _ROW_SPACES.popitem(last=False)
    else:
        _ROW_SPACES.move_to_end(key)
    return basis


def _min_norm(X: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _row_space(X).project(w)
