"""The engine of parameter-space losses (:class:`~tiltlab.losses.CallableLoss`,
:class:`~tiltlab.losses.FairPCALoss`...): per-sample losses and their ``N x d`` Jacobian
come from the loss itself, the tilted reduction and the tilt terms from here.

The parameter shape, the number of samples, the prior and the group tree of such a
problem are known after its first evaluation; the engine then hands the completed
problem back through the context (``ctx.update``).
"""

from __future__ import annotations

from typing import Any

from ..linearization import Linearization
from .base import Context, Engine
from .generic import aggregate, penalty, tilt_term_coef

__all__ = ["PARAMETER", "ParameterEngine"]


def _no_nan(problem: Any, ell: Any, theta: Any) -> None:
    xp = problem.xp
    if bool(xp.any(xp.isnan(ell))):
        problem.check_finite_theta(theta)
        raise ValueError(
            f"the {problem.loss.name} `loss` returned NaN at `theta`; a tilted risk of NaN "
            "losses is not defined"
        )


class ParameterEngine(Engine):
    """Evaluations of parameter-space losses; serves every such problem."""

    name = "parameter-space"

    def applies(self, problem: Any) -> bool:
        return not problem.is_linear

    def losses(self, problem: Any, theta: Any, ctx: Context) -> tuple[Any, Any]:
        """Per-sample losses and the (possibly completed) problem."""
        ell = problem.loss.fun(theta, problem.X, problem.y, xp=problem.xp)
        _no_nan(problem, ell, theta)
        return ell, self._learn(problem, theta, ell, ctx)

    def _learn(self, problem: Any, theta: Any, ell: Any, ctx: Context) -> Any:
        new = problem.learned(theta, ell)
        if new is not problem:
            ctx.update(new)
        return new

    def _jacobian(self, problem: Any, theta: Any, ctx: Context) -> tuple[Any, Any, Any]:
        ell, J = problem.loss.value_and_grad(theta, problem.X, problem.y, xp=problem.xp)
        _no_nan(problem, ell, theta)
        return ell, J, self._learn(problem, theta, ell, ctx)

    def value(self, problem: Any, theta: Any, ctx: Context) -> Any:
        ell, problem = self.losses(problem, theta, ctx)
        r, _ = aggregate(problem, ell)
        return r + penalty(problem, theta) if problem.l2 else r

    def value_and_gradient(self, problem: Any, theta: Any, ctx: Context) -> Any:
        ell, J, problem = self._jacobian(problem, theta, ctx)
        r, w = aggregate(problem, ell)
        g = w @ J
        if problem.l2:
            return r + penalty(problem, theta), g + problem.l2 * theta
        return r, g

    def hvp(self, problem: Any, theta: Any, v: Any, ctx: Context) -> Any:
        return self.linearize(problem, theta, ctx).hvp(v)

    def minibatch(self, problem: Any, theta: Any, idx: Any, ctx: Context) -> tuple:
        """Losses of the rows ``idx`` and ``c -> sum_i c_i grad f_i`` over them."""
        xp = problem.xp
        ell, J = problem.loss.value_and_grad(theta, problem.X, problem.y, xp=xp)
        ellB, JB = xp.take(ell, idx, axis=0), xp.take(J, idx, axis=0)
        return ellB, lambda c: c @ JB

    def linearize(self, problem: Any, theta: Any, ctx: Context) -> Any:
        ell, J, problem = self._jacobian(problem, theta, ctx)
        r, w = aggregate(problem, ell)
        g = w @ J

        def products(v: Any) -> Any:
            c = tilt_term_coef(problem, J @ v, w)
            Hv = problem.loss.hvp(theta, v, problem.X, problem.y, xp=problem.xp)
            out = w @ Hv + c @ J
            return out + problem.l2 * v if problem.l2 else out

        if problem.l2:
            r, g = r + penalty(problem, theta), g + problem.l2 * theta
        return Linearization(theta, r, g, ell, w, products)


#: The engine of losses given in ``theta``, one instance shared by every objective.
PARAMETER = ParameterEngine()
