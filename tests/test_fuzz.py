"""Hypothesis fuzzing of the aggregation API.

Random shapes (1-3 dims), dtypes (float32/float64), sample axes, priors (none, 1-d,
full shape, with zeros) and tilts (0, +-inf, tiny, large, grids of them) go through
``tilted_risk``, ``tilted_weights`` and ``bounds.tail_fraction`` on every backend.
The reference is written here independently: mpmath at a working precision that
grows as ``|t| * spread`` shrinks (so that ``t = 1e-300`` is resolved, not rounded to
the mean), on each 1-d slice of the exact input values; the tail fraction by direct
counting. Malformed inputs must raise ``ValueError``/``TypeError``; a valid input
never gives NaN.
"""

from __future__ import annotations

import math
import os

import mpmath
import numpy as np
import pytest
from _contract import reference_tilted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tiltlab as tl
from tiltlab import bounds
from tiltlab._compat import to_numpy
from tiltlab.testing import assert_namespace

SPECIAL_TILTS = [
    0.0,
    math.inf,
    -math.inf,
    1e-300,
    -1e-300,
    1e-30,
    -1e-12,
    1e-3,
    1e3,
    -1e3,
    1e8,
    -1e8,
]
scalar_tilts = st.one_of(st.sampled_from(SPECIAL_TILTS), st.floats(-30.0, 30.0))
tilts = st.one_of(
    scalar_tilts,
    st.lists(scalar_tilts, min_size=1, max_size=4).map(lambda v: np.array(v)),
)

# per-backend example counts (Dask evaluates a task graph per call); raise them for a
# longer local run, e.g. TILTLAB_FUZZ_EXAMPLES=600 TILTLAB_FUZZ_DASK=150
EXAMPLES = {"dask": int(os.environ.get("TILTLAB_FUZZ_DASK", "8"))}
DEFAULT_EXAMPLES = int(os.environ.get("TILTLAB_FUZZ_EXAMPLES", "30"))


def _examples(xp) -> int:
    name = xp.__name__.split(".")[-2 if xp.__name__.endswith(".array") else -1]
    return EXAMPLES.get(name, DEFAULT_EXAMPLES)


# ---------------------------------------------------------------------------
# the reference


def _ref_slice(l: np.ndarray, p: np.ndarray | None, t: float) -> tuple[float, np.ndarray]:
    """Tilted risk and weights of one 1-d slice, in mpmath from the exact inputs.

    The working precision grows with ``-log10(|t| * spread)`` so that tiny tilts are
    resolved (``exp(t l)`` differs from one in the 300th digit at ``t = 1e-300``).
    """
    on = np.ones(l.size, bool) if p is None else p > 0
    lo_hi = l[on].astype(np.float64)
    half = float(np.max(lo_hi)) / 2 - float(np.min(lo_hi)) / 2  # the spread may exceed max
    extra = 0
    if math.isfinite(t) and t != 0 and half > 0:  # digits of |t| * spread below one
        extra = max(0, math.ceil(-(math.log10(abs(t)) + math.log10(half) + math.log10(2))))
    with mpmath.workdps(40 + extra):
        return _ref_slice_mp(l, p, t)


def _ref_slice_mp(l, p, t):
    r, w = reference_tilted([float(v) for v in l], t, None if p is None else [float(v) for v in p])
    return float(r), np.array([float(v) for v in w])


def _reference(l, p, t, axis):
    """Risk and weights of the whole problem: samples on ``axis``, tilt grid leading."""
    axis = axis % l.ndim
    lm = np.moveaxis(l, axis, -1)
    pm = None if p is None else (p if p.ndim == 1 else np.moveaxis(p, axis, -1))
    ts = np.atleast_1d(t)
    R = np.empty(ts.shape + lm.shape[:-1])
    W = np.empty(ts.shape + lm.shape)
    for k, tk in enumerate(ts):
        for idx in np.ndindex(*lm.shape[:-1]):
            pk = None if pm is None else (pm if pm.ndim == 1 else pm[idx])
            R[(k, *idx)], W[(k, *idx)] = _ref_slice(lm[idx], pk, float(tk))
    W = np.moveaxis(W, -1, axis + 1)
    if np.ndim(t) == 0:
        return R[0], W[0]
    return R, W


