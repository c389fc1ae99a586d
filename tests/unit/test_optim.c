// test_optim.c: AdamW, SGD and row-wise Adagrad. Single steps computed by hand, AdamW over ten
// steps against a plain double reference, untouched table rows left alone, table storage
// rounding, the merged-duplicate semantics, and the internal errors on misuse.
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
#include "numerics.h"
#include "optim.h"

static Optim adamw(double lr, double wd) {
  return (Optim){.kind = OPTIM_ADAMW, .lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                 .weight_decay = wd};
}
static Optim adagrad(double lr) {
  return (Optim){.kind = OPTIM_ROWWISE_ADAGRAD, .lr = lr, .eps = 1e-8};
}
static Optim sgd(double lr) { return (Optim){.kind = OPTIM_SGD, .lr = lr}; }

static void assert_close(double got, double want, double rel) {
  if (!(fabs(got - want) <= rel * (1e-30 + fabs(want))))
    fail_msg("got %.10g, want %.10g (relative tolerance %g)", got, want, rel);
}

static uint64_t rng_state = 777;
static double rng_uniform(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static void test_optim_state_init_allocates_per_kind(void **state) {
  (void)state;
  OptimState s;
  optim_state_init(&s, adamw(1e-3, 0), 5, 0);
  assert_non_null(s.m);
  assert_non_null(s.v);
  assert_null(s.rowsum);
  for (int i = 0; i < 5; i++) assert_true(s.m[i] == 0 && s.v[i] == 0);
  assert_int_equal(s.step, 0);
  optim_state_free(&s);
  assert_null(s.m);

  optim_state_init(&s, adagrad(0.1), 7, 3);
  assert_non_null(s.rowsum);
  assert_null(s.m);
  assert_int_equal(s.n, 7);
  assert_int_equal(s.dim, 3);
  optim_state_free(&s);

  optim_state_init(&s, sgd(0.1), 4, 0);
  assert_null(s.m);
  assert_null(s.rowsum);
  optim_state_free(&s);
}

// Two steps worked out by hand (lr 0.1, betas 0.9/0.999, wd 0.01).
static void test_optim_adamw_two_steps_by_hand(void **state) {
  (void)state;
  OptimState s;
  optim_state_init(&s, adamw(0.1, 0.01), 2, 0);
  float w[2] = {1.0f, -2.0f};
  float g1[2] = {0.5f, -0.25f};
  optim_step_dense(&s, w, g1, 2);
  // Step 1: m = 0.1 g, v = 0.001 g², so m̂ = g, v̂ = g²: the Adam term is sign(g).
  assert_int_equal(s.step, 1);
  assert_close(s.m[0], 0.05, 1e-7);
  assert_close(s.v[0], 0.00025, 1e-7);
  assert_close(w[0], 1.0 - 0.1 * (1.0 + 0.01 * 1.0), 1e-7);      // 0.899
  assert_close(w[1], -2.0 - 0.1 * (-1.0 + 0.01 * -2.0), 1e-7);   // -1.898
  // Step 2 with the first gradient reversed: m = 0.045 - 0.05 = -0.005, v = 0.00049975;
  // m̂ = -0.005 / 0.19, v̂ = 0.00049975 / 0.001999 = 0.25.
  float g2[2] = {-0.5f, -0.25f};
  optim_step_dense(&s, w, g2, 2);
  assert_close(s.m[0], -0.005, 1e-5);
  assert_close(s.v[0], 0.00049975, 1e-6);
  double mhat = -0.005 / 0.19, vhat = 0.25;
  assert_close(w[0], 0.899 - 0.1 * (mhat / (sqrt(vhat) + 1e-8) + 0.01 * 0.899), 1e-6);
  // The second element saw -0.25 twice: m̂ = g and v̂ = g² again, so its step is lr (1 + wd w).
  assert_close(w[1], -1.898 - 0.1 * (-1.0 + 0.01 * -1.898), 1e-6);
  optim_state_free(&s);
}

// AdamW written out in double, straight from the formula in optim.h.
static void test_optim_adamw_matches_double_reference_over_ten_steps(void **state) {
  (void)state;
  enum { N = 64, STEPS = 10 };
  Optim cfg = adamw(0.01, 0.05);
  OptimState s;
  optim_state_init(&s, cfg, N, 0);
  float w[N], w0[N], g[N];
  double rw[N], rm[N] = {0}, rv[N] = {0};
  for (int i = 0; i < N; i++) rw[i] = w0[i] = w[i] = (float)(rng_uniform() * 2 - 1);
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) g[i] = (float)((rng_uniform() * 2 - 1) * (1 + i % 5));
    optim_step_dense(&s, w, g, N);
    for (int i = 0; i < N; i++) {
      rm[i] = cfg.beta1 * rm[i] + (1 - cfg.beta1) * g[i];
      rv[i] = cfg.beta2 * rv[i] + (1 - cfg.beta2) * (double)g[i] * g[i];
      double mhat = rm[i] / (1 - pow(cfg.beta1, t)), vhat = rv[i] / (1 - pow(cfg.beta2, t));
      rw[i] -= cfg.lr * (mhat / (sqrt(vhat) + cfg.eps) + cfg.weight_decay * rw[i]);
    }
  }
  assert_int_equal(s.step, STEPS);
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double err = fabs(w[i] - rw[i]);
    if (err > worst) worst = err;
    assert_close(s.m[i], rm[i], 1e-5);
  }
  print_message("AdamW vs double reference after %d steps: max |dw| = %.3g\n", STEPS, worst);
  assert_true(worst < 1e-6);
  // And the parameters did move: ten steps of lr 0.01 are far more than the tolerance.
  double moved = 0;
  for (int i = 0; i < N; i++) moved += fabs(w[i] - w0[i]) / N;
  assert_true(moved > 1e-3);
  optim_state_free(&s);
}

