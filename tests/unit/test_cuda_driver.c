// test_cuda_driver.c: the lazily loaded driver on any machine. With GEMC_NO_CUDA set it is a
// clean refusal with a reason (never a crash), every later call says the same, a failed check
// names the call and its place, and a context cannot be opened.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_driver.h"

static void test_cuda_driver_refuses_cleanly_when_disabled(void **state) {
  (void)state;
  char err[512] = "";
  assert_false(cuda_driver_load(err, sizeof err));
  assert_non_null(strstr(err, "GEMC_NO_CUDA"));
  assert_null(cuda_driver());
  char again[512] = "";
  assert_false(cuda_driver_load(again, sizeof again));
  assert_string_equal(err, again);
  assert_false(cuda_usable(again, sizeof again));
  assert_non_null(strstr(again, "GEMC_NO_CUDA"));
  CudaContext c;
  assert_false(cuda_context_open(&c, -1, again, sizeof again));
  assert_non_null(strstr(again, "GEMC_NO_CUDA"));
  cuda_context_close(&c);  // harmless on a context that never opened
}

static void test_cuda_driver_check_names_the_call_and_place(void **state) {
  (void)state;
  assert_true(CU_CHECK(CU_SUCCESS));
  assert_false(cuda_check(CU_ERROR_OUT_OF_MEMORY, "cuMemAlloc(&p, n)", "runtime/x.c", 42));
  assert_int_equal(cuda_last_result(), CU_ERROR_OUT_OF_MEMORY);
  assert_non_null(strstr(cuda_last_error(), "cuMemAlloc(&p, n) failed at runtime/x.c:42"));
  cuda_error_prefix("launching kernel %s", "k_relu");
  assert_non_null(strstr(cuda_last_error(), "launching kernel k_relu: cuMemAlloc"));
}

int main(void) {
  setenv("GEMC_NO_CUDA", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_driver_refuses_cleanly_when_disabled),
      cmocka_unit_test(test_cuda_driver_check_names_the_call_and_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
