"""The chunked tilted cross-entropy head against a full-logits float64 reference written
here (logsumexp over all tokens, autograd for the gradients)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from tiltlab.torch import tilted_cross_entropy, token_cross_entropy  # noqa: E402

D = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-12}


def _data(B=4, T=5, H=6, V=11, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, H, generator=g, dtype=D)
    W = torch.randn(V, H, generator=g, dtype=D) * 0.7
    b = torch.randn(V, generator=g, dtype=D)
    y = torch.randint(0, V, (B, T), generator=g)
    if ignore:
        y[0, :2] = -100
        y[2, -1] = -100
    return h, W, b, y


def _tilted(items, t):
    """The tilted risk of a vector, written out (uniform prior)."""
    n = items.shape[0]
    if t == 0:
        return items.mean()
    if math.isinf(t):
        return items.max() if t > 0 else items.min()
    if abs(t) < 1e-8:  # the cumulant series, exact to rounding here
        m = items.mean()
        return m + t * ((items - m) ** 2).mean() / 2
    return (torch.logsumexp(t * items, 0) - math.log(n)) / t


def _reference(h, W, b, y, t, level, normalize="weights", tilts=None, groups=None):
    z = h @ W.T + (0 if b is None else b)
    ok = y != -100
    tok = F.cross_entropy(
        z.reshape(-1, W.shape[0]), y.reshape(-1), reduction="none", ignore_index=-100
    ).reshape(y.shape)
    if level == "token":
        items = tok[ok]
    else:
        n = ok.sum(-1)
        items = ((tok * ok).sum(-1) / n.clamp(min=1))[n > 0]
    if level == "group":
        labels = groups if groups.shape == y.shape[:1] else groups
        if groups.shape == y.shape:
            items, labels = tok[ok], groups[ok]
        else:
            labels = groups[ok.sum(-1) > 0]
        t_out, t_in = tilts
        uniq = torch.unique(labels)
        risks = torch.stack([_tilted(items[labels == u], t_in) for u in uniq])
        mass = torch.stack([(labels == u).sum() for u in uniq]).to(D) / labels.shape[0]
        if t_out == 0:
            return (mass * risks).sum()
        if math.isinf(t_out):
            return risks.max() if t_out > 0 else risks.min()
        return torch.logsumexp(t_out * risks + torch.log(mass), 0) / t_out
    if normalize == "count":
        return (torch.exp(t * items).detach() * items).mean()
    return _tilted(items, t)


def _grads(value, *xs):
    return torch.autograd.grad(value, xs)


def _both(t, level, chunk, bias=True, normalize="weights", tilts=None, groups=None, seed=0):
    h, W, b, y = _data(seed=seed)
    hs = [x.clone().requires_grad_(True) for x in (h, W, b)]
    hr = [x.clone().requires_grad_(True) for x in (h, W, b)]
    got = tilted_cross_entropy(
        hs[0],
        hs[1],
        y,
        t,
        bias=hs[2] if bias else None,
        level=level,
        normalize=normalize,
        chunk_size=chunk,
        tilts=tilts,
        groups=groups,
    )
    ref = _reference(hr[0], hr[1], hr[2] if bias else None, y, t, level, normalize, tilts, groups)
    n = 3 if bias else 2
    return (got, *_grads(got, *hs[:n])), (ref, *_grads(ref, *hr[:n]))


TILTS = [0.0, -1.0, 2.0, -20.0, 1e-12, -3e-9, math.inf, -math.inf]


@pytest.mark.parametrize("t", TILTS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("chunk", [1, 3, 7, None])
def test_value_and_gradients_match_full_logits(t, level, chunk):
    got, ref = _both(t, level, chunk)
    for a, r in zip(got, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL)


@pytest.mark.parametrize("t", [-1.0, 0.0, 0.5])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_count_normalisation_is_dft_family(t, level):
    for chunk in (2, None):
        got, ref = _both(t, level, chunk, normalize="count")
        for a, r in zip(got, ref, strict=True):
            torch.testing.assert_close(a, r, **TOL)


def test_dft_at_minus_one_and_relation_to_tilted_gradient():
    h, W, b, y = _data(ignore=False)
    hr = h.reshape(-1, h.shape[-1]).clone().requires_grad_(True)
    yr = y.reshape(-1)
    # DFT written from its definition: each token's loss times its detached probability
    logp = F.log_softmax(hr @ W.T, -1).gather(1, yr[:, None])[:, 0]
    dft = -(logp.exp().detach() * logp).mean()
    (g_dft,) = torch.autograd.grad(dft, hr)
    hc = hr.detach().clone().requires_grad_(True)
    val = tilted_cross_entropy(hc, W, yr, -1.0, normalize="count", chunk_size=5)
    (g,) = torch.autograd.grad(val, hc)
    torch.testing.assert_close(val, dft, **TOL)
    torch.testing.assert_close(g, g_dft, **TOL)
    # the count gradient is the tilted gradient times the batch's mean exp(t l)
    ht = hr.detach().clone().requires_grad_(True)
    (g_t,) = torch.autograd.grad(tilted_cross_entropy(ht, W, yr, -1.0), ht)
    torch.testing.assert_close(g, g_t * logp.detach().exp().mean(), **TOL)


@pytest.mark.parametrize("tilts", [(2.0, -1.0), (0.0, 0.0), (-math.inf, 3.0), (-2.0, 1e-12)])
@pytest.mark.parametrize("per", ["token", "sequence"])
def test_group_level_matches_two_level_reference(tilts, per):
    h, W, b, y = _data()
    groups = (
        torch.tensor([0, 1, 0, 1])
        if per == "sequence"
        else (torch.arange(y.numel()).reshape(y.shape) % 3)
    )
    for chunk in (4, None):
        got, ref = _both(None, "group", chunk, tilts=tilts, groups=groups)
        for a, r in zip(got, ref, strict=True):
            torch.testing.assert_close(a, r, **TOL)


def test_no_bias_and_two_dimensional_hidden():
    got, ref = _both(-2.0, "token", 3, bias=False)
    for a, r in zip(got, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL)
    h, W, b, y = _data()
    v2 = tilted_cross_entropy(h.reshape(-1, 6), W, y.reshape(-1), 1.5, bias=b)
    torch.testing.assert_close(v2, tilted_cross_entropy(h, W, y, 1.5, bias=b), **TOL)


def test_low_precision_accumulates_in_float32():
    h, W, b, y = _data(B=8, T=16, V=50, ignore=False)
    ref = _reference(h, W, b, y, -1.0, "token")
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        hh, Wl, bl = (x.to(dt).requires_grad_(True) for x in (h, W, b))
        val = tilted_cross_entropy(hh, Wl, y, -1.0, bias=bl, chunk_size=16)
        assert val.dtype == dt
        val.backward()
        assert hh.grad.dtype == dt and Wl.grad.dtype == dt
        # the inputs' own rounding dominates (8 bits for bfloat16)
        eps = torch.finfo(dt).eps
        # recompute the reference at the rounded inputs, in float64
        r64 = _reference(
            hh.detach().double(), Wl.detach().double(), bl.detach().double(), y, -1.0, "token"
        )
        assert abs(float(val.detach()) - float(r64)) <= 2 * eps * abs(float(r64)) + 1e-6
        assert abs(float(r64) - float(ref)) < 1.0  # the same problem


def test_token_cross_entropy_and_its_backward():
    h, W, b, y = _data()
    hs, Ws, bs = (x.clone().requires_grad_(True) for x in (h, W, b))
    l = token_cross_entropy(hs, Ws, y, bias=bs, chunk_size=3)
    z = h @ W.T + b
    ref = F.cross_entropy(z.reshape(-1, 11), y.reshape(-1), reduction="none").reshape(y.shape)
    torch.testing.assert_close(l, ref, **TOL)
    v = torch.randn(y.shape, dtype=D)
    got = torch.autograd.grad((l * v).sum(), (hs, Ws, bs))
    hr, Wr, br = (x.clone().requires_grad_(True) for x in (h, W, b))
    zr = hr @ Wr.T + br
    lr = F.cross_entropy(zr.reshape(-1, 11), y.reshape(-1), reduction="none").reshape(y.shape)
    want = torch.autograd.grad((lr * v).sum(), (hr, Wr, br))
    for a, r in zip(got, want, strict=True):
        torch.testing.assert_close(a, r, **TOL)


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"level": "tokens"}, ValueError, "level"),
        ({"normalize": "mean"}, ValueError, "normalize"),
        ({"tilts": (1.0, 2.0)}, ValueError, "tilts"),
        ({"level": "group", "tilts": (1.0, 2.0)}, ValueError, "groups"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"t": "a"}, TypeError, "t"),
        ({"t": math.inf, "normalize": "count"}, ValueError, "t"),
        ({"groups": torch.zeros(4, dtype=torch.int64)}, ValueError, "groups"),
    ],
)
def test_errors_name_the_argument(kwargs, exc, word):
    h, W, b, y = _data()
    with pytest.raises(exc, match=word):
        tilted_cross_entropy(h, W, y, **kwargs)


def test_bad_shapes_and_targets():
    h, W, b, y = _data()
    with pytest.raises(ValueError, match="targets"):
        tilted_cross_entropy(h, W, y[:, :2])
    with pytest.raises(ValueError, match="weight"):
        tilted_cross_entropy(h, W[:, :3], y)
    with pytest.raises(ValueError, match="bias"):
        tilted_cross_entropy(h, W, y, bias=b[:3])
    with pytest.raises(ValueError, match="targets"):
        tilted_cross_entropy(h, W, y + 100)
    with pytest.raises(ValueError, match="ignore_index"):
        tilted_cross_entropy(h, W, torch.full_like(y, -100))


def _empty_sequences(B=6, T=3, H=4, V=9, seed=3):
    """Sequences 0, 1 and 4 without a token with a loss, and a partly ignored one."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, H, generator=g, dtype=D)
    W = torch.randn(V, H, generator=g, dtype=D)
    b = torch.randn(V, generator=g, dtype=D)
    y = torch.randint(0, V, (B, T), generator=g)
    y[[0, 1, 4]] = -100
    y[2, 1:] = -100
    return h, W, b, y


