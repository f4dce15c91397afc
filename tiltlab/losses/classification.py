"""Classification losses of the linear predictor.

Binary (labels 0 or 1): :class:`LogisticLoss`, :class:`HingeLoss`,
:class:`SquaredHingeLoss`; multi-class: :class:`MultinomialLoss` (softmax cross-entropy,
integer labels in ``[0, K)``).
"""

from __future__ import annotations

from typing import Any

from .._compat import (
    as_array,
    as_float_array,
    device,
    to_numpy,
)
from .base import Loss, _sigmoid_pair, _softplus, _zeros_like
from .formula import FormulaLoss

__all__ = ["LogisticLoss", "HingeLoss", "SquaredHingeLoss", "MultinomialLoss"]


# ----------------------------------------------------------------------------------------
# binary classification losses
# ----------------------------------------------------------------------------------------


class LogisticLoss(FormulaLoss):
    """Logistic loss (binary cross-entropy with natural log), labels ``y`` in {0, 1}.

    ``l = -y log s(z) - (1-y) log(1 - s(z)) = softplus(z) - y z`` with the logistic
    sigmoid ``s``. It is evaluated as ``max(z, 0) - y z + log1p(exp(-|z|))``, which
    never overflows and keeps full relative precision even for tiny losses; the
    derivatives ``d1 = s(z) - y`` and ``d2 = s(z) s(-z)`` use a sigmoid that never
    overflows either.

    A GLM loss: ``A(z) = softplus(z)``, ``T(y) = y``, ``c(y) = 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import LogisticLoss
    >>> LogisticLoss().value(np.array([0.0, 1e4]), np.array([1, 0]))
    array([6.93147181e-01, 1.00000000e+04])
    """

    name = "logistic"
    is_glm = True
    curvature_bound = 0.25

    def cumulant(self, z: Any, *, xp: Any = None) -> tuple[Any, Any, Any]:
        """``(A(z), A'(z), A''(z)) = (softplus(z), s(z), s(z)(1 - s(z)))``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import LogisticLoss
        >>> LogisticLoss().cumulant(np.array([0.0]))
        (array([0.69314718]), array([0.5]), array([0.25]))
        """
        xp = self._namespace(xp, z=z)
        z = as_float_array(z, xp, name="z")
        s, sc = _sigmoid_pair(z, xp)
        return _softplus(z, xp), s, s * sc

    def statistic(self, y: Any, *, xp: Any = None) -> Any:
        """Sufficient statistic ``T(y) = y`` (as floats).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import LogisticLoss
        >>> LogisticLoss().statistic(np.array([0, 1]))
        array([0., 1.])
        """
        xp = self._namespace(xp, y=y)
        return as_float_array(y, xp, name="y")

    def offset(self, y: Any, *, xp: Any = None) -> Any:
        """The ``theta``-free term ``c(y) = 0``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import LogisticLoss
        >>> LogisticLoss().offset(np.array([0, 1]))
        array([0., 0.])
        """
        xp = self._namespace(xp, y=y)
        return _zeros_like(as_float_array(y, xp, name="y"), xp)


class HingeLoss(FormulaLoss):
    """Hinge loss ``max(0, 1 - s z)`` with ``s = 2y - 1`` for labels ``y`` in {0, 1}.

    ``d1`` is the subgradient ``-s`` where the margin is violated and 0 elsewhere
    (0 at the kink); ``d2 = 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import HingeLoss
    >>> HingeLoss().value(np.array([0.5, 2.0, 0.5]), np.array([1, 1, 0]))
    array([0.5, 0. , 1.5])
    """

    name = "hinge"
    smooth = False


class SquaredHingeLoss(HingeLoss):
    """Squared hinge loss ``max(0, 1 - s z)**2`` with ``s = 2y - 1``, ``y`` in {0, 1}.

    ``d1 = -2 s max(0, 1 - s z)`` and ``d2 = 2`` where the margin is violated
    (0 elsewhere, and at the kink).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import SquaredHingeLoss
    >>> SquaredHingeLoss().value(np.array([0.5, 2.0, 0.5]), np.array([1, 1, 0]))
    array([0.25, 0.  , 2.25])
    """

    name = "squared_hinge"
    smooth = False  # C^1
    curvature_bound = 2.0


# ----------------------------------------------------------------------------------------
# multinomial
# ----------------------------------------------------------------------------------------


