"""The count of evaluations a run makes: a view of an objective that counts its calls."""

from __future__ import annotations

from typing import Any

__all__ = ["CountedObjective"]


class CountedObjective:
    """``objective`` seen through a counter of the evaluations made through it.

    Each call of ``value``, ``value_and_gradient``, ``gradient``, ``hvp``, ``hessian``,
    ``losses`` or ``linearize``, and each Hessian-vector product of a linearisation it
    returned, adds one to ``n_evals`` (a dense Hessian is one evaluation, however the
    objective forms it). Minibatches (``batch_losses_and_vjp``) are not evaluations of
    the objective and are not counted. Every other attribute is the objective's.

    Examples
    --------
    >>> import numpy as np
    >>> import tiltlab as tl
    >>> from tiltlab.solvers._count import CountedObjective
    >>> obj = CountedObjective(tl.TiltedObjective("squared", np.eye(2), np.ones(2)))
    >>> _ = obj.value(np.zeros(2)), obj.linearize(np.zeros(2)).hvp(np.ones(2))
    >>> obj.n_evals, obj.shape
    (3, (2,))
    """

    def __init__(self, objective: Any):
        self.objective = objective
        self.n_evals = 0

    def __getattr__(self, name: str) -> Any:
        # only names this view does not define (the objective's data, namespace...)
        if name == "objective":  # not set yet (a copy or an unpickling)
            raise AttributeError(name)
        out = getattr(self.objective, name)
        if name == "linearize":  # only where the objective has it (else an hvp fallback)
            return self._linearize(out)
        return out

    def _linearize(self, linearize: Any) -> Any:
        def counted(theta: Any) -> Any:
            self.n_evals += 1
            return _CountedLinearization(linearize(theta), self)

        return counted

    def value(self, theta: Any) -> Any:
        self.n_evals += 1
        return self.objective.value(theta)

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        self.n_evals += 1
        return self.objective.value_and_gradient(theta)

    def gradient(self, theta: Any) -> Any:
        self.n_evals += 1
        return self.objective.gradient(theta)

    def hvp(self, theta: Any, v: Any) -> Any:
        self.n_evals += 1
        return self.objective.hvp(theta, v)

    def hessian(self, theta: Any) -> Any:
        self.n_evals += 1
        return self.objective.hessian(theta)

    def losses(self, theta: Any) -> Any:
        self.n_evals += 1
        return self.objective.losses(theta)


class _CountedLinearization:
    """A linearisation whose Hessian-vector products count as evaluations."""

    def __init__(self, lin: Any, counter: CountedObjective):
        self.lin, self.counter = lin, counter

    def __getattr__(self, name: str) -> Any:
        if name == "lin":
            raise AttributeError(name)
        return getattr(self.lin, name)

    def hvp(self, v: Any) -> Any:
        self.counter.n_evals += 1
        return self.lin.hvp(v)
