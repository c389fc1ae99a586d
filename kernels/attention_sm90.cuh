// attention_sm90.cuh: the Hopper (sm_90a) forward GDPA kernel: TMA, mbarrier pipelines, wgmma,
// warp specialization and a persistent schedule (docs/attention.md, "The sm_90a kernel").
//
// One CTA per SM, 3 warpgroups. Warpgroup 0 is the producer: after setmaxnreg gives most of
// its registers away, one thread issues every TMA copy. Warpgroups 1 and 2 are consumers,
// 64 query rows each of a 128-row query tile; both read the same K and V stages. The CTA walks
// its own entries of the tile list, c, c + G, c + 2G, ... (G = the grid), in the order the
// host dealt them (runtime/gpu/gpu_tiles.c: longest first, back and forth over the CTAs).
//
// The pipeline: Q tiles have two buffers and K/V tiles STAGES, each with a "full" barrier the
// copy engine completes (expect_tx bytes) and an "empty" barrier the 256 consumer threads
// arrive on when their wgmma reads of it are done. The producer never waits for an item to
// finish: it loads the next item's Q and first K/V while the consumers finish the current one
// (outer-loop pipelining), so short KV loops do not drain the pipeline.
//
// Tiles are packed jagged rows: a box that starts inside one example runs on into the next
// example's rows (or past the matrix end, where TMA reads zeros); those rows are masked in the
// scores and never stored. Shared-memory tiles are 128-byte swizzled (TMA's SWIZZLE_128B, which
// is wgmma's 128B layout), one 64-column half after the other for DH = 128.
//
// S = Q·Kᵀ is wgmma m64nBNk16 with both operands in shared memory (K-major); O += P·V takes P
// from registers (the S accumulator fragments re-packed to 16-bit, as for mma.sync) and V from
// shared memory, transposed (N-major). Softmax runs online as in attention_forward.cuh.
// defines: TmaMap, attn_forward_sm90
// tests/codegen runs these kernels on the CPU too (GEMC_ON_CPU): every PTX instruction they use
// is one small function here, which there calls the emulator's (tests/codegen/cuda_on_cpu.h).
#ifndef GEMC_ATTENTION_SM90_CUH
#define GEMC_ATTENTION_SM90_CUH

// cuda.h's CUtensorMap, by value: a __grid_constant__ kernel parameter the runtime fills with
// cuTensorMapEncodeTiled (runtime/gpu/tensor_map.c).
struct __align__(64) TmaMap {
  unsigned long long opaque[16];
};

enum {
  SM90_CONSUMERS = 2,                     // consumer warpgroups
  SM90_THREADS = 128 * (1 + SM90_CONSUMERS),
  SM90_TILE_Q = 64 * SM90_CONSUMERS,      // query rows per work item
  SM90_PRODUCER_REGS = 40,                // setmaxnreg: 128 x 40 + 256 x 232 <= 65536
  SM90_CONSUMER_REGS = 232,
};

// ---------------------------------------------------------------------------------------------
// mbarrier

#ifdef GEMC_ON_CPU
__device__ __forceinline__ void sm90_bar_init(unsigned bar, unsigned count) { emu_mbar_init(bar, count); }
__device__ __forceinline__ void sm90_bar_expect(unsigned bar, unsigned bytes) { emu_mbar_expect_tx(bar, bytes); }
__device__ __forceinline__ void sm90_bar_arrive(unsigned bar) { emu_mbar_arrive(bar); }
__device__ __forceinline__ void sm90_bar_wait(unsigned bar, unsigned parity) {
  while (!emu_mbar_try_wait(bar, parity)) emu_yield();
}
__device__ __forceinline__ bool sm90_bar_test(unsigned bar, unsigned parity) {
  return emu_mbar_try_wait(bar, parity);
}
__device__ __forceinline__ void sm90_tma_load(unsigned dst, const TmaMap &map, int col, int row,
                                              unsigned bar) {
  emu_tma_load(dst, &map, col, row, bar);
}
__device__ __forceinline__ void sm90_tma_store(const TmaMap &map, int col, int row, unsigned src) {
  emu_tma_store(&map, col, row, src);
}
__device__ __forceinline__ void sm90_tma_store_wait_read() {}
__device__ __forceinline__ void sm90_tma_prefetch_map(const TmaMap &) {}
#else
__device__ __forceinline__ void sm90_bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of copies that will complete on the barrier.
__device__ __forceinline__ void sm90_bar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void sm90_bar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void sm90_bar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
}

