// gemm_kernel.c: instantiations, source, geometry and launches of the generated bf16 GEMM
// (gemm_kernel.h, kernels/gemm.cuh).
#include "gemm_kernel.h"

#include <stdio.h>
#include <string.h>

#include "kernels_embedded.h"

enum { MAX_GRID = 0x7fffffff, REDUCE_THREADS = 256, MAX_AUTO_SPLITS = 32, MIN_STEPS_PER_SPLIT = 4 };

bool gemm_kernel_valid(const GemmKernelConfig *c, char *err, size_t err_size) {
  if (c->tile_m != 128 || (c->tile_n != 128 && c->tile_n != 256)) {
    snprintf(err, err_size, "no %dx%d GEMM tile (128x128 and 128x256 exist)", c->tile_m,
             c->tile_n);
    return false;
  }
  if (c->act != ACT_NONE && c->act != ACT_RELU && c->act != ACT_GELU && c->act != ACT_SILU) {
    snprintf(err, err_size, "the generated GEMM has no %s epilogue", act_name(c->act));
    return false;
  }
  if (c->out != DT_BF16 && c->out != DT_F32) {
    snprintf(err, err_size, "the generated GEMM writes bf16 or fp32, not %s", dtype_name(c->out));
    return false;
  }
  return true;
}

bool gemm_kernel_aligned(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  int64_t a_row = trans_a ? m : k, b_row = trans_b ? k : n;
  return a_row % 8 == 0 && b_row % 8 == 0 && n % 8 == 0;
}

void gemm_kernel_name(const GemmKernelConfig *c, char *out, size_t size) {
  snprintf(out, size, "gemm_%dx%d_%c%c_%s_%s_a%d", c->tile_m, c->tile_n, c->trans_a ? 't' : 'n',
           c->trans_b ? 't' : 'n', act_name(c->act), c->out == DT_F32 ? "f32" : "bf16",
           c->aligned ? 8 : 1);
}

void gemm_kernel_tile_text(const GemmKernelConfig *c, char *out, size_t size) {
  snprintf(out, size, "%dx%d", c->tile_m, c->tile_n);
}

static bool same_config(const GemmKernelConfig *a, const GemmKernelConfig *b) {
  return a->tile_m == b->tile_m && a->tile_n == b->tile_n && a->trans_a == b->trans_a &&
         a->trans_b == b->trans_b && a->aligned == b->aligned && a->act == b->act &&
         a->out == b->out;
}

void gemm_kernel_source(const GemmKernelConfig *configs, int n, StrBuf *src) {
  if (!src->data || !strstr(src->data, "GEMC_PRELUDE_CUH")) sb_puts(src, kernel_prelude_cuh);
  sb_puts(src, kernel_gemm_cuh);
  sb_puts(src, "\n");
  for (int i = 0; i < n; i++) {
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) seen = same_config(&configs[i], &configs[j]);
    if (seen) continue;
    const GemmKernelConfig *c = &configs[i];
    char name[96];
    gemm_kernel_name(c, name, sizeof name);
    // 8 warps: 2 x 4 (warp tiles 64x32 or 64x64).
    sb_printf(src, "GEMM_INSTANTIATE(%s, %d, %d, 2, %d, %s, %s, %s, %d, %s)\n", name, c->tile_m,
              c->tile_n, GEMM_KERNEL_STAGES, c->trans_a ? "true" : "false",
              c->trans_b ? "true" : "false", c->aligned ? "true" : "false", (int)c->act,
              c->out == DT_F32 ? "float" : "bf16_t");
  }
}

