"""What `TiltedLoss` needs beyond one batch on one process: the exchange of batch
statistics between processes, the widening of its state, and the guard that keeps the
state's dtype through a module-wide cast."""

from __future__ import annotations

import math
from typing import Any

import torch

from tiltlab.minibatch._stats import merge

__all__: list[str] = []

#: floating state of a `TiltedLoss`: it never follows a module-wide cast to a narrower type
STATE_BUFFERS = ("risk", "seen", "counts", "ready", "pending", "anchor", "anchor_coef")


def wider(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The wider of two floating dtypes (float32 for float16 against bfloat16)."""
    return torch.promote_types(a, b)


def keep_state_dtypes(module: torch.nn.Module, apply: Any) -> Any:
    """Run ``apply()`` (the module's ``_apply``) and give back to the floating state
    buffers and to ``eta`` any precision a cast took away (a device move is kept)."""
    before = {
        name: buf.dtype
        for name, buf in module._buffers.items()
        if name in STATE_BUFFERS and buf is not None and buf.is_floating_point()
    }
    eta = module._parameters.get("eta")
    eta_dtype = None if eta is None else eta.dtype
    out = apply()
    for name, dtype in before.items():
        buf = module._buffers.get(name)
        if buf is not None and buf.is_floating_point() and wider(buf.dtype, dtype) != buf.dtype:
            module._buffers[name] = buf.to(wider(buf.dtype, dtype))
    eta = module._parameters.get("eta")
    if eta is not None and eta_dtype is not None and wider(eta.dtype, eta_dtype) != eta.dtype:
        eta.data = eta.data.to(wider(eta.dtype, eta_dtype))
    return out


def widen_state(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Widen the floating state to at least ``dtype`` (float64 losses: a float64 state)."""
    for name in STATE_BUFFERS:
        buf = module._buffers.get(name)
        if buf is not None and wider(buf.dtype, dtype) != buf.dtype:
            module._buffers[name] = buf.to(wider(buf.dtype, dtype))
    eta = module._parameters.get("eta")
    if eta is not None and wider(eta.dtype, dtype) != eta.dtype:
        eta.data = eta.data.to(wider(eta.dtype, dtype))


def world_size(process_group: Any) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "`distributed=True` needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group)"
        )
    return dist.get_world_size(process_group)


def gather_stats(local: torch.Tensor, t: Any, process_group: Any, xp: Any) -> tuple[Any, int]:
    """The statistics of the union of every process's batch, and the number of processes:
    one all-gather of ``7 * n_groups`` numbers per process, merged in the log domain (the
    same merge on every process, so every process holds the same statistics)."""
    import torch.distributed as dist

    size = world_size(process_group)
    if size == 1:
        return local, 1
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=process_group)
    return merge(torch.stack(parts), t, xp), size


def lean_running_step(loss, losses, values, t: float, update: bool, compiling: bool):
    """The running estimator at sample level on one process, for a Python tilt t = 0 or
    0.05 <= |t| < inf: the same quantities as the general path in about 40 tensor
    operations (a training step's overhead is their dispatch). The running update is
    ``logaddexp(log(1 - lam), log(lam) + t gap) / t`` (exact to rounding in the weights;
    in the risk to ``eps / |t|``, hence the bound on |t|)."""
    n = values.shape[0]
    lo, hi = torch.aminmax(values)
    spread = hi - lo
    ok = torch.isfinite(spread)
    risk = loss.risk.to(values.dtype)
    lam = loss.lam
    if t == 0:
        batch = values.mean()
        if update:
            with torch.no_grad():
                loss.ess.fill_(1.0)
        new = batch if lam == 1.0 else risk[0] + lam * (batch - risk[0])
    else:
        c = hi if t > 0 else lo
        u = (values - c) * t
        ex = torch.exp(u)
        s = ex.sum()
        if update:  # the effective sample size fraction of this batch's weights
            with torch.no_grad():
                ess = (s / n) * (s / torch.dot(ex, ex))
                loss.ess.copy_(torch.where(ok, ess, loss.ess[0]))
        log_mean = torch.where(
            spread * abs(t) <= 1, torch.log1p(torch.expm1(u).sum() / n), torch.log(s / n)
        )
        batch = c + log_mean / t
        if lam == 1.0:
            new = batch
        else:
            prev = risk[0]
            floor = torch.full_like(prev, math.log1p(-lam))
            new = prev + torch.logaddexp(floor, (batch - prev) * t + math.log(lam)) / t
    new = torch.where(loss.seen[0] > 0, new, batch)
    if not compiling and values.device.type == "cpu" and loss.check_finite and not bool(ok):
        raise ValueError("`losses` contains NaN or infinite values; every loss must be finite")
    if update:
        with torch.no_grad():
            loss.risk.copy_(torch.where(ok, new, risk[0]))
            loss.seen.copy_(torch.where(ok, 1.0, loss.seen))
            loss.counts.add_(ok * float(n))
            loss.nonfinite.add_(~ok)
        loss._advance(compiling)
    value = torch.where(ok, batch if t == 0 else new, math.nan).detach()
    if not losses.requires_grad:
        return value
    delta = losses.to(values.dtype) - values
    if t == 0:
        return value + delta.sum() / n
    weights = ex * (torch.exp((batch - new) * t) / s)
    return value + torch.dot(weights.detach(), delta)
