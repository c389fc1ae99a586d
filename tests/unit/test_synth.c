// test_synth.c: synthetic data: determinism (same seed and window, same bytes; windows agree
// with each other), validity for every kind of input, the length distributions and Zipf-like
// ids, and the teacher: its labels follow its probabilities, different tasks mix different
// signals, and its Bayes-optimal NE on models/gem_tiny.gem is clearly below 1.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "arena.h"
#include "batch.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"
#include "synth.h"

// --- a model and its schema ---------------------------------------------------------------

#include "load_text.h"

// One sequence of up to 512 ids (for length statistics), a candidate id, a label.
static const char *LENGTHS_MODEL =
    "model lens {\n"
    "  batch 8;\n"
    "  dim 8;\n"
    "  seq s : id max 512;\n"
    "  sparse a : id;\n"
    "  label y;\n"
    "  table t : rows 5000;\n"
    "  p = embed(t, s, pool = mean);\n"
    "  z = concat(p, embed(t, a));\n"
    "  loss bce(mlp(z, [1]), y);\n"
    "}\n";

static SynthConfig config(uint64_t seed, LengthDist lengths) {
  SynthConfig cfg;
  synth_config_default(&cfg);
  cfg.seed = seed;
  cfg.lengths = lengths;
  return cfg;
}

// --- comparing batches --------------------------------------------------------------------

static int64_t entries(const Schema *s, const Batch *b, int f) {
  const Feature *ft = &s->features[f];
  return (ft->jag >= 0 ? b->total[ft->jag] : b->B) * ft->width;
}

static bool batches_equal(const Schema *s, const Batch *x, const Batch *y) {
  if (x->B != y->B) return false;
  for (int j = 0; j < s->njagged; j++) {
    if (x->total[j] != y->total[j]) return false;
    if (memcmp(x->offsets[j], y->offsets[j], (size_t)(x->B + 1) * sizeof(int64_t))) return false;
  }
  for (int f = 0; f < s->nfeatures; f++) {
    size_t n = (size_t)entries(s, x, f);
    if (x->ids[f] && memcmp(x->ids[f], y->ids[f], n * sizeof(int64_t))) return false;
    if (x->values[f] && memcmp(x->values[f], y->values[f], n * sizeof(float))) return false;
  }
  return true;
}

static void assert_valid(const Schema *s, const Batch *b) {
  char err[512];
  if (!batch_validate(b, s, err, sizeof err)) {
    print_message("batch_validate: %s\n", err);
    fail();
  }
}

// --- determinism --------------------------------------------------------------------------

static void test_synth_same_seed_and_window_give_the_same_bytes(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  SynthConfig cfg = config(42, LENGTHS_HEAVY);
  Synth *g1 = synth_new(&m->s, &cfg), *g2 = synth_new(&m->s, &cfg);
  Batch a, b;
  batch_alloc(&a, &m->s, 32);
  batch_alloc(&b, &m->s, 32);
  synth_batch(g1, 1000, &a);
  synth_batch(g1, 5, &b);      // another window in between must not matter
  synth_batch(g2, 1000, &b);
  assert_true(batches_equal(&m->s, &a, &b));
  synth_batch(g1, 1001, &b);   // a shifted window differs
  assert_false(batches_equal(&m->s, &a, &b));
  batch_free(&a);
  batch_free(&b);
  synth_free(g1);
  synth_free(g2);
  unload(m);
}

static void test_synth_windows_agree_with_each_other(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  SynthConfig cfg = config(7, LENGTHS_LOGNORMAL);
  Synth *g = synth_new(&m->s, &cfg);
  Batch whole, first, second, joined;
  batch_alloc(&whole, &m->s, 128);
  batch_alloc(&first, &m->s, 64);
  batch_alloc(&second, &m->s, 64);
  batch_alloc(&joined, &m->s, 128);
  synth_batch(g, 0, &whole);
  synth_batch(g, 64, &second);  // out of order on purpose
  synth_batch(g, 0, &first);
  batch_copy(&m->s, &joined, 0, &first, 0, 64);
  batch_copy(&m->s, &joined, 64, &second, 0, 64);
  assert_true(batches_equal(&m->s, &whole, &joined));
  // An odd window inside agrees too.
  Batch odd, part;
  batch_alloc(&odd, &m->s, 37);
  batch_alloc(&part, &m->s, 37);
  synth_batch(g, 50, &odd);
  batch_copy(&m->s, &part, 0, &whole, 50, 37);
  assert_true(batches_equal(&m->s, &odd, &part));
  batch_free(&odd);
  batch_free(&part);
  batch_free(&whole);
  batch_free(&first);
  batch_free(&second);
  batch_free(&joined);
  synth_free(g);
  unload(m);
}

