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
import functools
import importlib
import importlib.util
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tiltlab

API_DIR = Path(__file__).resolve().parent.parent / "docs" / "api"

#: modules that need an optional dependency to import, and that dependency
OPTIONAL = {
    "tiltlab.estimators": "sklearn",
    "tiltlab.plot": "matplotlib",
    "tiltlab._cpu_kernels": "numba",
    "tiltlab.torch": "torch",
}
#: modules that import without these packages but whose docstring examples use them (the
#: deep reproductions import PyTorch and scikit-learn on first use); examples that import
#: ``torch`` or ``tiltlab.torch`` themselves are found without a listing
EXAMPLE_DEPENDENCIES = {
    "tiltlab.reproduce._deep": ("torch", "sklearn"),
    "tiltlab.reproduce._deep_losses": ("torch",),
    "tiltlab.reproduce._deep_report": ("torch", "sklearn"),
    "tiltlab.reproduce.class_imbalance": ("torch", "sklearn"),
    "tiltlab.reproduce.label_noise": ("torch", "sklearn"),
    "tiltlab.reproduce.lm_noisy_targets": ("torch",),
    "tiltlab.reproduce.noisy_annotators": ("torch", "sklearn"),
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


def _optional_dependency(name: str) -> str | None:
    """The optional package that module (or dotted name) ``name`` needs, if any."""
    return next((d for m, d in OPTIONAL.items() if name == m or name.startswith(m + ".")), None)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a package blocked in sys.modules
        return False


def _import(name: str):
    dep = _optional_dependency(name)
    if dep is not None:
        pytest.importorskip(dep, reason=f"{name} needs {dep}")
    return importlib.import_module(name)


def _api_sources() -> dict[str, str]:
    """The hand-written API pages, and the pages the build generates for other modules."""
    pages = {p.name: p.read_text(encoding="utf-8") for p in sorted(API_DIR.glob("*.rst"))}
    return {**pages, **_docs_helpers().module_pages(API_DIR)}


def _docs_helpers():
    """``docs/_ext/tiltlab_sphinx.py`` (it writes the generated module pages)."""
    pytest.importorskip("docutils", reason="the docs' Sphinx extension needs docutils")
    spec = importlib.util.spec_from_file_location(
        "tiltlab_sphinx", API_DIR.parent / "_ext" / "tiltlab_sphinx.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        dep = _optional_dependency(full_name)
        if dep is not None and not _installed(dep):
            continue  # checked where the dependency is installed
        try:
            _resolve(full_name)
        except (ImportError, AttributeError):
            stale.append(f"{full_name} (docs/api/{fname})")
    assert not stale, f"API reference lists names that do not exist: {stale}"


@functools.cache
def _documented_ids() -> dict[int, str]:
    """The objects the API reference documents, by id (resolved once per process)."""
    out: dict[int, str] = {}
    for full_name in _documented():
        try:
            out.setdefault(id(_resolve(full_name)), full_name)
        except (ImportError, AttributeError):
            pass
    return out


@pytest.mark.parametrize("module_name", _public_module_names())
def test_every_public_name_is_documented(module_name):
    module = _import(module_name)
    documented = _documented()
    documented_ids = _documented_ids()
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


#: modules whose examples run a whole fit or reproduction (seconds; their functions have
#: tests of their own in the push tier): the full tier
SLOW_EXAMPLES = {
    "tiltlab.reproduce.robust_regression",
    "tiltlab.reproduce.convergence",
    "tiltlab.reproduce.fair_pca",
    "tiltlab.reproduce.hierarchical",
    "tiltlab.estimators._regressor",
}


@pytest.mark.parametrize(
    "module_name",
    [
        pytest.param(m, marks=pytest.mark.slow) if m in SLOW_EXAMPLES else m
        for m in _all_module_names()
    ],
)
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
    failures, left_out = [], {}
    for test in tests:
        missing = [d for d in _example_dependencies(module_name, test) if not _installed(d)]
        if missing:
            left_out[test.name] = missing
            continue
        result = runner.run(test, out=failures.append, clear_globs=True)
        assert result.attempted
    assert not failures, "".join(failures)
    if left_out:
        needs = sorted({d for deps in left_out.values() for d in deps})
        pytest.skip(
            f"{len(left_out)} of {len(tests)} examples of {module_name} need "
            f"{', '.join(needs)}: {sorted(left_out)}"
        )


def _example_dependencies(module_name: str, test: doctest.DocTest) -> tuple[str, ...]:
    """The optional packages one docstring's examples need."""
    deps = set(EXAMPLE_DEPENDENCIES.get(module_name, ()))
    source = "\n".join(example.source for example in test.examples)
    if re.search(r"^\s*(import torch\b|from torch\b|from tiltlab\.torch\b)", source, re.M):
        deps.add("torch")
    return tuple(sorted(deps))


def test_examples_that_need_torch_are_found():
    """A docstring that imports PyTorch is found without a listing (it must skip, not fail,
    where PyTorch is not installed)."""
    parser = doctest.DocTestParser()
    needs = parser.get_doctest(">>> import torch\n>>> 1\n1\n", {}, "t", None, 0)
    plain = parser.get_doctest(">>> import numpy as np\n>>> 1\n1\n", {}, "t", None, 0)
    assert _example_dependencies("tiltlab.somewhere", needs) == ("torch",)
    assert _example_dependencies("tiltlab.somewhere", plain) == ()
    assert "torch" in _example_dependencies("tiltlab.reproduce._deep", plain)


def _documented_classes() -> list[str]:
    import inspect

    out, seen = [], set()
    for full_name in sorted(_documented()):
        try:
            obj = _resolve(full_name)
        except (ImportError, AttributeError):
            continue
        if inspect.isclass(obj) and id(obj) not in seen:
            seen.add(id(obj))
            out.append(full_name)
    return out


def test_every_class_member_has_a_description():
    """No row of a class page's member tables is empty (the docs extension looks a
    description up along the class's bases and in its docstring sections)."""
    pytest.importorskip("sphinx", reason="attribute comments are read with Sphinx's analyzer")
    pytest.importorskip("numpydoc")
    helpers = _docs_helpers()
    empty = {}
    for full_name in _documented_classes():
        undocumented = helpers.class_members(full_name)["undocumented"]
        if undocumented:
            empty[full_name] = undocumented
    assert not empty, f"class members without a description: {empty}"


def test_class_pages_list_conditional_methods_and_summarise_large_bases():
    pytest.importorskip("sphinx")
    helpers = _docs_helpers()
    if _installed("sklearn"):
        m = helpers.class_members("tiltlab.estimators.TiltedClassifier")
        assert {"predict_proba", "predict_log_proba"} <= set(m["methods"])
    if _installed("torch"):
        m = helpers.class_members("tiltlab.torch.TiltedLoss")
        owners = {owner: names for owner, names, _ in m["external"]}
        assert "torch.nn.Module" in owners  # its public name (the class page exists)
        assert len(owners["torch.nn.Module"]) >= m["many_members"]  # named by a count


# --- the code of the narrative pages runs as shown ---------------------------------------

DOCS_DIR = API_DIR.parent
#: pages whose ``python`` code blocks are run, each page's blocks in order in one process
GUIDE_PAGES = sorted(
    p
    for p in [*DOCS_DIR.glob("*.md"), *(DOCS_DIR / "user_guide").glob("*.md")]
    if "```python" in p.read_text(encoding="utf-8")
)
#: a page that imports one of these is skipped where it is not installed
PAGE_DEPENDENCIES = {
    "torch": "torch",
    "dask": "dask",
    "sklearn": "sklearn",
    "estimators": "sklearn",
}

_CHECK = """
def _check(expected, *values):
    got = " ".join(str(v) for v in values)
    print(got)
    norm = lambda s: " ".join(s.split())
    want = norm(expected)
    ok = norm(got).startswith(want[:-3]) if want.endswith("...") else norm(got) == want
    assert ok, f"printed {got!r}, the page says {expected!r}"
"""


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _with_checks(code: str) -> str:
    """``print(x)  # 1.5: text`` becomes a check that ``x`` prints as ``1.5``.

    Only comments that start like an output (a digit, sign, bracket, quote or capital)
    are checked; the expected text ends at ``": "``, and a trailing ``...`` makes it a
    prefix.
    """
    out = []
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("print(") and "  # " in stripped:
            call, comment = (s.strip() for s in stripped.split("  # ", 1))
            expected = comment.split(": ", 1)[0]
            if call.endswith(")") and re.match(r"[-0-9\[\('\"A-Z]", expected):
                indent = line[: len(line) - len(line.lstrip())]
                line = f"{indent}_check({expected!r}, {call[len('print(') : -1]})"
        out.append(line)
    return "\n".join(out)


def test_guide_pages_have_code():
    names = {p.name for p in GUIDE_PAGES}
    assert {"index.md", "getting_started.md", "tilt.md", "hierarchical.md"} <= names


def test_output_checks_can_fail(tmp_path):
    code = _CHECK + _with_checks("print(1 + 1)  # 3: wrong on purpose")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "the page says '3'" in proc.stderr


#: pages whose snippets take seconds (a local cluster, training loops, whole fits on the
#: shipped data): the full tier (their functions have push-tier tests of their own)
SLOW_PAGES = {
    "user_guide/robust.md",
    "user_guide/hierarchical.md",
    "user_guide/tilt.md",
    "user_guide/choosing_tilt.md",
    "user_guide/scale_out.md",
    "user_guide/minibatch.md",
    "user_guide/language_models.md",
    "user_guide/theory.md",
    "user_guide/estimators.md",
}


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, marks=pytest.mark.slow)
        if p.relative_to(DOCS_DIR).as_posix() in SLOW_PAGES
        else p
        for p in GUIDE_PAGES
    ],
    ids=[p.relative_to(DOCS_DIR).as_posix() for p in GUIDE_PAGES],
)
def test_guide_snippets_run(page, tmp_path):
    text = page.read_text(encoding="utf-8")
    code = "\n\n".join(_code_blocks(text))
    for word, dep in PAGE_DEPENDENCIES.items():
        if re.search(rf"^\s*(import|from) \S*{word}", code, flags=re.M):
            pytest.importorskip(dep, reason=f"{page.name} needs {dep}")
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(DOCS_DIR.parent), os.environ.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK + _with_checks(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"{page.name}: its code failed\n{proc.stdout}\n{proc.stderr}"


def test_every_public_module_states_its_backends():
    """Each public module's functions get a "Backends" line (docs/_ext/tiltlab_sphinx.py)."""
    helpers = _docs_helpers()
    names = [m + ".f" for m in _public_module_names() if m != "tiltlab"]
    names += [f"tiltlab.{n}" for n in tiltlab.__all__ if callable(getattr(tiltlab, n))]
    missing = [n for n in names if helpers.backend_kind(n) is None]
    assert not missing, f"add these modules to BACKEND_SUPPORT in docs/_ext: {missing}"
    assert set(helpers.BACKEND_SUPPORT.values()) <= set(helpers.BACKEND_TEXT)


# --- numpydoc sections of the reproductions, baselines and datasets ----------------------

#: the packages whose public names must have complete numpydoc docstrings
NUMPYDOC_PACKAGES = ("tiltlab.reproduce", "tiltlab.baselines", "tiltlab.datasets")
#: numpydoc validation codes that fail the test: no docstring (GL08), a parameter not
#: documented (PR01) or documented but not in the signature (PR02), no Returns (RT01) or
#: Yields (YD01) section, no Examples (EX01), no See Also (SA01)
NUMPYDOC_REQUIRED = ("GL08", "PR01", "PR02", "RT01", "YD01", "EX01", "SA01")
#: full name -> codes that may be missing, each with the reason; keep it short and empty
#: where possible (a property is documented as an attribute of its class: only its summary
#: is required, see `_numpydoc_gaps`)
NUMPYDOC_ALLOWED: dict[str, tuple[str, ...]] = {}


def _numpydoc_names() -> dict[str, object]:
    """Full names of the public functions, classes and methods of ``NUMPYDOC_PACKAGES``.

    Every module of those packages is read (private ones included: they define the public
    objects, and their own public names are imported by the experiments); each object is
    named where it is defined, once.
    """
    import inspect

    names: dict[str, object] = {}
    for package in NUMPYDOC_PACKAGES:
        pkg = importlib.import_module(package)
        modules = [package] + [
            info.name for info in pkgutil.walk_packages(pkg.__path__, package + ".")
        ]
        for module_name in modules:
            module = importlib.import_module(module_name)
            public = getattr(module, "__all__", None)
            if public is None:
                public = [n for n in vars(module) if not n.startswith("_")]
            extra = [  # public in the module though not exported (helpers of the experiments)
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == module_name
            ]
            for name in dict.fromkeys([*public, *extra]):
                obj = getattr(module, name)
                if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                if not obj.__module__.startswith("tiltlab."):
                    continue
                full = f"{obj.__module__}.{obj.__qualname__}"
                names[full] = obj
                if inspect.isclass(obj):
                    for attr, value in vars(obj).items():
                        if not attr.startswith("_") and (
                            inspect.isfunction(value)
                            or isinstance(value, (property, staticmethod, classmethod))
                        ):
                            names[f"{full}.{attr}"] = value
    return dict(sorted(names.items()))


def _numpydoc_gaps(full_name: str, obj: object) -> list[str]:
    """The required numpydoc sections missing from the docstring of ``obj``.

    ``full_name`` is where ``obj`` is defined (numpydoc imports it from there).
    """
    import inspect

    pytest.importorskip("numpydoc")
    from numpydoc.docscrape import NumpyDocString
    from numpydoc.validate import validate

    result = validate(full_name)
    codes = {code: message for code, message in result["errors"]}
    if isinstance(obj, property):  # an attribute: its summary is its documentation
        return [f"{c}: {codes[c]}" for c in ("GL08",) if c in codes]
    if inspect.isclass(obj) and "PR01" in codes and obj.__doc__:
        # a dataclass may document its fields as Attributes rather than Parameters
        doc = NumpyDocString(inspect.cleandoc(obj.__doc__))
        documented = {
            n.strip().lstrip("*")
            for section in ("Parameters", "Attributes")
            for p in doc[section]
            for n in p.name.split(",")
        }
        params = [
            p for p in inspect.signature(obj).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]  # fmt: skip
        if all(p.name in documented for p in params):
            del codes["PR01"]
    allowed = NUMPYDOC_ALLOWED.get(full_name, ())
    return [f"{c}: {codes[c]}" for c in NUMPYDOC_REQUIRED if c in codes and c not in allowed]


def test_numpydoc_names_are_found():
    names = _numpydoc_names()
    for expected in (
        "tiltlab.reproduce.__init__.run",
        "tiltlab.reproduce._common.Reproduction.to_dict",
        "tiltlab.reproduce._deep.train",
        "tiltlab.baselines.regression.fit_genie",
        "tiltlab.datasets._loaders.load_hiv1",
        "tiltlab.datasets.groups.GroupedData.sizes",
    ):
        expected = expected.replace(".__init__", "")
        assert expected in names, f"{expected} is not checked"


def test_numpydoc_check_can_fail():
    def undocumented(x, y=1):
        """Only a summary."""
        return x + y

    module = sys.modules[__name__]
    undocumented.__module__, undocumented.__qualname__ = __name__, "_tmp_undocumented"
    module._tmp_undocumented = undocumented
    try:
        gaps = _numpydoc_gaps(f"{__name__}._tmp_undocumented", undocumented)
        missing = {g.split(":")[0] for g in gaps}
    finally:
        del module._tmp_undocumented
    assert {"PR01", "RT01", "EX01", "SA01"} <= missing


@pytest.mark.parametrize("package", NUMPYDOC_PACKAGES)
def test_numpydoc_sections(package):
    """Parameters, Returns, See Also and Examples of every public name stay documented."""
    gaps = {
        name: _numpydoc_gaps(name, obj)
        for name, obj in _numpydoc_names().items()
        if name.startswith(package + ".")
    }
    gaps = {name: g for name, g in gaps.items() if g}
    assert not gaps, "incomplete numpydoc docstrings:\n" + "\n".join(
        f"{name}: {g}" for name, g in gaps.items()
    )


def test_numpydoc_allow_list_is_current():
    names = set(_numpydoc_names())
    stale = [n for n in NUMPYDOC_ALLOWED if n not in names]
    assert not stale, f"NUMPYDOC_ALLOWED names objects that are not checked: {stale}"


def test_gpu_figures_say_when_the_kernels_changed_after_them():
    # each GPU report records a digest of the device code it measured; where the kernels
    # have changed since, the pages that quote its figures say so (and stop saying so once
    # the figures are measured again)
    from tiltlab._cupy import source

    root = Path(__file__).resolve().parents[1]
    report = json.loads((root / "benchmarks/data/gpu_report_h200.json").read_text())
    assert len(report["cuda_sources"]) == 16
    changed = report["cuda_sources"] != source.device_code_digest()
    note = f"The CUDA kernels changed after commit `{report['commit'][:7]}`"
    for page in ("docs/benchmarks.md", "benchmarks/README.md"):
        text = (root / page).read_text(encoding="utf-8")
        assert f"commit `{report['commit'][:7]}`" in text, page
        assert (note in text) == changed, (page, changed)
    # the Speed page quotes the run's figures; the README and the backends guide refer to
    # it instead of quoting them again (two copies of one run drift apart)
    for page in ("README.md", "docs/user_guide/backends.md"):
        text = (root / page).read_text(encoding="utf-8")
        assert "H100" not in text and "GB/s" not in text and " ms " not in text, page
        assert "benchmarks.md" in text or "<../benchmarks>" in text, page
