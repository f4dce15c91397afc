"""Tests for the curves along a tilt path: quantile_curves (Q1..Q3) and min_tail_fraction (Q0).

References are independent of the code under test: brute force over all subsets of samples
(an LP per subset for the regression strips, the minimum enclosing circle for disks),
dense grid searches that bracket Q0 from both sides, and the tail bound formula evaluated
directly with mpmath.
"""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
from scipy.optimize import linprog

import tiltlab as tl
from tiltlab.bounds import min_tail_fraction, quantile_curves
from tiltlab.datasets import (
    linear_regression_outliers,
    point_estimation_2d,
    point_estimation_objective,
)
from tiltlab.losses import CallableLoss

# ---------------------------------------------------------------------------
# independent references


def brute_force_strip(X, y, a, p=None):
    """1 - (largest prior mass of samples fitted strictly within sqrt(a)), by LPs over subsets."""
    n, d = X.shape
    p = np.full(n, 1.0 / n) if p is None else p / p.sum()
    s = np.sqrt(a)
    best = 0.0
    for m in range(n, 0, -1):
        for S in itertools.combinations(range(n), m):
            mass = p[list(S)].sum()
            if mass <= best + 1e-15:
                continue
            XS, yS = X[list(S)], y[list(S)]
            A = np.block([[XS, np.ones((m, 1))], [-XS, np.ones((m, 1))]])
            c = np.r_[np.zeros(d), -1.0]
            res = linprog(
                c, A_ub=A, b_ub=np.r_[yS + s, s - yS], bounds=[(None, None)] * d + [(None, s)]
            )
            if res.status == 0 and res.x[-1] > 1e-9:  # a strictly feasible strip exists
                best = mass
    return 1.0 - best


def min_enclosing_radius(P):
    """Radius of the smallest disk holding the points (all pair/triple candidate centres)."""
    if len(P) == 1:
        return 0.0
    centres = [0.5 * (P[i] + P[j]) for i, j in itertools.combinations(range(len(P)), 2)]
    for i, j, k in itertools.combinations(range(len(P)), 3):
        A, B, C = P[i], P[j], P[k]
        D = 2 * (A[0] * (B[1] - C[1]) + B[0] * (C[1] - A[1]) + C[0] * (A[1] - B[1]))
        if abs(D) < 1e-14:
            continue
        ux = (A @ A * (B[1] - C[1]) + B @ B * (C[1] - A[1]) + C @ C * (A[1] - B[1])) / D
        uy = (A @ A * (C[0] - B[0]) + B @ B * (A[0] - C[0]) + C @ C * (B[0] - A[0])) / D
        centres.append(np.array([ux, uy]))
    return min(np.sqrt(((P - c) ** 2).sum(axis=1)).max() for c in centres)


def brute_force_disk(P, a, p=None):
    """1 - (largest prior mass of points inside an open disk of radius sqrt(a))."""
    n = len(P)
    p = np.full(n, 1.0 / n) if p is None else p / p.sum()
    r = np.sqrt(a)
    best = 0.0
    for m in range(n, 0, -1):
        for S in itertools.combinations(range(n), m):
            mass = p[list(S)].sum()
            if mass > best + 1e-15 and min_enclosing_radius(P[list(S)]) < r * (1 - 1e-12):
                best = mass
    return 1.0 - best


def grid_bracket(P, a, h):
    """(lower, upper) bounds on Q0 for disks from a grid of centres with spacing h.

    Upper: the best grid centre. Lower: every centre is within h/sqrt(2) of a grid point,
    whose disk of radius sqrt(a) + h/sqrt(2) holds every point the first one holds.
    """
    lo, hi = P.min(axis=0) - np.sqrt(a), P.max(axis=0) + np.sqrt(a)
    g0 = np.arange(lo[0], hi[0] + h, h)
    g1 = np.arange(lo[1], hi[1] + h, h)
    G = np.stack(np.meshgrid(g0, g1), axis=-1).reshape(-1, 2)
    d2 = ((G[:, None, :] - P[None, :, :]) ** 2).sum(axis=-1)
    upper = (d2 >= a).mean(axis=1).min()
    grow = (np.sqrt(a) + h / np.sqrt(2)) ** 2
    lower = (d2 >= grow).mean(axis=1).min()
    return lower, upper


def point_objective(points):
    """TiltedObjective for the point-estimation loss ||x_i - theta||^2."""
    return point_estimation_objective(points)


