"""tiltlab.testing.assert_close checks namespace, dtype and shape as well as values."""

import numpy as np
import pytest

from tiltlab.testing import assert_close


def test_float32_against_float64_fails_without_xp():
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(np.array([1.0], dtype=np.float32), np.array([1.0]))
    assert_close(np.array([1.0], dtype=np.float32), np.array([1.0], dtype=np.float32))


def test_numpy_against_torch_fails_both_ways():
    torch = pytest.importorskip("torch")
    with pytest.raises(AssertionError, match="namespace"):
        assert_close(np.array([1.0]), torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(AssertionError, match="namespace"):
        assert_close(torch.tensor([1.0], dtype=torch.float64), np.array([1.0]))
    assert_close(torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))


def test_with_xp_a_numpy_reference_is_allowed_but_the_namespace_is_checked():
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xp

    assert_close(torch.tensor([1.0], dtype=torch.float32), np.array([1.0]), xp=xp)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(
            torch.tensor([1.0], dtype=torch.float32), np.array([1.0]), xp=xp, dtype=torch.float64
        )
    with pytest.raises(AssertionError, match="namespace"):
        assert_close(np.array([1.0]), np.array([1.0]), xp=xp)


def test_values_shape_and_scalars():
    assert_close(np.array(2.0), 2.0)
    with pytest.raises(AssertionError):
        assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.1]))
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.array([1.0, 2.0]), np.array([[1.0, 2.0]]))
