// test_metrics.c: NE, AUC, calibration and log loss. Small cases by hand, the perfect,
// reversed and constant predictors, ties, soft labels, the NaN cases, batching, and a
// 1,000,000-example AUC that must be fast and agree with a histogram count.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "metrics.h"

static uint64_t rng_state = 4242;
static double rng_uniform(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static void assert_near(double got, double want, double tol) {
  if (!(fabs(got - want) <= tol)) fail_msg("got %.15g, want %.15g (tolerance %g)", got, want, tol);
}

static Metrics of(const float *pred, const float *label, int64_t n) {
  Metrics m;
  metrics_reset(&m);
  metrics_add(&m, pred, label, n);
  return m;
}

static void test_metrics_small_case_by_hand(void **state) {
  (void)state;
  const float q[] = {0.9f, 0.2f, 0.6f, 0.4f};
  const float y[] = {1, 0, 0, 1};
  Metrics m = of(q, y, 4);
  double ll = -(log(0.9f) + log(1.0 - 0.2f) + log(1.0 - 0.6f) + log(0.4f)) / 4;
  assert_near(metrics_logloss(&m), ll, 1e-12);
  assert_near(metrics_ne(&m), ll / log(2.0), 1e-12);  // base rate 1/2: entropy ln 2
  // Pairs (positive, negative): (0.9, 0.2) (0.9, 0.6) (0.4, 0.2) right, (0.4, 0.6) wrong.
  assert_near(metrics_auc(&m), 0.75, 1e-15);
  assert_near(metrics_calibration(&m), (0.9f + 0.2f + 0.6f + 0.4f) / 2.0, 1e-7);
  assert_int_equal(m.n, 4);
  metrics_free(&m);
  assert_int_equal(m.n, 0);
  assert_null(m.preds);
}

static void test_metrics_ne_with_skewed_base_rate(void **state) {
  (void)state;
  // One positive in four: p = 0.25, entropy -(0.25 ln 0.25 + 0.75 ln 0.75).
  const float q[] = {0.5f, 0.1f, 0.2f, 0.3f};
  const float y[] = {1, 0, 0, 0};
  Metrics m = of(q, y, 4);
  double ll = -(log(0.5) + log(1.0 - 0.1f) + log(1.0 - 0.2f) + log(1.0 - 0.3f)) / 4;
  double h = -(0.25 * log(0.25) + 0.75 * log(0.75));
  assert_near(metrics_ne(&m), ll / h, 1e-12);
  assert_near(metrics_calibration(&m), (0.5f + 0.1f + 0.2f + 0.3f) / 1.0, 1e-7);
  assert_near(metrics_auc(&m), 1.0, 0);
  metrics_free(&m);
}

static void test_metrics_perfect_and_reversed_predictors(void **state) {
  (void)state;
  enum { N = 1000 };
  static float q[N], y[N], r[N];
  for (int i = 0; i < N; i++) {
    y[i] = (float)(rng_uniform() < 0.3);
    q[i] = y[i] ? (float)(0.6 + 0.3 * rng_uniform()) : (float)(0.1 + 0.4 * rng_uniform());
    r[i] = 1.0f - q[i];
  }
  Metrics m = of(q, y, N), rev = of(r, y, N);
  assert_true(metrics_auc(&m) == 1.0);
  assert_true(metrics_auc(&rev) == 0.0);
  assert_true(metrics_ne(&m) < 1.0);   // it beats the constant predictor
  assert_true(metrics_ne(&rev) > 1.0);
  metrics_free(&m);
  metrics_free(&rev);
}

// Predicting the base rate for everyone is the constant predictor NE is normalized by.
static void test_metrics_constant_predictor_at_base_rate_has_ne_one(void **state) {
  (void)state;
  enum { N = 1000 };
  static float q[N], y[N];
  for (int i = 0; i < N; i++) {
    y[i] = (float)(i % 10 < 3);  // base rate 0.3
    q[i] = 0.3f;
  }
  Metrics m = of(q, y, N);
  print_message("constant predictor: NE - 1 = %.3g\n", metrics_ne(&m) - 1);
  assert_near(metrics_ne(&m), 1.0, 1e-12);
  assert_near(metrics_auc(&m), 0.5, 0);  // every pair tied
  assert_near(metrics_calibration(&m), 1.0, 1e-7);
  metrics_free(&m);

  // Any other constant does worse.
  for (int i = 0; i < N; i++) q[i] = 0.35f;
  m = of(q, y, N);
  assert_true(metrics_ne(&m) > 1.0 + 1e-4);
  metrics_free(&m);
}

// O(n²) AUC straight from its definition.
static double brute_auc(const float *q, const float *y, int n) {
  double right = 0, pairs = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      if (!(y[i] == 1 && y[j] == 0)) continue;
      pairs++;
      right += q[i] > q[j] ? 1.0 : q[i] == q[j] ? 0.5 : 0.0;
    }
  return right / pairs;
}

