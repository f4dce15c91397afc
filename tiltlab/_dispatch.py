"""Dispatch tables: implementations chosen by array library, registered from above.

A lower layer (the risk functions, the objective) owns a :class:`Dispatch` and asks it
for the implementation that fits an array's library. An optional backend (Dask, a
compiled CPU kernel, CuPy kernels) registers its implementation into that table, so the
lower layer never imports the higher one. :meth:`Dispatch.register_lazy` names a module
to import the first time an array of a library is seen; that module registers its
implementations when it is imported. The wiring of these lazy modules lives at the top of
the package (``tiltlab/_backends.py``), which is allowed to know every layer.

The model is ``dask.utils.Dispatch`` with its ``register_lazy``. A table that lives in a
module the top of the package does not import (so that ``import tiltlab`` stays light:
Dask's chunk routes) takes its lazy registrations by name, :func:`register_lazy`.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

__all__ = ["Dispatch", "library_of", "register_lazy"]

#: the tables by name, and the lazy registrations named for tables not made yet
_TABLES: dict[str, Dispatch] = {}
_PENDING: dict[str, dict[str, str]] = {}


def library_of(obj: Any) -> str:
    """The array library an array or an array namespace belongs to.

    Parameters
    ----------
    obj : array or module
        An array (its type's top-level package is the library) or an array namespace
        (``numpy``, ``array_api_compat.torch``, ``array_api_strict``...).

    Returns
    -------
    str
        The top-level package name: ``"numpy"``, ``"cupy"``, ``"torch"``, ``"dask"``,
        ``"array_api_strict"``...

    Examples
    --------
    >>> import numpy as np
    >>> library_of(np.ones(3))
    'numpy'
    >>> import array_api_compat.numpy as xp
    >>> library_of(xp)
    'numpy'
    """
    if isinstance(obj, ModuleType):
        parts = obj.__name__.split(".")
        if parts[0] == "array_api_compat" and len(parts) > 1:
            return parts[1]
        return parts[0]
    return type(obj).__module__.split(".")[0]


class Dispatch:
    """A table from array libraries to implementations.

    Parameters
    ----------
    name : str
        What the table dispatches (used in error messages and ``repr``).

    Examples
    --------
    >>> table = Dispatch("demo")
    >>> _ = table.register("numpy", lambda: "numpy implementation")
    >>> table.lookup("numpy")()
    'numpy implementation'
    >>> table.lookup("torch") is None
    True
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._impls: dict[str, Any] = {}
        self._lazy: dict[str, str] = dict(_PENDING.get(name, {}))
        self._lock = threading.Lock()
        _TABLES[name] = self

    def __repr__(self) -> str:
        return f"Dispatch({self.name!r}, libraries={self.registered()})"

    def register(self, library: str, impl: Any = None) -> Any:
        """Register ``impl`` for ``library`` (usable as a decorator when ``impl`` is None)."""
        if not isinstance(library, str) or not library:
            raise TypeError(f"`library` must be a non-empty string, got {library!r}")

        def _register(obj: Any) -> Any:
            self._impls[library] = obj
            return obj

        if impl is None:
            return _register
        _register(impl)
        return impl

    def register_lazy(self, library: str, module: str) -> None:
        """Import ``module`` (it registers into this table) when ``library`` is first needed."""
        if not isinstance(module, str) or not module:
            raise TypeError(f"`module` must be a non-empty module path, got {module!r}")
        self._lazy[library] = module

    def lookup(self, library: str, default: Any = None) -> Any:
        """The implementation for ``library``, importing its lazy module first if needed."""
        impl = self._impls.get(library)
        if impl is not None:
            return impl
        module = self._lazy.get(library)
        if module is None:
            return default
        with self._lock:
            if library not in self._impls:
                importlib.import_module(module)
                self._lazy.pop(library, None)
        return self._impls.get(library, default)

    def dispatch(self, obj: Any, default: Any = None) -> Any:
        """The implementation for the library of an array or namespace ``obj``."""
        return self.lookup(library_of(obj), default)

    def registered(self) -> list[str]:
        """Libraries with an implementation or a lazy module, sorted."""
        return sorted(set(self._impls) | set(self._lazy))


def register_lazy(table: str, library: str, module: str) -> None:
    """:meth:`Dispatch.register_lazy` for the table named ``table``, made now or later.

    For a table defined in a module that the wiring at the top of the package must not
    import: the registration waits until the table is made (its module imported).

    Examples
    --------
    >>> register_lazy("demo later", "numpy", "tiltlab.segments")
    >>> Dispatch("demo later").registered()
    ['numpy']
    """
    if not isinstance(module, str) or not module:
        raise TypeError(f"`module` must be a non-empty module path, got {module!r}")
    _PENDING.setdefault(table, {})[library] = module
    existing = _TABLES.get(table)
    if existing is not None:
        existing.register_lazy(library, module)
