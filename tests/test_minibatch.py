"""MinibatchTilt: full-batch exactness, the running recursion, special tilts, state, errors.

References: ``tilted_weights``/``hierarchical_weights``/``tilted_risk`` on the full batch,
50-digit mpmath for the weights and for the paper's running recursion, and plain NumPy
for the t = 0 and +-inf limits.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import tiltlab
from tiltlab.minibatch import MinibatchTilt, linear_schedule
from tiltlab.testing import assert_close

ESTIMATORS = ["running", "mlmc", "variational"]
TILTS = [-2.0, -1e-7, 0.0, 0.5, 10.0, math.inf, -math.inf]


def _losses(n=64, seed=0):
    return np.random.default_rng(seed).exponential(size=n)


def _make(t, estimator, n):
    return MinibatchTilt(t, estimator=estimator, base_batch_size=4, max_level=3, n_samples=n)


def _mp_weights(l, t):
    with mpmath.workdps(50):
        e = [mpmath.exp(mpmath.mpf(t) * mpmath.mpf(float(x))) for x in l]
        s = mpmath.fsum(e)
        return np.array([float(v / s) for v in e])


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("t", TILTS)
def test_full_batch_is_exact(xp, estimator, t):
    if estimator == "variational" and math.isinf(t):
        pytest.skip("the variational form needs a finite tilt")
    l_np = _losses()
    l = xp.asarray(l_np)
    tilt = _make(t, estimator, l_np.size)
    w = tilt.weights(l)
    assert_close(w, tiltlab.tilted_weights(l_np, t), xp=xp, dtype=xp.float64, rtol=1e-12)
    if math.isfinite(t):
        assert_close(w, _mp_weights(l_np, t), xp=xp, rtol=1e-12)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("t", [-2.0, 0.0, 1e-9, 3.0, math.inf])
def test_full_batch_value(estimator, t):
    if estimator == "variational" and math.isinf(t):
        pytest.skip("finite tilts only")
    l = _losses()
    value = _make(t, estimator, l.size)(l)
    assert_close(value, float(tiltlab.tilted_risk(l, t)), rtol=1e-12)


@pytest.mark.parametrize(
    "tilts", [(1.0, -2.0), (0.0, 0.0), (-1.5, 3.0), (5.0, 0.0), (math.inf, 1.0), (2.0, -math.inf)]
)
def test_hierarchical_full_batch_is_exact(xp, tilts):
    l_np = _losses(60, seed=1)
    g_np = np.random.default_rng(2).integers(0, 4, size=60)
    tilt = MinibatchTilt(tilts=tilts, n_groups=4)
    w = tilt.weights(xp.asarray(l_np), groups=xp.asarray(g_np))
    ref = tiltlab.hierarchical_weights(l_np, g_np, tilts)
    assert_close(w, ref, xp=xp, dtype=xp.float64, rtol=1e-12, atol=1e-15)


def test_hierarchical_equal_tilts_is_sample_level():
    l = _losses(40)
    g = np.arange(40) % 5
    a = MinibatchTilt(tilts=(1.5, 1.5), n_groups=5)
    assert_close(a(l, groups=g), float(tiltlab.tilted_risk(l, 1.5)), rtol=1e-12)


def _mp_running(batches, t, lam):
    """The paper's recursion, started at the first batch, in 50-digit arithmetic."""
    with mpmath.workdps(50):
        t = mpmath.mpf(t)

        def batch_risk(b):
            return (
                mpmath.log(mpmath.fsum(mpmath.exp(t * mpmath.mpf(float(x))) for x in b) / len(b))
                / t
            )

        r = batch_risk(batches[0])
        for b in batches[1:]:
            r = mpmath.log((1 - lam) * mpmath.exp(t * r) + lam * mpmath.exp(t * batch_risk(b))) / t
        return r


@pytest.mark.parametrize("t", [-3.0, -0.01, 0.7, 25.0])
def test_running_recursion_against_mpmath(xp, t):
    rng = np.random.default_rng(3)
    batches = [rng.exponential(size=8) * (1 + k) for k in range(5)]
    tilt = MinibatchTilt(t, lam=0.3)
    for b in batches:
        w = tilt.weights(xp.asarray(b))
    risk = _mp_running(batches, t, mpmath.mpf("0.3"))
    value = tilt.state_dict()["risk"][0]
    assert_close(value, float(risk), xp=xp, rtol=1e-12)
    # weights of the last batch: exp(t (l - R~)) / |B|
    with mpmath.workdps(50):
        ref = [float(mpmath.exp(t * (mpmath.mpf(float(x)) - risk)) / 8) for x in batches[-1]]
    assert_close(w, np.array(ref), xp=xp, rtol=1e-11)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_at_t_zero_is_the_batch_mean(estimator):
    rng = np.random.default_rng(8)
    tilt = MinibatchTilt(0.0, estimator=estimator, base_batch_size=2, max_level=2)
    for _ in range(3):
        b = rng.exponential(size=8)
        np.testing.assert_allclose(tilt.weights(b), np.full(8, 1 / 8), rtol=1e-15)
    b = rng.exponential(size=4)
    assert float(tilt(b)) == pytest.approx(np.mean(b), rel=1e-15)


