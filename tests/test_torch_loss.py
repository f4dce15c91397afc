"""TiltedLoss: exactness against autograd of the exact tilted risk, buffers, compile,
autocast, schedules, the variational parameter, errors, and that ``import tiltlab`` does
not import torch."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiltlab  # noqa: E402
from tiltlab.minibatch import linear_schedule  # noqa: E402
from tiltlab.torch import TiltedLoss  # noqa: E402


def _data(n=64, d=5, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, k, (n,), generator=g)
    W = torch.randn(d, k, generator=g, dtype=torch.float64, requires_grad=True)
    return X, y, W


def _exact_risk(losses, t):
    """The tilted risk written directly with torch.logsumexp (independent of tiltlab)."""
    n = losses.shape[0]
    if t == 0:
        return losses.mean()
    return (torch.logsumexp(t * losses, 0) - math.log(n)) / t


@pytest.mark.parametrize("estimator", ["running", "mlmc", "variational"])
@pytest.mark.parametrize("t", [-2.0, 0.0, 0.5, 4.0])
def test_full_batch_gradient_matches_autograd_of_exact_risk(estimator, t):
    X, y, W = _data()
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    # mlmc: the largest batch (4 * 2**3 = 32) is below n_samples, so a batch of all 64
    # samples is the whole data set and gets the exact weights
    kwargs = dict(estimator=estimator, base_batch_size=4, max_level=3, n_samples=64)
    loss_fn = TiltedLoss(ce, t=t, **kwargs).double()
    out = loss_fn(X @ W, y)
    (g,) = torch.autograd.grad(out, W)
    exact = _exact_risk(ce(X @ W, y), t)
    (g_ref,) = torch.autograd.grad(exact, W)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out.detach(), exact.detach(), rtol=1e-12, atol=0)


def _mlmc_mean(loss_fn, l, g):
    """Exact mean over the multilevel sampler's distribution of (value, sum_i w_i g_i):
    every level J with its probability, every ordered batch of distinct indices of that
    level's size."""
    import itertools

    from tiltlab.minibatch import level_probabilities

    value = grad = 0.0
    for j, p in enumerate(level_probabilities(loss_fn.max_level), start=1):
        batches = list(itertools.permutations(range(l.shape[0]), loss_fn.base_batch_size * 2**j))
        for b in batches:
            x = l[list(b)].clone().requires_grad_(True)
            out = loss_fn(x)
            (w,) = torch.autograd.grad(out, x)
            value += p * out.item() / len(batches)
            grad += p * float(w @ g[list(b)]) / len(batches)
    return value, grad


@pytest.mark.parametrize("t", [-1.5, 2.0])
def test_mlmc_mean_over_every_batch_is_the_plug_in_at_the_largest_batch(t):
    # brute force over every batch the sampler can draw: the multilevel mean is the
    # expected plug-in on the largest batch (4 of the 5 samples), written with logsumexp
    import itertools

    gen = torch.Generator().manual_seed(4)
    l = torch.rand(5, generator=gen, dtype=torch.float64) * 3
    g = torch.randn(5, generator=gen, dtype=torch.float64)
    loss_fn = TiltedLoss(t=t, estimator="mlmc", base_batch_size=1, max_level=2, n_samples=5)
    value, grad = _mlmc_mean(loss_fn.double(), l, g)
    subsets = list(itertools.combinations(range(5), 4))
    ref_value = ref_grad = 0.0
    for s in subsets:
        risk = _exact_risk(l[list(s)], t)
        w = torch.softmax(t * l[list(s)], 0)
        ref_value += risk.item() / len(subsets)
        ref_grad += float(w @ g[list(s)]) / len(subsets)
    assert value == pytest.approx(ref_value, rel=1e-12)
    assert grad == pytest.approx(ref_grad, rel=1e-12, abs=1e-14)


