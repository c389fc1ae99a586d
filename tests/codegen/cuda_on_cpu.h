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
// defines: launch, threadIdx, blockIdx, blockDim, __syncthreads, __shfl_xor_sync, __shfl_sync,
//          __match_any_sync, __ballot_sync, __popc, __ffs, __nanosleep, atomics,
//          emu_ldmatrix_x4, emu_mma_bf16, emu_cp_async16, __trap, emu_dynamic_smem, emu_mbar_*,
//          EmuTmaMap, emu_tma_load, emu_tma_store, emu_wgmma, emu_st_shared, emu_bar_sync,
//          emu_red_add
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
EmuBarrier block_bar_storage, warp_bar_storage[32], group_bar_storage[8], named_bar_storage[16];
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
template <class T> T __shfl_sync(unsigned, T v, int src) {  // src within the warp (width 32)
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  warp_buf[w][l] = (double)v;
  __syncwarp();
  T r = (T)warp_buf[w][src & 31];
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
// cp.async.cg.shared.global of 16 bytes, zero-filled when !valid: the source is read at issue,
// and the destination written at one of the two ends of what the hardware may do. In odd
// blocks only when a cp.async.wait_group of the thread covers its group, so a read before the
// wait (or a wait for too few groups) sees the poisoned shared memory; in even blocks at once,
// so a copy into a stage that another warp still reads (a missing __syncthreads before the
// refill) overwrites it.
struct EmuCopy {
  unsigned char *dst;
  unsigned char bytes[16];
  unsigned group;
};
static std::vector<EmuCopy> emu_copies[1024];
static unsigned emu_copy_groups[1024];  // groups committed by each thread
inline void emu_cp_async16(void *dst, const void *src, bool valid) {
  EmuCopy c;
  c.dst = (unsigned char *)dst;
  if (valid) memcpy(c.bytes, src, 16);
  else memset(c.bytes, 0, 16);
  if (blockIdx.x % 2 == 0) {
    memcpy(c.dst, c.bytes, 16);
    return;
  }
  c.group = emu_copy_groups[threadIdx.x];
  emu_copies[threadIdx.x].push_back(c);
}
inline void emu_cp_async_commit() { emu_copy_groups[threadIdx.x]++; }
// cp.async.wait_group n: every group but the newest n has landed.
inline void emu_cp_async_wait(unsigned n) {
  std::vector<EmuCopy> &q = emu_copies[threadIdx.x];
  unsigned done = emu_copy_groups[threadIdx.x] >= n ? emu_copy_groups[threadIdx.x] - n : 0;
  size_t kept = 0;
  for (size_t i = 0; i < q.size(); i++) {
    if (q[i].group < done) memcpy(q[i].dst, q[i].bytes, 16);
    else q[kept++] = q[i];
  }
  q.resize(kept);
}
// ---------------------------------------------------------------------------------------------
// Hopper

alignas(1024) unsigned char emu_dynamic_smem[256 * 1024];
static size_t emu_poison_bytes;  // set by the launcher: the launch's dynamic shared memory

inline void emu_st_shared(unsigned at, unsigned v) { memcpy(emu_dynamic_smem + at, &v, 4); }
inline void emu_red_add(float *p, float v) { *p += v; }

// bar.sync id, count: the first `count` arrivals release it.
inline void emu_bar_sync(unsigned id, unsigned count) {
  EmuBarrier &b = named_bar_storage[id];
  b.expected = count;
  emu_arrive_and_wait(b);
}

// mbarriers, by shared-memory address (8 bytes each).
struct EmuMbar {
  int expected, pending, tx;
  unsigned phase;  // of the phase in progress
};
static EmuMbar emu_mbars[sizeof emu_dynamic_smem / 8];
static std::vector<unsigned> emu_mbars_used;
inline void emu_mbar_reset() {
  for (unsigned i : emu_mbars_used) emu_mbars[i] = {0, 0, 0, 0};
  emu_mbars_used.clear();
}
inline EmuMbar &emu_mbar(unsigned addr) {
  if (addr % 8 || addr >= sizeof emu_dynamic_smem) {
    fprintf(stderr, "cuda_on_cpu: mbarrier at %u\n", addr);
    abort();
  }
  return emu_mbars[addr / 8];
}
inline void emu_mbar_init(unsigned addr, unsigned count) {
  emu_mbar(addr) = {(int)count, (int)count, 0, 0};
  emu_mbars_used.push_back(addr / 8);
}
// The phase completes when every arrival came and every announced byte landed.
inline void emu_mbar_settle(EmuMbar &m) {
  emu_progress++;
  if (m.pending < 0 || (m.pending == 0 && m.tx < 0)) {
    fprintf(stderr, "cuda_on_cpu: mbarrier over-arrived (pending %d, tx %d)\n", m.pending, m.tx);
    abort();
  }
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1;
    m.pending = m.expected;
  }
}
inline void emu_mbar_arrive(unsigned addr) {
  EmuMbar &m = emu_mbar(addr);
  m.pending--;
  emu_mbar_settle(m);
}
inline void emu_mbar_expect_tx(unsigned addr, unsigned bytes) {
  EmuMbar &m = emu_mbar(addr);
  m.tx += (int)bytes;
  m.pending--;
  emu_mbar_settle(m);
}
inline void emu_mbar_complete_tx(unsigned addr, unsigned bytes) {
  EmuMbar &m = emu_mbar(addr);
  m.tx -= (int)bytes;
  if (m.pending > 0 || m.tx != 0) {  // bytes before their arrival: the phase waits for both
    emu_progress++;
    return;
  }
  emu_mbar_settle(m);
}
// try_wait.parity: whether the phase of that parity has completed (the one in progress has
// the other parity).
inline bool emu_mbar_try_wait(unsigned addr, unsigned parity) {
  return emu_mbar(addr).phase != (parity & 1);
}

