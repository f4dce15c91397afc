"""Assertion helpers for tests of array-API code (used by tiltlab's own suite).

``assert_close`` checks the namespace, dtype and shape of a result as well as its
values, the way SciPy's ``xp_assert_close`` does, so that a function that silently
returns NumPy for a PyTorch input, or float64 for float32, fails its tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import device, is_array_api_obj, library_namespace, to_numpy

__all__ = ["assert_close", "assert_namespace", "default_rtol"]


def default_rtol(dtype: Any) -> float:
    """The default relative tolerance of :func:`assert_close` for ``dtype``.

    About four times the square root of the dtype's machine epsilon: loose enough for
    results that lose half their digits to cancellation, tight enough to catch a float32
    computation passed off as float64.

    Parameters
    ----------
    dtype : dtype or str
        A floating dtype of any array library (``numpy.float32``, ``torch.float64``,
        ``"float32"``...).

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.testing import default_rtol
    >>> f"{default_rtol(np.float64):.1e}", f"{default_rtol('float32'):.1e}"
    ('6.0e-08', '1.4e-03')
    """
    try:
        np_dtype = np.dtype(dtype)  # NumPy dtypes and scalar types, dtype names
    except TypeError:
        np_dtype = np.dtype(str(dtype).split(".")[-1])  # torch.float32, array-api-strict...
    eps = float(np.finfo(np_dtype).eps)
    return 4 * eps**0.5


def assert_namespace(actual: Any, xp: Any, *, dtype: Any = None, dev: Any = None) -> None:
    """Assert that ``actual`` is an array of ``xp`` with the given dtype and device.

    Parameters
    ----------
    actual : array
        The array to check.
    xp : namespace
        The array library it must belong to (``numpy``, ``torch``, ``array_api_strict``...).
    dtype : dtype, optional
        The dtype it must have.
    dev : device, optional
        The device it must be on.

    Raises
    ------
    AssertionError
        Naming the namespace, dtype or device that differs.

    See Also
    --------
    assert_close : Checks the values as well.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.testing import assert_namespace
    >>> assert_namespace(np.zeros(3, dtype=np.float32), np, dtype=np.float32)
    >>> assert_namespace(np.zeros(3), np, dtype=np.float32)
    Traceback (most recent call last):
    ...
    AssertionError: dtype float64 != ...
    """
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

    ``desired`` may be a NumPy array, a Python number or an array of ``xp``.

    - With ``xp`` given, ``actual`` must be an array of ``xp`` (of ``dtype`` when given);
      ``desired`` may then be a reference computed elsewhere (NumPy, mpmath as floats).
    - Without ``xp``, ``actual`` must come from the same library as ``desired`` and have
      its dtype (or ``dtype`` when given) whenever ``desired`` is an array: a float32
      result does not pass against a float64 reference, nor a NumPy array against a
      PyTorch tensor.

    The values are compared on the host with :func:`numpy.testing.assert_allclose`.

    Parameters
    ----------
    actual : array
        The result to check, of any supported library.
    desired : array_like or number
        The expected values.
    xp : namespace, optional
        The array library ``actual`` must belong to.
    rtol : float, optional
        Relative tolerance; default :func:`default_rtol` of ``actual``'s dtype.
    atol : float, default 0.0
        Absolute tolerance.
    dtype : dtype, optional
        The dtype ``actual`` must have.
    check_shape : bool, default True
        Whether the shapes must be equal (otherwise they broadcast).
    err_msg : str, optional
        Appended to the failure message.

    Raises
    ------
    AssertionError
        If the namespace, dtype, shape or values differ.

    See Also
    --------
    assert_namespace : The namespace, dtype and device checks alone.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.testing import assert_close
    >>> losses = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    >>> assert_close(tl.tilted_risk(losses, 0.0), 2.0, xp=np, dtype=np.float32)
    >>> try:
    ...     assert_close(np.array([1.0], dtype=np.float32), np.array([1.0]))
    ... except AssertionError as exc:
    ...     print("dtype" in str(exc))
    True
    """
    if xp is not None:
        assert_namespace(actual, xp, dtype=dtype)
    elif is_array_api_obj(desired):
        assert_namespace(actual, library_namespace(desired), dtype=dtype)
        if dtype is None:
            assert actual.dtype == desired.dtype, f"dtype {actual.dtype} != {desired.dtype}"
    elif dtype is not None:
        assert actual.dtype == dtype, f"dtype {actual.dtype} != {dtype}"
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