// A batch large enough to be made by several threads (gem_small's 512 examples hold about 100k
// ids) equals the same examples made 8 at a time, each of those small enough for one thread.
static void test_synth_threaded_batch_equals_small_batches(void **state) {
  (void)state;
  Loaded *m = load("models/gem_small.gem", NULL);
  SynthConfig cfg = config(3, LENGTHS_LOGNORMAL);
  Synth *g = synth_new(&m->s, &cfg);
  enum { B = 512, SMALL = 8 };
  Batch whole, small, joined;
  batch_alloc(&whole, &m->s, B);
  batch_alloc(&small, &m->s, SMALL);
  batch_alloc(&joined, &m->s, B);
  synth_batch(g, 77, &whole);
  int64_t ids = 0;
  for (int j = 0; j < whole.njagged; j++) ids += whole.total[j];
  assert_true(ids >= 16384);  // SYNTH_PARALLEL_VALUES: the whole batch takes the threaded path
  for (int64_t k = 0; k < B; k += SMALL) {
    synth_batch(g, 77 + k, &small);
    batch_copy(&m->s, &joined, k, &small, 0, SMALL);
  }
  assert_true(batches_equal(&m->s, &whole, &joined));
  batch_free(&whole);
  batch_free(&small);
  batch_free(&joined);
  synth_free(g);
  unload(m);
}

static void test_synth_different_seeds_differ(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  SynthConfig c1 = config(1, LENGTHS_UNIFORM), c2 = config(2, LENGTHS_UNIFORM);
  Synth *g1 = synth_new(&m->s, &c1), *g2 = synth_new(&m->s, &c2);
  Batch a, b;
  batch_alloc(&a, &m->s, 64);
  batch_alloc(&b, &m->s, 64);
  synth_batch(g1, 0, &a);
  synth_batch(g2, 0, &b);
  assert_false(batches_equal(&m->s, &a, &b));
  batch_free(&a);
  batch_free(&b);
  synth_free(g1);
  synth_free(g2);
  unload(m);
}

// --- validity -----------------------------------------------------------------------------

static void test_synth_batches_validate_for_every_model_and_distribution(void **state) {
  (void)state;
  const char *models[] = {"models/gem_tiny.gem", "models/gem_small.gem", "models/gem_full.gem",
                          "models/hstu.gem"};
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
    Loaded *m = load(models[i], NULL);
    for (int d = LENGTHS_UNIFORM; d <= LENGTHS_HEAVY; d++) {
      SynthConfig cfg = config(3 + (uint64_t)d, (LengthDist)d);
      Synth *g = synth_new(&m->s, &cfg);
      Batch b;
      batch_alloc(&b, &m->s, 16);
      for (int64_t first = 0; first < 64; first += 16) {
        synth_batch(g, first, &b);
        assert_valid(&m->s, &b);
      }
      batch_free(&b);
      synth_free(g);
    }
    unload(m);
  }
}

static void test_synth_all_empty_sequences_are_valid(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  SynthConfig cfg = config(5, LENGTHS_LOGNORMAL);
  cfg.empty_fraction = 1.0;
  Synth *g = synth_new(&m->s, &cfg);
  Batch b;
  batch_alloc(&b, &m->s, 32);
  synth_batch(g, 0, &b);
  assert_valid(&m->s, &b);
  for (int j = 0; j < m->s.njagged; j++) assert_int_equal(b.total[j], 0);
  int click = schema_find(&m->s, "click");
  for (int64_t k = 0; k < b.B; k++) assert_true(isfinite(synth_teacher_prob(g, &b, k, click)));
  batch_free(&b);
  synth_free(g);
  unload(m);
}

