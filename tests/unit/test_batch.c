// test_batch.c: the schema a model's IR gives the data layer (features in IR order, their
// kinds, jagged dims, widths, max lengths and id limits), batch allocation and growth,
// copying windows of examples, and every rule of batch_validate, each broken alone.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "arena.h"
#include "batch.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"

// --- a model and its schema ---------------------------------------------------------------

#include "load_text.h"

static const Feature *feature(const Loaded *m, const char *name) {
  int i = schema_find(&m->s, name);
  if (i < 0) {
    print_message("no feature '%s'\n", name);
    fail();
  }
  return &m->s.features[i];
}

// --- the schema ---------------------------------------------------------------------------

static void test_batch_schema_of_gem_full_lists_inputs_and_labels_in_ir_order(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  const char *want[] = {"history", "actions", "dwell",    "queries", "ad",
                        "user",    "tags",    "counters", "click",   "convert"};
  assert_int_equal(m->s.nfeatures, 10);
  assert_int_equal(m->s.njagged, m->ir.njagged);
  assert_int_equal(m->s.batch, m->ir.batch);
  assert_ptr_equal(m->s.ir, &m->ir);
  int last_tensor = -1;
  for (int i = 0; i < 10; i++) {
    const Feature *f = &m->s.features[i];
    assert_string_equal(f->name, want[i]);
    assert_string_equal(m->ir.tensors[f->tensor].name, want[i]);
    assert_true(f->tensor > last_tensor);
    last_tensor = f->tensor;
  }
  assert_int_equal(schema_find(&m->s, "nonesuch"), -1);
  unload(m);
}

static void test_batch_schema_kinds_layouts_and_limits(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  int history_dim = feature(m, "history")->jag;
  assert_true(history_dim >= 0);
  assert_string_equal(m->ir.jagged[history_dim].name, "history");

  const Feature *f = feature(m, "history");
  assert_int_equal(f->kind, FEATURE_IDS);
  assert_true(f->owns_lengths);
  assert_int_equal(f->width, 1);
  assert_int_equal(f->max_len, 2048);
  assert_int_equal(f->id_limit, 10000000);
  assert_string_equal(f->id_table, "items");

  f = feature(m, "actions");  // like history: same dim, does not own it
  assert_int_equal(f->kind, FEATURE_IDS);
  assert_int_equal(f->jag, history_dim);
  assert_false(f->owns_lengths);
  assert_int_equal(f->max_len, 2048);
  assert_int_equal(f->id_limit, 64);
  assert_string_equal(f->id_table, "acts");

  f = feature(m, "dwell");  // f32 per position
  assert_int_equal(f->kind, FEATURE_FLOATS);
  assert_int_equal(f->jag, history_dim);
  assert_false(f->owns_lengths);
  assert_int_equal(f->width, 1);
  assert_int_equal(f->id_limit, 0);

  f = feature(m, "queries");
  assert_true(f->owns_lengths);
  assert_true(f->jag >= 0 && f->jag != history_dim);
  assert_int_equal(f->max_len, 64);
  assert_int_equal(f->id_limit, 500000);

  f = feature(m, "ad");
  assert_int_equal(f->kind, FEATURE_IDS);
  assert_int_equal(f->jag, -1);
  assert_false(f->owns_lengths);
  assert_int_equal(f->max_len, 0);
  assert_int_equal(f->id_limit, 10000000);

  f = feature(m, "user");
  assert_int_equal(f->id_limit, 1000000);
  assert_string_equal(f->id_table, "users");

  f = feature(m, "tags");  // multihot, pooled by embed_pool
  assert_true(f->owns_lengths);
  assert_int_equal(f->max_len, 32);
  assert_int_equal(f->id_limit, 100000);

  f = feature(m, "counters");
  assert_int_equal(f->kind, FEATURE_FLOATS);
  assert_int_equal(f->jag, -1);
  assert_int_equal(f->width, 32);

  f = feature(m, "convert");
  assert_int_equal(f->kind, FEATURE_LABEL);
  assert_int_equal(f->width, 1);
  assert_int_equal(f->jag, -1);
  assert_null(f->id_table);
  unload(m);
}

