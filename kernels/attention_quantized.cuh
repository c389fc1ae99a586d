// attention_quantized.cuh: GDPA at fp8 and mxfp8, computing exactly what the CPU executor
// emulates (runtime/cpu/cpu_attention_real.h; the rules are docs/executor.md, "Quantized matmuls"):
//   - the tensor operands are quantized first, into fp32 copies that hold the dequantized
//     values: Q, K, V and dO along each head's dh features (for S = Q·Kᵀ and dP = dO·Vᵀ), and
//     V, K, Q and dO down each column of one example's rows (for O = P·V, dQ = dS·K,
//     dK = dSᵀ·Q and dV = Pᵀ·dO). fp8 gives a whole tensor one scale (amax / 448), so both
//     copies are the same and one is made;
//   - P and dS are quantized as they are formed: mxfp8 in blocks of 32 along the reduction,
//     aligned to the sequence's first row; fp8 with one scale per vector along the reduction
//     (a row of P or dS for the forward pass and dQ, a column for dK and dV), which costs an
//     extra sweep to find the vector's amax first.
// The arithmetic is fp32, activations in double as numerics.c evaluates them, softmax in the
// CPU's order (max, then the sum of exp(s - max) key by key, then one reciprocal). One thread
// per query row (forward, dQ, softmax statistics) or per key row (dK, dV), 64 rows per block,
// the other side staged through shared memory 64 rows at a time. These kernels are written
// to match, not for speed: the FP8 tensor-core path is a later issue (docs/attention.md).
// Needs the prelude (e4m3_round, mx_block_exponent, act_*) and attention.cuh (AttnRows).
// defines: attnq_amax, attnq_quantize_fp8, attnq_quantize_heads_mx, attnq_quantize_rows_mx,
//          attnq_forward, attnq_backward_stats, attnq_backward_q, attnq_backward_kv
#ifndef GEMC_ATTENTION_QUANTIZED_CUH
#define GEMC_ATTENTION_QUANTIZED_CUH

enum { ATTNQ_ROWS = 64, ATTNQ_BLOCK = 32 };

#define ATTNQ_FLT_MAX 3.402823466e38f

// ---------------------------------------------------------------------------------------------
// Quantizing the tensor operands

// |x| when finite, else 0: the amax of numerics.c ignores inf and NaN.
__device__ __forceinline__ float attnq_finite_abs(float x) {
  float a = fabsf(x);
  return a <= ATTNQ_FLT_MAX ? a : 0.0f;
}

// fp8, first pass: the largest finite |x| of the tensor, as the bits of a non-negative float
// (an integer atomicMax orders those as the floats: the result does not depend on the order).
// *amax_bits must be 0 before the launch.
template <typename T>
__device__ __forceinline__ void attnq_amax(unsigned *__restrict__ amax_bits, const T *__restrict__ x,
                                           i64 n) {
  float m = 0.0f;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (i64)gridDim.x * blockDim.x)
    m = fmaxf(m, attnq_finite_abs(attn_to_float(x[i])));
  m = warp_max(m);
  if (threadIdx.x % WARP_SIZE == 0 && m > 0.0f) atomicMax(amax_bits, __float_as_uint(m));
}

// The per-tensor fp8 scale of numerics.c: amax / 448, or 1 when that is not positive.
__device__ __forceinline__ float attnq_fp8_scale(float amax) {
  float s = __fdiv_rn(amax, 448.0f);
  return s > 0.0f ? s : 1.0f;
}

__device__ __forceinline__ float attnq_fp8(float x, float scale) {
  return e4m3_round(__fdiv_rn(x, scale)) * scale;
}

// fp8, second pass: out[i] = e4m3(x[i] / scale) * scale, one thread per element.
template <typename T>
__device__ __forceinline__ void attnq_quantize_fp8(float *__restrict__ out, const T *__restrict__ x,
                                                   i64 n, const unsigned *__restrict__ amax_bits) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = attnq_fp8(attn_to_float(x[i]), attnq_fp8_scale(__uint_as_float(*amax_bits)));
}

// One mxfp8 block of n values at x[0], x[stride], ... (n <= 32), quantized in place.
__device__ __forceinline__ void attnq_mx_block(float *v, int n, int stride) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = fmaxf(amax, attnq_finite_abs(v[i * stride]));
  int e = mx_block_exponent(amax);
  float inv = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);
  for (int i = 0; i < n; i++) v[i * stride] = e4m3_round(v[i * stride] * inv) * scale;
}

