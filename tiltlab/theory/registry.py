"""The registry of property checks and :func:`check_path`, which runs them along a path."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .derivatives import _check_gradient_fd, _check_hessian_fd, _check_solution_derivative
from .path_data import _PathData
from .properties import (
    _check_cosine,
    _check_cosine_local,
    _check_entropy,
    _check_entropy_local,
    _check_max_mean,
    _check_min_mean,
    _check_objective_monotone,
    _check_optimal_objective,
    _check_risk_sign,
    _check_risk_sign_local,
    _check_stationarity,
    _check_variance,
    _check_variance_local,
)
from .quantiles import _check_quantiles
from .records import PROPERTIES, PropertyCheck

__all__ = ["check_path"]


_CHECKS = {
    "stationarity": _check_stationarity,
    "objective_monotone_in_t": _check_objective_monotone,
    "optimal_objective_monotone": _check_optimal_objective,
    "risk_sign": _check_risk_sign,
    "risk_sign_local": _check_risk_sign_local,
    "max_mean_tradeoff": _check_max_mean,
    "min_mean_tradeoff": _check_min_mean,
    "variance_decreasing": _check_variance,
    "variance_local": _check_variance_local,
    "cosine_increasing": _check_cosine,
    "cosine_local": _check_cosine_local,
    "entropy_increasing": _check_entropy,
    "entropy_local": _check_entropy_local,
    "gradient_fd": _check_gradient_fd,
    "hessian_fd": _check_hessian_fd,
    "solution_derivative_fd": _check_solution_derivative,
}


def check_path(
    path: Any,
    *,
    rtol: float | None = None,
    fd_step: float = 1e-4,
    include: Iterable[str] | None = None,
    a: Any = None,
    q0: Any = None,
) -> list[PropertyCheck]:
    r"""Check the paper's properties of tilted solutions numerically along a tilt path.

    One :class:`PropertyCheck` per property in :data:`PROPERTIES` (or in ``include``),
    in that order. The module docstring lists the properties, which of them are
    theorems and which are claims of the paper that fail on valid data (with their
    corrected, local forms), and the tolerance rule.

    Parameters
    ----------
    path : TiltPath
        Output of :func:`tiltlab.tilt_path` for a sample-level objective whose Hessian
        is available (linear-predictor losses, or a ``CallableLoss`` with ``hess``). Tilts
        are sorted (repeated ones dropped) before checking.
    rtol : float, optional
        Relative allowance for floating-point rounding in every comparison (default
        ``1e-10``, or 100 times the machine epsilon of the path's dtype where that is
        larger: ``1.2e-5`` for float32). The solver's accuracy is allowed for separately
        (see Tolerances in the module docstring), through ``path.results[k].jac``.
    fd_step : float, default 1e-4
        Tilt step of the finite differences of re-solved solutions (``d theta/dt`` and the
        local sign check); steps ``h`` and ``2h`` are used.
    include : iterable of str, optional
        Names of the checks to run (default: all of :data:`PROPERTIES`).
    a : float or 1-d array, optional
        Thresholds for ``quantile_ordering`` (skipped, with ``holds=True`` and a note, when
        not given).
    q0 : array, optional
        :math:`Q^0(a)` if known (e.g. from :func:`tiltlab.bounds.min_tail_fraction` on
        point-estimation data); otherwise it is computed when the objective allows it.

    Returns
    -------
    list of PropertyCheck

    See Also
    --------
    format_checks : Prints the records.
    tradeoff_curves : The loss statistics along the path.
    tiltlab.tilt_path : Computes the path.

    Notes
    -----
    Cost: a dense Hessian and its eigenvalues at every path point, four Newton re-solves
    per path point (finite differences in ``t``), and up to ``4 p`` objective evaluations
    per point for the gradient/Hessian checks (5 random directions when ``p > 20``). Meant
    for small and medium parameter counts (up to a few hundred).

    Raises
    ------
    TypeError
        ``path`` is not a tilt path, or its objective has no Hessian.
    ValueError
        Unknown names in ``include``, bad ``rtol``/``fd_step``, fewer than two tilts.
    NotImplementedError
        Hierarchical objectives.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.theory import check_path, format_checks
    >>> rng = np.random.default_rng(0)
    >>> X = np.c_[rng.normal(size=30), np.ones(30)]
    >>> y = X @ np.array([1.0, 0.5]) + 0.3 * rng.normal(size=30)
    >>> obj = tl.TiltedObjective("squared", X, y, l2=1e-3)
    >>> path = tl.tilt_path(obj, np.linspace(-1, 2, 7), method="newton", tol=1e-12)
    >>> checks = check_path(
    ...     path, include=["objective_monotone_in_t", "solution_derivative_fd"])
    >>> [(c.name, c.holds) for c in checks]
    [('objective_monotone_in_t', True), ('solution_derivative_fd', True)]
    >>> print(format_checks(checks).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    property                   holds  worst violation  tolerance  reference
    """
    if rtol is not None and not (
        isinstance(rtol, (int, float)) and np.isfinite(rtol) and rtol >= 0
    ):
        raise ValueError(f"`rtol` must be a non-negative number, got {rtol!r}")
    if not (isinstance(fd_step, (int, float)) and np.isfinite(fd_step) and fd_step > 0):
        raise ValueError(f"`fd_step` must be a positive number, got {fd_step!r}")
    names = list(PROPERTIES) if include is None else list(include)
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown names in `include`: {unknown}; choose from {list(PROPERTIES)}")
    data = _PathData(path, None if rtol is None else float(rtol), float(fd_step))
    out = []
    for name in PROPERTIES:
        if name not in names:
            continue
        if name == "quantile_ordering":
            out.append(_check_quantiles(path, a, q0))
        else:
            out.append(_CHECKS[name](data))
    return out
