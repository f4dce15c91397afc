"""Mergeable statistics of a batch: what the running and variational estimators need.

The statistics of a batch are, per group, seven numbers ``(hi, lo, s, e, n, total, q)``:
the largest and the smallest loss, ``s = sum_i exp(t (l_i - c))`` and ``e = sum_i
expm1(t (l_i - c))`` relative to the shift ``c`` (``hi`` for t > 0, ``lo`` otherwise, so
that no exponent is positive; at t = +-inf ``s`` counts the losses equal to ``c``), the
number of losses, their sum, and ``q = sum_i exp(2 t (l_i - c))`` (the effective sample
size of the group's weights is ``s**2 / q``). They are stored as one array of shape
``(7, G)``.

Statistics of disjoint batches merge exactly (:func:`merge`: the shifted sums are moved to
the common shift in the log domain), so a batch split across processes or micro-batches
has the statistics of the whole batch, and every estimate computed from them (the batch's
tilted risk, the running state, the weights) equals the one of a single call on the
union. ``e`` carries the sum in the ``expm1`` form, exact near t = 0 where ``s / n - 1``
would cancel.

The tilt ``t`` is a Python number (eager callers: its special values are then Python
branches, few array operations) or a 0-d array (compiled callers: every branch is an
``xp.where``, no host read). No function here reads an array value on the host.
"""

from __future__ import annotations

import math
from typing import Any

from ._kernels import const, device, running_update, tilt_parts, tilted_columns

__all__: list[str] = []

HI, LO, S, E, N, TOTAL, Q = range(7)
N_STATS = 7


def is_number(t: Any) -> bool:
    """Whether the tilt is a Python number (not an array)."""
    return isinstance(t, (int, float))


def fit_tilt(t: float, dtype: Any, xp: Any) -> float:
    """A Python tilt beyond the range of ``dtype`` acts there as +-inf."""
    # 65504 is the largest float16: below it every floating dtype holds t (no finfo call)
    if math.isfinite(t) and abs(t) > 65504.0 and abs(t) > float(xp.finfo(dtype).max):
        return math.copysign(math.inf, t)
    return t


def batch_stats(values: Any, mask: Any, t: Any, xp: Any) -> Any:
    """Statistics ``(7, G)`` of one batch; ``mask`` (B, G) one-hot groups, or None (G = 1).
    An empty batch has the statistics of absent groups (no samples, extremes at the ends
    of the dtype's range): merged with others it changes nothing."""
    dtype = values.dtype
    if values.shape[0] == 0:
        g = 1 if mask is None else mask.shape[1]
        zeros = xp.zeros((g,), dtype=dtype, device=device(values))
        big = float(xp.finfo(dtype).max)
        return xp.stack([zeros - big, zeros + big, zeros, zeros, zeros, zeros, zeros])
    v = xp.reshape(values, (-1, 1))
    zero = const(0.0, values, xp)
    if mask is None:
        on = None
        hi, lo = xp.max(v, axis=0), xp.min(v, axis=0)
        n = xp.reshape(const(float(values.shape[0]), values, xp), (1,))
        total = xp.sum(v, axis=0)
    else:
        on = mask > 0
        big = const(float(xp.finfo(dtype).max), values, xp)
        hi = xp.max(xp.where(on, v, -big), axis=0)
        lo = xp.min(xp.where(on, v, big), axis=0)
        n = xp.sum(mask, axis=0)
        total = xp.sum(mask * v, axis=0)

    def msum(x: Any) -> Any:
        return xp.sum(x if mask is None else mask * x, axis=0)

    if is_number(t):
        c = hi if t > 0 else lo
        if on is not None:  # an absent group's shift is +-big: keep t * (v - c) finite
            c = xp.where(n > 0, c, zero)
        if t == 0:
            s, e, q = n, xp.zeros_like(n), n
        elif math.isinf(t):
            s, e = msum(xp.astype(v == c, dtype)), xp.zeros_like(n)
            q = s
        else:
            u = t * (v - c)
            if on is not None:
                u = xp.where(on, u, zero)
            ex = xp.exp(u)
            s, e, q = msum(ex), msum(xp.expm1(u)), msum(ex * ex)
    else:
        t_fin, is_zero, regular = tilt_parts(t, xp)
        c = xp.where(t > 0, hi, lo)
        if on is not None:
            c = xp.where(n > 0, c, zero)
        u = t_fin * (v - c)
        if on is not None:
            u = xp.where(on, u, zero)
        ties = msum(xp.astype(v == c, dtype))
        ex = xp.exp(u)
        s = xp.where(regular, msum(ex), xp.where(is_zero, n, ties))
        e = xp.where(regular, msum(xp.expm1(u)), zero)
        q = xp.where(regular, msum(ex * ex), xp.where(is_zero, n, ties))
    return xp.stack([hi, lo, s, e, n, total, q])


