// attention_tiny_kv.cuh: mxfp8 GDPA over a tiny key set (at most 32 keys per example, no mask),
// such as gem_small's cross attention from the history to {ad, tags, counters}. The work is a
// stream over the query rows; the few keys sit in shared memory. It computes what
// attention_quantized.cuh computes (the CPU executor's numerics, docs/executor.md), with the
// operands quantized in registers as they are read instead of through fp32 copies:
//   - a warp owns one query row at a time, lane l its F = D/32 features [l·F, l·F + F); a
//     head's features are G = DH/F neighbouring lanes and an mxfp8 block of 32 features
//     (min(32, DH)) BL neighbouring lanes, so the block amax and the head's dot products are
//     butterfly reductions over those lanes (every lane ends with the same bits);
//   - the keys of one example are at most one 32-row block, so quantizing V or K down its
//     columns, or a row of P or dS along the keys, is one block;
//   - the backward reduces dK and dV over the query rows: a warp owns one 32-row block (the
//     block of the executor's column quantization of P, dS, Q and dO), the eight warps of a CTA
//     one 256-row chunk, summed in warp order; attnt_backward_sum adds the chunks of each
//     example in order. No atomics: reruns are bit-identical.
// The activations run in double, as numerics.c evaluates them (attnq_prob, attnq_grad).
// Needs attention_quantized.cuh.
// defines: attnt_forward, attnt_backward, attnt_backward_sum
#ifndef GEMC_ATTENTION_TINY_KV_CUH
#define GEMC_ATTENTION_TINY_KV_CUH

enum { ATTNT_FWD_ROWS = 128, ATTNT_BWD_ROWS = 256, ATTNT_WARPS = 8, ATTNT_MAX_KEYS = 32 };

// The lane layout of a row of D = heads · DH features.
template <int D, int DH> struct AttntLanes {
  enum {
    F = D / 32,                      // features per lane
    G = DH / F,                      // lanes per head
    BL = (DH < 32 ? DH : 32) / F,    // lanes per mxfp8 block along a head
  };
  static_assert(D % 32 == 0 && 32 % F == 0 && DH % F == 0,
                "attention_tiny_kv: the blocks of 32 features must be whole lanes");
};

