"""The fast path of :func:`~tiltlab.risk.tilted_risk` and
:func:`~tiltlab.risk.tilted_weights`: one-dimensional losses on eager backends.

With a host tilt the risk and the weights take one exponential per loss, with host reads
of the extremes allowed. (CuPy's one-pass reductions are registered in the dispatch
tables by its backend package and run before this path.)
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from .._compat import (
    check_finite,
    is_cupy_namespace,
    is_lazy,
    is_torch_namespace,
    to_numpy,
)
from ..accumulator import (
    block_state,
    finalize_risk,
    host_extremes,
    shifted_exponent,
    spread_overflows,
)
from .kernels import _inplace_exp, _safe_mean, support_range

__all__: list[str] = []


# ---------------------------------------------------------------------------
# the fast path: one-dimensional losses on eager backends


def _check_losses(l: Any, xp: Any) -> None:
    check_finite(l, xp, name="losses", skip="check_finite=False")


def _use_fast_path(l: Any, xp: Any, check: bool) -> bool:
    """One-dimensional losses on an eager backend, with host reads allowed.

    ``check_finite=False`` on PyTorch keeps the synchronisation-free vectorised kernels,
    so that ``torch.compile(fullgraph=True)`` and ``torch.func.vmap`` trace through.
    """
    if l.ndim != 1 or is_lazy(xp):
        return False
    return check or not is_torch_namespace(xp)


def _host_tilt(t: Any, like: Any, xp: Any) -> Any:
    """A real Python/NumPy scalar tilt as a NumPy scalar of ``like``'s precision, else None
    (arrays, strings and everything else go through ``prepare_tilt``)."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)):
        return None
    v = float(t)
    if math.isnan(v):
        return None  # prepare_tilt raises the error
    if xp.finfo(like.dtype).bits != 32:
        return np.float64(v)
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf there
        return np.float32(v)


def _quiet(xp: Any, unchecked: bool = False):
    """Silence NumPy's overflow/underflow warnings inside the kernels: with finite input
    they come from intermediate terms whose limits (0 or inf) the kernels handle, and a
    finite result is returned (checked against mpmath near the float maximum).
    ``unchecked`` (``check_finite=False``) also silences the invalid operations of NaN
    or infinite losses, whose documented result is NaN."""
    if is_torch_namespace(xp) or is_cupy_namespace(xp):
        return contextlib.nullcontext()  # they do not warn (and torch.compile traces this)
    if unchecked:
        return np.errstate(all="ignore")
    return np.errstate(over="ignore", under="ignore")


def _keep(r: Any, keepdims: bool, ax: int, xp: Any) -> Any:
    return xp.expand_dims(r, axis=ax) if keepdims else r


def _finite_nonzero(tt: Any) -> bool:
    v = float(to_numpy(tt))
    return v != 0.0 and math.isfinite(v)


def _risk_1d(l: Any, p: Any, tt: Any, grid: bool, xp: Any, check: bool) -> Any:
    """Tilted risk of 1-d losses for a host tilt (or a grid of them): one exponential
    per loss and tilt, the extremes read once, temporaries of one loss vector."""
    if check and p is not None:
        _check_losses(l, xp)  # zero-weight samples are outside the extremes' support
    ts = [float(v) for v in np.atleast_1d(to_numpy(tt))]
    ext = None
    out = []
    for t in ts:
        if t == 0.0:
            r = xp.mean(l) if p is None else xp.sum(p * l)
            if not math.isfinite(float(to_numpy(r))):
                if check:
                    _check_losses(l, xp)
                r = _safe_mean(l, p, xp)  # the plain sum overflowed: a sum of l / n cannot
        elif math.isinf(t):
            if ext is None:
                ext = _checked_extremes(l, p, xp, check)
            r = support_range(l, p, xp)[0 if t > 0 else 1]  # on the device: differentiable
        else:
            if ext is None:
                ext = _checked_extremes(l, p, xp, check)
            r = finalize_risk(block_state(l, p, t, xp, extremes=ext), xp, l.dtype)
        out.append(r)
    return xp.stack(out) if grid else out[0]


def _checked_extremes(l: Any, p: Any, xp: Any, check: bool) -> tuple[float, float]:
    hi, lo = host_extremes(l, p, xp)
    if check and not (math.isfinite(hi) and math.isfinite(lo)):
        _check_losses(l, xp)
    return hi, lo


def _weights_1d(l: Any, p: Any, t: float, hi: float, lo: float, xp: Any) -> Any:
    """Tilted weights of 1-d losses: one exponential per loss, normalised in place."""
    huge = spread_overflows(hi, lo, l.dtype, xp)  # beyond the dtype's maximum: halved first
    u = shifted_exponent(l, hi if t > 0 else lo, t, p, xp, huge)
    e = _inplace_exp(u, xp)
    if getattr(e, "requires_grad", False):  # autograd: no in-place updates
        e = e if p is None else e * p
        return e / xp.sum(e)
    if p is not None:
        e *= p
    e /= xp.sum(e)
    return e
