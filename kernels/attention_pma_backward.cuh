// attention_pma_backward.cuh: the whole backward of a PMA (seeds that every example shares,
// over a jagged or fixed kv) on mma.sync, in one pass over the keys (docs/attention.md, "PMA").
//   Block x is (chunk, head). Chunk c owns the key tiles whose first key lies in
//   [c·T/chunks, (c+1)·T/chunks) of the batch's T keys (a long example is cut between chunks
//   at 64-key tile boundaries, so the chunks hold equal work), and walks them in key order.
//   4 warps of 16 keys: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ over the QROWS seed columns, then Pᵀ and dSᵀ
//   in registers. Every seed is in the tile, so dV = Pᵀ·dO and dK = scale·dSᵀ·Q of its keys are
//   whole: they are stored at once. dSᵀ goes to shared memory transposed (rounded to bf16, as
//   the dQ kernel rounds it), and dQ += dS·K accumulates in registers, the warps splitting the
//   seed rows and the head's columns. At the end the block writes every element of its part of
//   `out` (chunk c's seeds x the head's columns; zeros where its tiles added nothing), and
//   attn_pma_sum_chunks adds the chunks in order: no atomics, the same bits every run.
//   K and V stream through two stages with cp.async across example boundaries (the next tile,
//   of this example or the next, loads under this one), dO of the next example into the other
//   of two buffers; the seeds (fp32) are converted into shared memory once per block.
// Against attn_backward_q + attn_backward_kv it reads K and V once instead of twice, the seeds
// once a block instead of once an example, and needs no tile list.
// defines: attn_backward_pma, AttnPmaShape
#ifndef GEMC_ATTENTION_PMA_BACKWARD_CUH
#define GEMC_ATTENTION_PMA_BACKWARD_CUH

// QROWS seed rows a tile (16, 32 or 64, at least the seeds), split over the 4 warps for dQ as
// ROW_BLOCKS blocks of 16 rows times COL_GROUPS groups of the head's columns.
template <int DH, int QROWS> struct AttnPmaShape {
  enum {
    KEYS = ATTN_TILE_BWD,
    ROW_BLOCKS = QROWS / 16,
    COL_GROUPS = 4 / ROW_BLOCKS,
    COLS = DH / COL_GROUPS,  // a multiple of 16: DH >= 16 * COL_GROUPS
    // Q, 2 dO buffers, 2 stages of K and V, the dSᵀ tile; bf16
    SMEM = 2 * (3 * QROWS * DH + 4 * KEYS * DH + QROWS * KEYS),
  };
};

// The first key of example b in the packed kv.
__device__ __forceinline__ i64 attn_kv_begin(const AttnRows &r, i64 b) {
  return r.kv_off ? r.kv_off[b] : b * r.kv_fixed;
}

// A key tile of the walk: example b, first key j0 within it.
struct AttnPmaItem {
  int b, j0;
};

// Moves `it` to the first tile at or after it that exists (skipping examples with no key
// left); it.b == batch when there is none.
__device__ __forceinline__ void attn_pma_settle(const AttnRows &r, i64 batch, AttnPmaItem &it) {
  while (it.b < batch && it.j0 >= attn_kv_begin(r, it.b + 1) - attn_kv_begin(r, it.b)) {
    it.b++;
    it.j0 = 0;
  }
}

// The chunk's first tile: the first whose first key is at or after `lo`.
__device__ __forceinline__ AttnPmaItem attn_pma_first(const AttnRows &r, i64 batch, i64 lo) {
  int a = 0, z = (int)batch;  // the first example that starts at or after lo
  while (a < z) {
    const int mid = (a + z) / 2;
    if (attn_kv_begin(r, mid) < lo) a = mid + 1;
    else z = mid;
  }
  AttnPmaItem it = {a > 0 ? a - 1 : 0, 0};  // the example before may end inside the chunk
  const i64 into = lo - attn_kv_begin(r, it.b);
  if (into > 0) it.j0 = (int)((into + ATTN_TILE_BWD - 1) / ATTN_TILE_BWD * ATTN_TILE_BWD);
  attn_pma_settle(r, batch, it);
  return it;
}

