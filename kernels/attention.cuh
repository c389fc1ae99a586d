// attention.cuh: device building blocks of gemc's jagged GDPA kernels (docs/attention.md).
// Warp-level tensor-core pieces (ldmatrix, mma.sync m16n8k16 bf16 -> fp32, cp.async), the
// activations with their derivatives, and jagged row indexing. The kernels themselves are in
// attention_forward.cuh and attention_backward.cuh; codegen/attention/attention_shared.c pastes
// all three into a model's source, and the emitters write one small extern "C" wrapper per
// attention kernel.
// No standard headers: bf16 and fp16 are carried as raw 16-bit words, in the prelude's types
// (kernels/prelude.cuh: i64, bf16_t, fp16_t), which every source pastes in before this file.
// defines: attn_to_float, attn_store1, AttnRows, attn_act, attn_act_grad, the mma, ldmatrix and
// cp.async wrappers
#ifndef GEMC_ATTENTION_CUH
#define GEMC_ATTENTION_CUH

// The activations, numbered as gemc's Act enum (compiler/ir/ir.h).
enum {
  ATTN_ACT_NONE = 0,
  ATTN_ACT_SOFTMAX = 1,
  ATTN_ACT_SILU = 2,
  ATTN_ACT_GELU = 3,
  ATTN_ACT_GELU_TAYLOR = 4,
  ATTN_ACT_RELU = 5,
  ATTN_ACT_SIGMOID = 6,
};

enum { ATTN_TILE_KV = 64, ATTN_TILE_BWD = 64 };

#define ATTN_INV_SQRT_2 0.70710678118654752f
#define ATTN_INV_SQRT_2PI 0.39894228040143268f
#define ATTN_LOG2E 1.44269504088896341f
#define ATTN_INF __int_as_float(0x7f800000)

// ---------------------------------------------------------------------------------------------
// bf16 conversions

__device__ __forceinline__ float attn_bf16_to_float(bf16_t x) {
  return __uint_as_float((unsigned)x << 16);
}

// Two floats -> one register of two bf16, `lo` at the lower address (round to nearest even).
__device__ __forceinline__ unsigned attn_pack_bf16(float lo, float hi) {
#ifdef GEMC_ON_CPU  // tests/codegen: the kernels that need no tensor cores, run on the CPU
  return (unsigned)cpu_bf16_bits(lo) | (unsigned)cpu_bf16_bits(hi) << 16;
#else
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

__device__ __forceinline__ void attn_store2(bf16_t *p, float a, float b) {
  *(unsigned *)p = attn_pack_bf16(a, b);
}
__device__ __forceinline__ void attn_store2(float *p, float a, float b) {
  p[0] = a;
  p[1] = b;
}

// One-element loads and stores for every storage type (fp16_t is a struct, so that it
// overloads apart from bf16_t).
__device__ __forceinline__ float attn_to_float(float x) { return x; }
__device__ __forceinline__ float attn_to_float(bf16_t x) { return attn_bf16_to_float(x); }
__device__ __forceinline__ float attn_to_float(fp16_t x) {
#ifdef GEMC_ON_CPU
  return cpu_fp16_value(x.bits);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
#endif
}

__device__ __forceinline__ void attn_store1(float *p, float x) { *p = x; }
__device__ __forceinline__ void attn_store1(bf16_t *p, float x) {
  *p = (bf16_t)(attn_pack_bf16(x, 0.0f) & 0xffffu);
}
__device__ __forceinline__ void attn_store1(fp16_t *p, float x) {
#ifdef GEMC_ON_CPU
  p->bits = cpu_fp16_bits(x);
#else
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  p->bits = h;
#endif
}

// ---------------------------------------------------------------------------------------------
// Activations (docs/autodiff.md): the functions of runtime/cpu/numerics.c in fp32, with fast exp
// and reciprocal whose errors stay far below bf16's rounding of P. GELU keeps CUDA's erff: on
// the H200 it measured faster than a branch-free Abramowitz-Stegun erf (scores are small, so
// erff's short range is the path taken).

__device__ __forceinline__ float attn_sigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));  // 1/inf = 0 for very negative x
}