def test_running_t_zero_is_plain_mean():
    rng = np.random.default_rng(4)
    tilt = MinibatchTilt(0.0)
    for _ in range(3):
        b = rng.exponential(size=7)
        w = tilt.weights(b)
        assert np.all(w == 1 / 7)
    b = rng.exponential(size=5)
    assert float(tilt(b)) == np.mean(b)


@pytest.mark.parametrize("estimator", ["running", "mlmc"])
def test_infinite_tilts_are_max_and_min(estimator):
    b = np.array([0.5, 2.0, 0.1, 2.0, 0.3, 0.1, 1.0, 0.7])
    for t, ext in [(math.inf, 2.0), (-math.inf, 0.1)]:
        tilt = MinibatchTilt(t, estimator=estimator, base_batch_size=4, max_level=1)
        tilt.weights(np.ones(8))  # an earlier batch does not matter at +-inf
        w = tilt.weights(b)
        if estimator == "running":
            assert float(tilt(b)) == ext
            np.testing.assert_array_equal(w, np.where(b == ext, 0.5, 0.0))
        # mlmc: the plug-in weights sum to one and vanish off the extremes of each part
        assert w.sum() == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_half_precision_accumulates_in_float32(dtype_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    # t * l in the thousands: exp(t l) overflows float16, bfloat16 and float32 alike
    l64 = np.array([100.0, 180.0, 250.0, 300.0, 310.0, 120.0])
    l = torch.tensor(l64, dtype=dtype)
    for t in [10.0, -10.0]:
        tilt = MinibatchTilt(t)
        w = tilt.weights(l)
        assert w.dtype == torch.float32
        ref = tiltlab.tilted_weights(l.to(torch.float64).numpy(), t)
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5, atol=1e-30)
        w2 = tilt.weights(l[:3] + 5)  # a later batch: finite, bounded by 1/lam
        assert torch.isfinite(w2).all() and float(w2.max()) <= 1 / tilt.lam + 1e-6


def test_numpy_float16_and_float32():
    l = np.array([40.0, 900.0, 1000.0], dtype=np.float16)
    w = MinibatchTilt(5.0).weights(l)
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, tiltlab.tilted_weights(l.astype(np.float64), 5.0), atol=1e-6)
    w32 = MinibatchTilt(-1.0).weights(np.array([1.0, 2.0], dtype=np.float32))
    assert w32.dtype == np.float32


def test_state_dict_round_trip_and_reset():
    rng = np.random.default_rng(5)
    batches = [rng.exponential(size=6) for _ in range(6)]
    g = [rng.integers(0, 3, size=6) for _ in range(6)]
    a = MinibatchTilt(tilts=(1.0, -1.0), n_groups=3, lam=0.2)
    for b, gg in zip(batches[:3], g[:3], strict=True):
        a.weights(b, groups=gg)
    b_ = MinibatchTilt(tilts=(1.0, -1.0), n_groups=3, lam=0.2)
    b_.load_state_dict(a.state_dict())
    assert b_.step == 3
    for b, gg in zip(batches[3:], g[3:], strict=True):
        np.testing.assert_array_equal(a.weights(b, groups=gg), b_.weights(b, groups=gg))
    a.reset()
    assert a.step == 0 and "risk" not in a.state_dict()
    fresh = MinibatchTilt(tilts=(1.0, -1.0), n_groups=3, lam=0.2)
    np.testing.assert_array_equal(
        a.weights(batches[0], groups=g[0]), fresh.weights(batches[0], groups=g[0])
    )


def test_state_follows_the_namespace(xp):
    tilt = MinibatchTilt(1.0)
    tilt.weights(xp.asarray(_losses(8)))
    state = tilt.state_dict()
    assert type(state["risk"]) is type(xp.asarray(_losses(8)))


def test_schedule_and_settable_tilt():
    l = _losses(16)
    tilt = MinibatchTilt(linear_schedule(0.0, -2.0, steps=4), lam=1.0)
    seen = []
    for _ in range(6):
        seen.append(tilt.current_tilts()[1])
        w = tilt.weights(l)
    assert seen == [0.0, -0.5, -1.0, -1.5, -2.0, -2.0]
    # lam = 1: every batch is its own normaliser, so a full batch is exact at every step
    np.testing.assert_allclose(w, tiltlab.tilted_weights(l, -2.0), rtol=1e-12)
    tilt.t = 3.0
    np.testing.assert_allclose(tilt.weights(l), tiltlab.tilted_weights(l, 3.0), rtol=1e-12)


