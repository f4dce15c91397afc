"""Entropic value-at-risk (EVaR) of a loss vector.

:func:`entropic_value_at_risk`: Ahmadi-Javid's EVaR at confidence ``alpha`` (or at a KL radius
``-log(1 - alpha)``), the infimum over positive tilts of the tilted risk plus
``-log(1 - alpha) / t``, solved per row on the host in float64.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import (
    device,
    namespace_of,
    to_numpy,
)
from ..risk import risk_kernel, tilt_for_kl
from ._common import _host_levels, _samples_last

__all__ = ["entropic_value_at_risk"]


# ---------------------------------------------------------------------------
# public API: entropic value-at-risk and the KL-DRO view


def _evar_row(l: np.ndarray, p: np.ndarray | None, level: float, xp_np: Any) -> tuple[float, float]:
    """EVaR of one loss row at KL radius ``level`` on the host (float64): (value, tilt).

    The minimising tilt is :func:`tiltlab.tilt_for_kl`'s (the derivative of
    ``R(t) + level / t`` has the sign of ``KL(w_t || p) - level``)."""
    if level == 0:
        return float(np.mean(l) if p is None else np.sum(p * l)), 0.0
    support = l if p is None else l[p > 0]
    lmax = float(np.max(support))
    try:
        t = float(tilt_for_kl(l, level, weights=p))
    except ValueError:  # the radius is within rounding of its limit: the value is the max
        return lmax, math.inf
    if not math.isfinite(t):
        return lmax, math.inf
    risk = float(risk_kernel(xp_np.asarray(l), None if p is None else xp_np.asarray(p),
                              xp_np.asarray(t), xp_np))  # fmt: skip
    return min(risk + level / t, lmax), t


def _radii(alpha: Any, radius: Any) -> np.ndarray:
    """The KL radii (0-d or 1-d float64 host array) from exactly one of the two."""
    if (alpha is None) == (radius is None):
        raise TypeError(
            "pass exactly one of `alpha` (a confidence level) and `radius` (a KL radius, "
            "radius = -log(1 - alpha))"
        )
    if alpha is not None:
        return -np.log1p(-_host_levels(alpha))
    if isinstance(radius, bool):
        raise TypeError(f"`radius` must be a number >= 0 or a 1-d array, got {radius!r}")
    try:
        arr = np.asarray(to_numpy(radius) if hasattr(radius, "__array_namespace__") else radius)
    except (TypeError, ValueError) as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"`radius` must be a number >= 0: {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"`radius` must be real, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size == 0):
        raise ValueError(f"`radius` must be a scalar or a non-empty 1-d array, got {arr.shape}")
    if np.any(np.isnan(arr)) or np.any(arr < 0):
        raise ValueError(f"`radius` must be >= 0 (a KL divergence), got {radius!r}")
    return arr


def entropic_value_at_risk(
    losses: Any,
    alpha: Any = None,
    *,
    radius: Any = None,
    axis: int = -1,
    weights: Any = None,
    return_tilt: bool = False,
    xp: Any = None,
) -> Any:
    r"""Entropic value-at-risk at confidence level ``alpha``.

    .. math:: \mathrm{EVaR}_\alpha(\ell) = \inf_{t > 0}\; R(t) + \frac{\log(1/(1-\alpha))}{t}
              = \sup\{E_q[\ell] : \mathrm{KL}(q \| p) \le \log(1/(1-\alpha))\},

    Ahmadi-Javid's (2012) EVaR written with the confidence level ``alpha`` (his
    ``EVaR_{1-a}`` uses ``a = 1 - alpha``); ``R`` is the tilted risk under the prior.
    It is the tightest Chernoff bound on the VaR, so ``VaR <= CVaR <= EVaR <= max``.
    ``alpha = 0`` gives the mean (the infimum as ``t -> 0``); when the mass at the
    largest loss is at least ``1 - alpha`` the infimum is the maximum, reached as
    ``t -> inf``. The same value at a KL radius ``r`` directly: ``radius=r`` (which
    ``alpha = 1 - exp(-r)`` cannot express once it rounds to 1, from ``r`` about 36.7).

    The objective is unimodal in ``t``: its derivative has the sign of
    ``KL(w_t || p) - log(1/(1-alpha))`` (``w_t`` the tilted weights), which increases
    with ``t``: the minimiser is :func:`tiltlab.tilt_for_kl` of the radius, solved in
    float64 on the host, and the objective is evaluated there.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
    radius : float or 1-d array, optional
        Instead of ``alpha``: the KL radius (or radii) ``-log(1 - alpha) >= 0``, any size
        (``inf`` gives the maximum). Exactly one of ``alpha`` and ``radius`` is given.
    axis, weights, xp
        As for :func:`tail_fraction`.
    return_tilt : bool, optional
        Also return the minimising tilt (``0`` at ``alpha = 0``, ``inf`` when the
        infimum is the maximum).

    Returns
    -------
    value : array
        Shape ``alpha.shape + batch`` (0-d for a single row and level), in the
        namespace, dtype and device of ``losses``.
    tilt : array
        Only with ``return_tilt=True``; same shape, namespace and dtype.

    Raises
    ------
    TypeError
        Both or neither of ``alpha`` and ``radius``.
    ValueError
        ``alpha`` outside ``[0, 1)``, ``radius`` negative or NaN, bad losses or weights.

    See Also
    --------
    tiltlab.tilt_for_kl : The minimising tilt at a radius.
    superquantile : The risk measure it bounds from above.
    kl_dro_dual : The KL-robust view of the tilted risk.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.bounds import entropic_value_at_risk, superquantile
    >>> l = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    >>> ev, t = entropic_value_at_risk(l, 0.5, return_tilt=True)
    >>> bool(superquantile(l, 0.5) <= ev <= 10.0), bool(t > 0)
    (True, True)
    >>> float(entropic_value_at_risk(l, 0.0))  # the mean
    3.2
    >>> float(entropic_value_at_risk(l, radius=50.0))  # alpha = 1 - e^-50 rounds to 1
    10.0
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _radii(alpha, radius)
    xp_np = namespace_of(x=np.zeros(1))
    l_h = np.asarray(to_numpy(l), dtype=np.float64)
    p_h = None if p is None else np.asarray(to_numpy(p), dtype=np.float64)
    if p_h is not None:
        p_h = np.broadcast_to(p_h, l_h.shape)
    batch = l_h.shape[:-1]
    rows = l_h.reshape(-1, l_h.shape[-1])
    prow = None if p_h is None else p_h.reshape(-1, l_h.shape[-1])
    vals = np.empty(al.shape + (rows.shape[0],))
    tilts = np.empty_like(vals)
    for ia, a_lev in np.ndenumerate(al):
        for r in range(rows.shape[0]):
            v, tl_ = _evar_row(rows[r], None if prow is None else prow[r], float(a_lev), xp_np)
            vals[ia + (r,)] = v
            tilts[ia + (r,)] = tl_
    shape = al.shape + batch
    value = xp.asarray(vals.reshape(shape).tolist(), dtype=l.dtype, device=device(l))
    if not return_tilt:
        return value
    tilt = xp.asarray(tilts.reshape(shape).tolist(), dtype=l.dtype, device=device(l))
    return value, tilt
