"""Keep numba's on-disk kernel cache in step with the sources it was compiled from.

Numba (``cache=True``) checks only the source file that defines a compiled function
when it decides whether a cached machine code is still valid. The fused kernels inline
helpers from other files of this package (:mod:`._rows`, :mod:`._blocks`,
:mod:`._vmath`), so after an upgrade that changes a helper but not the kernel's own
file, numba would load the old machine code. :func:`refresh_cache` prevents that: it
fingerprints every source file of the package together with the numba version, keeps the
fingerprint next to the cache, and removes the cached kernels when it changes.

Only the package's own ``__pycache__`` folder is managed (where numba caches when the
package folder is writable). With ``NUMBA_CACHE_DIR`` set, numba caches elsewhere and
the user clears that folder after upgrading tiltlab.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["fingerprint", "refresh_cache"]

#: the file, in the cache folder, that holds the fingerprint of the cached kernels
STAMP = "tiltlab-kernels.stamp"


def fingerprint(package: Path | None = None) -> str:
    """A hash of every ``.py`` file of ``package`` (this package by default) and of the
    numba version: what the cached kernels depend on.

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import fingerprint
    >>> len(fingerprint())
    64
    """
    import numba

    folder = Path(__file__).parent if package is None else Path(package)
    digest = hashlib.sha256(numba.__version__.encode())
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def refresh_cache(package: Path | None = None) -> bool:
    """Remove the cached kernels in ``package/__pycache__`` if they were compiled from
    other sources (or another numba); returns whether anything was removed.

    Called once per process, before the first kernel is compiled or loaded. A folder that
    cannot be read or written is left alone (numba then caches elsewhere or not at all).

    Examples
    --------
    >>> from tiltlab._cpu_kernels._cache import refresh_cache
    >>> isinstance(refresh_cache(), bool)
    True
    """
    folder = Path(__file__).parent if package is None else Path(package)
    cache = folder / "__pycache__"
    stamp = cache / STAMP
    current = fingerprint(folder)
    try:
        if stamp.is_file() and stamp.read_text().strip() == current:
            return False
        removed = False
        for path in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            path.unlink(missing_ok=True)
            removed = True
        cache.mkdir(exist_ok=True)
        stamp.write_text(current + "\n")
        return removed
    except OSError:
        return False
