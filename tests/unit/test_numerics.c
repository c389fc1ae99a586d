// test_numerics.c: the precision emulation and the activations. bf16 and fp16 are checked
// exhaustively (every 16-bit pattern, every midpoint between neighbours) and against an
// independent reference rounding on random floats; E4M3 over all 256 codes and every midpoint;
// fp8 and mxfp8 on hand-checked tensors and blocks, both layouts; act_grad against central
// differences; the 6th-order series' error against the table in the design overview; gelu_taylor
// (docs/activations.md) within the bound gemc states, in double and in fp32, and carried with the
// same coefficients by the kernels.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "internal_error.h"
#include "kernels_embedded.h"
#include "numerics.h"

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// Same float, bit for bit (so -0 differs from +0).
#define assert_same_float(a, b) assert_int_equal(bits_of(a), bits_of(b))

// A small deterministic generator (splitmix64).
static uint64_t rng_state = 12345;
static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) * 0x1p-53; }
static double rng_normal(void) {
  double u1 = rng_uniform(), u2 = rng_uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// An independent reference: |x| rounded to `mant` fraction bits with minimum exponent `emin`
// (subnormals below it), by enumerating the two neighbours and comparing distances in exact
// double arithmetic. Returns +inf (the caller decides overflow) when it exceeds `max`.
static double ref_round(double x, int mant, int emin, double max) {
  double a = fabs(x);
  int e = emin;
  while (e < 200 && ldexp(1.0, e + 1) <= a) e++;
  double q = ldexp(1.0, e - mant);
  double lo = floor(a / q) * q, hi = lo + q;
  double r;
  if (a - lo < hi - a)
    r = lo;
  else if (a - lo > hi - a)
    r = hi;
  else
    r = fmod(lo / q, 2.0) == 0 ? lo : hi;
  if (r > max) r = INFINITY;
  return copysign(r, x);
}

// --- fp16 -------------------------------------------------------------------------------------

// The value of fp16 bits from the definition, independently of the library.
static double fp16_value(uint16_t h) {
  int exp = (h >> 10) & 31, mant = h & 1023;
  double mag = exp == 0 ? ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY)
                                                       : ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

static void test_numerics_fp16_every_value_round_trips(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float v = fp16_decode((uint16_t)h);
    double want = fp16_value((uint16_t)h);
    if (isnan(want)) {
      assert_true(isnan(v));
      assert_true(isnan(round_fp16(v)));
      assert_int_equal(fp16_encode(v) & 0x7e00, 0x7e00);  // a quiet NaN
      assert_int_equal(fp16_encode(v) & 0x8000, h & 0x8000);
      continue;
    }
    assert_true((double)v == want);
    assert_int_equal(signbit(v) != 0, (h & 0x8000) != 0);
    assert_int_equal(fp16_encode(v), h);
    assert_same_float(round_fp16(v), v);
  }
}

static void test_numerics_fp16_ties_go_to_even(void **state) {
  (void)state;
  // Every pair of neighbouring finite positive fp16 values, subnormals included.
  for (uint16_t h = 0; h < 0x7bff; h++) {
    float lo = fp16_decode(h), hi = fp16_decode((uint16_t)(h + 1));
    float mid = (float)(((double)lo + hi) / 2);  // exact: fp16 has 11 bits, float 24
    assert_true((double)mid == ((double)lo + hi) / 2);
    uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
    assert_int_equal(fp16_encode(mid), even);
    assert_int_equal(fp16_encode(-mid), even | 0x8000);
    assert_int_equal(fp16_encode(nextafterf(mid, 0)), h);
    assert_int_equal(fp16_encode(nextafterf(mid, INFINITY)), h + 1);
  }
}

static void test_numerics_fp16_overflow_underflow_and_nan(void **state) {
  (void)state;
  assert_true(round_fp16(65504.0f) == 65504.0f);
  assert_true(round_fp16(nextafterf(65520.0f, 0)) == 65504.0f);
  assert_true(isinf(round_fp16(65520.0f)));  // the tie goes to the even side, which is 2^16
  assert_true(round_fp16(-65520.0f) == -INFINITY);
  assert_true(round_fp16(1e10f) == INFINITY);
  assert_true(round_fp16(INFINITY) == INFINITY);
  assert_true(round_fp16(-INFINITY) == -INFINITY);
  assert_true(round_fp16(0x1p-24f) == 0x1p-24f);            // smallest subnormal
  assert_same_float(round_fp16(0x1p-25f), 0.0f);            // tie to even: 0
  assert_same_float(round_fp16(-0x1p-25f), -0.0f);          // the sign survives underflow
  assert_true(round_fp16(nextafterf(0x1p-25f, 1)) == 0x1p-24f);
  assert_true(round_fp16(0x3p-25f) == 0x1p-23f);            // 1.5 quanta: tie to 2
  assert_true(round_fp16(0x1.ff8p-15f) == 0x1.ff8p-15f);    // largest subnormal, 1023 * 2^-24
  assert_true(round_fp16(0x1.ffcp-15f) == 0x1p-14f);        // tie: up into the normals (even)
  assert_true(round_fp16(1.0f + 0x1p-11f) == 1.0f);         // tie at 1: even is 1
  assert_true(round_fp16(1.0f + 0x3p-11f) == 1.0f + 0x1p-9f);
  assert_true(isnan(round_fp16(NAN)));
  assert_true(isnan(round_fp16(float_of(0x7f800001u))));  // a NaN whose payload fp16 drops
  assert_true(isnan(round_fp16(float_of(0xffc00000u))));
}

