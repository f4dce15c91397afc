"""The dispatch tables that let optional backends register into lower layers."""

import sys
import types

import numpy as np
import pytest

from tiltlab._dispatch import Dispatch, library_of


def test_library_of_arrays_and_namespaces():
    import array_api_compat.numpy as npx
    import array_api_strict

    assert library_of(np.ones(2)) == "numpy"
    assert library_of(npx) == "numpy"
    assert library_of(array_api_strict) == "array_api_strict"
    assert library_of(array_api_strict.ones(2)) == "array_api_strict"


def test_register_lookup_and_default():
    table = Dispatch("t")
    sentinel = object()
    assert table.lookup("numpy") is None
    assert table.lookup("numpy", sentinel) is sentinel
    table.register("numpy", len)
    assert table.lookup("numpy") is len
    assert table.dispatch(np.ones(1)) is len

    @table.register("torch")
    def impl():
        return 1

    assert table.lookup("torch") is impl
    assert table.registered() == ["numpy", "torch"]


def test_register_lazy_imports_the_module_once(monkeypatch):
    table = Dispatch("lazy")
    calls = []
    name = "_tiltlab_test_lazy_backend"

    def fake_import(module_name):
        calls.append(module_name)
        table.register("dask", "dask implementation")
        return types.ModuleType(module_name)

    monkeypatch.setattr("tiltlab._dispatch.importlib.import_module", fake_import)
    table.register_lazy("dask", name)
    assert "dask" in table.registered()
    assert table.lookup("dask") == "dask implementation"
    assert table.lookup("dask") == "dask implementation"
    assert calls == [name]
    assert name not in sys.modules


def test_bad_registrations_name_the_argument():
    table = Dispatch("bad")
    with pytest.raises(TypeError, match="`library`"):
        table.register("", len)
    with pytest.raises(TypeError, match="`module`"):
        table.register_lazy("dask", "")