// mxfp8 along each head's features: a warp per (row, head, block of 32 of dh), a lane per
// feature, so that a warp reads 32 adjacent values; the block's amax by a butterfly (a max:
// the same bits as the executor's loop).
// A head of at most 32 features that divide 32 (16, 8, ...) is one block, and DH adjacent lanes
// take it: a thread per element, no lane idle.
template <int DH, typename T>
__device__ __forceinline__ void attnq_quantize_heads_mx(float *__restrict__ out, const T *__restrict__ x,
                                                        i64 rows, int d) {
  enum { BLOCKS = (DH + ATTNQ_BLOCK - 1) / ATTNQ_BLOCK, PACKED = DH < WARP_SIZE && WARP_SIZE % DH == 0 };
  if (PACKED) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const bool mine = i < rows * d;
    const float v = mine ? attn_to_float(x[i]) : 0.0f;
    float amax = attnq_finite_abs(v);
    for (int off = DH / 2; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const int e = mx_block_exponent(amax);
    if (mine) out[i] = e4m3_round(v * ldexpf(1.0f, -e)) * ldexpf(1.0f, e);
    return;
  }
  const int heads = d / DH;
  i64 t = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const bool block_ok = t < rows * heads * BLOCKS;
  i64 row = t / (heads * BLOCKS);
  int rest = (int)(t % (heads * BLOCKS)), h = rest / BLOCKS, blk = rest % BLOCKS;
  int c = blk * ATTNQ_BLOCK + lane;
  const bool mine = block_ok && c < DH;
  const i64 at = row * d + h * DH + c;
  float v = mine ? attn_to_float(x[at]) : 0.0f;
  float amax = warp_max(attnq_finite_abs(v));
  int e = mx_block_exponent(amax);
  if (mine) out[at] = e4m3_round(v * ldexpf(1.0f, -e)) * ldexpf(1.0f, e);
}

// Which rows of an example a rows-quantized copy covers.
enum { ATTNQ_KV_ROWS = 0, ATTNQ_Q_ROWS = 1, ATTNQ_OUT_ROWS = 2 };

// mxfp8 down each column of one example's rows (blocks of 32 from its first row): one thread
// per (example, block of 32 rows, column), over `blocks` blocks per example (the longest
// example's); a block past its example's end returns at once. PMA's seeds (q rows, shared)
// are one example, done once.
template <typename T>
__device__ __forceinline__ void attnq_quantize_rows_mx(float *__restrict__ out, const T *__restrict__ x,
                                                       const AttnRows &r, int side, i64 batch,
                                                       int blocks) {
  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 examples = side == ATTNQ_Q_ROWS && r.q_shared ? 1 : batch;
  if (t >= examples * blocks * r.d) return;
  const int b = (int)(t / ((i64)blocks * r.d)), rest = (int)(t % ((i64)blocks * r.d));
  const int r0 = rest / r.d * ATTNQ_BLOCK, c = rest % r.d;
  const AttnExample e = attn_example(r, b);
  i64 start = side == ATTNQ_KV_ROWS ? e.kv_start : side == ATTNQ_Q_ROWS ? e.q_start : e.o_start;
  int len = side == ATTNQ_KV_ROWS ? e.kv_len : e.q_len;
  if (r0 >= len) return;
  int n = len - r0 < ATTNQ_BLOCK ? len - r0 : ATTNQ_BLOCK;
  float v[ATTNQ_BLOCK];
  for (int i = 0; i < n; i++) v[i] = attn_to_float(x[(start + r0 + i) * r.d + c]);
  attnq_mx_block(v, n, 1);
  for (int i = 0; i < n; i++) out[(start + r0 + i) * r.d + c] = v[i];
}

// ---------------------------------------------------------------------------------------------
// Scores and probabilities, as the CPU forms them

template <int ACT> __device__ __forceinline__ double attnq_act(double x) {
  if (ACT == ATTN_ACT_SILU) return act_silu(x);
  if (ACT == ATTN_ACT_GELU) return act_gelu(x);
  if (ACT == ATTN_ACT_GELU_TAYLOR) return act_gelu_taylor(x);
  if (ACT == ATTN_ACT_RELU) return act_relu(x);
  if (ACT == ATTN_ACT_SIGMOID) return act_sigmoid(x);
  return x;
}