template <int ACT> __device__ __forceinline__ float attn_act(float x) {
  if (ACT == ATTN_ACT_SILU) return x * attn_sigmoid(x);
  if (ACT == ATTN_ACT_GELU) return 0.5f * x * (1.0f + erff(x * ATTN_INV_SQRT_2));
  if (ACT == ATTN_ACT_GELU_TAYLOR) {  // prelude.cuh's act_gelu_taylor in fp32: ALU only, selects
    float t = x * x, p = GELU_TAYLOR_A8;
    p = p * t + GELU_TAYLOR_A7;
    p = p * t + GELU_TAYLOR_A6;
    p = p * t + GELU_TAYLOR_A5;
    p = p * t + GELU_TAYLOR_A4;
    p = p * t + GELU_TAYLOR_A3;
    p = p * t + GELU_TAYLOR_A2;
    p = p * t + GELU_TAYLOR_A1;
    float y = 0.5f * x + t * p;
    return x >= GELU_TAYLOR_CLAMP ? x : (x <= -GELU_TAYLOR_CLAMP ? 0.0f : y);
  }
  if (ACT == ATTN_ACT_RELU) return x > 0.0f ? x : 0.0f;
  if (ACT == ATTN_ACT_SIGMOID) return attn_sigmoid(x);
  return x;
}

template <int ACT> __device__ __forceinline__ float attn_act_grad(float x) {
  if (ACT == ATTN_ACT_SILU) {
    float s = attn_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  }
  if (ACT == ATTN_ACT_GELU)
    return 0.5f * (1.0f + erff(x * ATTN_INV_SQRT_2)) + x * ATTN_INV_SQRT_2PI * __expf(-0.5f * x * x);
  if (ACT == ATTN_ACT_GELU_TAYLOR) {  // the derivative of exactly attn_act's polynomial
    float t = x * x, p = 8.0f * GELU_TAYLOR_A8;
    p = p * t + 7.0f * GELU_TAYLOR_A7;
    p = p * t + 6.0f * GELU_TAYLOR_A6;
    p = p * t + 5.0f * GELU_TAYLOR_A5;
    p = p * t + 4.0f * GELU_TAYLOR_A4;
    p = p * t + 3.0f * GELU_TAYLOR_A3;
    p = p * t + 2.0f * GELU_TAYLOR_A2;
    p = p * t + GELU_TAYLOR_A1;
    float y = 0.5f + 2.0f * x * p;
    return x >= GELU_TAYLOR_CLAMP ? 1.0f : (x <= -GELU_TAYLOR_CLAMP ? 0.0f : y);
  }
  if (ACT == ATTN_ACT_RELU) return x > 0.0f ? 1.0f : 0.0f;
  if (ACT == ATTN_ACT_SIGMOID) {
    float s = attn_sigmoid(x);
    return s * (1.0f - s);
  }
  return 1.0f;
}

