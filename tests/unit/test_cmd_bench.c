// test_cmd_bench.c: `gemc bench` without a GPU: `gemc bench gdpa` exits 1 with "no GPU: ..."
// (GEMC_NO_CUDA=1 hides any driver), and bad words are usage errors (exit 2), before any GPU
// or NVRTC work.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "commands.h"
#include "run_command.h"
#include "internal_error.h"

// cmd_bench on the words, stderr captured into err (run_command.h).
static int run_bench(char *err, size_t cap, int nwords, char **words) {
  return run_command(cmd_bench, CMD_BENCH, false, err, cap, nwords, words);
}

static void test_cmd_bench_without_gpu_exits_1_saying_no_gpu(void **state) {
  (void)state;
  setenv("GEMC_NO_CUDA", "1", 1);
  char err[2048];
  char *words[] = {"gdpa", "--quick", "--reps", "1"};
  assert_int_equal(run_bench(err, sizeof err, 4, words), GEMC_EXIT_USER_ERROR);
  assert_non_null(strstr(err, "no GPU: "));
}

static void test_cmd_bench_refuses_bad_words(void **state) {
  (void)state;
  setenv("GEMC_NO_CUDA", "1", 1);
  char err[2048];
  char *none[] = {"--quick"};
  assert_int_equal(run_bench(err, sizeof err, 1, none), GEMC_EXIT_USAGE);
  char *unknown[] = {"matmul"};
  assert_int_equal(run_bench(err, sizeof err, 1, unknown), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "unknown benchmark"));
  char *act[] = {"gdpa", "--act", "tanhh"};
  assert_int_equal(run_bench(err, sizeof err, 3, act), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "unknown activation"));
  char *reps[] = {"gdpa", "--reps", "0"};
  assert_int_equal(run_bench(err, sizeof err, 3, reps), GEMC_EXIT_USAGE);
  assert_null(strstr(err, "no GPU"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cmd_bench_without_gpu_exits_1_saying_no_gpu),
      cmocka_unit_test(test_cmd_bench_refuses_bad_words),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
