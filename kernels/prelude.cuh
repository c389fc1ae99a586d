// prelude.cuh: the helpers every generated kernel may use. gemc pastes this file (embedded in
// the binary) at the top of each generated source, so NVRTC needs no include path and no
// standard header. The numerics follow runtime/cpu/numerics.c exactly: bf16/fp16 round to nearest
// even (PTX cvt.rn), E4M3 is cvt.rn.satfinite, activations are evaluated in double.
// Its types are the only ones generated code and kernels/*.cuh use: i64, bf16_t, fp16_t.
// defines: i64, bf16_t, fp16_t, load_*/store_*, load_*_n/store_*_n, act_* (GELU_TAYLOR_*), warp_sum, block_sum,
//          e4m3_round, e4m3_bits
#ifndef GEMC_PRELUDE_CUH
#define GEMC_PRELUDE_CUH

typedef long long i64;
typedef unsigned short bf16_t;  // the bits of a bf16
struct fp16_t {                 // the bits of an IEEE half (a struct: it overloads apart)
  unsigned short bits;
};

enum { WARP_SIZE = 32, MX_BLOCK = 32 };

// --- storage types ----------------------------------------------------------------------

__device__ __forceinline__ float bf16_to_float(bf16_t h) {
  return __int_as_float(((unsigned)h) << 16);
}
__device__ __forceinline__ bf16_t float_to_bf16(float x) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ float fp16_to_float(fp16_t h) {
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h.bits));
  return x;
}
__device__ __forceinline__ fp16_t float_to_fp16(float x) {
  fp16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
  return h;
}

__device__ __forceinline__ float load_f32(const float *p, i64 i) { return p[i]; }
__device__ __forceinline__ float load_bf16(const bf16_t *p, i64 i) { return bf16_to_float(p[i]); }
__device__ __forceinline__ float load_fp16(const fp16_t *p, i64 i) { return fp16_to_float(p[i]); }
__device__ __forceinline__ void store_f32(float *p, i64 i, float x) { p[i] = x; }
__device__ __forceinline__ void store_bf16(bf16_t *p, i64 i, float x) { p[i] = float_to_bf16(x); }
__device__ __forceinline__ void store_fp16(fp16_t *p, i64 i, float x) { p[i] = float_to_fp16(x); }

// N consecutive values p[i..i+N) as floats: one 4-, 8- or 16-byte load when p + i is aligned to
// it (a row of a packed tensor whose width is a multiple of N), else N loads.
template <int N>
__device__ __forceinline__ void load_bf16_n(const bf16_t *p, i64 i, float *v) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "N: 1, 2, 4 or 8 values");
  struct alignas(2 * N) Words { unsigned short h[N]; };  // one vector load of N bf16
  const bf16_t *q = p + i;
  if (N >= 2 && ((unsigned long long)q & (2 * N - 1)) == 0) {
    Words u = *(const Words *)q;
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = bf16_to_float(u.h[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = bf16_to_float(q[k]);
  }
}
// p[i..i+N) = v as bf16: one vector store when aligned, as load_bf16_n.
template <int N>
__device__ __forceinline__ void store_bf16_n(bf16_t *p, i64 i, const float *v) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "N: 1, 2, 4 or 8 values");
  struct alignas(2 * N) Words { unsigned short h[N]; };
  bf16_t *q = p + i;
  if (N >= 2 && ((unsigned long long)q & (2 * N - 1)) == 0) {
    Words u;
#pragma unroll
    for (int k = 0; k < N; k++) u.h[k] = float_to_bf16(v[k]);
    *(Words *)q = u;
  } else {
#pragma unroll
    for (int k = 0; k < N; k++) q[k] = float_to_bf16(v[k]);
  }
}
// p[i..i+N) = v: 16-byte stores (8-byte for N = 2) when aligned, else N stores.
template <int N>
__device__ __forceinline__ void store_f32_n(float *p, i64 i, const float *v) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "N: 1, 2, 4 or 8 values");
  float *q = p + i;
  if (N >= 4 && ((unsigned long long)q & 15) == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 4) *(float4 *)(q + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
  } else if (N == 2 && ((unsigned long long)q & 7) == 0) {
    *(float2 *)q = make_float2(v[0], v[N - 1]);
  } else {
#pragma unroll
    for (int k = 0; k < N; k++) q[k] = v[k];
  }
}
template <int N>
__device__ __forceinline__ void store_fp16_n(fp16_t *p, i64 i, const float *v) {
#pragma unroll
  for (int k = 0; k < N; k++) p[i + k] = float_to_fp16(v[k]);
}
template <int N>
__device__ __forceinline__ void load_f32_n(const float *p, i64 i, float *v) {
#pragma unroll
  for (int k = 0; k < N; k++) v[k] = p[i + k];
}
template <int N>
__device__ __forceinline__ void load_fp16_n(const fp16_t *p, i64 i, float *v) {
#pragma unroll
  for (int k = 0; k < N; k++) v[k] = fp16_to_float(p[i + k]);
}

// --- fp8 (E4M3) -------------------------------------------------------------------------

// The nearest E4M3 value (ties to even), saturated to +-448; NaN stays NaN.
__device__ __forceinline__ float e4m3_round(float x) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  unsigned halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
  fp16_t lo = {(unsigned short)(halves & 0xffffu)};
  return fp16_to_float(lo);
}