static void test_numerics_fp16_and_bf16_match_reference_on_random_floats(void **state) {
  (void)state;
  for (int i = 0; i < 400000; i++) {
    float x = float_of((uint32_t)rng_next());
    if (isnan(x)) continue;
    double want16 = ref_round(x, 10, -14, 65504.0);
    double wantb = ref_round(x, 7, -126, 0x1.fep127);
    if (isinf(x)) want16 = wantb = x;
    assert_true((double)round_fp16(x) == want16);
    assert_true((double)round_bf16(x) == wantb);
    assert_int_equal(signbit(round_fp16(x)) != 0, signbit(x) != 0);
    // And random values in fp16's busy range, where the random bits above rarely land.
    float y = (float)ldexp(rng_uniform() * 2 - 1, (int)(rng_next() % 44) - 28);
    assert_true((double)round_fp16(y) == ref_round(y, 10, -14, 65504.0));
  }
}

// --- bf16 -------------------------------------------------------------------------------------

static void test_numerics_bf16_every_value_round_trips_and_ties_to_even(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float v = float_of(h << 16);
    assert_same_float(bf16_decode((uint16_t)h), v);
    if (isnan(v)) {
      assert_true(isnan(round_bf16(v)));
      continue;
    }
    assert_int_equal(bf16_encode(v), h);
    assert_same_float(round_bf16(v), v);
    if ((h & 0x7fff) >= 0x7f80) continue;  // inf: no upper neighbour
    // The midpoint to the next value up (in magnitude), and its two float neighbours.
    uint32_t mid = (h << 16) | 0x8000u;
    uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    assert_int_equal(bf16_encode(float_of(mid)), even);
    assert_int_equal(bf16_encode(float_of(mid - 1)), h);
    assert_int_equal(bf16_encode(float_of(mid + 1)), h + 1);
  }
}

static void test_numerics_bf16_overflow_and_nan(void **state) {
  (void)state;
  float max = float_of(0x7f7f0000u);
  assert_true(round_bf16(max) == max);
  assert_true(round_bf16(float_of(0x7f7f7fffu)) == max);
  assert_true(isinf(round_bf16(float_of(0x7f7f8000u))));  // tie, and 0x7f7f is odd
  assert_true(round_bf16(-3.4e38f) == -INFINITY);
  // A NaN whose payload lies only in the dropped bits must not become inf.
  assert_true(isnan(round_bf16(float_of(0x7f800001u))));
  assert_true(isnan(round_bf16(float_of(0xff800001u))));
  assert_true(round_bf16(1.0f + 0x1p-8f) == 1.0f);
  assert_true(round_bf16(1.0f + 0x3p-8f) == 1.0f + 0x1p-6f);
  assert_true(round_bf16(float_of(0x00008000u)) == 0.0f);  // subnormal tie to even zero
  assert_true(round_bf16(float_of(0x00018000u)) == float_of(0x00020000u));
}

// --- E4M3 -------------------------------------------------------------------------------------

// The value of an E4M3 code from the OCP definition.
static double e4m3_value(uint8_t c) {
  int exp = (c >> 3) & 15, mant = c & 7;
  double mag = (exp == 15 && mant == 7) ? NAN
               : exp == 0               ? mant / 512.0
                                        : (1.0 + mant / 8.0) * ldexp(1.0, exp - 7);
  return (c & 0x80) ? -mag : mag;
}

static void test_numerics_e4m3_all_codes_decode_and_round_trip(void **state) {
  (void)state;
  int nans = 0;
  for (int c = 0; c < 256; c++) {
    float v = e4m3_decode((uint8_t)c);
    double want = e4m3_value((uint8_t)c);
    if (isnan(want)) {
      nans++;
      assert_true(isnan(v));
      assert_true(isnan(e4m3_round(v)));
      assert_int_equal(e4m3_encode(v) & 0x7f, 0x7f);
      continue;
    }
    assert_true((double)v == want);
    assert_int_equal(e4m3_encode(v), c);
    assert_same_float(e4m3_round(v), v);
  }
  assert_int_equal(nans, 2);
  assert_true(e4m3_decode(0x7e) == 448.0f);
  assert_true(e4m3_decode(0x08) == 0x1p-6f);
  assert_true(e4m3_decode(0x01) == 0x1p-9f);
  assert_true(e4m3_decode(0x38) == 1.0f);
  assert_same_float(e4m3_decode(0x80), -0.0f);
}

