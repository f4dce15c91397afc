"""The vectorisable float32 ``exp``, ``expm1`` and ``log1p`` of the fused CPU kernels.

Compared with the float64 NumPy functions of the same float32 arguments (about 1e-16
relative: exact enough to measure float32 errors in units of the float32 spacing) over
random float32 bit patterns covering the whole range, over the ranges the kernels use,
and at the edges (overflow, underflow into the subnormals, -1 for ``log1p``, signed
zeros, infinities, NaN); and with 50-digit mpmath on a sample.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="the fused CPU kernels need numba")

from tiltlab._cpu_kernels import _typed_math  # noqa: E402
from tiltlab._cpu_kernels import _vmath32 as vm  # noqa: E402

#: the documented bound (units in the last place of the correctly rounded float32 result)
MAX_ULP = 2.0
F32 = np.float32


@numba.njit(error_model="numpy")
def _map_exp(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vexpf(x[i])


@numba.njit(error_model="numpy")
def _map_expm1(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vexpm1f(x[i])


@numba.njit(error_model="numpy")
def _map_log1p(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vlog1pf(x[i])


@numba.njit(error_model="numpy")
def _map_log1p_unit(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vlog1p_unitf(x[i])


FUNCS = {
    "exp": (_map_exp, np.exp, mpmath.exp),
    "expm1": (_map_expm1, np.expm1, mpmath.expm1),
    "log1p": (_map_log1p, np.log1p, mpmath.log1p),
    "log1p_unit": (_map_log1p_unit, np.log1p, mpmath.log1p),
}


# the kernels call these functions through _typed_math.exp_t and friends, compiled with the
# contraction of multiplications and additions into fused multiply-adds (where the CPU has
# them): each test runs on both builds


@numba.njit(error_model="numpy")
def _kmap_exp(x, out):
    for i in range(x.shape[0]):
        out[i] = _typed_math.exp_t(x[i])


@numba.njit(error_model="numpy")
def _kmap_expm1(x, out):
    for i in range(x.shape[0]):
        out[i] = _typed_math.expm1_t(x[i])


@numba.njit(error_model="numpy")
def _kmap_log1p_unit(x, out):
    for i in range(x.shape[0]):
        out[i] = _typed_math.log1p_unit_t(x[i])


KERNEL_FUNCS = {"exp": _kmap_exp, "expm1": _kmap_expm1, "log1p_unit": _kmap_log1p_unit}


@pytest.fixture(params=["rounded", "kernel"])
def build(request):
    """The functions as compiled alone, or as the kernels compile them."""
    return request.param


def _map(name, build):
    if build == "rounded":
        return FUNCS[name][0]
    if name not in KERNEL_FUNCS:
        pytest.skip("the kernels use exp, expm1 and log1p on [0, 1] only")
    return KERNEL_FUNCS[name]


def _apply(name, x, build="rounded"):
    x = np.ascontiguousarray(x, dtype=F32)
    out = np.empty_like(x)
    _map(name, build)(x, out)
    assert out.dtype == F32
    return out


def _reference(name, x):
    """The float64 function of the float32 arguments."""
    with np.errstate(all="ignore"):
        return FUNCS[name][1](np.asarray(x, dtype=F32).astype(np.float64))


def _ulp_error(actual, desired64):
    """Largest ``|actual - desired|`` in units of the float32 spacing at the correctly
    rounded ``desired`` (0 where both are the same non-finite value); the finiteness of
    ``actual`` must match that of the rounded ``desired`` (float32 overflow included)."""
    actual = np.asarray(actual, dtype=F32)
    desired64 = np.asarray(desired64, dtype=np.float64)
    with np.errstate(over="ignore"):
        rounded = desired64.astype(F32)
    same = (actual == rounded) | (np.isnan(actual) & np.isnan(rounded))
    assert np.array_equal(np.isfinite(actual), np.isfinite(rounded)), "finiteness differs"
    with np.errstate(invalid="ignore"):
        spacing = np.spacing(np.abs(rounded)).astype(np.float64)
        err = np.abs(actual.astype(np.float64) - desired64) / spacing
    err = np.where(same, 0.0, err)
    return float(np.max(err)) if err.size else 0.0


def _random_bits(n, seed):
    """Random float32 bit patterns: every exponent equally likely, both signs; NaN out."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F32)
    return x[~np.isnan(x)]