static void test_optim_sgd_dense_and_rows(void **state) {
  (void)state;
  OptimState s;
  optim_state_init(&s, sgd(0.1), 3, 0);
  float w[3] = {1.0f, 2.0f, -3.0f}, g[3] = {0.5f, -1.0f, 0.0f};
  optim_step_dense(&s, w, g, 3);
  assert_true(w[0] == (float)(1.0 - 0.1 * 0.5));
  assert_true(w[1] == (float)(2.0 + 0.1));
  assert_true(w[2] == -3.0f);
  optim_state_free(&s);

  // On a table: only the listed rows move.
  optim_state_init(&s, sgd(0.5), 3, 2);
  float t[6] = {1, 1, 2, 2, 3, 3};
  int64_t ids[1] = {2};
  float rg[2] = {1.0f, -2.0f};
  optim_step_rows(&s, t, ids, rg, 1, DT_F32);
  const float want[6] = {1, 1, 2, 2, 2.5f, 4};
  assert_memory_equal(t, want, sizeof want);
  optim_state_free(&s);
}

static void test_optim_rowwise_adagrad_single_steps_by_hand(void **state) {
  (void)state;
  OptimState s;
  optim_state_init(&s, adagrad(0.1), 4, 2);
  float w[8] = {0, 0, 1, 1, 5, 5, 2, 2};
  int64_t ids[2] = {1, 3};
  float g[4] = {3, 4, 1, -1};
  optim_step_rows(&s, w, ids, g, 2, DT_F32);
  // Row 1: s = mean(9, 16) = 12.5, step 0.1 / sqrt(12.5). Row 3: s = 1, step 0.1 / (1 + eps).
  double step1 = 0.1 / (sqrt(12.5) + 1e-8), step3 = 0.1 / (1 + 1e-8);
  assert_close(s.rowsum[1], 12.5, 1e-7);
  assert_close(s.rowsum[3], 1.0, 1e-7);
  assert_true(s.rowsum[0] == 0 && s.rowsum[2] == 0);
  assert_close(w[2], 1 - step1 * 3, 1e-7);
  assert_close(w[3], 1 - step1 * 4, 1e-7);
  assert_close(w[6], 2 - step3, 1e-7);
  assert_close(w[7], 2 + step3, 1e-7);
  // Untouched rows keep every bit.
  assert_true(w[0] == 0 && w[1] == 0 && w[4] == 5 && w[5] == 5);

  // A second step on row 1 accumulates its state: 12.5 + mean(0, 25) = 25, step 0.1 / 5.
  float before = w[3];
  int64_t one[1] = {1};
  float g1[2] = {0, 5};
  optim_step_rows(&s, w, one, g1, 1, DT_F32);
  assert_close(s.rowsum[1], 25.0, 1e-7);
  assert_close(w[3], before - 0.1 / (5 + 1e-8) * 5, 1e-7);
  assert_close(s.rowsum[3], 1.0, 1e-7);  // row 3 not touched this time
  assert_int_equal(s.step, 2);
  optim_state_free(&s);
}

// Tables stored in bf16 or fp16 are written back rounded to that type.
static void test_optim_rows_are_rounded_to_storage(void **state) {
  (void)state;
  const DType types[] = {DT_BF16, DT_FP16};
  for (int k = 0; k < 2; k++) {
    OptimState s;
    optim_state_init(&s, adagrad(0.0123), 2, 4);
    float w[8];
    for (int i = 0; i < 8; i++) w[i] = round_to_dtype((float)(0.3 + 0.1 * i), types[k]);
    int64_t ids[1] = {1};
    float g[4] = {0.7f, -0.3f, 0.1f, 2.0f};
    float fp32[4];
    double step = 0.0123 / (sqrt((0.49 + 0.09 + 0.01 + 4.0) / 4) + 1e-8);
    for (int j = 0; j < 4; j++) fp32[j] = (float)(w[4 + j] - step * g[j]);
    optim_step_rows(&s, w, ids, g, 1, types[k]);
    int differs = 0;
    for (int j = 0; j < 4; j++) {
      assert_true(w[4 + j] == round_to_dtype(w[4 + j], types[k]));  // representable
      assert_close(w[4 + j], round_to_dtype(fp32[j], types[k]), 1e-6);
      differs += w[4 + j] != fp32[j];
    }
    assert_true(differs > 0);  // the rounding really happened
    optim_state_free(&s);
  }
  // An update smaller than half a bf16 ulp is lost, as on the GPU.
  OptimState s;
  optim_state_init(&s, sgd(1e-4), 1, 2);
  float w[2] = {1.0f, 1.0f};
  int64_t id[1] = {0};
  float g[2] = {1.0f, 1.0f};
  optim_step_rows(&s, w, id, g, 1, DT_BF16);
  assert_true(w[0] == 1.0f);
  optim_step_rows(&s, w, id, g, 1, DT_F32);
  assert_true(w[0] < 1.0f);
  optim_state_free(&s);
}

