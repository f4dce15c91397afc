"""The group-level running step of `TiltedLoss` in few tensor operations.

On one process, for Python tilts (``t_group`` finite, ``t_sample`` 0 or ``0.05 <= |t_sample|
< inf``), a training step's overhead is the dispatch of its small tensor operations, not
their arithmetic. This path computes the quantities of the general one (the statistics of
:mod:`tiltlab.minibatch._stats`, :func:`~tiltlab.minibatch._stats.running_from_stats`,
:func:`~tiltlab.minibatch._stats.sample_weights`) with one scatter per extreme and one
``index_add_`` for every per-group sum, with no loop over groups and no host read (except
the CPU's raise on a bad batch, where reading costs nothing).
"""

from __future__ import annotations

import math

import torch

__all__: list[str] = []


def lean_group_step(
    loss, losses, values, groups, t_group: float, t_sample: float, update: bool, compiling: bool
):
    """The running estimator at group level for Python tilts (see the module).

    Per group g of this batch: the extremes ``hi_g``, ``lo_g``, the shift ``c_g`` (``hi``
    for t > 0, else ``lo``), ``s_g = sum exp(t (l - c_g))``, ``e_g = sum expm1(t (l -
    c_g))``, ``q_g = sum exp(2 t (l - c_g))``, the count and the sum; the batch's risk per
    group with the ``log1p`` form where ``|t| (hi - lo) <= 1``; the running update
    ``logaddexp(log(1 - lam), log(lam) + t gap) / t`` (exact to rounding in the weights, in
    the risk to ``eps / |t|``: hence the bound on |t|); the outer tilted risk of the groups
    under the masses ``counts / sum(counts)``. A sample of group g gets the weight
    ``W_g / (n p_g) exp(t (l - R_g))`` (``W`` the outer weights, ``p`` the masses, ``R``
    the new running risks, ``n`` the batch size).
    """
    n_groups = loss.n_groups
    dtype = values.dtype
    n_batch = values.shape[0]
    ts, tg = t_sample, t_group
    codes = groups.to(torch.int64)
    idx = codes.clamp(0, n_groups - 1)
    valid = torch.eq(idx, codes).all()
    zeros = values.new_zeros(n_groups)
    if ts == 0:
        cols = torch.stack([torch.ones_like(values), values])
        n, total = values.new_zeros(2, n_groups).index_add_(1, idx, cols)
        n_safe = n.clamp_min(1.0)
        batch = total / n_safe
    else:
        # an absent group keeps 0 (include_self=False): every exponent below stays finite
        hi = zeros.scatter_reduce(0, idx, values, "amax", include_self=False)
        lo = zeros.scatter_reduce(0, idx, values, "amin", include_self=False)
        c = hi if ts > 0 else lo
        u = (values - c.index_select(0, idx)) * ts
        ex = torch.exp(u)
        cols = torch.stack([torch.ones_like(values), values, ex, torch.expm1(u), ex * ex])
        n, total, s, e, q = values.new_zeros(5, n_groups).index_add_(1, idx, cols)
        n_safe = n.clamp_min(1.0)
        scaled = (hi - lo) * abs(ts)
        log_mean = torch.where(scaled <= 1, torch.log1p(e / n_safe), torch.log(s / n_safe))
        mean = total / n_safe
        # below sqrt(tiny) the shifted values are subnormal; the mean is exact to rounding
        tiny = math.sqrt(torch.finfo(dtype).smallest_normal)
        batch = torch.where(scaled < tiny, mean, c + log_mean / ts)
    ok = torch.isfinite(total).all() & valid
    present = n > 0
    risk = loss.risk.to(dtype)
    lam = loss.lam
    if lam == 1.0:
        new = batch
    elif ts == 0:
        new = risk + lam * (batch - risk)
    else:
        floor = torch.full_like(risk, math.log1p(-lam))
        new = risk + torch.logaddexp(floor, (batch - risk) * ts + math.log(lam)) / ts
    new = torch.where(present, torch.where(loss.seen > 0, new, batch), risk)
    counts = loss.counts.to(dtype) + n
    prior = counts / counts.sum()
    if tg == 0:
        value = torch.dot(prior, new)
        outer = None  # W_g / p_g = 1
    else:
        # the outer tilt over the groups seen so far (mass > 0); the others get mass 0
        m = torch.dot(prior, new)
        lo_r, hi_r = torch.aminmax(torch.where(prior > 0, new, m))
        shift = hi_r if tg > 0 else lo_r
        u_g = ((new - shift) * tg).clamp_max(0.0)
        ex_g = torch.exp(u_g)
        s_g = torch.dot(prior, ex_g)
        spread = (hi_r - lo_r) * abs(tg)
        log_mean_g = torch.where(
            spread <= 1, torch.log1p(torch.dot(prior, torch.expm1(u_g))), torch.log(s_g)
        )
        tiny = math.sqrt(torch.finfo(dtype).smallest_normal)
        value = torch.where(spread < tiny, m, shift + log_mean_g / tg)
        outer = ex_g / s_g  # W_g / p_g of the groups seen (present ones included)
    if tg == 0 and ts == 0:
        value = total.sum() / n_batch  # ERM: the batch mean itself
    if not compiling and values.device.type == "cpu" and loss.check_finite and not bool(ok):
        raise ValueError(
            "`losses` contains NaN or infinite values (or `groups` labels outside "
            "[0, n_groups)); every loss must be finite"
        )
    if update:
        with torch.no_grad():
            if ts == 0:
                ess = torch.ones_like(n)
            else:
                ess = ((s / n_safe) * (s / torch.where(present, q, 1.0))).clamp_max(1.0)
            keep = ok & present
            loss.ess.copy_(torch.where(keep, ess, loss.ess.to(dtype)))
            loss.risk.copy_(torch.where(ok, new, risk))
            loss.seen.copy_(torch.where(keep, 1.0, loss.seen))
            loss.counts.copy_(torch.where(ok, counts, loss.counts))
            loss.nonfinite.add_(~ok)
        loss._advance(compiling)
    value = torch.where(ok, value, math.nan).detach()
    if not losses.requires_grad:
        return value
    # the weights: a factor per group times exp(t (l - c_g)) per sample
    if ts == 0:
        per_group = None if outer is None else outer / n_batch
    else:
        factor = torch.exp((batch - new) * ts - log_mean)
        per_group = factor if outer is None else factor * outer
        per_group = per_group / n_batch
    delta = losses.to(dtype) - values
    if per_group is None:
        return value + delta.sum() / n_batch
    weights = per_group.index_select(0, idx)
    if ts != 0:
        weights = weights * ex
    return value + torch.dot(weights.detach(), delta)


def lean_tilts(t_group, t_sample) -> bool:
    """Whether :func:`lean_group_step` takes these tilts (Python numbers, see the module)."""
    return (
        isinstance(t_group, (int, float))
        and isinstance(t_sample, (int, float))
        and math.isfinite(t_group)
        and (t_sample == 0 or 0.05 <= abs(t_sample) < math.inf)
    )
