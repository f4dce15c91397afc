"""The public face of a tilted objective: a problem description and the engines that
evaluate it (see :mod:`tiltlab.objective.engines`)."""

from __future__ import annotations

import copy
import importlib
import math
import types
from typing import Any

import numpy as np

from .._compat import PicklableNamespace, array_result, is_lazy
from ..risk import prepare_tilts
from .blocks import BLOCK_BYTES
from .engines import Context, engines_for
from .engines.generic import (
    GENERIC,
    _check_finite_result,
    _on_cpu,
    _reads_extremes,
    aggregate,
)
from .engines.onepass import check_block_rows, rows_per_block
from .engines.parameter import PARAMETER
from .linearization import Linearization
from .problem import TiltedProblem, depth_of, tilt_value

__all__ = ["TiltedObjective"]


class TiltedObjective(PicklableNamespace):
    r"""A tilted empirical risk as a function of the parameters ``theta``.

    .. math:: F(\theta) = R\big(t; \ell(\theta)\big) + \tfrac{\lambda}{2}\|\theta\|^2

    (or the hierarchical risk :math:`J` when ``groups`` and ``tilts`` are given).

    Parameters
    ----------
    loss : str or Loss
        A loss name (``"squared"``, ``"absolute"``, ``"huber"``, ``"logistic"``,
        ``"hinge"``, ``"squared_hinge"``, ``"poisson"``, ``"pinball"``, ``"multinomial"``;
        the parameters of the default loss, e.g. ``get_loss("pinball", quantile=0.9)``
        otherwise) or a loss object from
        :mod:`tiltlab.losses` (including :class:`~tiltlab.losses.CallableLoss` and
        :class:`~tiltlab.losses.FairPCALoss` for non-linear models).
    X : array of shape (N, d), optional
        Features (``None`` for losses that carry their own data, e.g. fair PCA).
    y : array of shape (N,), optional
        Targets, one per row of ``X``. A column vector ``(N, 1)`` (or any other
        shape) is rejected rather than raveled: it is as often a mistake (the
        wrong array) as a layout choice, so pass ``y.reshape(-1)`` explicitly.
    t : float, default 0.0
        Sample-level tilt (ignored when ``groups`` is given).
    groups : array or sequence of arrays, optional
        Group labels, outermost level first (see :func:`tiltlab.hierarchical_risk`).
    tilts : sequence of float, optional
        One tilt per grouping level plus one for the samples, outermost first.
    weights : array of shape (N,), optional
        Prior sample weights (normalised; default uniform).
    l2 : float, default 0.0
        Ridge penalty :math:`\tfrac{\lambda}{2}\|\theta\|^2`.
    check_finite : bool, default True
        Reject NaN or infinite values in ``X`` and real-valued ``y`` up front (one pass
        over the data, a compute on lazy backends). Pass ``False`` to skip it; the
        objective is then NaN wherever IEEE arithmetic makes it so. Prior ``weights``
        and labels of classification losses are always checked.
    xp : namespace, optional
        Array namespace (inferred from ``X``/``y``).

    Attributes
    ----------
    n_samples, n_features : int
    shape : tuple
        Shape of ``theta``: ``(d,)``, or ``(d, K)`` for the multinomial loss.
    n_passes : int
        Full passes over the data made so far (each product with ``X`` or ``X^T``
        counts one); solvers report it as their cost.

    Notes
    -----
    Objectives pickle (:mod:`pickle`, :func:`copy.deepcopy`, and so joblib,
    multiprocessing and Dask distributed, which rely on it) on every backend whose
    arrays pickle: the array namespace is stored by name and imported again when
    unpickled. A :class:`~tiltlab.losses.CallableLoss`
    pickles when its callables do (plain :mod:`pickle` refuses lambdas; cloudpickle
    takes them).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab import TiltedObjective
    >>> X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    >>> y = np.array([0.0, 1.0, 5.0])
    >>> obj = TiltedObjective("squared", X, y, t=-1.0)
    >>> theta = np.zeros(2)
    >>> float(obj.value(theta)) <= float(obj.losses(theta).mean())
    True
    >>> obj.gradient(theta).shape, obj.hessian(theta).shape
    ((2,), (2, 2))
    """

    #: target size in bytes of one block of rows of ``X`` in the one-pass engine on CPU
    BLOCK_BYTES = BLOCK_BYTES

    #: use fused kernels (the compiled CPU kernels for NumPy data, the CUDA kernels for
    #: CuPy data) where they apply; set to False on an instance to force the generic
    #: array-API path (for comparisons)
    fused = True

    def __init__(
        self,
        loss: Any,
        X: Any = None,
        y: Any = None,
        *,
        t: float = 0.0,
        groups: Any = None,
        tilts: Any = None,
        weights: Any = None,
        l2: float = 0.0,
        check_finite: bool = True,
        xp: Any = None,
    ):
        self._problem = TiltedProblem.build(
            loss, X, y, t=t, groups=groups, tilts=tilts, weights=weights, l2=l2,
            check_finite=check_finite, xp=xp,
        )  # fmt: skip
        self._block_rows: int | None = None
        self.n_passes = 0

    # -- the problem ----------------------------------------------------------------

    @property
    def problem(self) -> TiltedProblem:
        """The frozen problem description the engines evaluate."""
        return self._problem

    loss = property(lambda self: self._problem.loss, doc="The loss.")
    X = property(lambda self: self._problem.X, doc="Features (or None).")
    y = property(lambda self: self._problem.y, doc="Targets (or None).")
    xp = property(lambda self: self._problem.xp, doc="The array namespace.")
    l2 = property(lambda self: self._problem.l2, doc="The ridge penalty.")
    tree = property(lambda self: self._problem.tree, doc="The group tree (or None).")
    n_samples = property(lambda self: self._problem.n_samples, doc="Number of samples N.")
    n_features = property(lambda self: self._problem.n_features, doc="Number of features d.")
    shape = property(lambda self: self._problem.shape, doc="Shape of ``theta``.")
    dtype = property(lambda self: self._problem.dtype, doc="Dtype of the data and of ``theta``.")
    device = property(lambda self: self._problem.device, doc="Device of the data and of ``theta``.")

    def prior(self) -> Any:
        """Normalised prior sample weights (None when uniform)."""
        return self._problem.prior

    @property
    def t(self) -> float:
        """Sample-level tilt, or the outermost tilt of a hierarchy. Settable."""
        return self._problem.tilts[0]

    @t.setter
    def t(self, value: float) -> None:
        tilts = (tilt_value(value),) + tuple(self._problem.tilts[1:])
        self._problem = self._problem.with_tilts(tilts)

    @property
    def tilts(self) -> tuple[float, ...]:
        """All tilts, outermost first (``(t,)`` for a sample-level objective). Settable."""
        return tuple(self._problem.tilts)

    @tilts.setter
    def tilts(self, values: Any) -> None:
        groups = self._problem.groups
        depth = 0 if groups is None else depth_of(groups)
        self._problem = self._problem.with_tilts(prepare_tilts(values, depth))

    @property
    def is_hierarchical(self) -> bool:
        """The objective tilts over groups (``groups`` given), not only over samples."""
        return self._problem.is_hierarchical

    def with_tilt(self, t: float | None = None, *, tilts: Any = None) -> TiltedObjective:
        """A shallow copy with another tilt; shares ``X``, ``y`` and the group tree.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab import TiltedObjective
        >>> obj = TiltedObjective("squared", np.eye(2), np.ones(2))
        >>> obj.with_tilt(3.0).X is obj.X
        True
        """
        new = copy.copy(self)
        new.n_passes = 0
        if tilts is not None:
            new.tilts = tilts
        if t is not None:
            new.t = t
        return new

    # -- parameters -----------------------------------------------------------------

    def check_theta(self, theta: Any, name: str = "theta") -> Any:
        """``theta`` as an array of the objective's namespace, dtype and device, checked
        against its shape (flat or ``shape``); NumPy parameters are moved over.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab import TiltedObjective
        >>> TiltedObjective("squared", np.eye(2), np.ones(2)).check_theta([1, 2])
        array([1., 2.])
        """
        return self._problem.check_theta(theta, name)

    _theta = check_theta  # the name solvers used before ``check_theta``

    def zeros(self) -> Any:
        """A zero parameter of the right shape, dtype and device."""
        if self.shape is None:
            raise ValueError("the parameter shape of a callable loss is unknown; pass theta0")
        return self.xp.zeros(self.shape, dtype=self.dtype, device=self.device)

    def _count(self, k: float) -> None:
        self.n_passes += k

    def _update(self, problem: TiltedProblem) -> None:
        self._problem = problem

    def _context(self) -> Context:
        return Context(
            self._count, self._update, self._block_rows, bool(self.fused), self.BLOCK_BYTES
        )

    def _call(self, op: str, theta: Any, *args: Any) -> Any:
        """Ask the engines in turn; the first that does not decline answers. Arguments
        arrive in the problem's parameter shape."""
        problem, ctx = self._problem, self._context()
        for engine in engines_for(problem):
            out = getattr(engine, op)(problem, theta, *args, ctx)
            if out is not None:
                return _checked(problem, engine, op, out, theta)
        return None

    def _shaped(self, theta: Any, name: str = "theta") -> tuple[Any, Any]:
        th = self.check_theta(theta, name)
        shape = self.shape
        return th, (th if shape is None else self.xp.reshape(th, shape))

    # -- evaluation -----------------------------------------------------------------

    def losses(self, theta: Any) -> Any:
        """Per-sample losses at ``theta``, shape ``(N,)``."""
        th, T = self._shaped(theta)
        if not self._problem.is_linear:
            return PARAMETER.losses(self._problem, th, self._context())[0]
        ell = GENERIC.losses(self._problem, T, self._context())
        if not is_lazy(self.xp) and not bool(self.xp.all(self.xp.isfinite(ell))):
            self._problem.check_finite_theta(th)
        return ell

    def value(self, theta: Any) -> Any:
        """Objective value at ``theta`` (a 0-d array)."""
        return array_result(self._call("value", self._shaped(theta)[1]))

    def weights(self, theta: Any) -> Any:
        """Tilted (or hierarchical) per-sample weights at ``theta``; they sum to one."""
        ell = self.losses(theta)
        return aggregate(self._problem, ell, self.check_theta(theta))[1]

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        """Objective value and gradient (gradient in the shape of ``theta``)."""
        th, T = self._shaped(theta)
        r, g = self._call("value_and_gradient", T)
        return array_result(r), self.xp.reshape(g, th.shape)

    def gradient(self, theta: Any) -> Any:
        """Gradient of the objective at ``theta`` (in the shape of ``theta``)."""
        return self.value_and_gradient(theta)[1]

    @property
    def block_rows(self) -> int:
        """Rows of ``X`` per block of the one-pass evaluations. Settable.

        Chosen from ``BLOCK_BYTES`` (32 MiB of ``X``: the per-sample temporaries stay
        O(block), not O(N)) on CPU backends; the whole of ``X`` on GPU backends, whose
        kernels block internally.
        """
        return rows_per_block(self._problem, self._block_rows, self.BLOCK_BYTES)

    @block_rows.setter
    def block_rows(self, value: int | None) -> None:
        self._block_rows = check_block_rows(value)

    def batch_losses_and_vjp(self, theta: Any, idx: Any):
        """Losses of the rows ``idx`` and a map ``c -> sum_i c_i grad f_i`` over them.

        ``idx`` is a 1-d integer array (host or ``xp``). The returned function turns
        per-sample coefficients (shape ``(len(idx),)``) into a gradient of ``theta``'s
        shape, reusing the predictor computed here. Data passes are counted in
        proportion to the batch size. The ridge term is not included.
        """
        th = self.check_theta(theta)
        if not hasattr(idx, "__array_namespace__") or not isinstance(idx, type(th)):
            idx = self.xp.asarray(np.asarray(idx, dtype=np.int64), device=self.device)
        engine = GENERIC if self._problem.is_linear else PARAMETER
        return engine.minibatch(self._problem, th, idx, self._context())

    # -- second order ---------------------------------------------------------------

    def _check_finite_tilts(self) -> None:
        if not self._problem.finite_tilts:
            raise ValueError("the Hessian is not defined at an infinite tilt")

    def hvp(self, theta: Any, v: Any) -> Any:
        """Hessian-vector product at ``theta`` (two passes over ``X``).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab import TiltedObjective
        >>> obj = TiltedObjective("logistic", np.eye(3), np.array([0, 1, 1]), t=2.0)
        >>> th, v = np.zeros(3), np.ones(3)
        >>> bool(np.allclose(obj.hvp(th, v), obj.hessian(th) @ v))
        True
        """
        self._check_finite_tilts()
        _, T = self._shaped(theta)
        vv, V = self._shaped(v, "v")
        self._problem.check_finite_theta(vv, "v")
        return self.xp.reshape(self._call("hvp", T, V), vv.shape)

    def hessian(self, theta: Any) -> Any:
        """Dense Hessian at ``theta``, shape ``(p, p)`` with ``p = theta.size``.

        Formed as ``X^T diag(.) X`` plus low-rank group terms for scalar-predictor
        losses; column by column from :meth:`hvp` for the multinomial loss.
        """
        xp = self.xp
        th0, T = self._shaped(theta)
        self._check_finite_tilts()
        H = self._call("hessian", T)
        if H is not None:
            return H
        p = math.prod(th0.shape)
        eye = xp.eye(p, dtype=th0.dtype, device=self.device)
        cols = [xp.reshape(self.hvp(th0, xp.reshape(eye[j, :], th0.shape)), (p,)) for j in range(p)]
        H = xp.stack(cols, axis=1)
        return 0.5 * (H + H.T)

    def linearize(self, theta: Any) -> Linearization:
        """The objective at ``theta`` with its losses, weights and derivatives kept, so
        that every Hessian-vector product of a Newton step reuses them.

        Returns a :class:`~tiltlab.objective.linearization.Linearization` with ``value``,
        ``gradient`` (in the shape of ``theta``), ``losses``, ``weights`` and ``hvp(v)``.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab import TiltedObjective
        >>> obj = TiltedObjective("squared", np.eye(3), np.arange(3.0), t=1.0)
        >>> lin = obj.linearize(np.zeros(3))
        >>> bool(np.allclose(lin.gradient, obj.gradient(np.zeros(3))))
        True
        """
        self._check_finite_tilts()
        th, T = self._shaped(theta)
        raw = self._call("linearize", T)
        return raw.reshaped(th, self._problem.shape, lambda v: self.check_theta(v, "v"))

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        if "_tilts_list" in state:  # pickled before the problem/engine split
            state = _from_flat_state(state)
        super().__setstate__(state)

    def __repr__(self) -> str:
        tilt = f"tilts={self.tilts}" if self.is_hierarchical else f"t={self.t}"
        shape = "?" if self.n_samples is None else f"{self.n_samples}x{self.n_features}"
        return f"TiltedObjective(loss={self.loss.name!r}, data={shape}, {tilt}, l2={self.l2})"