// Whether the phase of parity `parity` has completed, without waiting.
__device__ __forceinline__ bool sm90_bar_test(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}

// ---------------------------------------------------------------------------------------------
// TMA: one box of `map` at (column, row) into shared memory, completing on `bar`.

__device__ __forceinline__ void sm90_tma_load(unsigned dst, const TmaMap &map, int col, int row,
                                              unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n"
               ::"r"(dst), "l"((unsigned long long)&map), "r"(col), "r"(row), "r"(bar)
               : "memory");
}

// The reverse: one box of shared memory at src to `map` at (column, row), in this thread's bulk
// group (sm90_tma_store_wait_read waits until the shared memory has been read).
__device__ __forceinline__ void sm90_tma_store(const TmaMap &map, int col, int row, unsigned src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
               ::"l"((unsigned long long)&map), "r"(col), "r"(row), "r"(src)
               : "memory");
}
__device__ __forceinline__ void sm90_tma_store_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

__device__ __forceinline__ void sm90_tma_prefetch_map(const TmaMap &map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&map) : "memory");
}
#endif

// The rest of the PTX the kernels use: barrier-init fence, register reallocation, a 32-bit
// shared store, the generic-to-async proxy fence, a named barrier over COUNT threads.
#ifdef GEMC_ON_CPU
__device__ __forceinline__ void sm90_fence_barrier_init() {}
template <int REGS> __device__ __forceinline__ void sm90_setmaxnreg_dec() {}
template <int REGS> __device__ __forceinline__ void sm90_setmaxnreg_inc() {}
__device__ __forceinline__ void sm90_st_shared(unsigned at, unsigned v) { emu_st_shared(at, v); }
__device__ __forceinline__ void sm90_fence_proxy_async() {}
template <int COUNT> __device__ __forceinline__ void sm90_named_barrier(unsigned id) { emu_bar_sync(id, COUNT); }
#else
__device__ __forceinline__ void sm90_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
template <int REGS> __device__ __forceinline__ void sm90_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
}
template <int REGS> __device__ __forceinline__ void sm90_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
}
__device__ __forceinline__ void sm90_st_shared(unsigned at, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ void sm90_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int COUNT> __device__ __forceinline__ void sm90_named_barrier(unsigned id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(COUNT) : "memory");
}
#endif

// ---------------------------------------------------------------------------------------------
// wgmma

// A shared-memory matrix descriptor for the 128-byte swizzled layout: start address, leading
// and stride byte offsets (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ unsigned long long sm90_desc(unsigned addr, unsigned lead,
                                                        unsigned stride) {
  return (unsigned long long)((addr & 0x3ffff) >> 4) | (unsigned long long)(lead >> 4) << 16 |
         (unsigned long long)(stride >> 4) << 32 | 1ull << 62;
}