template <int ACT> __device__ __forceinline__ double attnq_act_grad(double x) {
  if (ACT == ATTN_ACT_SILU) return act_silu_grad(x);
  if (ACT == ATTN_ACT_GELU) return act_gelu_grad(x);
  if (ACT == ATTN_ACT_GELU_TAYLOR) return act_gelu_taylor_grad(x);
  if (ACT == ATTN_ACT_RELU) return act_relu_grad(x);
  if (ACT == ATTN_ACT_SIGMOID) return act_sigmoid_grad(x);
  return 1.0;
}

template <int DH> __device__ __forceinline__ float attnq_dot(const float *a, const float *b) {
  float s = 0.0f;
  for (int c = 0; c < DH; c++) s += a[c] * b[c];
  return s;
}

// Softmax row statistics in the CPU's order: m = the max score, inv = 1 / sum of exp(s - m).
struct AttnqRow {
  float m, inv, dot;  // dot: sum over keys of dP * P (backward)
};

// P from a score: softmax exp(s - m) * inv (the exponential in double, then fp32), else
// act(s) * inv_norm in double, rounded once.
template <int ACT>
__device__ __forceinline__ float attnq_prob(float s, const AttnqRow &st, double inv_norm) {
  if (ACT == ATTN_ACT_SOFTMAX) return (float)exp((double)(s - st.m)) * st.inv;
  return (float)(attnq_act<ACT>((double)s) * inv_norm);
}

// dS from dP: softmax P (dP - dot); else dP act'(s) inv_norm in double, rounded once.
template <int ACT>
__device__ __forceinline__ float attnq_grad(float s, float p, float dp, const AttnqRow &st,
                                            double inv_norm) {
  if (ACT == ATTN_ACT_SOFTMAX) return p * (dp - st.dot);
  return (float)((double)dp * attnq_act_grad<ACT>((double)s) * inv_norm);
}

// P and dS of one (query, key) pair from the query's and the key's features along the heads.
template <int DH, int ACT>
__device__ __forceinline__ void attnq_pair(const float *q, const float *dout, const float *k,
                                           const float *v, const AttnRows &r, const AttnqRow &st,
                                           double inv_norm, float *p, float *ds) {
  float s = attnq_dot<DH>(q, k) * r.scale;
  *p = attnq_prob<ACT>(s, st, inv_norm);
  *ds = attnq_grad<ACT>(s, *p, attnq_dot<DH>(dout, v), st, inv_norm);
}

// ---------------------------------------------------------------------------------------------
// Sweeps. A thread owns one row (a query, or a key for dK/dV) and goes over the other side's
// rows [lo, hi), 64 at a time: every thread of the block calls a sweep (it synchronizes around
// stage(x0), which fills shared memory with rows [x0, x0 + 64)); seen(x) says whether the
// thread's row sees row x under the mask.

// visit(xx) for each row x0 + xx the thread's row sees, in order (an inactive thread visits none).
template <class Stage, class Seen, class Visit>
__device__ __forceinline__ void attnq_sweep(int lo, int hi, bool active, Stage stage, Seen seen,
                                            Visit visit) {
  for (int x0 = lo; x0 < hi; x0 += ATTNQ_ROWS) {
    __syncthreads();
    stage(x0);
    __syncthreads();
    for (int xx = 0; active && xx < ATTNQ_ROWS && x0 + xx < hi; xx++)
      if (seen(x0 + xx)) visit(xx);
  }
}

