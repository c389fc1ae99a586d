// test_gemm_kernel.c: the generated bf16 GEMM without a GPU (kernels/gemm.cuh,
// runtime/bench/gemm_kernel.h). Every tile shape x transpose combo, both load/store paths, every
// epilogue and both output types, compiles with NVRTC for sm_90a and sm_100a (skipped, saying
// so, when libnvrtc cannot be loaded); configs, names, the alignment rule, the source and the
// launch geometry (tiles, split-K) behave as documented.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gemm_kernel.h"
#include "nvrtc_compile.h"

static const Act acts[] = {ACT_NONE, ACT_RELU, ACT_GELU, ACT_SILU};

// 2 tiles x 4 transpose combos = 8 instantiations; each combo takes the 16-byte path in one
// tile and the element path in the other; the epilogues and output types rotate.
static int all_configs(GemmKernelConfig *out) {
  int n = 0;
  for (int tile = 0; tile < 2; tile++)
    for (int tr = 0; tr < 4; tr++) {
      GemmKernelConfig c = {.tile_m = 128, .tile_n = tile ? 256 : 128, .trans_a = tr & 1,
                            .trans_b = (tr >> 1) & 1, .aligned = (tr + tile) % 2 == 0,
                            .act = acts[(n + tile) % 4], .out = n % 2 ? DT_F32 : DT_BF16};
      out[n++] = c;
    }
  return n;
}

// Whether the image holds `name` (a kernel's symbol) anywhere.
static bool image_has(const char *image, size_t size, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i + n <= size; i++)
    if (memcmp(image + i, name, n) == 0) return true;
  return false;
}

static void compiles_for(const char *arch) {
  char err[4096];
  if (!nvrtc_available(err, sizeof err)) {
    printf("skipped: libnvrtc cannot be loaded (%s)\n", err);
    skip();
  }
  GemmKernelConfig configs[8];
  int n = all_configs(configs);
  StrBuf src = {0};
  gemm_kernel_source(configs, n, &src);
  char *cubin = NULL, *log = NULL;
  size_t size = 0;
  bool ok = nvrtc_compile(src.data, "gemm.cu", arch, NVRTC_CUBIN, &cubin, &size, &log, err,
                          sizeof err);
  if (!ok) fprintf(stderr, "%s\n%s\n", err, log ? log : "");
  assert_true(ok);
  assert_true(size > 0);
  // Every tile kernel and its split-K reduction is in the image by name.
  for (int i = 0; i < n; i++) {
    char name[96];
    gemm_kernel_name(&configs[i], name, sizeof name);
    assert_true(image_has(cubin, size, name));
  }
  free(cubin);
  free(log);
  sb_free(&src);
}

static void test_gemm_kernel_compiles_sm90a(void **state) {
  (void)state;
  compiles_for("sm_90a");
}

static void test_gemm_kernel_compiles_sm100a(void **state) {
  (void)state;
  compiles_for("sm_100a");
}

static void test_gemm_kernel_names_are_distinct(void **state) {
  (void)state;
  GemmKernelConfig configs[8];
  int n = all_configs(configs);
  char names[8][96];
  for (int i = 0; i < n; i++) {
    gemm_kernel_name(&configs[i], names[i], sizeof names[i]);
    for (int j = 0; j < i; j++) assert_string_not_equal(names[i], names[j]);
  }
  GemmKernelConfig c = {.tile_m = 128, .tile_n = 256, .trans_a = false, .trans_b = true,
                        .aligned = true, .act = ACT_GELU, .out = DT_BF16};
  gemm_kernel_name(&c, names[0], sizeof names[0]);
  assert_string_equal(names[0], "gemm_128x256_nt_gelu_bf16_a8");
}

static void test_gemm_kernel_source_instantiates_each_config_once(void **state) {
  (void)state;
  GemmKernelConfig c[3] = {
      {.tile_m = 128, .tile_n = 128, .aligned = true, .act = ACT_NONE, .out = DT_BF16},
      {.tile_m = 128, .tile_n = 128, .aligned = true, .act = ACT_NONE, .out = DT_BF16},
      {.tile_m = 128, .tile_n = 128, .aligned = true, .act = ACT_RELU, .out = DT_BF16}};
  StrBuf src = {0};
  gemm_kernel_source(c, 3, &src);
  int count = 0;
  for (const char *p = src.data; (p = strstr(p, "\nGEMM_INSTANTIATE(")) != NULL; p++) count++;
  assert_int_equal(count, 2);
  assert_non_null(strstr(src.data, "GEMM_INSTANTIATE(gemm_128x128_nn_relu_bf16_a8, 128, 128,"));
  sb_free(&src);
}

