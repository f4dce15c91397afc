"""The fused CPU engine (numba): value, gradient and Hessian-vector products that read each
row of ``X`` once in one compiled loop, on all cores (:mod:`tiltlab._cpu_kernels`).

Registered for NumPy arrays in :data:`tiltlab.objective.engines.ENGINES` by this
package (``tiltlab/_backends.py`` names it). It serves sample-level problems
with a finite tilt, a loss the kernels know and float32 or float64 data, when numba is
installed (a dependency of the package) and the problem is large enough for compiled code
to pay (:func:`~tiltlab.use_fused`). Everything else goes on to the next
engines: other dtypes (float16), data the kernels do not take, a call whose losses are not
finite, and every call once the kernels failed to import or compile (a warning says so
once). A kernel that is neither compiled nor in the on-disk cache is compiled by a
background process while the next engines serve the problem (which then keeps them; see
:mod:`tiltlab._cpu_kernels.warmup`). ``fused = False`` on the objective, or the
environment variable ``TILTLAB_FUSED=0``, turns it off; ``TILTLAB_FUSED=wait`` compiles
missing kernels in the calling process on first use instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..objective.engines import Context, Engine
from ._launch import KernelsUnavailable, available
from ._prepare import LOSS_CODES
from .fused import FusedProblem, use_fused

__all__ = ["FUSED_CPU", "FusedCpuEngine"]

_CACHE_KEY = "fused_cpu"
_READY_KEY = "fused_cpu_kernels"
#: kept in the problem's cache when the kernels do not take its data
_DECLINED = "declined"
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _loss_params(loss: Any) -> dict | None:
    params = loss.parameters() if hasattr(loss, "parameters") else {}
    return dict(params) or None


class FusedCpuEngine(Engine):
    """Compiled one-pass loops over the rows of ``X`` (see :mod:`tiltlab._cpu_kernels`)."""

    name = "fused CPU"

    def applies(self, problem: Any) -> bool:
        if not problem.is_linear or problem.groups is not None or not problem.ready:
            return False
        if problem.loss.name not in LOSS_CODES:
            return False
        if getattr(problem.X, "dtype", None) not in _DTYPES:
            return False
        if not math.isfinite(problem.tilts[0]):
            return False
        n, d = problem.n_samples or 0, problem.n_features or 0
        k = problem.shape[1] if problem.shape is not None and len(problem.shape) == 2 else 1
        return use_fused(n, d, k)

    def _bound(self, problem: Any) -> Any:
        """The problem's data bound to the kernels (kept in its cache), or None when the
        kernels do not take it (the next engine then serves every call)."""
        fused = problem.cache.get(_CACHE_KEY)
        if fused is None:
            try:
                fused = FusedProblem(
                    problem.loss.name,
                    problem.X,
                    problem.y,
                    problem.prior,
                    loss_params=_loss_params(problem.loss),
                )
            except (TypeError, ValueError):
                fused = _DECLINED
            problem.cache[_CACHE_KEY] = fused
        return None if isinstance(fused, str) else fused

    def _serve(self, problem: Any, ctx: Context, method: str, *args: Any) -> Any:
        """``method`` of the bound problem, or None to decline."""
        if not ctx.fused or not available():
            return None
        fused = self._bound(problem)
        if fused is None:
            return None
        # a kernel neither compiled nor cached is compiled in the background meanwhile;
        # the problem keeps the engine it got first (one engine for a whole fit)
        decided = problem.cache.setdefault(_READY_KEY, {})
        kernel = fused.kernel(method)
        if kernel not in decided:
            decided[kernel] = fused.prepared(method)
        if not decided[kernel]:
            return None
        try:
            out = getattr(fused, method)(*args, float(problem.tilts[0]))
        except KernelsUnavailable:  # warned once; NumPy from now on
            return None
        if out is not None:
            ctx.count(1)
        return out

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        r = self._serve(problem, ctx, "value", theta)
        if r is None:
            return None
        return r + 0.5 * problem.l2 * (theta * theta).sum() if problem.l2 else r

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        out = self._serve(problem, ctx, "value_and_gradient", theta)
        if out is None:
            return None
        r, g = out
        if problem.l2:
            r = r + 0.5 * problem.l2 * (theta * theta).sum()
            g = g + problem.l2 * theta
        return r, g

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        hv = self._serve(problem, ctx, "hvp", theta, v)
        if hv is None:
            return None
        return hv + problem.l2 * v if problem.l2 else hv


#: The fused CPU engine (compiled kernels, NumPy data), one instance shared by every objective.
FUSED_CPU = FusedCpuEngine()
