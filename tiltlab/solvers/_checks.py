"""Argument checks shared by ``minimize`` and the solvers' configurations."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np

from ..objective.protocol import check_objective as _check_objective_protocol

__all__ = [
    "check_int",
    "check_real",
    "check_positive",
    "check_tolerance",
    "check_objective",
    "check_seed",
    "merge_options",
]


def check_objective(obj: Any, name: str) -> None:
    """``obj`` satisfies the objective interface (see ``tiltlab.objective.protocol``)."""
    _check_objective_protocol(obj, name)


def check_int(value: Any, name: str, minimum: int) -> int:
    """``value`` as an int ``>= minimum`` (an integral float is accepted, not a bool)."""
    if isinstance(value, bool):
        raise TypeError(f"`{name}` must be an integer, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            out = int(value)
        else:
            raise TypeError(f"`{name}` must be an integer, got {value!r}") from None
    if out < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    return int(out)


def check_real(value: Any, name: str) -> float:
    """``value`` as a non-negative float (NaN rejected)."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (numbers.Real, np.generic)):
        raise TypeError(f"`{name}` must be a real number, got {value!r}")
    out = float(value)
    if not out >= 0:
        raise ValueError(f"`{name}` must be a non-negative number, got {value!r}")
    return out


def check_tolerance(value: Any, name: str) -> float:
    """``value`` as a finite non-negative float (a stopping tolerance: an infinite one
    would stop every run at its start)."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (numbers.Real, np.generic)):
        raise TypeError(f"`{name}` must be a real number, got {value!r}")
    out = float(value)
    if not 0 <= out < float("inf"):
        raise ValueError(f"`{name}` must be a finite non-negative number, got {value!r}")
    return out


def check_positive(value: Any, name: str) -> float:
    """``value`` as a positive finite float."""
    out = check_real(value, name)
    if not 0 < out < float("inf"):
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}")
    return out


def check_seed(seed: Any) -> None:
    if seed is None or isinstance(seed, (np.random.Generator, np.random.SeedSequence)):
        return
    if isinstance(seed, bool) or not isinstance(seed, (numbers.Integral, np.integer)):
        raise TypeError(
            f"`seed` must be None, a non-negative integer or a numpy.random.Generator, got {seed!r}"
        )
    if int(seed) < 0:
        raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}")


#: arguments of ``minimize`` that a dict of solver options may not set
_FIXED = ("objective", "theta0", "method")


def merge_options(
    named: dict[str, Any], options: dict[str, Any] | None, *, name: str = "solver_options"
) -> dict[str, Any]:
    """Merge a user's dict of solver options into the keyword arguments of a call.

    For callers (such as estimators) that pass their own ``tol``, ``max_iter``... to
    :func:`tiltlab.minimize` together with a user's ``solver_options``: an option that
    repeats a named argument replaces it (the user's explicit choice wins) instead of
    the ``got multiple values`` error of a plain ``**`` call; ``objective``, ``theta0``
    and ``method`` cannot be set this way.

    Examples
    --------
    >>> from tiltlab.solvers._checks import merge_options
    >>> merge_options({"tol": 1e-4, "max_iter": 100}, {"tol": 1e-8, "memory": 5})
    {'tol': 1e-08, 'max_iter': 100, 'memory': 5}
    """
    if options is None:
        return dict(named)
    if not isinstance(options, dict):
        raise TypeError(f"`{name}` must be a dict, got {type(options).__name__}")
    bad = [k for k in options if not isinstance(k, str)]
    if bad:
        raise TypeError(f"`{name}` keys must be strings, got {bad[0]!r}")
    fixed = sorted(k for k in options if k in _FIXED)
    if fixed:
        raise ValueError(f"`{name}` cannot set {', '.join(fixed)}: pass it directly")
    return {**named, **options}
