// attention_quantized_tc.cuh: GDPA at fp8 and mxfp8 on the tensor cores (mma.sync m16n8k16,
// bf16 operands, fp32 accumulators), with the numerics of attention_quantized.cuh's SIMT
// kernels (docs/attention.md, "Quantized attention"):
//   - every quantized value is exact in bf16: an mxfp8 value is an E4M3 value times a power of
//     two; an fp8 value is staged as its E4M3 code (the copy divided by the tensor's scale),
//     and the scales multiply the fp32 result;
//   - P and dS are formed from the score tile in shared memory and quantized there (blocks of
//     32 along the reduction, aligned to the sequence's first row, as the CPU does), then fed
//     back to the tensor cores as bf16.
// What differs from the CPU is only the order of the fp32 sums (the dot products and softmax's
// sum of exponentials), so a quantized P or dS lying on a rounding boundary can round the other
// way; test_gpu_kernels compares with the executor at the fp8 tolerance (2e-2 of the norm).
// Each block has 2 warps (64 threads, the SIMT kernels' launch) and works on 64 x 64 tiles of
// scores: S = Q·Kᵀ (and dP = dO·Vᵀ) by mma into fp32 shared memory, an elementwise pass over
// the tile's valid part (a group of adjacent lanes per mx block), then the second product by
// mma. A sweep
// that needs a whole row's (or column's) statistic first (softmax's max and sum, fp8's amax)
// runs the first product once more per pass, as the SIMT kernels do.
// Needs the prelude, attention.cuh and attention_quantized.cuh. GPU only, for head widths that
// are a multiple of 16; attnq_*_any pick the SIMT kernels otherwise, and on the CPU.
// defines: AttnqScales, attnq_scales, attnq_forward_any, attnq_backward_stats_any,
//          attnq_backward_q_any, attnq_backward_kv_any
#ifndef GEMC_ATTENTION_QUANTIZED_TC_CUH
#define GEMC_ATTENTION_QUANTIZED_TC_CUH

// The per-tensor fp8 scales of the operands (amax / 448); all 1 at mxfp8, whose copies hold
// the values themselves.
struct AttnqScales {
  float q, k, v, dout;
};

__device__ __forceinline__ float attnq_scale_of(const unsigned *amax_bits) {
  return amax_bits ? attnq_fp8_scale(__uint_as_float(*amax_bits)) : 1.0f;
}

__device__ __forceinline__ AttnqScales attnq_scales(const unsigned *q, const unsigned *k,
                                                    const unsigned *v, const unsigned *dout) {
  return AttnqScales{attnq_scale_of(q), attnq_scale_of(k), attnq_scale_of(v), attnq_scale_of(dout)};
}

enum {
  ATTNM_THREADS = 64,
  ATTNM_LDT = 72,  // bf16 tiles 64 wide (keys or queries) and their transposes
  ATTNM_LDS = 65,  // fp32 score tiles: odd, so that a column is read without bank conflicts
};

// Shared-memory parts of the tensor-core kernels, in bytes. bf16 rows are padded by 8 so that
// a fragment's 8 rows x 4 words fall in 32 different banks.
template <int DH> struct AttnmSmem {
  enum {
    LDH = DH + 8,
    ROWS = 64 * LDH * 2,          // 64 rows of one head
    TRANS = DH * ATTNM_LDT * 2,   // one head of 64 rows, transposed
    SCORES = 64 * ATTNM_LDS * 4,  // a 64 x 64 fp32 tile
    QUANT = 64 * ATTNM_LDT * 2,   // a 64 x 64 bf16 tile of quantized P or dS
    STATS = 12 * 64 * 4,          // per-row statistics and partials
    FORWARD = 2 * ROWS + TRANS + SCORES + QUANT + STATS,
    BACKWARD_Q = 4 * ROWS + TRANS + 2 * SCORES + QUANT + STATS,
    BACKWARD_KV = 4 * ROWS + 2 * TRANS + 2 * SCORES + 2 * QUANT + STATS,
  };
};

// Stops the kernel when the launch gave it less shared memory than its layout needs.
__device__ __forceinline__ void attnm_need_smem(unsigned bytes) {
#ifdef GEMC_ON_CPU
  if (bytes > sizeof emu_dynamic_smem) __trap();
#else
  unsigned have;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
  if (have < bytes) __trap();
#endif
}

__device__ __forceinline__ unsigned attnm_ld32(const bf16_t *p) { return *(const unsigned *)p; }