// The tensor-core (bf16) kernels evaluate GELU in its tanh form with the hardware tanh
// (tanh.approx.f32, one MUFU op): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). Against exact
// GELU its error is under 5e-4 for the form plus 2^-11 relative for the approximate tanh, far
// below bf16's rounding of P (2^-9 relative); erff made these kernels ALU-bound (178 TFLOP/s
// forward at self N=1024 against 276 for silu). Forward and backward use the same function,
// so gradients stay consistent. The fp32 kernels keep exact erff (docs/attention.md).
__device__ __forceinline__ float attn_tanh_approx(float x) {
#ifdef GEMC_ON_CPU
  return tanhf(x);
#else
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

template <int ACT> __device__ __forceinline__ float attn_act_tc(float x) {
  if (ACT == ATTN_ACT_GELU) {
    float t = attn_tanh_approx(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t);
  }
  return attn_act<ACT>(x);
}

template <int ACT> __device__ __forceinline__ float attn_act_grad_tc(float x) {
  if (ACT == ATTN_ACT_GELU) {
    float t = attn_tanh_approx(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
  }
  return attn_act_grad<ACT>(x);
}

// GELU's tanh form at a raw score s (x = s·scale), times inv_norm, with the constants folded so
// that one tanh and five operations give P: t = tanh(s·(k0 + k1·s²)) with k0 = √(2/π)·scale and
// k1 = √(2/π)·0.044715·scale³, then P = h + h·t with h = s·(0.5·scale·inv_norm). The same t gives
// act′(x)·inv_norm = 0.5·inv_norm·(1 + t) + h·(1 − t²)·(√(2/π) + 3·√(2/π)·0.044715·x²).
// (The plain form took about ten operations for P and as many again for act′.)
struct AttnGeluK {
  float k0, k1, h, half_norm, ga, gb;
};
__device__ __forceinline__ AttnGeluK attn_gelu_k(float scale, float inv_norm) {
  const float c0 = 0.7978845608f, c1 = 0.7978845608f * 0.044715f;
  AttnGeluK k;
  k.k0 = c0 * scale;
  k.k1 = c1 * scale * scale * scale;
  k.h = 0.5f * scale * inv_norm;
  k.half_norm = 0.5f * inv_norm;
  k.ga = c0;
  k.gb = 3.0f * c1 * scale * scale;
  return k;
}
__device__ __forceinline__ float attn_gelu_p_tc(const AttnGeluK &k, float s, float *tanh_out) {
  const float s2 = s * s;
  const float t = attn_tanh_approx(s * fmaf(k.k1, s2, k.k0));
  const float h = s * k.h;
  if (tanh_out) *tanh_out = t;
  return fmaf(h, t, h);
}
__device__ __forceinline__ float attn_gelu_grad_tc(const AttnGeluK &k, float s, float t) {
  const float h = s * k.h;
  const float a = fmaf(k.gb, s * s, k.ga), b = fmaf(-t, t, 1.0f);
  return fmaf(h * b, a, fmaf(k.half_norm, t, k.half_norm));
}

// ---------------------------------------------------------------------------------------------
// Jagged rows. An attention node's operands, per example b: query rows [q_start, +q_len) of q
// (PMA: the shared seeds), output rows from o_start, key rows [kv_start, +kv_len) of k and v.
// Rows are d wide; head h owns columns [h*dh, (h+1)*dh).

struct AttnRows {
  const i64 *q_off;  // jagged q: offsets [B+1]; null otherwise
  const i64 *kv_off; // jagged kv: offsets [B+1]; null otherwise
  int q_fixed;             // rows per example when q is not jagged (set k, seeds k, dense 1)
  int kv_fixed;            // rows per example when kv is not jagged
  int q_shared;            // PMA: every example reads seeds rows [0, q_fixed)
  int d;                   // row width (all heads)
  int window;              // 0: none
  int causal;
  float scale;
  float inv_norm;          // 1/L with hstu_norm, else 1
};

struct AttnExample {
  i64 q_start, o_start, kv_start;
  int q_len, kv_len;
};

__device__ __forceinline__ AttnExample attn_example(const AttnRows &r, int b) {
  AttnExample e;
  if (r.q_off) {
    e.q_start = e.o_start = r.q_off[b];
    e.q_len = (int)(r.q_off[b + 1] - r.q_off[b]);
  } else {
    e.q_start = r.q_shared ? 0 : (i64)b * r.q_fixed;
    e.o_start = (i64)b * r.q_fixed;
    e.q_len = r.q_fixed;
  }
  if (r.kv_off) {
    e.kv_start = r.kv_off[b];
    e.kv_len = (int)(r.kv_off[b + 1] - r.kv_off[b]);
  } else {
    e.kv_start = (i64)b * r.kv_fixed;
    e.kv_len = r.kv_fixed;
  }
  return e;
}

// act(s·scale)·inv_norm, the P of a pointwise activation at raw score s.
template <int ACT> __device__ __forceinline__ float attn_act_p_tc(const AttnRows &r, float s) {
  if (ACT == ATTN_ACT_GELU) return attn_gelu_p_tc(attn_gelu_k(r.scale, r.inv_norm), s, nullptr);
  return attn_act_tc<ACT>(s * r.scale) * r.inv_norm;
}

// Whether query row i sees key j (both within the example), key bounds excluded.
__device__ __forceinline__ bool attn_visible(const AttnRows &r, int i, int j) {
  if (r.causal && j > i) return false;
  if (r.window > 0) {
    if (j <= i - r.window) return false;
    if (!r.causal && j >= i + r.window) return false;
  }
  return true;
}

// The first example b of [0, batch] whose keys start at or after `key` (offsets[batch + 1],
// ascending): a binary search.
__device__ __forceinline__ int attn_first_example_from(const i64 *offsets, i64 batch, i64 key) {
  int lo = 0, hi = (int)batch;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The work of one dQ block: from the tile list, one (example, tile of `rows` query rows, head);
// without one (PMA, whose seeds every example shares), block x is (range, seed tile, head) over
// `chunks` consecutive ranges of the batch's examples, which the block sums in order (one
// range, the whole batch, when chunks is 1); *chunk says which range. Over a jagged kv
// (kv_off) the ranges hold about equal numbers of keys; otherwise equal numbers of examples.
__device__ __forceinline__ void attn_query_block(const int *tiles, i64 batch, int rows,
                                                 int heads, int chunks, const i64 *kv_off,
                                                 int *b_first, int *b_end, int *i0, int *h,
                                                 int *chunk) {
  if (!tiles) {
    const int per_chunk = (int)(gridDim.x / chunks), local = (int)(blockIdx.x % per_chunk);
    *chunk = (int)(blockIdx.x / per_chunk);
    if (kv_off && chunks > 1) {
      // A jagged kv: chunk c takes the examples whose keys start in [c T / chunks,
      // (c + 1) T / chunks) of the T keys, so the chunks hold about equal work.
      *b_first = attn_first_example_from(kv_off, batch, kv_off[batch] * *chunk / chunks);
      *b_end = *chunk + 1 == chunks
                   ? (int)batch
                   : attn_first_example_from(kv_off, batch, kv_off[batch] * (*chunk + 1) / chunks);
    } else {
      const int per = (int)((batch + chunks - 1) / chunks);
      *b_first = *chunk * per < batch ? *chunk * per : (int)batch;
      *b_end = *b_first + per < batch ? *b_first + per : (int)batch;
    }
    *i0 = local / heads * rows, *h = local % heads;
  } else {
    const int *tile = tiles + 3 * blockIdx.x;
    *b_first = tile[0], *b_end = tile[0] + 1, *i0 = tile[1], *h = tile[2], *chunk = 0;
  }
}

// The keys [*lo, *hi) that query rows [i0, i1) can see, lo rounded down to a key tile.
__device__ __forceinline__ void attn_key_range(const AttnRows &r, int i0, int i1, int lk, int *lo,
                                               int *hi) {
  int a = 0, b = lk;
  if (r.causal && i1 < b) b = i1;
  if (r.window > 0) {
    a = i0 - r.window + 1;
    if (a < 0) a = 0;
    if (!r.causal && i1 + r.window - 1 < b) b = i1 + r.window - 1;
  }
  a -= a % ATTN_TILE_KV;
  *lo = a;
  *hi = b > a ? b : a;
}

// The query rows [*lo, *hi) that can see keys [j0, j1), lo rounded down to a query tile.
__device__ __forceinline__ void attn_query_range(const AttnRows &r, int j0, int j1, int lq, int *lo,
                                                 int *hi) {
  int a = 0, b = lq;
  if (r.causal) a = j0;
  if (r.window > 0) {
    int top = j1 - 1 + r.window;  // i < j + w for every visible pair
    if (top < b) b = top;
    if (!r.causal) {
      int bottom = j0 - r.window + 1;
      if (bottom > a) a = bottom;
    }
  }
  if (a < 0) a = 0;
  a -= a % ATTN_TILE_BWD;
  *lo = a;
  *hi = b > a ? b : a;
}

// The tensor-core pieces: shared-memory tiles, cp.async, ldmatrix, mma. tests/codegen runs them
// on the CPU too, where the three instructions are warp collectives of its emulator
// (tests/codegen/cuda_on_cpu.h: emu_cp_async16, emu_ldmatrix_x4, emu_mma_bf16).

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: rows of DH bf16, 16-byte chunks XOR-swizzled by row so that ldmatrix
// reads eight rows of one column chunk without bank conflicts. XOR keeps a chunk inside its row
// only when the row's chunk count is a power of two (DH 16, 32, 64, 128); other widths (48, 80,
// 96, 112) rotate the chunks by the row instead, which keeps them in the row (an XOR there sent
// chunks past the row's end, onto the next row's, and gave wrong results).

template <int DH> __device__ __forceinline__ int attn_smem_index(int row, int col) {
  enum { CHUNKS = DH / 8, POW2 = (CHUNKS & (CHUNKS - 1)) == 0 };
  int chunk = col >> 3;
  if (!POW2) return row * DH + (((chunk + row) % CHUNKS) << 3) + (col & 7);
  int x = CHUNKS >= 8 ? (row & 7) : ((row / (8 / CHUNKS)) & (CHUNKS - 1));
  return row * DH + ((chunk ^ x) << 3) + (col & 7);
}

#ifdef GEMC_ON_CPU
// A shared-memory address: the offset into the emulator's shared memory.
__device__ __forceinline__ unsigned attn_smem_addr(const void *p) {
  return (unsigned)((const unsigned char *)p - emu_dynamic_smem);
}
__device__ __forceinline__ void attn_cp_async16(void *dst, const void *src, bool valid) {
  emu_cp_async16(dst, src, valid);
}
__device__ __forceinline__ void attn_cp_async_commit() { emu_cp_async_commit(); }
template <int N> __device__ __forceinline__ void attn_cp_async_wait() { emu_cp_async_wait(N); }
#else
__device__ __forceinline__ unsigned attn_smem_addr(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

// Copies 16 bytes global -> shared asynchronously; zero-fills when !valid.
__device__ __forceinline__ void attn_cp_async16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(attn_smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void attn_cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void attn_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

// Loads rows [row0, row0 + ROWS) of one head of a row-major bf16 matrix (row stride ld) into a
// swizzled tile; rows at or past `len` become zeros. All THREADS threads take part.
template <int ROWS, int DH, int THREADS>
__device__ __forceinline__ void attn_load_tile(bf16_t *tile, const bf16_t *base, i64 start,
                                               int row0, int len, int ld, int col0) {
  enum { CHUNKS = DH / 8 };
  for (int c = threadIdx.x; c < ROWS * CHUNKS; c += THREADS) {
    int r = c / CHUNKS, ch = c % CHUNKS;
    bool valid = row0 + r < len;
    const bf16_t *src = valid ? base + (start + row0 + r) * ld + col0 + ch * 8 : base;
    attn_cp_async16(tile + attn_smem_index<DH>(r, ch * 8), src, valid);
  }
}

// The same from an fp32 matrix (PMA seeds are fp32 parameters): converted, synchronously.
template <int ROWS, int DH, int THREADS>
__device__ __forceinline__ void attn_load_tile(bf16_t *tile, const float *base, i64 start,
                                               int row0, int len, int ld, int col0) {
  enum { PAIRS = DH / 2 };
  for (int c = threadIdx.x; c < ROWS * PAIRS; c += THREADS) {
    int r = c / PAIRS, col = (c % PAIRS) * 2;
    float a = 0.0f, b = 0.0f;
    if (row0 + r < len) {
      const float *src = base + (start + row0 + r) * ld + col0 + col;
      a = src[0];
      b = src[1];
    }
    *(unsigned *)(tile + attn_smem_index<DH>(r, col)) = attn_pack_bf16(a, b);
  }
}

// ---------------------------------------------------------------------------------------------
// Warp-level mma. Fragments follow PTX's m16n8k16 layouts: lane = 4*g + t.

#ifdef GEMC_ON_CPU
__device__ __forceinline__ void attn_ldmatrix_x4(unsigned *r, const bf16_t *p) {
  emu_ldmatrix_x4(r, p, false);
}
__device__ __forceinline__ void attn_ldmatrix_x4_trans(unsigned *r, const bf16_t *p) {
  emu_ldmatrix_x4(r, p, true);
}
__device__ __forceinline__ void attn_mma(float *acc, const unsigned *a, const unsigned *b) {
  emu_mma_bf16(acc, a, b);
}
#else
__device__ __forceinline__ void attn_ldmatrix_x4(unsigned *r, const bf16_t *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(attn_smem_addr(p)));
}
__device__ __forceinline__ void attn_ldmatrix_x4_trans(unsigned *r, const bf16_t *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(attn_smem_addr(p)));
}

// acc (16x8 fp32) += a (16x16 bf16, row-major) * b (16x8 bf16, col-major).
__device__ __forceinline__ void attn_mma(float *acc, const unsigned *a, const unsigned *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// An A fragment from score accumulators in registers: k-step kk (16 columns) of a warp's
// 16-row score tile x (n-blocks of 8 columns, each 4 values: rows g, g, g+8, g+8 at columns
// 2t, 2t+1), rounded to bf16. The m16n8k16 C and A layouts line up, so no data moves.
__device__ __forceinline__ void attn_pack_a(unsigned *a, const float (*x)[4], int kk) {
  a[0] = attn_pack_bf16(x[2 * kk][0], x[2 * kk][1]);
  a[1] = attn_pack_bf16(x[2 * kk][2], x[2 * kk][3]);
  a[2] = attn_pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]);
  a[3] = attn_pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

// A fragment: rows [r0, r0+16), cols [c0, c0+16) of a swizzled tile.
template <int DH>
__device__ __forceinline__ void attn_load_a(unsigned *a, const bf16_t *tile, int r0, int c0) {
  int lane = threadIdx.x & 31;
  attn_ldmatrix_x4(a, tile + attn_smem_index<DH>(r0 + (lane & 15), c0 + (lane >> 4) * 8));
}

// B fragments for two n-blocks, when the tile holds Bᵀ row-major (n rows, k cols): rows
// [n0, n0+16) give n, cols [k0, k0+16) give k. b[0..1]: n-block n0, b[2..3]: n0+8.
template <int DH>
__device__ __forceinline__ void attn_load_bt(unsigned *b, const bf16_t *tile, int n0, int k0) {
  int lane = threadIdx.x & 31;
  attn_ldmatrix_x4(b, tile + attn_smem_index<DH>(n0 + (lane & 7) + ((lane >> 4) << 3),
                                               k0 + ((lane >> 3) & 1) * 8));
}

// B fragments for two n-blocks, when the tile holds B row-major (k rows, n cols): rows
// [k0, k0+16) give k, cols [n0, n0+16) give n.
template <int DH>
__device__ __forceinline__ void attn_load_b(unsigned *b, const bf16_t *tile, int k0, int n0) {
  int lane = threadIdx.x & 31;
  attn_ldmatrix_x4_trans(b, tile + attn_smem_index<DH>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                     n0 + (lane >> 4) * 8));
}

#endif
