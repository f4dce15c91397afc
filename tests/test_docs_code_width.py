"""Code lines shown to readers are at most 88 characters.

A longer line runs past the right edge of a code block on the documentation site (the
block scrolls sideways, so ``distributed=True`` reads ``distributed=Tru``) and wraps in a
terminal. Checked: the code blocks of README.md and of every Markdown and reStructuredText
page under ``docs/`` (fenced blocks, ``code-block`` directives and literal blocks), and
the Examples sections of the docstrings of every public name that the API pages show,
and the code cells of the notebooks the site renders.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import pytest

import tiltlab

ROOT = Path(__file__).resolve().parent.parent
MAX = 88
#: build outputs under docs/ (generated API pages, executed notebooks' copies)
SKIP_DIRS = {"_build", "generated", "modules", "notebooks"}


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"]
    for path in sorted((ROOT / "docs").rglob("*")):
        rel = path.relative_to(ROOT / "docs")
        if path.suffix in (".md", ".rst") and not SKIP_DIRS & set(rel.parts[:-1]):
            pages.append(path)
    return pages


def markdown_code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block (``` or ~~~)."""
    out, fence = [], None
    for no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif (
            fence is not None
            and line.strip().startswith(fence)
            and not line.strip()[len(fence) :].strip()
        ):
            fence = None
        elif fence is not None:
            out.append((no, line))
    return out


def rst_code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of a literal block (after ``::``) or of a
    ``code-block`` / ``code`` / ``literalinclude``-free code directive, dedented."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        starts = re.match(r"\s*\.\. (code-block|code|sourcecode)::", line) or (
            line.rstrip().endswith("::") and not re.match(r"\s*\.\. [\w:-]+::", line)
        )
        if not starts:
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        block = []
        i += 1
        while i < len(lines) and (lines[i].startswith(" " * (indent + 1)) or not lines[i].strip()):
            if lines[i].strip() and not re.match(r"\s+:\w[\w-]*:", lines[i]):
                block.append((i + 1, lines[i]))
            i += 1
        if block:  # the block's own indentation is not shown
            cut = min(len(b) - len(b.lstrip()) for _, b in block)
            out.extend((no, b[cut:]) for no, b in block)
    return out


def page_code_lines(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    return markdown_code_lines(text) if path.suffix == ".md" else rst_code_lines(text)


def docstring_example_lines(doc: str) -> list[str]:
    """The lines of the doctest blocks of a numpydoc docstring's Examples section (the
    ``>>>`` and ``...`` lines and their output, as the page shows them in code blocks;
    prose between the blocks wraps)."""
    lines = inspect.cleandoc(doc).splitlines()
    out, inside, in_block = [], False, False
    for k, line in enumerate(lines):
        underlined = k + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[k + 1].strip())
        if underlined and line.strip() == "Examples":
            inside = True
            continue
        if inside and underlined:
            break
        if not inside:
            continue
        if line.lstrip().startswith(">>>"):
            in_block = True
        elif not line.strip():
            in_block = False
        if in_block:
            out.append(line)
    return out


def _public_objects():
    names = ["tiltlab"] + [
        info.name
        for info in pkgutil.walk_packages(tiltlab.__path__, "tiltlab.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    seen: set[int] = set()
    for module_name in names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional dependency is missing: its pages are not built
            continue
        items = [(module_name, module)]
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            items.append((f"{module_name}.{name}", obj))
            if inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    value = getattr(value, "__func__", getattr(value, "fget", value))
                    if inspect.isfunction(value):
                        items.append((f"{module_name}.{name}.{attr}", value))
        for full, obj in items:
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield full, obj


def test_width_checks_can_fail():
    md = "text\n```python\n" + "x" * 89 + "\n```\n" + "y" * 200 + "\n"
    assert markdown_code_lines(md) == [(3, "x" * 89)]
    rst = "Text::\n\n    " + "z" * 89 + "\n\nback\n\n.. code-block:: python\n\n   a = 1\n"
    assert [len(line) for _, line in rst_code_lines(rst)] == [89, 5]
    doc = "Summary.\n\nExamples\n--------\n>>> " + "w" * 90 + "\n\nNotes\n-----\n" + "n" * 99
    assert docstring_example_lines(doc) == [">>> " + "w" * 90]


@pytest.mark.parametrize("path", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_code_lines_fit(path):
    long = [f"{no}: {len(line)} chars" for no, line in page_code_lines(path) if len(line) > MAX]
    assert not long, f"{path.relative_to(ROOT)}: code lines over {MAX} characters: {long}"


def test_docstring_example_lines_fit():
    long = [
        f"{name}: {len(line)} chars: {line[:50]}..."
        for name, obj in _public_objects()
        for line in docstring_example_lines(inspect.getdoc(obj) or "")
        if len(line) > MAX
    ]
    assert not long, f"docstring example lines over {MAX} characters:\n" + "\n".join(long)


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_code_lines_fit(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    long = [
        f"cell {k}: {len(line)} chars: {line[:50]}..."
        for k, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        for line in "".join(cell["source"]).splitlines()
        if len(line) > MAX
    ]
    assert not long, f"{path.name}: code lines over {MAX} characters: {long}"