// Ids looked up in two tables must fit the smaller; ids that feed no table have no limit.
static void test_batch_schema_id_limit_is_the_smallest_table(void **state) {
  (void)state;
  static const char *text =
      "model m {\n"
      "  batch 4;\n"
      "  dim 8;\n"
      "  sparse ad : id;\n"
      "  sparse spare : id;\n"
      "  label y;\n"
      "  table big : rows 500;\n"
      "  table small : rows 70;\n"
      "  z = concat(embed(big, ad), embed(small, ad));\n"
      "  loss bce(mlp(z, [1]), y);\n"
      "}\n";
  Loaded *m = load("m.gem", text);
  assert_int_equal(feature(m, "ad")->id_limit, 70);
  assert_string_equal(feature(m, "ad")->id_table, "small");
  assert_int_equal(feature(m, "spare")->id_limit, 0);  // unused: no table
  assert_null(feature(m, "spare")->id_table);
  unload(m);
}

static void test_batch_feature_describe(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  char buf[128];
  feature_describe(feature(m, "history"), "history", buf, sizeof buf);
  assert_string_equal(buf, "ids, one per position of *history");
  feature_describe(feature(m, "ad"), "", buf, sizeof buf);
  assert_string_equal(buf, "ids, one per example");
  feature_describe(feature(m, "counters"), "", buf, sizeof buf);
  assert_string_equal(buf, "fp32[32] per example");
  feature_describe(feature(m, "dwell"), "history", buf, sizeof buf);
  assert_string_equal(buf, "fp32[1] per position of *history");
  feature_describe(feature(m, "click"), "", buf, sizeof buf);
  assert_string_equal(buf, "label");
  unload(m);
}

// --- a hand-made batch of models/gem_tiny.gem ---------------------------------------------

// history lengths 3, 0, 2, 1; ad ids; counters; clicks.
static void fill_tiny(const Loaded *m, Batch *b) {
  batch_alloc(b, &m->s, 4);
  int h = schema_find(&m->s, "history"), ad = schema_find(&m->s, "ad");
  int counters = schema_find(&m->s, "counters"), click = schema_find(&m->s, "click");
  int64_t offsets[] = {0, 3, 3, 5, 6};
  memcpy(b->offsets[0], offsets, sizeof offsets);
  b->total[0] = 6;
  batch_reserve(b, h, 6);
  int64_t items[] = {10, 11, 12, 20, 21, 30};
  memcpy(b->ids[h], items, sizeof items);
  for (int k = 0; k < 4; k++) {
    b->ids[ad][k] = 100 + k;
    for (int e = 0; e < 4; e++) b->values[counters][4 * k + e] = (float)(k + 0.25 * e);
    b->values[click][k] = (float)(k % 2);
  }
}

static void assert_invalid(const Loaded *m, const Batch *b, const char *want) {
  char err[512] = "";
  if (batch_validate(b, &m->s, err, sizeof err)) {
    print_message("expected an invalid batch (%s)\n", want);
    fail();
  }
  if (!strstr(err, want)) {
    print_message("expected the reason to contain:\n  %s\nbut it was:\n  %s\n", want, err);
    fail();
  }
}

static void test_batch_alloc_reserve_and_free(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  Batch b;
  batch_alloc(&b, &m->s, 64);
  assert_int_equal(b.B, 64);
  assert_int_equal(b.njagged, 1);
  assert_int_equal(b.nfeatures, 4);
  int h = schema_find(&m->s, "history"), counters = schema_find(&m->s, "counters");
  assert_non_null(b.ids[h]);
  assert_null(b.values[h]);
  assert_null(b.ids[counters]);
  assert_true(b.capacity[counters] >= 64 * 4);
  assert_true(b.capacity[schema_find(&m->s, "ad")] >= 64);
  for (int k = 0; k <= 64; k++) assert_int_equal(b.offsets[0][k], 0);
  // Growing keeps what was there.
  for (int64_t e = 0; e < b.capacity[h]; e++) b.ids[h][e] = e * 7;
  int64_t old = b.capacity[h];
  batch_reserve(&b, h, 64 * 50);
  assert_true(b.capacity[h] >= 64 * 50);
  for (int64_t e = 0; e < old; e++) assert_int_equal(b.ids[h][e], e * 7);
  batch_reserve(&b, h, 3);  // never shrinks
  assert_true(b.capacity[h] >= 64 * 50);
  batch_free(&b);
  assert_null(b.ids);
  assert_int_equal(b.B, 0);
  unload(m);
}

