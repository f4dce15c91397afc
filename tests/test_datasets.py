"""Tests for tiltlab.datasets: shipped paper data (loaders and protocols) and toy generators.

The loaders are host-side NumPy helpers, so these tests do not take the ``xp`` fixture.
References are rebuilt here independently from the raw files (read through
importlib.resources) and from the authors' protocol (RandomState permutation, then
normal draws from the same stream).
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
from scipy.io import loadmat

from tiltlab.datasets import (
    AMINO_ACIDS,
    DatasetSplit,
    linear_regression_outliers,
    load_abalone,
    load_drug_discovery,
    load_hiv1,
    logistic_imbalanced,
    point_estimation_2d,
    point_estimation_losses,
)

DATA = resources.files("tiltlab.datasets").joinpath("data")


def _stack(d: DatasetSplit):
    X = np.concatenate([d.X_train, d.X_val, d.X_test])
    y = np.concatenate([d.y_train, d.y_val, d.y_test])
    return X, y


@pytest.fixture(scope="module")
def qsar():
    with DATA.joinpath("qsar.mat").open("rb") as fh:
        mat = loadmat(fh)
    X = np.vstack([mat["X_train"], mat["X_test"]]).astype(float)
    y = np.vstack([mat["y_train"], mat["y_test"]]).ravel().astype(float)
    return X, y


# --------------------------------------------------------------------------- packaging


def test_data_files_are_shipped():
    names = {entry.name for entry in DATA.iterdir()}
    assert {"qsar.mat", "abalone.data", "hiv1", "README.md"} <= names
    hiv = sorted(entry.name for entry in DATA.joinpath("hiv1").iterdir())
    assert hiv == ["1625Data.txt", "746Data.txt", "impensData.txt", "schillingData.txt"]
    readme = DATA.joinpath("README.md").read_text(encoding="utf-8")
    for needle in ("MIT", "Tian Li", "CC BY 4.0", "Olier", "Diakonikolas"):
        assert needle in readme


# --------------------------------------------------------------------------- drug discovery


def test_drug_shapes_split_and_intercept():
    d = load_drug_discovery(seed=0)
    assert d.X_train.shape == (3268, 411)
    assert d.X_val.shape == (408, 411)
    assert d.X_test.shape == (409, 411)
    assert d.y_train.shape == (3268,) and d.y_val.shape == (408,) and d.y_test.shape == (409,)
    X, y = _stack(d)
    assert X.shape == (4085, 411) and X.dtype == np.float64 and y.dtype == np.float64
    assert np.all(X[:, -1] == 1.0)
    assert set(np.unique(X[:, :-1])) == {0.0, 1.0}
    assert len(d.feature_names) == 411 and d.feature_names[-1] == "intercept"
    assert d.n_features == 411
    assert not d.noisy_train.any() and not d.noisy_val.any()
    assert "4085" in d.description


@pytest.mark.parametrize("seed", [0, 3])
def test_drug_rows_follow_seeded_permutation(qsar, seed):
    X_raw, y_raw = qsar
    perm = np.random.RandomState(seed).permutation(4085)
    X, y = _stack(load_drug_discovery(seed=seed))
    np.testing.assert_array_equal(X[:, :-1], X_raw[perm])
    np.testing.assert_array_equal(y, y_raw[perm])


def test_drug_shuffle_reproducible_and_seed_dependent():
    a = load_drug_discovery(seed=1, noise=0.4)
    b = load_drug_discovery(seed=1, noise=0.4)
    c = load_drug_discovery(seed=2, noise=0.4)
    for name in ("X_train", "y_train", "X_val", "y_val", "X_test", "y_test", "noisy_train"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.y_test, c.y_test)
    assert not np.array_equal(a.X_train, c.X_train)


@pytest.mark.parametrize("noise", [0.0, 0.2, 0.4, 0.8, 1.0])
def test_drug_noise_fraction_exact(noise):
    d = load_drug_discovery(seed=0, noise=noise)
    assert d.noisy_train.dtype == bool and d.noisy_train.shape == (3268,)
    assert int(d.noisy_train.sum()) == int(3268 * noise)
    assert int(d.noisy_val.sum()) == int(408 * noise)


def test_drug_noise_only_on_masked_rows_and_test_untouched():
    clean = load_drug_discovery(seed=4)
    noisy = load_drug_discovery(seed=4, noise=0.4)
    np.testing.assert_array_equal(noisy.X_train, clean.X_train)
    np.testing.assert_array_equal(noisy.X_val, clean.X_val)
    np.testing.assert_array_equal(noisy.X_test, clean.X_test)
    np.testing.assert_array_equal(noisy.y_test, clean.y_test)
    for mask, yn, yc in (
        (noisy.noisy_train, noisy.y_train, clean.y_train),
        (noisy.noisy_val, noisy.y_val, clean.y_val),
    ):
        np.testing.assert_array_equal(yn[~mask], yc[~mask])
        assert np.all(yn[mask] != yc[mask])


def test_drug_noise_draws_follow_reference_stream():
    # Authors' protocol: seed, permute, then N(5, 5) draws for train then validation.
    seed, noise = 2, 0.2
    d = load_drug_discovery(seed=seed, noise=noise)
    rng = np.random.RandomState(seed)
    rng.permutation(4085)
    expected_train = rng.normal(5.0, 5.0, int(3268 * noise))
    expected_val = rng.normal(5.0, 5.0, int(408 * noise))
    np.testing.assert_array_equal(d.y_train[d.noisy_train], expected_train)
    np.testing.assert_array_equal(d.y_val[d.noisy_val], expected_val)


def test_drug_noise_distribution():
    d = load_drug_discovery(seed=0, noise=0.8, noise_mean=-3.0, noise_std=2.0)
    draws = d.y_train[d.noisy_train]
    assert draws.size == 2614
    assert abs(draws.mean() + 3.0) < 0.2  # standard error 2 / sqrt(2614) = 0.04
    assert abs(draws.std() - 2.0) < 0.2


def test_drug_genie_drops_noisy_rows():
    noisy = load_drug_discovery(seed=1, noise=0.2)
    clean = load_drug_discovery(seed=1)
    genie = load_drug_discovery(seed=1, noise=0.2, genie=True)
    assert genie.X_train.shape == (3268 - 653, 411)
    assert genie.X_val.shape == (408 - 81, 411)
    np.testing.assert_array_equal(genie.X_train, noisy.X_train[~noisy.noisy_train])
    np.testing.assert_array_equal(genie.y_train, clean.y_train[~noisy.noisy_train])
    np.testing.assert_array_equal(genie.y_val, clean.y_val[~noisy.noisy_val])
    np.testing.assert_array_equal(genie.X_test, clean.X_test)
    np.testing.assert_array_equal(genie.y_test, clean.y_test)
    assert not genie.noisy_train.any() and genie.noisy_train.shape == (3268 - 653,)


def test_drug_returns_fresh_copies():
    a = load_drug_discovery(seed=0)
    a.X_train[:] = -1.0
    a.y_test[:] = np.nan
    b = load_drug_discovery(seed=0)
    assert np.all(b.X_train[:, -1] == 1.0)
    assert np.all(np.isfinite(b.y_test))


def test_drug_return_mask_and_custom_split():
    data, mask = load_drug_discovery(seed=0, noise=0.2, return_mask=True)
    assert mask is data.noisy_train
    d = load_drug_discovery(split=(0.5, 0.25, 0.25))
    assert (d.X_train.shape[0], d.X_val.shape[0], d.X_test.shape[0]) == (2042, 1021, 1022)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"noise": 1.5}, ValueError),
        ({"noise": -0.1}, ValueError),
        ({"split": (0.8, 0.1)}, ValueError),
        ({"split": (0.8, 0.3, 0.1)}, ValueError),
        ({"split": 0.8}, TypeError),
        ({"seed": 1.5}, TypeError),
        ({"seed": -1}, ValueError),
        ({"noise_std": -1.0}, ValueError),
    ],
)
def test_drug_bad_arguments(kwargs, error):
    with pytest.raises(error, match="`"):
        load_drug_discovery(**kwargs)


# --------------------------------------------------------------------------- abalone


def test_abalone_shapes_and_preprocessing():
    d = load_abalone(seed=0)
    assert (d.X_train.shape, d.X_val.shape, d.X_test.shape) == ((3341, 9), (418, 9), (418, 9))
    X, y = _stack(d)
    assert X.shape == (4177, 9)
    assert np.all(X[:, -1] == 1.0)
    np.testing.assert_allclose(X[:, :-1].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(X[:, :-1].std(axis=0), 1.0, rtol=1e-4)  # std + 1e-6
    assert np.unique(X[:, 0]).size == 2  # sex: male vs not
    assert d.feature_names[0] == "sex_male" and d.feature_names[-1] == "intercept"

    raw = np.genfromtxt(
        DATA.joinpath("abalone.data").read_text().splitlines(), delimiter=",", dtype=str
    )
    male = (raw[:, 0] == "M").astype(float)
    numeric = raw[:, 1:8].astype(float)
    features = np.column_stack([male, numeric])
    z = (features - features.mean(axis=0)) / (features.std(axis=0) + 1e-6)
    perm = np.random.RandomState(0).permutation(4177)
    np.testing.assert_allclose(X[:, :-1], z[perm], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(y, raw[perm, 8].astype(float))


def test_abalone_noise_and_genie():
    clean = load_abalone(seed=3)
    noisy = load_abalone(seed=3, noise=0.4)
    genie = load_abalone(seed=3, noise=0.4, genie=True)
    assert int(noisy.noisy_train.sum()) == int(3341 * 0.4)
    assert int(noisy.noisy_val.sum()) == int(418 * 0.4)
    m = noisy.noisy_train
    np.testing.assert_array_equal(noisy.y_train[~m], clean.y_train[~m])
    assert np.all(noisy.y_train[m] != clean.y_train[m])
    np.testing.assert_array_equal(noisy.y_test, clean.y_test)
    np.testing.assert_array_equal(genie.X_train, clean.X_train[~m])


def test_abalone_scale_corruption():
    clean = load_abalone(seed=0, n_train=100)
    d = load_abalone(seed=0, noise=0.05, corruption="scale", n_train=100)
    assert d.X_train.shape == (100, 9) and int(d.noisy_train.sum()) == 5
    m = d.noisy_train
    np.testing.assert_allclose(d.X_train[m, :-1], 100.0 * clean.X_train[m, :-1])
    np.testing.assert_array_equal(d.X_train[m, -1], 1.0)
    np.testing.assert_allclose(d.y_train[m], 1e4 * clean.y_train[m])
    np.testing.assert_array_equal(d.X_train[~m], clean.X_train[~m])
    np.testing.assert_array_equal(d.X_test, clean.X_test)
    with pytest.raises(ValueError, match="`corruption`"):
        load_abalone(corruption="flip")
    with pytest.raises(ValueError, match="`n_train`"):
        load_abalone(n_train=10**6)


# --------------------------------------------------------------------------- HIV-1


def _read_hiv_lines():
    lines = []
    for name in sorted(entry.name for entry in DATA.joinpath("hiv1").iterdir()):
        text = DATA.joinpath("hiv1", name).read_text()
        lines.extend(line.strip() for line in text.splitlines() if line.strip())
    return lines


def test_hiv1_shapes_one_hot_and_labels():
    d = load_hiv1(seed=0)
    assert (d.X_train.shape, d.X_val.shape, d.X_test.shape) == (
        (5272, 160),
        (659, 160),
        (659, 160),
    )
    X, y = _stack(d)
    assert X.shape == (6590, 160)
    assert set(np.unique(X)) == {0.0, 1.0}
    np.testing.assert_array_equal(X.sum(axis=1), 8.0)
    # Each block of 20 columns holds exactly one letter.
    np.testing.assert_array_equal(X.reshape(-1, 8, 20).sum(axis=2), 1.0)
    assert set(np.unique(y)) == {0.0, 1.0}
    assert int(y.sum()) == 1360 and int((y == 0).sum()) == 5230


def test_hiv1_decodes_back_to_raw_lines():
    lines = _read_hiv_lines()
    assert len(lines) == 6590
    seed = 5
    perm = np.random.RandomState(seed).permutation(6590)
    X, y = _stack(load_hiv1(seed=seed))
    for row in (0, 17, 4000, 6589):
        letters = "".join(AMINO_ACIDS[j] for j in np.flatnonzero(X[row]) % 20)
        octamer, label = lines[perm[row]].split(",")
        assert letters == octamer
        assert y[row] == (1.0 if label == "1" else 0.0)


def test_hiv1_imbalance_and_label_noise():
    base = load_hiv1(seed=1)
    skewed = load_hiv1(seed=1, imbalance=0.05)
    n_common = int((base.y_train == 0).sum())
    assert int((skewed.y_train == 0).sum()) == n_common
    assert int((skewed.y_train == 1).sum()) == int(0.05 * n_common)
    np.testing.assert_array_equal(skewed.y_test, base.y_test)
    np.testing.assert_array_equal(skewed.X_val, base.X_val)

    noisy = load_hiv1(seed=1, imbalance=0.05, noise=0.3)
    n = skewed.y_train.size
    assert int(noisy.noisy_train.sum()) == int(0.3 * n)
    assert int(noisy.noisy_val.sum()) == int(0.3 * 659)
    np.testing.assert_array_equal(noisy.X_train, skewed.X_train)
    m = noisy.noisy_train
    np.testing.assert_array_equal(noisy.y_train[~m], skewed.y_train[~m])
    assert set(np.unique(noisy.y_train)) <= {0.0, 1.0}
    np.testing.assert_array_equal(noisy.y_test, base.y_test)

    genie = load_hiv1(seed=1, imbalance=0.05, noise=0.3, genie=True)
    np.testing.assert_array_equal(genie.X_train, skewed.X_train[~m])
    np.testing.assert_array_equal(genie.y_train, skewed.y_train[~m])


def test_hiv1_label_noise_draws_from_class_prior():
    noisy = load_hiv1(seed=0, noise=1.0)
    clean = load_hiv1(seed=0)
    # Every label redrawn from Bernoulli(p_rare): about a fifth of them are 1.
    assert abs(noisy.y_train.mean() - clean.y_train.mean()) < 0.03
    # ... and independent of the true label: agreement is p^2 + (1-p)^2, far below 1.
    p = clean.y_train.mean()
    agreement = np.mean(noisy.y_train == clean.y_train)
    assert abs(agreement - (p * p + (1 - p) ** 2)) < 0.03


def test_hiv1_intercept_and_bad_arguments():
    d = load_hiv1(intercept=True)
    assert d.X_train.shape == (5272, 161) and np.all(d.X_train[:, -1] == 1.0)
    assert d.feature_names[-1] == "intercept" and d.feature_names[0] == "pos1_A"
    with pytest.raises(ValueError, match="`imbalance`"):
        load_hiv1(imbalance=0.0)
    with pytest.raises(ValueError, match="`noise`"):
        load_hiv1(noise=2.0)


# --------------------------------------------------------------------------- toys


def test_point_estimation_2d():
    points, inlier = point_estimation_2d(n=120, outlier_fraction=0.25, seed=3)
    assert points.shape == (120, 2) and points.dtype == np.float64
    assert inlier.shape == (120,) and inlier.dtype == bool
    assert int((~inlier).sum()) == 30
    # Inlier sample mean within 4 standard errors (0.5 / sqrt(90)) of (1, 1).
    assert np.all(np.abs(points[inlier].mean(axis=0) - 1.0) < 4 * 0.5 / np.sqrt(90))
    assert np.all(np.abs(points[~inlier].mean(axis=0) - 4.0) < 4 * 0.5 / np.sqrt(30))
    again, again_inlier = point_estimation_2d(n=120, outlier_fraction=0.25, seed=3)
    np.testing.assert_array_equal(points, again)
    np.testing.assert_array_equal(inlier, again_inlier)
    other, _ = point_estimation_2d(n=120, outlier_fraction=0.25, seed=4)
    assert not np.array_equal(points, other)

    theta = np.array([0.5, -2.0])
    expected = [(p[0] - 0.5) ** 2 + (p[1] + 2.0) ** 2 for p in points]
    np.testing.assert_allclose(point_estimation_losses(points, theta), expected, rtol=1e-14)
    # The mean minimises the summed loss: its gradient sum 2 (theta - x_i) vanishes.
    np.testing.assert_allclose((points.mean(axis=0) - points).sum(axis=0), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="`theta`"):
        point_estimation_losses(points, np.zeros(3))
    with pytest.raises(ValueError, match="`outlier_fraction`"):
        point_estimation_2d(outlier_fraction=1.0)


def test_linear_regression_outliers():
    X, y, inlier = linear_regression_outliers(n=200, outlier_fraction=0.2, seed=7)
    assert X.shape == (200, 2) and y.shape == (200,) and inlier.shape == (200,)
    assert np.all(X[:, 1] == 1.0)
    assert int((~inlier).sum()) == 40
    w_clean = np.linalg.solve(X[inlier].T @ X[inlier], X[inlier].T @ y[inlier])
    np.testing.assert_allclose(w_clean, [2.0, 1.0], atol=0.2)
    w_all = np.linalg.solve(X.T @ X, X.T @ y)
    assert abs(w_all[0] - 2.0) > 1.0  # the outliers pull least squares away
    X2, y2, _ = linear_regression_outliers(n=200, outlier_fraction=0.2, seed=7)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_logistic_imbalanced():
    X, y = logistic_imbalanced(n=150, rare_fraction=0.1, seed=2)
    assert X.shape == (150, 3) and y.shape == (150,)
    assert np.all(X[:, 2] == 1.0)
    assert set(np.unique(y)) == {0.0, 1.0}
    assert int(y.sum()) == 15
    assert np.all(X[y == 1, :2].mean(axis=0) > X[y == 0, :2].mean(axis=0) + 1.0)
    X2, y2 = logistic_imbalanced(n=150, rare_fraction=0.1, seed=2)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(ValueError, match="`rare_fraction`"):
        logistic_imbalanced(rare_fraction=0.0)
    with pytest.raises(TypeError, match="`n`"):
        logistic_imbalanced(n=10.5)
