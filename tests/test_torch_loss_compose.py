"""TiltedLoss options composed: every combination of the tilt (``t``, ``tilts``, ``ess``,
schedules) with accumulation (one pass with ``finish_step``, or two passes with
``observe``), data-parallel training (two gloo processes, unequal batches, an empty one)
and ``torch.compile(fullgraph=True)`` gives the gradient and state of one call on the
union of every micro-batch of every process, or is refused at construction.

The reference is written here in plain torch (float64): the running estimator of the
paper on the union (log-sum-exp per group, the running update in the log domain, the
outer tilt over the groups' risks), its gradient by autograd of ``sum_i w_i l_i`` with
the weights held fixed; the tilt for ``ess`` by ``tiltlab.tilt_for_ess`` (a host root
finder, independent of the loss's device solver).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiltlab  # noqa: E402
from tiltlab.minibatch import linear_schedule  # noqa: E402
from tiltlab.torch import TiltedLoss  # noqa: E402

N_GROUPS = 3
D = 4

SPECS = {
    "t": dict(t=-1.5, lam=0.3),
    "t-ramp": dict(t=linear_schedule(0.0, 2.0, 2), lam=0.5),
    "tilts": dict(tilts=(1.0, -0.7), n_groups=N_GROUPS, lam=0.3),
    "tilts-0": dict(tilts=(-0.5, 0.0), n_groups=N_GROUPS),
    "ess": dict(ess=0.6, lam=0.3),
    "ess-ramp": dict(ess=linear_schedule(0.9, 0.5, 2), ess_sign=1),
}
# the solved tilt agrees with tilt_for_ess to its stopping rule (about 1e-13 relative),
# which moves the weights by that times |t| times the losses' spread (a few units)
RTOL = {"ess": 1e-10, "ess-ramp": 1e-10}

# -- the reference -------------------------------------------------------------------


def _spec_tilts(spec, step, losses):
    if "ess" in spec:
        f = spec["ess"]
        f = float(f(step)) if callable(f) else f
        t = float(tiltlab.tilt_for_ess(losses.detach().numpy(), f, sign=spec.get("ess_sign", -1)))
        return 0.0, t
    if "tilts" in spec:
        return tuple(float(v) for v in spec["tilts"])
    t = spec["t"]
    return 0.0, float(t(step)) if callable(t) else float(t)


def _lse_mean(x, t):
    """(1/t) log mean exp(t x), the mean at t = 0."""
    if t == 0:
        return x.mean()
    return (torch.logsumexp(t * x, 0) - math.log(x.numel())) / t


def reference_step(state, losses, groups, spec, step):
    """Weights (fixed), value and new state of one call on the union ``losses``."""
    lam = spec.get("lam", 0.1)
    t_group, t_sample = _spec_tilts(spec, step, losses)
    g = N_GROUPS if "tilts" in spec else 1
    codes = groups if g > 1 else torch.zeros(losses.shape[0], dtype=torch.int64)
    l = losses.detach()
    risk, seen, counts = (v.clone() for v in state)
    for k in range(g):
        part = l[codes == k]
        if part.numel() == 0:
            continue
        b = _lse_mean(part, t_sample)
        if seen[k] == 0:
            risk[k] = b
        elif t_sample == 0:
            risk[k] = (1 - lam) * risk[k] + lam * b
        else:
            both = torch.stack(
                [math.log(1 - lam) + t_sample * risk[k], math.log(lam) + t_sample * b]
            )
            risk[k] = torch.logsumexp(both, 0) / t_sample
        seen[k] = 1.0
        counts[k] += part.numel()
    n = l.shape[0]
    p = counts / counts.sum()
    on = p > 0
    if g == 1:
        outer = torch.ones(1, dtype=l.dtype)
        value = l.mean() if t_sample == 0 else risk[0]
    elif t_group == 0:
        outer = torch.where(on, torch.ones_like(p), torch.zeros_like(p))
        value = (p * risk).sum()
    else:
        logits = torch.where(on, t_group * risk + torch.log(p), torch.full_like(p, -math.inf))
        big = torch.softmax(logits, 0)
        outer = torch.where(on, big / torch.where(on, p, torch.ones_like(p)), torch.zeros_like(p))
        value = torch.logsumexp(logits, 0) / t_group
    if g > 1 and t_group == 0 and t_sample == 0:
        value = l.mean()
    w = outer[codes] / n * torch.exp(t_sample * (l - risk[codes]))
    return w, value, (risk, seen, counts), t_sample


def data(step, sizes, seed=0):
    """Features, targets and groups of one step: ``sizes`` samples per process."""
    gen = torch.Generator().manual_seed(seed + 7 * step)
    total = sum(sizes)
    X = torch.randn(total, D, generator=gen, dtype=torch.float64)
    y = torch.randn(total, generator=gen, dtype=torch.float64) * 2
    groups = torch.randint(0, N_GROUPS - (step == 0), (total,), generator=gen)  # one absent
    return X, y, groups


def sq_losses(theta, X, y):
    return (X @ theta - y) ** 2


def reference_run(spec, steps, sizes, seed=0):
    """Gradients, values and states of one process calling on the union at each step."""
    theta = torch.linspace(-0.5, 0.7, D, dtype=torch.float64).requires_grad_(True)
    g = N_GROUPS if "tilts" in spec else 1
    state = tuple(torch.zeros(g, dtype=torch.float64) for _ in range(3))
    out = []
    for step in range(steps):
        X, y, groups = data(step, sizes[step], seed)
        losses = sq_losses(theta, X, y)
        w, value, state, t = reference_step(state, losses, groups, spec, step)
        (grad,) = torch.autograd.grad(torch.dot(w, losses), theta)
        out.append(dict(grad=grad, value=value, risk=state[0].clone(), t=t))
        with torch.no_grad():
            theta -= 0.1 * grad
    return out


# -- the runs of TiltedLoss ---------------------------------------------------------------


def split(n, k):
    """k micro-batches of n samples, the second one empty when k > 2."""
    if k == 1:
        return [torch.arange(n)]
    cuts = np.array_split(np.arange(n), k - 1)
    parts = [cuts[0], np.arange(0)] + list(cuts[1:]) if k > 2 else cuts
    return [torch.as_tensor(p, dtype=torch.int64) for p in parts]


def run(spec, mode, steps, sizes, rank=0, world=1, seed=0, k=3, penalty=0.0, clip=None):
    """Train ``steps`` steps with TiltedLoss in ``mode`` (plain, accumulate, observe,
    compiled) on this process's share; returns its gradients (summed over processes
    they are ``world`` times the union's) and states."""
    kwargs = dict(spec)
    compiled = mode.endswith("-compiled") or mode == "compiled"
    mode = mode.removesuffix("-compiled")
    if mode == "accumulate":
        kwargs["accumulation_steps"] = k
    loss_fn = TiltedLoss(distributed=world > 1, **kwargs).double()
    theta = torch.linspace(-0.5, 0.7, D, dtype=torch.float64).requires_grad_(True)
    grouped = "tilts" in spec

    def call(X, y, groups):
        losses = sq_losses(theta, X, y)
        return loss_fn(losses, groups=groups if grouped else None)

    if compiled:
        torch._dynamo.reset()
        call = torch.compile(call, fullgraph=True, backend="aot_eager")
    out = []
    for step in range(steps):
        X, y, groups = data(step, sizes[step], seed)
        lo = sum(sizes[step][:rank])
        share = slice(lo, lo + sizes[step][rank])
        X, y, groups = X[share], y[share], groups[share]
        theta.grad = None
        parts = split(X.shape[0], k) if mode in ("accumulate", "observe") else [None]
        if mode == "observe":
            with torch.no_grad():
                for idx in parts:
                    g = groups[idx] if grouped else None
                    loss_fn.observe(sq_losses(theta, X[idx], y[idx]), groups=g)
        value = None
        for idx in parts:
            sub = (X, y, groups) if idx is None else (X[idx], y[idx], groups[idx])
            out_j = call(*sub)
            if mode == "observe" and penalty:  # another term: its share per micro-batch
                out_j = out_j + penalty * (theta**2).sum() / (len(parts) * world)
            out_j.backward()
            value = out_j.detach() if value is None or sub[0].shape[0] else value
        if mode == "accumulate":
            loss_fn.finish_step([theta])
            if penalty:  # another term, after the rescaling of the tilted gradient
                (penalty * (theta**2).sum() / world).backward()
        elif penalty and mode != "observe":
            (penalty * (theta**2).sum() / world).backward()
        grad = theta.grad.clone()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_([theta], clip)
            out.append(dict(norm=norm.detach().clone(), clipped=theta.grad.clone()))
        out.append(
            dict(
                grad=grad,
                value=value,
                risk=loss_fn.risk.detach().clone(),
                t=loss_fn.tilts_in_use[1],
            )
        )
        with torch.no_grad():
            theta -= 0.1 * (grad if world == 1 else _all_mean(grad))
    return out


