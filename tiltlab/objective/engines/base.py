"""The engine interface (:class:`Engine`, :class:`Context`) and the table of engines per
array library (:data:`ENGINES`); see :mod:`tiltlab.objective.engines`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..._dispatch import Dispatch

__all__ = ["ENGINES", "Context", "Engine"]


@dataclasses.dataclass
class Context:
    """What an objective hands its engines with each call.

    ``count(k)`` adds ``k`` passes over the data to the objective's tally (one per
    product with ``X`` or ``X^T``, or per blocked sweep); ``update(problem)`` hands back
    a problem completed by an evaluation (the parameter shape of a parameter-space loss);
    ``block_rows`` sets the rows per block of blocked engines (None: their policy, with
    blocks of about ``block_bytes``);
    ``fused`` allows fused kernels.
    """

    #: Adds ``k`` passes over the data to the objective's tally.
    count: Callable[[float], None]
    #: Hands back a problem completed by an evaluation.
    update: Callable[[Any], None]
    #: Rows per block of blocked engines (None: their policy, blocks of ``block_bytes``).
    block_rows: int | None = None
    #: Whether fused kernels (CUDA, compiled CPU) may serve the call.
    fused: bool = True
    #: The target size in bytes of one block of rows of ``X``.
    block_bytes: int = 1 << 25


#: engines for one array library each, filled by optional backends (see the module doc)
ENGINES = Dispatch("objective engine")


class Engine:
    """Base of the engines: every evaluation declines (returns None).

    ``theta`` and ``v`` arrive validated, in the problem's namespace and parameter
    ``shape``; gradients and products are returned in that shape, with the ridge term
    included, and values as 0-d arrays.
    """

    #: a short name, shown in ``repr`` and in error messages
    name = "engine"
    #: whether the engine itself raises the ``ValueError`` naming ``theta`` for a
    #: non-finite ``theta`` at every tilt; if not, the objective checks ``theta`` where a
    #: result at ``t = 0`` or ``t = +-inf`` is not finite
    checks_theta = False

    def applies(self, problem: Any) -> bool:
        """Whether this engine may serve ``problem`` at all."""
        return True

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        """The objective's value at ``theta`` (a 0-d array), or None to decline."""
        return None

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        """``(value, gradient)`` at ``theta``, or None to decline."""
        return None

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        """The Hessian-vector product ``H(theta) v``, or None to decline."""
        return None

    def hessian(self, problem: Any, theta: Any, ctx: Context) -> Any:
        """The Hessian at ``theta``, or None to decline."""
        return None

    def linearize(self, problem: Any, theta: Any, ctx: Context) -> Any:
        """The value, gradient and a Hessian-vector product function at ``theta`` (one
        evaluation for several products), or None to decline."""
        return None

    def __repr__(self) -> str:
        return f"<{self.name} engine>"
