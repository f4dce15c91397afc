"""Gradient accumulation for `TiltedLoss`: micro-batches weighted relative to a
provisional state, and the rescaling of the accumulated gradient when the step ends."""

from __future__ import annotations

import math
from typing import Any

import torch

from tiltlab.minibatch import _stats as S

__all__: list[str] = []


def micro_batch(loss, values, stats, t_group, t_sample, ok, compiling, xp):
    """A micro-batch: merge its statistics into the pending ones and weight it relative
    to the provisional state after the first micro-batch (``anchor``); :func:`finish`
    rescales the accumulated gradient to the final state. Returns ``(value, weights)``."""
    if S.is_number(t_sample) and math.isinf(t_sample):
        raise ValueError("`t` must be finite with `accumulation_steps` > 1")
    if not compiling and loss._micro >= loss.accumulation_steps:
        raise RuntimeError(
            f"{loss._micro} micro-batches since the last `finish_step`: call "
            f"`loss_fn.finish_step(parameters)` before each optimiser step"
        )
    dtype = values.dtype
    pending = loss.pending.to(dtype)
    if loss._micro == 0:  # the statistics of no sample: the merge below changes nothing
        pending = S.batch_stats(values[:0], None, t_sample, xp)
    merged = S.merge(xp.stack([pending, stats]), t_sample, xp)
    state = [b.to(dtype) for b in (loss.risk, loss.seen, loss.counts)]
    value, coef, risk, _, _ = S.running_from_stats(merged, t_group, t_sample, *state, loss.lam, xp)
    with torch.no_grad():
        loss.pending.copy_(torch.where(ok, merged, pending))
        # the anchor: the provisional state after the first micro-batch with samples
        # (empty micro-batches before it contribute no gradient)
        fresh = (loss.anchor_coef == 0) & ok & torch.isfinite(coef) & (coef > 0)
        loss.anchor.copy_(torch.where(fresh, risk, loss.anchor.to(dtype)))
        loss.anchor_coef.copy_(torch.where(fresh, coef, loss.anchor_coef.to(dtype)))
    anchor, anchor_coef = loss.anchor.to(dtype), loss.anchor_coef.to(dtype)
    weights = S.sample_weights(values, anchor, stats, None, anchor_coef, t_sample, xp)
    loss._micro += 1
    return value, weights


def finish(loss, parameters: Any, xp: Any) -> None:
    """Rescale the accumulated gradients to the final normaliser and commit the state."""
    if loss.accumulation_steps == 1 or loss._micro == 0:
        return
    t_group, t_sample = loss._tilts_now(loss.pending, False)
    dtype = loss.pending.dtype
    state = [b.to(dtype) for b in (loss.risk, loss.seen, loss.counts)]
    with torch.no_grad():
        _, coef, risk, seen, counts = S.running_from_stats(
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