// The accumulating sweep of NV quantized vectors (P, or dS, or both): value(xx, v) writes the
// NV values for a seen row x0 + xx (the others are 0); each block of 32 rows, aligned as the
// sequence's, is quantized (mxfp8: one E8M0 scale per block and vector; fp8: the vector's
// fp8_scale[n]); then use(xx, q) gets the NV quantized values of every row.
template <int NV, int MX, class Stage, class Seen, class Value, class Use>
__device__ __forceinline__ void attnq_sweep_quantized(int lo, int hi, bool active,
                                                      const float *fp8_scale, Stage stage,
                                                      Seen seen, Value value, Use use) {
  for (int x0 = lo; x0 < hi; x0 += ATTNQ_ROWS) {
    __syncthreads();
    stage(x0);
    __syncthreads();
    if (!active) continue;
    for (int half = 0; half < ATTNQ_ROWS; half += ATTNQ_BLOCK) {
      float v[NV][ATTNQ_BLOCK];
      for (int xx = 0; xx < ATTNQ_BLOCK; xx++) {
        float got[NV];
        for (int n = 0; n < NV; n++) got[n] = 0.0f;
        int x = x0 + half + xx;
        if (x < hi && seen(x)) value(half + xx, got);
        for (int n = 0; n < NV; n++) v[n][xx] = got[n];
      }
      for (int n = 0; n < NV; n++) {
        if (MX) attnq_mx_block(v[n], ATTNQ_BLOCK, 1);
        else
          for (int xx = 0; xx < ATTNQ_BLOCK; xx++) v[n][xx] = attnq_fp8(v[n][xx], fp8_scale[n]);
      }
      for (int xx = 0; xx < ATTNQ_BLOCK; xx++) {
        float q[NV];
        for (int n = 0; n < NV; n++) q[n] = v[n][xx];
        use(half + xx, q);
      }
    }
  }
}

// The softmax statistics of query row i (its features in registers; dor: dO's, used only
// when with_dot) over keys [jlo, jhi), staging K (and V) through shared memory.
template <int DH, int ACT>
__device__ __forceinline__ AttnqRow attnq_row_stats(const float *qr, const float *dor, bool with_dot,
                                                    const float *__restrict__ kh,
                                                    const float *__restrict__ vh, const AttnRows &r,
                                                    const AttnExample &e, int i, bool active, int jlo,
                                                    int jhi, int col0, float *tile_k, float *tile_v) {
  AttnqRow st = {-ATTN_INF, 0.0f, 0.0f};
  if (ACT != ATTN_ACT_SOFTMAX) return st;
  auto stage_k = [&](int j0) { attn_stage_rows<DH>(tile_k, kh, e.kv_start, j0, e.kv_len, r.d, col0); };
  auto seen = [&](int j) { return attn_visible(r, i, j); };
  auto score = [&](int jj) { return attnq_dot<DH>(qr, tile_k + jj * DH) * r.scale; };
  bool any = false;
  attnq_sweep(jlo, jhi, active, stage_k, seen, [&](int jj) {  // the max
    float s = score(jj);
    st.m = !any || s > st.m ? s : st.m;
    any = true;
  });
  float sum = 0.0f;
  attnq_sweep(jlo, jhi, active, stage_k, seen,  // the sum, key by key
              [&](int jj) { sum += (float)exp((double)(score(jj) - st.m)); });
  st.inv = any ? 1.0f / sum : 0.0f;
  if (!with_dot) return st;
  auto stage_kv = [&](int j0) {
    stage_k(j0);
    attn_stage_rows<DH>(tile_v, vh, e.kv_start, j0, e.kv_len, r.d, col0);
  };
  float dot = 0.0f;
  attnq_sweep(jlo, jhi, active, stage_kv, seen, [&](int jj) {  // sum of dP * P
    float dp = attnq_dot<DH>(dor, tile_v + jj * DH);
    dot += dp * attnq_prob<ACT>(score(jj), st, 1.0);
  });
  st.dot = dot;
  return st;
}

// ---------------------------------------------------------------------------------------------
// Forward: O = quant(P) · V, one thread per query row of a 64-row tile.