def _checked(problem: TiltedProblem, engine: Any, op: str, out: Any, theta: Any) -> Any:
    """``out``, the result of ``engine``, after the check of ``theta`` that the tilted
    reduction makes at a finite non-zero tilt, for an engine that does not make it
    itself, at ``t = 0`` or ``t = +-inf``: a non-finite value sends ``theta`` to
    :meth:`TiltedProblem.check_finite_theta` (products, which have no value, send it
    there directly). No host read on lazy backends or on a device (CuPy, PyTorch on a
    GPU), whose evaluations keep their budget of host reads."""
    if engine.checks_theta or _reads_extremes(problem) or is_lazy(problem.xp):
        return out
    if not _on_cpu(theta):
        return out
    if op == "value":
        _check_finite_result(problem, out, theta)
    elif op == "value_and_gradient":
        _check_finite_result(problem, out[0], theta)
    elif op == "linearize":
        _check_finite_result(problem, out.value, theta)
    else:
        problem.check_finite_theta(theta)
    return out


def _from_flat_state(old: dict) -> dict:
    """The state of an objective pickled when it kept the problem in its own attributes."""
    xp = old["xp"]
    if isinstance(xp, str):
        xp = importlib.import_module(xp)
    elif not isinstance(xp, types.ModuleType) and hasattr(xp, "name"):
        xp = importlib.import_module(xp.name)  # a namespace reference
    problem = TiltedProblem(
        loss=old["loss"], X=old["X"], y=old["y"], xp=xp,
        tilts=tuple(float(t) for t in old["_tilts_list"]), l2=float(old["l2"]),
        weights=old.get("_weights_in"), prior=old.get("_prior"), groups=old.get("_groups"),
        tree=old.get("tree"), n_samples=old.get("n_samples"),
        n_features=old.get("n_features"), shape=old.get("shape"), dtype=old.get("dtype"),
        device=old.get("device"),
    )  # fmt: skip
    new = {"_problem": problem, "_block_rows": old.get("_block_rows")}
    new["n_passes"] = old.get("n_passes", 0)
    if "fused" in old:
        new["fused"] = old["fused"]
    return new