static void test_synth_id_vocab_caps_the_ids(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  SynthConfig cfg = config(9, LENGTHS_UNIFORM);
  cfg.id_vocab = 10;
  Synth *g = synth_new(&m->s, &cfg);
  Batch b;
  batch_alloc(&b, &m->s, 64);
  synth_batch(g, 0, &b);
  int history = schema_find(&m->s, "history"), ad = schema_find(&m->s, "ad");
  bool seen[10] = {false};
  for (int64_t e = 0; e < b.total[0]; e++) {
    assert_in_range(b.ids[history][e], 0, 9);
    seen[b.ids[history][e]] = true;
  }
  for (int64_t k = 0; k < b.B; k++) assert_in_range(b.ids[ad][k], 0, 9);
  int distinct = 0;
  for (int i = 0; i < 10; i++) distinct += seen[i];
  assert_true(distinct >= 8);
  batch_free(&b);
  synth_free(g);
  unload(m);
}

// --- distributions ------------------------------------------------------------------------

typedef struct LengthStats {
  double mean, median, empty, short_share, long_share;  // short: <= max/16; long: >= max/2
} LengthStats;

static int compare_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

// Statistics of the lengths of 20,480 examples of the 512-long sequence.
static LengthStats length_stats(LengthDist dist, double empty_fraction) {
  Loaded *m = load("lens.gem", LENGTHS_MODEL);
  SynthConfig cfg = config(11, dist);
  cfg.empty_fraction = empty_fraction;
  Synth *g = synth_new(&m->s, &cfg);
  enum { N = 20480, B = 1024 };
  int64_t *lengths = malloc(N * sizeof *lengths);
  Batch b;
  batch_alloc(&b, &m->s, B);
  for (int64_t first = 0; first < N; first += B) {
    synth_batch(g, first, &b);
    for (int64_t k = 0; k < B; k++) lengths[first + k] = b.offsets[0][k + 1] - b.offsets[0][k];
  }
  LengthStats st = {0};
  int64_t nonempty = 0;
  for (int64_t i = 0; i < N; i++) {
    st.mean += (double)lengths[i] / N;
    st.empty += lengths[i] == 0 ? 1.0 / N : 0.0;
    if (lengths[i] == 0) continue;
    nonempty++;
    st.short_share += lengths[i] <= 512 / 16 ? 1.0 : 0.0;
    st.long_share += lengths[i] >= 512 / 2 ? 1.0 : 0.0;
    assert_true(lengths[i] >= 1 && lengths[i] <= 512);
  }
  st.short_share /= (double)nonempty;
  st.long_share /= (double)nonempty;
  // The median of the non-empty lengths.
  int64_t *sorted = malloc((size_t)nonempty * sizeof *sorted);
  for (int64_t i = 0, n = 0; i < N; i++)
    if (lengths[i] > 0) sorted[n++] = lengths[i];
  qsort(sorted, (size_t)nonempty, sizeof *sorted, compare_i64);
  st.median = (double)sorted[nonempty / 2];
  free(sorted);
  free(lengths);
  batch_free(&b);
  synth_free(g);
  unload(m);
  return st;
}

static void test_synth_uniform_lengths(void **state) {
  (void)state;
  LengthStats st = length_stats(LENGTHS_UNIFORM, 0.0);
  assert_true(fabs(st.mean - 256.5) < 6.0);
  assert_true(st.empty == 0.0);
  assert_true(fabs(st.long_share - 0.5) < 0.02);
}

static void test_synth_lognormal_lengths_have_median_max_over_8(void **state) {
  (void)state;
  LengthStats st = length_stats(LENGTHS_LOGNORMAL, 0.0);
  print_message("lognormal: median %.1f (want 64), mean %.1f\n", st.median, st.mean);
  assert_true(fabs(st.median - 64.0) <= 5.0);
  assert_true(st.mean > st.median);  // skewed right
}