static void test_numerics_e4m3_midpoints_tie_to_even(void **state) {
  (void)state;
  for (int c = 0; c < 0x7e; c++) {
    double lo = e4m3_value((uint8_t)c), hi = e4m3_value((uint8_t)(c + 1));
    float mid = (float)((lo + hi) / 2);
    int even = (c & 1) ? c + 1 : c;
    assert_int_equal(e4m3_encode(mid), even);
    assert_int_equal(e4m3_encode(-mid), even | 0x80);
    assert_int_equal(e4m3_encode(nextafterf(mid, 0)), c);
    assert_int_equal(e4m3_encode(nextafterf(mid, INFINITY)), c + 1);
    assert_true((double)e4m3_round(mid) == e4m3_value((uint8_t)even));
  }
}

static void test_numerics_e4m3_saturates_and_keeps_nan(void **state) {
  (void)state;
  const float big[] = {448.5f, 464.0f, 479.9f, 480.0f, 1e6f, 3e38f, INFINITY};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
    assert_true(e4m3_round(big[i]) == 448.0f);
    assert_true(e4m3_round(-big[i]) == -448.0f);
  }
  assert_true(isnan(e4m3_round(NAN)));
  assert_true(isnan(e4m3_round(-NAN)));
  assert_same_float(e4m3_round(0x1p-10f), 0.0f);  // half the smallest subnormal: tie to 0
  assert_same_float(e4m3_round(-0x1p-11f), -0.0f);
  assert_true(e4m3_round(nextafterf(0x1p-10f, 1)) == 0x1p-9f);
  assert_true(e4m3_round(0.1f) == 0.1015625f);    // 0.1 = 1.6 * 2^-4 -> 1.625 * 2^-4
  assert_true(e4m3_round(300.0f) == 288.0f);      // quantum 32 at 2^8: 300 -> 288
  assert_true(e4m3_round(304.0f) == 320.0f);      // tie between 288 (odd) and 320 (even)
}

// --- fp8 with a per-tensor scale --------------------------------------------------------------

static void test_numerics_fp8_quantize_hand_checked(void **state) {
  (void)state;
  float x[] = {3.5f, -1.75f, 0.1f, 0.0f, 1e-4f};
  float out[5];
  float scale = fp8_quantize(x, out, 5);
  assert_true(scale == 0x1p-7f);             // 3.5 / 448, exact
  assert_true(out[0] == 3.5f);               // 448 * 2^-7
  assert_true(out[1] == -1.75f);             // -224 * 2^-7
  assert_true(out[2] == 13.0f * 0x1p-7f);    // 12.8 -> 13 (quantum 1 in [8, 16))
  assert_same_float(out[3], 0.0f);
  assert_true(out[4] == 0x1p-9f * 0x1p-7f * 7);  // 0.0128 = 6.55 * 2^-9 -> 7 * 2^-9

  // In place, and a tensor of zeros gets scale 1.
  float z[3] = {0.0f, -0.0f, 0.0f};
  assert_true(fp8_quantize(z, z, 3) == 1.0f);
  assert_same_float(z[1], -0.0f);
  memcpy(out, x, sizeof x);
  assert_true(fp8_quantize(out, out, 5) == scale);
  assert_true(out[2] == 13.0f * 0x1p-7f);
}

static void test_numerics_fp8_quantize_skips_nonfinite_in_amax(void **state) {
  (void)state;
  float x[] = {NAN, 2.0f, -INFINITY, 0.5f};
  float out[4];
  float scale = fp8_quantize(x, out, 4);
  assert_true(scale == 2.0f / 448.0f);
  assert_true(isnan(out[0]));
  assert_true(out[1] == e4m3_round(2.0f / scale) * scale);
  assert_true(out[2] == -448.0f * scale);  // saturated, not inf
}

static void test_numerics_fp8_error_within_half_ulp_on_normal_data(void **state) {
  (void)state;
  enum { N = 4096 };
  static float x[N], out[N];
  for (int i = 0; i < N; i++) x[i] = (float)rng_normal();
  float scale = fp8_quantize(x, out, N);
  for (int i = 0; i < N; i++) {
    double err = fabs((double)out[i] - x[i]);
    if (fabs(x[i]) / scale >= 0x1p-6)
      assert_true(err <= 0x1p-4 * fabs(x[i]) * (1 + 1e-6));  // half an ulp of a 3-bit mantissa
    else
      assert_true(err <= 0x1p-10 * scale * (1 + 1e-6));      // half the subnormal quantum
  }
}

// --- mxfp8 ------------------------------------------------------------------------------------