RANGES = {
    "exp": [(-104.0, 89.0), (-40.0, 0.0), (-1.0, 1.0), (-1e-4, 1e-4)],
    "expm1": [(-104.0, 89.0), (-1.0, 0.0), (-0.4, 0.4), (-1e-6, 1e-6), (-20.0, -15.0)],
    "log1p": [(-1.0, 1.0), (0.0, 1.0), (-1e-6, 1e-6), (1.0, 1e6), (-1.0, -0.99)],
}


@pytest.mark.parametrize("name", ["exp", "expm1", "log1p"])
def test_ulp_error_over_the_whole_float32_range(name, build):
    rng = np.random.default_rng(1)
    xs = [_random_bits(1_000_000, 0)]
    xs += [rng.uniform(a, b, 200_000).astype(F32) for a, b in RANGES[name]]
    # log-uniform magnitudes (each binade alike, subnormals included), both signs
    mag = np.exp(rng.uniform(-103.0, 88.0, 200_000)).astype(F32)
    xs += [mag, -mag]
    for x in xs:
        assert _ulp_error(_apply(name, x, build), _reference(name, x)) <= MAX_ULP


def test_log1p_unit_on_its_domain(build):
    """``vlog1p_unitf`` serves ``[0, 1]`` (the softplus ``log1p(exp(-|z|))``)."""
    rng = np.random.default_rng(3)
    edge = np.sqrt(F32(2.0)) - F32(1.0)
    x = np.concatenate(
        [
            rng.uniform(0.0, 1.0, 200_000).astype(F32),
            np.exp(-rng.uniform(0.0, 103.0, 200_000)).astype(F32),
            np.array([0.0, 1e-45, 1e-38, edge, np.nextafter(edge, F32(1)), 1.0], dtype=F32),
        ]
    )
    assert _ulp_error(_apply("log1p_unit", x, build), _reference("log1p", x)) <= MAX_ULP


@pytest.mark.parametrize("name", list(FUNCS))
def test_against_mpmath(name, build):
    ref = FUNCS[name][2]
    rng = np.random.default_rng(2)
    lo, hi = (-1.0, 50.0) if name == "log1p" else (-100.0, 88.0)
    lo, hi = (0.0, 1.0) if name == "log1p_unit" else (lo, hi)
    x = np.concatenate([rng.uniform(lo, hi, 150), rng.uniform(-0.5, 0.5, 50)])
    if name == "log1p":
        x = np.concatenate([x, -1.0 + np.exp(rng.uniform(-16.0, 0.0, 50))])
    if name == "log1p_unit":
        x = np.abs(x)
    x = x.astype(F32)
    with mpmath.workdps(50):
        desired = np.array([float(ref(mpmath.mpf(float(v)))) for v in x])
    assert _ulp_error(_apply(name, x, build), desired) <= MAX_ULP


def test_exp_overflow_underflow_and_specials(build):
    big = np.log(np.float64(np.finfo(F32).max))  # 88.72...
    x = np.array([88.72, np.nextafter(F32(big), F32(np.inf)), 89.0, 1e30, np.inf], dtype=F32)
    out = _apply("exp", x, build)
    assert np.isfinite(out[0]) and np.all(np.isinf(out[1:]))
    x = np.array([-87.0, -100.0, -103.9, -104.0, -1e30, -np.inf], dtype=F32)
    out = _apply("exp", x, build)
    assert _ulp_error(out, _reference("exp", x)) <= 1.0  # subnormals, then zeros
    np.testing.assert_array_equal(out[3:], 0.0)
    assert 0 < out[1] < np.finfo(F32).tiny
    x = np.array([0.0, -0.0, 1e-45, -1e-45], dtype=F32)
    np.testing.assert_array_equal(_apply("exp", x, build), np.ones(4, dtype=F32))