// Rows [row0, row0 + rows) of one head of an fp32 copy (rows <= 64: what the products read),
// times `mul`, as bf16 rows of DH + 8; rows at or past `len` become zeros.
template <int DH>
__device__ __forceinline__ void attnm_stage(bf16_t *tile, const float *__restrict__ src, i64 start,
                                            int row0, int len, int d, int col0, float mul,
                                            int rows = 64) {
  enum { PAIRS = DH / 2, LD = DH + 8 };
  for (int c = threadIdx.x; c < rows * PAIRS; c += ATTNM_THREADS) {
    int rr = c / PAIRS, cc = (c % PAIRS) * 2;
    float2 x = make_float2(0.0f, 0.0f);
    if (row0 + rr < len) x = *(const float2 *)(src + (start + row0 + rr) * d + col0 + cc);
    *(unsigned *)(tile + rr * LD + cc) = attn_pack_bf16(x.x * mul, x.y * mul);
  }
}

// The same, transposed: tile[col][row], rows 72 apart.
template <int DH>
__device__ __forceinline__ void attnm_stage_t(bf16_t *tile, const float *__restrict__ src,
                                              i64 start, int row0, int len, int d, int col0,
                                              float mul, int rows = 64) {
  for (int c = threadIdx.x; c < rows * DH; c += ATTNM_THREADS) {
    int rr = c / DH, cc = c % DH;
    float x = row0 + rr < len ? src[(start + row0 + rr) * d + col0 + cc] * mul : 0.0f;
    tile[cc * ATTNM_LDT + rr] = float_to_bf16(x);
  }
}

template <int NB> __device__ __forceinline__ void attnm_zero(float (&acc)[4][NB][4]) {
#pragma unroll
  for (int m = 0; m < 4; m++)
#pragma unroll
    for (int n = 0; n < NB; n++) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
}

// acc[m][n] += A · B over k in [0, 16 ksteps), for the warp's 16-row blocks m < mblocks and
// 8-column blocks n0 + n: A row-major (k contiguous, lda), B given as Bᵀ (n rows, k
// contiguous, ldb). Fragments by 32-bit loads in PTX's m16n8k16 layouts (lane = 4g + t).
template <int NB>
__device__ __forceinline__ void attnm_mma(float (&acc)[4][NB][4], int mblocks, const bf16_t *a,
                                          int lda, const bf16_t *bt, int ldb, int n0, int ksteps) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < 4; m++) {
    if (m >= mblocks) break;
    for (int ks = 0; ks < ksteps; ks++) {
      const bf16_t *ar = a + (m * 16 + g) * lda + ks * 16 + 2 * t;
      unsigned af[4] = {attnm_ld32(ar), attnm_ld32(ar + 8 * lda), attnm_ld32(ar + 8),
                        attnm_ld32(ar + 8 * lda + 8)};
#pragma unroll
      for (int n = 0; n < NB; n++) {
        const bf16_t *br = bt + ((n0 + n) * 8 + g) * ldb + ks * 16 + 2 * t;
        unsigned bf[2] = {attnm_ld32(br), attnm_ld32(br + 8)};
        attn_mma(acc[m][n], af, bf);
      }
    }
  }
}

// A 64 x 64 fp32 tile (rows 65 apart) = mul · A · Bᵀ for the warp's 32 columns: A's 64 rows
// (the first mblocks blocks of 16) against Bᵀ's 64 rows, both DH wide.
template <int DH>
__device__ __forceinline__ void attnm_scores(float *tile, int mblocks, const bf16_t *a,
                                             const bf16_t *bt, float mul) {
  float acc[4][4][4];
  attnm_zero(acc);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  attnm_mma(acc, mblocks, a, DH + 8, bt, DH + 8, 4 * warp, DH / 16);
#pragma unroll
  for (int m = 0; m < 4; m++) {
    if (m >= mblocks) break;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      float *p = tile + (m * 16 + g) * ATTNM_LDS + (4 * warp + n) * 8 + 2 * t;
      p[0] = acc[m][n][0] * mul;
      p[1] = acc[m][n][1] * mul;
      p[8 * ATTNM_LDS] = acc[m][n][2] * mul;
      p[8 * ATTNM_LDS + 1] = acc[m][n][3] * mul;
    }
  }
}