@pytest.mark.parametrize("t", [-1.0, 0.0, 2.0, 1e-12, -math.inf, math.inf])
@pytest.mark.parametrize("chunk", [1, 2, 6, 9, None, "blocks"])
def test_sequence_level_with_empty_chunks(t, chunk, monkeypatch):
    # chunk_size=6 holds two sequences of 3 tokens: the first chunk (sequences 0 and 1) has
    # no token with a loss; at chunk_size 1 or 2 (a sequence a chunk) the first, second and
    # fifth chunks have none; chunk_size=9 (three sequences) and None have no empty chunk
    from tiltlab.torch import cross_entropy as ce

    if chunk == "blocks":  # vocabulary blocks of 4, 4, 1 and chunks of 3 tokens
        monkeypatch.setattr(ce, "CHUNK_ELEMENTS", 12)
        monkeypatch.setattr(ce, "MIN_TOKENS", 3)
        chunk = None
    h, W, b, y = _empty_sequences()
    keep = (y != -100).any(-1)
    for normalize in ("weights", "count") if math.isfinite(t) else ("weights",):
        xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
        got = tilted_cross_entropy(
            *xs[:2], y, t, bias=xs[2], level="sequence", normalize=normalize, chunk_size=chunk
        )
        g_got = _grads(got, *xs)
        # the reference on the sequences with a loss only; the others get no gradient
        xr = [
            h[keep].clone().requires_grad_(True),
            W.clone().requires_grad_(True),
            b.clone().requires_grad_(True),
        ]
        ref = _reference(xr[0], xr[1], xr[2], y[keep], t, "sequence", normalize)
        g_ref = _grads(ref, *xr)
        torch.testing.assert_close(got, ref, **TOL)
        torch.testing.assert_close(g_got[0][keep], g_ref[0], **TOL)
        assert bool((g_got[0][~keep] == 0).all())
        for a, r in zip(g_got[1:], g_ref[1:], strict=True):
            torch.testing.assert_close(a, r, **TOL)


