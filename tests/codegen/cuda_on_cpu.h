// cuda_on_cpu.h: just enough of CUDA to run gemc's generated kernels (all but attention's) on
// the CPU, so CI checks them against the CPU executor without a GPU: one std::thread per CUDA
// thread, the blocks of a grid one after another, __syncthreads as a std::barrier over the
// block, warp shuffles through a per-warp buffer between two warp barriers, atomics as
// __atomic builtins. Real concurrency, so a missing barrier or a racy write can show up.
// defines: launch, threadIdx, blockIdx, blockDim, __syncthreads, __shfl_xor_sync,
//          __match_any_sync, __ballot_sync, __popc, __ffs, atomics
#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <atomic>
#include <functional>
#include <cstdio>
#include <cstdint>
struct dim3 { unsigned x, y, z; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<> *block_bar;
std::barrier<> *warp_bar[32];
double warp_buf[32][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
inline void __syncthreads() { block_bar->arrive_and_wait(); }
inline void __syncwarp() { warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
template <class T> T __shfl_xor_sync(unsigned, T v, int off) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  warp_buf[w][l] = (double)v;
  __syncwarp();
  T r = (T)warp_buf[w][l ^ off];
  __syncwarp();
  return r;
}
// The lanes of this thread's warp that hold the same v (a bit per lane), and the lanes whose
// pred is true, through the same buffer.
inline unsigned warp_lanes_where(bool (*same)(double, double), double v) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  int lanes = (int)blockDim.x - w * 32 < 32 ? (int)blockDim.x - w * 32 : 32;
  warp_buf[w][l] = v;
  __syncwarp();
  unsigned m = 0;
  for (int k = 0; k < lanes; k++)
    if (same(warp_buf[w][k], v)) m |= 1u << k;
  __syncwarp();
  return m;
}
inline unsigned __match_any_sync(unsigned, int v) {
  return warp_lanes_where([](double a, double b) { return a == b; }, (double)v);
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  return warp_lanes_where([](double a, double) { return a != 0.0; }, pred ? 1.0 : 0.0);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
// The rounded fp32 intrinsics (never fused into an fma; neither is plain C++ here).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
  return old;
}
template <class F> void launch(unsigned grid, unsigned threads, F f) {
  blockDim = {threads, 1, 1};
  gridDim = {grid, 1, 1};
  for (unsigned b = 0; b < grid; b++) {
    std::barrier<> bar(threads);
    block_bar = &bar;
    std::vector<std::barrier<> *> wb;
    for (unsigned w = 0; w < (threads + 31) / 32; w++) { warp_bar[w] = new std::barrier<>(threads - w * 32 < 32 ? threads - w * 32 : 32); }
    std::vector<std::thread> ts;
    // A thread that returns leaves the barriers, as an exited CUDA thread stops counting.
    for (unsigned t = 0; t < threads; t++)
      ts.emplace_back([=] {
        threadIdx = {t, 0, 0};
        blockIdx = {b, 0, 0};
        f();
        block_bar->arrive_and_drop();
        warp_bar[t / 32]->arrive_and_drop();
      });
    for (auto &t : ts) t.join();
    for (unsigned w = 0; w < (threads + 31) / 32; w++) delete warp_bar[w];
  }
}
