"""The vectorisable ``exp``, ``expm1`` and ``log1p`` of the fused CPU kernels.

Compared with NumPy (whose functions are accurate to about one unit in the last place)
over random bit patterns covering the whole float64 range, over the ranges the kernels
use, and at the edges (overflow, underflow into the subnormals, -1 for ``log1p``, signed
zeros, infinities, NaN); and with 50-digit mpmath on a sample.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="the fused CPU kernels need numba")

from tiltlab._cpu_kernels import _typed_math  # noqa: E402
from tiltlab._cpu_kernels import _vmath as vm  # noqa: E402

#: the documented bound (units in the last place of the correctly rounded result)
MAX_ULP = 2.0


@numba.njit(error_model="numpy")
def _map_exp(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vexp(x[i])


@numba.njit(error_model="numpy")
def _map_expm1(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vexpm1(x[i])


@numba.njit(error_model="numpy")
def _map_log1p(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vlog1p(x[i])


@numba.njit(error_model="numpy")
def _map_log1p_unit(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vlog1p_unit(x[i])


@numba.njit(error_model="numpy")
def _map_log(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.vlog(x[i])


FUNCS = {
    "exp": (_map_exp, np.exp, mpmath.exp),
    "expm1": (_map_expm1, np.expm1, mpmath.expm1),
    "log1p": (_map_log1p, np.log1p, mpmath.log1p),
    "log1p_unit": (_map_log1p_unit, np.log1p, mpmath.log1p),
    "log": (_map_log, np.log, mpmath.log),
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


@numba.njit(error_model="numpy")
def _kmap_log(x, out):
    for i in range(x.shape[0]):
        out[i] = _typed_math.log_t(x[i])


KERNEL_FUNCS = {
    "exp": _kmap_exp,
    "expm1": _kmap_expm1,
    "log1p_unit": _kmap_log1p_unit,
    "log": _kmap_log,
}


@pytest.fixture(params=["rounded", "kernel"])
def build(request):
    """The functions as compiled alone, or as the kernels compile them."""
    return request.param


def _map(name, build):
    if build == "rounded":
        return FUNCS[name][0]
    if name not in KERNEL_FUNCS:
        pytest.skip("the kernels use exp, expm1, log and log1p on [0, 1] only")
    return KERNEL_FUNCS[name]


def _apply(name, x, build="rounded"):
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    _map(name, build)(x, out)
    return out


def _ulp_error(actual, desired):
    """Largest ``|actual - desired|`` in units of the spacing at ``desired`` (0 where both
    are the same non-finite value)."""
    actual = np.asarray(actual)
    desired = np.asarray(desired)
    same = (actual == desired) | (np.isnan(actual) & np.isnan(desired))
    assert np.array_equal(np.isfinite(actual), np.isfinite(desired)), "finiteness differs"
    with np.errstate(invalid="ignore"):
        err = np.abs(actual - desired) / np.spacing(np.abs(desired))
    err = np.where(same, 0.0, err)
    return float(np.max(err)) if err.size else 0.0


def _random_bits(n, seed):
    """Random float64 bit patterns: every exponent equally likely, both signs; NaN out."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**63 - 1, n, dtype=np.int64).view(np.float64)
    x = np.where(rng.random(n) < 0.5, -x, x)
    return x[~np.isnan(x)]


RANGES = {
    "exp": [(-746.0, 710.0), (-40.0, 0.0), (-1.0, 1.0), (-1e-6, 1e-6)],
    "expm1": [(-746.0, 710.0), (-1.0, 0.0), (-0.4, 0.4), (-1e-9, 1e-9), (-50.0, -30.0)],
    "log1p": [(-1.0, 1.0), (0.0, 1.0), (-1e-9, 1e-9), (1.0, 1e6), (-1.0, -0.99)],
    "log": [(0.0, 1.0), (0.5, 2.0), (1.0 - 1e-9, 1.0 + 1e-9), (1.0, 1e6), (0.0, 1e-300)],
}


@pytest.mark.parametrize("name", ["exp", "expm1", "log1p", "log"])
def test_ulp_error_against_numpy_over_the_whole_range(name, build):
    ref = FUNCS[name][1]
    rng = np.random.default_rng(1)
    xs = [_random_bits(400_000, 0)]
    xs += [rng.uniform(a, b, 200_000) for a, b in RANGES[name]]
    # log-uniform magnitudes (each binade alike), both signs
    mag = np.exp(rng.uniform(-745.0, 709.0, 200_000))
    xs += [mag, -mag]
    for x in xs:
        with np.errstate(all="ignore"):
            desired = ref(x)
        assert _ulp_error(_apply(name, x, build), desired) <= MAX_ULP


def test_log1p_unit_on_its_domain(build):
    """``vlog1p_unit`` serves ``[0, 1]`` (the softplus ``log1p(exp(-|z|))``)."""
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.uniform(0.0, 1.0, 200_000),
            np.exp(-rng.uniform(0.0, 745.0, 200_000)),
            [0.0, 5e-324, 1e-300, np.sqrt(2.0) - 1.0, np.nextafter(np.sqrt(2.0) - 1.0, 1), 1.0],
        ]
    )
    assert _ulp_error(_apply("log1p_unit", x, build), np.log1p(x)) <= MAX_ULP


