"""Statistics of tilted weights: entropy and effective sample size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._compat import (
    as_float_array,
    check_finite,
    namespace_of,
    normalize_axis,
)
from ._checks import _check_objective, _theta_of

__all__ = [
    "WeightStats",
    "weight_entropy",
    "effective_sample_size",
    "tilted_weight_stats",
]


@dataclass(frozen=True)
class WeightStats:
    """Tilted weights with their entropy and effective sample size.

    Attributes
    ----------
    weights : array (N,)
    entropy : 0-d array
        Shannon entropy (natural log); ``log N`` for uniform weights.
    effective_sample_size : 0-d array
        Kish's ``1 / sum w_i**2``; ``N`` for uniform weights.
    """

    weights: Any
    entropy: Any
    effective_sample_size: Any


def _prepare_weights(weights: Any, axis: int, xp: Any) -> tuple[Any, Any, int]:
    """Validated weights scaled by their largest entry along ``axis`` (which is 1).

    Both statistics depend on the ratios of the weights only; scaling by the maximum
    (not the sum) keeps finite weights whose sum overflows, or that underflow when
    divided by it, exact.
    """
    xp = namespace_of(weights=weights) if xp is None else xp
    w = as_float_array(weights, xp, name="weights")
    if w.ndim == 0:
        raise ValueError("`weights` must have at least one dimension (got a scalar)")
    if any(s == 0 for s in w.shape):
        raise ValueError(f"`weights` must not be empty (shape {tuple(w.shape)})")
    ax = normalize_axis(axis, w.ndim)
    check_finite(w, xp, name="weights")
    if not bool(xp.all(w >= 0)):
        raise ValueError("`weights` must be non-negative")
    top = xp.max(w, axis=ax, keepdims=True)
    if not bool(xp.all(top > 0)):
        raise ValueError("`weights` must not be all zero")
    return xp, w / top, ax


def weight_entropy(weights: Any, *, axis: int = -1, xp: Any = None) -> Any:
    r"""Shannon entropy :math:`-\sum_i w_i \log w_i` (natural log, :math:`0\log 0 = 0`).

    The weights are normalised to sum to one along ``axis`` first. The entropy lies in
    ``[0, log N]``: ``log N`` for uniform weights, 0 for a single non-zero weight.

    Parameters
    ----------
    weights : array
        Non-negative weights, not all zero along ``axis``.
    axis : int, default -1
        The sample axis.
    xp : namespace, optional
        Inferred from ``weights``.

    Returns
    -------
    array
        The entropy, reduced along ``axis``, in the namespace, dtype and device of
        ``weights`` (integer input promoted to the default float).

    See Also
    --------
    effective_sample_size : Another summary of the same weights.
    tilted_weight_stats : Both, and more.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.diagnostics import weight_entropy
    >>> bool(np.isclose(weight_entropy(np.full(4, 0.25)), np.log(4)))
    True
    >>> float(weight_entropy(np.array([0.0, 1.0, 0.0])))
    0.0
    """
    xp, s, ax = _prepare_weights(weights, axis, xp)
    q = s / xp.sum(s, axis=ax, keepdims=True)
    pos = q > 0
    logq = xp.log(xp.where(pos, q, xp.ones_like(q)))
    return 0.0 - xp.sum(xp.where(pos, q * logq, xp.zeros_like(q)), axis=ax)


def effective_sample_size(weights: Any, *, axis: int = -1, xp: Any = None) -> Any:
    r"""Kish's effective sample size :math:`(\sum_i w_i)^2 / \sum_i w_i^2`.

    For normalised weights this is :math:`1/\sum_i w_i^2`: ``N`` for uniform weights, 1
    for a single non-zero weight.

    Parameters
    ----------
    weights : array
        Non-negative weights, not all zero along ``axis``.
    axis : int, default -1
    xp : namespace, optional

    Returns
    -------
    array
        Reduced along ``axis``, in the namespace, dtype and device of ``weights``.

    See Also
    --------
    weight_entropy : Another summary of the same weights.
    tiltlab.tilted_weights : The weights.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.diagnostics import effective_sample_size
    >>> float(effective_sample_size(np.ones(5)))
    5.0
    >>> float(effective_sample_size(np.array([0.0, 2.0, 0.0])))
    1.0
    """
    # weights scaled by the largest (not by the sum): exact for equal weights, and neither
    # overflow nor underflow
    xp, s, ax = _prepare_weights(weights, axis, xp)
    total = xp.sum(s, axis=ax)
    return total * total / xp.sum(s * s, axis=ax)


def tilted_weight_stats(objective: Any, theta: Any) -> WeightStats:
    """Tilted weights of ``objective`` at ``theta``, their entropy and effective size.

    Works for sample-level and hierarchical objectives (the per-sample weights of
    ``objective.weights``).

    Parameters
    ----------
    objective : TiltedObjective
    theta : array

    Returns
    -------
    WeightStats

    See Also
    --------
    weight_entropy
    effective_sample_size

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> from tiltlab.diagnostics import tilted_weight_stats
    >>> obj = TiltedObjective("squared", np.ones((3, 1)), np.array([0.0, 1.0, 2.0]))
    >>> float(tilted_weight_stats(obj, np.array([1.0])).effective_sample_size)
    3.0
    >>> s = tilted_weight_stats(obj.with_tilt(5.0), np.array([1.0]))
    >>> bool(s.effective_sample_size < 3.0)
    True
    """
    obj = _check_objective(objective)
    w = obj.weights(_theta_of(obj, theta))
    return WeightStats(w, weight_entropy(w, xp=obj.xp), effective_sample_size(w, xp=obj.xp))
