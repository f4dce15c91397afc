"""Sphinx helpers of the tiltlab documentation (loaded by ``docs/conf.py``).

* :func:`class_members` chooses what a class page documents: every public method and
  attribute that tiltlab defines (inherited from a private parent class included), each
  with its own entry; members that come from a third-party base class (scikit-learn's
  ``get_params``...) are named in one line with a link to their own documentation.
* :func:`enum_members` lists an enumeration's members with their descriptions.
* :func:`module_pages` writes an API page for every public module of tiltlab that has no
  hand-written page, from the module's ``__all__``, so a new module is documented by the
  next build (``tests/test_docs.py`` uses the same function).
* :func:`resolve_missing` resolves, without the network, the cross-references Sphinx
  could not: a tiltlab object named under another public path than the one it is
  documented under, a tiltlab implementation module (named as text, linked to its
  package's page), and names of NumPy, SciPy, scikit-learn, PyTorch, Dask, CuPy,
  matplotlib and the standard library, linked by their documentation's URL patterns. A
  third-party name is linked only if it imports, so a misspelt reference still fails the
  nitpicky build.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

from docutils import nodes

#: where each library documents its objects, ``{name}`` being the full dotted name
_PATTERNS = {
    "numpy": "https://numpy.org/doc/stable/reference/generated/{name}.html",
    "scipy": "https://docs.scipy.org/doc/scipy/reference/generated/{name}.html",
    "sklearn": "https://scikit-learn.org/stable/modules/generated/{name}.html",
    "torch": "https://pytorch.org/docs/stable/generated/{name}.html",
    "dask": "https://docs.dask.org/en/stable/generated/{name}.html",
    "distributed": "https://distributed.dask.org/en/stable/api.html#{name}",
    "cupy": "https://docs.cupy.dev/en/stable/reference/generated/{name}.html",
    "matplotlib": "https://matplotlib.org/stable/api/_as_gen/{name}.html",
}
#: module pages, and objects whose page does not follow the pattern
_SPECIAL = {
    "numpy": "https://numpy.org/doc/stable/reference/index.html",
    "numpy.ndarray": "https://numpy.org/doc/stable/reference/generated/numpy.ndarray.html",
    "scipy": "https://docs.scipy.org/doc/scipy/reference/index.html",
    "sklearn": "https://scikit-learn.org/stable/api/index.html",
    "torch": "https://pytorch.org/docs/stable/index.html",
    "torch.Tensor": "https://pytorch.org/docs/stable/tensors.html",
    "dask": "https://docs.dask.org/en/stable/",
    "dask.array": "https://docs.dask.org/en/stable/array.html",
    "dask.array.Array": "https://docs.dask.org/en/stable/generated/dask.array.Array.html",
    "distributed": "https://distributed.dask.org/en/stable/",
    "cupy": "https://docs.cupy.dev/en/stable/reference/index.html",
    "cupy.ndarray": "https://docs.cupy.dev/en/stable/reference/generated/cupy.ndarray.html",
    "matplotlib": "https://matplotlib.org/stable/api/index.html",
    "array_api_strict": "https://data-apis.org/array-api-strict/",
}
#: libraries that need not be importable to be linked (not installed on every machine)
_OPTIONAL = {"cupy", "torch", "dask", "distributed", "matplotlib", "array_api_strict"}


def _import_object(name: str):
    """The object a dotted name denotes, or raise ``LookupError``."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise LookupError(name) from None
        return obj
    raise LookupError(name)


