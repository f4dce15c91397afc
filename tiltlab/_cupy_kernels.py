"""A fused CuPy kernel for the one-pass value and gradient (a backend fast path).

One CUDA kernel reads each row of ``X`` once: a group of ``L`` lanes (a power of two up to
a warp) loads the row into registers, forms ``z = x . theta`` by a shuffle reduction,
evaluates the loss and its derivative, folds the sample into the group's running tilted
state (the online normaliser of :mod:`tiltlab.accumulator`: running shift, ``s``, ``q``,
extremes, loss sum) and adds ``exp(t (l - c)) l' x`` to per-lane gradient accumulators,
rescaling them whenever the shift moves. Every group writes its state; the states are
merged on the device by the same exact rule as :func:`tiltlab.accumulator.merge`.

It serves ``TiltedObjective.value_and_gradient`` (through the objective's CUDA engine) for
losses that give a device expression (the squared and logistic losses), sample-level
finite tilts, uniform priors and C-contiguous float32/float64 ``X`` with up to 1024
features on CuPy arrays; the loss's statements are spliced into the source. Everything
else takes the generic array-API path, and the two paths are compared on a GPU by
``tests/test_cupy_kernels.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._compat import to_numpy
from .accumulator import EXTREMES, GroupState, TiltState, needed_sums

_SOURCE = r"""
#define LOSS_%(loss)s 1
typedef %(T)s T;
#define L %(L)d
#define NPL %(NPL)d
#define R %(R)d

__device__ __forceinline__ T group_sum(T v, unsigned mask) {
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off, L);
    return v;
}

extern "C" __global__ void tilted_vg(
    const T* __restrict__ X, const T* __restrict__ y, const T* __restrict__ theta,
    const long long n, const int d, const T t,
    T* __restrict__ st, T* __restrict__ acc_out)
{
    // A group of L lanes reads R rows per step (all loads first, for memory parallelism);
    // lane i < R then does the scalar work of row i (loss, derivative, exponentials) and
    // the lanes share the coefficients by shuffles. Each lane keeps partial sums s, q,
    // lsum, mass relative to the group's common shift c.
    const int lane = threadIdx.x %% L;
    const long long group = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / L;
    const long long n_groups = ((long long)gridDim.x * blockDim.x) / L;
    const unsigned mask = 0xffffffffu;

    T th[NPL];
    T acc[NPL];
#pragma unroll
    for (int k = 0; k < NPL; ++k) {
        int j = lane + k * L;
        th[k] = (j < d) ? theta[j] : (T)0;
        acc[k] = (T)0;
    }
    const T inf = (T)(1e300 * 1e300);
    T c = (t > 0) ? -inf : inf;   // the group's shift: max loss (t > 0) or min (t < 0)
    T hi = -inf, lo = inf;
    T s = 0, q = 0, lsum = 0, mass = 0;

    // every lane of a warp runs the same number of steps (the shuffles need them)
    for (long long r0 = group; __any_sync(mask, r0 < n); r0 += n_groups * R) {
        T xv[R][NPL];
        T part[R];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const long long r = r0 + i * n_groups;
            const bool ok = r < n;
            const T* row = X + (ok ? r : 0) * (long long)d;
#pragma unroll
            for (int k = 0; k < NPL; ++k) {
                int j = lane + k * L;
                xv[i][k] = (ok && j < d) ? row[j] : (T)0;
            }
        }
        const long long my_r = r0 + (long long)lane * n_groups;
        const bool mine = lane < R && my_r < n;
        const T yy = mine ? y[my_r] : (T)0;
#pragma unroll
        for (int i = 0; i < R; ++i) {
            T p = 0;
#pragma unroll
            for (int k = 0; k < NPL; ++k) p += xv[i][k] * th[k];
            part[i] = p;
        }
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1) {
#pragma unroll
            for (int i = 0; i < R; ++i) part[i] += __shfl_xor_sync(mask, part[i], off, L);
        }
        // row `lane` is this lane's scalar work
        T z = 0;