// Reductions over groups of `group` adjacent lanes (a power of two, at most 32).
__device__ __forceinline__ float attnm_group_max(float x, int group) {  // group uniform
  for (int off = group / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float attnm_group_sum(float x, int group) {  // group uniform
  for (int off = group / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// x quantized as the CPU quantizes it: mxfp8 with the block's amax (the group's), or fp8's
// E4M3 code for a vector of scale `scale` (the caller multiplies the scale back in).
template <int MX>
__device__ __forceinline__ float attnm_quantize(float x, float block_amax, float scale) {
  if (MX) {
    int e = mx_block_exponent(block_amax);
    return e4m3_round(x * ldexpf(1.0f, -e)) * ldexpf(1.0f, e);
  }
  return e4m3_round(__fdiv_rn(x, scale));
}

// The passes of a query-side sweep.
enum { ATTNM_MAX, ATTNM_SUM, ATTNM_DOT, ATTNM_AMAX, ATTNM_QUANT };
// What a query-side kernel computes.
enum { ATTNM_FORWARD, ATTNM_DQ, ATTNM_STATS };

// Per-row statistics in shared memory (AttnmSmem::STATS).
struct AttnmStats {
  float *m, *inv, *dot, *scale, *part;  // part: two warps' partials, 64 each
};

__device__ __forceinline__ AttnmStats attnm_stats_at(float *base) {
  return AttnmStats{base, base + 64, base + 128, base + 192, base + 256};
}

// One example's query tile [i0, i0 + nq) of head h, on the query side: the sweeps over its
// keys that MODE needs, leaving, for FORWARD and DQ, the tile's unscaled result in acc (O, or
// dQ without the softmax scale) and, at fp8, each row's scale of P or dS in st.scale.
template <int DH, int ACT, int MX, int MODE>
__device__ __forceinline__ void attnm_query_tile(float (&acc)[4][DH / 16][4], unsigned char *smem,
                                                 const float *__restrict__ qh,
                                                 const float *__restrict__ kh,
                                                 const float *__restrict__ vh,
                                                 const float *__restrict__ doh,
                                                 const float *__restrict__ second,
                                                 const AttnRows &r, const AttnqScales &sc,
                                                 double inv_norm, const AttnExample &e, int i0,
                                                 int h) {
  typedef AttnmSmem<DH> L;
  enum { NB = DH / 16, SOFTMAX = ACT == ATTN_ACT_SOFTMAX };
  bf16_t *tq = (bf16_t *)smem, *tdo = (bf16_t *)(smem + L::ROWS),
         *tk = (bf16_t *)(smem + 2 * L::ROWS), *tv = (bf16_t *)(smem + 3 * L::ROWS);
  if (MODE == ATTNM_FORWARD) tk = (bf16_t *)(smem + L::ROWS);  // no dO, no V along the heads
  const int rows_bytes = MODE == ATTNM_FORWARD ? 2 * L::ROWS : 4 * L::ROWS;
  bf16_t *tb = (bf16_t *)(smem + rows_bytes);  // the second product's operand, transposed
  float *ts = (float *)(smem + rows_bytes + L::TRANS), *tdp = ts + 64 * ATTNM_LDS;
  const int scores_bytes = MODE == ATTNM_FORWARD ? L::SCORES : 2 * L::SCORES;
  bf16_t *tquant = (bf16_t *)(smem + rows_bytes + L::TRANS + scores_bytes);
  AttnmStats st = attnm_stats_at((float *)(smem + rows_bytes + L::TRANS + scores_bytes + L::QUANT));
  const int col0 = h * DH, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int nq = e.q_len - i0 < 64 ? e.q_len - i0 : 64, mblocks = (nq + 15) / 16;
  int jlo, jhi;
  attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
  const float s_mul = r.scale * sc.q * sc.k, dp_mul = sc.dout * sc.v;
  const float sec_mul = MODE == ATTNM_FORWARD ? 1.0f / sc.v : 1.0f / sc.k;

  __syncthreads();  // the previous tile's readers are done
  attnm_stage<DH>(tq, qh, e.q_start, i0, e.q_len, r.d, col0, 1.0f / sc.q, 16 * mblocks);
  if (MODE != ATTNM_FORWARD)
    attnm_stage<DH>(tdo, doh, e.o_start, i0, e.q_len, r.d, col0, 1.0f / sc.dout, 16 * mblocks);
  if (tid < 64) {
    st.m[tid] = -ATTN_INF, st.inv[tid] = 0.0f, st.dot[tid] = 0.0f, st.scale[tid] = 1.0f;
  }

  auto row_stats = [&](int row) {
    return AttnqRow{st.m[row], st.inv[row], st.dot[row]};
  };
  auto sweep = [&](int pass) {
    const bool need_dp = MODE != ATTNM_FORWARD && pass >= ATTNM_DOT;
    if (tid < 64) st.part[tid] = st.part[64 + tid] = pass == ATTNM_MAX ? -ATTN_INF : 0.0f;
    for (int j0 = jlo; j0 < jhi; j0 += 64) {
      __syncthreads();
      attnm_stage<DH>(tk, kh, e.kv_start, j0, e.kv_len, r.d, col0, 1.0f / sc.k);
      if (need_dp) attnm_stage<DH>(tv, vh, e.kv_start, j0, e.kv_len, r.d, col0, 1.0f / sc.v);
      if (pass == ATTNM_QUANT) attnm_stage_t<DH>(tb, second, e.kv_start, j0, e.kv_len, r.d, col0, sec_mul);
      __syncthreads();
      attnm_scores<DH>(ts, mblocks, tq, tk, s_mul);
      if (need_dp) attnm_scores<DH>(tdp, mblocks, tdo, tv, dp_mul);
      __syncthreads();
      // Keys per row in the elementwise pass: the tile's keys rounded up to a power of two, at
      // least 16 (the second product's k-step); a group of at most 32 lanes is one mx block.
      const int nkt = jhi - j0 < 64 ? jhi - j0 : 64;
      int lanes = 16;
      while (lanes < nkt) lanes *= 2;
      const int group = lanes < 32 ? lanes : 32, end = (nq * lanes + 63) / 64 * 64;
      for (int x = tid; x < end; x += ATTNM_THREADS) {
        const int row = x / lanes, kk = x % lanes, j = j0 + kk;
        const bool ok = row < nq && j < jhi && attn_visible(r, i0 + row, j), lead = kk % group == 0;
        const float s = ts[row * ATTNM_LDS + kk];
        float value = 0.0f;
        if (pass == ATTNM_MAX) {
          value = attnm_group_max(ok ? s : -ATTN_INF, group);
          if (lead) st.part[warp * 64 + row] = fmaxf(st.part[warp * 64 + row], value);
          continue;
        }
        if (pass == ATTNM_SUM) {
          value = attnm_group_sum(ok ? (float)exp((double)(s - st.m[row])) : 0.0f, group);
          if (lead) st.part[warp * 64 + row] += value;
          continue;
        }
        const AttnqRow rs = row_stats(row);
        const float p = attnq_prob<ACT>(s, rs, pass == ATTNM_DOT ? 1.0 : inv_norm);
        if (pass == ATTNM_DOT) {
          value = attnm_group_sum(ok ? tdp[row * ATTNM_LDS + kk] * p : 0.0f, group);
          if (lead) st.part[warp * 64 + row] += value;
          continue;
        }
        if (ok && MODE == ATTNM_DQ) value = attnq_grad<ACT>(s, p, tdp[row * ATTNM_LDS + kk], rs, inv_norm);
        else if (ok) value = p;
        const float amax = attnm_group_max(attnq_finite_abs(value), group);
        if (pass == ATTNM_AMAX) {
          if (lead) st.part[warp * 64 + row] = fmaxf(st.part[warp * 64 + row], amax);
          continue;
        }
        tquant[row * ATTNM_LDT + kk] = float_to_bf16(attnm_quantize<MX>(value, amax, st.scale[row]));
      }
      if (pass == ATTNM_QUANT) {
        __syncthreads();
        const int kmax = jhi - j0 < 64 ? jhi - j0 : 64;
        attnm_mma(acc, mblocks, tquant, ATTNM_LDT, tb, ATTNM_LDT, warp * NB, (kmax + 15) / 16);
      }
    }
    __syncthreads();
    if (tid < 64) {  // fold the two warps' partials into the row's statistic
      const float a = st.part[tid], b = st.part[64 + tid];
      if (pass == ATTNM_MAX) st.m[tid] = fmaxf(a, b);
      if (pass == ATTNM_SUM) st.inv[tid] = st.m[tid] > -ATTN_INF ? 1.0f / (a + b) : 0.0f;
      if (pass == ATTNM_DOT) st.dot[tid] = a + b;
      if (pass == ATTNM_AMAX) st.scale[tid] = attnq_fp8_scale(fmaxf(a, b));
    }
    __syncthreads();
  };
  if (SOFTMAX) {
    sweep(ATTNM_MAX);
    sweep(ATTNM_SUM);
    if (MODE != ATTNM_FORWARD) sweep(ATTNM_DOT);
  }
  if (MODE == ATTNM_STATS) return;
  if (!MX) sweep(ATTNM_AMAX);
  sweep(ATTNM_QUANT);
}

// Calls put(row, col, value) for each of the warp's accumulator entries of rows < rows.
template <int NB, class Put>
__device__ __forceinline__ void attnm_each(const float (&acc)[4][NB][4], int rows, Put put) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < 4; m++)
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int row = m * 16 + g + (c >= 2 ? 8 : 0), col = (warp * NB + n) * 8 + 2 * t + (c & 1);
        if (row < rows) put(row, col, acc[m][n][c]);
      }
}

// Forward: O = quant(P) · V.
template <int DH, int ACT, int MX, typename OT>
__device__ __forceinline__ void attnq_forward_tc(OT *__restrict__ out, const float *__restrict__ qh,
                                                 const float *__restrict__ kh,
                                                 const float *__restrict__ vr, const AttnRows &r,
                                                 double inv_norm, const int *__restrict__ tiles,
                                                 const AttnqScales &sc) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  attnm_need_smem(AttnmSmem<DH>::FORWARD);
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  float acc[4][DH / 16][4];
  attnm_zero(acc);
  attnm_query_tile<DH, ACT, MX, ATTNM_FORWARD>(acc, attn_smem, qh, kh, kh, qh, vr, r, sc, inv_norm,
                                               e, i0, h);
  const AttnmStats st = attnm_stats_at((float *)(attn_smem + AttnmSmem<DH>::FORWARD - AttnmSmem<DH>::STATS));
  const int nq = e.q_len - i0 < 64 ? e.q_len - i0 : 64;
  attnm_each(acc, nq, [&](int row, int col, float x) {
    const float mul = MX ? 1.0f : st.scale[row] * sc.v;
    attn_store1(out + (e.o_start + i0 + row) * r.d + h * DH + col, x * mul);
  });
}

