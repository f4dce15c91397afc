"""Solvers driven from the client for objectives on Dask arrays.

:func:`tiltlab.minimize` hands a Dask objective to :func:`client_minimize`, which runs the
unchanged solvers on a :class:`ClientObjective`: a NumPy view of the objective whose every
evaluation is one graph on the cluster (:func:`tiltlab.distributed.evaluate`). The solver's
``d``-dimensional algebra (L-BFGS two-loop recursion, line searches, CG, momentum) runs in
NumPy on the client; the data never leave the workers. The result's ``x``, ``fun`` and
``jac`` come back as Dask arrays, like the input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import is_dask_namespace, library_namespace, to_numpy
from ..objective.linearization import Linearization
from ..objective.problem import TiltedProblem
from ..objective.protocol import linearize_by_products
from ..solvers import DRIVERS
from ._objective import distribute, evaluate, lazy_hessian, supported

__all__ = ["ClientObjective", "client_minimize", "is_dask_objective"]


def is_dask_objective(objective: Any) -> bool:
    """A :class:`~tiltlab.TiltedObjective` whose data are Dask arrays and that the
    one-graph path supports (linear-predictor loss, finite innermost tilt)."""
    xp = getattr(objective, "xp", None)
    if xp is None or not is_dask_namespace(xp):
        return False
    problem = getattr(objective, "problem", None)
    return isinstance(problem, TiltedProblem) and supported(problem)


class ClientObjective:
    """NumPy face of a Dask :class:`~tiltlab.TiltedObjective` for client-side solvers.

    Parameters, iterates, gradients and Hessian products are NumPy arrays; each call of
    :meth:`value`, :meth:`value_and_gradient`, :meth:`hvp` or :meth:`hessian` runs one
    graph on the cluster (``n_evals`` counts them). Minibatches
    (:meth:`batch_losses_and_vjp`) fetch only the requested rows.
    """

    def __init__(self, objective: Any):
        self.objective = objective
        self.plan = distribute(objective)
        self.xp = library_namespace(np.empty(0))
        self.device = "cpu"
        self.dtype = np.dtype(objective.dtype)
        self.shape = objective.shape
        self.n_samples = objective.n_samples
        self.n_features = objective.n_features
        self.l2 = objective.l2
        self.loss = objective.loss
        self.n_passes: float = 0.0
        self.n_evals = 0

    # -- what the solvers read -----------------------------------------------------------

    @property
    def tilts(self) -> tuple:
        """The Dask objective's tilts, outermost first."""
        return self.objective.tilts

    @property
    def t(self) -> float:
        """The Dask objective's (outermost) tilt."""
        return self.objective.t

    @property
    def is_hierarchical(self) -> bool:
        """The objective tilts over groups, not only over samples."""
        return self.objective.is_hierarchical

    @property
    def tree(self) -> Any:
        """The Dask objective's group tree (None at sample level)."""
        return self.objective.tree

    def _theta(self, theta: Any, name: str = "theta") -> np.ndarray:
        """``theta`` as a flat NumPy array of the objective's dtype, checked."""
        th = np.asarray(to_numpy(theta))
        if th.dtype.kind not in "fiub":
            raise TypeError(f"`{name}` must be real, got dtype {th.dtype}")
        th = th.astype(self.dtype, copy=False)
        size = int(np.prod(self.shape))
        if tuple(th.shape) != tuple(self.shape) and tuple(th.shape) != (size,):
            raise ValueError(
                f"`{name}` must have shape {tuple(self.shape)} (or be flat of size {size}), "
                f"got {tuple(th.shape)}"
            )
        return th

    check_theta = _theta

    def zeros(self) -> np.ndarray:
        """A zero parameter on the client (NumPy)."""
        return np.zeros(self.shape, dtype=self.dtype)

    def linearize(self, theta: Any) -> Linearization:
        """Value and gradient at ``theta`` (one graph), and products there (one graph each)."""
        return linearize_by_products(self, self._theta(theta))

    def _run(self, theta: Any, v: Any, mode: str) -> tuple:
        th = self._theta(theta)
        T = np.reshape(th, self.shape)
        V = None if v is None else np.reshape(self._theta(v, name="v"), self.shape)
        before = self.objective.n_passes
        out = evaluate(self.objective, T, V, mode)
        self.n_passes += self.objective.n_passes - before
        self.n_evals += 1
        return th.shape, out

    def value(self, theta: Any) -> np.ndarray:
        """The value at ``theta`` (one graph on the cluster)."""
        return self._run(theta, None, "value")[1][0]

    def value_and_gradient(self, theta: Any) -> tuple:
        """The value and gradient at ``theta`` (one graph on the cluster)."""
        shape, (f, g) = self._run(theta, None, "grad")
        return f, np.reshape(g, shape)

    def gradient(self, theta: Any) -> np.ndarray:
        """The gradient at ``theta`` (one graph on the cluster)."""
        return self.value_and_gradient(theta)[1]

    def hvp(self, theta: Any, v: Any) -> np.ndarray:
        """The Hessian-vector product ``H(theta) v`` (one graph on the cluster)."""
        if not all(np.isfinite(self.objective.tilts)):
            raise ValueError("the Hessian is not defined at an infinite tilt")
        _, (_, hv) = self._run(theta, v, "hvp")
        return np.reshape(hv, np.shape(v))

    def hessian(self, theta: Any) -> np.ndarray:
        """Dense Hessian, one evaluation and one graph: one pass for a sample-level
        scalar-predictor objective, else one Hessian-vector product per column, all in
        the same graph."""
        import dask

        if not all(np.isfinite(self.objective.tilts)):
            raise ValueError("the Hessian is not defined at an infinite tilt")
        th = self._theta(theta)
        if len(self.shape) == 1 and not self.is_hierarchical:
            return self._run(th, None, "hess")[1][1]
        before = self.objective.n_passes
        H, _ = lazy_hessian(self.objective, np.reshape(th, self.shape))
        (H,) = dask.compute(H)
        self.n_passes += self.objective.n_passes - before
        self.n_evals += 1
        return np.asarray(H, dtype=self.dtype)

    def prior(self) -> Any:
        """The normalised prior on the client (NumPy), or None when uniform."""
        p = self.objective.prior()
        return None if p is None else np.asarray(to_numpy(p))

    def losses(self, theta: Any) -> np.ndarray:
        """Per-sample losses (N numbers to the client: for the stochastic method only)."""
        return np.asarray(to_numpy(self.objective.losses(theta)))

    def batch_losses_and_vjp(self, theta: Any, idx: Any):
        """Losses of rows ``idx`` and their vector-Jacobian map; only those rows travel
        (one graph gathering ``X[idx]`` and ``y[idx]`` from their chunks)."""
        import dask

        idx = np.asarray(to_numpy(idx), dtype=np.int64)
        plan = self.plan
        XB, yB = dask.compute(plan.X[idx], plan.y[idx])
        th = np.reshape(self._theta(theta), self.shape)
        z = XB @ th
        ell, d1, _ = self.loss.derivatives(z, yB, validate=False, xp=self.xp)
        frac = idx.shape[0] / self.n_samples
        self.n_passes += frac

        def vjp(c: Any) -> np.ndarray:
            self.n_passes += frac
            coef = c[:, None] * d1 if d1.ndim == 2 else c * d1
            return np.reshape(XB.T @ coef, np.shape(theta))

        return ell, vjp

    def with_tilt(self, t: float | None = None, *, tilts: Any = None) -> ClientObjective:
        """The client view of the Dask objective at another tilt."""
        return ClientObjective(self.objective.with_tilt(t, tilts=tilts))


