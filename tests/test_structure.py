"""Guards for the package layout: public import paths, layering and sizes.

``tiltlab.bounds``, ``tiltlab.losses`` and ``tiltlab.risk`` were single modules and are now
subpackages. The names below are the ones the single modules exposed, written out by hand
(not read from the package), so that a name dropped from a package ``__init__`` fails here.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pickle
import pkgutil
import sys
from pathlib import Path

import pytest

import tiltlab

PUBLIC = {
    "tiltlab": [
        "tilted_risk",
        "tilted_weights",
        "hierarchical_risk",
        "hierarchical_weights",
        "tilt_for_ess",
        "tilted_advantage",
        "tilt_for_kl",
        "TiltedObjective",
        "minimize",
        "minimize_dro",
        "tilt_path",
        "TiltPath",
        "OptimizeResult",
        "Status",
        "bounds",
        "diagnostics",
        "losses",
        "plot",
        "theory",
    ],
    "tiltlab.bounds": [
        "tail_fraction",
        "k_loss",
        "value_at_risk",
        "superquantile",
        "tilted_tail_bound",
        "chernoff_bound",
        "k_loss_bound",
        "entropic_value_at_risk",
        "kl_dro_dual",
        "worst_case_distribution",
        "kl_divergence",
        "quantile_curves",
        "min_tail_fraction",
    ],
    "tiltlab.losses": [
        "Loss",
        "SquaredLoss",
        "AbsoluteLoss",
        "HuberLoss",
        "PoissonLoss",
        "PinballLoss",
        "LogisticLoss",
        "HingeLoss",
        "SquaredHingeLoss",
        "MultinomialLoss",
        "CallableLoss",
        "FairPCALoss",
        "PointEstimationLoss",
        "LOSS_NAMES",
        "get_loss",
    ],
    "tiltlab.risk": [
        "tilted_risk",
        "tilted_weights",
        "hierarchical_risk",
        "hierarchical_weights",
        "tilt_for_ess",
        "tilted_advantage",
        "tilt_for_kl",
    ],
    "tiltlab.theory": [
        "PropertyCheck",
        "PROPERTIES",
        "check_path",
        "format_checks",
        "tradeoff_curves",
    ],
}

# Names outside ``__all__`` that other modules (tiltlab.objective, tiltlab.bounds) or users
# of the single-module tiltlab.risk import from it.
RISK_EXTRA = [
    "HIERARCHICAL_RISK",
    "HIERARCHICAL_WEIGHTS",
    "TILTED_RISK",
    "TILTED_WEIGHTS",
    "GroupTree",
    "build_tree",
    "broadcast_groups",
    "check_group_mass",
    "hierarchy_eval",
    "prepare_losses",
    "prepare_prior",
    "prepare_tilt",
    "prepare_tilts",
    "risk_and_weights",
    "risk_weights_scalar",
    "group_level",
    "level_masses",
    "segment_sum",
    "support_range",
    "risk_kernel",
    "weights_kernel",
    "prior_mean",
    "_GRID_CHUNK",
]

# Private names of the single-module ``tiltlab.theory``, now in its submodules.
THEORY_EXTRA = [
    "_SAFETY",
    "_EPS",
    "_NOT_A_THEOREM",
    "_Violations",
    "_host",
    "_PathData",
    "_sample_grad_norms",
    "_sample_vjp",
    "_tilted_risks",
    "_tilted_weights",
    "_entropy",
    "_check_stationarity",
    "_check_objective_monotone",
    "_check_optimal_objective",
    "_pen_label",
    "_check_risk_sign",
    "_check_risk_sign_local",
    "_monotone",
    "_parts_tuple",
    "_parts_note",
    "_two_parts",
    "_check_max_mean",
    "_check_min_mean",
    "_variance_parts",
    "_check_variance",
    "_zero_point",
    "_local_tol",
    "_check_variance_local",
    "_cosine_parts",
    "_COSINE_REF",
    "_check_cosine",
    "_check_cosine_local",
    "_entropy_parts",
    "_uniform_only",
    "_ENTROPY_REF",
    "_check_entropy",
    "_check_entropy_local",
    "_directions",
    "_check_gradient_fd",
    "_check_hessian_fd",
    "_check_solution_derivative",
    "_check_quantiles",
    "_CHECKS",
]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_importable(module):
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    # `from module import *` gives exactly __all__
    ns: dict = {}
    exec(f"from {module} import *", ns)
    assert sorted(k for k in ns if not k.startswith("__")) == sorted(PUBLIC[module])


def test_risk_helpers_importable():
    import tiltlab.risk as risk

    missing = [name for name in RISK_EXTRA if not hasattr(risk, name)]
    assert not missing


def test_theory_helpers_importable():
    # the private helpers live in the theory package's modules (not re-exported by it)
    import tiltlab.theory as theory

    modules = [
        importlib.import_module(f"tiltlab.theory.{info.name}")
        for info in pkgutil.iter_modules(theory.__path__)
    ]
    missing = [name for name in THEORY_EXTRA if not any(hasattr(m, name) for m in modules)]
    assert not missing
    # the function, not the submodule that holds it
    assert callable(theory.check_path) and callable(theory.tradeoff_curves)


@pytest.mark.parametrize(
    "package", ["tiltlab.bounds", "tiltlab.losses", "tiltlab.risk", "tiltlab.theory"]
)
def test_subpackage_modules_document_and_declare(package):
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{package}.{info.name}")
        assert mod.__doc__ and mod.__doc__.strip(), f"{mod.__name__} has no docstring"
        assert isinstance(mod.__all__, list), f"{mod.__name__} has no __all__"
        for name in mod.__all__:
            # every public name of a submodule is re-exported by its package
            assert getattr(pkg, name) is getattr(mod, name), f"{package}.{name}"


def test_old_class_paths_unpickle():
    # A pickle written when the classes lived in tiltlab.losses / tiltlab.risk refers to
    # them as "tiltlab.losses.SquaredLoss"; such global references must still resolve.
    for module, names in {
        "tiltlab.losses": [n for n in PUBLIC["tiltlab.losses"] if n.endswith("Loss")],
        "tiltlab.risk": ["GroupTree"],
    }.items():
        for name in names:
            cls = pickle.loads(f"c{module}\n{name}\n.".encode())
            assert cls is getattr(importlib.import_module(module), name)
            # and the path pickle writes today resolves to the same class
            assert getattr(sys.modules[cls.__module__], cls.__qualname__) is cls
    loss = tiltlab.losses.HuberLoss(delta=2.5)
    back = pickle.loads(pickle.dumps(loss))
    assert type(back) is tiltlab.losses.HuberLoss and back.delta == 2.5


# ----------------------------------------------------------------------------------------
# layering: the import graph, read from the source (imports inside functions included)
# ----------------------------------------------------------------------------------------

#: the layer of each top-level module or subpackage; an import may go to the same layer
#: or a lower one, never up. ``""`` is ``tiltlab/__init__.py`` itself.
LAYERS = {
    # ground floor: namespaces and devices, dispatch tables, device kernels, test helpers
    "_compat": 0,
    "_dispatch": 0,
    "testing": 0,
    # the tilted reduction and segment (group) sums
    "accumulator": 1,
    "segments": 1,
    "losses": 2,
    "risk": 3,
    # the objective and its engines
    "objective": 4,
    "solvers": 5,
    # backends: they register into the tables below them (distributed: Dask; _cupy: every
    # CuPy registration, the CUDA sources, kernels and engine; _cpu_kernels: every numba
    # registration, the compiled CPU kernels, their engine, segment kernels and Dask route)
    "_cupy": 6,
    "_cpu_kernels": 6,
    # tools built on solved objectives; distributed registers into the tables below it
    "distributed": 6,
    "diagnostics": 6,
    "bounds": 6,
    "theory": 6,
    # applications
    "estimators": 7,
    "reproduce": 7,
    "datasets": 7,
    "baselines": 7,
    "plot": 7,
    # training helpers for minibatch models (torch: the PyTorch module form)
    "minibatch": 7,
    "torch": 7,
    # the top: the package itself, the wiring of optional backends, the command line
    "_backends": 8,
    "cli": 8,
    "": 8,
}

#: edges that break the layering today and are being removed; the list only shrinks
PENDING_EDGES: set[tuple[str, str]] = set()

#: modules other than tiltlab._compat that import array_api_compat today (to go through
#: tiltlab._compat instead); the list only shrinks
PENDING_ARRAY_API_COMPAT: set[str] = set()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The parsed source of ``path`` (parsed once per process; the checks only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _modules() -> dict[str, tuple[Path, bool]]:
    root = Path(tiltlab.__file__).parent
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _targets(module: str, is_pkg: bool, node, modules) -> list[str]:
    """The tiltlab modules an import statement loads (``from pkg import name`` loads the
    submodule ``pkg.name`` when there is one, else ``pkg``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
    out = []
    for name in names:
        if name != "tiltlab" and not name.startswith("tiltlab."):
            continue
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


def _lazy_target(node, modules) -> str | None:
    """The module a lazy registration names (``table.register_lazy(library, "tiltlab.x")``
    or ``importlib.import_module("tiltlab.x")``): an import made later, by name, which
    the layering counts like any other."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    attr = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if attr == "register_lazy" and len(node.args) in (2, 3):  # by table, or by its name
        arg = node.args[-1]
    elif attr == "import_module" and len(node.args) == 1:
        arg = node.args[0]
    else:
        return None
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    name = arg.value
    if not name.startswith("tiltlab."):
        return None
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """tiltlab's import edges, and the outside packages each module imports."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    outside: dict[str, set[str]] = {m: set() for m in modules}
    for module, (path, is_pkg) in modules.items():
        for node in ast.walk(_tree(path)):
            lazy = _lazy_target(node, modules)
            if lazy is not None and lazy != module:
                edges[module].add(lazy)
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(module, is_pkg, node, modules):
                if target != module:
                    edges[module].add(target)
            if isinstance(node, ast.Import):
                outside[module].update(a.name.split(".")[0] for a in node.names)
            elif not node.level and node.module:
                outside[module].add(node.module.split(".")[0])
    return edges, outside


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _without_pending(edges):
    return {a: {b for b in bs if (a, b) not in PENDING_EDGES} for a, bs in edges.items()}


def test_every_module_has_a_layer():
    edges, _ = _import_graph()
    unknown = sorted({_unit(m) for m in edges} - set(LAYERS))
    assert not unknown, f"give these a layer in LAYERS (tests/test_structure.py): {unknown}"


def test_no_upward_import():
    edges, _ = _import_graph()
    upward = [
        f"{a} (layer {LAYERS[_unit(a)]}) imports {b} (layer {LAYERS[_unit(b)]})"
        for a, bs in sorted(_without_pending(edges).items())
        for b in sorted(bs)
        if LAYERS[_unit(a)] < LAYERS[_unit(b)]
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules():
    cycles = _cycles(_without_pending(_import_graph()[0]))
    assert not cycles, f"import cycles between modules: {cycles}"


def test_no_import_cycle_between_subpackages():
    units: dict[str, set[str]] = {}
    for a, bs in _without_pending(_import_graph()[0]).items():
        units.setdefault(_unit(a), set())
        units[_unit(a)].update(_unit(b) for b in bs if _unit(b) != _unit(a))
    cycles = _cycles(units)
    assert not cycles, f"import cycles between subpackages: {cycles}"


def test_pending_edges_still_exist():
    # a removed edge must leave the list (so that it cannot come back unnoticed)
    edges = _import_graph()[0]
    gone = sorted(e for e in PENDING_EDGES if e[1] not in edges.get(e[0], ()))
    assert not gone, f"remove from PENDING_EDGES: {gone}"


def test_the_graph_sees_imports_inside_functions():
    # the builder is what the layering tests rest on: check it on known edges
    edges = _import_graph()[0]
    assert "tiltlab.objective.engines" in edges["tiltlab._backends"]
    # lazy registrations are edges: the layering sees who loads the CuPy backend
    assert "tiltlab._cupy" in edges["tiltlab._backends"]
    assert "tiltlab._cpu_kernels" in edges["tiltlab._backends"]
    assert "tiltlab.solvers" in edges["tiltlab.plot"]  # only inside a function
    assert "tiltlab.objective.blocks" in edges["tiltlab.objective.engines.onepass"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_compat_imports_array_api_compat():
    _, outside = _import_graph()
    users = {
        m
        for m, pkgs in outside.items()
        if "array_api_compat" in pkgs and not m.startswith("tiltlab._compat")
    }
    assert users <= PENDING_ARRAY_API_COMPAT, sorted(users - PENDING_ARRAY_API_COMPAT)


def test_nothing_outside_the_objective_reads_its_private_state():
    private = (
        "_prior",
        "_weights_in",
        "_tilts_list",
        "_groups",
        "_set_tree",
        "_dask_plan",
        "_problem",
        "_block_rows",
    )
    root = Path(tiltlab.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("objective/"):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{rel}:{node.lineno} .{node.attr}")
    assert not found, found


def _private_kernel_uses(rel: str, tree: ast.AST) -> list[str]:
    """Uses of private names of ``tiltlab._cpu_kernels`` in one module: imports of its
    private modules or names, and attributes ``_cpu_kernels._x``."""
    package = ["tiltlab"] + rel[: -len(".py")].split("/")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            parts = mod.split(".")
            if parts[:2] == ["tiltlab", "_cpu_kernels"]:
                if any(p.startswith("_") for p in parts[2:]):
                    found.append(f"{rel}:{node.lineno} from {mod}")
                elif len(parts) == 2:
                    found += [
                        f"{rel}:{node.lineno} {a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
        elif isinstance(node, ast.Import):
            found += [
                f"{rel}:{node.lineno} import {a.name}"
                for a in node.names
                if a.name.startswith("tiltlab._cpu_kernels._")
            ]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and isinstance(node.value, ast.Name)
            and node.value.id == "_cpu_kernels"
        ):
            found.append(f"{rel}:{node.lineno} _cpu_kernels.{node.attr}")
    return found


def test_nothing_outside_the_cpu_kernels_uses_their_private_names():
    """The compiled CPU kernels are used through their public names (``FusedProblem``,
    its ``block_states`` and ``group_states``, ``segments``...): the kernels' bodies,
    launcher and state layout may change without their callers."""
    root = Path(tiltlab.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("_cpu_kernels/"):
            continue
        found += _private_kernel_uses(rel, _tree(path))
    assert not found, found


def test_the_private_kernel_rule_sees_each_form():
    src = (
        "from .._cpu_kernels._launch import _call\n"
        "from .. import _cpu_kernels\n"
        "from tiltlab._cpu_kernels import _run_vg, FusedProblem\n"
        "import tiltlab._cpu_kernels._prepare\n"
        "x = _cpu_kernels._kernels()\n"
        "from .._cpu_kernels import segments\n"
    )
    found = _private_kernel_uses("distributed/_x.py", ast.parse(src))
    assert [f.split(" ", 1)[1] for f in found] == [
        "from tiltlab._cpu_kernels._launch",
        "_run_vg",
        "import tiltlab._cpu_kernels._prepare",
        "_cpu_kernels._kernels",
    ]


#: the private names one subpackage may still take from another (importing module, the
#: private module or name it reaches); each is named, with its reason, in CONTRIBUTING.md
#: (Layers). The ground floor (``_compat``, ``_dispatch``) is not private to anyone.
ALLOWED_PRIVATE_IMPORTS: set[tuple[str, str]] = {
    ("tiltlab", "tiltlab._backends"),
}

#: top-level modules that every layer may use, private names or not
_GROUND_FLOOR = ("_compat", "_dispatch")


def _private_imports(module: str, is_pkg: bool, tree: ast.AST) -> set[tuple[str, str]]:
    """The private names one module takes from another subpackage: ``(module, target)``
    for each import (inside functions too; ``from ..x import _y``, ``from ..x._y import
    z``, ``import tiltlab.x._y``) whose path below ``tiltlab`` leaves the module's own
    subpackage and passes a name starting with one underscore; ``target`` is that path
    up to the first such name."""
    parts = module.split(".")
    unit = _unit(module)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts if is_pkg else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            paths = [f"{mod}.{a.name}".split(".") for a in node.names]
        elif isinstance(node, ast.Import):
            paths = [a.name.split(".") for a in node.names]
        else:
            continue
        for path in paths:
            if path[0] != "tiltlab" or len(path) < 2 or path[1] in (unit,) + _GROUND_FLOOR:
                continue
            for i, name in enumerate(path[1:], start=1):
                if name.startswith("_") and not name.startswith("__"):
                    found.add((module, ".".join(path[: i + 1])))
                    break
    return found


def _all_private_imports() -> set[tuple[str, str]]:
    found = set()
    for module, (path, is_pkg) in _modules().items():
        found |= _private_imports(module, is_pkg, _tree(path))
    return found


def test_private_names_stay_in_their_subpackage():
    """A subpackage takes another's public names only, except the few listed (each with
    its reason in CONTRIBUTING.md); the list only shrinks."""
    found = _all_private_imports()
    extra = sorted(found - ALLOWED_PRIVATE_IMPORTS)
    assert not extra, "private names taken across subpackages:\n" + "\n".join(
        f"{a} imports {b}" for a, b in extra
    )
    gone = sorted(ALLOWED_PRIVATE_IMPORTS - found)
    assert not gone, f"remove from ALLOWED_PRIVATE_IMPORTS: {gone}"


def test_the_private_import_rule_sees_each_form():
    src = (
        "from ..risk import _risk_kernel, tilted_risk\n"
        "from ..risk._dispatch import TILTED_RISK\n"
        "import tiltlab.solvers._external\n"
        "from .. import _cpu_kernels\n"
        "from .._compat import _private_helper\n"  # the ground floor
        "from ._chunk_engine import DECLINE\n"  # its own subpackage
        "from ..accumulator import TiltState\n"  # public
        "def f():\n"
        "    from ..reproduce._deep import check_device\n"
    )
    found = _private_imports("tiltlab.distributed._x", False, ast.parse(src))
    assert sorted(b for _, b in found) == [
        "tiltlab._cpu_kernels",
        "tiltlab.reproduce._deep",
        "tiltlab.risk._dispatch",
        "tiltlab.risk._risk_kernel",
        "tiltlab.solvers._external",
    ]
    # a package's own relative imports resolve from the package itself
    pkg = _private_imports("tiltlab.bounds", True, ast.parse("from ..risk import _wsum\n"))
    assert pkg == {("tiltlab.bounds", "tiltlab.risk._wsum")}


def test_only_the_cpu_kernels_import_numba():
    """numba is the compiled CPU backend's (``tiltlab/_cpu_kernels/``): every other module
    reaches the kernels through the tables the backend registers into."""
    _, outside = _import_graph()
    users = sorted(m for m, pkgs in outside.items()
                   if "numba" in pkgs and not m.startswith("tiltlab._cpu_kernels"))
    assert not users, users



# ----------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------

#: a module holds one concept: it may reach this size where that concept needs it, and is
#: split where its concepts part, never at a line count
MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 150
MAX_OBJECTIVE_CLASS_LINES = 350

#: modules allowed past the limit (none today); the list only shrinks
LARGE_MODULES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def test_module_and_function_sizes():
    root = Path(tiltlab.__file__).parent
    big, long = {}, {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        src = path.read_text(encoding="utf-8")
        n = src.count("\n")
        if n > MAX_MODULE_LINES and rel not in LARGE_MODULES:
            big[rel] = n
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                key = f"{rel}::{node.name}"
                if size > MAX_FUNCTION_LINES and key not in LONG_FUNCTIONS:
                    long[key] = size
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_objective_class_is_thin():
    from tiltlab.objective import _facade

    tree = ast.parse(Path(_facade.__file__).read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TiltedObjective"]
    size = cls.end_lineno - cls.lineno + 1
    assert size <= MAX_OBJECTIVE_CLASS_LINES, size


def test_import_tiltlab_is_light():
    # heavy and optional libraries are imported on first use, not by `import tiltlab`
    import subprocess
    import sys as _sys

    code = (
        "import sys, tiltlab; "
        "print(sorted({m.split('.')[0] + ('.' + m.split('.')[1] if m.count('.') else '') "
        "for m in sys.modules if m.split('.')[0] in "
        "('scipy', 'torch', 'numba', 'dask', 'distributed', 'sklearn', 'matplotlib', 'cupy', "
        "'tqdm')}))"
    )
    out = subprocess.run([_sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ----------------------------------------------------------------------------------------
# the tilted reduction's rule: one Python home
# ----------------------------------------------------------------------------------------

#: the packages whose code drives the tilted state (its eager form, the packed form, the
#: minibatch estimators, the PyTorch module, the risk functions)
RULE_DRIVERS = ("tiltlab.accumulator", "tiltlab.minibatch", "tiltlab.torch", "tiltlab.risk")
#: the one module that forms the small-tilt sums (``expm1`` of the shifted exponents) and
#: picks ``log1p`` of them near t = 0 (the generated CPU and CUDA kernels are its twins);
#: the eager state reads its regime on the host and takes its terms, merge factors and
#: logs from it
RULE_HOME = "tiltlab.accumulator.packed"
#: the reference of the state table's steps, generated from tiltlab/accumulator/state_table.py
RULE_GENERATED = ("tiltlab.accumulator._state_formulas",)
#: other formulas that use ``expm1``/``log1p`` in the driver packages, each with its reason
RULE_OTHER_FORMULAS = {
    "tiltlab.minibatch.steps:_variational_value": "the variational bound eta + expm1(g) / t",
    "tiltlab.torch._grouped:_numbers": "the constant log(1 - lam) of the running average",
    "tiltlab.torch._parallel:_numbers": "the constant log(1 - lam) of the running average",
    "tiltlab.risk.advantage:_advantage": "the advantage expm1(beta (r - R)) / beta",
    "tiltlab.risk.ess:_LogESS.kl": "the KL divergence's psi(v) = v expm1(v) - (expm1(v) - v)",
}


def _rule_uses() -> dict[str, list[int]]:
    """``module:function`` -> lines that name ``expm1`` or ``log1p`` (a call or a reference,
    as in ``apply(xp.expm1, u)``), in the driver packages."""
    uses: dict[str, list[int]] = {}
    for module, (path, _) in _modules().items():
        if not module.startswith(RULE_DRIVERS):
            continue

        def walk(node, stack, module=module):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    walk(child, [*stack, child.name])
                    continue
                named = (isinstance(child, ast.Attribute) and child.attr in ("expm1", "log1p")) or (
                    isinstance(child, ast.Name) and child.id in ("expm1", "log1p")
                )
                if named:
                    uses.setdefault(f"{module}:{'.'.join(stack)}", []).append(child.lineno)
                walk(child, stack)

        walk(_tree(path), [])
    return uses


def test_the_small_tilt_rule_has_one_python_home():
    uses = _rule_uses()
    stray = {
        where: lines
        for where, lines in uses.items()
        if where.split(":")[0] not in (RULE_HOME, *RULE_GENERATED)
        and where not in RULE_OTHER_FORMULAS
    }
    assert not stray, (
        f"expm1/log1p outside {RULE_HOME} (form the sums with its `exponent_terms` and take "
        f"the log with its `log_normaliser`, or list another formula in "
        f"RULE_OTHER_FORMULAS): {stray}"
    )
    assert not [w for w in RULE_OTHER_FORMULAS if w not in uses], "stale RULE_OTHER_FORMULAS"
    # the check sees a reference as well as a call, and the home itself
    assert any(w.startswith(RULE_HOME + ":") for w in uses)
    assert "tiltlab.accumulator.packed:normaliser_term" in uses


def test_torch_takes_no_private_name_of_minibatch():
    """The PyTorch module uses the minibatch estimators' public modules (`steps`,
    `checks`) and the packed state of the accumulator, no private module or name."""
    bad = []
    for module, (path, _) in _modules().items():
        if not module.startswith("tiltlab.torch"):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module:
                target = node.module
                names = [a.name for a in node.names]
                if target.startswith("tiltlab.minibatch") and (
                    any(p.startswith("_") for p in target.split("."))
                    or any(n.startswith("_") for n in names)
                ):
                    bad.append((module, target, names))
    assert not bad, bad