// The emulator's tensor map, in the 128 bytes of a CUtensorMap: a row-major matrix of `rows`
// rows of `width` 2-byte elements, `stride` bytes apart, boxes of box_rows x box_cols, the
// 128-byte swizzle when swizzle is 128.
struct EmuTmaMap {
  uint64_t magic, base, width, rows, stride, box_cols, box_rows, swizzle, unused[8];
};
enum : uint64_t { EMU_TMA_MAGIC = 0x656d75746d61ull };  // "emutma"
inline unsigned emu_swizzle128(unsigned addr) { return addr ^ (((addr >> 7) & 7) << 4); }
inline const EmuTmaMap &emu_tma_map(const void *map) {
  const EmuTmaMap *m = (const EmuTmaMap *)map;
  if (m->magic != EMU_TMA_MAGIC || m->box_cols * 2 != 128 || m->swizzle != 128) {
    fprintf(stderr, "cuda_on_cpu: not an emulator tensor map of 128-byte rows\n");
    abort();
  }
  return *m;
}
inline unsigned emu_box_addr(unsigned base, unsigned r, unsigned c) {
  return emu_swizzle128(base + r * 128 + c * 2);
}
// cp.async.bulk.tensor.2d.shared.global.mbarrier::complete_tx: the box at (col, row).
inline void emu_tma_load(unsigned dst, const void *map, int col, int row, unsigned bar) {
  const EmuTmaMap &m = emu_tma_map(map);
  for (uint64_t r = 0; r < m.box_rows; r++)
    for (uint64_t c = 0; c < m.box_cols; c++) {
      int64_t gr = row + (int64_t)r, gc = col + (int64_t)c;
      uint16_t v = 0;
      if (gr >= 0 && gr < (int64_t)m.rows && gc >= 0 && gc < (int64_t)m.width)
        memcpy(&v, (const unsigned char *)m.base + gr * m.stride + gc * 2, 2);
      memcpy(emu_dynamic_smem + emu_box_addr(dst, (unsigned)r, (unsigned)c), &v, 2);
    }
  emu_mbar_complete_tx(bar, (unsigned)(m.box_rows * m.box_cols * 2));
}
// cp.async.bulk.tensor.2d.global.shared: the box back, what lies inside the matrix.
inline void emu_tma_store(const void *map, int col, int row, unsigned src) {
  const EmuTmaMap &m = emu_tma_map(map);
  for (uint64_t r = 0; r < m.box_rows; r++)
    for (uint64_t c = 0; c < m.box_cols; c++) {
      int64_t gr = row + (int64_t)r, gc = col + (int64_t)c;
      if (gr >= 0 && gr < (int64_t)m.rows && gc >= 0 && gc < (int64_t)m.width)
        memcpy((unsigned char *)m.base + gr * m.stride + gc * 2,
               emu_dynamic_smem + emu_box_addr(src, (unsigned)r, (unsigned)c), 2);
    }
}

