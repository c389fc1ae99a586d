// gemm.cuh: a bf16 tensor-core GEMM for sm_90a (and later), the generated alternative to the
// cuBLASLt matmuls of codegen/ops/lower_gemm.c (docs/perf.md, "Dense GEMMs"). Row-major
//   C[m, n] = act(op(A)[m, k] · op(B)[k, n] + bias[n])
// with A stored [m, k] (or [k, m] when TRANS_A), B stored [k, n] (or [n, k] when TRANS_B), so
// the three products of a linear layer are all here: x·w (NN), dz·wᵀ (NT), xᵀ·dz (TN). bf16
// operands, fp32 accumulation (mma.sync.aligned.m16n8k16), an fp32 bias, relu / exact gelu
// (erff) / silu epilogue, bf16 or fp32 output.
//
// Schedule: a block of 8 warps computes a BM x BN tile (128x128 or 128x256) of C. Operand tiles
// of GEMM_BK = 32 along k stream through a STAGES-deep cp.async pipeline into shared memory
// whose 16-byte chunks are XOR-swizzled by row, so that both the cp.async writes and the
// ldmatrix reads (.trans for the operands stored k-major) are free of bank conflicts. Each warp
// owns a (BM / WARPS_M) x (BN / WARPS_N) sub-tile. Blocks walk the tiles in groups of
// GEMM_GROUP_M tile rows (L2 reuse of B). Split-K: with splits > 1, block (tile, s) reduces its
// share of k into an fp32 workspace [splits][m][n], and gemm_splitk_reduce sums the splits in
// order (deterministic) and applies the epilogue.
//
// Sizes: any m, n, k. With ALIGNED (the host checks it: every dimension that is contiguous in
// memory, i.e. k of a non-transposed A or transposed B, m of a transposed A, n of a
// non-transposed B and of C, is a multiple of 8, and the pointers are 16-byte aligned) tiles
// move with 16-byte cp.async and C with paired stores; otherwise with element loads and stores
// (slow, correct; the models' n = 1 and k = 1 products take it). Rows and columns past the
// matrix edges are zero-filled, so m (jagged row counts) is free either way.
// Built on kernels/prelude.cuh (i64, bf16_t: the bits of a bf16), which gemm_kernel_source
// pastes first; every name of its own is gemm_-prefixed, and it needs no standard header.
// defines: GEMM_ACT_*, gemm_tile, gemm_splitk_reduce, GEMM_INSTANTIATE
#ifndef GEMC_GEMM_CUH
#define GEMC_GEMM_CUH

// The activations, numbered as gemc's Act enum (compiler/ir/ir.h).
enum { GEMM_ACT_NONE = 0, GEMM_ACT_SILU = 2, GEMM_ACT_GELU = 3, GEMM_ACT_RELU = 5 };
enum { GEMM_BK = 32, GEMM_THREADS = 256, GEMM_WARPS = 8, GEMM_GROUP_M = 8 };

// ---------------------------------------------------------------------------------------------
// Scalars: bf16 packing, the epilogue activation, stores of one or two outputs.

__device__ __forceinline__ unsigned gemm_pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <int ACT> __device__ __forceinline__ float gemm_act(float x) {
  if (ACT == GEMM_ACT_RELU) return x > 0.0f ? x : 0.0f;
  if (ACT == GEMM_ACT_GELU) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  if (ACT == GEMM_ACT_SILU) return x / (1.0f + expf(-x));
  return x;
}