def test_mlmc_mean_is_the_full_data_when_the_largest_batch_is_the_data():
    # n_samples left out and the largest batch the whole data set: the multilevel mean
    # is the full-data tilted risk and gradient
    gen = torch.Generator().manual_seed(5)
    l = torch.rand(4, generator=gen, dtype=torch.float64) * 3
    g = torch.randn(4, generator=gen, dtype=torch.float64)
    loss_fn = TiltedLoss(t=2.0, estimator="mlmc", base_batch_size=1, max_level=2).double()
    value, grad = _mlmc_mean(loss_fn, l, g)
    assert value == pytest.approx(_exact_risk(l, 2.0).item(), rel=1e-12)
    ref_grad = float(torch.softmax(2.0 * l, 0) @ g)
    assert grad == pytest.approx(ref_grad, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("n_samples", [2, 3, 4])
def test_mlmc_n_samples_not_above_the_largest_batch_is_refused(n_samples):
    # n_samples = base * 2**max_level made the batches of the largest level (the whole
    # data set) exact plug-ins instead of level corrections: the mean was biased (brute
    # force on 4 losses at t = 2: the value by 0.034, the gradient by 0.13); below it, the
    # largest level cannot be drawn at all
    with pytest.raises(ValueError, match="`n_samples`"):
        TiltedLoss(t=2.0, estimator="mlmc", base_batch_size=1, max_level=2, n_samples=n_samples)
    TiltedLoss(t=2.0, estimator="mlmc", base_batch_size=1, max_level=2, n_samples=5)


def test_t_zero_is_the_mean_loss_exactly():
    X, y, W = _data()
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    loss_fn = TiltedLoss(ce, t=0.0).double()
    for k in range(3):
        sl = slice(16 * k, 16 * (k + 1))
        out = loss_fn(X[sl] @ W, y[sl])
        ref = ce(X[sl] @ W, y[sl]).mean()
        assert out.item() == ref.item()
        (g,) = torch.autograd.grad(out, W)
        (g_ref,) = torch.autograd.grad(ref, W)
        torch.testing.assert_close(g, g_ref, rtol=1e-15, atol=1e-16)


def test_class_level_tilting_matches_hierarchical_weights():
    X, y, W = _data(n=60, k=4)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    loss_fn = TiltedLoss(ce, tilts=(2.0, -1.0), n_groups=4).double()
    losses = ce(X @ W, y)
    out = loss_fn(X @ W, y, groups=y)
    (g,) = torch.autograd.grad(out, W)
    w = tiltlab.hierarchical_weights(losses.detach().numpy(), y.numpy(), (2.0, -1.0))
    (g_ref,) = torch.autograd.grad((torch.as_tensor(w) * losses).sum(), W)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    ref = tiltlab.hierarchical_risk(losses.detach().numpy(), y.numpy(), (2.0, -1.0))
    assert out.item() == pytest.approx(float(ref), rel=1e-12)


def test_vector_of_losses_and_buffers_in_state_dict():
    loss_fn = TiltedLoss(t=1.0, lam=0.5)
    assert set(loss_fn.state_dict()) == {"_extra_state", "step", "risk", "seen", "counts"}
    rng = np.random.default_rng(0)
    batches = [torch.tensor(rng.exponential(size=8), dtype=torch.float32) for _ in range(4)]
    for b in batches[:2]:
        loss_fn(b)
    other = TiltedLoss(t=1.0, lam=0.5)
    other.load_state_dict(loss_fn.state_dict())
    assert int(other.step) == 2
    for b in batches[2:]:
        assert loss_fn(b).item() == other(b).item()
    # the same stream through MinibatchTilt gives the same values
    from tiltlab.minibatch import MinibatchTilt

    ref = MinibatchTilt(1.0, lam=0.5)
    fresh = TiltedLoss(t=1.0, lam=0.5)
    for b in batches:
        np.testing.assert_allclose(fresh(b).item(), float(ref(b.numpy())), rtol=1e-6)
    fresh.reset()
    assert int(fresh.step) == 0 and float(fresh.seen.sum()) == 0


def test_schedule_and_settable_tilt():
    loss_fn = TiltedLoss(t=linear_schedule(0.0, -2.0, steps=4), lam=1.0).double()
    l = torch.tensor(np.random.default_rng(1).exponential(size=10), requires_grad=True)
    for _ in range(5):
        out = loss_fn(l)
    (g,) = torch.autograd.grad(out, l)
    np.testing.assert_allclose(
        g.numpy(), tiltlab.tilted_weights(l.detach().numpy(), -2.0), rtol=1e-12
    )
    loss_fn.t = 1.0
    assert loss_fn.t == 1.0 and loss_fn.state_dict()["_extra_state"]["tilts"] == [0.0, 1.0]


def test_variational_eta_is_a_parameter_with_exact_start():
    rng = np.random.default_rng(2)
    data = torch.tensor(rng.uniform(0.0, 2.0, size=512))
    t = 1.0
    loss_fn = TiltedLoss(t=t, estimator="variational").double()
    assert [name for name, _ in loss_fn.named_parameters()] == ["eta"]
    first = data[:32]
    loss_fn(first)
    assert loss_fn.eta.item() == pytest.approx(
        float(tiltlab.tilted_risk(first.numpy(), t)), rel=1e-12
    )
    # SGD on eta alone over random batches reaches the full-data tilted risk
    opt = torch.optim.SGD(loss_fn.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    trace = []
    for _ in range(3000):
        idx = torch.randint(0, 512, (32,), generator=gen)
        opt.zero_grad()
        loss_fn(data[idx]).backward()
        opt.step()
        trace.append(loss_fn.eta.item())
    # the iterate average (the gradient in eta is unbiased, so its zero is the full risk)
    assert np.mean(trace[1500:]) == pytest.approx(
        float(tiltlab.tilted_risk(data.numpy(), t)), rel=0.02
    )


def test_variational_negative_tilt_ascends_in_eta():
    rng = np.random.default_rng(3)
    data = torch.tensor(rng.exponential(size=256))
    loss_fn = TiltedLoss(t=-2.0, estimator="variational").double()
    loss_fn(data[:8])
    with torch.no_grad():
        loss_fn.eta.fill_(2.0)  # far from the optimum
    opt = torch.optim.SGD(loss_fn.parameters(), lr=0.05)
    for _ in range(2000):
        opt.zero_grad()
        loss_fn(data).backward()
        opt.step()
    assert loss_fn.eta.item() == pytest.approx(
        float(tiltlab.tilted_risk(data.numpy(), -2.0)), rel=1e-6
    )


@pytest.mark.parametrize("estimator", ["running", "mlmc", "variational"])
def test_compile_fullgraph_without_breaks(estimator):
    # backend="aot_eager": the graph is traced in full (fullgraph=True fails on any break)
    # without inductor's C++ code generation, which takes minutes on a loaded 2-core box
    torch._dynamo.reset()
    kwargs = dict(estimator=estimator, base_batch_size=8, max_level=1)
    eager = TiltedLoss(t=linear_schedule(0.0, 2.0, 3), **kwargs)
    compiled_module = TiltedLoss(t=linear_schedule(0.0, 2.0, 3), **kwargs)
    graphs = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    compiled = torch.compile(compiled_module, fullgraph=True, backend=counting_backend)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        l = torch.rand(16, generator=gen, dtype=torch.float32)
        a = l.clone().requires_grad_(True)
        b = l.clone().requires_grad_(True)
        out_a, out_b = eager(a), compiled(b)
        out_a.backward()
        out_b.backward()
        torch.testing.assert_close(out_b, out_a, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7)
    assert int(compiled_module.step) == 5
    # the tilt and the step are tensors: the schedule moving t does not recompile
    assert len(graphs) <= 2


def test_compile_group_level():
    torch._dynamo.reset()
    eager = TiltedLoss(tilts=(1.0, -1.0), n_groups=3)
    module = TiltedLoss(tilts=(1.0, -1.0), n_groups=3)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        l = torch.rand(12, generator=gen, dtype=torch.float32)
        g = torch.randint(0, 3, (12,), generator=gen)
        torch.testing.assert_close(compiled(l, groups=g), eager(l, groups=g), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(module.risk, eager.risk)


def test_autocast_bfloat16_on_cpu():
    X, y, W = _data()
    model = torch.nn.Linear(5, 3, dtype=torch.float32)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    loss_fn = TiltedLoss(ce, t=-1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(X.float())
        assert logits.dtype == torch.bfloat16
        out = loss_fn(logits, y)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert torch.isfinite(model.weight.grad).all()


def test_half_losses_with_large_tilted_values():
    l = torch.tensor([300.0, 400.0, 1000.0, 20.0], dtype=torch.float16, requires_grad=True)
    out = TiltedLoss(t=5.0)(l)  # t * l = 5000
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(
        float(tiltlab.tilted_risk(np.array([300.0, 400.0, 1000.0, 20.0]), 5.0)), rel=1e-5
    )
    out.backward()
    assert torch.isfinite(l.grad).all()


def test_bad_input():
    ce = torch.nn.CrossEntropyLoss()
    with pytest.raises(ValueError, match="reduction='none'"):
        TiltedLoss(ce, t=1.0)(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    loss_fn = TiltedLoss(t=1.0)
    with pytest.raises(ValueError, match="`losses` contains NaN"):
        loss_fn(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="`target`"):
        loss_fn(torch.ones(3), torch.ones(3))
    with pytest.raises(TypeError, match="`t`"):
        TiltedLoss(t="1")
    with pytest.raises(TypeError, match="`criterion`"):
        TiltedLoss(3)
    group_level = TiltedLoss(tilts=(1.0, 0.0), n_groups=2)
    with pytest.raises(ValueError, match="`groups` must have one label per loss"):
        group_level(torch.ones(3), groups=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`groups` is required"):
        group_level(torch.ones(3))
    with pytest.raises(ValueError, match="`t` must be finite"):
        TiltedLoss(t=math.inf, estimator="variational")
    variational = TiltedLoss(t=5.0, estimator="variational")
    variational(torch.zeros(4, dtype=torch.float32))
    with pytest.raises(ValueError, match="`losses`: the variational weights"):
        variational(torch.full((4,), 100.0, dtype=torch.float32))  # exp(500) in float32


def test_import_tiltlab_does_not_import_torch():
    code = (
        "import sys, tiltlab, tiltlab.minibatch; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_eval_mode_leaves_the_state_alone():
    loss_fn = TiltedLoss(t=linear_schedule(0.0, 1.0, 10), lam=0.5)
    loss_fn(torch.tensor([0.1, 0.2, 0.3], dtype=torch.float32))
    before = {k: v.clone() for k, v in loss_fn.named_buffers()}
    loss_fn.eval()
    loss_fn(torch.tensor([5.0, 6.0], dtype=torch.float32))
    for key, value in loss_fn.named_buffers():  # NaN where nothing was recorded yet
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, equal_nan=True)
    loss_fn.train()
    loss_fn(torch.tensor([5.0, 6.0], dtype=torch.float32))
    assert int(loss_fn.step) == 2


def test_buffers_follow_to():
    loss_fn = TiltedLoss(t=1.0).to(device="meta")
    assert all(b.device.type == "meta" for b in loss_fn.buffers())
    assert TiltedLoss(t=1.0).double().risk.dtype == torch.float64
    assert TiltedLoss(t=1.0).half().risk.dtype == torch.float32  # never narrowed


def test_compile_fullgraph_with_a_narrower_state():
    # a fresh loss whose first call is compiled with fullgraph=True on float64 losses:
    # no graph break (the state is read in float64 and written back in its own float32),
    # so the values agree with the eager float64 loss to float32 rounding of the state;
    # loss_fn.double() before compiling keeps a float64 state, equal to rounding
    torch._dynamo.reset()
    eager = TiltedLoss(t=1.0, lam=0.5)
    narrow = TiltedLoss(t=1.0, lam=0.5)
    wide = TiltedLoss(t=1.0, lam=0.5).double()
    run_narrow = torch.compile(narrow, fullgraph=True, backend="aot_eager")
    run_wide = torch.compile(wide, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        l = torch.rand(16, generator=gen, dtype=torch.float64) * 3
        ref = eager(l)
        torch.testing.assert_close(run_wide(l), ref, rtol=1e-13, atol=0)
        torch.testing.assert_close(run_narrow(l), ref, rtol=1e-6, atol=0)
    assert narrow.risk.dtype == torch.float32 and wide.risk.dtype == torch.float64
    torch.testing.assert_close(wide.risk, eager.risk, rtol=1e-13, atol=0)


def test_compile_fullgraph_under_autocast():
    # a compiled step under bf16 autocast traces in one graph (the loss turns autocast off
    # for its state without asking torch whether autocast is on, a query some torch
    # releases do not trace) and gives the eager step's loss
    torch._dynamo.reset()
    X, y, W = _data()
    model = torch.nn.Linear(5, 3, dtype=torch.float32)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    eager_fn, compiled_fn = TiltedLoss(ce, t=-1.0), TiltedLoss(ce, t=-1.0)

    def step(loss_fn):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_fn(model(X.float()), y)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for _ in range(3):
        want, got = step(eager_fn), compiled(compiled_fn)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_fn.risk, eager_fn.risk, rtol=1e-5, atol=1e-6)