// Lanes [g·W, g·W + W) of the warp, W a power of two: the max and the sum over them.
template <int W> __device__ __forceinline__ float attnt_group_max(float x) {
  for (int o = 1; o < W; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <int W> __device__ __forceinline__ float attnt_group_sum(float x) {
  for (int o = 1; o < W; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The F features of this lane from row pointer p (element type T), as floats.
template <int F, typename T> __device__ __forceinline__ void attnt_load(float *x, const T *p) {
#ifndef GEMC_ON_CPU
  if constexpr ((F * sizeof(T)) % 16 == 0) {
    union {
      uint4 v[F * sizeof(T) / 16];
      T e[F];
    } u;
    for (int k = 0; k < (int)(F * sizeof(T) / 16); k++) u.v[k] = ((const uint4 *)p)[k];
    for (int f = 0; f < F; f++) x[f] = attn_to_float(u.e[f]);
    return;
  }
#endif
  for (int f = 0; f < F; f++) x[f] = attn_to_float(p[f]);
}

template <int F, typename T> __device__ __forceinline__ void attnt_store(T *p, const float *x) {
  for (int f = 0; f < F; f++) attn_store1(p + f, x[f]);
}
template <int F> __device__ __forceinline__ void attnt_store(bf16_t *p, const float *x) {
#ifndef GEMC_ON_CPU
  if constexpr (F % 8 == 0) {  // 16 bytes a store
    for (int k = 0; k < F / 8; k++) {
      uint4 u;
      u.x = attn_pack_bf16(x[8 * k], x[8 * k + 1]);
      u.y = attn_pack_bf16(x[8 * k + 2], x[8 * k + 3]);
      u.z = attn_pack_bf16(x[8 * k + 4], x[8 * k + 5]);
      u.w = attn_pack_bf16(x[8 * k + 6], x[8 * k + 7]);
      ((uint4 *)p)[k] = u;
    }
    return;
  }
#endif
  for (int f = 0; f < F; f++) attn_store1(p + f, x[f]);
}

// mxfp8 along a head: this lane's F values are part of a block of BL lanes (attnq_mx_block).
template <int F, int BL> __device__ __forceinline__ void attnt_mx_lanes(float *x) {
  float amax = 0.0f;
  for (int f = 0; f < F; f++) amax = fmaxf(amax, attnq_finite_abs(x[f]));
  amax = attnt_group_max<BL>(amax);
  int e = mx_block_exponent(amax);
  float inv = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);
  for (int f = 0; f < F; f++) x[f] = e4m3_round(x[f] * inv) * scale;
}

// One example's keys in shared memory, quantized as the executor does: `heads` copies along
// each head's features (blocks of 32), `cols` copies down each column (one block of the
// example's kv rows). Rows past the example's keys are 0. Called by every thread of the CTA.
template <int D, int DH, int KV, typename KT>
__device__ __forceinline__ void attnt_stage_heads(float *dst, const KT *__restrict__ x,
                                                  const AttnExample &e, int d) {
  enum { BW = DH < 32 ? DH : 32, BLOCKS = D / BW };
  for (int t = threadIdx.x; t < KV * BLOCKS; t += blockDim.x) {
    int j = t / BLOCKS, c0 = (t % BLOCKS) * BW;
    float v[BW];
    for (int f = 0; f < BW; f++) v[f] = j < e.kv_len ? attn_to_float(x[(e.kv_start + j) * d + c0 + f]) : 0.0f;
    attnq_mx_block(v, BW, 1);
    for (int f = 0; f < BW; f++) dst[j * D + c0 + f] = v[f];
  }
}

template <int D, int KV, typename KT>
__device__ __forceinline__ void attnt_stage_cols(float *dst, const KT *__restrict__ x,
                                                 const AttnExample &e, int d) {
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float v[KV];
    for (int j = 0; j < KV; j++) v[j] = j < e.kv_len ? attn_to_float(x[(e.kv_start + j) * d + c]) : 0.0f;
    attnq_mx_block(v, KV, 1);  // the zeros past kv_len change no amax
    for (int j = 0; j < KV; j++) dst[j * D + c] = v[j];
  }
}

// The scores of this lane's head against the example's keys: s[j] = scale · qh·kh_j.
template <int D, int DH, int KV>
__device__ __forceinline__ void attnt_scores(float *s, const float *qh, const float *kh, int f0,
                                             int kv_len, float scale) {
  enum { F = AttntLanes<D, DH>::F, G = AttntLanes<D, DH>::G };
  for (int j = 0; j < KV; j++) {
    float part = 0.0f;
    for (int f = 0; f < F; f++) part += qh[f] * kh[j * D + f0 + f];
    float sum = attnt_group_sum<G>(part) * scale;  // every lane takes part
    s[j] = j < kv_len ? sum : 0.0f;
  }
}

// P of a row (0 past kv_len), as attnq_prob forms it: softmax in the executor's order (the max,
// then exp(s - max) key by key into the sum, then one reciprocal), else act(s) · inv_norm in
// double. Returns the softmax statistics {max, 1/sum, 0} (unused otherwise).
template <int KV, int ACT>
__device__ __forceinline__ AttnqRow attnt_probs(float *p, const float *s, int kv_len,
                                                double inv_norm) {
  AttnqRow st = {-ATTN_INF, 0.0f, 0.0f};
  if (ACT != ATTN_ACT_SOFTMAX) {
    for (int j = 0; j < KV; j++) p[j] = j < kv_len ? attnq_prob<ACT>(s[j], st, inv_norm) : 0.0f;
    return st;
  }
  for (int j = 0; j < KV; j++)
    if (j < kv_len) st.m = j == 0 || s[j] > st.m ? s[j] : st.m;
  float sum = 0.0f;
  for (int j = 0; j < KV; j++) {
    p[j] = j < kv_len ? (float)exp((double)(s[j] - st.m)) : 0.0f;
    sum += p[j];
  }
  st.inv = kv_len > 0 ? 1.0f / sum : 0.0f;
  for (int j = 0; j < KV; j++) p[j] *= st.inv;
  return st;
}

// ---------------------------------------------------------------------------------------------
// Forward: O = quant_rows(P) · Vr. A CTA takes 128 query rows of one example (tile list entry
// {b, i0, 0}), each of its 8 warps 16 of them; shared memory holds Kh and Vr of the example.

template <int D, int DH, int KV, int ACT, typename OT, typename QT, typename KT>
__device__ __forceinline__ void attnt_forward(OT *__restrict__ out, const QT *__restrict__ q,
                                              const KT *__restrict__ k, const KT *__restrict__ v,
                                              const AttnRows &r, double inv_norm,
                                              const int *__restrict__ tiles) {
  typedef AttntLanes<D, DH> Lanes;
  enum { F = Lanes::F, BL = Lanes::BL, ROWS_PER_WARP = ATTNT_FWD_ROWS / ATTNT_WARPS };
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *kh = (float *)attn_smem, *vr = kh + KV * D;
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1];
  if (b < 0) return;
  const AttnExample e = attn_example(r, b);
  attnt_stage_heads<D, DH, KV>(kh, k, e, r.d);
  attnt_stage_cols<D, KV>(vr, v, e, r.d);
  __syncthreads();
  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, f0 = lane * F;
  const int first = i0 + warp * ROWS_PER_WARP;
  int last = first + ROWS_PER_WARP;
  if (last > e.q_len) last = e.q_len;
  float next[F];
  if (first < last) attnt_load<F>(next, q + (e.q_start + first) * r.d + f0);
  for (int i = first; i < last; i++) {
    float qh[F];
    for (int f = 0; f < F; f++) qh[f] = next[f];
    if (i + 1 < last) attnt_load<F>(next, q + (e.q_start + i + 1) * r.d + f0);
    attnt_mx_lanes<F, BL>(qh);
    float s[KV];
    attnt_scores<D, DH, KV>(s, qh, kh, f0, e.kv_len, r.scale);
    float p[KV];
    attnt_probs<KV, ACT>(p, s, e.kv_len, inv_norm);
    attnq_mx_block(p, KV, 1);
    float acc[F];
    for (int f = 0; f < F; f++) acc[f] = 0.0f;
    for (int j = 0; j < KV; j++)
      if (p[j] != 0.0f)
        for (int f = 0; f < F; f++) acc[f] += p[j] * vr[j * D + f0 + f];
    attnt_store<F>(out + (e.o_start + i) * r.d + f0, acc);
  }
}

// ---------------------------------------------------------------------------------------------
// The forward on the tensor cores (head widths that are a multiple of 16): a warp takes 16
// query rows, head by head, and both products run as mma.sync m16n8k16 on bf16 copies of the
// quantized values (exact: an mxfp8 value is an E4M3 value, 4 significant bits, times a power
// of two, in bf16's exponent range). In the mma layouts (lane = 4g + t) a row's 32 features of
// one k-step pair are held by the 4 lanes of a quad, so the mxfp8 block amax along a head is a
// max over the quad; a row's keys are the quad's accumulator columns, so P's block along the
// keys is too. Only the order of the fp32 sums differs from the executor (a quantized P on a
// rounding boundary can round the other way).
//   shared memory: kh [KP keys][D + 8] (K quantized along each head's features) and
//                  vt [D features][KP + 8] (V quantized down each column, transposed), bf16.

template <int D, int DH, int KV> struct AttntTc {
  enum {
    NT = (KV + 15) / 16 * 2,  // key tiles of 8 (even: two are a k-step of P·V)
    KP = NT * 8,              // keys, padded with zeros
    BW = DH < 32 ? DH : 32,   // an mxfp8 block along a head
    KPB = BW / 16,            // k-steps of 16 features a block
    LDK = D + 8,              // a fragment's 8 rows x 4 words fall in 32 banks
    LDV = KP + 8,
    FORWARD_SMEM = 2 * (KP * LDK + D * LDV),  // bytes (emit_attention_tiny_kv.c: tiny_tc_smem)
  };
};

template <typename T> __device__ __forceinline__ void attnt_load2(const T *p, float &a, float &b) {
  a = attn_to_float(p[0]);
  b = attn_to_float(p[1]);
}
__device__ __forceinline__ void attnt_load2(const bf16_t *p, float &a, float &b) {
  unsigned w;
#ifdef GEMC_ON_CPU
  memcpy(&w, p, 4);
#else
  w = *(const unsigned *)p;
#endif
  a = __uint_as_float(w << 16);
  b = __uint_as_float(w & 0xffff0000u);
}

template <typename T> __device__ __forceinline__ void attnt_store2(T *p, float a, float b) {
  attn_store1(p, a);
  attn_store1(p + 1, b);
}
__device__ __forceinline__ void attnt_store2(bf16_t *p, float a, float b) {
#ifdef GEMC_ON_CPU
  unsigned w = attn_pack_bf16(a, b);
  memcpy(p, &w, 4);
#else
  attn_store2(p, a, b);
#endif
}

// K quantized along each head's features into kh (bf16, rows KP), and V down each column into
// vt (transposed; none when vt is null); zeros past the example's keys. Called by every thread
// of the CTA.
template <int D, int DH, int KV, typename KT>
__device__ __forceinline__ void attnt_stage_tc(bf16_t *kh, bf16_t *vt, const KT *__restrict__ k,
                                               const KT *__restrict__ v, const AttnExample &e,
                                               int d) {
  typedef AttntTc<D, DH, KV> Tc;
  enum { BLOCKS = D / Tc::BW };
  for (int t = threadIdx.x; t < Tc::KP * BLOCKS; t += blockDim.x) {
    int j = t / BLOCKS, c0 = (t % BLOCKS) * Tc::BW;
    float x[Tc::BW];
    for (int f = 0; f < Tc::BW; f++) x[f] = j < e.kv_len ? attn_to_float(k[(e.kv_start + j) * d + c0 + f]) : 0.0f;
    attnq_mx_block(x, Tc::BW, 1);
    for (int f = 0; f < Tc::BW; f += 2) *(unsigned *)(kh + j * Tc::LDK + c0 + f) = attn_pack_bf16(x[f], x[f + 1]);
  }
  for (int c = threadIdx.x; vt && c < D; c += blockDim.x) {
    float x[Tc::KP];
    for (int j = 0; j < Tc::KP; j++) x[j] = j < e.kv_len ? attn_to_float(v[(e.kv_start + j) * d + c]) : 0.0f;
    attnq_mx_block(x, KV, 1);  // the zeros past kv_len change no amax
    for (int j = 0; j < Tc::KP; j += 2) *(unsigned *)(vt + c * Tc::LDV + j) = attn_pack_bf16(x[j], x[j + 1]);
  }
}

// Rows g and g + 8 of the warp's 16 (row0 + g < len, else zeros), features [c0, c0 + BW) of
// one mxfp8 block, quantized as the executor quantizes a row along a head, as A fragments of
// the block's KPB k-steps.
template <int BW, typename T>
__device__ __forceinline__ void attnt_a_block(unsigned (*a)[4], const T *__restrict__ x, i64 start,
                                              int row0, int len, int d, int c0) {
  enum { KPB = BW / 16 };
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float v[2][KPB][4];  // [row g, g + 8][k-step][cols 2t, 2t + 1, 2t + 8, 2t + 9]
  for (int h = 0; h < 2; h++) {
    const int row = row0 + g + 8 * h;
    for (int ks = 0; ks < KPB; ks++) {
      float *w = v[h][ks];
      w[0] = w[1] = w[2] = w[3] = 0.0f;
      if (row < len) {
        const T *p = x + (start + row) * d + c0 + 16 * ks + 2 * t;
        attnt_load2(p, w[0], w[1]);
        attnt_load2(p + 8, w[2], w[3]);
      }
    }
    float amax = 0.0f;
    for (int ks = 0; ks < KPB; ks++)
      for (int i = 0; i < 4; i++) amax = fmaxf(amax, attnq_finite_abs(v[h][ks][i]));
    amax = attnt_group_max<4>(amax);
    const int ex = mx_block_exponent(amax);
    const float inv = ldexpf(1.0f, -ex), scale = ldexpf(1.0f, ex);
    for (int ks = 0; ks < KPB; ks++)
      for (int i = 0; i < 4; i++) v[h][ks][i] = e4m3_round(v[h][ks][i] * inv) * scale;
  }
  for (int ks = 0; ks < KPB; ks++) {
    a[ks][0] = attn_pack_bf16(v[0][ks][0], v[0][ks][1]);
    a[ks][1] = attn_pack_bf16(v[1][ks][0], v[1][ks][1]);
    a[ks][2] = attn_pack_bf16(v[0][ks][2], v[0][ks][3]);
    a[ks][3] = attn_pack_bf16(v[1][ks][2], v[1][ks][3]);
  }
}

// acc[n] += A · B for the key tiles n < NT: B's column n·8 + g is key row n·8 + g of `rows`
// (bf16, row stride ld), its k the features [c, c + 16).
template <int NT>
__device__ __forceinline__ void attnt_mma_rows(float (*acc)[4], const unsigned *a, const bf16_t *rows,
                                               int ld, int c) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int n = 0; n < NT; n++) {
    const bf16_t *p = rows + (n * 8 + g) * ld + c + 2 * t;
    unsigned b[2] = {*(const unsigned *)p, *(const unsigned *)(p + 8)};
    attn_mma(acc[n], a, b);
  }
}