__device__ __forceinline__ void gemm_store1(float *p, float x) { *p = x; }
__device__ __forceinline__ void gemm_store1(bf16_t *p, float x) {
  *p = (bf16_t)(gemm_pack_bf16(x, 0.0f) & 0xffffu);
}
// Two adjacent outputs; p is 8-byte (fp32) or 4-byte (bf16) aligned.
__device__ __forceinline__ void gemm_store2(float *p, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void gemm_store2(bf16_t *p, float a, float b) {
  *(unsigned *)p = gemm_pack_bf16(a, b);
}

// ---------------------------------------------------------------------------------------------
// Shared memory: a tile is ROWS rows of COLS bf16; 16-byte chunk c of row r sits at chunk
// c ^ f(r), f spreading any 8 consecutive rows over the 8 16-byte slots of a 128-byte line.

template <int COLS> __device__ __forceinline__ int gemm_smem_index(int row, int col) {
  enum { CHUNKS = COLS / 8 };
  int chunk = col >> 3;
  int x = CHUNKS >= 8 ? (row & 7) : ((row / (8 / CHUNKS)) & (CHUNKS - 1));
  return row * COLS + ((chunk ^ x) << 3) + (col & 7);
}

__device__ __forceinline__ unsigned gemm_smem_addr(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void gemm_cp_async16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(gemm_smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void gemm_cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void gemm_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [row0, row0 + ROWS) x columns [col0, col0 + COLS) of a row-major matrix with `ld`
// elements per row into a swizzled tile; elements at or past (rows, cols) become zero. All
// GEMM_THREADS threads take part.
template <int ROWS, int COLS, bool ALIGNED>
__device__ __forceinline__ void gemm_load_tile(bf16_t *tile, const bf16_t *__restrict__ src,
                                               i64 ld, i64 row0, i64 col0,
                                               i64 rows, i64 cols) {
  enum { CHUNKS = COLS / 8, TOTAL = ROWS * CHUNKS,
         PER_THREAD = (TOTAL + GEMM_THREADS - 1) / GEMM_THREADS };
#pragma unroll
  for (int i = 0; i < PER_THREAD; i++) {
    const int c = (int)threadIdx.x + i * GEMM_THREADS;
    if (TOTAL % GEMM_THREADS != 0 && c >= TOTAL) break;
    const int r = c / CHUNKS, ch = c % CHUNKS;
    const i64 gr = row0 + r, gc = col0 + ch * 8;
    bf16_t *dst = tile + gemm_smem_index<COLS>(r, ch * 8);
    if (ALIGNED) {
      const bool valid = gr < rows && gc < cols;  // cols % 8 == 0: the whole chunk is inside
      gemm_cp_async16(dst, valid ? src + gr * ld + gc : src, valid);
    } else {
      unsigned w[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        unsigned lo = 0, hi = 0;
        if (gr < rows && gc + 2 * e < cols) lo = src[gr * ld + gc + 2 * e];
        if (gr < rows && gc + 2 * e + 1 < cols) hi = src[gr * ld + gc + 2 * e + 1];
        w[e] = lo | (hi << 16);
      }
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(gemm_smem_addr(dst)),
                   "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Warp-level mma: fragments in PTX's m16n8k16 layouts (lane = 4 * g + t).

__device__ __forceinline__ void gemm_ldmatrix_x4(unsigned *r, const bf16_t *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(gemm_smem_addr(p)));
}
__device__ __forceinline__ void gemm_ldmatrix_x4_trans(unsigned *r, const bf16_t *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(gemm_smem_addr(p)));
}

// acc (16x8 fp32) += a (16x16 bf16, row-major) * b (16x8 bf16, col-major).
__device__ __forceinline__ void gemm_mma(float *acc, const unsigned *a, const unsigned *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A fragment (rows m0.., k k0.., 16x16). TRANS: the tile holds A k-major (GEMM_BK rows of COLS
// = BM), so ldmatrix.trans turns each stored 8x8 [k][m] block into the [m][k] fragment.
template <bool TRANS, int COLS>
__device__ __forceinline__ void gemm_load_a(unsigned *a, const bf16_t *tile, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  if (TRANS)
    gemm_ldmatrix_x4_trans(a, tile + gemm_smem_index<COLS>(k0 + (lane & 7) + ((lane >> 4) << 3),
                                                          m0 + ((lane >> 3) & 1) * 8));
  else
    gemm_ldmatrix_x4(a, tile + gemm_smem_index<COLS>(m0 + (lane & 15), k0 + (lane >> 4) * 8));
}

// B fragments of two n-blocks (n0 and n0 + 8, k k0..k0+15): b[0..1] for n0, b[2..3] for n0 + 8.
// TRANS: the tile holds Bᵀ (BN rows of GEMM_BK), else B (GEMM_BK rows of COLS = BN).
template <bool TRANS, int COLS>
__device__ __forceinline__ void gemm_load_b(unsigned *b, const bf16_t *tile, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  if (TRANS)
    gemm_ldmatrix_x4(b, tile + gemm_smem_index<COLS>(n0 + (lane & 7) + ((lane >> 4) << 3),
                                                    k0 + ((lane >> 3) & 1) * 8));
  else
    gemm_ldmatrix_x4_trans(b, tile + gemm_smem_index<COLS>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                          n0 + (lane >> 4) * 8));
}

// ---------------------------------------------------------------------------------------------
// The epilogue of two adjacent outputs (row, col) and (row, col + 1) of a row-major [*, n]
// matrix: bias, activation, store; columns at or past n are dropped.
template <bool ALIGNED, int ACT, typename OT>
__device__ __forceinline__ void gemm_out2(OT *__restrict__ out, const float *__restrict__ bias,
                                          i64 row, i64 col, i64 n, float v0,
                                          float v1) {
  if (ALIGNED) {  // n % 8 == 0 and col even: both or neither are inside
    if (col >= n) return;
    if (bias) {
      v0 += bias[col];
      v1 += bias[col + 1];
    }
    gemm_store2(out + row * n + col, gemm_act<ACT>(v0), gemm_act<ACT>(v1));
  } else {
    if (col < n) gemm_store1(out + row * n + col, gemm_act<ACT>(v0 + (bias ? bias[col] : 0.0f)));
    if (col + 1 < n)
      gemm_store1(out + row * n + col + 1, gemm_act<ACT>(v1 + (bias ? bias[col + 1] : 0.0f)));
  }
}

// ---------------------------------------------------------------------------------------------
// The kernel body. Grid: tiles_m * tiles_n * splits blocks of GEMM_THREADS threads, dynamic
// shared memory STAGES * (BM + BN) * GEMM_BK * 2 bytes. With splits > 1 the fp32 partial sums
// go to partial[split][m][n] (no bias, no activation) and c is not written.
template <int BM, int BN, int WARPS_M, int STAGES, bool TRANS_A, bool TRANS_B, bool ALIGNED,
          int ACT, typename OT>
__device__ __forceinline__ void gemm_tile(OT *__restrict__ c, float *__restrict__ partial,
                                          const bf16_t *__restrict__ a,
                                          const bf16_t *__restrict__ b,
                                          const float *__restrict__ bias, i64 m, i64 n,
                                          i64 k, int splits) {
  enum {
    WARPS_N = GEMM_WARPS / WARPS_M,
    WM = BM / WARPS_M,
    WN = BN / WARPS_N,
    MI = WM / 16,  // 16-row blocks per warp
    NI = WN / 8,   // 8-column blocks per warp
    A_ELEMS = BM * GEMM_BK,
    STAGE_ELEMS = (BM + BN) * GEMM_BK,
    A_COLS = TRANS_A ? BM : GEMM_BK,  // row width of the A tile in shared memory
    B_COLS = TRANS_B ? GEMM_BK : BN,
  };
  static_assert(WM % 16 == 0 && WN % 16 == 0 && STAGES >= 2, "gemm: bad tile shape");
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  bf16_t *smem = (bf16_t *)gemm_smem;

  // Which tile and which share of k: groups of GEMM_GROUP_M tile rows, column by column.
  const i64 tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
  const i64 tiles = tiles_m * tiles_n;
  const i64 pid = (i64)blockIdx.x % tiles;
  const int split = (int)((i64)blockIdx.x / tiles);
  const i64 per_group = (i64)GEMM_GROUP_M * tiles_n;
  const i64 first_m = pid / per_group * GEMM_GROUP_M;
  const i64 group_rows = tiles_m - first_m < GEMM_GROUP_M ? tiles_m - first_m : GEMM_GROUP_M;
  const i64 tm = first_m + (pid % per_group) % group_rows;
  const i64 tn = (pid % per_group) / group_rows;
  const i64 m0 = tm * BM, n0 = tn * BN;
  const i64 k_steps = (k + GEMM_BK - 1) / GEMM_BK;
  const i64 steps_per_split = (k_steps + splits - 1) / splits;
  const i64 k_begin = (i64)split * steps_per_split * GEMM_BK;
  i64 k_end = k_begin + steps_per_split * GEMM_BK;
  if (k_end > k) k_end = k;
  const int nsteps = k_end > k_begin ? (int)((k_end - k_begin + GEMM_BK - 1) / GEMM_BK) : 0;

  // Stage s <- k step `step` of this split. k bounds are k_end, so a split never reads its
  // neighbour's share.
  auto load_stage = [&](int s, int step) {
    bf16_t *sa = smem + s * STAGE_ELEMS, *sb = sa + A_ELEMS;
    const i64 k0 = k_begin + (i64)step * GEMM_BK;
    if (TRANS_A)
      gemm_load_tile<GEMM_BK, BM, ALIGNED>(sa, a, m, k0, m0, k_end, m);
    else
      gemm_load_tile<BM, GEMM_BK, ALIGNED>(sa, a, k, m0, k0, m, k_end);
    if (TRANS_B)
      gemm_load_tile<BN, GEMM_BK, ALIGNED>(sb, b, k, n0, k0, n, k_end);
    else
      gemm_load_tile<GEMM_BK, BN, ALIGNED>(sb, b, n, k0, n0, k_end, n);
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NI; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

  // One commit per stage and per step, loaded or not, so that wait_group counts steps.
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < nsteps) load_stage(s, s);
    gemm_cp_async_commit();
  }
  for (int step = 0; step < nsteps; step++) {
    gemm_cp_async_wait<STAGES - 2>();  // step's group has landed (this thread's copies)
    __syncthreads();                   // everyone's, and step - 1's stage is free again
    const int next = step + STAGES - 1;
    if (next < nsteps) load_stage(next % STAGES, next);
    gemm_cp_async_commit();

    const bf16_t *sa = smem + (step % STAGES) * STAGE_ELEMS, *sb = sa + A_ELEMS;
#pragma unroll
    for (int kk = 0; kk < GEMM_BK; kk += 16) {
      unsigned fa[MI][4], fb[NI][2];
#pragma unroll
      for (int i = 0; i < MI; i++) gemm_load_a<TRANS_A, A_COLS>(fa[i], sa, wm * WM + i * 16, kk);
#pragma unroll
      for (int j = 0; j < NI / 2; j++) {
        unsigned r[4];
        gemm_load_b<TRANS_B, B_COLS>(r, sb, kk, wn * WN + j * 16);
        fb[2 * j][0] = r[0], fb[2 * j][1] = r[1], fb[2 * j + 1][0] = r[2], fb[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) gemm_mma(acc[i][j], fa[i], fb[j]);
    }
  }
  gemm_cp_async_wait<0>();

  // Thread (g, t) holds, per (i, j), rows g and g + 8 of the 16x8 block, columns 2t and 2t + 1.
  const i64 row_base = m0 + wm * WM + g, col_base = n0 + wn * WN + 2 * t;
  if (splits > 1) {
    float *dst = partial + (i64)split * m * n;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const i64 row = row_base + i * 16 + half * 8;
        if (row >= m) continue;
#pragma unroll
        for (int j = 0; j < NI; j++)
          gemm_out2<ALIGNED, GEMM_ACT_NONE, float>(dst, (const float *)0, row, col_base + j * 8, n,
                                                   acc[i][j][2 * half], acc[i][j][2 * half + 1]);
      }
    return;
  }
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const i64 row = row_base + i * 16 + half * 8;
      if (row >= m) continue;
#pragma unroll
      for (int j = 0; j < NI; j++)
        gemm_out2<ALIGNED, ACT, OT>(c, bias, row, col_base + j * 8, n, acc[i][j][2 * half],
                                    acc[i][j][2 * half + 1]);
    }
}

// Split-K: c = act(sum over s of partial[s] + bias), the splits summed in order. One thread
// per output element; grid ceil(m * n / blockDim.x).
template <int ACT, typename OT>
__device__ __forceinline__ void gemm_splitk_reduce(OT *__restrict__ c,
                                                   const float *__restrict__ partial,
                                                   const float *__restrict__ bias, i64 m,
                                                   i64 n, int splits) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, total = m * n;
  if (i >= total) return;
  float sum = 0.0f;
  for (int s = 0; s < splits; s++) sum += partial[(i64)s * total + i];
  if (bias) sum += bias[i % n];
  gemm_store1(c + i, gemm_act<ACT>(sum));
}

// One instantiation: NAME (the tile) and NAME_reduce (split-K's second pass), extern "C".
#define GEMM_INSTANTIATE(NAME, BM, BN, WARPS_M, STAGES, TRANS_A, TRANS_B, ALIGNED, ACT, OT)      \
  extern "C" __global__ void __launch_bounds__(GEMM_THREADS, (BN) <= 128 ? 2 : 1)              \
      NAME(OT *c, float *partial, const bf16_t *a, const bf16_t *b, const float *bias,      \
           i64 m, i64 n, i64 k, int splits) {                                   \
    gemm_tile<BM, BN, WARPS_M, STAGES, TRANS_A, TRANS_B, ALIGNED, ACT, OT>(c, partial, a, b,      \
                                                                           bias, m, n, k, splits); \
  }                                                                                               \
  extern "C" __global__ void NAME##_reduce(OT *c, const float *partial, const float *bias,        \
                                           i64 m, i64 n, int splits) {                \
    gemm_splitk_reduce<ACT, OT>(c, partial, bias, m, n, splits);                                  \
  }

#endif