TILTS = np.r_[-np.logspace(1, -2, 8), 0.0, np.logspace(-2, 2, 12)]

# ---------------------------------------------------------------------------
# min_tail_fraction: linear regression


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_q0_strip_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 8
    x = rng.uniform(0, 2, n)
    X = np.c_[x, np.ones(n)]
    y = 2 * x + 1 + rng.normal(scale=0.5, size=n)
    y[:2] -= 4.0
    obj = tl.TiltedObjective("squared", X, y)
    a = np.array([0.005, 0.03, 0.1, 0.3, 1.0, 3.0, 30.0])
    q0, theta = min_tail_fraction(obj, a, return_minimizers=True)
    expected = [brute_force_strip(X, y, ak) for ak in a]
    np.testing.assert_allclose(q0, expected, rtol=0, atol=1e-12)
    # the minimisers attain the values (recomputed from the objective's own losses)
    for ak, qk, th in zip(a, q0, theta, strict=True):
        assert float(np.mean(obj.losses(th) >= ak)) == pytest.approx(qk, abs=1e-12)
    # the MILP agrees on generic data
    np.testing.assert_allclose(min_tail_fraction(obj, a, method="milp"), expected, atol=1e-12)


def test_q0_strip_ties_are_strict():
    # y alternates 0/1 on equally spaced x: at a = 1/4 the horizontal line y = 1/2 has every
    # residual exactly sqrt(a), so it fits nothing strictly; a tilted line fits 5 of 8
    X = np.c_[np.arange(8.0), np.ones(8)]
    y = np.array([0.0, 1, 0, 1, 0, 1, 0, 1])
    obj = tl.TiltedObjective("squared", X, y)
    a = np.array([0.2, 0.25, 0.25 + 1e-7, 0.3])
    expected = [brute_force_strip(X, y, ak) for ak in a]
    assert expected == pytest.approx([0.375, 0.375, 0.0, 0.0])
    np.testing.assert_allclose(min_tail_fraction(obj, a), expected, atol=1e-12)


def test_q0_strip_milp_rejects_sets_that_only_touch_the_strip():
    # integer data: the samples at x = 1 with y = 2 and y = 0 fit a strip of half-width
    # s = 1 only with residuals exactly s (not strictly), a set that HiGHS's feasibility
    # tolerance (of the size of the margin) accepts; six samples fit strictly
    X = np.c_[[1.0, 1, 1, -2, -2, 0, -1, 0], np.ones(8)]
    y = np.array([2.0, -1, 0, -1, -1, 2, -2, -1])
    obj = tl.TiltedObjective("squared", X, y)
    expected = brute_force_strip(X, y, 1.0)
    assert expected == pytest.approx(0.25)
    q0, theta = min_tail_fraction(obj, 1.0, method="milp", return_minimizers=True)
    assert float(q0) == pytest.approx(expected, abs=1e-12)
    assert float(np.mean(obj.losses(theta) >= 1.0)) == pytest.approx(expected, abs=1e-12)


def test_q0_strip_prior_weights_and_rank_deficient_design():
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 1, 7)
    # a duplicated column: rank 2 in 3 columns (the enumeration works in the row space)
    X = np.c_[x, np.ones(7), 2 * x]
    y = x + rng.normal(scale=0.3, size=7)
    w = rng.uniform(0.5, 2.0, 7)
    obj = tl.TiltedObjective("squared", X, y, weights=w)
    a = np.array([0.01, 0.05, 0.2])
    expected = [brute_force_strip(X[:, :2], y, ak, w) for ak in a]
    q0, theta = min_tail_fraction(obj, a, return_minimizers=True)
    np.testing.assert_allclose(q0, expected, atol=1e-12)
    for ak, qk, th in zip(a, q0, theta, strict=True):
        assert float(w[np.asarray(obj.losses(th)) >= ak].sum() / w.sum()) == pytest.approx(qk)


def test_q0_strip_theta_bound_box_and_trivial_thresholds():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, 8)
    X = np.c_[x, np.ones(8)]
    y = 3 * x + rng.normal(scale=0.2, size=8)
    obj = tl.TiltedObjective("squared", X, y)
    a = np.array([-1.0, 0.0, 0.02, 0.1])
    ref = [1.0, 1.0] + [brute_force_strip(X, y, ak) for ak in a[2:]]
    got = min_tail_fraction(obj, a, method="milp", theta_bound=50.0)
    np.testing.assert_allclose(got, ref, atol=1e-12)
    assert min_tail_fraction(obj, 0.02).shape == ()


