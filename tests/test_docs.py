"""The documentation: every public name is in the API reference, and docstring examples run.

* The API reference (``docs/api/*.rst``) lists names in ``autosummary`` blocks under a
  ``currentmodule``. Every name in ``tiltlab.__all__`` and in the ``__all__`` of every public
  submodule must be documented there, under its own path or under another public path of
  the same object (a re-export is documented once); every listed name must exist (no stale
  entries); every public top-level module has a page.
* Every ``tiltlab`` module's docstring examples (private modules included: they define
  most public objects) run as doctests (a module whose optional
  dependency is missing is skipped, naming it).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import tiltlab

API_DIR = Path(__file__).resolve().parent.parent / "docs" / "api"

#: modules that need an optional dependency, and that dependency
OPTIONAL = {
    "tiltlab.estimators": "sklearn",
    "tiltlab.plot": "matplotlib",
    "tiltlab._cpu_kernels": "numba",
}


def _public_module_names() -> list[str]:
    names = ["tiltlab"]
    for info in pkgutil.walk_packages(tiltlab.__path__, "tiltlab."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def _all_module_names() -> list[str]:
    """Every module of the package, private ones included (they define public objects)."""
    return ["tiltlab"] + sorted(
        info.name for info in pkgutil.walk_packages(tiltlab.__path__, "tiltlab.")
    )


def _import(name: str):
    dep = next((d for m, d in OPTIONAL.items() if name == m or name.startswith(m + ".")), None)
    if dep is not None:
        pytest.importorskip(dep, reason=f"{name} needs {dep}")
    return importlib.import_module(name)


def _api_sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(API_DIR.glob("*.rst"))}


def _documented() -> dict[str, str]:
    """Full dotted names listed in autosummary blocks -> the file that lists them."""
    out: dict[str, str] = {}
    for fname, text in _api_sources().items():
        module = None
        in_summary = False
        for line in text.splitlines():
            m = re.match(r"\.\. currentmodule:: (\S+)", line)
            if m:
                module, in_summary = m.group(1), False
                continue
            if line.startswith(".. autosummary::"):
                in_summary = True
                continue
            if in_summary:
                stripped = line.strip()
                if not stripped or stripped.startswith(":"):
                    continue
                if not line.startswith("   "):
                    in_summary = False
                    continue
                assert module is not None, f"{fname}: autosummary before any currentmodule"
                out[f"{module}.{stripped.lstrip('~')}"] = fname
    return out


def _resolve(full_name: str):
    module_name, _, attr = full_name.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def test_api_reference_exists():
    assert (API_DIR / "index.rst").exists()
    assert _documented(), "no autosummary entries found in docs/api"


def test_every_listed_name_exists():
    have_estimators = (
        importlib.util.find_spec("tiltlab.estimators") is not None
        and importlib.util.find_spec("sklearn") is not None
    )
    stale = []
    for full_name, fname in _documented().items():
        if full_name.startswith("tiltlab.estimators.") and not have_estimators:
            continue  # docs/conf.py renders that page as a note without the module
        try:
            _resolve(full_name)
        except (ImportError, AttributeError):
            stale.append(f"{full_name} (docs/api/{fname})")
    assert not stale, f"API reference lists names that do not exist: {stale}"


@pytest.mark.parametrize("module_name", _public_module_names())
def test_every_public_name_is_documented(module_name):
    module = _import(module_name)
    documented = _documented()
    documented_ids = {}
    for full_name in documented:
        try:
            documented_ids.setdefault(id(_resolve(full_name)), full_name)
        except (ImportError, AttributeError):
            pass
    texts = "\n".join(_api_sources().values())
    missing = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if isinstance(obj, type(tiltlab)):  # a submodule: it needs its own section
            if f".. automodule:: {obj.__name__}\n" not in texts:
                missing.append(f"{name} (module {obj.__name__} has no automodule)")
            continue
        if f"{module_name}.{name}" in documented or id(obj) in documented_ids:
            continue
        missing.append(name)
    assert not missing, (
        f"public names of {module_name} missing from the API reference (add them to an "
        f"autosummary block in docs/api/*.rst): {missing}"
    )


def test_every_top_level_module_has_a_page():
    texts = "\n".join(_api_sources().values())
    for name in _public_module_names():
        if name.count(".") == 1:
            assert f".. automodule:: {name}\n" in texts, f"{name} has no API page"


@pytest.mark.parametrize("module_name", _all_module_names())
def test_docstring_examples(module_name, monkeypatch, tmp_path):
    module = _import(module_name)
    if module_name == "tiltlab.plot" or module_name.startswith("tiltlab.plot."):
        import matplotlib

        matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    # the finder keeps only objects defined in this module: re-exports run where defined
    tests = [t for t in finder.find(module, module_name) if t.examples]
    if not tests:
        pytest.skip(f"{module_name} has no docstring examples of its own")
    failures = []
    for test in tests:
        result = runner.run(test, out=failures.append, clear_globs=True)
        assert result.attempted
    assert not failures, "".join(failures)
