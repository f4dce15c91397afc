"""Benchmarks of the fused CPU kernels (numba), next to one matrix-vector product.

Parameters: the shape ``(n, d)`` (2e5 x 100, 2e4 x 1000, 1e6 x 20), the ``dtype`` and the
``loss`` (squared at t = -2, logistic at t = 1: the logistic loss exercises the
vectorised ``exp``/``log1p`` of the block kernels). ``time_matvec`` is the unit the targets
are stated in (``X @ theta``, NumPy, the same threads); ``track_*_in_matvecs`` report the
ratios measured side by side (interleaved, medians of 5) on one thread (BLAS limited with
threadpoolctl, numba's threads set to 1) in the thread's CPU time, as the Speed page states
its targets, so that the asv history holds numbers that neither the machine's other jobs
nor a threaded BLAS call just before an evaluation move (see ``NextToBlas``). Without
numba every benchmark is skipped (``NotImplementedError`` in ``setup``). Compilation
happens in ``setup`` (numba caches it on disk), never in a timed call.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

SHAPES = ["200000x100", "20000x1000", "1000000x20"]
DTYPES = ["float64", "float32"]
LOSSES = ["squared", "logistic"]


def _problem(shape: str, dtype: str, loss: str):
    n, d = (int(s) for s in shape.split("x"))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)).astype(dtype)
    theta = (rng.standard_normal(d) / np.sqrt(d)).astype(dtype)
    if loss == "squared":
        y = (X @ theta + rng.standard_normal(n)).astype(dtype)
        t = -2.0
    else:
        y = (rng.random(n) < 0.3).astype(dtype)
        t = 1.0
    v = rng.standard_normal(d).astype(dtype)
    return X, y, theta, v, t


@contextlib.contextmanager
def _one_thread():
    """BLAS and the compiled kernels on one thread (threadpoolctl and numba), restored
    after; without threadpoolctl (the ``bench`` extra) the ratio is not measured."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError as exc:  # pragma: no cover - threadpoolctl comes with the extra
        raise NotImplementedError(f"threadpoolctl is not installed: {exc}") from None
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        numba.set_num_threads(before)


class FusedKernels:
    """``fused_value_and_gradient``, ``fused_hvp`` and the linearised product."""

    params = (SHAPES, DTYPES, LOSSES)
    param_names = ["shape", "dtype", "loss"]
    timeout = 600

    def setup(self, shape, dtype, loss):
        try:
            from tiltlab import _cpu_kernels as ck
        except ImportError as exc:  # pragma: no cover - older tiltlab
            raise NotImplementedError(str(exc)) from None
        if not ck.available():
            raise NotImplementedError("numba is not installed")
        self.X, self.y, self.theta, self.v, self.t = _problem(shape, dtype, loss)
        self.fp = ck.FusedProblem(loss, self.X, self.y)  # bound once, as an engine does
        self.lin = self.fp.linearize(self.theta, self.t)
        self.time_value_and_gradient(shape, dtype, loss)  # compile (or load) outside clocks
        self.time_hvp(shape, dtype, loss)
        self.time_linearized_hvp(shape, dtype, loss)

    def time_matvec(self, shape, dtype, loss):
        self.X @ self.theta

    def time_value_and_gradient(self, shape, dtype, loss):
        self.fp.value_and_gradient(self.theta, self.t)

    def time_hvp(self, shape, dtype, loss):
        self.fp.hvp(self.theta, self.v, self.t)

    def time_linearized_hvp(self, shape, dtype, loss):
        self.lin.hvp(self.v)

    def _ratio(self, fn) -> float:
        times: dict = {"matvec": [], "fn": []}
        with _one_thread():
            fn()  # the one-thread launch path, before the clocks
            for _ in range(5):
                t0 = time.thread_time()
                self.X @ self.theta
                times["matvec"].append(time.thread_time() - t0)
                t0 = time.thread_time()
                fn()
                times["fn"].append(time.thread_time() - t0)
        return float(np.median(times["fn"]) / np.median(times["matvec"]))

    def track_value_and_gradient_in_matvecs(self, shape, dtype, loss):
        return self._ratio(lambda: self.time_value_and_gradient(shape, dtype, loss))

    track_value_and_gradient_in_matvecs.unit = "matvecs"

    def track_hvp_in_matvecs(self, shape, dtype, loss):
        return self._ratio(lambda: self.time_hvp(shape, dtype, loss))

    track_hvp_in_matvecs.unit = "matvecs"

    def track_linearized_hvp_in_matvecs(self, shape, dtype, loss):
        return self._ratio(lambda: self.time_linearized_hvp(shape, dtype, loss))

    track_linearized_hvp_in_matvecs.unit = "matvecs"


class NextToBlas:
    """Value and gradient at 2e5 x 100 float64 as a solver calls it: right after one
    threaded NumPy ``X @ theta`` (OpenBLAS's pool is then spinning), against the same call
    after an evaluation. ``track_after_blas_in_alone`` is the ratio of the two (medians of
    7, interleaved; 1 means that the BLAS pool takes nothing from the kernels)."""

    timeout = 600

    def setup(self):
        try:
            from tiltlab import _cpu_kernels as ck
        except ImportError as exc:  # pragma: no cover - older tiltlab
            raise NotImplementedError(str(exc)) from None
        if not ck.available():
            raise NotImplementedError("numba is not installed")
        self.X, self.y, self.theta, _, self.t = _problem("200000x100", "float64", "squared")
        self.fp = ck.FusedProblem("squared", self.X, self.y)
        self.fp.value_and_gradient(self.theta, self.t)

    def time_matvec_then_value_and_gradient(self):
        self.X @ self.theta
        self.fp.value_and_gradient(self.theta, self.t)

    def track_after_blas_in_alone(self):
        times: dict = {"alone": [], "after": []}
        for _ in range(7):
            self.fp.value_and_gradient(self.theta, self.t)
            t0 = time.perf_counter()
            self.fp.value_and_gradient(self.theta, self.t)
            times["alone"].append(time.perf_counter() - t0)
            self.X @ self.theta
            t0 = time.perf_counter()
            self.fp.value_and_gradient(self.theta, self.t)
            times["after"].append(time.perf_counter() - t0)
        return float(np.median(times["after"]) / np.median(times["alone"]))

    track_after_blas_in_alone.unit = "evaluations"
