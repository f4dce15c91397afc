"""TiltedLoss and MinibatchTilt under what users do: float64 and half-precision models,
schedules that return odd values, huge tilts, NumPy input, pickling, NaN batches, and no
host synchronisation per step.

References: the paper's running recursion written by hand in float64 in the log domain
(``np.logaddexp`` and ``scipy.special.logsumexp``), independent of tiltlab's kernels.
"""

from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
from scipy.special import logsumexp

torch = pytest.importorskip("torch")

from tiltlab.minibatch import MinibatchTilt, linear_schedule  # noqa: E402
from tiltlab.torch import TiltedLoss  # noqa: E402


def _reference_stream(batches, t, lam):
    """Weights of the last batch and the running risk: the paper's recursion in float64,
    ``R <- (1/t) log((1 - lam) e^{t R} + lam e^{t R_B})``, started at the first batch."""
    risk = None
    for b in batches:
        b = np.asarray(b, dtype=np.float64)
        batch = (logsumexp(t * b) - math.log(b.size)) / t
        if risk is None:
            risk = batch
        else:
            risk = np.logaddexp(math.log1p(-lam) + t * risk, math.log(lam) + t * batch) / t
        w = np.exp(t * (b - risk)) / b.size
    return w, risk


def _grad_weights(loss_fn, b):
    l = b.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss_fn(l), l)
    return g


def test_float64_losses_keep_a_float64_state_and_tilt():
    rng = np.random.default_rng(0)
    batches = [1000.0 + rng.uniform(0.0, 2.0, size=16) for _ in range(300)]
    loss_fn = TiltedLoss(t=5.0, lam=0.1)
    for b in batches:
        w = _grad_weights(loss_fn, torch.tensor(b))
    ref, risk = _reference_stream(batches, 5.0, 0.1)
    assert loss_fn.risk.dtype == torch.float64
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-9)
    assert float(loss_fn.risk[0]) == pytest.approx(risk, rel=1e-14)
    assert TiltedLoss(t=0.1).t == 0.1
    assert TiltedLoss(tilts=(0.1, 0.3), n_groups=2).tilts == (0.1, 0.3)


@pytest.mark.parametrize("tilts", [(1.0, -1.0), (0.0, 2.0), (-2.0, 0.5), (1.0, 0.0)])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_float64_losses_at_group_level(tilts, device):
    # float64 losses widen the running state to float64, not the float32 diagnostic of
    # the effective sample size, which the step writes all the same (it used to fail to:
    # a float64 result written in place into the float32 buffer); on the first step the
    # value is the two-level tilted risk of the batch (NumPy's hierarchical_risk)
    import tiltlab as tl

    rng = np.random.default_rng(3)
    loss_fn = TiltedLoss(tilts=tilts, n_groups=3)
    for step in range(3):
        b = rng.uniform(0.0, 3.0, size=12)
        g = np.arange(12) % 3
        l = torch.tensor(b, dtype=torch.float64, device=device, requires_grad=True)
        out = loss_fn(l, groups=torch.tensor(g, device=device))
        out.backward()
        assert out.dtype == torch.float64 and l.grad.dtype == torch.float64
        if device == "cpu" and step == 0:
            want = tl.hierarchical_risk(b, [g], list(tilts))
            assert float(out.detach()) == pytest.approx(float(want), rel=1e-12)
    assert loss_fn.risk.dtype == torch.float64 and loss_fn.ess.dtype == torch.float32
    if device == "cpu":
        assert bool(torch.all((loss_fn.ess > 0) & (loss_fn.ess <= 1)))


