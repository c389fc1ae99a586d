// attention_backward.cuh: the backward GDPA kernel bodies (docs/autodiff.md, "Attention,
// exactly"), on mma.sync, with no atomics: every output element has one writer.
//   attn_backward_kv: one block per (example, key tile, head); 4 warps of 16 keys each loop
//     over the query tiles that can see their keys and accumulate dK = scale·dSᵀQ, dV = PᵀdO.
//   attn_backward_q:  one block per (example, query tile, head); loops over key tiles and
//     accumulates dQ = scale·dS·K. For PMA (no tile list) the examples are cut into `chunks`
//     consecutive ranges: one block per (chunk, seed tile, head) sums its range's dQ in example
//     order into fp32 `partial[chunk]` (every element written, zeros included), and a second
//     kernel adds the chunks in order: deterministic, no atomics. chunks = 1 with no partial
//     buffer is one block per (seed tile, head) over every example, writing dQ itself.
// Both recompute S = Q·Kᵀ and dP = dO·Vᵀ per tile. dS = dP ⊙ act′(S) ⊙ M for a pointwise
// act, and P ⊙ (dP − D) for softmax, with P = exp2(S·scale·log2e − lse2) from the stats
// that attn_forward's preparation mode wrote (lse2 and D per output row and head).
// defines: attn_backward_kv, attn_backward_q
#ifndef GEMC_ATTENTION_BACKWARD_CUH
#define GEMC_ATTENTION_BACKWARD_CUH

template <int DH> struct AttnBackwardSmem {
  enum { BYTES = 6 * ATTN_TILE_BWD * DH * 2 };
};

// P and dS of one score element, given s = (Q·Kᵀ) and dp = (dO·Vᵀ) at it.
template <int ACT>
__device__ __forceinline__ void attn_grad_element(const AttnRows &r, float s, float dp, bool valid,
                                                  float2 stat, float *p, float *ds) {
  if (!valid) {
    *p = 0.0f;
    *ds = 0.0f;
  } else if (ACT == ATTN_ACT_SOFTMAX) {
    float pr = exp2f(s * r.scale * ATTN_LOG2E - stat.x);
    *p = pr;
    *ds = pr * (dp - stat.y);
  } else if (ACT == ATTN_ACT_GELU) {
    const AttnGeluK k = attn_gelu_k(r.scale, r.inv_norm);
    float t;
    *p = attn_gelu_p_tc(k, s, &t);
    *ds = dp * attn_gelu_grad_tc(k, s, t);
  } else {
    float x = s * r.scale;
    *p = attn_act_tc<ACT>(x) * r.inv_norm;
    *ds = dp * attn_act_grad_tc<ACT>(x) * r.inv_norm;
  }
}

// The double buffering both kernels use for the side they loop over: before tile `it` is
// used, start loading tile it + 1 of x and y (rows from `next`) into the other stage and wait
// for tile it; the last tile just waits.
template <int TILE, int DH, int THREADS, typename TX, typename TY>
__device__ __forceinline__ void attn_prefetch_pair(bf16_t *tile_x, const TX *x, i64 x_start,
                                                   bf16_t *tile_y, const TY *y, i64 y_start,
                                                   int len, int it, int count, int next,
                                                   const AttnRows &r, int col0) {
  if (it + 1 < count) {
    const int stage = (it + 1) & 1;
    attn_load_tile<TILE, DH, THREADS>(tile_x + stage * TILE * DH, x, x_start, next, len, r.d, col0);
    attn_load_tile<TILE, DH, THREADS>(tile_y + stage * TILE * DH, y, y_start, next, len, r.d, col0);
    attn_cp_async_commit();
    attn_cp_async_wait<1>();
  } else {
    attn_cp_async_wait<0>();
  }
  __syncthreads();
}

