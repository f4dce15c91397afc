"""The executable contract's harness: every engine, point by point, against 50 digits.

The meaning of the method is written once: each loss at one point in
:mod:`tiltlab.losses.pointwise` (value, first and second derivative in ``z``, label set,
parameters; here defined again from the textbook formulas, :func:`reference_loss`, so
that the references do not come from the table every engine's code is generated from),
and the tilted state with its empty element, merge and finish in
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
    return reference_loss(name, z, y, **params)


def reference_loss(name: str, z: Any, y: Any, **params: Any) -> tuple:
    """``(value, d1, d2)`` of the loss ``name`` at one point, at the working precision of
    :mod:`mpmath`, from the definitions as first written down (no stabilisation: extra
    digits absorb their cancellations, e.g. ``1 - s(800)``), with derivatives written by
    hand, independent of the loss table and of every code generated from it. At a kink the
    derivatives take the documented side: ``d1 = 0`` where the absolute, pinball, hinge
    and squared hinge losses have one, Huber's quadratic branch at ``|z - y| = delta``.
    ``z``: a number (a list of ``K`` for the multinomial loss, ``y`` its class)."""
    vector = isinstance(z, (list, tuple))
    top = max(abs(float(v)) for v in (z if vector else [z]))
    with mpmath.extradps(30 + int(top / 2.3)):
        out = _definition(name, z, y, **params)
    if vector:
        return +out[0], [+v for v in out[1]], [[+v for v in row] for row in out[2]]
    return tuple(+v for v in out)


def _definition(name, z, y, delta=1.0, quantile=0.5):
    if name == "multinomial":
        zs = [mpmath.mpf(v) for v in z]
        total = mpmath.fsum(mpmath.exp(v) for v in zs)
        s = [mpmath.exp(v) / total for v in zs]
        K = len(zs)
        d1 = [s[k] - (1 if k == y else 0) for k in range(K)]
        d2 = [[(s[i] if i == j else 0) - s[i] * s[j] for j in range(K)] for i in range(K)]
        return -mpmath.log(s[int(y)]), d1, d2
    z, y = mpmath.mpf(z), mpmath.mpf(y)
    zero = mpmath.mpf(0)
    if name == "squared":
        return (z - y) ** 2, 2 * (z - y), mpmath.mpf(2)
    if name == "absolute":
        return abs(z - y), mpmath.sign(z - y), zero
    if name == "huber":
        r, d = z - y, mpmath.mpf(delta)
        if abs(r) <= d:
            return r * r / 2, r, mpmath.mpf(1)
        return d * (abs(r) - d / 2), d * mpmath.sign(r), zero
    if name == "logistic":
        s = 1 / (1 + mpmath.exp(-z))
        return -y * mpmath.log(s) - (1 - y) * mpmath.log(1 - s), s - y, s * (1 - s)
    if name in ("hinge", "squared_hinge"):
        m = 2 * y - 1  # the label as -1 or +1
        h = 1 - m * z
        if h <= 0:
            return zero, zero, zero
        if name == "hinge":
            return h, -m, zero
        return h * h, -2 * m * h, 2 * m * m
    if name == "poisson":  # the half deviance, y log y = 0 at y = 0
        ez = mpmath.exp(z)
        value = ez - y - y * (z - mpmath.log(y)) if y > 0 else ez
        return value, ez - y, ez
    if name == "pinball":
        q = mpmath.mpf(quantile)  # the float exactly (q - 1 in floats would round)
        r = y - z
        d1 = -q if r > 0 else (1 - q) if r < 0 else zero
        return max(q * r, (q - 1) * r), d1, zero
    raise NotImplementedError(f"no 50-digit definition of the {name} loss")


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


# ---------------------------------------------------------------------------------------
# the objective: value, gradient, Hessian-vector product and weights, with a prior and a
# tilt tree (50 digits, by recursion over the tree; independent of every engine)


def reference_tilted(values: list, t: float, prior: list | None = None) -> tuple[Any, list]:
    """Tilted risk and normalised weights of 50-digit ``values`` under ``prior`` (uniform
    when None; entries of zero mass take no weight): the prior mean at ``t = 0``, the
    extreme over the support (prior mass over its ties as weights) at ``+-inf``, and
    otherwise ``c + log1p(sum p expm1(t (l - c)) / sum p) / t`` with ``c`` the extreme."""
    with mpmath.workdps(max(DPS, mpmath.mp.dps)):
        l = [mpmath.mpf(v) for v in values]
        p = [mpmath.mpf(1)] * len(l) if prior is None else [mpmath.mpf(v) for v in prior]
        mass = mpmath.fsum(p)
        support = [v for v, q in zip(l, p, strict=True) if q > 0]
        if t == 0:
            return mpmath.fsum(q * v for v, q in zip(l, p, strict=True)) / mass, [
                q / mass for q in p
            ]
        c = max(support) if t > 0 else min(support)
        if math.isinf(t):
            tied = mpmath.fsum(q for v, q in zip(l, p, strict=True) if v == c and q > 0)
            return c, [q / tied if v == c and q > 0 else mpmath.mpf(0)
                       for v, q in zip(l, p, strict=True)]  # fmt: skip
        tt = mpmath.mpf(t)
        u = [tt * (v - c) if q > 0 else mpmath.mpf(0) for v, q in zip(l, p, strict=True)]
        risk = (
            c
            + mpmath.log1p(
                mpmath.fsum(q * mpmath.expm1(x) for x, q in zip(u, p, strict=True)) / mass
            )
            / tt
        )
        e = [q * mpmath.exp(x) for x, q in zip(u, p, strict=True)]
        total = mpmath.fsum(e)
        return risk, [x / total for x in e]


def _mp(v: Any) -> Any:
    """``v`` as an mpmath number, exactly (an mpmath number as it is)."""
    return v if isinstance(v, mpmath.mpf) else mpmath.mpf(float(v))


def reference_hierarchy(
    losses: Any, groups: list | tuple, tilts: Any, prior: Any = None
) -> tuple[Any, list]:
    """The hierarchical tilted risk of ``losses`` and the samples' effective weights, in 50
    digits: each group's tilted risk of its members under their prior mass, at its level's
    tilt, up to the top. ``groups``: one label array per level below the top, coarse
    first; ``tilts[0]`` tilts the top level, ``tilts[-1]`` the samples in the finest
    groups. Samples of zero prior mass take no weight (a group of no mass none either)."""
    with mpmath.workdps(max(DPS, mpmath.mp.dps)):
        l = [_mp(v) for v in losses]
        n = len(l)
        p = [mpmath.mpf(1)] * n if prior is None else [_mp(q) for q in prior]

        def node(idx: list, level: int) -> tuple:
            if level == len(groups):
                kids = [(l[i], p[i], {i: mpmath.mpf(1)}) for i in idx]
            else:
                labels = np.asarray(groups[level])
                kids = [
                    node([i for i in idx if labels[i] == lab], level + 1)
                    for lab in sorted({labels[i].item() for i in idx})
                ]
                kids = [k for k in kids if k[1] > 0]
            R, w = reference_tilted([k[0] for k in kids], tilts[level], [k[1] for k in kids])
            weights = {i: wc * wi for wc, k in zip(w, kids, strict=True) for i, wi in k[2].items()}
            return R, mpmath.fsum(k[1] for k in kids), weights

        R, _, weights = node(list(range(n)), 0)
        return R, [weights.get(i, mpmath.mpf(0)) for i in range(n)]


def reference_objective(
    name: str,
    X: np.ndarray,
    y: np.ndarray,
    theta: np.ndarray,
    tilts: list,
    groups: list | tuple = (),
    prior: np.ndarray | None = None,
    l2: float = 0.0,
    params: dict | None = None,
    v: np.ndarray | None = None,
) -> dict:
    """The tilted objective of the loss ``name`` at ``theta``, in 50 digits.

    ``tilts[0]`` tilts the top level, ``tilts[-1]`` the samples within the finest groups;
    ``groups`` holds one label array per level below the top (coarse first). The value is
    ``R(theta) + l2/2 |theta|^2``; the gradient ``sum_i w_i d1_i x_i + l2 theta``; the
    Hessian-vector product (``v`` given, finite tilts) follows the tilted Hessian of each
    node, ``H = sum_c w_c H_c + t sum_c w_c (g_c - g)(g_c - g)^T``, down to the samples'
    ``d2_i x_i x_i^T``. Returns a dict of ``value`` (mpf), ``grad`` and ``hvp`` (object
    arrays of ``theta``'s shape), ``weights`` (the samples' effective weights) and
    ``scales`` (the magnitudes of the terms each quantity sums, for tolerances)."""
    params = params or {}
    vector = POINT_LOSSES[name].vector
    n = X.shape[0]
    with mpmath.workdps(DPS):
        Xm = np.array([[mpmath.mpf(float(a)) for a in row] for row in X], dtype=object)
        th = np.array(
            [mpmath.mpf(float(a)) for a in np.asarray(theta).reshape(-1)], dtype=object
        ).reshape(np.shape(theta))
        vv = None
        if v is not None:
            vv = np.array(
                [mpmath.mpf(float(a)) for a in np.asarray(v).reshape(-1)], dtype=object
            ).reshape(np.shape(theta))
        Z = Xm.dot(th)  # (n,) or (n, K), exact products summed at 50 digits
        p = [mpmath.mpf(1)] * n if prior is None else [mpmath.mpf(float(q)) for q in prior]
        leaf = []  # per sample: (value, gradient, Hv, prior mass, {sample: weight})
        d2s = []  # per sample: the largest second derivative
        for i in range(n):
            if vector:
                val, g1, h2 = _point(name, list(Z[i]), int(y[i]), params)
                grad = np.outer(Xm[i], np.array(g1, dtype=object))
                hv = None
                if vv is not None:
                    hv = np.outer(Xm[i], np.array(h2, dtype=object).dot(vv.T.dot(Xm[i])))
            else:
                val, g1, h2 = _point(name, Z[i], float(y[i]), params)
                grad = Xm[i] * g1
                hv = None if vv is None else Xm[i] * (h2 * Xm[i].dot(vv))
            leaf.append((val, grad, hv, p[i], {i: mpmath.mpf(1)}))
            d2s.append(max(abs(x) for x in np.asarray(h2, dtype=object).reshape(-1)))

        def node(idx: list, level: int) -> tuple:
            t = tilts[level]
            if level == len(groups):
                kids = [leaf[i] for i in idx]
            else:
                labels = np.asarray(groups[level])
                kids = [
                    node([i for i in idx if labels[i] == lab], level + 1)
                    for lab in sorted({labels[i].item() for i in idx})
                ]
            R, w = reference_tilted([k[0] for k in kids], t, [k[3] for k in kids])
            g = mix(w, [k[1] for k in kids])
            hv = None
            if all(k[2] is not None for k in kids) and math.isfinite(t):
                hv = mix(w, [k[2] for k in kids])
                for wc, k in zip(w, kids, strict=True):
                    dg = k[1] - g
                    hv = hv + (mpmath.mpf(t) * wc * mp_sum(dg * vv)) * dg
            weights = {i: wc * wi for wc, k in zip(w, kids, strict=True) for i, wi in k[4].items()}
            return R, g, hv, mpmath.fsum(k[3] for k in kids), weights

        R, g, hv, _, weights = node(list(range(n)), 0)
        w = [weights[i] for i in range(n)]
        lam = mpmath.mpf(l2)
        out = {
            "value": R + lam / 2 * mp_sum(th * th),
            "grad": g + lam * th,
            "hvp": None if hv is None else hv + lam * vv,
            "weights": w,
        }
        # the magnitudes an engine's rounding errors scale with: the largest loss; the
        # gradient's terms at the samples' weights; the product's terms, its tilted part
        # (t times the weighted spread of the samples' gradients) included
        t_max = max(abs(t) for t in tilts if math.isfinite(t)) if any(
            math.isfinite(t) for t in tilts) else 0  # fmt: skip
        # (each loss moves by |d1| times the rounding of z = x . theta, of size
        # eps sum_j |x_j theta_j|; its derivatives by |d2| times as much)
        zs = [mp_sum(mp_abs(Xm[i]).dot(mp_abs(th))) for i in range(n)]
        out["scales"] = {
            "value": max(abs(k[0]) + mp_sum(mp_abs(k[1])) / max(mp_sum(mp_abs(Xm[i])), 1)
                         * zs[i] for i, k in enumerate(leaf)) + lam * mp_sum(th * th),
            "grad": mix(w, [mp_abs(k[1]) * (1 + t_max * zs[i]) + d2s[i] * mp_abs(Xm[i]).reshape(
                (-1,) + (1,) * (th.ndim - 1)) * zs[i] for i, k in enumerate(leaf)])
            + lam * mp_abs(th),
        }  # fmt: skip
        if hv is not None:
            spread = mix(w, [mp_abs(k[1]) * abs(mp_sum(k[1] * vv)) for k in leaf])
            out["scales"]["hvp"] = (
                mix(w, [mp_abs(k[2]) * (1 + zs[i]) for i, k in enumerate(leaf)])
                + 2 * t_max * spread * (1 + t_max * max(zs))
                + lam * mp_abs(vv)
            )
    return out


def mix(weights: list, arrays: list) -> np.ndarray:
    """``sum_c weights[c] * arrays[c]`` of object arrays of mpmath numbers."""
    out = 0 * arrays[0]
    for wc, a in zip(weights, arrays, strict=True):
        out = out + wc * a
    return out


def mp_sum(a: Any) -> Any:
    """The sum of an object array of mpmath numbers (at the working precision)."""
    return mpmath.fsum(np.asarray(a, dtype=object).reshape(-1).tolist())


def mp_abs(a: Any) -> np.ndarray:
    return np.vectorize(abs, otypes=[object])(np.asarray(a, dtype=object))


#: the problems each objective engine is checked on: tilts (top level first) and the
#: groups below the top level (a two-level tree), with and without a prior
OBJECTIVE_TILTS: dict[str, tuple] = {
    "t=0": (0.0,),
    "t=1e-12": (1e-12,),
    "t=-2": (-2.0,),
    "t=8": (8.0,),
    "t=inf": (math.inf,),
    "tree (-1, 3)": (-1.0, 3.0),
    "tree (2, 0)": (2.0, 0.0),
}
OBJECTIVE_N, OBJECTIVE_D, OBJECTIVE_K = 13, 3, 3


def objective_problem(name: str, dtype: Any, prior: bool, tilts: tuple, seed: int = 7) -> dict:
    """A small problem of the loss ``name`` in ``dtype``: ``X`` (13 x 3), labels of its
    label set, ``theta`` and a direction ``v`` (``3 x K`` for the multinomial loss), a
    prior (or None) and, for a two-level tilt, the groups (four of unequal sizes)."""
    rng = np.random.default_rng(seed)
    n, d = OBJECTIVE_N, OBJECTIVE_D
    vector = POINT_LOSSES[name].vector
    shape = (d, OBJECTIVE_K) if vector else (d,)
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(shape) / 2).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    z = X.astype(np.float64) @ theta.astype(np.float64)
    kind = POINT_LOSSES[name].labels
    if kind == "class":
        y = rng.integers(0, OBJECTIVE_K, n).astype(np.int64)
    elif kind == "binary":
        y = (rng.random(n) < 0.4).astype(dtype)
    elif kind == "nonnegative":
        y = rng.poisson(np.exp(z)).astype(dtype)
    else:
        y = (z + rng.standard_normal(n)).astype(dtype)
    groups = [np.array([0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])[rng.permutation(n)]]
    return {
        "X": X, "y": y, "theta": theta, "v": v, "tilts": tilts,
        "groups": groups if len(tilts) > 1 else (),
        "prior": (rng.random(n) + 0.25) if prior else None,
        "l2": 0.125,
    }  # fmt: skip


def objective_errors(got: dict, ref: dict, dtype: Any, n: int, d: int) -> dict:
    """The quantities of ``got`` (``value``, ``grad``, ``hvp``: NumPy arrays or None) off
    their 50-digit reference by more than a few units of the dtype's epsilon per term
    summed, times the magnitudes they scale with (``ref["scales"]``)."""
    e = 16 * (n + d) * eps(dtype)
    bad = {}
    for key in ("value", "grad", "hvp"):
        if got.get(key) is None or ref.get(key) is None:
            continue
        a = np.asarray(got[key], dtype=np.float64).reshape(-1).tolist()
        r = np.asarray(ref[key], dtype=object).reshape(-1).tolist()
        sc = np.asarray(ref["scales"][key], dtype=object).reshape(-1).tolist()
        if len(sc) == 1:
            sc = sc * len(r)
        assert len(a) == len(r), (key, len(a), len(r))
        off = [
            (i, ai, float(ri))
            for i, (ai, ri, si) in enumerate(zip(a, r, sc, strict=True))
            if not abs(mpmath.mpf(ai) - ri) <= e * si + tiny(dtype)
        ]
        if off:
            bad[key] = off[:5]
    return bad


@dataclass(frozen=True)
class ObjectiveEngine:
    """One objective engine: ``evaluate(name, problem, dtype, params) -> {"value", "grad",
    "hvp"}`` (NumPy arrays; ``hvp`` None where the engine has no product), raising
    ``NotImplementedError`` for a problem it declines."""

    needs: tuple[str, ...]
    evaluate: Callable[..., dict]


def _engine_call(engine: Any, name: str, pb: dict, params: dict, xp: Any = np, **ctx) -> dict:
    """``value_and_gradient`` and ``hvp`` of one engine object of the objective layer on
    the problem ``pb`` (arrays in ``xp``); a decline (None) of a problem the engine
    ``applies`` to is returned as is, for the test to see."""
    from tiltlab._compat import to_numpy
    from tiltlab.losses import get_loss
    from tiltlab.objective import TiltedObjective
    from tiltlab.objective.engines import Context

    tilts = pb["tilts"]
    kw = {"t": tilts[0]} if len(tilts) == 1 else {"groups": pb["groups"][0], "tilts": tilts}
    asx = (lambda a: None if a is None else xp.asarray(a)) if xp is not np else (lambda a: a)
    problem = TiltedObjective(
        get_loss(name, **params), asx(pb["X"]), asx(pb["y"]), weights=asx(pb["prior"]),
        l2=pb["l2"], **kw,
    ).problem  # fmt: skip
    context = Context(count=lambda k: None, update=lambda p: None, **ctx)
    theta, v = asx(pb["theta"]), asx(pb["v"])
    vg = engine.value_and_gradient(problem, theta, context)
    if vg is None:
        raise NotImplementedError(f"{engine.name} declines this problem")
    hv = None
    if all(math.isfinite(t) for t in tilts):  # the Hessian is not defined at +-inf
        hv = engine.hvp(problem, theta, v, context)
    out = {"value": to_numpy(vg[0]), "grad": to_numpy(vg[1]), "hvp": None}
    if hv is not None:
        out["hvp"] = to_numpy(hv)
    out["dtypes"] = {str(a.dtype) for a in (vg[0], vg[1]) + (() if hv is None else (hv,))}
    return out


def array_api_objective(xp: Any) -> ObjectiveEngine:
    """The generic array-API engine (``objective.engines.generic``) on the namespace
    ``xp``: every problem, every tilt, hierarchies and priors."""

    def evaluate(name, pb, dtype, params):
        from tiltlab.objective.engines.generic import GENERIC

        return _engine_call(GENERIC, name, pb, params, xp=xp)

    return ObjectiveEngine(needs=(), evaluate=evaluate)


def _onepass_objective(name, pb, dtype, params):
    """The one-pass block engine (eager NumPy), in blocks of 4 rows (the last one short)."""
    from tiltlab.objective.engines.onepass import ONE_PASS

    if len(pb["tilts"]) > 1 or math.isinf(pb["tilts"][0]):
        raise NotImplementedError("the one-pass engine serves finite sample-level tilts")
    return _engine_call(ONE_PASS, name, pb, params, block_rows=4)


def _fused_cpu_objective(name, pb, dtype, params):
    """The fused CPU engine (compiled kernels) on NumPy data, whatever the size."""
    from tiltlab._cpu_kernels import LOSS_CODES
    from tiltlab._cpu_kernels.engine import FUSED_CPU

    if len(pb["tilts"]) > 1 or math.isinf(pb["tilts"][0]) or name not in LOSS_CODES:
        raise NotImplementedError("the compiled kernels serve finite flat tilts of their losses")
    return _engine_call(FUSED_CPU, name, pb, params)


def _dask_objective(name, pb, dtype, params):
    """The Dask engine (``distributed``): ``X`` in chunks of 5 rows, one graph a call."""
    import dask.array as da

    from tiltlab._compat import to_numpy
    from tiltlab.losses import get_loss
    from tiltlab.objective import TiltedObjective

    tilts = pb["tilts"]
    kw = {"t": tilts[0]} if len(tilts) == 1 else {"groups": pb["groups"][0], "tilts": tilts}
    prior = None if pb["prior"] is None else da.from_array(pb["prior"], chunks=5)
    obj = TiltedObjective(
        get_loss(name, **params), da.from_array(pb["X"], chunks=(5, -1)),
        da.from_array(pb["y"], chunks=5), weights=prior, l2=pb["l2"], **kw,
    )  # fmt: skip
    theta, v = da.from_array(pb["theta"]), da.from_array(pb["v"])
    value, grad = obj.value_and_gradient(theta)
    hv = obj.hvp(theta, v) if all(math.isfinite(t) for t in tilts) else None
    out = {"value": to_numpy(value), "grad": to_numpy(grad)}
    out["hvp"] = None if hv is None else to_numpy(hv)
    out["dtypes"] = {str(np.asarray(out[k]).dtype) for k in ("value", "grad")}
    return out


def _cuda_objective(name, pb, dtype, params):
    """The fused CUDA kernels (``tilted_vg``, its finish and gradient product), run in the
    CPU emulation of CUDA (``tests/cuda_emu.h``) behind the recording stand-in for CuPy:
    flat finite tilts, the uniform prior, the losses with C code; value and gradient."""
    import sys

    from cuda_fake import FakeArray, Recorder, fake_cupy
    from cuda_host import run_emulated

    from tiltlab._cupy import engine as cuda_engine
    from tiltlab._cupy import source
    from tiltlab.losses import get_loss

    t = pb["tilts"][0]
    if len(pb["tilts"]) > 1 or math.isinf(t) or pb["prior"] is not None:
        raise NotImplementedError("the fused CUDA kernel serves flat finite uniform tilts")
    if name not in source.C_LOSSES:
        raise NotImplementedError(f"the CUDA engine has no C code for {name}")
    rec = Recorder()
    saved = sys.modules.get("cupy"), source._MODULES
    sys.modules["cupy"] = fake_cupy(rec, run=run_emulated, sms=1)
    source._MODULES = {}
    try:
        X, y, theta = (FakeArray(pb[k], rec) for k in ("X", "y", "theta"))
        out = cuda_engine.value_and_gradient(X, y, theta, t, get_loss(name, **params), pb["l2"])
    finally:
        if saved[0] is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved[0]
        source._MODULES = saved[1]
    if out is None:
        raise AssertionError("the fused CUDA kernel reported non-finite losses")
    value, grad = (a._a for a in out)
    return {
        "value": value,
        "grad": grad,
        "hvp": None,
        "dtypes": {str(value.dtype), str(grad.dtype)},
    }


#: the objective engines checked against :func:`reference_objective` (the generic engine
#: runs per backend of the ``xp`` fixture: :func:`array_api_objective`)
OBJECTIVE_ENGINES: dict[str, ObjectiveEngine] = {
    "one-pass": ObjectiveEngine(needs=(), evaluate=_onepass_objective),
    "fused CPU (numba)": ObjectiveEngine(needs=("numba",), evaluate=_fused_cpu_objective),
    "dask": ObjectiveEngine(needs=("dask",), evaluate=_dask_objective),
    "fused CUDA (emulated)": ObjectiveEngine(needs=("exe:g++",), evaluate=_cuda_objective),
}
