"""Splitting a batch does not change the estimate: mergeable statistics (MinibatchTilt's
combine step), gradient accumulation (TiltedLoss.finish_step) and data-parallel training
(TiltedLoss(distributed=True), two gloo processes on the CPU, also with k micro-batches per
process and step).

References: one call on the concatenated batch (itself exact at full batch against
``tilted_weights``/``hierarchical_weights``), and the autograd gradient of the tilted
risk written with ``torch.logsumexp``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tiltlab
from tiltlab.minibatch import MinibatchTilt


def _stream(n_batches=4, size=12, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.exponential(size=size) * (1 + k) for k in range(n_batches)]


@pytest.mark.parametrize("t", [-2.0, -1e-6, 0.0, 0.7, 30.0, math.inf, -math.inf])
@pytest.mark.parametrize("parts", [2, 3])
def test_combined_statistics_equal_one_call_on_the_union(t, parts):
    one = MinibatchTilt(t, lam=0.3)
    many = [MinibatchTilt(t, lam=0.3) for _ in range(parts)]
    for batch in _stream():
        split = np.array_split(batch, parts)
        stats = [m.statistics(b) for m, b in zip(many, split, strict=True)]
        w = np.concatenate(
            [m.weights(b, combined=m.combine(stats)) for m, b in zip(many, split, strict=True)]
        )
        np.testing.assert_allclose(w, one.weights(batch), rtol=1e-12, atol=1e-300)
    for m in many:
        np.testing.assert_allclose(m.state_dict()["risk"], one.state_dict()["risk"], rtol=1e-13)


@pytest.mark.parametrize("tilts", [(2.0, 0.0), (-1.0, 1.5), (1.0, -math.inf)])
def test_combined_statistics_at_group_level(tilts):
    rng = np.random.default_rng(1)
    one = MinibatchTilt(tilts=tilts, n_groups=3)
    many = [MinibatchTilt(tilts=tilts, n_groups=3) for _ in range(2)]
    for k, batch in enumerate(_stream(seed=2)):
        groups = rng.integers(0, 3 if k else 2, size=batch.size)  # a group absent at first
        halves = [(batch[:5], groups[:5]), (batch[5:], groups[5:])]
        stats = [m.statistics(b, g) for m, (b, g) in zip(many, halves, strict=True)]
        w = np.concatenate(
            [
                m.weights(b, g, combined=m.combine(stats))
                for m, (b, g) in zip(many, halves, strict=True)
            ]
        )
        ref = one.weights(batch, groups)
        np.testing.assert_allclose(w, ref, rtol=1e-12, atol=1e-300)
        if k == 0:
            exact = tiltlab.hierarchical_weights(batch, groups, tilts)
            np.testing.assert_allclose(w, exact, rtol=1e-12, atol=1e-300)


def test_combined_statistics_variational():
    one = MinibatchTilt(1.5, estimator="variational")
    many = [MinibatchTilt(1.5, estimator="variational") for _ in range(2)]
    for batch in _stream(seed=3):
        split = np.array_split(batch, 2)
        stats = [m.statistics(b) for m, b in zip(many, split, strict=True)]
        w = np.concatenate(
            [m.weights(b, combined=m.combine(stats)) for m, b in zip(many, split, strict=True)]
        )
        np.testing.assert_allclose(w, one.weights(batch), rtol=1e-12)


def test_combine_checks_its_input():
    tilt = MinibatchTilt(1.0)
    with pytest.raises(ValueError, match="`statistics`"):
        tilt.combine([np.zeros((5, 1))])
    with pytest.raises(TypeError, match="`statistics`"):
        tilt.combine([])
    with pytest.raises(ValueError, match="`combined`"):
        tilt.weights(np.ones(3), combined=np.zeros((7, 2)))
    with pytest.raises(ValueError, match="`statistics`"):
        MinibatchTilt(1.0, estimator="mlmc", base_batch_size=2).statistics(np.ones(4))


# -- gradient accumulation -------------------------------------------------------------


def _linear_problem(n=24, d=4, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = X @ torch.randn(d, generator=g, dtype=torch.float64) + torch.randn(
        n, generator=g, dtype=torch.float64
    )
    return X, y


@pytest.mark.parametrize("t", [-2.0, 0.0, 0.5, 3.0, 1e-3])
@pytest.mark.parametrize("use_hook", [False, True])
def test_accumulation_equals_one_call_on_the_concatenated_batch(t, use_hook):
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    k = 3
    batches = [_linear_problem(seed=s) for s in range(4)]
    w_acc = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    w_one = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    acc = TiltedLoss(t=t, lam=0.3, accumulation_steps=k).double()
    one = TiltedLoss(t=t, lam=0.3).double()
    opt_acc = torch.optim.SGD([w_acc], lr=0.05)
    opt_one = torch.optim.SGD([w_one], lr=0.05)
    if use_hook:
        acc.attach(opt_acc)
    for step, (X, y) in enumerate(batches):
        opt_acc.zero_grad()
        opt_one.zero_grad()
        for part in range(k):
            sl = slice(8 * part, 8 * (part + 1))
            value = acc((X[sl] @ w_acc - y[sl]) ** 2)
            value.backward()
            assert torch.isfinite(value)  # the running estimate so far
        if not use_hook:
            acc.finish_step([w_acc])
        full = one((X @ w_one - y) ** 2)
        full.backward()
        if use_hook:  # the hook rescales the gradient inside opt.step()
            opt_acc.step()
        torch.testing.assert_close(w_acc.grad, w_one.grad, rtol=1e-12, atol=1e-15)
        if step == 0:  # the first step is exact: the autograd gradient of the tilted risk
            w = w_one.detach().clone().requires_grad_(True)
            losses = (X @ w - y) ** 2
            risk = (
                losses.mean()
                if t == 0
                else (torch.logsumexp(t * losses, 0) - math.log(losses.shape[0])) / t
            )
            (g,) = torch.autograd.grad(risk, w)
            torch.testing.assert_close(w_one.grad, g, rtol=1e-12, atol=1e-15)
        for name in ("risk", "seen", "counts", "step"):
            torch.testing.assert_close(getattr(acc, name), getattr(one, name), rtol=1e-13, atol=0)
        if not use_hook:
            opt_acc.step()
        opt_one.step()
        torch.testing.assert_close(w_acc, w_one, rtol=1e-12, atol=1e-15)


def test_accumulation_rules():
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    with pytest.raises(ValueError, match="`accumulation_steps`.*sample level"):
        TiltedLoss(tilts=(1.0, 0.0), n_groups=2, accumulation_steps=2)
    with pytest.raises(ValueError, match="`accumulation_steps`"):
        TiltedLoss(t=1.0, estimator="variational", accumulation_steps=2)
    loss_fn = TiltedLoss(t=1.0, accumulation_steps=2)
    loss_fn(torch.rand(3))
    loss_fn(torch.rand(3))
    with pytest.raises(RuntimeError, match="finish_step"):
        loss_fn(torch.rand(3))
    with pytest.raises(ValueError, match="`t` must be finite"):
        TiltedLoss(t=math.inf, accumulation_steps=2)(torch.rand(3))


def _accumulate(torch, parts, t, dtype, wrap=None, **kwargs):
    """Micro-batches of losses (each its own leaf) through one accumulation step, the
    module called through ``wrap(module)`` if given (``torch.compile``); returns the
    leaves, the values and the module."""
    from tiltlab.torch import TiltedLoss

    acc = TiltedLoss(t=t, accumulation_steps=len(parts), **kwargs).to(torch.float64)
    call = acc if wrap is None else wrap(acc)
    leaves = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in parts]
    values = []
    for x in leaves:
        value = call(x)
        value.backward()
        values.append(value.detach())
    acc.finish_step(leaves)
    return leaves, values, acc


def _tilted_weights64(losses, t):
    """The tilted weights softmax(t l) of the union, in float64 (the reference)."""
    l = np.concatenate([np.asarray(p, dtype=np.float64) for p in losses])
    u = t * l
    e = np.exp(u - u.max())
    return e / e.sum()


@pytest.mark.parametrize(
    ("dtype", "t", "parts"),
    [
        ("float32", -10.0, [[10.0, 11.0], [0.5, 12.0]]),
        ("float64", 1000.0, [[1.0, 2.0], [0.0, 3.0]]),
        ("float64", -1000.0, [[1.0, 2.0], [0.0, 3.0]]),
        ("float32", 10.0, [[1.0, 1.5, 0.2], [0.7], [11.0, 0.0]]),
    ],
)
def test_accumulation_raises_where_the_weights_leave_the_dtype(dtype, t, parts):
    # the gradient of a micro-batch is accumulated relative to the first micro-batch's
    # state: exp(t (l - anchor)) beyond the range of the losses' dtype cannot be held in the
    # gradient beside the first micro-batch's, so the call raises (before its backward,
    # leaving the state as it was); one call on the union is fine
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    dt = getattr(torch, dtype)
    acc = TiltedLoss(t=t, accumulation_steps=len(parts)).to(torch.float64)
    leaves = [torch.tensor(p, dtype=dt, requires_grad=True) for p in parts]
    *first, last = leaves
    for x in first:
        acc(x).backward()
    with pytest.raises(ValueError, match=r"relative to the step's first micro-batch.*observe"):
        acc(last)
    # the state is that of the micro-batches before: finish_step gives their union's step
    acc.finish_step(first)
    want = _tilted_weights64(parts[:-1], t)
    got = torch.cat([x.grad for x in first]).double().numpy()
    eps = float(torch.finfo(dt).eps)
    lmax = max(max(abs(v) for v in p) for p in parts)
    # each weight: exponents t l formed to about eps |t| l, a few of them per weight
    rtol = 8 * eps * (abs(t) * lmax + 10)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=float(torch.finfo(dt).tiny))
    one = TiltedLoss(t=t).to(torch.float64)
    x = torch.tensor(sum(parts, []), dtype=dt, requires_grad=True)
    one(x).backward()
    assert bool(torch.isfinite(x.grad).all())


def test_accumulation_without_check_finite_skips_and_counts_such_a_micro_batch():
    torch = pytest.importorskip("torch")

    parts = [[10.0, 11.0], [0.5, 12.0], [10.5]]
    leaves, values, acc = _accumulate(torch, parts, -10.0, torch.float32, check_finite=False)
    assert math.isnan(values[1].item()) and int(acc.nonfinite) == 1
    assert bool((leaves[1].grad == 0).all())  # skipped: no gradient
    # the step is that of the other micro-batches
    got = torch.cat([leaves[0].grad, leaves[2].grad]).double().numpy()
    want = _tilted_weights64([parts[0], parts[2]], -10.0)
    eps = float(torch.finfo(torch.float32).eps)
    np.testing.assert_allclose(got, want, rtol=8 * eps * (10 * 12 + 10), atol=1e-38)


@pytest.mark.slow  # a compilation
def test_accumulation_compiled_skips_such_a_micro_batch_and_check_says_so():
    # compiled (no host read) the micro-batch is skipped and counted, as a non-finite one
    torch = pytest.importorskip("torch")

    torch._dynamo.reset()
    parts = [[10.0, 11.0], [0.5, 12.0], [10.5]]
    leaves, values, module = _accumulate(
        torch,
        parts,
        -10.0,
        torch.float32,
        wrap=lambda m: torch.compile(m, fullgraph=True, backend="aot_eager"),
    )
    assert math.isnan(values[1].item()) and not math.isnan(values[2].item())
    assert int(module.nonfinite) == 1 and bool((leaves[1].grad == 0).all())
    got = torch.cat([leaves[0].grad, leaves[2].grad]).double().numpy()
    want = _tilted_weights64([parts[0], parts[2]], -10.0)
    eps = float(torch.finfo(torch.float32).eps)
    np.testing.assert_allclose(got, want, rtol=8 * eps * (10 * 12 + 10), atol=1e-38)
    with pytest.raises(ValueError, match="relative to the step's first micro-batch"):
        module.check()


@pytest.mark.parametrize(
    ("dtype", "t", "parts"),
    [
        # weights relative to the first micro-batch up to about exp(61) and exp(650)
        ("float32", -10.0, [[10.0, 10.5, 11.0], [4.0, 12.0], [9.0]]),
        ("float32", 10.0, [[1.0, 0.5], [7.0, -3.0, 1.2]]),
        ("float64", -100.0, [[10.0, 10.5], [3.5, 12.0], [9.0, 4.0]]),
        ("float64", 2.0, [[-300.0, -299.0], [20.0, 0.0]]),
    ],
)
def test_accumulation_is_exact_for_spread_micro_batches(dtype, t, parts):
    # micro-batches far apart (their weights relative to the first one huge, within the
    # dtype) still give one call's gradient, per micro-batch and on a shared parameter
    torch = pytest.importorskip("torch")

    dt = getattr(torch, dtype)
    leaves, _, acc = _accumulate(torch, parts, t, dt)
    want = _tilted_weights64(parts, t)
    got = torch.cat([x.grad for x in leaves]).double().numpy()
    eps = float(torch.finfo(dt).eps)
    lmax = max(max(abs(v) for v in p) for p in parts)
    rtol = 8 * eps * (abs(t) * lmax + 10)
    tiny = float(torch.finfo(dt).tiny)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=tiny)
    assert int(acc.nonfinite) == 0
    # a shared parameter: losses l_i + x_i . w at w = 0, gradient sum_i w_i x_i
    from tiltlab.torch import TiltedLoss

    g = torch.Generator().manual_seed(0)
    X = [torch.randn(len(p), 3, generator=g, dtype=dt) for p in parts]
    w = torch.zeros(3, dtype=dt, requires_grad=True)
    acc = TiltedLoss(t=t, accumulation_steps=len(parts)).to(torch.float64)
    for p, Xp in zip(parts, X, strict=True):
        acc(torch.tensor(p, dtype=dt) + Xp @ w).backward()
    acc.finish_step([w])
    ref = torch.cat(X).double().T @ torch.as_tensor(want)
    # a sum of weights (summing to 1) times |x|: the weights' relative error, and a
    # rounding per term of the sum
    scale = float(torch.cat(X).abs().max())
    atol = (rtol + len(want) * eps) * scale
    torch.testing.assert_close(w.grad.double(), ref, rtol=0, atol=atol)


# -- data-parallel training --------------------------------------------------------------

WORKER = r"""
import contextlib
import sys