// wgmma's shared-memory operands through a matrix descriptor (128-byte swizzle): the start
// address (>> 4 in bits 0-13), the leading byte offset (16-29) and the stride byte offset
// (32-45). K-major, element (row, k) of a 16-wide k-step: rows of 128 bytes, 8-row groups SBO
// apart, k at 2 bytes from the start (which names the k-step inside the row). MN-major, element
// (k, col): 8-row (k) groups SBO apart, 64-column blocks LBO apart.
inline unsigned emu_desc_field(uint64_t d, int shift) {
  if (d >> 62 != 1) {  // the layout type: 1 is the 128-byte swizzle, the only one emulated
    fprintf(stderr, "cuda_on_cpu: wgmma descriptor of layout type %u\n", (unsigned)(d >> 62));
    abort();
  }
  return (unsigned)((d >> shift) & 0x3fff) << 4;
}
inline unsigned emu_kmajor_addr(uint64_t d, int row, int k) {
  return emu_swizzle128(emu_desc_field(d, 0) + (row / 8) * emu_desc_field(d, 32) + (row % 8) * 128 + k * 2);
}
inline unsigned emu_mnmajor_addr(uint64_t d, int k, int col) {
  return emu_swizzle128(emu_desc_field(d, 0) + (col / 64) * emu_desc_field(d, 16) +
                        (k / 8) * emu_desc_field(d, 32) + (k % 8) * 128 + (col % 64) * 2);
}
inline float emu_half_value(uint16_t h, bool f16) {
  if (!f16) return __uint_as_float((unsigned)h << 16);
  unsigned sign = (unsigned)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {  // zero or subnormal: m * 2^-24
    float f = (float)m * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}
inline float emu_smem_half(unsigned addr, bool f16) {
  uint16_t h;
  memcpy(&h, emu_dynamic_smem + addr, 2);
  return emu_half_value(h, f16);
}
struct EmuGroupSlot {
  uint32_t w[128][4];
};
static EmuGroupSlot emu_group_slots[8][2];
static unsigned emu_group_exchanges[1024];
// wgmma.mma_async m64nNk16 .f32: d (64 x N, the warpgroup's; thread 32w + 4g + t holds, of each
// 8-column block j, (16w + g, 8j + 2t..) in d[4j], d[4j + 1] and row + 8 in d[4j + 2, 3])
// (+)= A·B. A from the descriptor a (K-major, or MN-major when a_mn) or, when a_regs, from
// each thread's 4 registers in mma.m16n8k16's A layout over its warp's 16 rows; B from the
// descriptor b, K-major (as N rows of k) or MN-major (b_mn). Products in fp32, summed in k order.
inline void emu_wgmma(float *d, int n, uint64_t a, const unsigned *a_regs, bool a_mn, uint64_t b,
                      bool b_mn, bool accumulate, bool f16) {
  const unsigned tid = threadIdx.x, group = tid / 128;
  const EmuGroupSlot *slot = nullptr;
  if (a_regs) {  // the warpgroup's A fragments, through one warpgroup barrier
    EmuGroupSlot &s = emu_group_slots[group][emu_group_exchanges[tid]++ & 1];
    for (int i = 0; i < 4; i++) s.w[tid % 128][i] = a_regs[i];
    emu_arrive_and_wait(group_bar_storage[group]);
    slot = &s;
  }
  auto a_at = [&](int row, int k) -> float {
    if (slot) {
      int warp = row / 16, r = row % 16;
      uint32_t word = slot->w[32 * warp + 4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)];
      return emu_half_value((uint16_t)(k & 1 ? word >> 16 : word & 0xffffu), f16);
    }
    return emu_smem_half(a_mn ? emu_mnmajor_addr(a, k, row) : emu_kmajor_addr(a, row, k), f16);
  };
  auto b_at = [&](int k, int col) -> float {
    return emu_smem_half(b_mn ? emu_mnmajor_addr(b, k, col) : emu_kmajor_addr(b, col, k), f16);
  };
  const int warp = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  for (int j = 0; j < n / 8; j++)
    for (int c = 0; c < 4; c++) {
      int row = 16 * warp + g + 8 * (c >> 1), col = 8 * j + 2 * t + (c & 1);
      float sum = 0.0f;
      for (int k = 0; k < 16; k++) sum += a_at(row, k) * b_at(k, col);
      d[4 * j + c] = (accumulate ? d[4 * j + c] : 0.0f) + sum;
    }
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
  emu_arrive_and_drop(group_bar_storage[t / 128]);
  emu_fibers[t].done = true;
  // uc_link returns to the scheduler.
}
// Runs the block's fibers until all have exited, one warp at a time: the lanes of warp w are
// resumed round-robin for as long as they make progress (arrive somewhere or exit), and only
// then warp w + 1. So a warp runs as far ahead of the others as CUDA allows it, up to a
// barrier that needs them: a missing __syncthreads or wait lets it read what the others have
// not written yet (NaN-poisoned shared memory), where lockstep warps would hide it.
static void emu_run_block(unsigned threads) {
  unsigned live = threads;
  while (live > 0) {
    unsigned long pass = emu_progress;
    for (unsigned w0 = 0; w0 < threads; w0 += 32) {
      unsigned w1 = w0 + 32 < threads ? w0 + 32 : threads;
      for (;;) {
        unsigned long before = emu_progress;
        for (unsigned t = w0; t < w1; t++) {
          if (emu_fibers[t].done) continue;
          emu_cur = t;
          threadIdx = {t, 0, 0};
          swapcontext(&emu_scheduler, &emu_fibers[t].ctx);
          if (emu_fibers[t].done) live--;
        }
        if (emu_progress == before) break;
      }
    }
    if (live > 0 && emu_progress == pass) {
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
    memset(emu_group_exchanges, 0, sizeof emu_group_exchanges);
    memset(emu_copy_groups, 0, sizeof emu_copy_groups);
    for (unsigned t = 0; t < threads; t++) emu_copies[t].clear();
    // Shared memory starts as NaN bytes in every block (as much as the launch declared), so a
    // read of what the block did not write shows, never another block's leftovers.
    if (emu_poison_bytes) memset(emu_dynamic_smem, 0xff, emu_poison_bytes);
    for (unsigned w = 0; w < (threads + 31) / 32; w++)
      warp_bar_storage[w] = {threads - w * 32 < 32 ? threads - w * 32 : 32, 0, 0};
    for (unsigned w = 0; w < (threads + 127) / 128; w++)
      group_bar_storage[w] = {threads - w * 128 < 128 ? threads - w * 128 : 128, 0, 0};
    for (EmuBarrier &nb : named_bar_storage) nb = {0, 0, 0};
    emu_mbar_reset();
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
