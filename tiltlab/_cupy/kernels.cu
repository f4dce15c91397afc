/* CUDA kernels of the CuPy backend, compiled by NVRTC after tilt.cuh (the scalar loss
 * and state functions) with these macros set by the build (tiltlab/_cupy/source.py):
 *   TL_FLOAT     1 for float, 0 for double
 *   TL_LOSS      the loss function of tilt.cuh (e.g. tl_loss_squared); without it only
 *                the reductions are compiled
 *   TL_PARAM     the loss's parameter (Huber's delta, the pinball quantile; 0 without)
 *   L, NPL, R    lanes per row group, features per lane, rows in flight per group
 * A state is stored as TL_STATE_FIELDS consecutive numbers (the fields of tl_state).
 */
typedef tl_real T;

#ifndef TL_PARAM
#  define TL_PARAM 0
#endif

#ifndef TL_FINISH_THREADS
#  define TL_FINISH_THREADS 512
#endif
#ifndef TL_BLOCK_THREADS
#  define TL_BLOCK_THREADS 256
#endif

__device__ __forceinline__ tl_state tl_load(const T* p, long long i) {
    const T* a = p + i * TL_STATE_FIELDS;
    tl_state s;
    s.c = a[0]; s.hi = a[1]; s.lo = a[2]; s.s = a[3]; s.q = a[4]; s.lsum = a[5]; s.mass = a[6];
    return s;
}

__device__ __forceinline__ void tl_store(T* p, long long i, tl_state s) {
    T* a = p + i * TL_STATE_FIELDS;
    a[0] = s.c; a[1] = s.hi; a[2] = s.lo; a[3] = s.s; a[4] = s.q; a[5] = s.lsum; a[6] = s.mass;
}

/* the merge of the states sh[0..NT) of a block into sh[0] (NT a power of two) */
template <int NT>
__device__ __forceinline__ void tl_block_merge(tl_state* sh, T t) {
    T fa, fb;
#pragma unroll 1
    for (int w = NT / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] = tl_merge(sh[threadIdx.x], sh[threadIdx.x + w], t, &fa, &fb);
        __syncthreads();
    }
}

/* the merge of n states (in global memory) by one block of TL_FINISH_THREADS threads */
__device__ __forceinline__ tl_state tl_merge_all(const T* st, long long n, T t, tl_state* sh) {
    T fa, fb;
    tl_state m = tl_empty();
    for (long long g = threadIdx.x; g < n; g += TL_FINISH_THREADS) m = tl_merge(m, tl_load(st, g), t, &fa, &fb);
    sh[threadIdx.x] = m;
    __syncthreads();
    tl_block_merge<TL_FINISH_THREADS>(sh, t);
    const tl_state all = sh[0];
    __syncthreads();
    return all;
}

#ifdef TL_LOSS
__device__ __forceinline__ T group_sum(T v, unsigned mask) {
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off, L);
    return v;
}

/* the merge of the states of the lanes lane ^ off, off = lo, 2 lo, ... < hi, by shuffles of
 * the given width (lanes 1..L: a row group; L..32: the groups of a warp) */
__device__ __forceinline__ tl_state shfl_merge(tl_state s, T t, unsigned mask, int lo, int hi,
                                               int width) {
    T fa, fb;
    for (int off = lo; off < hi; off <<= 1) {
        tl_state o;
        o.c = __shfl_xor_sync(mask, s.c, off, width);
        o.hi = __shfl_xor_sync(mask, s.hi, off, width);
        o.lo = __shfl_xor_sync(mask, s.lo, off, width);
        o.s = __shfl_xor_sync(mask, s.s, off, width);
        o.q = __shfl_xor_sync(mask, s.q, off, width);
        o.lsum = __shfl_xor_sync(mask, s.lsum, off, width);
        o.mass = __shfl_xor_sync(mask, s.mass, off, width);
        s = tl_merge(s, o, t, &fa, &fb);
    }
    return s;
}

