"""Array-API kernels of the minibatch estimators, without validation or host reads.

Every function here takes arrays of one namespace ``xp`` in the accumulation dtype
(float32 for half-precision losses) and tilts as 0-d arrays of that dtype, and branches on
array values only through ``xp.where``: no Python ``if`` on an array, no ``float()``, no
synchronisation. That keeps the kernels lazy on Dask and traceable by ``torch.compile``
without graph breaks, and lets :class:`tiltlab.torch.TiltedLoss` hold its tilt in a buffer
(a schedule changes the tilt without recompiling).

The one reduction everything uses is :func:`tilted_columns`: the tilted risk and the
normalised tilted weights of each column of a (samples x columns) table of prior weights,
with the max shift and the ``log1p``/``expm1`` form near ``t = 0``.
"""

from __future__ import annotations

import math
from typing import Any

from .._compat import device as _compat_device

__all__: list[str] = []


def device(x: Any) -> Any:
    """The device of ``x``; a tensor's own attribute for PyTorch (array-api-compat's helper
    goes through cached type checks that ``torch.compile`` warns about)."""
    if type(x).__module__.startswith("torch"):
        return x.device
    return _compat_device(x)


def const(value: float, like: Any, xp: Any) -> Any:
    """A 0-d array holding ``value`` in the dtype and on the device of ``like``."""
    return xp.asarray(value, dtype=like.dtype, device=device(like))


def accumulation_dtype(dtype: Any, xp: Any) -> Any:
    """float32 for half-precision floats (float16, bfloat16), else ``dtype`` itself."""
    if xp.finfo(dtype).bits < 32:
        return xp.float32
    return dtype


