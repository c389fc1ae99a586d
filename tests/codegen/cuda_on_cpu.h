// cuda_on_cpu.h: just enough of CUDA to run gemc's generated kernels (all but attention's) on
// the CPU, so CI checks them against the CPU executor without a GPU: one fiber (a ucontext
// with its own stack) per CUDA thread, the blocks of a grid one after another, each thread run
// until it waits at a barrier, __syncthreads and __syncwarp as counting barriers over the block
// and the warp, warp shuffles through a per-warp buffer between two warp barriers, atomics as
// __atomic builtins. Thread 0 runs to its first barrier before thread 1 starts, so a missing
// barrier reads another thread's data before it is written and shows up as a wrong result; a
// barrier some threads never reach (while others have not exited) stops with a message, not a
// hang. (One OS thread per CUDA thread cost 10x more: futex wake-ups of 256 threads on 2 cores.)
// The warp's tensor-core instructions that gemc's mma.sync kernels use (ldmatrix x4, plain and
// transposed, and mma m16n8k16 bf16 -> fp32) are warp collectives here too: each lane publishes
// its operands, one warp barrier, then each lane forms its own fragment from the others', by
// the fragment layouts of the PTX ISA. cp.async is a plain copy (its groups complete at once).
// defines: launch, threadIdx, blockIdx, blockDim, __syncthreads, __shfl_xor_sync,
//          __match_any_sync, __ballot_sync, __popc, __ffs, __nanosleep, atomics,
//          emu_ldmatrix_x4, emu_mma_bf16, emu_cp_async16, __trap
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
// One warp-collective exchange of up to 8 words a lane: the lane writes its words, waits at the
// warp barrier, and returns the warp's slot for reading. Two slots alternate, so exchange k + 2
// reuses the slot of exchange k only after every lane passed exchange k + 1's barrier, which
// it reached after its reads of k. Every lane of the warp takes part (as .aligned requires).
struct EmuWarpSlot {
  uint32_t w[32][8];
  const unsigned char *p[32];
};
static EmuWarpSlot emu_warp_slots[32][2];
static unsigned emu_exchanges[1024];  // per thread: exchanges done in this block
inline const EmuWarpSlot &emu_warp_exchange(const uint32_t *words, int n, const void *ptr) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  EmuWarpSlot &s = emu_warp_slots[w][emu_exchanges[threadIdx.x]++ & 1];
  for (int i = 0; i < n; i++) s.w[l][i] = words[i];
  s.p[l] = (const unsigned char *)ptr;
  __syncwarp();
  return s;
}
inline uint32_t emu_ld16(const unsigned char *p) { uint16_t h; memcpy(&h, p, 2); return h; }
// ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lanes 8i..8i+7 give the row addresses of matrix i;
// lane 4g + t receives, of each matrix, the two 16-bit elements (g, 2t) and (g, 2t + 1), or with
// .trans (2t, g) and (2t + 1, g).
inline void emu_ldmatrix_x4(unsigned *r, const void *row, bool trans) {
  const EmuWarpSlot &s = emu_warp_exchange(nullptr, 0, row);
  int l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  for (int i = 0; i < 4; i++) {
    if (!trans) {
      memcpy(&r[i], s.p[8 * i + g] + 4 * t, 4);
    } else {
      r[i] = emu_ld16(s.p[8 * i + 2 * t] + 2 * g) | emu_ld16(s.p[8 * i + 2 * t + 1] + 2 * g) << 16;
    }
  }
}
inline float emu_bf16_value(uint32_t bits) { return __uint_as_float((bits & 0xffffu) << 16); }
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, acc += A·B: lane 4g + t holds A's (g, 2t..)
// in a[0], (g + 8, 2t..) in a[1], (g, 2t + 8..) in a[2], (g + 8, 2t + 8..) in a[3]; B's (2t.., g)
// in b[0] and (2t + 8.., g) in b[1]; and acc's (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
// The products of bf16 values are exact in fp32; they are summed in k order (the tensor cores'
// order and rounding differ, within fp32 accumulation's error).
inline void emu_mma_bf16(float *acc, const unsigned *a, const unsigned *b) {
  uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  const EmuWarpSlot &s = emu_warp_exchange(mine, 6, nullptr);
  int l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  auto a_at = [&](int row, int k) {  // A(row, k): lane 4·(row % 8) + (k % 8) / 2
    int reg = (row >= 8) + 2 * (k >= 8);
    uint32_t word = s.w[4 * (row & 7) + ((k & 7) >> 1)][reg];
    return emu_bf16_value(k & 1 ? word >> 16 : word);
  };
  auto b_at = [&](int k, int col) {  // B(k, col): lane 4·col + (k % 8) / 2
    uint32_t word = s.w[4 * col + ((k & 7) >> 1)][4 + (k >= 8)];
    return emu_bf16_value(k & 1 ? word >> 16 : word);
  };
  for (int c = 0; c < 4; c++) {
    int row = g + 8 * (c >> 1), col = 2 * t + (c & 1);
    float sum = 0.0f;
    for (int k = 0; k < 16; k++) sum += a_at(row, k) * b_at(k, col);
    acc[c] += sum;
  }
}
// cp.async.cg.shared.global of 16 bytes, zero-filled when !valid: done at once.
inline void emu_cp_async16(void *dst, const void *src, bool valid) {
  if (valid) memcpy(dst, src, 16);
  else memset(dst, 0, 16);
}
// A spin-wait's pause: the fiber yields, so a wait on a block that never runs (blocks run one
// after another here) stops as a deadlock instead of spinning forever.
inline void emu_yield();
inline void __nanosleep(unsigned) { emu_yield(); }
// __trap: the kernel stops the program, as a trap stops the context on the GPU.
inline void __trap() { fprintf(stderr, "cuda_on_cpu: __trap in block %u, thread %u\n", blockIdx.x, threadIdx.x); abort(); }
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
    memset(emu_exchanges, 0, sizeof emu_exchanges);
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
