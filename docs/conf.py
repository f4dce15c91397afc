"""Sphinx configuration of the tiltlab documentation.

Build with ``pip install ".[docs]" && sphinx-build -n -W -b html docs docs/_build/html``
(nitpicky: every cross-reference must resolve). The build needs no network:

* formulas are rendered by a MathJax copy shipped with the site (``sphinx-mathjax-offline``);
* references to NumPy, SciPy, scikit-learn, PyTorch, Dask and the standard library are
  linked by their documentation's URL patterns (``_ext/tiltlab_sphinx.py``) instead of
  intersphinx, whose inventories would have to be downloaded at build time;
* the notebooks of ``../notebooks`` are copied into ``docs/notebooks`` (Sphinx reads only
  files under this folder) and executed by myst-nb with a cache in ``docs/_build``, so
  the site shows what the current code prints; a cell error fails the build.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import sys
import warnings
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout, not an older installed copy
sys.path.insert(0, str(DOCS / "_ext"))
# the notebook kernels are subprocesses: they import this checkout's tiltlab too
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

import tiltlab_sphinx  # noqa: E402

import tiltlab  # noqa: E402

project = "tiltlab"
author = "tiltlab developers"
copyright = "tiltlab developers, MIT licence"  # noqa: A001
release = tiltlab.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # serves MathJax from _static: formulas render offline
    "sphinx_copybutton",
    "numpydoc",
    "myst_nb",
]

# autosummary/class.rst: every public method and attribute tiltlab defines gets an entry
templates_path = ["_templates"]
autosummary_context = {
    "class_members": tiltlab_sphinx.ContextFunction("class_members"),
    "enum_members": tiltlab_sphinx.ContextFunction("enum_members"),
}
nitpicky = True
# Third-party names that have no page of their own to link to. Keep this list short: a
# reference to a tiltlab name or to a documented library object must resolve.
nitpick_ignore: list[tuple[str, str]] = []

# --- sources -------------------------------------------------------------------------
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
#: whether ``tiltlab.estimators`` (scikit-learn estimators) is importable; without it the
#: API page ``api/estimators.rst`` is replaced by a short note (see ``_estimators_page``)
HAVE_ESTIMATORS = (
    importlib.util.find_spec("tiltlab.estimators") is not None
    and importlib.util.find_spec("sklearn") is not None
)

# copy the notebooks (and the data they read) next to their index page
(DOCS / "notebooks").mkdir(exist_ok=True)
for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "notebooks" / "data").glob("*")
):
    target = DOCS / "notebooks" / nb.relative_to(ROOT / "notebooks")
    target.parent.mkdir(exist_ok=True)
    if not target.exists() or target.read_bytes() != nb.read_bytes():
        shutil.copyfile(nb, target)

# an API page for every public module without a hand-written one (from its __all__)
tiltlab_sphinx.write_module_pages(DOCS / "api", DOCS / "api" / "modules")

# --- myst / myst-nb ------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "substitution"]
myst_substitutions = {"version": release}
myst_heading_anchors = 3
# executed at build time, re-run when a notebook changes; TILTLAB_DOCS_NB_EXECUTION=off
# renders the stored outputs instead (a quick local build of the other pages)
nb_execution_mode = os.environ.get("TILTLAB_DOCS_NB_EXECUTION", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_merge_streams = True

# --- autodoc / autosummary / numpydoc -------------------------------------------------
# stub pages for the API reference (the estimators page only when the module exists)
autosummary_generate = sorted(
    str(f.relative_to(DOCS))
    for f in [*(DOCS / "api").glob("*.rst"), *(DOCS / "api" / "modules").glob("*.rst")]
    if HAVE_ESTIMATORS or f.name != "estimators.rst"
)
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # the numpydoc sections give the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# --- copy buttons ----------------------------------------------------------------------
# the button copies the code only: the ``>>> ``/``... `` prompts of the docstring examples
# are stripped and their output lines (no prompt) left out; blocks without prompts (the
# guides' ``python`` and ``bash`` blocks) are copied whole
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True
copybutton_remove_prompts = True
copybutton_exclude = ".linenos, .gp, .go"

# --- HTML ----------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"tiltlab {release}"
html_static_path = ["_static"]
# long page titles (full dotted names) and previous/next links wrap instead of being cut
html_css_files = ["tiltlab.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
# pages without sub-pages: no (empty) section navigation
html_sidebars = {page: [] for page in ("index", "getting_started", "benchmarks", "changelog")}


def _module_pages_toctree(app, docname, source):
    """List the generated module pages (``api/modules``) in the API index."""
    pages = sorted(p.stem for p in (DOCS / "api" / "modules").glob("*.rst"))
    if docname == "api/index" and pages:
        entries = "".join(f"   modules/{p}\n" for p in pages)
        source[0] += f"\n.. toctree::\n   :maxdepth: 1\n   :caption: Other modules\n\n{entries}"


def _estimators_page(app, docname, source):
    """Render ``api/estimators`` as a note when ``tiltlab.estimators`` is not installed."""
    if docname == "api/estimators" and not HAVE_ESTIMATORS:
        source[0] = (
            "``tiltlab.estimators``: scikit-learn estimators\n"
            "===============================================\n\n"
            "This module (or scikit-learn, which it needs) is not part of this build. "
            "The :doc:`user guide <../user_guide/estimators>` describes its estimators.\n"
        )


# autosummary's summary tables parse the raw docstrings, before _options_section runs
warnings.filterwarnings("ignore", message="Unknown section Options", category=UserWarning)


def _options_section(app, what, name, obj, options, lines):
    """Render the solvers' ``Options`` docstring section as numpydoc's "Other Parameters".

    The solver classes list the method options of :func:`tiltlab.minimize` under an
    ``Options`` heading, which numpydoc does not know and would drop. Runs before numpydoc.
    """
    for i in range(len(lines) - 1):
        if lines[i].strip() == "Options" and set(lines[i + 1].strip()) == {"-"}:
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            lines[i] = indent + "Other Parameters"
            lines[i + 1] = indent + "-" * len("Other Parameters")


def _no_inherited_type_doc(app, what, name, obj, options, lines):
    """Drop the docstring a module-level constant inherits from its type (tuple, ndarray).

    A constant documented by a ``#:`` comment keeps that comment; one without gets the
    docstring of its class from autodoc, which describes ``tuple`` or ``numpy.ndarray``.
    """
    if what != "data" or not lines:
        return
    own = inspect.getdoc(obj) or ""
    if own and lines[0].strip() == own.splitlines()[0].strip():
        lines.clear()


_ASV_MISSING = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tiltlab benchmark history</title></head>
<body><h1>tiltlab benchmark history</h1>
<p>The graphs of the asv history were not built with this copy of the documentation
(asv, or the git history of the recorded commits, was missing). Build them with
<code>pip install asv; python benchmarks/asv_publish.py</code> from the repository's root
and open <code>benchmarks/html/index.html</code>.</p></body></html>
"""


