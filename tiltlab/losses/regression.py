"""Regression losses of the linear predictor: squared, absolute and Huber."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import (
    as_float_array,
    device,
)
from .base import Loss, _ones_like, _zeros_like

__all__ = ["SquaredLoss", "AbsoluteLoss", "HuberLoss"]


# ----------------------------------------------------------------------------------------
# regression losses
# ----------------------------------------------------------------------------------------


class SquaredLoss(Loss):
    """Squared error ``(z - y)**2`` (no factor 1/2, as in the TERM paper).

    A GLM loss: ``l = A(z) - T(y) z + c(y)`` with ``A(z) = z**2``, ``T(y) = 2y``
    and ``c(y) = y**2``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import SquaredLoss
    >>> SquaredLoss().value(np.array([1.0, -1.0]), np.array([0.0, 1.0]))
    array([1., 4.])
    """

    name = "squared"
    is_glm = True
    curvature_bound = 2.0

    def _value(self, z, y, xp):
        r = z - y
        return r * r

    def _derivatives(self, z, y, xp):
        r = z - y
        return r * r, 2.0 * r, xp.full(r.shape, 2.0, dtype=r.dtype, device=device(r))

    def _value_and_d1(self, z, y, xp):
        r = z - y
        return r * r, 2.0 * r

    def cumulant(self, z: Any, *, xp: Any = None) -> tuple[Any, Any, Any]:
        """``(A(z), A'(z), A''(z)) = (z**2, 2z, 2)``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import SquaredLoss
        >>> SquaredLoss().cumulant(np.array([3.0]))
        (array([9.]), array([6.]), array([2.]))
        """
        xp = self._namespace(xp, z=z)
        z = as_float_array(z, xp, name="z")
        return z * z, 2.0 * z, xp.full(z.shape, 2.0, dtype=z.dtype, device=device(z))

    def statistic(self, y: Any, *, xp: Any = None) -> Any:
        """Sufficient statistic ``T(y) = 2y``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import SquaredLoss
        >>> SquaredLoss().statistic(np.array([1.5]))
        array([3.])
        """
        xp = self._namespace(xp, y=y)
        return 2.0 * as_float_array(y, xp, name="y")

    def offset(self, y: Any, *, xp: Any = None) -> Any:
        """The ``theta``-free term ``c(y) = y**2``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import SquaredLoss
        >>> SquaredLoss().offset(np.array([3.0]))
        array([9.])
        """
        xp = self._namespace(xp, y=y)
        y = as_float_array(y, xp, name="y")
        return y * y


class AbsoluteLoss(Loss):
    """Absolute error ``|z - y|`` (a baseline; not differentiable at ``z = y``).

    ``d1 = sign(z - y)`` (0 at the kink) and ``d2 = 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import AbsoluteLoss
    >>> AbsoluteLoss().value(np.array([1.0, -1.0]), np.array([0.0, 1.0]))
    array([1., 2.])
    """

    name = "absolute"
    smooth = False

    def _value(self, z, y, xp):
        return xp.abs(z - y)

    def _derivatives(self, z, y, xp):
        r = z - y
        return xp.abs(r), xp.sign(r), _zeros_like(r, xp)


class HuberLoss(Loss):
    """Huber loss with threshold ``delta``, in the scikit-learn/SciPy convention.

    With ``r = z - y``: ``r**2 / 2`` for ``|r| <= delta`` and
    ``delta * (|r| - delta/2)`` otherwise (``scipy.special.huber(delta, r)``).

    Parameters
    ----------
    delta : float, default 1.0
        Positive threshold between the quadratic and the linear part.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import HuberLoss
    >>> HuberLoss(delta=1.0).value(np.array([0.5, 3.0]), np.array([0.0, 0.0]))
    array([0.125, 2.5  ])
    """

    name = "huber"
    smooth = False  # C^1: the second derivative jumps at |r| = delta
    curvature_bound = 1.0

    def __init__(self, delta: float = 1.0):
        delta = float(delta)
        if not (delta > 0 and np.isfinite(delta)):
            raise ValueError(f"`delta` must be a positive finite number, got {delta}")
        self.delta = delta

    def _value(self, z, y, xp):
        r = z - y
        a = xp.abs(r)
        d = self.delta
        return xp.where(a <= d, 0.5 * r * r, d * (a - 0.5 * d))

    def _derivatives(self, z, y, xp):
        r = z - y
        a = xp.abs(r)
        d = self.delta
        inside = a <= d
        v = xp.where(inside, 0.5 * r * r, d * (a - 0.5 * d))
        d1 = xp.where(inside, r, d * xp.sign(r))
        d2 = xp.where(inside, _ones_like(r, xp), _zeros_like(r, xp))
        return v, d1, d2

    def __repr__(self) -> str:
        return f"HuberLoss(delta={self.delta!r})"
