"""The executable contract's harness: every engine, point by point, against 50 digits.

The meaning of the method is written once: each loss at one point in
:mod:`tiltlab.losses.pointwise` (value, first and second derivative in ``z``, label set,
parameters), and the tilted state with its empty element, merge and finish in
:class:`tiltlab.accumulator.TiltState`. Every execution target is an *engine* here, one
entry in a table, checked against 50-digit :mod:`mpmath` references of that contract
(independent of any engine's code) with tolerances derived from the dtype.

Point entries (:data:`POINT_ENGINES`; the array-API classes are checked on every backend
of the ``xp`` fixture by :func:`array_api_point`)::

    point(loss_name: str, z: ndarray, y: ndarray, dtype, params: dict) -> (value, d1, d2)

``z`` has shape ``(N,)`` (``(N, K)`` for the multinomial loss) and is already in
``dtype`` (float32 or float64); ``y`` holds ``N`` labels of the loss's label set (in
``dtype``; int64 class labels for the multinomial loss); ``params`` the loss's parameters
(Huber's ``delta``). The entry returns NumPy arrays (or anything ``np.asarray`` takes):
``value`` of shape ``(N,)``, ``d1`` of ``z``'s shape, ``d2`` of ``z``'s shape for the
scalar losses and ``(N, K, K)`` for the multinomial loss, or None where the engine does
not form second derivatives. It raises ``NotImplementedError`` for a loss the engine
refuses, and its ``supported()`` returns the engine's declared table (the names it
serves): the tests check that every registered loss is either in that table and agrees
point by point, or refused by ``point``. The CUDA kernels' scalar loss functions
(``tiltlab/_cupy/tilt.cuh``, written once in C for the host and NVRTC) are checked
through their host build (entry ``"cuda (tilt.cuh, host C)"``).

State entries (:data:`STATE_ENGINES`)::

    merged(blocks: list[ndarray], t: float, dtype) -> (risk: float, weights: ndarray | None)

The engine summarises each block of losses (uniform prior; a block may be empty: an
unused lane, chunk or batch) in its own state, merges the states its own way and
finishes: the tilted risk of all the losses together and, where the engine gives them,
the normalised tilted weights of the concatenated losses. ``t`` is any float, 0 and
``+-inf`` included. A case the engine refuses raises ``NotImplementedError``; a known
divergence from the contract is declared by the entry's ``defect(blocks, t, dtype)``
(a reason string, or None), and the test then expects a failure (strict xfail).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from tiltlab.losses.pointwise import POINT_LOSSES

DPS = 50

# ---------------------------------------------------------------------------------------
# tolerances (from the dtype and the conditioning, not from one machine's bits)

#: units of the dtype's epsilon a point evaluation may be off, relative to the value
#: (the formulas are stable: a few roundings and one exp/log1p of 2 ulp)
POINT_ULPS = 8


def eps(dtype: Any) -> float:
    return float(np.finfo(dtype).eps)


def tiny(dtype: Any) -> float:
    return float(np.finfo(dtype).smallest_normal)


def point_errors(
    actual: Any, reference: list, dtype: Any, *, absolute: bool = False, scales: Any = None
) -> list:
    """The entries where ``actual`` is off its reference by more than ``POINT_ULPS`` ulps
    (relative, plus the smallest normal number: underflow is allowed), as readable tuples.
    ``absolute``: measure against 1 instead (a Hessian formed as a product); ``scales``:
    against these magnitudes instead (a sum of terms that cancel, :func:`term_scales`)."""
    a = np.asarray(actual, dtype=np.float64).reshape(-1)
    bad = []
    for i, (ai, ri) in enumerate(zip(a.tolist(), reference, strict=True)):
        scale = 1 if absolute else abs(ri)
        if scales is not None:
            scale = max(scale, scales[i])
        err = abs(mpmath.mpf(ai) - ri)
        if not err <= POINT_ULPS * eps(dtype) * scale + tiny(dtype):
            bad.append((i, ai, float(ri)))
    return bad


def state_tolerance(blocks: list, t: float, dtype: Any) -> float:
    """Absolute tolerance of a merged risk: the risk lies in ``[min, max]`` and moves at
    most as much as the largest loss's rounding; each block and each merge adds a few."""
    n_blocks = sum(1 for b in blocks if len(b))
    scale = max(abs(float(v)) for b in blocks for v in b)
    return (16 + 4 * n_blocks) * eps(dtype) * max(scale, tiny(dtype))


