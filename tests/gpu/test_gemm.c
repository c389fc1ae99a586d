// test_gemm.c: the generated bf16 GEMM (kernels/gemm.cuh, runtime/bench/gemm_kernel.h) against a CPU
// fp64 reference, on a machine with a GPU (tests/gpu/run.sh; no cmocka there: each case prints
// PASS or FAIL and the exit status counts the failures).
//
// Cases: m not a multiple of the tile (1, 7, 129, 1000, a jagged 94289), every transpose combo,
// with and without bias, every epilogue (none, relu, gelu, silu), bf16 and fp32 outputs, both
// tile shapes, the 16-byte and the element path (n = 1, k = 1, odd k), and split-K (chosen, and
// forced with an empty last split).
//
// Inputs are bf16 values (uniform in [-1, 1], rounded), so the reference sees exactly what the
// GPU multiplies: the only errors are the fp32 accumulation and the output rounding. Per
// element, with S = sum_k |a_ik b_kj| + |bias_j|:
//   |gpu - ref| <= rel * |ref| + 16 * sqrt(k + 1) * 2^-24 * S
// rel = 2^-8 for bf16 outputs (round to nearest: at most 2^-9 relative, doubled for the
// activation's fp32 evaluation on top), 2^-20 for fp32 outputs. The second term bounds fp32
// accumulation (random-walk growth sqrt(k) ulps of the sum of magnitudes, with a 16x margin for
// the tensor core's internal adds and split-K's partial sums; the activations' slopes are at
// most 1.13). A wrong fragment, tile or split loses or repeats whole products: errors of the
// order of |ref| itself.
//
// usage: test_gemm   (GEMC_CACHE_DIR: the cubin cache, optional)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "gemm_kernel.h"
#include "jit_cache.h"
#include "nvrtc_compile.h"
#include "gpu_check.h"


typedef struct Case {
  int64_t m, n, k;
  bool trans_a, trans_b, bias;
  Act act;
  DType out;
  int tile_n;  // 128 or 256
  int splits;  // 0: the geometry's choice
} Case;

static const Case cases[] = {
    {1, 64, 64, false, false, false, ACT_NONE, DT_BF16, 128, 0},
    {7, 136, 72, false, true, true, ACT_RELU, DT_F32, 128, 0},
    {129, 256, 256, true, false, false, ACT_NONE, DT_F32, 256, 0},
    {1000, 520, 320, true, true, true, ACT_GELU, DT_BF16, 256, 0},
    {1000, 264, 1003, true, false, false, ACT_NONE, DT_F32, 128, 0},  // xᵀ·dz: k free
    {300, 200, 4096, false, false, true, ACT_SILU, DT_BF16, 128, 0},   // split-K chosen
    {256, 256, 20000, true, false, false, ACT_NONE, DT_F32, 256, 0},   // weight-gradient shape
    {129, 256, 128, false, false, true, ACT_GELU, DT_F32, 256, 3},     // 4 k-steps, 3 splits: one empty
    {37, 1, 512, false, false, true, ACT_NONE, DT_F32, 128, 0},        // n = 1: element path
    {64, 512, 1, false, true, false, ACT_RELU, DT_BF16, 256, 0},       // k = 1
    {512, 1, 77, true, false, false, ACT_NONE, DT_F32, 128, 0},        // n = 1, odd k
    {100, 30, 50, false, false, true, ACT_GELU, DT_BF16, 128, 0},      // nothing a multiple of 8
    {94289, 64, 64, false, false, true, ACT_RELU, DT_BF16, 128, 0},    // jagged row count
    {2000, 256, 256, false, true, false, ACT_NONE, DT_BF16, 256, 0},
    {256, 384, 4864, false, false, true, ACT_NONE, DT_F32, 256, 0},    // the MLP's first layer
    {520, 136, 40, true, true, false, ACT_SILU, DT_F32, 128, 0},
};
enum { NUM_CASES = (int)(sizeof cases / sizeof cases[0]) };

static GemmKernelConfig case_config(const Case *c) {
  GemmKernelConfig k = {.tile_m = 128, .tile_n = c->tile_n, .trans_a = c->trans_a,
                        .trans_b = c->trans_b,
                        .aligned = gemm_kernel_aligned(c->m, c->n, c->k, c->trans_a, c->trans_b),
                        .act = c->act, .out = c->out};
  return k;
}

// --- host data ----------------------------------------------------------------------------------

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (double)(g_rng >> 40) / (double)(1 << 24) * 2.0 - 1.0;
}

