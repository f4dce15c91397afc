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
============== ============================================== ==========================

*Non-linear losses* (``is_linear = False``) are given directly in the
parameters ``theta``: :class:`CallableLoss` wraps user callables and
:class:`FairPCALoss` is the fair-PCA group loss of the TERM paper (section 5.2).
They return per-sample gradients as an ``(N, d)`` Jacobian.

All computations use the array namespace of the inputs (NumPy, CuPy, PyTorch,
array-api-strict, Dask, ...) and keep their dtype and device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._compat import (
    PicklableNamespace,
    as_array,
    as_float_array,
    default_float,
    device,
    is_array_api_obj,
    is_lazy,
    namespace_of,
    to_numpy,
)

__all__ = [
    "Loss",
    "SquaredLoss",
    "AbsoluteLoss",
    "HuberLoss",
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


# ----------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------


def _const(value: float, like: Any, xp: Any) -> Any:
    return xp.asarray(value, dtype=like.dtype, device=device(like))


def _zeros_like(x: Any, xp: Any) -> Any:
    return xp.zeros(x.shape, dtype=x.dtype, device=device(x))


def _ones_like(x: Any, xp: Any) -> Any:
    return xp.ones(x.shape, dtype=x.dtype, device=device(x))


def _float_of(x: Any, xp: Any) -> Any:
    """The floating dtype ``x`` computes in, or None for integer/bool arrays."""
    if xp.isdtype(x.dtype, "real floating"):
        return x.dtype
    return None


def _check_broadcast(z: Any, y: Any, *, name: str = "y") -> None:
    """``y`` must broadcast to ``z``'s shape without enlarging it.

    A column ``y`` of shape (N, 1) against ``z`` of shape (N,) would broadcast to an
    (N, N) table of losses: a silent wrong answer, so it is rejected here.
    """
    zs, ys = tuple(z.shape), tuple(y.shape)
    if any(s is None or s != s for s in zs + ys):  # unknown (lazy) sizes
        return
    try:
        out = np.broadcast_shapes(zs, ys)
    except ValueError:
        out = None
    if out != zs:
        hint = " (pass `y.reshape(-1)`)" if ys == zs + (1,) else ""
        raise ValueError(
            f"`{name}` has shape {ys}, which does not match the predictor `z` of shape {zs}{hint}"
        )


def _softplus(z: Any, xp: Any) -> Any:
    """log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|))."""
    zero = _const(0.0, z, xp)
    return xp.maximum(z, zero) + xp.log1p(xp.exp(-xp.abs(z)))


def _sigmoid_pair(z: Any, xp: Any) -> tuple[Any, Any]:
    """(s(z), s(-z)) = (1/(1+exp(-z)), 1/(1+exp(z))), both to full relative precision."""
    e = xp.exp(-xp.abs(z))  # in (0, 1]: never overflows
    one = _const(1.0, z, xp)
    big = one / (one + e)
    small = e / (one + e)
    pos = z >= 0
    return xp.where(pos, big, small), xp.where(pos, small, big)


# ----------------------------------------------------------------------------------------
# base class
# ----------------------------------------------------------------------------------------


class Loss(PicklableNamespace):
    """Base class of tiltlab's per-sample losses.

    Linear-predictor losses (``is_linear = True``) implement :meth:`value`,
    :meth:`derivatives` and :meth:`hvp_z` in the predictor ``z = X @ theta``.
    Non-linear losses (``is_linear = False``, see :class:`CallableLoss`) implement
    ``fun``, ``grad``, ``hess`` and ``hvp`` in ``theta`` instead.

    Attributes
    ----------
    name : str
        Registry name (see :func:`get_loss`).
    is_linear : bool
        True when the loss is a function of ``z = X @ theta`` only.
    n_outputs : int or None
        Number of predictor columns: 1 (``theta`` of shape ``(d,)``), or ``K`` for
        the multinomial loss (``theta`` of shape ``(d, K)``); None when not yet known.
    is_glm : bool
        True when ``l(z, y) = A(z) - T(y) z + c(y)`` (exponential-family form); such
        losses also offer :meth:`cumulant`, :meth:`statistic` and :meth:`offset`.
    convex : bool
        True when the loss is convex in ``z`` (hence in ``theta`` for linear losses).
    smooth : bool
        True when the loss is twice continuously differentiable in ``z``.
    curvature_bound : float or None
        An upper bound on the second derivative in ``z`` (the largest eigenvalue of
        the per-sample Hessian in ``z`` for multinomial); None when unbounded or
        not differentiable.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import get_loss
    >>> loss = get_loss("squared")
    >>> loss.value(np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    array([1., 4.])
    """

    name: str = "loss"
    is_linear: bool = True
    n_outputs: int | None = 1
    is_glm: bool = False
    convex: bool = True
    smooth: bool = True
    curvature_bound: float | None = None
    #: "real" (regression targets), "binary" (0/1) or "class" (integers in [0, K)).
    label_kind: str = "real"

    # -- input handling ---------------------------------------------------------------

    def _namespace(self, xp: Any, **arrays: Any) -> Any:
        return xp if xp is not None else namespace_of(**arrays)

    def check_y(self, y: Any, *, n_classes: int | None = None, xp: Any = None) -> Any:
        """Validate the targets ``y`` and return them as an array of ``xp``.

        Parameters
        ----------
        y : array_like
            Targets: real numbers (regression losses), 0/1 labels (logistic, hinge,
            squared hinge) or integer class labels (multinomial).
        n_classes : int, optional
            Number of classes, for the multinomial loss (defaults to the loss's own).
        xp : namespace, optional
            Array namespace; inferred from ``y`` when omitted.

        Returns
        -------
        array
            ``y`` as an array: floating for real targets, unchanged dtype for 0/1
            labels, an integer dtype for class labels.

        Raises
        ------
        ValueError
            If the labels are not of the kind the loss needs (the message names `y`).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import LogisticLoss
        >>> LogisticLoss().check_y(np.array([0, 1, 1]))
        array([0, 1, 1])
        """
        xp = self._namespace(xp, y=y)
        if self.label_kind == "real":
            return as_float_array(y, xp, name="y")
        y = as_array(y, xp, name="y")
        if xp.isdtype(y.dtype, "complex floating"):
            raise TypeError("`y`: complex labels are not supported")
        if self.label_kind == "binary":
            if xp.isdtype(y.dtype, "bool"):
                return y
            ok = xp.all((y == 0) | (y == 1))
            if not bool(ok):
                raise ValueError(
                    f"`y` must hold binary labels 0 or 1 for the {self.name} loss; got other "
                    "values (map labels {-1, +1} to {0, 1} with (y + 1) // 2)"
                )
            return y
        # class labels
        if xp.isdtype(y.dtype, "bool"):
            raise ValueError("`y` must hold integer class labels, not booleans")
        if not xp.isdtype(y.dtype, "integral"):
            integral = xp.all(xp.isfinite(y) & (y == xp.round(y)))
            if not bool(integral):
                raise ValueError(f"`y` must hold integer class labels for the {self.name} loss")
            y = xp.astype(y, xp.int64)
        if y.ndim != 1:
            raise ValueError(f"`y` must be a 1-d array of class labels, got shape {y.shape}")
        k = n_classes if n_classes is not None else self.n_outputs
        lo = bool(xp.all(y >= 0))
        hi = True if k is None else bool(xp.all(y < k))
        if not (lo and hi):
            rng = "[0, K)" if k is None else f"[0, {k})"
            raise ValueError(f"`y` must hold class labels in {rng}")
        return y

    def with_labels(self, y: Any, *, xp: Any = None) -> Loss:
        """Validate ``y`` once and return a loss with label-dependent settings fixed.

        For the multinomial loss with ``n_classes=None`` this returns a copy with
        ``n_classes = max(y) + 1``; every other loss returns itself. Objectives can
        call this once and then pass ``validate=False`` in their inner loops.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import get_loss
        >>> get_loss("multinomial").with_labels(np.array([0, 2, 1])).n_outputs
        3
        """
        self.check_y(y, xp=xp)
        return self

    def _prepare(self, z: Any, y: Any, xp: Any, validate: bool) -> tuple[Any, Any, Any]:
        """Namespace, floating ``z`` and ``y`` cast for arithmetic."""
        xp = self._namespace(xp, z=z, y=y)
        z = as_array(z, xp, name="z")
        if validate:
            y = self.check_y(y, xp=xp)
        else:
            y = as_array(y, xp, name="y")
        zf = _float_of(z, xp)
        if self.label_kind == "real":
            yf = _float_of(y, xp)
            floats = [d for d in (zf, yf) if d is not None]
            dt = xp.result_type(*floats) if floats else default_float(xp, device(z))
        else:
            dt = zf if zf is not None else default_float(xp, device(z))
        if z.dtype != dt:
            z = xp.astype(z, dt)
        if self.label_kind != "class" and y.dtype != dt:
            y = xp.astype(y, dt)
        if self.label_kind != "class":
            _check_broadcast(z, y)
        return xp, z, y

    # -- linear-predictor interface ---------------------------------------------------

    def value(self, z: Any, y: Any, *, validate: bool = True, xp: Any = None) -> Any:
        """Per-sample losses ``l(z_i, y_i)``.

        Parameters
        ----------
        z : array
            Linear predictor ``X @ theta``: shape ``(N,)`` (or any shape broadcasting
            with ``y``), or ``(N, K)`` for the multinomial loss.
        y : array
            Targets of shape ``(N,)``.
        validate : bool, default True
            Check the labels (costs one pass, and a compute on lazy backends).
        xp : namespace, optional
            Array namespace; inferred from the inputs when omitted.

        Returns
        -------
        array of shape ``(N,)``
            In ``z``'s namespace, on its device, in its floating dtype.
        """
        xp, z, y = self._prepare(z, y, xp, validate)
        return self._value(z, y, xp)

    def derivatives(
        self, z: Any, y: Any, *, validate: bool = True, xp: Any = None
    ) -> tuple[Any, Any, Any]:
        """Per-sample value and first and second derivatives in ``z``.

        Returns
        -------
        value : array of shape ``(N,)``
        d1 : array of ``z``'s shape
            ``dl/dz`` (a subgradient at kinks).
        d2 : array of ``z``'s shape, or None
            ``d2l/dz2`` for scalar-predictor losses; None for the multinomial loss,
            whose per-sample Hessian in ``z`` is a ``K x K`` matrix (use :meth:`hvp_z`).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import get_loss
        >>> v, d1, d2 = get_loss("squared").derivatives(np.array([3.0]), np.array([1.0]))
        >>> v, d1, d2
        (array([4.]), array([4.]), array([2.]))
        """
        xp, z, y = self._prepare(z, y, xp, validate)
        return self._derivatives(z, y, xp)

    def value_and_d1(
        self, z: Any, y: Any, *, validate: bool = True, xp: Any = None
    ) -> tuple[Any, Any]:
        """Per-sample value and first derivative in ``z`` (what a gradient needs).

        The same numbers as the first two outputs of :meth:`derivatives`, without the
        cost of the second derivative.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import get_loss
        >>> get_loss("logistic").value_and_d1(np.array([0.0]), np.array([1.0]))
        (array([0.69314718]), array([-0.5]))
        """
        xp, z, y = self._prepare(z, y, xp, validate)
        return self._value_and_d1(z, y, xp)

    def _value_and_d1(self, z: Any, y: Any, xp: Any) -> tuple[Any, Any]:
        out = self._derivatives(z, y, xp)
        return out[0], out[1]

    def hvp_z(self, z: Any, y: Any, u: Any, *, validate: bool = True, xp: Any = None) -> Any:
        """Per-sample Hessian in ``z`` applied to per-sample directions ``u``.

        Parameters
        ----------
        z, y : array
            As in :meth:`value`.
        u : array of ``z``'s shape
            One direction per sample (for a parameter direction ``v`` this is
            ``X @ v``).

        Returns
        -------
        array of ``z``'s shape
            ``d2 * u`` for scalar-predictor losses; ``s*u - s*sum(s*u, axis=1)`` with
            ``s = softmax(z)`` for the multinomial loss.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import get_loss
        >>> get_loss("squared").hvp_z(np.array([3.0]), np.array([1.0]), np.array([0.5]))
        array([1.])
        """
        xp = self._namespace(xp, z=z, y=y, u=u)
        xp, z, y = self._prepare(z, y, xp, validate)
        u = as_float_array(u, xp, name="u")
        if u.dtype != z.dtype:
            u = xp.astype(u, z.dtype)
        if tuple(u.shape) != tuple(z.shape):
            raise ValueError(f"`u` must have the shape of `z` {tuple(z.shape)}, got {u.shape}")
        return self._hvp_z(z, y, u, xp)

    def _value(self, z: Any, y: Any, xp: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"the {self.name} loss has no value in z")

    def _derivatives(self, z: Any, y: Any, xp: Any) -> tuple[Any, Any, Any]:
        raise NotImplementedError  # pragma: no cover - abstract

    def _hvp_z(self, z: Any, y: Any, u: Any, xp: Any) -> Any:
        _, _, d2 = self._derivatives(z, y, xp)
        return d2 * u

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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


# ----------------------------------------------------------------------------------------
# binary classification losses
# ----------------------------------------------------------------------------------------


class LogisticLoss(Loss):
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
    label_kind = "binary"
    is_glm = True
    curvature_bound = 0.25

    def _value(self, z, y, xp):
        zero = _const(0.0, z, xp)
        # max(z, 0) - y z is exact for y in {0, 1}: it is max(z, 0) or max(-z, 0)
        return (xp.maximum(z, zero) - y * z) + xp.log1p(xp.exp(-xp.abs(z)))

    def _fused(self, z, y, xp):
        # one exponential shared by the value and the sigmoid pair
        e = xp.exp(-xp.abs(z))  # in (0, 1]: never overflows
        one = _const(1.0, z, xp)
        inv = one / (one + e)
        small = e * inv
        pos = z >= 0
        s, sc = xp.where(pos, inv, small), xp.where(pos, small, inv)
        value = (xp.maximum(z, _const(0.0, z, xp)) - y * z) + xp.log1p(e)
        d1 = (1.0 - y) * s - y * sc  # s - y, without cancellation for y in {0, 1}
        return value, d1, s, sc

    def _derivatives(self, z, y, xp):
        value, d1, s, sc = self._fused(z, y, xp)
        return value, d1, s * sc

    def _value_and_d1(self, z, y, xp):
        value, d1, _, _ = self._fused(z, y, xp)
        return value, d1

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


class HingeLoss(Loss):
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
    label_kind = "binary"
    smooth = False

    def _margin(self, z, y):
        sgn = 2.0 * y - 1.0
        return sgn, 1.0 - sgn * z

    def _value(self, z, y, xp):
        _, m = self._margin(z, y)
        return xp.maximum(m, _const(0.0, m, xp))

    def _derivatives(self, z, y, xp):
        sgn, m = self._margin(z, y)
        zero = _zeros_like(m, xp)
        return xp.maximum(m, zero), xp.where(m > 0, -sgn, zero), zero


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

    def _value(self, z, y, xp):
        _, m = self._margin(z, y)
        h = xp.maximum(m, _const(0.0, m, xp))
        return h * h

    def _derivatives(self, z, y, xp):
        sgn, m = self._margin(z, y)
        zero = _zeros_like(m, xp)
        h = xp.maximum(m, zero)
        d2 = xp.where(m > 0, _const(2.0, m, xp), zero)
        return h * h, -2.0 * sgn * h, d2


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


# ----------------------------------------------------------------------------------------
# non-linear losses
# ----------------------------------------------------------------------------------------


class CallableLoss(Loss):
    """A user-supplied per-sample loss in the parameters ``theta``.

    Parameters
    ----------
    fun : callable
        ``fun(theta, X, y) -> (N,)`` per-sample losses.
    grad : callable
        ``grad(theta, X, y) -> (N, d)`` per-sample gradients in ``theta`` (the
        Jacobian of ``fun``).
    hess : callable, optional
        ``hess(theta, X, y) -> (N, d, d)`` per-sample Hessians in ``theta``. Needed
        for Hessians and Hessian-vector products of an objective.
    name : str, default "callable"
    convex : bool, default False
        Whether every per-sample loss is convex in ``theta`` (used by diagnostics).

    Notes
    -----
    Unlike the linear-predictor losses, a callable loss necessarily forms the
    ``N x d`` Jacobian of per-sample gradients (and ``N x d x d`` Hessians when
    ``hess`` is given), so memory grows with ``N * d``. ``X`` and ``y`` are passed
    through untouched (``None`` when the objective has no data).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import CallableLoss
    >>> loss = CallableLoss(lambda th, X, y: (X @ th - y) ** 4,
    ...                     lambda th, X, y: 4 * ((X @ th - y) ** 3)[:, None] * X)
    >>> X, y = np.eye(2), np.zeros(2)
    >>> loss.fun(np.array([1.0, 2.0]), X, y)
    array([ 1., 16.])
    >>> loss.grad(np.array([1.0, 2.0]), X, y)
    array([[ 4.,  0.],
           [ 0., 32.]])
    """

    is_linear = False
    is_glm = False
    n_outputs = 1
    curvature_bound = None

    def __init__(
        self,
        fun: Callable[..., Any],
        grad: Callable[..., Any],
        hess: Callable[..., Any] | None = None,
        *,
        name: str = "callable",
        convex: bool = False,
    ):
        if not callable(fun):
            raise TypeError("`fun` must be callable as fun(theta, X, y)")
        if not callable(grad):
            raise TypeError("`grad` must be callable as grad(theta, X, y)")
        if hess is not None and not callable(hess):
            raise TypeError("`hess` must be callable as hess(theta, X, y) or None")
        self._fun, self._grad, self._hess = fun, grad, hess
        self.name = str(name)
        self.convex = bool(convex)

    @property
    def has_hessian(self) -> bool:
        """True when per-sample Hessians are available."""
        return self._hess is not None

    def _theta(self, theta: Any, xp: Any) -> tuple[Any, Any]:
        xp = self._namespace(xp, theta=theta)
        theta = as_float_array(theta, xp, name="theta")
        if theta.ndim != 1:
            raise ValueError(f"`theta` must be a 1-d parameter vector, got shape {theta.shape}")
        return xp, theta

    def fun(self, theta: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-sample losses, shape ``(N,)``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import CallableLoss
        >>> CallableLoss(lambda th, X, y: th**2, lambda th, X, y: np.diag(2*th)).fun(
        ...     np.array([1.0, 3.0]))
        array([1., 9.])
        """
        xp, theta = self._theta(theta, xp)
        out = as_float_array(self._fun(theta, X, y), xp, name="fun")
        if out.ndim != 1:
            raise ValueError(f"`fun` must return per-sample losses of shape (N,), got {out.shape}")
        return out

    def grad(self, theta: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-sample gradients in ``theta`` (Jacobian), shape ``(N, d)``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import CallableLoss
        >>> CallableLoss(lambda th, X, y: th**2, lambda th, X, y: np.diag(2*th)).grad(
        ...     np.array([1.0, 3.0]))
        array([[2., 0.],
               [0., 6.]])
        """
        xp, theta = self._theta(theta, xp)
        out = as_float_array(self._grad(theta, X, y), xp, name="grad")
        if out.ndim != 2 or out.shape[1] != theta.shape[0]:
            raise ValueError(
                f"`grad` must return per-sample gradients of shape (N, {theta.shape[0]}), "
                f"got {out.shape}"
            )
        return out

    def value_and_grad(
        self, theta: Any, X: Any = None, y: Any = None, *, xp: Any = None
    ) -> tuple[Any, Any]:
        """``(fun(theta, X, y), grad(theta, X, y))``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import CallableLoss
        >>> v, g = CallableLoss(lambda th, X, y: th**2,
        ...                     lambda th, X, y: np.diag(2*th)).value_and_grad(np.ones(2))
        >>> v.shape, g.shape
        ((2,), (2, 2))
        """
        return self.fun(theta, X, y, xp=xp), self.grad(theta, X, y, xp=xp)

    def hess(self, theta: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-sample Hessians in ``theta``, shape ``(N, d, d)``.

        Raises
        ------
        NotImplementedError
            If the loss was built without ``hess``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import CallableLoss
        >>> loss = CallableLoss(lambda th, X, y: th**2, lambda th, X, y: np.diag(2*th),
        ...                     lambda th, X, y: 2.0 * np.eye(2)[:, :, None] * np.eye(2))
        >>> loss.hess(np.ones(2))[1]
        array([[0., 0.],
               [0., 2.]])
        """
        if self._hess is None:
            raise NotImplementedError(
                f"the {self.name} loss has no per-sample Hessian; pass `hess` to CallableLoss"
            )
        xp, theta = self._theta(theta, xp)
        out = as_float_array(self._hess(theta, X, y), xp, name="hess")
        d = theta.shape[0]
        if out.ndim != 3 or tuple(out.shape[1:]) != (d, d):
            raise ValueError(
                f"`hess` must return per-sample Hessians of shape (N, {d}, {d}), got {out.shape}"
            )
        return out

    def hvp(self, theta: Any, v: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-sample Hessian-vector products ``H_i(theta) @ v``, shape ``(N, d)``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import CallableLoss
        >>> loss = CallableLoss(lambda th, X, y: th**2, lambda th, X, y: np.diag(2*th),
        ...                     lambda th, X, y: 2.0 * np.eye(2)[:, :, None] * np.eye(2))
        >>> loss.hvp(np.ones(2), np.array([1.0, 5.0]))
        array([[ 2.,  0.],
               [ 0., 10.]])
        """
        H = self.hess(theta, X, y, xp=xp)
        xp = self._namespace(xp, theta=theta)
        v = as_float_array(v, xp, name="v")
        if tuple(v.shape) != (H.shape[-1],):
            raise ValueError(f"`v` must have shape ({H.shape[-1]},), got {v.shape}")
        return xp.sum(H * xp.astype(v, H.dtype)[None, None, :], axis=-1)

    def __repr__(self) -> str:
        return f"CallableLoss(name={self.name!r})"


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


class FairPCALoss(CallableLoss):
    """Fair-PCA group loss of the TERM paper (section 5.2).

    For each group ``g`` with data ``X_g`` (``n_g x d``) and a projection
    ``U`` (``d x k``),

    ``f_g(U) = (||X_g - X_g U U^T||_F^2 - ||X_g - Xhat_g||_F^2) / n_g``

    where ``Xhat_g`` is the best rank-``k`` approximation of ``X_g`` (so
    ``||X_g - Xhat_g||_F^2`` is the sum of the squared singular values of ``X_g``
    beyond the ``k``-th, precomputed once). ``f_g(U) >= 0`` for every ``U``
    (``X_g U U^T`` has rank at most ``k``), with equality at the top-``k`` right
    singular vectors of ``X_g``. The parameters are ``theta = U.reshape(-1)``
    (row-major, length ``d*k``); the "samples" are the ``G`` groups.

    With ``A_g = X_g^T X_g`` the per-group gradient is
    ``(-4 A_g U + 2 (A_g U U^T U + U U^T A_g U)) / n_g``.

    Parameters
    ----------
    groups_data : sequence of arrays
        One ``(n_g, d)`` data matrix per group, all from one array library.
    n_components : int
        Target dimension ``k`` (``1 <= k <= d``).

    Notes
    -----
    ``fun``, ``grad``, ``hess`` and ``hvp`` take ``theta`` and ignore ``X`` and ``y``
    (pass nothing, or ``None``). Values are computed from the residual
    ``X_g - X_g U U^T`` itself (accurate near the optimum); gradients and
    Hessian-vector products use the ``d x d`` Gram matrices.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab.losses import FairPCALoss
    >>> rng = np.random.default_rng(0)
    >>> loss = FairPCALoss([rng.normal(size=(20, 3)), rng.normal(size=(10, 3))], 2)
    >>> U = np.eye(3)[:, :2]
    >>> loss.fun(U.ravel()).shape, loss.grad(U.ravel()).shape
    ((2,), (2, 6))
    """

    name = "fair_pca"

    def __init__(self, groups_data: Sequence[Any], n_components: int):
        if is_array_api_obj(groups_data) or not isinstance(groups_data, Sequence):
            raise TypeError("`groups_data` must be a sequence of (n_g, d) arrays, one per group")
        if len(groups_data) == 0:
            raise ValueError("`groups_data` must hold at least one group")
        xp = namespace_of(**{f"groups_data[{i}]": g for i, g in enumerate(groups_data)})
        mats = [as_float_array(g, xp, name=f"groups_data[{i}]") for i, g in enumerate(groups_data)]
        dt = xp.result_type(*[m.dtype for m in mats])
        mats = [m if m.dtype == dt else xp.astype(m, dt) for m in mats]
        for i, m in enumerate(mats):
            if m.ndim != 2 or m.shape[0] < 1:
                raise ValueError(f"`groups_data[{i}]` must be a non-empty 2-d array, got {m.shape}")
        d = mats[0].shape[1]
        if any(m.shape[1] != d for m in mats):
            raise ValueError("`groups_data` arrays must all have the same number of columns")
        if isinstance(n_components, bool) or int(n_components) != n_components:
            raise ValueError(f"`n_components` must be an integer, got {n_components!r}")
        k = int(n_components)
        if not 1 <= k <= d:
            raise ValueError(f"`n_components` must lie in [1, {d}], got {k}")
        dev = device(mats[0])
        self._xp = xp
        self.n_features = d
        self.n_components = k
        self.n_groups = len(mats)
        self._X = mats
        self.group_sizes = tuple(int(m.shape[0]) for m in mats)
        self._n = xp.asarray(self.group_sizes, dtype=dt, device=dev)
        self._A = xp.stack([xp.matmul(xp.matrix_transpose(m), m) for m in mats])
        self._opt = xp.stack([self._tail_energy(m, k, xp) for m in mats])
        self.dtype = dt
        super().__init__(self._fun_impl, self._grad_impl, self._hess_impl, name="fair_pca")

    @staticmethod
    def _tail_energy(m: Any, k: int, xp: Any) -> Any:
        """Sum of squared singular values of ``m`` beyond the k-th: ||m - best_k(m)||_F^2."""
        sv = None
        if not is_lazy(xp) and hasattr(xp, "linalg") and hasattr(xp.linalg, "svdvals"):
            try:
                sv = xp.linalg.svdvals(m)
            except Exception:  # pragma: no cover - backend without a working svdvals
                sv = None
        if sv is None:
            sv_np = np.linalg.svd(to_numpy(m).astype(np.float64), compute_uv=False)
            tail = np.sum(sv_np[k:] ** 2)
            return xp.asarray(tail, dtype=m.dtype, device=device(m))
        tail = sv[k:]
        return xp.sum(tail * tail)

    def _theta(self, theta: Any, xp: Any) -> tuple[Any, Any]:
        return super()._theta(theta, self._xp if xp is None else xp)

    @property
    def n_params(self) -> int:
        """Length ``d*k`` of ``theta``."""
        return self.n_features * self.n_components

    @property
    def optimal_errors(self) -> Any:
        """Per-group ``||X_g - Xhat_g||_F^2`` (unnormalised), shape ``(G,)``."""
        return self._opt

    def _U(self, theta: Any) -> Any:
        xp = self._xp
        if tuple(theta.shape) != (self.n_params,):
            raise ValueError(
                f"`theta` must have shape ({self.n_params},) = d*k with d={self.n_features}, "
                f"k={self.n_components}; got {theta.shape}"
            )
        if theta.dtype != self.dtype:
            theta = xp.astype(theta, self.dtype)
        return xp.reshape(theta, (self.n_features, self.n_components))

    def _fun_impl(self, theta, X, y):
        xp = self._xp
        U = self._U(theta)
        Ut = xp.matrix_transpose(U)
        vals = []
        for m in self._X:
            r = m - xp.matmul(xp.matmul(m, U), Ut)
            vals.append(xp.sum(r * r))
        return (xp.stack(vals) - self._opt) / self._n

    def _grad_impl(self, theta, X, y):
        xp = self._xp
        U = self._U(theta)
        Ut = xp.matrix_transpose(U)
        AU = xp.matmul(self._A, U)  # (G, d, k)
        UtU = xp.matmul(Ut, U)  # (k, k)
        UtAU = xp.matmul(Ut, AU)  # (G, k, k)
        g = -4.0 * AU + 2.0 * (xp.matmul(AU, UtU) + xp.matmul(U, UtAU))
        g = g / self._n[:, None, None]
        return xp.reshape(g, (self.n_groups, self.n_params))

    def _hvp_batch(self, U: Any, V: Any) -> Any:
        """Per-group Hessian applied to directions ``V`` of shape (m, d, k) -> (G, m, d, k)."""
        xp = self._xp
        A = self._A[:, None, :, :]  # (G, 1, d, d)
        Ut = xp.matrix_transpose(U)
        Vt = xp.matrix_transpose(V)  # (m, k, d)
        AU = xp.matmul(self._A, U)[:, None, :, :]  # (G, 1, d, k)
        AV = xp.matmul(A, V[None, ...])  # (G, m, d, k)
        UtU = xp.matmul(Ut, U)  # (k, k)
        UtAU = xp.matmul(Ut, AU)  # (G, 1, k, k)
        VtU = xp.matmul(Vt, U)[None, ...]  # (1, m, k, k)
        UtV = xp.matrix_transpose(VtU)
        VtAU = xp.matmul(Vt[None, ...], AU)  # (G, m, k, k)
        UtAV = xp.matrix_transpose(VtAU)
        out = -4.0 * AV + 2.0 * (
            xp.matmul(AV, UtU)
            + xp.matmul(AU, VtU)
            + xp.matmul(AU, UtV)
            + xp.matmul(V[None, ...], UtAU)
            + xp.matmul(U, VtAU)
            + xp.matmul(U, UtAV)
        )
        return out / self._n[:, None, None, None]

    def _hess_impl(self, theta, X, y):
        xp = self._xp
        U = self._U(theta)
        p = self.n_params
        eye = xp.eye(p, dtype=U.dtype, device=device(U))
        E = xp.reshape(eye, (p, self.n_features, self.n_components))
        H = self._hvp_batch(U, E)  # (G, p, d, k): row j = H e_j
        return xp.reshape(H, (self.n_groups, p, p))

    def hvp(self, theta: Any, v: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-group Hessian-vector products, shape ``(G, d*k)``, without forming Hessians.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import FairPCALoss
        >>> loss = FairPCALoss([np.eye(3), 2 * np.eye(3)], 1)
        >>> loss.hvp(np.array([1.0, 0, 0]), np.array([0.0, 1.0, 0])).shape
        (2, 3)
        """
        xp, theta = self._theta(theta, xp)
        v = as_float_array(v, xp, name="v")
        if tuple(v.shape) != (self.n_params,):
            raise ValueError(f"`v` must have shape ({self.n_params},), got {v.shape}")
        U = self._U(theta)
        V = self._U(v)
        out = self._hvp_batch(U, V[None, ...])[:, 0, ...]
        return xp.reshape(out, (self.n_groups, self.n_params))

    def standard_pca_theta(self) -> Any:
        """``theta`` of ordinary PCA on the pooled groups (top-``k`` right singular vectors).

        A natural starting point (and the ``t = 0``-like baseline of the paper's
        fair-PCA figure). Computed with NumPy on the host, returned in the data's
        namespace, dtype and device.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab.losses import FairPCALoss
        >>> FairPCALoss([np.diag([3.0, 1.0, 0.5])], 1).standard_pca_theta()
        array([1., 0., 0.])
        """
        xp = self._xp
        pooled = np.concatenate([to_numpy(m) for m in self._X], axis=0).astype(np.float64)
        _, _, vt = np.linalg.svd(pooled, full_matrices=False)
        U = vt[: self.n_components].T
        # a deterministic sign: the largest entry of each column is positive
        idx = np.argmax(np.abs(U), axis=0)
        U = U * np.sign(U[idx, np.arange(U.shape[1])])
        return xp.asarray(U.reshape(-1), dtype=self.dtype, device=device(self._A))

    def __repr__(self) -> str:
        return (
            f"FairPCALoss(n_groups={self.n_groups}, n_features={self.n_features}, "
            f"n_components={self.n_components})"
        )


# ----------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[Loss]] = {
    "squared": SquaredLoss,
    "absolute": AbsoluteLoss,
    "huber": HuberLoss,
    "logistic": LogisticLoss,
    "hinge": HingeLoss,
    "squared_hinge": SquaredHingeLoss,
    "multinomial": MultinomialLoss,
}

#: Names accepted by :func:`get_loss`.
LOSS_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_loss(name_or_loss: str | Loss, **params: Any) -> Loss:
    """Return a loss object from its name, or a :class:`Loss` instance unchanged.

    Parameters
    ----------
    name_or_loss : str or Loss
        One of ``"squared"``, ``"absolute"``, ``"huber"``, ``"logistic"``,
        ``"hinge"``, ``"squared_hinge"``, ``"multinomial"`` (case-insensitive;
        ``-`` may replace ``_``), or a :class:`Loss` (including :class:`CallableLoss`
        and :class:`FairPCALoss`), which is returned as is.
    **params
        Parameters of the loss class: ``delta`` for Huber, ``n_classes`` for
        multinomial.

    Returns
    -------
    Loss

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones).
    TypeError
        For parameters the loss does not take, or parameters given with an instance.

    Examples
    --------
    >>> from tiltlab.losses import get_loss
    >>> get_loss("huber", delta=2.0)
    HuberLoss(delta=2.0)
    >>> get_loss("multinomial", n_classes=3).n_outputs
    3
    """
    if isinstance(name_or_loss, Loss):
        if params:
            raise TypeError(
                "`params` cannot be combined with a Loss instance; set them on the instance"
            )
        return name_or_loss
    if not isinstance(name_or_loss, str):
        raise TypeError(
            f"`loss` must be a loss name or a Loss instance, got {type(name_or_loss).__name__}"
        )
    key = name_or_loss.strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(
            f"`loss`: unknown loss {name_or_loss!r}; valid names are {', '.join(LOSS_NAMES)}"
        )
    cls = _REGISTRY[key]
    try:
        return cls(**params)
    except TypeError as exc:
        raise TypeError(f"`params`: invalid parameters for the {key} loss: {exc}") from None
