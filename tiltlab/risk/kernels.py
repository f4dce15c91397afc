"""The tilted-risk and tilted-weight kernels, without validation.

Losses have samples on the last axis and priors are normalised (or None). The kernels
form the shifted exponents for one tilt or a grid of tilts (vectorised, no host reads)
and leave the regime rule to :mod:`tiltlab.accumulator`; :mod:`tiltlab.bounds` and the
hierarchy reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._compat import (
    apply_inplace,
    device,
    tiny_sqrt,
)
from ..accumulator import risk_of_exponents, series_threshold

__all__: list[str] = []


# ---------------------------------------------------------------------------
# kernels (no validation; l has samples on the last axis, p normalised or None)


@dataclass
class _Shifted:
    """Quantities shared by the risk and the weights for one set of tilts."""

    t_fin: Any  # tilt with 0/inf replaced by +-1 (placeholders, masked later)
    c: Any  # shift: max over the support for t > 0, min for t < 0
    u: Any  # t_fin * (l - c) <= 0, zero off the support
    half: Any  # (l - c) / 2, zero off the support
    lmax: Any
    lmin: Any


def support_range(l: Any, p: Any, xp: Any) -> tuple[Any, Any]:
    """(max, min) over the support of ``p`` along the last axis."""
    if p is None:
        return xp.max(l, axis=-1), xp.min(l, axis=-1)
    ninf = xp.asarray(-xp.inf, dtype=l.dtype, device=device(l))
    pinf = xp.asarray(xp.inf, dtype=l.dtype, device=device(l))
    on = p > 0
    return xp.max(xp.where(on, l, ninf), axis=-1), xp.min(xp.where(on, l, pinf), axis=-1)


def prior_mean(a: Any, p: Any, xp: Any) -> Any:
    """Prior-weighted sum along the last axis (the mean when ``p`` is None)."""
    if p is None:
        return xp.mean(a, axis=-1)
    return xp.sum(p * a, axis=-1)


def _safe_mean(a: Any, p: Any, xp: Any) -> Any:
    """:func:`prior_mean` that cannot overflow for finite ``a``: where the plain mean does (losses
    near the float maximum), the sum of ``a / n`` is used instead (no synchronisation)."""
    m = prior_mean(a, p, xp)
    if p is not None:
        return m  # a sum of p * a with p summing to one cannot overflow
    return xp.where(xp.isfinite(m), m, xp.sum(a * (1.0 / a.shape[-1]), axis=-1))


def _shift(l: Any, p: Any, tt: Any, xp: Any) -> _Shifted:
    lmax, lmin = support_range(l, p, xp)
    one = xp.ones_like(tt)
    fin = xp.isfinite(tt) & (tt != 0)
    t_fin = xp.where(fin, tt, xp.where(tt < 0, -one, one))
    # broadcast tilt against the batch shape of l (grid axis leads)
    tb = xp.reshape(t_fin, tuple(tt.shape) + (1,) * (l.ndim - 1))
    c = xp.where(tb > 0, lmax, lmin)
    # halved before subtracting: exact (scaling by 2 commutes with rounding) and finite for
    # spreads beyond the float maximum
    d = l * 0.5 - c[..., None] * 0.5
    if p is not None:
        d = xp.where(p > 0, d, xp.zeros_like(d))
    u = (tb[..., None] * d) * 2.0
    return _Shifted(t_fin=tb, c=c, u=u, half=d, lmax=lmax, lmin=lmin)


def risk_kernel(l: Any, p: Any, tt: Any, xp: Any) -> Any:
    """Tilted risk along the last axis of ``l`` for tilts ``tt`` (0-d or 1-d).

    The normalisers are formed here and finished by
    :func:`tiltlab.accumulator.finish_risk` (the one home of the regime rule). A tilt
    that carries autograd (PyTorch) takes the cumulant series near zero, so that
    ``dR/dt`` is ``Var / 2`` at ``t = 0`` and right at tiny tilts.
    """
    s = _shift(l, p, tt, xp)
    tb = xp.reshape(tt, tuple(tt.shape) + (1,) * (l.ndim - 1))
    scale = xp.abs(s.t_fin) * _half_gap(s.lmax, s.lmin) * 2.0
    mean = _safe_mean(l, p, xp)
    series = None
    if getattr(tt, "requires_grad", False):
        series = _series(l, p, mean, tb, s, xp)
    tiny = tiny_sqrt(l.dtype, xp)
    r = risk_of_exponents(s.u, p, s.c, scale, mean + xp.zeros_like(s.c), s.t_fin, xp,
                          tiny=tiny, series=series)
    r = xp.where(tb == 0, mean + xp.zeros_like(r), r) if series is None else r
    r = xp.where(tb == xp.inf, s.lmax + xp.zeros_like(r), r)
    r = xp.where(tb == -xp.inf, s.lmin + xp.zeros_like(r), r)
    return r


def _half_gap(a: Any, b: Any) -> Any:
    return a * 0.5 - b * 0.5


def _series(l: Any, p: Any, mean: Any, tb: Any, s: _Shifted, xp: Any) -> tuple:
    """``(t, k2, k3, near)`` for the cumulant series of the risk near ``t = 0``."""
    d = l - mean[..., None]
    k2 = prior_mean(d * d, p, xp)
    k3 = prior_mean(d * d * d, p, xp)
    k2 = xp.where(xp.isfinite(k2), k2, xp.zeros_like(k2))  # 0 * inf must not reach t = 0
    k3 = xp.where(xp.isfinite(k3), k3, xp.zeros_like(k3))
    fin = xp.isfinite(tb)
    t0 = xp.where(fin, tb, xp.zeros_like(tb))
    near = fin & (xp.abs(t0) * _half_gap(s.lmax, s.lmin) * 2.0 < series_threshold(l.dtype, xp))
    return t0, k2, k3, near


def weights_kernel(l: Any, p: Any, tt: Any, xp: Any) -> Any:
    """Tilted weights along the last axis; the tilt grid (if any) leads."""
    s = _shift(l, p, tt, xp)
    tb = xp.reshape(tt, tuple(tt.shape) + (1,) * l.ndim)
    # uniform prior normalised by a sum, not by the sample count (which a lazy array with
    # unknown chunk sizes does not know)
    ones = xp.ones_like(l)
    prior = ones / xp.sum(ones, axis=-1, keepdims=True) if p is None else p
    grad = getattr(tt, "requires_grad", False)
    u = s.u
    if grad:  # the exact tilt at t = 0 too, so that dw/dt = w (l - sum w l) there
        t0 = xp.where(xp.isfinite(tb), tb, xp.zeros_like(tb))
        u = xp.where(xp.isfinite(tb), (t0 * s.half) * 2.0, u)
    e = prior * xp.exp(u)
    w = e / xp.sum(e, axis=-1, keepdims=True)
    # t = +-inf: prior restricted to the tied extreme set (the limit of w as t -> +-inf)
    is_ext = s.u == 0
    if p is not None:
        is_ext = is_ext & (p > 0)
    ext = xp.where(is_ext, prior + xp.zeros_like(w), xp.zeros_like(w))
    total = xp.sum(ext, axis=-1, keepdims=True)
    ext = ext / xp.where(total > 0, total, xp.ones_like(total))  # 0 only for NaN losses
    w = xp.where(xp.isinf(tb), ext, w)
    if not grad:
        w = xp.where(tb == 0, prior + xp.zeros_like(w), w)
    return w


def _inplace(fn: Any, u: Any, xp: Any) -> Any:
    """``fn(u)`` written over the temporary ``u`` where the library allows it."""
    return apply_inplace(fn, u, xp)


def _inplace_exp(u: Any, xp: Any) -> Any:
    return _inplace(xp.exp, u, xp)