static void test_numerics_mxfp8_block_exponent(void **state) {
  (void)state;
  assert_int_equal(mxfp8_block_exponent(1.0f), -8);
  assert_int_equal(mxfp8_block_exponent(448.0f), 0);
  assert_int_equal(mxfp8_block_exponent(511.9f), 0);
  assert_int_equal(mxfp8_block_exponent(512.0f), 1);
  assert_int_equal(mxfp8_block_exponent(0.75f), -9);
  assert_int_equal(mxfp8_block_exponent(3.0f), -7);
  assert_int_equal(mxfp8_block_exponent(0.0f), 0);              // zero block: scale 1
  assert_int_equal(mxfp8_block_exponent(0x1p-140f), -127);      // clamped to E8M0's range
  assert_int_equal(mxfp8_block_exponent(0x1p-149f), -127);      // subnormal amax
  assert_int_equal(mxfp8_block_exponent(0x1p-119f), -127);
  assert_int_equal(mxfp8_block_exponent(0x1p-118f), -126);
  assert_int_equal(mxfp8_block_exponent(3.4e38f), 119);         // floor(log2 FLT_MAX) - 8
}

static void test_numerics_mxfp8_hand_checked_block(void **state) {
  (void)state;
  float x[32] = {0}, out[32];
  x[0] = 7.9f;   // amax: scale 2^(2-8) = 2^-6; 7.9 * 64 = 505.6 clamps to 448 -> 7.0
  x[1] = 0.1f;   // 6.4 -> 6.5 (quantum 0.5 in [4, 8)) -> 6.5 / 64
  x[2] = 1e-4f;  // 0.0064 = 3.28 * 2^-9 -> 3 * 2^-9 -> 3 * 2^-15
  x[3] = -3.0f;  // -192, exact
  x[31] = -7.5f; // -480 clamps to -448 -> -7.0
  mxfp8_quantize(x, out, 1, 32, 1);
  assert_true(out[0] == 7.0f);
  assert_true(out[1] == 6.5f / 64);
  assert_true(out[2] == 3 * 0x1p-15f);
  assert_true(out[3] == -3.0f);
  assert_true(out[31] == -7.0f);
  for (int i = 4; i < 31; i++) assert_same_float(out[i], 0.0f);
  // The same block read down a column (k_contiguous = 0) gives the same values.
  float col[32];
  mxfp8_quantize(x, col, 32, 1, 0);
  assert_memory_equal(col, out, sizeof out);
}

// A [rows, cols] matrix whose blocks are checked one by one: every element of a block must
// equal e4m3_round(x / 2^e) * 2^e with e from that block's own amax.
static void check_blocks(const float *x, const float *out, size_t rows, size_t cols, int kc) {
  size_t nk = kc ? cols : rows, nother = kc ? rows : cols;
  for (size_t o = 0; o < nother; o++)
    for (size_t k0 = 0; k0 < nk; k0 += 32) {
      size_t len = nk - k0 < 32 ? nk - k0 : 32;
      float amax = 0;
      for (size_t k = k0; k < k0 + len; k++) {
        size_t i = kc ? o * cols + k : k * cols + o;
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
      }
      double scale = ldexp(1.0, mxfp8_block_exponent(amax));
      for (size_t k = k0; k < k0 + len; k++) {
        size_t i = kc ? o * cols + k : k * cols + o;
        assert_true((double)out[i] == (double)e4m3_round((float)(x[i] / scale)) * scale);
      }
    }
}

static void test_numerics_mxfp8_both_layouts_and_short_last_block(void **state) {
  (void)state;
  enum { R = 5, C = 70 };  // 70 = 32 + 32 + 6: a short last block
  static float x[R * C], out[R * C], xt[C * R], outt[C * R];
  for (int i = 0; i < R * C; i++) x[i] = (float)(rng_normal() * 0.01);
  // Row 1: 0.01 everywhere in its short last block but one 1e4, whose scale 2^(13-8) = 32
  // puts 0.01 below half of E4M3's smallest step (2^-9 * 32): it flushes to zero there.
  for (int c = 64; c < 70; c++) x[1 * C + c] = 0.01f;
  x[1 * C + 66] = 1e4f;
  mxfp8_quantize(x, out, R, C, 1);
  check_blocks(x, out, R, C, 1);
  for (int c = 64; c < 70; c++)
    if (c != 66) assert_same_float(out[1 * C + c], 0.0f);
  // The other blocks of row 1 keep E4M3's relative precision (1/8 at worst, when the block's
  // amax itself is clamped to 448 times the scale).
  for (int c = 0; c < 64; c++)
    assert_true(fabs(out[1 * C + c] - x[1 * C + c]) <= 0.125 * fabs(x[1 * C + c]) + 1e-6);
  // The transpose with k_contiguous = 0 blocks the same elements.
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) xt[c * R + r] = x[r * C + c];
  mxfp8_quantize(xt, outt, C, R, 0);
  check_blocks(xt, outt, C, R, 0);
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) assert_same_float(outt[c * R + r], out[r * C + c]);
  // In place.
  mxfp8_quantize(x, x, R, C, 1);
  assert_memory_equal(x, out, sizeof out);
}