// The softmax statistics {m, 1/sum, dot} of every output row and head, for dK/dV.
template <int DH, int ACT>
__device__ __forceinline__ void attnq_backward_stats_tc(float4 *__restrict__ stats,
                                                        const float *__restrict__ qh,
                                                        const float *__restrict__ kh,
                                                        const float *__restrict__ vh,
                                                        const float *__restrict__ doh,
                                                        const AttnRows &r, int q_tiles,
                                                        const AttnqScales &sc) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  attnm_need_smem(AttnmSmem<DH>::BACKWARD_Q);
  const int heads = r.d / DH;
  const int b = (int)(blockIdx.x / (q_tiles * heads)), h = (int)(blockIdx.x % heads);
  const int i0 = (int)((blockIdx.x / heads) % q_tiles) * 64;
  const AttnExample e = attn_example(r, b);
  if (i0 >= e.q_len) return;
  float acc[4][DH / 16][4];
  attnm_query_tile<DH, ACT, 1, ATTNM_STATS>(acc, attn_smem, qh, kh, vh, doh, kh, r, sc, 1.0, e,
                                            i0, h);
  const AttnmStats st = attnm_stats_at((float *)(attn_smem + AttnmSmem<DH>::BACKWARD_Q - AttnmSmem<DH>::STATS));
  const int row = threadIdx.x;
  if (i0 + row < e.q_len)
    stats[(e.o_start + i0 + row) * heads + h] = make_float4(st.m[row], st.inv[row], st.dot[row], 0.0f);
}

