"""Gradient accumulation for `TiltedLoss`: micro-batches weighted relative to a
provisional state, and the rescaling of the accumulated gradient when the step ends."""

from __future__ import annotations

import math
from typing import Any

import torch

from tiltlab.accumulator import packed as P
from tiltlab.minibatch.steps import group_mask, running_from_stats, sample_weights

from ._parallel import gather_stats

__all__: list[str] = []


def micro_batch(loss, values, stats, t_group, t_sample, ok, compiling, xp, grad_dtype=None):
    """A micro-batch: merge its statistics into the pending ones and weight it relative
    to the provisional state after the first micro-batch (``anchor``); :func:`finish`
    rescales the accumulated gradient to the final state. Returns ``(value, weights)``.

    The weights ``c_0 exp(t (l - anchor))`` of a later micro-batch are unbounded: they
    must fit, with room for the backward pass, in ``grad_dtype`` (the dtype of the
    losses, which their gradient takes; default that of ``values``), up to
    :func:`weight_limit`. A micro-batch beyond it cannot be accumulated beside the first
    one's gradient: eagerly on the CPU with ``check_finite`` it raises before changing
    anything, else it is skipped (NaN value, no gradient, state unchanged) and counted in
    ``nonfinite``, as a batch with a non-finite loss."""
    if P.is_number(t_sample) and math.isinf(t_sample):
        raise ValueError("`t` must be finite with `accumulation_steps` > 1")
    if not compiling and loss._micro >= loss.accumulation_steps:
        raise RuntimeError(
            f"{loss._micro} micro-batches since the last `finish_step`: call "
            f"`loss_fn.finish_step(parameters)` before each optimiser step"
        )
    dtype = values.dtype
    pending = loss.pending.to(dtype)
    if loss._micro == 0:  # the statistics of no sample: the merge below changes nothing
        pending = P.block(values[:0], None, t_sample, xp)
    merged = P.merge(xp.stack([pending, stats]), t_sample, xp)
    state = [b.to(dtype) for b in (loss.risk, loss.seen, loss.counts)]
    value, coef, risk, _, _ = running_from_stats(merged, t_group, t_sample, *state, loss.lam, xp)
    # the anchor: the provisional state after the first micro-batch with samples (empty
    # micro-batches before it contribute no gradient), as its buffers will hold it
    fresh = (loss.anchor_coef == 0) & ok & torch.isfinite(coef) & (coef > 0)
    anchor = torch.where(fresh, risk.to(loss.anchor.dtype), loss.anchor).to(dtype)
    anchor_coef = torch.where(fresh, coef.to(loss.anchor_coef.dtype), loss.anchor_coef)
    anchor_coef = anchor_coef.to(dtype)
    weights = anchored_weights(values, anchor, anchor_coef, t_sample)
    # the largest weight is that of the extreme the tilt favours; taken from the merged
    # statistics (every process's share under `distributed`), the decision is the same on
    # every process
    if P.is_number(t_sample):
        extreme = stats[P.HI] if t_sample > 0 else stats[P.LO]
    else:
        extreme = torch.where(t_sample > 0, stats[P.HI], stats[P.LO])
    limit = weight_limit(dtype if grad_dtype is None else grad_dtype)
    fits = (anchored_weights(extreme, anchor, anchor_coef, t_sample) <= limit).all()
    skip = ok & ~fits
    if not compiling and values.device.type == "cpu" and loss.check_finite and bool(skip):
        reach = float((t_sample * (extreme - anchor) + torch.log(anchor_coef)).max())
        name = str(grad_dtype or dtype).removeprefix("torch.")
        raise ValueError(
            f"`losses`: the weights of this micro-batch relative to the step's first "
            f"micro-batch, exp(t (loss - anchor)) / n, reach exp({reach:.4g}), beyond "
            f"exp({math.log(limit):.4g}), the most a gradient in {name} holds beside the "
            f"first micro-batch's: its losses lie too far from the first ones in the "
            f"direction of `t` to be accumulated in one pass. Use the two-pass form "
            f"(`observe` each micro-batch, then the training pass), losses in a wider "
            f"dtype, or a smaller |t|"
        )
    keep = ok & fits
    with torch.no_grad():
        loss.pending.copy_(torch.where(keep, merged, pending))
        loss.anchor.copy_(torch.where(fresh & keep, anchor, loss.anchor.to(dtype)))
        loss.anchor_coef.copy_(torch.where(fresh & keep, anchor_coef, loss.anchor_coef.to(dtype)))
        loss.nonfinite.add_(skip.to(torch.int64))
    weights = torch.where(keep, weights, torch.zeros_like(weights))
    value = torch.where(fits, value, torch.full_like(value, math.nan))
    loss._micro += 1
    return value, weights