class MultinomialLoss(Loss):
    """Softmax cross-entropy ``logsumexp(z_i) - z_{i, y_i}`` for ``K`` classes.

    ``z`` has shape ``(N, K)`` (``theta`` of shape ``(d, K)``) and ``y`` holds integer
    labels in ``[0, K)``. The gradient in ``z`` is ``softmax(z) - onehot(y)`` (the
    entry of the true class is computed as minus the mass of the other classes, so
    it keeps full relative precision); the per-sample Hessian in ``z`` is
    ``diag(s) - s s^T`` with ``s = softmax(z)``, available as a product
    (:meth:`hvp_z`). Its largest eigenvalue is at most 1/2.

    Parameters
    ----------
    n_classes : int, optional
        Number of classes ``K``. When None it is taken from ``z.shape[1]`` at each
        call; :meth:`with_labels` fixes it from the labels (``max(y) + 1``).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import MultinomialLoss
    >>> z = np.array([[0.0, 0.0], [1e4, -1e4]])
    >>> MultinomialLoss(n_classes=2).value(z, np.array([0, 1]))
    array([6.93147181e-01, 2.00000000e+04])
    """

    name = "multinomial"
    label_kind = "class"
    curvature_bound = 0.5

    def __init__(self, n_classes: int | None = None):
        if n_classes is not None:
            if isinstance(n_classes, bool) or int(n_classes) != n_classes or n_classes < 1:
                raise ValueError(f"`n_classes` must be a positive integer, got {n_classes!r}")
            n_classes = int(n_classes)
        self.n_classes = n_classes

    @property
    def n_outputs(self) -> int | None:  # type: ignore[override]
        return self.n_classes

    def with_labels(self, y: Any, *, xp: Any = None) -> MultinomialLoss:
        """Validate ``y``; with ``n_classes=None`` return a copy with ``K = max(y) + 1``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import MultinomialLoss
        >>> MultinomialLoss().with_labels(np.array([0, 3])).n_classes
        4
        """
        y = self.check_y(y, xp=xp)
        if self.n_classes is not None:
            return self
        xp = self._namespace(xp, y=y)
        k = int(to_numpy(xp.max(y))) + 1 if y.shape[0] else 1
        return MultinomialLoss(n_classes=k)

    def _prepare(self, z, y, xp, validate):
        xp = self._namespace(xp, z=z, y=y)
        z = as_float_array(z, xp, name="z")
        if z.ndim != 2:
            raise ValueError(f"`z` must have shape (N, K) for the multinomial loss, got {z.shape}")
        k = z.shape[1]
        if self.n_classes is not None and k != self.n_classes:
            raise ValueError(
                f"`z` has {k} columns but the loss was built for n_classes={self.n_classes}"
            )
        if validate:
            y = self.check_y(y, n_classes=k, xp=xp)
        else:
            y = as_array(y, xp, name="y")
            if not xp.isdtype(y.dtype, "integral"):
                y = xp.astype(y, xp.int64)
        n = z.shape[0]
        known = n is not None and n == n and all(s is not None and s == s for s in y.shape)
        if known and tuple(y.shape) != (n,):
            raise ValueError(f"`y` must have shape ({z.shape[0]},) to match `z`, got {y.shape}")
        return xp, z, y

    def _parts(self, z, y, xp):
        k = z.shape[1]
        dev = device(z)
        cls = xp.arange(k, dtype=y.dtype, device=dev)
        onehot = y[:, None] == cls[None, :]
        m = xp.max(z, axis=1, keepdims=True)
        e = xp.exp(z - m)
        # the first arg-max contributes exp(0) = 1 exactly: log(sum e) = log1p(rest)
        amax = xp.argmax(z, axis=1)
        first = xp.arange(k, dtype=amax.dtype, device=dev)[None, :] == amax[:, None]
        zero = _zeros_like(e, xp)
        rest = xp.sum(xp.where(first, zero, e), axis=1)
        total = xp.sum(e, axis=1, keepdims=True)
        zy = xp.sum(xp.where(onehot, z, zero), axis=1)
        value = (m[:, 0] - zy) + xp.log1p(rest)
        return onehot, e, total, value

    def _value(self, z, y, xp):
        return self._parts(z, y, xp)[3]

    def _derivatives(self, z, y, xp):
        onehot, e, total, value = self._parts(z, y, xp)
        zero = _zeros_like(e, xp)
        others = xp.sum(xp.where(onehot, zero, e), axis=1, keepdims=True)
        s = e / total
        d1 = xp.where(onehot, -(others / total), s)
        return value, d1, None

    def _hvp_z(self, z, y, u, xp):
        m = xp.max(z, axis=1, keepdims=True)
        e = xp.exp(z - m)
        s = e / xp.sum(e, axis=1, keepdims=True)
        su = s * u
        return su - s * xp.sum(su, axis=1, keepdims=True)

    def softmax(self, z: Any, *, xp: Any = None) -> Any:
        """Row-wise softmax of ``z`` (shape ``(N, K)``), computed without overflow.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import MultinomialLoss
        >>> MultinomialLoss().softmax(np.array([[0.0, 0.0]]))
        array([[0.5, 0.5]])
        """
        xp = self._namespace(xp, z=z)
        z = as_float_array(z, xp, name="z")
        e = xp.exp(z - xp.max(z, axis=-1, keepdims=True))
        return e / xp.sum(e, axis=-1, keepdims=True)

    def __repr__(self) -> str:
        return f"MultinomialLoss(n_classes={self.n_classes!r})"