// dst (this warp's 16 keys of the tile) = mul · Xᵀ·B: X the warp's score tile (keys x QROWS
// seeds) in registers, B (QROWS seeds x DH) a shared-memory tile; rows past the example's keys
// are not stored.
template <int DH, int QROWS, typename GT>
__device__ __forceinline__ void attn_pma_key_grad(GT *__restrict__ dst, const float (*x)[4],
                                                  const bf16_t *b, float mul, const AttnRows &r,
                                                  const AttnExample &e, int j0, int col0,
                                                  const int *key_row) {
  enum { OUT_BLOCKS = DH / 8 };
  const int t = threadIdx.x & 3;
  float acc[OUT_BLOCKS][4];
#pragma unroll
  for (int n = 0; n < OUT_BLOCKS; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < QROWS / 16; kk++) {
    unsigned frag_a[4];
    attn_pack_a(frag_a, x, kk);
#pragma unroll
    for (int n2 = 0; n2 < DH / 16; n2++) {
      unsigned frag[4];
      attn_load_b<DH>(frag, b, kk * 16, n2 * 16);
      attn_mma(acc[2 * n2], frag_a, frag);
      attn_mma(acc[2 * n2 + 1], frag_a, frag + 2);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int j = j0 + key_row[half];
    if (j >= e.kv_len) continue;
    GT *at = dst + (e.kv_start + j) * r.d + col0 + 2 * t;
#pragma unroll
    for (int n = 0; n < OUT_BLOCKS; n++)
      attn_store2(at + n * 8, acc[n][2 * half] * mul, acc[n][2 * half + 1] * mul);
  }
}

template <int DH, int ACT, int QROWS, typename DQT, typename GT, typename QT>
__device__ __forceinline__ void attn_backward_pma(DQT *__restrict__ out, GT *__restrict__ dk,
                                                  GT *__restrict__ dv,
                                                  const QT *__restrict__ q,
                                                  const bf16_t *__restrict__ k,
                                                  const bf16_t *__restrict__ v,
                                                  const bf16_t *__restrict__ dout,
                                                  const AttnRows &r, i64 batch,
                                                  const float *__restrict__ stats, int chunks) {
  typedef AttnPmaShape<DH, QROWS> Shape;
  enum { KEYS = Shape::KEYS, THREADS = 128, SCORE_BLOCKS = QROWS / 8, DQ_BLOCKS = Shape::COLS / 8 };
  static_assert(QROWS == 16 || QROWS == 32 || QROWS == 64, "QROWS: 16, 32 or 64 seed rows");
  static_assert(Shape::COLS % 16 == 0, "each warp's dQ columns: a multiple of 16");
  extern __shared__ __align__(128) unsigned char attn_smem[];
  bf16_t *tile_q = (bf16_t *)attn_smem;
  bf16_t *tile_do = tile_q + QROWS * DH;   // two buffers, by example
  bf16_t *tile_k = tile_do + 2 * QROWS * DH;  // two stages
  bf16_t *tile_v = tile_k + 2 * KEYS * DH;    // two stages
  bf16_t *tile_ds = tile_v + 2 * KEYS * DH;   // dS (seeds x keys), row-major, swizzled

  const int heads = r.d / DH;
  const int chunk = (int)(blockIdx.x / heads), h = (int)(blockIdx.x % heads), col0 = h * DH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rb = warp % Shape::ROW_BLOCKS, cg = warp / Shape::ROW_BLOCKS;
  const i64 total = attn_kv_begin(r, batch);
  const i64 lo = total * chunk / chunks, hi = total * (chunk + 1) / chunks;

  attn_load_tile<QROWS, DH, THREADS>(tile_q, q, 0, 0, r.q_fixed, r.d, col0);
  AttnPmaItem cur = attn_pma_first(r, batch, lo);
  bool have = cur.b < batch && attn_kv_begin(r, cur.b) + cur.j0 < hi;
  int do_buf = 0;
  if (have) {
    const AttnExample e = attn_example(r, cur.b);
    attn_load_tile<KEYS, DH, THREADS>(tile_k, k, e.kv_start, cur.j0, e.kv_len, r.d, col0);
    attn_load_tile<KEYS, DH, THREADS>(tile_v, v, e.kv_start, cur.j0, e.kv_len, r.d, col0);
    attn_load_tile<QROWS, DH, THREADS>(tile_do, dout, e.o_start, 0, e.q_len, r.d, col0);
    attn_cp_async_commit();
  }

  float acc_dq[DQ_BLOCKS][4];
#pragma unroll
  for (int n = 0; n < DQ_BLOCKS; n++) acc_dq[n][0] = acc_dq[n][1] = acc_dq[n][2] = acc_dq[n][3] = 0.0f;

  for (int it = 0; have; it++) {
    const AttnExample e = attn_example(r, cur.b);
    const int j0 = cur.j0;
    AttnPmaItem next = {cur.b, cur.j0 + KEYS};
    attn_pma_settle(r, batch, next);
    const bool have_next = next.b < batch && attn_kv_begin(r, next.b) + next.j0 < hi;
    if (have_next) {  // the next tile (and the next example's dO) under this one
      const AttnExample en = attn_example(r, next.b);
      const int stage = (it + 1) & 1;
      attn_load_tile<KEYS, DH, THREADS>(tile_k + stage * KEYS * DH, k, en.kv_start, next.j0,
                                        en.kv_len, r.d, col0);
      attn_load_tile<KEYS, DH, THREADS>(tile_v + stage * KEYS * DH, v, en.kv_start, next.j0,
                                        en.kv_len, r.d, col0);
      if (next.b != cur.b)
        attn_load_tile<QROWS, DH, THREADS>(tile_do + (do_buf ^ 1) * QROWS * DH, dout, en.o_start,
                                           0, en.q_len, r.d, col0);
      attn_cp_async_commit();
      attn_cp_async_wait<1>();
    } else {
      attn_cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t *stage_k = tile_k + (it & 1) * KEYS * DH;
    const bf16_t *stage_v = tile_v + (it & 1) * KEYS * DH;
    const bf16_t *stage_do = tile_do + do_buf * QROWS * DH;

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's 16 keys and the seeds; then Pᵀ and dSᵀ.
    float s[SCORE_BLOCKS][4], dp[SCORE_BLOCKS][4];
    attn_two_products<DH, SCORE_BLOCKS>(s, dp, stage_k, stage_v, tile_q, stage_do, warp);
    const int key_row[2] = {warp * 16 + g, warp * 16 + g + 8};  // within the tile
#pragma unroll
    for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int i = n * 8 + 2 * t + (c & 1), j = j0 + key_row[c >> 1];
        const bool valid = i < e.q_len && j < e.kv_len && attn_visible(r, i, j);
        float2 stat = make_float2(0.0f, 0.0f);
        if (ACT == ATTN_ACT_SOFTMAX && valid)
          stat = *(const float2 *)(stats + ((e.o_start + i) * heads + h) * 2);
        attn_grad_element<ACT>(r, s[n][c], dp[n][c], valid, stat, &s[n][c], &dp[n][c]);
        tile_ds[attn_smem_index<KEYS>(i, key_row[c >> 1])] =
            (bf16_t)(attn_pack_bf16(dp[n][c], 0.0f) & 0xffffu);
      }

    // dV = Pᵀ·dO and dK = scale·dSᵀ·Q over the seeds: whole for these keys, stored now.
    if (dv) attn_pma_key_grad<DH, QROWS>(dv, s, stage_do, 1.0f, r, e, j0, col0, key_row);
    if (dk) attn_pma_key_grad<DH, QROWS>(dk, dp, tile_q, r.scale, r, e, j0, col0, key_row);
    __syncthreads();  // dS whole in shared memory

    // dQ += dS·K: this warp's 16 seed rows (block rb) and COLS columns (group cg).
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; kk++) {
      unsigned frag_ds[4];
      attn_load_a<KEYS>(frag_ds, tile_ds, rb * 16, kk * 16);
#pragma unroll
      for (int n2 = 0; n2 < DQ_BLOCKS / 2; n2++) {
        unsigned frag[4];
        attn_load_b<DH>(frag, stage_k, kk * 16, cg * Shape::COLS + n2 * 16);
        attn_mma(acc_dq[2 * n2], frag_ds, frag);
        attn_mma(acc_dq[2 * n2 + 1], frag_ds, frag + 2);
      }
    }
    __syncthreads();  // this stage, dO buffer and dS tile are free for the next loads
    if (have_next && next.b != cur.b) do_buf ^= 1;
    cur = next;
    have = have_next;
  }

  // Every seed row of the chunk, for this head's columns.
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int i = rb * 16 + g + 8 * half;
    if (i >= r.q_fixed) continue;
    DQT *at = out + ((i64)chunk * r.q_fixed + i) * r.d + col0 + cg * Shape::COLS + 2 * t;
#pragma unroll
    for (int n = 0; n < DQ_BLOCKS; n++) {
      attn_store1(at + n * 8, acc_dq[n][2 * half] * r.scale);
      attn_store1(at + n * 8 + 1, acc_dq[n][2 * half + 1] * r.scale);
    }
  }
}

#endif
