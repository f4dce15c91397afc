"""Engines: the code that evaluates a :class:`~tiltlab.objective.problem.TiltedProblem`.

An engine is an object with the methods of :class:`Engine`. Each method either returns its
result or None, which means "not for this problem (or this point)": the objective then asks
the next engine. For a problem, :func:`engines_for` gives the chain

1. the engine registered in :data:`ENGINES` for the array library of the data (a fused
   CUDA kernel for CuPy, one task graph per evaluation for Dask, ...), when there is one;
2. the one-pass block engine (:mod:`.onepass`) on eager backends;
3. the generic array-API engine (:mod:`.generic`) for predictor losses, or the
   parameter-space engine (:mod:`.parameter`) for callables. These never decline.

Adding an engine is one registration: ``ENGINES.register(library, engine)`` from the
module that defines it, made lazy by ``ENGINES.register_lazy(library, module)`` in
``tiltlab/_backends.py``. Engines count their passes over the data through the
:class:`Context` they are given with each call.
"""

from __future__ import annotations

from typing import Any

from ..._compat import is_lazy
from .base import ENGINES, Context, Engine
from .generic import GENERIC
from .onepass import ONE_PASS
from .parameter import PARAMETER

__all__ = ["ENGINES", "Context", "Engine", "engines_for"]


def engines_for(problem: Any) -> list[Engine]:
    """The engines to ask for ``problem``, in order (see the module doc)."""
    chain: list[Engine] = []
    special = ENGINES.dispatch(problem.xp)
    if special is not None and special.applies(problem):
        chain.append(special)
    if not problem.is_linear:
        chain.append(PARAMETER)
        return chain
    if not is_lazy(problem.xp) and ONE_PASS.applies(problem):
        chain.append(ONE_PASS)
    chain.append(GENERIC)
    return chain