// s = A1·B1ᵀ and dp = A2·B2ᵀ for this warp's 16 rows of A1 and A2 (resident tiles) against the
// TILE rows of B1 and B2 (the staged tiles): S and dP (or their transposes) of one tile pair.
template <int DH, int SCORE_BLOCKS>
__device__ __forceinline__ void attn_two_products(float (*s)[4], float (*dp)[4], const bf16_t *a1,
                                                  const bf16_t *a2, const bf16_t *b1,
                                                  const bf16_t *b2, int warp) {
#pragma unroll
  for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) s[n][c] = dp[n][c] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DH / 16; kk++) {
    unsigned frag_a1[4], frag_a2[4];
    attn_load_a<DH>(frag_a1, a1, warp * 16, kk * 16);
    attn_load_a<DH>(frag_a2, a2, warp * 16, kk * 16);
#pragma unroll
    for (int n2 = 0; n2 < SCORE_BLOCKS / 2; n2++) {
      unsigned frag[4];
      attn_load_bt<DH>(frag, b1, n2 * 16, kk * 16);
      attn_mma(s[2 * n2], frag_a1, frag);
      attn_mma(s[2 * n2 + 1], frag_a1, frag + 2);
      attn_load_bt<DH>(frag, b2, n2 * 16, kk * 16);
      attn_mma(dp[2 * n2], frag_a2, frag);
      attn_mma(dp[2 * n2 + 1], frag_a2, frag + 2);
    }
  }
}

template <int DH, int ACT, typename QT, typename GT>
__device__ __forceinline__ void attn_backward_kv(GT *__restrict__ dk, GT *__restrict__ dv,
                                                 const QT *__restrict__ q,
                                                 const bf16_t *__restrict__ k,
                                                 const bf16_t *__restrict__ v,
                                                 const bf16_t *__restrict__ dout,
                                                 const AttnRows &r, const int *__restrict__ tiles,
                                                 const float *__restrict__ stats) {
  enum { TILE = ATTN_TILE_BWD, THREADS = 128, SCORE_BLOCKS = TILE / 8,
         OUT_BLOCKS = DH / 8 };
  extern __shared__ __align__(128) unsigned char attn_smem[];
  bf16_t *tile_k = (bf16_t *)attn_smem;
  bf16_t *tile_v = tile_k + TILE * DH;
  bf16_t *tile_q = tile_v + TILE * DH;   // two stages
  bf16_t *tile_do = tile_q + 2 * TILE * DH;  // two stages

  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], j0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, heads = r.d / DH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int nk = e.kv_len - j0 < TILE ? e.kv_len - j0 : TILE;
  int qlo, qhi;
  attn_query_range(r, j0, j0 + nk, e.q_len, &qlo, &qhi);
  const int nqt = (qhi - qlo + TILE - 1) / TILE;

  attn_load_tile<TILE, DH, THREADS>(tile_k, k, e.kv_start, j0, e.kv_len, r.d, col0);
  attn_load_tile<TILE, DH, THREADS>(tile_v, v, e.kv_start, j0, e.kv_len, r.d, col0);
  if (nqt > 0) {
    attn_load_tile<TILE, DH, THREADS>(tile_q, q, e.q_start, qlo, e.q_len, r.d, col0);
    attn_load_tile<TILE, DH, THREADS>(tile_do, dout, e.o_start, qlo, e.q_len, r.d, col0);
  }
  attn_cp_async_commit();

  float acc_dk[OUT_BLOCKS][4], acc_dv[OUT_BLOCKS][4];
#pragma unroll
  for (int n = 0; n < OUT_BLOCKS; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc_dk[n][c] = acc_dv[n][c] = 0.0f;
  const int key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};

  for (int it = 0; it < nqt; it++) {
    const int i0 = qlo + it * TILE;
    attn_prefetch_pair<TILE, DH, THREADS>(tile_q, q, e.q_start, tile_do, dout, e.o_start, e.q_len,
                                          it, nqt, i0 + TILE, r, col0);
    const bf16_t *stage_q = tile_q + (it & 1) * TILE * DH;
    const bf16_t *stage_do = tile_do + (it & 1) * TILE * DH;

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's 16 keys and the tile's queries.
    float s[SCORE_BLOCKS][4], dp[SCORE_BLOCKS][4];
    attn_two_products<DH, SCORE_BLOCKS>(s, dp, tile_k, tile_v, stage_q, stage_do, warp);

    // Pᵀ into s, dSᵀ into dp.
#pragma unroll
    for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int i = i0 + n * 8 + 2 * t + (c & 1), j = key[c >> 1];
        const bool valid = i < e.q_len && j < e.kv_len && attn_visible(r, i, j);
        float2 stat = make_float2(0.0f, 0.0f);
        if (ACT == ATTN_ACT_SOFTMAX && valid)
          stat = *(const float2 *)(stats + ((e.o_start + i) * heads + h) * 2);
        attn_grad_element<ACT>(r, s[n][c], dp[n][c], valid, stat, &s[n][c], &dp[n][c]);
      }

    // dV += Pᵀ·dO and dK += dSᵀ·Q, reducing over the tile's queries.
