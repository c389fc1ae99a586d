// attention_sm90_backward.cuh: the Hopper (sm_90a) backward GDPA kernels, on the machinery of
// attention_sm90.cuh (TMA, mbarrier pipelines, wgmma, a producer warpgroup and two consumer
// warpgroups, one persistent CTA per SM). No atomics: every gradient element has one writer.
//
// One template serves both kernels. A work item holds a resident pair of 128-row tiles (64
// rows per consumer warpgroup) and streams pairs of 64-row tiles from the other side:
//   KV (dK, dV): resident K and V of 128 keys; streamed Q and dO of the query tiles that can
//     see them. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q.
//   Q (dQ): resident Q and dO of 128 query rows; streamed K and V of the keys they see.
//     S = Q·Kᵀ and dP = dO·Vᵀ, then dQ += dS·K.
// The two products are wgmma with both operands in shared memory; the accumulations take Pᵀ,
// dSᵀ or dS from registers and the streamed tile transposed, as the forward takes V. dS is
// dP ⊙ act′(S) for a pointwise activation and P ⊙ (dP − D) for softmax, with P recomputed from
// the row statistics {lse2, D} of the forward's preparation pass (attention_backward.cuh's
// attn_grad_element, the same function).
//
// DQ (KV only, head dim 128; `@schedule(deterministic = false)`): the dK/dV kernel computes dQ
// too, so the backward runs 5 products instead of 7. Each warpgroup stores its dSᵀ (64 keys x
// 64 streamed queries, bf16, the 128-byte swizzle) into one of two shared tiles; after a named
// barrier over both warpgroups, warpgroup w takes dQ's columns [64w, 64w + 64) as dS·K over
// all 128 resident keys (a wgmma with both operands transposed in shared memory) and adds
// them, scaled, into the fp32 workspace `dq_acc` with red.global.add. The float atomics make
// dQ's bits depend on the order the work items finish in (docs/attention.md).
// defines: attn_backward_sm90
#ifndef GEMC_ATTENTION_SM90_BACKWARD_CUH
#define GEMC_ATTENTION_SM90_BACKWARD_CUH

enum { SM90_BWD_STREAM = 64, SM90_BWD_RESIDENT = 128 };

#define SM90_BACKWARD_SMEM(DH, STAGES) \
  (1024 + 2 * 2 * 128 * (DH) * 2 + 2 * (STAGES) * 64 * (DH) * 2 + 8 * (4 + 3 * (STAGES)))
// With DQ: two more 128 x 64 bf16 tiles of dSᵀ.
#define SM90_BACKWARD_DQ_SMEM(DH, STAGES) (SM90_BACKWARD_SMEM(DH, STAGES) + 2 * 128 * 64 * 2)

// d (64 x 64 fp32) (+)= A (64 x 16) * B (16 x 64), both in shared memory MN-major (transposed).
#ifdef GEMC_ON_CPU
template <bool F16>
__device__ __forceinline__ void sm90_mma_ss_tt_n64(float *d, unsigned long long a,
                                                   unsigned long long b, int accumulate) {
  emu_wgmma(d, 64, a, nullptr, true, b, true, accumulate != 0, F16);
}
__device__ __forceinline__ void sm90_red_add2(float *p, float a, float b) {
  emu_red_add(p, a);
  emu_red_add(p + 1, b);
}
#else
template <bool F16>
__device__ __forceinline__ void sm90_mma_ss_tt_n64(float *d, unsigned long long a,
                                                   unsigned long long b, int accumulate) {
  if (F16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" SM90_REGS32
                 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : SM90_ACC32(d)
                 : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SM90_REGS32
                 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : SM90_ACC32(d)
                 : "l"(a), "l"(b), "r"(accumulate));
}