import numpy as np
import torch
import torch.distributed as dist

from tiltlab.minibatch import linear_schedule
from tiltlab.torch import TiltedLoss

rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
distributed = world > 1
if distributed:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
torch.set_num_threads(1)
CASES = {
    "sample": dict(t=-2.0, lam=0.3),
    "group": dict(tilts=(2.0, -1.0), n_groups=3, lam=0.3),
    "variational": dict(t=1.0, estimator="variational"),
    # k micro-batches per process; the single process takes the global batch in one call
    "accumulate": dict(t=-2.0, lam=0.3, accumulation_steps=3),
    "accumulate-ramp": dict(t=linear_schedule(0.0, 1.5, 2), lam=0.5, accumulation_steps=2),
}
SIZES = (10, 14)  # the two processes' batches differ in size
results = {}
for case, kwargs in CASES.items():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3, dtype=torch.float64)
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    k = kwargs.pop("accumulation_steps", 1) if distributed else 1
    kwargs.pop("accumulation_steps", None)
    loss_fn = TiltedLoss(ce, distributed=distributed, accumulation_steps=k, **kwargs).double()
    params = list(model.parameters())
    opt = torch.optim.SGD(params + list(loss_fn.parameters()), lr=0.2)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        X = torch.randn(sum(SIZES), 4, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 3, (sum(SIZES),), generator=gen)
        if distributed:
            lo = sum(SIZES[:rank])
            X, y = X[lo : lo + SIZES[rank]], y[lo : lo + SIZES[rank]]
        groups = y if "tilts" in kwargs else None
        opt.zero_grad()
        parts = np.array_split(np.arange(X.shape[0]), k)
        for j, part in enumerate(parts):  # DDP averages the gradients at the last backward
            idx = torch.as_tensor(part)
            sync = not distributed or j == k - 1
            with contextlib.nullcontext() if sync else net.no_sync():
                value = loss_fn(net(X[idx]), y[idx], groups=None if groups is None else groups[idx])
                value.backward()
        if k > 1:
            loss_fn.finish_step(params)
        results[f"{case}/{step}/grad"] = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
        results[f"{case}/{step}/value"] = np.array(float(value.detach()))
        opt.step()
    for name, buf in loss_fn.state_dict().items():
        if torch.is_tensor(buf):
            results[f"{case}/state/{name}"] = buf.numpy()
np.savez(out, **results)
if distributed:
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_data_parallel_gradient_equals_one_process_on_the_global_batch(tmp_path):
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    import os
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = str(__import__("pathlib").Path(tiltlab.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    init = f"file://{tmp_path / 'rendezvous'}"

    def launch(rank, world, out):
        cmd = [sys.executable, str(script), str(rank), str(world), init, str(out)]
        return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)

    procs = [launch(r, 2, tmp_path / f"rank{r}.npz") for r in range(2)]
    single = launch(0, 1, tmp_path / "single.npz")
    for p in [*procs, single]:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    ref = np.load(tmp_path / "single.npz")
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert torch is not None
    for key in ref.files:
        for r in ranks:
            np.testing.assert_allclose(r[key], ref[key], rtol=1e-12, atol=1e-15, err_msg=key)