#ifdef GEMC_ON_CPU
// The emulator runs each wgmma at once, so there is nothing to fence, commit or wait for.
__device__ __forceinline__ void sm90_wgmma_fence() {}
__device__ __forceinline__ void sm90_wgmma_commit() {}
template <int N> __device__ __forceinline__ void sm90_wgmma_wait() {}
template <int N> __device__ __forceinline__ void sm90_pin(float *) {}
template <bool F16> __device__ __forceinline__ unsigned sm90_pack(float lo, float hi) {
  if (F16) return (unsigned)cpu_fp16_bits(lo) | (unsigned)cpu_fp16_bits(hi) << 16;
  return (unsigned)cpu_bf16_bits(lo) | (unsigned)cpu_bf16_bits(hi) << 16;
}
#else
__device__ __forceinline__ void sm90_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void sm90_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void sm90_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma
// fence or wait (the wgmma asm statements name them, but their results land later).
template <int N> __device__ __forceinline__ void sm90_pin(float *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

// Two floats -> one register of two 16-bit values (bf16, or fp16 when F16), `lo` first.
template <bool F16> __device__ __forceinline__ unsigned sm90_pack(float lo, float hi) {
  unsigned r;
  if (F16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif

#ifdef GEMC_ON_CPU
// d (64 x N) (+)= A·B over one k-step of 16, as the emulator's warpgroup collective: A K-major
// in shared memory (SS) or in registers (RS), B K-major (SS) or N-major (RS: transposed).
template <int N, bool F16>
__device__ __forceinline__ void sm90_mma_ss(float *d, unsigned long long a, unsigned long long b,
                                            int accumulate) {
  emu_wgmma(d, N, a, nullptr, false, b, false, accumulate != 0, F16);
}
template <int N, bool F16>
__device__ __forceinline__ void sm90_mma_rs(float *d, const unsigned *a, unsigned long long b) {
  emu_wgmma(d, N, 0, a, false, b, true, true, F16);
}
#else
// The accumulator operands of a wgmma: 8 (m64n16), 16 (m64n32), 32 (m64n64) or 64 (m64n128)
// fp32 registers per thread,
// as the asm register list and as the operand list over d[].
#define SM90_REGS8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define SM90_REGS16 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SM90_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SM90_REGS64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SM90_ACC8(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define SM90_ACC16(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define SM90_ACC32(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SM90_ACC64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (64 x N fp32) (+)= A (64 x 16, shared, K-major) * B (N x 16, shared, K-major)ᵀ, TYPE the
// operands' ("bf16.bf16" or "f16.f16"); NA, NB, NS the asm operand numbers of a, b and
// `accumulate` (after the accumulators).
#define SM90_WGMMA_SS(SHAPE, TYPE, REGS, ACC, NA, NB, NS)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" NS ", 0;\n"                                \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE " {" REGS "}, %" NA ", %" NB   \
               ", p, 1, 1, 0, 0;\n}\n"                                                          \
               : ACC(d)                                                                       \
               : "l"(a), "l"(b), "r"(accumulate))

// d (64 x N fp32) += A (64 x 16, registers a[0..3]) * B (16 x N, shared, N-major: transposed).
#define SM90_WGMMA_RS(SHAPE, TYPE, REGS, ACC, NA0, NA1, NA2, NA3, NB, NS)                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" NS ", 0;\n"                                \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE " {" REGS "}, {%" NA0 ", %"    \
               NA1 ", %" NA2 ", %" NA3 "}, %" NB ", p, 1, 1, 1;\n}\n"                              \
               : ACC(d)                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

// S over the small key tiles (16 or 32 keys: a set that small, where 64-key tiles would be
// mostly masked).
template <bool F16>
__device__ __forceinline__ void sm90_mma_ss_n16(float *d, unsigned long long a,
                                                unsigned long long b, int accumulate) {
  if (F16)
    SM90_WGMMA_SS("m64n16k16", "f16.f16", SM90_REGS8, SM90_ACC8, "8", "9", "10");
  else
    SM90_WGMMA_SS("m64n16k16", "bf16.bf16", SM90_REGS8, SM90_ACC8, "8", "9", "10");
}
template <bool F16>
__device__ __forceinline__ void sm90_mma_ss_n32(float *d, unsigned long long a,
                                                unsigned long long b, int accumulate) {
  if (F16)
    SM90_WGMMA_SS("m64n32k16", "f16.f16", SM90_REGS16, SM90_ACC16, "16", "17", "18");
  else
    SM90_WGMMA_SS("m64n32k16", "bf16.bf16", SM90_REGS16, SM90_ACC16, "16", "17", "18");
}
template <bool F16>
__device__ __forceinline__ void sm90_mma_ss_n64(float *d, unsigned long long a,
                                                unsigned long long b, int accumulate) {
  if (F16)
    SM90_WGMMA_SS("m64n64k16", "f16.f16", SM90_REGS32, SM90_ACC32, "32", "33", "34");
  else
    SM90_WGMMA_SS("m64n64k16", "bf16.bf16", SM90_REGS32, SM90_ACC32, "32", "33", "34");
}
template <bool F16>
__device__ __forceinline__ void sm90_mma_ss_n128(float *d, unsigned long long a,
                                                 unsigned long long b, int accumulate) {
  if (F16)
    SM90_WGMMA_SS("m64n128k16", "f16.f16", SM90_REGS64, SM90_ACC64, "64", "65", "66");
  else
    SM90_WGMMA_SS("m64n128k16", "bf16.bf16", SM90_REGS64, SM90_ACC64, "64", "65", "66");
}
template <bool F16>
__device__ __forceinline__ void sm90_mma_rs_n64(float *d, const unsigned *a, unsigned long long b) {
  if (F16)
    SM90_WGMMA_RS("m64n64k16", "f16.f16", SM90_REGS32, SM90_ACC32, "32", "33", "34", "35", "36",
                  "37");
  else
    SM90_WGMMA_RS("m64n64k16", "bf16.bf16", SM90_REGS32, SM90_ACC32, "32", "33", "34", "35",
                  "36", "37");
}
template <bool F16>
__device__ __forceinline__ void sm90_mma_rs_n128(float *d, const unsigned *a,
                                                 unsigned long long b) {
  if (F16)
    SM90_WGMMA_RS("m64n128k16", "f16.f16", SM90_REGS64, SM90_ACC64, "64", "65", "66", "67",
                  "68", "69");
  else
    SM90_WGMMA_RS("m64n128k16", "bf16.bf16", SM90_REGS64, SM90_ACC64, "64", "65", "66", "67",
                  "68", "69");
}

template <int N, bool F16>
__device__ __forceinline__ void sm90_mma_ss(float *d, unsigned long long a, unsigned long long b,
                                            int accumulate) {
  if (N == 16)
    sm90_mma_ss_n16<F16>(d, a, b, accumulate);
  else if (N == 32)
    sm90_mma_ss_n32<F16>(d, a, b, accumulate);
  else if (N == 64)
    sm90_mma_ss_n64<F16>(d, a, b, accumulate);
  else
    sm90_mma_ss_n128<F16>(d, a, b, accumulate);
}
template <int N, bool F16>
__device__ __forceinline__ void sm90_mma_rs(float *d, const unsigned *a, unsigned long long b) {
  if (N == 64)
    sm90_mma_rs_n64<F16>(d, a, b);
  else
    sm90_mma_rs_n128<F16>(d, a, b);
}
#endif

__device__ __forceinline__ void sm90_store2(float *p, float a, float b) { p[0] = a, p[1] = b; }
__device__ __forceinline__ void sm90_store2(bf16_t *p, float a, float b) {
  *(unsigned *)p = sm90_pack<false>(a, b);
}
__device__ __forceinline__ void sm90_store2(fp16_t *p, float a, float b) {
  *(unsigned *)p = sm90_pack<true>(a, b);
}

// S (64 x BN) = Q·Kᵀ for one consumer warpgroup: its 64 rows of the Q tile at q_rows against
// the K tile at k_tile, DH/16 wgmma issued (the caller fences before and commits after).
template <int DH, int BN, bool F16>
__device__ __forceinline__ void sm90_scores(float *sc, unsigned q_rows, unsigned k_tile) {
#pragma unroll
  for (int kk = 0; kk < DH / 16; kk++) {
    const unsigned step = (kk & 3) * 32;  // 16 columns of a 128-byte row: 32 bytes
    sm90_mma_ss<BN, F16>(sc, sm90_desc(q_rows + (kk / 4) * SM90_TILE_Q * 128 + step, 16, 1024),
                         sm90_desc(k_tile + (kk / 4) * BN * 128 + step, 16, 1024), kk > 0);
  }
}

// S -> P for one key tile, in place: mask, activation (or online softmax, with the factor
// `correction` that O must be rescaled by before this tile's P·V is added). Accumulator
// n-block nb holds keys j0 + 8 nb + 2t + {0, 1} of rows row0 (values 0, 1) and row0 + 8
// (values 2, 3).
template <int ACT, int BN>
__device__ __forceinline__ void sm90_activate(float *sc, float *correction, float *row_max,
                                              float *row_sum, const AttnRows &r,
                                              const AttnExample &e, int j0, int row0, int t) {
  enum { S_REGS = BN / 2, SOFTMAX = ACT == ATTN_ACT_SOFTMAX };
  const float scale_log2 = r.scale * ATTN_LOG2E;
  const bool edge = j0 + BN > e.kv_len || r.causal || r.window > 0;
  if (SOFTMAX) {
    float tile_max[2] = {-ATTN_INF, -ATTN_INF};
#pragma unroll
    for (int i = 0; i < S_REGS; i++) {
      float x = sc[i] * scale_log2;
      if (edge) {
        const int key = j0 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (key >= e.kv_len || !attn_visible(r, row0 + 8 * ((i >> 1) & 1), key))
          x = -ATTN_INF;
      }
      sc[i] = x;
      tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], x);
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
      float mx = tile_max[half];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[half], mx);
      const float m_use = m_new == -ATTN_INF ? 0.0f : m_new;
      correction[half] = exp2f(row_max[half] - m_use);
      row_max[half] = m_new;
      row_sum[half] *= correction[half];
#pragma unroll
      for (int i = 0; i < S_REGS; i++)
        if (((i >> 1) & 1) == half) {
          const float p = exp2f(sc[i] - m_use);
          sc[i] = p;
          row_sum[half] += p;
        }
    }
  } else {
#pragma unroll
    for (int i = 0; i < S_REGS; i++) {
      float p = attn_act_p_tc<ACT>(r, sc[i]);
      if (edge) {
        const int key = j0 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (key >= e.kv_len || !attn_visible(r, row0 + 8 * ((i >> 1) & 1), key)) p = 0.0f;
      }
      sc[i] = p;
    }
  }
}