def tilt_parts(t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """``(t_fin, is_zero, is_finite_nonzero)``: ``t`` with 0 and +-inf replaced by 1."""
    one = const(1.0, t, xp)
    regular = xp.isfinite(t) & (t != 0)
    return xp.where(regular, t, one), t == 0, regular


def tilted_columns(values: Any, mass: Any, t: Any, xp: Any) -> tuple[Any, Any, Any]:
    """Tilted risk and weights of each column.

    Parameters
    ----------
    values : array, shape (B, 1) or (B, K)
        Values (losses, or group risks), broadcast against ``mass``.
    mass : array, shape (B, K)
        Non-negative prior mass of each row in each column (0: not a member).
    t : 0-d array
        The tilt (0 and +-inf included).

    Returns
    -------
    risk : array, shape (K,)
        ``(1/t) log(sum_i m_i exp(t v_i) / sum_i m_i)``; 0 for a column without mass.
    weights : array, shape (B, K)
        ``m_i exp(t v_i) / sum_j m_j exp(t v_j)`` (the prior restricted to the tied
        extremes at +-inf, the prior at 0); zero columns where a column has no mass.
    total : array, shape (K,)
        The mass of each column.
    """
    zero, one = const(0.0, mass, xp), const(1.0, mass, xp)
    big = const(xp.finfo(mass.dtype).max, mass, xp)
    on = mass > 0
    total = xp.sum(mass, axis=0)
    present = total > 0
    total_safe = xp.where(present, total, one)
    vmax = xp.where(present, xp.max(xp.where(on, values, -big), axis=0), zero)
    vmin = xp.where(present, xp.min(xp.where(on, values, big), axis=0), zero)
    mean = xp.sum(xp.where(on, mass * values, zero), axis=0) / total_safe
    t_fin, is_zero, regular = tilt_parts(t, xp)
    shift = xp.where(t_fin > 0, vmax, vmin)
    # u <= 0 on every member: no exponential can overflow, even in branches not chosen
    u = xp.where(on, t_fin * (values - shift), zero)
    spread = vmax - vmin
    near_zero = xp.abs(t_fin) * spread <= 1
    ex = xp.exp(u)
    s_small = xp.sum(mass * xp.expm1(u), axis=0) / total_safe  # in (-1, 0]
    s_large = xp.where(present, xp.sum(mass * ex, axis=0) / total_safe, one)  # in (0, 1]
    log_mean = xp.where(near_zero, xp.log1p(s_small), xp.log(s_large))
    risk = shift + log_mean / t_fin
    # below sqrt(tiny) the shifted values are subnormal; the mean is exact to rounding there
    tiny = math.sqrt(float(xp.finfo(mass.dtype).smallest_normal))
    risk = xp.where(xp.abs(t_fin) * spread < tiny, mean, risk)
    risk = xp.where(is_zero, mean, risk)
    risk = xp.where(t == xp.inf, vmax, risk)
    risk = xp.where(t == -xp.inf, vmin, risk)

    tilted = mass * ex
    w_regular = tilted / xp.where(present, xp.sum(tilted, axis=0), one)
    w_prior = mass / total_safe
    extreme = xp.where(t > 0, vmax, vmin)
    tied = xp.where(on & (values == extreme), mass, zero)
    w_tied = tied / xp.where(present, xp.sum(tied, axis=0), one)
    weights = xp.where(regular, w_regular, xp.where(is_zero, w_prior, w_tied))
    return xp.where(present, risk, zero), weights, total


def running_update(previous: Any, batch: Any, t: Any, lam: float, xp: Any) -> Any:
    """The paper's tilted average ``(1/t) log((1-lam) e^{t prev} + lam e^{t batch})``.

    Written as ``prev + f(t (batch - prev)) / t`` with ``f(u) = log1p(lam expm1(u))`` for
    u <= 0 and ``u + log1p((1-lam) expm1(-u))`` for u > 0: no overflow at any ``t * loss``
    and full relative precision as t -> 0, where it becomes the linear average
    ``prev + lam (batch - prev)`` (used exactly at t = 0). At +-inf it keeps ``batch``.
    """
    if lam == 1.0:  # no memory: every batch is its own normaliser (the plug-in)
        return batch
    gap = batch - previous
    if isinstance(t, (int, float)):  # a Python tilt: its special values are branches
        if t == 0:
            return previous + lam * gap
        if math.isinf(t):
            return batch
        if abs(t) < float(xp.finfo(gap.dtype).smallest_normal):
            # t is zero or subnormal in the losses' dtype (1e-300 in float32): t * gap and
            # the division by t are formed in float64, where t is a normal number
            wide = xp.astype(gap, xp.float64)
            return previous + xp.astype(_running_f(t * wide, lam, xp) / t, gap.dtype)
        return previous + _running_f(t * gap, lam, xp) / t
    t_fin, is_zero, regular = tilt_parts(t, xp)
    u = t_fin * gap
    out = xp.where(regular, previous + _running_f(u, lam, xp) / t_fin, batch)
    return xp.where(is_zero, previous + lam * gap, out)


def _running_f(u: Any, lam: float, xp: Any) -> Any:
    """``log((1 - lam) + lam e^u)`` without overflow, exact to rounding at every u."""
    u_neg = xp.where(u <= 0, u, const(0.0, u, xp))
    u_pos = xp.where(u > 0, u, const(0.0, u, xp))
    shrink = lam * xp.expm1(u_neg)  # in (-lam, 0]
    # far below, log1p(shrink) would lose the small 1 - lam + lam e^u: take the log directly
    f_neg = xp.where(shrink > -0.5, xp.log1p(shrink), xp.log((1.0 - lam) + lam * xp.exp(u_neg)))
    return xp.where(u <= 0, f_neg, u_pos + xp.log1p((1.0 - lam) * xp.expm1(-u_pos)))


def ratio_factor(batch: Any, reference: Any, t: Any, xp: Any) -> Any:
    """``exp(t (batch - reference))``: turns weights normalised by the batch's own risk into
    weights normalised by ``reference``; 1 at t = 0 and +-inf."""
    t_fin, _, regular = tilt_parts(t, xp)
    return xp.where(regular, xp.exp(t_fin * (batch - reference)), const(1.0, batch, xp))


def group_mask(codes: Any, n_groups: int, dtype: Any, xp: Any) -> Any:
    """One-hot table (B, G) of the group codes, in ``dtype``."""
    ids = xp.arange(n_groups, device=device(codes))
    hits = xp.reshape(codes, (-1, 1)) == xp.reshape(ids, (1, -1))
    return xp.astype(hits, dtype)


def hierarchical_step(
    losses: Any,
    mask: Any,
    t_group: Any,
    t_sample: Any,
    risk: Any,
    seen: Any,
    counts: Any,
    lam: float,
    xp: Any,
) -> tuple[Any, Any, Any, Any, Any]:
    """One step of the running estimator (sample level: one group).

    ``risk`` (G,) holds the running tilted risk of each group at ``t_sample``, ``seen``
    (G,) whether a group has been seen (0/1), ``counts`` (G,) the samples seen per group
    (the group masses are ``counts / sum(counts)``). The value is the running estimate of
    the risk (the batch mean when both tilts are 0). Returns ``(weights, value, risk, seen,
    counts)`` after this batch.
    """
    zero = const(0.0, losses, xp)
    values = xp.reshape(losses, (-1, 1))
    batch_risk, within, n_batch = tilted_columns(values, mask, t_sample, xp)
    present = n_batch > 0
    updated = running_update(risk, batch_risk, t_sample, lam, xp)
    new_risk = xp.where(present, xp.where(seen > 0, updated, batch_risk), risk)
    new_seen = xp.where(present, const(1.0, seen, xp), seen)
    new_counts = counts + n_batch
    prior = new_counts / xp.sum(new_counts)
    value, group_w, _ = tilted_columns(
        xp.reshape(new_risk, (-1, 1)), xp.reshape(prior, (-1, 1)), t_group, xp
    )
    group_w = xp.reshape(group_w, (-1,))
    # absent groups: a zero gap (their factor is discarded; this keeps exp finite)
    gap_source = xp.where(present, batch_risk, new_risk)
    scale = group_w * n_batch * ratio_factor(gap_source, new_risk, t_sample, xp)
    n_total = const(losses.shape[0], losses, xp)
    scale = xp.where(present, scale / (n_total * xp.where(present, prior, zero + 1)), zero)
    weights = xp.sum(within * xp.reshape(scale, (1, -1)), axis=1)
    # with every tilt 0 this is ERM: report the batch mean itself, not a running mean
    plain = (t_group == 0) & (t_sample == 0)
    value = xp.where(plain, xp.mean(losses), xp.reshape(value, ()))
    return weights, value, new_risk, new_seen, new_counts


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


def variational_step(losses: Any, t: Any, eta: Any, ready: Any, xp: Any):
    """Weights, value and eta-gradient of ``eta + expm1(t (R_B - eta)) / t``.

    ``eta`` is the auxiliary variable in loss units (``v = -t eta`` in
    ``log z = min_v (z e^v - v) - 1``); where ``ready`` is false it is first set to the
    batch's tilted risk ``R_B`` (the exact minimiser on this batch). Returns ``(weights,
    value, eta_used, eta_grad)`` with ``eta_grad`` the gradient of the value in eta with
    the sign of t (descent on it is descent for t > 0 and ascent, the saddle point, for
    t < 0) and the batch's tilted risk ``R_B``.
    """
    one = const(1.0, losses, xp)
    mass = xp.ones((losses.shape[0], 1), dtype=losses.dtype, device=device(losses))
    batch_risk, w, _ = tilted_columns(xp.reshape(losses, (-1, 1)), mass, t, xp)
    batch_risk = xp.reshape(batch_risk, ())
    eta = xp.where(ready, eta, batch_risk)
    t_fin, is_zero, _ = tilt_parts(t, xp)
    gap = t_fin * (batch_risk - eta)
    scale = xp.where(is_zero, one, xp.exp(gap))
    weights = w[:, 0] * scale
    value = xp.where(is_zero, batch_risk, eta + xp.expm1(gap) / t_fin)
    eta_grad = xp.where(is_zero, const(0.0, one, xp), xp.where(t_fin > 0, one - scale, scale - one))
    return weights, value, eta, eta_grad, batch_risk