#pragma unroll
    for (int kk = 0; kk < TILE / 16; kk++) {
      unsigned frag_p[4], frag_ds[4];
      attn_pack_a(frag_p, s, kk);
      attn_pack_a(frag_ds, dp, kk);
#pragma unroll
      for (int n2 = 0; n2 < DH / 16; n2++) {
        unsigned frag[4];
        attn_load_b<DH>(frag, stage_do, kk * 16, n2 * 16);
        attn_mma(acc_dv[2 * n2], frag_p, frag);
        attn_mma(acc_dv[2 * n2 + 1], frag_p, frag + 2);
        attn_load_b<DH>(frag, stage_q, kk * 16, n2 * 16);
        attn_mma(acc_dk[2 * n2], frag_ds, frag);
        attn_mma(acc_dk[2 * n2 + 1], frag_ds, frag + 2);
      }
    }
    __syncthreads();
  }
  attn_cp_async_wait<0>();

#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int j = key[half];
    if (j >= e.kv_len) continue;
    const i64 at = (e.kv_start + j) * r.d + col0 + 2 * t;
#pragma unroll
    for (int n = 0; n < OUT_BLOCKS; n++) {
      if (dk)
        attn_store2(dk + at + n * 8, acc_dk[n][2 * half] * r.scale, acc_dk[n][2 * half + 1] * r.scale);
      if (dv) attn_store2(dv + at + n * 8, acc_dv[n][2 * half], acc_dv[n][2 * half + 1]);
    }
  }
}