# ---------------------------------------------------------------------------------------
# the points each loss is checked at (kinks, large predictors, ties, underflow)

REAL_Z = [-1e4, -3.0, -1.0, -0.3, 0.0, 0.25, 1.0, 1.5, 2.0, 7.0, 1e3]
REAL_Y = [-2.0, 0.0, 0.5, 1.0, 7.0]
BINARY_Z = [
    -800.0,
    -100.0,
    -40.0,
    -3.0,
    -1.0,
    -1e-8,
    0.0,
    1e-8,
    0.3,
    0.5,
    1.0,
    2.0,
    3.0,
    40.0,
    100.0,
    800.0,
]
CLASS_Z = [
    [0.0, 0.0, 0.0],
    [1.0, 2.0, 3.0],
    [3.0, 2.0, 1.0],
    [1e4, -1e4, 0.0],
    [-5.0, 40.0, 40.0],
    [0.3, -0.7, 2.0],
    [-800.0, 0.0, 800.0],
    [40.0, 0.0, 0.0],
]
#: predictors and labels of the Poisson loss (labels >= 0; exp(z) finite in float32)
COUNT_Z = [-30.0, -3.0, -1.0, -0.3, 0.0, 0.25, 1.0, 1.5, 2.0, 7.0, 30.0]
COUNT_Y = [0.0, 0.5, 1.0, 7.0, 100.0]
#: parameter sets each loss is checked with (the defaults first)
PARAMS: dict[str, list[dict]] = {
    "huber": [{}, {"delta": 2.5}],
    "pinball": [{}, {"quantile": 0.1}, {"quantile": 0.9}],
}


def term_scales(name: str, z: np.ndarray, y: np.ndarray) -> tuple:
    """For a loss whose value (or first derivative) is a sum of terms that cancel near its
    minimum, the magnitudes its rounding errors scale with at each point; ``(None,
    None)`` for the others (relative errors).

    Poisson: the value ``exp(z) - y - y z + y log y`` is a sum of terms of these sizes,
    and it is evaluated through ``w = z - log y``, whose rounding (``|log y| + |w|`` ulps
    absolute) moves the value by ``|dl/dw| = |exp(z) - y|`` times as much."""
    if name != "poisson":
        return None, None
    with mpmath.workdps(DPS):
        vs, ds = [], []
        for zi, yi in zip(z.tolist(), y.tolist(), strict=True):
            ez, yy = mpmath.exp(zi), mpmath.mpf(yi)
            ly = abs(mpmath.log(yy)) if yi > 0 else 0
            spread = (ez + yy) * (1 + ly + abs(zi - (mpmath.log(yy) if yi > 0 else 0)))
            vs.append(ez + yy + abs(yy * zi) + yy * ly + spread)
            ds.append(spread)
    return vs, ds


