"""Sphinx configuration of the tiltlab documentation.

Build with ``pip install ".[docs]" && sphinx-build -W -b html docs docs/_build/html``.
The notebooks of ``../notebooks`` are rendered with their stored outputs (myst-nb,
no execution at build time); they are copied into ``docs/notebooks`` here because Sphinx
reads only files under this folder.
"""

from __future__ import annotations

import importlib.util
import inspect
import shutil
import sys
import warnings
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout, not an older installed copy

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
    "numpydoc",
    "myst_nb",
]

templates_path = ["_templates"]  # autosummary/class.rst: a class's own members only

# --- sources -------------------------------------------------------------------------
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
#: whether ``tiltlab.estimators`` (scikit-learn estimators) is importable; without it the
#: API page ``api/estimators.rst`` is replaced by a short note (see ``_estimators_page``)
HAVE_ESTIMATORS = (
    importlib.util.find_spec("tiltlab.estimators") is not None
    and importlib.util.find_spec("sklearn") is not None
)

# copy the executed notebooks next to their index page (outputs are stored in them)
(DOCS / "notebooks").mkdir(exist_ok=True)
for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    target = DOCS / "notebooks" / nb.name
    if not target.exists() or target.read_bytes() != nb.read_bytes():
        shutil.copyfile(nb, target)

# --- myst / myst-nb ------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # render the stored outputs; the test suite executes them
nb_merge_streams = True

# --- autodoc / autosummary / numpydoc -------------------------------------------------
# stub pages for the API reference (the estimators page only when the module exists)
autosummary_generate = sorted(
    str(f.relative_to(DOCS))
    for f in (DOCS / "api").glob("*.rst")
    if HAVE_ESTIMATORS or f.name != "estimators.rst"
)
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # the numpydoc sections give the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# --- HTML ----------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"tiltlab {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"index": []}


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


def setup(app):
    app.connect("source-read", _estimators_page)
    app.connect("autodoc-process-docstring", _options_section, priority=100)
    app.connect("autodoc-process-docstring", _no_inherited_type_doc, priority=100)
