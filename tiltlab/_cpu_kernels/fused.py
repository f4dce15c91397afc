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
rows at a time (:mod:`.block_steps`): dot products, then the loss, the weights and the state
for the whole block in vectorised loops (``exp``, ``expm1`` and ``log1p`` written so that
LLVM vectorises them, :mod:`._vmath`, and their float32 versions for float32 data,
:mod:`._vmath32`: numba has no SIMD math library here), then the updates while the block
is still in cache. The ridge term is not included (the objective
adds it).

Entry points
------------
:func:`fused_value`, :func:`fused_value_and_gradient`, :func:`fused_hvp` and
:func:`fused_linearize` (whose :meth:`Linearization.hvp` then costs one fused pass per
product) take NumPy arrays (``X`` float32 or float64) and return NumPy results in ``X``'s
dtype; :class:`FusedProblem` binds the data once. :func:`available` says whether the kernels
may be used (:mod:`._launch`) and :func:`use_fused` is the size policy. Numba compiles each
kernel on its first call (about 10 s of CPU time per kernel and dtype) into a per-user cache
(:mod:`._cache`), from which a new process loads it in a fraction of a second; the
objective's engine has missing kernels compiled in the background (:mod:`.warmup`).

Determinism
-----------
Rows are split into ``n_chunks`` contiguous chunks that depend on the number of rows
only (never on the number of threads; threads take contiguous ranges of chunks), and chunk
states are merged in a fixed order, so results are identical bit for bit for any number of
threads. Against the generic
path they agree to rounding: about ``1e-13`` relative in float64 and ``1e-5`` in float32
(for float32 data the scalar-loss kernels compute the losses, their derivatives and the
tilted weights in float32 arithmetic, with vectorised float32 ``exp``/``log1p`` accurate
to 2 units in the last place; the tilted state and every long vector sum are float64).

Losses: the scalar losses of the table ``tiltlab/losses/table.py``, whose block loops are
generated into :mod:`._losses` (squared, absolute, Huber with ``loss_params={"delta":
...}``, logistic, hinge, squared hinge with labels 0/1, Poisson with labels >= 0, pinball
with ``loss_params={"quantile": ...}``), and the multinomial loss (``theta`` of shape
``(d, K)``, integer labels in ``[0, K)``). Infinite tilts are not served (callers use the
generic path).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import warmup
from ._launch import (
    SWITCH,
    KernelsUnavailable,
    _call,
    _kernels,
    available,
    switched_off,
    threads,
)
from ._linear import Linearization
from ._prepare import (
    CHUNK_ROWS,
    LOSS_CODES,
    MAX_CHUNKS,
    _at,
    _bind,
    _direction,
    _Problem,
    default_chunks,
)
from ._states import KernelStates, run_groups, states_of