template <int DH, int ACT, int MX, typename OT>
__device__ __forceinline__ void attnq_forward(OT *__restrict__ out, const float *__restrict__ qh,
                                              const float *__restrict__ kh,
                                              const float *__restrict__ vr, const AttnRows &r,
                                              double inv_norm, const int *__restrict__ tiles) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_k = (float *)attn_smem, *tile_v = tile_k + ATTNQ_ROWS * DH;
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], i0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, i = i0 + threadIdx.x;
  const bool active = i < e.q_len;
  const int nq = e.q_len - i0 < ATTNQ_ROWS ? e.q_len - i0 : ATTNQ_ROWS;
  int jlo, jhi;
  attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
  float qr[DH], acc[DH];
  for (int c = 0; c < DH; c++) {
    qr[c] = active ? qh[(e.q_start + i) * r.d + col0 + c] : 0.0f;
    acc[c] = 0.0f;
  }
  const AttnqRow st = attnq_row_stats<DH, ACT>(qr, qr, false, kh, kh, r, e, i, active, jlo, jhi,
                                               col0, tile_k, tile_v);
  auto stage_k = [&](int j0) { attn_stage_rows<DH>(tile_k, kh, e.kv_start, j0, e.kv_len, r.d, col0); };
  auto seen = [&](int j) { return attn_visible(r, i, j); };
  auto prob = [&](int jj) { return attnq_prob<ACT>(attnq_dot<DH>(qr, tile_k + jj * DH) * r.scale, st, inv_norm); };
  float row_scale = 1.0f;
  if (!MX) {  // fp8: one scale for the row of P
    float amax = 0.0f;
    attnq_sweep(jlo, jhi, active, stage_k, seen,
                [&](int jj) { amax = fmaxf(amax, attnq_finite_abs(prob(jj))); });
    row_scale = attnq_fp8_scale(amax);
  }
  attnq_sweep_quantized<1, MX>(
      jlo, jhi, active, &row_scale,
      [&](int j0) {
        stage_k(j0);
        attn_stage_rows<DH>(tile_v, vr, e.kv_start, j0, e.kv_len, r.d, col0);
      },
      seen, [&](int jj, float *p) { p[0] = prob(jj); },
      [&](int jj, const float *pq) {
        if (pq[0] == 0.0f) return;
        const float *vj = tile_v + jj * DH;
        for (int c = 0; c < DH; c++) acc[c] += pq[0] * vj[c];
      });
  if (!active) return;
  for (int c = 0; c < DH; c++) attn_store1(out + (e.o_start + i) * r.d + col0 + c, acc[c]);
}

// ---------------------------------------------------------------------------------------------
// Backward

// Softmax statistics {m, inv, dot} of every output row and head, for the dK/dV kernel (which
// goes by key and cannot form a row's statistics itself). One thread per query row; block x
// is (example, 64-row tile, head) over q_tiles tiles per example (the longest example's), and
// a tile past its example's end returns at once.
template <int DH, int ACT>
__device__ __forceinline__ void attnq_backward_stats(float4 *__restrict__ stats, const float *__restrict__ qh,
                                                     const float *__restrict__ kh,
                                                     const float *__restrict__ vh,
                                                     const float *__restrict__ doh, const AttnRows &r,
                                                     int q_tiles) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_k = (float *)attn_smem, *tile_v = tile_k + ATTNQ_ROWS * DH;
  const int heads = r.d / DH;
  const int b = (int)(blockIdx.x / (q_tiles * heads)), h = (int)(blockIdx.x % heads);
  const int i0 = (int)((blockIdx.x / heads) % q_tiles) * ATTNQ_ROWS;
  const AttnExample e = attn_example(r, b);
  if (i0 >= e.q_len) return;
  const int col0 = h * DH, i = i0 + threadIdx.x;
  const bool active = i < e.q_len;
  const int nq = e.q_len - i0 < ATTNQ_ROWS ? e.q_len - i0 : ATTNQ_ROWS;
  int jlo, jhi;
  attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
  float qr[DH], dor[DH];
  for (int c = 0; c < DH; c++) {
    qr[c] = active ? qh[(e.q_start + i) * r.d + col0 + c] : 0.0f;
    dor[c] = active ? doh[(e.o_start + i) * r.d + col0 + c] : 0.0f;
  }
  AttnqRow st = attnq_row_stats<DH, ACT>(qr, dor, true, kh, vh, r, e, i, active, jlo, jhi, col0,
                                         tile_k, tile_v);
  if (active) stats[(e.o_start + i) * heads + h] = make_float4(st.m, st.inv, st.dot, 0.0f);
}