// The softmax normaliser of one row: its sum over the 4 lanes that hold it, inverted. A row
// that sees no key gets 0, never NaN.
__device__ __forceinline__ float sm90_row_inv(float sum) {
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  return sum > 0.0f ? 1.0f / sum : 0.0f;
}

// One key tile's scores made ready for P·V: activate them (sm90_activate), wait for the
// previous tile's P·V, rescale O (softmax) and pack P into A fragments.
template <int ACT, int BN, int DH, bool F16>
__device__ __forceinline__ void sm90_prepare(float *sc, unsigned (*pa)[4], float *o,
                                             float *row_max, float *row_sum, const AttnRows &r,
                                             const AttnExample &e, int j0, int row0, int t) {
  float correction[2] = {1.0f, 1.0f};
  sm90_activate<ACT, BN>(sc, correction, row_max, row_sum, r, e, j0, row0, t);
  sm90_wgmma_wait<0>();  // the previous tile's P·V
  sm90_pin<DH / 2>(o);
  if (ACT == ATTN_ACT_SOFTMAX) {
#pragma unroll
    for (int i = 0; i < DH / 2; i++) o[i] *= correction[(i >> 1) & 1];
  }
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
    for (int q = 0; q < 4; q++) pa[kk][q] = sm90_pack<F16>(sc[8 * kk + 2 * q], sc[8 * kk + 2 * q + 1]);
}

