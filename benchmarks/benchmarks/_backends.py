"""Array backends for the benchmarks: namespace, data transfer and synchronisation.

``get_backend(name)`` returns a :class:`Backend` for one of

- ``"numpy"``: NumPy on the CPU;
- ``"torch"``: PyTorch on the CPU (the same meaning on every machine, so results compare);
- ``"torch-cuda"``: PyTorch on the current CUDA device;
- ``"cupy"``: CuPy on the current CUDA device;
- ``"dask"``: Dask arrays (NumPy chunks), computed at the end of each timed call.

It raises ``NotImplementedError`` when the library is missing or, for the GPU backends, when
no CUDA device is visible. asv treats ``NotImplementedError`` raised in ``setup`` as "skip
this parameter combination", so the suite runs anywhere and times what is there.

GPU libraries launch kernels asynchronously: a timed function must end with
``backend.sync(result)`` so that the clock stops after the kernels have finished, not when
they were queued. For Dask, ``sync`` computes the lazy result.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BACKENDS",
    "Backend",
    "available_backends",
    "get_backend",
    "make_groups",
    "make_losses",
]

#: every backend name understood by :func:`get_backend`
BACKENDS = ("numpy", "torch", "torch-cuda", "cupy", "dask")

#: chunk length for Dask arrays (samples per chunk)
DASK_CHUNK = 1_000_000


@dataclass(frozen=True)
class Backend:
    """One array library, ready to receive data and to be timed.

    Attributes
    ----------
    name : str
        Backend name as passed to :func:`get_backend`.
    xp : module
        The array-API namespace (from ``array_api_compat``).
    device : str
        ``"cpu"`` or the GPU's name.
    asarray : callable
        ``asarray(numpy_array) -> backend array`` (copies to the device).
    sync : callable
        ``sync(result=None) -> result``: waits for queued GPU work, computes Dask results.
    is_gpu : bool
        Whether the arrays live on a GPU.
    """

    name: str
    xp: Any
    device: str
    asarray: Callable[[np.ndarray], Any]
    sync: Callable[..., Any]
    is_gpu: bool = False


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or CUDA libraries that fail to load
        raise NotImplementedError(f"{module} is not available: {exc}") from exc


def _no_sync(result: Any = None) -> Any:
    return result


def _numpy() -> Backend:
    import array_api_compat.numpy as xp

    return Backend("numpy", xp, "cpu", np.asarray, _no_sync)


def _torch(cuda: bool) -> Backend:
    torch = _import("torch")
    xp = _import("array_api_compat.torch")
    if not cuda:
        return Backend(
            "torch", xp, "cpu", lambda a: torch.from_numpy(np.ascontiguousarray(a)), _no_sync
        )
    if not torch.cuda.is_available():
        raise NotImplementedError("torch-cuda: no CUDA device visible to PyTorch")
    dev = torch.device("cuda", torch.cuda.current_device())

    def asarray(a: np.ndarray) -> Any:
        out = torch.from_numpy(np.ascontiguousarray(a)).to(dev)
        torch.cuda.synchronize(dev)
        return out

    def sync(result: Any = None) -> Any:
        torch.cuda.synchronize(dev)
        return result

    return Backend("torch-cuda", xp, torch.cuda.get_device_name(dev), asarray, sync, True)


def _cupy() -> Backend:
    cupy = _import("cupy")
    try:
        n_devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError when there is no driver
        raise NotImplementedError(f"cupy: no CUDA device ({exc})") from exc
    if n_devices < 1:
        raise NotImplementedError("cupy: no CUDA device")
    xp = _import("array_api_compat.cupy")
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)

    def asarray(a: np.ndarray) -> Any:
        out = cupy.asarray(a)
        cupy.cuda.get_current_stream().synchronize()
        return out

    def sync(result: Any = None) -> Any:
        cupy.cuda.get_current_stream().synchronize()
        return result

    return Backend("cupy", xp, name, asarray, sync, True)


def _dask() -> Backend:
    da = _import("dask.array")
    xp = _import("array_api_compat.dask.array")

    def asarray(a: np.ndarray) -> Any:
        chunks = tuple(min(DASK_CHUNK, n) if i == a.ndim - 1 else n for i, n in enumerate(a.shape))
        return da.from_array(a, chunks=chunks or ())

    def sync(result: Any = None) -> Any:
        if result is None:
            return None
        if isinstance(result, tuple | list):
            import dask

            return dask.compute(*result)
        return result.compute() if hasattr(result, "compute") else result

    return Backend("dask", xp, "cpu", asarray, sync)


_LOADERS: dict[str, Callable[[], Backend]] = {
    "numpy": _numpy,
    "torch": lambda: _torch(cuda=False),
    "torch-cuda": lambda: _torch(cuda=True),
    "cupy": _cupy,
    "dask": _dask,
}

_CACHE: dict[str, Backend | NotImplementedError] = {}


def get_backend(name: str) -> Backend:
    """Return the :class:`Backend` called ``name``.

    Raises
    ------
    NotImplementedError
        The library is not installed, or (GPU backends) no CUDA device is visible.
    ValueError
        ``name`` is not one of :data:`BACKENDS`.
    """
    if name not in _LOADERS:
        raise ValueError(f"`name`: unknown backend {name!r}; choose from {BACKENDS}")
    if name not in _CACHE:
        try:
            _CACHE[name] = _LOADERS[name]()
        except NotImplementedError as exc:
            _CACHE[name] = exc
    found = _CACHE[name]
    if isinstance(found, NotImplementedError):
        raise NotImplementedError(str(found))
    return found


def available_backends(names: tuple[str, ...] = BACKENDS) -> list[Backend]:
    """The backends among ``names`` that can run here, in order."""
    out = []
    for name in names:
        try:
            out.append(get_backend(name))
        except NotImplementedError:
            pass
    return out


def make_losses(n: int, dtype: str = "float64", seed: int = 0) -> np.ndarray:
    """Seeded per-sample losses: 3 * Exponential(1) plus a small uniform spread, length ``n``."""
    rng = np.random.default_rng(seed)
    losses = 3.0 * rng.exponential(1.0, size=n) + 0.01 * rng.random(n)
    return losses.astype(dtype)


def make_groups(n: int, n_groups: int = 10, seed: int = 0) -> np.ndarray:
    """Seeded integer group labels in ``range(n_groups)``, every group non-empty."""
    rng = np.random.default_rng(seed + 1)
    groups = rng.integers(0, n_groups, size=n)
    groups[:n_groups] = np.arange(n_groups)  # no empty group even for tiny n
    return groups.astype(np.int64)
