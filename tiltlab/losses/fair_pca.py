"""The fair-PCA group loss of the TERM paper (section 5.2): :class:`FairPCALoss`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compat import (
    as_float_array,
    device,
    is_array_api_obj,
    is_lazy,
    namespace_of,
    to_numpy,
)
from .custom import CallableLoss

__all__ = ["FairPCALoss"]


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
