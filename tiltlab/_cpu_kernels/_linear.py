"""The linearised state of the fused kernels: :class:`Linearization` keeps the tilted risk,
its gradient and the per-sample coefficients at one ``theta``, and its :meth:`~Linearization.hvp`
reads ``X`` once per product (built by :func:`tiltlab._cpu_kernels.fused_linearize`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._launch import _call, _kernels

__all__ = ["Linearization"]


@dataclass(frozen=True)
class Linearization:
    """The tilted risk, its gradient and per-sample coefficients at one ``theta``.

    Built by :func:`fused_linearize`; :meth:`hvp` then costs one fused pass over ``X``
    per product (no loss or weight evaluation), which is what a Newton-CG inner loop
    needs.

    Attributes
    ----------
    value : 0-d array
        Tilted risk at ``theta``.
    gradient : array
        Its gradient (``theta``'s shape).
    weights : ndarray of shape (N,)
        Tilted weights ``w`` (float64, summing to one).
    d1 : ndarray
        Per-sample ``l'`` (shape (N,), or (N, K) for the multinomial loss; float64).
    d2 : ndarray
        Per-sample ``l''`` (shape (N,)), or the softmax rows (N, K) for the multinomial
        loss (its Hessian in the predictor is ``diag(s) - s s^T``).
    t : float
        The tilt.
    """

    value: np.ndarray
    gradient: np.ndarray
    weights: np.ndarray
    d1: np.ndarray
    d2: np.ndarray
    t: float
    X: np.ndarray
    n_chunks: int
    alpha: np.ndarray | None = None  # w (l'' + t l'^2) (scalar losses)
    beta: np.ndarray | None = None  # t w l'

    def hvp(self, v: Any) -> np.ndarray:
        """Hessian-vector product along ``v`` (one fused pass over ``X``).

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab._cpu_kernels import fused_linearize
        >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
        >>> lin = fused_linearize("squared", X, np.zeros(2), np.zeros(2), t=0.0)
        >>> lin.hvp(np.array([1.0, 2.0])).tolist()
        [1.0, 2.0]
        """
        lp = _kernels()
        X = self.X
        g = self.gradient
        v = np.asarray(v)
        if v.shape != g.shape:
            raise ValueError(f"`v` must have the shape of `theta` {g.shape}, got {v.shape}")
        V = np.ascontiguousarray(v, dtype=X.dtype)
        gv = float(np.sum(g.astype(np.float64) * V))
        A = np.zeros((self.n_chunks,) + g.shape)
        if g.ndim == 2:
            _call(
                lp.linear_hvp_multi,
                X,
                self.weights,
                self.d1,
                self.d2,
                self.t,
                V,
                gv,
                self.n_chunks,
                A,
                chunks=self.n_chunks,
            )
        else:
            _call(
                lp.linear_hvp_scalar,
                X,
                self.alpha,
                self.beta,
                V,
                gv,
                self.n_chunks,
                A,
                chunks=self.n_chunks,
            )
        return np.sum(A, axis=0).astype(X.dtype)
