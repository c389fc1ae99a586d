// test_limits.c: the size checks of issue 9 below the command line: checked_math.h, the CPU
// memory-fit check (cpu_exec_check_fit, through the cpu_memory_set_available seam), the GPU one
// (plan_check_fit with a fake free-memory figure), saturating SymSize evaluation, and a kernel
// with more arguments than the old fixed limit of 24 (a table looked up 15 times), whose plan
// reads back. tests/limits/run.sh covers the same limits through gemc.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "checked_math.h"
#include "cpu_exec.h"
#include "load_model.h"
#include "load_text.h"
#include "lower.h"
#include "memplan.h"
#include "plan.h"


// Writes text to a temporary file and runs the whole front end on it, autodiff included.
static LoadedModel *load_with_grad(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/test_limits_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  LoadedModel *m = calloc(1, sizeof *m);
  assert_non_null(m);
  assert_true(load_model(m, path, NULL, true, true, false));
  remove(path);
  return m;
}

static void free_loaded(LoadedModel *m) {
  loaded_model_free(m);
  free(m);
}

static void test_checked_math(void **state) {
  (void)state;
  int64_t r;
  assert_true(ck_mul(INT64_C(1) << 31, INT64_C(1) << 31, &r));
  assert_true(r == INT64_C(1) << 62);
  assert_false(ck_mul(INT64_C(1) << 62, 4, &r));
  assert_true(r == INT64_MAX);
  assert_false(ck_add(INT64_MAX, 1, &r));
  assert_false(ck_mul3(INT64_C(1) << 40, 64, 4 << 20, &r));
  assert_true(sat_mul(INT64_C(1) << 40, INT64_C(1) << 40) == INT64_MAX);
  assert_true(sat_add(INT64_MAX - 1, 5) == INT64_MAX);
  assert_string_equal(bytes_text(512).s, "512 bytes");
  assert_string_equal(bytes_text(INT64_C(3) << 29).s, "1.5 GiB (1610612736 bytes)");
  assert_string_equal(bytes_text(INT64_MAX).s, "more than 2^63 bytes");
}

static const char *const BIG_TABLE =
    "model big {\n  batch 64;\n  dim 16;\n  precision fp32;\n  sparse ad : id;\n"
    "  label click;\n  table t : rows 1000000;\n  e = embed(t, ad);\n"
    "  y = mlp(e, [1], act = relu);\n  loss bce(y, click);\n}\n";

static void test_cpu_fit_uses_the_available_memory(void **state) {
  (void)state;
  Loaded *m = load("big.gem", BIG_TABLE);
  int64_t need = cpu_exec_bytes_needed(&m->ir, EXEC_F32, 64);
  // The table (1e6 x 16 x 4 bytes) and its row-wise Adagrad sums at least.
  assert_true(need >= INT64_C(1000000) * 16 * 4 + INT64_C(1000000) * 4);
  char err[512] = "";
  cpu_memory_set_available(need);
  assert_true(cpu_exec_check_fit(&m->ir, EXEC_F32, 64, err, sizeof err));
  cpu_memory_set_available(need - 1);
  assert_false(cpu_exec_check_fit(&m->ir, EXEC_F32, 64, err, sizeof err));
  assert_non_null(strstr(err, "of memory on the CPU at batch 64"));
  assert_non_null(strstr(err, "available"));
  // A batch whose values overflow int64 reads "more than 2^63 bytes", never negative.
  assert_true(cpu_exec_bytes_needed(&m->ir, EXEC_F32, INT64_MAX / 2) == INT64_MAX);
  assert_false(cpu_exec_check_fit(&m->ir, EXEC_F32, INT64_MAX / 2, err, sizeof err));
  assert_non_null(strstr(err, "more than 2^63 bytes"));
  cpu_memory_set_available(-1);
  assert_true(cpu_memory_available() > 0);
  unload(m);
}

static void test_gpu_fit_uses_the_free_memory(void **state) {
  (void)state;
  LoadedModel *m = load_with_grad(BIG_TABLE);
  Arena arena = {0};
  Diag d;
  diag_init(&d, &m->src, stderr);
  Plan p;
  assert_true(plan_build(&m->ir, "sm_90a", &arena, &d, &p));
  int64_t need = memplan_stats(&p).planned_bytes;
  assert_true(need >= INT64_C(1000000) * 16 * 4);
  char err[512] = "";
  assert_true(plan_check_fit(&p, "GPU 0", need, err, sizeof err));
  assert_true(plan_check_fit(&p, "GPU 0", -1, err, sizeof err));  // unknown: no check
  assert_false(plan_check_fit(&p, "GPU 0", need / 2, err, sizeof err));
  assert_non_null(strstr(err, "of GPU memory at batch 64"));
  assert_non_null(strstr(err, "GPU 0 has"));
  // SymSize evaluation saturates.
  SymSize s = {1, INT64_C(1) << 40, 0, -1};
  assert_true(symsize_eval(s, INT64_C(1) << 40, NULL) == INT64_MAX);
  arena_free(&arena);
  free_loaded(m);
}

// A table looked up 15 times (the most sema allows): its table_grad kernels take more than the
// 24 arguments the plan once had room for; the plan prints and reads back.
static void test_kernel_with_many_arguments(void **state) {
  (void)state;
  char text[4096];
  int n = snprintf(text, sizeof text, "model many {\n  batch 8;\n  dim 8;\n  precision fp32;\n"
                   "  label click;\n  table t : rows 100;\n");
  for (int i = 0; i < 15; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, "  sparse s%d : id;\n", i);
  for (int i = 0; i < 15; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, "  e%d = embed(t, s%d);\n", i, i);
  n += snprintf(text + n, sizeof text - (size_t)n, "  z = concat(e0");
  for (int i = 1; i < 15; i++) n += snprintf(text + n, sizeof text - (size_t)n, ", e%d", i);
  snprintf(text + n, sizeof text - (size_t)n,
           ");\n  y = mlp(z, [1], act = relu);\n  loss bce(y, click);\n}\n");
  LoadedModel *m = load_with_grad(text);
  Arena arena = {0};
  Diag d;
  diag_init(&d, &m->src, stderr);
  Plan p;
  assert_true(plan_build(&m->ir, "sm_90a", &arena, &d, &p));
  int most = 0;
  for (int i = 0; i < p.nlaunches; i++) {
    if (p.launches[i].nargs > most) most = p.launches[i].nargs;
    assert_true(launch_param_bytes(&p.launches[i]) <= PLAN_MAX_PARAM_BYTES);
    assert_int_equal(launch_param_bytes(&p.launches[i]), p.launches[i].param_bytes);
  }
  assert_true(most > 24);
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  assert_non_null(out);
  plan_print(out, &p);
  fclose(out);
  SourceFile f;
  source_from_memory(&f, "plan.txt", buf, len);
  Diag d2;
  diag_init(&d2, &f, stderr);
  Plan q;
  assert_true(plan_read(&f, p.ir, &arena, &d2, &q));
  assert_int_equal(q.nlaunches, p.nlaunches);
  for (int i = 0; i < p.nlaunches; i++) {
    assert_int_equal(q.launches[i].nargs, p.launches[i].nargs);
    for (int a = 0; a < p.launches[i].nargs; a++)
      assert_int_equal(q.launches[i].args[a].kind, p.launches[i].args[a].kind);
  }
  free(buf);
  arena_free(&arena);
  free_loaded(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checked_math),
      cmocka_unit_test(test_cpu_fit_uses_the_available_memory),
      cmocka_unit_test(test_gpu_fit_uses_the_free_memory),
      cmocka_unit_test(test_kernel_with_many_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