static void test_gemm_kernel_valid_configs(void **state) {
  (void)state;
  char err[256];
  GemmKernelConfig c = {.tile_m = 128, .tile_n = 256, .act = ACT_SILU, .out = DT_F32};
  assert_true(gemm_kernel_valid(&c, err, sizeof err));
  c.tile_n = 64;
  assert_false(gemm_kernel_valid(&c, err, sizeof err));
  assert_non_null(strstr(err, "128x64"));
  c.tile_n = 128, c.act = ACT_SOFTMAX;
  assert_false(gemm_kernel_valid(&c, err, sizeof err));
  assert_non_null(strstr(err, "softmax"));
  c.act = ACT_NONE, c.out = DT_FP16;
  assert_false(gemm_kernel_valid(&c, err, sizeof err));
}

// The contiguous dims: k of A (NN, NT) or m of A (TN, TT); n of B (NN, TN) or k of B (NT, TT);
// n of C always.
static void test_gemm_kernel_alignment_rule(void **state) {
  (void)state;
  assert_true(gemm_kernel_aligned(94289, 256, 256, false, false));  // any m
  assert_true(gemm_kernel_aligned(256, 256, 94289, true, false));   // xᵀ·dz: any k
  assert_false(gemm_kernel_aligned(94289, 256, 256, true, false));  // m is A's row length
  assert_false(gemm_kernel_aligned(512, 1, 512, false, false));     // n = 1
  assert_false(gemm_kernel_aligned(512, 512, 1, false, true));      // k = 1, k-contiguous
  assert_false(gemm_kernel_aligned(512, 512, 12, false, false));
  assert_true(gemm_kernel_aligned(7, 8, 8, false, true));
}

static void test_gemm_kernel_geometry(void **state) {
  (void)state;
  char err[256];
  GemmGeometry g;
  GemmKernelConfig c = {.tile_m = 128, .tile_n = 256, .aligned = true, .act = ACT_NONE,
                        .out = DT_BF16};
  // Enough tiles: no split, one block per tile, 4 stages of (128 + 256) x 32 bf16.
  assert_true(gemm_kernel_geometry(&c, 262144, 256, 256, 132, 0, &g, err, sizeof err));
  assert_int_equal(g.splits, 1);
  assert_int_equal(g.grid, 2048);
  assert_int_equal(g.smem, 4 * 384 * 32 * 2);
  assert_int_equal(g.workspace_bytes, 0);
  // A weight gradient: 2 tiles, k = 262144 (8192 steps) -> 32 splits.
  assert_true(gemm_kernel_geometry(&c, 256, 256, 262144, 132, 0, &g, err, sizeof err));
  assert_int_equal(g.splits, 32);
  assert_int_equal(g.grid, 64);
  assert_int_equal(g.workspace_bytes, (size_t)32 * 256 * 256 * 4);
  assert_int_equal(g.reduce_grid, 256 * 256 / 256);
  // Short k is not split below 4 steps per split; no split is left empty.
  assert_true(gemm_kernel_geometry(&c, 128, 256, 200, 132, 0, &g, err, sizeof err));
  assert_int_equal(g.splits, 1);
  assert_true(gemm_kernel_geometry(&c, 512, 1024, 4864, 132, 0, &g, err, sizeof err));
  int64_t steps = (4864 + 31) / 32, per = (steps + g.splits - 1) / g.splits;
  assert_true(g.splits > 1);
  assert_true((g.splits - 1) * per < steps);
  // 128x128 tiles count two blocks per SM.
  c.tile_n = 128;
  assert_true(gemm_kernel_geometry(&c, 256, 256, 262144, 132, 0, &g, err, sizeof err));
  assert_int_equal(g.grid, 4u * (unsigned)g.splits);
  assert_int_equal(g.smem, 4 * 256 * 32 * 2);
  // A forced split count is kept (the kernel writes zeros for an empty split).
  assert_true(gemm_kernel_geometry(&c, 129, 256, 128, 132, 3, &g, err, sizeof err));
  assert_int_equal(g.splits, 3);
  assert_int_equal(g.grid, 2 * 2 * 3);
  // Empty products launch nothing; negative sizes are refused.
  assert_true(gemm_kernel_geometry(&c, 0, 256, 256, 132, 0, &g, err, sizeof err));
  assert_int_equal(g.grid, 0);
  assert_false(gemm_kernel_geometry(&c, -1, 256, 256, 132, 0, &g, err, sizeof err));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_kernel_compiles_sm90a),
      cmocka_unit_test(test_gemm_kernel_compiles_sm100a),
      cmocka_unit_test(test_gemm_kernel_names_are_distinct),
      cmocka_unit_test(test_gemm_kernel_source_instantiates_each_config_once),
      cmocka_unit_test(test_gemm_kernel_valid_configs),
      cmocka_unit_test(test_gemm_kernel_alignment_rule),
      cmocka_unit_test(test_gemm_kernel_geometry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