def _to_dask(a: Any) -> Any:
    import dask.array as da

    if a is None:
        return None
    return da.from_array(np.asarray(a), chunks=-1)


def client_minimize(minimize: Any, objective: Any, theta0: Any, **kwargs: Any) -> Any:
    """:func:`tiltlab.minimize` for a Dask objective, driven from the client.

    ``validation`` may be a Dask objective too (one graph per validation value). The
    result's ``x``, ``fun`` and ``jac`` are Dask arrays (single chunk); ``nfev`` counts the
    evaluations, each one graph on the cluster. ``callback`` sees NumPy iterates.
    """
    client = ClientObjective(objective)
    x0 = None if theta0 is None else client._theta(theta0, name="theta0")
    if x0 is not None and not np.all(np.isfinite(x0)):
        raise ValueError("`theta0` contains NaN or infinite values")
    val = kwargs.get("validation")
    if val is not None and is_dask_objective(val):
        kwargs["validation"] = ClientObjective(val)
    res = minimize(client, x0, **kwargs)
    res.x, res.fun, res.jac = _to_dask(res.x), _to_dask(res.fun), _to_dask(res.jac)
    # evaluations made, each one graph on the cluster (OptimizeResult.nfev's definition)
    res.nfev = client.n_evals
    return res


class _ClientDriver:
    """The Dask driver of :func:`tiltlab.minimize` (see :mod:`tiltlab.solvers._external`)."""

    def applies(self, objective: Any) -> bool:
        return is_dask_objective(objective)

    def __call__(self, minimize: Any, objective: Any, theta0: Any, **kwargs: Any) -> Any:
        return client_minimize(minimize, objective, theta0, **kwargs)


DRIVERS.register("dask", _ClientDriver())
