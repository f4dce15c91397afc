"""GPU report: the CuPy test subset and tiltlab's throughput against the device's bandwidth.

One command, one process for the measurements::

    python benchmarks/gpu_report.py --json gpu_report.json

It

1. runs the tests that need a device (``pytest -m gpu --tier full``) in a subprocess and
   records its summary (``--no-tests`` skips it);
2. measures the device-to-device copy bandwidth (bytes read plus bytes written per second)
   of a large CuPy array;
3. times ``tilted_risk`` (N = 1e7) and ``TiltedObjective.value_and_gradient`` (N = 1e7,
   d in {16, 128}, squared and logistic losses) in float32 and float64, through the fused
   CuPy kernel and through the generic array-API path, and reports the bytes of input read
   once per second as a fraction of the copy bandwidth;
4. times the same objective written in PyTorch on CUDA and differentiated by autograd
   (``logsumexp`` of ``t * losses``), and reports tiltlab's speed-up over it;
5. checks the fused kernel, the generic path and PyTorch against each other on every case;
6. times ``hierarchical_risk`` with 1000 groups against ``tilted_risk`` of the same losses
   (one level of device integer labels; and two nested levels of 100 and 1000 groups,
   whose group tree the function builds on the device at every call), and the value and
   gradient of hierarchical objectives (one level of 1000 groups, two levels of 100 and
   1000; the group tree uploaded once per objective) against the generic path and
   against the sample-level objective of the same data;
7. times a training step of a small MLP (batch 512) with ``tiltlab.torch.TiltedLoss``
   against the same step with a mean loss, on CUDA (bf16 autocast; eager and compiled)
   and on the CPU (eager), interleaved;
8. fits ``TiltedClassifier`` and ``TiltedRegressor`` (t = 0 and t != 0, ``random_state``
   fixed) on CuPy arrays (scikit-learn's array-API dispatch, in a subprocess with
   ``SCIPY_ARRAY_API=1``) and on the same data in NumPy, at 5e5 x 64 and 1e6 x 64 in
   float64, and reports the coefficients' relative difference and the ratio of the fit
   times (wall clock, the device synchronised, medians of 2 after an untimed fit on
   20,000 rows; ``--no-estimators`` skips it).

The report names the device, the commit measured (``git rev-parse HEAD``) and a digest
of the device code (``cuda_sources``: ``tilt.cuh`` and ``kernels.cu``), from which the
test suite tells whether the kernels changed after the figures the pages quote.

Times are medians of CUDA-event timings after warm-up. It prints a table and writes JSON.
Nothing runs without a GPU (the script exits with a message); ``--dry-run`` lists the
cases and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np


def _timeit(fn, sync, repeat=9, warmup=2):
    import cupy

    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(out))


def copy_bandwidth(nbytes=4 << 30):
    import cupy

    a = cupy.ones(nbytes // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    sec = _timeit(lambda: cupy.copyto(b, a), cupy.cuda.Device().synchronize)
    return 2 * nbytes / sec  # read + write


def run_tests():
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", "-m", "gpu",
         "--tier", "full"],
        capture_output=True, text=True,
    )
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    fails = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    return {"returncode": proc.returncode, "summary": tail, "failed": fails[:50],
            "seconds": time.time() - t0}


def _commit():
    if os.environ.get("TILTLAB_COMMIT"):
        return os.environ["TILTLAB_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # not a checkout
        return "unknown"


def _torch_objective(torch, X, y, theta, t, loss):
    th = theta.clone().requires_grad_(True)
    z = X @ th
    if loss == "squared":
        ell = (z - y) ** 2
    else:
        ell = torch.nn.functional.softplus(z) - y * z
    n = ell.shape[0]
    val = (torch.logsumexp(t * ell, 0) - math.log(n)) / t
    (g,) = torch.autograd.grad(val, th)
    return val.detach(), g


def loss_step_ratio(torch, device, compiled=False, repeat=21, batch=512):
    """Median time of a training step of a small MLP with ``tiltlab.torch.TiltedLoss``
    over the same step with a plain mean loss, timed interleaved (bf16 autocast on CUDA).
    Returns ``(ratio, tilted_ms, mean_ms)``."""
    from tiltlab.torch import TiltedLoss

    torch.manual_seed(0)
    X = torch.randn(batch, 784, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def make(loss_fn):
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
            torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16,
                                enabled=device == "cuda"):
                loss = loss_fn(model(X), y)
            loss.backward()
            opt.step()

        return torch.compile(step) if compiled else step

    tilted = make(TiltedLoss(torch.nn.CrossEntropyLoss(reduction="none"), t=1.0))
    mean = make(torch.nn.CrossEntropyLoss())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = {"tilted": [], "mean": []}
    for _ in range(3):  # warm-up (and compilation)
        tilted()
        mean()
    for _ in range(repeat):
        for name, fn in (("tilted", tilted), ("mean", mean)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    t_ms = float(np.median(times["tilted"])) * 1e3
    m_ms = float(np.median(times["mean"])) * 1e3
    return t_ms / m_ms, t_ms, m_ms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--losses", default="squared,logistic",
                    help="losses of the value-and-gradient rows at the largest d: a comma "
                         "list, or 'all' for every loss the CUDA kernels serve (the smaller "
                         "d take squared and logistic)")
    ap.add_argument("--risk-n", type=int, default=0,
                    help="also time float32 tilted_risk and tilted_weights at this many "
                         "losses (0: only at --n)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--no-torch-step", action="store_true",
                    help="skip the TiltedLoss training-step ratios")
    ap.add_argument("--no-estimators", action="store_true",
                    help="skip the estimator fits on CuPy against NumPy")
    ap.add_argument("--estimators-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true",
                    help="list the cases and exit (no GPU needed)")
    args = ap.parse_args(argv)
    if args.estimators_only:  # the subprocess of estimator_rows
        print(json.dumps(_estimator_fits()))
        return 0
    if args.dry_run:
        for case in _cases(args):
            print(case)
        return 0
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # pragma: no cover - no GPU
        print(f"no CUDA device: {exc}")
        return 1
    import tiltlab as tl

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    from tiltlab._cupy import source

    report = {"device": name, "cupy": cupy.__version__, "python": platform.python_version(),
              "n": args.n, "commit": _commit(), "cuda_sources": source.device_code_digest()}
    print(f"commit: {report['commit']}")
    try:
        import torch

        report["torch"] = torch.__version__
        has_torch = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_torch = False
    print(f"device: {name}  cupy {cupy.__version__}" + (f"  torch {torch.__version__}"
                                                        if has_torch else ""))
    if not args.no_tests:
        report["tests"] = run_tests()
        print("cupy test subset:", report["tests"]["summary"])
        for f in report["tests"]["failed"]:
            print("  ", f)
    sync = cupy.cuda.Device().synchronize
    bw = copy_bandwidth()
    report["copy_bandwidth_GBps"] = bw / 1e9
    print(f"device-to-device copy: {bw / 1e9:.0f} GB/s (read + write)")
    rng = np.random.default_rng(0)
    rows = []
    n = args.n
    for dtype in (np.float32, np.float64):
        l = cupy.asarray((3 * rng.exponential(size=n)).astype(dtype))
        for t in (1.0, 1e-3):
            sec = _timeit(lambda l=l, t=t: tl.tilted_risk(l, t), sync, args.repeat)
            frac = l.nbytes / sec / bw
            rows.append({"call": f"tilted_risk t={t:g}", "dtype": np.dtype(dtype).name, "d": 1,
                         "ms": sec * 1e3, "GBps": l.nbytes / sec / 1e9, "frac_copy_bw": frac})
            print(_fmt(rows[-1]), flush=True)
        sec = _timeit(lambda l=l: tl.tilted_weights(l, 1.0), sync, args.repeat)
        rows.append({"call": "tilted_weights t=1", "dtype": np.dtype(dtype).name, "d": 1,
                     "ms": sec * 1e3, "GBps": 2 * l.nbytes / sec / 1e9,
                     "frac_copy_bw": 2 * l.nbytes / sec / bw})
        print(_fmt(rows[-1]), flush=True)
        groups = cupy.asarray(np.arange(n) % 1000)
        sec_h = _timeit(lambda l=l, g=groups: tl.hierarchical_risk(l, g, [1.0, 1.0]), sync,
                        args.repeat)
        sec_r = _timeit(lambda l=l: tl.tilted_risk(l, 1.0), sync, args.repeat)
        rows.append({"call": "hierarchical_risk 1000 groups", "dtype": np.dtype(dtype).name,
                     "d": 1, "ms": sec_h * 1e3, "vs_tilted_risk": sec_h / sec_r})
        print(_fmt(rows[-1]), flush=True)
        inner = np.arange(n) % 1000
        nested = [cupy.asarray(inner % 100), cupy.asarray(inner)]
        sec_n = _timeit(lambda l=l, g=nested: tl.hierarchical_risk(l, g, [1.0, -1.0, 1.0]),
                        sync, args.repeat)
        r_dev = float(tl.hierarchical_risk(l, nested, [1.0, -1.0, 1.0]))
        r_host = float(tl.hierarchical_risk(cupy.asnumpy(l).astype(np.float64),
                                            [inner % 100, inner], [1.0, -1.0, 1.0]))
        rows.append({"call": "hierarchical_risk 100 x 1000 nested device labels",
                     "dtype": np.dtype(dtype).name, "d": 1, "ms": sec_n * 1e3,
                     "vs_tilted_risk": sec_n / sec_r,
                     "vs_numpy_float64": abs(r_dev - r_host) / abs(r_host)})
        print(_fmt(rows[-1]), flush=True)
        del l, groups, nested
    if args.risk_n:
        rows += large_risk_rows(cupy, tl, args.risk_n, bw, sync, args.repeat)
    rows += hierarchical_objective_rows(cupy, tl, n, args.dims[0], sync, args.repeat)
    for dtype in (np.float32, np.float64):
        for d in args.dims:
            X = cupy.random.default_rng(d).standard_normal((n, d), dtype=dtype)
            theta_h = (rng.standard_normal(d) / math.sqrt(d)).astype(dtype)
            theta = cupy.asarray(theta_h)
            for loss in _losses_at(args, d):
                t = _TILTS.get(loss, 1.0)
                y = _labels(cupy, loss, X, theta, n, dtype)
                obj = tl.TiltedObjective(loss, X, y, t=t)
                gen = tl.TiltedObjective(loss, X, y, t=t)
                gen.fused = False
                row = {"call": f"value_and_gradient {loss}", "dtype": np.dtype(dtype).name,
                       "d": d}
                sec_f = _timeit(lambda o=obj, th=theta: o.value_and_gradient(th), sync,
                                args.repeat)
                sec_g = _timeit(lambda o=gen, th=theta: o.value_and_gradient(th), sync,
                                args.repeat)
                sec_mv = _timeit(lambda X=X, th=theta: X @ th, sync, args.repeat)
                vf, gf = obj.value_and_gradient(theta)
                vg, gg = gen.value_and_gradient(theta)
                row.update(ms=sec_f * 1e3, GBps=X.nbytes / sec_f / 1e9,
                           frac_copy_bw=X.nbytes / sec_f / bw,
                           generic_ms=sec_g * 1e3, generic_frac=X.nbytes / sec_g / bw,
                           matvec_ms=sec_mv * 1e3,
                           fused_vs_generic_grad=float(cupy.max(cupy.abs(gf - gg))
                                                       / cupy.max(cupy.abs(gg))),
                           fused_vs_generic_value=abs(float(vf) - float(vg)) / abs(float(vg)))
                if has_torch and loss in ("squared", "logistic"):
                    tX = torch.as_tensor(X, device="cuda")
                    ty = torch.as_tensor(y, device="cuda")
                    tth = torch.as_tensor(theta, device="cuda")

                    def tfn(tX=tX, ty=ty, tth=tth, t=t, loss=loss):
                        return _torch_objective(torch, tX, ty, tth, t, loss)

                    sec_t = _timeit(tfn, torch.cuda.synchronize, args.repeat)
                    tv, tg = tfn()
                    row.update(torch_ms=sec_t * 1e3, speedup_vs_torch=sec_t / sec_f,
                               torch_vs_tiltlab_grad=float(
                                   (tg - torch.as_tensor(gf, device="cuda")).abs().max()
                                   / tg.abs().max()))
                    del tX, ty, tth
                rows.append(row)
                print(_fmt(row), flush=True)
                del obj, gen, y
            X = None
            cupy.get_default_memory_pool().free_all_blocks()
    if has_torch and not args.no_torch_step:
        for device, compiled in (("cuda", False), ("cuda", True), ("cpu", False)):
            try:
                ratio, t_ms, m_ms = loss_step_ratio(torch, device, compiled)
            except Exception as exc:  # torch.compile may be unavailable
                print(f"TiltedLoss step on {device} (compiled={compiled}): {exc}")
                continue
            rows.append({"call": "TiltedLoss step / mean-loss step", "device": device,
                         "compiled": compiled, "ms": t_ms, "mean_loss_ms": m_ms,
                         "ratio": ratio})
            print(_fmt(rows[-1]), flush=True)
    if not args.no_estimators:
        for row in estimator_rows():
            rows.append(row)
            print(_fmt(row), flush=True)
    report["rows"] = rows
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


#: the tilt of each loss's value-and-gradient row
_TILTS = {"squared": -2.0, "absolute": -2.0, "huber": -2.0, "pinball": -2.0}


def _losses_at(args, d):
    """The losses of the value-and-gradient rows at ``d`` features."""
    if d != max(args.dims) or args.losses == "squared,logistic":
        return ("squared", "logistic")
    if args.losses == "all":
        from tiltlab._cupy.source import C_LOSSES

        return tuple(C_LOSSES)
    return tuple(args.losses.split(","))


def _labels(cupy, loss, X, theta, n, dtype):
    """Labels in the loss's label set, from the linear model ``X theta``: a real target
    with noise, 0/1 classes, or Poisson counts of ``exp(X theta)``."""
    from tiltlab.losses.table import FORMULAS

    kind = FORMULAS[loss].labels if loss in FORMULAS else "real"
    if kind == "binary":
        return (cupy.random.default_rng(2).random(n) < 0.3).astype(dtype)
    z = X @ theta
    if kind == "nonnegative":
        lam = cupy.exp(cupy.clip(z, -5, 5))
        return cupy.random.RandomState(3).poisson(lam).astype(dtype)
    return z + cupy.random.default_rng(1).standard_normal(n, dtype=dtype)


def large_risk_rows(cupy, tl, n, bw, sync, repeat):
    """``tilted_risk`` and ``tilted_weights`` of ``n`` float32 losses (past the launch
    latency that bounds them at 1e7)."""
    rows = []
    l = cupy.random.RandomState(5).exponential(3.0, size=n, dtype=cupy.float32)
    sec = _timeit(lambda l=l: tl.tilted_risk(l, 1.0), sync, repeat)
    rows.append({"call": "tilted_risk t=1", "dtype": "float32", "n": n, "ms": sec * 1e3,
                 "GBps": l.nbytes / sec / 1e9, "frac_copy_bw": l.nbytes / sec / bw})
    print(_fmt(rows[-1]), flush=True)
    sec = _timeit(lambda l=l: tl.tilted_weights(l, 1.0), sync, repeat)
    rows.append({"call": "tilted_weights t=1", "dtype": "float32", "n": n, "ms": sec * 1e3,
                 "GBps": 2 * l.nbytes / sec / 1e9, "frac_copy_bw": 2 * l.nbytes / sec / bw})
    print(_fmt(rows[-1]), flush=True)
    del l
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _cases(args):
    """The measured cases, by name (what ``--dry-run`` prints)."""
    out = []
    for dtype in ("float32", "float64"):
        out += [f"tilted_risk t={t:g} {dtype} n={args.n}" for t in (1.0, 1e-3)]
        out += [f"tilted_weights t=1 {dtype}", f"hierarchical_risk 1000 groups {dtype}",
                f"hierarchical_risk 100 x 1000 nested groups {dtype}"]
    for dtype in ("float32", "float64"):
        for levels in ("1000", "100 x 1000"):
            out += [f"hierarchical {call} logistic {levels} groups {dtype} d={args.dims[0]}"
                    for call in ("value_and_gradient", "hvp")]
    if args.risk_n:
        out += [f"{call} t=1 float32 n={args.risk_n}" for call in ("tilted_risk",
                                                                  "tilted_weights")]
    for dtype in ("float32", "float64"):
        for d in args.dims:
            out += [f"value_and_gradient {loss} {dtype} d={d}" for loss in _losses_at(args, d)]
    if not args.no_torch_step:
        out.append("TiltedLoss step / mean-loss step (cuda eager, cuda compiled, cpu)")
    if not args.no_estimators:
        out += [f"{name} {n}x{d} float64: CuPy fit against NumPy fit"
                for name, _, _ in _ESTIMATOR_CASES for n, d in _ESTIMATOR_SHAPES]
    return out


#: (name, estimator, options) of the estimator comparison, and its shapes
_ESTIMATOR_CASES = (
    ("TiltedClassifier t=0", "TiltedClassifier", {"t": 0.0}),
    ("TiltedClassifier t=1", "TiltedClassifier", {"t": 1.0}),
    ("TiltedRegressor t=0", "TiltedRegressor", {"t": 0.0}),
    ("TiltedRegressor t=-1", "TiltedRegressor", {"t": -1.0}),
)
_ESTIMATOR_SHAPES = ((500_000, 64), (1_000_000, 64))


def estimator_rows():
    """Run :func:`_estimator_fits` in a subprocess with ``SCIPY_ARRAY_API=1`` (SciPy reads
    it once, at import) and return its rows."""

    # the CPU fits use the compiled kernels from the first timed fit on (compiled in the
    # process at the warm-up, not in the background)
    env = dict(os.environ, SCIPY_ARRAY_API="1", TILTLAB_FUSED="wait")
    proc = subprocess.run([sys.executable, __file__, "--estimators-only"], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return [{"call": "estimators on CuPy", "error": proc.stderr[-800:]}]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _estimator_fits(repeat=2):
    """Fit each estimator case on NumPy and on CuPy (interleaved, medians of ``repeat``),
    after one untimed fit of each on the first 20,000 rows (kernel compilation)."""
    import cupy
    import sklearn

    import tiltlab.estimators as est

    rows = []
    for n, d in _ESTIMATOR_SHAPES:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n, d))
        w = rng.standard_normal(d) / math.sqrt(d)
        z = X @ w
        targets = {"TiltedClassifier": (rng.random(n) < 1 / (1 + np.exp(-3 * z))).astype(int),
                   "TiltedRegressor": z + rng.standard_normal(n)}
        targets["TiltedRegressor"][: n // 10] = rng.normal(5.0, 5.0, n // 10)  # outliers
        Xc = cupy.asarray(X)
        for name, cls, opts in _ESTIMATOR_CASES:
            y = targets[cls]
            yc = cupy.asarray(y)
            make = getattr(est, cls)
            w_rows = slice(0, 20_000)
            make(random_state=0, **opts).fit(X[w_rows], y[w_rows])
            with sklearn.config_context(array_api_dispatch=True):
                make(random_state=0, **opts).fit(Xc[w_rows], yc[w_rows])
            host, dev = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                a = make(random_state=0, **opts).fit(X, y)
                host.append(time.perf_counter() - t0)
                with sklearn.config_context(array_api_dispatch=True):
                    cupy.cuda.Device().synchronize()
                    t0 = time.perf_counter()
                    b = make(random_state=0, **opts).fit(Xc, yc)
                    cupy.cuda.Device().synchronize()
                    dev.append(time.perf_counter() - t0)
            ca = np.asarray(a.coef_).ravel()
            cb = cupy.asnumpy(cupy.asarray(b.coef_)).ravel()
            rows.append({"call": f"{name} fit, CuPy against NumPy", "n": n, "d": d,
                         "numpy_s": float(np.median(host)), "cupy_s": float(np.median(dev)),
                         "cupy_vs_numpy_time": float(np.median(dev) / np.median(host)),
                         "coef_rel_diff": float(np.abs(ca - cb).max() / np.abs(ca).max()),
                         "n_iter_numpy": int(np.max(a.n_iter_)),
                         "n_iter_cupy": int(np.max(b.n_iter_))})
        del Xc
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def hierarchical_objective_rows(cupy, tl, n, d, sync, repeat):
    """Value and gradient, and Hessian-vector products, of hierarchical objectives
    (logistic loss, ``d`` features): the device tree against the generic path and against
    the sample-level objective."""
    rows = []
    for dtype in (np.float32, np.float64):
        X = cupy.random.default_rng(d).standard_normal((n, d), dtype=dtype)
        y = (cupy.random.default_rng(2).random(n) < 0.3).astype(dtype)
        theta = cupy.asarray((np.random.default_rng(0).standard_normal(d) / math.sqrt(d))
                             .astype(dtype))
        inner = np.arange(n) % 1000
        flat = tl.TiltedObjective("logistic", X, y, t=1.0)
        sec_s = _timeit(lambda o=flat, th=theta: o.value_and_gradient(th), sync, repeat)
        for name, groups, tilts in (("1000", inner, (1.0, 1.0)),
                                    ("100 x 1000", [inner % 100, inner], (1.0, -1.0, 1.0))):
            obj = tl.TiltedObjective("logistic", X, y, groups=groups, tilts=tilts)
            gen = tl.TiltedObjective("logistic", X, y, groups=groups, tilts=tilts)
            gen.fused = False
            obj.value_and_gradient(theta)  # the tree goes to the device once
            sec_h = _timeit(lambda o=obj, th=theta: o.value_and_gradient(th), sync, repeat)
            sec_g = _timeit(lambda o=gen, th=theta: o.value_and_gradient(th), sync, repeat)
            vh, gh = obj.value_and_gradient(theta)
            vg, gg = gen.value_and_gradient(theta)
            rows.append({"call": f"hierarchical value_and_gradient logistic {name} groups",
                         "dtype": np.dtype(dtype).name, "d": d, "ms": sec_h * 1e3,
                         "generic_ms": sec_g * 1e3, "vs_sample_level": sec_h / sec_s,
                         "vs_generic": sec_h / sec_g,
                         "device_vs_generic_grad": float(cupy.max(cupy.abs(gh - gg))
                                                         / cupy.max(cupy.abs(gg))),
                         "device_vs_generic_value": abs(float(vh) - float(vg)) / abs(float(vg))})
            print(_fmt(rows[-1]), flush=True)
            v = cupy.asarray(np.random.default_rng(1).standard_normal(d).astype(dtype))
            sec_ph = _timeit(lambda o=obj, th=theta, v=v: o.hvp(th, v), sync, repeat)
            sec_pg = _timeit(lambda o=gen, th=theta, v=v: o.hvp(th, v), sync, repeat)
            ph, pg = obj.hvp(theta, v), gen.hvp(theta, v)
            rows.append({"call": f"hierarchical hvp logistic {name} groups",
                         "dtype": np.dtype(dtype).name, "d": d, "ms": sec_ph * 1e3,
                         "generic_ms": sec_pg * 1e3, "vs_generic": sec_ph / sec_pg,
                         "vs_own_value_and_gradient": sec_ph / sec_h,
                         "device_vs_generic": float(cupy.max(cupy.abs(ph - pg))
                                                    / cupy.max(cupy.abs(pg)))})
            print(_fmt(rows[-1]), flush=True)
            del obj, gen
        del X, y, flat
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _fmt(row):
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


if __name__ == "__main__":
    sys.exit(main())