// dQ = scale · quant(dS) · K; PMA (no tile list) sums the examples in order, in `chunks` ranges
// of fp32 partials when `partial` is given.
template <int DH, int ACT, int MX, typename GT>
__device__ __forceinline__ void attnq_backward_q_tc(GT *__restrict__ dq, i64 batch,
                                                    const float *__restrict__ qh,
                                                    const float *__restrict__ kh,
                                                    const float *__restrict__ vh,
                                                    const float *__restrict__ doh,
                                                    const float *__restrict__ kr, const AttnRows &r,
                                                    double inv_norm, const int *__restrict__ tiles,
                                                    float *__restrict__ partial, int chunks,
                                                    const AttnqScales &sc) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  attnm_need_smem(AttnmSmem<DH>::BACKWARD_Q);
  enum { NB = DH / 16 };
  const int heads = r.d / DH;
  int b_first, b_end, i0, h, chunk;  // PMA (no tile list): a range of examples, in order
  attn_query_block(tiles, batch, 64, heads, partial ? chunks : 1, r.kv_off, &b_first, &b_end,
                   &i0, &h, &chunk);
  const AttnmStats st = attnm_stats_at((float *)(attn_smem + AttnmSmem<DH>::BACKWARD_Q - AttnmSmem<DH>::STATS));
  float acc[4][NB][4], part[4][NB][4];
  attnm_zero(acc);
  i64 q_start = 0;
  int q_len = 0;
  for (int b = b_first; b < b_end; b++) {
    const AttnExample e = attn_example(r, b);
    q_start = e.q_start, q_len = e.q_len;
    if (i0 >= e.q_len) continue;
    attnm_zero(part);
    attnm_query_tile<DH, ACT, MX, ATTNM_DQ>(part, attn_smem, qh, kh, vh, doh, kr, r, sc, inv_norm,
                                            e, i0, h);
    const int lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int row = m * 16 + g + (c >= 2 ? 8 : 0);
        const float mul = MX ? 1.0f : st.scale[row] * sc.k;
#pragma unroll
        for (int n = 0; n < NB; n++) acc[m][n][c] += part[m][n][c] * mul;
      }
  }
  const int col0 = h * DH;
  if (partial) {  // every seed row of the chunk, zeros where its examples added nothing
    attnm_each(acc, r.q_fixed - i0 < 64 ? r.q_fixed - i0 : 64, [&](int row, int col, float x) {
      partial[((i64)chunk * r.q_fixed + i0 + row) * r.d + col0 + col] = x * r.scale;
    });
    return;
  }
  attnm_each(acc, q_len - i0 < 64 ? q_len - i0 : 64, [&](int row, int col, float x) {
    attn_store1(dq + (q_start + i0 + row) * r.d + col0 + col, x * r.scale);
  });
}

