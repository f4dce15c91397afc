"""Argument and data checks of the tilted estimators, and small array helpers."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .._compat import (
    device,
    is_array_api_obj,
    is_numpy_namespace,
    library_namespace,
    to_numpy,
)

# ------------------------------------------------------------------------ small helpers


def namespace(X: Any) -> Any:
    """The array namespace of ``X`` (array-api-compat's wrapper)."""
    return library_namespace(X)


def is_numpy(xp: Any) -> bool:
    return is_numpy_namespace(xp)


def take_rows(A: Any, idx: np.ndarray, xp: Any) -> Any:
    """Rows ``idx`` (host integer array) of ``A`` in ``A``'s namespace and device."""
    if is_numpy(xp):
        return A[idx]
    return xp.take(A, xp.asarray(idx.astype(np.int64), device=device(A)), axis=0)


def follow_X(a: Any, X: Any, xp: Any) -> Any:
    """``a`` (``y``, ``sample_weight``) in ``X``'s namespace and on its device.

    Targets and weights follow ``X``, as in scikit-learn: with array API dispatch, ``y``
    may come from another library or device than ``X``; it is copied through the host
    then, and returned unchanged when it is already where ``X`` is.
    """
    if not is_array_api_obj(a):
        return a
    if namespace(a) is xp and device(a) == device(X):
        return a
    host = to_numpy(a)
    if is_numpy(xp):
        return host
    return xp.asarray(host, device=device(X))


def add_intercept_column(X: Any, xp: Any) -> Any:
    ones = xp.ones((X.shape[0], 1), dtype=X.dtype, device=device(X))
    return xp.concat([X, ones], axis=1)


def as_float_X(X: Any, xp: Any) -> Any:
    """``X`` in a floating type the solvers can work in.

    Integers and booleans become float64 wherever the device has it (float32 only on a
    device without float64), whatever the library's default float: so integer data give
    the same fit in every library (PyTorch's default float32 gave coefficients 3e-8 to
    3e-7 off NumPy's on well-conditioned data), as scikit-learn does. Half
    precision (float16, bfloat16) becomes float32, as scikit-learn fits float16 data: a
    10-bit mantissa cannot resolve the decrease a gradient step promises, so a
    half-precision fit would stop far from the solution.
    """
    if not xp.isdtype(X.dtype, "real floating"):
        return xp.astype(X, xp.float64 if is_numpy(xp) else _widest_float(xp, X))
    if xp.finfo(X.dtype).bits < 32:
        return xp.astype(X, xp.float32)
    return X


def _widest_float(xp: Any, X: Any) -> Any:
    """float64 where ``X``'s device has it, else float32."""
    try:
        kinds = xp.__array_namespace_info__().dtypes(kind="real floating", device=device(X))
    except Exception:  # pragma: no cover - old namespaces
        return xp.float64
    return xp.float64 if "float64" in kinds else xp.float32


def check_real(value: Any, name: str, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {value!r}")
    v = float(value)
    if np.isnan(v) or (not allow_inf and not np.isfinite(v)):
        what = "not NaN" if allow_inf else "finite"
        raise ValueError(f"`{name}` must be {what}, got {value!r}")
    return v


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a bool: ``True`` or ``False`` (Python's or NumPy's), nothing else."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}")
    return bool(value)


def check_tilts(tilts: Any) -> tuple[float, ...]:
    if isinstance(tilts, (str, bytes)) or not hasattr(tilts, "__len__"):
        raise TypeError(
            f"`tilts` must be a sequence (t_group, ..., t_sample), outermost first; got {tilts!r}"
        )
    if len(tilts) < 2:
        raise ValueError(
            "`tilts` needs one tilt per grouping level plus one for the samples, e.g. "
            f"(t_group, t_sample); got {tuple(tilts)!r}"
        )
    return tuple(check_real(v, f"tilts[{k}]") for k, v in enumerate(tilts))


#: minimize() arguments the estimators set themselves, and the parameter that sets each
RESERVED_SOLVER_OPTIONS = {
    "objective": None,
    "theta0": "warm_start",
    "method": "solver",
    "tol": "tol",
    "atol": "tol",
    "max_iter": "max_iter",
    "validation": "early_stopping",
    "patience": "n_iter_no_change",
    "seed": "random_state",
}


def check_solver_options(options: Any) -> dict[str, Any]:
    """``solver_options`` as a dict; no argument the estimator sets, sane budgets."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(
            f"`solver_options` must be a dict of options for tiltlab.minimize, got "
            f"{type(options).__name__}"
        )
    for key, value in options.items():
        if not isinstance(key, str):
            raise TypeError(f"`solver_options` keys must be strings, got {key!r}")
        if key in RESERVED_SOLVER_OPTIONS:
            owner = RESERVED_SOLVER_OPTIONS[key]
            use = f"; use the estimator's `{owner}` parameter" if owner else ""
            raise ValueError(
                f"`solver_options` must not contain {key!r}: the estimator sets it{use}"
            )
        if key == "batch_size" and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        ):
            raise ValueError(
                f"`solver_options['batch_size']` must be a positive integer, got {value!r}"
            )
        if key == "max_passes":
            v = check_real(value, "solver_options['max_passes']")
            if v <= 0:
                raise ValueError(f"`solver_options['max_passes']` must be positive, got {value!r}")
    return dict(options)


def check_sample_weight(sample_weight: Any, n: int, X: Any, xp: Any) -> Any:
    """``sample_weight`` as a finite non-negative array of X's dtype and device (or None).

    The weights are the prior of the tilted risk, which normalises them: only their ratios
    count. Weights whose sum would overflow ``X``'s floating type, or whose largest is
    below its smallest normal number (as float64 weights for float32 data can be), are
    divided by their largest before the cast to that type; others are cast unchanged.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Real):  # one weight for every row: same checks
        sample_weight = np.full(n, float(sample_weight))
    if not is_numpy(xp) and is_array_api_obj(sample_weight):
        sw = follow_X(sample_weight, X, xp)
        if not xp.isdtype(sw.dtype, "real floating"):
            sw = xp.astype(sw, X.dtype)
    else:
        sw_np = np.asarray(to_numpy(sample_weight))
        if sw_np.dtype.kind not in "biuf":
            raise TypeError(f"`sample_weight` must hold numbers, got dtype {sw_np.dtype}")
        sw = xp.asarray(sw_np.astype(np.float64), device=device(X))
    if sw.ndim != 1 or int(sw.shape[0]) != n:
        raise ValueError(
            f"`sample_weight` must have shape ({n},) (one weight per sample), got {tuple(sw.shape)}"
        )
    if not bool(xp.all(xp.isfinite(sw))):
        raise ValueError("`sample_weight` must be finite")
    if not bool(xp.all(sw >= 0)):
        raise ValueError("`sample_weight` must be non-negative")
    largest = float(xp.max(sw))
    if not largest > 0:
        raise ValueError("`sample_weight` must not be all zero")
    info = xp.finfo(X.dtype)
    if not (float(info.smallest_normal) <= largest <= float(info.max) / n):
        sw = sw / largest
    return xp.astype(sw, X.dtype)


