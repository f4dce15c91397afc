"""Cells of notebooks/backends_and_gpu.ipynb (see ../_build_notebooks.py)."""

CELLS = [
    (
        "md",
        """# Backends and GPU: NumPy, PyTorch, CuPy (and Dask)

tiltlab runs the same code on every array library that speaks the array API. This notebook
times three workloads on every backend installed **on the machine that runs it**, and
prints what it measured:

1. `tilted_risk` of a vector of losses (one log-sum-exp pass);
2. the value and gradient of a tilted least-squares objective (two passes over `X`);
3. a full `minimize` (L-BFGS) of a tilted logistic regression.

Backends that are not installed (CuPy without a GPU, say) are skipped. Each time is the
median of several runs after a warm-up, with the GPU synchronised before the clock stops.
The notebook stored in the repository was executed on a CPU machine; the last section
shows a run of the same code on an NVIDIA H100, recorded in
`notebooks/data/backends_h100.json`.""",
    ),
    (
        "code",
        """import json
import os
import platform
import time
from pathlib import Path

import numpy as np

import tiltlab as tl

SMALL = os.environ.get("TILTLAB_BENCH_SCALE", "small") == "small"
N_RISK = 10**6 if SMALL else 10**7
N_OBJ, D_OBJ = (100_000, 50) if SMALL else (2_000_000, 100)
N_FIT, D_FIT = (10_000, 20) if SMALL else (500_000, 50)


def backends():
    found = {"numpy": (np, None)}
    try:
        import torch

        found["torch (cpu)"] = (torch, "cpu")
        if torch.cuda.is_available():
            found["torch (cuda)"] = (torch, "cuda")
    except ImportError:
        pass
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()  # raises without a usable GPU
        found["cupy"] = (cupy, None)
    except Exception:  # any failure means: no usable CuPy here
        pass
    return found


def to_backend(a, lib, device):
    if lib.__name__ == "torch":
        return lib.asarray(a, device=device)
    return lib.asarray(a)


def sync(lib, device):
    if lib.__name__ == "cupy":
        lib.cuda.Device().synchronize()
    elif lib.__name__ == "torch" and device == "cuda":
        lib.cuda.synchronize()


def median_time(fn, lib, device, repeat=5):
    fn()  # warm-up (kernel compilation, caches)
    sync(lib, device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(lib, device)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


BACKENDS = backends()
print("machine:", platform.processor() or platform.machine(),
      "| backends:", ", ".join(BACKENDS))""",
    ),
    ("md", "## Measure"),
    (
        "code",
        """rng = np.random.default_rng(0)
losses = rng.exponential(size=N_RISK)
Xo = rng.standard_normal((N_OBJ, D_OBJ))
yo = Xo @ rng.standard_normal(D_OBJ) + rng.standard_normal(N_OBJ)
Xf = rng.standard_normal((N_FIT, D_FIT))
yf = Xf @ rng.standard_normal(D_FIT) + rng.standard_normal(N_FIT)
yf = (yf > 1.0).astype(np.float64)

results = []
for name, (lib, device) in BACKENDS.items():
    for dtype in ("float64", "float32"):
        def conv(a, lib=lib, device=device, dtype=dtype):
            return to_backend(a.astype(dtype), lib, device)

        ell = conv(losses)
        obj = tl.TiltedObjective("squared", conv(Xo), conv(yo), t=1.0)
        theta = conv(np.zeros(D_OBJ))
        fit = tl.TiltedObjective("logistic", conv(Xf), conv(yf), t=5.0, l2=1e-3)
        results.append({
            "backend": name,
            "dtype": dtype,
            "tilted_risk": median_time(lambda: tl.tilted_risk(ell, 2.0), lib, device),
            "value_and_gradient": median_time(
                lambda: obj.value_and_gradient(theta), lib, device),
            "minimize": median_time(lambda: tl.minimize(fit, method="lbfgs", tol=1e-6),
                                    lib, device, repeat=3),
        })

WORK = ("tilted_risk", "value_and_gradient", "minimize")
print(f"sizes: tilted_risk N={N_RISK:,}; value_and_gradient {N_OBJ:,} x {D_OBJ}; "
      f"minimize (lbfgs, logistic, t=5) {N_FIT:,} x {D_FIT}")
print("median times in milliseconds:")
print(f"{'backend':>13} {'dtype':>7}" + "".join(f"{w:>19}" for w in WORK))
for r in results:
    cells = "".join(f"{1e3 * r[w]:19.2f}" for w in WORK)
    print(f"{r['backend']:>13} {r['dtype']:>7}" + cells)

out = os.environ.get("TILTLAB_BENCH_JSON")
if out:  # used to record the run shown in the last section
    Path(out).write_text(json.dumps({"sizes": [N_RISK, N_OBJ, D_OBJ, N_FIT, D_FIT],
                                     "results": results}, indent=1))""",
    ),
    (
        "md",
        """Every result comes back in the input's library, dtype and device; nothing here
was converted to NumPy behind the scenes. On a shared CPU machine the timings are noisy
(other processes run at the same time); compare backends within one run only.

PyTorch on the CPU is usually slower than NumPy for the objective and, by several
times, for the solver. tiltlab runs the same sequence of array operations on both; a
solver makes many small ones, whose cost is dominated by the library's per-call overhead,
which is larger for PyTorch (dispatch and autograd bookkeeping), and PyTorch's CPU thread
pool also competes with other processes on a small machine. On the CPU, use NumPy; PyTorch pays off on a GPU, or when
the losses come from a PyTorch model whose gradients flow through autograd.

## Dask

Dask arrays run the same calls lazily, chunk by chunk; `.compute()` runs the graph.""",
    ),
    (
        "code",
        """try:
    import dask.array as da
except ImportError:
    print("dask not installed: skipped")
else:
    ell = da.from_array(losses, chunks=N_RISK // 8)
    lazy = tl.tilted_risk(ell, 2.0)
    start = time.perf_counter()
    value = float(lazy.compute())
    print(f"dask, 8 chunks: {1e3 * (time.perf_counter() - start):.1f} ms;",
          "same as numpy:",
          np.isclose(value, float(tl.tilted_risk(losses, 2.0)), rtol=1e-12))""",
    ),
    (
        "md",
        """## Recorded: the same code on an NVIDIA H100

`notebooks/data/backends_h100.json` was written by this notebook's measuring cell run on
a machine with one NVIDIA H100 (80 GB) and 16 CPU cores, with
`TILTLAB_BENCH_SCALE=large` (ten to fifty times larger problems than above) and
`TILTLAB_BENCH_JSON` set. The table below is read from that file, not measured here; the
file records the software versions and the tiltlab revision it ran.""",
    ),
    (
        "code",
        """record = Path("data") / "backends_h100.json"
if not record.exists():
    print("no recorded GPU run in", record)
else:
    rec = json.loads(record.read_text())
    for key, value in rec["provenance"].items():
        print(f"{key}: {value}")
    n_risk, n_obj, d_obj, n_fit, d_fit = rec["sizes"]
    print(f"sizes: tilted_risk N={n_risk:,}; value_and_gradient {n_obj:,} x {d_obj}; "
          f"minimize {n_fit:,} x {d_fit}")
    print("median times in milliseconds:")
    print(f"{'backend':>13} {'dtype':>7}" + "".join(f"{w:>19}" for w in WORK))
    base = {r["dtype"]: r for r in rec["results"] if r["backend"] == "numpy"}
    for r in rec["results"]:
        print(f"{r['backend']:>13} {r['dtype']:>7}"
              + "".join(f"{1e3 * r[w]:19.2f}" for w in WORK))
    print()
    print("speed-up over NumPy on the same machine (same dtype):")
    for r in rec["results"]:
        if r["backend"] != "numpy":
            ratios = [base[r["dtype"]][w] / r[w] for w in WORK]
            cells = "".join(f"{x:18.1f}x" for x in ratios)
            print(f"{r['backend']:>13} {r['dtype']:>7}" + cells)""",
    ),
]