/* value and gradient partials: one state and one row of gradient sums per block */
extern "C" __global__ void tilted_vg(
    const T* __restrict__ X, const T* __restrict__ y, const T* __restrict__ theta,
    const long long n, const int d, const T t,
    T* __restrict__ st, T* __restrict__ acc_out)
{
    // A group of L lanes reads R rows per step (all loads first, for memory parallelism);
    // lane i < R then does the scalar work of row i (loss, derivative, exponentials) and
    // the lanes share the coefficients by shuffles. Every lane keeps a partial state
    // relative to the group's common shift c (tilt.cuh: empty until it has a sample).
    const int lane = threadIdx.x % L;
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
    tl_state mine_st = tl_empty();
    bool have = false;                             // whether the group has a shift yet
    T c = (t > 0) ? -tl_inf() : tl_inf();          // the shift (a reduction's neutral until then)

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
        T l = 0, d1 = 0, d2 = 0;
        if (mine) TL_LOSS(z, yy, (T)TL_PARAM, &l, &d1, &d2);
        // the group's new shift (the same on every lane); lane 0 has a row whenever the
        // group has one in this step
        T cand = mine ? l : c;
        cand = tl_beyond(cand, c, t) ? cand : c;
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1) {
            const T o = __shfl_xor_sync(mask, cand, off, L);
            cand = tl_beyond(o, cand, t) ? o : cand;
        }
        if (r0 < n && (!have || cand != c)) {
            // move the shift: the factor of the gradient sums is the group's (they hold
            // every row of the group), zero before its first row
            const T rg = have ? tl_state_factor(t, c, cand) : (T)0;
            tl_move(&mine_st, cand, t);
#pragma unroll
            for (int k = 0; k < NPL; ++k) acc[k] *= rg;
            c = cand;
            have = true;
        }
        T coef = 0;
        if (mine) coef = tl_add(&mine_st, l, t) * d1;
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const T ci = __shfl_sync(mask, coef, i, L);
#pragma unroll
            for (int k = 0; k < NPL; ++k) acc[k] += ci * xv[i][k];
        }
    }
    // the group's state: the merge of its lanes' states (one shift, or empty); then the
    // warp's: the merge of its 32 / L groups, whose gradient sums (lane i of every group
    // holds the same features) are moved to the warp's shift and added by shuffles
    const tl_state gs = shfl_merge(mine_st, t, mask, 1, L, L);
    const tl_state ws = shfl_merge(gs, t, mask, L, 32, 32);
    const T fg = tl_is_empty(&gs) ? (T)0 : tl_state_factor(t, gs.c, ws.c);
#pragma unroll
    for (int k = 0; k < NPL; ++k) {
        acc[k] *= fg;
        for (int off = L; off < 32; off <<= 1) acc[k] += __shfl_xor_sync(mask, acc[k], off, 32);
    }
    // the block's state: its warps' states merged in order by one thread; its gradient
    // sums: each warp's moved to the block's shift and added in warp order (the same
    // order at every run), so that the finish merges one state a block, not one a warp
    __shared__ tl_state wst[32];
    __shared__ tl_state bst;
    __shared__ T bacc[L * NPL];
    const int wid = threadIdx.x / 32;
    const int n_warps = blockDim.x / 32;
    if (threadIdx.x % 32 == 0) wst[wid] = ws;
    __syncthreads();
    if (threadIdx.x == 0) {
        T fa, fb;
        tl_state b = tl_empty();
        for (int w = 0; w < n_warps; ++w) b = tl_merge(b, wst[w], t, &fa, &fb);
        bst = b;
        tl_store(st, blockIdx.x, b);
    }
    __syncthreads();
    const T fw = tl_is_empty(&ws) ? (T)0 : tl_state_factor(t, ws.c, bst.c);
    for (int w = 0; w < n_warps; ++w) {
        if (wid == w && (int)(threadIdx.x % 32) < L) {
#pragma unroll
            for (int k = 0; k < NPL; ++k) {
                const int j = lane + k * L;
                if (j < d) bacc[j] = (w == 0 ? (T)0 : bacc[j]) + acc[k] * fw;
            }
        }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) acc_out[(long long)blockIdx.x * d + j] = bacc[j];
}

/* the finish on the device: merges the blocks' states, writes the value (with the ridge
 * term) and a status to out[0..1], each block's share of the normalised gradient to
 * f[0..n_states) and l2 to f[n_states], theta to the extra row of the gradient sums, so
 * that the gradient is one product f @ acc */
