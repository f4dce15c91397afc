"""Assertion helpers for tests of array-API code (used by tiltlab's own suite).

``assert_close`` checks the namespace, dtype and shape of a result as well as its
values, the way SciPy's ``xp_assert_close`` does, so that a function that silently
returns NumPy for a PyTorch input, or float64 for float32, fails its tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import device, library_namespace, to_numpy

__all__ = ["assert_close", "assert_namespace", "default_rtol"]


def default_rtol(dtype: Any) -> float:
    """About four times the square root of the dtype's machine epsilon."""
    eps = float(np.finfo(np.dtype(str(dtype).split(".")[-1])).eps)
    return 4 * eps**0.5


def assert_namespace(actual: Any, xp: Any, *, dtype: Any = None, dev: Any = None) -> None:
    """``actual`` is an array of ``xp`` with the given dtype and device."""
    got = library_namespace(actual)
    want = library_namespace(xp.asarray(0.0))
    assert got is want, f"namespace {got.__name__} != {want.__name__}"
    if dtype is not None:
        assert actual.dtype == dtype, f"dtype {actual.dtype} != {dtype}"
    if dev is not None:
        assert device(actual) == dev, f"device {device(actual)} != {dev}"


def assert_close(
    actual: Any,
    desired: Any,
    *,
    xp: Any = None,
    rtol: float | None = None,
    atol: float = 0.0,
    dtype: Any = None,
    check_shape: bool = True,
    err_msg: str = "",
) -> None:
    """Assert namespace, dtype, shape and values of ``actual`` against ``desired``.

    ``desired`` may be a NumPy array, a Python number or an array of ``xp``. With
    ``xp`` given, ``actual`` must belong to that namespace (and to ``dtype`` when
    given). ``rtol`` defaults to :func:`default_rtol` of the dtype.
    """
    if xp is not None:
        assert_namespace(actual, xp, dtype=dtype)
    a = to_numpy(actual)
    d = to_numpy(desired) if not isinstance(desired, (int, float)) else np.asarray(desired)
    if check_shape:
        assert a.shape == d.shape, f"shape {a.shape} != {d.shape}. {err_msg}"
    if rtol is None:
        rtol = default_rtol(a.dtype)
    np.testing.assert_allclose(
        a,
        d.astype(np.float64, copy=False) if d.dtype.kind in "iub" else d,
        rtol=rtol,
        atol=atol,
        err_msg=err_msg,
    )