@pytest.mark.parametrize("cast", ["half", "bfloat16"])
def test_module_cast_to_half_keeps_the_state_in_float32(cast):
    dtype = {"half": torch.float16, "bfloat16": torch.bfloat16}[cast]
    rng = np.random.default_rng(1)
    batches = [torch.tensor(5.0 + rng.uniform(0.0, 3.0, size=32)).to(dtype) for _ in range(50)]
    loss_fn = getattr(TiltedLoss(t=4.0, lam=0.1), cast)()
    assert loss_fn.risk.dtype == torch.float32
    for b in batches:
        w = _grad_weights(loss_fn, b)
    ref, risk = _reference_stream([b.double().numpy() for b in batches], 4.0, 0.1)
    assert loss_fn.risk.dtype == torch.float32
    # the state: float32 rounding of a risk near 8 (a half-precision state is 1e-2 off)
    assert float(loss_fn.risk[0]) == pytest.approx(risk, abs=1e-5)
    # the gradient reaches the half-precision losses rounded to their precision
    rtol = {"half": 2e-3, "bfloat16": 1e-2}[cast]
    np.testing.assert_allclose(w.double().numpy(), ref, rtol=rtol, atol=rtol * 1e-2)
    variational = getattr(TiltedLoss(t=1.0, estimator="variational"), cast)()
    assert variational.eta.dtype == torch.float32


@pytest.mark.parametrize("bad", [math.nan, "tensor-nan", "vector"])
def test_schedule_results_are_validated(bad):
    values = {
        math.nan: math.nan,
        "tensor-nan": torch.tensor(math.nan),
        "vector": torch.tensor([1.0]),
    }

    def schedule(step):
        return values[bad]

    loss_fn = TiltedLoss(t=schedule)
    error = TypeError if bad == "vector" else ValueError
    with pytest.raises(error, match=r"`t\(step=0\)`"):
        loss_fn(torch.rand(4))
    assert int(loss_fn.step) == 0


def test_schedule_reaching_infinity_is_refused_by_the_variational_estimator():
    loss_fn = TiltedLoss(t=lambda step: math.inf, estimator="variational")
    with pytest.raises(ValueError, match="`t` must be finite"):
        loss_fn(torch.rand(4))
    group = TiltedLoss(tilts=(lambda step: math.nan, 0.0), n_groups=2)
    with pytest.raises(ValueError, match=r"`tilts\[0\]\(step=0\)`"):
        group(torch.rand(4), groups=torch.tensor([0, 1, 0, 1]))


def test_huge_tilt_is_accepted_as_a_number():
    loss_fn = TiltedLoss(t=1e39)
    assert loss_fn.t == 1e39
    l = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float32)
    assert float(loss_fn(l)) == 2.0  # beyond float32's range: the maximum
    l64 = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64, requires_grad=True)
    out = TiltedLoss(t=1e39)(l64)
    (g,) = torch.autograd.grad(out, l64)
    assert float(out.detach()) == pytest.approx(2.0, abs=1e-30)
    np.testing.assert_array_equal(g.numpy(), [0.0, 1.0, 0.0])


def test_numpy_and_list_losses_raise_a_type_error_naming_them():
    loss_fn = TiltedLoss(t=1.0)
    with pytest.raises(TypeError, match="`losses` must be a torch.Tensor"):
        loss_fn(np.ones(3))
    with pytest.raises(TypeError, match="`losses` must be a torch.Tensor"):
        loss_fn([1.0, 2.0])
    wrapped = TiltedLoss(lambda x, y: np.ones(3), t=1.0)
    with pytest.raises(TypeError, match="criterion's result must be a torch.Tensor"):
        wrapped(torch.ones(3), torch.ones(3))


def test_schedules_and_losses_pickle():
    schedule = linear_schedule(0.0, -2.0, steps=10)
    again = pickle.loads(pickle.dumps(schedule))
    assert [again(s) for s in (0, 5, 10, 20)] == [0.0, -1.0, -2.0, -2.0]
    model = torch.nn.ModuleDict(
        {
            "net": torch.nn.Linear(3, 2),
            "loss_fn": TiltedLoss(torch.nn.CrossEntropyLoss(reduction="none"), t=schedule),
        }
    )
    model.loss_fn(model.net(torch.randn(4, 3)), torch.tensor([0, 1, 1, 0]))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert int(loaded.loss_fn.step) == 1 and loaded.loss_fn.t(5) == -1.0
    tilt = pickle.loads(pickle.dumps(MinibatchTilt(schedule)))
    assert tilt.current_tilts() == (0.0, 0.0)