# ---------------------------------------------------------------------------
# strategies


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    width = 32 if dtype is np.float32 else 64
    values = st.one_of(
        st.floats(-1e3, 1e3, width=width),
        st.sampled_from([0.0, 1.0, -1.0, 2.5]),  # ties
    )
    l = draw(hnp.arrays(dtype, shape, elements=values))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    kind = draw(st.sampled_from(["none", "1d", "full"]))
    wvals = st.one_of(st.just(0.0), st.floats(0.0078125, 1.0, width=width))
    if kind == "none":
        p = None
    elif kind == "1d":
        p = draw(hnp.arrays(dtype, (n,), elements=wvals))
        p[draw(st.integers(0, n - 1))] = 1.0  # some positive mass
    else:
        p = draw(hnp.arrays(dtype, shape, elements=wvals))
        # every slice along `axis` keeps some positive mass
        pos = draw(st.integers(0, n - 1))
        idx = [slice(None)] * len(shape)
        idx[axis] = pos
        p[tuple(idx)] = 0.5
    t = draw(tilts)
    # the tilt the computation runs with (the losses' dtype)
    t = np.asarray(t, dtype=dtype) if np.ndim(t) else float(np.asarray(t, dtype=dtype))
    return l, p, axis, t


def _as_the_device_reads(xp, a):
    """``a`` with float32 subnormals as 0 on CuPy, whose kernels are built with
    flush-to-zero for float32 (``-ftz=true``): there a float32 subnormal reads as 0, and
    losses that differ by less than the smallest normal number tie. Elsewhere ``a``."""
    if a is None or a.dtype != np.float32 or "cupy" not in getattr(xp, "__name__", ""):
        return a
    return np.where(np.abs(a) < np.finfo(np.float32).tiny, np.float32(0), a)


def _tol(dtype) -> float:
    return 16 * float(np.finfo(dtype).eps)


# ---------------------------------------------------------------------------
# the properties


