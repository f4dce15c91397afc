"""The tilted advantage of risk-sensitive group policy optimisation:
:func:`tilted_advantage`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import (
    as_float_array,
    check_finite,
    device,
    host_labels,
    namespace_of,
    normalize_axis,
    real_number,
    tiny_sqrt,
)
from ..accumulator.packed import exponent_terms, log_normaliser
from .fast_path import _host_tilt, _quiet
from .inputs import narrow, widen_half

__all__ = ["tilted_advantage"]


def tilted_advantage(rewards: Any, beta: Any, *, groups: Any = None, axis: int = -1) -> Any:
    r"""The tilted advantage :math:`A_i = (e^{\beta (r_i - R_\beta)} - 1) / \beta` of each
    reward against the :math:`\beta`-tilted mean :math:`R_\beta` of its group.

    This is the advantage of risk-sensitive group policy optimisation (RS-GRPO): GRPO's
    group-mean baseline replaced by the tilted mean
    :math:`R_\beta = \frac{1}{\beta}\log\frac{1}{n}\sum_j e^{\beta r_j}` of the group's
    rewards (:func:`tilted_risk` at tilt ``beta``). :math:`A_i` is the derivative of the
    group's tilted mean with respect to :math:`r_i`, times ``n``, minus one, divided by
    ``beta``: the advantages of a group average to zero. At ``beta = 0`` it is
    ``r - mean(r)``, GRPO's advantage before scaling; ``beta > 0`` favours the best
    responses of a group (optimistic, pass@k-seeking), ``beta < 0`` the worst.

    No absolute quantity is subtracted: with the shift ``c`` the group's largest reward
    (``beta > 0``; its smallest for ``beta < 0``), the exponents
    :math:`u_i = \beta (r_i - c) \le 0` (formed in halves, so that spreads beyond the
    float maximum stay finite) and the log normaliser
    :math:`L = \log\frac{1}{n}\sum_j e^{u_j} = \beta (R_\beta - c)` (through
    ``log1p`` of the ``expm1`` terms while :math:`|\beta|` times the spread is at most 1,
    the tilted risk's rule) give :math:`A_i = \operatorname{expm1}(u_i - L) / \beta`.
    The error of :math:`A_i` is then a few ulps of the spread, times the weight
    :math:`n w_i = e^{\beta (r_i - R_\beta)}`, plus a few ulps of :math:`A_i` itself,
    for rewards of any size and at any ``beta`` (about :math:`\pm 1 / \beta` at large
    :math:`|\beta|`). Where :math:`|\beta|` times the spread lies below the square root
    of the smallest normal number, :math:`A_i` is ``r_i - mean(r)`` to rounding, and
    that is what is returned. ``beta`` is taken in the rewards' precision: a value beyond
    float32's range is infinite for float32 rewards, as in :func:`tilted_risk`, and every
    advantage is then 0 (their limit).

    Parameters
    ----------
    rewards : array
        Rewards; the members of a group lie along ``axis`` (e.g. shape ``(n_prompts,
        n_responses)`` with ``axis=-1``). Integer and boolean rewards are promoted to the
        namespace's default floating dtype.
    beta : float
        The tilt, a finite real number (rounded to the rewards' precision).
    groups : array of int, optional
        Integer group labels, one per entry along ``axis``: the members of a group are
        the entries with equal labels (in any order). Default: all entries along
        ``axis`` form one group.
    axis : int, optional
        The axis of a group's members. Default: the last.

    Returns
    -------
    array
        The advantages, of the shape, namespace, dtype and device of ``rewards``.

    Raises
    ------
    ValueError
        Empty or non-finite ``rewards``, non-finite ``beta``, ``groups`` of the wrong
        length or with non-integer labels, an ``axis`` out of range.
    TypeError
        ``beta`` not a real number, complex ``rewards``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import tilted_advantage
    >>> r = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    >>> tilted_advantage(r, 0.0)
    array([[-0.5 ,  0.5 ,  0.5 , -0.5 ],
           [ 0.25,  0.25,  0.25, -0.75]])
    >>> a = tilted_advantage(r, 4.0)
    >>> bool(np.allclose(a.mean(axis=-1), 0.0))
    True
    >>> tilted_advantage(np.array([0.0, 1.0, 2.0, 5.0]), -1.0, groups=[0, 1, 0, 1]).round(3)
    array([-0.762, -0.964,  0.762,  0.964])
    """
    b = real_number(beta, "beta")
    if not math.isfinite(b):
        raise ValueError(f"`beta` must be finite, got {b}")
    xp = namespace_of(rewards=rewards)
    r = as_float_array(rewards, xp, name="rewards")
    if r.ndim == 0:
        raise ValueError("`rewards` must have at least one dimension (got a scalar)")
    ax = normalize_axis(axis, r.ndim)
    if any(s == 0 for s in r.shape):
        raise ValueError(f"`rewards` must not be empty (shape {tuple(r.shape)})")
    check_finite(r, xp, name="rewards")
    r, narrow_to = widen_half(r, xp)
    b = float(_host_tilt(b, r, xp))  # in the rewards' precision (+-inf beyond float32's)
    if groups is None:
        with _quiet(xp):
            out = _advantage(r, b, ax, xp)
        return narrow(out, narrow_to, xp)
    labels = host_labels(groups, name="groups")
    n = r.shape[ax]
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(
            f"`groups` must be 1-d with one label per entry along `axis` ({n}), got shape "
            f"{labels.shape}"
        )
    if labels.dtype.kind not in "iub":
        raise ValueError(f"`groups` must hold integer labels, got dtype {labels.dtype}")
    codes = np.unique(labels, return_inverse=True)[1].reshape(-1)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    dev = device(r)
    pieces = []
    for idx in np.split(order, bounds):
        members = xp.take(r, xp.asarray(idx, device=dev), axis=ax)
        with _quiet(xp):
            pieces.append(_advantage(members, b, ax, xp))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0])
    out = xp.take(xp.concat(pieces, axis=ax), xp.asarray(inverse, device=dev), axis=ax)
    return narrow(out, narrow_to, xp)


def _advantage(r: Any, b: float, ax: int, xp: Any) -> Any:
    """The advantages of one group (its members along ``ax``) for the tilt ``b`` in the
    rewards' precision (0 and +-inf included)."""
    if math.isinf(b):  # the limit of (n w_i - 1) / beta
        return xp.zeros_like(r)
    hi, lo = xp.max(r, axis=ax, keepdims=True), xp.min(r, axis=ax, keepdims=True)
    c, other = (hi, lo) if b >= 0 else (lo, hi)
    h = r * 0.5 - c * 0.5  # (r - c) / 2: exact, and finite for any finite rewards
    mean_h = xp.mean(h, axis=ax, keepdims=True)
    # where the sum of the halves overflows, the sum of h / n cannot (n counted where a
    # lazy array does not know its length)
    n = h.shape[ax]
    count = n if isinstance(n, int) else xp.sum(xp.ones_like(h), axis=ax, keepdims=True)
    spill = xp.sum(h / count, axis=ax, keepdims=True)
    centred = (h - xp.where(xp.isfinite(mean_h), mean_h, spill)) * 2.0
    if b == 0.0:
        return centred
    scale = (abs(b) * xp.abs(other * 0.5 - c * 0.5)) * 2.0  # |beta| (hi - lo)
    u = (b * h) * 2.0  # <= 0; -inf where it overflows, whose weight is 0 as exp(u) is
    ex, em = exponent_terms(u, xp, squares=False)
    mean_ex = xp.mean(ex, axis=ax, keepdims=True)
    mean_em = xp.mean(em, axis=ax, keepdims=True)
    log_z = log_normaliser(mean_em, mean_ex, scale <= 1.0, xp)  # beta (R - c)
    a = xp.expm1(u - log_z) / b  # (n w_i - 1) / beta, n w_i = exp(beta (r_i - R))
    # below sqrt(tiny) the exponents may be subnormal; A = r - mean(r) to rounding there
    return xp.where(scale < tiny_sqrt(r.dtype, xp), centred, a)
