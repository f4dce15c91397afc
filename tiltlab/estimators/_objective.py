"""Objectives for the estimators: a tilted risk plus a ridge term that spares the intercept.

:class:`~tiltlab.TiltedObjective` penalises every coordinate of ``theta`` alike. The
estimators fit the intercept as the coefficient of an appended column of ones and must not
shrink it (as scikit-learn's linear models do not), so they wrap an objective built with
``l2=0`` and add ``alpha/2 ||theta[:-1]||^2`` themselves. The wrapper offers the methods the
solvers call (value, gradient, Hessian products, minibatch products, ``with_tilt``) and
hands every other attribute to the wrapped objective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MaskedRidgeObjective", "make_objective"]


class MaskedRidgeObjective:
    """``base(theta) + alpha/2 * ||mask * theta||^2`` for a ``base`` built with ``l2=0``.

    ``mask`` (in ``theta``'s shape, namespace and device) is 1 for penalised coordinates
    and 0 for the intercept row. ``l2`` reads 0 so that a solver which adds
    ``objective.l2 * theta`` itself (the stochastic method) does not add a second,
    unmasked ridge; the masked term is added in :meth:`batch_losses_and_vjp` instead.
    """

    l2 = 0.0

    def __init__(self, base: Any, alpha: float, mask: Any):
        if base.l2 != 0:
            raise ValueError("the wrapped objective must have l2=0")
        self.base = base
        self.alpha = float(alpha)
        self.mask = mask

    def __getattr__(self, name: str) -> Any:
        # only called for attributes not found on the wrapper itself
        if name == "base":  # not yet set (copy/pickle): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def _masked(self, theta: Any) -> Any:
        xp = self.base.xp
        return xp.reshape(self.mask, theta.shape) * theta

    def value(self, theta: Any) -> Any:
        xp = self.base.xp
        th = self.base._theta(theta)
        m = self._masked(th)
        return self.base.value(th) + 0.5 * self.alpha * xp.sum(m * m)

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        xp = self.base.xp
        th = self.base._theta(theta)
        f, g = self.base.value_and_gradient(th)
        m = self._masked(th)
        return f + 0.5 * self.alpha * xp.sum(m * m), g + self.alpha * m

    def gradient(self, theta: Any) -> Any:
        return self.value_and_gradient(theta)[1]

    def penalty(self, theta: Any) -> tuple[Any, Any]:
        """The masked ridge term at ``theta``: its value and gradient."""
        xp = self.base.xp
        m = self._masked(theta)
        return 0.5 * self.alpha * xp.sum(m * m), self.alpha * m

    def hvp(self, theta: Any, v: Any) -> Any:
        vv = self.base._theta(v, name="v")
        return self.base.hvp(theta, vv) + self.alpha * self._masked(vv)

    def hessian(self, theta: Any) -> Any:
        xp = self.base.xp
        H = self.base.hessian(theta)
        diag = xp.reshape(self.mask, (-1,)) * self.alpha
        return H + _diag_matrix(diag, xp)

    def batch_losses_and_vjp(self, theta: Any, idx: Any):
        ell, vjp = self.base.batch_losses_and_vjp(theta, idx)
        th = self.base._theta(theta)
        ridge = self.alpha * self._masked(th)

        def vjp_ridge(c: Any) -> Any:
            return vjp(c) + ridge

        return ell, vjp_ridge

    def linearize(self, theta: Any) -> Any:
        """The wrapped objective's linearisation with the masked ridge term added."""
        from ..objective.linearization import Linearization

        xp = self.base.xp
        th = self.base.check_theta(theta)
        lin = self.base.linearize(th)
        m = self._masked(th)
        value = lin.value + 0.5 * self.alpha * xp.sum(m * m)

        def products(v: Any) -> Any:
            return lin.hvp(v) + self.alpha * self._masked(v)

        return Linearization(
            th, value, lin.gradient + self.alpha * m, lin.losses, lin.weights, products,
            check=lambda v: self.base.check_theta(v, "v"),
        )  # fmt: skip

    def with_tilt(self, t: float | None = None, *, tilts: Any = None) -> MaskedRidgeObjective:
        return MaskedRidgeObjective(self.base.with_tilt(t, tilts=tilts), self.alpha, self.mask)

    def __repr__(self) -> str:
        return f"MaskedRidgeObjective({self.base!r}, alpha={self.alpha}, intercept unpenalised)"


def _diag_matrix(diag: Any, xp: Any) -> Any:
    from .._compat import device

    n = int(diag.shape[0])
    eye = xp.eye(n, dtype=diag.dtype, device=device(diag))
    return eye * diag[None, :]


def make_objective(
    loss: Any,
    X: Any,
    y: Any,
    *,
    t: float = 0.0,
    tilts: Any = None,
    groups: Any = None,
    weights: Any = None,
    alpha: float = 0.0,
    intercept: bool = False,
    check_finite: bool = True,
) -> Any:
    """A tilted objective for ``X`` (whose last column is the intercept's when ``intercept``).

    The ridge term ``alpha/2 ||theta||^2`` skips the intercept row. ``check_finite=False``
    skips the objective's pass over ``X`` and ``y`` for NaN and infinity (for data that
    were checked already).
    """
    from ..objective import TiltedObjective

    kw: dict[str, Any] = {"weights": weights, "check_finite": check_finite}
    if tilts is not None:
        kw.update(groups=groups, tilts=tilts)
    else:
        kw["t"] = t
    if not intercept or alpha == 0:
        return TiltedObjective(loss, X, y, l2=alpha, **kw)
    base = TiltedObjective(loss, X, y, l2=0.0, **kw)
    xp = base.xp
    shape = base.shape
    mask_np = np.ones(shape, dtype=np.float64)
    mask_np[-1, ...] = 0.0
    mask = xp.asarray(mask_np, dtype=base.dtype, device=base.device)
    return MaskedRidgeObjective(base, alpha, mask)
