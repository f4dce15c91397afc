"""Segment reductions against per-group NumPy loops, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from tiltlab._compat import to_numpy
from tiltlab.segments import Segments, expand, segment_max, segment_min, segment_sum


def _data(batch=()):
    rng = np.random.default_rng(0)
    w = 1.0 / np.arange(1, 41) ** 1.3  # Zipf-sized groups, one of them of size one
    codes = np.concatenate([rng.choice(40, size=500, p=w / w.sum()), np.arange(40)])
    values = rng.normal(size=batch + codes.shape) * np.exp(rng.normal(size=codes.shape) * 5)
    return codes, values


@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_reductions_match_loops(xp, batch, dtype):
    codes, values = _data(batch)
    values = values.astype(dtype)
    seg = Segments.from_codes(codes)
    v = xp.asarray(values)
    s, mx, mn = (to_numpy(f(v, seg, xp)) for f in (segment_sum, segment_max, segment_min))
    for g in range(seg.n_groups):
        members = values[..., codes == g]
        np.testing.assert_allclose(
            s[..., g],
            members.astype(np.float64).sum(axis=-1),
            rtol=1e-12 if dtype == "float64" else 2e-5,
            atol=1e-12 * np.abs(members).sum(),
        )
        # extremes are exact (no rounding involved)
        np.testing.assert_array_equal(mx[..., g], members.max(axis=-1))
        np.testing.assert_array_equal(mn[..., g], members.min(axis=-1))
    assert s.dtype == np.dtype(dtype) and mx.dtype == np.dtype(dtype)
    back = to_numpy(expand(xp.asarray(mx), seg, xp))
    np.testing.assert_array_equal(back, mx[..., codes])


def test_members_partition_the_items():
    codes, _ = _data()
    seg = Segments.from_codes(codes)
    members = seg.members()
    assert len(members) == seg.n_groups
    np.testing.assert_array_equal(np.sort(np.concatenate(members)), np.arange(codes.size))
    for g, m in enumerate(members):
        assert np.all(codes[m] == g) and np.all(np.diff(m) > 0)


def test_pickles_without_cached_device_arrays():
    import pickle

    codes, _ = _data()
    seg = Segments.from_codes(codes)
    seg.codes_on(np, None)
    again = pickle.loads(pickle.dumps(seg))
    assert again.n_groups == seg.n_groups and np.array_equal(again.codes, seg.codes)
    assert again._cache == {}


BAD_CODES = [
    ([0, -1, 2], None, ValueError, r"\[0, 3\)"),
    ([0, 1, 5], 3, ValueError, r"\[0, 3\)"),
    ([0.5, 1.0], None, TypeError, "integers"),
    ([True, False], None, TypeError, "integers"),
    ([[0, 1]], None, ValueError, "1-d"),
    ([], None, ValueError, "n_groups"),
    ([0, 1], 0, ValueError, "at least 1"),
    ([0, 1], 2.5, TypeError, "n_groups"),
]


@pytest.mark.parametrize(("codes", "n_groups", "exc", "match"), BAD_CODES)
def test_from_codes_validates_on_every_library(codes, n_groups, exc, match):
    import array_api_strict

    makers = [np.asarray, list, array_api_strict.asarray]
    try:
        import torch

        makers.append(torch.tensor)
    except ImportError:  # pragma: no cover
        pass
    for make in makers:
        with pytest.raises(exc, match=match):
            Segments.from_codes(make(codes), n_groups)


def test_from_codes_agrees_across_libraries():
    import array_api_strict

    codes = [2, 0, 2, 3]
    ref = Segments.from_codes(np.asarray(codes), 5)
    makers = [list, array_api_strict.asarray]
    try:
        import torch

        makers.append(torch.tensor)
    except ImportError:  # pragma: no cover
        pass
    for make in makers:
        seg = Segments.from_codes(make(codes), 5)
        assert seg.n_groups == 5 and seg.codes.tolist() == codes
        assert seg.counts.tolist() == [1, 0, 2, 1, 0] == ref.counts.tolist()
    assert Segments.from_codes(np.zeros(0, dtype=np.int64), 2).counts.tolist() == [0, 0]