def test_q0_errors():
    X = np.c_[np.arange(5.0), np.ones(5)]
    with pytest.raises(NotImplementedError, match="logistic"):
        min_tail_fraction(tl.TiltedObjective("logistic", X, np.array([0, 1, 0, 1, 1])), 0.1)
    obj = tl.TiltedObjective("squared", X, np.arange(5.0))
    with pytest.raises(ValueError, match="too large to solve exactly"):
        min_tail_fraction(obj, 0.1, max_samples=4)
    with pytest.raises(ValueError, match="method"):
        min_tail_fraction(obj, 0.1, method="bnb")
    with pytest.raises(ValueError, match="theta_bound"):
        min_tail_fraction(obj, 0.1, method="milp", theta_bound=-1.0)
    with pytest.raises(ValueError, match="weights"):
        min_tail_fraction(obj, 0.1, weights=np.ones(5))
    with pytest.raises(NotImplementedError, match="3-D"):
        min_tail_fraction(np.zeros((4, 3)), 0.1)
    with pytest.raises(ValueError, match="`a`"):
        min_tail_fraction(np.zeros((4, 2)), np.array([[0.1]]))
    big = tl.TiltedObjective(
        "squared", np.random.default_rng(0).normal(size=(150, 6)), np.ones(150)
    )
    with pytest.raises(ValueError, match="too large to solve exactly"):
        min_tail_fraction(big, 0.1)


# ---------------------------------------------------------------------------
# min_tail_fraction: point estimation


@pytest.mark.parametrize("seed", range(3))
def test_q0_disk_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    P = rng.normal(size=(8, 2))
    P[:2] += 3.0
    a = np.array([0.05, 0.2, 0.5, 1.0, 2.0, 5.0, 20.0])
    q0, centres = min_tail_fraction(P, a, return_minimizers=True)
    np.testing.assert_allclose(q0, [brute_force_disk(P, ak) for ak in a], atol=1e-12)
    for ak, qk, c in zip(a, q0, centres, strict=True):
        assert np.mean(((P - c) ** 2).sum(axis=1) >= ak) == pytest.approx(qk)


def test_q0_disk_ties_and_weights():
    # a 3 x 2 lattice: at r = 1/2 two neighbours sit exactly on a diameter (not strictly in)
    P = np.array([[0.0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]])
    a = np.array([0.25, 0.25 + 1e-7, 0.5, 0.5 + 1e-7, 1.25, 1.25 + 1e-7])
    np.testing.assert_allclose(
        min_tail_fraction(P, a), [brute_force_disk(P, ak) for ak in a], atol=1e-12
    )
    w = np.array([1.0, 2.0, 3.0, 1.0, 1.0, 5.0])
    np.testing.assert_allclose(
        min_tail_fraction(P, a, weights=w),
        [brute_force_disk(P, ak, w) for ak in a],
        atol=1e-12,
    )


def test_q0_disk_within_grid_bracket():
    P, _ = point_estimation_2d(n=30, seed=2)
    a = np.array([0.1, 0.5, 2.0, 8.0])
    q0 = min_tail_fraction(P, a)
    for ak, qk in zip(a, q0, strict=True):
        lower, upper = grid_bracket(P, ak, h=0.02)
        assert lower - 1e-12 <= qk <= upper + 1e-12


def test_q0_points_in_one_dimension():
    x = np.array([[0.0], [0.3], [0.35], [1.0], [1.1], [1.2], [5.0]])
    a = np.array([0.01, 0.0025, 0.0026, 0.04, 0.3])
    # brute force: the most points strictly inside an interval of half-width sqrt(a)
    expected = []
    for ak in a:
        r = np.sqrt(ak)
        best = max(
            np.sum(np.abs(x[:, 0] - c) < r)
            for c in np.r_[x[:, 0], (x[:-1, 0] + x[1:, 0]) / 2, np.linspace(-1, 6, 14001)]
        )
        expected.append(1 - best / len(x))
    np.testing.assert_allclose(min_tail_fraction(x, a), expected, atol=1e-12)


# ---------------------------------------------------------------------------
# quantile_curves


@pytest.fixture(scope="module")
def regression_path():
    X, y, _ = linear_regression_outliers(n=40, seed=0)
    obj = tl.TiltedObjective("squared", X, y, l2=1e-6)
    return tl.tilt_path(obj, TILTS / 10, method="newton", tol=1e-10)