def test_expm1_specials(build):
    x = np.array([0.0, -0.0, 1e-45, -1e-40, 1e-30, -np.inf, np.inf, 89.0, -200.0], dtype=F32)
    out = _apply("expm1", x, build)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, np.expm1(x.astype(np.float64)).astype(F32))
    np.testing.assert_array_equal(np.signbit(out[:2]), [False, True])


def test_log1p_specials():
    top = np.finfo(F32).max
    x = np.array([0.0, -0.0, 1e-45, -1e-45, -1.0, np.inf, top], dtype=F32)
    with np.errstate(divide="ignore"):
        desired = np.log1p(x.astype(np.float64)).astype(F32)
    out = _apply("log1p", x)
    np.testing.assert_array_equal(out, desired)
    np.testing.assert_array_equal(np.signbit(out[:2]), [False, True])
    below = np.array([np.nextafter(F32(-1), F32(-2)), -2.0, -1e30, -np.inf], dtype=F32)
    assert np.all(np.isnan(_apply("log1p", below)))


@pytest.mark.parametrize("name", ["exp", "expm1", "log1p"])
def test_nan_propagates(name, build):
    x = np.array([np.nan, -np.nan, 1.0, np.nan], dtype=F32)
    out = _apply(name, x, build)
    np.testing.assert_array_equal(np.isnan(out), [True, True, False, True])


def test_reduction_constants():
    """``LN2_HI_F + LN2_LO_F`` is ln 2 to far below float32 rounding, ``k * LN2_HI_F`` is
    exact for every ``|k| < 2**15`` (9 significant bits), and the clamp keeps both factors
    of the power of two in the normal range."""
    with mpmath.workdps(50):
        err = mpmath.mpf(float(vm.LN2_HI_F)) + mpmath.mpf(float(vm.LN2_LO_F)) - mpmath.log(2)
        # 1.6e-12: k * err < 2**-31 for every |k| the clamp allows (217), far below
        # float32 rounding of the reduced argument
        assert abs(err) < mpmath.mpf(2) ** -38
    bits = np.array([vm.LN2_HI_F], dtype=F32).view(np.int32)[0]
    assert bits & ((1 << 14) - 1) == 0
    assert vm.INV_LN2_F == F32(1 / mpmath.log(2))
    kmax = int(np.ceil(float(vm._CLAMP_F) * float(vm.INV_LN2_F)))
    assert kmax - kmax // 2 <= 127 and -kmax // 2 >= -126


@numba.njit(error_model="numpy")
def _map_typed(x, out):
    for i in range(x.shape[0]):
        out[i, 0] = _typed_math.exp_t(x[i])
        out[i, 1] = _typed_math.expm1_t(x[i])
        out[i, 2] = _typed_math.log1p_unit_t(abs(x[i]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_typed_dispatch_keeps_the_precision(dtype):
    """The kernels' ``exp_t``/``expm1_t``/``log1p_unit_t`` take the float32 functions for
    float32 arguments and the float64 ones otherwise (compiled and as plain Python)."""
    x = np.linspace(-1.0, 1.0, 101).astype(dtype)  # log1p_unit serves [0, 1]
    out = np.empty((x.size, 3), dtype=dtype)
    _map_typed(x, out)
    x64 = x.astype(np.float64)
    desired = np.stack([np.exp(x64), np.expm1(x64), np.log1p(np.abs(x64))], axis=1)
    rtol = 2.5e-7 if dtype == np.float32 else 5e-16
    np.testing.assert_allclose(out, desired, rtol=rtol)
    plain = np.array([[_typed_math.exp_t(v), _typed_math.expm1_t(v)] for v in x[:5]])
    np.testing.assert_allclose(plain, desired[:5, :2], rtol=rtol)
    err = np.max(np.abs(out.astype(np.float64) / np.where(desired == 0, 1, desired) - 1.0))
    if dtype == np.float32:  # float32 arithmetic: errors of float32 rounding, not 1e-16
        assert err > 1e-9
