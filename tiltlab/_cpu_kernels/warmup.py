"""Compile the fused kernels in a background process while NumPy serves the first problems.

Numba compiles a kernel on its first call, which takes seconds (the compiled code is then
cached on disk, :mod:`._cache`, and a new process loads it in a fraction of a second). So
that the first fit in a new environment does not wait for it, the objective's engine asks
:func:`ready` before it uses a kernel: when the kernel (for ``X``'s dtype) is neither in
this process nor in the cache, a background process compiles it into the cache
(:func:`start`, once per kernel and process) and the engine declines, so that the NumPy
path serves the problem. Problems bound after the background process has finished load the
kernel from the cache. A problem keeps the engine it started with (its evaluations do not
change engine halfway through a fit).

The environment variable ``TILTLAB_FUSED`` sets this (:func:`mode`): ``0`` (or ``false``,
``no``, ``off``) turns the compiled kernels off, ``wait`` compiles a missing kernel in the
calling process on its first call (what the direct functions of the package always do),
anything else (the default) compiles in the background.

The background process runs ``python -m tiltlab._cpu_kernels KEY``, which compiles
the kernel named by ``KEY`` (:func:`key`) and marks it ready.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._cache import cache_folder, refresh_cache

__all__ = ["key", "mark_ready", "mode", "ready", "start"]

#: the environment variable read by :func:`mode`
SWITCH = "TILTLAB_FUSED"
_OFF = ("0", "false", "no", "off")
#: suffix of the files that say a kernel is in the cache (removed with the cache)
READY_SUFFIX = ".ready"
#: suffix of the file that says a process is compiling a kernel (so that the processes of
#: a pool do not all compile the same kernel); one older than LOCK_SECONDS is ignored
LOCK_SUFFIX = ".compiling"
LOCK_SECONDS = 900
#: kernels known to be compiled or cached, in this process
_READY: set[str] = set()
#: background compilations started by this process
_STARTED: dict[str, Any] = {}


def mode() -> str:
    """``"off"``, ``"wait"`` or ``"background"``, from the environment variable
    ``TILTLAB_FUSED`` (read at each call).

    Examples
    --------
    >>> import os
    >>> from tiltlab._cpu_kernels.warmup import mode
    >>> mode() in ("off", "wait", "background")
    True
    """
    value = os.environ.get(SWITCH, "").strip().lower()
    if value in _OFF:
        return "off"
    return "wait" if value == "wait" else "background"


def key(kernel: str, X: np.ndarray) -> str:
    """The name under which a kernel compiled for ``X`` is known: the kernel's name and
    ``X``'s dtype (and ``-ro`` for read-only data, which numba compiles separately).

    Examples
    --------
    >>> import numpy as np
    >>> from tiltlab._cpu_kernels.warmup import key
    >>> key("vg_scalar", np.zeros((2, 2), np.float32))
    'vg_scalar-float32'
    """
    return f"{kernel}-{X.dtype.name}{'' if X.flags.writeable else '-ro'}"


def _flag(name: str) -> Path:
    return cache_folder() / f"{name}{READY_SUFFIX}"


@functools.cache
def _writable() -> bool:
    """Whether the cache folder can be written (else nothing is cached: no background)."""
    folder = cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def ready(name: str) -> bool:
    """Whether the kernel ``name`` (:func:`key`) can be used without compiling it here:
    compiled in this process, or cached on disk. True as well where nothing can be
    cached (the kernel is then compiled on its first call, as numba does).

    Examples
    --------
    >>> from tiltlab._cpu_kernels.warmup import ready
    >>> isinstance(ready("vg_scalar-float64"), bool)
    True
    """
    if name in _READY:
        return True
    if not _writable():
        return True
    refresh_cache()  # flags of kernels compiled from other sources are removed with them
    if _flag(name).is_file():
        _READY.add(name)
        return True
    return False


def mark_ready(name: str) -> None:
    """Record that the kernel ``name`` is compiled (and so in the cache)."""
    if name in _READY:
        return
    _READY.add(name)
    try:
        _flag(name).touch()
    except OSError:
        pass


def _claim(name: str) -> bool:
    """Take the compilation of ``name`` for this process: False when another process
    started it less than ``LOCK_SECONDS`` ago."""
    lock = cache_folder() / f"{name}{LOCK_SUFFIX}"
    for _ in range(2):
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            try:
                if time.time() - lock.stat().st_mtime < LOCK_SECONDS:
                    return False
                lock.unlink()  # left by a process that did not finish: take it over
            except OSError:
                return False
        except OSError:
            return True  # no lock can be taken: compile anyway
    return False


def start(name: str) -> bool:
    """Start compiling the kernel ``name`` in a background process (once per process, and
    not while another process compiles it); returns False when no process could be started
    (the caller then compiles here)."""
    if name in _STARTED:
        return _STARTED[name] is not None
    if not _claim(name):
        _STARTED[name] = "elsewhere"
        return True
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds this package
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env[SWITCH] = "wait"
    env.setdefault("NUMBA_NUM_THREADS", "1")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiltlab._cpu_kernels", name],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        proc = None
        _release(name)
    _STARTED[name] = proc
    return proc is not None


def _release(name: str) -> None:
    try:
        (cache_folder() / f"{name}{LOCK_SUFFIX}").unlink(missing_ok=True)
    except OSError:
        pass


def wait(name: str, timeout: float | None = None) -> bool:
    """Wait for the background compilation of ``name`` started by this process (if any);
    returns whether the kernel is ready."""
    proc = _STARTED.get(name)
    if isinstance(proc, subprocess.Popen):
        proc.wait(timeout)
    return ready(name)