def points(name: str, dtype: Any, params: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(z, y)`` for the loss ``name``, cast to ``dtype`` (class labels: int64)."""
    kind = POINT_LOSSES[name].labels
    if kind == "nonnegative":
        zs, ys = [], []
        for y in COUNT_Y:
            at = math.log(y) if y > 0 else 0.0
            for z in COUNT_Z + [at, at + 0.5, at - 0.5, at + 1e-3]:  # near a perfect fit
                zs.append(z)
                ys.append(y)
        return np.asarray(zs, dtype=dtype), np.asarray(ys, dtype=dtype)
    if kind == "real":
        zs, ys = [], []
        delta = params.get("delta", POINT_LOSSES[name].params.get("delta", 1.0))
        for y in REAL_Y:
            for z in REAL_Z + [y, y + delta, y - delta, y + 1.0, y - 1.0]:  # kinks
                zs.append(z)
                ys.append(y)
        return np.asarray(zs, dtype=dtype), np.asarray(ys, dtype=dtype)
    if kind == "binary":
        zs = BINARY_Z * 2
        ys = [0.0] * len(BINARY_Z) + [1.0] * len(BINARY_Z)
        return np.asarray(zs, dtype=dtype), np.asarray(ys, dtype=dtype)
    K = len(CLASS_Z[0])
    rows = [r for r in CLASS_Z for _ in range(K)]
    labels = [k for _ in CLASS_Z for k in range(K)]
    return np.asarray(rows, dtype=dtype), np.asarray(labels, dtype=np.int64)


def reference_points(name: str, z: np.ndarray, y: np.ndarray, params: dict) -> tuple:
    """The contract at every point, in 50 digits, at the points as given (exactly).

    Returns ``(values, d1, d2)`` as flat lists of mpmath numbers (row-major)."""
    vals, d1s, d2s = [], [], []
    vector = POINT_LOSSES[name].vector
    with mpmath.workdps(DPS):
        for zi, yi in zip(z.tolist(), y.tolist(), strict=True):
            v, g, h = _point(name, zi, yi, params)
            vals.append(v)
            if vector:
                d1s.extend(g)
                d2s.extend(x for row in h for x in row)
            else:
                d1s.append(g)
                d2s.append(h)
    return vals, d1s, d2s


def _point(name, z, y, params):
    from tiltlab.losses.pointwise import point

    return point(name, z, y, m=mpmath, **params)


# ---------------------------------------------------------------------------------------
# point entries


@dataclass(frozen=True)
class PointEngine:
    """One engine's losses: its declared table and its point evaluation."""

    #: modules the engine needs (the test is skipped without them)
    needs: tuple[str, ...]
    #: the names the engine serves (its declared table)
    supported: Callable[[], frozenset]
    #: ``point(loss_name, z, y, dtype, params) -> (value, d1, d2)``
    point: Callable[..., tuple]


def array_api_point(xp: Any) -> PointEngine:
    """The array-API loss classes (:mod:`tiltlab.losses`) on the namespace ``xp``; the
    multinomial Hessian is formed column by column with ``hvp_z``."""
    from tiltlab._compat import to_numpy
    from tiltlab.losses import LOSS_NAMES, get_loss

    def point(name, z, y, dtype, params):
        loss = get_loss(name, **params)
        zz, yy = xp.asarray(z), xp.asarray(y)
        v, d1, d2 = loss.derivatives(zz, yy)
        for a in (v, d1) + (() if d2 is None else (d2,)):
            assert str(a.dtype).endswith(np.dtype(dtype).name), (a.dtype, dtype)
        if d2 is None:  # the K x K Hessian of each row, one column per direction
            K = z.shape[1]
            cols = []
            for k in range(K):
                u = np.zeros_like(z)
                u[:, k] = 1
                cols.append(np.asarray(to_numpy(loss.hvp_z(zz, yy, xp.asarray(u)))))
            d2 = np.stack(cols, axis=2)  # [n, i, k] = H_ik
        return np.asarray(to_numpy(v)), np.asarray(to_numpy(d1)), np.asarray(to_numpy(d2))

    return PointEngine(needs=(), supported=lambda: frozenset(LOSS_NAMES), point=point)


def loss_param(name: str, params: dict) -> float:
    """The one number the kernels take as the loss's parameter (0 for a loss without)."""
    defaults = POINT_LOSSES[name].params
    return float(next((params.get(k, v) for k, v in defaults.items()), 0.0))


def _numba_supported() -> frozenset:
    from tiltlab._cpu_kernels import LOSS_CODES

    return frozenset(LOSS_CODES)


def _numba_point(name, z, y, dtype, params):
    """The compiled CPU kernels' loss code, called directly: ``loss_block`` (the block step
    of the scalar losses, in the data's dtype) and ``_softmax_row`` (multinomial, float64)."""
    from tiltlab._cpu_kernels import LOSS_CODES

    if name not in LOSS_CODES:
        raise NotImplementedError(f"the compiled CPU kernels do not serve the {name} loss")
    n = z.shape[0]
    if POINT_LOSSES[name].vector:
        from tiltlab._cpu_kernels._rows import _softmax_row

        K = z.shape[1]
        v, d1 = np.empty(n), np.empty((n, K))
        s = np.empty(K)
        for i in range(n):
            v[i], others = _softmax_row(np.asarray(z[i], dtype=np.float64), int(y[i]), s)
            d1[i] = s
            d1[i, int(y[i])] = -others  # the kernels' gradient coefficient of the true class
        return v, d1, None
    from tiltlab._cpu_kernels._losses import loss_block

    out = [np.empty(n, dtype=dtype) for _ in range(3)]
    zz, yy = np.ascontiguousarray(z, dtype=dtype), np.ascontiguousarray(y, dtype=dtype)
    loss_block(LOSS_CODES[name], zz, yy, 0, n, loss_param(name, params), *out)
    return tuple(out)


def _cuda_supported() -> frozenset:
    """The CUDA engine's table: the losses with a ``tl_loss_<name>`` function in
    ``tiltlab/_cupy/tilt.cuh`` (the engine refuses every other loss)."""
    from tiltlab._cupy import source

    return frozenset(source.C_LOSSES)


def _cuda_point(name, z, y, dtype, params):
    """The CUDA kernels' loss functions (``tl_loss_<name>`` of ``tilt.cuh``), compiled for
    the host as C (the same source NVRTC compiles) and called through ctypes."""
    from cuda_host import host

    if name not in _cuda_supported():
        raise NotImplementedError(f"the CUDA engine has no C code for {name}")
    h = host(dtype)
    param = loss_param(name, params)
    out = [h.loss(name, float(a), float(b), param) for a, b in zip(z, y, strict=True)]
    out = np.array(out, dtype=dtype)
    return out[:, 0], out[:, 1], out[:, 2]


#: the engines whose losses are checked point by point (the array API runs per backend)
POINT_ENGINES: dict[str, PointEngine] = {
    "numba": PointEngine(needs=("numba",), supported=_numba_supported, point=_numba_point),
    "cuda (tilt.cuh, host C)": PointEngine(
        needs=("exe:cc",), supported=_cuda_supported, point=_cuda_point
    ),
}


def available(needs: tuple[str, ...]) -> str | None:
    """The first missing requirement of ``needs`` (None when all are there): module names,
    or ``"exe:NAME"`` for a program on the PATH (a compiler)."""
    import shutil

    def missing(req):
        if req.startswith("exe:"):
            return shutil.which(req[4:]) is None
        return importlib.util.find_spec(req) is None

    return next((m for m in needs if missing(m)), None)


# ---------------------------------------------------------------------------------------
# the tilted state: references and cases

CASES: dict[str, list[float]] = {
    "spread": [0.25, 3.5, 1.0, 7.75, 2.0, 0.5, 7.75, 4.0, 0.25, 1.5, 6.0, 3.0],
    "all equal": [2.5] * 9,
    "spread 1e6": [0.0, 1e6, 0.5, 3e5, 1e6, 7.0, 2e5, 0.25, 9e5, 1.0],
    "both signs": [-40.0, 3.5, -2.0, 12.0, -40.0, 0.75, 9.0, 12.0],
}
TILTS = [0.0, math.inf, -math.inf, 1e-300, -1e-300, 1e-12, -1e-12, 1e8, -1e8, 2.5, -3.0]


def splits(n: int) -> dict[str, list[int]]:
    """Block sizes: one block, empty blocks among others (unused lanes or chunks), uneven
    blocks and blocks of one sample."""
    return {
        "one block": [n],
        "with empty": [0, 3, 0, n - 5, 2, 0],
        "uneven": [1, 2, n - 6, 3],
        "ones": [1] * n,
    }


def blocks_of(losses: list[float], sizes: list[int], dtype: Any) -> list[np.ndarray]:
    out, i = [], 0
    for k in sizes:
        out.append(np.asarray(losses[i : i + k], dtype=dtype))
        i += k
    return out


def reference_state(losses: list[float], t: float) -> tuple[Any, list]:
    """Tilted risk and weights of ``losses`` (uniform prior) in 50 digits: the mean at
    ``t = 0``, the extreme (weights uniform over its ties) at ``+-inf``, and otherwise
    ``c + log1p(mean(expm1(t (l - c)))) / t`` with ``c`` the extreme (no cancellation at
    any tilt, 1e-300 included)."""
    with mpmath.workdps(DPS):
        l = [mpmath.mpf(float(v)) for v in losses]
        n = len(l)
        if t == 0:
            return mpmath.fsum(l) / n, [mpmath.mpf(1) / n] * n
        c = max(l) if t > 0 else min(l)
        if math.isinf(t):
            ties = sum(1 for v in l if v == c)
            return c, [mpmath.mpf(1) / ties if v == c else mpmath.mpf(0) for v in l]
        tt = mpmath.mpf(t)
        u = [tt * (v - c) for v in l]
        risk = c + mpmath.log1p(mpmath.fsum(mpmath.expm1(x) for x in u) / n) / tt
        e = [mpmath.exp(x) for x in u]
        total = mpmath.fsum(e)
        return risk, [x / total for x in e]


def weight_errors(weights: Any, losses: list[float], t: float, ref: list, dtype: Any) -> list:
    """Weights off their reference by more than the conditioning allows: the exponent
    ``t (l - c)`` carries a rounding of ``eps |t (l - c)|``."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1).tolist()
    bad = []
    c = (max if t > 0 else min)(losses) if t != 0 else 0.0
    for i, (wi, ri) in enumerate(zip(w, ref, strict=True)):
        cond = 1.0 if t == 0 or math.isinf(t) else 1.0 + abs(t * (losses[i] - c))
        if not abs(mpmath.mpf(wi) - ri) <= 32 * eps(dtype) * cond * abs(ri) + tiny(dtype):
            bad.append((i, wi, float(ri)))
    return bad


# ---------------------------------------------------------------------------------------
# state entries


@dataclass(frozen=True)
class StateEngine:
    """One engine's tilted state: build per block, merge its own way, finish."""

    needs: tuple[str, ...]
    #: ``merged(blocks, t, dtype) -> (risk, weights or None)``
    merged: Callable[..., tuple]
    #: ``defect(blocks, t, dtype) -> reason or None``: a known divergence (strict xfail)
    defect: Callable[..., str | None] = lambda blocks, t, dtype: None


def _accumulator_merged(blocks, t, dtype):
    """:class:`~tiltlab.accumulator.TiltState`: one state per block (the empty state for an
    empty block), merged left to right; the weights as a sum of per-sample vectors."""
    from tiltlab.accumulator import TiltState

    n = sum(len(b) for b in blocks)
    states, at = [], 0
    for b in blocks:
        if len(b) == 0:
            states.append(TiltState.empty(t, dtype=dtype))
            continue

        def sums(pe, at=at):
            out = np.zeros(n, dtype=dtype)
            out[at : at + pe.shape[0]] = pe
            return (out,)

        states.append(TiltState.from_block(b, t, sums=sums))
        at += len(b)
    st = states[0]
    for other in states[1:]:
        st = st.merge(other)
    return float(st.risk()), st.normalized_sums()[0]


def _running_defect(blocks, t, dtype):
    """The running estimators keep the last batch's extreme at ``t = +-inf`` (documented),
    where the merge of the states (the limit of their own update as ``t -> +-inf``) is the
    extreme of all batches."""
    nonempty = [b for b in blocks if len(b)]
    if not math.isinf(t) or len(nonempty) < 2:
        return None
    pick = max if t > 0 else min
    gap = abs(pick(nonempty[-1].tolist()) - pick(np.concatenate(nonempty).tolist()))
    if gap <= state_tolerance(blocks, t, dtype):
        return None
    return (
        "the running update keeps the last batch's risk at t = +-inf instead of the "
        "extreme of the running and the batch risk (its limit for t -> +-inf)"
    )


def _minibatch_merged(blocks, t, dtype):
    """:class:`~tiltlab.minibatch.MinibatchTilt` (running estimator): a batch per block,
    each merged into the running risk with ``lam = |B| / (samples so far)``, which makes
    its log-domain update the merge of two tilted states; the risk is read from its state.
    Empty batches are refused by its validation (tested apart)."""
    from tiltlab.minibatch import MinibatchTilt

    tilt = MinibatchTilt(t, lam=1.0)
    seen, weights, nonempty = 0, None, [b for b in blocks if len(b)]
    for b in nonempty:
        seen += len(b)
        tilt.lam = len(b) / seen
        weights = tilt.weights(b)
    risk = float(np.asarray(tilt.state_dict()["risk"])[0])
    return risk, (weights if len(nonempty) == 1 else None)


def _torch_merged(blocks, t, dtype):
    """:class:`tiltlab.torch.TiltedLoss` (running estimator) as :func:`_minibatch_merged`;
    the weights are the gradient of its output in the losses. The module is converted to
    the losses' dtype (``loss_fn.to(torch.float64)``), as a float64 model would be."""
    import torch

    from tiltlab.torch import TiltedLoss

    loss_fn = TiltedLoss(t=t, lam=1.0).to(getattr(torch, np.dtype(dtype).name))
    seen, weights, nonempty = 0, None, [b for b in blocks if len(b)]
    for b in nonempty:
        seen += len(b)
        loss_fn.lam = len(b) / seen
        l = torch.tensor(b, requires_grad=True)
        loss_fn(l).backward()
        weights = l.grad.numpy()
    risk = float(loss_fn.risk[0])
    return risk, (weights if len(nonempty) == 1 else None)


def _dask_merged(blocks, t, dtype):
    """Dask's chunk states (``tiltlab.distributed._states``): one per chunk (``EMPTY`` for
    an empty chunk), merged as its tree reduction does, finished on the client."""
    from tiltlab.distributed._states import chunk_loss_state, merge_states

    st = merge_states(*[chunk_loss_state(b, None, t) for b in blocks])
    return float(st.risk(np, np.dtype(dtype))), None


def _numba_chunks_merged(blocks, t, dtype):
    """The compiled CPU kernels' chunk states (``tiltlab._cpu_kernels``): one chunk per
    block, padded to a common length with rows of zero prior weight (unused lanes; an
    empty block is a chunk without mass), merged by the host merge of the chunk states.
    The losses are those of the absolute loss at ``z = l``, so they must be >= 0; the
    kernels serve finite tilts only (``t = +-inf`` goes to the generic path)."""
    from tiltlab._cpu_kernels import fused_value

    if math.isinf(t):
        raise NotImplementedError("the compiled kernels serve finite tilts")
    if any(float(v) < 0 for b in blocks for v in b):
        raise NotImplementedError("losses of a loss function are >= 0")
    rows = max(1, max(len(b) for b in blocks))
    n = rows * len(blocks)
    X = np.zeros((n, 1), dtype=dtype)
    prior = np.zeros(n)
    for k, b in enumerate(blocks):
        X[k * rows : k * rows + len(b), 0] = b
        prior[k * rows : k * rows + len(b)] = 1.0
    y = np.zeros(n, dtype=dtype)
    r = fused_value("absolute", X, y, np.ones(1, dtype=dtype), t, prior, n_chunks=len(blocks))
    return float(r), None


def _numba_groups_merged(blocks, t, dtype):
    """The compiled grouped kernel's per-group states (``FusedProblem.group_states``): one
    group per block, the rows of the blocks interleaved (round robin, so that every group's
    running state is updated between the others'), one pass; the group states are merged
    by the accumulator's exact merge (``GroupState.collapse``). Losses as for
    :func:`_numba_chunks_merged` (the absolute loss at ``z = l``, finite tilts)."""
    from tiltlab._cpu_kernels import FusedProblem
    from tiltlab.accumulator import GroupState

    if math.isinf(t):
        raise NotImplementedError("the compiled kernels serve finite tilts")
    if any(float(v) < 0 for b in blocks for v in b):
        raise NotImplementedError("losses of a loss function are >= 0")
    rows = [(k, v) for j in range(max(len(b) for b in blocks)) for k, b in enumerate(blocks)
            if j < len(b) for v in [b[j]]]  # fmt: skip
    X = np.array([[v] for _, v in rows], dtype=dtype).reshape(len(rows), 1)
    codes = np.array([k for k, _ in rows], dtype=np.int64)
    fp = FusedProblem("absolute", X, np.zeros(len(rows), dtype=dtype))
    st = fp.group_states(np.ones(1, dtype=dtype), t, codes, len(blocks))
    groups = GroupState(
        t=st.t, hi=st.hi, lo=st.lo, mass=st.mass, s=st.s, q=None if t == 0.0 else st.q,
        lsum=st.lsum, sums=(),
    )  # fmt: skip
    return float(groups.collapse().risk(np, np.dtype(dtype))), None


def _cuda_reductions_merged(blocks, t, dtype):
    """The CuPy ``tilted_risk`` and ``tilted_weights`` (``tiltlab/_cupy/reductions.py``),
    their kernels run in the CPU emulation of CUDA (``tests/cuda_emu.h``) behind the
    recording stand-in for CuPy: the losses of all blocks in one device array, which the
    kernels split among their own blocks and threads (most threads unused at these
    sizes: their states empty)."""
    import sys

    from cuda_fake import FakeArray, Recorder, fake_cupy
    from cuda_host import run_emulated

    from tiltlab._cupy import reductions, source

    if t == 0.0 or math.isinf(t):
        raise NotImplementedError("the CuPy reductions serve finite non-zero tilts")
    losses = np.concatenate([np.asarray(b, dtype=dtype) for b in blocks])
    rec = Recorder()
    saved = sys.modules.get("cupy"), source._MODULES
    sys.modules["cupy"] = fake_cupy(rec, run=run_emulated, sms=1)
    source._MODULES = {}
    try:
        risk = reductions.tilted_risk(FakeArray(losses, rec), t)
        weights = reductions.tilted_weights(FakeArray(losses, rec), t)
    finally:
        if saved[0] is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved[0]
        source._MODULES = saved[1]
    return float(risk._a), np.asarray(weights._a, dtype=np.float64)


def _packed_merged(blocks, t, dtype, library="numpy"):
    """:mod:`tiltlab.accumulator.packed`: the packed state of each block (an empty block
    included), merged in one call on NumPy with a Python tilt, or on PyTorch with a 0-d
    tensor tilt (the compiled form: no branch on the tilt) as a balanced tree of pairwise
    merges; the risk from :func:`~tiltlab.accumulator.packed.finish`."""
    from tiltlab.accumulator import packed

    if library == "numpy":
        xp, tilt = np, t
        arrays = [np.asarray(b, dtype=dtype) for b in blocks]
        states = [packed.block(b, None, tilt, xp) for b in arrays]
        st = packed.merge(xp.stack(states), tilt, xp)
        return float(packed.finish(st, tilt, xp)[0][0]), None
    import torch

    from tiltlab._compat import library_namespace

    xp = library_namespace(torch.empty(0))
    tdtype = getattr(torch, np.dtype(dtype).name)
    tilt = torch.tensor(t, dtype=tdtype)
    states = [packed.block(torch.tensor(b, dtype=tdtype), None, tilt, xp) for b in blocks]
    while len(states) > 1:
        pairs = [xp.stack(states[i : i + 2]) for i in range(0, len(states) - 1, 2)]
        nxt = [packed.merge(p, tilt, xp) for p in pairs]
        states = nxt + ([states[-1]] if len(states) % 2 else [])
    return float(packed.finish(states[0], tilt, xp)[0][0]), None


#: the engines whose tilted state is checked against the contract
STATE_ENGINES: dict[str, StateEngine] = {
    "accumulator": StateEngine(needs=(), merged=_accumulator_merged),
    "packed": StateEngine(needs=(), merged=_packed_merged),
    "packed torch": StateEngine(
        needs=("torch",), merged=lambda b, t, d: _packed_merged(b, t, d, "torch")
    ),
    "minibatch": StateEngine(needs=(), merged=_minibatch_merged, defect=_running_defect),
    "torch": StateEngine(needs=("torch",), merged=_torch_merged, defect=_running_defect),
    "dask chunks": StateEngine(needs=("dask",), merged=_dask_merged),
    "numba chunks": StateEngine(needs=("numba",), merged=_numba_chunks_merged),
    "numba groups": StateEngine(needs=("numba",), merged=_numba_groups_merged),
    "cuda reductions (emulated)": StateEngine(needs=("exe:g++",), merged=_cuda_reductions_merged),
}
