"""The steps of `TiltedLoss` beyond its lean paths: the tilts of a call (numbers,
schedules, the tilt solved for ``ess``), the general running, variational and multilevel
steps on the mergeable statistics of :mod:`tiltlab.minibatch`."""

from __future__ import annotations

import math
from typing import Any

import torch

from tiltlab._compat import library_namespace
from tiltlab.accumulator import packed as P
from tiltlab.minibatch.checks import check_ess, resolve
from tiltlab.minibatch.steps import (
    mlmc_step,
    report_from_state,
    running_from_stats,
    sample_weights,
    variational_from_stats,
)

from ._checks import mlmc_level
from ._ess import ess_tilt
from ._parallel import gather_values

__all__: list[str] = []

#: the array-API namespace of PyTorch tensors (the minibatch kernels are written for it)
xp_torch = library_namespace(torch.empty(0))


def tilts_now(loss, like: torch.Tensor, compiling: bool) -> list[Any]:
    """``[t_group, t_sample]`` of this step: Python floats (validated on the host), or
    0-d tensors where a schedule runs inside a compiled graph (flagged on the device)."""
    out: list[Any] = []
    names = ("tilts[0]", "tilts[1]" if loss.hierarchical else "t")
    for i, schedule in enumerate(loss._schedules):
        if schedule is None:
            value: Any = loss._values[i]
        elif compiling:
            value = schedule(loss.step.to(torch.float64))
            if isinstance(value, torch.Tensor):
                if value.ndim != 0 or not value.is_floating_point():
                    raise TypeError(f"`{names[i]}` must return a real number or a 0-d tensor")
                value = value.to(like.dtype)
            else:
                value = resolve(value, 0, names[i])
        else:
            value = resolve(schedule, loss._host_step(), names[i])
        if P.is_number(value):
            if loss.estimator == "variational" and math.isinf(value):
                raise ValueError(f"`{names[i]}` must be finite for estimator='variational'")
            value = P.fit_tilt(value, like.dtype, xp_torch)
        out.append(value)
    return out


def solve_ess(loss, values: torch.Tensor, compiling: bool) -> Any:
    """The tilt at which the weights of the union of every process's batch keep the
    ESS fraction (:func:`ess_tilt`, on the device). Eagerly it is read once (kept in
    ``t``; an unreachable fraction raises); when compiling it stays a 0-d tensor (an
    unreachable fraction gives NaN: the batch is skipped and counted, see
    :meth:`check`)."""
    spec = loss._ess
    if callable(spec):
        if compiling:
            step = loss.step if loss.training else (loss.step - 1).clamp_min(0)
            fraction = spec(step.to(torch.float64))
            if not isinstance(fraction, torch.Tensor):
                fraction = check_ess(fraction)
        else:
            step = loss._host_step() if loss.training else max(loss._host_step() - 1, 0)
            fraction = check_ess(resolve(spec, step, "ess"))
    else:
        fraction = spec
    union = values
    if loss.distributed:
        if compiling:
            raise RuntimeError(
                "`ess` with `distributed=True` solves the tilt on the losses gathered "
                "from every process (sizes known on the host only): call the loss "
                "outside the compiled region"
            )
        union = gather_values(values, loss.process_group)
    if union.shape[0] == 0:
        t = torch.zeros((), dtype=values.dtype, device=values.device)
    else:
        t = ess_tilt(union, fraction, loss.ess_sign).to(values.dtype)
    if compiling:
        return t
    value = float(t)
    if math.isnan(value):
        if not bool(torch.isfinite(union).all()):
            value = 0.0  # a non-finite batch: skipped and reported as such
        else:
            raise ValueError(
                f"`ess`={fraction!r}: no finite tilt of sign {loss.ess_sign:+d} reaches "
                f"this fraction of the batch's {union.shape[0]} losses (the tilted "
                f"weights keep at least the share of the losses tied at the "
                f"{'largest' if loss.ess_sign > 0 else 'smallest'} loss, all of them "
                f"for equal losses); give a larger `ess`"
            )
    loss._values[1] = value
    return value


def record_tilts(
    loss, t_group: Any, t_sample: Any, like: Any, compiling: bool
) -> None:
    """Keep the tilts of this training call for :attr:`tilts_in_use`: as Python numbers
    eagerly (no device operation), in the ``used`` buffer when compiling."""
    if not compiling:
        buf = loss.used
        loss.__dict__["_used"] = (float(t_group), float(t_sample), buf, buf._version)
        return
    pair = [t if isinstance(t, torch.Tensor) else P.const(t, like, xp_torch) for t in
            (t_group, t_sample)]
    loss.used.copy_(torch.stack(pair))