def _is_tiltlab(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "tiltlab" or module.startswith("tiltlab.")


def _defining_class(cls, name):
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _docstring_attributes(cls) -> set[str]:
    """Names in the class docstring's numpydoc ``Attributes`` section."""
    from numpydoc.docscrape import NumpyDocString

    doc = inspect.getdoc(cls) or ""
    try:
        section = NumpyDocString(doc)["Attributes"]
    except Exception:  # a malformed docstring is numpydoc's warning to give, not ours
        return set()
    names = set()
    for param in section:
        for part in param.name.split(","):
            names.add(part.strip())
    return names


def class_members(fullname: str) -> dict:
    """What the page of class ``fullname`` documents.

    Returns a dict with ``methods`` and ``attributes`` (names that get their own entries:
    public, defined by a tiltlab class, attributes not already described in the class
    docstring), ``external`` (``(name, owner)`` pairs for public members that a
    third-party base class defines) and ``undocumented`` (own members without a
    docstring, for the maintainers).
    """
    cls = _import_object(fullname)
    described = _docstring_attributes(cls)
    # attributes a tiltlab base class describes in its docstring: named, linked to it
    inherited: dict[str, list[str]] = {}
    for base in cls.__mro__[1:]:
        if _is_tiltlab(base):
            for name in sorted(_docstring_attributes(base) - described):
                if hasattr(cls, name) and not any(name in v for v in inherited.values()):
                    inherited.setdefault(f"{base.__module__}.{base.__qualname__}", []).append(name)
    inherited_names = {n for v in inherited.values() for n in v}
    methods, attributes, external, undocumented = [], [], [], []
    is_enum = isinstance(cls, enum.EnumMeta)
    names = set(dir(cls)) | {n for k in cls.__mro__ if _is_tiltlab(k) for n in vars(k)}
    for name in sorted(names):
        if name.startswith("_"):
            continue
        owner = _defining_class(cls, name)
        if owner is None or owner is object:
            continue
        raw = vars(owner)[name]
        if is_enum and isinstance(getattr(cls, name), cls):
            continue  # members are listed by enum_members
        wrapped = _conditional_method(raw)
        if wrapped is not None:  # a tiltlab method behind scikit-learn's available_if
            methods.append(name)
            if not inspect.getdoc(wrapped):
                undocumented.append(name)
            continue
        if not _is_tiltlab(owner) or not _is_tiltlab(type(raw)) and _foreign_descriptor(raw):
            if not _is_tiltlab(owner):
                where = f"{owner.__module__}.{owner.__qualname__}"
            else:  # put on the class by a third-party hook (scikit-learn's metadata routing)
                where = type(raw).__module__
            if where.split(".")[0] in _PATTERNS:
                external.append((name, where))
            continue
        if isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
            methods.append(name)
            if not inspect.getdoc(getattr(cls, name)):
                undocumented.append(name)
        elif name not in described and name not in inherited_names:
            attributes.append(name)
            if not inherited_attribute_doc(cls, name):
                undocumented.append(name)
    return {
        "methods": methods,
        "attributes": attributes,
        "attribute_rows": [_attribute_row(cls, name) for name in attributes],
        "external": _external_by_owner(external),
        "undocumented": undocumented,
        "has_attributes_section": bool(described),
        "many_members": _MANY_MEMBERS,
        "base_attributes": sorted(inherited.items()),
    }


def _attribute_doc(owner, name, raw) -> str:
    if isinstance(raw, property) or type(raw).__module__ == "enum":
        return inspect.getdoc(raw) or ""
    from sphinx.pycode import ModuleAnalyzer

    docs: dict = {}
    try:
        docs = ModuleAnalyzer.for_module(owner.__module__).find_attr_docs()
    except Exception:
        pass
    if (owner.__qualname__, name) not in docs:
        # a class re-exported under another module (``__module__`` rewritten): read the
        # ``#:`` comments of the file that defines it
        source = _defining_file(owner)
        try:
            docs = ModuleAnalyzer.for_file(source, owner.__module__).find_attr_docs()
        except Exception:
            return ""
    return "\n".join(docs.get((owner.__qualname__, name), []))


def _defining_file(cls) -> str | None:
    """The source file that defines ``cls``, read from its functions' code (the class's
    ``__module__`` may name the package that re-exports it)."""
    for value in vars(cls).values():
        fn = getattr(value, "fget", None) or getattr(value, "__func__", None) or value
        code = getattr(fn, "__code__", None)
        if code is not None:
            return code.co_filename
    return None


def _sphinx_finds_doc(cls, name: str) -> bool:
    """Whether autodoc shows a description for attribute ``name`` of ``cls`` by itself
    (a ``#:`` comment found through a class's ``__module__`` along the MRO), or fires
    ``autodoc-process-docstring`` for it (a descriptor: :func:`fill_attribute_doc`)."""
    from sphinx.pycode import ModuleAnalyzer

    for klass in cls.__mro__:
        try:
            docs = ModuleAnalyzer.for_module(klass.__module__).find_attr_docs()
        except Exception:
            continue
        if (klass.__qualname__, name) in docs:
            return True
    return inspect.isdatadescriptor(inspect.getattr_static(cls, name, None))


def _attribute_row(cls, name: str) -> tuple[str, str, list[str]]:
    """``(name, summary, content)`` of an attribute: the summary shown in the class's
    table (the description's first paragraph, on one line) and the lines to give its
    ``autoattribute`` entry where autodoc would show none (else empty)."""
    text = inherited_attribute_doc(cls, name)
    paragraph = text.strip().split("\n\n")[0]
    summary = " ".join(line.strip() for line in paragraph.splitlines())
    content = [] if _sphinx_finds_doc(cls, name) else text.strip().splitlines()
    return name, summary, content


def _section_doc(cls, name: str) -> str:
    """The description of ``name`` in the numpydoc Attributes or Parameters section of
    ``cls``'s docstring (a dataclass field is often described as a parameter)."""
    from numpydoc.docscrape import NumpyDocString

    text = inspect.getdoc(cls) or ""
    # the solvers list their options under "Options" (docs/conf.py renders it as numpydoc's
    # "Other Parameters", which is what numpydoc parses)
    text = text.replace("Options\n-------\n", "Other Parameters\n----------------\n")
    try:
        doc = NumpyDocString(text)
    except Exception:
        return ""
    for section in ("Attributes", "Parameters", "Other Parameters"):
        for param in doc[section]:
            if name in (part.strip().lstrip("*") for part in param.name.split(",")):
                return " ".join(line.strip() for line in param.desc).strip()
    return ""


def inherited_attribute_doc(cls, name: str) -> str:
    """The documentation of attribute ``name`` of ``cls``: its own (a property's
    docstring, a ``#:`` comment), else the first that a tiltlab class along the MRO gives
    (a subclass that only overrides a value, ``label_kind = "binary"``), else the
    description in a class docstring's Attributes or Parameters section."""
    for klass in cls.__mro__:
        if not _is_tiltlab(klass) or name not in vars(klass):
            continue
        text = _attribute_doc(klass, name, vars(klass)[name])
        if text:
            return text
    for klass in cls.__mro__:
        if _is_tiltlab(klass):
            text = _section_doc(klass, name)
            if text:
                return text
    return ""


def _reexported_data_doc(name: str, obj) -> str:
    """The ``#:`` comment of a module constant re-exported by a package: read in the
    submodule that defines it (autodoc reads only the package's own file)."""
    from sphinx.pycode import ModuleAnalyzer

    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return ""
    candidates = [module_name]
    if hasattr(module, "__path__"):
        candidates += [i.name for i in pkgutil.walk_packages(module.__path__, module_name + ".")]
    for candidate in candidates:
        sub = sys.modules.get(candidate)
        if sub is None or getattr(sub, attr, None) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(candidate).find_attr_docs()
        except Exception:
            continue
        if ("", attr) in docs:
            return "\n".join(docs[("", attr)])
    return ""


def fill_attribute_doc(app, what, name, obj, options, lines):
    """``autodoc-process-docstring``: an attribute without documentation of its own
    takes what :func:`inherited_attribute_doc` finds (no empty row in the class tables)."""
    if what == "data" and not any(line.strip() for line in lines):
        text = _reexported_data_doc(name, obj)
        if text:
            lines[:] = text.splitlines() + [""]
        return
    if what not in ("attribute", "property") or any(line.strip() for line in lines):
        return
    owner_name, _, attr = name.rpartition(".")
    try:
        owner = _import_object(owner_name)
    except LookupError:
        return
    if not inspect.isclass(owner):
        return
    text = inherited_attribute_doc(owner, attr)
    if text:
        lines[:] = text.splitlines() + [""]
    elif _is_tiltlab(owner):  # an empty row in the class's table: fails the -W build
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            f"{name}: attribute without a description (give it a docstring, a #: comment "
            "or an entry in its class's Attributes section)"
        )


