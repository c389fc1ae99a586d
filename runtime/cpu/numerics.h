// numerics.h: the precisions of gemc, emulated bit-exactly on the CPU, so that a GPU kernel
// that disagrees with the CPU executor is wrong, not the oracle.
//   bf16, fp16: round to nearest even (NaN stays NaN, overflow to inf as IEEE does)
//   fp8:        E4M3 (max 448, no inf) with one fp32 scale per tensor, saturating
//   mxfp8:      OCP MX v1.0: blocks of 32 along the reduction dim share an E8M0 scale
//               2^(floor(log2(amax)) - 8); elements E4M3, saturating
//   gelu_taylor: a degree-16 minimax polynomial for |x| < 4.125, x above and 0 below; its error
//                bound over every input is GELU_TAYLOR_ERROR (docs/activations.md)
// defines: round_bf16, round_fp16, e4m3_round, fp8_quantize, mxfp8_quantize, act_forward, act_grad,
//          bf16/fp16/e4m3 _encode and _decode, gelu_taylor and the GELU variants it was chosen from
// The exact rules are in docs/numerics.md; gelu_taylor's variants and errors, docs/activations.md.
#ifndef GEMC_NUMERICS_H
#define GEMC_NUMERICS_H

#include <stddef.h>
#include <stdint.h>

#include "ir.h"

float round_bf16(float x);
float round_fp16(float x);
// The nearest E4M3 value to x (ties to even), saturated to +-448; NaN stays NaN.
float e4m3_round(float x);
// The bit patterns behind the roundings, for kernels and tests that hold real 16/8-bit data:
// encode rounds (as above) and returns the bits; decode is exact. NaN encodes as a quiet NaN.
uint16_t bf16_encode(float x);
float bf16_decode(uint16_t h);
uint16_t fp16_encode(float x);
float fp16_decode(uint16_t h);
uint8_t e4m3_encode(float x);  // S.EEEE.MMM; NaN is S.1111.111
float e4m3_decode(uint8_t c);

// Rounds x to what a tensor stored in `t` holds (fp32, fp64, i64: unchanged; bf16, fp16:
// rounded; fp8 and mxfp8 values are stored as bf16).
float round_to_dtype(float x, DType t);
void round_array(float *x, size_t n, DType t);

// fp8: scale = amax / 448 (1 when amax is 0); x ~= e4m3_round(x / scale) * scale. Writes the
// dequantized values to out (may alias x) and returns the scale.
float fp8_quantize(const float *x, float *out, size_t n);

// mxfp8 over a row-major [rows, cols] matrix whose reduction dim is `cols` (k_contiguous = 1)
// or `rows` (k_contiguous = 0): each block of 32 consecutive elements along the reduction dim
// (the last block may be shorter) shares scale 2^(floor(log2(amax)) - 8), an E8M0 value
// (2^-127 .. 2^127); a zero block has scale 1. Writes dequantized values to out (may alias x).
void mxfp8_quantize(const float *x, float *out, size_t rows, size_t cols, int k_contiguous);
// The E8M0 exponent (scale = 2^e) of one block with max magnitude amax.
int mxfp8_block_exponent(float amax);

// Pointwise activations and their derivatives (double, used by both fp32 and fp64 paths).
// ACT_SOFTMAX is not pointwise and is handled by the attention code.
double act_forward(Act a, double x);
double act_grad(Act a, double x);  // d act / dx at x

// --- gelu_taylor (docs/activations.md) ---------------------------------------------------------
// gelu_taylor(x) = x for x >= GELU_TAYLOR_CLAMP, 0 for x <= -GELU_TAYLOR_CLAMP, and otherwise
// x/2 + t (a1 + a2 t + ... + a8 t^7) with t = x^2: a minimax fit (tests/fit/gelu_minimax_fit.py)
// of exact GELU, continuous at the clamp to within 2e-10. The coefficients are fp32 values, so
// the fp32 kernels (kernels/attention.cuh) carry them exactly; kernels/prelude.cuh holds the
// same literals as GELU_TAYLOR_A1..A8 (test_numerics checks they agree).
// Over every finite input, in double: |gelu_taylor - gelu| <= GELU_TAYLOR_ERROR and
// |gelu_taylor' - gelu'| <= GELU_TAYLOR_GRAD_ERROR; evaluating in fp32 (with or without FMA)
// moves the value by at most GELU_TAYLOR_FP32_ROUNDING and the derivative by at most
// GELU_TAYLOR_FP32_GRAD_ROUNDING. `gemc check -v` prints these bounds.
#define GELU_TAYLOR_CLAMP 4.125
#define GELU_TAYLOR_DEGREE 16
#define GELU_TAYLOR_ERROR 8.6e-5
#define GELU_TAYLOR_GRAD_ERROR 4.4e-4
#define GELU_TAYLOR_FP32_ROUNDING 1.2e-5
#define GELU_TAYLOR_FP32_GRAD_ROUNDING 4e-5
extern const float gelu_taylor_coef[8];  // a1..a8
double gelu_taylor(double x);
double gelu_taylor_grad(double x);

// The other variant measured for gelu_taylor, and what it replaced: the 6th-order Taylor series
// around 0 (0.5x + (x^2 - x^4/6 + x^6/40)/sqrt(2pi), exact only near 0: error 0.22 at |x| = 2,
// 4.0 at |x| = 3), that series guarded by |x| <= GELU_GUARD_RANGE with the tanh form
// 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) beyond, and the tanh form alone. Each with its
// derivative.
#define GELU_GUARD_RANGE 0.7
double gelu_series6(double x);
double gelu_series6_grad(double x);
double gelu_guarded(double x);
double gelu_guarded_grad(double x);
double gelu_tanh_form(double x);
double gelu_tanh_form_grad(double x);

// Max |f(x) - ref(x)| over x = lo + (hi - lo) i / samples, i = 0..samples (NaN when the range
// or the count is not valid). For the error tables: ref is act_forward(ACT_GELU)'s function or
// its derivative, gelu_exact and gelu_exact_grad.
double gelu_exact(double x);
double gelu_exact_grad(double x);
double max_abs_error(double (*f)(double), double (*ref)(double), double lo, double hi,
                     int samples);
// Max |gelu_taylor(x) - gelu(x)| over |x| <= r (the error is even in x: gelu(-x) = gelu(x) - x,
// and gelu_taylor keeps that identity), sampled at 100,001 points of [0, r], r included.
double gelu_taylor_max_error(double r);

#endif