#: every level with each normaliser it takes
LEVELS_AND_NORMALISERS = [
    ("token", "weights"),
    ("token", "count"),
    ("sequence", "weights"),
    ("sequence", "count"),
    ("group", "weights"),
]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize(("level", "normalize"), LEVELS_AND_NORMALISERS)
def test_ignored_positions_do_not_reach_the_value_or_the_gradients(bad, level, normalize):
    # a non-finite hidden state where the target is ignored (padding) is never read: the
    # value and the gradients are those with that hidden state replaced by zeros
    h, W, b, y = _data()
    dirty = h.clone()
    dirty[0, :2] = bad  # y[0, :2] is ignored
    dirty[2, -1] = -bad
    clean = torch.where(y[..., None] != -100, h, torch.zeros((), dtype=D))
    kwargs = dict(level=level, normalize=normalize)
    if level == "group":
        kwargs.update(tilts=(1.5, -1.0), groups=torch.tensor([0, 1, 0, 1]))
        t = None
    else:
        t = -1.0
    for chunk in (1, 7, None):
        xs = [dirty.clone().requires_grad_(True), W.clone().requires_grad_(True)]
        got = tilted_cross_entropy(*xs, y, t, bias=b, chunk_size=chunk, **kwargs)
        g_got = _grads(got, *xs)
        xr = [clean.clone().requires_grad_(True), W.clone().requires_grad_(True)]
        ref = _reference(
            xr[0], xr[1], b, y, t, level, normalize, kwargs.get("tilts"), kwargs.get("groups")
        )
        g_ref = _grads(ref, *xr)
        torch.testing.assert_close(got, ref, **TOL)
        for a, r in zip(g_got, g_ref, strict=True):
            torch.testing.assert_close(a, r, **TOL)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["hidden", "weight", "bias"])