// Queries of a dK/dV tile padded to 16, 32 or 64: the reduction's extent in the tile, and the
// lanes of one mx block in the elementwise pass.
__device__ __forceinline__ int attnm_query_pad(int nq) { return nq <= 16 ? 16 : nq <= 32 ? 32 : 64; }

// dK = scale · quant(dS)ᵀ · Q and dV = quant(P)ᵀ · dO for one 64-key tile; the columns of P
// and dS run down the query rows (mxfp8 blocks of 32 from the first).
template <int DH, int ACT, int MX, typename GT>
__device__ __forceinline__ void attnq_backward_kv_tc(GT *__restrict__ dk, GT *__restrict__ dv,
                                                     const float *__restrict__ qh,
                                                     const float *__restrict__ kh,
                                                     const float *__restrict__ vh,
                                                     const float *__restrict__ doh,
                                                     const float *__restrict__ qr,
                                                     const float *__restrict__ dor,
                                                     const AttnRows &r, double inv_norm,
                                                     const float4 *__restrict__ stats,
                                                     const int *__restrict__ tiles,
                                                     const AttnqScales &sc) {
  typedef AttnmSmem<DH> L;
  enum { NB = DH / 16, SOFTMAX = ACT == ATTN_ACT_SOFTMAX };
  extern __shared__ __align__(16) unsigned char attn_smem[];
  attnm_need_smem(L::BACKWARD_KV);
  unsigned char *smem = attn_smem;
  bf16_t *tk = (bf16_t *)smem, *tv = (bf16_t *)(smem + L::ROWS), *tq = (bf16_t *)(smem + 2 * L::ROWS),
         *tdo = (bf16_t *)(smem + 3 * L::ROWS);
  bf16_t *tqr = (bf16_t *)(smem + 4 * L::ROWS), *tdor = (bf16_t *)(smem + 4 * L::ROWS + L::TRANS);
  float *ts = (float *)(smem + 4 * L::ROWS + 2 * L::TRANS), *tdp = ts + 64 * ATTNM_LDS;
  bf16_t *tp = (bf16_t *)(smem + 4 * L::ROWS + 2 * L::TRANS + 2 * L::SCORES),
         *tds = tp + 64 * ATTNM_LDT;
  float *sm = (float *)(smem + L::BACKWARD_KV - L::STATS);
  float *s_m = sm, *s_inv = sm + 64, *s_dot = sm + 128;  // the staged query rows' statistics
  float *p_scale = sm + 192, *ds_scale = sm + 256;       // fp8: per key
  float *p_part = sm + 320, *ds_part = sm + 448;         // two warps' partials, 64 each

  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], j0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, heads = r.d / DH, tid = threadIdx.x, warp = tid >> 5;
  const int nk = e.kv_len - j0 < 64 ? e.kv_len - j0 : 64, kblocks = (nk + 15) / 16;
  int qlo, qhi;
  attn_query_range(r, j0, j0 + nk, e.q_len, &qlo, &qhi);
  const float s_mul = r.scale * sc.q * sc.k, dp_mul = sc.dout * sc.v;
  attnm_stage<DH>(tk, kh, e.kv_start, j0, e.kv_len, r.d, col0, 1.0f / sc.k);
  attnm_stage<DH>(tv, vh, e.kv_start, j0, e.kv_len, r.d, col0, 1.0f / sc.v);
  float acc_dk[4][NB][4], acc_dv[4][NB][4];
  attnm_zero(acc_dk);
  attnm_zero(acc_dv);
  if (tid < 64) p_scale[tid] = ds_scale[tid] = 1.0f, p_part[tid] = p_part[64 + tid] = 0.0f,
                ds_part[tid] = ds_part[64 + tid] = 0.0f;

  auto sweep = [&](bool quant) {
    for (int i0 = qlo; i0 < qhi; i0 += 64) {
      const int nq = qhi - i0 < 64 ? qhi - i0 : 64, pad = attnm_query_pad(nq), qrows = 16 * ((nq + 15) / 16);
      // Lanes per key in the elementwise pass: the queries rounded up to a power of two, in
      // groups of at most 32 (one mx block).
      int lanes = 1;
      while (lanes < nq) lanes *= 2;
      const int group = lanes < 32 ? lanes : 32;
      __syncthreads();
      attnm_stage<DH>(tq, qh, e.q_start, i0, e.q_len, r.d, col0, 1.0f / sc.q, qrows);
      attnm_stage<DH>(tdo, doh, e.o_start, i0, e.q_len, r.d, col0, 1.0f / sc.dout, qrows);
      if (quant) {
        attnm_stage_t<DH>(tqr, qr, e.q_start, i0, e.q_len, r.d, col0, 1.0f / sc.q, pad);
        attnm_stage_t<DH>(tdor, dor, e.o_start, i0, e.q_len, r.d, col0, 1.0f / sc.dout, pad);
        for (int x = tid; lanes < pad && x < 64 * pad; x += ATTNM_THREADS) {  // the padding's zeros
          const int kk = x / pad, qq = x % pad;
          if (qq >= lanes) tp[kk * ATTNM_LDT + qq] = tds[kk * ATTNM_LDT + qq] = float_to_bf16(0.0f);
        }
      }
      if (SOFTMAX && tid < 64) {
        const float4 s = i0 + tid < e.q_len ? stats[(e.o_start + i0 + tid) * heads + h]
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        s_m[tid] = s.x, s_inv[tid] = s.y, s_dot[tid] = s.z;
      }
      __syncthreads();
      attnm_scores<DH>(ts, qrows / 16, tq, tk, s_mul);
      attnm_scores<DH>(tdp, qrows / 16, tdo, tv, dp_mul);
      __syncthreads();
      for (int x = tid; x < (nk * lanes + 63) / 64 * 64; x += ATTNM_THREADS) {  // rows past nk: unused
        const int kk = x / lanes, qq = x % lanes, i = i0 + qq;
        const bool ok = qq < nq && kk < nk && attn_visible(r, i, j0 + kk);
        float p = 0.0f, ds = 0.0f;
        if (ok) {
          const AttnqRow rs = SOFTMAX ? AttnqRow{s_m[qq], s_inv[qq], s_dot[qq]} : AttnqRow{0.0f, 0.0f, 0.0f};
          const float s = ts[qq * ATTNM_LDS + kk];
          p = attnq_prob<ACT>(s, rs, inv_norm);
          ds = attnq_grad<ACT>(s, p, tdp[qq * ATTNM_LDS + kk], rs, inv_norm);
        }
        const float p_amax = attnm_group_max(attnq_finite_abs(p), group);
        const float ds_amax = attnm_group_max(attnq_finite_abs(ds), group);
        if (!quant) {
          if (qq % group == 0) {
            p_part[warp * 64 + kk] = fmaxf(p_part[warp * 64 + kk], p_amax);
            ds_part[warp * 64 + kk] = fmaxf(ds_part[warp * 64 + kk], ds_amax);
          }
          continue;
        }
        tp[kk * ATTNM_LDT + qq] = float_to_bf16(attnm_quantize<MX>(p, p_amax, p_scale[kk]));
        tds[kk * ATTNM_LDT + qq] = float_to_bf16(attnm_quantize<MX>(ds, ds_amax, ds_scale[kk]));
      }
      if (quant) {
        __syncthreads();
        if (dv) attnm_mma(acc_dv, kblocks, tp, ATTNM_LDT, tdor, ATTNM_LDT, warp * NB, pad / 16);
        if (dk) attnm_mma(acc_dk, kblocks, tds, ATTNM_LDT, tqr, ATTNM_LDT, warp * NB, pad / 16);
      }
    }
    __syncthreads();
  };
  if (!MX) {
    sweep(false);
    if (tid < 64) {
      p_scale[tid] = attnq_fp8_scale(fmaxf(p_part[tid], p_part[64 + tid]));
      ds_scale[tid] = attnq_fp8_scale(fmaxf(ds_part[tid], ds_part[64 + tid]));
    }
  }
  sweep(true);
  const i64 at = (e.kv_start + j0) * r.d + col0;
  if (dk)
    attnm_each(acc_dk, nk, [&](int row, int col, float x) {
      attn_store1(dk + at + (i64)row * r.d + col, x * r.scale * (MX ? 1.0f : ds_scale[row] * sc.q));
    });
  if (dv)
    attnm_each(acc_dv, nk, [&](int row, int col, float x) {
      attn_store1(dv + at + (i64)row * r.d + col, x * (MX ? 1.0f : p_scale[row] * sc.dout));
    });
}