extern "C" __global__ void tilted_vg_finish(
    const T* __restrict__ st, const long long n_states, const T t, const T tiny,
    const T* __restrict__ theta, const int d, const T l2,
    T* __restrict__ f, T* __restrict__ acc_last, T* __restrict__ out)
{
    __shared__ tl_state sh[TL_FINISH_THREADS];
    __shared__ T sq[TL_FINISH_THREADS];
    const tl_state all = tl_merge_all(st, n_states, t, sh);
    T p = 0;
    for (int j = threadIdx.x; j < d; j += TL_FINISH_THREADS) {
        p += theta[j] * theta[j];
        acc_last[j] = theta[j];
    }
    sq[threadIdx.x] = p;
    __syncthreads();
    for (int w = TL_FINISH_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sq[threadIdx.x] += sq[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const T pen = l2 > 0 ? (T)0.5 * l2 * sq[0] : (T)0;
        out[0] = tl_risk(all, t, tiny) + pen;
        out[1] = tl_state_finite(&all) ? (T)0 : (T)1;
        f[n_states] = l2;
    }
    for (long long g = threadIdx.x; g < n_states; g += TL_FINISH_THREADS)
        f[g] = tl_share(tl_load(st, g), all, t);
}

/* the gradient: grad[j] = sum over the rows g < n_rows of f[g] acc[g][j] (the blocks'
 * shares and gradient sums, and the ridge row), for 32 features a block; each warp takes
 * every TL_GRAD_WARPS-th row, and the warps' sums are added in warp order (the same sums
 * at every run) */
#ifndef TL_GRAD_WARPS
#  define TL_GRAD_WARPS 32
#endif
extern "C" __global__ void tilted_vg_grad(
    const T* __restrict__ f, const T* __restrict__ acc, const long long n_rows, const int d,
    T* __restrict__ grad)
{
    __shared__ T part[TL_GRAD_WARPS][33];
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const int j = blockIdx.x * 32 + lane;
    T sum = (T)0;
    if (j < d)
        for (long long g = wid; g < n_rows; g += TL_GRAD_WARPS) sum += f[g] * acc[g * d + j];
    part[wid][lane] = sum;
    __syncthreads();
    if (wid == 0 && j < d) {
        T all = (T)0;
        for (int w = 0; w < TL_GRAD_WARPS; ++w) all += part[w][lane];
        grad[j] = all;
    }
}

/* the losses and their first derivatives at the predictors z (one pass over the samples;
 * the hierarchical objective's first step) */
extern "C" __global__ void tilted_loss_d1(
    const T* __restrict__ z, const T* __restrict__ y, const long long n,
    T* __restrict__ l, T* __restrict__ d1)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T v, g, h;
        TL_LOSS(z[i], y[i], (T)TL_PARAM, &v, &g, &h);
        l[i] = v;
        d1[i] = g;
    }
}

/* the hierarchical Hessian-vector product's first step: at the samples' predictors and
 * directional predictors zu = [z u] (n x 2, row-major), the losses, their first
 * derivatives, the directional derivatives a = l' u and the curvature terms hu = l'' u */
extern "C" __global__ void tilted_loss_d12(
    const T* __restrict__ zu, const T* __restrict__ y, const long long n,
    T* __restrict__ l, T* __restrict__ d1, T* __restrict__ a, T* __restrict__ hu)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T v, g, h;
        TL_LOSS(zu[2 * i], y[i], (T)TL_PARAM, &v, &g, &h);
        const T u = zu[2 * i + 1];
        l[i] = v;
        d1[i] = g;
        a[i] = g * u;
        hu[i] = h * u;
    }
}
#endif /* TL_LOSS */

/* ------------------------------------------------------------------------------------
 * tilted_risk and tilted_weights of one-dimensional losses: two passes over the losses,
 * their extremes (one pair per block) and then their sums relative to the extreme on the
 * tilt's side, each block of the second pass merging the first pass's pairs itself. With
 * the shift and the range known before the sums, every loss costs one transcendental
 * (expm1 where |t| (hi - lo) <= 1, else exp), no shift moves and no state is carried from
 * one loss to the next; one block then merges the blocks' states, and (weights) one more
 * elementwise pass
 */

/* the sum (op 0), largest (1) or smallest (2) of the block's values v, for every thread
 * of the block (sh: TL_BLOCK_THREADS numbers of shared work space, free again on return) */
__device__ __forceinline__ T tl_block_all(T* sh, T v, int op) {
    sh[threadIdx.x] = v;
    __syncthreads();
#pragma unroll 1
    for (int w = TL_BLOCK_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            const T a = sh[threadIdx.x], b = sh[threadIdx.x + w];
            sh[threadIdx.x] = op == 0 ? a + b : (op == 1 ? (b > a ? b : a) : (b < a ? b : a));
        }
        __syncthreads();
    }
    const T all = sh[0];
    __syncthreads();
    return all;
}

