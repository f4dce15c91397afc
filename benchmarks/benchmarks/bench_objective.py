"""Benchmarks of ``TiltedObjective``: value and gradient, Hessian-vector products, memory.

Parameters: number of samples ``n``, number of features ``d``, the ``loss`` (squared or
logistic, linear-predictor path) and the array ``backend`` (see ``_backends.py``; a backend
that is not installed, or a GPU backend without a GPU, is skipped by raising
``NotImplementedError`` in ``setup``). The tilt is ``t = -2`` throughout (the robust side,
where the tilted weights are far from uniform). Data are float64 and seeded. Every timed
function ends with ``backend.sync(result)`` so that GPU timings include the kernels.
"""

from __future__ import annotations

import numpy as np

import tiltlab

from ._backends import get_backend

SIZES = [10**4, 10**6]
N_FEATURES = [10, 100]
LOSSES = ["squared", "logistic"]
BACKEND_NAMES = ["numpy", "torch", "cupy"]
#: backends whose arrays live in host memory (peakmem_ measures the host's resident set)
HOST_BACKENDS = ["numpy", "torch"]

T = -2.0
N_GROUPS = 10
HIERARCHICAL_TILTS = (1.0, -2.0)


def make_problem(n: int, d: int, loss: str, seed: int = 0):
    """Seeded ``(X, y, theta, v)`` in float64 NumPy: Gaussian features, a planted model.

    ``theta`` is a perturbation of the planted parameter (not a minimiser, so the losses and
    tilted weights are spread out); ``v`` is a unit direction for Hessian-vector products.
    The multinomial problem has 3 classes (``theta`` and ``v`` of shape ``(d, 3)``).
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal(size=(n, d))
    scale = 1.0 / np.sqrt(d)
    if loss == "multinomial":
        truth = scale * rng.standard_normal(size=(d, 3))
        y = np.argmax(X @ truth + rng.gumbel(size=(n, 3)), axis=1).astype(np.int64)
        theta = truth + 0.5 * scale * rng.standard_normal(size=(d, 3))
    else:
        truth = scale * rng.standard_normal(size=d)
        z = X @ truth
        if loss == "logistic":
            y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.float64)
        else:
            y = z + 0.5 * rng.standard_normal(size=n)
        theta = truth + 0.5 * scale * rng.standard_normal(size=d)
    v = rng.standard_normal(size=theta.shape)
    return X, y, theta, v / np.linalg.norm(v)


class _Objective:
    """Common setup: a sample-level objective at t = -2 on the chosen backend."""

    params = (SIZES, N_FEATURES, LOSSES, BACKEND_NAMES)
    param_names = ["n", "d", "loss", "backend"]
    # setup draws up to 1e6 x 100 normals (800 MB) on the CPU
    timeout = 300
    #: call once in setup, outside the clock (loads CUDA kernels, fills allocator pools)
    warm_up = True

    def setup(self, n, d, loss, backend):
        self.backend = get_backend(backend)  # NotImplementedError -> asv skips
        X, y, theta, v = make_problem(n, d, loss)
        to = self.backend.asarray
        self.obj = tiltlab.TiltedObjective(loss, to(X), to(y), t=T)
        self.theta, self.v = to(theta), to(v)
        if self.warm_up:
            self.backend.sync(self.obj.value_and_gradient(self.theta))
            self.backend.sync(self.obj.hvp(self.theta, self.v))


class ValueAndGradient(_Objective):
    """``value_and_gradient``: one pass for ``X @ theta``, one for ``X.T @ (w * l')``."""

    def time_value_and_gradient(self, n, d, loss, backend):
        self.backend.sync(self.obj.value_and_gradient(self.theta))


class HessianVectorProduct(_Objective):
    """``hvp``: Hessian-vector product without forming per-sample gradients."""

    def time_hvp(self, n, d, loss, backend):
        self.backend.sync(self.obj.hvp(self.theta, self.v))


class GradientMemory(_Objective):
    """Peak resident memory of ``gradient`` at n = 1e6, d = 20 (host backends only).

    The figure includes the process baseline and the data (X alone is 160 MB of float64);
    the gradient itself should add N-vectors only, never an ``N x d`` temporary. Compare
    variants with each other, not with zero.
    """

    params = ([10**6], [20], LOSSES, HOST_BACKENDS)
    # peakmem_ reports the process's maximum resident set, which never goes down: a warm-up
    # call in setup would not change the figure, so skip it
    warm_up = False

    def peakmem_gradient(self, n, d, loss, backend):
        self.backend.sync(self.obj.gradient(self.theta))


class Passes:
    """Full passes over the data (products with ``X`` or ``X^T``) per call, on NumPy.

    A cost model, not a timing: solvers report ``n_passes`` as their cost, so a change here
    changes every solver's reported work.
    """

    params = (["squared", "logistic", "multinomial"], ["sample", "hierarchical"])
    param_names = ["loss", "tilt"]
    unit = "passes"

    def setup(self, loss, tilt):
        n, d = 1000, 5
        X, y, theta, v = make_problem(n, d, loss)
        if tilt == "sample":
            kw = {"t": T}
        else:
            groups = np.arange(n) % N_GROUPS
            kw = {"groups": groups, "tilts": HIERARCHICAL_TILTS}
        self.obj = tiltlab.TiltedObjective(loss, X, y, **kw)
        self.theta, self.v = theta, v

    def track_passes_value_and_gradient(self, loss, tilt):
        self.obj.n_passes = 0
        self.obj.value_and_gradient(self.theta)
        return self.obj.n_passes

    def track_passes_hvp(self, loss, tilt):
        self.obj.n_passes = 0
        self.obj.hvp(self.theta, self.v)
        return self.obj.n_passes