static void test_numerics_mxfp8_zero_block_and_nan(void **state) {
  (void)state;
  float x[64] = {0}, out[64];
  x[32] = NAN;
  x[33] = 1.0f;
  x[34] = -INFINITY;
  mxfp8_quantize(x, out, 1, 64, 1);
  for (int i = 0; i < 32; i++) assert_same_float(out[i], 0.0f);
  assert_true(isnan(out[32]));
  assert_true(out[33] == 1.0f);  // amax 1 (finite values only): scale 2^-8
  assert_true(out[34] == -448.0f * 0x1p-8f);
}

static void test_numerics_mxfp8_relative_error_of_normal_matrix(void **state) {
  (void)state;
  enum { R = 64, C = 96 };
  static float x[R * C], out[R * C];
  for (int i = 0; i < R * C; i++) x[i] = (float)rng_normal();
  for (int kc = 0; kc <= 1; kc++) {
    mxfp8_quantize(x, out, R, C, kc);
    double num = 0, den = 0;
    for (int i = 0; i < R * C; i++) {
      num += ((double)out[i] - x[i]) * ((double)out[i] - x[i]);
      den += (double)x[i] * x[i];
    }
    double rel = sqrt(num / den);
    print_message("mxfp8 k_contiguous=%d: relative error %.4f (bound 2^-4 = 0.0625)\n", kc, rel);
    assert_true(rel > 0.005 && rel < 0x1p-4);
  }
}

// --- storage dtypes ---------------------------------------------------------------------------

static void test_numerics_round_to_dtype_per_dtype(void **state) {
  (void)state;
  float x = 1.0f + 0x1p-20f + 0x1p-9f;  // not a bf16 or an fp16 value
  assert_true(round_to_dtype(x, DT_F32) == x);
  assert_true(round_to_dtype(x, DT_F64) == x);
  assert_true(round_to_dtype(x, DT_I64) == x);
  assert_true(round_to_dtype(x, DT_BF16) == round_bf16(x));
  assert_true(round_to_dtype(x, DT_FP16) == round_fp16(x));
  assert_true(round_to_dtype(x, DT_FP8) == round_bf16(x));  // fp8 outputs are stored as bf16
  assert_true(round_to_dtype(x, DT_MXFP8) == round_bf16(x));
  assert_true(round_bf16(x) != x && round_fp16(x) != x && round_bf16(x) != round_fp16(x));

  const DType all[] = {DT_F32, DT_BF16, DT_FP16, DT_FP8, DT_MXFP8, DT_F64, DT_I64};
  for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) {
    float a[100];
    for (int i = 0; i < 100; i++) a[i] = (float)(rng_normal() * 1000);
    float b[100];
    memcpy(b, a, sizeof a);
    round_array(b, 100, all[t]);
    for (int i = 0; i < 100; i++) assert_same_float(b[i], round_to_dtype(a[i], all[t]));
  }
}

// --- activations ------------------------------------------------------------------------------

static void test_numerics_act_forward_known_values(void **state) {
  (void)state;
  assert_true(act_forward(ACT_NONE, -2.5) == -2.5);
  assert_true(fabs(act_forward(ACT_SILU, 1.0) - 0.7310585786300049) < 1e-15);
  assert_true(fabs(act_forward(ACT_GELU, 1.0) - 0.8413447460685429) < 1e-15);
  assert_true(fabs(act_forward(ACT_GELU, -1.0) - (-0.15865525393145707)) < 1e-15);
  assert_true(act_forward(ACT_RELU, -1.0) == 0.0 && act_forward(ACT_RELU, 2.0) == 2.0);
  assert_true(act_forward(ACT_SIGMOID, 0.0) == 0.5);
  // The 6th-order series gelu_taylor used to be, term by term.
  double x = 0.7, s = 1 / sqrt(2 * M_PI);
  double series = 0.5 * x + x * x * s - pow(x, 4) * s / 6 + pow(x, 6) * s / 40;
  assert_true(fabs(gelu_series6(x) - series) < 1e-15);
  // gelu_taylor: the polynomial, then x or 0 beyond the clamp; exact at 0; NaN stays NaN.
  assert_true(act_forward(ACT_GELU_TAYLOR, x) == gelu_taylor(x));
  assert_true(act_grad(ACT_GELU_TAYLOR, x) == gelu_taylor_grad(x));
  const float *a = gelu_taylor_coef;
  double t = x * x, poly = 0;
  for (int k = 0; k < 8; k++) poly += a[k] * pow(t, k + 1);
  assert_true(fabs(gelu_taylor(x) - (0.5 * x + poly)) < 1e-15);
  assert_true(fabs(gelu_taylor(1.0) - 0.8413447460685429) < GELU_TAYLOR_ERROR);
  assert_true(gelu_taylor(0.0) == 0.0);
  assert_true(gelu_taylor(GELU_TAYLOR_CLAMP) == GELU_TAYLOR_CLAMP && gelu_taylor(7.5) == 7.5);
  assert_true(gelu_taylor(-GELU_TAYLOR_CLAMP) == 0.0 && gelu_taylor(-7.5) == 0.0);
  assert_true(gelu_taylor_grad(7.5) == 1.0 && gelu_taylor_grad(-7.5) == 0.0);
  assert_true(gelu_taylor(INFINITY) == INFINITY && gelu_taylor(-INFINITY) == 0.0);
  assert_true(isnan(gelu_taylor(NAN)) && isnan(gelu_taylor_grad(NAN)));
  // Continuous at the clamp (the fit moved the fp32 coefficients to keep q(C^2) = C/2).
  double below = nextafter(GELU_TAYLOR_CLAMP, 0);
  assert_true(fabs(gelu_taylor(below) - GELU_TAYLOR_CLAMP) < 1e-9);
  assert_true(fabs(gelu_taylor(-below)) < 1e-9);
  // Far tails stay finite.
  assert_true(act_forward(ACT_SIGMOID, -800) == 0.0 && act_forward(ACT_SIGMOID, 800) == 1.0);
  assert_true(act_forward(ACT_SILU, -800) == 0.0 && act_forward(ACT_SILU, 800) == 800.0);
  assert_true(act_grad(ACT_SILU, -800) == 0.0 && act_grad(ACT_SIGMOID, 800) == 0.0);
  assert_true(act_forward(ACT_GELU, -40) == 0.0 && act_forward(ACT_GELU, 40) == 40.0);
}