// O (64 x DH) += P·V: P from registers, the V tile at v_tile transposed, BN/16 wgmma issued.
template <int DH, int BN, bool F16>
__device__ __forceinline__ void sm90_values(float *o, unsigned (*pa)[4], unsigned v_tile) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    sm90_mma_rs<DH, F16>(o, pa[kk], sm90_desc(v_tile + kk * 16 * 128, BN * 128, 1024));
}

// ---------------------------------------------------------------------------------------------
// Work items

// One entry of the tile list as both roles see it: the example, its first query row and head,
// the rows it has, and its key tiles [jlo, jlo + nkv * BN).
struct Sm90Item {
  AttnExample e;
  int i0, h, nq, jlo, nkv;
};

// False for a hole in the deal (example -1).
template <int BN>
__device__ __forceinline__ bool sm90_item(const AttnRows &r, const int *__restrict__ tiles,
                                          int index, Sm90Item *it) {
  const int *tile = tiles + 3 * index;
  const int b = tile[0];
  if (b < 0) return false;
  it->i0 = tile[1];
  it->h = tile[2];
  it->e = attn_example(r, b);
  it->nq = it->e.q_len - it->i0 < SM90_TILE_Q ? it->e.q_len - it->i0 : SM90_TILE_Q;
  // The keys the rows see (attn_key_range, with the low end rounded to BN).
  const int i1 = it->i0 + it->nq;
  int lo = 0, hi = it->e.kv_len;
  if (r.causal && i1 < hi) hi = i1;
  if (r.window > 0) {
    lo = it->i0 - r.window + 1;
    if (lo < 0) lo = 0;
    if (!r.causal && i1 + r.window - 1 < hi) hi = i1 + r.window - 1;
  }
  lo -= lo % BN;
  it->jlo = lo;
  it->nkv = hi > lo ? (hi - lo + BN - 1) / BN : 0;
  return true;
}

// The first valid item of this CTA's list at or after `index` (stepping by the grid), into *it;
// `count` when none is left.
template <int BN>
__device__ __forceinline__ int sm90_next_item(const AttnRows &r, const int *__restrict__ tiles,
                                              int index, int count, Sm90Item *it) {
  for (; index < count; index += gridDim.x)
    if (sm90_item<BN>(r, tiles, index, it)) return index;
  return count;
}

// One work item's Q tile (DH/64 boxes of 128 rows x 64 columns) into `dst`, completing on `full`.
template <int DH>
__device__ __forceinline__ void sm90_forward_load_q(unsigned dst, const TmaMap &q_map,
                                                    const Sm90Item &it, unsigned full) {
  sm90_bar_expect(full, SM90_TILE_Q * DH * 2);
#pragma unroll
  for (int half = 0; half < DH / 64; half++)
    sm90_tma_load(dst + half * SM90_TILE_Q * 128, q_map, it.h * DH + 64 * half,
                  (int)(it.e.q_start + it.i0), full);
}

