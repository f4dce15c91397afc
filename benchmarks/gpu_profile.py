"""Where a CuPy call spends its time: the host's issue time against the stream's, and the
kernels of one call (for Nsight Compute).

::

    python benchmarks/gpu_profile.py host
    ncu --csv --metrics gpu__time_duration.sum --profile-from-start off \\
        python benchmarks/gpu_profile.py one CASE      # CASE: risk, weights, vg16, vg128

``host`` prints, for ``tilted_risk`` and ``tilted_weights`` of 1e7 float32 losses and
``TiltedObjective.value_and_gradient`` (logistic, t = 1, 1e7 x 16 and 1e7 x 128 float32),
the host time per call of 30 calls issued back to back and the CUDA-event time of the
same loop: equal times mean that every call waits for the device (its one read). ``one``
runs one call of CASE between ``cudaProfilerStart`` and ``cudaProfilerStop`` after five
warm-up calls, so that ``ncu --profile-from-start off`` lists the kernels of that call
alone. Nsight Compute locks the clocks at their base rate by default, so its kernel times
run longer than in a free run.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def _case(name):
    import cupy as cp

    import tiltlab
    from tiltlab.losses import LogisticLoss

    n = 10_000_000
    if name in ("risk", "weights"):
        l = cp.asarray(np.random.default_rng(0).gamma(2.0, 1.0, size=n).astype(np.float32))
        if name == "risk":
            return "tilted_risk 1e7 f32", lambda: tiltlab.tilted_risk(l, 1.0)
        return "tilted_weights 1e7 f32", lambda: tiltlab.tilted_weights(l, 1.0)
    d = int(name[2:])
    X = cp.random.default_rng(d).standard_normal((n, d), dtype=cp.float32)
    y = (cp.random.default_rng(2).random(n) < 0.3).astype(cp.float32)
    obj = tiltlab.TiltedObjective(LogisticLoss(), X, y, t=1.0)
    rng = np.random.default_rng(0)
    th = cp.asarray(rng.standard_normal(d).astype(np.float32) / np.sqrt(d))
    return f"value_and_gradient 1e7x{d} f32", lambda: obj.value_and_gradient(th)


def host() -> None:
    import cupy as cp

    for name in ("risk", "weights", "vg16", "vg128"):
        label, fn = _case(name)
        for _ in range(5):
            fn()
        cp.cuda.Device().synchronize()
        n = 30
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        issue = (time.perf_counter() - t0) / n
        e1.record()
        e1.synchronize()
        stream = cp.cuda.get_elapsed_time(e0, e1) / 1e3 / n
        print(
            f"{label}: host issue {issue * 1e6:.1f} us/call, stream {stream * 1e6:.1f} us/call",
            flush=True,
        )


def one(name: str) -> None:
    import cupy as cp

    _, fn = _case(name)
    for _ in range(5):
        fn()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    fn()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "host":
        host()
    elif len(sys.argv) == 3 and sys.argv[1] == "one":
        one(sys.argv[2])
    else:
        sys.exit(__doc__)