static uint16_t to_bf16(float f) {  // round to nearest even (no NaNs here)
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static double act_ref(Act a, double x) {
  switch (a) {
  case ACT_RELU: return x > 0 ? x : 0;
  case ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
  case ACT_SILU: return x / (1.0 + exp(-x));
  default: return x;
  }
}

// --- one case -----------------------------------------------------------------------------------

static bool upload(CUdeviceptr *d, const void *h, size_t bytes) {
  const CudaDriver *cu = cuda_driver();
  return CU_CHECK(cu->cuMemAlloc(d, bytes ? bytes : 16)) &&
         (bytes == 0 || CU_CHECK(cu->cuMemcpyHtoD(*d, h, bytes)));
}

static void run_case(int index, CUmodule module, int num_sms) {
  const Case *c = &cases[index];
  const CudaDriver *cu = cuda_driver();
  GemmKernelConfig cfg = case_config(c);
  char name[96], reduce_name[112], err[1024], what[256];
  gemm_kernel_name(&cfg, name, sizeof name);
  snprintf(reduce_name, sizeof reduce_name, "%s_reduce", name);
  snprintf(what, sizeof what, "m=%lld n=%lld k=%lld%s%s%s %s -> %s, %s", (long long)c->m,
           (long long)c->n, (long long)c->k, c->trans_a ? " A^T" : "", c->trans_b ? " B^T" : "",
           c->bias ? " +bias" : "", act_name(c->act), dtype_name(c->out), name);

  size_t a_elems = (size_t)(c->m * c->k), b_elems = (size_t)(c->k * c->n);
  size_t c_elems = (size_t)(c->m * c->n), c_bytes = c_elems * (c->out == DT_F32 ? 4 : 2);
  uint16_t *a = malloc(a_elems * 2 + 2), *b = malloc(b_elems * 2 + 2);
  float *bias = malloc((size_t)c->n * 4);
  // Row-major [m][k] and [n][k] copies in fp64 for the reference, whatever the storage.
  double *ra = malloc(a_elems * sizeof(double) + 8), *rb = malloc(b_elems * sizeof(double) + 8);
  for (size_t i = 0; i < a_elems; i++) a[i] = to_bf16((float)uniform());
  for (size_t i = 0; i < b_elems; i++) b[i] = to_bf16((float)uniform());
  for (int64_t j = 0; j < c->n; j++) bias[j] = (float)uniform();
  for (int64_t i = 0; i < c->m; i++)
    for (int64_t kk = 0; kk < c->k; kk++)
      ra[i * c->k + kk] = from_bf16(a[c->trans_a ? kk * c->m + i : i * c->k + kk]);
  for (int64_t j = 0; j < c->n; j++)
    for (int64_t kk = 0; kk < c->k; kk++)
      rb[j * c->k + kk] = from_bf16(b[c->trans_b ? j * c->k + kk : kk * c->n + j]);

  GemmGeometry geo;
  CUfunction fn = NULL, reduce = NULL;
  CUdeviceptr da = 0, db = 0, dbias = 0, dc = 0, dws = 0;
  void *out = malloc(c_bytes + 4);
  bool ok = gemm_kernel_geometry(&cfg, c->m, c->n, c->k, num_sms, c->splits, &geo, err, sizeof err);
  if (ok)
    ok = CU_CHECK(cu->cuModuleGetFunction(&fn, module, name)) &&
         CU_CHECK(cu->cuModuleGetFunction(&reduce, module, reduce_name)) &&
         upload(&da, a, a_elems * 2) && upload(&db, b, b_elems * 2) &&
         upload(&dbias, bias, (size_t)c->n * 4) && CU_CHECK(cu->cuMemAlloc(&dc, c_bytes + 16)) &&
         CU_CHECK(cu->cuMemAlloc(&dws, geo.workspace_bytes + 16)) &&
         CU_CHECK(cu->cuMemsetD8Async(dc, 0xff, c_bytes, NULL));  // NaN everywhere first
  if (!ok && err[0] == '\0') snprintf(err, sizeof err, "%s", cuda_last_error());
  if (ok && !gemm_kernel_launch(fn, reduce, &geo, dc, dws, da, db, c->bias ? dbias : 0, c->m, c->n,
                                c->k, NULL, err, sizeof err))
    ok = false;
  if (ok && !(CU_CHECK(cu->cuCtxSynchronize()) && CU_CHECK(cu->cuMemcpyDtoH(out, dc, c_bytes)))) {
    snprintf(err, sizeof err, "%s", cuda_last_error());
    ok = false;
  }
  if (!ok) {
    check(false, "%s: %s", what, err);
  } else {
    double worst = 0;  // max over elements of error / tolerance
    int64_t wi = 0, wj = 0;
    double rel = c->out == DT_F32 ? ldexp(1.0, -20) : ldexp(1.0, -8);
    double acc = 16.0 * sqrt((double)c->k + 1.0) * ldexp(1.0, -24);
    for (int64_t i = 0; i < c->m; i++)
      for (int64_t j = 0; j < c->n; j++) {
        double sum = 0, mag = 0;
        const double *x = ra + i * c->k, *y = rb + j * c->k;
        for (int64_t kk = 0; kk < c->k; kk++) sum += x[kk] * y[kk], mag += fabs(x[kk] * y[kk]);
        if (c->bias) sum += bias[j], mag += fabs(bias[j]);
        double ref = act_ref(c->act, sum);
        size_t e = (size_t)(i * c->n + j);
        double got = c->out == DT_F32 ? ((float *)out)[e] : from_bf16(((uint16_t *)out)[e]);
        double ratio = fabs(got - ref) / (rel * fabs(ref) + acc * mag + 1e-30);
        if (!(ratio <= worst)) worst = isnan(ratio) ? INFINITY : ratio, wi = i, wj = j;
      }
    check(worst <= 1.0, "%s: splits %d, worst error %.3g of the tolerance (at %lld, %lld)", what,
          geo.splits, worst, (long long)wi, (long long)wj);
  }
  cu->cuMemFree(da), cu->cuMemFree(db), cu->cuMemFree(dbias), cu->cuMemFree(dc), cu->cuMemFree(dws);
  free(a), free(b), free(bias), free(ra), free(rb), free(out);
}

// --- geometry checks that need no device -----------------------------------------------------------

static void check_geometry(int num_sms) {
  GemmKernelConfig cfg = {.tile_m = 128, .tile_n = 256, .trans_a = true, .aligned = true,
                          .act = ACT_NONE, .out = DT_F32};
  GemmGeometry g;
  char err[256];
  bool ok = gemm_kernel_geometry(&cfg, 256, 256, 262144, num_sms, 0, &g, err, sizeof err);
  check(ok && g.splits > 1 && g.grid == 2u * (unsigned)g.splits,
        "a 256x256 weight gradient over k=262144 is split along k (%d splits, %u blocks)",
        g.splits, g.grid);
  cfg.trans_a = false;
  ok = gemm_kernel_geometry(&cfg, 262144, 256, 256, num_sms, 0, &g, err, sizeof err);
  check(ok && g.splits == 1 && g.grid == 2048, "m=262144 n=256 fills the GPU unsplit (%u blocks)",
        g.grid);
}

int main(void) {
  char err[1024];
  CudaContext ctx;
  if (!cuda_context_open(&ctx, -1, err, sizeof err)) {
    printf("FAIL no GPU: %s\n", err);
    return 1;
  }
  printf("generated GEMM on %s (%s, %d SMs)\n", ctx.name, ctx.arch, ctx.sm_count);
  check_geometry(ctx.sm_count);

  GemmKernelConfig configs[NUM_CASES];
  for (int i = 0; i < NUM_CASES; i++) configs[i] = case_config(&cases[i]);
  StrBuf src = {0};
  gemm_kernel_source(configs, NUM_CASES, &src);
  char *cubin = NULL;
  size_t size = 0;
  char cache[1024];
  bool cached = jit_cache_dir(cache, sizeof cache, err, sizeof err);
  uint64_t key = jit_cache_key(src.data, ctx.arch, NULL, 0, nvrtc_version(), "gemm-test");
  void *image = NULL;
  bool corrupt = false;
  if (cached && jit_cache_load(cache, ctx.arch, key, &image, &size, &corrupt, NULL, 0)) {
    cubin = image;
  } else if (nvrtc_compile(src.data, "gemm.cu", ctx.arch, NVRTC_CUBIN, &cubin, &size, NULL, err,
                           sizeof err)) {
    if (cached) jit_cache_store(cache, ctx.arch, key, cubin, size, err, sizeof err);
  } else {
    check(false, "NVRTC: %s", err);
    sb_free(&src);
    return 1;
  }
  sb_free(&src);
  CUmodule module;
  if (!CU_CHECK(cuda_driver()->cuModuleLoadData(&module, cubin))) {
    check(false, "loading the GEMM kernels: %s", cuda_last_error());
    free(cubin);
    return 1;
  }
  free(cubin);
  for (int i = 0; i < NUM_CASES; i++) run_case(i, module, ctx.sm_count);
  cuda_driver()->cuModuleUnload(module);
  printf("%d of %d GEMM checks passed\n", gpu_check_count - gpu_check_failures, gpu_check_count);
  return gpu_check_failures ? 1 : 0;
}