// ---------------------------------------------------------------------------------------------
// The entry points the emitter calls: the tensor-core kernels when the head width allows (a
// multiple of 16), else the SIMT ones (attention_quantized.cuh). tests/codegen runs both on the
// CPU: the tensor-core ones through its mma emulation, the SIMT ones for every head width when
// it defines GEMC_EMU_SIMT.

template <int DH> struct AttnqTc {
#ifdef GEMC_EMU_SIMT
  enum { ON = 0 };
#else
  enum { ON = DH % 16 == 0 };
#endif
};

template <int DH, int ACT, int MX, typename OT>
__device__ __forceinline__ void attnq_forward_any(OT *out, const float *qh, const float *kh,
                                                  const float *vr, const AttnRows &r,
                                                  double inv_norm, const int *tiles,
                                                  const AttnqScales &sc) {
  if constexpr (AttnqTc<DH>::ON) return attnq_forward_tc<DH, ACT, MX>(out, qh, kh, vr, r, inv_norm, tiles, sc);
  attnq_forward<DH, ACT, MX>(out, qh, kh, vr, r, inv_norm, tiles);
}

template <int DH, int ACT>
__device__ __forceinline__ void attnq_backward_stats_any(float4 *stats, const float *qh,
                                                         const float *kh, const float *vh,
                                                         const float *doh, const AttnRows &r,
                                                         int q_tiles, const AttnqScales &sc) {
  if constexpr (AttnqTc<DH>::ON) return attnq_backward_stats_tc<DH, ACT>(stats, qh, kh, vh, doh, r, q_tiles, sc);
  attnq_backward_stats<DH, ACT>(stats, qh, kh, vh, doh, r, q_tiles);
}

