"""Benchmarks of the loss aggregations: tilted risk, tilted weights, hierarchical risk.

Parameters: number of samples ``n``, floating ``dtype`` and array ``backend`` (see
``_backends.py``; a backend that is not installed, or a GPU backend without a GPU, is skipped
by raising ``NotImplementedError`` in ``setup``). Every timed function ends with
``backend.sync(result)`` so that GPU timings include the kernels and Dask timings include the
computation.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import tiltlab

from ._backends import get_backend, make_groups, make_losses

SIZES = [10**3, 10**5, 10**7]
DTYPES = ["float32", "float64"]
BACKEND_NAMES = ["numpy", "torch", "torch-cuda", "cupy", "dask"]
#: backends whose arrays live in host memory (peakmem_ measures the host's resident set)
HOST_BACKENDS = ["numpy", "torch", "dask"]

T_SCALAR = 1.0
#: a 16-point tilt grid from negative to positive tilts (vectorised in one call)
T_GRID = np.linspace(-4.0, 4.0, 16)
N_GROUPS = 10
HIERARCHICAL_TILTS = (-2.0, 1.0)


class _Aggregation:
    """Common setup: seeded losses (and a t-grid) on the chosen backend."""

    params = (SIZES, DTYPES, BACKEND_NAMES)
    param_names = ["n", "dtype", "backend"]
    # 1e7 samples on a 16-point grid is 1.6e8 exponentials per call on the CPU
    timeout = 600
    #: call once in setup, outside the clock (loads CUDA kernels, fills allocator pools)
    warm_up = True

    def setup(self, n, dtype, backend):
        self.backend = get_backend(backend)  # NotImplementedError -> asv skips
        self.losses = self.backend.asarray(make_losses(n, dtype))
        self.t_grid = self.backend.asarray(T_GRID.astype(dtype))
        if self.warm_up:
            self.backend.sync(tiltlab.tilted_risk(self.losses, T_SCALAR))


class TiltedRisk(_Aggregation):
    """``tilted_risk`` for one tilt and for a 16-point tilt grid."""

    def time_tilted_risk(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_risk(self.losses, T_SCALAR))

    def time_tilted_risk_t_grid(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_risk(self.losses, self.t_grid))


class TiltedWeights(_Aggregation):
    """``tilted_weights`` for one tilt and for a 16-point tilt grid (output 16 x n)."""

    def time_tilted_weights(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_weights(self.losses, T_SCALAR))

    def time_tilted_weights_t_grid(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_weights(self.losses, self.t_grid))


class HierarchicalRisk(_Aggregation):
    """Two-level ``hierarchical_risk``/``hierarchical_weights``: 10 groups, tilts (-2, 1)."""

    def setup(self, n, dtype, backend):
        super().setup(n, dtype, backend)
        self.groups = self.backend.asarray(make_groups(n, N_GROUPS))
        if self.warm_up:
            self.backend.sync(
                tiltlab.hierarchical_risk(self.losses, self.groups, HIERARCHICAL_TILTS)
            )

    def time_hierarchical_risk(self, n, dtype, backend):
        self.backend.sync(tiltlab.hierarchical_risk(self.losses, self.groups, HIERARCHICAL_TILTS))

    def time_hierarchical_weights(self, n, dtype, backend):
        self.backend.sync(
            tiltlab.hierarchical_weights(self.losses, self.groups, HIERARCHICAL_TILTS)
        )


class PeakMemory(_Aggregation):
    """Peak resident memory at n = 1e7 (host backends: GPU memory is not seen by peakmem).

    The figure includes the process baseline and the input (n * itemsize bytes); compare
    variants against each other, not against zero.
    """

    params = ([10**7], DTYPES, HOST_BACKENDS)
    # peakmem_ reports the process's maximum resident set, which never goes down: a warm-up
    # call in setup would put its own peak into every figure of the class
    warm_up = False

    def setup(self, n, dtype, backend):
        super().setup(n, dtype, backend)
        self.groups = self.backend.asarray(make_groups(n, N_GROUPS))

    def peakmem_tilted_risk(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_risk(self.losses, T_SCALAR))

    def peakmem_tilted_risk_t_grid(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_risk(self.losses, self.t_grid))

    def peakmem_tilted_weights(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_weights(self.losses, T_SCALAR))

    def peakmem_tilted_weights_t_grid(self, n, dtype, backend):
        self.backend.sync(tiltlab.tilted_weights(self.losses, self.t_grid))

    def peakmem_hierarchical_risk(self, n, dtype, backend):
        self.backend.sync(tiltlab.hierarchical_risk(self.losses, self.groups, HIERARCHICAL_TILTS))


class Bandwidth(_Aggregation):
    """Achieved bandwidth of ``tilted_risk`` (one tilt): bytes of the losses read once / time.

    A lower bound on the memory traffic (an implementation that reads the input twice moves
    twice the bytes), so it compares directly with the device's peak bandwidth.
    """

    unit = "GB/s"
    #: seconds of timed calls per measurement (after one warm-up call in setup)
    seconds_per_measurement = 0.2
    calls_per_measurement = 5

    def track_tilted_risk_bandwidth(self, n, dtype, backend):
        nbytes = n * np.dtype(dtype).itemsize
        times = []
        start = time.perf_counter()
        while (
            len(times) < self.calls_per_measurement
            or time.perf_counter() - start < self.seconds_per_measurement
        ):
            t0 = time.perf_counter()
            self.backend.sync(tiltlab.tilted_risk(self.losses, T_SCALAR))
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9


class HierarchicalManyGroups:
    """``hierarchical_risk`` over 1e6 NumPy losses with 1,000 and 100,000 uniform or
    Zipf-sized groups (tilts (1, -2)), and its time in units of ``tilted_risk`` on the
    same losses (``track_*``: interleaved, medians of 9; the issue's target is <= 3)."""

    params = ([1000, 100_000], ["uniform", "zipf"], DTYPES)
    param_names = ["groups", "sizes", "dtype"]
    n = 10**6
    tilts = (1.0, -2.0)

    def setup(self, groups, sizes, dtype):
        rng = np.random.default_rng(0)
        self.losses = (3 * rng.exponential(size=self.n)).astype(dtype)
        if sizes == "uniform":
            g = rng.integers(0, groups, self.n)
        else:
            w = 1.0 / np.arange(1, groups + 1) ** 1.1
            g = rng.choice(groups, size=self.n, p=w / w.sum())
        self.groups = np.unique(g, return_inverse=True)[1].astype(np.int64)
        tiltlab.hierarchical_risk(self.losses, self.groups, self.tilts)  # compile / load

    def time_hierarchical_risk(self, groups, sizes, dtype):
        tiltlab.hierarchical_risk(self.losses, self.groups, self.tilts)

    def track_hierarchical_risk_in_tilted_risks(self, groups, sizes, dtype):
        times: dict = {"hier": [], "flat": []}
        for _ in range(9):
            t0 = time.perf_counter()
            tiltlab.hierarchical_risk(self.losses, self.groups, self.tilts)
            times["hier"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tiltlab.tilted_risk(self.losses, self.tilts[0])
            times["flat"].append(time.perf_counter() - t0)
        return float(np.median(times["hier"]) / np.median(times["flat"]))

    track_hierarchical_risk_in_tilted_risks.unit = "tilted_risks"
