"""What `TiltedLoss` needs beyond one batch on one process: the exchange of batch
statistics between processes, the widening of its state, and the guard that keeps the
state's dtype through a module-wide cast."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from tiltlab.accumulator.packed import exponent_terms, log_normaliser, merge

__all__: list[str] = []

#: floating state of a `TiltedLoss`: it never follows a module-wide cast to a narrower type
STATE_BUFFERS = ("risk", "seen", "counts", "ready", "pending", "anchor", "anchor_coef", "used")


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


def gather_values(local: torch.Tensor, process_group: Any) -> torch.Tensor:
    """The losses of every process's batch, in the order of the ranks (the same on every
    process): one all-gather of the sizes (read on the host) and one of the losses padded
    to the largest size. Empty local batches are legal."""
    import torch.distributed as dist

    size = world_size(process_group)
    if size == 1:
        return local
    count = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    counts = [torch.empty_like(count) for _ in range(size)]
    dist.all_gather(counts, count, group=process_group)
    sizes = [int(c) for c in counts]
    padded = local.new_zeros(max(sizes))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded, group=process_group)
    return torch.cat([part[:k] for part, k in zip(parts, sizes, strict=True)])


def lean_running_step(loss, losses, values, t: float, update: bool, compiling: bool):
    """The running estimator at sample level on one process, for a Python tilt t = 0 or
    0.05 <= |t| < inf: the same quantities as the general path in about 40 tensor
    operations (a training step's overhead is their dispatch; its numbers are 0-d tensors
    made once, see :func:`_numbers`). The running update is ``logaddexp(log(1 - lam),
    log(lam) + t gap) / t`` (exact to rounding in the weights; in the risk to ``eps /
    |t|``, hence the bound on |t|)."""
    k = _numbers(loss, values, t, compiling)
    risk_buf, seen_buf, ess_buf, prev, seen = _state(loss, compiling)
    lo, hi = torch.aminmax(values)
    spread = hi - lo
    # x - x is 0 for a finite x and NaN for an infinite or NaN one
    ok = torch.eq(spread - spread, k.zero)
    if prev.dtype != values.dtype:  # a state wider than these losses
        prev = prev.to(values.dtype)
    lam = loss.lam
    if t == 0:
        batch = values.mean()
        if update:
            ess_buf.fill_(1.0)
        new = batch if lam == 1.0 else torch.lerp(prev, batch, lam)
    else:
        c = hi if t > 0 else lo
        u = (values - c) * k.ts
        ex, em = exponent_terms(u, torch, squares=False)
        s = ex.sum()
        s_mean = s / k.n
        if update:  # the effective sample size fraction of this batch's weights
            ess = s_mean * (s / torch.dot(ex, ex))
            write_where(ess_buf, ok, ess, compiling)
        near = spread <= k.inv_abs_t
        log_mean = log_normaliser(em.mean(), s_mean, near, torch, guarded=False)
        batch = torch.add(c, log_mean, alpha=1.0 / t)
        if lam == 1.0:
            new = batch
        else:
            floor, log_lam = k.floor, k.log_lam
            if compiling:  # Python numbers there
                floor, log_lam = torch.full_like(prev, floor), torch.full_like(prev, log_lam)
            moved = torch.logaddexp(floor, torch.add(log_lam, batch - prev, alpha=t))
            new = torch.add(prev, moved, alpha=1.0 / t)
    new = torch.where(seen > k.zero, new, batch)
    if not compiling and values.device.type == "cpu" and loss.check_finite and not bool(ok):
        raise ValueError("`losses` contains NaN or infinite values; every loss must be finite")
    if update:  # nothing here requires a gradient (the losses' values are detached)
        write_where(risk_buf, ok, new, compiling)
        seen_buf.masked_fill_(ok, 1.0)
        loss.counts.add_(ok, alpha=values.shape[0])
        loss.nonfinite.add_(~ok)
        loss._advance(compiling)
    value = torch.where(ok, batch if t == 0 else new, k.nan)
    if not losses.requires_grad:
        return value
    delta = losses - values if losses.dtype == values.dtype else losses.to(values.dtype) - values
    if t == 0:
        return value + delta.mean()
    # the weights ex * factor: the factor (a number) multiplies the dot product, so that
    # the backward pass forms ex * factor, the same products as weights formed first
    factor = torch.exp((batch - new) * k.ts) / s
    return torch.addcmul(value, torch.dot(ex, delta), factor)


def write_where(buf: torch.Tensor, ok: torch.Tensor, new: torch.Tensor, compiling: bool) -> None:
    """``buf = new`` where ``ok`` (a 0-d flag), else ``buf`` as it was: written in place
    by ``where`` eagerly (one operation), through a copy when compiling. ``new`` is cast
    to the buffer's dtype (the state may be narrower than the losses, float32 buffers
    with float64 losses, or wider)."""
    if compiling:
        buf.copy_(torch.where(ok, new, buf))
        return
    if new.dtype != buf.dtype:
        new = new.to(buf.dtype)
    torch.where(ok, new, buf, out=buf)


def _state(loss, compiling: bool) -> tuple[torch.Tensor, ...]:
    """The buffers ``risk``, ``seen``, ``ess`` and 0-d views of the first two, the views
    kept while the buffers are the same tensors (a move, cast or load replaces them);
    made afresh when compiling (a traced view must not outlive its graph)."""
    bufs = loss._buffers
    risk, seen, ess = bufs["risk"], bufs["seen"], bufs["ess"]
    if compiling:
        return risk, seen, ess, risk[0], seen[0]
    cached = loss.__dict__.get("_lean_state")
    if cached is None or cached[0] is not risk or cached[1] is not seen or cached[2] is not ess:
        cached = (risk, seen, ess, risk[0], seen[0])
        loss.__dict__["_lean_state"] = cached
    return cached


class _Numbers(NamedTuple):
    zero: Any
    one: Any
    nan: Any
    n: Any
    log_lam: Any
    floor: Any
    ts: Any
    inv_abs_t: Any


def _numbers(loss, values, t: float, compiling: bool) -> _Numbers:
    """The numbers of a step as 0-d tensors of the losses' dtype and device, made once
    (an eager operation with a Python number wraps it in a new tensor at every call, which
    costs about as much as the operation), or as Python numbers when compiling. The tilt's
    two numbers become tensors once the same tilt comes a second time in a row (a schedule
    that changes t at every step keeps them Python numbers: making them would cost more)."""
    lam = loss.lam
    tilt = (t, 1.0 / abs(t) if t != 0 else math.inf)
    if compiling:
        fixed = (0.0, 1.0, math.nan, float(values.shape[0]), math.log(lam))
        return _Numbers(*fixed, math.log1p(-lam) if lam < 1.0 else -math.inf, *tilt)
    key = (values.dtype, values.device, values.shape[0], lam)
    cached = loss.__dict__.get("_lean_numbers")
    if cached is None or cached[0] != key:
        numbers = [0.0, 1.0, math.nan, float(values.shape[0]), math.log(lam)]
        numbers.append(math.log1p(-lam) if lam < 1.0 else -math.inf)
        made = torch.tensor(numbers, dtype=values.dtype, device=values.device)
        cached = (key, made.unbind(), None, None)
        loss.__dict__["_lean_numbers"] = cached
    if cached[2] == t:
        if cached[3] is None:  # the same tilt a second time: keep it as tensors
            made = torch.tensor(tilt, dtype=values.dtype, device=values.device).unbind()
            cached = (key, cached[1], t, made)
            loss.__dict__["_lean_numbers"] = cached
        return _Numbers(*cached[1], *cached[3])
    loss.__dict__["_lean_numbers"] = (key, cached[1], t, None)
    return _Numbers(*cached[1], *tilt)
