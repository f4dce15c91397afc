"""The compiled CPU backend (numba): every registration of the compiled CPU kernels.

- :mod:`.fused`: the fused one-pass evaluations of a sample-level tilted GLM objective
  (:class:`FusedProblem`, :func:`fused_value`, :func:`fused_value_and_gradient`,
  :func:`fused_hvp`, :func:`fused_linearize`), over the kernels of :mod:`._scalar`,
  :mod:`._multinomial` and :mod:`._grouped` (the block steps of :mod:`.block_steps`, the
  register code of :mod:`._short`, the generated loss loops of :mod:`._losses`, the
  vectorised math of :mod:`._vmath` and :mod:`._vmath32`), bound by :mod:`._prepare`,
  launched on threads by :mod:`._launch`, cached per user by :mod:`._cache` and compiled in
  the background by :mod:`.warmup` (``python -m tiltlab._cpu_kernels KEY``);
- :mod:`.engine`: the objective engine over them (``FUSED_CPU``);
- :mod:`.segments`: the compiled segment counts and sums behind :mod:`tiltlab.segments`;
- :mod:`.dask_chunks`: the route of NumPy chunks of a Dask evaluation.

Importing this package registers them into the tables of the layers below
(:data:`tiltlab.objective.engines.ENGINES`, :data:`tiltlab.segments.SEGMENT_KERNELS`,
:data:`tiltlab.distributed.CHUNK_ROUTES`); ``tiltlab/_backends.py`` names it for NumPy,
so that it is imported the first time one of those tables is asked about NumPy data.
Importing it does not import numba: the kernels are compiled (or loaded from the cache)
on their first call, and where numba is missing or ``TILTLAB_FUSED=0`` turns them off
(:func:`available` is False) every caller takes its NumPy path.
"""

from __future__ import annotations

from ..distributed import CHUNK_ROUTES
from ..objective.engines import ENGINES
from ..segments import SEGMENT_KERNELS
from . import segments
from .dask_chunks import NUMPY_CHUNKS
from .engine import FUSED_CPU
from .fused import (
    CHUNK_ROWS,
    LOSS_CODES,
    MAX_CHUNKS,
    SWITCH,
    FusedProblem,
    KernelStates,
    KernelsUnavailable,
    Linearization,
    available,
    default_chunks,
    fused_hvp,
    fused_linearize,
    fused_value,
    fused_value_and_gradient,
    switched_off,
    threads,
    use_fused,
)

__all__ = [
    "CHUNK_ROWS",
    "LOSS_CODES",
    "MAX_CHUNKS",
    "SWITCH",
    "FusedProblem",
    "KernelStates",
    "KernelsUnavailable",
    "Linearization",
    "available",
    "default_chunks",
    "fused_hvp",
    "fused_linearize",
    "fused_value",
    "fused_value_and_gradient",
    "switched_off",
    "threads",
    "use_fused",
]

ENGINES.register("numpy", FUSED_CPU)
SEGMENT_KERNELS.register("numpy", segments)
CHUNK_ROUTES.register("numpy", NUMPY_CHUNKS)
