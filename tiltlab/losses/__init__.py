"""Per-sample loss families for tilted empirical risk minimization.

Two kinds of losses live here.

*Linear-predictor losses* (``is_linear = True``) are functions ``l(z, y)`` of the
linear predictor ``z = X @ theta`` and a target ``y``. They expose per-sample
values and first and second derivatives in ``z``, so that an objective can form
gradients ``X.T @ (w * d1)`` and Hessian-vector products without ever building
an ``N x d`` matrix of per-sample gradients:

============== ============================================== ==========================
name           value ``l(z, y)``                               labels ``y``
============== ============================================== ==========================
squared        ``(z - y)**2`` (no factor 1/2)                  real
absolute       ``|z - y|``                                     real
huber          ``r**2/2`` if ``|r| <= delta`` else              real
               ``delta*(|r| - delta/2)``, ``r = z - y``
logistic       ``-y log s(z) - (1-y) log(1 - s(z))``            0 or 1
hinge          ``max(0, 1 - s z)``, ``s = 2y - 1``              0 or 1
squared_hinge  ``max(0, 1 - s z)**2``                           0 or 1
multinomial    ``logsumexp(z_i) - z_{i, y_i}``, ``z`` (N, K)     integers in ``[0, K)``
poisson        ``exp(z) - y - y (z - log y)`` (log link)         real, ``>= 0``
pinball        ``max(q r, (q - 1) r)``, ``r = y - z``            real
============== ============================================== ==========================

The scalar losses (all but multinomial) are written once, in the table of
:mod:`tiltlab.losses.table`, from which every engine's code is generated.

*Non-linear losses* (``is_linear = False``, subclasses of
:class:`~tiltlab.losses.custom.ParameterLoss`, not of :class:`Loss`) are given directly
in the parameters ``theta``: :class:`CallableLoss` wraps user callables and
:class:`FairPCALoss` is the fair-PCA group loss of the TERM paper (section 5.2).
They return per-sample gradients as an ``(N, d)`` Jacobian.

All computations use the array namespace of the inputs (NumPy, CuPy, PyTorch,
array-api-strict, Dask, ...) and keep their dtype and device.

Layout
------
The classes live in submodules named after what they hold; import them from here:
:mod:`~tiltlab.losses.base` (:class:`Loss`), :mod:`~tiltlab.losses.regression`,
:mod:`~tiltlab.losses.classification`, :mod:`~tiltlab.losses.custom`
(:class:`CallableLoss`), :mod:`~tiltlab.losses.point_estimation`,
:mod:`~tiltlab.losses.fair_pca` and :mod:`~tiltlab.losses.registry` (:func:`get_loss`,
``LOSS_NAMES``).
"""

from .base import Loss
from .classification import HingeLoss, LogisticLoss, MultinomialLoss, SquaredHingeLoss
from .custom import CallableLoss
from .custom import ParameterLoss as ParameterLoss  # the base of the second kind
from .fair_pca import FairPCALoss
from .point_estimation import PointEstimationLoss
from .registry import LOSS_NAMES, get_loss
from .regression import AbsoluteLoss, HuberLoss, PinballLoss, PoissonLoss, SquaredLoss

__all__ = [
    "Loss",
    "SquaredLoss",
    "AbsoluteLoss",
    "HuberLoss",
    "PoissonLoss",
    "PinballLoss",
    "LogisticLoss",
    "HingeLoss",
    "SquaredHingeLoss",
    "MultinomialLoss",
    "CallableLoss",
    "FairPCALoss",
    "PointEstimationLoss",
    "LOSS_NAMES",
    "get_loss",
]