static void test_batch_validate_accepts_a_good_batch(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  Batch b;
  fill_tiny(m, &b);
  char err[256] = "";
  assert_true(batch_validate(&b, &m->s, err, sizeof err));
  batch_free(&b);
  unload(m);
}

static void test_batch_validate_offsets(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  Batch b;
  fill_tiny(m, &b);
  b.offsets[0][0] = 1;
  assert_invalid(m, &b, "the offsets of *history start at 1, not 0");
  b.offsets[0][0] = 0;
  b.offsets[0][2] = 2;  // 3 then 2
  assert_invalid(m, &b, "example 1: the offsets of *history are out of order (3 then 2)");
  b.offsets[0][2] = 3;
  b.total[0] = 5;
  assert_invalid(m, &b, "the total of *history is 5 but its offsets end at 6");
  batch_free(&b);

  // A length over the max (50 for gem_tiny's history).
  batch_alloc(&b, &m->s, 2);
  b.offsets[0][1] = 50;
  b.offsets[0][2] = 101;
  b.total[0] = 101;
  batch_reserve(&b, schema_find(&m->s, "history"), 101);
  memset(b.ids[schema_find(&m->s, "history")], 0, 101 * sizeof(int64_t));
  assert_invalid(m, &b, "example 1: *history has length 51, over its max 50");
  b.offsets[0][2] = 100;
  b.total[0] = 100;
  char err[256];
  assert_true(batch_validate(&b, &m->s, err, sizeof err));  // exactly the max is fine
  batch_free(&b);
  unload(m);
}

static void test_batch_validate_ids(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  Batch b;
  fill_tiny(m, &b);
  int h = schema_find(&m->s, "history"), ad = schema_find(&m->s, "ad");
  b.ids[ad][2] = 1000;
  assert_invalid(m, &b,
                 "example 2: feature 'ad': id 1000 is out of range: table 'ads' has 1000 rows "
                 "(ids must be in [0, 1000))");
  b.ids[ad][2] = 999;
  b.ids[h][4] = -5;  // example 2, position 1
  assert_invalid(m, &b, "example 2, position 1: feature 'history': id -5 is negative");
  b.ids[h][4] = 12345;
  assert_invalid(m, &b, "example 2, position 1: feature 'history': id 12345 is out of range: "
                        "table 'items' has 1000 rows");
  b.ids[h][4] = 0;
  char err[256];
  assert_true(batch_validate(&b, &m->s, err, sizeof err));
  // The example numbers count from `first` when the batch is a window of a stream.
  b.ids[ad][3] = 2000;
  assert_false(batch_validate_from(&b, &m->s, 640, err, sizeof err));
  assert_non_null(strstr(err, "example 643: feature 'ad': id 2000"));
  batch_free(&b);
  unload(m);
}

static void test_batch_validate_floats_and_labels(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  Batch b;
  fill_tiny(m, &b);
  int counters = schema_find(&m->s, "counters"), click = schema_find(&m->s, "click");
  b.values[counters][4 * 1 + 2] = NAN;
  assert_invalid(m, &b, "example 1: feature 'counters': element 2 is nan, not a finite number");
  b.values[counters][4 * 1 + 2] = -INFINITY;
  assert_invalid(m, &b, "example 1: feature 'counters': element 2 is -inf, not a finite number");
  b.values[counters][4 * 1 + 2] = 1e30f;  // large is fine
  char err[256];
  assert_true(batch_validate(&b, &m->s, err, sizeof err));
  b.values[click][3] = 0.5f;
  assert_invalid(m, &b, "example 3: label 'click' is 0.5; labels must be 0 or 1");
  b.values[click][3] = NAN;
  assert_invalid(m, &b, "example 3: label 'click' is nan; labels must be 0 or 1");
  batch_free(&b);
  unload(m);
}

