"""Dispatch tables of the risk functions: implementations for array libraries that need
their own evaluation (a lazy library evaluates a risk as one task graph).

An implementation takes the public function's arguments and returns the result, or None
to let the generic array-API path handle a case it does not cover. Backends register
into these tables when imported; ``tiltlab/_backends.py`` names the modules to import
lazily, so this layer never imports a higher one.
"""

from __future__ import annotations

from .._dispatch import Dispatch

__all__: list[str] = []  # private tables (backends register into them)

#: ``impl(losses, t, *, axis, weights, keepdims, check_finite)`` -> risk or None
TILTED_RISK = Dispatch("tilted_risk")

#: ``impl(losses, groups, tilts, *, weights, check_finite)`` -> risk or None
HIERARCHICAL_RISK = Dispatch("hierarchical_risk")

#: ``impl(losses, t, *, axis, weights, check_finite)`` -> weights or None
TILTED_WEIGHTS = Dispatch("tilted_weights")

#: ``impl(losses, groups, tilts, *, weights, check_finite)`` -> weights or None
HIERARCHICAL_WEIGHTS = Dispatch("hierarchical_weights")
