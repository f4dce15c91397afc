"""The point-estimation loss ``||x_i - theta||^2`` of the paper's toy examples."""

from __future__ import annotations

from typing import Any

from .._compat import (
    device,
    namespace_of,
)
from .custom import CallableLoss

__all__ = ["PointEstimationLoss"]


class PointEstimationLoss(CallableLoss):
    """Squared distance of a point estimate to each sample, ``f(x_i; theta) = ||x_i - theta||^2``.

    The loss of the paper's point-estimation toy: the rows of ``X`` are the samples and
    ``theta`` (shape ``(d,)``) the estimate. Per-sample gradient ``2 (theta - x_i)`` and
    Hessian ``2 I``; written on the array API, so it runs on every backend.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import PointEstimationLoss
    >>> PointEstimationLoss().fun(np.zeros(2), np.array([[0.0, 0.0], [3.0, 4.0]]))
    array([ 0., 25.])
    """

    def __init__(self) -> None:
        super().__init__(
            self._value_of, self._grad_of, self._hess_of, name="point_estimation", convex=True
        )

    @staticmethod
    def _check(theta: Any, X: Any) -> Any:
        if X is None or X.ndim != 2 or X.shape[1] != theta.shape[0]:
            shape = None if X is None else tuple(X.shape)
            raise ValueError(
                f"`X` must hold the samples as rows of shape (N, {theta.shape[0]}), got {shape}"
            )
        return namespace_of(X=X, theta=theta)

    @classmethod
    def _value_of(cls, theta: Any, X: Any, y: Any) -> Any:
        xp = cls._check(theta, X)
        diff = X - theta[None, :]
        return xp.sum(diff * diff, axis=1)

    @classmethod
    def _grad_of(cls, theta: Any, X: Any, y: Any) -> Any:
        cls._check(theta, X)
        return 2.0 * (theta[None, :] - X)

    @classmethod
    def _hess_of(cls, theta: Any, X: Any, y: Any) -> Any:
        xp = cls._check(theta, X)
        d = theta.shape[0]
        eye = 2.0 * xp.eye(d, dtype=X.dtype, device=device(X))
        return xp.broadcast_to(eye[None, :, :], (X.shape[0], d, d))

    def __repr__(self) -> str:
        return "PointEstimationLoss()"