static void test_batch_validate_per_position_floats(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  Batch b;
  batch_alloc(&b, &m->s, 3);
  int history = schema_find(&m->s, "history"), dwell = schema_find(&m->s, "dwell");
  int j = m->s.features[history].jag;
  int64_t offsets[] = {0, 2, 5, 5};
  memcpy(b.offsets[j], offsets, sizeof offsets);
  b.total[j] = 5;
  for (int f = 0; f < m->s.nfeatures; f++) {
    const Feature *ft = &m->s.features[f];
    int64_t n = (ft->jag >= 0 ? b.total[ft->jag] : 3) * ft->width;
    batch_reserve(&b, f, n);
    if (b.ids[f]) memset(b.ids[f], 0, (size_t)n * sizeof(int64_t));
    else memset(b.values[f], 0, (size_t)n * sizeof(float));
  }
  char err[256];
  assert_true(batch_validate(&b, &m->s, err, sizeof err));
  b.values[dwell][3] = INFINITY;  // example 1, position 1
  assert_invalid(m, &b, "example 1, position 1: feature 'dwell': element 0 is inf");
  batch_free(&b);
  unload(m);
}

static void test_batch_validate_mismatched_batch(void **state) {
  (void)state;
  Loaded *tiny = load("models/gem_tiny.gem", NULL);
  Loaded *full = load("models/gem_full.gem", NULL);
  Batch b;
  fill_tiny(tiny, &b);
  char err[256];
  assert_false(batch_validate(&b, &full->s, err, sizeof err));
  assert_non_null(strstr(err, "the batch has 4 features and 1 jagged dims; the schema has 10"));
  batch_free(&b);
  unload(tiny);
  unload(full);
}

// --- copying ------------------------------------------------------------------------------

static void test_batch_copy_windows(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  Batch src, dst;
  fill_tiny(m, &src);
  batch_alloc(&dst, &m->s, 5);
  // dst = src[2..4) then src[0..3): lengths 2, 1, 3, 0, 2.
  batch_copy(&m->s, &dst, 0, &src, 2, 2);
  batch_copy(&m->s, &dst, 2, &src, 0, 3);
  int64_t want_offsets[] = {0, 2, 3, 6, 6, 8};
  for (int k = 0; k <= 5; k++) assert_int_equal(dst.offsets[0][k], want_offsets[k]);
  assert_int_equal(dst.total[0], 8);
  int h = schema_find(&m->s, "history"), ad = schema_find(&m->s, "ad");
  int counters = schema_find(&m->s, "counters"), click = schema_find(&m->s, "click");
  int64_t want_items[] = {20, 21, 30, 10, 11, 12, 20, 21};
  for (int e = 0; e < 8; e++) assert_int_equal(dst.ids[h][e], want_items[e]);
  int64_t want_ads[] = {102, 103, 100, 101, 102};
  for (int k = 0; k < 5; k++) assert_int_equal(dst.ids[ad][k], want_ads[k]);
  assert_true(dst.values[counters][4 * 0 + 3] == src.values[counters][4 * 2 + 3]);
  assert_true(dst.values[counters][4 * 4 + 1] == src.values[counters][4 * 2 + 1]);
  assert_true(dst.values[click][1] == 1.0f && dst.values[click][2] == 0.0f);
  char err[256];
  assert_true(batch_validate(&dst, &m->s, err, sizeof err));
  batch_free(&src);
  batch_free(&dst);
  unload(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_schema_of_gem_full_lists_inputs_and_labels_in_ir_order),
      cmocka_unit_test(test_batch_schema_kinds_layouts_and_limits),
      cmocka_unit_test(test_batch_schema_id_limit_is_the_smallest_table),
      cmocka_unit_test(test_batch_feature_describe),
      cmocka_unit_test(test_batch_alloc_reserve_and_free),
      cmocka_unit_test(test_batch_validate_accepts_a_good_batch),
      cmocka_unit_test(test_batch_validate_offsets),
      cmocka_unit_test(test_batch_validate_ids),
      cmocka_unit_test(test_batch_validate_floats_and_labels),
      cmocka_unit_test(test_batch_validate_per_position_floats),
      cmocka_unit_test(test_batch_validate_mismatched_batch),
      cmocka_unit_test(test_batch_copy_windows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
