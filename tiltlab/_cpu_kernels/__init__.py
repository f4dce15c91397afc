"""A fused CPU engine (numba) for the data term of sample-level tilted GLM objectives.

For a linear-predictor loss ``l_i = f(x_i . theta, y_i)``, prior weights ``p_i`` and a
finite tilt ``t``, the data term is the tilted risk
``R = (1/t) log(sum_i p_i exp(t l_i) / sum_i p_i)`` (the weighted mean at ``t = 0``), with
gradient ``X^T (w * l')`` and Hessian-vector product
``X^T (w (l'' u + t l' (l' u - g . v)))``, ``u = X v``, for the tilted weights ``w``.
The kernels read every row of ``X`` from memory once per call: the predictor, the loss
and its derivatives, the row's fold into the tilted accumulator (an online shift, exactly
merged over chunks as in :mod:`tiltlab.accumulator`) and the rank-one update of the
gradient all happen while the row is in cache. The scalar-loss kernels do this a block of
rows at a time (:mod:`._blocks`): dot products, then the loss, the weights and the state
for the whole block in vectorised loops (``exp``, ``expm1`` and ``log1p`` written so that
LLVM vectorises them, :mod:`._vmath`, and their float32 versions for float32 data,
:mod:`._vmath32`: numba has no SIMD math library here), then the updates while the block
is still in cache. The ridge term is not included (the objective
adds it).

Entry points
------------
:func:`fused_value`, :func:`fused_value_and_gradient`, :func:`fused_hvp` and
:func:`fused_linearize` (value, gradient and the per-sample coefficients at ``theta``,
whose :meth:`Linearization.hvp` then costs one fused pass per product). They take NumPy
arrays (``X`` float32 or float64) and return NumPy results in ``X``'s dtype.
:class:`FusedProblem` binds the data once (what an engine keeps between calls: the
O(N) input checks are not repeated). :func:`available` says whether numba imports;
:func:`use_fused` is the size policy under which the generic array-API path is used
instead. Numba compiles each kernel on its first call (about 10 s per kernel and dtype
on a loaded 2-core machine) and caches it on disk (``cache=True``): a new process then
loads it in about 0.01 s. Numba checks only a kernel's own file for changes, so
:mod:`._cache` removes the cached kernels whenever any source file of this package (or
the numba version) differs from the one they were compiled from.

Determinism
-----------
Rows are split into ``n_chunks`` contiguous chunks that depend on the number of rows
only (never on the number of threads), and chunk states are merged in a fixed order, so
results are identical bit for bit for any number of numba threads. Against the generic
path they agree to rounding: about ``1e-13`` relative in float64 and ``1e-5`` in float32
(for float32 data the scalar-loss kernels compute the losses, their derivatives and the
tilted weights in float32 arithmetic, with vectorised float32 ``exp``/``log1p`` accurate
to 2 units in the last place; the tilted state and every long vector sum are float64).

Losses: squared, absolute, Huber (``loss_params={"delta": ...}``), logistic, hinge,
squared hinge (labels 0/1) and multinomial (``theta`` of shape ``(d, K)``, integer
labels in ``[0, K)``). Infinite tilts are not served (callers use the generic path).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ._prepare import (
    CHUNK_ROWS,
    LOSS_CODES,
    MAX_CHUNKS,
    _at,
    _bind,
    _combine,
    _direction,
    _merge,
    _Problem,
    default_chunks,
)

__all__ = [
    "CHUNK_ROWS",
    "LOSS_CODES",
    "MAX_CHUNKS",
    "FusedProblem",
    "Linearization",
    "available",
    "default_chunks",
    "fused_hvp",
    "fused_linearize",
    "fused_value",
    "fused_value_and_gradient",
    "use_fused",
]

#: below this many entries of ``X`` (times classes) the generic path is used: the
#: parallel launch and the first call's cache load cost more than they save
MIN_ELEMENTS = 1 << 18
#: ... and below this many rows (too few chunks to share between threads)
MIN_ROWS = 2048
#: ... and below this many entries per row (features times classes): the per-row work of
#: the kernels then outweighs the short dot product and update. With the vectorised block
#: kernels the fused path wins from d = 8 on (benchmarks/cpu_kernel_speed.py, one thread),
#: except ``value_and_gradient`` of float32 data with a loss without transcendentals
#: (squared: 1.2-1.5x NumPy's time at d = 8-20)
MIN_ROW_ENTRIES = 8


def available() -> bool:
    """Whether numba can be imported (the fused engine needs it).

    Examples
    --------
    >>> from tiltlab._cpu_kernels import available
    >>> isinstance(available(), bool)
    True
    """
    return importlib.util.find_spec("numba") is not None


def use_fused(n: int, d: int, k: int = 1) -> bool:
    """Size policy: serve an ``n x d`` problem (``k`` classes) with the fused kernels?

    True when numba is available, the problem is large enough that the kernel's fixed
    costs (thread launch, first-call cache load) are small against a pass over ``X``, and
    rows are long enough (``d * k >= MIN_ROW_ENTRIES``) that the row's dot product and
    update, not the per-row work, set the cost.

    Examples
    --------
    >>> from tiltlab._cpu_kernels import available, use_fused
    >>> use_fused(100, 3), use_fused(10**6, 4)
    (False, False)
    >>> use_fused(200_000, 100) == available()
    True
    """
    row = d * max(k, 1)
    return n >= MIN_ROWS and row >= MIN_ROW_ENTRIES and n * row >= MIN_ELEMENTS and available()


def _kernels():
    """The compiled kernels (imports numba on first use)."""
    if not available():
        raise ImportError("the fused CPU kernels need numba (pip install 'tiltlab[cpu]')")
    from ._cache import refresh_cache

    refresh_cache()  # before numba loads a kernel compiled from older helpers
    from . import _multinomial, _rows, _scalar

    return SimpleNamespace(
        STATE_COLS=_rows.STATE_COLS,
        vg_scalar=_scalar.vg_scalar,
        hvp_scalar=_scalar.hvp_scalar,
        linear_hvp_scalar=_scalar.linear_hvp_scalar,
        vg_multi=_multinomial.vg_multi,
        hvp_multi=_multinomial.hvp_multi,
        linear_hvp_multi=_multinomial.linear_hvp_multi,
    )


# ---------------------------------------------------------------------------------------
# value and gradient


def _run_vg(pb: _Problem, want_grad: bool, per_sample: bool):
    lp = _kernels()
    n, d = pb.X.shape
    state = np.zeros((pb.n_chunks, lp.STATE_COLS))
    if pb.loss == "multinomial":
        K = pb.theta.shape[1]
        G = np.zeros((pb.n_chunks, d, K) if want_grad else (pb.n_chunks, 1, K))
        out_l = np.zeros(n if per_sample else 1)
        out_s = np.zeros((n, K) if per_sample else (1, K))
        lp.vg_multi(
            pb.X,
            pb.y,
            pb.p,
            pb.theta,
            pb.t,
            pb.n_chunks,
            want_grad,
            per_sample,
            state,
            G,
            out_l,
            out_s,
        )
        out = (out_l, out_s)
    else:
        G = np.zeros((pb.n_chunks, d if want_grad else 1))
        out = np.zeros((n, 3) if per_sample else (1, 3))
        lp.vg_scalar(
            pb.X,
            pb.y,
            pb.p,
            pb.theta,
            pb.t,
            pb.code,
            pb.param,
            pb.n_chunks,
            want_grad,
            per_sample,
            state,
            G,
            out,
        )
    return state, G, out


class FusedProblem:
    """Data bound once (validated, contiguous), evaluated at many ``theta`` and tilts.

    What an engine keeps between calls: the O(N) checks of ``y`` and ``prior`` and the
    conversions happen here, once; each evaluation then checks only ``theta`` and ``t``.
    Parameters as in :func:`fused_value_and_gradient`.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels import FusedProblem
    >>> fp = FusedProblem("squared", np.eye(2), np.array([1.0, 3.0]))
    >>> float(fp.value(np.zeros(2), t=0.0)), fp.gradient(np.zeros(2), t=0.0).tolist()
    (5.0, [-1.0, -3.0])
    """

    def __init__(
        self,
        loss: str,
        X: Any,
        y: Any,
        prior: Any = None,
        *,
        loss_params: dict | None = None,
        n_chunks: int | None = None,
    ):
        self._base, self._ymax = _bind(loss, X, y, prior, loss_params, n_chunks)

    @property
    def loss(self) -> str:
        return self._base.loss

    @property
    def X(self) -> np.ndarray:
        return self._base.X

    @property
    def n_chunks(self) -> int:
        return self._base.n_chunks

    def _at(self, theta: Any, t: Any) -> _Problem:
        return _at(self._base, self._ymax, theta, t)

    def value(self, theta: Any, t: float) -> np.ndarray | None:
        """Tilted risk at ``theta`` (see :func:`fused_value`)."""
        return _value(self._at(theta, t))

    def value_and_gradient(self, theta: Any, t: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Risk and gradient (see :func:`fused_value_and_gradient`)."""
        return _value_and_gradient(self._at(theta, t))

    def gradient(self, theta: Any, t: float) -> np.ndarray | None:
        """Gradient of the risk at ``theta``."""
        out = self.value_and_gradient(theta, t)
        return None if out is None else out[1]

    def hvp(self, theta: Any, v: Any, t: float) -> np.ndarray | None:
        """Hessian-vector product (see :func:`fused_hvp`)."""
        return _hvp(self._at(theta, t), v)

    def linearize(self, theta: Any, t: float) -> Linearization | None:
        """Value, gradient and Hessian-vector-product state (see :func:`fused_linearize`)."""
        return _linearize(self._at(theta, t))


