"""Losses given directly in the parameters: :class:`ParameterLoss` and :class:`CallableLoss`.

The second kind of loss (the first, :class:`~tiltlab.losses.Loss`, is a function of the
linear predictor ``z = X @ theta``): per-sample losses, their ``N x d`` Jacobian and
(optionally) their Hessians in ``theta``. :class:`CallableLoss` wraps user callables, so
that any model can be tilted; objectives evaluate these losses with their own engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._compat import PicklableNamespace, as_float_array, namespace_of

__all__ = ["CallableLoss", "ParameterLoss"]


class ParameterLoss(PicklableNamespace):
    """Base class of per-sample losses given in the parameters ``theta``.

    Subclasses implement :meth:`fun` and :meth:`grad` (and :meth:`hess` when they have
    per-sample Hessians); :meth:`value_and_grad` and :meth:`hvp` follow from them.

    Attributes
    ----------
    name : str
    is_linear : bool
        Always False: the loss is not a function of ``z = X @ theta`` alone.
    convex : bool
        Whether every per-sample loss is convex in ``theta`` (used by diagnostics).
    """

    name: str = "parameter"
    is_linear: bool = False
    #: Always False: the GLM statistics are defined for predictor losses only.
    is_glm: bool = False
    #: 1: the loss takes one parameter vector ``theta``.
    n_outputs: int | None = 1
    convex: bool = False
    #: Whether the per-sample losses are twice continuously differentiable in ``theta``.
    smooth: bool = True
    #: An upper bound on the per-sample Hessians' eigenvalues, or None when not known.
    curvature_bound: float | None = None
    #: The kind of targets: "real" (any numbers, or none).
    label_kind: str = "real"

    def _namespace(self, xp: Any, **arrays: Any) -> Any:
        return xp if xp is not None else namespace_of(**arrays)

    @property
    def has_hessian(self) -> bool:
        """True when per-sample Hessians are available."""
        return False

    def fun(self, theta: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-sample losses, shape ``(N,)``."""
        raise NotImplementedError  # pragma: no cover - abstract

    def grad(self, theta: Any, X: Any = None, y: Any = None, *, xp: Any = None) -> Any:
        """Per-sample gradients in ``theta`` (Jacobian), shape ``(N, d)``."""
        raise NotImplementedError  # pragma: no cover - abstract

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
        """Per-sample Hessians in ``theta``, shape ``(N, d, d)``."""
        raise NotImplementedError(f"the {self.name} loss has no per-sample Hessian")

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
        return f"{type(self).__name__}(name={self.name!r})"


class CallableLoss(ParameterLoss):
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

    def __repr__(self) -> str:
        return f"CallableLoss(name={self.name!r})"
