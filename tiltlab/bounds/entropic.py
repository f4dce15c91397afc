"""Entropic value-at-risk (EVaR) of a loss vector.

:func:`entropic_value_at_risk`: Ahmadi-Javid's EVaR at confidence ``alpha``, the infimum
over positive tilts of the tilted risk plus ``-log(1 - alpha) / t``, solved per row on
the host in float64.
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
from ..risk import (
    _risk_kernel,
    _weights_kernel,
)
from ._common import _host_levels, _samples_last

__all__ = ["entropic_value_at_risk"]


# ---------------------------------------------------------------------------
# public API: entropic value-at-risk and the KL-DRO view


def _evar_row(l: np.ndarray, p: np.ndarray | None, alpha: float, xp_np: Any) -> tuple[float, float]:
    """EVaR of one loss row on the host (float64); returns (value, minimising tilt)."""
    from scipy.optimize import brentq

    if alpha == 0:
        return float(np.mean(l) if p is None else np.sum(p * l)), 0.0
    support = l if p is None else l[p > 0]
    lmax, lmin = float(np.max(support)), float(np.min(support))
    at_max = np.count_nonzero(l == lmax) / l.size if p is None else float(np.sum(p[l == lmax]))
    if at_max >= 1.0 - alpha or lmax == lmin:
        # KL(w_t || p) never reaches log(1/(1-alpha)): the infimum is the limit t -> inf
        return lmax, math.inf
    level = -math.log1p(-alpha)
    la = xp_np.asarray(l)
    pa = None if p is None else xp_np.asarray(p)

    def risk(t: float) -> float:
        return float(_risk_kernel(la, pa, xp_np.asarray(t), xp_np))

    def excess_kl(s: float) -> float:
        # d/dt [R(t) + level/t] has the sign of KL(w_t || p) - level, which increases in t
        t = math.exp(s)
        tt = xp_np.asarray(t)
        r = float(_risk_kernel(la, pa, tt, xp_np))
        w = np.asarray(_weights_kernel(la, pa, tt, xp_np))
        return float(np.sum(w * (t * (l - r)))) - level

    # start near t = 1/spread (capped: a subnormal spread would overflow exp)
    lo = hi = min(-math.log(lmax - lmin), 690.0)
    while excess_kl(lo) >= 0 and lo > -700:
        lo -= 2.0
    while excess_kl(hi) <= 0:
        if hi > 700:
            return lmax, math.inf
        hi += 2.0
    s = brentq(excess_kl, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    t = math.exp(s)
    return min(risk(t) + level / t, lmax), t


def entropic_value_at_risk(
    losses: Any,
    alpha: Any,
    *,
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
    ``t -> inf``.

    The objective is unimodal in ``t``: its derivative has the sign of
    ``KL(w_t || p) - log(1/(1-alpha))`` (``w_t`` the tilted weights), which increases
    with ``t``. The root is found by Brent's method in ``log t`` on a bracket, in float64
    on the host, and the objective is evaluated there.

    Parameters
    ----------
    losses : array
        Per-sample losses along ``axis``; finite and non-empty.
    alpha : float or 1-d array
        Confidence level(s) in ``[0, 1)``; a 1-d array adds a leading axis.
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

    See Also
    --------
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
    """
    xp = namespace_of(losses=losses, weights=weights) if xp is None else xp
    l, p = _samples_last(losses, axis, weights, xp)
    al = _host_levels(alpha)
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
