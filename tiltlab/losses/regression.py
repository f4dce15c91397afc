"""Regression losses of the linear predictor: squared, absolute, Huber, Poisson and pinball.

Their values and derivatives are the table's (:mod:`tiltlab.losses.table`); the classes
add the label checks, the parameters and the GLM parts."""

from __future__ import annotations

from typing import Any

from .._compat import (
    as_float_array,
    device,
)
from .formula import FormulaLoss, check_param

__all__ = ["SquaredLoss", "AbsoluteLoss", "HuberLoss", "PoissonLoss", "PinballLoss"]


# ----------------------------------------------------------------------------------------
# regression losses
# ----------------------------------------------------------------------------------------


class SquaredLoss(FormulaLoss):
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


class AbsoluteLoss(FormulaLoss):
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


class HuberLoss(FormulaLoss):
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
        self.delta = check_param("huber", "delta", delta)


class PoissonLoss(FormulaLoss):
    """Half Poisson deviance with a log link, for counts or rates ``y >= 0``.

    ``l(z, y) = exp(z) - y - y (z - log y)`` (``y log y = 0`` at ``y = 0``): zero at a
    perfect fit ``exp(z) = y``, the negative log-likelihood of a Poisson mean ``exp(z)``
    up to a term of ``y`` alone. It is evaluated as ``y (expm1(w) - w)`` with
    ``w = z - log y`` (``exp(z)`` at ``y = 0``), which keeps the small losses near a good
    fit; ``d1 = exp(z) - y`` (as ``y expm1(w)``) and ``d2 = exp(z)``. Beyond ``w = 8``,
    where nothing cancels, the loss is ``exp(z) - y - y w`` and ``d1 = exp(z) - y``, so
    that a small rate ``y`` far below the prediction gives the finite loss rather than
    the overflow of ``expm1(w)``. The predictor is the
    log of the mean: :class:`~tiltlab.estimators.TiltedRegressor` predicts ``exp(z)``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import PoissonLoss
    >>> PoissonLoss().value(np.array([0.0, np.log(3.0), 1.0]), np.array([0.0, 3.0, 0.0]))
    array([1.        , 0.        , 2.71828183])
    """

    name = "poisson"


class PinballLoss(FormulaLoss):
    """Pinball (quantile) loss ``max(q r, (q - 1) r)`` with ``r = y - z``, ``0 < q < 1``.

    Its minimiser over a constant predictor is the ``q``-quantile of the targets. It has a
    kink at ``r = 0``, where ``d1`` takes 0 (a subgradient, as for :class:`AbsoluteLoss`,
    which is twice the pinball loss at ``q = 1/2``); ``d1 = -q`` for ``r > 0``,
    ``1 - q`` for ``r < 0``, and ``d2 = 0``.

    Parameters
    ----------
    quantile : float, default 0.5
        The quantile ``q``, in ``(0, 1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import PinballLoss
    >>> PinballLoss(quantile=0.9).value(np.array([0.0, 0.0]), np.array([1.0, -1.0]))
    array([0.9, 0.1])
    """

    name = "pinball"
    smooth = False

    def __init__(self, quantile: float = 0.5):
        self.quantile = check_param("pinball", "quantile", quantile)
