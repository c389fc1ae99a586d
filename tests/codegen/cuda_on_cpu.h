// cuda_on_cpu.h: just enough of CUDA to run gemc's generated kernels (all but attention's) on
// the CPU, so CI checks them against the CPU executor without a GPU: one fiber (a ucontext
// with its own stack) per CUDA thread, the blocks of a grid one after another, each thread run
// until it waits at a barrier, __syncthreads and __syncwarp as counting barriers over the block
// and the warp, warp shuffles through a per-warp buffer between two warp barriers, atomics as
// __atomic builtins. Thread 0 runs to its first barrier before thread 1 starts, so a missing
// barrier reads another thread's data before it is written and shows up as a wrong result; a
// barrier some threads never reach (while others have not exited) stops with a message, not a
// hang. (One OS thread per CUDA thread cost 10x more: futex wake-ups of 256 threads on 2 cores.)
// defines: launch, threadIdx, blockIdx, blockDim, __syncthreads, __shfl_xor_sync,
//          __match_any_sync, __ballot_sync, __popc, __ffs, __nanosleep, atomics
#include <cstdint>
#include <vector>
#include <cmath>
#include <cstring>
#include <atomic>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
struct dim3 { unsigned x, y, z; };
dim3 threadIdx, blockIdx;  // the running fiber's, set by the scheduler before each switch to it
dim3 blockDim, gridDim;

// A counting barrier: a thread arrives and yields until the last of `expected` arrives; a thread
// that exits leaves it (expected - 1), as an exited CUDA thread stops counting.
struct EmuBarrier {
  unsigned expected = 0, arrived = 0, generation = 0;
};
struct EmuFiber {
  ucontext_t ctx;
  char *stack = nullptr;
  bool done = false;
};
enum { EMU_STACK = 1 << 20, EMU_PAGE = 4096 };
static std::vector<EmuFiber> emu_fibers;
static ucontext_t emu_scheduler;
static unsigned emu_cur;
static unsigned long emu_progress;  // bumped on every arrival and exit: a pass without it is a deadlock
static void (*emu_body)(void *);
static void *emu_body_arg;
EmuBarrier block_bar_storage, warp_bar_storage[32];
EmuBarrier *block_bar = &block_bar_storage;
double warp_buf[32][32];

inline void emu_yield() { swapcontext(&emu_fibers[emu_cur].ctx, &emu_scheduler); }
inline void emu_release_if_full(EmuBarrier &b) {
  if (b.arrived > 0 && b.arrived == b.expected) {
    b.arrived = 0;
    b.generation++;
  }
}
inline void emu_arrive_and_wait(EmuBarrier &b) {
  unsigned gen = b.generation;
  b.arrived++;
  emu_progress++;
  emu_release_if_full(b);
  while (b.generation == gen) emu_yield();
}
inline void emu_arrive_and_drop(EmuBarrier &b) {
  b.expected--;
  emu_progress++;
  emu_release_if_full(b);
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
inline void __syncthreads() { emu_arrive_and_wait(block_bar_storage); }
inline void __syncwarp() { emu_arrive_and_wait(warp_bar_storage[threadIdx.x / 32]); }
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
// A spin-wait's pause: the fiber yields, so a wait on a block that never runs (blocks run one
// after another here) stops as a deadlock instead of spinning forever.
inline void emu_yield();
inline void __nanosleep(unsigned) { emu_yield(); }
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
static void emu_fiber_entry() {
  unsigned t = emu_cur;
  emu_body(emu_body_arg);
  emu_arrive_and_drop(block_bar_storage);
  emu_arrive_and_drop(warp_bar_storage[t / 32]);
  emu_fibers[t].done = true;
  // uc_link returns to the scheduler.
}
// Runs the block's fibers round-robin until all have exited.
static void emu_run_block(unsigned threads) {
  unsigned live = threads;
  while (live > 0) {
    unsigned long before = emu_progress;
    for (unsigned t = 0; t < threads; t++) {
      if (emu_fibers[t].done) continue;
      emu_cur = t;
      threadIdx = {t, 0, 0};
      swapcontext(&emu_scheduler, &emu_fibers[t].ctx);
      if (emu_fibers[t].done) live--;
    }
    if (live > 0 && emu_progress == before) {
      fprintf(stderr, "cuda_on_cpu: deadlock in block %u: %u thread(s) wait at a barrier the others "
                      "never reach\n", blockIdx.x, live);
      abort();
    }
  }
}
template <class F> void launch(unsigned grid, unsigned threads, F f) {
  if (threads == 0 || threads > 1024) { fprintf(stderr, "cuda_on_cpu: %u threads a block\n", threads); abort(); }
  blockDim = {threads, 1, 1};
  gridDim = {grid, 1, 1};
  if (emu_fibers.size() < threads) emu_fibers.resize(threads);
  for (unsigned t = 0; t < threads; t++)
    if (!emu_fibers[t].stack) {
      // A guard page below each stack: an overflow faults instead of writing a neighbour's.
      void *m = mmap(nullptr, EMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) { perror("cuda_on_cpu: mmap"); abort(); }
      mprotect(m, EMU_PAGE, PROT_NONE);
      emu_fibers[t].stack = (char *)m;
    }
  emu_body = [](void *p) { (*(F *)p)(); };
  emu_body_arg = &f;
  for (unsigned b = 0; b < grid; b++) {
    blockIdx = {b, 0, 0};
    block_bar_storage = {threads, 0, 0};
    for (unsigned w = 0; w < (threads + 31) / 32; w++)
      warp_bar_storage[w] = {threads - w * 32 < 32 ? threads - w * 32 : 32, 0, 0};
    for (unsigned t = 0; t < threads; t++) {
      EmuFiber &fb = emu_fibers[t];
      fb.done = false;
      getcontext(&fb.ctx);
      fb.ctx.uc_stack.ss_sp = fb.stack + EMU_PAGE;
      fb.ctx.uc_stack.ss_size = EMU_STACK - EMU_PAGE;
      fb.ctx.uc_link = &emu_scheduler;
      makecontext(&fb.ctx, emu_fiber_entry, 0);
    }
    emu_run_block(threads);
  }
  emu_body_arg = nullptr;  // f dies with this call
}