/* ext[2 b], ext[2 b + 1]: the largest and smallest loss of block b's share (NaN losses
 * take no part: they turn the sums NaN in the second pass) */
extern "C" __global__ void tilted_extremes_blocks(
    const T* __restrict__ l, const long long n, T* __restrict__ ext)
{
    __shared__ T sh[TL_BLOCK_THREADS];
    T hi = -tl_inf(), lo = tl_inf();
    const long long stride = (long long)gridDim.x * TL_BLOCK_THREADS;
    for (long long i = (long long)blockIdx.x * TL_BLOCK_THREADS + threadIdx.x; i < n; i += stride) {
        const T v = l[i];
        hi = v > hi ? v : hi;
        lo = v < lo ? v : lo;
    }
    hi = tl_block_all(sh, hi, 1);
    lo = tl_block_all(sh, lo, 2);
    if (threadIdx.x == 0) {
        ext[2 * blockIdx.x] = hi;
        ext[2 * blockIdx.x + 1] = lo;
    }
}

/* block b's tilted state in parts (the empty state for a block without losses): the
 * shift c is the largest loss of all for t > 0 (else the smallest), from the n_ext pairs
 * of tilted_extremes_blocks */
extern "C" __global__ void tilted_sums_blocks(
    const T* __restrict__ l, const long long n, const T t, const T* __restrict__ ext,
    const long long n_ext, T* __restrict__ parts)
{
    __shared__ T sh[TL_BLOCK_THREADS];
    T hi = -tl_inf(), lo = tl_inf();
    for (long long g = threadIdx.x; g < n_ext; g += TL_BLOCK_THREADS) {
        const T h = ext[2 * g], m = ext[2 * g + 1];
        hi = h > hi ? h : hi;
        lo = m < lo ? m : lo;
    }
    hi = tl_block_all(sh, hi, 1);
    lo = tl_block_all(sh, lo, 2);
    const T c = t > (T)0 ? hi : lo;
    const int small = tl_small_range(t, hi, lo);  /* the same for every thread */
    T s = (T)0, q = (T)0, lsum = (T)0, mass = (T)0;
    const long long stride = (long long)gridDim.x * TL_BLOCK_THREADS;
    for (long long i = (long long)blockIdx.x * TL_BLOCK_THREADS + threadIdx.x; i < n; i += stride) {
        const T v = l[i];
        T e, e1;  /* one transcendental: expm1 near t = 0, else exp */
        tl_state_weight(t, v, c, small, &e, &e1);
        tl_state_fold((T)1, v, c, e, e1, mass, s, q, lsum, &mass, &s, &q, &lsum);
    }
    s = tl_block_all(sh, s, 0);
    q = tl_block_all(sh, q, 0);
    lsum = tl_block_all(sh, lsum, 0);
    mass = tl_block_all(sh, mass, 0);
    if (threadIdx.x == 0) {
        tl_state st = tl_empty();
        if (mass > (T)0) {
            st.c = c;
            st.hi = hi;
            st.lo = lo;
            st.s = s;
            st.q = small ? q : tl_nan();  /* dropped, as tl_add_w drops it */
            st.lsum = lsum;
            st.mass = mass;
        }
        tl_store(parts, blockIdx.x, st);
    }
}

/* out: the risk, a status (0: every loss finite), the merged shift and normaliser */
extern "C" __global__ void tilted_state_finish(
    const T* __restrict__ parts, const long long n_parts, const T t, const T tiny,
    T* __restrict__ out)
{
    __shared__ tl_state sh[TL_FINISH_THREADS];
    const tl_state all = tl_merge_all(parts, n_parts, t, sh);
    if (threadIdx.x == 0) {
        out[0] = tl_risk(all, t, tiny);
        out[1] = tl_state_finite(&all) ? (T)0 : (T)1;
        out[2] = all.c;
        out[3] = all.s;
    }
}

extern "C" __global__ void tilted_weights_apply(
    const T* __restrict__ l, const long long n, const T t, const T* __restrict__ fin,
    T* __restrict__ w)
{
    const T c = fin[2];
    const T s = fin[3];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    {
        T e, e1;
        tl_state_weight(t, l[i], c, 0, &e, &e1);
        w[i] = e / s;
    }
}

/* ------------------------------------------------------------------------------------
 * order-preserving integer keys of the values (the groups' extremes by integer atomics)
 */

