"""Where a CuPy call spends its time: the host's issue time against the stream's, and the
kernels of one call (for Nsight Compute).

::

    python benchmarks/gpu_profile.py host
    python benchmarks/gpu_profile.py stages
    ncu --csv --metrics gpu__time_duration.sum --profile-from-start off \\
        python benchmarks/gpu_profile.py one CASE      # CASE: risk, weights, vg16, vg128

``host`` prints, for ``tilted_risk`` and ``tilted_weights`` of 1e7 float32 losses and
``TiltedObjective.value_and_gradient`` (logistic, t = 1, 1e7 x 16 and 1e7 x 128 float32),
the host time per call of 30 calls issued back to back and the CUDA-event time of the
same loop: equal times mean that every call waits for the device (its one read). ``one``
runs one call of CASE between ``cudaProfilerStart`` and ``cudaProfilerStop`` after five
warm-up calls, so that ``ncu --profile-from-start off`` lists the kernels of that call
alone. Nsight Compute locks the clocks at their base rate by default, so its kernel times
run longer than in a free run. ``stages`` times, with CUDA events (medians of 15), each
kernel of a call launched alone and the whole call: for ``value_and_gradient`` (logistic,
t = 1, 1e7 x 16 and 1e7 x 128, float32 and float64, at the default launch shape) the
fused kernel, the finish and the gradient's product; for ``tilted_risk`` (1e7 normal
losses) the extremes' pass, the sums' pass, the finish and the read of the status; beside
a device-to-device copy of 4 GiB.
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


def _median_ms(fn, reps=15, warm=3) -> float:
    """Median CUDA-event time of ``fn`` in ms (``gpu_report``'s timer)."""
    import cupy as cp
    from gpu_report import _timeit

    return _timeit(fn, cp.cuda.Device().synchronize, repeat=reps, warmup=warm) * 1e3


def _copy_rate() -> float:
    """GB/s (read + write) of a device-to-device copy of 4 GiB (``gpu_report``'s)."""
    from gpu_report import copy_bandwidth

    return copy_bandwidth() / 1e9


def _vg_stages(copy: float, dt, d: int, n: int = 10_000_000) -> None:
    import math

    import cupy as cp

    from tiltlab._cupy import engine, source

    X = cp.random.default_rng(d).standard_normal((n, d), dtype=dt)
    th = np.random.default_rng(0).standard_normal(d) / math.sqrt(d)
    th = cp.asarray(th.astype(dt))
    y = (cp.random.default_rng(2).random(n) < 0.5).astype(dt)
    T = np.dtype(dt).type
    src = source.vg_source("logistic", dt, d)
    kern, fin = source.function(src, "tilted_vg"), source.function(src, "tilted_vg_finish")
    prod = source.function(src, "tilted_vg_grad")
    blocks = engine._grid(src, n, source.launch_shape(d)[0])
    st, f = cp.empty((blocks, 7), dt), cp.empty(blocks + 1, dt)
    acc, out, g = cp.empty((blocks + 1, d), dt), cp.empty(2, dt), cp.empty(d, dt)
    nn, dd, one = cp.int64(n), cp.int32(d), T(1.0)
    fin_args = (
        st,
        cp.int64(blocks),
        one,
        T(engine.tiny_sqrt(dt)),
        th,
        dd,
        T(0.0),
        f,
        acc[blocks],
        out,
    )
    t1 = _median_ms(lambda: kern((blocks,), (256,), (X, y, th, nn, dd, one, st, acc)))
    t2 = _median_ms(lambda: fin((1,), (engine.FINISH_THREADS,), fin_args))
    t3 = _median_ms(
        lambda: prod(
            (-(-d // 32),), (32 * engine.GRAD_WARPS,), (f, acc, cp.int64(blocks + 1), dd, g)
        )
    )
    call = _median_ms(lambda: engine.value_and_gradient(X, y, th, 1.0, "logistic"))
    print(
        f"value_and_gradient {np.dtype(dt).name} d={d} shape={source.launch_shape(d)} "
        f"blocks={blocks}: kernel {t1 * 1e3:.0f} us ({X.nbytes / t1 / 1e6 / copy:.2f}), "
        f"finish {t2 * 1e3:.1f} us, product {t3 * 1e3:.1f} us, call {call * 1e3:.0f} us "
        f"({X.nbytes / call / 1e6 / copy:.2f})",
        flush=True,
    )


def _risk_stages(dt, n: int = 10_000_000) -> None:
    import cupy as cp

    from tiltlab._cupy import reductions, source

    l = cp.random.default_rng(0).standard_normal(n, dtype=dt)
    src = source.reduction_source(dt)
    blocks = max(1, min(reductions.MAX_BLOCKS, -(-n // (reductions.BLOCK_THREADS * 8))))
    ext, parts, out = cp.empty(2 * blocks, dt), cp.empty((blocks, 7), dt), cp.empty(4, dt)
    nn, nb, T = cp.int64(n), cp.int64(blocks), np.dtype(dt).type
    grid, block = (blocks,), (reductions.BLOCK_THREADS,)
    kernels = [
        (source.function(src, "tilted_extremes_blocks"), grid, block, (l, nn, ext)),
        (source.function(src, "tilted_sums_blocks"), grid, block, (l, nn, T(1.0), ext, nb, parts)),
        (
            source.function(src, "tilted_state_finish"),
            (1,),
            (reductions.FINISH_THREADS,),
            (parts, nb, T(1.0), T(1e-19), out),
        ),
    ]

    def launch(k):
        k[0](k[1], k[2], k[3])

    def all_three():
        for k in kernels:
            launch(k)

    times = [_median_ms(lambda k=k: launch(k)) * 1e3 for k in kernels]
    read = _median_ms(lambda: (all_three(), out[1:2].get())) * 1e3 - _median_ms(all_three) * 1e3
    call = _median_ms(lambda: reductions.tilted_risk(l, 1.0)) * 1e3
    print(
        f"tilted_risk {np.dtype(dt).name}: extremes {times[0]:.1f} us, sums "
        f"{times[1]:.1f} us, finish {times[2]:.1f} us, status read {read:.1f} us; call "
        f"{call:.1f} us; CuPy sum {_median_ms(lambda: l.sum()) * 1e3:.1f} us",
        flush=True,
    )


def stages() -> None:
    copy = _copy_rate()
    print(f"copy {copy:.0f} GB/s (read + write, 4 GiB)", flush=True)
    for dt, d in ((np.float32, 16), (np.float64, 16), (np.float32, 128), (np.float64, 128)):
        _vg_stages(copy, dt, d)
    for dt in (np.float32, np.float64):
        _risk_stages(dt)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "host":
        host()
    elif len(sys.argv) >= 2 and sys.argv[1] == "stages":
        stages()
    elif len(sys.argv) == 3 and sys.argv[1] == "one":
        one(sys.argv[2])
    else:
        sys.exit(__doc__)