bool gemm_kernel_geometry(const GemmKernelConfig *c, int64_t m, int64_t n, int64_t k, int num_sms,
                          int splits, GemmGeometry *g, char *err, size_t err_size) {
  memset(g, 0, sizeof *g);
  if (m < 0 || n < 0 || k < 0) {
    snprintf(err, err_size, "negative GEMM size m=%lld n=%lld k=%lld", (long long)m,
             (long long)n, (long long)k);
    return false;
  }
  int64_t tiles = ((m + c->tile_m - 1) / c->tile_m) * ((n + c->tile_n - 1) / c->tile_n);
  int64_t steps = (k + GEMM_KERNEL_BK - 1) / GEMM_KERNEL_BK;
  if (splits <= 0) {
    // 128x128 tiles fit two blocks per SM (registers and shared memory), 128x256 one.
    int64_t slots = (int64_t)(num_sms > 0 ? num_sms : 1) * (c->tile_n <= 128 ? 2 : 1);
    int64_t s = 1;
    if (tiles > 0 && tiles < slots) {
      s = (slots + tiles - 1) / tiles;
      if (s > steps / MIN_STEPS_PER_SPLIT) s = steps / MIN_STEPS_PER_SPLIT;
      if (s > MAX_AUTO_SPLITS) s = MAX_AUTO_SPLITS;
      if (s < 1) s = 1;
      // No empty splits: the last one has work.
      int64_t per = (steps + s - 1) / s;
      s = per > 0 ? (steps + per - 1) / per : 1;
    }
    splits = (int)s;
  }
  if (tiles * splits > MAX_GRID || (splits > 1 && (m * n + REDUCE_THREADS - 1) / REDUCE_THREADS > MAX_GRID)) {
    snprintf(err, err_size, "GEMM m=%lld n=%lld is too large for one grid", (long long)m,
             (long long)n);
    return false;
  }
  g->grid = (unsigned)(tiles * splits);
  g->smem = (unsigned)(GEMM_KERNEL_STAGES * (c->tile_m + c->tile_n) * GEMM_KERNEL_BK * 2);
  g->splits = splits;
  if (splits > 1) {
    g->reduce_grid = (unsigned)((m * n + REDUCE_THREADS - 1) / REDUCE_THREADS);
    g->workspace_bytes = (size_t)splits * (size_t)m * (size_t)n * sizeof(float);
  }
  return true;
}

bool gemm_kernel_launch(CUfunction fn, CUfunction reduce, const GemmGeometry *g, CUdeviceptr c,
                        CUdeviceptr workspace, CUdeviceptr a, CUdeviceptr b, CUdeviceptr bias,
                        int64_t m, int64_t n, int64_t k, CUstream stream, char *err,
                        size_t err_size) {
  const CudaDriver *d = cuda_driver();
  if (!d) {
    snprintf(err, err_size, "the CUDA driver is not loaded");
    return false;
  }
  if (m == 0 || n == 0 || g->grid == 0) return true;
  long long mm = m, nn = n, kk = k;
  int splits = g->splits;
  if (g->smem > 48 * 1024 &&
      !CU_CHECK(d->cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      (int)g->smem))) {
    snprintf(err, err_size, "GEMM shared memory: %s", cuda_last_error());
    return false;
  }
  void *args[] = {&c, &workspace, &a, &b, &bias, &mm, &nn, &kk, &splits};
  if (!CU_CHECK(d->cuLaunchKernel(fn, g->grid, 1, 1, GEMM_KERNEL_THREADS, 1, 1, g->smem, stream,
                                  args, NULL))) {
    snprintf(err, err_size, "GEMM m=%lld n=%lld k=%lld: %s", mm, nn, kk, cuda_last_error());
    return false;
  }
  if (splits <= 1) return true;
  void *rargs[] = {&c, &workspace, &bias, &mm, &nn, &splits};
  if (!CU_CHECK(d->cuLaunchKernel(reduce, g->reduce_grid, 1, 1, REDUCE_THREADS, 1, 1, 0, stream,
                                  rargs, NULL))) {
    snprintf(err, err_size, "GEMM split-K reduction m=%lld n=%lld: %s", mm, nn,
             cuda_last_error());
    return false;
  }
  return true;
}
