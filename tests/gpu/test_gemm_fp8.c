// test_gemm_fp8.c: cuBLASLt's FP8 GEMMs as the plan runs them (runtime/gpu/cublaslt.c,
// gemm_run_scaled; codegen/ops/lower_gemm.c writes the operands) against a CPU fp64 reference,
// on a machine with a GPU (tests/gpu/run.sh runs it; each case prints PASS or FAIL and the exit
// status counts the failures).
//
// A and B are random E4M3 codes, both K-major ([m, k] and [n, k]), with zero padding past a
// "true" k (as the quantize kernels pad a jagged reduction to a multiple of 16), and the two
// scales are random floats in device memory. The reference decodes the codes exactly (every
// E4M3 value is a float), so the only error is the accumulation and the scaling. Hopper's FP8
// MMA adds its products into a narrower accumulator than fp32 between cuBLASLt's promotions to
// fp32 (measured on the H200: errors up to 2.4e-4 of S at k = 128, 22 times what fp32 sums
// give), so per element, with S = sa · sb · Σ |a b|:
//   |gpu - ref| <= 2^-20 |ref| + (16 sqrt(k + 1) 2^-24 + 2^-10) S
// That is 4x the measured error, and far below E4M3's own rounding (2^-4 of each operand). A
// wrong operand order, scale or layout is off by the order of |ref| itself, about S / sqrt(k)
// for these random signs (S / 307 at the largest k here). Then the shapes
// cuBLASLt's FP8 kernels do not take are refused with a message, before any launch.
//
// usage: test_gemm_fp8
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublaslt.h"
#include "cuda_driver.h"
#include "gpu_check.h"
#include "numerics.h"

typedef struct Case {
  int64_t m, n, k, k_true;  // k: the GEMM's (a multiple of 16); k_true: where the padding starts
  float scale_a, scale_b;
  float beta;
} Case;

static const Case cases[] = {
    {1, 128, 128, 128, 0.5f, 0.25f, 0},
    {7, 128, 128, 128, 3.0f / 448.0f, 1.7f / 448.0f, 0},
    {1024, 128, 128, 128, 0.01f, 0.02f, 0},     // gem_full's pFFN q projection
    {94289, 128, 128, 128, 0.003f, 0.05f, 0},   // a jagged row count
    {128, 128, 94304, 94289, 0.001f, 0.002f, 0},  // a weight gradient: k = M padded to 16
    {128, 128, 16, 1, 1.0f, 1.0f, 0},           // one row of the reduction
    {300, 260, 1024, 1000, 0.2f, 0.3f, 0},
    {64, 64, 64, 64, 0.1f, 0.1f, 1.0f},         // beta = 1 accumulates into C
};
enum { NUM_CASES = (int)(sizeof cases / sizeof cases[0]) };

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static double uniform(void) {  // [-1, 1)
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) * 0x1.0p-52 - 1.0;
}

// A random finite E4M3 code: a value uniform in [-448, 448) rounded.
static uint8_t random_code(void) { return e4m3_encode((float)(uniform() * 448.0)); }

static bool upload(CUdeviceptr *d, const void *h, size_t bytes) {
  const CudaDriver *cu = cuda_driver();
  return CU_CHECK(cu->cuMemAlloc(d, bytes ? bytes : 16)) &&
         (bytes == 0 || CU_CHECK(cu->cuMemcpyHtoD(*d, h, bytes)));
}

