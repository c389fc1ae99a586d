// attention_simt.cuh: GDPA for nodes the tensor-core kernels do not take (fp32 and fp16
// storage): plain fp32 arithmetic, one thread per query row (forward, dQ) or per key row
// (dK/dV), keys or queries staged through shared memory 64 rows at a time. Same tile lists,
// arguments and workspaces as the mma.sync kernels; written for correctness, not speed (the
// fp32 models are the small ones). Softmax statistics here are natural-log: {lse, D}.
// defines: attn_forward_simt, attn_backward_kv_simt, attn_backward_q_simt
#ifndef GEMC_ATTENTION_SIMT_CUH
#define GEMC_ATTENTION_SIMT_CUH

enum { ATTN_SIMT_ROWS = 64 };

// Stages rows [row0, row0 + 64) of one head into sh[64][DH] as floats (zeros past len).
template <int DH, typename T>
__device__ __forceinline__ void attn_stage_rows(float *sh, const T *base, i64 start, int row0,
                                                int len, int ld, int col0) {
  for (int c = threadIdx.x; c < ATTN_SIMT_ROWS * DH; c += ATTN_SIMT_ROWS) {
    int rr = c / DH, cc = c % DH;
    sh[c] = row0 + rr < len ? attn_to_float(base[(start + row0 + rr) * ld + col0 + cc]) : 0.0f;
  }
}

template <int DH, int ACT, typename QT, typename T, typename OT>
__device__ __forceinline__ void attn_forward_simt(OT *__restrict__ out, const QT *__restrict__ q,
                                                  const T *__restrict__ k, const T *__restrict__ v,
                                                  const AttnRows &r, const int *__restrict__ tiles,
                                                  float *__restrict__ stats,
                                                  const T *__restrict__ dout) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_k = (float *)attn_smem, *tile_v = tile_k + ATTN_SIMT_ROWS * DH;
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, heads = r.d / DH, i = i0 + threadIdx.x;
  const bool active = i < e.q_len;
  const int nq = e.q_len - i0 < ATTN_SIMT_ROWS ? e.q_len - i0 : ATTN_SIMT_ROWS;
  int jlo, jhi;
  attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
  float qr[DH], acc[DH];
  for (int c = 0; c < DH; c++) {
    qr[c] = active ? attn_to_float(q[(e.q_start + i) * r.d + col0 + c]) : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -ATTN_INF, l = 0.0f;
  for (int j0 = jlo; j0 < jhi; j0 += ATTN_SIMT_ROWS) {
    __syncthreads();
    attn_stage_rows<DH>(tile_k, k, e.kv_start, j0, e.kv_len, r.d, col0);
    attn_stage_rows<DH>(tile_v, v, e.kv_start, j0, e.kv_len, r.d, col0);
    __syncthreads();
    if (!active) continue;
    for (int jj = 0; jj < ATTN_SIMT_ROWS && j0 + jj < jhi; jj++) {
      if (!attn_visible(r, i, j0 + jj)) continue;
      const float *kr = tile_k + jj * DH, *vr = tile_v + jj * DH;
      float s = 0.0f;
      for (int c = 0; c < DH; c++) s += qr[c] * kr[c];
      s *= r.scale;
      float p;
      if (ACT == ATTN_ACT_SOFTMAX) {
        if (s > m) {
          float correction = expf(m - s);  // 0 while m is -inf
          l *= correction;
          for (int c = 0; c < DH; c++) acc[c] *= correction;
          m = s;
        }
        p = expf(s - m);
        l += p;
      } else {
        p = attn_act<ACT>(s) * r.inv_norm;
      }
      for (int c = 0; c < DH; c++) acc[c] += p * vr[c];
    }
  }
  if (!active) return;
  float lse = ATTN_INF;
  if (ACT == ATTN_ACT_SOFTMAX) {
    float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row that sees no key is 0, never NaN
    if (l > 0.0f) lse = m + logf(l);
    for (int c = 0; c < DH; c++) acc[c] *= inv;
  }
  if (stats) {  // softmax backward preparation
    float dot = 0.0f;
    for (int c = 0; c < DH; c++) dot += acc[c] * attn_to_float(dout[(e.o_start + i) * r.d + col0 + c]);
    float *at = stats + ((e.o_start + i) * heads + h) * 2;
    at[0] = lse;
    at[1] = dot;
    return;
  }
  for (int c = 0; c < DH; c++) attn_store1(out + (e.o_start + i) * r.d + col0 + c, acc[c]);
}