static void test_synth_heavy_lengths_are_mostly_short_with_a_long_tail(void **state) {
  (void)state;
  LengthStats st = length_stats(LENGTHS_HEAVY, 0.0);
  print_message("heavy: %.3f short, %.3f long, mean %.1f\n", st.short_share, st.long_share,
                st.mean);
  assert_true(fabs(st.short_share - 0.9) < 0.015);
  assert_true(fabs(st.long_share - 0.1) < 0.015);
  assert_true(fabs(st.short_share + st.long_share - 1.0) < 1e-9);  // nothing in between
}

static void test_synth_empty_fraction(void **state) {
  (void)state;
  LengthStats st = length_stats(LENGTHS_UNIFORM, 0.02);
  print_message("empty: %.4f (want 0.02)\n", st.empty);
  assert_true(fabs(st.empty - 0.02) < 0.005);
  st = length_stats(LENGTHS_HEAVY, 0.3);
  assert_true(fabs(st.empty - 0.3) < 0.02);
}

static void test_synth_ids_are_zipf_like(void **state) {
  (void)state;
  Loaded *m = load("lens.gem", LENGTHS_MODEL);
  SynthConfig cfg = config(13, LENGTHS_UNIFORM);
  Synth *g = synth_new(&m->s, &cfg);
  Batch b;
  batch_alloc(&b, &m->s, 512);
  int64_t *count = calloc(5000, sizeof *count);
  int64_t n = 0;
  for (int64_t first = 0; first < 4096; first += 512) {
    synth_batch(g, first, &b);
    for (int64_t e = 0; e < b.total[0]; e++, n++) count[b.ids[0][e]]++;
  }
  qsort(count, 5000, sizeof *count, compare_i64);  // ascending
  int64_t top = count[4999], top100 = 0, seen = 0;
  for (int i = 0; i < 100; i++) top100 += count[4999 - i];
  for (int i = 0; i < 5000; i++) seen += count[i] > 0;
  print_message("ids: top %.4f, top 100 %.3f of %lld draws, %lld of 5000 ids seen\n",
                (double)top / (double)n, (double)top100 / (double)n, (long long)n,
                (long long)seen);
  assert_true((double)top / (double)n > 50.0 / 5000);  // the head is 50x the uniform share
  assert_true((double)top100 / (double)n > 0.2);        // 2% of the ids take 20% of the draws
  assert_true(seen > 2500);                              // and the tail is long
  free(count);
  batch_free(&b);
  synth_free(g);
  unload(m);
}

// --- the teacher --------------------------------------------------------------------------

static double entropy(double p) {
  if (p <= 0.0 || p >= 1.0) return 0.0;
  return -(p * log(p) + (1 - p) * log(1 - p));
}

typedef struct TeacherStats {
  double base_rate;    // mean label
  double mean_prob;    // mean teacher probability
  double ne_expected;  // E[H(p)] / H(mean p): the Bayes NE in expectation
  double ne_sampled;   // the teacher's log loss on the drawn labels / H(base rate)
  double mean_p_given_1, mean_p_given_0;
} TeacherStats;

static TeacherStats teacher_stats(Loaded *m, Synth *g, int label, int64_t n) {
  enum { B = 512 };
  Batch b;
  batch_alloc(&b, &m->s, B);
  double sum_h = 0, sum_p = 0, sum_y = 0, sum_loss = 0, p1 = 0, p0 = 0;
  for (int64_t first = 0; first < n; first += B) {
    synth_batch(g, first, &b);
    for (int64_t k = 0; k < B; k++) {
      double p = synth_teacher_prob(g, &b, k, label);
      double y = b.values[label][k];
      sum_h += entropy(p);
      sum_p += p;
      sum_y += y;
      sum_loss -= y > 0.5 ? log(p) : log(1 - p);
      if (y > 0.5) p1 += p;
      else p0 += p;
    }
  }
  batch_free(&b);
  TeacherStats st;
  st.base_rate = sum_y / (double)n;
  st.mean_prob = sum_p / (double)n;
  st.ne_expected = sum_h / (double)n / entropy(st.mean_prob);
  st.ne_sampled = sum_loss / (double)n / entropy(st.base_rate);
  st.mean_p_given_1 = p1 / sum_y;
  st.mean_p_given_0 = p0 / ((double)n - sum_y);
  return st;
}

