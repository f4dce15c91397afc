"""Build (and execute) the notebooks of this folder from source, so they are reproducible.

Usage::

    python notebooks/_build_notebooks.py                 # write and execute every notebook
    python notebooks/_build_notebooks.py --no-execute    # write them without outputs
    python notebooks/_build_notebooks.py --only robust_regression
    python notebooks/_build_notebooks.py --script backends_and_gpu > run.py

Each notebook ``NAME.ipynb`` is defined by ``_sources/NAME.py`` as a list ``CELLS`` of
(kind, source) pairs, kind ``"md"`` or ``"code"``. This script writes it with nbformat
and, unless ``--no-execute``, runs it with nbclient (kernel ``python3``, working directory
``notebooks/``) and stores the outputs. ``--script`` prints a notebook's code cells as one
Python script (to run its measurements on a machine without Jupyter). Edit the sources,
not the ``.ipynb`` files; ``tests/test_notebooks.py`` checks that they agree.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = HERE / "_sources"


def _load_cells(path: Path) -> list[tuple[str, str]]:
    spec = importlib.util.spec_from_file_location(f"_nb_source_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CELLS)


#: notebook file name -> its cells, one entry per ``_sources/*.py``
NOTEBOOKS = {f"{p.stem}.ipynb": _load_cells(p) for p in sorted(SOURCES.glob("*.py"))}


def build(cells):
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def kernel_env() -> None:
    """Make the kernel import this checkout's tiltlab (it inherits the environment)."""
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)


def execute(nb) -> None:
    from nbclient import NotebookClient

    kernel_env()
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()


def script(cells) -> str:
    """The code cells as one script (``plt.show()`` does nothing without a display)."""
    code = [src for kind, src in cells if kind == "code"]
    return "import matplotlib\nmatplotlib.use('Agg')\n\n" + "\n\n".join(code) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-execute", action="store_true", help="write without outputs")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="build only this notebook (repeatable; name without .ipynb)")
    parser.add_argument("--script", metavar="NAME", help="print NAME's code cells and exit")
    args = parser.parse_args(argv)
    if args.script:
        print(script(NOTEBOOKS[f"{args.script}.ipynb"]), end="")
        return
    import nbformat

    names = [f"{n}.ipynb" for n in args.only] or list(NOTEBOOKS)
    for name in names:
        nb = build(NOTEBOOKS[name])
        if not args.no_execute:
            execute(nb)
        nbformat.validate(nb)
        nbformat.write(nb, HERE / name)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