template <int DH, int ACT, int MX, typename GT>
__device__ __forceinline__ void attnq_backward_q_any(GT *dq, i64 batch, const float *qh,
                                                     const float *kh, const float *vh,
                                                     const float *doh, const float *kr,
                                                     const AttnRows &r, double inv_norm,
                                                     const int *tiles, const AttnqScales &sc,
                                                     float *partial = 0, int chunks = 1) {
  if constexpr (AttnqTc<DH>::ON)
    return attnq_backward_q_tc<DH, ACT, MX>(dq, batch, qh, kh, vh, doh, kr, r, inv_norm, tiles,
                                            partial, chunks, sc);
  attnq_backward_q<DH, ACT, MX>(dq, batch, qh, kh, vh, doh, kr, r, inv_norm, tiles, partial, chunks);
}

template <int DH, int ACT, int MX, typename GT>
__device__ __forceinline__ void attnq_backward_kv_any(GT *dk, GT *dv, const float *qh,
                                                      const float *kh, const float *vh,
                                                      const float *doh, const float *qr,
                                                      const float *dor, const AttnRows &r,
                                                      double inv_norm, const float4 *stats,
                                                      const int *tiles, const AttnqScales &sc) {
  if constexpr (AttnqTc<DH>::ON)
    return attnq_backward_kv_tc<DH, ACT, MX>(dk, dv, qh, kh, vh, doh, qr, dor, r, inv_norm, stats,
                                             tiles, sc);
  attnq_backward_kv<DH, ACT, MX>(dk, dv, qh, kh, vh, doh, qr, dor, r, inv_norm, stats, tiles);
}

#endif