#if TL_FLOAT
typedef int tl_key;
#  define TL_KEY_FLIP 0x7fffffff
__device__ __forceinline__ tl_key tl_bits(T v) { return __float_as_int(v); }
__device__ __forceinline__ T tl_unbits(tl_key k) { return __int_as_float(k); }
#else
typedef long long tl_key;
#  define TL_KEY_FLIP 0x7fffffffffffffffLL
__device__ __forceinline__ tl_key tl_bits(T v) { return __double_as_longlong(v); }
__device__ __forceinline__ T tl_unbits(tl_key k) { return __longlong_as_double(k); }
#endif

/* a key whose integer order is the order of the values (NaN beyond the infinities) */
__device__ __forceinline__ tl_key tl_to_key(T v) {
    const tl_key b = tl_bits(v);
    return b >= 0 ? b : (tl_key)(b ^ TL_KEY_FLIP);
}

__device__ __forceinline__ T tl_from_key(tl_key k) {
    return tl_unbits(k >= 0 ? k : (tl_key)(k ^ TL_KEY_FLIP));
}

/* ------------------------------------------------------------------------------------
 * hierarchies of any depth. Level k partitions its items (the samples for k = 0, the
 * groups of level k - 1 above) into the groups of level k by codes; every item has a
 * value (a loss, or its group's risk) and a mass (the prior's, or its group's mass), and
 * every group of level k its mass (precomputed with the tree). Per level: the groups'
 * extremes (integer atomics on order-preserving keys), their sums relative to their
 * shifts (tl_state's s, q, lsum, so that each group's state is the tilted state of its
 * items), and each group's risk; the top level merges the outermost groups' states in one
 * block. Weights go down the tree: an item's weight is its group's weight times its share
 * in the group's state, p exp(t (v - c)) / s (tl_share's form; the ties of the extreme at
 * an infinite tilt, since tl_gap is 0 there for the tied values and -inf otherwise).
 * Items of zero mass are skipped (an empty group has mass 0: its state is tl_empty()).
 * Under the uniform prior every sample has the mass unit = 1 / N (passed as a number, no
 * array read), as on the host: the sums of gaps p (v - c) then stay below the largest gap,
 * where unit masses would overflow for losses near the largest float.
 */

#define TL_KEY_LOWEST (-TL_KEY_FLIP - 1)
/* the most groups of a level whose extremes and sums a block gathers in shared memory */
#ifndef TL_SHARED_GROUPS
#  define TL_SHARED_GROUPS 1024
#endif

/* item i's mass: the shared unit mass when unit > 0, else m[i] */
__device__ __forceinline__ T tl_item_mass(const T* m, const T unit, const long long i) {
    return unit > (T)0 ? unit : m[i];
}

/* hi and lo keys to their neutral values, the sums to 0, the status out[1] to 0 */
extern "C" __global__ void tilted_tree_init(
    tl_key* __restrict__ hi, tl_key* __restrict__ lo, const long long n_keys,
    T* __restrict__ sums, const long long n_sums, T* __restrict__ out)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long i = first; i < n_keys; i += stride) {
        hi[i] = (tl_key)TL_KEY_LOWEST;
        lo[i] = (tl_key)TL_KEY_FLIP;
    }
    for (long long i = first; i < n_sums; i += stride) sums[i] = (T)0;
    if (first == 0) out[1] = (T)0;
}

extern "C" __global__ void tilted_level_extremes(
    const T* __restrict__ v, const T* __restrict__ m, const T unit,
    const long long* __restrict__ codes, const long long n, const long long n_groups,
    tl_key* __restrict__ hi, tl_key* __restrict__ lo)
{
    // up to TL_SHARED_GROUPS groups, each block gathers its extremes in shared memory and
    // adds them to the global ones once (few global atomics on few addresses)
    __shared__ tl_key shi[TL_SHARED_GROUPS];
    __shared__ tl_key slo[TL_SHARED_GROUPS];
    const bool priv = n_groups <= TL_SHARED_GROUPS;  /* the same in every thread */
    if (priv) {
        for (long long g = threadIdx.x; g < n_groups; g += blockDim.x) {
            shi[g] = (tl_key)TL_KEY_LOWEST;
            slo[g] = (tl_key)TL_KEY_FLIP;
        }
        __syncthreads();
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (!(tl_item_mass(m, unit, i) > (T)0)) continue;
        const long long g = codes[i];
        const tl_key k = tl_to_key(v[i]);
        if (priv) {
            atomicMax(shi + g, k);
            atomicMin(slo + g, k);
        } else {
            atomicMax(hi + g, k);
            atomicMin(lo + g, k);
        }
    }
    if (priv) {
        __syncthreads();
        for (long long g = threadIdx.x; g < n_groups; g += blockDim.x) {
            if (shi[g] == (tl_key)TL_KEY_LOWEST) continue;  /* no item here */
            atomicMax(hi + g, shi[g]);
            atomicMin(lo + g, slo[g]);
        }
    }
}