// The E4M3 code of x (rounded to nearest even, saturating to ±448; NaN stays NaN): what
// cuBLASLt's FP8 GEMMs read (codegen/ops/lower_gemm.c).
__device__ __forceinline__ unsigned char e4m3_bits(float x) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return (unsigned char)(pair & 0xffu);
}

// The E8M0 exponent of an mxfp8 block with max magnitude amax: floor(log2 amax) - 8, clamped
// to [-127, 127]; 0 for a zero block.
__device__ __forceinline__ int mx_block_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  if (isinf(amax)) return 127;
  int e = (int)((__float_as_uint(amax) >> 23) & 0xff) - 127;
  if (e == -127) e = ilogbf(amax);  // subnormal amax
  e -= 8;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// --- activations (runtime/cpu/numerics.c: act_forward, act_grad) ------------------------------

__device__ __forceinline__ double act_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ double act_silu(double x) { return x * act_sigmoid(x); }
__device__ __forceinline__ double act_relu(double x) { return x > 0 ? x : 0.0; }
__device__ __forceinline__ double act_gelu(double x) {
  return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
}
// gelu_taylor (docs/activations.md): x/2 + t (a1 + a2 t + ... + a8 t^7), t = x^2, for |x| < 4.125;
// x above and 0 below. fp32 coefficients, the same as runtime/cpu/numerics.c's; the fp32
// attention kernels (attention.cuh) use these macros too. |error| <= 8.6e-5 over every input.
#define GELU_TAYLOR_CLAMP 4.125f
#define GELU_TAYLOR_A1 3.984107077e-01f
#define GELU_TAYLOR_A2 -6.544434279e-02f
#define GELU_TAYLOR_A3 9.256702848e-03f
#define GELU_TAYLOR_A4 -9.412298677e-04f
#define GELU_TAYLOR_A5 6.577874592e-05f
#define GELU_TAYLOR_A6 -2.967661203e-06f
#define GELU_TAYLOR_A7 7.716877803e-08f
#define GELU_TAYLOR_A8 -8.735044355e-10f
__device__ __forceinline__ double act_gelu_taylor(double x) {
  if (x >= GELU_TAYLOR_CLAMP) return x;
  if (x <= -GELU_TAYLOR_CLAMP) return 0.0;
  double t = x * x, p = GELU_TAYLOR_A8;
  p = p * t + GELU_TAYLOR_A7;
  p = p * t + GELU_TAYLOR_A6;
  p = p * t + GELU_TAYLOR_A5;
  p = p * t + GELU_TAYLOR_A4;
  p = p * t + GELU_TAYLOR_A3;
  p = p * t + GELU_TAYLOR_A2;
  p = p * t + GELU_TAYLOR_A1;
  return 0.5 * x + t * p;
}
__device__ __forceinline__ double act_none(double x) { return x; }

__device__ __forceinline__ double act_sigmoid_grad(double x) {
  double s = act_sigmoid(x);
  return s * (1.0 - s);
}
__device__ __forceinline__ double act_silu_grad(double x) {
  double s = act_sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}
__device__ __forceinline__ double act_relu_grad(double x) { return x > 0 ? 1.0 : 0.0; }
__device__ __forceinline__ double act_gelu_grad(double x) {
  return 0.5 * (1.0 + erf(x * 0.70710678118654752440)) +
         x * 0.39894228040143267794 * exp(-0.5 * x * x);
}
__device__ __forceinline__ double act_gelu_taylor_grad(double x) {  // of exactly the above
  if (x >= GELU_TAYLOR_CLAMP) return 1.0;
  if (x <= -GELU_TAYLOR_CLAMP) return 0.0;
  double t = x * x, p = 8.0 * GELU_TAYLOR_A8;
  p = p * t + 7.0 * GELU_TAYLOR_A7;
  p = p * t + 6.0 * GELU_TAYLOR_A6;
  p = p * t + 5.0 * GELU_TAYLOR_A5;
  p = p * t + 4.0 * GELU_TAYLOR_A4;
  p = p * t + 3.0 * GELU_TAYLOR_A3;
  p = p * t + 2.0 * GELU_TAYLOR_A2;
  p = p * t + GELU_TAYLOR_A1;
  return 0.5 + 2.0 * x * p;
}
__device__ __forceinline__ double act_none_grad(double x) { return 1.0; }

// --- reductions -------------------------------------------------------------------------

// Sums over the 32 lanes of a warp in a fixed butterfly order: the same bits every run.
__device__ __forceinline__ double warp_sum(double x) {
  for (int off = WARP_SIZE / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int off = WARP_SIZE / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// Sums one value per thread over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the total. `scratch` holds 32 doubles of shared memory.
__device__ __forceinline__ double block_sum(double x, double *scratch) {
  int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  int nwarps = blockDim.x / WARP_SIZE;
  x = lane < nwarps ? scratch[lane] : 0.0;
  return warp_sum(x);
}

// The example a row of a jagged tensor belongs to: the b with offsets[b] <= row < offsets[b+1].
__device__ __forceinline__ i64 example_of_row(const i64 *__restrict__ offsets, i64 batch, i64 row) {
  i64 lo = 0, hi = batch;  // offsets[lo] <= row < offsets[hi]
  while (hi - lo > 1) {
    i64 mid = (lo + hi) / 2;
    if (offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

#endif  // GEMC_PRELUDE_CUH