def test_call_gradient_on_torch():
    torch = pytest.importorskip("torch")
    l_np = _losses(32)
    l = torch.tensor(l_np, requires_grad=True)
    tilt = MinibatchTilt(-1.5)
    out = tilt(l)
    (grad,) = torch.autograd.grad(out, l)
    np.testing.assert_allclose(grad.numpy(), _mp_weights(l_np, -1.5), rtol=1e-12)
    assert float(out.detach()) == pytest.approx(float(tiltlab.tilted_risk(l_np, -1.5)), rel=1e-12)


def test_bad_input():
    tilt = MinibatchTilt(1.0)
    with pytest.raises(ValueError, match="`losses`.*one-dimensional"):
        tilt.weights(np.ones((2, 3)))
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        tilt.weights(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="`losses` contains infinite"):
        tilt.weights(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="`losses` is empty"):
        tilt.weights(np.array([]))
    with pytest.raises(TypeError, match="`losses`"):
        tilt.weights([1.0, 2.0])
    with pytest.raises(ValueError, match="`groups`"):
        tilt.weights(np.ones(3), groups=np.zeros(3, dtype=int))
    with pytest.raises(TypeError, match="`t`"):
        MinibatchTilt("2")
    with pytest.raises(TypeError, match="`t`"):
        MinibatchTilt(True)
    with pytest.raises(ValueError, match="`t`"):
        MinibatchTilt(float("nan"))
    with pytest.raises(ValueError, match="`t`.*`tilts`"):
        MinibatchTilt()
    with pytest.raises(ValueError, match="`lam`"):
        MinibatchTilt(1.0, lam=0.0)
    with pytest.raises(ValueError, match="`estimator`"):
        MinibatchTilt(1.0, estimator="exact")
    with pytest.raises(ValueError, match="`t` must be finite"):
        MinibatchTilt(math.inf, estimator="variational")
    with pytest.raises(ValueError, match="`base_batch_size`"):
        MinibatchTilt(1.0, estimator="mlmc")
    with pytest.raises(ValueError, match="`losses` has 5 samples"):
        MinibatchTilt(1.0, estimator="mlmc", base_batch_size=2).weights(np.ones(5))
    with pytest.raises(TypeError, match=r"`t\(step=0\)`"):
        MinibatchTilt(lambda step: "x").weights(np.ones(2))
    group_level = MinibatchTilt(tilts=(1.0, 0.0), n_groups=2)
    with pytest.raises(ValueError, match="`groups` is required"):
        group_level.weights(np.ones(3))
    with pytest.raises(ValueError, match="`groups` must have one label per loss"):
        group_level.weights(np.ones(3), groups=np.array([0, 1]))
    with pytest.raises(ValueError, match=r"`groups` labels must lie in \[0, n_groups\)"):
        group_level.weights(np.ones(2), groups=np.array([0, 2]))
    with pytest.raises(TypeError, match="`groups` must hold integer labels"):
        group_level.weights(np.ones(2), groups=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="`n_groups`"):
        MinibatchTilt(tilts=(1.0, 0.0))
    with pytest.raises(ValueError, match="`tilts`"):
        MinibatchTilt(tilts=(1.0, 0.0, 2.0), n_groups=2)
    with pytest.raises(ValueError, match="`tilts`.*running"):
        MinibatchTilt(tilts=(1.0, 0.0), n_groups=2, estimator="mlmc", base_batch_size=2)


def test_no_memory_is_the_plug_in_even_far_from_the_state():
    # lam = 1: each batch is normalised by its own tilted risk, whatever came before
    tilt = MinibatchTilt(-3.0, lam=1.0)
    tilt.weights(np.array([0.0, 0.1]))
    far = np.array([400.0, 401.0, 405.0])
    np.testing.assert_allclose(
        tilt.weights(far), tiltlab.tilted_weights(far, -3.0) / 1.0, rtol=1e-12
    )