def check_groups(groups: Any, n: int) -> list[np.ndarray]:
    """Group labels as a list of host integer code arrays, outermost level first.

    ``groups`` is one label per sample (shape ``(n,)``) or one column per level
    (shape ``(n, L)``, outermost first). Labels may be any hashable values.
    """
    g = np.asarray(to_numpy(groups))
    if g.ndim == 1:
        cols = [g]
    elif g.ndim == 2:
        cols = [g[:, j] for j in range(g.shape[1])]
    else:
        raise ValueError(
            f"`groups` must have shape (n_samples,) or (n_samples, n_levels), got {g.shape}"
        )
    if g.shape[0] != n:
        raise ValueError(f"`groups` has {g.shape[0]} entries but `X` has {n} rows")
    out = []
    for c in cols:
        if c.dtype.kind == "f" and not np.all(np.isfinite(c)):
            raise ValueError("`groups` must not contain NaN or infinite labels")
        if c.dtype.kind == "O":
            _check_object_labels(c)
        out.append(_codes(c))
    if len(out) > 1:  # nest inner levels inside outer ones: (outer, inner) pairs
        nested = [out[0]]
        for c in out[1:]:
            pair = np.stack([nested[-1], c], axis=1)
            _, codes = np.unique(pair, axis=0, return_inverse=True)
            nested.append(codes.reshape(-1).astype(np.int64))
        out = nested
    return out


def _check_object_labels(c: np.ndarray) -> None:
    """Object-dtype labels must be one comparable kind: numbers or strings, no None."""
    if any(v is None for v in c):
        raise ValueError("`groups` must not contain None labels")
    kinds = {"number" if isinstance(v, numbers.Number) else type(v).__name__ for v in c}
    if len(kinds) > 1:
        raise TypeError(
            f"`groups` labels must be all numbers or all of one type (they are sorted), got "
            f"a mix of {sorted(kinds)}"
        )


def _codes(labels: np.ndarray) -> np.ndarray:
    try:
        _, codes = np.unique(labels, return_inverse=True)
    except TypeError as exc:
        raise TypeError(f"`groups` labels must be sortable ({exc})") from None
    return codes.reshape(-1).astype(np.int64)


def check_same_namespace(X: Any, estimator: Any, method: str) -> None:
    """Raise a ValueError when ``X`` is not of the namespace and device of the fit.

    scikit-learn's own check (``sklearn.utils._array_api.check_same_namespace``, 1.9 and
    later) where it exists, so the message is the one its estimators give; on older
    versions the same rule: with ``array_api_dispatch`` on, ``X`` must come from the
    library and device of ``coef_`` (array-likes count as NumPy).
    """
    try:
        from sklearn.utils._array_api import check_same_namespace as sk_check
    except ImportError:  # scikit-learn < 1.9
        sk_check = None
    if sk_check is not None:
        sk_check(X, estimator, attribute="coef_", method=method)
        return
    from sklearn import get_config

    if not get_config().get("array_api_dispatch", False):
        return
    coef = estimator.coef_
    x = X if is_array_api_obj(X) else np.asarray(X)
    a_xp, x_xp = library_namespace(coef), library_namespace(x)
    if is_numpy_namespace(a_xp) and is_numpy_namespace(x_xp):
        return
    if a_xp is x_xp and device(x) == device(coef):
        return
    raise ValueError(
        f"Inputs passed to {type(estimator).__name__}.{method}() must use the same "
        "namespace and the same device as those passed to fit()."
    )
