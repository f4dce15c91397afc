"""The point contract of the losses (:mod:`tiltlab.losses.pointwise`) against independent
references: the textbook definitions of the tests' reference module (``_contract.py``) at
500 digits, numerical derivatives of the value (``mpmath.diff``), one-sided derivatives
at the kinks, SciPy's Huber, and the registry's metadata (label kinds, parameters,
curvature bounds)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _contract import CLASS_Z, PARAMS, points, reference_loss, term_scales

from tiltlab.losses import LOSS_NAMES, get_loss
from tiltlab.losses.pointwise import POINT_LOSSES, point, valid_label

LOSS_CASES = [(name, p) for name in LOSS_NAMES for p in PARAMS.get(name, [{}])]


def _kinks(name, y, params):
    """Predictors where the derivative (or the second one) jumps."""
    if name == "absolute":
        return [y]
    if name == "huber":
        delta = params.get("delta", 1.0)
        return [y - delta, y + delta]
    if name == "pinball":
        return [y]
    if name in ("hinge", "squared_hinge"):
        return [2 * y - 1]  # the margin 1 - (2y - 1) z is 0 at z = 2y - 1 = +-1
    return []


def _close(a, b, digits=40):
    return abs(a - b) <= mpmath.mpf(10) ** (-digits) * max(1, abs(b))


@pytest.mark.parametrize("case", LOSS_CASES, ids=str)
def test_values_are_the_definitions(case):
    """The contract at 60 digits against the definition at 500 (the textbook logistic
    forms 1 - s(800), which needs about 350 digits to resolve)."""
    name, params = case
    z, y = points(name, np.float64, params)
    for zi, yi in zip(z.tolist(), y.tolist(), strict=True):
        with mpmath.workdps(60):
            v = point(name, zi, yi, m=mpmath, **params)[0]
        with mpmath.workdps(500):
            zz = mpmath.mpf(zi) if isinstance(zi, float) else [mpmath.mpf(x) for x in zi]
            yy = yi if name == "multinomial" else mpmath.mpf(yi)
            ref = reference_loss(name, zz, yy, **params)[0]
        assert _close(v, ref, 55), (zi, yi, v, ref)


@pytest.mark.parametrize("case", LOSS_CASES, ids=str)
def test_derivatives_are_those_of_the_value(case):
    """d1 and d2 against ``mpmath.diff`` of the value at 50 digits; at a kink, d1 lies
    between the one-sided derivatives (the documented subgradient choice) and d2 is the
    second derivative of one side."""
    name, params = case
    if POINT_LOSSES[name].vector:
        pytest.skip("the multinomial loss: test_multinomial_gradient_and_hessian")
    z, y = points(name, np.float64, params)
    with mpmath.workdps(50):
        for zi, yi in zip(z.tolist(), y.tolist(), strict=True):
            if abs(zi) > 100:  # the numerical derivative's step is relative to |z|
                continue
            _, d1, d2 = point(name, zi, yi, m=mpmath, **params)

            def f(x, yi=yi):
                return point(name, x, yi, m=mpmath, **params)[0]

            if any(zi == k for k in _kinks(name, yi, params)):
                left, right = mpmath.diff(f, zi, direction=-1), mpmath.diff(f, zi, direction=1)
                assert min(left, right) - 1e-30 <= d1 <= max(left, right) + 1e-30, (zi, yi)
                # d2: the second derivative on one side (a kink of d1 has no other value)
                h = mpmath.mpf("1e-20")
                sides = [mpmath.diff(f, zi - h, 2), mpmath.diff(f, zi + h, 2)]
                assert any(_close(d2, side, 20) for side in sides), (zi, yi, d2, sides)
                continue
            assert _close(d1, mpmath.diff(f, zi), 30), (zi, yi, d1)
            assert _close(d2, mpmath.diff(f, zi, 2), 25), (zi, yi, d2)


def test_multinomial_gradient_and_hessian():
    with mpmath.workdps(50):
        for row in CLASS_Z:
            if max(abs(v) for v in row) > 100:
                continue
            for y in range(len(row)):
                _, g, H = point("multinomial", row, y, m=mpmath)
                K = len(row)

                def f(*zs, y=y):
                    return point("multinomial", list(zs), y, m=mpmath)[0]

                for i in range(K):
                    order = [1 if k == i else 0 for k in range(K)]
                    assert _close(g[i], mpmath.diff(f, row, order), 30)
                    for j in range(K):
                        order = [(k == i) + (k == j) for k in range(K)]
                        assert _close(H[i][j], mpmath.diff(f, row, order), 25)


@pytest.mark.parametrize("case", LOSS_CASES, ids=str)
def test_float_evaluation_keeps_full_relative_precision(case):
    """The stable formulas in Python floats agree with 50 digits to a few ulps, values and
    derivatives alike (so the float evaluation is itself a usable reference)."""
    name, params = case
    z, y = points(name, np.float64, params)
    eps = np.finfo(np.float64).eps
    # a sum whose terms cancel near its minimum (Poisson): relative to their magnitudes
    sv, s1 = term_scales(name, z, y)
    for i, (zi, yi) in enumerate(zip(z.tolist(), y.tolist(), strict=True)):
        got = point(name, zi, yi, m=math, **params)
        with mpmath.workdps(50):
            ref = point(name, zi, yi, m=mpmath, **params)
        scales = [0, 0, 0] if sv is None else [sv[i], s1[i], 0]
        for a, r, s in zip(_flat(got), _flat(ref), scales + [0] * 99, strict=False):
            assert abs(a - r) <= 4 * eps * max(abs(r), s) + 1e-300, (name, zi, yi, a, r)


def _flat(out):
    vals = []
    for part in out:
        if isinstance(part, list):
            vals.extend(_flat(part))
        else:
            vals.append(part)
    return vals


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_registry_metadata_follows_the_contract(name):
    pl = POINT_LOSSES[name]
    loss = get_loss(name)
    assert loss.label_kind == pl.labels
    for key, default in pl.params.items():
        assert getattr(loss, key) == default  # the class's default is the contract's
        assert getattr(get_loss(name, **{key: 0.5 * default}), key) == 0.5 * default
    # the class's curvature bound holds at every point of the contract
    if loss.curvature_bound is not None:
        z, y = points(name, np.float64, {})
        for zi, yi in zip(z.tolist(), y.tolist(), strict=True):
            d2 = point(name, zi, yi)[2]
            top = max(np.linalg.eigvalsh(np.array(d2))) if pl.vector else d2
            assert top <= loss.curvature_bound * (1 + 1e-15)


def test_huber_is_scipys():
    special = pytest.importorskip("scipy.special")
    for delta in (1.0, 2.5):
        for r in (-7.0, -2.5, -1.0, -0.3, 0.0, 0.25, 1.0, 2.5, 3.0, 1e3):
            assert point("huber", r, 0.0, delta=delta)[0] == special.huber(delta, r)


def test_bad_names_labels_and_parameters_are_refused():
    with pytest.raises(ValueError, match="`name`"):
        point("nope", 0.0, 0.0)
    with pytest.raises(ValueError, match="`y`"):
        point("logistic", 0.0, 0.5)
    with pytest.raises(ValueError, match="`y`"):
        point("multinomial", [0.0, 1.0], 2)
    with pytest.raises(ValueError, match="`params`"):
        point("squared", 0.0, 0.0, delta=1.0)
    assert valid_label("multinomial", 1, 2) and not valid_label("multinomial", 1.5)
