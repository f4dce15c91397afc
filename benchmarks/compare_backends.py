"""Time tiltlab's aggregations on every available backend, side by side, in one process.

No asv needed. For each size and dtype this times ``tilted_risk`` and ``tilted_weights``
(one tilt) on NumPy, PyTorch CPU, and, where a GPU is visible, CuPy and PyTorch CUDA, next
to two plain NumPy/SciPy references:

- ``naive``: ``np.log(np.mean(np.exp(t * l))) / t`` (weights ``e / e.sum()``, ``e = exp(t l)``),
  which overflows for large ``t * l`` but shows the cost of a bare exp-and-sum;
- ``logsumexp``: ``(scipy.special.logsumexp(t * l) - log N) / t`` (weights
  ``exp(t l - logsumexp(t l))``), the usual stable formula.

Each figure is the median of several calls after warm-up calls; GPU calls are synchronised
before the clock stops. The table gives time ratios against tiltlab on NumPy and against
the logsumexp reference, the effective bandwidth (bytes of the losses read once / time), and
the relative error against a float64 logsumexp of the same data.

Usage::

    python benchmarks/compare_backends.py            # N in 1e5, 1e6, 1e7
    python benchmarks/compare_backends.py --quick    # N in 1e5, 1e6, fewer repeats
    python benchmarks/compare_backends.py --json out.json

GPU figures mean something only next to the device's name and the CPU figures measured in
the same run; the JSON output records both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import logsumexp

import tiltlab


def _load_backends_module() -> Any:
    # the helper lives in the asv suite; load it by path so this script runs from anywhere
    path = Path(__file__).resolve().parent / "benchmarks" / "_backends.py"
    spec = importlib.util.spec_from_file_location("tiltlab_bench_backends", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


_backends = _load_backends_module()

DEFAULT_BACKENDS = ("numpy", "torch", "torch-cuda", "cupy")


def _host_sync(result: Any) -> Any:
    return result


# ---------------------------------------------------------------------------- references


def naive_risk(losses: np.ndarray, t: float) -> Any:
    return np.log(np.mean(np.exp(t * losses))) / t


def naive_weights(losses: np.ndarray, t: float) -> np.ndarray:
    e = np.exp(t * losses)
    return e / e.sum()


def logsumexp_risk(losses: np.ndarray, t: float) -> Any:
    return (logsumexp(t * losses) - math.log(losses.shape[-1])) / t


def logsumexp_weights(losses: np.ndarray, t: float) -> np.ndarray:
    z = t * losses
    return np.exp(z - logsumexp(z))


# ---------------------------------------------------------------------------- helpers


def to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "compute"):  # dask
        x = x.compute()
    if hasattr(x, "detach"):  # torch
        return x.detach().cpu().numpy()
    if hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def relative_error(actual: Any, desired: np.ndarray) -> float:
    """Max-norm relative error, computed in float64 on the host."""
    a = to_numpy(actual).astype(np.float64)
    d = np.asarray(desired, dtype=np.float64)
    scale = float(np.max(np.abs(d)))
    if not np.all(np.isfinite(a)):
        return math.inf
    return float(np.max(np.abs(a - d))) / (scale if scale > 0 else 1.0)


def median_time(fn, sync, warmup: int, repeats: int) -> tuple[float, list[float], Any]:
    result = None
    for _ in range(warmup):
        result = sync(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = sync(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return None


def platform_info(backends: list[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "gpu_name": gpu_name(),
        "backends": {b.name: b.device for b in backends},
        "versions": {"tiltlab": getattr(tiltlab, "__version__", "?"), "numpy": np.__version__},
    }
    for mod in ("scipy", "torch", "cupy", "dask", "array_api_compat"):
        if mod in sys.modules:
            info["versions"][mod] = getattr(sys.modules[mod], "__version__", "?")
    if "torch" in sys.modules:
        info["torch_num_threads"] = sys.modules["torch"].get_num_threads()
    return info


# ---------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = _backends.available_backends(tuple(args.backends))
    sizes = [10**5, 10**6] if args.quick else [10**5, 10**6, 10**7]
    if args.sizes:
        sizes = [int(float(s)) for s in args.sizes]
    repeats = args.repeats or (5 if args.quick else 11)
    t = args.t
    rows: list[dict[str, Any]] = []

    functions = {
        "tilted_risk": (tiltlab.tilted_risk, naive_risk, logsumexp_risk),
        "tilted_weights": (tiltlab.tilted_weights, naive_weights, logsumexp_weights),
    }
    for n in sizes:
        for dtype in args.dtypes:
            host = _backends.make_losses(n, dtype)
            reference_input = host.astype(np.float64)
            on_backend = {b.name: b.asarray(host) for b in backends}
            for func_name, (func, naive, lse) in functions.items():
                reference = lse(reference_input, t)
                candidates = [
                    (
                        f"tiltlab/{b.name}",
                        b.device,
                        b.sync,
                        (lambda f=func, x=on_backend[b.name]: f(x, t)),
                    )
                    for b in backends
                ]
                candidates += [
                    ("naive/numpy", "cpu", _host_sync, lambda f=naive, x=host: f(x, t)),
                    ("logsumexp/numpy", "cpu", _host_sync, lambda f=lse, x=host: f(x, t)),
                ]
                block = []
                for method, device, sync, fn in candidates:
                    with np.errstate(over="ignore", invalid="ignore"):
                        med, times, result = median_time(fn, sync, args.warmup, repeats)
                        err = relative_error(result, reference)
                    block.append(
                        {
                            "function": func_name,
                            "n": n,
                            "dtype": dtype,
                            "t": t,
                            "method": method,
                            "device": device,
                            "median_s": med,
                            "times_s": times,
                            "gb_per_s": n * np.dtype(dtype).itemsize / med / 1e9,
                            "rel_error": err,
                        }
                    )
                base = next(r["median_s"] for r in block if r["method"] == "tiltlab/numpy")
                lse_time = next(r["median_s"] for r in block if r["method"] == "logsumexp/numpy")
                for r in block:
                    r["ratio_vs_numpy"] = r["median_s"] / base
                    r["ratio_vs_logsumexp"] = r["median_s"] / lse_time
                rows.extend(block)
    return {
        "info": platform_info(backends),
        "settings": {"t": t, "repeats": repeats, "warmup": args.warmup, "sizes": sizes},
        "results": rows,
    }


def print_table(report: dict[str, Any]) -> None:
    info = report["info"]
    print(f"CPU: {info['cpu_model']} ({info['cpus_available']} CPUs available)")
    print(f"GPU: {info['gpu_name'] or 'none'}")
    if info.get("load_average") is not None:
        print("load average: " + ", ".join(f"{x:.2f}" for x in info["load_average"]))
    s = report["settings"]
    print(f"t = {s['t']}, median of {s['repeats']} calls after {s['warmup']} warm-up calls")
    print("time ratios: < 1 is faster than tiltlab/numpy (x numpy) or than logsumexp (x lse)")
    header = (
        f"{'function':<15}{'N':>9} {'dtype':<8}{'method':<18}{'median ms':>11}{'GB/s':>8}"
        f"{'x numpy':>9}{'x lse':>8}{'rel err':>10}"
    )
    print(header)
    print("-" * len(header))
    previous = None
    for r in report["results"]:
        key = (r["function"], r["n"], r["dtype"])
        if previous is not None and key != previous:
            print()
        previous = key
        print(
            f"{r['function']:<15}{r['n']:>9.0e} {r['dtype']:<8}{r['method']:<18}"
            f"{r['median_s'] * 1e3:>11.3f}{r['gb_per_s']:>8.2f}{r['ratio_vs_numpy']:>9.2f}"
            f"{r['ratio_vs_logsumexp']:>8.2f}{r['rel_error']:>10.1e}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N up to 1e6 and 5 repeats")
    parser.add_argument("--sizes", nargs="+", help="sample counts, e.g. 1e5 1e7")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument(
        "--backends",
        nargs="+",
        default=list(DEFAULT_BACKENDS),
        choices=list(_backends.BACKENDS),
        help="backends to try (missing ones are left out)",
    )
    parser.add_argument("--t", type=float, default=1.0, help="tilt (default 1.0)")
    parser.add_argument("--repeats", type=int, help="timed calls per figure (default 11, 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads(N) first")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.t == 0:
        parser.error("--t must be non-zero (the references divide by t)")
    if args.torch_threads is not None:
        try:
            import torch
        except ImportError:
            parser.error("--torch-threads: torch is not installed")
        torch.set_num_threads(args.torch_threads)

    report = run(args)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