// P and dS from s = scale·(q·k) and dp = dO·v, for a visible pair; stat = {lse, D}.
template <int ACT>
__device__ __forceinline__ void attn_simt_grad(const AttnRows &r, float s, float dp, float2 stat,
                                               float *p, float *ds) {
  if (ACT == ATTN_ACT_SOFTMAX) {
    *p = expf(s - stat.x);
    *ds = *p * (dp - stat.y);
  } else {
    *p = attn_act<ACT>(s) * r.inv_norm;
    *ds = dp * attn_act_grad<ACT>(s) * r.inv_norm;
  }
}

template <int DH, int ACT, typename QT, typename T, typename GT>
__device__ __forceinline__ void attn_backward_kv_simt(GT *__restrict__ dk, GT *__restrict__ dv,
                                                      const QT *__restrict__ q,
                                                      const T *__restrict__ k,
                                                      const T *__restrict__ v,
                                                      const T *__restrict__ dout, const AttnRows &r,
                                                      const int *__restrict__ tiles,
                                                      const float *__restrict__ stats) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_q = (float *)attn_smem, *tile_do = tile_q + ATTN_SIMT_ROWS * DH;
  float2 *tile_stat = (float2 *)(tile_do + ATTN_SIMT_ROWS * DH);
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], j0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, heads = r.d / DH, j = j0 + threadIdx.x;
  const bool active = j < e.kv_len;
  const int nk = e.kv_len - j0 < ATTN_SIMT_ROWS ? e.kv_len - j0 : ATTN_SIMT_ROWS;
  int qlo, qhi;
  attn_query_range(r, j0, j0 + nk, e.q_len, &qlo, &qhi);
  float kr[DH], vr[DH], acc_dk[DH], acc_dv[DH];
  for (int c = 0; c < DH; c++) {
    kr[c] = active ? attn_to_float(k[(e.kv_start + j) * r.d + col0 + c]) : 0.0f;
    vr[c] = active ? attn_to_float(v[(e.kv_start + j) * r.d + col0 + c]) : 0.0f;
    acc_dk[c] = acc_dv[c] = 0.0f;
  }
  for (int i0 = qlo; i0 < qhi; i0 += ATTN_SIMT_ROWS) {
    __syncthreads();
    attn_stage_rows<DH>(tile_q, q, e.q_start, i0, e.q_len, r.d, col0);
    attn_stage_rows<DH>(tile_do, dout, e.o_start, i0, e.q_len, r.d, col0);
    if (ACT == ATTN_ACT_SOFTMAX) {
      int i = i0 + threadIdx.x;
      tile_stat[threadIdx.x] = i < e.q_len ? *(const float2 *)(stats + ((e.o_start + i) * heads + h) * 2)
                                           : make_float2(0.0f, 0.0f);
    }
    __syncthreads();
    if (!active) continue;
    for (int ii = 0; ii < ATTN_SIMT_ROWS && i0 + ii < qhi; ii++) {
      if (!attn_visible(r, i0 + ii, j)) continue;
      const float *qi = tile_q + ii * DH, *doi = tile_do + ii * DH;
      float s = 0.0f, dp = 0.0f;
      for (int c = 0; c < DH; c++) {
        s += qi[c] * kr[c];
        dp += doi[c] * vr[c];
      }
      float p, ds;
      attn_simt_grad<ACT>(r, s * r.scale, dp, tile_stat[ii], &p, &ds);
      for (int c = 0; c < DH; c++) {
        acc_dv[c] += p * doi[c];
        acc_dk[c] += ds * qi[c];
      }
    }
  }
  if (!active) return;
  const i64 at = (e.kv_start + j) * r.d + col0;
  for (int c = 0; c < DH; c++) {
    if (dk) attn_store1(dk + at + c, acc_dk[c] * r.scale);
    if (dv) attn_store1(dv + at + c, acc_dv[c]);
  }
}

