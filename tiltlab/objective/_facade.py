"""Tilted objectives: a loss, data, a tilt (or a hierarchy of tilts) and a prior.

For a linear-predictor loss with ``z = X @ theta`` the objective never forms the
``N x d`` matrix of per-sample gradients:

* gradient ``X^T (w * l')``;
* Hessian-vector product, for a hierarchy with levels ``0`` (samples) ... ``L`` (root)
  and tilts ``t_1 .. t_L`` applied at levels ``1 .. L``,

      H v = X^T (w * l'' * Xv) + sum_k t_k X^T (w * l' * (s_{k-1} - s_k)) + l2 v,

  where ``a = l' * Xv`` (the directional derivative of each loss) and ``s_k`` is, for
  each sample, the ``w``-weighted mean of ``a`` over its node at level ``k``
  (``s_0 = a``, ``s_L = g . v``). With no groups this is the tilted Hessian lemma
  ``H = sum w_i H_i + t sum w_i (g_i - g)(g_i - g)^T``; every level adds the covariance
  of its children's gradients, scaled by its tilt. Two passes over ``X`` per product.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .. import _cupy_kernels
from .._compat import (
    PicklableNamespace,
    as_array,
    as_float_array,
    device,
    is_cupy_namespace,
    is_dask_namespace,
    is_lazy,
    is_torch_namespace,
    namespace_of,
    real_number,
)
from .._compat import check_finite as _check_finite
from ..accumulator import NonFiniteLosses, block_state, finalize_risk, merge, normalized_sums
from ..losses import get_loss
from ..risk import (
    GroupTree,
    broadcast_groups,
    build_tree,
    check_group_mass,
    hierarchy_eval,
    prepare_prior,
    prepare_tilts,
    risk_and_weights,
    risk_weights_scalar,
    segment_sum,
)

__all__ = ["TiltedObjective"]


class TiltedObjective(PicklableNamespace):
    r"""A tilted empirical risk as a function of the parameters ``theta``.

    .. math:: F(\theta) = R\big(t; \ell(\theta)\big) + \tfrac{\lambda}{2}\|\theta\|^2

    (or the hierarchical risk :math:`J` when ``groups`` and ``tilts`` are given).

    Parameters
    ----------
    loss : str or Loss
        A loss name (``"squared"``, ``"absolute"``, ``"huber"``, ``"logistic"``,
        ``"hinge"``, ``"squared_hinge"``, ``"multinomial"``) or a loss object from
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
        if not isinstance(check_finite, (bool, np.bool_)):
            raise TypeError(f"`check_finite` must be True or False, got {check_finite!r}")
        l2 = real_number(l2, "l2")
        if not np.isfinite(l2) or l2 < 0:
            raise ValueError(f"`l2` must be a finite non-negative number, got {l2!r}")
        skip = "check_finite=False"
        self.loss: Any = get_loss(loss)  # a Loss; callable losses add fun/grad/hvp
        self.n_samples: int | None
        self.n_features: int | None
        self.shape: tuple[int, ...] | None
        if xp is None:
            xp = namespace_of(X=X, y=y, weights=weights)
            carried = getattr(self.loss, "_xp", None)  # losses carrying their own data
            if X is None and y is None and carried is not None:
                xp = carried
        self.xp = xp
        if self.loss.is_linear:
            if X is None or y is None:
                raise ValueError(f"the {self.loss.name} loss needs `X` and `y`")
            X = as_float_array(X, xp, name="X")
            if X.ndim != 2:
                raise ValueError(f"`X` must be 2-d (samples x features), got shape {X.shape}")
            if X.shape[0] == 0 or X.shape[1] == 0:
                raise ValueError(f"`X` must not be empty, got shape {X.shape}")
            if check_finite:
                _check_finite(X, xp, name="X", skip=skip)
            self.loss = self.loss.with_labels(y, xp=xp)
            y = self.loss.check_y(y, xp=xp)
            if y.ndim != 1:
                hint = " (pass `y.reshape(-1)`)" if y.ndim == 2 and y.shape[1] == 1 else ""
                raise ValueError(
                    f"`y` must be 1-d with one target per row of `X`, got shape "
                    f"{tuple(y.shape)}{hint}"
                )
            if y.shape[0] != X.shape[0]:
                raise ValueError(f"`y` has {y.shape[0]} entries but `X` has {X.shape[0]} rows")
            if xp.isdtype(y.dtype, "real floating"):
                if check_finite:
                    _check_finite(y, xp, name="y", skip=skip)
                if y.dtype != X.dtype:
                    y = xp.astype(y, X.dtype)
            self.n_samples, self.n_features = int(X.shape[0]), int(X.shape[1])
            k = self.loss.n_outputs
            self.shape = (self.n_features,) if k == 1 else (self.n_features, int(k))
            self.dtype = X.dtype
            self.device = device(X)
        else:
            if X is not None:
                X = as_array(X, xp, name="X")
            self.n_samples = None  # known after the first evaluation
            self.n_features = None
            self.shape = None
            self.dtype = None
            self.device = None
        self.X, self.y = X, y
        self._weights_in = weights
        self._prior = None
        if weights is not None and self.n_samples is not None:
            self._prior = prepare_prior(
                weights, xp.zeros((self.n_samples,), dtype=self.dtype, device=self.device), xp
            )
        self.l2 = l2
        self.tree: GroupTree | None = None
        self._groups = groups
        if groups is not None:
            if tilts is None:
                raise ValueError("`tilts` is required with `groups` (outermost first)")
            if self.n_samples is not None:
                self._set_tree(groups, self.n_samples)
            self._tilts_list = prepare_tilts(tilts, _depth_of(groups))
        elif tilts is not None:
            raise ValueError("`tilts` needs `groups`; for sample-level tilting pass `t`")
        else:
            self._tilts_list = [_tilt_value(t)]
        self.n_passes = 0

    # -- tilt -----------------------------------------------------------------------

    def _set_tree(self, groups: Any, n: int) -> None:
        self.tree = build_tree(groups, n)
        check_group_mass(self._prior, self.tree, self.xp)

    @property
    def t(self) -> float:
        """Sample-level tilt, or the outermost tilt of a hierarchy. Settable."""
        return self._tilts_list[0]

    @t.setter
    def t(self, value: float) -> None:
        self._tilts_list = [_tilt_value(value)] + list(self._tilts_list[1:])

    @property
    def tilts(self) -> tuple[float, ...]:
        """All tilts, outermost first (``(t,)`` for a sample-level objective). Settable."""
        return tuple(self._tilts_list)

    @tilts.setter
    def tilts(self, values: Any) -> None:
        depth = 0 if self._groups is None else _depth_of(self._groups)
        self._tilts_list = prepare_tilts(values, depth)

    @property
    def is_hierarchical(self) -> bool:
        return self._groups is not None

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
        new._tilts_list = list(self._tilts_list)
        new.n_passes = 0
        if tilts is not None:
            new.tilts = tilts
        if t is not None:
            new.t = t
        return new

    # -- parameters -----------------------------------------------------------------

    def _theta(self, theta: Any, name: str = "theta") -> Any:
        xp = self.xp
        th = as_float_array(theta, xp, name=name, dev=self.device)
        if self.dtype is not None and th.dtype != self.dtype:
            th = xp.astype(th, self.dtype)
        if self.shape is not None:
            size = int(np.prod(self.shape))
            if tuple(th.shape) != self.shape and tuple(th.shape) != (size,):
                raise ValueError(
                    f"`{name}` must have shape {self.shape} (or be flat of size {size}), got "
                    f"{tuple(th.shape)}"
                )
        return th

    def zeros(self) -> Any:
        """A zero parameter of the right shape, dtype and device."""
        if self.shape is None:
            raise ValueError("the parameter shape of a callable loss is unknown; pass theta0")
        return self.xp.zeros(self.shape, dtype=self.dtype, device=self.device)

    # -- evaluation -----------------------------------------------------------------

    def _linear_parts(self, theta: Any):
        xp = self.xp
        th = xp.reshape(theta, self.shape)
        z = self.X @ th
        self.n_passes += 1
        value, d1, d2 = self.loss.derivatives(z, self.y, validate=False, xp=xp)
        return th, z, value, d1, d2

    def _aggregate(self, ell: Any) -> tuple[Any, Any]:
        xp = self.xp
        if self.tree is None and self._groups is not None:
            self._set_tree(self._groups, ell.shape[-1])
        if self._prior is None and self._weights_in is not None:
            self._prior = prepare_prior(self._weights_in, ell, xp)
            if self.tree is not None:
                check_group_mass(self._prior, self.tree, xp)
        if self.tree is None:
            if not is_lazy(xp):
                try:
                    return risk_weights_scalar(ell, self._prior, self._tilts_list[0], xp)
                except NonFiniteLosses:
                    pass  # IEEE results (inf for an overflowing trial step)
            tt = xp.asarray(self._tilts_list[0], dtype=ell.dtype, device=device(ell))
            return risk_and_weights(ell, self._prior, tt, xp)
        return hierarchy_eval(ell, self._prior, self.tree, self._tilts_list, xp)

    def _penalty(self, th: Any) -> Any:
        xp = self.xp
        return 0.5 * self.l2 * xp.sum(th * th)

    def losses(self, theta: Any) -> Any:
        """Per-sample losses at ``theta``, shape ``(N,)``."""
        th = self._theta(theta)
        if self.loss.is_linear:
            z = self.X @ self.xp.reshape(th, self.shape)
            self.n_passes += 1
            return self.loss.value(z, self.y, validate=False, xp=self.xp)
        ell = self.loss.fun(th, self.X, self.y, xp=self.xp)
        self._learn_shape(th, ell)
        return ell

    def _learn_shape(self, th: Any, ell: Any) -> None:
        if self.n_samples is None:
            self.n_samples = int(ell.shape[0])
            self.shape = tuple(int(s) for s in th.shape)
            self.n_features = int(th.shape[0])
            self.dtype = ell.dtype
            self.device = device(ell)

    def value(self, theta: Any) -> Any:
        """Objective value at ``theta`` (a 0-d array)."""
        if is_lazy(self.xp):  # issue-12 hook: Dask data -> one graph (tiltlab.distributed)
            out = _distributed_call(self, "value", theta)
            if out is not None:
                return out
        th = self._theta(theta)
        r, _ = self._aggregate(self.losses(th))
        return r + self._penalty(th) if self.l2 else r

    def weights(self, theta: Any) -> Any:
        """Tilted (or hierarchical) per-sample weights at ``theta``; they sum to one."""
        _, w = self._aggregate(self.losses(theta))
        return w

    def value_and_gradient(self, theta: Any) -> tuple[Any, Any]:
        """Objective value and gradient (gradient in the shape of ``theta``)."""
        xp = self.xp
        if is_lazy(xp):  # issue-12 hook: Dask data -> one graph (tiltlab.distributed)
            out = _distributed_call(self, "grad", theta)
            if out is not None:
                return out
        th0 = self._theta(theta)
        one = None
        if self.loss.is_linear and self._one_pass_ok():
            th = xp.reshape(th0, self.shape)
            if self.fused and is_cupy_namespace(xp) and _cupy_kernels.supported(self):
                fused = _cupy_kernels.value_and_gradient(self, th)
                one = None if fused is None else (fused[0], (fused[1],))
            if one is None:
                one = self._one_pass(th, None)
        if one is not None:
            r, (g,) = one
        elif self.loss.is_linear:
            th, z, ell, d1, _ = self._linear_parts(th0)
            r, w = self._aggregate(ell)
            coef = w[:, None] * d1 if d1.ndim == 2 else w * d1
            g = self.X.T @ coef
            self.n_passes += 1
        else:
            th = th0
            ell, J = self.loss.value_and_grad(th, self.X, self.y, xp=xp)
            self._learn_shape(th, ell)
            r, w = self._aggregate(ell)
            g = w @ J
        if self.l2:
            r = r + self._penalty(th)
            g = g + self.l2 * th
        return r, xp.reshape(g, th0.shape)

    def gradient(self, theta: Any) -> Any:
        """Gradient of the objective at ``theta`` (in the shape of ``theta``)."""
        return self.value_and_gradient(theta)[1]

    # -- the one-pass engine ----------------------------------------------------------

    #: target size in bytes of one block of rows of ``X`` on CPU backends. Measured on the
    #: 2-core CI-class machine under load (benchmarks/engine_speed.py), cache-sized blocks
    #: (256 KiB - 2 MiB) lost to per-block overhead; 32 MiB blocks bound the temporaries
    #: and cost no more than one block.
    BLOCK_BYTES = 1 << 25

    #: use the fused CuPy kernel (:mod:`tiltlab._cupy_kernels`) where it applies; set to
    #: False on an instance to force the generic array-API path (for comparisons)
    fused = True

    @property
    def block_rows(self) -> int:
        """Rows of ``X`` per block of the one-pass evaluations. Settable.

        Chosen from ``BLOCK_BYTES`` (32 MiB of ``X``: the per-sample temporaries stay
        O(block), not O(N)) on CPU backends; the whole of ``X`` on GPU backends, whose
        kernels block internally.
        """
        n = self.n_samples or 1
        if getattr(self, "_block_rows", None):
            return min(int(self._block_rows), n)
        xp = self.xp
        if is_cupy_namespace(xp) or (
            is_torch_namespace(xp) and getattr(self.device, "type", "cpu") != "cpu"
        ):
            return n
        row_bytes = (self.n_features or 1) * _itemsize(self.dtype, xp)
        return min(n, max(256, self.BLOCK_BYTES // max(row_bytes, 1)))

    @block_rows.setter
    def block_rows(self, value: int | None) -> None:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise ValueError(f"`block_rows` must be a positive integer or None, got {value!r}")
        self._block_rows = None if value is None else int(value)

    def _one_pass_ok(self) -> bool:
        """Sample-level tilt, finite, on an eager backend: the one-pass engine applies."""
        if self.tree is not None or self._groups is not None or is_lazy(self.xp):
            return False
        if self._prior is None and self._weights_in is not None:
            return False  # the prior is prepared by the first plain evaluation
        return bool(np.isfinite(self._tilts_list[0]))

    def _one_pass(self, th: Any, V: Any) -> tuple[Any, tuple] | None:
        """Value and gradient (``V is None``) or Hessian-vector product along ``V``, reading
        each block of ``X`` once: ``z_b = X_b @ theta``, the block's losses and derivatives
        fold into a tilted accumulator, and ``X_b.T @ c_b`` is taken while ``X_b`` is hot.
        """
        xp = self.xp
        X, y, p, t = self.X, self.y, self._prior, float(self._tilts_list[0])
        n, B = self.n_samples, self.block_rows
        assert n is not None
        multi = th.ndim == 2
        if V is not None:
            k = th.shape[1] if multi else 1
            TV = xp.concat([th, V], axis=1) if multi else xp.stack([th, V], axis=1)
        state = None
        for r0 in range(0, n, B):
            r1 = min(n, r0 + B)
            Xb = X[r0:r1, ...] if (r0, r1) != (0, n) else X
            yb = y[r0:r1, ...] if (r0, r1) != (0, n) else y
            pb = None if p is None else (p[r0:r1] if (r0, r1) != (0, n) else p)
            if V is None:
                z = Xb @ th
                ell, d1 = self.loss.value_and_d1(z, yb, validate=False, xp=xp)

                def sums(pe, Xb=Xb, d1=d1):
                    coef = pe[:, None] * d1 if multi else pe * d1
                    return (Xb.T @ coef,)
            else:
                zu = Xb @ TV
                if multi:
                    z, u = zu[:, :k], zu[:, k:]
                else:
                    z, u = zu[:, 0], zu[:, 1]
                ell, d1, d2 = self.loss.derivatives(z, yb, validate=False, xp=xp)
                if multi:
                    hz = self.loss.hvp_z(z, yb, u, validate=False, xp=xp)
                    a = xp.sum(d1 * u, axis=1)
                else:
                    a = d1 * u

                def sums(pe, Xb=Xb, d1=d1, d2=d2, u=u, a=a, hz=(hz if multi else None)):
                    c, gcoef = hvp_coefficients(pe, d1, d2, u, a, hz, t)
                    return (Xb.T @ c, Xb.T @ gcoef, xp.sum(pe * a))

            try:
                if t == 0.0:
                    st = _mean_state(ell, pb, xp, sums)
                else:
                    st = block_state(ell, pb, t, xp, sums=sums)
            except NonFiniteLosses:
                return None  # overflowing losses: the plain path gives IEEE results

            state = st if state is None else merge(state, st)
        self.n_passes += 1
        assert state is not None
        if t == 0.0:
            value = state.shift + state.lsum / state.mass
        else:
            value = finalize_risk(state, xp, self.dtype)
        parts = normalized_sums(state)
        if V is None:
            return value, parts
        A, G, av = parts
        return value, (A - t * G * av if t != 0.0 else A,)

    # -- minibatches (stochastic solvers) ---------------------------------------------

    def batch_losses_and_vjp(self, theta: Any, idx: Any):
        """Losses of the rows ``idx`` and a map ``c -> sum_i c_i grad f_i`` over them.

        ``idx`` is a 1-d integer array (host or ``xp``). The returned function turns
        per-sample coefficients (shape ``(len(idx),)``) into a gradient of ``theta``'s
        shape, reusing the predictor computed here. Data passes are counted in
        proportion to the batch size. The ridge term is not included.
        """
        xp = self.xp
        th = self._theta(theta)
        if not hasattr(idx, "__array_namespace__") or not isinstance(idx, type(th)):
            idx = xp.asarray(np.asarray(idx, dtype=np.int64), device=self.device)
        if self.loss.is_linear:
            XB = xp.take(self.X, idx, axis=0)
            yB = xp.take(self.y, idx, axis=0)
            z = XB @ xp.reshape(th, self.shape)
            ell, d1, _ = self.loss.derivatives(z, yB, validate=False, xp=xp)
            frac = idx.shape[0] / self.n_samples

            def vjp(c: Any) -> Any:
                self.n_passes += frac
                coef = c[:, None] * d1 if d1.ndim == 2 else c * d1
                return xp.reshape(XB.T @ coef, th.shape)

            self.n_passes += frac
            return ell, vjp
        ell, J = self.loss.value_and_grad(th, self.X, self.y, xp=xp)
        ellB, JB = xp.take(ell, idx, axis=0), xp.take(J, idx, axis=0)
        return ellB, lambda c: c @ JB

    def prior(self) -> Any:
        """Normalised prior sample weights (None when uniform)."""
        return self._prior

    # -- second order ---------------------------------------------------------------

    def _level_means(self, wa: Any, w: Any) -> list[Any]:
        """Per-sample w-weighted means of ``a`` over each level's nodes (s_1 .. s_L)."""
        xp = self.xp
        out = []
        if self.tree is not None:
            for lay in self.tree.sample_layouts:
                num = segment_sum(wa, lay, xp)
                den = segment_sum(w, lay, xp)
                safe = xp.where(den > 0, den, xp.ones_like(den))
                mean = xp.where(den > 0, num / safe, xp.zeros_like(num))
                out.append(broadcast_groups(mean, lay, xp))
        out.append(xp.sum(wa) + xp.zeros_like(wa))  # the root: g . v
        return out

    def _tilt_term_coef(self, a: Any, w: Any) -> Any:
        """Per-sample coefficient c with  tilt part of H v = sum_i c_i grad f_i."""
        xp = self.xp
        means = [a] + self._level_means(w * a, w)
        tilts = self._tilts_list[::-1]  # innermost (samples) first
        coef = xp.zeros_like(a)
        for k, tk in enumerate(tilts):
            if tk == 0:
                continue
            if not np.isfinite(tk):
                raise ValueError("the Hessian is not defined at an infinite tilt")
            coef = coef + tk * (means[k] - means[k + 1])
        return w * coef

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
        xp = self.xp
        if not all(np.isfinite(self._tilts_list)):
            raise ValueError("the Hessian is not defined at an infinite tilt")
        if is_lazy(xp):  # issue-12 hook: Dask data -> one graph (tiltlab.distributed)
            out = _distributed_call(self, "hvp", theta, v)
            if out is not None:
                return out
        th0 = self._theta(theta)
        vv = self._theta(v, name="v")
        one = None
        if self.loss.is_linear and self._one_pass_ok():
            assert self.shape is not None
            one = self._one_pass(xp.reshape(th0, self.shape), xp.reshape(vv, self.shape))
        if one is not None:
            out = one[1][0]
        elif self.loss.is_linear:
            assert self.shape is not None  # known for linear-predictor losses
            th = xp.reshape(th0, self.shape)
            V = xp.reshape(vv, self.shape)
            # one pass over X for both the predictor and the direction
            if len(self.shape) == 1:
                zu = self.X @ xp.stack([th, V], axis=1)
                z, u = zu[:, 0], zu[:, 1]
            else:
                k = self.shape[1]
                zu = self.X @ xp.concat([th, V], axis=1)
                z, u = zu[:, :k], zu[:, k:]
            self.n_passes += 1
            ell, d1, d2 = self.loss.derivatives(z, self.y, validate=False, xp=xp)
            _, w = self._aggregate(ell)
            if d1.ndim == 2:  # multinomial: per-sample K x K Hessians in z
                hz = self.loss.hvp_z(z, self.y, u, validate=False, xp=xp)
                a = xp.sum(d1 * u, axis=1)
                c = self._tilt_term_coef(a, w)
                R = w[:, None] * hz + c[:, None] * d1
            else:
                a = d1 * u
                c = self._tilt_term_coef(a, w)
                R = w * d2 * u + c * d1
            out = self.X.T @ R
            self.n_passes += 1
        else:
            ell, J = self.loss.value_and_grad(th0, self.X, self.y, xp=xp)
            _, w = self._aggregate(ell)
            a = J @ vv
            c = self._tilt_term_coef(a, w)
            Hv = self.loss.hvp(th0, vv, self.X, self.y, xp=xp)
            out = w @ Hv + c @ J
        out = xp.reshape(out, vv.shape)
        if self.l2:
            out = out + self.l2 * vv
        return out

    def hessian(self, theta: Any) -> Any:
        """Dense Hessian at ``theta``, shape ``(p, p)`` with ``p = theta.size``.

        Formed as ``X^T diag(.) X`` plus low-rank group terms for scalar-predictor
        losses; column by column from :meth:`hvp` for the multinomial loss.
        """
        xp = self.xp
        th0 = self._theta(theta)
        if not all(np.isfinite(self._tilts_list)):
            raise ValueError("the Hessian is not defined at an infinite tilt")
        if is_lazy(xp):  # issue-12 hook: Dask data -> one graph (tiltlab.distributed)
            out = _distributed_call(self, "hess", th0)
            if out is not None:
                return out
        if self.loss.is_linear and self.shape is not None and len(self.shape) == 1:
            th, z, ell, d1, d2 = self._linear_parts(th0)
            _, w = self._aggregate(ell)
            X = self.X
            tilts = self._tilts_list[::-1]  # innermost first
            # level 0: samples; sum_i w_i (d2 + t_1 d1^2) x_i x_i^T
            diag = w * d2 + tilts[0] * w * d1 * d1 if tilts[0] else w * d2
            H = X.T @ (diag[:, None] * X)
            self.n_passes += 1
            # node gradients per level: G_n = sum_{x in n} w_x d1_x x_x / W_n
            wd1X = (w * d1)[:, None] * X
            layouts = list(self.tree.sample_layouts) if self.tree is not None else []
            for k, tk in enumerate(tilts):
                if tk == 0:
                    continue
                if not np.isfinite(tk):
                    raise ValueError("the Hessian is not defined at an infinite tilt")
                # + t_k * sum_{nodes of level k-1} W G G^T  - t_k * sum_{nodes of level k} ...
                if k > 0:
                    H = H + tk * _node_outer(wd1X, w, layouts[k - 1], xp)
                if k < len(layouts):
                    H = H - tk * _node_outer(wd1X, w, layouts[k], xp)
                else:
                    g = xp.sum(wd1X, axis=0)
                    H = H - tk * (g[:, None] * g[None, :])
            if self.l2:
                H = H + self.l2 * xp.eye(H.shape[0], dtype=H.dtype, device=device(H))
            return H
        # generic: columns of the identity through hvp
        p = int(np.prod(th0.shape))
        eye = xp.eye(p, dtype=th0.dtype, device=device(th0))
        cols = [xp.reshape(self.hvp(th0, xp.reshape(eye[j, :], th0.shape)), (p,)) for j in range(p)]
        H = xp.stack(cols, axis=1)
        return 0.5 * (H + H.T)

    def __getstate__(self) -> dict:  # issue-12 hook: pickles (Dask workers, joblib)
        import types

        state = self.__dict__.copy()
        if isinstance(self.xp, types.ModuleType):  # a module does not pickle: its name does
            state["xp"] = self.xp.__name__
        return state

    def __setstate__(self, state: dict) -> None:  # issue-12 hook
        import importlib

        xp = state["xp"]
        self.__dict__.update(state, xp=importlib.import_module(xp) if isinstance(xp, str) else xp)

    def __repr__(self) -> str:
        tilt = f"tilts={self.tilts}" if self.is_hierarchical else f"t={self.t}"
        shape = "?" if self.n_samples is None else f"{self.n_samples}x{self.n_features}"
        return f"TiltedObjective(loss={self.loss.name!r}, data={shape}, {tilt}, l2={self.l2})"


def _node_outer(wd1X: Any, w: Any, layout: Any, xp: Any) -> Any:
    """sum over nodes of W_n G_n G_n^T with G_n = sum_{x in n} w_x d1_x x_x / W_n."""
    d = wd1X.shape[1]
    cols = [segment_sum(wd1X[:, j], layout, xp) for j in range(d)]
    S = xp.stack(cols, axis=1)  # (G, d): W_n G_n
    W = segment_sum(w, layout, xp)
    safe = xp.where(W > 0, W, xp.ones_like(W))
    return S.T @ (S / safe[:, None])


def _distributed_call(obj: Any, kind: str, theta: Any, v: Any = None) -> Any:
    """issue-12 hook: one-graph evaluation of a Dask objective (None: not applicable)."""
    if not is_dask_namespace(obj.xp):
        return None
    from ..distributed import objective_call

    return objective_call(obj, kind, theta, v)


def hvp_coefficients(pe: Any, d1: Any, d2: Any, u: Any, a: Any, hz: Any, t: float):
    """Per-sample coefficients of a block's Hessian-vector product pieces.

    With unnormalised tilted weights ``pe``, loss derivatives ``d1``/``d2`` in the
    predictor (``hz``: the multinomial loss's per-sample Hessian applied to ``u``, else
    None), the direction's predictor ``u = X v`` and ``a = l' . u``, returns ``(c, g)``
    such that ``X^T c`` sums ``w (l'' u + t l' a)`` and ``X^T g`` sums ``w l'``; the
    Hessian-vector product is ``X^T c / s - t (X^T g / s)(sum w a / s)``.
    """
    if hz is not None:  # multinomial: (n, K) coefficients
        c = pe[:, None] * hz
        if t != 0.0:
            c = c + (t * pe * a)[:, None] * d1
        return c, pe[:, None] * d1
    c = pe * (d2 * u + t * d1 * a) if t != 0.0 else pe * d2 * u
    return c, pe * d1


def _itemsize(dtype: Any, xp: Any) -> int:
    try:
        return int(xp.finfo(dtype).bits) // 8
    except Exception:  # pragma: no cover - non-float dtypes
        return 8


def _mean_state(ell: Any, p: Any, xp: Any, sums: Any):
    """An accumulator state at t = 0 (no exponentials): weights are the prior."""
    from ..accumulator import NonFiniteLosses, TiltState, _extremes

    hi, lo = _extremes(ell, p, xp)
    if not (np.isfinite(hi) and np.isfinite(lo)):
        raise NonFiniteLosses("`losses` contains NaN or infinite values")
    pe = xp.ones_like(ell) if p is None else p
    mass = xp.sum(pe)
    lsum = xp.sum(ell - lo) if p is None else xp.sum(p * (ell - lo))  # relative to the shift
    return TiltState(t=0.0, hi=hi, lo=lo, mass=mass, s=mass, q=None, lsum=lsum,
                     sums=tuple(sums(pe)))


def _tilt_value(t: Any) -> float:
    """A sample-level tilt as a float (``+-inf`` allowed).

    Any real number or size-one array of any library; strings, booleans, NaN and
    arrays of several tilts are rejected.
    """
    return real_number(t, "t")


def _depth_of(groups: Any) -> int:
    from .._compat import seq_of_arrays

    return len(groups) if seq_of_arrays(groups) else 1