def running(loss, values, stats, codes, t_group, t_sample, ok, update):
    xp = xp_torch
    dtype = values.dtype
    state = [b.to(dtype) for b in (loss.risk, loss.seen, loss.counts)]
    value, coef, risk, seen, counts = running_from_stats(
        stats, t_group, t_sample, *state, loss.lam, xp
    )
    weights = sample_weights(values, risk, stats, codes, coef, t_sample, xp)
    if update:
        with torch.no_grad():
            ess = P.ess_fraction(stats, xp)
            loss.ess.copy_(torch.where(ok & ~torch.isnan(ess), ess, loss.ess.to(dtype)))
            for buf, new, old in zip(
                (loss.risk, loss.seen, loss.counts), (risk, seen, counts), state, strict=True
            ):
                buf.copy_(torch.where(ok, new, old))
    return value, weights


def variational(loss, values, stats, t_sample, ok, update):
    xp = xp_torch
    eta_now = loss.eta.detach().to(values.dtype)
    value, eta_used, eta_grad, _, coef = variational_from_stats(
        stats, t_sample, eta_now, loss.ready > 0, xp
    )
    weights = sample_weights(values, eta_used, stats, None, coef, t_sample, xp)
    ok_all = ok & torch.isfinite(weights).all()
    if not torch.compiler.is_compiling() and values.device.type == "cpu":
        if bool(ok) and not bool(ok_all):
            raise ValueError(
                "`losses`: the variational weights exp(t (loss - eta)) overflowed; this "
                "batch is far from the current eta: lower `t` or use estimator='running' "
                "(its weights are bounded by 1/lam)"
            )
    if update:
        with torch.no_grad():
            loss.eta.copy_(torch.where(ok_all, eta_used, eta_now))
            loss.ready.copy_(torch.where(ok_all, torch.ones_like(loss.ready), loss.ready))
    extra = eta_grad.detach() * (loss.eta - loss.eta.detach())
    return value, weights, extra


def mlmc(loss, losses, values, t_sample, update, compiling):
    xp = xp_torch
    n = values.shape[0]
    level = mlmc_level(loss, n)
    prob = 1.0 if level is None else loss._level_p[level - 1]
    t = P.const(t_sample, values, xp) if P.is_number(t_sample) else t_sample
    weights, value = mlmc_step(
        values, loss.base_batch_size, level or 0, prob, level is None, t, xp
    )
    ok = torch.isfinite(values).all()
    if not compiling and losses.device.type == "cpu" and loss.check_finite and not bool(ok):
        raise ValueError("`losses` contains NaN or infinite values; every loss must be finite")
    if update:
        with torch.no_grad():
            loss.nonfinite.add_((~ok).to(torch.int64))
        loss._advance(compiling)
    value = torch.where(ok, value, torch.full_like(value, math.nan)).detach()
    if not losses.requires_grad:
        return value
    return value + torch.dot(weights.detach(), losses.to(values.dtype) - values)


def per_sample(loss, input: Any, target: Any) -> Any:
    """The per-sample losses of a call: the criterion's, or the input itself."""
    if loss.criterion is not None:
        if target is None:
            raise ValueError("`target` is required: this loss wraps a criterion")
        return loss.criterion(input, target)
    if target is not None:
        raise ValueError(
            "`target` given but no criterion: pass per-sample losses, or build the "
            "loss as TiltedLoss(criterion, ...)"
        )
    return input


def used_tilts(loss) -> tuple[float, float]:
    """The tilts of the last training call (see ``TiltedLoss.tilts_in_use``)."""
    cache = loss.__dict__.get("_used")
    buf = loss.used
    if cache is not None and cache[2] is buf and cache[3] == buf._version:
        return cache[0], cache[1]
    t_group, t_sample = buf.tolist()
    return float(t_group), float(t_sample)


def report(loss) -> dict:
    """``TiltedLoss.group_report``: the running state per group (nothing read)."""
    if loss.estimator != "running":
        raise ValueError("`group_report` is for the running estimator")
    dtype = loss.risk.dtype
    schedule = loss._schedules[0]
    if schedule is None:
        t_group = loss._values[0]
    else:
        t_group = resolve(schedule, loss._host_step(), "tilts[0]")
    t_group = P.fit_tilt(t_group, dtype, xp_torch)
    return report_from_state(loss.risk, loss.counts, loss.ess.to(dtype), t_group, xp_torch)