template <int DH, int ACT, typename QT, typename T, typename GT>
__device__ __forceinline__ void attn_backward_q_simt(GT *__restrict__ dq, i64 batch,
                                                     const QT *__restrict__ q,
                                                     const T *__restrict__ k,
                                                     const T *__restrict__ v,
                                                     const T *__restrict__ dout, const AttnRows &r,
                                                     const int *__restrict__ tiles,
                                                     const float *__restrict__ stats) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_k = (float *)attn_smem, *tile_v = tile_k + ATTN_SIMT_ROWS * DH;
  const int heads = r.d / DH;
  int b_first, b_end, i0, h, chunk;  // PMA (no tile list): every example, in order
  attn_query_block(tiles, batch, ATTN_SIMT_ROWS, heads, 1, r.kv_off, &b_first, &b_end, &i0, &h,
                   &chunk);
  const int col0 = h * DH, i = i0 + threadIdx.x;
  float acc[DH];
  for (int c = 0; c < DH; c++) acc[c] = 0.0f;
  i64 q_start = 0;
  int q_len = 0;
  for (int b = b_first; b < b_end; b++) {
    const AttnExample e = attn_example(r, b);
    q_start = e.q_start, q_len = e.q_len;
    if (i0 >= e.q_len) continue;
    const bool active = i < e.q_len;
    const int nq = e.q_len - i0 < ATTN_SIMT_ROWS ? e.q_len - i0 : ATTN_SIMT_ROWS;
    int jlo, jhi;
    attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
    float qr[DH], dor[DH];
    for (int c = 0; c < DH; c++) {
      qr[c] = active ? attn_to_float(q[(e.q_start + i) * r.d + col0 + c]) : 0.0f;
      dor[c] = active ? attn_to_float(dout[(e.o_start + i) * r.d + col0 + c]) : 0.0f;
    }
    float2 stat = make_float2(0.0f, 0.0f);
    if (ACT == ATTN_ACT_SOFTMAX && active)
      stat = *(const float2 *)(stats + ((e.o_start + i) * heads + h) * 2);
    for (int j0 = jlo; j0 < jhi; j0 += ATTN_SIMT_ROWS) {
      __syncthreads();
      attn_stage_rows<DH>(tile_k, k, e.kv_start, j0, e.kv_len, r.d, col0);
      attn_stage_rows<DH>(tile_v, v, e.kv_start, j0, e.kv_len, r.d, col0);
      __syncthreads();
      if (!active) continue;
      for (int jj = 0; jj < ATTN_SIMT_ROWS && j0 + jj < jhi; jj++) {
        if (!attn_visible(r, i, j0 + jj)) continue;
        const float *kj = tile_k + jj * DH, *vj = tile_v + jj * DH;
        float s = 0.0f, dp = 0.0f;
        for (int c = 0; c < DH; c++) {
          s += qr[c] * kj[c];
          dp += dor[c] * vj[c];
        }
        float p, ds;
        attn_simt_grad<ACT>(r, s * r.scale, dp, stat, &p, &ds);
        for (int c = 0; c < DH; c++) acc[c] += ds * kj[c];
      }
    }
  }
  if (i >= q_len) return;
  for (int c = 0; c < DH; c++) attn_store1(dq + (q_start + i) * r.d + col0 + c, acc[c] * r.scale);
}

#endif