static void test_numerics_act_grad_matches_central_differences(void **state) {
  (void)state;
  const Act acts[] = {ACT_NONE, ACT_SILU, ACT_GELU, ACT_GELU_TAYLOR, ACT_RELU, ACT_SIGMOID};
  const double h = 1e-5;
  for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
    int checked = 0;
    for (double x = -6.0; x <= 6.0; x += 0.0173) {
      if (acts[a] == ACT_RELU && fabs(x) < 2 * h) continue;  // the kink
      double fd = (act_forward(acts[a], x + h) - act_forward(acts[a], x - h)) / (2 * h);
      double g = act_grad(acts[a], x);
      double tol = 1e-7 * (1 + fabs(g));
      if (fabs(fd - g) > tol)
        fail_msg("%s at x=%g: act_grad %.12g, central difference %.12g", act_name(acts[a]), x, g,
                 fd);
      checked++;
    }
    assert_true(checked > 600);
  }
  assert_true(act_grad(ACT_RELU, 0.0) == 0.0);
  assert_true(act_grad(ACT_RELU, 1e-300) == 1.0);
  assert_true(act_grad(ACT_GELU, 0.0) == 0.5 && act_grad(ACT_GELU_TAYLOR, 0.0) == 0.5);
}

static void call_softmax_forward(void) { (void)act_forward(ACT_SOFTMAX, 1.0); }
static void call_softmax_grad(void) { (void)act_grad(ACT_SOFTMAX, 1.0); }

// Runs fn in a child with stderr silenced and expects an internal error (exit code 3).
static void assert_internal_error(void (*fn)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stderr)) _exit(99);
    fn();
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), GEMC_EXIT_INTERNAL);
}

static void test_numerics_softmax_is_not_pointwise(void **state) {
  (void)state;
  assert_internal_error(call_softmax_forward);
  assert_internal_error(call_softmax_grad);
}

// The design overview's table of the old 6th-order series, to two significant digits.
static void test_numerics_gelu_series6_error_table(void **state) {
  (void)state;
  const struct {
    double r, err;
  } table[] = {{0.5, 4.5e-6}, {1.0, 1.1e-3}, {1.5, 2.5e-2}, {2.0, 0.22}, {3.0, 4.0}};
  double prev = 0;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    double got = max_abs_error(gelu_series6, gelu_exact, 0.0, table[i].r, 100000);
    double unit = pow(10.0, floor(log10(table[i].err)) - 1);  // the second significant digit
    print_message("series max error |x| <= %.1f: %.4g (table %.2g)\n", table[i].r, got,
                  table[i].err);
    if (fabs(got - table[i].err) > 0.5 * unit)
      fail_msg("r=%g: %.6g does not round to %.2g", table[i].r, got, table[i].err);
    assert_true(got > prev);
    prev = got;
  }
  assert_true(isnan(max_abs_error(gelu_series6, gelu_exact, 1.0, -1.0, 10)));
  assert_true(isnan(max_abs_error(gelu_series6, gelu_exact, 0.0, INFINITY, 10)));
  assert_true(isnan(max_abs_error(gelu_series6, gelu_exact, 0.0, 1.0, 0)));
}

// The grid of docs/activations.md's table: [-10, 10] every 1e-4. Between two samples the error
// moves by at most |error'| * 5e-5 < 3e-8 (|error'| <= GELU_TAYLOR_GRAD_ERROR), under the margin
// between the measured maximum and the stated bound; beyond |x| = 10 gelu_taylor is x or 0
// and GELU's distance from them, |x| Q(|x|), only shrinks.
enum { GRID = 200000 };