@pytest.mark.parametrize("name", list(FUNCS))
def test_against_mpmath(name, build):
    ref = FUNCS[name][2]
    rng = np.random.default_rng(2)
    lo, hi = (-1.0, 50.0) if name == "log1p" else (-700.0, 700.0)
    lo, hi = (0.0, 1.0) if name == "log1p_unit" else (lo, hi)
    lo, hi = (1e-300, 1e6) if name == "log" else (lo, hi)
    x = np.concatenate([rng.uniform(lo, hi, 150), rng.uniform(-0.5, 0.5, 50)])
    if name == "log1p":
        x = np.concatenate([x, -1.0 + np.exp(rng.uniform(-36.0, 0.0, 50))])
    if name in ("log1p_unit", "log"):
        x = np.abs(x)
    if name == "log":  # every binade, subnormals included
        x = np.concatenate([x, np.exp(rng.uniform(-744.0, 709.0, 100)), [5e-324, 1.0]])
    with mpmath.workdps(50):
        desired = np.array([float(ref(mpmath.mpf(float(v)))) for v in x])
    assert _ulp_error(_apply(name, x, build), desired) <= MAX_ULP


def test_exp_overflow_underflow_and_specials(build):
    big = np.log(np.finfo(np.float64).max)
    x = np.array([big, np.nextafter(big, np.inf), 710.0, 1e300, np.inf])
    out = _apply("exp", x, build)
    assert np.isfinite(out[0]) and np.all(np.isinf(out[1:]))
    x = np.array([-708.0, -740.0, -745.1, -745.2, -1e300, -np.inf])
    out = _apply("exp", x, build)
    assert _ulp_error(out, np.exp(x)) <= 1.0  # subnormals (within one step), then zeros
    np.testing.assert_array_equal(out[3:], 0.0)
    assert out[1] > 0 and out[1] < np.finfo(np.float64).tiny
    x = np.array([0.0, -0.0, 5e-324, -5e-324])
    np.testing.assert_array_equal(_apply("exp", x, build), np.ones(4))


def test_expm1_specials(build):
    x = np.array([0.0, -0.0, 5e-324, -1e-310, 1e-300, -np.inf, np.inf, 710.0, -800.0])
    out = _apply("expm1", x, build)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, np.expm1(x))
    np.testing.assert_array_equal(np.signbit(out[:2]), [False, True])


def test_log1p_specials():
    x = np.array([0.0, -0.0, 5e-324, -5e-324, -1.0, np.inf, 1.7976931348623157e308])
    with np.errstate(divide="ignore"):
        desired = np.log1p(x)
    out = _apply("log1p", x)
    np.testing.assert_array_equal(out, desired)
    np.testing.assert_array_equal(np.signbit(out[:2]), [False, True])
    below = np.array([-1.0 - 2.0**-52, -2.0, -1e300, -np.inf])
    assert np.all(np.isnan(_apply("log1p", below)))


@pytest.mark.parametrize("name", ["exp", "expm1", "log1p"])
def test_nan_propagates(name, build):
    x = np.array([np.nan, -np.nan, 1.0, np.nan])
    out = _apply(name, x, build)
    np.testing.assert_array_equal(np.isnan(out), [True, True, False, True])


def test_reduction_constants():
    """``LN2_HI + LN2_LO`` is ln 2 to far below float64 rounding, and ``k * LN2_HI`` is
    exact for every ``|k| < 2048`` (11 trailing zero bits)."""
    with mpmath.workdps(50):
        err = mpmath.mpf(vm.LN2_HI) + mpmath.mpf(vm.LN2_LO) - mpmath.log(2)
        assert abs(err) < mpmath.mpf(2) ** -100
    bits = np.array([vm.LN2_HI]).view(np.int64)[0]
    assert bits & ((1 << 11) - 1) == 0
    assert vm.INV_LN2 == float(1 / mpmath.log(2))


def test_log_specials_and_float32(build):
    x = np.array([0.0, -0.0, np.inf, -1.0, -np.inf, np.nan, 1.0, 5e-324, 2.2250738585072014e-308])
    with np.errstate(all="ignore"):
        want = np.log(x)
    assert _ulp_error(_apply("log", x, build), want) <= MAX_ULP
    # float32 through the float64 function, rounded once: within half an ulp of float32's
    # correctly rounded log, plus the float64 error
    rng = np.random.default_rng(5)
    x32 = np.exp(rng.uniform(-103.0, 88.0, 20_000)).astype(np.float32)
    out = np.empty_like(x32)
    _kmap_log(x32, out)
    assert out.dtype == np.float32
    assert _ulp_error(out, np.log(x32.astype(np.float64)).astype(np.float32)) <= 1.0
