// A CPU stand-in for the CUDA execution model, enough to run tiltlab's kernels
// (tiltlab/_cupy/kernels.cu) as host C++ in the tests: every thread of a block is a
// fiber (ucontext), the fibers of a block take turns on the calling OS thread and switch
// only where a thread waits (at a barrier), blocks run one after another (so __shared__
// arrays can be function statics), __syncthreads is a barrier of the block and the warp
// intrinsics exchange values through a per-warp buffer between two barriers of the warp.
// A thread waiting at a barrier hands over to the next thread that has not finished, so
// every thread runs up to its next barrier before any passes it, as on the device. Slow,
// and only for small launches; what it checks is the kernels' logic, not their speed
// (with an OS thread per CUDA thread, which the barriers kept switching, a launch took
// tens of times longer).
#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
// the running fiber's indices (set at every switch; external linkage, so that the compiler
// reads them again after a switch instead of keeping them in registers)
emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;

struct emu_fiber {
    ucontext_t ctx;
    bool done = false;
};
static std::vector<emu_fiber> emu_fibers;
static std::vector<std::unique_ptr<char[]>> emu_stacks;
static constexpr std::size_t EMU_STACK = 256 * 1024;
static ucontext_t emu_main;
static int emu_current = 0;
static const std::function<void()>* emu_fn = nullptr;

// the next fiber after the running one that has not finished (-1: none)
static int emu_next_live() {
    const int n = (int)emu_fibers.size();
    for (int k = 1; k <= n; ++k) {
        const int j = (emu_current + k) % n;
        if (!emu_fibers[j].done) return j;
    }
    return -1;
}

// hand the OS thread to the next fiber that has not finished
static void emu_yield() {
    const int next = emu_next_live();
    if (next < 0 || next == emu_current) return;
    const int cur = emu_current;
    emu_current = next;
    threadIdx.x = (unsigned)next;
    swapcontext(&emu_fibers[cur].ctx, &emu_fibers[next].ctx);
}

static void emu_entry() {
    (*emu_fn)();
    emu_fibers[emu_current].done = true;
    const int next = emu_next_live();
    if (next < 0) setcontext(&emu_main);  // the block is done: back to the launcher
    emu_current = next;
    threadIdx.x = (unsigned)next;
    setcontext(&emu_fibers[next].ctx);
}

struct emu_barrier {
    int n = 0;
    int count = 0;
    unsigned gen = 0;
    explicit emu_barrier(int size) : n(size) {}
    void arrive_and_wait() {
        const unsigned g = gen;
        if (++count == n) {  // the last to arrive releases the others
            count = 0;
            ++gen;
            return;
        }
        while (gen == g) emu_yield();
    }
};

struct emu_warp {
    emu_barrier bar{32};
    double val[32];
    int pred[32];
};
static emu_barrier* emu_block_bar = nullptr;
static std::vector<std::unique_ptr<emu_warp>> emu_warps;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

static inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }

static inline emu_warp& emu_my_warp() { return *emu_warps[threadIdx.x / 32]; }

template <class V>
static inline V emu_exchange(V v, int src) {
    emu_warp& w = emu_my_warp();
    const int lane = threadIdx.x % 32;
    w.val[lane] = (double)v;
    w.bar.arrive_and_wait();
    const V out = (V)w.val[src];
    w.bar.arrive_and_wait();
    return out;
}

template <class V>
static inline V __shfl_xor_sync(unsigned, V v, int off, int width = 32) {
    const int lane = threadIdx.x % 32;
    const int src = lane ^ off;
    (void)width;
    return emu_exchange(v, src);
}

template <class V>
static inline V __shfl_sync(unsigned, V v, int src_lane, int width = 32) {
    const int lane = threadIdx.x % 32;
    const int base = (lane / width) * width;
    return emu_exchange(v, base + (src_lane % width));
}

static inline int __any_sync(unsigned, int pred) {
    emu_warp& w = emu_my_warp();
    const int lane = threadIdx.x % 32;
    w.pred[lane] = pred != 0;
    w.bar.arrive_and_wait();
    int any = 0;
    for (int i = 0; i < 32; ++i) any |= w.pred[i];
    w.bar.arrive_and_wait();
    return any;
}

// bit casts and atomics (atomic_ref on ordinary memory, as the device's atomics)
static inline int __float_as_int(float v) { int b; std::memcpy(&b, &v, sizeof b); return b; }
static inline float __int_as_float(int b) { float v; std::memcpy(&v, &b, sizeof v); return v; }
static inline long long __double_as_longlong(double v) {
    long long b; std::memcpy(&b, &v, sizeof b); return b;
}
static inline double __longlong_as_double(long long b) {
    double v; std::memcpy(&v, &b, sizeof v); return v;
}

template <class V>
static inline V atomicAdd(V* p, V v) { return std::atomic_ref<V>(*p).fetch_add(v); }

template <class V>
static inline V atomicMax(V* p, V v) {
    std::atomic_ref<V> a(*p);
    V old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {}
    return old;
}

template <class V>
static inline V atomicMin(V* p, V v) {
    std::atomic_ref<V> a(*p);
    V old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {}
    return old;
}

// run fn on a grid of `grid` blocks of `block` threads (a multiple of 32)
static void emu_launch(int grid, int block, const std::function<void()>& fn) {
    gridDim.x = grid;
    blockDim.x = block;
    emu_fn = &fn;
    while ((int)emu_stacks.size() < block) emu_stacks.emplace_back(new char[EMU_STACK]);
    for (int b = 0; b < grid; ++b) {
        emu_barrier bar(block);
        emu_block_bar = &bar;
        emu_warps.clear();
        for (int w = 0; w < (block + 31) / 32; ++w) emu_warps.emplace_back(new emu_warp());
        emu_fibers.assign(block, emu_fiber{});
        for (int t = 0; t < block; ++t) {
            ucontext_t& c = emu_fibers[t].ctx;
            getcontext(&c);
            c.uc_stack.ss_sp = emu_stacks[t].get();
            c.uc_stack.ss_size = EMU_STACK;
            c.uc_link = &emu_main;
            makecontext(&c, emu_entry, 0);
        }
        blockIdx.x = b;
        emu_current = 0;
        threadIdx.x = 0;
        swapcontext(&emu_main, &emu_fibers[0].ctx);
    }
}
