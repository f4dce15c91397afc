"""Short rows on a block in cache: the fused CPU kernels' dot products and rank-one
updates in LLVM's vectorised loops against the whole-register code of
``tiltlab._cpu_kernels._short``, side by side.

For each row length ``d`` and dtype, one block of ``X`` of about 128 KiB (the kernels'
block, see ``block_rows``) stays in cache and each step runs over it many times; the
figures are nanoseconds per row, medians over interleaved repetitions, timed by the
thread's CPU clock:

* ``dot``: ``X[i] . theta`` per row (value and gradient);
* ``dot4``: the same, four rows side by side in registers (``regs``; the kernels use it
  from ``d`` of more than two registers on);
* ``dot2``: ``X[i] . theta`` and ``X[i] . v`` (the one-pass Hessian-vector product);
* ``axpy``: ``acc += sum_r c_r X[i + r]``, four rows at a time;
* ``axpy2``: two such sums with two coefficient vectors, two rows at a time.

``loop`` is the loop of the kernels before the register code (LLVM's vectoriser: 16
float64 or 32 float32 columns per step of its main loop, then its epilogue and a scalar
remainder); ``regs`` the register code. The updates of both agree bit for bit (checked).

Usage::

    python benchmarks/short_rows.py                 # d = 8, 9, 12, 16, 20, 31, 32, 64
    python benchmarks/short_rows.py --d 20,100 --repeat 15

Nothing here asserts a timing; figures go in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from tiltlab._cpu_kernels import _short

_R = njit(fastmath={"reassoc"}, nogil=True, error_model="numpy")
_N = njit(fastmath=False, nogil=True, error_model="numpy")


@_R
def dot_loop(X, nb, v, out):
    d = X.shape[1]
    for i in range(nb):
        a = X.dtype.type(0)
        for j in range(d):
            a += X[i, j] * v[j]
        out[i] = a


@_N
def dot_regs(X, nb, v, out):
    for i in range(nb):
        out[i] = _short.vdot(X, i, v)


@_N
def dot4_regs(X, nb, v, out):
    for i in range(0, nb - 3, 4):
        out[i], out[i + 1], out[i + 2], out[i + 3] = _short.vdot4(X, i, v)


@_R
def dot2_loop(X, nb, v, w, out, out2):
    d = X.shape[1]
    for i in range(0, nb - 1, 2):
        a0 = a1 = c0 = c1 = X.dtype.type(0)
        for j in range(d):
            x0 = X[i, j]
            x1 = X[i + 1, j]
            a0 += x0 * v[j]
            a1 += x1 * v[j]
            c0 += x0 * w[j]
            c1 += x1 * w[j]
        out[i] = a0
        out[i + 1] = a1
        out2[i] = c0
        out2[i + 1] = c1


@_N
def dot2_regs(X, nb, v, w, out, out2):
    for i in range(nb):
        a, c = _short.vdot2(X, i, v, w)
        out[i] = a
        out2[i] = c


@_N
def axpy_loop(X, nb, c, acc, acc2):
    d = X.shape[1]
    for i in range(0, nb - 3, 4):
        c0, c1, c2, c3 = c[i], c[i + 1], c[i + 2], c[i + 3]
        for j in range(d):
            acc[j] += (c0 * X[i, j] + c1 * X[i + 1, j]) + (c2 * X[i + 2, j] + c3 * X[i + 3, j])


@_N
def axpy_regs(X, nb, c, acc, acc2):
    for i in range(0, nb - 3, 4):
        _short.vaxpy4(X, i, c[i], c[i + 1], c[i + 2], c[i + 3], acc)


@_N
def axpy2_loop(X, nb, c, acc, acc2):
    d = X.shape[1]
    for i in range(0, nb - 1, 2):
        a0, a1, b0, b1 = c[i], c[i + 1], c[nb - 1 - i], c[nb - 2 - i]
        for j in range(d):
            x0 = X[i, j]
            x1 = X[i + 1, j]
            acc[j] += a0 * x0 + a1 * x1
            acc2[j] += b0 * x0 + b1 * x1


@_N
def axpy2_regs(X, nb, c, acc, acc2):
    for i in range(0, nb - 1, 2):
        _short.vaxpy2x2(X, i, c[i], c[i + 1], c[nb - 1 - i], c[nb - 2 - i], acc, acc2)


def _time(f, args, reps):
    t0 = time.thread_time()
    for _ in range(reps):
        f(*args)
    return (time.thread_time() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", default="8,9,12,16,20,31,32,64")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for d in (int(s) for s in args.d.split(",")):
        for dtype in (np.float32, np.float64):
            size = np.dtype(dtype).itemsize
            if d * size < _short.VBYTES:
                continue
            nb = min(2048, max(64, 131072 // (d * size) // 8 * 8))
            X = rng.standard_normal((nb + 1, d)).astype(dtype)  # a row after the block
            v = rng.standard_normal(d).astype(dtype)
            w = rng.standard_normal(d).astype(dtype)
            c = rng.standard_normal(nb).astype(dtype)
            out = np.empty(nb, dtype)
            out2 = np.empty(nb, dtype)
            pad = _short.padded(d, size)
            accs = {}
            cases = {
                "dot": (dot_loop, dot_regs, (X, nb, v, out)),
                "dot4": (dot_loop, dot4_regs, (X, nb, v, out)),
                "dot2": (dot2_loop, dot2_regs, (X, nb, v, w, out, out2)),
            }
            for name, loop, regs in (
                ("axpy", axpy_loop, axpy_regs),
                ("axpy2", axpy2_loop, axpy2_regs),
            ):
                for tag, f in (("loop", loop), ("regs", regs)):
                    a, b = np.zeros(pad, dtype), np.zeros(pad, dtype)
                    f(X, nb, c, a, b)
                    accs[name, tag] = (a[:d].copy(), b[:d].copy())
                cases[name] = (loop, regs, (X, nb, c, np.zeros(pad, dtype), np.zeros(pad, dtype)))
                for x, y in zip(accs[name, "loop"], accs[name, "regs"], strict=True):
                    np.testing.assert_array_equal(x, y)
            line = [f"d={d:<4d} {np.dtype(dtype).name}"]
            for name, (loop, regs, fargs) in cases.items():
                reps = max(1, int(2e6 // (nb * d)))
                loop(*fargs), regs(*fargs)  # compile
                t_loop, t_regs = [], []
                for r in range(args.repeat):
                    order = ((loop, t_loop), (regs, t_regs))
                    for f, acc in order if r % 2 == 0 else order[::-1]:
                        acc.append(_time(f, fargs, reps))
                ns = 1e9 / nb
                line.append(f"{name} {np.median(t_loop) * ns:.2f}/{np.median(t_regs) * ns:.2f}")
            print("  ".join(line) + "   (ns a row, loop/regs)", flush=True)


if __name__ == "__main__":
    main()