// gelu_taylor keeps the bound it states over the whole grid, value and derivative; the old
// series breaks it by far at |x| = 3 (so this test can fail), and the guarded series and the
// tanh form, the other candidates, are looser.
static void test_numerics_gelu_taylor_within_its_bound(void **state) {
  (void)state;
  double value = max_abs_error(gelu_taylor, gelu_exact, -10, 10, GRID);
  double grad = max_abs_error(gelu_taylor_grad, gelu_exact_grad, -10, 10, GRID);
  print_message("gelu_taylor on [-10, 10]: |error| %.4e (bound %.1e), derivative %.4e (bound "
                "%.1e)\n", value, GELU_TAYLOR_ERROR, grad, GELU_TAYLOR_GRAD_ERROR);
  assert_true(value <= GELU_TAYLOR_ERROR);
  assert_true(grad <= GELU_TAYLOR_GRAD_ERROR);
  assert_true(value > 0.9 * GELU_TAYLOR_ERROR);  // the bound is tight, not a loose guess
  assert_true(gelu_taylor_max_error(10.0) == max_abs_error(gelu_taylor, gelu_exact, 0, 10,
                                                           100000));
  // Far out, and on the negative side, where GELU's tail is 0 to within |x| Q(|x|).
  const double far[] = {-1e30, -1e6, -42.0, 42.0, 1e6, 1e30};
  for (size_t i = 0; i < sizeof far / sizeof far[0]; i++)
    assert_true(fabs(gelu_taylor(far[i]) - gelu_exact(far[i])) <= GELU_TAYLOR_ERROR);

  double old_at_3 = fabs(gelu_series6(3.0) - gelu_exact(3.0));
  print_message("old series at |x| = 3: |error| %.4g\n", old_at_3);
  assert_true(old_at_3 > GELU_TAYLOR_ERROR);
  assert_true(old_at_3 > 3.9);
  assert_true(fabs(gelu_series6(-3.0) - gelu_exact(-3.0)) > GELU_TAYLOR_ERROR);

  double guarded = max_abs_error(gelu_guarded, gelu_exact, -10, 10, GRID);
  double guarded_grad = max_abs_error(gelu_guarded_grad, gelu_exact_grad, -10, 10, GRID);
  double tanh_form = max_abs_error(gelu_tanh_form, gelu_exact, -10, 10, GRID);
  print_message("guarded series: %.4e, derivative %.4e; tanh form %.4e\n", guarded,
                guarded_grad, tanh_form);
  assert_true(guarded > 5 * GELU_TAYLOR_ERROR && guarded_grad > GELU_TAYLOR_GRAD_ERROR);
  assert_true(guarded <= tanh_form * (1 + 1e-12));  // the guard keeps the tanh form's bound
}

// gelu_taylor as the fp32 attention kernels evaluate it (kernels/attention.cuh, attn_act and
// attn_act_grad): Horner in float with the fp32 coefficients, contracted to FMA as NVRTC does
// (fma = 1) or not, as the CPU emulation of the kernels does (fma = 0).
static float horner_f32(const float *c, float t, int fma) {
  float p = c[7];
  for (int k = 6; k >= 0; k--) {
    if (fma) {
      p = fmaf(p, t, c[k]);
    } else {
      volatile float m = p * t;  // no contraction
      p = m + c[k];
    }
  }
  return p;
}

static float gelu_taylor_f32(float x, int fma) {
  float t = x * x, p = horner_f32(gelu_taylor_coef, t, fma);
  volatile float m = t * p;
  float y = fma ? fmaf(t, p, 0.5f * x) : 0.5f * x + m;
  const float c = (float)GELU_TAYLOR_CLAMP;
  return x >= c ? x : (x <= -c ? 0.0f : y);
}

static float gelu_taylor_grad_f32(float x, int fma) {
  float d[8];
  for (int k = 0; k < 8; k++) d[k] = (float)(k + 1) * gelu_taylor_coef[k];
  float p = horner_f32(d, x * x, fma);
  volatile float m = 2.0f * x * p;
  float y = fma ? fmaf(2.0f * x, p, 0.5f) : 0.5f + m;
  const float c = (float)GELU_TAYLOR_CLAMP;
  return x >= c ? 1.0f : (x <= -c ? 0.0f : y);
}

static void test_numerics_gelu_taylor_fp32_rounding_within_its_bound(void **state) {
  (void)state;
  for (int fma = 0; fma <= 1; fma++) {
    double value = 0, grad = 0, total = 0;
    for (int i = 0; i <= GRID; i++) {
      float x = (float)(-10.0 + 20.0 * i / GRID);
      value = fmax(value, fabs(gelu_taylor_f32(x, fma) - gelu_taylor(x)));
      grad = fmax(grad, fabs(gelu_taylor_grad_f32(x, fma) - gelu_taylor_grad(x)));
      total = fmax(total, fabs(gelu_taylor_f32(x, fma) - gelu_exact(x)));
    }
    print_message("fp32%s: |fp32 - double| %.3e (bound %.1e), derivative %.3e (bound %.1e); "
                  "|error| %.4e\n", fma ? " with fma" : "", value, GELU_TAYLOR_FP32_ROUNDING,
                  grad, GELU_TAYLOR_FP32_GRAD_ROUNDING, total);
    assert_true(value <= GELU_TAYLOR_FP32_ROUNDING);
    assert_true(grad <= GELU_TAYLOR_FP32_GRAD_ROUNDING);
    assert_true(total <= GELU_TAYLOR_ERROR + GELU_TAYLOR_FP32_ROUNDING);
  }
}