def _conditional_method(raw):
    """The tiltlab function behind a descriptor that exposes it conditionally
    (scikit-learn's ``available_if``: ``predict_proba`` only for probabilistic losses),
    else None."""
    fn = getattr(raw, "fn", None)
    if _foreign_descriptor(raw) and inspect.isfunction(fn) and _is_tiltlab(fn):
        return fn
    return None


#: third-party base classes documented under a public name other than their own path
_PUBLIC_NAMES = {"torch.nn.modules.module.Module": "torch.nn.Module"}
#: from this many inherited members on, a base class is named with a count, not a list
_MANY_MEMBERS = 12


def _foreign_descriptor(raw) -> bool:
    """Whether ``raw`` is a descriptor object of a third-party library."""
    if inspect.isfunction(raw) or isinstance(raw, (property, staticmethod, classmethod)):
        return False
    top = (type(raw).__module__ or "").split(".")[0]
    return top in _PATTERNS


def _external_by_owner(pairs):
    """``(owner, names, linkable)``: linkable when the owner has a public documented path.

    Members from private third-party modules are grouped under one label per library
    (scikit-learn's metadata-routing methods under ``"scikit-learn metadata routing"``).
    """
    by_owner: dict[tuple[str, bool], list[str]] = {}
    for name, owner in pairs:
        owner = _PUBLIC_NAMES.get(owner, owner)
        linkable = not any(p.startswith("_") for p in owner.split("."))
        if not linkable:
            owner = owner.split(".")[0]
            if "metadata" in name or name.startswith("set_") and name.endswith("_request"):
                owner = "scikit-learn metadata routing"
        by_owner.setdefault((owner, linkable), []).append(name)
    return [
        (owner, sorted(names), linkable) for (owner, linkable), names in sorted(by_owner.items())
    ]