/* sums[3 g + (0, 1, 2)]: sum p exp(u), sum p expm1(u), sum p (v - c), u = t (v - c), c the
 * group's shift (its largest value for t > 0, else its smallest); the expm1 sums only for
 * groups whose q is kept (tl_small_range), 0 for the others */
extern "C" __global__ void tilted_level_sums(
    const T* __restrict__ v, const T* __restrict__ m, const T unit,
    const long long* __restrict__ codes, const long long n, const long long n_groups,
    const T t, const tl_key* __restrict__ hi, const tl_key* __restrict__ lo,
    T* __restrict__ sums)
{
    __shared__ T ssum[3 * TL_SHARED_GROUPS];  /* as in tilted_level_extremes */
    const bool priv = n_groups <= TL_SHARED_GROUPS;
    if (priv) {
        for (long long g = threadIdx.x; g < 3 * n_groups; g += blockDim.x) ssum[g] = (T)0;
        __syncthreads();
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T p = tl_item_mass(m, unit, i);
        if (!(p > (T)0)) continue;
        const long long g = codes[i];
        const T gh = tl_from_key(hi[g]), gl = tl_from_key(lo[g]);
        const T c = t > 0 ? gh : gl;
        const T x = v[i];
        /* one transcendental: expm1 while the group keeps q (u in [-1, 0]), else exp */
        const int small = tl_small_range(t, gh, gl);
        T w1, m1, dm, e, em1, dl;
        tl_state_weight(t, x, c, small, &w1, &m1);
        /* the row's terms: its fold into empty sums */
        tl_state_fold(p, x, c, w1, m1, (T)0, (T)0, (T)0, (T)0, &dm, &e, &em1, &dl);
        (void)dm;
        if (priv) {
            atomicAdd(ssum + 3 * g, e);
            atomicAdd(ssum + 3 * g + 1, em1);
            atomicAdd(ssum + 3 * g + 2, dl);
        } else {
            atomicAdd(sums + 3 * g, e);
            atomicAdd(sums + 3 * g + 1, em1);
            atomicAdd(sums + 3 * g + 2, dl);
        }
    }
    if (priv) {
        __syncthreads();
        for (long long g = threadIdx.x; g < 3 * n_groups; g += blockDim.x)
            if (ssum[g] != (T)0) atomicAdd(sums + g, ssum[g]);
    }
}

/* mass[g] += unit times the number of items of group g (mass zeroed by the caller); up to
 * TL_SHARED_GROUPS groups, each block counts in shared memory and adds its counts once.
 * Beyond that the items add one at a time, as the sums of tilted_level_sums do: in float
 * such a running sum stops growing at 2^24, so a group of more items has inexact sums */
extern "C" __global__ void tilted_level_count(
    const long long* __restrict__ codes, const long long n, const long long n_groups,
    const T unit, T* __restrict__ mass)
{
    __shared__ unsigned int scount[TL_SHARED_GROUPS];
    const bool priv = n_groups <= TL_SHARED_GROUPS;
    if (priv) {
        for (long long g = threadIdx.x; g < n_groups; g += blockDim.x) scount[g] = 0u;
        __syncthreads();
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (priv) atomicAdd(scount + codes[i], 1u);
        else atomicAdd(mass + codes[i], unit);
    }
    if (priv) {
        __syncthreads();
        for (long long g = threadIdx.x; g < n_groups; g += blockDim.x)
            if (scount[g]) atomicAdd(mass + g, (T)scount[g] * unit);
    }
}

/* nested device labels: parent[inner[i]] = outer[i] for every sample (labels that nest
 * give every inner group one outer label, so the threads that write one group write the
 * same value); a second pass sets bad[0] = 1 where a sample's outer label differs from its
 * inner group's parent (the labels do not nest). parent is zeroed by the caller: an unused
 * inner code keeps the parent 0, and its mass 0 keeps it out of every sum */
