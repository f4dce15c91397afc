"""`hierarchical_risk` differentiates through tilts that carry autograd (PyTorch), as
`tilted_risk` does: checked against central finite differences of an independent NumPy
evaluation of the nested formula, in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tiltlab as tl

torch = pytest.importorskip("torch")


def _tilted(values: np.ndarray, mass: np.ndarray, t: float) -> float:
    """(1/t) log sum mass exp(t v) (mass summing to one), its limits at 0 and +-inf."""
    keep = mass > 0
    v, q = values[keep], mass[keep] / mass[keep].sum()
    if t == 0.0:
        return float(q @ v)
    if math.isinf(t):
        return float(v.max() if t > 0 else v.min())
    c = v.max() if t > 0 else v.min()
    # log1p of the expm1 sum: accurate to rounding for tiny |t| too (the differences below)
    return float(c + np.log1p(q @ np.expm1(t * (v - c))) / t)


def _reference(losses, labels, tilts, prior=None) -> float:
    """The nested definition, level by level (labels outermost first)."""
    n = len(losses)
    p = np.full(n, 1.0 / n) if prior is None else prior / prior.sum()
    values, masses, members = list(losses), list(p), [[i] for i in range(n)]
    for depth in range(len(labels) - 1, -1, -1):  # innermost grouping first
        lab = labels[depth]
        keys = sorted({lab[m[0]] for m in members})
        new_values, new_masses, new_members = [], [], []
        for key in keys:
            idx = [j for j, m in enumerate(members) if lab[m[0]] == key]
            mm = np.array([masses[j] for j in idx])
            new_values.append(_tilted(np.array([values[j] for j in idx]), mm, tilts[depth + 1]))
            new_masses.append(mm.sum())
            new_members.append([i for j in idx for i in members[j]])
        values, masses, members = new_values, new_masses, new_members
    return _tilted(np.array(values), np.array(masses), tilts[0])


def _fd_gradient(losses, labels, tilts, prior=None, h=1e-5):
    grad = []
    for k in range(len(tilts)):
        if math.isinf(tilts[k]):
            grad.append(0.0)
            continue
        up, down = list(tilts), list(tilts)
        up[k] += h
        down[k] -= h
        grad.append(
            (_reference(losses, labels, up, prior) - _reference(losses, labels, down, prior))
            / (2 * h)
        )
    return np.array(grad)


RNG = np.random.default_rng(3)
LOSSES = RNG.gamma(2.0, 0.5, size=40)
OUTER = RNG.integers(0, 3, size=40)
INNER = OUTER * 10 + RNG.integers(0, 4, size=40)  # nested in OUTER


@pytest.mark.parametrize(
    "tilts",
    [(1.0, -2.0), (-0.5, 3.0), (0.0, 0.0), (2.0, 0.0), (0.0, -1.5), (1.0, -np.inf), (1e-7, 0.7)],
)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_gradient_in_the_tilts_matches_finite_differences(tilts, as_tensor):
    l = torch.tensor(LOSSES, dtype=torch.float64)
    g = torch.tensor(OUTER)
    if as_tensor:
        tt = torch.tensor(tilts, dtype=torch.float64, requires_grad=True)
        arg, wrt = tt, [tt]
    else:
        arg = [torch.tensor(t, dtype=torch.float64, requires_grad=True) for t in tilts]
        wrt = arg
    r = tl.hierarchical_risk(l, g, arg)
    assert r.requires_grad and r.dtype == torch.float64
    ref = _reference(LOSSES, [OUTER], tilts)
    assert float(r.detach()) == pytest.approx(ref, rel=1e-12, abs=1e-14)
    grads = torch.autograd.grad(r, wrt)
    got = (grads[0] if as_tensor else torch.stack(grads)).numpy()
    want = _fd_gradient(LOSSES, [OUTER], tilts)
    # central differences with h = 1e-5 on values of size ~1: truncation h^2 * R''' ~ 1e-10,
    # rounding eps / h ~ 1e-11
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_gradient_with_two_levels_and_a_prior():
    prior = RNG.uniform(0.1, 1.0, size=40)
    prior[[0, 5]] = 0.0  # children without mass
    tilts = (0.8, -1.0, 2.0)
    l = torch.tensor(LOSSES, dtype=torch.float64)
    tt = torch.tensor(tilts, dtype=torch.float64, requires_grad=True)
    r = tl.hierarchical_risk(
        l, [torch.tensor(OUTER), torch.tensor(INNER)], tt, weights=torch.tensor(prior)
    )
    ref = _reference(LOSSES, [OUTER, INNER], tilts, prior)
    assert float(r.detach()) == pytest.approx(ref, rel=1e-12)
    (grad,) = torch.autograd.grad(r, [tt])
    assert np.all(np.isfinite(grad.numpy()))
    want = _fd_gradient(LOSSES, [OUTER, INNER], tilts, prior)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, atol=1e-8)


def test_only_one_tilt_requires_grad_and_losses_too():
    l = torch.tensor(LOSSES, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    r = tl.hierarchical_risk(l, torch.tensor(OUTER), (0.5, tau))
    dl, dtau = torch.autograd.grad(r, [l, tau])
    # the gradient in the losses is the hierarchical weights (the paper's lemma)
    w = tl.hierarchical_weights(LOSSES, OUTER, (0.5, -1.0))
    np.testing.assert_allclose(dl.numpy(), w, rtol=1e-10, atol=1e-15)
    want = _fd_gradient(LOSSES, [OUTER], (0.5, -1.0))[1]
    assert float(dtau) == pytest.approx(want, rel=1e-6)


def test_float32_tilts_on_float64_losses_keep_the_losses_dtype():
    l = torch.tensor(LOSSES, dtype=torch.float64)
    tt = torch.tensor([1.0, -2.0], dtype=torch.float32, requires_grad=True)
    r = tl.hierarchical_risk(l, torch.tensor(OUTER), tt)
    assert r.dtype == torch.float64
    (grad,) = torch.autograd.grad(r, [tt])
    assert grad.dtype == torch.float32
    np.testing.assert_allclose(grad.numpy(), _fd_gradient(LOSSES, [OUTER], (1.0, -2.0)), rtol=1e-5)