// Q tiles in flight: two, or four over key tiles of at most 32 keys, where an item is little
// more than its Q load and O store and the producer must run further ahead to keep HBM busy.
#define SM90_Q_BUFFERS(BN) ((BN) <= 32 ? 4 : 2)
// The shared memory attn_forward_sm90 takes: 1 KB of alignment slack, the Q tiles, STAGES K
// and V tiles, the barriers.
#define SM90_FORWARD_SMEM(DH, BN, STAGES)                                                  \
  (1024 + SM90_Q_BUFFERS(BN) * 128 * (DH) * 2 + 2 * (STAGES) * (BN) * (DH) * 2 +          \
   8 * (2 * SM90_Q_BUFFERS(BN) + 4 * (STAGES)))

// ---------------------------------------------------------------------------------------------
// The kernel body. DH: 64 or 128; BN: keys per tile, 16, 32, 64 or 128; F16: q, k, v are fp16 (else
// bf16); `count` entries in `tiles`, dealt for gridDim.x CTAs.

// o_map: O's tensor map (64-row boxes) when OT is the 16-bit type of q, k, v, else nullptr;
// with it, a work item whose 128 rows all lie in its example writes O through the Q tile it has
// consumed and one TMA store per warpgroup and half, instead of 32 stores a thread.
template <int DH, int ACT, int BN, int STAGES, bool F16, typename OT>
__device__ __forceinline__ void attn_forward_sm90(OT *__restrict__ out, const TmaMap &q_map,
                                                  const TmaMap &k_map, const TmaMap &v_map,
                                                  const TmaMap *o_map, const AttnRows &r,
                                                  const int *__restrict__ tiles, int count) {
  enum {
    HALVES = DH / 64,                // 64-column (128-byte) halves of a row
    Q_HALF = SM90_TILE_Q * 128,      // bytes of one half of a Q tile
    KV_HALF = BN * 128,
    Q_BYTES = Q_HALF * HALVES,
    KV_BYTES = KV_HALF * HALVES,
    S_REGS = BN / 2,                 // score accumulators per thread (64 x BN over 128)
    O_REGS = DH / 2,
    SOFTMAX = ACT == ATTN_ACT_SOFTMAX,
    QBUF = SM90_Q_BUFFERS(BN),
  };
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const unsigned base = (attn_smem_addr(sm90_smem) + 1023u) & ~1023u;  // the swizzle's period
  const unsigned q_tiles = base;                           // [QBUF]
  const unsigned k_tiles = q_tiles + QBUF * Q_BYTES;       // [STAGES]
  const unsigned v_tiles = k_tiles + STAGES * KV_BYTES;    // [STAGES]
  const unsigned q_full = v_tiles + STAGES * KV_BYTES;     // 8-byte barriers from here
  const unsigned q_empty = q_full + 8 * QBUF, k_full = q_empty + 8 * QBUF;
  const unsigned v_full = k_full + 8 * STAGES, k_empty = v_full + 8 * STAGES;
  const unsigned v_empty = k_empty + 8 * STAGES;

  if (threadIdx.x == 0) {
    for (int i = 0; i < QBUF; i++) {
      sm90_bar_init(q_full + 8 * i, 1);
      sm90_bar_init(q_empty + 8 * i, 128 * SM90_CONSUMERS);
    }
    for (int s = 0; s < STAGES; s++) {
      sm90_bar_init(k_full + 8 * s, 1);
      sm90_bar_init(v_full + 8 * s, 1);
      sm90_bar_init(k_empty + 8 * s, 128 * SM90_CONSUMERS);
      sm90_bar_init(v_empty + 8 * s, 128 * SM90_CONSUMERS);
    }
    sm90_fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // the producer warpgroup
    sm90_setmaxnreg_dec<SM90_PRODUCER_REGS>();
    if (threadIdx.x != 0) return;
    sm90_tma_prefetch_map(q_map);
    sm90_tma_prefetch_map(k_map);
    sm90_tma_prefetch_map(v_map);
    int n = 0, c = 0;  // Q tiles and key tiles loaded so far
    // The next item's Q is loaded as soon as its buffer is free (the consumers are done with
    // the item that used it before), between this item's K/V tiles, without waiting for the
    // buffer: the consumers then find it landed when they finish this item.
    Sm90Item it;
    int index = sm90_next_item<BN>(r, tiles, blockIdx.x, count, &it);
    bool q_ahead = false;  // the Q of `it` is loaded already
    while (index < count) {
      if (!q_ahead) {
        sm90_bar_wait(q_empty + 8 * (n % QBUF), ((n / QBUF) & 1) ^ 1);
        sm90_forward_load_q<DH>(q_tiles + (n % QBUF) * Q_BYTES, q_map, it, q_full + 8 * (n % QBUF));
        n++;
      }
      Sm90Item nit;
      const int next_index = sm90_next_item<BN>(r, tiles, index + gridDim.x, count, &nit);
      q_ahead = false;
      for (int j = 0; j < it.nkv; j++, c++) {
        const int s = c % STAGES;
        const unsigned free_parity = ((c / STAGES) & 1) ^ 1;
        const int row = (int)(it.e.kv_start + it.jlo + j * BN);
        sm90_bar_wait(k_empty + 8 * s, free_parity);
        sm90_bar_expect(k_full + 8 * s, KV_BYTES);
#pragma unroll
        for (int half = 0; half < HALVES; half++)
          sm90_tma_load(k_tiles + s * KV_BYTES + half * KV_HALF, k_map, it.h * DH + 64 * half,
                        row, k_full + 8 * s);
        sm90_bar_wait(v_empty + 8 * s, free_parity);
        sm90_bar_expect(v_full + 8 * s, KV_BYTES);
#pragma unroll
        for (int half = 0; half < HALVES; half++)
          sm90_tma_load(v_tiles + s * KV_BYTES + half * KV_HALF, v_map, it.h * DH + 64 * half,
                        row, v_full + 8 * s);
        if (!q_ahead && next_index < count &&
            sm90_bar_test(q_empty + 8 * (n % QBUF), ((n / QBUF) & 1) ^ 1)) {
          sm90_forward_load_q<DH>(q_tiles + (n % QBUF) * Q_BYTES, q_map, nit,
                                  q_full + 8 * (n % QBUF));
          n++;
          q_ahead = true;
        }
      }
      it = nit;
      index = next_index;
    }
    return;
  }

  // A consumer warpgroup: query rows [64 cw, 64 cw + 64) of each item.
  sm90_setmaxnreg_inc<SM90_CONSUMER_REGS>();
  const int cw = threadIdx.x / 128 - 1;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float scale_log2 = r.scale * ATTN_LOG2E;
  int n = 0, c = 0;
  for (int index = blockIdx.x; index < count; index += gridDim.x) {
    Sm90Item it;
    if (!sm90_item<BN>(r, tiles, index, &it)) continue;
    const int qb = n % QBUF;
    sm90_bar_wait(q_full + 8 * qb, (n / QBUF) & 1);
    n++;
    const unsigned q_rows = q_tiles + qb * Q_BYTES + cw * 64 * 128;
    const int row0 = it.i0 + cw * 64 + warp * 16 + g;  // this thread's rows: row0, row0 + 8
    float o[O_REGS];
#pragma unroll
    for (int i = 0; i < O_REGS; i++) o[i] = 0.0f;
    float row_max[2] = {-ATTN_INF, -ATTN_INF}, row_sum[2] = {0.0f, 0.0f};

    // The loop is software-pipelined inside the warpgroup: the activation of key tile j runs
    // while the tensor cores still add tile j-1's P·V; then S of tile j+1 and P·V of tile j
    // are issued together, and only S is waited for. K and V stages are released apart (K
    // once its S is done, V once its P·V is), so the producer refills K a tile earlier. The
    // last tile is peeled: its P·V is a wgmma group of its own under the `if` (a group that is
    // wholly conditional is fine; a conditional wgmma inside a group makes ptxas serialize
    // them, C7520).
    float sc[S_REGS];
#pragma unroll
    for (int i = 0; i < S_REGS; i++) sc[i] = 0.0f;
    unsigned pa[BN / 16][4];  // P as wgmma A fragments, 16 keys each
    if (it.nkv > 0) {
      sm90_bar_wait(k_full + 8 * (c % STAGES), (c / STAGES) & 1);
      sm90_pin<S_REGS>(sc);
      sm90_wgmma_fence();
      sm90_scores<DH, BN, F16>(sc, q_rows, k_tiles + (c % STAGES) * KV_BYTES);
      sm90_wgmma_commit();
      sm90_wgmma_wait<0>();
      sm90_pin<S_REGS>(sc);
      sm90_bar_arrive(k_empty + 8 * (c % STAGES));  // K is read; V stays until its P·V is done
    }
    for (int j = 0; j + 1 < it.nkv; j++, c++) {
      const int s = c % STAGES, next = (c + 1) % STAGES;
      sm90_prepare<ACT, BN, DH, F16>(sc, pa, o, row_max, row_sum, r, it.e, it.jlo + j * BN,
                                     row0, t);
      if (j > 0) sm90_bar_arrive(v_empty + 8 * ((c - 1) % STAGES));
      sm90_bar_wait(k_full + 8 * next, ((c + 1) / STAGES) & 1);
      sm90_bar_wait(v_full + 8 * s, (c / STAGES) & 1);
      sm90_pin<S_REGS>(sc);
      sm90_pin<O_REGS>(o);
      sm90_wgmma_fence();
      sm90_scores<DH, BN, F16>(sc, q_rows, k_tiles + next * KV_BYTES);
      sm90_wgmma_commit();
      sm90_values<DH, BN, F16>(o, pa, v_tiles + s * KV_BYTES);
      sm90_wgmma_commit();
      sm90_wgmma_wait<1>();  // S of tile j+1; P·V of tile j stays in flight
      sm90_pin<S_REGS>(sc);
      sm90_bar_arrive(k_empty + 8 * next);
    }
    if (it.nkv > 0) {  // the last key tile: its P·V alone
      const int s = c % STAGES;
      sm90_prepare<ACT, BN, DH, F16>(sc, pa, o, row_max, row_sum, r, it.e,
                                     it.jlo + (it.nkv - 1) * BN, row0, t);
      if (it.nkv > 1) sm90_bar_arrive(v_empty + 8 * ((c - 1) % STAGES));
      sm90_bar_wait(v_full + 8 * s, (c / STAGES) & 1);
      sm90_pin<O_REGS>(o);
      sm90_wgmma_fence();
      sm90_values<DH, BN, F16>(o, pa, v_tiles + s * KV_BYTES);
      sm90_wgmma_commit();
      sm90_wgmma_wait<0>();
      sm90_pin<O_REGS>(o);
      sm90_bar_arrive(v_empty + 8 * s);
      c++;
    }
    sm90_wgmma_wait<0>();  // a no-op (nothing is in flight), which tells ptxas so
    sm90_pin<O_REGS>(o);
    if (sizeof(OT) == 2 && o_map && it.i0 + SM90_TILE_Q <= it.e.q_len) {
      // O into this warpgroup's 64 rows of the Q tile (read by every S, so free now), in the
      // 128-byte swizzle the map uses: 16-byte chunk c of row rl sits at chunk c ^ (rl % 8).
      const unsigned q_mine = q_tiles + qb * Q_BYTES + cw * 64 * 128;
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const float inv = SOFTMAX ? sm90_row_inv(row_sum[half]) : 1.0f;
        const int rl = warp * 16 + g + 8 * half;
#pragma unroll
        for (int nb = 0; nb < DH / 8; nb++) {
          const unsigned at = q_mine + (nb / 8) * Q_HALF + rl * 128 + (((nb % 8) ^ (rl % 8)) * 16) + 4 * t;
          const unsigned v = sm90_pack<F16>(o[4 * nb + 2 * half] * inv, o[4 * nb + 2 * half + 1] * inv);
          sm90_st_shared(at, v);
        }
      }
      sm90_fence_proxy_async();
      sm90_named_barrier<128>(1 + cw);  // this warpgroup's rows
      if ((threadIdx.x & 127) == 0) {
#pragma unroll
        for (int half = 0; half < HALVES; half++)
          sm90_tma_store(*o_map, it.h * DH + 64 * half, (int)(it.e.o_start + it.i0 + cw * 64),
                         q_mine + half * Q_HALF);
        sm90_tma_store_wait_read();  // the Q tile is the producer's again after this
      }
      sm90_bar_arrive(q_empty + 8 * qb);
      continue;
    }
    sm90_bar_arrive(q_empty + 8 * qb);

    // Normalize and store this thread's rows that exist.
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const float inv = SOFTMAX ? sm90_row_inv(row_sum[half]) : 1.0f;
      const int i = row0 + 8 * half;
      if (i >= it.e.q_len) continue;
      OT *dst = out + (it.e.o_start + i) * r.d + it.h * DH + 2 * t;
#pragma unroll
      for (int nb = 0; nb < DH / 8; nb++)
        sm90_store2(dst + 8 * nb, o[4 * nb + 2 * half] * inv, o[4 * nb + 2 * half + 1] * inv);
    }
  }
}

#endif
