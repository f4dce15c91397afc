"""Tail fractions and quantile risks of a loss vector.

:func:`tail_fraction` (the share ``Q(a)`` of the mass at or above ``a``), :func:`k_loss`
(the k-th smallest loss), :func:`value_at_risk` (the lower quantile) and
:func:`superquantile` (CVaR). See :mod:`tiltlab.bounds` for the conventions.
"""

from __future__ import annotations

from typing import Any

from .._compat import (
    array_result,
    namespace_of,
)
from ._common import (
    _check_k,
    _host_levels,
    _points,
    _samples_last,
    _superquantile_kernel,
    _tail_kernel,
    _var_kernel,
)

__all__ = ["tail_fraction", "k_loss", "value_at_risk", "superquantile"]


# ---------------------------------------------------------------------------
# public API: tail fraction and quantile risks


def tail_fraction(
    losses: Any, a: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Share of the losses at or above ``a``: :math:`Q(a) = \sum_i p_i\,[\ell_i \ge a]`.

    Parameters
    ----------
    losses : array
        Per-sample losses, samples along ``axis``; finite and non-empty.
    a : float, 0-d or 1-d array
        Threshold(s), finite. A 1-d array of length A gives a result with a leading axis
        of length A. Like tilts, thresholds (and floors) may come from any library; they
        are converted to the namespace of ``losses``.
    axis : int, optional
        The sample axis (default: last).
    weights : array, optional
        Non-negative prior weights (1-d, one per sample, or the shape of ``losses`` with
        the samples along ``axis``), normalised to sum one. Default: uniform, so ``Q(a)``
        is a multiple of ``1/N``.
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        ``Q(a)`` in the namespace, floating dtype and device of ``losses``; shape
        ``a.shape + batch`` where ``batch`` is the shape of ``losses`` without ``axis``.

    Raises
    ------
    ValueError
        Empty or non-finite ``losses``, non-finite ``a``, bad ``weights``.

    See Also
    --------
    k_loss : The loss at a given tail share.
    tilted_tail_bound : Its bound from the tilted risk.
    min_tail_fraction : Its exact minimum over a model's parameters.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import tail_fraction
    >>> l = np.array([0.5, 1.0, 2.0, 4.0])
    >>> float(tail_fraction(l, 1.0))
    0.75
    >>> tail_fraction(l, np.array([0.0, 3.0, 5.0])).tolist()
    [1.0, 0.25, 0.0]
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    aa = _points(a, xp, l, "a")
    return array_result(_tail_kernel(l, p, aa, xp))


def k_loss(losses: Any, k: int, *, axis: int = -1, xp: Any = None) -> Any:
    r"""The k-th smallest loss :math:`R_{(k)}` (``k = 1``: minimum, ``k = N``: maximum).

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    k : int
        Rank, 1-based, in ``[1, N]``.
    axis : int, optional
        The sample axis (default: last).
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        The k-loss, shape ``batch`` (``losses`` without ``axis``), in the namespace,
        dtype and device of ``losses``.

    Raises
    ------
    TypeError
        ``k`` not an integer.
    ValueError
        ``k`` outside ``[1, N]``; empty or non-finite ``losses``.

    See Also
    --------
    k_loss_bound : Its bound from the tilted risk.
    value_at_risk : The loss at a tail probability.
    tail_fraction : The share of losses at or above a threshold.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import k_loss
    >>> l = np.array([3.0, 1.0, 2.0])
    >>> float(k_loss(l, 1)), float(k_loss(l, 2)), float(k_loss(l, 3))
    (1.0, 2.0, 3.0)
    """
    xp = namespace_of(losses=losses) if xp is None else xp
    l, _ = _samples_last(losses, axis, None, xp)
    kk = _check_k(k, l.shape[-1])
    return xp.sort(l, axis=-1)[..., kk - 1]


def value_at_risk(
    losses: Any, alpha: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Value-at-risk: the lower ``alpha``-quantile :math:`\min\{c : P(\ell \le c) \ge \alpha\}`.

    ``alpha`` is the confidence level in ``[0, 1)``; ``alpha = 0`` gives the smallest
    loss (over samples with positive weight), and the value tends to the largest loss
    as ``alpha -> 1``. It is the left end of the set of minimisers ``c`` of the
    Rockafellar-Uryasev objective in :func:`superquantile`. One definition holds with
    and without weights: the losses are sorted increasingly and the value is the first
    one (with positive weight) at which the cumulative mass reaches ``alpha``, up to
    the rounding of the sums; ``alpha = k / N`` picks the k-th smallest loss. This is
    :func:`numpy.quantile` with ``method="inverted_cdf"`` (and its ``weights``).

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
    axis, weights, xp
        As for :func:`tail_fraction`.

    Returns
    -------
    array
        Shape ``alpha.shape + batch``; namespace, dtype and device of ``losses``.

    See Also
    --------
    superquantile : The mean of the tail beyond it.
    k_loss : The k-th smallest loss.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import value_at_risk
    >>> l = np.array([1.0, 2.0, 3.0, 4.0])
    >>> value_at_risk(l, np.array([0.0, 0.5, 0.6, 0.99])).tolist()
    [1.0, 2.0, 3.0, 4.0]
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _host_levels(alpha)
    return _var_kernel(l, p, al, xp)


def superquantile(
    losses: Any, alpha: Any, *, axis: int = -1, weights: Any = None, xp: Any = None
) -> Any:
    r"""Superquantile (CVaR) at confidence level ``alpha``: the mean of the top ``1 - alpha``.

    The Rockafellar-Uryasev value

    .. math:: \mathrm{CVaR}_\alpha(\ell) = \min_c\; c + \frac{E_p[(\ell - c)_+]}{1 - \alpha},

    computed exactly for the discrete distribution ``sum_i p_i delta_{l_i}``: the
    largest losses are averaged until they hold mass ``1 - alpha``, the atom at the VaR
    entering with the fraction of its mass that is needed. ``superquantile(l, 0)`` is
    the (weighted) mean; the value is non-decreasing in ``alpha``, lies between
    :func:`value_at_risk` and the maximum, and tends to the maximum as ``alpha -> 1``.
    For uniform weights the kept mass ``N (1 - alpha)`` is formed exactly from ``alpha``.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
    axis, weights, xp
        As for :func:`tail_fraction`.

    Returns
    -------
    array
        Shape ``alpha.shape + batch``; namespace, dtype and device of ``losses``.

    Raises
    ------
    ValueError
        ``alpha`` outside ``[0, 1)``; empty or non-finite ``losses``; bad ``weights``.

    See Also
    --------
    value_at_risk : The quantile it averages beyond.
    entropic_value_at_risk : An upper bound on it from tilted risks.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import superquantile
    >>> l = np.array([1.0, 2.0, 3.0, 4.0])
    >>> float(superquantile(l, 0.0)), float(superquantile(l, 0.5))
    (2.5, 3.5)
    >>> float(superquantile(l, 0.625))  # top 1.5 samples: (4 + 0.5 * 3) / 1.5
    3.6666666666666665
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _host_levels(alpha)
    return array_result(_superquantile_kernel(l, p, al, xp))