// *p += (a, b), one vector reduction in global memory.
__device__ __forceinline__ void sm90_red_add2(float *p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
#endif

// fp16 has 5 exponent bits. Without loss scaling, the dS of small gradients falls into its
// subnormals when it is rounded for the tensor cores, and keeps only a few of its bits (the
// executor keeps dS in fp32; bf16 has fp32's exponent range and loses only 2^-9 relative). So at
// fp16 each resident row's dS is scaled by 2^e[row] before rounding, e chosen so that the row's
// largest |dS| so far lies in [2^14, 2^15): well inside fp16's range, with 28 binades of normal
// values below it. A later tile whose values need a smaller e scales the row's accumulator
// (dQ or dK) down to match; the store divides by 2^e. Powers of two, so the scaling is exact:
// what differs from bf16's path is only fp16's 11-bit significand. Rows are this thread's
// accumulator rows (value i: row half (i >> 1) & 1), whose 16 streamed columns a thread holds
// and the quad (t = 0..3) shares.
enum { SM90_DS_UNSET = 1 << 20, SM90_DS_MAX_EXP = 100 };
template <int O_REGS>
__device__ __forceinline__ void sm90_ds_scale_rows(float *ds, float *acc, int *e) {
#pragma unroll
  for (int half = 0; half < 2; half++) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < SM90_BWD_STREAM / 2; i++)
      if (((i >> 1) & 1) == half) m = fmaxf(m, fabsf(ds[i]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    int want = SM90_DS_UNSET;
    if (m > 0.0f && m < ATTN_INF) {  // floor(log2 m), -127 for a subnormal m
      want = 14 - ((int)((__float_as_uint(m) >> 23) & 0xff) - 127);
      want = want > SM90_DS_MAX_EXP ? SM90_DS_MAX_EXP : want;
    }
    if (want < e[half]) {
      if (e[half] != SM90_DS_UNSET) {
        const float down = ldexpf(1.0f, want - e[half]);
#pragma unroll
        for (int i = 0; i < O_REGS; i++)
          if (((i >> 1) & 1) == half) acc[i] *= down;
      }
      e[half] = want;
    }
    if (e[half] != SM90_DS_UNSET) {
      const float up = ldexpf(1.0f, e[half]);
#pragma unroll
      for (int i = 0; i < SM90_BWD_STREAM / 2; i++)
        if (((i >> 1) & 1) == half) ds[i] *= up;
    }
  }
}

// The factor that undoes sm90_ds_scale_rows at the store.
__device__ __forceinline__ float sm90_ds_unscale(int e) {
  return e == SM90_DS_UNSET ? 1.0f : ldexpf(1.0f, -e);
}

// One backward work item: the example, the resident tile's first row and head, its rows, and
// the streamed rows [lo, lo + n * 64).
struct Sm90BwdItem {
  AttnExample e;
  int r0, h, nres, lo, nstream;
};

template <bool KV>
__device__ __forceinline__ bool sm90_bwd_item(const AttnRows &r, const int *__restrict__ tiles,
                                              int index, Sm90BwdItem *it) {
  const int *tile = tiles + 3 * index;
  const int b = tile[0];
  if (b < 0) return false;
  it->r0 = tile[1];
  it->h = tile[2];
  it->e = attn_example(r, b);
  const int len = KV ? it->e.kv_len : it->e.q_len;
  it->nres = len - it->r0 < SM90_BWD_RESIDENT ? len - it->r0 : SM90_BWD_RESIDENT;
  int lo, hi;
  if (KV) {
    attn_query_range(r, it->r0, it->r0 + it->nres, it->e.q_len, &lo, &hi);  // lo: 64-aligned
  } else {
    const int i1 = it->r0 + it->nres;
    lo = 0, hi = it->e.kv_len;
    if (r.causal && i1 < hi) hi = i1;
    if (r.window > 0) {
      lo = it->r0 - r.window + 1;
      if (lo < 0) lo = 0;
      if (!r.causal && i1 + r.window - 1 < hi) hi = i1 + r.window - 1;
    }
    lo -= lo % SM90_BWD_STREAM;
    if (hi < lo) hi = lo;
  }
  it->lo = lo;
  it->nstream = (hi - lo + SM90_BWD_STREAM - 1) / SM90_BWD_STREAM;
  return true;
}

// KV: (res1, res2, str1, str2) = (K, V, Q, dO), outputs dk and dv. Q: (Q, dO, K, V), output
// dq (in `g1`). `count` entries in `tiles`, dealt for gridDim.x CTAs. LN_STATS: the
// statistics come from the SIMT preparation pass (attention_simt.cuh), whose lse is in natural
// log units; they are read as log2 units.
// g1_map, g2_map: tensor maps of g1 and g2 (64-row boxes) where GT is the 16-bit type of the
// inputs, else nullptr; with them, an item whose 128 resident rows all lie in its example writes
// its gradients into its consumed resident tiles and stores them by TMA, one
// `cp.async.bulk.tensor` per warpgroup, tensor and half, instead of 64 stores a thread.
template <int DH, int ACT, int STAGES, bool F16, bool KV, bool LN_STATS, bool DQ = false,
          typename GT>
__device__ __forceinline__ void attn_backward_sm90(GT *__restrict__ g1, GT *__restrict__ g2,
                                                   const TmaMap *g1_map, const TmaMap *g2_map,
                                                   const TmaMap &res1_map, const TmaMap &res2_map,
                                                   const TmaMap &str1_map, const TmaMap &str2_map,
                                                   const AttnRows &r,
                                                   const int *__restrict__ tiles, int count,
                                                   const float *__restrict__ stats,
                                                   float *__restrict__ dq_acc = 0) {
  static_assert(!DQ || (KV && DH == 128 && !F16),
                "dQ in the dK/dV kernel takes head dim 128 and bf16 (fp16's dS is scaled per key "
                "row, which dQ's sum over the keys cannot undo)");
  enum {
    HALVES = DH / 64,
    RES_HALF = SM90_BWD_RESIDENT * 128,  // bytes of one 64-column half of a resident tile
    STR_HALF = SM90_BWD_STREAM * 128,
    RES_BYTES = RES_HALF * HALVES,
    STR_BYTES = STR_HALF * HALVES,
    S_REGS = SM90_BWD_STREAM / 2,        // 64 x 64 scores over 128 threads
    O_REGS = DH / 2,
    SOFTMAX = ACT == ATTN_ACT_SOFTMAX,
    DS_BYTES = 128 * 128,                // one 128 x 64 bf16 tile of dSᵀ
  };
  extern __shared__ __align__(1024) unsigned char sm90_smem[];
  const unsigned base = (attn_smem_addr(sm90_smem) + 1023u) & ~1023u;
  const unsigned res_tiles = base;                          // [2 buffers][2 tiles]
  const unsigned str_tiles = res_tiles + 4 * RES_BYTES;     // [STAGES][2 tiles]
  const unsigned ds_tiles = str_tiles + 2 * STAGES * STR_BYTES;  // DQ: [2] dSᵀ
  const unsigned res_full = ds_tiles + (DQ ? 2 * DS_BYTES : 0);
  const unsigned res_empty = res_full + 16, str_full = res_empty + 16;
  const unsigned str_empty = str_full + 16 * STAGES;  // str_full: [STAGES][2] (str1, str2)

  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; i++) {
      sm90_bar_init(res_full + 8 * i, 1);
      sm90_bar_init(res_empty + 8 * i, 128 * SM90_CONSUMERS);
    }
    for (int s = 0; s < STAGES; s++) {
      sm90_bar_init(str_full + 16 * s, 1);
      sm90_bar_init(str_full + 16 * s + 8, 1);
      sm90_bar_init(str_empty + 8 * s, 128 * SM90_CONSUMERS);
    }
    sm90_fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // the producer warpgroup
    sm90_setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    int n = 0, c = 0;
    for (int index = blockIdx.x; index < count; index += gridDim.x) {
      Sm90BwdItem it;
      if (!sm90_bwd_item<KV>(r, tiles, index, &it)) continue;
      const int rb = n & 1;
      const int res1_row = (int)((KV ? it.e.kv_start : it.e.q_start) + it.r0);
      const int res2_row = (int)((KV ? it.e.kv_start : it.e.o_start) + it.r0);
      sm90_bar_wait(res_empty + 8 * rb, ((n >> 1) & 1) ^ 1);
      sm90_bar_expect(res_full + 8 * rb, 2 * RES_BYTES);
#pragma unroll
      for (int half = 0; half < HALVES; half++) {
        const int col = it.h * DH + 64 * half;
        sm90_tma_load(res_tiles + (2 * rb) * RES_BYTES + half * RES_HALF, res1_map, col, res1_row,
                      res_full + 8 * rb);
        sm90_tma_load(res_tiles + (2 * rb + 1) * RES_BYTES + half * RES_HALF, res2_map, col,
                      res2_row, res_full + 8 * rb);
      }
      n++;
      for (int j = 0; j < it.nstream; j++, c++) {
        const int s = c % STAGES;
        sm90_bar_wait(str_empty + 8 * s, ((c / STAGES) & 1) ^ 1);
        const int row = it.lo + j * SM90_BWD_STREAM;
        const int str1_row = (int)((KV ? it.e.q_start : it.e.kv_start) + row);
        const int str2_row = (int)((KV ? it.e.o_start : it.e.kv_start) + row);
        sm90_bar_expect(str_full + 16 * s, STR_BYTES);
#pragma unroll
        for (int half = 0; half < HALVES; half++)
          sm90_tma_load(str_tiles + (2 * s) * STR_BYTES + half * STR_HALF, str1_map,
                        it.h * DH + 64 * half, str1_row, str_full + 16 * s);
        sm90_bar_expect(str_full + 16 * s + 8, STR_BYTES);
#pragma unroll
        for (int half = 0; half < HALVES; half++)
          sm90_tma_load(str_tiles + (2 * s + 1) * STR_BYTES + half * STR_HALF, str2_map,
                        it.h * DH + 64 * half, str2_row, str_full + 16 * s + 8);
      }
    }
    return;
  }

  sm90_setmaxnreg_inc<240>();
  const int cw = threadIdx.x / 128 - 1;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int heads = r.d / DH;
  int n = 0, c = 0;
  for (int index = blockIdx.x; index < count; index += gridDim.x) {
    Sm90BwdItem it;
    if (!sm90_bwd_item<KV>(r, tiles, index, &it)) continue;
    const int rb = n & 1;
    sm90_bar_wait(res_full + 8 * rb, (n >> 1) & 1);
    n++;
    const unsigned res1 = res_tiles + (2 * rb) * RES_BYTES + cw * 64 * 128;
    const unsigned res2 = res_tiles + (2 * rb + 1) * RES_BYTES + cw * 64 * 128;
    const int row0 = it.r0 + cw * 64 + warp * 16 + g;  // this thread's resident rows: +0, +8
    float acc1[O_REGS], acc2[KV ? O_REGS : 1];        // KV: dK, dV; Q: dQ
#pragma unroll
    for (int i = 0; i < O_REGS; i++) acc1[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < (KV ? O_REGS : 1); i++) acc2[i] = 0.0f;
    int ds_exp[2] = {SM90_DS_UNSET, SM90_DS_UNSET};  // F16: sm90_ds_scale_rows
    float2 stat_row[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
    if (!KV && SOFTMAX)
      for (int half = 0; half < 2; half++)
        if (row0 + 8 * half < it.e.q_len)
          stat_row[half] =
              *(const float2 *)(stats + ((it.e.o_start + row0 + 8 * half) * heads + it.h) * 2);
    if (LN_STATS) stat_row[0].x *= ATTN_LOG2E, stat_row[1].x *= ATTN_LOG2E;

    for (int j = 0; j < it.nstream; j++, c++) {
      const int s = c % STAGES;
      const unsigned phase = (c / STAGES) & 1;
      const int s0 = it.lo + j * SM90_BWD_STREAM;  // first streamed row
      const unsigned str1 = str_tiles + (2 * s) * STR_BYTES, str2 = str1 + STR_BYTES;

      // x = res1·str1ᵀ (S or Sᵀ) and y = res2·str2ᵀ (dP or dPᵀ)
      float x[S_REGS], y[S_REGS];
#pragma unroll
      for (int i = 0; i < S_REGS; i++) x[i] = y[i] = 0.0f;
      sm90_bar_wait(str_full + 16 * s, phase);
      sm90_pin<S_REGS>(x);
      sm90_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DH / 16; kk++) {
        const unsigned step = (kk & 3) * 32;  // 16 columns of a 128-byte row
        sm90_mma_ss<64, F16>(x, sm90_desc(res1 + (kk / 4) * RES_HALF + step, 16, 1024),
                             sm90_desc(str1 + (kk / 4) * STR_HALF + step, 16, 1024), kk > 0);
      }
      sm90_wgmma_commit();
      sm90_bar_wait(str_full + 16 * s + 8, phase);
      sm90_pin<S_REGS>(y);
      sm90_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DH / 16; kk++) {
        const unsigned step = (kk & 3) * 32;
        sm90_mma_ss<64, F16>(y, sm90_desc(res2 + (kk / 4) * RES_HALF + step, 16, 1024),
                             sm90_desc(str2 + (kk / 4) * STR_HALF + step, 16, 1024), kk > 0);
      }
      sm90_wgmma_commit();
      // A pointwise activation needs only S for P and act′(S): those run while dP's product is
      // still on the tensor cores (S's group is waited for alone), then dS = dP ⊙ act′(S).
      // Softmax needs dP with P (dS = P ⊙ (dP − D)) and waits for both.
      if (SOFTMAX) {
        sm90_wgmma_wait<0>();
        sm90_pin<S_REGS>(y);
      } else {
        sm90_wgmma_wait<1>();
      }
      sm90_pin<S_REGS>(x);

      // P (or Pᵀ) into x, dS (or dSᵀ) into y. Accumulator value i: resident row
      // row0 + 8 ((i >> 1) & 1), streamed row s0 + 8 (i >> 2) + 2t + (i & 1). Only tiles at a
      // sequence's end or under a mask test each pair.
      const int q_end = KV ? s0 + SM90_BWD_STREAM : it.r0 + SM90_BWD_RESIDENT;
      const int k_end = KV ? it.r0 + SM90_BWD_RESIDENT : s0 + SM90_BWD_STREAM;
      const bool edge = q_end > it.e.q_len || k_end > it.e.kv_len || r.causal || r.window > 0;
      unsigned pf[4][4], dsf[4][4];  // A fragments of 16 streamed rows each
      if (SOFTMAX) {
#pragma unroll
        for (int i = 0; i < S_REGS; i++) {
          const int res = row0 + 8 * ((i >> 1) & 1), str = s0 + 8 * (i >> 2) + 2 * t + (i & 1);
          const int qi = KV ? str : res, kj = KV ? res : str;
          const bool valid =
              !edge || (qi < it.e.q_len && kj < it.e.kv_len && attn_visible(r, qi, kj));
          float2 stat = stat_row[(i >> 1) & 1];
          if (KV && valid) {
            stat = *(const float2 *)(stats + ((it.e.o_start + qi) * heads + it.h) * 2);
            if (LN_STATS) stat.x *= ATTN_LOG2E;
          }
          float p, ds;
          attn_grad_element<ACT>(r, x[i], y[i], valid, stat, &p, &ds);
          x[i] = p;
          y[i] = ds;
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
          for (int q = 0; q < 4; q++)
            if (KV) pf[kk][q] = sm90_pack<F16>(x[8 * kk + 2 * q], x[8 * kk + 2 * q + 1]);
      } else {
        // P straight into its fragments, act′(S) into x, under dP's product
#pragma unroll
        for (int i = 0; i < S_REGS; i += 2) {
          float p[2];
#pragma unroll
          for (int u = 0; u < 2; u++) {
            const int res = row0 + 8 * (((i + u) >> 1) & 1);
            const int str = s0 + 8 * ((i + u) >> 2) + 2 * t + ((i + u) & 1);
            const int qi = KV ? str : res, kj = KV ? res : str;
            const bool valid =
                !edge || (qi < it.e.q_len && kj < it.e.kv_len && attn_visible(r, qi, kj));
            float pv, gv;
            if (ACT == ATTN_ACT_GELU) {
              const AttnGeluK gk = attn_gelu_k(r.scale, r.inv_norm);
              float th;
              pv = attn_gelu_p_tc(gk, x[i + u], &th);
              gv = attn_gelu_grad_tc(gk, x[i + u], th);
            } else {
              const float xs = x[i + u] * r.scale;
              pv = attn_act_tc<ACT>(xs) * r.inv_norm;
              gv = attn_act_grad_tc<ACT>(xs) * r.inv_norm;
            }
            p[u] = valid ? pv : 0.0f;
            x[i + u] = valid ? gv : 0.0f;
          }
          if (KV) pf[i / 8][(i % 8) / 2] = sm90_pack<F16>(p[0], p[1]);
        }
        sm90_wgmma_wait<0>();
        sm90_pin<S_REGS>(y);
#pragma unroll
        for (int i = 0; i < S_REGS; i++) y[i] *= x[i];
      }
      if (F16) sm90_ds_scale_rows<O_REGS>(y, acc1, ds_exp);
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int q = 0; q < 4; q++)
          dsf[kk][q] = sm90_pack<F16>(y[8 * kk + 2 * q], y[8 * kk + 2 * q + 1]);

      // DQ: this warpgroup's dSᵀ rows (keys 64 cw + 16 warp + g, + 8) into dS tile c & 1, in
      // the 128-byte swizzle (16-byte chunk k of row R at chunk k ^ (R & 7), and R & 7 = g).
      // Tile c & 1 was last read by both warpgroups' dQ products of stream tile c - 2, which
      // each finished before the barrier of tile c - 1.
      const unsigned ds_tile = ds_tiles + (c & 1) * DS_BYTES;
      if (DQ) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
          for (int q = 0; q < 4; q++) {
            const unsigned row = 64 * cw + 16 * warp + g + 8 * (q & 1);
            const unsigned at = ds_tile + row * 128 + (((2 * kk + (q >> 1)) ^ g) << 4) + 4 * t;
            sm90_st_shared(at, dsf[kk][q]);
          }
        sm90_fence_proxy_async();
        sm90_named_barrier<256>(1);  // both consumer warpgroups
      }
      float dq[DQ ? 32 : 1];

      // KV: dK += dSᵀ·Q (str1), dV += Pᵀ·dO (str2). Q: dQ += dS·K (str1). DQ: first dQ's 64
      // columns of this warpgroup = dS·K, K the resident tile's half cw.
      sm90_pin<O_REGS>(acc1);
      if (KV) sm90_pin<O_REGS>(acc2);
      sm90_wgmma_fence();
      if (DQ) {
        const unsigned k_half = res_tiles + (2 * rb) * RES_BYTES + cw * RES_HALF;
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
          sm90_mma_ss_tt_n64<F16>(dq, sm90_desc(ds_tile + kk * 16 * 128, DS_BYTES, 1024),
                                  sm90_desc(k_half + kk * 16 * 128, RES_HALF, 1024), kk > 0);
        sm90_wgmma_commit();
      }
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        sm90_mma_rs<DH, F16>(acc1, dsf[kk], sm90_desc(str1 + kk * 16 * 128, STR_HALF, 1024));
      if (KV) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
          sm90_mma_rs<DH, F16>(acc2, pf[kk], sm90_desc(str2 + kk * 16 * 128, STR_HALF, 1024));
      }
      sm90_wgmma_commit();
      if (DQ) {  // dQ's group is done while dK and dV's run: add its rows that exist
        sm90_wgmma_wait<1>();
        sm90_pin<32>(dq);
#pragma unroll
        for (int half = 0; half < 2; half++) {
          const int qi = s0 + 16 * warp + g + 8 * half;
          if (qi >= it.e.q_len) continue;
          float *row = dq_acc + (it.e.q_start + qi) * r.d + it.h * DH + 64 * cw + 2 * t;
#pragma unroll
          for (int nb = 0; nb < 8; nb++)
            sm90_red_add2(row + 8 * nb, dq[4 * nb + 2 * half] * r.scale,
                          dq[4 * nb + 2 * half + 1] * r.scale);
        }
      }
      sm90_wgmma_wait<0>();
      sm90_pin<O_REGS>(acc1);
      if (KV) sm90_pin<O_REGS>(acc2);
      sm90_bar_arrive(str_empty + 8 * s);
    }
    // Store this thread's resident rows that exist: dK and dQ carry the scale.
    const int len = KV ? it.e.kv_len : it.e.q_len;
    const i64 start = KV ? it.e.kv_start : it.e.o_start;
    if (sizeof(GT) == 2 && (g1_map || g2_map) && (!g1 || g1_map) && (!KV || !g2 || g2_map) &&
        it.nres == SM90_BWD_RESIDENT) {
      // Into this warpgroup's 64 rows of the resident tiles (dK or dQ over K or Q, dV over V),
      // in the 128-byte swizzle the maps use: 16-byte chunk c of row rl at chunk c ^ (rl % 8).
      // With DQ both warpgroups' dQ products read all 128 keys of K, so neither overwrites its
      // rows before both are done.
      if (DQ) sm90_named_barrier<256>(1);
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const int rl = warp * 16 + g + 8 * half;
        const float scale1 = F16 ? r.scale * sm90_ds_unscale(ds_exp[half]) : r.scale;
#pragma unroll
        for (int nb = 0; nb < DH / 8; nb++) {
          const unsigned at = (nb / 8) * RES_HALF + rl * 128 + (((nb % 8) ^ (rl % 8)) * 16) + 4 * t;
          if (g1_map)
            sm90_st_shared(res1 + at, sm90_pack<F16>(acc1[4 * nb + 2 * half] * scale1,
                                                     acc1[4 * nb + 2 * half + 1] * scale1));
          if (KV && g2_map)
            sm90_st_shared(res2 + at, sm90_pack<F16>(acc2[4 * nb + 2 * half],
                                                     acc2[4 * nb + 2 * half + 1]));
        }
      }
      sm90_fence_proxy_async();
      sm90_named_barrier<128>(2 + cw);  // this warpgroup's rows
      if ((threadIdx.x & 127) == 0) {
        const int row = (int)(start + it.r0 + cw * 64);
#pragma unroll
        for (int half = 0; half < HALVES; half++) {
          if (g1_map) sm90_tma_store(*g1_map, it.h * DH + 64 * half, row, res1 + half * RES_HALF);
          if (KV && g2_map)
            sm90_tma_store(*g2_map, it.h * DH + 64 * half, row, res2 + half * RES_HALF);
        }
        sm90_tma_store_wait_read();  // the resident tiles are the producer's again after this
      }
      sm90_bar_arrive(res_empty + 8 * rb);
      continue;
    }
    sm90_bar_arrive(res_empty + 8 * rb);
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int i = row0 + 8 * half;
      if (i >= len) continue;
      const i64 at = (start + i) * r.d + it.h * DH + 2 * t;
      const float scale1 = F16 ? r.scale * sm90_ds_unscale(ds_exp[half]) : r.scale;
#pragma unroll
      for (int nb = 0; nb < DH / 8; nb++) {
        if (g1)
          sm90_store2(g1 + at + 8 * nb, acc1[4 * nb + 2 * half] * scale1,
                      acc1[4 * nb + 2 * half + 1] * scale1);
        if (KV && g2)
          sm90_store2(g2 + at + 8 * nb, acc2[4 * nb + 2 * half], acc2[4 * nb + 2 * half + 1]);
      }
    }
  }
}

#endif
