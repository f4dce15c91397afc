"""When the compiled kernels may be used, and running one over row chunks on threads.

:func:`available` is the policy's question (numba installed, not switched off by
``TILTLAB_FUSED``, not failed in this process); :func:`_call` runs a kernel over its row
chunks, which :func:`threads` threads take from a shared queue in contiguous runs (the
kernels are compiled without the GIL), and turns a numba error while compiling into
:class:`KernelsUnavailable` (one warning; the callers then take the NumPy path). Each
chunk writes only its own state, so results do not depend on the number of threads.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from . import warmup

__all__ = ["SWITCH", "KernelsUnavailable", "available", "switched_off", "threads"]

#: the environment variable that turns the compiled CPU kernels off (``TILTLAB_FUSED=0``)
#: or has missing kernels compiled in the calling process (``wait``), see :mod:`.warmup`
SWITCH = warmup.SWITCH
#: why the kernels could not be imported or compiled in this process (then not tried again)
_BROKEN: list[str] = []


def switched_off() -> bool:
    """Whether the environment variable :data:`SWITCH` (``TILTLAB_FUSED``) turns the
    compiled kernels off (``0``, ``false``, ``no`` or ``off``; read at each call).

    Examples
    --------
    >>> import os
    >>> from tiltlab._cpu_kernels import switched_off
    >>> switched_off() == (os.environ.get("TILTLAB_FUSED") == "0")
    True
    """
    return warmup.mode() == "off"


def available() -> bool:
    """Whether the compiled kernels may be used: numba is installed, they are not switched
    off (:func:`switched_off`), and they have not failed to import or compile in this
    process.

    Examples
    --------
    >>> from tiltlab._cpu_kernels import available
    >>> isinstance(available(), bool)
    True
    """
    return not _BROKEN and not switched_off() and importlib.util.find_spec("numba") is not None


class KernelsUnavailable(RuntimeError):
    """numba is installed but the kernels could not be imported or compiled (the callers
    then take the NumPy path; :func:`available` is False from then on)."""


def _give_up(exc: BaseException) -> KernelsUnavailable:
    """Record that the kernels cannot be used in this process, warn once, and return the
    error to raise."""
    why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not _BROKEN:
        warnings.warn(
            f"the compiled CPU kernels of tiltlab could not be used ({why}); NumPy computes "
            f"instead (set the environment variable {SWITCH}=0 to skip them)",
            RuntimeWarning,
            stacklevel=4,
        )
    _BROKEN.append(why)
    return KernelsUnavailable(why)


def threads() -> int:
    """Threads the kernels run on: numba's setting (``NUMBA_NUM_THREADS``,
    ``numba.set_num_threads``).

    Examples
    --------
    >>> from tiltlab._cpu_kernels import threads
    >>> threads() >= 1
    True
    """
    import numba

    return max(1, int(numba.get_num_threads()))


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        max_workers=max(1, (os.cpu_count() or 1) - 1), thread_name_prefix="tiltlab-kernels"
    )


def _run(kernel: Any, args: tuple, k0: int, k1: int) -> None:
    """One kernel call on the chunks ``k0 <= k < k1`` (compiled on its first call); a
    numba error while compiling makes the kernels unavailable (:class:`KernelsUnavailable`)."""
    try:
        kernel(*args, k0, k1)
    except Exception as exc:
        errors = sys.modules.get("numba.core.errors")
        if errors is not None and isinstance(exc, errors.NumbaError):
            raise _give_up(exc) from exc
        raise
    warmup.mark_ready(warmup.key(kernel.__name__, args[0]))


#: each thread takes this many grabs of chunks on average (a thread that another thread
#: pool keeps off its core, such as a BLAS pool spinning after its last call, then takes
#: fewer chunks instead of holding up the others)
GRABS_PER_THREAD = 8


def _call(kernel: Any, *args: Any, chunks: int) -> None:
    """Run ``kernel`` over ``chunks`` row chunks on :func:`threads` threads (the kernels
    release the GIL). The threads take contiguous runs of chunks from a shared queue as
    they become free (about :data:`GRABS_PER_THREAD` runs each), so a thread that gets less
    of the processor than the others (a BLAS pool spinning after its last call, another
    thread pool of the user) does less of the work. Each chunk writes only its own state,
    so the results do not depend on which thread ran it."""
    n = min(threads(), chunks)
    if n <= 1:
        _run(kernel, args, 0, chunks)
        return
    size = max(1, -(-chunks // (n * GRABS_PER_THREAD)))
    runs = iter(range(0, chunks, size))  # next() on a range iterator holds the GIL

    def work() -> None:
        for k0 in runs:
            _run(kernel, args, k0, min(chunks, k0 + size))

    pool = _pool()
    futures = [pool.submit(work) for _ in range(1, n)]
    try:
        work()
    finally:
        errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


def _kernels():
    """The compiled kernels (imports numba on first use)."""
    if not available():
        if _BROKEN:
            raise KernelsUnavailable(_BROKEN[0])
        if switched_off():
            raise KernelsUnavailable(f"the compiled CPU kernels are switched off ({SWITCH})")
        raise ImportError("the fused CPU kernels need numba (pip install numba)")
    try:
        import numba  # noqa: F401 - without it the modules below would run as plain Python

        from . import _multinomial, _rows, _scalar
    except Exception as exc:  # a numba (or llvmlite) that does not import
        raise _give_up(exc) from exc

    return SimpleNamespace(
        STATE_COLS=_rows.STATE_COLS,
        vg_scalar=_scalar.vg_scalar,
        hvp_scalar=_scalar.hvp_scalar,
        linear_hvp_scalar=_scalar.linear_hvp_scalar,
        vg_multi=_multinomial.vg_multi,
        hvp_multi=_multinomial.hvp_multi,
        linear_hvp_multi=_multinomial.linear_hvp_multi,
    )
