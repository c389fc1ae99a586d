// prelude_on_cpu.h: kernels/prelude.cuh for the CPU (cuda_on_cpu.h): the same names, with the
// PTX conversions replaced by the CPU executor's own rounding functions (runtime/cpu/numerics.c),
// so an emulated kernel rounds exactly as the oracle does.
// defines: i64, bf16_t, fp16_t, load_*/store_*, load_*_n/store_*_n, act_*, warp_sum, warp_max, block_sum, ...
extern "C" {
float round_bf16(float x);
uint16_t bf16_encode(float x);
float bf16_decode(uint16_t h);
uint16_t fp16_encode(float x);
float fp16_decode(uint16_t h);
float e4m3_round(float x);
uint8_t e4m3_encode(float x);
int mxfp8_block_exponent(float amax);
}
typedef long long i64;
typedef unsigned short bf16_t;
struct fp16_t {  // as in the prelude: a struct, so that it overloads apart from bf16_t
  unsigned short bits;
};
enum { WARP_SIZE = 32, MX_BLOCK = 32 };
inline float load_f32(const float *p, i64 i) { return p[i]; }
inline float load_bf16(const bf16_t *p, i64 i) { return bf16_decode(p[i]); }
inline float load_fp16(const fp16_t *p, i64 i) { return fp16_decode(p[i].bits); }
inline void store_f32(float *p, i64 i, float x) { p[i] = x; }
inline bf16_t float_to_bf16(float x) { return bf16_encode(x); }
inline void store_bf16(bf16_t *p, i64 i, float x) { p[i] = bf16_encode(x); }
inline void store_fp16(fp16_t *p, i64 i, float x) { p[i].bits = fp16_encode(x); }
// load_*_n / store_*_n: N consecutive values (a vector access on the GPU when aligned).
template <int N> inline void load_f32_n(const float *p, i64 i, float *v) {
  for (int k = 0; k < N; k++) v[k] = load_f32(p, i + k);
}
template <int N> inline void load_bf16_n(const bf16_t *p, i64 i, float *v) {
  for (int k = 0; k < N; k++) v[k] = load_bf16(p, i + k);
}
template <int N> inline void store_f32_n(float *p, i64 i, const float *v) {
  for (int k = 0; k < N; k++) store_f32(p, i + k, v[k]);
}
template <int N> inline void store_bf16_n(bf16_t *p, i64 i, const float *v) {
  for (int k = 0; k < N; k++) store_bf16(p, i + k, v[k]);
}
template <int N> inline void store_fp16_n(fp16_t *p, i64 i, const float *v) {
  for (int k = 0; k < N; k++) store_fp16(p, i + k, v[k]);
}
template <int N> inline void load_fp16_n(const fp16_t *p, i64 i, float *v) {
  for (int k = 0; k < N; k++) v[k] = load_fp16(p, i + k);
}
inline int mx_block_exponent(float amax) { return mxfp8_block_exponent(amax); }
inline unsigned char e4m3_bits(float x) { return e4m3_encode(x); }
inline double act_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
inline double act_silu(double x) { return x * act_sigmoid(x); }
inline double act_relu(double x) { return x > 0 ? x : 0.0; }
inline double act_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }
// gelu_taylor, as kernels/prelude.cuh has it (test_numerics checks that the literals agree).
#define GELU_TAYLOR_CLAMP 4.125f
#define GELU_TAYLOR_A1 3.984107077e-01f
#define GELU_TAYLOR_A2 -6.544434279e-02f
#define GELU_TAYLOR_A3 9.256702848e-03f
#define GELU_TAYLOR_A4 -9.412298677e-04f
#define GELU_TAYLOR_A5 6.577874592e-05f
#define GELU_TAYLOR_A6 -2.967661203e-06f
#define GELU_TAYLOR_A7 7.716877803e-08f
#define GELU_TAYLOR_A8 -8.735044355e-10f
inline double act_gelu_taylor(double x) {
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
inline double act_none(double x) { return x; }
inline double act_sigmoid_grad(double x) { double s = act_sigmoid(x); return s * (1.0 - s); }
inline double act_silu_grad(double x) { double s = act_sigmoid(x); return s * (1.0 + x * (1.0 - s)); }
inline double act_relu_grad(double x) { return x > 0 ? 1.0 : 0.0; }
inline double act_gelu_grad(double x) {
  return 0.5 * (1.0 + erf(x * 0.70710678118654752440)) + x * 0.39894228040143267794 * exp(-0.5 * x * x);
}
inline double act_gelu_taylor_grad(double x) {
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
inline double act_none_grad(double) { return 1.0; }
inline double warp_sum(double x) {
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
inline float warp_max(float x) {
  for (int off = 16; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
inline double block_sum(double x, double *scratch) {
  int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  int nwarps = blockDim.x / WARP_SIZE;
  x = lane < nwarps ? scratch[lane] : 0.0;
  return warp_sum(x);
}
inline i64 example_of_row(const i64 *offsets, i64 batch, i64 row) {
  i64 lo = 0, hi = batch;
  while (hi - lo > 1) {
    i64 mid = (lo + hi) / 2;
    if (offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}
using std::isfinite;
using std::isinf;

// The attention kernels that need no tensor cores (kernels/attention_simt.cuh,
// attention_quantized.cuh) run here too: attention.cuh takes its GEMC_ON_CPU branches, and
// plan_emu.sh points the dynamic shared memory at emu_dynamic_smem (cuda_on_cpu.h; blocks run
// one at a time).
#define GEMC_ON_CPU 1
#define __align__(n) alignas(n)
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float __expf(float x) { return expf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned short cpu_bf16_bits(float x) { return bf16_encode(x); }
inline float cpu_fp16_value(unsigned short h) { return fp16_decode(h); }
inline unsigned short cpu_fp16_bits(float x) { return fp16_encode(x); }