static void run_case(Gemm *g, const Case *c) {
  const CudaDriver *cu = cuda_driver();
  char err[1024], what[160];
  snprintf(what, sizeof what, "fp8 GEMM m=%lld n=%lld k=%lld (%lld before the padding)%s",
           (long long)c->m, (long long)c->n, (long long)c->k, (long long)c->k_true,
           c->beta != 0 ? " beta=1" : "");
  size_t a_n = (size_t)(c->m * c->k), b_n = (size_t)(c->n * c->k), c_n = (size_t)(c->m * c->n);
  uint8_t *a = calloc(a_n + 1, 1), *b = calloc(b_n + 1, 1);
  float *c0 = malloc(c_n * 4 + 4), *out = malloc(c_n * 4 + 4);
  for (int64_t i = 0; i < c->m; i++)
    for (int64_t k = 0; k < c->k_true; k++) a[i * c->k + k] = random_code();
  for (int64_t j = 0; j < c->n; j++)
    for (int64_t k = 0; k < c->k_true; k++) b[j * c->k + k] = random_code();
  for (size_t i = 0; i < c_n; i++) c0[i] = (float)uniform();
  // Each scale in an allocation of its own, as the plan gives each a scratch slot (aligned).
  CUdeviceptr da = 0, db = 0, dc = 0, dsa = 0, dsb = 0;
  bool ok = upload(&da, a, a_n) && upload(&db, b, b_n) && upload(&dc, c0, c_n * 4) &&
            upload(&dsa, &c->scale_a, 4) && upload(&dsb, &c->scale_b, 4);
  if (!ok) snprintf(err, sizeof err, "%s", cuda_last_error());
  GemmShape s = {.m = c->m, .n = c->n, .k = c->k, .trans_b = true, .dtype = DT_FP8,
                 .c_dtype = DT_F32, .alpha = 1.0f, .beta = c->beta, .act = ACT_NONE};
  if (ok) ok = gemm_run_scaled(g, &s, da, db, dc, 0, dsa, dsb, NULL, err, sizeof err);
  if (ok && !(CU_CHECK(cu->cuCtxSynchronize()) && CU_CHECK(cu->cuMemcpyDtoH(out, dc, c_n * 4)))) {
    snprintf(err, sizeof err, "%s", cuda_last_error());
    ok = false;
  }
  if (!ok) {
    check(false, "%s: %s", what, err);
  } else {
    double worst = 0, acc = 16.0 * sqrt((double)c->k + 1.0) * ldexp(1.0, -24) + ldexp(1.0, -10);
    int64_t wi = 0, wj = 0;
    double *ra = malloc((size_t)c->k * sizeof(double) + 8), *rb = malloc(b_n * sizeof(double) + 8);
    for (size_t i = 0; i < b_n; i++) rb[i] = e4m3_decode(b[i]);
    for (int64_t i = 0; i < c->m; i++) {
      for (int64_t k = 0; k < c->k; k++) ra[k] = e4m3_decode(a[i * c->k + k]);
      for (int64_t j = 0; j < c->n; j++) {
        double sum = 0, mag = 0;
        const double *y = rb + j * c->k;
        for (int64_t k = 0; k < c->k_true; k++) {
          double p = ra[k] * y[k];
          sum += p, mag += fabs(p);
        }
        double sc = (double)c->scale_a * c->scale_b;
        double ref = sum * sc + (double)c->beta * c0[i * c->n + j];
        double got = out[i * c->n + j];
        double ratio = fabs(got - ref) / (ldexp(1.0, -20) * fabs(ref) + acc * mag * sc +
                                          ldexp(1.0, -23) * fabs((double)c->beta * c0[i * c->n + j]) + 1e-30);
        if (!(ratio <= worst)) worst = isnan(ratio) ? INFINITY : ratio, wi = i, wj = j;
      }
    }
    free(ra), free(rb);
    check(worst <= 1.0, "%s: worst error %.3g of the tolerance (at %lld, %lld)", what, worst,
          (long long)wi, (long long)wj);
  }
  cu->cuMemFree(da), cu->cuMemFree(db), cu->cuMemFree(dc), cu->cuMemFree(dsa), cu->cuMemFree(dsb);
  free(a), free(b), free(c0), free(out);
}

// Shapes the FP8 kernels cannot take are refused with a reason, and nothing is launched.
static void check_refusals(Gemm *g) {
  GemmShape base = {.m = 64, .n = 64, .k = 64, .trans_b = true, .dtype = DT_FP8,
                    .c_dtype = DT_F32, .alpha = 1.0f, .act = ACT_NONE};
  struct {
    const char *what, *expect;
    GemmShape s;
    bool scales;
  } bad[] = {
      {"A^T", "K-major", base, true},
      {"k = 40", "multiple of 16", base, true},
      {"a bf16 C", "fp32 C", base, true},
      {"a bias", "no bias", base, true},
      {"no scales", "scales", base, false},
      {"a scale 4 bytes past 16", "16-byte aligned", base, true},
  };
  bad[0].s.trans_a = true;
  bad[1].s.k = 40;
  bad[2].s.c_dtype = DT_BF16;
  bad[3].s.has_bias = true;
  bad[3].s.bias_dtype = DT_F32;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char err[512] = "";
    // Pointers that would fault if used: the refusal comes before any launch.
    CUdeviceptr scale = !bad[i].scales ? 0 : i == 5 ? 20 : 16;
    bool ran = gemm_run_scaled(g, &bad[i].s, 16, 16, 16, 16, scale, scale, NULL, err, sizeof err);
    check(!ran && strstr(err, bad[i].expect) != NULL, "fp8 GEMM with %s is refused: %s",
          bad[i].what, err);
  }
}

int main(void) {
  char err[1024];
  CudaContext ctx;
  if (!cuda_context_open(&ctx, -1, err, sizeof err)) {
    printf("FAIL no GPU: %s\n", err);
    return 1;
  }
  Gemm *g = gemm_open(err, sizeof err);
  if (!g) {
    printf("FAIL cuBLASLt: %s\n", err);
    return 1;
  }
  printf("cuBLASLt %zu FP8 GEMMs on %s (%s)\n", gemm_library_version(g), ctx.name, ctx.arch);
  check_refusals(g);
  for (int i = 0; i < NUM_CASES; i++) run_case(g, &cases[i]);
  gemm_close(g);
  printf("%d of %d fp8 GEMM checks passed\n", gpu_check_count - gpu_check_failures,
         gpu_check_count);
  return gpu_check_failures ? 1 : 0;
}
