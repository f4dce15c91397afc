// A CPU stand-in for the CUDA execution model, enough to run tiltlab's kernels
// (tiltlab/_cupy/kernels.cu) as host C++ in the tests: every thread of a block is an OS
// thread, blocks run one after another (so __shared__ arrays can be function statics),
// __syncthreads is a barrier of the block and the warp intrinsics exchange values
// through a per-warp buffer between two barriers of the warp. Slow, and only for small
// launches; what it checks is the kernels' logic, not their speed.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;

struct emu_warp {
    std::barrier<> bar{32};
    double val[32];
    int pred[32];
};
static std::barrier<>* emu_block_bar = nullptr;
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
    for (int b = 0; b < grid; ++b) {
        std::barrier<> bar(block);
        emu_block_bar = &bar;
        emu_warps.clear();
        for (int w = 0; w < (block + 31) / 32; ++w) emu_warps.emplace_back(new emu_warp());
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (int t = 0; t < block; ++t) {
            threads.emplace_back([&, t, b] {
                threadIdx.x = t;
                blockIdx.x = b;
                fn();
            });
        }
        for (auto& th : threads) th.join();
    }
}