extern "C" __global__ void tilted_level_parent(
    const long long* __restrict__ inner, const long long* __restrict__ outer,
    const long long n, long long* __restrict__ parent)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        parent[inner[i]] = outer[i];
}

extern "C" __global__ void tilted_level_nested(
    const long long* __restrict__ inner, const long long* __restrict__ outer,
    const long long n, const long long* __restrict__ parent, long long* __restrict__ bad)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        if (parent[inner[i]] != outer[i]) bad[0] = 1;
}

/* the state of group g (tl_empty() for a group without mass) */
__device__ __forceinline__ tl_state tl_group_state(
    const tl_key* hi, const tl_key* lo, const T* sums, const T* gmass, const long long g,
    const T t)
{
    if (!(gmass[g] > (T)0)) return tl_empty();
    tl_state st;
    st.hi = tl_from_key(hi[g]);
    st.lo = tl_from_key(lo[g]);
    st.c = t > 0 ? st.hi : st.lo;
    st.s = sums[3 * g];
    st.q = tl_small_range(t, st.hi, st.lo) ? sums[3 * g + 1] : tl_nan();  /* as tl_add */
    st.lsum = sums[3 * g + 2];
    st.mass = gmass[g];
    return st;
}

/* every group's risk (0 for a group without mass); out[1] = 1 when a state is not finite */
extern "C" __global__ void tilted_level_finish(
    const tl_key* __restrict__ hi, const tl_key* __restrict__ lo, const T* __restrict__ sums,
    const T* __restrict__ gmass, const long long n_groups, const T t, const T tiny,
    T* __restrict__ risk, T* __restrict__ out)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < n_groups;
         g += stride) {
        const tl_state st = tl_group_state(hi, lo, sums, gmass, g, t);
        risk[g] = tl_is_empty(&st) ? (T)0 : tl_risk(st, t, tiny);
        if (!tl_state_finite(&st)) out[1] = (T)1;
    }
}

/* one block: the outermost groups' risks at t merged at the top tilt tau. out: the risk
 * (NaN when a loss was not finite), the status (1 then, also when a lower level set it),
 * the top state's shift and sum; with
 * want, w[g] = each group's weight P_g exp(tau (R_g - c)) / s */
extern "C" __global__ void tilted_tree_top(
    const tl_key* __restrict__ hi, const tl_key* __restrict__ lo, const T* __restrict__ sums,
    const T* __restrict__ gmass, const long long n_groups, const T t, const T tau,
    const T tiny, const int want, T* __restrict__ w, T* __restrict__ out)
{
    __shared__ tl_state sh[TL_FINISH_THREADS];
    __shared__ int bad[TL_FINISH_THREADS];
    tl_state top = tl_empty();
    int my_bad = 0;
    T r;
    for (long long g = threadIdx.x; g < n_groups; g += TL_FINISH_THREADS) {
        const tl_state st = tl_group_state(hi, lo, sums, gmass, g, t);
        if (tl_is_empty(&st)) continue;
        if (!tl_state_finite(&st)) my_bad = 1;
        tl_push_w(&top, tl_risk(st, t, tiny), st.mass, tau, &r);
    }
    sh[threadIdx.x] = top;
    bad[threadIdx.x] = my_bad;
    __syncthreads();
    for (int k = TL_FINISH_THREADS / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) bad[threadIdx.x] |= bad[threadIdx.x + k];
        __syncthreads();
    }
    tl_block_merge<TL_FINISH_THREADS>(sh, tau);
    const tl_state all = sh[0];
    if (threadIdx.x == 0) {
        const int fail = out[1] != (T)0 || bad[0] || !tl_state_finite(&all);
        out[0] = fail ? tl_nan() : tl_risk(all, tau, tiny);  /* NaN: not finite */
        out[1] = fail ? (T)1 : (T)0;
        out[2] = all.c;
        out[3] = all.s;
    }
    if (!want) return;
    for (long long g = threadIdx.x; g < n_groups; g += TL_FINISH_THREADS) {
        const tl_state st = tl_group_state(hi, lo, sums, gmass, g, t);
        w[g] = tl_is_empty(&st)
                   ? (T)0
                   : st.mass * tl_state_factor(tau, tl_risk(st, t, tiny), all.c) / all.s;
    }
}

/* the items' weights from their groups' (w_items[i] = w_groups[g] p exp(t (v - c)) / s),
 * times d1[i] when has_d1 (the gradient's coefficients at the samples) */