static void test_metrics_auc_counts_ties_as_half(void **state) {
  (void)state;
  const float q1[] = {0.5f, 0.5f}, y1[] = {1, 0};
  Metrics m = of(q1, y1, 2);
  assert_near(metrics_auc(&m), 0.5, 0);
  metrics_free(&m);
  // (0.5, 0.1) right, (0.5, 0.5) tie, (0.9, 0.1) and (0.9, 0.5) right: 3.5 / 4.
  const float q2[] = {0.1f, 0.5f, 0.5f, 0.9f}, y2[] = {0, 1, 0, 1};
  m = of(q2, y2, 4);
  assert_near(metrics_auc(&m), 0.875, 0);
  metrics_free(&m);
  // Many ties, against the definition.
  enum { N = 1500 };
  static float q[N], y[N];
  for (int i = 0; i < N; i++) {
    q[i] = (float)(int)(rng_uniform() * 20) / 20;  // 20 distinct scores
    y[i] = (float)(rng_uniform() < 0.2 + 0.6 * q[i]);
  }
  m = of(q, y, N);
  assert_near(metrics_auc(&m), brute_auc(q, y, N), 1e-12);
  metrics_free(&m);
}

// A soft label y counts as y of a positive and 1 - y of a negative.
static void test_metrics_soft_labels_weight_both_classes(void **state) {
  (void)state;
  const float q[] = {0.2f, 0.8f}, y[] = {0.0f, 0.5f};
  Metrics m = of(q, y, 2);
  // Positive weight 0.5 at 0.8; negative weights 1 at 0.2 and 0.5 at 0.8 (a tie with itself):
  // (0.5 * 1 + 0.5 * 0.5 * 0.5) / (0.5 * 1.5).
  assert_near(metrics_auc(&m), 0.625 / 0.75, 1e-15);
  double ll = -(log(1.0 - 0.2f) + 0.5 * log(0.8f) + 0.5 * log(1.0 - 0.8f)) / 2;
  assert_near(metrics_logloss(&m), ll, 1e-12);
  metrics_free(&m);
}

static void test_metrics_nan_cases(void **state) {
  (void)state;
  Metrics m;
  metrics_reset(&m);
  assert_true(isnan(metrics_ne(&m)) && isnan(metrics_auc(&m)));
  assert_true(isnan(metrics_calibration(&m)) && isnan(metrics_logloss(&m)));

  const float q[] = {0.3f, 0.6f, 0.9f};
  const float ones[] = {1, 1, 1}, zeros[] = {0, 0, 0};
  m = of(q, ones, 3);  // one class only: no entropy, no pairs
  assert_true(isnan(metrics_ne(&m)) && isnan(metrics_auc(&m)));
  assert_near(metrics_calibration(&m), (0.3f + 0.6f + 0.9f) / 3.0, 1e-7);
  assert_false(isnan(metrics_logloss(&m)));
  metrics_free(&m);
  m = of(q, zeros, 3);  // and no positive: no calibration either
  assert_true(isnan(metrics_ne(&m)) && isnan(metrics_auc(&m)) && isnan(metrics_calibration(&m)));
  metrics_free(&m);

  // A NaN prediction (a diverged model) shows in every metric, never as a good number.
  const float qn[] = {0.3f, NAN, 0.9f}, y[] = {0, 1, 1};
  m = of(qn, y, 3);
  assert_true(isnan(metrics_ne(&m)) && isnan(metrics_auc(&m)));
  assert_true(isnan(metrics_logloss(&m)) && isnan(metrics_calibration(&m)));
  metrics_free(&m);
}