__all__ = [
    "CHUNK_ROWS",
    "LOSS_CODES",
    "MAX_CHUNKS",
    "SWITCH",
    "FusedProblem",
    "KernelStates",
    "KernelsUnavailable",
    "Linearization",
    "available",
    "default_chunks",
    "fused_hvp",
    "fused_linearize",
    "fused_value",
    "fused_value_and_gradient",
    "switched_off",
    "threads",
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
        _call(
            lp.vg_multi,
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
            chunks=pb.n_chunks,
        )
        out = (out_l, out_s)
    else:
        G = np.zeros((pb.n_chunks, d if want_grad else 1))
        out = np.zeros((n, 3) if per_sample else (1, 3))
        _call(
            lp.vg_scalar,
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
            chunks=pb.n_chunks,
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

    def kernel(self, method: str) -> str:
        """The kernel that evaluates ``method`` (``"value"``, ``"value_and_gradient"``,
        ``"gradient"``, ``"hvp"`` or ``"group_states"``), named as in :func:`.warmup.key`.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab._cpu_kernels import FusedProblem
        >>> FusedProblem("squared", np.eye(2), np.array([1.0, 3.0])).kernel("hvp")
        'hvp_scalar-float64'
        """
        family = {"hvp": "hvp", "group_states": "group"}.get(method, "vg")
        kind = "multi" if self.loss == "multinomial" else "scalar"
        return warmup.key(f"{family}_{kind}", self.X)

    def prepared(self, method: str) -> bool:
        """Whether ``method`` can run without compiling a kernel in this process first.

        False when its kernel is neither compiled nor cached and the compiled-kernel mode
        (``TILTLAB_FUSED``) is the default: a background process then compiles it into the
        cache (see :mod:`.warmup`) and the caller takes another path meanwhile. True in the
        ``wait`` mode (the first call compiles) and where no process can be started.
        """
        name = self.kernel(method)
        if warmup.mode() != "background" or warmup.ready(name):
            return True
        return not warmup.start(name)

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

    def block_states(
        self, theta: Any, t: float, *, gradient: bool = False, hvp_vector: Any = None
    ) -> KernelStates | None:
        """The mergeable tilted state of each row chunk, from one fused pass.

        What :meth:`value`, :meth:`value_and_gradient` and :meth:`hvp` merge and finish,
        left unmerged (one entry per row chunk, :attr:`n_chunks` of them), so that a
        caller can merge them with states of other data by the rule of
        :mod:`tiltlab.accumulator` (a Dask chunk, for instance).

        Parameters
        ----------
        theta : array_like
            The parameters (as for :meth:`value`).
        t : float
            Finite tilt.
        gradient : bool, default False
            Also the per-chunk gradient sums.
        hvp_vector : array_like, optional
            A direction ``v`` of ``theta``'s shape: the per-chunk sums of a
            Hessian-vector product along it instead (see :class:`KernelStates`).

        Returns
        -------
        KernelStates or None
            None when a loss on the prior's support is not finite.
        """
        at = self._at(theta, t)
        if hvp_vector is not None:
            state, A, G = _run_hvp(at, _direction(hvp_vector, at))
            return states_of(state, at.t, (A, G, np.array(state[:, 8])))
        state, G, _ = _run_vg(at, bool(gradient), False)
        return states_of(state, at.t, (G,) if gradient else ())

    def group_states(
        self,
        theta: Any,
        t: float,
        codes: Any,
        n_groups: int,
        *,
        gradient: bool = False,
        hvp_vector: Any = None,
    ) -> KernelStates | None:
        """The mergeable tilted state of each group of a partition of the rows, from one
        fused pass.

        As :meth:`block_states`, with one entry per group: ``codes[i]`` in
        ``[0, n_groups)`` is the group of row ``i``; a group without rows of positive
        prior weight is an empty entry. The vector sums are ``n_groups x d`` (one row of
        ``X`` added to its group's row; ``n_groups x d x K`` for the multinomial loss):
        meant for moderate numbers of groups. The rows are walked by one thread.

        Examples
        --------
        >>> import numpy as np
        >>> from tiltlab._cpu_kernels import FusedProblem
        >>> fp = FusedProblem("squared", np.eye(3), np.array([1.0, 3.0, 2.0]))
        >>> st = fp.group_states(np.zeros(3), 0.0, np.array([0, 1, 0]), 2, gradient=True)
        >>> (st.lsum / st.mass + st.shift).tolist()  # the group means of the losses
        [2.5, 9.0]
        >>> st.sums[0].tolist()
        [[-2.0, 0.0, -4.0], [0.0, -6.0, 0.0]]
        >>> fm = FusedProblem("multinomial", np.eye(3), np.array([0, 1, 0]))
        >>> fm.group_states(np.zeros((3, 2)), 0.5, [0, 1, 0], 2, gradient=True).sums[0].shape
        (2, 3, 2)
        """
        at = self._at(theta, t)
        V = None if hvp_vector is None else _direction(hvp_vector, at)
        return run_groups(at, codes, n_groups, bool(gradient), V)


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
        ``{"delta": ...}`` for the Huber loss, ``{"quantile": ...}`` for the pinball loss.
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


def _merged(pb: _Problem, state: np.ndarray, sums: tuple = ()) -> Any:
    """The chunk states of a pass merged by the rule of :mod:`tiltlab.accumulator`
    (:meth:`KernelStates.merged`); None when a loss on the support is not finite."""
    states = states_of(state, pb.t, sums)
    return None if states is None else states.merged()


def _value(pb: _Problem) -> np.ndarray | None:
    state, _, _ = _run_vg(pb, False, False)
    merged = _merged(pb, state)
    if merged is None:
        return None
    return np.asarray(merged.risk(np, np.float64), dtype=pb.X.dtype)


def _value_and_gradient(pb: _Problem) -> tuple[np.ndarray, np.ndarray] | None:
    state, G, _ = _run_vg(pb, True, False)
    merged = _merged(pb, state, (G,))
    if merged is None:
        return None
    (g,) = merged.normalized_sums()
    return np.asarray(merged.risk(np, np.float64), dtype=pb.X.dtype), g.astype(pb.X.dtype)


# ---------------------------------------------------------------------------------------
# Hessian-vector products


def _hvp(pb: _Problem, v: Any) -> np.ndarray | None:
    state, A, G = _run_hvp(pb, _direction(v, pb))
    merged = _merged(pb, state, (A, G, np.array(state[:, 8])))
    if merged is None:
        return None
    h, g, av = merged.normalized_sums()
    out = h - pb.t * av * g if pb.t != 0.0 else h
    return out.astype(pb.X.dtype)


def _run_hvp(pb: _Problem, V: np.ndarray) -> tuple:
    """Chunk states and the per-chunk sums ``A`` and ``G`` of a Hessian-vector product."""
    lp = _kernels()
    shape = (pb.n_chunks,) + pb.theta.shape
    state = np.zeros((pb.n_chunks, lp.STATE_COLS))
    A = np.zeros(shape)
    G = np.zeros(shape)
    if pb.loss == "multinomial":
        _call(
            lp.hvp_multi,
            pb.X,
            pb.y,
            pb.p,
            pb.theta,
            V,
            pb.t,
            pb.n_chunks,
            state,
            A,
            G,
            chunks=pb.n_chunks,
        )
    else:
        _call(
            lp.hvp_scalar,
            pb.X,
            pb.y,
            pb.p,
            pb.theta,
            V,
            pb.t,
            pb.code,
            pb.param,
            pb.n_chunks,
            state,
            A,
            G,
            chunks=pb.n_chunks,
        )
    return state, A, G


def _linearize(pb: _Problem) -> Linearization | None:
    state, G, out = _run_vg(pb, True, True)
    merged = _merged(pb, state, (G,))
    if merged is None:
        return None
    g = merged.normalized_sums()[0].astype(pb.X.dtype)
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
    value = np.asarray(merged.risk(np, np.float64), dtype=pb.X.dtype)
    return Linearization(value, g, w, d1, d2, pb.t, pb.X, pb.n_chunks, alpha, beta)
