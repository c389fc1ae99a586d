// numerics.h: the precisions of gemc, emulated bit-exactly on the CPU, so that a GPU kernel
// that disagrees with the CPU executor is wrong, not the oracle.
//   bf16, fp16: round to nearest even (NaN stays NaN, overflow to inf as IEEE does)
//   fp8:        E4M3 (max 448, no inf) with one fp32 scale per tensor, saturating
//   mxfp8:      OCP MX v1.0: blocks of 32 along the reduction dim share an E8M0 scale
//               2^(floor(log2(amax)) - 8); elements E4M3, saturating
//   gelu_taylor: the 6th-order series 0.5x + x^2/sqrt(2pi) - x^4/(6 sqrt(2pi)) + x^6/(40 sqrt(2pi))
// defines: round_bf16, round_fp16, e4m3_round, fp8_quantize, mxfp8_quantize, act_forward, act_grad,
//          bf16/fp16/e4m3 _encode and _decode
// The exact rules, and the gelu_taylor error table, are in docs/numerics.md.
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
double gelu_taylor(double x);
// Max |gelu_taylor(x) - gelu(x)| over |x| <= r, for docs and the compiler's error report.
double gelu_taylor_max_error(double r);

#endif