// dQ = scale · quant(dS) · K, one thread per query row; PMA (no tile list) sums the examples
// in order for its shared seeds.
template <int DH, int ACT, int MX, typename GT>
__device__ __forceinline__ void attnq_backward_q(GT *__restrict__ dq, i64 batch,
                                                 const float *__restrict__ qh,
                                                 const float *__restrict__ kh,
                                                 const float *__restrict__ vh,
                                                 const float *__restrict__ doh,
                                                 const float *__restrict__ kr, const AttnRows &r,
                                                 double inv_norm, const int *__restrict__ tiles,
                                                 float *__restrict__ partial = 0,
                                                 int chunks = 1) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_k = (float *)attn_smem, *tile_v = tile_k + ATTNQ_ROWS * DH,
        *tile_kr = tile_v + ATTNQ_ROWS * DH;
  const int heads = r.d / DH;
  int b_first, b_end, i0, h, chunk;  // PMA (no tile list): a range of examples, in order
  attn_query_block(tiles, batch, ATTNQ_ROWS, heads, partial ? chunks : 1, r.kv_off, &b_first,
                   &b_end, &i0, &h, &chunk);
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
    const int nq = e.q_len - i0 < ATTNQ_ROWS ? e.q_len - i0 : ATTNQ_ROWS;
    int jlo, jhi;
    attn_key_range(r, i0, i0 + nq, e.kv_len, &jlo, &jhi);
    float qr[DH], dor[DH];
    for (int c = 0; c < DH; c++) {
      qr[c] = active ? qh[(e.q_start + i) * r.d + col0 + c] : 0.0f;
      dor[c] = active ? doh[(e.o_start + i) * r.d + col0 + c] : 0.0f;
    }
    const AttnqRow st = attnq_row_stats<DH, ACT>(qr, dor, true, kh, vh, r, e, i, active, jlo,
                                                 jhi, col0, tile_k, tile_v);
    auto stage_kv = [&](int j0) {
      attn_stage_rows<DH>(tile_k, kh, e.kv_start, j0, e.kv_len, r.d, col0);
      attn_stage_rows<DH>(tile_v, vh, e.kv_start, j0, e.kv_len, r.d, col0);
    };
    auto seen = [&](int j) { return attn_visible(r, i, j); };
    auto dscore = [&](int jj) {
      float p, ds;
      attnq_pair<DH, ACT>(qr, dor, tile_k + jj * DH, tile_v + jj * DH, r, st, inv_norm, &p, &ds);
      return ds;
    };
    float row_scale = 1.0f;
    if (!MX) {  // fp8: one scale for the row of dS
      float amax = 0.0f;
      attnq_sweep(jlo, jhi, active, stage_kv, seen,
                  [&](int jj) { amax = fmaxf(amax, attnq_finite_abs(dscore(jj))); });
      row_scale = attnq_fp8_scale(amax);
    }
    attnq_sweep_quantized<1, MX>(
        jlo, jhi, active, &row_scale,
        [&](int j0) {
          stage_kv(j0);
          attn_stage_rows<DH>(tile_kr, kr, e.kv_start, j0, e.kv_len, r.d, col0);
        },
        seen, [&](int jj, float *ds) { ds[0] = dscore(jj); },
        [&](int jj, const float *dsq) {
          if (dsq[0] == 0.0f) return;
          const float *kj = tile_kr + jj * DH;
          for (int c = 0; c < DH; c++) acc[c] += dsq[0] * kj[c];
        });
  }
  if (partial) {  // every seed row of the chunk, zeros where its examples added nothing
    if (i >= r.q_fixed) return;
    float *out = partial + ((i64)chunk * r.q_fixed + i) * r.d + col0;
    for (int c = 0; c < DH; c++) out[c] = acc[c] * r.scale;
    return;
  }
  if (i >= q_len) return;
  for (int c = 0; c < DH; c++) attn_store1(dq + (q_start + i) * r.d + col0 + c, acc[c] * r.scale);
}

