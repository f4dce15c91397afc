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
)
from .inputs import narrow, widen_half
from .sample import tilted_risk

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

    The difference ``r_i - R_beta`` goes through ``expm1``, so that tiny ``beta`` loses
    nothing to cancellation, and ``R_beta`` is the library's exact tilted risk.

    Parameters
    ----------
    rewards : array
        Rewards; the members of a group lie along ``axis`` (e.g. shape ``(n_prompts,
        n_responses)`` with ``axis=-1``). Integer and boolean rewards are promoted to the
        namespace's default floating dtype.
    beta : float
        The tilt, a finite real number.
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
    if groups is None:
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
        pieces.append(_advantage(members, b, ax, xp))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0])
    out = xp.take(xp.concat(pieces, axis=ax), xp.asarray(inverse, device=dev), axis=ax)
    return narrow(out, narrow_to, xp)


def _advantage(r: Any, b: float, ax: int, xp: Any) -> Any:
    """The advantages of one group (its members along ``ax``)."""
    d = r - tilted_risk(r, b, axis=ax, keepdims=True, check_finite=False)
    if b == 0.0:
        return d
    x = b * d
    # |x| below eps: expm1(x) / b = d (1 + x / 2) to rounding, and x may be subnormal
    eps = float(xp.finfo(d.dtype).eps)
    return xp.where(xp.abs(x) < eps, d * (1.0 + 0.5 * x), xp.expm1(x) / b)
