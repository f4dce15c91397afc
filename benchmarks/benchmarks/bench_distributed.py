"""Benchmarks of ``TiltedObjective`` on Dask arrays: graphs, chunk reads and time per evaluation.

The data are ``N x D`` float64 (a seeded logistic regression, chunks of ``CHUNK`` rows),
persisted in memory, on Dask's synchronous scheduler in this process (the costs of the
tasks themselves, without a cluster's messages), on one thread: BLAS limited to one
thread (threadpoolctl) and the compiled kernels too (numba), so that CPU times compare the
work done rather than the threads spinning. ``kind`` is the sample-level objective
(``t = -1``) or a two-level hierarchy over ``GROUPS`` Zipf-sized groups (tilts ``(-1, 2)``).

- ``track_graphs_per_evaluation`` (unit "graphs"): the graphs one ``value_and_gradient``
  computes (both results fetched by one ``dask.compute``); a count, not a timing.
- ``track_chunk_reads_per_evaluation`` (unit "passes"): how many tasks of that graph take
  each persisted chunk of ``X`` (the largest over the chunks): the sweeps over the data.
- ``track_evaluation_in_plain_passes`` (unit "plain passes"): the CPU time of one
  ``value_and_gradient`` over that of one plain Dask pass over the same persisted data,
  the value and gradient of the untilted least squares in Dask's own graph
  (``X.T @ (X @ theta - y)`` with the sum of squares, one ``dask.compute``); interleaved,
  medians of 7. A ratio of times measured side by side, so it compares across machines
  better than a time, but it is still a timing: reported, never gated.
- ``time_value_and_gradient``: the evaluation's wall time.

``setup`` compiles (or loads from numba's cache) the chunk kernels before anything is
measured (``TILTLAB_FUSED=wait`` unless the variable is set): the figures are those of a
process that has evaluated the objective before, not of the first evaluations, which take
the generic route while a background process compiles the kernels.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

import tiltlab

N, D = 200_000, 32
CHUNK = 1 << 15
GROUPS = 200
T = -1.0
TILTS = (-1.0, 2.0)


def _zipf_groups(n: int, n_groups: int, rng) -> np.ndarray:
    w = 1.0 / np.arange(1, n_groups + 1) ** 1.1
    return rng.choice(n_groups, size=n, p=w / w.sum()).astype(np.int64)


class DaskEvaluation:
    """One ``value_and_gradient`` of a persisted Dask objective (see the module doc)."""

    params = (["sample", "hierarchy"],)
    param_names = ["kind"]
    timeout = 300

    def setup(self, kind):
        try:
            import dask
            import dask.array as da
        except ImportError as exc:
            raise NotImplementedError(f"dask is not installed: {exc}") from None
        self.dask = dask
        os.environ.setdefault("TILTLAB_FUSED", "wait")  # compiled here, not in the background
        rng = np.random.default_rng(0)
        X = rng.standard_normal((N, D))
        theta = rng.standard_normal(D) / np.sqrt(D)
        y = (rng.random(N) < 1.0 / (1.0 + np.exp(-(X @ theta)))).astype(np.float64)
        kw = {"t": T} if kind == "sample" else {"groups": _zipf_groups(N, GROUPS, rng),
                                                 "tilts": TILTS}
        self._config = dask.config.set(scheduler="synchronous")
        self._config.__enter__()
        self._limits = None
        try:
            from threadpoolctl import threadpool_limits

            self._limits = threadpool_limits(1)
        except ImportError:
            pass
        try:
            import numba

            numba.set_num_threads(1)
        except ImportError:
            pass
        Xd, yd = dask.persist(
            da.from_array(X, chunks=(CHUNK, D)), da.from_array(y, chunks=CHUNK)
        )
        self.Xd, self.yd = Xd, yd
        self.obj = tiltlab.TiltedObjective("logistic", Xd, yd, **kw)
        # theta as a Dask array: older versions took no NumPy parameter for Dask data
        self.theta = da.from_array(0.5 * theta)
        for _ in range(2):  # distributes the data; compiles or loads the chunk kernels
            self.evaluate()
            self.plain_pass()

    def teardown(self, kind):
        self._config.__exit__(None, None, None)
        if self._limits is not None:
            self._limits.restore_original_limits()

    def evaluate(self):
        out = self.obj.value_and_gradient(self.theta)
        return self.dask.compute(*out)

    def plain_pass(self):
        r = self.Xd @ self.theta - self.yd
        return self.dask.compute(0.5 * (r * r).sum(), self.Xd.T @ r)

    def _count(self):
        from dask.callbacks import Callback

        counts = {"graphs": 0, "reads": 0}

        def start_state(dsk, state):
            counts["graphs"] += 1
            for key, value in state["cache"].items():
                if isinstance(value, np.ndarray) and value.ndim == 2 and value.shape[1] == D:
                    reads = len(state["dependents"].get(key, ()))
                    counts["reads"] = max(counts["reads"], reads)

        with Callback(start_state=start_state):
            self.evaluate()
        return counts

    def track_graphs_per_evaluation(self, kind):
        return self._count()["graphs"]

    track_graphs_per_evaluation.unit = "graphs"

    def track_chunk_reads_per_evaluation(self, kind):
        return self._count()["reads"]

    track_chunk_reads_per_evaluation.unit = "passes"

    def track_evaluation_in_plain_passes(self, kind):
        times: dict = {"eval": [], "plain": []}
        for _ in range(7):
            t0 = time.process_time()
            self.evaluate()
            times["eval"].append(time.process_time() - t0)
            t0 = time.process_time()
            self.plain_pass()
            times["plain"].append(time.process_time() - t0)
        return float(statistics.median(times["eval"]) / statistics.median(times["plain"]))

    track_evaluation_in_plain_passes.unit = "plain passes"

    def time_value_and_gradient(self, kind):
        self.evaluate()