def merge(stacked: Any, t: Any, xp: Any) -> Any:
    """Merge statistics ``(P, 6, G)`` of P disjoint batches into those of their union."""
    hi_k, lo_k, s_k, e_k, n_k, q_k = (stacked[:, i, ...] for i in (HI, LO, S, E, N, Q))
    hi, lo = xp.max(hi_k, axis=0), xp.min(lo_k, axis=0)
    n, total = xp.sum(n_k, axis=0), xp.sum(stacked[:, TOTAL, ...], axis=0)
    zero = const(0.0, stacked, xp)
    if is_number(t):
        if t == 0:
            return xp.stack([hi, lo, n, xp.zeros_like(n), n, total, n])
        c_k, c = (hi_k, hi) if t > 0 else (lo_k, lo)
        if math.isinf(t):
            s = xp.sum(xp.where(c_k == c, s_k, zero), axis=0)
            return xp.stack([hi, lo, s, xp.zeros_like(n), n, total, s])
        d = xp.where(n_k > 0, t * (xp.where(n_k > 0, c_k, c) - c), zero)
    else:
        t_fin, is_zero, regular = tilt_parts(t, xp)
        c_k, c = xp.where(t > 0, hi_k, lo_k), xp.where(t > 0, hi, lo)
        d = xp.where(n_k > 0, t_fin * (xp.where(n_k > 0, c_k, c) - c), zero)
    f = xp.exp(d)
    s = xp.sum(s_k * f, axis=0)
    e = xp.sum(e_k * f + n_k * xp.expm1(d), axis=0)
    q = xp.sum(q_k * f * f, axis=0)
    if not is_number(t):
        ties = xp.sum(xp.where(c_k == c, s_k, zero), axis=0)
        s = xp.where(regular, s, xp.where(is_zero, n, ties))
        e = xp.where(regular, e, zero)
        q = xp.where(regular, q, xp.where(is_zero, n, ties))
    return xp.stack([hi, lo, s, e, n, total, q])


