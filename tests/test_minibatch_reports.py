"""Per-group reports of the running state and the tilt chosen by effective sample size.

References: ``tiltlab.diagnostics.group_report`` on the whole batch (an independent
implementation), and brute-force effective sample sizes ``(sum w)^2 / sum w^2`` of the
weights ``exp(t l)`` written out with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab
from tiltlab.diagnostics import group_report
from tiltlab.minibatch import MinibatchTilt, linear_schedule


def _ess_fraction(l, t):
    w = np.exp(t * (l - l.max()))
    return w.sum() ** 2 / (w.size * (w * w).sum())


def _batch(n=30, seed=0):
    rng = np.random.default_rng(seed)
    return rng.exponential(size=n), rng.integers(0, 3, size=n)


@pytest.mark.parametrize("tilts", [(2.0, -1.0), (-1.0, 0.5), (0.0, 0.0)])
def test_full_batch_report_matches_the_data_set_report(tilts):
    l, g = _batch()
    tilt = MinibatchTilt(tilts=tilts, n_groups=3)
    tilt.weights(l, g)
    rep, ref = tilt.group_report(), group_report(l, g, tilts)
    for key in ("risk", "mass", "weight", "ess"):
        np.testing.assert_allclose(rep[key], ref[key], rtol=1e-12, err_msg=key)
    np.testing.assert_array_equal(rep["size"], ref["size"])


def test_running_report_after_several_batches():
    tilt = MinibatchTilt(tilts=(1.5, -2.0), n_groups=3, lam=0.2)
    for seed in range(4):
        l, g = _batch(seed=seed)
        tilt.weights(l, g)
    rep = tilt.group_report()
    state = tilt.state_dict()
    np.testing.assert_array_equal(rep["risk"], state["risk"])
    mass = state["counts"] / state["counts"].sum()
    np.testing.assert_allclose(rep["mass"], mass, rtol=1e-15)
    w = mass * np.exp(1.5 * state["risk"])
    np.testing.assert_allclose(rep["weight"], w / w.sum(), rtol=1e-13)
    ess = [_ess_fraction(l[g == k], -2.0) for k in range(3)]
    np.testing.assert_allclose(rep["ess"], ess, rtol=1e-12)


def test_torch_reports_and_ess_tilt():
    torch = pytest.importorskip("torch")
    from tiltlab.torch import TiltedLoss

    l, g = _batch(seed=5)
    loss_fn = TiltedLoss(tilts=(2.0, -1.0), n_groups=3).double()
    loss_fn(torch.tensor(l), groups=torch.tensor(g))
    rep, ref = loss_fn.group_report(), group_report(l, g, (2.0, -1.0))
    for key in ("risk", "mass", "weight", "ess"):
        np.testing.assert_allclose(rep[key].numpy(), ref[key], rtol=1e-12, err_msg=key)
    sample = TiltedLoss(t=-2.0).double()
    sample(torch.tensor(l))
    assert float(sample.group_report()["ess"][0]) == pytest.approx(_ess_fraction(l, -2.0), 1e-12)

    # the tilt chosen by ESS: on the whole data in one batch the gradient is the tilted
    # weights at that tilt, whose effective sample size is the fraction asked for
    chosen = TiltedLoss(ess=0.4).double()
    x = torch.tensor(l, requires_grad=True)
    (grad,) = torch.autograd.grad(chosen(x), x)
    assert chosen.t < 0
    assert _ess_fraction(l, chosen.t) == pytest.approx(0.4, rel=1e-8)
    np.testing.assert_allclose(grad.numpy(), tiltlab.tilted_weights(l, chosen.t), rtol=1e-12)
    ramp = TiltedLoss(ess=linear_schedule(1.0, 0.5, 2), ess_sign=1)
    ramp(torch.tensor(l))
    assert ramp.t == 0.0
    ramp(torch.tensor(l))
    assert ramp.t > 0 and _ess_fraction(l, ramp.t) == pytest.approx(0.75, rel=1e-6)
    with pytest.raises(ValueError, match="`ess`"):
        TiltedLoss(ess=1.5)
    with pytest.raises(ValueError, match="at most one"):
        TiltedLoss(t=1.0, ess=0.5)
