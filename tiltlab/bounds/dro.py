"""The KL distributionally robust view of tilted risks.

:func:`kl_dro_dual` (a tilted risk as the value of a KL-penalised worst case),
:func:`worst_case_distribution` (the maximising distribution, the tilted weights) and
:func:`kl_divergence`.
"""

from __future__ import annotations

import numbers
from typing import Any

from .._compat import (
    array_result,
    as_float_array,
    check_finite,
    device,
    namespace_of,
    normalize_axis,
    real_number,
    to_numpy,
)
from ..risk import (
    prepare_tilt,
    risk_kernel,
    weights_kernel,
)
from ._common import _samples_last
from .entropic import entropic_value_at_risk

__all__ = ["kl_dro_dual", "worst_case_distribution", "kl_divergence"]


def kl_dro_dual(
    losses: Any,
    t: Any = None,
    *,
    radius: Any = None,
    axis: int = -1,
    weights: Any = None,
    xp: Any = None,
) -> tuple[Any, Any]:
    r"""The tilted risk as a KL-regularised distributionally robust risk.

    By the Donsker-Varadhan formula, for ``t > 0``

    .. math:: R(t) = \max_q\; E_q[\ell] - \frac{\mathrm{KL}(q \| p)}{t},

    over distributions ``q`` on the samples, attained at the tilted weights
    ``q_i = p_i e^{t\ell_i} / \sum_j p_j e^{t\ell_j}``. For ``t < 0`` the same formula
    holds with ``min`` (``R(t) = min_q E_q[l] + KL(q||p)/|t|``), ``t = 0`` forces
    ``q = p`` (the mean), and ``t = +-inf`` drops the penalty (``q`` on the extreme
    losses).

    With ``radius=r`` instead of ``t``, the constrained form: the worst case
    :math:`\max\{E_q[\ell] : \mathrm{KL}(q\|p) \le r\} = \min_{t>0} R(t) + r/t`,
    attained at the tilted weights of the minimising tilt
    :func:`tiltlab.tilt_for_kl` (per row; ``t = inf``, the prior on the largest losses,
    once ``r`` reaches the divergence of that distribution).

    Parameters
    ----------
    losses, t, axis, weights, xp
        As for :func:`tiltlab.tilted_risk`.
    radius : float, optional
        A KL radius ``>= 0`` in place of ``t`` (exactly one of the two).

    Returns
    -------
    value : array
        ``R(t)``, the optimal value (shape ``t.shape + batch``); with ``radius``, the
        worst-case expected loss (shape ``batch``).
    q : array
        The optimal distribution, the tilted weights (shape ``t.shape + losses.shape``
        with the samples on the last axis).

    Raises
    ------
    TypeError
        Both or neither of ``t`` and ``radius``.

    See Also
    --------
    worst_case_distribution : The maximising distribution.
    kl_divergence : The divergence of the ball.
    tiltlab.tilted_risk : The tilted risk itself.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import kl_divergence, kl_dro_dual
    >>> l = np.array([0.0, 1.0, 3.0])
    >>> value, q = kl_dro_dual(l, 2.0)
    >>> bool(np.isclose(value, q @ l - kl_divergence(q) / 2.0))
    True
    >>> worst, q = kl_dro_dual(l, radius=0.2)  # the worst case in a KL ball
    >>> bool(np.isclose(kl_divergence(q), 0.2)), bool(np.isclose(worst, q @ l))
    (True, True)
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    if (t is None) == (radius is None):
        raise TypeError("pass exactly one of `t` (a tilt) and `radius` (a KL radius)")
    l, p = _samples_last(losses, axis, weights, xp)
    if radius is not None:
        return _constrained(l, p, radius, xp)
    tt, _ = prepare_tilt(t, xp, l)
    return risk_kernel(l, p, tt, xp), weights_kernel(l, p, tt, xp)


def worst_case_distribution(
    losses: Any,
    t: Any = None,
    *,
    radius: Any = None,
    axis: int = -1,
    weights: Any = None,
    xp: Any = None,
) -> Any:
    r"""The maximiser ``q`` of :math:`E_q[\ell] - \mathrm{KL}(q\|p)/t` (``t > 0``).

    The tilted weights: the worst-case reweighting of the prior within the KL penalty
    (for ``t < 0`` the minimiser, the best case). With ``radius=r`` instead of ``t``:
    the maximiser of :math:`E_q[\ell]` over the KL ball :math:`\mathrm{KL}(q\|p)\le r`.
    See :func:`kl_dro_dual`.

    Parameters
    ----------
    losses, t, axis, weights, xp
        As for :func:`tiltlab.tilted_risk`.
    radius : float, optional
        A KL radius ``>= 0`` in place of ``t``.

    Returns
    -------
    array
        ``q`` with the samples on the last axis (a tilt grid leads).

    See Also
    --------
    kl_dro_dual : The value of the worst case.
    tiltlab.tilted_weights : The same weights seen as the gradient's.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import worst_case_distribution
    >>> q = worst_case_distribution(np.array([0.0, 0.0, 1.0]), 50.0)
    >>> [round(v, 6) for v in q.tolist()]
    [0.0, 0.0, 1.0]
    """
    return kl_dro_dual(losses, t, radius=radius, axis=axis, weights=weights, xp=xp)[1]


def _constrained(l: Any, p: Any, radius: Any, xp: Any) -> tuple[Any, Any]:
    """The worst case over the KL ball of radius ``radius`` (a scalar), row by row."""
    if isinstance(radius, bool) or not isinstance(radius, numbers.Real):
        try:
            radius = real_number(radius, "radius")
        except (TypeError, ValueError):
            raise TypeError(f"`radius` must be a real number, got {radius!r}") from None
    value, tilt = entropic_value_at_risk(l, radius=float(radius), weights=p, return_tilt=True)
    n = l.shape[-1]
    rows = xp.reshape(l, (-1, n))
    prows = None if p is None else xp.reshape(xp.broadcast_to(p, l.shape), (-1, n))
    tilts = to_numpy(xp.reshape(tilt, (-1,)))
    q = [
        weights_kernel(rows[i, :], None if prows is None else prows[i, :],
                        xp.asarray(float(tilts[i]), dtype=l.dtype, device=device(l)), xp)
        for i in range(rows.shape[0])
    ]  # fmt: skip
    return value, xp.reshape(xp.stack(q), l.shape)


def kl_divergence(q: Any, p: Any = None, *, axis: int = -1, xp: Any = None) -> Any:
    r"""Kullback-Leibler divergence :math:`\mathrm{KL}(q\|p) = \sum_i q_i \log(q_i/p_i)`.

    ``q`` and ``p`` are non-negative weights, each normalised to sum one along
    ``axis`` (``p`` uniform by default). Terms with ``q_i = 0`` contribute 0; a ``q_i > 0``
    with ``p_i = 0`` gives ``+inf``.

    Parameters
    ----------
    q : array
        Weights, samples along ``axis``.
    p : array, optional
        Reference weights, 1-d with one entry per sample or of the shape of ``q``.
    axis : int, optional
        The sample axis (default: last).
    xp : namespace, optional
        Array namespace (inferred by default).

    Returns
    -------
    array
        Shape of ``q`` without ``axis``; namespace, dtype and device of ``q``.

    Raises
    ------
    ValueError
        Empty, negative, non-finite or all-zero ``q`` or ``p``; mismatched shapes.

    See Also
    --------
    kl_dro_dual : The robust risk over a KL ball.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import kl_divergence
    >>> round(float(kl_divergence(np.array([1.0, 0.0]), np.array([0.5, 0.5]))), 12)
    0.69314718056
    """
    xp = namespace_of(q=q, p=p) if xp is None else xp
    qq = as_float_array(q, xp, name="q")
    if qq.ndim == 0 or any(s == 0 for s in qq.shape):
        raise ValueError(f"`q` must be a non-empty array, got shape {tuple(qq.shape)}")
    ax = normalize_axis(axis, qq.ndim)
    if ax != qq.ndim - 1:
        qq = xp.moveaxis(qq, ax, -1)
    check_finite(qq, xp, name="q")
    if not bool(xp.all(qq >= 0)):
        raise ValueError("`q` must be non-negative")
    # scaled by the largest entry before normalising: finite weights whose sum overflows
    # keep their ratios
    tq = xp.max(qq, axis=-1, keepdims=True)
    if not bool(xp.all(tq > 0)):
        raise ValueError("`q` must not be all zero")
    qq = qq / tq
    qq = qq / xp.sum(qq, axis=-1, keepdims=True)
    if p is None:
        pp = xp.full_like(qq, 1.0 / qq.shape[-1])
    else:
        pp = as_float_array(p, xp, name="p", dev=device(qq))
        pp = xp.astype(pp, qq.dtype) if pp.dtype != qq.dtype else pp
        if pp.ndim == 0:
            raise ValueError("`p` must be an array with one entry per sample")
        if pp.ndim > 1 and ax != qq.ndim - 1:
            pp = xp.moveaxis(pp, ax, -1)  # a 1-d p already lines up with the sample axis
        if pp.shape[-1] != qq.shape[-1] or (pp.ndim != 1 and tuple(pp.shape) != tuple(qq.shape)):
            raise ValueError(
                f"`p` of shape {tuple(pp.shape)} does not match `q` of shape {tuple(qq.shape)} "
                "(axis moved last); pass one entry per sample or the shape of `q`"
            )
        check_finite(pp, xp, name="p")
        if not bool(xp.all(pp >= 0)):
            raise ValueError("`p` must be non-negative")
        tp = xp.max(pp, axis=-1, keepdims=True)
        if not bool(xp.all(tp > 0)):
            raise ValueError("`p` must not be all zero")
        pp = pp / tp
        pp = xp.broadcast_to(pp / xp.sum(pp, axis=-1, keepdims=True), tuple(qq.shape))
    on = qq > 0
    ok = pp > 0
    one = xp.ones_like(qq)
    terms = qq * (xp.log(xp.where(on, qq, one)) - xp.log(xp.where(ok, pp, one)))
    terms = xp.where(on, terms, xp.zeros_like(terms))
    terms = xp.where(on & ~ok, xp.full_like(terms, xp.inf), terms)
    return array_result(xp.sum(terms, axis=-1))