@pytest.mark.parametrize("t", [0.0, 1.0, -2.0])
def test_minibatch_tilt_nan_batch_is_skipped_at_every_tilt(t):
    rng = np.random.default_rng(2)
    batches = [rng.exponential(size=6) for _ in range(4)]
    bad = batches[1].copy()
    bad[2] = np.nan
    clean = MinibatchTilt(t, check_finite=False)
    noisy = MinibatchTilt(t, check_finite=False)
    for k, b in enumerate(batches):
        if k == 2:
            w = noisy.weights(bad)
            assert np.all(np.isnan(w)) and np.isnan(float(noisy(bad)))
        np.testing.assert_array_equal(noisy.weights(b), clean.weights(b))


@pytest.mark.parametrize("estimator", ["running", "variational"])
def test_nan_batch_returns_nan_and_leaves_the_state_without_grad(estimator):
    clean = TiltedLoss(t=1.0, estimator=estimator, check_finite=False).double()
    noisy = TiltedLoss(t=1.0, estimator=estimator, check_finite=False).double()
    first, later = torch.tensor([0.1, 0.5, 0.3]), torch.tensor([0.2, 0.4])
    clean(first)
    noisy(first)
    with torch.no_grad():
        out = noisy(torch.tensor([0.2, math.nan]))
    assert math.isnan(float(out))
    assert float(noisy(later).detach()) == float(clean(later).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_nan_batch_returns_nan(dtype):
    # float32 losses fit the fresh state; float64 ones need it widened first, which
    # fullgraph=True cannot do inside the graph: .double() before compiling (documented)
    torch._dynamo.reset()
    module = TiltedLoss(t=1.0)
    if dtype == torch.float64:
        module = module.double()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    compiled(torch.tensor([0.1, 0.5, 0.3], dtype=dtype))
    risk = module.risk.clone()
    with torch.no_grad():
        out = compiled(torch.tensor([0.2, math.nan, 0.1], dtype=dtype))
    assert math.isnan(float(out))
    assert torch.equal(module.risk, risk)
    with pytest.raises(ValueError, match="1 batch"):
        module.check()
    module.check()  # reported once


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(t=-2.0),
        dict(t=linear_schedule(0.0, 2.0, 5)),
        dict(tilts=(1.0, -1.0), n_groups=3),
        dict(tilts=(1.0, 0.0), n_groups=3),
        dict(tilts=(linear_schedule(0.0, 1.0, 5), 0.01), n_groups=3),
        dict(t=1.0, estimator="variational"),
        dict(t=0.0),
    ],
)
def test_a_step_reads_nothing_from_the_device(kwargs):
    # a meta tensor has no data: any read of a value (.item(), bool(), a NaN check on the
    # host) raises; the loss, its state and its step all run on that device
    loss_fn = TiltedLoss(**kwargs)
    for _ in range(3):
        l = torch.rand(8, device="meta", requires_grad=True)
        groups = torch.zeros(8, dtype=torch.int64, device="meta")
        out = loss_fn(l, groups=groups if "tilts" in kwargs else None)
        out.backward()
        assert out.device.type == "meta" and loss_fn.step.device.type == "meta"


def test_cpu_nan_batch_raises_at_once_and_leaves_the_state():
    loss_fn = TiltedLoss(t=1.0)
    loss_fn(torch.tensor([0.1, 0.2]))
    risk = loss_fn.risk.clone()
    with pytest.raises(ValueError, match="`losses` contains NaN or infinite"):
        loss_fn(torch.tensor([0.1, math.nan]))
    assert torch.equal(loss_fn.risk, risk) and int(loss_fn.step) == 1
    with pytest.raises(ValueError, match="`groups` labels"):
        TiltedLoss(tilts=(1.0, 0.0), n_groups=2)(torch.ones(2), groups=torch.tensor([0, 2]))
