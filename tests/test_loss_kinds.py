"""The two kinds of losses: prediction-space losses (``value_and_d1`` against
``derivatives`` and finite differences, for every registered loss) and parameter-space
losses (their own base, accepted everywhere a loss is)."""

from __future__ import annotations

import numpy as np
import pytest

import tiltlab as tl
from tiltlab._compat import to_numpy
from tiltlab.losses import LOSS_NAMES, CallableLoss, FairPCALoss, Loss, get_loss
from tiltlab.losses.custom import ParameterLoss
from tiltlab.testing import assert_close


def _case(name: str, n: int = 40, seed: int = 0):
    """Predictors away from the kinks of the non-smooth losses, and labels."""
    rng = np.random.default_rng(seed)
    if name == "multinomial":
        return rng.standard_normal((n, 3)), rng.integers(0, 3, n)
    if get_loss(name).label_kind == "binary":
        y = rng.integers(0, 2, n).astype(float)
        s = 2 * y - 1
        m = rng.choice([-1.0, 1.0], n) * rng.uniform(0.2, 0.8, n)  # margin 1 - s z off 0
        return s * (1 - m), y
    y = rng.standard_normal(n)
    if get_loss(name).label_kind == "nonnegative":  # counts, zeros included
        y = rng.poisson(1.5, n).astype(float)
    r = rng.choice([-1.0, 1.0], n) * rng.uniform(0.1, 2.0, n)  # residuals off 0 and +-delta
    r = np.where(np.abs(np.abs(r) - 1.0) < 0.1, r * 1.3, r)
    return y + r, y


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_value_and_d1_equals_derivatives(xp, name):
    z_np, y_np = _case(name)
    loss = get_loss(name).with_labels(y_np)
    z, y = xp.asarray(z_np), xp.asarray(y_np)
    v1, d1 = loss.value_and_d1(z, y, xp=xp)
    v, g, _ = loss.derivatives(z, y, xp=xp)
    assert_close(v1, to_numpy(v), xp=xp, rtol=1e-15)
    assert_close(d1, to_numpy(g), xp=xp, rtol=1e-15)
    assert_close(v, to_numpy(loss.value(z, y, xp=xp)), xp=xp, rtol=1e-15)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_derivatives_against_finite_differences(name):
    z, y = _case(name, seed=3)
    loss = get_loss(name).with_labels(y)
    h = 1e-6
    _, d1, d2 = loss.derivatives(z, y)
    if z.ndim == 1:
        fd1 = (loss.value(z + h, y) - loss.value(z - h, y)) / (2 * h)
        np.testing.assert_allclose(d1, fd1, rtol=1e-6, atol=1e-8)
        if loss.smooth:
            _, a, _ = loss.derivatives(z + h, y)
            _, b, _ = loss.derivatives(z - h, y)
            np.testing.assert_allclose(d2, (a - b) / (2 * h), rtol=1e-5, atol=1e-7)
        return
    u = np.random.default_rng(4).standard_normal(z.shape)
    fd1 = (loss.value(z + h * u, y) - loss.value(z - h * u, y)) / (2 * h)
    np.testing.assert_allclose(np.sum(d1 * u, axis=1), fd1, rtol=1e-6, atol=1e-8)
    _, a, _ = loss.derivatives(z + h * u, y)
    _, b, _ = loss.derivatives(z - h * u, y)
    np.testing.assert_allclose(loss.hvp_z(z, y, u), (a - b) / (2 * h), rtol=1e-5, atol=1e-7)


def test_parameter_losses_are_their_own_kind():
    loss = CallableLoss(lambda th, X, y: th**2, lambda th, X, y: np.diag(2 * th))
    assert isinstance(loss, ParameterLoss) and not isinstance(loss, Loss)
    assert issubclass(FairPCALoss, ParameterLoss)
    assert get_loss(loss) is loss and loss.is_linear is False
    for name in LOSS_NAMES:
        assert isinstance(get_loss(name), Loss) and not isinstance(get_loss(name), ParameterLoss)
    # an objective takes either kind
    obj = tl.TiltedObjective(loss, t=1.0)
    np.testing.assert_allclose(obj.value(np.array([1.0, 2.0])), np.log(np.mean(np.exp([1, 4]))))
    with pytest.raises(NotImplementedError, match="no per-sample Hessian"):
        loss.hess(np.ones(2))
