// test_flops.c: the FLOP count behind Local MFU. It grows exactly linearly with the batch when
// every example keeps its lengths, the backward pass adds to the forward one, padding never
// counts (empty sequences add nothing to attention), and the peaks are the datasheet's.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batch.h"
#include "flops.h"
#include "load_model.h"

// A batch of B examples whose jagged lengths repeat the pattern `lens` (cycled).
static void make_batch(const Schema *s, int64_t B, const int64_t *lens, int nlens, Batch *b) {
  batch_alloc(b, s, B);
  for (int j = 0; j < s->njagged; j++) {
    b->offsets[j][0] = 0;
    for (int64_t e = 0; e < B; e++) b->offsets[j][e + 1] = b->offsets[j][e] + lens[e % nlens];
    b->total[j] = b->offsets[j][B];
  }
}

static void test_flops_linear_in_batch_and_backward_adds(void **state) {
  (void)state;
  LoadedModel m;
  assert_true(load_model(&m, "models/gem_tiny.gem", NULL, true, true, false));
  Schema s;
  schema_from_ir(&m.ir, &s);
  const int64_t lens[] = {0, 1, 17, 50};
  Batch b4, b8;
  make_batch(&s, 4, lens, 4, &b4);
  make_batch(&s, 8, lens, 4, &b8);
  double f4 = step_flops(&m.ir, &b4, false), f8 = step_flops(&m.ir, &b8, false);
  assert_true(f4 > 0);
  assert_true(f8 == 2 * f4);
  double t4 = step_flops(&m.ir, &b4, true);
  assert_true(t4 > 2 * f4);  // backward: about twice the forward, attention 2.5 times
  assert_true(t4 < 4 * f4);
  // Only real positions count: the same examples with every sequence empty do less work, and
  // lengths beyond what is present never count.
  const int64_t empty[] = {0};
  Batch be;
  make_batch(&s, 4, empty, 1, &be);
  assert_true(step_flops(&m.ir, &be, false) < f4);
  batch_free(&b4);
  batch_free(&b8);
  batch_free(&be);
  loaded_model_free(&m);
}

static void test_flops_causal_attention_counts_visible_pairs(void **state) {
  (void)state;
  LoadedModel m;
  assert_true(load_model(&m, "models/gem_tiny.gem", NULL, true, true, false));
  Schema s;
  schema_from_ir(&m.ir, &s);
  // One example of length L against one of length 0: the difference is the work of L rows,
  // and its attention part grows as L(L+1)/2 (causal), not L^2.
  const int64_t l10[] = {10}, l20[] = {20}, l0[] = {0};
  Batch a, b, z;
  make_batch(&s, 1, l10, 1, &a);
  make_batch(&s, 1, l20, 1, &b);
  make_batch(&s, 1, l0, 1, &z);
  double base = step_flops(&m.ir, &z, false);
  double d10 = step_flops(&m.ir, &a, false) - base, d20 = step_flops(&m.ir, &b, false) - base;
  // Rows-linear work doubles; the causal self-attention part goes from 55 to 210 pairs.
  assert_true(d20 > 2 * d10);
  assert_true(d20 < 4 * d10);
  batch_free(&a);
  batch_free(&b);
  batch_free(&z);
  loaded_model_free(&m);
}

static void test_flops_peaks_are_the_datasheet_numbers(void **state) {
  (void)state;
  assert_true(peak_tflops("sm_90a", DT_BF16) > 989 && peak_tflops("sm_90a", DT_BF16) < 990);
  assert_true(peak_tflops("sm_90a", DT_FP16) == peak_tflops("sm_90a", DT_BF16));
  assert_true(peak_tflops("sm_90a", DT_FP8) > 1978 && peak_tflops("sm_90a", DT_FP8) < 1980);
  assert_true(peak_tflops("sm_90a", DT_MXFP8) == peak_tflops("sm_90a", DT_FP8));
  assert_true(peak_tflops("sm_90a", DT_F32) > 66 && peak_tflops("sm_90a", DT_F32) < 68);
  assert_true(peak_tflops("sm_100a", DT_BF16) > peak_tflops("sm_90a", DT_BF16));
  assert_true(peak_tflops("sm_75", DT_BF16) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flops_linear_in_batch_and_backward_adds),
      cmocka_unit_test(test_flops_causal_attention_counts_visible_pairs),
      cmocka_unit_test(test_flops_peaks_are_the_datasheet_numbers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