#pragma unroll
        for (int i = 0; i < R; ++i) z = (lane == i) ? part[i] : z;
        T l = 0, d1 = 0;
        if (mine) {
%(loss_code)s            hi = l > hi ? l : hi;
            lo = l < lo ? l : lo;
            lsum += l;
        }
        // the group's new shift
        T cand = mine ? l : c;
        cand = (t > 0) ? (cand > c ? cand : c) : (cand < c ? cand : c);
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1) {
            const T o = __shfl_xor_sync(mask, cand, off, L);
            cand = (t > 0) ? (o > cand ? o : cand) : (o < cand ? o : cand);
        }
        if (cand != c) {
            // move the shift (exact: both terms one-signed); the same factor on every lane
            const T du = t * (c - cand);   // <= 0 (-inf before the first sample)
            const T rr = exp(du);
            const T em = (mass > 0) ? expm1(du) : (T)0;
            q = mass * em + q * rr;
            s = s * rr;
#pragma unroll
            for (int k = 0; k < NPL; ++k) acc[k] *= rr;
            c = cand;
        }
        T coef = 0;
        if (mine) {
            const T u = t * (l - c);
            const T ew = exp(u);
            s += ew;
            q += expm1(u);
            mass += (T)1;
            coef = ew * d1;
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const T ci = __shfl_sync(mask, coef, i, L);
#pragma unroll
            for (int k = 0; k < NPL; ++k) acc[k] += ci * xv[i][k];
        }
    }
    // combine the lanes' partial sums (all relative to the common shift c)
    s = group_sum(s, mask);
    q = group_sum(q, mask);
    lsum = group_sum(lsum, mask);
    mass = group_sum(mass, mask);
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) {
        const T h = __shfl_xor_sync(mask, hi, off, L);
        const T w = __shfl_xor_sync(mask, lo, off, L);
        hi = h > hi ? h : hi;
        lo = w < lo ? w : lo;
    }
    if (lane == 0) {
        T* o = st + group * 7;
        o[0] = c; o[1] = hi; o[2] = lo; o[3] = s; o[4] = q; o[5] = lsum; o[6] = mass;
    }