def enum_members(fullname: str) -> list[tuple[str, int, str]]:
    """``(name, value, description)`` of each member of the enumeration ``fullname``.

    The description is the member's ``describe()`` when it has one, else its docstring.
    """
    cls = _import_object(fullname)
    if not isinstance(cls, enum.EnumMeta):
        return []
    out = []
    for member in cls:
        text = member.describe() if hasattr(member, "describe") else ""
        out.append((member.name, member.value, text))
    return out


# --- API pages for modules without a hand-written page ---------------------------------


def public_modules() -> list[str]:
    """``tiltlab``'s public top-level modules (no underscore in the name)."""
    import tiltlab

    return sorted(
        f"tiltlab.{info.name}"
        for info in pkgutil.iter_modules(tiltlab.__path__)
        if not info.name.startswith("_")
    )


def module_page(module_name: str) -> str:
    """An API page (reStructuredText) for ``module_name``, listing its ``__all__``."""
    short = module_name.split(".", 1)[1]
    title = f"``{module_name}``"
    lines = [f".. _api-{short}:", "", title, "=" * len(title), ""]
    lines += [f".. automodule:: {module_name}", "   :no-members:", ""]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        lines += [f"This module needs a package that is not part of this build ({exc.name})."]
        return "\n".join(lines) + "\n"
    names = [n for n in getattr(module, "__all__", ()) if not inspect.ismodule(getattr(module, n))]
    if names:
        lines += [f".. currentmodule:: {module_name}", "", ".. autosummary::"]
        lines += ["   :toctree: generated/", ""] + [f"   {n}" for n in names]
    return "\n".join(lines) + "\n"


def module_pages(api_dir: Path) -> dict[str, str]:
    """Pages (file name -> text) for the public modules that ``api_dir`` has no page for."""
    have = "\n".join(p.read_text(encoding="utf-8") for p in api_dir.glob("*.rst"))
    out = {}
    for name in public_modules():
        if f".. automodule:: {name}\n" not in have:
            out[f"{name.split('.', 1)[1]}.rst"] = module_page(name)
    return out


def write_module_pages(api_dir: Path, target: Path) -> None:
    """Write :func:`module_pages` into ``target`` (stale pages there are removed)."""
    target.mkdir(parents=True, exist_ok=True)
    pages = module_pages(api_dir)
    for old in target.glob("*.rst"):
        if old.name not in pages:
            old.unlink()
    for fname, text in pages.items():
        path = target / fname
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


# --- cross-references --------------------------------------------------------------------


def _canonical_names(env) -> dict:
    """id of a documented tiltlab object -> the name it is documented under (cached)."""
    cache = getattr(env, "_tiltlab_canonical", None)
    if cache is not None and cache[0] == len(env.get_domain("py").objects):
        return cache[1]
    ids = {}
    for fullname, entry in env.get_domain("py").objects.items():
        if not fullname.startswith("tiltlab") or entry.objtype == "attribute":
            continue
        try:
            obj = _import_object(fullname)
        except LookupError:
            continue
        if isinstance(obj, (int, float, str, bytes, bool, type(None))):
            continue  # interned values: their ids do not identify a name
        ids.setdefault(id(obj), fullname)
    env._tiltlab_canonical = (len(env.get_domain("py").objects), ids)
    return ids