@pytest.mark.parametrize(("level", "normalize"), LEVELS_AND_NORMALISERS)
def test_non_finite_losses_raise_with_either_normaliser(bad, where, level, normalize):
    # a NaN or infinite input at a token with a loss: every level and normaliser raises the
    # same error, with and without gradients (never a NaN value or gradient)
    from tiltlab.accumulator import NonFiniteLosses

    h, W, b, y = _data()
    x = {"hidden": h, "weight": W, "bias": b}
    x = {k: v.clone() for k, v in x.items()}
    if where == "hidden":
        x[where][1, 2, 3] = bad  # y[1, 2] has a loss
    elif where == "weight":
        x[where][y[1, 2], 0] = bad
    else:
        x[where][y[1, 2]] = bad
    kwargs = dict(level=level, normalize=normalize, bias=x["bias"])
    t = -1.0
    if level == "group":
        kwargs.update(tilts=(1.5, -1.0), groups=torch.tensor([0, 1, 0, 1]))
        t = None
    messages = set()
    for grad in (False, True):
        for chunk in (3, None):
            xs = [v.clone().requires_grad_(grad) for v in (x["hidden"], x["weight"])]
            with pytest.raises(NonFiniteLosses, match="NaN or infinite") as info:
                tilted_cross_entropy(*xs, y, t, chunk_size=chunk, **kwargs)
            messages.add(str(info.value))
    assert len(messages) == 1 and "`hidden`" in messages.pop()


def test_module_count_normalisation_raises_on_non_finite_losses():
    from tiltlab.accumulator import NonFiniteLosses
    from tiltlab.torch import TiltedCrossEntropy

    h, W, b, y = _data()
    h[0, 3, 0] = math.nan
    for level in ("token", "sequence"):
        loss_fn = TiltedCrossEntropy(-1.0, level=level, normalize="count")
        with pytest.raises(NonFiniteLosses, match="NaN or infinite"):
            loss_fn(h.clone().requires_grad_(True), W, y, bias=b)


