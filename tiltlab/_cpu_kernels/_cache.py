"""Where numba caches the compiled kernels, and keeping that cache in step with the sources.

Location
--------
The kernels are cached in a per-user cache folder, never inside the installed package
(files written there would outlive an uninstall):

- ``$NUMBA_CACHE_DIR/<package folder>`` when ``NUMBA_CACHE_DIR`` is set (the folder numba
  itself would use);
- otherwise ``$XDG_CACHE_HOME/tiltlab/numba/<package folder>`` (``~/.cache/tiltlab/numba``
  when ``XDG_CACHE_HOME`` is unset), ``~/Library/Caches/tiltlab/numba`` on macOS and
  ``%LOCALAPPDATA%\\tiltlab\\Cache\\numba`` on Windows,

where ``<package folder>`` is the folder's name and a hash of its absolute path (one
installation's cache does not overwrite another's). :func:`cache_folder` gives the path.
Only the kernels of this package are cached there: :func:`jit` compiles a function with
numba and attaches a cache whose locator points at that folder (numba's own locators,
and so every other library's caching, are left as they are). Where the folder cannot be
created or written the kernels are compiled in every process and not cached.

Freshness
---------
Numba checks only the source file that defines a compiled function when it decides
whether a cached machine code is still valid. The fused kernels compile in helpers from
other files of this package (:mod:`._rows`, :mod:`.block_steps`, :mod:`._vmath`), so after
an upgrade that changes a helper but not the kernel's own file, numba would load the old
machine code. :func:`refresh_cache` prevents that: it fingerprints every source file of
the package together with the numba version, keeps the fingerprint in a stamp file next
to the cached kernels, and removes them when it changes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["cache_folder", "cache_root", "fingerprint", "jit", "refresh_cache"]

#: the file, in the cache folder, that holds the fingerprint of the cached kernels
STAMP = "tiltlab-kernels.stamp"
#: the suffixes of numba's cache files (index and data) and of the files that say a kernel
#: is in the cache or being compiled (:mod:`.warmup`)
CACHE_SUFFIXES = (".nbi", ".nbc", ".ready", ".compiling")


def _package(package: Path | None) -> Path:
    return Path(__file__).resolve().parent if package is None else Path(package).resolve()


def cache_root() -> Path:
    """The per-user folder under which the compiled kernels are cached.

    ``NUMBA_CACHE_DIR`` when set, else the platform's user cache folder followed by
    ``tiltlab/numba`` (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux).

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import cache_root
    >>> cache_root().is_absolute()
    True
    """
    given = os.environ.get("NUMBA_CACHE_DIR", "")
    if not given and "numba.core.config" in sys.modules:
        given = getattr(sys.modules["numba.core.config"], "CACHE_DIR", "") or ""
    if given:
        return Path(given).expanduser().resolve()
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
        return base / "tiltlab" / "Cache" / "numba"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "tiltlab" / "numba"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".cache"
    return base / "tiltlab" / "numba"


def cache_folder(package: Path | None = None) -> Path:
    """The folder that holds the cached kernels of ``package`` (this package by default)
    and their stamp: :func:`cache_root`, then the package folder's name and a hash of its
    absolute path (numba's naming for ``NUMBA_CACHE_DIR``).

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import cache_folder, cache_root
    >>> cache_folder().parent == cache_root()
    True
    """
    folder = _package(package)
    hashed = hashlib.sha1(str(folder).encode()).hexdigest()
    return cache_root() / f"{folder.name}_{hashed}"


def fingerprint(package: Path | None = None) -> str:
    """A hash of every ``.py`` file of ``package`` (this package by default) and of the
    numba version: what the cached kernels depend on.

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import fingerprint
    >>> len(fingerprint())
    64
    """
    from importlib import metadata

    try:  # without importing numba (which takes a while)
        version = metadata.version("numba")
    except metadata.PackageNotFoundError:
        import numba

        version = numba.__version__
    folder = _package(package)
    digest = hashlib.sha256(version.encode())
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _remove(folder: Path, names: tuple[str, ...]) -> bool:
    removed = False
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.suffix in names or path.name == STAMP:
            path.unlink(missing_ok=True)
            removed = True
    return removed


@functools.cache
def refresh_cache(package: Path | None = None) -> bool:
    """Remove the cached kernels of ``package`` if they were compiled from other sources
    (or another numba), and write the current fingerprint next to them; returns whether
    anything was removed.

    Called once per process, before the first kernel is compiled or loaded. Kernels that
    earlier versions cached inside the package (``__pycache__``) are removed too. A folder
    that cannot be read or written is left alone (the kernels are then not cached).

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import refresh_cache
    >>> isinstance(refresh_cache(), bool)
    True
    """
    folder = _package(package)
    try:  # caches of earlier versions, inside the package
        _remove(folder / "__pycache__", CACHE_SUFFIXES)
    except OSError:
        pass
    cache = cache_folder(folder)
    stamp = cache / STAMP
    current = fingerprint(folder)
    try:
        if stamp.is_file() and stamp.read_text().strip() == current:
            return False
        removed = _remove(cache, CACHE_SUFFIXES)
        cache.mkdir(parents=True, exist_ok=True)
        stamp.write_text(current + "\n")
        return removed
    except OSError:
        return False


@functools.cache
def _cache_class() -> Any:
    """numba's function cache with a locator that points at :func:`cache_folder`."""
    from numba.core import caching

    class Locator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        def __init__(self, py_func: Any, py_file: str):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(cache_folder(Path(py_file).parent))

        def get_cache_path(self) -> str:
            return self._cache_path

    class Impl(caching.CompileResultCacheImpl):
        _locator_classes = [Locator]

    class Cache(caching.FunctionCache):
        _impl_class = Impl

    return Cache


def jit(**options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(**options)``, cached in :func:`cache_folder` (``cache=False`` turns the
    cache off). Where the cache cannot be set up the function is compiled uncached.

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import jit
    >>> @jit(nogil=True)
    ... def twice(x):
    ...     return 2 * x
    >>> twice(3)
    6
    """
    import numba

    cache = options.pop("cache", True)
    if cache:
        refresh_cache()  # before any kernel of the package is loaded from the cache

    def decorate(func: Callable) -> Any:
        dispatcher = numba.njit(**options)(func)
        if cache:
            try:
                dispatcher._cache = _cache_class()(dispatcher.py_func)
            except Exception:  # no usable folder, or another numba's internals: no cache
                pass
        return dispatcher

    return decorate