extern "C" __global__ void tilted_level_weights(
    const T* __restrict__ v, const T* __restrict__ m, const T unit,
    const long long* __restrict__ codes, const long long n, const T t,
    const tl_key* __restrict__ hi, const tl_key* __restrict__ lo, const T* __restrict__ sums,
    const T* __restrict__ w_groups, const T* __restrict__ d1, const int has_d1,
    T* __restrict__ w_items)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T p = tl_item_mass(m, unit, i);
        T out = (T)0;
        if (p > (T)0) {
            const long long g = codes[i];
            const T c = tl_from_key(t > 0 ? hi[g] : lo[g]);
            T e, e1;
            tl_state_weight(t, v[i], c, 0, &e, &e1);
            out = w_groups[g] * (p * e / sums[3 * g]);
        }
        w_items[i] = has_d1 ? out * d1[i] : out;
    }
}

/* ------------------------------------------------------------------------------------
 * the tilt terms of a hierarchical Hessian-vector product: with w the samples' weights and
 * a their directional derivatives, s_k(i) is the w-weighted mean of a over the node of
 * sample i at level k (s_0 = a, the root's mean last), and the product's coefficient at
 * sample i is  w_i (l''_i u_i + l'_i sum_k t_k (s_k(i) - s_{k+1}(i)))  (tilts innermost
 * first); see tiltlab/objective/engines/generic.py for the derivation
 */

/* out_x[g] += (mul ? w[i] x[i] : x[i]) and out_w[g] += w[i], g = codes[i] (g = 0 with
 * one_group); the outputs zeroed by the caller */
extern "C" __global__ void tilted_level_add2(
    const T* __restrict__ x, const T* __restrict__ w, const int mul,
    const long long* __restrict__ codes, const int one_group, const long long n,
    T* __restrict__ out_x, T* __restrict__ out_w)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long g = one_group ? 0 : codes[i];
        const T wi = w[i];
        atomicAdd(out_x + g, mul ? wi * x[i] : x[i]);
        atomicAdd(out_w + g, wi);
    }
}

/* one level k, per sample: node[i] moves to its group at level k (codes of level k,
 * applied to the sample itself when first), s = S[g] / W[g] its mean there (0 in a group
 * without weight); acc[i] += t (prev[i] - s) and prev[i] = s (prev[i] = a[i] and
 * acc[i] = 0 before the first level) */
extern "C" __global__ void tilted_hvp_level(
    const long long* __restrict__ codes, const int first, const T* __restrict__ a,
    const T* __restrict__ S, const T* __restrict__ W, const T t, const long long n,
    long long* __restrict__ node, T* __restrict__ prev, T* __restrict__ acc)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long g = codes[first ? i : node[i]];
        const T s = W[g] > (T)0 ? S[g] / W[g] : (T)0;
        const T p = first ? a[i] : prev[i];
        const T before = first ? (T)0 : acc[i];
        node[i] = g;
        acc[i] = t == (T)0 ? before : before + t * (p - s);
        prev[i] = s;
    }
}

/* the last level (the root, S and W its totals) and the coefficients:
 * coef[i] = w[i] (hu[i] + d1[i] (acc[i] + t (prev[i] - s_root))) */
extern "C" __global__ void tilted_hvp_coef(
    const T* __restrict__ w, const T* __restrict__ d1, const T* __restrict__ hu,
    const T* __restrict__ prev, const T* __restrict__ acc, const T* __restrict__ S,
    const T* __restrict__ W, const T t, const long long n, T* __restrict__ coef)
{
    const T s = W[0] > (T)0 ? S[0] / W[0] : (T)0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T tilt = t == (T)0 ? acc[i] : acc[i] + t * (prev[i] - s);
        coef[i] = w[i] * (hu[i] + d1[i] * tilt);
    }
}

/* one block: g += l2 theta and out[0] += l2 / 2 |theta|^2 (the ridge term) */
extern "C" __global__ void tilted_ridge(
    T* __restrict__ g, const T* __restrict__ theta, const int d, const T l2,
    T* __restrict__ out)
{
    __shared__ T sq[TL_FINISH_THREADS];
    T p = 0;
    for (int j = threadIdx.x; j < d; j += TL_FINISH_THREADS) {
        p += theta[j] * theta[j];
        g[j] += l2 * theta[j];
    }
    sq[threadIdx.x] = p;
    __syncthreads();
    for (int k = TL_FINISH_THREADS / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sq[threadIdx.x] += sq[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] += (T)0.5 * l2 * sq[0];
}