def batch_risk(stats: Any, t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """``(risk, present, log_mean)`` per group: the batch's tilted risk (0 where absent)
    and ``log(s / n)`` (the risk is ``shift + log_mean / t``; 0 at t = 0 and +-inf)."""
    hi, lo, s, e, n = (stats[i, ...] for i in (HI, LO, S, E, N))
    one, zero = const(1.0, stats, xp), const(0.0, stats, xp)
    present = n > 0
    n_safe = xp.where(present, n, one)
    mean = stats[TOTAL, ...] / n_safe
    tiny = math.sqrt(float(xp.finfo(stats.dtype).smallest_normal))
    if is_number(t):
        if t == 0:
            return xp.where(present, mean, zero), present, xp.zeros_like(n)
        if math.isinf(t):
            return xp.where(present, hi if t > 0 else lo, zero), present, xp.zeros_like(n)
        c, t_fin = (hi if t > 0 else lo), t
        scaled = abs(t) * (hi - lo)
    else:
        t_fin, is_zero, regular = tilt_parts(t, xp)
        c = xp.where(t_fin > 0, hi, lo)
        scaled = xp.abs(t_fin) * (hi - lo)
    log_mean = xp.where(
        scaled <= 1, xp.log1p(e / n_safe), xp.log(xp.where(present, s / n_safe, one))
    )
    risk = xp.where(scaled < tiny, mean, c + log_mean / t_fin)
    if not is_number(t):
        risk = xp.where(is_zero, mean, risk)
        risk = xp.where(t == xp.inf, hi, xp.where(t == -xp.inf, lo, risk))
        log_mean = xp.where(regular, log_mean, zero)
    return xp.where(present, risk, zero), present, xp.where(present, log_mean, zero)


def sample_factors(values, center, b_risk, log_mean, stats, codes, t, xp) -> Any:
    """``exp(t (l_i - center_g))`` per sample, formed as ``exp(t (l_i - shift_g) -
    log_mean_g) * exp(t (risk_g - center_g))`` (each factor bounded, and the second exactly
    1 where the center is the batch's own risk); 1 at t = 0; at +-inf the indicator of the
    group's extreme times ``n_g / ties_g``. ``codes`` maps samples to groups (None: one)."""

    def per_sample(x: Any) -> Any:
        return xp.reshape(x, ()) if codes is None else xp.take(x, codes, axis=0)

    zero = const(0.0, values, xp)
    if is_number(t):
        if t == 0:
            return xp.ones_like(values)
        c = stats[HI, ...] if t > 0 else stats[LO, ...]
        if math.isinf(t):
            return xp.where(
                values == per_sample(c), per_sample(stats[N, ...] / stats[S, ...]), zero
            )
        ratio = xp.exp(t * (b_risk - center))
        return xp.exp(t * (values - per_sample(c)) - per_sample(log_mean)) * per_sample(ratio)
    t_fin, is_zero, regular = tilt_parts(t, xp)
    c = xp.where(t > 0, stats[HI, ...], stats[LO, ...])
    one = const(1.0, values, xp)
    ties = per_sample(stats[N, ...] / xp.where(stats[S, ...] > 0, stats[S, ...], one))
    extreme = xp.where(values == per_sample(c), ties, zero)
    ratio = xp.exp(xp.where(regular, t_fin * (b_risk - center), zero + 0))
    u = xp.where(regular, t_fin * (values - per_sample(c)) - per_sample(log_mean), zero)
    regular_f = xp.exp(u) * per_sample(ratio)
    return xp.where(regular, regular_f, xp.where(is_zero, one, extreme))


def ess_fraction(stats: Any, xp: Any) -> Any:
    """Effective sample size of each group's tilted weights in the batch, as a fraction of
    the group's size: ``s**2 / (n q)`` (1 at t = 0; NaN for an absent group)."""
    s, n, q = stats[S, ...], stats[N, ...], stats[Q, ...]
    present = n > 0
    one = const(1.0, stats, xp)
    frac = (s / xp.where(present, n, one)) * (s / xp.where(present, q, one))
    return xp.where(present, xp.minimum(frac, one), const(math.nan, stats, xp))


def as_tilt_array(t: Any, like: Any, xp: Any) -> Any:
    return const(t, like, xp) if is_number(t) else t


def running_from_stats(
    stats: Any, t_group: Any, t_sample: Any, risk: Any, seen: Any, counts: Any, lam: float, xp
):
    """The running estimator after a batch with these statistics.

    Returns ``(value, coef, risk, seen, counts)``: the running estimate of the risk, the
    coefficient of each group (a sample of group g gets ``coef_g * exp(t_sample (l -
    risk_g))``, see :func:`sample_factors` for the factor) and the new state.
    """
    b_risk, present, _ = batch_risk(stats, t_sample, xp)
    one, zero = const(1.0, stats, xp), const(0.0, stats, xp)
    updated = running_update(risk, b_risk, t_sample, lam, xp)
    new_risk = xp.where(present, xp.where(seen > 0, updated, b_risk), risk)
    new_seen = xp.where(present, one, seen)
    n = stats[N, ...]
    new_counts = counts + n
    n_total = xp.sum(n)
    if risk.shape[0] == 1:
        value = xp.reshape(new_risk, ())
        coef = xp.reshape(one / n_total, (1,))
    else:
        prior = new_counts / xp.sum(new_counts)
        value, group_w, _ = tilted_columns(
            xp.reshape(new_risk, (-1, 1)),
            xp.reshape(prior, (-1, 1)),
            as_tilt_array(t_group, stats, xp),
            xp,
        )
        value = xp.reshape(value, ())
        safe = xp.where(prior > 0, prior, one)
        coef = xp.where(prior > 0, xp.reshape(group_w, (-1,)) / (n_total * safe), zero)
    plain = (t_group == 0) & (t_sample == 0)
    if is_number(plain):
        if plain:
            value = xp.sum(stats[TOTAL, ...]) / n_total
    else:
        value = xp.where(plain, xp.sum(stats[TOTAL, ...]) / n_total, value)
    return value, coef, new_risk, new_seen, new_counts


def variational_from_stats(stats: Any, t: Any, eta: Any, ready: Any, xp: Any):
    """``(value, eta_used, eta_grad, batch_risk, coef)`` of the variational estimator.

    ``eta`` becomes the batch's tilted risk where ``ready`` is false. A sample gets the
    weight ``coef * exp(t (l - eta_used))``; ``eta_grad`` is the gradient of the value in
    eta with the sign of t (so that descent on it is the saddle point's ascent for t < 0).
    """
    b_risk = xp.reshape(batch_risk(stats, t, xp)[0], ())
    eta = xp.where(ready, eta, b_risk)
    one = const(1.0, b_risk, xp)
    coef = xp.reshape(one / xp.sum(stats[N, ...]), (1,))
    if is_number(t):
        if t == 0:
            return b_risk, eta, one - one, b_risk, coef
        gap = t * (b_risk - eta)
        scale = xp.exp(gap)
        value = eta + xp.expm1(gap) / t
        grad = one - scale if t > 0 else scale - one
        return value, eta, grad, b_risk, coef
    t_fin, is_zero, _ = tilt_parts(t, xp)
    gap = t_fin * (b_risk - eta)
    scale = xp.exp(gap)
    value = xp.where(is_zero, b_risk, eta + xp.expm1(gap) / t_fin)
    grad = xp.where(is_zero, one - one, xp.where(t_fin > 0, one - scale, scale - one))
    return value, eta, grad, b_risk, coef


def sample_weights(values, center, stats, codes, coef, t, xp) -> Any:
    """The weights ``coef_g * exp(t (l_i - center_g))`` of the samples of this batch."""
    b_risk, _, log_mean = batch_risk(stats, t, xp)
    factors = sample_factors(values, center, b_risk, log_mean, stats, codes, t, xp)
    per = xp.reshape(coef, ()) if codes is None else xp.take(coef, codes, axis=0)
    return per * factors


def check_stats(stats: Any, n_groups: int, like: Any, xp: Any) -> Any:
    """Combined statistics given by a user: an array of shape ``(7, n_groups)``."""
    if getattr(stats, "shape", None) is None or tuple(stats.shape) != (N_STATS, n_groups):
        raise ValueError(
            f"`combined` must be the statistics of `combine()`, an array of shape "
            f"({N_STATS}, {n_groups}), got shape {tuple(getattr(stats, 'shape', ()))}"
        )
    if stats.dtype != like.dtype:
        stats = xp.astype(stats, like.dtype)
    if device(stats) != device(like):
        raise ValueError("`combined` and `losses` live on different devices")
    return stats


def report_from_state(risk: Any, counts: Any, ess: Any, t_group: Any, xp: Any) -> dict:
    """A group report (the keys of :func:`tiltlab.diagnostics.group_report`) of a running
    state: risks (NaN for a group never seen), masses from the counts, outer weights at
    ``t_group`` (0 for a group never seen), the last ESS."""
    import numpy as np

    total = xp.sum(counts)
    mass = counts / xp.where(total > 0, total, const(1.0, counts, xp))
    _, weight, _ = tilted_columns(
        xp.reshape(risk, (-1, 1)), xp.reshape(mass, (-1, 1)), as_tilt_array(t_group, risk, xp), xp
    )
    if ess is None:
        ess = xp.full(risk.shape, math.nan, dtype=risk.dtype, device=device(risk))
    # a group never seen has no risk yet (NaN: not ranked among the best)
    unseen = xp.full(risk.shape, math.nan, dtype=risk.dtype, device=device(risk))
    return {
        "group": np.arange(risk.shape[0]),
        "risk": xp.where(counts > 0, risk, unseen),
        "mass": mass,
        "weight": xp.reshape(weight, (-1,)),
        "ess": ess,
        "size": xp.astype(xp.round(counts), xp.int64),
    }