static void test_synth_teacher_bayes_ne_on_gem_tiny_is_clearly_below_1(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  SynthConfig cfg;
  synth_config_default(&cfg);
  Synth *g = synth_new(&m->s, &cfg);
  TeacherStats st = teacher_stats(m, g, schema_find(&m->s, "click"), 16384);
  print_message("gem_tiny teacher: base rate %.3f (mean p %.3f), Bayes NE %.3f expected, "
                "%.3f on the drawn labels\n",
                st.base_rate, st.mean_prob, st.ne_expected, st.ne_sampled);
  assert_true(st.base_rate > 0.2 && st.base_rate < 0.35);
  assert_true(fabs(st.base_rate - st.mean_prob) < 0.02);  // labels follow the probabilities
  assert_true(st.ne_expected > 0.5 && st.ne_expected < 0.85);
  assert_true(fabs(st.ne_sampled - st.ne_expected) < 0.05);
  assert_true(st.mean_p_given_1 > st.mean_p_given_0 + 0.1);
  synth_free(g);
  unload(m);
}

// Every model: each label has a sensible base rate and a teacher that beats the constant.
static void test_synth_teacher_learnable_for_every_model_and_distribution(void **state) {
  (void)state;
  const char *models[] = {"models/gem_small.gem", "models/gem_full.gem", "models/hstu.gem"};
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
    Loaded *m = load(models[i], NULL);
    for (int d = LENGTHS_UNIFORM; d <= LENGTHS_HEAVY; d++) {
      SynthConfig cfg = config(21, (LengthDist)d);
      Synth *g = synth_new(&m->s, &cfg);
      for (int f = 0; f < m->s.nfeatures; f++) {
        if (m->s.features[f].kind != FEATURE_LABEL) continue;
        TeacherStats st = teacher_stats(m, g, f, 1024);
        if (st.mean_prob < 0.15 || st.mean_prob > 0.4 || st.ne_expected > 0.9) {
          print_message("%s %s %s: mean p %.3f, Bayes NE %.3f\n", models[i],
                        synth_length_dist_name((LengthDist)d), m->s.features[f].name,
                        st.mean_prob, st.ne_expected);
          fail();
        }
      }
      synth_free(g);
    }
    unload(m);
  }
}

// The tasks of a multi-task model mix the signals differently: their probabilities are
// correlated but far from identical.
static void test_synth_tasks_mix_signals_differently(void **state) {
  (void)state;
  Loaded *m = load("models/gem_full.gem", NULL);
  SynthConfig cfg = config(17, LENGTHS_LOGNORMAL);
  Synth *g = synth_new(&m->s, &cfg);
  int click = schema_find(&m->s, "click"), convert = schema_find(&m->s, "convert");
  Batch b;
  batch_alloc(&b, &m->s, 512);
  synth_batch(g, 0, &b);
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, agree = 0;
  for (int64_t k = 0; k < b.B; k++) {
    double x = synth_teacher_prob(g, &b, k, click), y = synth_teacher_prob(g, &b, k, convert);
    sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
    agree += b.values[click][k] == b.values[convert][k];
  }
  double n = (double)b.B;
  double corr = (sxy / n - sx / n * sy / n) /
                sqrt((sxx / n - sx / n * sx / n) * (syy / n - sy / n * sy / n));
  print_message("click/convert teacher correlation %.3f, labels agree on %.3f\n", corr,
                agree / n);
  assert_true(corr > 0.1 && corr < 0.9);
  assert_true(agree / n < 0.95);
  assert_true(isnan(synth_teacher_prob(g, &b, 0, schema_find(&m->s, "ad"))));
  batch_free(&b);
  synth_free(g);
  unload(m);
}

