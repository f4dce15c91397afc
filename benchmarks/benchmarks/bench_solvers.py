"""Benchmarks of ``tiltlab.minimize``: work to tolerance (iterations, passes) and wall time.

Problems: seeded synthetic logistic and squared-loss regressions from
``bench_objective.make_problem`` (Gaussian features, a planted model), ``N = 5000``,
``d = 50``, ridge ``l2 = 1e-3``, sample-level tilt ``t``. Every run starts from zero and
stops at ``tol = 1e-8`` (``||grad|| <= 1e-8 ||grad(0)||``) or at the method's default
``max_iter``.

- ``Work``: ``track_iterations``, ``track_passes`` (full passes over the data, unit
  "passes") and ``track_relative_gradient`` (final ``||grad|| / ||grad(0)||``, unit
  "ratio") for every method in {gd, agd, lbfgs, newton}, tilt in {-2, 0, 2, 50} and loss,
  on NumPy. These are cost counts, not timings: they do not depend on the machine's speed
  (BLAS summation order can move an iteration count by a little). A run that hits ``max_iter``
  reports the capped count; ``track_relative_gradient`` above 1e-8 marks it.
- ``Minimize``: ``time_minimize`` per method and loss at t = 2 (convex for both losses, so
  every method converges to the same minimiser), on NumPy and PyTorch (CPU); a backend that
  is not installed is skipped (``NotImplementedError`` in ``setup``).

``Work`` solves each problem once in ``setup_cache``; ``Minimize``'s ``setup`` draws the data,
builds the objective and makes a two-iteration warm-up solve, and the solve to tolerance
is what is timed.
"""

from __future__ import annotations

import tiltlab

from ._backends import get_backend
from .bench_objective import make_problem

METHODS = ["gd", "agd", "lbfgs", "newton"]
TILTS = [-2.0, 0.0, 2.0, 50.0]
LOSSES = ["logistic", "squared"]
BACKEND_NAMES = ["numpy", "torch"]

N, D = 5000, 50
L2 = 1e-3
TOL = 1e-8
#: tilt of the timed runs
T_TIME = 2.0


class Work:
    """Iterations and passes over the data to reach ``tol = 1e-8``, on NumPy.

    Every problem is solved once, in ``setup_cache`` (asv runs it once and hands its result
    to each benchmark): the three counts of a solve come from the same run.
    """

    params = (METHODS, TILTS, LOSSES)
    param_names = ["method", "t", "loss"]
    # the 32 solves of setup_cache; gd at t = 50 on the squared loss runs its
    # 10,000-iteration budget (about 5 s on a quiet machine)
    timeout = 1200

    def setup_cache(self):
        work = {}
        for loss in LOSSES:
            X, y, _, _ = make_problem(N, D, loss)
            for t in TILTS:
                for method in METHODS:  # a new objective each: no cache carried over
                    obj = tiltlab.TiltedObjective(loss, X, y, t=t, l2=L2)
                    res = tiltlab.minimize(obj, method=method, tol=TOL)
                    grad_norm = res.history["grad_norm"]
                    work[(method, t, loss)] = (
                        int(res.nit), float(res.n_passes), float(grad_norm[-1] / grad_norm[0])
                    )
        return work

    def track_iterations(self, work, method, t, loss):
        return work[(method, t, loss)][0]

    track_iterations.unit = "iterations"

    def track_passes(self, work, method, t, loss):
        return work[(method, t, loss)][1]

    track_passes.unit = "passes"

    def track_relative_gradient(self, work, method, t, loss):
        return work[(method, t, loss)][2]

    track_relative_gradient.unit = "ratio"


class Minimize:
    """Wall time of ``minimize`` to ``tol = 1e-8`` at t = 2, from zero."""

    params = (METHODS, LOSSES, BACKEND_NAMES)
    param_names = ["method", "loss", "backend"]
    timeout = 300

    def setup(self, method, loss, backend):
        self.backend = get_backend(backend)  # NotImplementedError -> asv skips
        X, y, _, _ = make_problem(N, D, loss)
        to = self.backend.asarray
        self.obj = tiltlab.TiltedObjective(loss, to(X), to(y), t=T_TIME, l2=L2)
        # warm-up, outside the clock: two iterations load lazily imported code (the dense
        # Newton solve), torch's kernels and allocator pools
        self.backend.sync(tiltlab.minimize(self.obj, method=method, max_iter=2).x)

    def time_minimize(self, method, loss, backend):
        self.backend.sync(tiltlab.minimize(self.obj, method=method, tol=TOL).x)
