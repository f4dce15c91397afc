"""TiltedLoss at group level over several steps, against an independent float64 NumPy
reference of the running estimator and, for a first batch, against central finite
differences of the batch's hierarchical tilted risk."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

torch = pytest.importorskip("torch")

from tiltlab.torch import TiltedLoss  # noqa: E402


def _tilted_mean(v, t, b=None):
    """(1/t) log(sum b exp(t v) / sum b), the mean at t = 0, the extreme at +-inf."""
    v = np.asarray(v, dtype=np.float64)
    b = np.ones_like(v) if b is None else np.asarray(b, dtype=np.float64)
    on = b > 0
    if t == 0:
        return float(np.sum(b[on] * v[on]) / np.sum(b[on]))
    if math.isinf(t):
        return float(v[on].max() if t > 0 else v[on].min())
    return float((logsumexp(t * v[on], b=b[on]) - math.log(np.sum(b[on]))) / t)


def _outer_weights(risk, mass, t):
    on = mass > 0
    w = np.zeros_like(risk)
    if math.isinf(t):
        ext = risk[on].max() if t > 0 else risk[on].min()
        w[on] = np.where(risk[on] == ext, mass[on], 0.0)
    else:
        z = t * risk[on]
        w[on] = mass[on] * np.exp(z - z.max())
    return w / w.sum()


class RunningReference:
    """The running estimator written from its definition: per group the batch's tilted
    risk ``B_g``, the tilted average ``(1/t) log((1 - lam) e^{t R_g} + lam e^{t B_g})``
    (``B_g`` itself on a group's first batch), the masses ``counts / sum(counts)``, the
    outer tilted risk of the groups and the weights ``W_g / (n p_g) exp(t (l - R_g))``."""

    def __init__(self, t_group, t_sample, n_groups, lam):
        self.tg, self.ts, self.lam = t_group, t_sample, lam
        self.risk = np.zeros(n_groups)
        self.seen = np.zeros(n_groups, dtype=bool)
        self.counts = np.zeros(n_groups)

    def __call__(self, losses, groups):
        ts, lam = self.ts, self.lam
        for g in np.unique(groups):
            b = _tilted_mean(losses[groups == g], ts)
            if not self.seen[g] or lam == 1.0:
                self.risk[g] = b
            elif ts == 0:
                self.risk[g] = (1 - lam) * self.risk[g] + lam * b
            else:
                r = self.risk[g]
                self.risk[g] = np.logaddexp(np.log1p(-lam) + ts * r, np.log(lam) + ts * b) / ts
            self.seen[g] = True
            self.counts[g] += np.sum(groups == g)
        mass = self.counts / self.counts.sum()
        value = _tilted_mean(self.risk, self.tg, mass)
        if self.tg == 0 and ts == 0:
            value = float(np.mean(losses))
        outer = _outer_weights(self.risk, mass, self.tg)
        n = losses.shape[0]
        r = self.risk[groups]
        weights = outer[groups] / (n * mass[groups]) * np.exp(ts * (losses - r))
        return value, weights


def _hierarchical_risk(losses, groups, t_group, t_sample):
    """The batch's two-level tilted risk (groups weighted by their share of the batch)."""
    ids = np.unique(groups)
    risks = np.array([_tilted_mean(losses[groups == g], t_sample) for g in ids])
    mass = np.array([np.mean(groups == g) for g in ids])
    return _tilted_mean(risks, t_group, mass)


TILTS = [(1.0, 0.0), (0.0, 0.0), (-2.0, 0.0), (2.0, -1.0), (0.0, 0.5), (-1.0, 3.0)]
# tilts outside the few-operation path (|t_sample| < 0.05, t_group = +-inf) follow the same
# definition through the general path
OTHER_TILTS = [(1.0, 0.01), (math.inf, -1.0), (-math.inf, 0.0)]


@pytest.mark.parametrize("tilts", TILTS + OTHER_TILTS)
@pytest.mark.parametrize("lam", [0.3, 1.0])
def test_running_group_level_matches_the_reference(tilts, lam):
    rng = np.random.default_rng(7)
    n_groups = 5
    loss_fn = TiltedLoss(tilts=tilts, n_groups=n_groups, lam=lam).double()
    ref = RunningReference(*tilts, n_groups, lam)
    for step in range(6):
        n = int(rng.integers(6, 30))
        # groups 3 and 4 are absent from some batches; group 4 only appears from step 2
        high = 5 if step >= 2 else 4
        groups = rng.integers(0, high if step % 2 else 3, size=n)
        losses = rng.gamma(2.0, 0.7, size=n) + 0.5 * groups
        value_ref, w_ref = ref(losses, groups)
        l = torch.tensor(losses, requires_grad=True)
        out = loss_fn(l, groups=torch.tensor(groups))
        out.backward()
        assert out.item() == pytest.approx(value_ref, rel=1e-12, abs=1e-14), step
        np.testing.assert_allclose(l.grad.numpy(), w_ref, rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(loss_fn.risk.numpy(), ref.risk, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(loss_fn.counts.numpy(), ref.counts)


@pytest.mark.parametrize("tilts", TILTS + [(1.0, 0.01)])
def test_first_batch_gradient_by_finite_differences(tilts):
    # on a first batch the running state is the batch's own, so the value is the
    # hierarchical tilted risk of the batch and the weights are its gradient
    rng = np.random.default_rng(3)
    n = 24
    groups = rng.integers(0, 4, size=n)
    losses = rng.uniform(0.2, 2.0, size=n) + 0.3 * groups
    l = torch.tensor(losses, requires_grad=True)
    out = TiltedLoss(tilts=tilts, n_groups=4).double()(l, groups=torch.tensor(groups))
    out.backward()
    assert out.item() == pytest.approx(_hierarchical_risk(losses, groups, *tilts), rel=1e-12)
    h = 1e-6
    fd = np.empty(n)
    for i in range(n):
        up, down = losses.copy(), losses.copy()
        up[i] += h
        down[i] -= h
        fd[i] = (
            _hierarchical_risk(up, groups, *tilts) - _hierarchical_risk(down, groups, *tilts)
        ) / (2 * h)
    # central differences: truncation ~ h^2 |f'''|, rounding ~ eps |f| / h (about 1e-10)
    np.testing.assert_allclose(l.grad.numpy(), fd, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("tilts", [(1.0, 0.0), (2.0, -1.0)])
def test_float32_group_step_matches_float64(tilts):
    rng = np.random.default_rng(11)
    a = TiltedLoss(tilts=tilts, n_groups=3, lam=0.5)
    b = TiltedLoss(tilts=tilts, n_groups=3, lam=0.5).double()
    for _ in range(4):
        losses = rng.exponential(size=40)
        groups = torch.tensor(rng.integers(0, 3, size=40))
        la = torch.tensor(losses, dtype=torch.float32, requires_grad=True)
        lb = torch.tensor(losses, dtype=torch.float64, requires_grad=True)
        a(la, groups=groups).backward()
        out_b = b(lb, groups=groups)
        out_b.backward()
    assert a.risk.dtype == torch.float32 and la.grad.dtype == torch.float32
    np.testing.assert_allclose(la.grad.numpy(), lb.grad.numpy(), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(a.risk.numpy(), b.risk.numpy(), rtol=2e-5)


def test_bad_group_batch_is_skipped_without_raising():
    loss_fn = TiltedLoss(tilts=(1.0, -1.0), n_groups=2, check_finite=False)
    loss_fn(torch.tensor([0.1, 0.5, 0.2]), groups=torch.tensor([0, 1, 1]))
    state = {k: v.clone() for k, v in loss_fn.named_buffers() if k not in ("nonfinite", "used")}
    out = loss_fn(torch.tensor([0.1, math.inf]), groups=torch.tensor([0, 1]))
    assert math.isnan(out.item())
    out = loss_fn(torch.tensor([0.1, 0.2]), groups=torch.tensor([0, 5]))
    assert math.isnan(out.item())
    for key, value in state.items():
        if key != "step":
            assert torch.equal(getattr(loss_fn, key), value), key
    assert int(loss_fn.nonfinite) == 2


@pytest.mark.parametrize("tilts", [(1e-3, -1.0), (-1e-4, 0.0), (2e-3, 0.5)])
def test_small_group_tilt_in_float32(tilts):
    # near t_group = 0 the outer risk is shift + log1p(d) / t_group: d must be normalised
    # by the groups' total mass exactly (masses that add up to 1 only to rounding would
    # leave an error of eps / |t_group|)
    rng = np.random.default_rng(5)
    n_groups = 7
    loss_fn = TiltedLoss(tilts=tilts, n_groups=n_groups, lam=0.5)
    ref = RunningReference(*tilts, n_groups, 0.5)
    for _ in range(5):
        n = int(rng.integers(20, 60))
        groups = rng.integers(0, n_groups, size=n)
        losses = (rng.gamma(2.0, 0.7, size=n) + 0.3 * groups).astype(np.float32)
        value_ref, w_ref = ref(losses.astype(np.float64), groups)
        l = torch.tensor(losses, requires_grad=True)
        out = loss_fn(l, groups=torch.tensor(groups))
        out.backward()
        assert out.item() == pytest.approx(value_ref, rel=1e-5)
        np.testing.assert_allclose(l.grad.numpy(), w_ref, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("tilts", [(1.0, -1.0), (-2.0, 3.0), (0.5, 0.0)])
def test_tied_and_single_sample_groups(tilts):
    # a group of equal losses (every shifted sum is exact), a group of one sample and a
    # group whose losses differ by 1e-12 (the log1p form)
    losses = np.array([0.7, 0.7, 0.7, 2.5, 1.0, 1.0 + 1e-12, 1.0 + 3e-12, 0.7])
    groups = np.array([0, 0, 0, 1, 2, 2, 2, 0])
    ref = RunningReference(*tilts, 3, 0.3)
    loss_fn = TiltedLoss(tilts=tilts, n_groups=3, lam=0.3).double()
    for shift in (0.0, 0.25):
        value_ref, w_ref = ref(losses + shift * groups, groups)
        l = torch.tensor(losses + shift * groups, requires_grad=True)
        out = loss_fn(l, groups=torch.tensor(groups))
        out.backward()
        assert out.item() == pytest.approx(value_ref, rel=1e-13)
        np.testing.assert_allclose(l.grad.numpy(), w_ref, rtol=1e-12)
        assert loss_fn.ess[0].item() == 1.0 and loss_fn.ess[1].item() == 1.0