@pytest.fixture(scope="module")
def points_path():
    P, _ = point_estimation_2d(n=40, seed=0)
    path = tl.tilt_path(point_objective(P), TILTS, method="newton", tol=1e-10, theta0=P.mean(0))
    return P, path


def test_quantile_curves_against_direct_computation(regression_path):
    path = regression_path
    a = np.array([0.05, 0.5, 2.0, 10.0])
    c = quantile_curves(path, a)
    L = np.stack([np.asarray(path.objective.losses(x)) for x in path.x])
    Q = np.array([[np.mean(L[k] >= ak) for k in range(len(path.ts))] for ak in a])
    np.testing.assert_array_equal(c["Q_path"], Q)
    np.testing.assert_array_equal(c["Q1"], Q.min(axis=1))
    mpmath.mp.dps = 50
    for i, ak in enumerate(a):
        bounds = []
        for k, t in enumerate(path.ts):
            ell = [mpmath.mpf(float(v)) for v in L[k]]
            if t == 0:
                b = mpmath.fsum(ell) / len(ell) / ak  # Markov (floor 0)
            else:
                m = mpmath.fsum(mpmath.exp(t * v) for v in ell) / len(ell)  # e^{tR}
                b = (m - 1) / (mpmath.exp(t * ak) - 1)
            bounds.append(float(b))
        bounds = np.array(bounds)
        np.testing.assert_allclose(c["bound_path"][i], bounds, rtol=1e-9)
        k = int(np.argmin(bounds))
        assert c["Q3"][i] == pytest.approx(bounds[k], rel=1e-9)
        assert c["t_tilde"][i] == path.ts[k]
        assert c["Q2"][i] == Q[i, k]
    assert c["Q3"].shape == a.shape and float(quantile_curves(path, 1.0)["Q1"]) >= 0


def test_quantile_ordering_regression_toy(regression_path):
    a = np.linspace(0.01, 30, 25)
    c = quantile_curves(regression_path, a)
    q0 = min_tail_fraction(regression_path.objective, a)
    assert np.all(q0 <= c["Q1"] + 1e-12)
    assert np.all(c["Q1"] <= c["Q2"])
    assert np.all(c["Q2"] <= c["Q3"] * (1 + 1e-12))
    assert np.any(q0 < c["Q1"]) or np.all(q0 == c["Q1"])  # Q0 is a genuine minimum


def test_quantile_ordering_point_estimation_toy(points_path):
    P, path = points_path
    a = np.linspace(0.05, 40, 25)
    c = quantile_curves(path, a)
    q0 = min_tail_fraction(P, a)
    assert np.all(q0 <= c["Q1"] + 1e-12)
    assert np.all(c["Q1"] <= c["Q2"])
    assert np.all(c["Q2"] <= c["Q3"] * (1 + 1e-12))
    # the exact minimum is close to TERM's approximation, as the paper's figure shows
    assert np.max(c["Q2"] - q0) <= 0.25


def test_quantile_curves_floor_rules(points_path):
    _, path = points_path
    with pytest.raises(ValueError, match="exceed the floor"):
        quantile_curves(path, [0.0, 1.0])
    with pytest.raises(ValueError, match="exceeds the smallest loss"):
        quantile_curves(path, [5.0], floor=1.0)
    lower = quantile_curves(path, [2.0], floor=-1.0)["Q3"]
    assert lower >= quantile_curves(path, [2.0])["Q3"] - 1e-12  # a lower floor is weaker
    with pytest.raises(TypeError, match="TiltPath"):
        quantile_curves(object(), [1.0])


def test_quantile_curves_negative_losses_need_floor():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(12, 2))

    def fun(th, X, y):
        return th @ th - 2.0 * (X @ th)  # an exponential-family loss, can be negative

    def grad(th, X, y):
        return 2.0 * (th[None, :] - X)

    obj = tl.TiltedObjective(CallableLoss(fun, grad), X=P)
    path = tl.tilt_path(obj, [0.0, 1.0], theta0=P.mean(0), tol=1e-10)
    with pytest.raises(ValueError, match="negative losses"):
        quantile_curves(path, [0.5])
    floor = -float(np.max((P**2).sum(axis=1)))  # ||th||^2 - 2 th.x >= -||x||^2
    c = quantile_curves(path, [0.0, 0.5], floor=floor)
    assert np.all(c["Q1"] <= c["Q2"]) and np.all(c["Q2"] <= c["Q3"])