static void test_metrics_predictions_are_clamped_for_the_log(void **state) {
  (void)state;
  const float q[] = {0.0f, 1.0f}, y[] = {1, 0};  // confidently wrong, twice
  Metrics m = of(q, y, 2);
  assert_near(metrics_logloss(&m), -log(1e-7), 1e-6);
  assert_true(isfinite(metrics_ne(&m)));
  assert_near(metrics_calibration(&m), 1.0, 0);  // unclamped: (0 + 1) / 1
  metrics_free(&m);
}

static void test_metrics_batches_add_up_to_one_pass(void **state) {
  (void)state;
  enum { N = 3000 };
  static float q[N], y[N];
  for (int i = 0; i < N; i++) {
    q[i] = (float)rng_uniform();
    y[i] = (float)(rng_uniform() < q[i]);
  }
  Metrics whole = of(q, y, N), parts;
  metrics_reset(&parts);
  for (int i = 0; i < N; i += 700) metrics_add(&parts, q + i, y + i, N - i < 700 ? N - i : 700);
  assert_int_equal(parts.n, N);
  assert_true(metrics_ne(&parts) == metrics_ne(&whole));
  assert_true(metrics_auc(&parts) == metrics_auc(&whole));
  assert_true(metrics_calibration(&parts) == metrics_calibration(&whole));
  // Reuse after free starts from empty.
  metrics_free(&parts);
  metrics_add(&parts, q, y, 10);
  assert_int_equal(parts.n, 10);
  metrics_free(&parts);
  metrics_free(&whole);
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// 1e6 examples on 1000 distinct scores: the sort-based AUC against an O(n) histogram count.
static void test_metrics_auc_of_a_million_is_fast_and_exact(void **state) {
  (void)state;
  enum { N = 1000000, LEVELS = 1000 };
  float *q = malloc(N * sizeof *q), *y = malloc(N * sizeof *y);
  assert_non_null(q);
  assert_non_null(y);
  static double pos[LEVELS], neg[LEVELS];
  for (int i = 0; i < N; i++) {
    int level = (int)(rng_uniform() * LEVELS);
    q[i] = (float)level / LEVELS;
    y[i] = (float)(rng_uniform() < 0.1 + 0.3 * q[i]);
    (y[i] ? pos : neg)[level]++;
  }
  double right = 0, neg_below = 0, npos = 0;
  for (int l = 0; l < LEVELS; l++) {
    right += pos[l] * (neg_below + 0.5 * neg[l]);
    neg_below += neg[l];
    npos += pos[l];
  }
  double want = right / (npos * neg_below);

  Metrics m = of(q, y, N);
  double t0 = seconds();
  double auc = metrics_auc(&m);
  double took = seconds() - t0;
  print_message("AUC of 1e6 examples: %.6f in %.3f s\n", auc, took);
  assert_near(auc, want, 1e-12);
  assert_true(auc > 0.6 && auc < 0.8);
  assert_true(took < 1.0);
  metrics_free(&m);
  free(q);
  free(y);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_metrics_small_case_by_hand),
      cmocka_unit_test(test_metrics_ne_with_skewed_base_rate),
      cmocka_unit_test(test_metrics_perfect_and_reversed_predictors),
      cmocka_unit_test(test_metrics_constant_predictor_at_base_rate_has_ne_one),
      cmocka_unit_test(test_metrics_auc_counts_ties_as_half),
      cmocka_unit_test(test_metrics_soft_labels_weight_both_classes),
      cmocka_unit_test(test_metrics_nan_cases),
      cmocka_unit_test(test_metrics_predictions_are_clamped_for_the_log),
      cmocka_unit_test(test_metrics_batches_add_up_to_one_pass),
      cmocka_unit_test(test_metrics_auc_of_a_million_is_fast_and_exact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