def fused_value(
    loss: str,
    X: Any,
    y: Any,
    theta: Any,
    t: float,
    prior: Any = None,
    *,
    loss_params: dict | None = None,
    n_chunks: int | None = None,
) -> np.ndarray | None:
    """Tilted risk of the losses at ``theta`` (one pass over ``X``, no gradient).

    Parameters are those of :func:`fused_value_and_gradient`.

    Returns
    -------
    0-d array of ``X``'s dtype, or None when a loss on the prior's support is not
    finite (the generic path then gives the IEEE result or raises).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels import fused_value
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> float(fused_value("squared", X, np.array([1.0, 3.0]), np.zeros(2), t=0.0))
    5.0
    """
    fp = FusedProblem(loss, X, y, prior, loss_params=loss_params, n_chunks=n_chunks)
    return fp.value(theta, t)


def fused_value_and_gradient(
    loss: str,
    X: Any,
    y: Any,
    theta: Any,
    t: float,
    prior: Any = None,
    *,
    loss_params: dict | None = None,
    n_chunks: int | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Tilted risk and its gradient in ``theta``, reading each row of ``X`` once.

    Parameters
    ----------
    loss : str
        One of :data:`LOSS_CODES`.
    X : ndarray of shape (N, d)
        float32 or float64 features (copied once if not C-contiguous).
    y : array_like of shape (N,)
        Targets (0/1 labels for the binary losses, classes in ``[0, K)`` for the
        multinomial loss).
    theta : array_like of shape (d,), or (d, K) for the multinomial loss
    t : float
        Finite tilt (0 gives the prior-weighted mean).
    prior : array_like of shape (N,), optional
        Non-negative prior weights (normalised here; zeros allowed: those rows are
        skipped). Default uniform.
    loss_params : dict, optional
        ``{"delta": ...}`` for the Huber loss.
    n_chunks : int, optional
        Row chunks (default :func:`default_chunks`); results do not depend on the
        number of threads for a given chunk count.

    Returns
    -------
    (value, gradient) : 0-d array and array of ``theta``'s shape, in ``X``'s dtype,
    or None when a loss on the prior's support is not finite.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels import fused_value_and_gradient
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> value, grad = fused_value_and_gradient("squared", X, np.array([1.0, 3.0]),
    ...                                        np.zeros(2), t=0.0)
    >>> float(value), grad.tolist()
    (5.0, [-1.0, -3.0])
    """
    fp = FusedProblem(loss, X, y, prior, loss_params=loss_params, n_chunks=n_chunks)
    return fp.value_and_gradient(theta, t)


def fused_hvp(
    loss: str,
    X: Any,
    y: Any,
    theta: Any,
    v: Any,
    t: float,
    prior: Any = None,
    *,
    loss_params: dict | None = None,
    n_chunks: int | None = None,
) -> np.ndarray | None:
    """Hessian-vector product of the tilted risk at ``theta`` along ``v`` (one pass).

    ``H v = X^T (w (l'' u + t l' a)) - t g (sum_i w_i a_i)`` with ``u = X v``,
    ``a = l' u`` and ``g`` the gradient (the multinomial loss applies its per-sample
    ``K x K`` Hessian in the predictor instead of ``l''``). Other parameters as in
    :func:`fused_value_and_gradient`; ``v`` has ``theta``'s shape.

    Returns
    -------
    array of ``theta``'s shape in ``X``'s dtype, or None for non-finite losses.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels import fused_hvp
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> fused_hvp("squared", X, np.zeros(2), np.zeros(2), np.ones(2), t=0.0).tolist()
    [1.0, 1.0]
    """
    fp = FusedProblem(loss, X, y, prior, loss_params=loss_params, n_chunks=n_chunks)
    return fp.hvp(theta, v, t)


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
            lp.linear_hvp_multi(X, self.weights, self.d1, self.d2, self.t, V, gv, self.n_chunks, A)
        else:
            lp.linear_hvp_scalar(X, self.alpha, self.beta, V, gv, self.n_chunks, A)
        return np.sum(A, axis=0).astype(X.dtype)


def fused_linearize(
    loss: str,
    X: Any,
    y: Any,
    theta: Any,
    t: float,
    prior: Any = None,
    *,
    loss_params: dict | None = None,
    n_chunks: int | None = None,
) -> Linearization | None:
    """Value, gradient and the per-sample state of Hessian-vector products at ``theta``.

    One fused pass over ``X`` (as :func:`fused_value_and_gradient`) that also keeps the
    per-sample derivatives; the tilted weights follow from the merged state. Each
    :meth:`Linearization.hvp` then reads ``X`` once. Parameters as in
    :func:`fused_value_and_gradient`; None for non-finite losses.

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels import fused_linearize
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> lin = fused_linearize("squared", X, np.array([1.0, 3.0]), np.zeros(2), t=0.0)
    >>> float(lin.value), lin.weights.tolist()
    (5.0, [0.5, 0.5])
    """
    fp = FusedProblem(loss, X, y, prior, loss_params=loss_params, n_chunks=n_chunks)
    return fp.linearize(theta, t)


def _value(pb: _Problem) -> np.ndarray | None:
    state, _, _ = _run_vg(pb, False, False)
    merged = _merge(state, pb.t)
    if merged is None:
        return None
    return np.asarray(merged.value, dtype=pb.X.dtype)


def _value_and_gradient(pb: _Problem) -> tuple[np.ndarray, np.ndarray] | None:
    state, G, _ = _run_vg(pb, True, False)
    merged = _merge(state, pb.t)
    if merged is None:
        return None
    g = _combine(merged.r, G, merged.s)
    return np.asarray(merged.value, dtype=pb.X.dtype), g.astype(pb.X.dtype)


# ---------------------------------------------------------------------------------------
# Hessian-vector products


def _hvp(pb: _Problem, v: Any) -> np.ndarray | None:
    V = _direction(v, pb)
    lp = _kernels()
    shape = (pb.n_chunks,) + pb.theta.shape
    state = np.zeros((pb.n_chunks, lp.STATE_COLS))
    A = np.zeros(shape)
    G = np.zeros(shape)
    if pb.loss == "multinomial":
        lp.hvp_multi(pb.X, pb.y, pb.p, pb.theta, V, pb.t, pb.n_chunks, state, A, G)
    else:
        lp.hvp_scalar(
            pb.X, pb.y, pb.p, pb.theta, V, pb.t, pb.code, pb.param, pb.n_chunks, state, A, G
        )
    merged = _merge(state, pb.t)
    if merged is None:
        return None
    out = _combine(merged.r, A, merged.s)
    if pb.t != 0.0:
        out = out - pb.t * merged.av * _combine(merged.r, G, merged.s)
    return out.astype(pb.X.dtype)


def _linearize(pb: _Problem) -> Linearization | None:
    state, G, out = _run_vg(pb, True, True)
    merged = _merge(state, pb.t)
    if merged is None:
        return None
    g = _combine(merged.r, G, merged.s).astype(pb.X.dtype)
    ell = out[0] if pb.loss == "multinomial" else out[:, 0]
    p = np.ones(ell.shape[0]) if pb.p.shape[0] == 0 else pb.p
    on = p > 0
    w = np.where(on, p * np.exp(pb.t * np.where(on, ell - merged.shift, 0.0)), 0.0) / merged.s
    if pb.loss == "multinomial":
        S = out[1]
        d1 = S.copy()
        rows = np.arange(ell.shape[0])
        labels = pb.y.astype(np.int64)
        d1[rows, labels] = 0.0
        d1[rows, labels] = -np.sum(d1, axis=1)  # minus the other classes' mass
        d2 = S
        alpha = beta = None
    else:
        d1, d2 = out[:, 1], out[:, 2]
        alpha = w * (d2 + pb.t * d1 * d1)
        beta = pb.t * w * d1
    value = np.asarray(merged.value, dtype=pb.X.dtype)
    return Linearization(value, g, w, d1, d2, pb.t, pb.X, pb.n_chunks, alpha, beta)
