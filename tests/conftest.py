"""Backend fixture: every test that takes ``xp`` runs once per installed backend.

Backends: numpy, array_api_strict, torch (CPU), dask.array, and cupy (only where a
GPU is present). Missing libraries are skipped, not failed. Mark a test
``@pytest.mark.skip_xp_backend("dask", reason=...)`` to skip one backend with a reason.
"""

from __future__ import annotations

import importlib
import os

import pytest
from _matrix import BACKENDS

# The tests compare the compiled CPU kernels with the generic path: a kernel not yet
# compiled must be compiled in the test's process, not handed to a background compile
# while NumPy serves the problem (which would make such a comparison vacuous). The tests
# of the background mode set the variable themselves.
os.environ.setdefault("TILTLAB_FUSED", "wait")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "skip_xp_backend(name, reason): skip a test for one array backend"
    )
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")


def _load(name):
    if name == "numpy":
        import array_api_compat.numpy as xp

        return xp
    if name == "array_api_strict":
        xp = importlib.import_module("array_api_strict")
        return xp
    if name == "torch":
        torch = importlib.import_module("torch")
        torch.set_default_dtype(torch.float64)
        # two cores shared with other processes: torch's thread pool contends badly
        torch.set_num_threads(1)
        import array_api_compat.torch as xp

        return xp
    if name == "dask":
        importlib.import_module("dask.array")
        import array_api_compat.dask.array as xp

        return xp
    if name == "cupy":
        cupy = importlib.import_module("cupy")
        if cupy.cuda.runtime.getDeviceCount() < 1:  # pragma: no cover
            raise ImportError("no GPU")
        import array_api_compat.cupy as xp

        return xp
    raise ValueError(name)  # pragma: no cover


_CACHE: dict = {}


def _backend(name):
    if name not in _CACHE:
        try:
            _CACHE[name] = _load(name)
        except Exception as exc:  # ImportError, CUDA errors
            _CACHE[name] = exc
    return _CACHE[name]


@pytest.fixture(params=BACKENDS)
def xp(request):
    """The array namespace under test (skips backends that are not installed)."""
    name = request.param
    mod = _backend(name)
    if isinstance(mod, Exception):
        pytest.skip(f"{name} not available: {mod}")
    for marker in request.node.iter_markers("skip_xp_backend"):
        if marker.args and marker.args[0] == name:
            pytest.skip(marker.kwargs.get("reason", f"not supported on {name}"))
    return mod


@pytest.fixture
def xp_name(xp):
    return xp.__name__.replace("array_api_compat.", "")


def pytest_runtest_logreport(report):
    """With ``TILTLAB_RECORD_SKIPS=FILE``, append the id of every test skipped for want of
    PyTorch to FILE: CI runs the suite without PyTorch first (a new user's state), then
    exactly those tests again once PyTorch is installed."""
    path = os.environ.get("TILTLAB_RECORD_SKIPS")
    if not path or not report.skipped:
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    if "torch" in str(reason).lower():
        with open(path, "a", encoding="utf-8") as out:
            out.write(report.nodeid + "\n")
