// attention_forward.cuh: the forward GDPA kernel body, jagged flash attention on mma.sync.
// One block computes one (example, query tile, head) from the tile list: WARPS warps of MW×16
// query rows each (a K or V fragment read from shared memory serves MW row blocks); K and V
// stream through shared memory in ATTN_TILE_KV-key tiles, double buffered with cp.async.
// Softmax runs online (running max and sum per row, in log2 units); a pointwise activation
// needs no running state: O += act(scale·S)·M·V directly.
// With `stats` set the kernel is the softmax backward's preparation instead: it writes, per
// output row and head, the row's log2-sum-exp and D = rowsum(dO ⊙ O), and no output.
// defines: attn_forward
#ifndef GEMC_ATTENTION_FORWARD_CUH
#define GEMC_ATTENTION_FORWARD_CUH

template <int DH, int ACT, int WARPS, int MW, typename QT, typename OT>
__device__ __forceinline__ void attn_forward(OT *__restrict__ out, const QT *__restrict__ q,
                                             const bf16_t *__restrict__ k,
                                             const bf16_t *__restrict__ v, const AttnRows &r,
                                             const int *__restrict__ tiles,
                                             float *__restrict__ stats,
                                             const bf16_t *__restrict__ dout) {
  enum {
    TILE_Q = 16 * MW * WARPS,  // each warp owns MW blocks of 16 query rows
    THREADS = 32 * WARPS,
    KSTEPS = DH / 16,          // k-steps of S = Q·Kᵀ
    SCORE_BLOCKS = ATTN_TILE_KV / 8,
    OUT_BLOCKS = DH / 8,
    SOFTMAX = ACT == ATTN_ACT_SOFTMAX,
  };
  extern __shared__ __align__(128) unsigned char attn_smem[];
  bf16_t *tile_q = (bf16_t *)attn_smem;
  bf16_t *tile_k = tile_q + TILE_Q * DH;           // two stages
  bf16_t *tile_v = tile_k + 2 * ATTN_TILE_KV * DH;  // two stages

  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, heads = r.d / DH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int nq = e.q_len - i0 < TILE_Q ? e.q_len - i0 : TILE_Q;
  int jlo, jhi;
  attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
  const int nkv = (jhi - jlo + ATTN_TILE_KV - 1) / ATTN_TILE_KV;

  attn_load_tile<TILE_Q, DH, THREADS>(tile_q, q, e.q_start, i0, e.q_len, r.d, col0);
  if (nkv > 0) {
    attn_load_tile<ATTN_TILE_KV, DH, THREADS>(tile_k, k, e.kv_start, jlo, e.kv_len, r.d, col0);
    attn_load_tile<ATTN_TILE_KV, DH, THREADS>(tile_v, v, e.kv_start, jlo, e.kv_len, r.d, col0);
  }
  attn_cp_async_commit();

  float acc_o[MW][OUT_BLOCKS][4];
  float row_max[MW][2], row_sum[MW][2];
  int row[MW][2];  // query rows (within the example) of this thread's accumulator halves
#pragma unroll
  for (int m = 0; m < MW; m++) {
#pragma unroll
    for (int n = 0; n < OUT_BLOCKS; n++)
      acc_o[m][n][0] = acc_o[m][n][1] = acc_o[m][n][2] = acc_o[m][n][3] = 0.0f;
    row_max[m][0] = row_max[m][1] = -ATTN_INF;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
    row[m][0] = i0 + (warp * MW + m) * 16 + g;
    row[m][1] = row[m][0] + 8;
  }
  const float scale_log2 = r.scale * ATTN_LOG2E;

  for (int it = 0; it < nkv; it++) {
    const int j0 = jlo + it * ATTN_TILE_KV;
    if (it + 1 < nkv) {
      const int stage = (it + 1) & 1;
      attn_load_tile<ATTN_TILE_KV, DH, THREADS>(tile_k + stage * ATTN_TILE_KV * DH, k, e.kv_start,
                                                j0 + ATTN_TILE_KV, e.kv_len, r.d, col0);
      attn_load_tile<ATTN_TILE_KV, DH, THREADS>(tile_v + stage * ATTN_TILE_KV * DH, v, e.kv_start,
                                                j0 + ATTN_TILE_KV, e.kv_len, r.d, col0);
      attn_cp_async_commit();
      attn_cp_async_wait<1>();
    } else {
      attn_cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t *stage_k = tile_k + (it & 1) * ATTN_TILE_KV * DH;
    const bf16_t *stage_v = tile_v + (it & 1) * ATTN_TILE_KV * DH;

    // S = Q·Kᵀ for this warp's rows and the tile's keys: each K fragment serves MW row blocks.
    float s[MW][SCORE_BLOCKS][4];
#pragma unroll
    for (int m = 0; m < MW; m++)
#pragma unroll
      for (int n = 0; n < SCORE_BLOCKS; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
      unsigned frag_q[MW][4];
#pragma unroll
      for (int m = 0; m < MW; m++) attn_load_a<DH>(frag_q[m], tile_q, (warp * MW + m) * 16, kk * 16);
#pragma unroll
      for (int n2 = 0; n2 < SCORE_BLOCKS / 2; n2++) {
        unsigned frag_k[4];
        attn_load_bt<DH>(frag_k, stage_k, n2 * 16, kk * 16);
#pragma unroll
        for (int m = 0; m < MW; m++) {
          attn_mma(s[m][2 * n2], frag_q[m], frag_k);
          attn_mma(s[m][2 * n2 + 1], frag_q[m], frag_k + 2);
        }
      }
    }

    // S -> P: mask, activation (or online softmax).
    const bool edge = j0 + ATTN_TILE_KV > e.kv_len || r.causal || r.window > 0;
#pragma unroll
    for (int m = 0; m < MW; m++) {
      if (SOFTMAX) {
        float tile_max[2] = {-ATTN_INF, -ATTN_INF};
#pragma unroll
        for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            float x = s[m][n][c] * scale_log2;
            if (edge) {
              int j = j0 + n * 8 + 2 * t + (c & 1);
              if (j >= e.kv_len || !attn_visible(r, row[m][c >> 1], j)) x = -ATTN_INF;
            }
            s[m][n][c] = x;
            tile_max[c >> 1] = fmaxf(tile_max[c >> 1], x);
          }
#pragma unroll
        for (int half = 0; half < 2; half++) {
          float mx = tile_max[half];
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          float m_new = fmaxf(row_max[m][half], mx);
          float m_use = m_new == -ATTN_INF ? 0.0f : m_new;
          float correction = exp2f(row_max[m][half] - m_use);
          row_max[m][half] = m_new;
          row_sum[m][half] *= correction;
#pragma unroll
          for (int n = 0; n < OUT_BLOCKS; n++) {
            acc_o[m][n][2 * half] *= correction;
            acc_o[m][n][2 * half + 1] *= correction;
          }
#pragma unroll
          for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
            for (int c = 2 * half; c < 2 * half + 2; c++) {
              float p = exp2f(s[m][n][c] - m_use);
              s[m][n][c] = p;
              row_sum[m][half] += p;
            }
        }
      } else {
#pragma unroll
        for (int n = 0; n < SCORE_BLOCKS; n++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            float p = attn_act_p_tc<ACT>(r, s[m][n][c]);
            if (edge) {
              int j = j0 + n * 8 + 2 * t + (c & 1);
              if (j >= e.kv_len || !attn_visible(r, row[m][c >> 1], j)) p = 0.0f;
            }
            s[m][n][c] = p;
          }
      }
    }

    // O += P·V: P goes from accumulator fragments straight to A fragments, in bf16; each V
    // fragment serves MW row blocks.
#pragma unroll
    for (int kk = 0; kk < ATTN_TILE_KV / 16; kk++) {
      unsigned frag_p[MW][4];
#pragma unroll
      for (int m = 0; m < MW; m++) attn_pack_a(frag_p[m], s[m], kk);
#pragma unroll
      for (int n2 = 0; n2 < DH / 16; n2++) {
        unsigned frag_v[4];
        attn_load_b<DH>(frag_v, stage_v, kk * 16, n2 * 16);
#pragma unroll
        for (int m = 0; m < MW; m++) {
          attn_mma(acc_o[m][2 * n2], frag_p[m], frag_v);
          attn_mma(acc_o[m][2 * n2 + 1], frag_p[m], frag_v + 2);
        }
      }
    }
    __syncthreads();
  }
  attn_cp_async_wait<0>();

#pragma unroll
  for (int m = 0; m < MW; m++) {
    float lse2[2] = {ATTN_INF, ATTN_INF};
    if (SOFTMAX) {
#pragma unroll
      for (int half = 0; half < 2; half++) {
        float sum = row_sum[m][half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that sees no key is 0, never NaN
        if (sum > 0.0f) lse2[half] = row_max[m][half] + __log2f(sum);
#pragma unroll
        for (int n = 0; n < OUT_BLOCKS; n++) {
          acc_o[m][n][2 * half] *= inv;
          acc_o[m][n][2 * half + 1] *= inv;
        }
      }
    }

    if (stats) {  // softmax backward preparation: log2-sum-exp and D = rowsum(dO ⊙ O)
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const int i = row[m][half];
        float dot = 0.0f;
        if (i < e.q_len) {
          const bf16_t *grad = dout + (e.o_start + i) * r.d + col0 + 2 * t;
#pragma unroll
          for (int n = 0; n < OUT_BLOCKS; n++) {
            unsigned pair = *(const unsigned *)(grad + n * 8);
            dot += acc_o[m][n][2 * half] * attn_bf16_to_float((bf16_t)(pair & 0xffffu)) +
                   acc_o[m][n][2 * half + 1] * attn_bf16_to_float((bf16_t)(pair >> 16));
          }
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        if (i < e.q_len && t == 0) {
          float *at = stats + ((e.o_start + i) * heads + h) * 2;
          at[0] = lse2[half];
          at[1] = dot;
        }
      }
      continue;
    }

#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int i = row[m][half];
      if (i >= e.q_len) continue;
      OT *dst = out + (e.o_start + i) * r.d + col0 + 2 * t;
#pragma unroll
      for (int n = 0; n < OUT_BLOCKS; n++)
        attn_store2(dst + n * 8, acc_o[m][n][2 * half], acc_o[m][n][2 * half + 1]);
    }
  }
}

#endif