def test_fuzz_risk_and_weights(xp):
    # the example budget depends on the backend, so it is set per call
    @settings(
        max_examples=_examples(xp),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(prob=problems())
    def run(prob):
        l, p, axis, t = prob
        l, p = _as_the_device_reads(xp, l), _as_the_device_reads(xp, p)
        R_ref, W_ref = _reference(l, p, t, axis)
        L = xp.asarray(l)
        P = None if p is None else xp.asarray(p)
        # tilts come as NumPy values whatever the backend (they are parameters)
        R = tl.tilted_risk(L, t, axis=axis, weights=P)
        W = tl.tilted_weights(L, t, axis=axis, weights=P)
        assert_namespace(R, xp, dtype=L.dtype)
        assert_namespace(W, xp, dtype=L.dtype)
        Rn, Wn = to_numpy(R).astype(np.float64), to_numpy(W).astype(np.float64)
        assert Rn.shape == R_ref.shape and Wn.shape == W_ref.shape
        assert np.all(np.isfinite(Rn)) and np.all(np.isfinite(Wn))
        tol = _tol(l.dtype)
        # a few ulps of the largest |loss| of each slice (the documented accuracy)
        scale = np.max(np.abs(l.astype(np.float64)), axis=axis) + float(np.finfo(l.dtype).tiny)
        assert np.all(np.abs(Rn - R_ref) <= tol * scale), (Rn, R_ref)
        np.testing.assert_allclose(Wn, W_ref, rtol=0, atol=tol)
        # the tail fraction shares the prior handling: a threshold taken from the losses
        # (so that ties with `>=` occur), reference by direct counting
        a = float(l.reshape(-1)[0])
        Q = to_numpy(bounds.tail_fraction(L, np.float64(a), axis=axis, weights=P))
        pq = np.ones_like(l) if p is None else np.asarray(p, dtype=np.float64)
        if pq.ndim == 1:
            pq = np.moveaxis(np.broadcast_to(pq, np.moveaxis(l, axis, -1).shape), -1, axis)
        Q_ref = np.sum(pq * (l >= a), axis=axis) / np.sum(pq, axis=axis)
        np.testing.assert_allclose(Q.astype(np.float64), Q_ref, rtol=0, atol=tol)
        # keepdims keeps the sample axis in place
        Rk = tl.tilted_risk(L, t, axis=axis, weights=P, keepdims=True)
        lead = 1 if np.ndim(t) else 0
        want = list(R_ref.shape)
        want.insert(lead + (axis % l.ndim), 1)
        assert tuple(Rk.shape) == tuple(want)

    run()


BAD = [
    "nan_loss",
    "inf_loss",
    "nan_tilt",
    "tilt_2d",
    "tilt_string",
    "tilt_empty",
    "neg_weight",
    "zero_weights",
    "nan_weight",
    "weights_shape",
    "axis",
]


def test_fuzz_bad_input_raises(xp):
    @settings(
        max_examples=max(8, _examples(xp) // 2),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(prob=problems(), bad=st.sampled_from(BAD), pos=st.integers(0, 10**6))
    def run(prob, bad, pos):
        l, p, axis, t = prob
        l = l.copy()
        n = l.shape[axis]
        if bad in ("nan_loss", "inf_loss"):
            l.reshape(-1)[pos % l.size] = np.nan if bad == "nan_loss" else -np.inf
        elif bad == "nan_tilt":
            t = np.array([0.0, np.nan]) if pos % 2 else math.nan
        elif bad == "tilt_2d":
            t = np.ones((2, 2))
        elif bad == "tilt_string":
            t = ["1.0", "2.0"] if pos % 2 else "1.0"
        elif bad == "tilt_empty":
            t = np.array([])
        elif bad in ("neg_weight", "zero_weights", "nan_weight"):
            p = np.ones(n, dtype=l.dtype) if p is None else p.copy()
            if bad == "neg_weight":
                p.reshape(-1)[pos % p.size] = -0.5
            elif bad == "nan_weight":
                p.reshape(-1)[pos % p.size] = np.nan
            else:
                p[...] = 0.0
        elif bad == "weights_shape":
            p = np.ones(n + 1 + pos % 3, dtype=l.dtype)
        else:  # axis
            axis = l.ndim + pos % 3 if pos % 2 else -l.ndim - 1 - pos % 3
        L = xp.asarray(l)
        P = None if p is None else xp.asarray(p)
        for f in (tl.tilted_risk, tl.tilted_weights):
            with pytest.raises((ValueError, TypeError)):
                # a lazy (Dask) result may raise when it is computed: compute inside
                to_numpy(f(L, t, axis=axis, weights=P))

    run()


# ---------------------------------------------------------------------------
# input classes of their own: tiny tilts with spreads beyond the float maximum,
# float16 losses, Dask arrays with unknown or empty chunks

HUGE_VALUES = st.one_of(
    st.floats(1e307, 1.7e308), st.floats(-1.7e308, -1e307), st.sampled_from([0.0, 1.0])
)
TINY_TILTS = st.sampled_from([1e-310, -1e-310, 3e-309, 1e-308, -1e-307, 1e-300])


@st.composite
def special_problems(draw):
    kind = draw(st.sampled_from(["huge", "float16", "unknown_chunks", "empty_chunk"]))
    if kind == "huge":
        l = np.array(draw(st.lists(HUGE_VALUES, min_size=2, max_size=6)), dtype=np.float64)
        l[0], l[1] = 1.5e308, -1.5e308  # the spread overflows
        return kind, l, draw(TINY_TILTS)
    if kind == "float16":
        vals = st.floats(-60.0, 60.0, width=16)
        l = np.array(draw(st.lists(vals, min_size=1, max_size=40)), dtype=np.float16)
        return kind, l, float(np.float32(draw(scalar_tilts)))  # computed in float32
    l = np.array(draw(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=12)))
    return kind, l, draw(scalar_tilts)


def _dask_layout(kind, l):
    """``(dask losses, the values they hold)`` for the Dask input classes."""
    import dask.array as da

    if kind == "empty_chunk":
        k = len(l) // 2
        return da.from_array(l, chunks=((k, 0, len(l) - k),)), l
    x = da.from_array(np.r_[l, 7.25], chunks=3)
    return x[x != 7.25], l[l != 7.25]


def test_fuzz_special_input_classes(xp):
    name = xp.__name__
    strict = "array_api_strict" in name
    dask = "dask" in name

    @settings(
        max_examples=_examples(xp),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(prob=special_problems())
    def run(prob):
        kind, l, t = prob
        if kind in ("unknown_chunks", "empty_chunk"):
            if not dask:
                return
            L, values = _dask_layout(kind, l)
        elif kind == "float16" and strict:
            return  # array-api-strict has no float16
        else:
            L, values = xp.asarray(l), l
        if values.size == 0:
            return
        ref_t = float(t)
        R_ref, W_ref = _ref_slice(values.astype(np.float64), None, ref_t)
        with np.errstate(all="ignore"):  # Dask's worker threads: checked values below
            R = to_numpy(tl.tilted_risk(L, t)).astype(np.float64)
            W = to_numpy(tl.tilted_weights(L, t)).astype(np.float64)
        assert np.isfinite(R) and np.all(np.isfinite(W))
        dt = np.float32 if kind == "float16" else values.dtype  # float16 accumulates in f32
        tol = _tol(dt) if kind != "float16" else float(np.finfo(np.float16).eps)
        scale = float(np.max(np.abs(values.astype(np.float64))))
        if kind == "float16":  # rounded once to float16 at the end
            assert abs(float(R) - R_ref) <= tol * max(scale, 1.0), (R, R_ref)
            np.testing.assert_allclose(W, W_ref, rtol=0, atol=tol)
        else:
            assert abs(float(R) - R_ref) <= tol * scale, (R, R_ref)
            np.testing.assert_allclose(W, W_ref, rtol=0, atol=tol)

    run()