def anchored_weights(values, anchor, coef, t):
    """``coef exp(t (l - anchor))`` per sample, without overflowing where only ``exp``
    alone would (its logarithm is then summed first); exactly ``coef`` at ``t = 0``."""
    u = t * (values - anchor)
    big = u > math.log(torch.finfo(values.dtype).max) - 1.0
    e = torch.exp(torch.where(big, u + torch.log(coef), u))
    return torch.where(big, e, e * coef)


def weight_limit(dtype) -> float:
    """The largest weight relative to the first micro-batch that a gradient in ``dtype``
    takes: ``finfo.max * sqrt(eps)`` (about ``exp(80.75)`` in float32, ``exp(691.8)`` in
    float64), which leaves a factor ``1 / sqrt(eps)`` for the backward pass (a sample's
    gradient larger than its loss, the sums over samples) before the accumulated gradient
    overflows."""
    info = torch.finfo(dtype)
    return info.max * math.sqrt(info.eps)


def finish(loss, parameters: Any, xp: Any) -> None:
    """Rescale the accumulated gradients to the final normaliser and commit the state."""
    if loss.accumulation_steps == 1 or loss._micro == 0:
        return
    t_group, t_sample = loss._tilts_now(loss.pending, False)
    dtype = loss.pending.dtype
    state = [b.to(dtype) for b in (loss.risk, loss.seen, loss.counts)]
    with torch.no_grad():
        _, coef, risk, seen, counts = running_from_stats(
            loss.pending, t_group, t_sample, *state, loss.lam, xp
        )
        ok = loss.anchor_coef > 0
        anchor = loss.anchor.to(dtype)
        factor = coef / torch.where(ok, loss.anchor_coef.to(dtype), torch.ones_like(coef))
        if t_sample != 0:
            factor = factor * torch.exp(t_sample * (anchor - risk))
        factor = torch.where(ok, factor, torch.zeros_like(factor)).reshape(())
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(factor.to(p.grad.dtype))
        for buf, new, old in zip(
            (loss.risk, loss.seen, loss.counts), (risk, seen, counts), state, strict=True
        ):
            buf.copy_(torch.where(ok.all(), new, old))
        loss.anchor_coef.zero_()
    loss._micro = 0
    loss._advance(False)


# -- the two-pass form: statistics first, then weights that are final -------------------


def observe_batch(loss, losses: torch.Tensor, groups: Any) -> None:
    """Keep a micro-batch's losses (and group labels) for the step's plan."""
    if loss.estimator != "running" or loss.accumulation_steps != 1:
        raise ValueError(
            "`observe` (two-pass accumulation) needs estimator='running' and "
            "`accumulation_steps`=1 (the micro-batches are counted by the observe calls)"
        )
    if torch.compiler.is_compiling():
        raise RuntimeError("`observe` runs eagerly: call it outside the compiled region")
    if loss.__dict__.get("_plan") is not None:
        raise RuntimeError(
            "`observe` during the training pass of a step: observe every micro-batch of "
            "the step first, then run the training pass over the same micro-batches"
        )
    acc = P.accumulation_dtype(losses.dtype, torch)
    codes = None if groups is None else groups.detach().to(torch.int64)
    loss.__dict__.setdefault("_observed", []).append((losses.detach().to(acc), codes))
    loss.__dict__["_plan_open"] = True


