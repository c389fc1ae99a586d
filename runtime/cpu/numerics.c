// numerics.c: bit-exact emulation of gemc's precisions (bf16, fp16, E4M3 fp8 with a per-tensor
// scale, OCP MX v1.0 mxfp8) and the pointwise activations with their derivatives.
//
// Every rounding is round-to-nearest, ties to even, done on the float's bits (or, for
// subnormal targets, by one float addition whose ulp is the target's quantum), so it is exact
// and fast enough for the CPU executor's hot path.
// docs/numerics.md states every rule in prose.
#include "numerics.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "float_bits.h"
#include "internal_error.h"

// The subnormal paths round with one float addition, which needs float arithmetic evaluated
// in float (SSE, NEON), not in x87 extended precision.
_Static_assert(FLT_EVAL_METHOD == 0, "numerics.c needs FLT_EVAL_METHOD == 0");

// --- bf16 -------------------------------------------------------------------------------------

// The float bits of x rounded to bf16: adding 0x7fff plus the lowest kept bit rounds to
// nearest, ties to even; a carry out of the mantissa bumps the exponent, and past the largest
// finite value gives inf. NaN keeps its sign and top payload, made quiet.
static uint32_t bf16_round_bits(uint32_t u) {
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

uint16_t bf16_encode(float x) { return (uint16_t)(bf16_round_bits(float_bits(x)) >> 16); }

float bf16_decode(uint16_t h) { return bits_float((uint32_t)h << 16); }

float round_bf16(float x) { return bits_float(bf16_round_bits(float_bits(x))); }

// --- fp16 -------------------------------------------------------------------------------------

uint16_t fp16_encode(float x) {
  uint32_t u = float_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u)  // NaN: keep the top of the payload, force quiet
    return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x03ffu));
  if (u >= 0x477ff000u)  // >= 65520, the midpoint of 65504 and 2^16: ties to even give inf
    return (uint16_t)(sign | 0x7c00u);
  if (u < 0x38800000u) {  // below 2^-14: an fp16 subnormal (or zero)
    // 0.5f has ulp 2^-24, the fp16 subnormal quantum, so the float addition rounds |x| to a
    // multiple of 2^-24 (nearest, ties to even); the low bits are then the fp16 mantissa.
    float f = bits_float(u) + 0.5f;
    return (uint16_t)(sign | (float_bits(f) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;
  return (uint16_t)(sign | (u >> 13));
}

float fp16_decode(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x03ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    float mag = (float)mant * 0x1p-24f;
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

float round_fp16(float x) { return fp16_decode(fp16_encode(x)); }

// --- E4M3 -------------------------------------------------------------------------------------
// OCP E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits. Normals 2^-6 .. 448 (1.75 * 2^8),
// subnormals k * 2^-9 for k = 1..7. S.1111.111 is NaN; there is no inf.

static const uint32_t F32_E4M3_MAX = 0x43e00000u;         // 448 as float bits
static const uint32_t F32_E4M3_MIN_NORMAL = 0x3c800000u;  // 2^-6 as float bits

float e4m3_round(float x) {
  uint32_t u = float_bits(x);
  uint32_t sign = u & 0x80000000u, a = u ^ sign;
  if (a > 0x7f800000u) return x;  // NaN
  if (a >= F32_E4M3_MAX) return bits_float(sign | F32_E4M3_MAX);  // saturating, inf included
  if (a < F32_E4M3_MIN_NORMAL) {
    // Subnormal range: 16384 has float ulp 2^-9, the E4M3 subnormal quantum, so the float
    // addition rounds |x| to a multiple of 2^-9 (nearest, ties to even); the subtraction is exact.
    float r = (bits_float(a) + 16384.0f) - 16384.0f;
    return bits_float(float_bits(r) | sign);
  }
  // Normal range: keep 3 of float's 23 mantissa bits, rounding the other 20 to nearest even
  // (a carry bumps the exponent). Below 448 nothing rounds past 448.
  a += 0x7ffffu + ((a >> 20) & 1u);
  return bits_float(sign | (a & 0xfff00000u));
}

uint8_t e4m3_encode(float x) {
  float r = e4m3_round(x);
  uint32_t u = float_bits(r);
  uint8_t sign = (u >> 31) ? 0x80 : 0x00;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
  if (a < F32_E4M3_MIN_NORMAL)  // subnormal: the code is r / 2^-9
    return (uint8_t)(sign | (uint8_t)(bits_float(a) * 512.0f));
  uint32_t biased = (a >> 23) - 127 + 7;
  uint32_t mant = (a >> 20) & 7u;
  return (uint8_t)(sign | (biased << 3) | mant);
}

float e4m3_decode(uint8_t c) {
  int exp = (c >> 3) & 0xf;
  int mant = c & 0x7;
  float mag;
  if (exp == 15 && mant == 7)
    mag = NAN;
  else if (exp == 0)
    mag = ldexpf((float)mant, -9);
  else
    mag = ldexpf((float)(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp-7)
  return (c & 0x80) ? -mag : mag;
}

// --- storage dtypes ---------------------------------------------------------------------------

float round_to_dtype(float x, DType t) {
  switch (t) {
    case DT_BF16:
    case DT_FP8:
    case DT_MXFP8:
      return round_bf16(x);
    case DT_FP16:
      return round_fp16(x);
    case DT_F32:
    case DT_F64:
    case DT_I64:
    case DT_COUNT:
      break;
  }
  return x;
}

void round_array(float *x, size_t n, DType t) {
  switch (t) {
    case DT_BF16:
    case DT_FP8:
    case DT_MXFP8:
      for (size_t i = 0; i < n; i++) x[i] = round_bf16(x[i]);
      return;
    case DT_FP16:
      for (size_t i = 0; i < n; i++) x[i] = round_fp16(x[i]);
      return;
    case DT_F32:
    case DT_F64:
    case DT_I64:
    case DT_COUNT:
      return;
  }
}

// --- fp8 with a per-tensor scale --------------------------------------------------------------

// The largest finite |x[i]| (NaN and inf are skipped; they quantize to NaN and +-448 * scale).
static float finite_amax(const float *x, size_t n, size_t stride) {
  float amax = 0;
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(x[i * stride]);
    if (a <= FLT_MAX && a > amax) amax = a;
  }
  return amax;
}

float fp8_quantize(const float *x, float *out, size_t n) {
  float scale = finite_amax(x, n, 1) / 448.0f;
  if (!(scale > 0)) scale = 1;  // an all-zero tensor (or amax so small the scale underflows)
  for (size_t i = 0; i < n; i++) out[i] = e4m3_round(x[i] / scale) * scale;
  return scale;
}

// --- mxfp8 (OCP MX v1.0) ----------------------------------------------------------------------

enum { MX_BLOCK = 32, E8M0_EMIN = -127, E8M0_EMAX = 127, E4M3_EMAX = 8 };

int mxfp8_block_exponent(float amax) {
  if (!(amax > 0)) return 0;  // a zero block (or NaN) has scale 1
  if (isinf(amax)) return E8M0_EMAX;
  int e;
  frexp(amax, &e);
  int exp = (e - 1) - E4M3_EMAX;  // floor(log2 amax) - 8
  if (exp < E8M0_EMIN) exp = E8M0_EMIN;
  if (exp > E8M0_EMAX) exp = E8M0_EMAX;
  return exp;
}

// Quantizes n elements x[0], x[stride], ... as one block. Both scalings are by a power of
// two and exact in float (x / 2^e stays below 2^9 for finite x; q * 2^e keeps q's 4
// significant bits even as a float subnormal), so the element rounds once, in e4m3_round.
static void mx_block(const float *x, float *out, size_t n, size_t stride) {
  int e = mxfp8_block_exponent(finite_amax(x, n, stride));
  float inv_scale = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);
  for (size_t i = 0; i < n; i++) out[i * stride] = e4m3_round(x[i * stride] * inv_scale) * scale;
}

void mxfp8_quantize(const float *x, float *out, size_t rows, size_t cols, int k_contiguous) {
  if (k_contiguous) {  // reduction along cols: blocks run along each row
    for (size_t r = 0; r < rows; r++)
      for (size_t c = 0; c < cols; c += MX_BLOCK) {
        size_t n = cols - c < MX_BLOCK ? cols - c : MX_BLOCK;
        mx_block(x + r * cols + c, out + r * cols + c, n, 1);
      }
  } else {  // reduction along rows: blocks run down each column
    for (size_t r = 0; r < rows; r += MX_BLOCK) {
      size_t n = rows - r < MX_BLOCK ? rows - r : MX_BLOCK;
      for (size_t c = 0; c < cols; c++) mx_block(x + r * cols + c, out + r * cols + c, n, cols);
    }
  }
}

// --- activations ------------------------------------------------------------------------------

static const double INV_SQRT_2PI = 0.398942280401432677939946059934;  // 1/sqrt(2 pi)
static const double INV_SQRT_2 = 0.707106781186547524400844362105;    // 1/sqrt(2)

static double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

double gelu_exact(double x) { return 0.5 * x * (1.0 + erf(x * INV_SQRT_2)); }

double gelu_exact_grad(double x) {  // Phi(x) + x phi(x)
  return 0.5 * (1.0 + erf(x * INV_SQRT_2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
}

// --- gelu_taylor: the clamped minimax polynomial (docs/activations.md) --------------------------

// q(t) = t (a1 + a2 t + ... + a8 t^7), fitted by tests/fit/gelu_minimax_fit.py. The same literals
// as GELU_TAYLOR_A1..A8 in kernels/prelude.cuh (and tests/codegen/prelude_on_cpu.h).
const float gelu_taylor_coef[8] = {
    3.984107077e-01f,  -6.544434279e-02f, 9.256702848e-03f,  -9.412298677e-04f,
    6.577874592e-05f,  -2.967661203e-06f, 7.716877803e-08f,  -8.735044355e-10f,
};

// Beyond the clamp GELU is x (or 0) to within C Q(C) = 7.6e-5 (Q the normal tail), below the
// polynomial's own error. NaN fails both comparisons and stays NaN through the polynomial.
double gelu_taylor(double x) {
  if (x >= GELU_TAYLOR_CLAMP) return x;
  if (x <= -GELU_TAYLOR_CLAMP) return 0.0;
  const float *a = gelu_taylor_coef;
  double t = x * x, p = a[7];
  for (int k = 6; k >= 0; k--) p = p * t + a[k];
  return 0.5 * x + t * p;
}

// The derivative of exactly what gelu_taylor computes: 1/2 + 2x q'(x^2), and 1 or 0 beyond.
double gelu_taylor_grad(double x) {
  if (x >= GELU_TAYLOR_CLAMP) return 1.0;
  if (x <= -GELU_TAYLOR_CLAMP) return 0.0;
  const float *a = gelu_taylor_coef;
  double t = x * x, p = 8.0 * a[7];
  for (int k = 6; k >= 0; k--) p = p * t + (k + 1) * (double)a[k];
  return 0.5 + 2.0 * x * p;
}

// --- the variants gelu_taylor was chosen against ----------------------------------------------

double gelu_series6(double x) {
  double x2 = x * x;
  return 0.5 * x + INV_SQRT_2PI * x2 * (1.0 - x2 / 6.0 + x2 * x2 / 40.0);
}

double gelu_series6_grad(double x) {
  double x2 = x * x;
  return 0.5 + INV_SQRT_2PI * x * (2.0 - 4.0 * x2 / 6.0 + 6.0 * x2 * x2 / 40.0);
}

static const double SQRT_2_OVER_PI = 0.797884560802865355879892119869;  // sqrt(2/pi)

double gelu_tanh_form(double x) {
  return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
}

double gelu_tanh_form_grad(double x) {
  double t = tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x);
}

// The range check: the series where it is exact, the tanh form beyond. It jumps by 1.2e-4 at
// |x| = GELU_GUARD_RANGE, where the two forms disagree.
double gelu_guarded(double x) {
  return fabs(x) <= GELU_GUARD_RANGE ? gelu_series6(x) : gelu_tanh_form(x);
}

double gelu_guarded_grad(double x) {
  return fabs(x) <= GELU_GUARD_RANGE ? gelu_series6_grad(x) : gelu_tanh_form_grad(x);
}

double act_forward(Act a, double x) {
  switch (a) {
    case ACT_NONE: return x;
    case ACT_SILU: return x * sigmoid(x);
    case ACT_GELU: return gelu_exact(x);
    case ACT_GELU_TAYLOR: return gelu_taylor(x);
    case ACT_RELU: return x > 0 ? x : 0.0;
    case ACT_SIGMOID: return sigmoid(x);
    case ACT_SOFTMAX:
    case ACT_COUNT:
      break;
  }
  gemc_internal_error(__FILE__, __LINE__, "act_forward: not a pointwise activation");
}

double act_grad(Act a, double x) {
  switch (a) {
    case ACT_NONE: return 1.0;
    case ACT_SILU: {
      double s = sigmoid(x);
      return s * (1.0 + x * (1.0 - s));
    }
    case ACT_GELU: return gelu_exact_grad(x);
    case ACT_GELU_TAYLOR: return gelu_taylor_grad(x);
    case ACT_RELU: return x > 0 ? 1.0 : 0.0;
    case ACT_SIGMOID: {
      double s = sigmoid(x);
      return s * (1.0 - s);
    }
    case ACT_SOFTMAX:
    case ACT_COUNT:
      break;
  }
  gemc_internal_error(__FILE__, __LINE__, "act_grad: not a pointwise activation");
}

double max_abs_error(double (*f)(double), double (*ref)(double), double lo, double hi,
                     int samples) {
  if (!(lo <= hi) || isinf(lo) || isinf(hi) || samples < 1) return NAN;
  double worst = 0;
  for (int i = 0; i <= samples; i++) {
    double x = i == samples ? hi : lo + (hi - lo) * i / samples;
    double err = fabs(f(x) - ref(x));
    if (err > worst) worst = err;
  }
  return worst;
}

// The error is even in x, so [0, r] suffices; r itself is always sampled.
double gelu_taylor_max_error(double r) {
  if (!(r >= 0) || isinf(r)) return NAN;
  return max_abs_error(gelu_taylor, gelu_exact, 0.0, r, 100000);
}