def _candidates(node) -> list[str]:
    target = node["reftarget"].lstrip("~.")
    module = node.get("py:module") or ""
    cls = node.get("py:class") or ""
    out = []
    if module and cls:
        out.append(f"{module}.{cls}.{target}")
    if module:
        out.append(f"{module}.{target}")
    out.append(target)
    return out


def _tiltlab_reference(app, env, node, contnode):
    domain = env.get_domain("py")
    ids = _canonical_names(env)
    for name in _candidates(node):
        if not name.startswith("tiltlab"):
            continue
        try:
            obj = _import_object(name)
        except LookupError:
            continue
        canonical = ids.get(id(obj))
        if canonical is None and "." in name:
            # a member of a class documented under another path
            owner_name, _, member = name.rpartition(".")
            try:
                owner = _import_object(owner_name)
            except LookupError:
                owner = None
            if inspect.isclass(owner) and id(owner) in ids:
                candidate = f"{ids[id(owner)]}.{member}"
                if candidate in domain.objects:
                    canonical = candidate
        if canonical is not None:
            return _xref(app, env, node, contnode, canonical)
        if inspect.ismodule(obj):
            # an implementation module: its name as text, linked to its package's page
            parent = name
            while "." in parent:
                parent = parent.rpartition(".")[0]
                if parent in domain.modules:
                    ref = domain.resolve_xref(
                        env, node["refdoc"], app.builder, "mod", parent, node, contnode
                    )
                    if ref is not None:
                        return ref
    return _search_reference(app, env, node, contnode)


def _xref(app, env, node, contnode, fullname, role="obj"):
    return env.get_domain("py").resolve_xref(
        env, node["refdoc"], app.builder, role, fullname, node, contnode
    )


def _search_reference(app, env, node, contnode):
    """A short name documented once in tiltlab (as ``:func:`.name``` would find it).

    When several members match, and all are members of subclasses of the class whose
    docstring names them (a base class naming what its subclasses offer), the first is
    linked.
    """
    target = node["reftarget"].lstrip("~.")
    if "." in target:
        return None
    domain = env.get_domain("py")
    matches = sorted(
        name
        for name in domain.objects
        if name.startswith("tiltlab.") and name.endswith("." + target)
    )
    if len(matches) == 1:
        return _xref(app, env, node, contnode, matches[0])
    context = node.get("py:class")
    if matches and context:
        try:
            base = _import_object(f"{node.get('py:module')}.{context}")
            owners = [_import_object(m.rpartition(".")[0]) for m in matches]
        except LookupError:
            return None
        if all(inspect.isclass(o) and issubclass(o, base) for o in owners):
            return _xref(app, env, node, contnode, matches[0])
    return None


def _external_reference(node, contnode):
    target = node["reftarget"].lstrip("~.")
    top = target.split(".")[0]
    stdlib = top in sys.stdlib_module_names
    if top not in _PATTERNS and top not in _SPECIAL and not stdlib:
        return None
    if top not in _OPTIONAL:
        try:
            obj = _import_object(target)
        except LookupError:
            return None  # a typo: let Sphinx warn
    else:
        obj = None
    if stdlib:
        module = target if obj is not None and inspect.ismodule(obj) else None
        if module is None:
            module = getattr(obj, "__module__", None) or top
            module = module.lstrip("_") if module.lstrip("_") in sys.stdlib_module_names else top
        uri = f"https://docs.python.org/3/library/{module}.html"
        if target != module:
            uri += f"#{target}"
    elif target in _SPECIAL:
        uri = _SPECIAL[target]
    elif obj is not None and inspect.ismodule(obj):
        uri = _SPECIAL.get(top, _PATTERNS[top].format(name=target))
    elif obj is not None and not inspect.isclass(obj) and "." in target and top == "sklearn":
        owner = target.rpartition(".")[0]
        owner_obj = _import_object(owner)
        if inspect.isclass(owner_obj):
            uri = _PATTERNS[top].format(name=owner) + f"#{target}"
        else:
            uri = _PATTERNS[top].format(name=target)
    else:
        uri = _PATTERNS[top].format(name=target)
    ref = nodes.reference("", "", internal=False, refuri=uri, reftitle=target)
    ref += contnode
    return ref


def resolve_missing(app, env, node, contnode):
    """``missing-reference`` handler: see the module docstring."""
    if node.get("refdomain") != "py":
        return None
    return _tiltlab_reference(app, env, node, contnode) or _external_reference(node, contnode)


