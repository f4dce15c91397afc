"""The group-level running step of `TiltedLoss` in few tensor operations.

On one process, for Python tilts (``t_group`` finite, ``t_sample`` 0 or ``0.05 <= |t_sample|
< inf``), a training step's overhead is the dispatch of its small tensor operations, not
their arithmetic. This path computes the quantities of the general one (the statistics of
:mod:`tiltlab.accumulator.packed`, :func:`~tiltlab.minibatch.steps.running_from_stats`,
:func:`~tiltlab.minibatch.steps.sample_weights`) with one scatter per extreme and one
``index_add_`` for every per-group sum, with no loop over groups and no host read (except
the CPU's raise on a bad batch, where reading costs nothing). On CUDA, ``index_add_`` adds
with atomics, so the last bits of a group's sums may change from run to run unless
``torch.use_deterministic_algorithms(True)`` is set.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from tiltlab.accumulator.packed import exponent_terms, log_normaliser

from ._parallel import write_where as _write

__all__: list[str] = []


def lean_group_step(
    loss, losses, values, groups, t_group: float, t_sample: float, update: bool, compiling: bool
):
    """The running estimator at group level for Python tilts (see the module).

    Per group g of this batch: the shift ``c_g`` (the largest loss for t > 0, else the
    smallest), and the fields of :mod:`tiltlab.accumulator.packed`: ``s_g = sum exp(t (l -
    c_g))``, ``q_g = sum expm1(t (l - c_g)) <= 0``, ``s2_g = sum exp(2 t (l - c_g))``, the
    count ``n_g`` and the sum. The batch's risk of the group is ``c_g + log(s_g / n_g) /
    t``, with ``log1p(q_g / n_g)`` where ``s_g >= n_g / 2`` (its
    :func:`~tiltlab.accumulator.packed.log_normaliser`), and the mean where ``q_g / n_g >
    -sqrt(tiny)`` (then ``|t| (max - min) < n_g sqrt(tiny)``: the tilted risk is the mean
    to rounding). The running update is ``logaddexp(log(1 - lam), log(lam) + t gap) / t``
    (exact to rounding in the weights, in the risk to ``eps / |t|``: hence the bound on
    |t|); the outer tilted risk of the groups takes the masses ``counts / sum(counts)`` in
    the same forms. A sample of group g gets the weight ``W_g / (n p_g) exp(t (l - R_g))``
    (``W`` the outer weights, ``p`` the masses, ``R`` the new running risks, ``n`` the
    batch size).
    """
    n_groups = loss.n_groups
    dtype = values.dtype
    ts, tg = t_sample, t_group
    k = _numbers(loss, values, ts, tg, compiling)
    codes = groups.to(torch.int64)
    idx = codes.clamp(0, n_groups - 1)
    valid = torch.eq(idx, codes).all()
    if ts == 0:
        cols = torch.stack([torch.ones_like(values), values])
        sums = values.new_zeros(2, n_groups).index_add_(1, idx, cols)
        n, total = sums
        batch = total / n.clamp_min(1.0)
    else:
        # an absent group keeps the shift 0 (include_self=False): its sums stay 0
        reduce = "amax" if ts > 0 else "amin"
        c = values.new_zeros(n_groups).scatter_reduce(0, idx, values, reduce, include_self=False)
        u = (values - c.index_select(0, idx)) * k.ts
        ex, em, ex2 = exponent_terms(u, torch)
        cols = torch.stack([torch.ones_like(values), values, ex, em, ex2])
        sums = values.new_zeros(5, n_groups).index_add_(1, idx, cols)
        n, total = sums[0], sums[1]
        # per group: 1 (0 if absent), the mean, s / n, e / n in (-1, 0], q / n
        _, mean_b, s_mean, e_mean, q_mean = sums / n.clamp_min(1.0)
        log_mean = log_normaliser(e_mean, s_mean, e_mean >= k.half, torch, guarded=False)
        batch = torch.where(e_mean > k.tiny, mean_b, torch.add(c, log_mean, alpha=1.0 / ts))
    # x - x is 0 for a finite x and NaN for an infinite or NaN one
    ok = torch.eq(total - total, k.zero).all() & valid
    present = n > k.zero
    risk = loss.risk.to(dtype)
    lam = loss.lam
    if lam == 1.0:
        new = batch
    elif ts == 0:
        new = torch.lerp(risk, batch, lam)
    else:
        floor = torch.full_like(risk, k.floor) if compiling else k.floor
        moved = torch.logaddexp(floor, (batch - risk) * k.ts + k.log_lam)
        new = torch.add(risk, moved, alpha=1.0 / ts)
    new = torch.where(present, torch.where(loss.seen > k.zero, new, batch), risk)
    counts = loss.counts.to(dtype) + n
    mass = counts.sum()
    if tg == 0:
        value = torch.dot(counts, new) / mass
        outer = None  # W_g / p_g = 1
    else:
        # the outer tilt over the groups seen so far (mass > 0); the others get mass 0
        seen_risks = torch.where(counts > k.zero, new, k.far)
        shift = seen_risks.amax() if tg > 0 else seen_risks.amin()
        u_g = ((new - shift) * k.tg).clamp_max(0.0)
        ex_g, em_g = exponent_terms(u_g, torch, squares=False)
        # the masses' means of the risks, of exp(u) (in (0, 1]) and of expm1(u) (s_g - 1)
        rows = torch.stack([new, ex_g, em_g])
        mean, s_g, d_g = torch.mv(rows, counts) / mass
        log_mean_g = log_normaliser(d_g, s_g, d_g >= k.half, torch, guarded=False)
        value = torch.where(d_g > k.tiny, mean, torch.add(shift, log_mean_g, alpha=1.0 / tg))
        outer = ex_g / s_g  # W_g / p_g of the groups seen (present ones included)
    if tg == 0 and ts == 0:
        value = total.sum() * k.inv_n  # ERM: the batch mean itself
    if not compiling and values.device.type == "cpu" and loss.check_finite and not bool(ok):
        raise ValueError(
            "`losses` contains NaN or infinite values (or `groups` labels outside "
            "[0, n_groups)); every loss must be finite"
        )
    if update:  # nothing here requires a gradient (the losses' values are detached)
        keep = ok & present
        if ts == 0:
            loss.ess.masked_fill_(keep, 1.0)
        else:  # s^2 / (n q); NaN for an absent group, which keeps its last value
            _write(loss.ess, keep, (s_mean * s_mean / q_mean).clamp_max(1.0), compiling)
        _write(loss.risk, ok, new, compiling)
        loss.seen.masked_fill_(keep, 1.0)
        _write(loss.counts, ok, counts, compiling)
        loss.nonfinite.add_(~ok)
        loss._advance(compiling)
    value = torch.where(ok, value, k.nan)
    if not losses.requires_grad:
        return value
    # the weights: a factor per group times exp(t (l - c_g)) per sample
    if ts == 0:
        per_group = None if outer is None else outer * k.inv_n
    else:
        factor = torch.exp((batch - new) * k.ts - log_mean)
        per_group = factor if outer is None else factor * outer
        per_group = per_group * k.inv_n
    delta = losses.to(dtype) - values
    if per_group is None:
        return value + delta.sum() * k.inv_n
    weights = per_group.index_select(0, idx)
    if ts != 0:
        weights = weights * ex
    return value + torch.dot(weights, delta)


class _Numbers(NamedTuple):
    zero: Any
    one: Any
    half: Any
    tiny: Any
    nan: Any
    far: Any
    ts: Any
    tg: Any
    inv_n: Any
    log_lam: Any
    floor: Any


def _numbers(loss, values, ts: float, tg: float, compiling: bool) -> _Numbers:
    """The numbers of a step as 0-d tensors of the losses' dtype and device, made once
    (an eager operation with a Python number wraps it in a tensor at every call, which
    costs about as much as the operation), or as Python numbers when compiling."""
    lam = loss.lam
    numbers = {
        "zero": 0.0,
        "one": 1.0,
        "half": -0.5,
        # e / n above this: |t| (max - min) < n sqrt(tiny), the tilted risk is the mean
        "tiny": -math.sqrt(torch.finfo(values.dtype).smallest_normal),
        "nan": math.nan,
        "far": -math.inf if tg > 0 else math.inf,
        "ts": ts,
        "tg": tg,
        "inv_n": 1.0 / values.shape[0],
        "log_lam": math.log(lam),
        "floor": math.log1p(-lam) if lam < 1.0 else -math.inf,
    }
    if compiling:
        return _Numbers(**numbers)
    key = (values.dtype, values.device, ts, tg, values.shape[0], lam)
    cached = loss.__dict__.get("_lean_group_numbers")
    if cached is None or cached[0] != key:
        made = torch.tensor(list(numbers.values()), dtype=values.dtype, device=values.device)
        cached = (key, _Numbers(**dict(zip(numbers, made.unbind(), strict=True))))
        loss.__dict__["_lean_group_numbers"] = cached
    return cached[1]


def lean_tilts(t_group, t_sample) -> bool:
    """Whether :func:`lean_group_step` takes these tilts (Python numbers, see the module)."""
    return (
        isinstance(t_group, (int, float))
        and isinstance(t_sample, (int, float))
        and math.isfinite(t_group)
        and (t_sample == 0 or 0.05 <= abs(t_sample) < math.inf)
    )
