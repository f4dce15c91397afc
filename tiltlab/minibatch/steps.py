"""One step of each minibatch estimator, driven by the packed tilted state.

The statistics of a batch are its packed tilted state (:mod:`tiltlab.accumulator.packed`:
per group ``hi, lo, mass, s, q, lsum, s2``, an array of shape ``(7, G)``, built by
:func:`~tiltlab.accumulator.packed.block` and combined by
:func:`~tiltlab.accumulator.packed.merge`). States of disjoint batches merge exactly, so a
batch split across processes or micro-batches has the statistics of the whole batch, and
every estimate computed here from them (the batch's tilted risk, the running state, the
weights) equals the one of a single call on the union. :class:`~tiltlab.minibatch.MinibatchTilt` and
:class:`tiltlab.torch.TiltedLoss` are built on these steps.

The tilt ``t`` is a Python number (eager callers: its special values are Python branches)
or a 0-d array (compiled callers: every branch is an ``xp.where``). No function here
reads an array value on the host, so that the steps stay lazy on Dask and
``torch.compile`` traces them without graph breaks.

Examples
--------
The running estimator's first step on a batch of three losses is the batch's tilted risk,
and its weights are the batch's tilted weights:

>>> import numpy as np
>>> from tiltlab.accumulator import packed
>>> l, t = np.array([0.0, 1.0, 2.0]), 1.0
>>> stats = packed.block(l, None, t, np)
>>> zero = np.zeros(1)
>>> value, coef, risk, seen, counts = running_from_stats(
...     stats, 0.0, t, zero, zero, zero, 0.5, np
... )
>>> bool(np.isclose(value, np.log(np.mean(np.exp(l)))))
True
>>> w = sample_weights(l, risk, stats, None, coef, t, np)
>>> bool(np.allclose(w, np.exp(l) / np.exp(l).sum()))
True
"""

from __future__ import annotations

import math
from typing import Any

from ..accumulator.packed import (
    HI,
    LO,
    MASS,
    N_FIELDS,
    S,
    const,
    device,
    is_number,
    running_update,
    tilt_parts,
    tilted_columns,
)
from ..accumulator.packed import finish as _finish
from ..accumulator.packed import total as _total

__all__ = [
    "group_mask",
    "mlmc_step",
    "running_from_stats",
    "variational_from_stats",
    "sample_factors",
    "sample_weights",
    "check_stats",
    "report_from_state",
]

N = MASS


def group_mask(codes: Any, n_groups: int, dtype: Any, xp: Any) -> Any:
    """One-hot table (B, G) of the group codes, in ``dtype``."""
    ids = xp.arange(n_groups, device=device(codes))
    hits = xp.reshape(codes, (-1, 1)) == xp.reshape(ids, (1, -1))
    return xp.astype(hits, dtype)


def mlmc_step(
    losses: Any, base: int, level: int, prob: float, full: bool, t: Any, xp: Any
) -> tuple[Any, Any]:
    """Multilevel weights for a batch of ``base * 2**level`` samples drawn with level
    probability ``prob``: the plug-in weights of the first ``base`` samples plus the
    level's correction (plug-in on the whole batch minus the mean of the plug-ins on its
    halves) divided by ``prob``. ``full``: the batch is the whole data set (plug-in)."""
    n = losses.shape[0]
    idx = xp.arange(n, device=device(losses))
    half = n // 2
    columns = xp.stack([idx < base, idx >= 0, idx < half, idx >= half], axis=1)
    mass = xp.astype(columns, losses.dtype)
    risk, w, _ = tilted_columns(xp.reshape(losses, (-1, 1)), mass, t, xp)
    if full:
        return w[:, 1], risk[1]
    weights = w[:, 0] + (w[:, 1] - 0.5 * (w[:, 2] + w[:, 3])) / prob
    value = risk[0] + (risk[1] - 0.5 * (risk[2] + risk[3])) / prob
    # at t = 0 the plug-in (the batch mean) is already unbiased: use the whole batch
    weights = xp.where(t == 0, w[:, 1], weights)
    value = xp.where(t == 0, risk[1], value)
    return weights, value


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
    b_risk, present, _ = _finish(stats, t_sample, xp)
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
            value = xp.sum(_total(stats, t_sample, xp)) / n_total
    else:
        value = xp.where(plain, xp.sum(_total(stats, t_sample, xp)) / n_total, value)
    return value, coef, new_risk, new_seen, new_counts


def _variational_value(eta: Any, b_risk: Any, gap: Any, t: Any, xp: Any) -> Any:
    """``eta + expm1(gap) / t`` with ``gap = t (b_risk - eta)``; where ``|gap| < 1e-8`` (a
    tilt that underflows in the dtype among them, where the division was 0 / 0) as
    ``eta + (b_risk - eta) (1 + gap / 2)``, its series to the dtype's precision."""
    small = xp.abs(gap) < 1e-8
    one = const(1.0, b_risk, xp)
    regular = eta + xp.expm1(gap) / xp.where(small, one, t * one)
    return xp.where(small, eta + (b_risk - eta) * (one + gap / 2), regular)


def variational_from_stats(stats: Any, t: Any, eta: Any, ready: Any, xp: Any):
    """``(value, eta_used, eta_grad, batch_risk, coef)`` of the variational estimator.

    ``eta`` becomes the batch's tilted risk where ``ready`` is false. A sample gets the
    weight ``coef * exp(t (l - eta_used))``; ``eta_grad`` is the gradient of the value in
    eta with the sign of t (so that descent on it is the saddle point's ascent for t < 0).
    """
    b_risk = xp.reshape(_finish(stats, t, xp)[0], ())
    eta = xp.where(ready, eta, b_risk)
    one = const(1.0, b_risk, xp)
    coef = xp.reshape(one / xp.sum(stats[N, ...]), (1,))
    if is_number(t):
        if t == 0:
            return b_risk, eta, one - one, b_risk, coef
        gap = t * (b_risk - eta)
        scale = xp.exp(gap)
        value = _variational_value(eta, b_risk, gap, t, xp)
        grad = one - scale if t > 0 else scale - one
        return value, eta, grad, b_risk, coef
    t_fin, is_zero, _ = tilt_parts(t, xp)
    gap = t_fin * (b_risk - eta)
    scale = xp.exp(gap)
    value = xp.where(is_zero, b_risk, _variational_value(eta, b_risk, gap, t_fin, xp))
    grad = xp.where(is_zero, one - one, xp.where(t_fin > 0, one - scale, scale - one))
    return value, eta, grad, b_risk, coef


def sample_weights(values, center, stats, codes, coef, t, xp) -> Any:
    """The weights ``coef_g * exp(t (l_i - center_g))`` of the samples of this batch."""
    b_risk, _, log_mean = _finish(stats, t, xp)
    factors = sample_factors(values, center, b_risk, log_mean, stats, codes, t, xp)
    per = xp.reshape(coef, ()) if codes is None else xp.take(coef, codes, axis=0)
    return per * factors


def check_stats(stats: Any, n_groups: int, like: Any, xp: Any) -> Any:
    """Combined statistics given by a user: an array of shape ``(7, n_groups)``."""
    if getattr(stats, "shape", None) is None or tuple(stats.shape) != (N_FIELDS, n_groups):
        raise ValueError(
            f"`combined` must be the statistics of `combine()`, an array of shape "
            f"({N_FIELDS}, {n_groups}), got shape {tuple(getattr(stats, 'shape', ()))}"
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
