// test_cublaslt_fp8.c: the shapes cuBLASLt's FP8 kernels cannot take are refused by
// gemm_run_scaled with the reason, before it touches cuBLASLt or the device (runtime/gpu/cublaslt.h),
// so this runs on any machine; the GEMMs themselves are tests/gpu/test_gemm_fp8.c's.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cublaslt.h"

static GemmShape fp8_shape(void) {
  return (GemmShape){.m = 64, .n = 64, .k = 64, .trans_b = true, .dtype = DT_FP8,
                     .c_dtype = DT_F32, .alpha = 1.0f, .act = ACT_NONE};
}

// Runs s with scales at `scale` and expects a refusal whose message holds `why`.
static void expect_refused(const GemmShape *s, CUdeviceptr scale, const char *why) {
  char err[512] = "";
  assert_false(gemm_run_scaled(NULL, s, 256, 256, 256, 0, scale, scale, NULL, err, sizeof err));
  if (!strstr(err, why)) fail_msg("expected \"%s\" in: %s", why, err);
  assert_non_null(strstr(err, "fp8->"));  // the message names the GEMM
}

static void test_cublaslt_fp8_refuses_what_its_kernels_cannot_take(void **state) {
  (void)state;
  GemmShape s = fp8_shape();
  s.trans_a = true;
  expect_refused(&s, 256, "K-major");
  s = fp8_shape();
  s.trans_b = false;
  expect_refused(&s, 256, "K-major");
  s = fp8_shape();
  s.k = 40;
  expect_refused(&s, 256, "multiple of 16");
  s = fp8_shape();
  s.c_dtype = DT_BF16;
  expect_refused(&s, 256, "fp32 C");
  s = fp8_shape();
  s.n = 66;
  expect_refused(&s, 256, "multiple of 4");
  s = fp8_shape();
  s.has_bias = true;
  expect_refused(&s, 256, "no bias");
  s = fp8_shape();
  s.act = ACT_RELU;
  expect_refused(&s, 256, "activation");
  s = fp8_shape();
  expect_refused(&s, 0, "scales");
  expect_refused(&s, 260, "16-byte aligned");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cublaslt_fp8_refuses_what_its_kernels_cannot_take),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