# ---------------------------------------------------------------------------------------
# the module: TiltedLoss's state, accumulation and exchange over the chunked losses


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("t", [-1.0, 0.0, 2.0])
def test_module_accumulation_equals_one_call_on_the_union(level, t):
    from tiltlab.torch import TiltedCrossEntropy

    k = 2
    W_acc = torch.nn.Parameter(_data()[1].clone())
    W_one = torch.nn.Parameter(_data()[1].clone())
    acc = TiltedCrossEntropy(t, level=level, accumulation_steps=k, chunk_size=3).double()
    one = TiltedCrossEntropy(t, level=level, chunk_size=5).double()
    for step in range(3):
        h, _, b, y = _data(seed=10 + step)
        W_acc.grad = W_one.grad = None
        for part in range(k):
            sl = slice(2 * part, 2 * (part + 1))
            acc(h[sl], W_acc, y[sl], bias=b).backward()
        acc.finish_step([W_acc])
        value = one(h, W_one, y, bias=b)
        value.backward()
        torch.testing.assert_close(W_acc.grad, W_one.grad, **TOL)
        if step == 0:  # the first step: the batch's tilted risk and its gradient, exactly
            Wr = W_one.detach().clone().requires_grad_(True)
            ref = tilted_cross_entropy(h, Wr, y, t, bias=b, level=level)
            ref.backward()
            torch.testing.assert_close(value, ref, **TOL)
            torch.testing.assert_close(W_one.grad, Wr.grad, **TOL)
        with torch.no_grad():
            W_acc -= 0.1 * W_acc.grad
            W_one -= 0.1 * W_one.grad
    torch.testing.assert_close(acc.tilted.risk, one.tilted.risk, **TOL)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_module_accumulation_raises_where_the_weights_leave_the_dtype(level):
    # two classes, logits (h, -h): the loss of class 0 is softplus(-2 h). The first
    # micro-batch's losses are about 10, the second's about 0 and 12: at t = -10 its
    # weights relative to the first, about exp(100), leave float32 (TiltedLoss's
    # accumulation, as one call on the union would not); the error says so
    from tiltlab.torch import TiltedCrossEntropy

    f32 = torch.float32  # explicit: the test suite may make float64 the default
    W = torch.tensor([[1.0], [-1.0]], dtype=f32, requires_grad=True)
    first = torch.tensor([[-5.0, -5.5], [-5.25, -5.0]], dtype=f32)[..., None]
    second = torch.tensor([[5.0, 5.0], [-6.0, -6.0]], dtype=f32)[..., None]
    y = torch.zeros(2, 2, dtype=torch.int64)
    loss_fn = TiltedCrossEntropy(-10.0, level=level, accumulation_steps=2)
    loss_fn(first, W, y).backward()
    with pytest.raises(ValueError, match="first micro-batch.*`observe`"):
        loss_fn(second, W, y)
    one = TiltedCrossEntropy(-10.0, level=level)
    value = one(torch.cat([first, second]), W, torch.cat([y, y]))
    assert bool(torch.isfinite(torch.autograd.grad(value, W)[0]).all())


def test_module_groups_count_and_errors():
    from tiltlab.torch import TiltedCrossEntropy

    h, W, b, y = _data()
    g = torch.tensor([0, 1, 0, 1])
    m = TiltedCrossEntropy(tilts=(1.0, -1.0), level="group", n_groups=2).double()
    v = m(h, W, y, bias=b, groups=g)
    ref = tilted_cross_entropy(h, W, y, tilts=(1.0, -1.0), level="group", groups=g, bias=b)
    torch.testing.assert_close(v, ref, **TOL)  # the first step is the hierarchy's risk
    assert m.group_report()["risk"].shape == (2,)
    c = TiltedCrossEntropy(-1.0, normalize="count")
    torch.testing.assert_close(
        c(h, W, y), tilted_cross_entropy(h, W, y, -1.0, normalize="count"), **TOL
    )
    with pytest.raises(ValueError, match="accumulation_steps"):
        TiltedCrossEntropy(-1.0, normalize="count", accumulation_steps=2)
    with pytest.raises(ValueError, match="tilts"):
        TiltedCrossEntropy(-1.0, level="group")
    with pytest.raises(ValueError, match="groups"):
        TiltedCrossEntropy(-1.0)(h, W, y, groups=g)