class ContextFunction:
    """A function of this module, callable from a template and picklable by name.

    ``autosummary_context`` is part of Sphinx's configuration, which Sphinx caches only
    when it holds no function objects.
    """

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        return globals()[self.name](*args, **kwargs)

    def __repr__(self) -> str:
        return f"ContextFunction({self.name!r})"


# --- backend support -------------------------------------------------------------------

#: what each kind of function accepts and returns (the sentence under "Backends")
BACKEND_TEXT = {
    "all": (
        "NumPy, CuPy, PyTorch, array-api-strict and Dask arrays; the result is in the "
        "input's library, dtype and device."
    ),
    "host": (
        "arrays of any supported library (or objects holding them); the computation runs "
        "on the host in NumPy and the results are NumPy arrays or Python numbers."
    ),
    "numpy": "NumPy: takes and returns host data (NumPy arrays, Python numbers).",
    "dask": (
        "Dask arrays (chunks may be NumPy or CuPy arrays); the client-side work runs in NumPy."
    ),
    "torch": "PyTorch tensors on any device; the result is a tensor on the input's device.",
    "none": "no arrays: works on Python objects only.",
}
#: the kind of every public function, by module (the first matching prefix wins); the
#: "all" entries are those the test suite runs on every backend
BACKEND_SUPPORT = {
    "tiltlab.tilted_risk": "all",
    "tiltlab.tilted_weights": "all",
    "tiltlab.hierarchical_risk": "all",
    "tiltlab.hierarchical_weights": "all",
    "tiltlab.tilt_for_ess": "all",
    "tiltlab.tilted_advantage": "all",
    "tiltlab.tilt_for_kl": "all",
    "tiltlab.minimize_dro": "all",
    "tiltlab.minimize": "all",
    "tiltlab.tilt_path": "all",
    "tiltlab.TiltedObjective": "all",
    "tiltlab.TiltPath": "all",
    "tiltlab.OptimizeResult": "all",
    "tiltlab.Status": "none",
    "tiltlab.objective": "all",
    "tiltlab.accumulator": "all",
    "tiltlab.segments": "all",
    "tiltlab.risk": "all",
    "tiltlab.losses": "all",
    "tiltlab.solvers": "all",
    "tiltlab.bounds.quantile_curves": "host",
    "tiltlab.bounds.min_tail_fraction": "host",
    "tiltlab.bounds": "all",
    "tiltlab.diagnostics.classify_stationary_point": "host",
    "tiltlab.diagnostics.fit_step_size_rule": "host",
    "tiltlab.diagnostics.format_group_report": "host",
    "tiltlab.diagnostics": "all",
    "tiltlab.theory.format_checks": "none",
    "tiltlab.theory": "host",
    "tiltlab.plot": "host",
    "tiltlab.estimators": "host",
    "tiltlab.minibatch.MLMCBatchSampler": "none",
    "tiltlab.minibatch.level_probabilities": "numpy",
    "tiltlab.minibatch.linear_schedule": "none",
    "tiltlab.minibatch": "all",
    "tiltlab.minibatch.checks": "none",
    "tiltlab.torch": "torch",
    "tiltlab.distributed": "dask",
    "tiltlab.baselines": "numpy",
    "tiltlab.datasets": "numpy",
    "tiltlab.reproduce": "numpy",
    "tiltlab.cli": "none",
    "tiltlab.testing": "all",
}


def backend_kind(fullname: str) -> str | None:
    """The :data:`BACKEND_SUPPORT` kind of the function documented as ``fullname``."""
    for prefix in sorted(BACKEND_SUPPORT, key=len, reverse=True):
        if fullname == prefix or fullname.startswith(prefix + "."):
            return BACKEND_SUPPORT[prefix]
    return None


def add_backend_line(app, what, name, obj, options, lines):
    """``autodoc-process-docstring``: a "Backends" paragraph on every function's page."""
    if what != "function" or not name.startswith("tiltlab"):
        return
    kind = backend_kind(name)
    if kind is None:
        return
    # at the end of the extended summary, before the first numpydoc section
    at = next(
        (
            i
            for i in range(1, len(lines) - 1)
            if lines[i].strip() and set(lines[i + 1].strip()) == {"-"} and not lines[i - 1].strip()
        ),
        len(lines),
    )
    lines[at:at] = [f"**Backends:** {BACKEND_TEXT[kind]}", ""]
