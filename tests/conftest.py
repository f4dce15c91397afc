"""Backend fixture and test tiers.

Backend fixture: every test that takes ``xp`` runs once per installed backend.
Backends: numpy, array_api_strict, torch (CPU), dask.array, and cupy (only where a
GPU is present). Missing libraries are skipped, not failed. Mark a test
``@pytest.mark.skip_xp_backend("dask", reason=...)`` to skip one backend with a reason.
Its CuPy instances carry the ``gpu`` marker (they run on a device).

Tiers (``--tier`` or ``TILTLAB_TIER``; ``push`` by default):

- ``push``: each parametrized test function runs a covering design of its instances,
  the fewest (chosen greedily, deterministically) that meet every value of every
  parameter at least once, on the backends installed here (the instances that skip for
  want of a backend get a design of their own: a run without PyTorch records them).
  A parameter named in :data:`REPLICATES` (``seed``) repeats one check on other draws:
  the design meets one of its values, not each.
  The contract rows (``test_contract.py``) and tests marked ``push`` run in full; tests
  marked ``slow`` do not run; a test named on the command line (``file::test`` or
  ``file::test[id]``) runs as named.
- ``full``: every collected test.
- ``rest``: the full tier less the push tier (the push tier's complement, for a run
  after the push tier in the same environment).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections import defaultdict

import pytest
from _matrix import BACKENDS

# The tests compare the compiled CPU kernels with the generic path: a kernel not yet
# compiled must be compiled in the test's process, not handed to a background compile
# while NumPy serves the problem (which would make such a comparison vacuous). The tests
# of the background mode set the variable themselves.
os.environ.setdefault("TILTLAB_FUSED", "wait")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "skip_xp_backend(name, reason): skip a test for one array backend"
    )
    config.addinivalue_line(
        "markers", "gpu: runs CuPy on a CUDA device (benchmarks/gpu_check.sh runs -m gpu)"
    )
    config.addinivalue_line(
        "markers", "push: runs every instance in the push tier (no covering design)"
    )
    if not hasattr(config, "workerinput"):  # the main process, before any worker starts
        _compile_kernels_once()


#: the fused CPU kernels the tests use (``tiltlab._cpu_kernels.warmup.key`` names) and
#: the seconds of a cold compile of each on a 2-core machine, without the block steps of
#: its dtype (:data:`SHARED_SECONDS`, compiled once per process and dtype)
KERNELS = {
    "vg_scalar-float64": 10.0, "hvp_scalar-float64": 5.0, "group_scalar-float64": 2.5,
    "group_multi-float64": 3.5, "vg_multi-float64": 3.0, "hvp_multi-float64": 3.0,
    "vg_scalar-float32": 10.0, "hvp_scalar-float32": 5.0, "group_scalar-float32": 2.5,
    "group_multi-float32": 3.5,
}  # fmt: skip
SHARED_SECONDS = 5.0


def _compile_seconds(names):
    """Estimated seconds to compile ``names`` in one process: each kernel's own time, and
    the block steps once per dtype."""
    dtypes = {name.split("-")[1] for name in names}
    return sum(KERNELS[name] for name in names) + SHARED_SECONDS * len(dtypes)


def _split(names):
    """``names`` in at most two lists, to compile in two processes at once: the split
    whose longer list takes the least estimated time (every split is tried)."""
    names = sorted(names)
    best = None
    for mask in range(1 << max(len(names) - 1, 0)):  # the last name stays in list 0
        a = [k for i, k in enumerate(names) if not mask >> i & 1]
        b = [k for i, k in enumerate(names) if mask >> i & 1]
        key = max(_compile_seconds(a), _compile_seconds(b))
        if best is None or key < best[0]:
            best = (key, [part for part in (a, b) if part])
    return best[1] if best else []


def _compile_kernels_once():
    """Compile the fused CPU kernels missing from numba's cache, in parallel processes,
    before the tests start: otherwise each test process (``pytest -n``) compiles every
    kernel it meets on its own, seconds each, the same kernels in every process at once.
    A warm cache costs one look at its flags; without numba, or with the kernels switched
    off, nothing happens (the tests that compile in a new process use caches of their
    own)."""
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("numba") is None:
        return
    import tiltlab
    from tiltlab._cpu_kernels import warmup

    if warmup.mode() == "off":
        return
    halves = _split([k for k in KERNELS if not warmup.ready(k)])
    if not halves:
        return
    env = dict(os.environ, TILTLAB_FUSED="wait", NUMBA_NUM_THREADS="1")
    root = str(Path(tiltlab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    # after each scalar value-and-gradient kernel, the loss block and the linearisation's
    # product of its dtype (compiled by the tests too, with no flag of their own)
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from tiltlab._cpu_kernels import LOSS_CODES, FusedProblem, warmup\n"
        "from tiltlab._cpu_kernels.__main__ import _compile\n"
        "from tiltlab._cpu_kernels._losses import loss_block\n"
        "for k in sys.argv[1:]:\n"
        "    _compile(k)\n"
        "    warmup.mark_ready(k)\n"
        "    if k.startswith('vg_scalar-'):\n"
        "        dt = np.dtype(k.split('-')[1])\n"
        "        z = np.zeros(8, dtype=dt)\n"
        "        fp = FusedProblem('squared', np.ones((8, 2), dtype=dt), z)\n"
        "        fp.linearize(np.zeros(2, dtype=dt), 1.0).hvp(np.zeros(2, dtype=dt))\n"
        "        loss_block(LOSS_CODES['squared'], z, z, 0, 8, 0.0, z.copy(), z.copy(), z.copy())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, *h], env=env, stdin=subprocess.DEVNULL)
        for h in halves
    ]
    for proc in procs:
        proc.wait()  # a failure shows in the tests that use the kernel


TIERS = ("push", "full", "rest")


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=TIERS,
        default=None,
        help="push (default; env TILTLAB_TIER): a covering design of each parametrized "
        "test, without the tests marked slow; full: every test; rest: full less push",
    )


def _tier(config) -> str:
    tier = config.getoption("--tier", None) or os.environ.get("TILTLAB_TIER") or "push"
    if tier not in TIERS:
        raise pytest.UsageError(f"TILTLAB_TIER must be one of {TIERS}, not {tier!r}")
    return tier


def pytest_report_header(config):
    return f"tiltlab test tier: {_tier(config)}"


def _load(name):
    if name == "numpy":
        import array_api_compat.numpy as xp

        return xp
    if name == "array_api_strict":
        xp = importlib.import_module("array_api_strict")
        return xp
    if name == "torch":
        torch = importlib.import_module("torch")
        torch.set_default_dtype(torch.float64)
        # two cores shared with other processes: torch's thread pool contends badly
        torch.set_num_threads(1)
        import array_api_compat.torch as xp

        return xp
    if name == "dask":
        importlib.import_module("dask.array")
        import array_api_compat.dask.array as xp

        return xp
    if name == "cupy":
        cupy = importlib.import_module("cupy")
        if cupy.cuda.runtime.getDeviceCount() < 1:  # pragma: no cover
            raise ImportError("no GPU")
        import array_api_compat.cupy as xp

        return xp
    raise ValueError(name)  # pragma: no cover


_CACHE: dict = {}


def _backend(name):
    if name not in _CACHE:
        try:
            _CACHE[name] = _load(name)
        except Exception as exc:  # ImportError, CUDA errors
            _CACHE[name] = exc
    return _CACHE[name]


@pytest.fixture(params=BACKENDS)
def xp(request):
    """The array namespace under test (skips backends that are not installed)."""
    name = request.param
    mod = _backend(name)
    if isinstance(mod, Exception):
        pytest.skip(f"{name} not available: {mod}")
    for marker in request.node.iter_markers("skip_xp_backend"):
        if marker.args and marker.args[0] == name:
            pytest.skip(marker.kwargs.get("reason", f"not supported on {name}"))
    return mod


@pytest.fixture
def xp_name(xp):
    return xp.__name__.replace("array_api_compat.", "")


def pytest_runtest_logreport(report):
    """With ``TILTLAB_RECORD_SKIPS=FILE``, append the id of every test skipped for want of
    PyTorch to FILE: CI runs the suite without PyTorch first (a new user's state), then
    exactly those tests again once PyTorch is installed."""
    path = os.environ.get("TILTLAB_RECORD_SKIPS")
    if not path or not report.skipped:
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    if "torch" in str(reason).lower():
        with open(path, "a", encoding="utf-8") as out:
            out.write(report.nodeid + "\n")


def _value_key(value):
    """What makes two parameter values the same value for the covering design: their repr
    (the object itself where the repr is object's, with its address), the function of a
    ``functools.partial`` (scikit-learn's checks are partials bound to an estimator)."""
    if isinstance(value, functools.partial):
        return ("partial", _value_key(value.func))
    if type(value).__repr__ is object.__repr__:
        return (type(value).__qualname__, id(value))
    return (type(value).__qualname__, repr(value))


#: parameters whose values are replicates of one check (other random draws), not cases:
#: the push tier's design meets one value of each
REPLICATES = frozenset({"seed"})


def _covering(items):
    """Few items (greedy: each the first that meets the most values not yet met) that
    meet every value of every parameter of ``items`` (one value of a replicate)."""
    cover = {
        it: {
            (name, None if name in REPLICATES else _value_key(v))
            for name, v in it.callspec.params.items()
        }
        for it in items
    }
    needed = set().union(*cover.values())
    chosen = []
    while needed:
        best = max(items, key=lambda it: len(cover[it] & needed))  # first of the best
        chosen.append(best)
        needed -= cover[best]
    return chosen


def _installed(name) -> bool:
    """Whether the ``xp`` fixture's backend ``name`` can run here (imported, but not set
    up as the fixture sets it up: collecting changes no library's global state; CuPy is
    asked for a GPU)."""
    if name == "cupy":
        return not isinstance(_backend("cupy"), Exception)
    try:
        importlib.import_module({"dask": "dask.array"}.get(name, name))
    except Exception:  # ImportError, or a broken installation
        return False
    return True


def _skips_for(item, installed):
    """The backend for which ``item`` skips at once (not installed here, or marked
    ``skip_xp_backend``), else None."""
    backend = item.callspec.params.get("xp")
    if backend not in installed:
        return None
    if not installed[backend] or any(
        m.args and m.args[0] == backend for m in item.iter_markers("skip_xp_backend")
    ):
        return backend
    return None


def _named(config) -> set:
    """The tests named on the command line (``file::test`` or ``file::test[id]``), as
    (file name, rest of the id) pairs."""
    out = set()
    for arg in config.args:
        if "::" in arg:
            path, rest = arg.split("::", 1)
            out.add((os.path.basename(path), rest))
    return out


def _push_tier(config, items):
    """The items of the push tier (see the module's docstring), in collection order."""
    named = _named(config)
    installed = {name: _installed(name) for name in BACKENDS}
    groups = defaultdict(list)
    keep = set()
    for it in items:
        path, rest = it.nodeid.split("::", 1)
        name = os.path.basename(path)
        if (name, rest) in named or (name, rest.split("[", 1)[0]) in named:
            keep.add(it)  # asked for by name: runs as asked
        elif it.get_closest_marker("slow") is not None:
            continue
        elif (
            not hasattr(it, "callspec")
            or it.get_closest_marker("push") is not None
            or name == "test_contract.py"
        ):
            keep.add(it)
        else:
            # one design per test function (its id without the parameters); the instances
            # that skip for want of a backend get their own (a run without PyTorch records
            # them for a run with it)
            groups[it.nodeid.split("[", 1)[0], _skips_for(it, installed)].append(it)
    for group in groups.values():
        keep.update(_covering(group))
    return [it for it in items if it in keep]


def pytest_itemcollected(item):
    # before -m selects: the CuPy instances of the backend matrix run on a device
    spec = getattr(item, "callspec", None)
    if spec is not None and spec.params.get("xp") == "cupy":
        item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(trylast=True)  # after -k and -m: the design covers what they selected
def pytest_collection_modifyitems(config, items):
    tier = _tier(config)
    if tier == "full":
        return
    push = _push_tier(config, items)
    if tier == "push":
        selected = push
    else:
        in_push = set(push)
        selected = [it for it in items if it not in in_push]
    if len(selected) < len(items):
        chosen = set(selected)
        config.hook.pytest_deselected(items=[it for it in items if it not in chosen])
        items[:] = selected