template <int DH, int ACT, typename QT, typename GT>
__device__ __forceinline__ void attn_backward_q(GT *__restrict__ dq, i64 batch,
                                                const QT *__restrict__ q,
                                                const bf16_t *__restrict__ k,
                                                const bf16_t *__restrict__ v,
                                                const bf16_t *__restrict__ dout,
                                                const AttnRows &r, const int *__restrict__ tiles,
                                                const float *__restrict__ stats,
                                                float *__restrict__ partial = 0,
                                                int chunks = 1) {
  enum { TILE = ATTN_TILE_BWD, THREADS = 128, SCORE_BLOCKS = TILE / 8,
         OUT_BLOCKS = DH / 8 };
  extern __shared__ __align__(128) unsigned char attn_smem[];
  bf16_t *tile_q = (bf16_t *)attn_smem;
  bf16_t *tile_do = tile_q + TILE * DH;
  bf16_t *tile_k = tile_do + TILE * DH;      // two stages
  bf16_t *tile_v = tile_k + 2 * TILE * DH;   // two stages

  // One tile of the list, or (no list: PMA) one (seed tile, head) summed over every example
  // in example order, so the seeds' gradient needs no atomics and no second pass.
  const int heads = r.d / DH;
  int b_first, b_end, i0, h, chunk;  // PMA (no tile list): a range of examples, in order
  attn_query_block(tiles, batch, TILE, heads, partial ? chunks : 1, r.kv_off, &b_first, &b_end,
                   &i0, &h, &chunk);
  const int col0 = h * DH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float acc_dq[OUT_BLOCKS][4];
#pragma unroll
  for (int n = 0; n < OUT_BLOCKS; n++) acc_dq[n][0] = acc_dq[n][1] = acc_dq[n][2] = acc_dq[n][3] = 0.0f;
  i64 q_start = 0;
  int q_len = 0;

  for (int b = b_first; b < b_end; b++) {
    const AttnExample e = attn_example(r, b);
    q_start = e.q_start, q_len = e.q_len;
    if (i0 >= e.q_len) continue;
    const int nq = e.q_len - i0 < TILE ? e.q_len - i0 : TILE;
    int jlo, jhi;
    attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
    const int nkv = (jhi - jlo + TILE - 1) / TILE;
    if (nkv == 0) continue;  // no key: this example adds nothing

    attn_load_tile<TILE, DH, THREADS>(tile_q, q, e.q_start, i0, e.q_len, r.d, col0);
    attn_load_tile<TILE, DH, THREADS>(tile_do, dout, e.o_start, i0, e.q_len, r.d, col0);
    attn_load_tile<TILE, DH, THREADS>(tile_k, k, e.kv_start, jlo, e.kv_len, r.d, col0);
    attn_load_tile<TILE, DH, THREADS>(tile_v, v, e.kv_start, jlo, e.kv_len, r.d, col0);
    attn_cp_async_commit();

    float2 stat[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
    if (ACT == ATTN_ACT_SOFTMAX)
      for (int half = 0; half < 2; half++)
        if (row[half] < e.q_len)
          stat[half] = *(const float2 *)(stats + ((e.o_start + row[half]) * heads + h) * 2);

    for (int it = 0; it < nkv; it++) {
      const int j0 = jlo + it * TILE;
      attn_prefetch_pair<TILE, DH, THREADS>(tile_k, k, e.kv_start, tile_v, v, e.kv_start, e.kv_len,
                                            it, nkv, j0 + TILE, r, col0);
      const bf16_t *stage_k = tile_k + (it & 1) * TILE * DH;
      const bf16_t *stage_v = tile_v + (it & 1) * TILE * DH;

      // S = Q·Kᵀ and dP = dO·Vᵀ for this warp's 16 queries and the tile's keys.
      float s[SCORE_BLOCKS][4], dp[SCORE_BLOCKS][4];
      attn_two_products<DH, SCORE_BLOCKS>(s, dp, tile_q, tile_do, stage_k, stage_v, warp);
#pragma unroll
      for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int i = row[c >> 1], j = j0 + n * 8 + 2 * t + (c & 1);
          const bool valid = i < e.q_len && j < e.kv_len && attn_visible(r, i, j);
          float p;
          attn_grad_element<ACT>(r, s[n][c], dp[n][c], valid, stat[c >> 1], &p, &dp[n][c]);
        }
      // dQ += dS·K, reducing over the tile's keys.
#pragma unroll
      for (int kk = 0; kk < TILE / 16; kk++) {
        unsigned frag_ds[4];
        attn_pack_a(frag_ds, dp, kk);
#pragma unroll
        for (int n2 = 0; n2 < DH / 16; n2++) {
          unsigned frag[4];
          attn_load_b<DH>(frag, stage_k, kk * 16, n2 * 16);
          attn_mma(acc_dq[2 * n2], frag_ds, frag);
          attn_mma(acc_dq[2 * n2 + 1], frag_ds, frag + 2);
        }
      }
      __syncthreads();
    }
  }

  if (partial) {  // every seed row of the chunk, zeros where its examples added nothing
    float *out = partial + (i64)chunk * r.q_fixed * r.d;
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int i = row[half];
      if (i >= r.q_fixed) continue;
#pragma unroll
      for (int n = 0; n < OUT_BLOCKS; n++) {
        float *at = out + (i64)i * r.d + col0 + 2 * t + n * 8;
        at[0] = acc_dq[n][2 * half] * r.scale;
        at[1] = acc_dq[n][2 * half + 1] * r.scale;
      }
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int i = row[half];
    if (i >= q_len) continue;
#pragma unroll
    for (int n = 0; n < OUT_BLOCKS; n++)
      attn_store2(dq + (q_start + i) * r.d + col0 + 2 * t + n * 8, acc_dq[n][2 * half] * r.scale,
                  acc_dq[n][2 * half + 1] * r.scale);
  }
}

#endif