// A row's statistics over the keys its quad holds (accumulator columns 8n + 2t + {0, 1}; `hi`
// picks row g + 8): the max, and the sum of x in key order (the executor's).
template <int NT, int KV>
__device__ __forceinline__ float attnt_quad_max(const float (*x)[4], int hi, int kv_len) {
  const int t = threadIdx.x & 3;
  float m = -ATTN_INF;
  for (int n = 0; n < NT; n++)
    for (int c = 0; c < 2; c++)
      if (8 * n + 2 * t + c < kv_len) m = fmaxf(m, x[n][2 * hi + c]);
  return attnt_group_max<4>(m);
}

template <int NT, int KV>
__device__ __forceinline__ float attnt_quad_sum_in_order(const float (*x)[4], int hi, int kv_len) {
  const int lane = threadIdx.x & 31;
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < KV; j++) {
    const float mine = x[j / 8][2 * hi + (j & 1)];
    const float xj = __shfl_sync(0xffffffffu, mine, (lane & ~3) | ((j % 8) >> 1));
    if (j < kv_len) sum += xj;
  }
  return sum;
}

template <int D, int DH, int KV, int ACT, typename OT, typename QT, typename KT>
__device__ __forceinline__ void attnt_forward_tc(OT *__restrict__ out, const QT *__restrict__ q,
                                                 const KT *__restrict__ k, const KT *__restrict__ v,
                                                 const AttnRows &r, double inv_norm,
                                                 const int *__restrict__ tiles) {
  typedef AttntTc<D, DH, KV> Tc;
  enum { NT = Tc::NT, H = D / DH };
  extern __shared__ __align__(16) unsigned char attn_smem[];
  bf16_t *kh = (bf16_t *)attn_smem, *vt = kh + Tc::KP * Tc::LDK;
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1];
  if (b < 0) return;
  const AttnExample e = attn_example(r, b);
  attnt_stage_tc<D, DH, KV>(kh, vt, k, v, e, r.d);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, g = lane >> 2, t = lane & 3;
  const int row0 = i0 + warp * 16;
  if (row0 >= e.q_len) return;
  for (int h = 0; h < H; h++) {
    float s[NT][4];
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    for (int c0 = h * DH; c0 < (h + 1) * DH; c0 += Tc::BW) {
      unsigned a[Tc::KPB][4];
      attnt_a_block<Tc::BW>(a, q, e.q_start, row0, e.q_len, r.d, c0);
      for (int ks = 0; ks < Tc::KPB; ks++) attnt_mma_rows<NT>(s, a[ks], kh, Tc::LDK, c0 + 16 * ks);
    }
    // P, row g in [n][0..1], row g + 8 in [n][2..3]; then quantized along the keys.
    float p[NT][4];
    for (int hi = 0; hi < 2; hi++) {
      AttnqRow st = {-ATTN_INF, 0.0f, 0.0f};
      for (int n = 0; n < NT; n++)
        for (int c = 0; c < 2; c++) s[n][2 * hi + c] *= r.scale;
      if (ACT == ATTN_ACT_SOFTMAX) {
        st.m = attnt_quad_max<NT, KV>(s, hi, e.kv_len);
        for (int n = 0; n < NT; n++)
          for (int c = 0; c < 2; c++)
            p[n][2 * hi + c] = 8 * n + 2 * t + c < e.kv_len ? (float)exp((double)(s[n][2 * hi + c] - st.m)) : 0.0f;
        const float sum = attnt_quad_sum_in_order<NT, KV>(p, hi, e.kv_len);
        st.inv = e.kv_len > 0 ? 1.0f / sum : 0.0f;
        for (int n = 0; n < NT; n++)
          for (int c = 0; c < 2; c++) p[n][2 * hi + c] *= st.inv;
      } else {
        for (int n = 0; n < NT; n++)
          for (int c = 0; c < 2; c++)
            p[n][2 * hi + c] = 8 * n + 2 * t + c < e.kv_len ? attnq_prob<ACT>(s[n][2 * hi + c], st, inv_norm) : 0.0f;
      }
      float amax = 0.0f;
      for (int n = 0; n < NT; n++)
        for (int c = 0; c < 2; c++) amax = fmaxf(amax, attnq_finite_abs(p[n][2 * hi + c]));
      amax = attnt_group_max<4>(amax);
      const int ex = mx_block_exponent(amax);
      const float inv = ldexpf(1.0f, -ex), scale = ldexpf(1.0f, ex);
      for (int n = 0; n < NT; n++)
        for (int c = 0; c < 2; c++) p[n][2 * hi + c] = e4m3_round(p[n][2 * hi + c] * inv) * scale;
    }
    // O = quant(P) · Vr: the accumulators of key tiles 2s and 2s + 1 are the A fragment of
    // k-step s.
    float o[DH / 8][4];
    for (int n = 0; n < DH / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int ks = 0; ks < NT / 2; ks++) {
      unsigned a[4] = {attn_pack_bf16(p[2 * ks][0], p[2 * ks][1]), attn_pack_bf16(p[2 * ks][2], p[2 * ks][3]),
                       attn_pack_bf16(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                       attn_pack_bf16(p[2 * ks + 1][2], p[2 * ks + 1][3])};
      attnt_mma_rows<DH / 8>(o, a, vt + h * DH * Tc::LDV, Tc::LDV, 16 * ks);
    }
    for (int hi = 0; hi < 2; hi++) {
      const int row = row0 + g + 8 * hi;
      if (row >= e.q_len) continue;
      OT *dst = out + (e.o_start + row) * r.d + h * DH + 2 * t;
      for (int n = 0; n < DH / 8; n++) attnt_store2(dst + 8 * n, o[n][2 * hi], o[n][2 * hi + 1]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward. A CTA takes 256 query rows of one example (entry {b, i0, 0}); warp w the 32-row
// block at i0 + 32w. Per row it forms P and dS, writes dQ = scale · quant_rows(dS) · Kr, and
// keeps P and dS in shared memory; then it quantizes their columns over the block, reads the
// block's Q and dO again quantized down their columns, and sums dK = quant_cols(dS)ᵀ · Qr and
// dV = quant_cols(P)ᵀ · dOr. The CTA's sums go to partial[(b · chunks + i0 / 256)][2][KV][D].

// The backward's shared memory, in floats (codegen/attention/emit_attention_tiny_kv.c sizes
// the launch the same way): kh, vh, kr; {P, dS} of each warp's 32 rows; the CTA's dK and dV.
template <int D, int KV, int H> struct AttntBackwardSmem {
  enum { KEYS = 3 * KV * D, PDS = ATTNT_WARPS * 32 * H * KV * 2, SUM = 2 * KV * D };
};

template <int D, int DH, int KV, int ACT, typename GT, typename QT, typename KT>
__device__ __forceinline__ void attnt_backward(GT *__restrict__ dq, const QT *__restrict__ q,
                                               const KT *__restrict__ k, const KT *__restrict__ v,
                                               const KT *__restrict__ dout, const AttnRows &r,
                                               double inv_norm, const int *__restrict__ tiles,
                                               int chunks, float *__restrict__ partial) {
  typedef AttntLanes<D, DH> Lanes;
  enum { F = Lanes::F, G = Lanes::G, BL = Lanes::BL, H = D / DH };
  typedef AttntBackwardSmem<D, KV, H> Smem;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *kh = (float *)attn_smem, *vh = kh + KV * D, *kr = vh + KV * D;
  float2 *pds_all = (float2 *)(kh + Smem::KEYS);
  float *sum = (float *)pds_all + Smem::PDS;
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1];
  if (b < 0) return;
  const AttnExample e = attn_example(r, b);
  attnt_stage_heads<D, DH, KV>(kh, k, e, r.d);
  attnt_stage_heads<D, DH, KV>(vh, v, e, r.d);
  attnt_stage_cols<D, KV>(kr, k, e, r.d);
  __syncthreads();
  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, f0 = lane * F;
  const int head = lane / G;
  float2 *pds = pds_all + warp * 32 * H * KV;  // [row][head][key] {P, dS}
  const int first = i0 + warp * 32;
  int n = e.q_len - first;
  n = n < 0 ? 0 : (n > 32 ? 32 : n);
  // Pass 1, row by row: P, dS, dQ; and the column amax of Q and dO over the block.
  float qmax[F], dmax[F];
  for (int f = 0; f < F; f++) qmax[f] = dmax[f] = 0.0f;
  for (int ii = 0; ii < n; ii++) {
    const int i = first + ii;
    float qh[F], doh[F];
    attnt_load<F>(qh, q + (e.q_start + i) * r.d + f0);
    attnt_load<F>(doh, dout + (e.o_start + i) * r.d + f0);
    for (int f = 0; f < F; f++) {
      qmax[f] = fmaxf(qmax[f], attnq_finite_abs(qh[f]));
      dmax[f] = fmaxf(dmax[f], attnq_finite_abs(doh[f]));
    }
    attnt_mx_lanes<F, BL>(qh);
    attnt_mx_lanes<F, BL>(doh);
    float s[KV], dp[KV];
    attnt_scores<D, DH, KV>(s, qh, kh, f0, e.kv_len, r.scale);
    attnt_scores<D, DH, KV>(dp, doh, vh, f0, e.kv_len, 1.0f);
    float p[KV], ds[KV];
    AttnqRow st = attnt_probs<KV, ACT>(p, s, e.kv_len, inv_norm);
    for (int j = 0; j < KV; j++) st.dot += dp[j] * p[j];  // softmax: sum of dP · P, key by key
    for (int j = 0; j < KV; j++)
      ds[j] = j < e.kv_len ? attnq_grad<ACT>(s[j], p[j], dp[j], st, inv_norm) : 0.0f;
    if (lane % G == 0)
      for (int j = 0; j < KV; j++) pds[(ii * H + head) * KV + j] = make_float2(p[j], ds[j]);
    if (dq) {
      attnq_mx_block(ds, KV, 1);
      float acc[F];
      for (int f = 0; f < F; f++) acc[f] = 0.0f;
      for (int j = 0; j < KV; j++)
        if (ds[j] != 0.0f)
          for (int f = 0; f < F; f++) acc[f] += ds[j] * kr[j * D + f0 + f];
      for (int f = 0; f < F; f++) acc[f] *= r.scale;
      attnt_store<F>(dq + (e.q_start + i) * r.d + f0, acc);
    }
  }
  // Rows of the block past the example's end are zeros of the executor's blocks.
  for (int t = lane; t < (32 - n) * H * KV; t += WARP_SIZE) pds[n * H * KV + t] = make_float2(0.0f, 0.0f);
  __syncwarp();
  // Pass 2: quantize each column of P and of dS (head, key) over the block's 32 rows.
  float *pds_floats = (float *)pds;
  for (int t = lane; t < H * KV * 2; t += WARP_SIZE) attnq_mx_block(pds_floats + t, 32, H * KV * 2);
  __syncwarp();
  // Pass 3: Q and dO down their columns, and this block's sums of dK and dV.
  float qinv[F], qsc[F], dinv[F], dsc[F];
  for (int f = 0; f < F; f++) {
    int eq = mx_block_exponent(qmax[f]), ed = mx_block_exponent(dmax[f]);
    qinv[f] = ldexpf(1.0f, -eq), qsc[f] = ldexpf(1.0f, eq);
    dinv[f] = ldexpf(1.0f, -ed), dsc[f] = ldexpf(1.0f, ed);
  }
  float dk[KV][F], dv[KV][F];
  for (int j = 0; j < KV; j++)
    for (int f = 0; f < F; f++) dk[j][f] = dv[j][f] = 0.0f;
  for (int ii = 0; ii < n; ii++) {
    const int i = first + ii;
    float qr[F], dor[F];
    attnt_load<F>(qr, q + (e.q_start + i) * r.d + f0);
    attnt_load<F>(dor, dout + (e.o_start + i) * r.d + f0);
    for (int f = 0; f < F; f++) {
      qr[f] = e4m3_round(qr[f] * qinv[f]) * qsc[f];
      dor[f] = e4m3_round(dor[f] * dinv[f]) * dsc[f];
    }
    for (int j = 0; j < KV; j++) {
      const float2 q = pds[(ii * H + head) * KV + j];  // {P, dS}, quantized down the columns
      if (q.x != 0.0f)
        for (int f = 0; f < F; f++) dv[j][f] += q.x * dor[f];
      if (q.y != 0.0f)
        for (int f = 0; f < F; f++) dk[j][f] += q.y * qr[f];
    }
  }
  // The CTA's sums, warp by warp in order.
  for (int w = 0; w < ATTNT_WARPS; w++) {
    if (warp == w)
      for (int j = 0; j < KV; j++)
        for (int f = 0; f < F; f++) {
          float *at = sum + j * D + f0 + f;
          at[0] = w == 0 ? dk[j][f] : at[0] + dk[j][f];
          at[KV * D] = w == 0 ? dv[j][f] : at[KV * D] + dv[j][f];
        }
    __syncthreads();
  }
  float *dst = partial + ((i64)b * chunks + i0 / ATTNT_BWD_ROWS) * 2 * KV * D;
  for (int t = threadIdx.x; t < 2 * KV * D; t += blockDim.x) dst[t] = sum[t];
}

// dK = scale · (the chunks' dK sums) and dV = the chunks' dV sums, each example's chunks in
// order; one thread per (example, dK or dV, key, feature). Keys of an example without query
// rows get zeros.
template <int D, int KV, typename GT>
__device__ __forceinline__ void attnt_backward_sum(GT *__restrict__ dk, GT *__restrict__ dv,
                                                   const float *__restrict__ partial,
                                                   const AttnRows &r, i64 batch, int chunks) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= batch * 2 * KV * D) return;
  const int b = (int)(t / (2 * KV * D)), rest = (int)(t % (2 * KV * D));
  const int which = rest / (KV * D), j = rest % (KV * D) / D, c = rest % D;
  const AttnExample e = attn_example(r, b);
  if (j >= e.kv_len) return;
  GT *g = which == 0 ? dk : dv;
  if (!g) return;
  const int used = (e.q_len + ATTNT_BWD_ROWS - 1) / ATTNT_BWD_ROWS;
  float acc = 0.0f;
  for (int ch = 0; ch < used; ch++) acc += partial[((i64)b * chunks + ch) * 2 * KV * D + rest];
  attn_store1(g + (e.kv_start + j) * r.d + c, which == 0 ? acc * r.scale : acc);
}

#endif
