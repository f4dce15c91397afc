"""The :class:`Loss` base class and the small array helpers the loss families share.

A :class:`Loss` validates labels and evaluates per-sample values, first and second
derivatives in the linear predictor ``z`` and Hessian-vector products; subclasses
implement ``_value``, ``_derivatives`` and, where it helps, ``_value_and_d1`` and
``_hvp_z``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import (
    PicklableNamespace,
    as_array,
    as_float_array,
    default_float,
    device,
    namespace_of,
)

__all__ = ["Loss"]


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

    These are the losses of the linear predictor ``z = X @ theta`` (``is_linear =
    True``): they implement :meth:`value`, :meth:`derivatives` and :meth:`hvp_z` in
    ``z``. Losses given in ``theta`` itself (``fun``, ``grad``, ``hess``, ``hvp``) are the
    other kind, :class:`~tiltlab.losses.custom.ParameterLoss` (for instance
    :class:`~tiltlab.losses.CallableLoss`).

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
    #: "real" (regression targets), "nonnegative" (real, >= 0), "binary" (0/1) or
    #: "class" (integers in [0, K)).
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
        if self.label_kind == "nonnegative":
            y = as_float_array(y, xp, name="y")
            if not bool(xp.all((y >= 0) & (y < math.inf))):
                raise ValueError(
                    f"`y` must hold finite non-negative targets for the {self.name} loss; "
                    "got negative, infinite or NaN values"
                )
            return y
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

    def parameters(self) -> dict[str, float]:
        """The loss's scalar parameters by name (Huber's ``delta``, the pinball
        ``quantile``): what the compiled kernels take; empty for a loss without them.

        Examples
        --------
        >>> from tiltlab.losses import get_loss
        >>> get_loss("pinball", quantile=0.9).parameters()
        {'quantile': 0.9}
        """
        return {}

    def _prepare(self, z: Any, y: Any, xp: Any, validate: bool) -> tuple[Any, Any, Any]:
        """Namespace, floating ``z`` and ``y`` cast for arithmetic."""
        xp = self._namespace(xp, z=z, y=y)
        z = as_array(z, xp, name="z")
        if validate:
            y = self.check_y(y, xp=xp)
        else:
            y = as_array(y, xp, name="y")
        zf = _float_of(z, xp)
        real = self.label_kind in ("real", "nonnegative")
        if real:
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
