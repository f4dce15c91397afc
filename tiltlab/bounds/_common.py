"""Input handling and the vectorised kernels shared by the functions of :mod:`tiltlab.bounds`.

Private. Validation of losses, priors, thresholds, confidence levels, ``k`` and floors,
and the kernels (samples on the last axis) behind the tail fraction, the quantile risks
and the tilted tail bounds.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from .._compat import (
    as_float_array,
    as_parameter,
    check_finite,
    device,
    host_real,
    is_array_api_obj,
    namespace_of,
    normalize_axis,
    tiny_sqrt,
    to_numpy,
)
from ..risk import (
    prepare_losses,
    prepare_prior,
    prior_mean,
    risk_kernel,
    support_range,
)

__all__: list[str] = []


# ---------------------------------------------------------------------------
# input handling


def _samples_last(losses: Any, axis: int, weights: Any, xp: Any) -> tuple[Any, Any]:
    """Validated losses with the sample axis moved last, and the normalised prior."""
    l = prepare_losses(losses, xp, True)
    ax = normalize_axis(axis, l.ndim)
    if ax != l.ndim - 1:
        l = xp.moveaxis(l, ax, -1)
    return l, prepare_prior(weights, l, xp, ax)


def _points(value: Any, xp: Any, like: Any, name: str) -> Any:
    """A finite scalar or 1-d array of thresholds in the dtype/device of ``like``.

    Like tilts, thresholds are parameters: numbers or arrays of any library are
    converted to ``like``'s namespace.
    """
    arr = as_parameter(value, xp, like, name=name)
    check_finite(arr, xp, name=name)
    return arr


def _host_levels(alpha: Any) -> np.ndarray:
    """Confidence level(s) as a float64 host array (0-d or 1-d), validated in [0, 1)."""
    if isinstance(alpha, bool) or alpha is None:
        raise TypeError(f"`alpha` must be a number in [0, 1) or a 1-d array, got {alpha!r}")
    try:
        arr = np.asarray(to_numpy(alpha) if is_array_api_obj(alpha) else alpha)
    except (TypeError, ValueError) as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"`alpha` must be a number in [0, 1): {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"`alpha` must be real, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size == 0):
        raise ValueError(f"`alpha` must be a scalar or a non-empty 1-d array, got {arr.shape}")
    if np.any(np.isnan(arr)) or np.any(arr < 0) or np.any(arr >= 1):
        raise ValueError(f"`alpha` must lie in [0, 1) (a confidence level), got {alpha!r}")
    return arr


def _check_k(k: Any, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"`k` must be an integer in [1, {n}], got {k!r}")
    if not 1 <= k <= n:
        raise ValueError(f"`k` must lie in [1, N] = [1, {n}] (1 = smallest loss), got {k}")
    return int(k)


def _floor(floor: Any, xp: Any, l: Any, p: Any) -> Any:
    """The floor F as an array of the batch shape; must not exceed the smallest loss."""
    if isinstance(floor, bool) or floor is None:
        raise TypeError(f"`floor` must be a real number, got {floor!r}")
    if is_array_api_obj(floor) and namespace_of(floor=floor) is xp:
        f = as_float_array(floor, xp, name="floor")
        f = xp.astype(f, l.dtype) if f.dtype != l.dtype else f
    else:  # a number, or a parameter array of another library
        f = xp.asarray(
            host_real(floor, "floor", "a real number or an array").astype(np.float64),
            dtype=l.dtype,
            device=device(l),
        )
    check_finite(f, xp, name="floor")
    batch = tuple(l.shape[:-1])
    try:
        f = xp.broadcast_to(f, batch)
    except (ValueError, RuntimeError) as exc:
        raise ValueError(
            f"`floor` of shape {tuple(f.shape)} does not broadcast to the batch shape {batch} "
            "of `losses`"
        ) from exc
    _, lmin = support_range(l, p, xp)
    if not bool(xp.all(f <= lmin)):
        raise ValueError(
            "`floor` exceeds the smallest loss; it must be a lower bound F(-inf) on every "
            "loss (pass floor <= min(losses), e.g. the infimum of the loss function)"
        )
    return f


# ---------------------------------------------------------------------------
# kernels (samples on the last axis)


def _bshape(x: Any, lead: int, trail: int, xp: Any) -> Any:
    """Reshape ``x`` with ``lead`` leading and ``trail`` trailing singleton axes."""
    return xp.reshape(x, (1,) * lead + tuple(x.shape) + (1,) * trail)


def _tail_kernel(l: Any, p: Any, aa: Any, xp: Any) -> Any:
    """Q(a) with the threshold axis (if any) leading: shape a.shape + batch."""
    ab = _bshape(aa, 0, l.ndim, xp)
    hit = xp.astype(l >= ab, l.dtype)
    return prior_mean(hit, p, xp)


def _take_along_last(x: Any, idx: Any, xp: Any) -> Any:
    """``take_along_axis(x, idx, axis=-1)`` also where the namespace lacks it (Dask)."""
    if x.ndim == 1:
        return xp.take(x, idx, axis=0)
    if hasattr(xp, "take_along_axis"):
        return xp.take_along_axis(x, idx, axis=-1)
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    offs = xp.reshape(
        xp.arange(rows, dtype=idx.dtype, device=device(idx)) * n, tuple(x.shape[:-1]) + (1,)
    )
    flat = xp.take(xp.reshape(x, (-1,)), xp.reshape(idx + offs, (-1,)), axis=0)
    return xp.reshape(flat, tuple(x.shape))


def _sorted_desc(l: Any, p: Any, xp: Any) -> tuple[Any, Any]:
    """Losses sorted in decreasing order, with their prior weights (None if uniform)."""
    if p is None:
        return xp.sort(l, axis=-1, descending=True), None
    order = xp.argsort(l, axis=-1, descending=True, stable=True)
    pb = xp.broadcast_to(p, tuple(l.shape)) if p.ndim != l.ndim else p
    return _take_along_last(l, order, xp), _take_along_last(pb, order, xp)


def _top_mass(alpha: np.ndarray, n: int, weighted: bool) -> np.ndarray:
    """Mass 1 - alpha to keep, in count units (N (1 - alpha), exactly rounded) when
    the prior is uniform; +inf at alpha = 0 so that every sample is kept."""
    flat = alpha.reshape(-1)
    out = np.empty(flat.shape)
    for i, a in enumerate(flat.tolist()):
        if a == 0:
            out[i] = math.inf
        elif weighted:
            out[i] = 1.0 - a
        else:
            out[i] = float((1 - Fraction(a)) * n)
    return out.reshape(alpha.shape)


def _superquantile_kernel(l: Any, p: Any, alpha: np.ndarray, xp: Any) -> Any:
    """Average of the top (1 - alpha) mass; alpha axis (if any) leads."""
    ld, pd = _sorted_desc(l, p, xp)
    n = l.shape[-1]
    dev = device(l)
    smass = xp.asarray(_top_mass(alpha, n, p is not None), dtype=l.dtype, device=dev)
    smass = _bshape(smass, 0, l.ndim, xp)
    if pd is None:
        # count units: the j-th largest loss has exactly j samples above it
        above = xp.arange(n, dtype=l.dtype, device=dev)
        cap = xp.ones_like(ld)
    else:
        above = xp.cumulative_sum(pd, axis=-1, include_initial=True)[..., :-1]
        cap = pd
    # share of each sorted sample inside the top mass (the VaR atom gets a fraction)
    zero = xp.zeros((), dtype=l.dtype, device=dev)
    m = xp.minimum(xp.maximum(smass - above, zero), cap)
    return xp.sum(m * ld, axis=-1) / xp.sum(m, axis=-1)


def _var_kernel(l: Any, p: Any, alpha: np.ndarray, xp: Any) -> Any:
    """Lower alpha-quantile: the smallest loss whose cumulative mass reaches alpha.

    The losses are sorted increasingly and ``cdf_i`` is the cumulative prior mass up to
    and including the i-th of them, normalised by the total (``i / N`` for a uniform
    prior); the value is the first loss with positive mass and ``cdf_i >= alpha``, where
    "reaches" forgives the rounding of the cumulative sums (four units in the last place
    of the losses' dtype), so that ``alpha = k / N`` picks the k-th smallest loss with or
    without (uniform) weights. This is NumPy's ``quantile(..., method="inverted_cdf",
    weights=p)``. The alpha axis (if any) leads.
    """
    n = l.shape[-1]
    dev = device(l)
    alpha = alpha * (1.0 - 4.0 * float(xp.finfo(l.dtype).eps))
    if p is None:
        la = xp.sort(l, axis=-1)
        counts = np.arange(1, n + 1, dtype=np.float64)
        cdf_host = counts / n
        flat = alpha.reshape(-1)
        # first index whose cdf reaches alpha: the exact float rule, on the host
        js = np.minimum(np.searchsorted(cdf_host, flat, side="left"), n - 1)
        out = xp.take(la, xp.asarray(js.tolist(), device=dev), axis=-1)
        out = xp.moveaxis(out, -1, 0)
        return xp.reshape(out, tuple(alpha.shape) + tuple(l.shape[:-1]))
    ld, pd = _sorted_desc(l, p, xp)
    la, pa = xp.flip(ld, axis=-1), xp.flip(pd, axis=-1)
    cum = xp.cumulative_sum(pa, axis=-1)
    cdf = cum / cum[..., -1:]
    levels = xp.asarray(alpha, dtype=l.dtype, device=dev)
    levels = _bshape(levels, 0, l.ndim, xp)
    ok = (cdf >= levels) & (pa > 0)
    # the last sample with positive mass always qualifies (its cdf is 1 up to rounding)
    rev = xp.flip(xp.astype(pa > 0, l.dtype), axis=-1)
    last = xp.flip(xp.cumulative_sum(rev, axis=-1), axis=-1)
    ok = ok | ((last == 1) & (pa > 0))
    inf = xp.asarray(xp.inf, dtype=l.dtype, device=dev)
    return xp.min(xp.where(ok, la, inf), axis=-1)


def _logmax(dtype: Any, xp: Any) -> float:
    """A little below log(largest finite number of ``dtype``)."""
    return math.log(float(xp.finfo(dtype).max)) - 1.0


def _guarded_exp(e: Any, factor: Any, xp: Any) -> Any:
    """``exp(e) * factor`` (factor >= 0), +inf where it would overflow, without warnings."""
    lm = _logmax(e.dtype, xp)
    pos = factor > 0
    log_total = e + xp.log(xp.where(pos, factor, xp.ones_like(factor)))
    big = pos & (log_total > lm)
    val = xp.exp(xp.where(big | ~pos, xp.zeros_like(e), e)) * factor
    return xp.where(big, xp.full_like(val, xp.inf), val)


def _infinite_tilt_limit(l: Any, p: Any, aa: Any, R_inf: Any, xp: Any, T: int) -> Any:
    """Limit of exp(t (R(t) - a)) (and of the tilted bound) as t -> +inf:
    +inf for a < max, the mass at a (the mass at the maximum, or 0) for a >= max."""
    A, nb = aa.ndim, l.ndim - 1
    q = _bshape(_tail_kernel(l, p, aa, xp), T, 0, xp)
    mx = _bshape(R_inf, T + A, 0, xp)
    ab = _bshape(aa, T, nb, xp)
    return xp.where(ab < mx, xp.full_like(q, xp.inf), q)


def _tail_bound_kernel(l, p, aa, tt, F, t_host, xp):
    T, A, nb = tt.ndim, aa.ndim, l.ndim - 1
    R = risk_kernel(l, p, tt, xp)
    Rb = xp.reshape(R, tuple(tt.shape) + (1,) * A + tuple(l.shape[:-1]))
    Fb = _bshape(F, T + A, 0, xp)
    # R(t) lies between the smallest and the largest loss on the prior's support (its
    # limits at t = -inf and +inf); a computed R may leave that range by rounding, or by
    # underflow when the prior scales subnormal losses (a weighted mean of two equal
    # subnormal losses can round to 0), so it is brought back into it
    lo = risk_kernel(l, p, xp.asarray(-xp.inf, dtype=l.dtype, device=device(l)), xp)
    hi = risk_kernel(l, p, xp.asarray(xp.inf, dtype=l.dtype, device=device(l)), xp)
    Rb = xp.minimum(xp.maximum(xp.maximum(Rb, lo), Fb), hi)
    ab = _bshape(aa, T, nb, xp)
    tb = _bshape(tt, 0, A + nb, xp)
    one = xp.ones_like(tb)
    fin = xp.isfinite(tb) & (tb != 0)
    tabs = xp.abs(xp.where(fin, tb, one))
    span = ab - Fb  # > 0
    u = tabs * (Rb - Fb)  # >= 0
    v = tabs * span  # > 0
    small = (tabs * span < tiny_sqrt(l.dtype, xp)) | (tb == 0)
    v_safe = xp.where(small, xp.ones_like(v), v)
    # t < 0: (1 - e^{-u}) / (1 - e^{-v}) with u, v the magnitudes of t (R - F), t (a - F);
    # t > 0: the same ratio times exp(t (R - a)) (numerator and denominator divided by
    # e^{t R} and e^{t a}), so that no exponential of a positive argument is formed
    ratio = xp.expm1(-u) / xp.expm1(-v_safe)
    pos = _guarded_exp(tabs * (Rb - ab), ratio, xp)
    out = xp.where(tb > 0, pos, ratio)
    out = xp.where(small, (Rb - Fb) / span + xp.zeros_like(out), out)
    if np.any(np.isinf(t_host)):
        if np.any(t_host == np.inf):
            r_inf = risk_kernel(l, p, xp.asarray(xp.inf, dtype=l.dtype, device=device(l)), xp)
            lim = _infinite_tilt_limit(l, p, aa, r_inf, xp, T)
            out = xp.where(tb == xp.inf, lim + xp.zeros_like(out), out)
        if np.any(t_host == -np.inf):
            # e^{t (R - F)} -> mass at F: the bound tends to the mass strictly above F
            at_floor = prior_mean(xp.astype(l <= F[..., None], l.dtype), p, xp)
            lim = _bshape(1 - at_floor, T + A, 0, xp)
            out = xp.where(tb == -xp.inf, lim + xp.zeros_like(out), out)
    return out
