"""The interface of an objective, as the solvers and analysis tools use it.

:class:`Objective` is a :class:`typing.Protocol`: :class:`~tiltlab.TiltedObjective`, the
client-side face of a Dask objective (:class:`tiltlab.distributed.ClientObjective`) and
the estimators' objective with an unpenalised intercept satisfy it without inheriting
from anything. :func:`check_objective` is the one check of it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .linearization import Linearization

__all__ = ["Objective", "check_objective", "linearize_by_products"]


@runtime_checkable
class Objective(Protocol):
    """What a solver may call on an objective.

    ``theta`` is the parameter (of shape ``shape``, or flat), in the namespace ``xp``;
    ``n_passes`` counts the passes over the data made so far.
    """

    xp: Any
    n_passes: float

    def check_theta(self, theta: Any, name: str = "theta") -> Any:
        """``theta`` as an array of the objective's namespace, dtype and shape."""
        ...

    def zeros(self) -> Any:
        """A zero parameter."""
        ...

    def value(self, theta: Any) -> Any:
        """The objective's value at ``theta``."""
        ...

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        """The value and the gradient at ``theta``."""
        ...

    def gradient(self, theta: Any) -> Any:
        """The gradient at ``theta``."""
        ...

    def hvp(self, theta: Any, v: Any) -> Any:
        """The Hessian-vector product ``H(theta) v``."""
        ...

    def hessian(self, theta: Any) -> Any:
        """The Hessian at ``theta``."""
        ...

    def linearize(self, theta: Any) -> Linearization:
        """The value, gradient and Hessian-vector products at ``theta``."""
        ...


#: the members of :class:`Objective`, in the order error messages list them
MEMBERS = (
    "value_and_gradient",
    "value",
    "gradient",
    "hvp",
    "hessian",
    "linearize",
    "zeros",
    "check_theta",
    "xp",
    "n_passes",
)


def check_objective(obj: Any, name: str = "objective", *, tilted: bool = False) -> Any:
    """``obj`` if it satisfies :class:`Objective`, else a ``TypeError`` naming ``name`` and
    the missing members. With ``tilted=True`` it must be a
    :class:`~tiltlab.TiltedObjective` itself (tools that read its data, not only call it).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> obj = TiltedObjective("squared", np.eye(2), np.ones(2))
    >>> check_objective(obj) is obj
    True
    >>> check_objective(3.0, "x0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: `x0` must be a tiltlab.TiltedObjective or follow the ... (no ...
    """
    if tilted:
        from ._facade import TiltedObjective

        if not isinstance(obj, TiltedObjective):
            raise TypeError(f"`{name}` must be a tiltlab.TiltedObjective, got {type(obj).__name__}")
        return obj
    missing = [m for m in MEMBERS if not hasattr(obj, m)]
    if missing:
        raise TypeError(
            f"`{name}` must be a tiltlab.TiltedObjective or follow the "
            f"tiltlab.objective.Objective protocol, got {type(obj).__name__} "
            f"(no {', '.join(missing)})"
        )
    return obj


def linearize_by_products(objective: Any, theta: Any) -> Linearization:
    """A linearisation whose products call ``objective.hvp(theta, v)`` each time (for
    objectives with no cheaper way; losses and weights are not kept)."""
    value, gradient = objective.value_and_gradient(theta)
    return Linearization(theta, value, gradient, None, None, lambda v: objective.hvp(theta, v))
