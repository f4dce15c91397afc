"""Pickling objects that hold an array namespace (a module, which does not pickle)."""

from __future__ import annotations

import importlib
import types


class _ModuleRef:
    """Stand-in for a module in a pickled state: its import name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self) -> tuple:
        return (_ModuleRef, (self.name,))


class PicklableNamespace:
    """Mixin: pickle (and deep-copy) objects whose attributes hold array namespaces.

    Namespaces are modules (``array_api_compat.numpy``, ``array_api_strict``, ...),
    which do not pickle; they are stored by import name and imported again on
    unpickling, so the object works with :mod:`pickle`, :func:`copy.deepcopy`,
    joblib, multiprocessing and Dask distributed.
    """

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key, value in state.items():
            if isinstance(value, types.ModuleType):
                state[key] = _ModuleRef(value.__name__)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        for key, value in state.items():
            if isinstance(value, _ModuleRef):
                state[key] = importlib.import_module(value.name)
        self.__dict__.update(state)