def test_reproducible_with_the_sampler_seed():
    l = _losses(256, seed=7)

    def run():
        tilt = MinibatchTilt(1.0, estimator="mlmc", base_batch_size=4, max_level=3)
        return [tilt.weights(l[b]) for b in tilt.batch_sampler(256, num_batches=20, seed=3)]

    for a, b in zip(run(), run(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_running_update_at_a_tilt_below_the_dtype_range():
    # t = 1e-300 is zero in float32: the update is the t -> 0 limit, the linear average
    # (it was 0 / 0 = NaN when t * gap and the division were formed in float32)
    from tiltlab.accumulator.packed import running_update

    prev, batch = np.array([2.0], np.float32), np.array([4.5], np.float32)
    for t in (1e-300, -1e-300, 1e-42):
        got = running_update(prev, batch, t, 0.4, np)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, [2.0 + 0.4 * 2.5], rtol=4 * np.finfo(np.float32).eps)


def _mlmc_expectation(tilt, l, g):
    """Exact mean over the sampler's distribution of (value, sum_i w_i g_i): every level J
    with its probability, every ordered batch of distinct indices of that level's size."""
    import itertools

    from tiltlab.minibatch import level_probabilities

    value = grad = 0.0
    for j, p in enumerate(level_probabilities(tilt.max_level), start=1):
        batches = list(itertools.permutations(range(l.size), tilt.base_batch_size * 2**j))
        for b in batches:
            idx = list(b)
            w = tilt.weights(l[idx])
            value += p * float(tilt(l[idx])) / len(batches)
            grad += p * float(w @ g[idx]) / len(batches)
    return value, grad


@pytest.mark.parametrize("t", [-1.5, 2.0])
def test_mlmc_mean_is_the_full_data_when_the_largest_batch_is_the_data(t):
    # brute force over every batch the sampler can draw: with the largest level the whole
    # data set, the multilevel mean is exactly the full-data tilted risk and gradient
    rng = np.random.default_rng(4)
    l, g = rng.exponential(size=4), rng.normal(size=4)
    tilt = MinibatchTilt(t, estimator="mlmc", base_batch_size=1, max_level=2)
    assert len(tilt.batch_sampler(4)) >= 1  # the sampler accepts this data set
    value, grad = _mlmc_expectation(tilt, l, g)
    assert value == pytest.approx(float(tiltlab.tilted_risk(l, t)), rel=1e-12)
    assert grad == pytest.approx(float(tiltlab.tilted_weights(l, t) @ g), rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("n_samples", [2, 3, 4])
def test_mlmc_n_samples_not_above_the_largest_batch_is_refused(n_samples):
    # n_samples = base * 2**max_level made the batches of the largest level (the whole
    # data set) exact plug-ins instead of level corrections: the mean was biased (brute
    # force: the value by 0.013, the gradient by 0.056 on 8 losses at t = 2); below it, the
    # largest level cannot be drawn at all
    with pytest.raises(ValueError, match="`n_samples`"):
        MinibatchTilt(2.0, estimator="mlmc", base_batch_size=1, max_level=2, n_samples=n_samples)
    MinibatchTilt(2.0, estimator="mlmc", base_batch_size=1, max_level=2, n_samples=5)


def test_linear_schedule_ends_exactly_at_its_endpoints():
    # start + (stop - start) * 1 is stop only up to an ulp (-1.0838099947183877 to
    # 3.902743520047924 ended at 3.9027435200479244): the schedule did not stay at `stop`
    rng = np.random.default_rng(0)
    for start, stop in rng.uniform(-5.0, 5.0, size=(200, 2)):
        schedule = linear_schedule(float(start), float(stop), steps=7)
        assert schedule(0) == start
        assert schedule(7) == stop
        assert schedule(1000) == stop
        assert schedule(3) == pytest.approx(start + (stop - start) * 3 / 7, rel=1e-14, abs=1e-14)


@pytest.mark.parametrize(
    ("dtype", "t"),
    [("float32", 1e-42), ("float32", 1e-45), ("float32", 1e-50), ("float64", 1e-320)],
)
def test_variational_value_at_a_tilt_below_the_dtype_range(dtype, t):
    # eta + expm1(t (R_B - eta)) / t divided by t in the losses' dtype: NaN (0 / 0) once t
    # underflows there, and a few digits or 30% off while t is subnormal
    l1 = np.array([0.2, 1.7, 3.1], dtype=dtype)
    l2 = np.array([0.4, 1.5], dtype=dtype)
    tilt = MinibatchTilt(t, estimator="variational")
    tilt(l1)
    got = tilt(l2)
    with mpmath.workdps(400):  # exp(t x) = 1 + t x needs the digits of t and then some
        tm = mpmath.mpf(t)

        def risk(l):
            e = [mpmath.exp(tm * mpmath.mpf(float(x))) for x in l]
            return mpmath.log(mpmath.fsum(e) / len(l)) / tm

        eta = risk(l1)  # the first batch sets eta to its tilted risk
        want = float(eta + mpmath.expm1(tm * (risk(l2) - eta)) / tm)
    assert got.dtype == np.dtype(dtype)
    assert float(got) == pytest.approx(want, rel=4 * float(np.finfo(dtype).eps))