def _all_mean(grad):
    import torch.distributed as dist

    total = grad.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def _check(got, ref, rtol, what):
    for step, (g, r) in enumerate(zip(got, ref, strict=True)):
        for key in ("grad", "risk"):
            np.testing.assert_allclose(
                g[key].numpy(),
                r[key].numpy(),
                rtol=rtol,
                atol=1e-14,
                err_msg=f"{what} {step} {key}",
            )
        assert g["t"] == pytest.approx(r["t"], rel=rtol, abs=1e-300), (what, step)


MODES = {
    "t": ("plain", "accumulate", "observe", "compiled", "accumulate-compiled"),
    "t-ramp": ("plain", "accumulate", "observe", "compiled", "accumulate-compiled"),
    "tilts": ("plain", "observe", "compiled"),
    "tilts-0": ("plain", "observe"),
    "ess": ("plain", "observe", "compiled"),
    "ess-ramp": ("plain", "observe", "compiled"),
}
SIZES_ONE = [(13,), (9,)]


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        # the compiled modes (several seconds each) run in the full tier
        pytest.param(n, m, marks=pytest.mark.slow) if "compiled" in m else (n, m)
        for n, modes in MODES.items()
        for m in modes
    ],
)
def test_one_process_equals_one_call_on_the_union(name, mode):
    spec = SPECS[name]
    ref = reference_run(spec, 2, SIZES_ONE)
    got = run(spec, mode, 2, SIZES_ONE)
    _check(got, ref, RTOL.get(name, 1e-12), f"{name}/{mode}")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(ess=0.5, accumulation_steps=2), "`ess` with `accumulation_steps`"),
        (dict(tilts=(1.0, 0.0), n_groups=2, accumulation_steps=2), "`accumulation_steps`"),
        (dict(t=1.0, estimator="variational", accumulation_steps=2), "`accumulation_steps`"),
        (dict(t=1.0, estimator="mlmc", base_batch_size=4, distributed=True), "`distributed"),
        (dict(ess=0.5, estimator="mlmc", base_batch_size=4), "`ess`"),
    ],
)
def test_refused_combinations_name_themselves(kwargs, words):
    with pytest.raises(ValueError, match=words):
        TiltedLoss(**kwargs)


