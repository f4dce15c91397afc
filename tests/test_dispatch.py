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


def test_risk_layer_imports_no_higher_module():
    """The risk functions reach Dask through dispatch tables: no module of the risk layer
    (or below it) names ``tiltlab.distributed``, not even inside a function."""
    import ast
    from pathlib import Path

    import tiltlab

    root = Path(tiltlab.__file__).parent
    lower = [
        root / "segments.py",
        *sorted((root / "accumulator").glob("*.py")),
        *sorted((root / "risk").glob("*.py")),
    ]
    for path in lower:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
                # the module imported from (or the modules, for ``from .. import x``)
                names = [mod] if node.module else [mod + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert "distributed" not in name and "objective" not in name, (path, name)
                if "accumulator" in str(path) or path.name == "segments.py":
                    assert "_cupy" not in name and ".risk" not in name, (path, name)


def test_dask_risks_are_registered_lazily():
    import subprocess
    import sys as _sys

    code = (
        "import sys, tiltlab\n"
        "from tiltlab.risk._dispatch import TILTED_RISK\n"
        "assert 'tiltlab.distributed' not in sys.modules\n"
        "assert 'dask' in TILTED_RISK.registered()\n"
        "import dask.array as da\n"
        "r = tiltlab.tilted_risk(da.ones(4, chunks=2), 1.0)\n"
        "assert 'tiltlab.distributed' in sys.modules\n"
        "assert float(r.compute()) == 1.0\n"
    )
    subprocess.run([_sys.executable, "-c", code], check=True)