// A row that appears twice in one batch arrives merged (table_grad sums the gradients): the
// table then gets one update with g1 + g2, not two updates.
static void test_optim_duplicate_rows_arrive_merged_and_update_once(void **state) {
  (void)state;
  const float g1[2] = {0.5f, -1.0f}, g2[2] = {1.5f, 0.25f};
  float sum[2] = {g1[0] + g2[0], g1[1] + g2[1]};
  float merged[10] = {0}, by_hand[10] = {0}, twice[10] = {0};
  int64_t row3[1] = {3};

  OptimState a;
  optim_state_init(&a, adagrad(0.1), 5, 2);
  optim_step_rows(&a, merged, row3, sum, 1, DT_F32);

  // What one update with g1 + g2 is: s = mean((g1+g2)²), w = -lr (g1+g2) / sqrt(s).
  double st = (sum[0] * sum[0] + sum[1] * sum[1]) / 2.0;
  for (int j = 0; j < 2; j++) by_hand[6 + j] = (float)(-0.1 * sum[j] / (sqrt(st) + 1e-8));
  for (int i = 0; i < 10; i++) assert_close(merged[i], by_hand[i], 1e-6);
  assert_close(a.rowsum[3], st, 1e-7);
  assert_int_equal(a.step, 1);

  // Two separate updates (g1, then g2) differ: the state grows twice and the steps differ.
  OptimState b;
  optim_state_init(&b, adagrad(0.1), 5, 2);
  float one[2] = {g1[0], g1[1]}, two[2] = {g2[0], g2[1]};
  optim_step_rows(&b, twice, row3, one, 1, DT_F32);
  optim_step_rows(&b, twice, row3, two, 1, DT_F32);
  assert_true(fabs(twice[6] - merged[6]) > 1e-3);
  assert_true(b.rowsum[3] != a.rowsum[3]);
  optim_state_free(&a);
  optim_state_free(&b);
}

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

static void rows_step(const int64_t *ids, int64_t n, Optim cfg) {
  OptimState s;
  optim_state_init(&s, cfg, 4, 1);
  float w[4] = {0}, g[4] = {1, 1, 1, 1};
  optim_step_rows(&s, w, ids, g, n, DT_F32);
  optim_state_free(&s);
}
static void rows_duplicate(void) { rows_step((const int64_t[]){1, 1}, 2, adagrad(0.1)); }
static void rows_descending(void) { rows_step((const int64_t[]){2, 1}, 2, adagrad(0.1)); }
static void rows_out_of_range(void) { rows_step((const int64_t[]){0, 4}, 2, adagrad(0.1)); }
static void rows_negative(void) { rows_step((const int64_t[]){-1}, 1, sgd(0.1)); }
static void rows_adamw(void) { rows_step((const int64_t[]){0}, 1, adamw(0.1, 0)); }
static void dense_adagrad(void) {
  OptimState s;
  optim_state_init(&s, adagrad(0.1), 2, 1);
  float w[2] = {0}, g[2] = {0};
  optim_step_dense(&s, w, g, 2);
}
static void dense_wrong_size(void) {
  OptimState s;
  optim_state_init(&s, sgd(0.1), 2, 0);
  float w[3] = {0}, g[3] = {0};
  optim_step_dense(&s, w, g, 3);
}
static void rows_fine(void) { rows_step((const int64_t[]){0, 2, 3}, 3, adagrad(0.1)); }

static void test_optim_misuse_is_an_internal_error(void **state) {
  (void)state;
  assert_internal_error(rows_duplicate);
  assert_internal_error(rows_descending);
  assert_internal_error(rows_out_of_range);
  assert_internal_error(rows_negative);
  assert_internal_error(rows_adamw);
  assert_internal_error(dense_adagrad);
  assert_internal_error(dense_wrong_size);
  rows_fine();  // and the checks pass on good input
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_optim_state_init_allocates_per_kind),
      cmocka_unit_test(test_optim_adamw_two_steps_by_hand),
      cmocka_unit_test(test_optim_adamw_matches_double_reference_over_ten_steps),
      cmocka_unit_test(test_optim_sgd_dense_and_rows),
      cmocka_unit_test(test_optim_rowwise_adagrad_single_steps_by_hand),
      cmocka_unit_test(test_optim_rows_are_rounded_to_storage),
      cmocka_unit_test(test_optim_duplicate_rows_arrive_merged_and_update_once),
      cmocka_unit_test(test_optim_misuse_is_an_internal_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