def test_observe_is_for_the_running_estimator_without_one_pass_accumulation():
    for loss_fn in (
        TiltedLoss(t=1.0, estimator="variational"),
        TiltedLoss(t=1.0, accumulation_steps=2),
    ):
        with pytest.raises(ValueError, match="`observe`"):
            loss_fn.observe(torch.tensor([0.1, 0.2]))


def test_training_pass_must_follow_the_observed_micro_batches():
    loss_fn = TiltedLoss(t=-1.0)
    loss_fn.observe(torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="observe` saw 3"):
        loss_fn(torch.tensor([0.1, 0.2]))


def test_ess_out_of_reach_says_so():
    # three of four losses tied at the smallest: no tilt keeps less than 3/4 of them
    tied = torch.tensor([1.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="no finite tilt"):
        TiltedLoss(ess=0.5)(tied)
    with pytest.raises(ValueError, match="no finite tilt"):
        TiltedLoss(ess=0.2)(torch.tensor([0.1, 0.4, 3.0]))  # below 1/B
    with pytest.raises(ValueError, match="no finite tilt"):
        TiltedLoss(ess=0.9)(torch.ones(5))  # equal losses
    assert TiltedLoss(ess=0.8)(tied).item() == pytest.approx(
        float(tiltlab.tilted_risk(tied.numpy(), float(tiltlab.tilt_for_ess(tied.numpy(), 0.8))))
    )
    # compiled: no host read, the batch is skipped (NaN, state kept) and check() says so
    torch._dynamo.reset()
    module = TiltedLoss(ess=0.5).double()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    assert math.isnan(compiled(tied).item())
    assert int(module.step) == 1 and torch.all(module.seen == 0)
    with pytest.raises(ValueError, match="`ess` fraction no tilt reaches"):
        module.check()


def test_clipping_after_finish_step_clips_the_union_gradient():
    # finish_step before clip_grad_norm_ (as GradScaler.unscale_): the clipped gradient
    # is the union's, clipped; attach() would rescale after the clip
    spec = SPECS["t"]
    ref = reference_run(spec, 2, SIZES_ONE)
    for mode in ("accumulate", "observe"):
        got = run(spec, mode, 2, SIZES_ONE, clip=0.5)
        for step in range(2):
            clip, rec = got[2 * step], got[2 * step + 1]
            grad = ref[step]["grad"]
            norm = grad.norm()
            assert clip["norm"].item() == pytest.approx(norm.item(), rel=1e-12)
            expected = grad * min(1.0, 0.5 / (norm.item() + 1e-6))
            np.testing.assert_allclose(clip["clipped"].numpy(), expected.numpy(), rtol=1e-12)
            np.testing.assert_allclose(rec["grad"].numpy(), grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("mode", ["plain", "accumulate", "observe"])
def test_other_loss_terms_keep_their_gradient(mode):
    # an L2 penalty: after finish_step (one pass) or per micro-batch (two passes)
    spec = SPECS["t"]
    penalty = 0.3
    ref = reference_run(spec, 1, SIZES_ONE)
    got = run(spec, mode, 1, SIZES_ONE, penalty=penalty)
    theta = torch.linspace(-0.5, 0.7, D, dtype=torch.float64)
    np.testing.assert_allclose(
        got[0]["grad"].numpy(), (ref[0]["grad"] + 2 * penalty * theta).numpy(), rtol=1e-12
    )


def test_group_level_accumulation_in_two_passes_with_four_micro_batches():
    spec = SPECS["tilts"]
    ref = reference_run(spec, 2, SIZES_ONE)
    got = run(spec, "observe", 2, SIZES_ONE, k=4)
    _check(got, ref, 1e-12, "tilts/observe/k=4")


def test_group_report_leaves_unseen_groups_without_risk():
    from tiltlab.diagnostics import format_group_report

    loss_fn = TiltedLoss(tilts=(1.0, 0.0), n_groups=3)
    loss_fn(torch.tensor([0.1, 0.3, 2.0]), groups=torch.tensor([0, 0, 2]))
    rep = loss_fn.group_report()
    assert math.isnan(rep["risk"][1].item()) and rep["weight"][1].item() == 0
    assert rep["risk"][0].item() == pytest.approx(0.2)
    text = format_group_report(rep, worst=1, best=1)
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["2", "0"]
    # the same for the array-API form
    from tiltlab.minibatch import MinibatchTilt

    tilt = MinibatchTilt(tilts=(1.0, 0.0), n_groups=3)
    tilt.weights(np.array([0.1, 0.3, 2.0]), np.array([0, 0, 2]))
    rep = tilt.group_report()
    assert np.isnan(rep["risk"][1]) and rep["risk"][0] == pytest.approx(0.2)


def test_tilts_in_use_after_compiled_calls():
    torch._dynamo.reset()
    module = TiltedLoss(t=linear_schedule(0.0, -2.0, 4)).double()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    assert all(math.isnan(v) for v in module.tilts_in_use)
    for _ in range(3):
        compiled(torch.tensor([0.1, 0.3, 2.0], dtype=torch.float64))
    assert module.tilts_in_use == (0.0, pytest.approx(-1.0))
    module(torch.tensor([0.1, 0.3, 2.0], dtype=torch.float64))
    assert module.tilts_in_use == (0.0, pytest.approx(-1.5))


# -- two processes ---------------------------------------------------------------------

SIZES_TWO = [(7, 5), (0, 9)]  # unequal shares; the first process has none at step 1
WORKER = """
import sys
sys.path.insert(0, sys.argv[4])
import torch
import torch.distributed as dist
import test_torch_loss_compose as h

rank, init, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
torch.set_num_threads(1)
results = {}
for name, mode in h.DISTRIBUTED:
    runs = h.run(h.SPECS[name], mode, 2, h.SIZES_TWO, rank=rank, world=2)
    for step, r in enumerate(runs):
        for key in ("grad", "risk"):
            results[f"{name}/{mode}/{step}/{key}"] = r[key]
        results[f"{name}/{mode}/{step}/t"] = torch.tensor(r["t"], dtype=torch.float64)
torch.save(results, out)
dist.destroy_process_group()
"""
DISTRIBUTED = [
    ("t", "plain"),
    ("t", "accumulate"),
    ("t", "observe"),
    ("t-ramp", "accumulate"),
    ("tilts", "plain"),
    ("tilts", "observe"),
    ("ess", "plain"),
    ("ess", "observe"),
    ("ess-ramp", "plain"),
]


@pytest.mark.slow  # two processes
def test_two_processes_equal_one_call_on_the_union(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = str(Path(tiltlab.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    init = f"file://{tmp_path / 'rendezvous'}"
    here = str(Path(__file__).resolve().parent)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), init, str(tmp_path / f"{r}.pt"), here],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    ranks = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    for name, mode in DISTRIBUTED:
        ref = reference_run(SPECS[name], 2, SIZES_TWO)
        rtol = RTOL.get(name, 1e-12)
        for step in range(2):
            key = f"{name}/{mode}/{step}"
            # each process's gradient carries the factor 2 that DDP's average divides out
            total = (ranks[0][f"{key}/grad"] + ranks[1][f"{key}/grad"]) / 2
            np.testing.assert_allclose(
                total.numpy(), ref[step]["grad"].numpy(), rtol=rtol, atol=1e-14, err_msg=key
            )
            for r in ranks:  # every process holds the same state and tilt
                np.testing.assert_allclose(
                    r[f"{key}/risk"].numpy(), ref[step]["risk"].numpy(), rtol=rtol, err_msg=key
                )
                assert float(r[f"{key}/t"]) == pytest.approx(ref[step]["t"], rel=rtol)
