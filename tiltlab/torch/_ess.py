"""The tilt of a batch's effective sample size, solved on the device (eagerly and inside
``torch.compile`` alike), for `TiltedLoss(ess=...)`."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__: list[str] = []

#: halvings of the bracket of log z (width 800: below 1 after 10), then Newton steps
_BISECTIONS = 10
_NEWTON = 8


def ess_tilt(values: torch.Tensor, fraction: Any, sign: int) -> torch.Tensor:
    """The tilt of sign ``sign`` at which the weights ``exp(t l_i)`` of ``values`` keep
    ``fraction`` of the batch as effective sample size, as a 0-d tensor; NaN where no
    finite tilt reaches it (``fraction`` not above the share of the losses tied at the
    extreme, which includes equal losses) and 0 for ``fraction`` 1.

    With ``d_i`` the distance of each loss from the extreme that the tilt favours (the
    smallest for ``sign=-1``), ``D`` the largest of them and ``z = |t| D``, the fraction
    ``F = (sum_i w_i)^2 / (n sum_i w_i^2)`` with ``w_i = exp(-z d_i / D)`` falls
    monotonically in ``z`` from 1 to that tied share; ``log z`` is bracketed over the range
    where ``F`` can differ from its limits in the dtype (``exp(log z + log(d_i / D))``
    never overflows), bisected to a bracket of width below 1, and the root of ``log F -
    log f`` finished by safeguarded Newton steps (a fixed count: 18 passes in all). No
    value is read on the host: the bisection is traced by ``torch.compile`` as it runs
    eagerly. Solved in float64 (float32 where the device has no float64).
    """
    dtype = torch.float64 if values.device.type != "mps" else torch.float32
    v = values.detach().to(dtype)
    n = v.shape[0]
    info = torch.finfo(dtype)
    if not isinstance(fraction, torch.Tensor) and fraction >= 1.0:
        return torch.zeros((), dtype=dtype, device=v.device)
    extreme = v.amax() if sign > 0 else v.amin()
    d = (v - extreme).abs()
    spread = d.amax()
    ok = torch.isfinite(spread) & (spread > 0)
    r = d / torch.where(ok, spread, torch.ones_like(spread))
    log_r = torch.log(r)  # -inf at the extreme: weight 1 at every z
    tied = (r == 0).to(dtype).sum()
    f = torch.as_tensor(fraction, dtype=dtype, device=v.device)
    reachable = ok & (f * n > tied) & (f <= 1)
    lo = torch.full((), -45.0, dtype=dtype, device=v.device)
    top = 5.0 - math.log(info.smallest_normal * info.eps)  # z d / D > 5 for the least d
    hi = torch.full((), top, dtype=dtype, device=v.device)
    log_target = torch.log(f * n)
    # bisection to a bracket of width < 1 in log z, then Newton steps in log z kept
    # inside the bracket (a step leaving it bisects), quadratic near the root
    x = lo
    for k in range(_BISECTIONS + _NEWTON):
        mid = 0.5 * (lo + hi)
        x = mid if k < _BISECTIONS else torch.where((x >= lo) & (x <= hi), x, mid)
        e = torch.exp(x + log_r)  # z d_i / D
        w = torch.exp(-e)
        s1, s2 = w.sum(), torch.dot(w, w)
        g = 2 * torch.log(s1) - torch.log(s2) - log_target  # log F - log f, falls in x
        above = g > 0  # the root lies at a larger z
        lo = torch.where(above, x, lo)
        hi = torch.where(above, hi, x)
        if k >= _BISECTIONS - 1:  # d g / d log z
            slope = 2 * torch.dot(w, w * e) / s2 - 2 * torch.dot(w, e) / s1
            step = g / torch.where(slope < 0, slope, torch.full_like(slope, -1.0))
            x = x - torch.where(slope < 0, step, torch.zeros_like(step))
    x = torch.where((x >= lo) & (x <= hi), x, 0.5 * (lo + hi))
    t = sign * torch.exp(x) / torch.where(ok, spread, torch.ones_like(spread))
    t = torch.where(f >= 1, torch.zeros_like(t), t)
    return torch.where(reachable | (f >= 1), t, torch.full_like(t, math.nan))
