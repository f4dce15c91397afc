"""The table of scalar losses (``tiltlab/losses/table.py``): the generated dialects are
the checked-in files byte for byte, the vocabulary is enforced, and the two losses added
through the table alone (Poisson, pinball) against definitions written out here."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from tiltlab.losses import LOSS_NAMES, get_loss
from tiltlab.losses import _generate as gen
from tiltlab.losses.pointwise import POINT_LOSSES, point
from tiltlab.losses.table import TABLE


@pytest.mark.parametrize("path", sorted(gen.outputs()), ids=lambda p: p.name)
def test_generated_files_are_the_table(path):
    # regenerate with: python -m tiltlab.losses._generate
    assert path.read_text(encoding="utf-8") == gen.outputs()[path]


def test_the_check_command_fails_on_a_stale_file(monkeypatch, tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(gen, "outputs", lambda: {stale: "new\n"})
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert stale.read_text(encoding="utf-8") == "old\n"
    assert gen.main([]) == 0 and stale.read_text(encoding="utf-8") == "new\n"


@pytest.mark.parametrize("text", ["sqrt(z)", "z ** 2", "a < b < c", "z if y else 0", "True"])
def test_the_vocabulary_is_enforced(text):
    with pytest.raises(ValueError, match="vocabulary"):
        gen.parse(text)


def test_every_scalar_registered_loss_is_in_the_table():
    scalar = {n for n in LOSS_NAMES if not POINT_LOSSES[n].vector}
    assert {f.name for f in TABLE} == scalar


# ---------------------------------------------------------------------------------------
# Poisson and pinball: the definitions, written out in 50 digits


def _poisson_def(z, y):
    z, y = mpmath.mpf(z), mpmath.mpf(y)
    ylogy = y * mpmath.log(y) if y > 0 else 0
    return mpmath.exp(z) - y - y * z + ylogy


def _pinball_def(z, y, q):
    r = mpmath.mpf(y) - mpmath.mpf(z)
    q = mpmath.mpf(q)
    return max(q * r, (q - 1) * r)


@pytest.mark.parametrize("z", [-20.0, -1.0, 0.0, 0.3, math.log(7.0), 5.0])
@pytest.mark.parametrize("y", [0.0, 0.25, 1.0, 7.0, 1e3])
def test_poisson_reference_is_the_definition(z, y):
    with mpmath.workdps(50):
        v, d1, d2 = point("poisson", z, y, m=mpmath)
        # the definition is a sum that cancels near a perfect fit: 50 digits of its terms
        terms = mpmath.exp(z) + y + abs(y * z) + (y * abs(mpmath.log(y)) if y else 0)
        tol = mpmath.mpf(10) ** -45
        assert mpmath.almosteq(v, _poisson_def(z, y), rel_eps=tol, abs_eps=tol * terms)
        assert mpmath.almosteq(d1, mpmath.diff(lambda s: _poisson_def(s, y), z), 1e-30)
        assert mpmath.almosteq(d2, mpmath.diff(lambda s: _poisson_def(s, y), z, 2), 1e-30)
    assert point("poisson", math.log(7.0), 7.0)[0] == pytest.approx(0.0, abs=1e-14)


@pytest.mark.parametrize("q", [0.05, 0.5, 0.9])
@pytest.mark.parametrize(("z", "y"), [(0.0, 1.0), (2.0, -1.0), (1.5, 1.5), (-3.0, -7.0)])
def test_pinball_reference_is_the_definition(z, y, q):
    with mpmath.workdps(50):
        v, d1, d2 = point("pinball", z, y, m=mpmath, quantile=q)
        assert v == _pinball_def(z, y, q)
        if z != y:
            assert mpmath.almosteq(d1, mpmath.diff(lambda s: _pinball_def(s, y, q), z), 1e-30)
        else:  # the kink: 0, inside the subdifferential [-q, 1 - q], as sign(0) = 0
            assert d1 == 0 and point("absolute", z, y)[1] == 0
        assert d2 == 0
    # the absolute loss is twice the pinball loss at q = 1/2, derivatives included
    assert [2 * a for a in point("pinball", z, y, quantile=0.5)] == list(point("absolute", z, y))


def test_poisson_and_pinball_finite_differences(xp):
    rng = np.random.default_rng(0)
    z = rng.normal(size=40)
    y = rng.poisson(2.0, size=40).astype(float)
    for name, kw in (("poisson", {}), ("pinball", {"quantile": 0.3})):
        loss = get_loss(name, **kw)
        h = 1e-6
        v, d1, d2 = (np.asarray(a) for a in loss.derivatives(z, y))
        fd1 = (loss.value(z + h, y) - loss.value(z - h, y)) / (2 * h)
        np.testing.assert_allclose(d1, fd1, rtol=1e-6, atol=1e-8)
        if name == "poisson":
            fd2 = (loss.derivatives(z + h, y)[1] - loss.derivatives(z - h, y)[1]) / (2 * h)
            np.testing.assert_allclose(d2, fd2, rtol=1e-6)
        # the same numbers on every backend, in the input's namespace and dtype
        from tiltlab.testing import assert_close

        got = loss.derivatives(xp.asarray(z), xp.asarray(y))
        for a, b in zip(got, (v, d1, d2), strict=True):
            assert_close(a, xp.asarray(b), xp=xp, rtol=1e-12)


def test_labels_and_parameters_are_validated():
    with pytest.raises(ValueError, match="`y`.*non-negative"):
        get_loss("poisson").value(np.zeros(2), np.array([1.0, -1.0]))
    for q in (0.0, 1.0, -0.5, 2.0, float("nan")):
        with pytest.raises(ValueError, match="`quantile`"):
            get_loss("pinball", quantile=q)
    with pytest.raises(TypeError, match="params"):
        get_loss("poisson", delta=1.0)
    assert repr(get_loss("pinball", quantile=0.25)) == "PinballLoss(quantile=0.25)"
    assert get_loss("pinball").parameters() == {"quantile": 0.5}


def test_pinball_at_zero_tilt_fits_the_sample_quantile():
    from tiltlab.objective import TiltedObjective
    from tiltlab.solvers import minimize

    rng = np.random.default_rng(1)
    y = rng.exponential(size=201)
    X = np.ones((201, 1))
    for q in (0.1, 0.5, 0.8):
        obj = TiltedObjective(get_loss("pinball", quantile=q), X, y, t=0.0)
        res = minimize(obj, np.zeros(1), method="lbfgs", max_iter=2000)
        # any minimiser lies between the order statistics around q N (the objective is
        # flat there): compare the objective with the one at the sample quantile
        at_q = float(obj.value(np.array([np.quantile(y, q, method="inverted_cdf")])))
        assert float(obj.value(res.x)) <= at_q * (1 + 1e-6)


def test_poisson_regressor_at_zero_tilt_is_the_glm_fit():
    linear_model = pytest.importorskip("sklearn.linear_model")
    from tiltlab.estimators import TiltedRegressor

    rng = np.random.default_rng(2)
    X = rng.normal(size=(400, 3))
    y = rng.poisson(np.exp(X @ np.array([0.4, -0.3, 0.2]) + 0.5)).astype(float)
    ours = TiltedRegressor(loss="poisson", tol=1e-10).fit(X, y)
    ref = linear_model.PoissonRegressor(alpha=0.0, tol=1e-12, max_iter=1000).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-5)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-5)
    with pytest.raises(ValueError, match="`y`"):
        TiltedRegressor(loss="poisson").fit(X, -y - 1.0)


def test_pinball_regressor_fits_a_conditional_quantile():
    from sklearn.base import clone

    from tiltlab.estimators import TiltedRegressor

    rng = np.random.default_rng(3)
    X = rng.uniform(size=(600, 1))
    y = 2.0 * X[:, 0] + rng.exponential(size=600)
    est = TiltedRegressor(loss="pinball", quantile=0.8, max_iter=3000)
    assert est.get_params()["quantile"] == 0.8
    assert clone(est.set_params(quantile=0.7)).quantile == 0.7
    est.fit(X, y)
    # a q-quantile fit leaves about a fraction q of the targets below it
    below = float(np.mean(y <= est.predict(X)))
    assert abs(below - 0.7) < 0.03
    # the slope of the exponential noise's 0.7-quantile line is that of the mean: 2
    assert est.coef_[0] == pytest.approx(2.0, abs=0.3)
    with pytest.raises(ValueError, match="`quantile`"):
        TiltedRegressor(loss="pinball", quantile=1.5).fit(X, y)