// The value of `#define NAME literal` in `text`, NAN when it is not there; *suffix is the
// character after the number ('f' for a float literal).
static double define_value(const char *text, const char *name, char *suffix) {
  char key[64];
  snprintf(key, sizeof key, "#define %s ", name);
  const char *at = strstr(text, key);
  if (!at) return NAN;
  char *end;
  double v = strtod(at + strlen(key), &end);
  *suffix = *end;
  return v;
}

static void assert_same_coefficients(const char *text, const char *where) {
  for (int k = 0; k < 8; k++) {
    char name[32];
    snprintf(name, sizeof name, "GELU_TAYLOR_A%d", k + 1);
    char suffix;
    double v = define_value(text, name, &suffix);
    if ((float)v != gelu_taylor_coef[k])
      fail_msg("%s: %s is %.10g, numerics.c has %.10g", where, name, v, gelu_taylor_coef[k]);
    assert_int_equal(suffix, 'f');  // a float literal: in double code too it is the fp32 value
  }
  char suffix;
  assert_true(define_value(text, "GELU_TAYLOR_CLAMP", &suffix) == GELU_TAYLOR_CLAMP);
}

// The GPU kernels compute the CPU executor's gelu_taylor: the prelude's macros (which the
// attention kernels use) and the CPU stand-in for the prelude carry numerics.c's coefficients.
static void test_numerics_gelu_taylor_kernels_carry_the_same_coefficients(void **state) {
  (void)state;
  assert_same_coefficients(kernel_prelude_cuh, "kernels/prelude.cuh");
  // attn_act and attn_act_grad evaluate those macros, with no coefficient of their own.
  const char *at = strstr(kernel_attention_cuh, "ACT == ATTN_ACT_GELU_TAYLOR");
  assert_non_null(at);
  assert_non_null(strstr(at, "GELU_TAYLOR_A8"));
  assert_non_null(strstr(at, "GELU_TAYLOR_CLAMP"));
  at = strstr(at + 1, "ACT == ATTN_ACT_GELU_TAYLOR");
  assert_non_null(at);
  assert_non_null(strstr(at, "8.0f * GELU_TAYLOR_A8"));
  assert_null(strstr(kernel_attention_cuh, "40.0f"));  // the old series' last term
  static char text[1 << 16];
  FILE *f = fopen("tests/codegen/prelude_on_cpu.h", "r");
  if (!f) return;  // run from elsewhere than the repository root
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  assert_same_coefficients(text, "tests/codegen/prelude_on_cpu.h");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_numerics_fp16_every_value_round_trips),
      cmocka_unit_test(test_numerics_fp16_ties_go_to_even),
      cmocka_unit_test(test_numerics_fp16_overflow_underflow_and_nan),
      cmocka_unit_test(test_numerics_fp16_and_bf16_match_reference_on_random_floats),
      cmocka_unit_test(test_numerics_bf16_every_value_round_trips_and_ties_to_even),
      cmocka_unit_test(test_numerics_bf16_overflow_and_nan),
      cmocka_unit_test(test_numerics_e4m3_all_codes_decode_and_round_trip),
      cmocka_unit_test(test_numerics_e4m3_midpoints_tie_to_even),
      cmocka_unit_test(test_numerics_e4m3_saturates_and_keeps_nan),
      cmocka_unit_test(test_numerics_fp8_quantize_hand_checked),
      cmocka_unit_test(test_numerics_fp8_quantize_skips_nonfinite_in_amax),
      cmocka_unit_test(test_numerics_fp8_error_within_half_ulp_on_normal_data),
      cmocka_unit_test(test_numerics_mxfp8_block_exponent),
      cmocka_unit_test(test_numerics_mxfp8_hand_checked_block),
      cmocka_unit_test(test_numerics_mxfp8_both_layouts_and_short_last_block),
      cmocka_unit_test(test_numerics_mxfp8_zero_block_and_nan),
      cmocka_unit_test(test_numerics_mxfp8_relative_error_of_normal_matrix),
      cmocka_unit_test(test_numerics_round_to_dtype_per_dtype),
      cmocka_unit_test(test_numerics_act_forward_known_values),
      cmocka_unit_test(test_numerics_act_grad_matches_central_differences),
      cmocka_unit_test(test_numerics_softmax_is_not_pointwise),
      cmocka_unit_test(test_numerics_gelu_series6_error_table),
      cmocka_unit_test(test_numerics_gelu_taylor_within_its_bound),
      cmocka_unit_test(test_numerics_gelu_taylor_fp32_rounding_within_its_bound),
      cmocka_unit_test(test_numerics_gelu_taylor_kernels_carry_the_same_coefficients),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