def _asv_graphs(app, config):
    """Ship the asv history's graphs with the site as ``asv/index.html``: the committed
    results of ``benchmarks/results`` published by ``benchmarks/asv_publish.py`` (asv's
    pages with their scripts copied beside them: no network), or a page that says how to
    build them where asv or the git history is missing."""
    import subprocess

    extra = DOCS / "_build" / "asv-extra"
    site = extra / "asv"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    script = ROOT / "benchmarks" / "asv_publish.py"
    done = subprocess.run(
        [sys.executable, str(script), str(site)], capture_output=True, check=False
    ).returncode == 0
    if not done:
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir(parents=True)
        (site / "index.html").write_text(_ASV_MISSING, encoding="utf-8")
    config.html_extra_path = [*config.html_extra_path, str(extra)]


def setup(app):
    app.connect("config-inited", _asv_graphs)
    app.connect("missing-reference", tiltlab_sphinx.resolve_missing)
    app.connect("autodoc-process-docstring", tiltlab_sphinx.add_backend_line, priority=400)
    app.connect("source-read", _estimators_page)
    app.connect("source-read", _module_pages_toctree)
    app.connect("autodoc-process-docstring", _options_section, priority=100)
    app.connect("autodoc-process-docstring", _no_inherited_type_doc, priority=100)
    app.connect("autodoc-process-docstring", tiltlab_sphinx.fill_attribute_doc, priority=200)