#pragma unroll
    for (int k = 0; k < NPL; ++k) {
        int j = lane + k * L;
        if (j < d) acc_out[group * (long long)d + j] = acc[k];
    }
}
"""

_CACHE: dict = {}
MAX_FEATURES = 1024


def supported(X: Any, t: float, shape: tuple) -> bool:
    """Whether the fused kernel serves a value and gradient with data ``X`` (a CuPy array),
    tilt ``t`` and parameter ``shape`` (the caller checks the loss, the prior and the
    tilt tree: a device expression, a uniform prior, a sample-level tilt)."""
    try:
        import cupy
    except ImportError:  # pragma: no cover - no CuPy here
        return False
    if not isinstance(X, cupy.ndarray):
        return False
    if t == 0.0 or not math.isfinite(t):
        return False
    if X.dtype not in (cupy.float32, cupy.float64) or not X.flags.c_contiguous:
        return False
    return 0 < X.shape[1] <= MAX_FEATURES and len(shape) == 1


def loss_code(expressions: dict[str, str]) -> str:
    """The loss section of the kernel: each loss's device statements (they set ``l`` and
    ``d1`` from ``z`` and ``yy``), chosen by the ``LOSS_<name>`` macro of the build; the
    last one is the default branch."""
    names = list(expressions)
    if len(names) == 1:
        return expressions[names[0]]
    out = f"#if defined(LOSS_{names[0]})\n{expressions[names[0]]}"
    for name in names[1:-1]:
        out += f"#elif defined(LOSS_{name})\n{expressions[name]}"
    return out + f"#else\n{expressions[names[-1]]}#endif\n"


def launch_shape(d: int) -> tuple[int, int, int]:
    """Lanes per row group ``L`` (a power of two up to a warp), features per lane, and
    rows in flight per lane group (memory parallelism; lane i < rows does row i's scalar
    work, so rows <= L) for ``d`` features."""
    L = 1
    while L < min(d, 32):
        L *= 2
    npl = -(-d // L)
    rows = max(1, min(8, 16 // npl, L))
    return L, npl, rows


def kernel_source(loss: str, expressions: dict[str, str], T: str, d: int) -> str:
    """CUDA source of the kernel for the loss named ``loss`` (a key of ``expressions``),
    element type ``T`` (``"float"`` or ``"double"``) and ``d`` features."""
    if loss not in expressions:
        raise ValueError(f"`loss`: no device expression for {loss!r}")
    L, npl, rows = launch_shape(d)
    return _SOURCE % {
        "loss": loss,
        "loss_code": loss_code(expressions),
        "T": T,
        "L": L,
        "NPL": npl,
        "R": rows,
    }


def _kernel(loss: str, expressions: dict[str, str], dtype: Any, d: int):
    import cupy

    L, npl, rows = launch_shape(d)
    key = (loss, str(dtype), L, npl, rows)
    if key not in _CACHE:
        T = "float" if dtype == cupy.float32 else "double"
        src = kernel_source(loss, expressions, T, d)
        _CACHE[key] = (cupy.RawKernel(src, "tilted_vg", options=("--std=c++14",)), L)
    return _CACHE[key]


THREADS = 256


def _grid(kern: Any, n: int, L: int) -> int:
    """Blocks for one resident wave (occupancy from the kernel's register count)."""
    import cupy

    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    regs = max(1, int(kern.num_regs))
    per_sm = max(1, min(2048 // THREADS, 65536 // (regs * THREADS), 32))
    return max(1, min(sms * per_sm, -(-n * L // THREADS)))


def value_and_gradient(
    X: Any, y: Any, theta: Any, t: float, loss: str, expressions: dict[str, str]
) -> tuple[Any, Any] | None:
    """Value and gradient of the tilted risk of ``loss`` (see :func:`supported`); None
    for non-finite losses (the generic path raises or gives IEEE values)."""
    import cupy

    n, d = int(X.shape[0]), int(X.shape[1])
    dtype = X.dtype
    kern, L = _kernel(loss, expressions, dtype, d)
    blocks = _grid(kern, n, L)
    n_groups = blocks * THREADS // L
    st = cupy.empty((n_groups, 7), dtype=dtype)
    acc = cupy.empty((n_groups, d), dtype=dtype)
    th = cupy.ascontiguousarray(theta, dtype=dtype)
    yy = cupy.ascontiguousarray(y, dtype=dtype)
    t = float(t)
    scalar = dtype.type
    kern((blocks,), (THREADS,), (X, yy, th, cupy.int64(n), cupy.int32(d), scalar(t), st, acc))
    # exact merge of the group states by the tilted reduction (None: non-finite losses)
    return finish_partials(st, acc, t, dtype)


def finish_partials(st: Any, acc: Any, t: float, dtype: Any) -> tuple[Any, Any] | None:
    """Value and gradient from the kernel's per-group partial states (host side).

    ``st`` holds one row ``(c, hi, lo, s, q, lsum, mass)`` per lane group (``lsum`` the
    plain sum of its losses, ``s``, ``q`` relative to its shift ``c``) and ``acc`` its
    gradient sums; unused groups have ``mass = 0`` and infinite extremes. They are the
    group form of :class:`tiltlab.accumulator.TiltState` and are merged and finished
    by it. Works on any array library (tested with NumPy). Returns None for non-finite
    losses.
    """
    c, hi, lo, s, q, lsum, mass = (st[:, k] for k in range(7))
    used = mass > 0
    hi_h = np.asarray(to_numpy(hi), dtype=np.float64)
    lo_h = np.asarray(to_numpy(lo), dtype=np.float64)
    on = np.asarray(to_numpy(used))
    hi_h[~on], lo_h[~on] = -np.inf, np.inf
    if not (np.all(np.isfinite(hi_h[on])) and np.all(np.isfinite(lo_h[on]))):
        return None
    # the kernel's shift c is the group's extreme on the tilt's side; its loss sum is
    # taken relative to it here (unused groups: 0 - 0 * c)
    c0 = c * used
    groups = GroupState(t=float(t), hi=hi_h, lo=lo_h, mass=mass, s=s, q=q,
                        lsum=lsum - mass * c0, sums=(acc,))
    state = groups.collapse()
    (grad,) = state.normalized_sums()
    return state.risk(None, dtype), grad


# ---------------------------------------------------------------------------------------
# fused reductions for tilted_risk and tilted_weights of one-dimensional losses

_RED: dict = {}


def _reductions():
    import cupy

    if not _RED:
        # elementwise, then CuPy's device-wide (CUB) sum: a ReductionKernel to a scalar
        # runs in one thread block and was 10x slower here
        _RED["expm1"] = cupy.ElementwiseKernel(
            "T l, T c, T t", "T e", "e = expm1(t * (l - c))", "tilted_expm1")
        _RED["exp"] = cupy.ElementwiseKernel(
            "T l, T c, T t", "T e", "e = exp(t * (l - c))", "tilted_exp")
    return _RED


def _split(x: Any, k: int = 1024):
    """``x`` as (k, m) rows plus a tail: a reduction along the rows runs in k blocks.

    CuPy reduces a whole array to a scalar in a single thread block unless its CUB
    accelerator is switched on globally (which a library should not do), so large
    reductions are taken in two stages.
    """
    n = x.shape[0]
    m = n // k
    if m < 256:
        return None, x
    return x[: m * k].reshape(k, m), x[m * k :]


def _sum(x: Any) -> Any:
    head, tail = _split(x)
    if head is None:
        return tail.sum()
    return head.sum(axis=1).sum() + tail.sum()


def extremes(l: Any) -> tuple[float, float]:
    """(max, min) of a 1-d CuPy array, read to the host in one transfer."""
    import cupy

    head, tail = _split(l)
    if head is None:
        both = cupy.stack([l.max(), l.min()])
    else:
        parts = [head.max(axis=1), head.min(axis=1)]
        if tail.size:
            parts = [cupy.concatenate([parts[0], tail]), cupy.concatenate([parts[1], tail])]
        both = cupy.stack([parts[0].max(), parts[1].min()])
    hi, lo = (float(v) for v in both.get())
    return hi, lo


def risk_1d(l: Any, t: float, hi: float, lo: float) -> Any:
    """Tilted risk of 1-d losses (uniform prior) at a finite non-zero tilt: one fused
    reduction over the losses, after their extremes, finished by
    :class:`tiltlab.accumulator.TiltState`."""
    import cupy

    red = _reductions()
    dt = l.dtype.type
    c = hi if t > 0 else lo
    mass = cupy.asarray(float(l.shape[0]), dtype=l.dtype)
    want_q, want_lsum = needed_sums(t, hi, lo, math.sqrt(float(cupy.finfo(l.dtype).tiny)))
    lsum = cupy.sum(l - dt(c)) if want_lsum else None
    q = None
    if want_q:
        q = _sum(red["expm1"](l, dt(c), dt(t)))
        s = mass + q
    else:
        s = _sum(red["exp"](l, dt(c), dt(t)))
    st = TiltState(t=float(t), hi=hi, lo=lo, mass=mass, s=s, q=q, lsum=lsum, sums=())
    return st.risk(cupy, l.dtype)


def weights_1d(l: Any, t: float, hi: float, lo: float) -> Any:
    """Tilted weights of 1-d losses (uniform prior): one reduction and one elementwise
    pass."""
    red = _reductions()
    dt = l.dtype.type
    c = hi if t > 0 else lo
    e = red["exp"](l, dt(c), dt(t))
    e /= _sum(e)
    return e


EXTREMES.register("cupy", extremes)