// dK = scale · quant(dS)ᵀ · Q and dV = quant(P)ᵀ · dO, one thread per key row of a 64-row key
// tile; the columns of P and dS run down the query rows (mxfp8 blocks of 32 from the first).
// Softmax reads the rows' statistics from attnq_backward_stats.
template <int DH, int ACT, int MX, typename GT>
__device__ __forceinline__ void attnq_backward_kv(GT *__restrict__ dk, GT *__restrict__ dv,
                                                  const float *__restrict__ qh,
                                                  const float *__restrict__ kh,
                                                  const float *__restrict__ vh,
                                                  const float *__restrict__ doh,
                                                  const float *__restrict__ qr,
                                                  const float *__restrict__ dor, const AttnRows &r,
                                                  double inv_norm, const float4 *__restrict__ stats,
                                                  const int *__restrict__ tiles) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  float *tile_q = (float *)attn_smem, *tile_do = tile_q + ATTNQ_ROWS * DH,
        *tile_qr = tile_do + ATTNQ_ROWS * DH, *tile_dor = tile_qr + ATTNQ_ROWS * DH;
  AttnqRow *tile_st = (AttnqRow *)(tile_dor + ATTNQ_ROWS * DH);
  const int *tile = tiles + 3 * blockIdx.x;
  const int b = tile[0], j0 = tile[1], h = tile[2];
  const AttnExample e = attn_example(r, b);
  const int col0 = h * DH, heads = r.d / DH, j = j0 + threadIdx.x;
  const bool active = j < e.kv_len;
  const int nk = e.kv_len - j0 < ATTNQ_ROWS ? e.kv_len - j0 : ATTNQ_ROWS;
  int qlo, qhi;
  attn_query_range(r, j0, j0 + nk, e.q_len, &qlo, &qhi);
  float kreg[DH], vreg[DH], acc_dk[DH], acc_dv[DH];
  for (int c = 0; c < DH; c++) {
    kreg[c] = active ? kh[(e.kv_start + j) * r.d + col0 + c] : 0.0f;
    vreg[c] = active ? vh[(e.kv_start + j) * r.d + col0 + c] : 0.0f;
    acc_dk[c] = acc_dv[c] = 0.0f;
  }
  // Stages query rows [i0, i0 + 64): Q and dO along dh and their statistics, and (when `all`)
  // the rows-quantized Q and dO.
  auto stage = [&](int i0, bool all) {
    attn_stage_rows<DH>(tile_q, qh, e.q_start, i0, e.q_len, r.d, col0);
    attn_stage_rows<DH>(tile_do, doh, e.o_start, i0, e.q_len, r.d, col0);
    if (all) {
      attn_stage_rows<DH>(tile_qr, qr, e.q_start, i0, e.q_len, r.d, col0);
      attn_stage_rows<DH>(tile_dor, dor, e.o_start, i0, e.q_len, r.d, col0);
    }
    if (ACT == ATTN_ACT_SOFTMAX) {
      int ii = i0 + threadIdx.x;
      float4 s = ii < e.q_len ? stats[(e.o_start + ii) * heads + h] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      tile_st[threadIdx.x] = AttnqRow{s.x, s.y, s.z};
    }
  };
  auto seen = [&](int i) { return attn_visible(r, i, j); };
  // P and dS of staged query row ii with this thread's key.
  auto pair = [&](int ii, float *pds) {
    AttnqRow st = ACT == ATTN_ACT_SOFTMAX ? tile_st[ii] : AttnqRow{0.0f, 0.0f, 0.0f};
    attnq_pair<DH, ACT>(tile_q + ii * DH, tile_do + ii * DH, kreg, vreg, r, st, inv_norm, &pds[0],
                        &pds[1]);
  };
  float scales[2] = {1.0f, 1.0f};  // fp8: one scale per column of P and of dS
  if (!MX) {
    float pmax = 0.0f, dmax = 0.0f;
    attnq_sweep(qlo, qhi, active, [&](int i0) { stage(i0, false); }, seen, [&](int ii) {
      float pds[2];
      pair(ii, pds);
      pmax = fmaxf(pmax, attnq_finite_abs(pds[0]));
      dmax = fmaxf(dmax, attnq_finite_abs(pds[1]));
    });
    scales[0] = attnq_fp8_scale(pmax);
    scales[1] = attnq_fp8_scale(dmax);
  }
  attnq_sweep_quantized<2, MX>(
      qlo, qhi, active, scales, [&](int i0) { stage(i0, true); }, seen, pair,
      [&](int ii, const float *q) {
        const float *qi = tile_qr + ii * DH, *doi = tile_dor + ii * DH;
        if (q[0] != 0.0f)
          for (int c = 0; c < DH; c++) acc_dv[c] += q[0] * doi[c];
        if (q[1] != 0.0f)
          for (int c = 0; c < DH; c++) acc_dk[c] += q[1] * qi[c];
      });
  if (!active) return;
  const i64 at = (e.kv_start + j) * r.d + col0;
  for (int c = 0; c < DH; c++) {
    if (dk) attn_store1(dk + at + c, acc_dk[c] * r.scale);
    if (dv) attn_store1(dv + at + c, acc_dv[c]);
  }
}

#endif