LM_WORKER = r"""
import sys

import numpy as np
import torch
import torch.distributed as dist

from tiltlab.torch import TiltedCrossEntropy

rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
distributed = world > 1
if distributed:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
torch.set_num_threads(1)


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 6, dtype=torch.float64)
        self.head = torch.nn.Linear(6, 9, bias=False, dtype=torch.float64)

    def forward(self, x):
        return torch.tanh(self.body(x))


SIZES = (3, 5)  # sequences per process: unequal batches
results = {}
for case, kwargs in {"token": dict(t=-2.0), "sequence": dict(t=-1.0, level="sequence")}.items():
    torch.manual_seed(0)
    model = LM()
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    loss_fn = TiltedCrossEntropy(distributed=distributed, lam=0.3, chunk_size=3, **kwargs)
    loss_fn = loss_fn.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        X = torch.randn(sum(SIZES), 4, 4, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 9, (sum(SIZES), 4), generator=gen)
        y[:, 0] = -100
        if distributed:
            lo = sum(SIZES[:rank])
            X, y = X[lo : lo + SIZES[rank]], y[lo : lo + SIZES[rank]]
        opt.zero_grad()
        value = loss_fn(net(X), model.head.weight, y)
        value.backward()
        grads = [p.grad.reshape(-1) for p in model.parameters()]
        results[f"{case}/{step}/grad"] = torch.cat(grads).numpy()
        results[f"{case}/{step}/value"] = np.array(float(value.detach()))
        opt.step()
np.savez(out, **results)
if distributed:
    dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes
def test_module_data_parallel_equals_one_process_on_the_global_batch(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    import os
    import pathlib
    import subprocess
    import sys

    import numpy as np

    import tiltlab

    script = tmp_path / "worker.py"
    script.write_text(LM_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = str(pathlib.Path(tiltlab.__file__).resolve().parent.parent)
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
    for r in range(2):
        got = np.load(tmp_path / f"rank{r}.npz")
        for key in ref.files:
            if key.endswith("/value"):  # each process's value is the shared running estimate
                np.testing.assert_allclose(got[key], ref[key], rtol=1e-10, err_msg=key)
            else:
                np.testing.assert_allclose(got[key], ref[key], rtol=1e-10, atol=1e-13, err_msg=key)


@pytest.mark.parametrize("t", [-1.0, 0.0, 1e-12, math.inf, -math.inf, 3.0])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("normalize", ["weights", "count"])
def test_vocabulary_in_blocks_matches_full_logits(t, level, normalize, monkeypatch):
    # a budget of 12 logits and chunks of at least 3 tokens: vocabulary blocks of 4, 4, 3
    from tiltlab.torch import cross_entropy as ce

    monkeypatch.setattr(ce, "CHUNK_ELEMENTS", 12)
    monkeypatch.setattr(ce, "MIN_TOKENS", 3)
    if normalize == "count" and math.isinf(t):
        return
    got, ref = _both(t, level, None, normalize=normalize)
    for a, r in zip(got, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL)


def test_vocabulary_in_blocks_groups_and_token_losses(monkeypatch):
    from tiltlab.torch import cross_entropy as ce

    monkeypatch.setattr(ce, "CHUNK_ELEMENTS", 12)
    monkeypatch.setattr(ce, "MIN_TOKENS", 3)
    got, ref = _both(None, "group", None, tilts=(2.0, -1.0), groups=torch.tensor([0, 1, 0, 1]))
    for a, r in zip(got, ref, strict=True):
        torch.testing.assert_close(a, r, **TOL)
    h, W, b, y = _data()
    hs, Ws = (x.clone().requires_grad_(True) for x in (h, W))
    l = token_cross_entropy(hs, Ws, y)
    ref_l = F.cross_entropy((h @ W.T).reshape(-1, 11), y.reshape(-1), reduction="none").reshape(
        y.shape
    )
    torch.testing.assert_close(l, ref_l, **TOL)
    v = torch.randn(y.shape, dtype=D)
    got = torch.autograd.grad((l * v).sum(), (hs, Ws))
    hr, Wr = (x.clone().requires_grad_(True) for x in (h, W))
    lr = F.cross_entropy((hr @ Wr.T).reshape(-1, 11), y.reshape(-1), reduction="none").reshape(
        y.shape
    )
    want = torch.autograd.grad((lr * v).sum(), (hr, Wr))
    for a, r in zip(got, want, strict=True):
        torch.testing.assert_close(a, r, **TOL)