def planned_step(loss, losses, values, groups, xp):
    """A training micro-batch of a two-pass step: weights from the plan of the step (the
    state after the union of the observed micro-batches of every process), so that the
    gradient needs no rescaling; the state is committed after the last micro-batch."""
    if torch.compiler.is_compiling():
        raise RuntimeError(
            "the training pass after `observe` runs eagerly: call the loss outside the "
            "compiled region (the model may be compiled)"
        )
    plan = loss.__dict__.get("_plan")
    observed = loss.__dict__["_observed"]
    if plan is None:
        plan = _make_plan(loss, observed, values.dtype, xp)
        loss.__dict__["_plan"] = plan
    index = plan["next"]
    expected = observed[index][0].shape[0]
    if values.shape[0] != expected:
        raise ValueError(
            f"`losses`: micro-batch {index} of the training pass has {values.shape[0]} "
            f"losses where `observe` saw {expected}: run the training pass over the "
            f"observed micro-batches, in the same order"
        )
    t_sample = plan["t_sample"]
    codes = mask = None
    if loss.hierarchical:
        codes = groups.to(torch.int64).clamp(0, loss.n_groups - 1)
        mask = group_mask(codes, loss.n_groups, values.dtype, xp)
    stats = P.block(values, mask, t_sample, xp)
    weights = sample_weights(values, plan["risk"], stats, codes, plan["coef"], t_sample, xp)
    weights = torch.where(plan["ok"], weights, torch.zeros_like(weights)) * plan["world"]
    plan["next"] = index + 1
    if plan["next"] == len(observed):
        _commit(loss, plan, xp)
    value = torch.where(plan["ok"], plan["value"], torch.full_like(plan["value"], math.nan))
    if not losses.requires_grad:
        return value
    return value + torch.dot(weights.detach(), losses.to(values.dtype) - values)


def _make_plan(loss, observed, dtype, xp) -> dict:
    values = torch.cat([v.to(dtype) for v, _ in observed])
    codes = mask = None
    valid = None
    if loss.hierarchical:
        codes = torch.cat([c for _, c in observed])
        valid = ((codes >= 0) & (codes < loss.n_groups)).all()
        codes = codes.clamp(0, loss.n_groups - 1)
        mask = group_mask(codes, loss.n_groups, dtype, xp)
    if loss._ess is not None:
        loss._solve_ess(values, False)  # on the union of the processes' observed losses
    t_group, t_sample = loss._tilts_now(values, False)
    loss._record_tilts(t_group, t_sample, values, False)
    stats = P.block(values, mask, t_sample, xp)
    world = 1
    if loss.distributed:
        stats, world = gather_stats(stats, t_sample, loss.process_group, xp)
    state = [b.to(dtype) for b in (loss.risk, loss.seen, loss.counts)]
    value, coef, risk, seen, counts = running_from_stats(
        stats, t_group, t_sample, *state, loss.lam, xp
    )
    # a step without any sample has an infinite coefficient
    ok = torch.isfinite(stats).all() & torch.isfinite(coef).all()
    if valid is not None:
        ok = ok & valid
    if values.device.type == "cpu" and loss.check_finite and not bool(ok):
        loss.__dict__.pop("_observed", None)
        loss.__dict__["_plan_open"] = False
        raise ValueError(
            "the observed micro-batches contain NaN or infinite losses (or `groups` labels "
            "outside [0, n_groups), or no sample at all); every loss must be finite"
        )
    return {
        "t_sample": t_sample,
        "value": value,
        "coef": coef,
        "risk": risk,
        "seen": seen,
        "counts": counts,
        "ok": ok,
        "world": world,
        "next": 0,
        "stats": stats,
        "state": state,
    }


def _commit(loss, plan: dict, xp: Any) -> None:
    ok = plan["ok"]
    with torch.no_grad():
        ess = P.ess_fraction(plan["stats"], xp)
        loss.ess.copy_(torch.where(ok & ~torch.isnan(ess), ess, loss.ess.to(ess.dtype)))
        for buf, new, old in zip(
            (loss.risk, loss.seen, loss.counts),
            (plan["risk"], plan["seen"], plan["counts"]),
            plan["state"],
            strict=True,
        ):
            buf.copy_(torch.where(ok, new, old))
        loss.nonfinite.add_((~ok).to(torch.int64))
    loss.__dict__.pop("_plan", None)
    loss.__dict__.pop("_observed", None)
    loss.__dict__["_plan_open"] = False
    loss._advance(False)