// Changing a feature the teacher reads changes its probability: the label depends on the
// sequence contents, the ids and the dense features.
static void test_synth_teacher_reads_sequence_ids_and_dense_features(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  SynthConfig cfg = config(19, LENGTHS_UNIFORM);
  cfg.empty_fraction = 0.0;
  Synth *g = synth_new(&m->s, &cfg);
  int click = schema_find(&m->s, "click"), history = schema_find(&m->s, "history");
  int ad = schema_find(&m->s, "ad"), counters = schema_find(&m->s, "counters");
  Batch b;
  batch_alloc(&b, &m->s, 64);
  synth_batch(g, 0, &b);
  int changed_seq = 0, changed_ad = 0, changed_dense = 0;
  for (int64_t k = 0; k < b.B; k++) {
    double p = synth_teacher_prob(g, &b, k, click);
    int64_t *h = &b.ids[history][b.offsets[0][k]];
    int64_t keep = *h;
    *h = (keep + 1) % 1000;
    changed_seq += fabs(synth_teacher_prob(g, &b, k, click) - p) > 1e-6;
    *h = keep;
    keep = b.ids[ad][k];
    b.ids[ad][k] = (keep + 1) % 1000;
    changed_ad += fabs(synth_teacher_prob(g, &b, k, click) - p) > 1e-6;
    b.ids[ad][k] = keep;
    float v = b.values[counters][4 * k];
    b.values[counters][4 * k] = v + 1.0f;
    changed_dense += fabs(synth_teacher_prob(g, &b, k, click) - p) > 1e-6;
    b.values[counters][4 * k] = v;
    assert_true(fabs(synth_teacher_prob(g, &b, k, click) - p) == 0.0);  // restored
  }
  assert_int_equal(changed_seq, 64);
  assert_int_equal(changed_ad, 64);
  assert_int_equal(changed_dense, 64);
  batch_free(&b);
  synth_free(g);
  unload(m);
}

static void test_synth_length_dist_names_round_trip(void **state) {
  (void)state;
  for (int d = LENGTHS_UNIFORM; d <= LENGTHS_HEAVY; d++) {
    LengthDist out;
    assert_true(synth_length_dist_from_name(synth_length_dist_name((LengthDist)d), &out));
    assert_int_equal(out, d);
  }
  LengthDist out;
  assert_false(synth_length_dist_from_name("zipf", &out));
  assert_string_equal(synth_length_dist_name(LENGTHS_HEAVY), "heavy");
}

// Generating a gem_small batch (B = 512, histories up to 1024) is far cheaper than a step.
static void test_synth_is_fast(void **state) {
  (void)state;
  Loaded *m = load("models/gem_small.gem", NULL);
  SynthConfig cfg;
  synth_config_default(&cfg);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  Synth *g = synth_new(&m->s, &cfg);
  Batch b;
  batch_alloc(&b, &m->s, m->s.batch);
  for (int i = 0; i < 10; i++) synth_batch(g, i * m->s.batch, &b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  print_message("gem_small: synth_new + 10 batches of 512 in %.3f s\n", s);
  assert_true(s < 5.0);
  batch_free(&b);
  synth_free(g);
  unload(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_synth_same_seed_and_window_give_the_same_bytes),
      cmocka_unit_test(test_synth_windows_agree_with_each_other),
      cmocka_unit_test(test_synth_threaded_batch_equals_small_batches),
      cmocka_unit_test(test_synth_different_seeds_differ),
      cmocka_unit_test(test_synth_batches_validate_for_every_model_and_distribution),
      cmocka_unit_test(test_synth_all_empty_sequences_are_valid),
      cmocka_unit_test(test_synth_id_vocab_caps_the_ids),
      cmocka_unit_test(test_synth_uniform_lengths),
      cmocka_unit_test(test_synth_lognormal_lengths_have_median_max_over_8),
      cmocka_unit_test(test_synth_heavy_lengths_are_mostly_short_with_a_long_tail),
      cmocka_unit_test(test_synth_empty_fraction),
      cmocka_unit_test(test_synth_ids_are_zipf_like),
      cmocka_unit_test(test_synth_teacher_bayes_ne_on_gem_tiny_is_clearly_below_1),
      cmocka_unit_test(test_synth_teacher_learnable_for_every_model_and_distribution),
      cmocka_unit_test(test_synth_tasks_mix_signals_differently),
      cmocka_unit_test(test_synth_teacher_reads_sequence_ids_and_dense_features),
      cmocka_unit_test(test_synth_length_dist_names_round_trip),
      cmocka_unit_test(test_synth_is_fast),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
