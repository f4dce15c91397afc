"""An objective linearised at a point: value, gradient and Hessian-vector products that
reuse the losses, tilted weights and loss derivatives computed once there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._compat import library_namespace as _namespace

__all__ = ["Linearization"]


class Linearization:
    """A tilted objective at a fixed ``theta``, from :meth:`tiltlab.TiltedObjective.linearize`.

    A Newton-CG step asks for many Hessian-vector products at one point; each product
    from here costs a product with ``X`` and one with ``X^T`` and never evaluates the
    losses or the tilted weights again.

    Attributes
    ----------
    theta : array
        The point, in the shape it was given.
    value : 0-d array
        The objective at ``theta``.
    gradient : array
        The gradient at ``theta``, in the shape of ``theta``.
    losses, weights : array
        Per-sample losses and tilted (or hierarchical) weights at ``theta``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> obj = TiltedObjective("logistic", np.eye(3), np.array([0, 1, 1]), t=2.0)
    >>> lin = obj.linearize(np.zeros(3))
    >>> v = np.ones(3)
    >>> bool(np.allclose(lin.hvp(v), obj.hvp(np.zeros(3), v)))
    True
    """

    def __init__(
        self,
        theta: Any,
        value: Any,
        gradient: Any,
        losses: Any,
        weights: Any,
        products: Callable[[Any], Any],
        check: Callable[[Any], Any] | None = None,
    ):
        self.theta = theta
        self.value = value
        self.gradient = gradient
        self.losses = losses
        self.weights = weights
        self._products = products
        self._check = check

    def hvp(self, v: Any) -> Any:
        """Hessian-vector product at the linearisation point, in the shape of ``v``."""
        vv = v if self._check is None else self._check(v)
        return self._products(vv)

    def reshaped(self, theta: Any, shape: Any, check: Callable[[Any], Any]) -> Linearization:
        """This linearisation (made in the parameter ``shape``) seen in the shape of
        ``theta``, with ``check`` validating each direction ``v``."""
        xp = _namespace(theta)

        def products(v: Any) -> Any:
            V = v if shape is None else xp.reshape(v, shape)
            return xp.reshape(self.hvp(V), v.shape)

        grad = xp.reshape(self.gradient, theta.shape)
        return Linearization(
            theta, self.value, grad, self.losses, self.weights, products, check=check
        )

    def __repr__(self) -> str:
        return f"Linearization(value={self.value!r})"
