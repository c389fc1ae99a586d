// synth.c: synthetic data with a learnable ground truth.
//
// Every example is a pure function of (seed, example index): each of its random fields draws
// from its own counter-based stream, splitmix64 of (seed, index, field), so any window of the
// stream can be generated on its own and always comes out the same.
//
// How an example is drawn:
//   - a hidden topic t in [0, 16) (not a feature: it only shapes the ids);
//   - every jagged dim gets a length from the configured distribution, or 0 with probability
//     empty_fraction;
//   - ids are Zipf-like (s = 1.05) ranks; a sequence id is, with probability 0.8, a rank
//     shifted to the topic's own popular region of the table (0.6 for a one-per-example id),
//     so a history says something about the user and the candidate can match it;
//   - dense floats are N(0, 1); per-position floats are Exp(1).
//
// The teacher gives every id of every table a hashed vector u(id) in [-1,1)^8 and a scalar
// s(id) (keyed by the table the ids are looked up in, so the same item has the same vector in
// a history and as a candidate). An example's score sums standardized terms:
//   seq mean     <mean u(history), c>
//   seq recent   <recency-weighted mean u(history), c'>   (weights 0.7^(positions from end))
//   seq length   log(1 + length)
//   id           s(id) of a one-per-example id
//   interact     <u(candidate), mean u(first sequence)>
//   dense        <w, x> of a dense feature
//   seq float    mean over positions of <w, v>
// Each label mixes the same terms with its own weights (the first label by fixed shares; the
// others by randomized shares, and each term's sign flipped with probability 1/4), scaled so
// the scores have variance 3, plus a bias that puts its base rate at 0.27 (0.20-0.32 for later
// labels). Standardization and bias come from a calibration sample of 1024 examples drawn from
// a separate stream. The label is Bernoulli(sigmoid(score)); synth_teacher_prob gives that
// probability, the Bayes-optimal prediction (a perfect model reaches NE ~ 0.7).
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "internal_error.h"
#include "synth.h"

enum {
  NTOPICS = 16,
  UDIM = 8,                // dims of the teacher's id vectors
  CALIBRATION_EXAMPLES = 1024,
  CALIBRATION_BATCH = 256,
  SYNTH_MAX_THREADS = 8,            // threads that make one batch
  SYNTH_PARALLEL_VALUES = 16384,    // fewer ids and rows than this: one thread
};

static const double ZIPF_S = 1.05;
static const double SCORE_VARIANCE = 3.0;
static const double RECENCY_DECAY = 0.7;

// --- counter-based random numbers ---------------------------------------------------------

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = mix64(a + 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ (b + 0x632be59bd9b4e019ULL));
  return mix64(h ^ (c + 0x8cb92ba72f3d8dd7ULL));
}

static uint64_t hash_string(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
  return mix64(h);
}

typedef struct Rng {
  uint64_t state;
} Rng;

static uint64_t rng_next(Rng *r) {
  r->state += 0x9e3779b97f4a7c15ULL;
  return mix64(r->state);
}

static double rng_uniform(Rng *r) {  // [0, 1)
  return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static double rng_normal(Rng *r) {
  double u1 = 1.0 - rng_uniform(r);  // (0, 1]
  double u2 = rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// The fields of an example; each (tag, index) pair is its own stream.
enum { STREAM_TOPIC = 1, STREAM_LENGTH, STREAM_FEATURE, STREAM_LABEL };

static Rng stream(uint64_t seed, int64_t example, uint32_t tag, uint32_t index) {
  return (Rng){hash3(seed, (uint64_t)example, ((uint64_t)tag << 32) | index)};
}

// Uniform in [-1, 1) from 16 bits.
static double unit16(uint64_t bits) { return (double)(bits & 0xffff) / 32768.0 - 1.0; }

// --- the generator ----------------------------------------------------------------------

typedef enum TermKind {
  TERM_SEQ_MEAN,
  TERM_SEQ_RECENT,
  TERM_SEQ_LENGTH,
  TERM_ID,
  TERM_INTERACT,
  TERM_DENSE,
  TERM_SEQ_FLOAT,
  TERM_KIND_COUNT
} TermKind;

// Each kind's share of the first label's score variance, split evenly among its terms.
static const double TERM_SHARE[TERM_KIND_COUNT] = {
    [TERM_SEQ_MEAN] = 0.8, [TERM_SEQ_RECENT] = 0.25, [TERM_SEQ_LENGTH] = 0.15,
    [TERM_ID] = 0.8,       [TERM_INTERACT] = 0.35,   [TERM_DENSE] = 1.0,
    [TERM_SEQ_FLOAT] = 0.3,
};

typedef struct Term {
  TermKind kind;
  int f;              // the feature (the jagged dim for TERM_SEQ_LENGTH; the candidate for
                      // TERM_INTERACT)
  int h;              // TERM_INTERACT: the sequence feature
  double dir[UDIM];   // SEQ_MEAN, SEQ_RECENT: the direction c
  double *w;          // DENSE, SEQ_FLOAT: one weight per element
  double mean, std;   // of the raw term over the calibration sample
} Term;

// How one id feature draws its ids.
typedef struct IdGen {
  uint64_t key;       // hash of the table (or the feature) name: the teacher's key
  int64_t vocab;      // ids are in [0, vocab)
  double zipf_top;    // (vocab + 1)^(1 - s), for the inverse CDF
  double p_topic;     // probability of a topic-shifted id
  int64_t topic_base[NTOPICS];
} IdGen;

// An id sequence's teacher summary for one example.
typedef struct SeqSummary {
  double mean[UDIM], recent[UDIM];
} SeqSummary;

struct Synth {
  const Schema *s;
  SynthConfig cfg;
  IdGen *ids;         // [nfeatures]
  Term *terms;
  int nterms;
  int nlabels;
  int *label_slot;    // [nfeatures]: index among the labels, or -1
  double *alpha;      // [nlabels][nterms]: weights of the standardized terms
  double *bias;       // [nlabels]
  int threads;        // how many make one large batch (the cores, at most SYNTH_MAX_THREADS)
  double *raw;        // scratch: [threads][nterms], thread w's at raw + w * nterms
  SeqSummary *seq;    // scratch: [threads][nfeatures]
};

void synth_config_default(SynthConfig *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->seed = 1;
  cfg->lengths = LENGTHS_LOGNORMAL;
  cfg->empty_fraction = 0.02;
  cfg->id_vocab = 0;
}

static const char *const LENGTH_NAMES[] = {
    [LENGTHS_UNIFORM] = "uniform", [LENGTHS_LOGNORMAL] = "lognormal", [LENGTHS_HEAVY] = "heavy"};

bool synth_length_dist_from_name(const char *s, LengthDist *out) {
  for (int d = 0; d < (int)(sizeof LENGTH_NAMES / sizeof *LENGTH_NAMES); d++)
    if (strcmp(s, LENGTH_NAMES[d]) == 0) {
      *out = (LengthDist)d;
      return true;
    }
  return false;
}

const char *synth_length_dist_name(LengthDist d) {
  if ((int)d < 0 || d > LENGTHS_HEAVY) return "?";
  return LENGTH_NAMES[d];
}

// --- drawing an example -------------------------------------------------------------------

static int example_topic(uint64_t seed, int64_t i) {
  Rng r = stream(seed, i, STREAM_TOPIC, 0);
  return (int)(rng_next(&r) % NTOPICS);
}

static int64_t uniform_int(Rng *r, int64_t lo, int64_t hi) {  // [lo, hi]
  int64_t x = lo + (int64_t)(rng_uniform(r) * (double)(hi - lo + 1));
  return x > hi ? hi : x;
}

static int64_t draw_length(const Synth *g, uint64_t seed, int64_t i, int j) {
  int64_t max = g->s->ir->jagged[j].max_len;
  if (max < 1) return 0;
  Rng r = stream(seed, i, STREAM_LENGTH, (uint32_t)j);
  if (rng_uniform(&r) < g->cfg.empty_fraction) return 0;
  switch (g->cfg.lengths) {
  case LENGTHS_UNIFORM: return uniform_int(&r, 1, max);
  case LENGTHS_LOGNORMAL: {
    double x = round((double)max / 8.0 * exp(rng_normal(&r)));
    return x < 1 ? 1 : x > (double)max ? max : (int64_t)x;
  }
  case LENGTHS_HEAVY: {
    if (rng_uniform(&r) < 0.9) return uniform_int(&r, 1, max / 16 > 1 ? max / 16 : 1);
    return uniform_int(&r, max / 2 > 1 ? max / 2 : 1, max);
  }
  }
  return 1;
}

// A Zipf-like rank in [0, vocab): the inverse CDF of the continuous power law x^-s on
// [1, vocab + 1), floored.
static int64_t zipf_rank(const IdGen *ig, double u) {
  double x = pow(1.0 + u * (ig->zipf_top - 1.0), 1.0 / (1.0 - ZIPF_S));
  int64_t r = (int64_t)x - 1;
  return r < 0 ? 0 : r >= ig->vocab ? ig->vocab - 1 : r;
}

static int64_t draw_id(const IdGen *ig, Rng *r, int topic) {
  int64_t rank = zipf_rank(ig, rng_uniform(r));
  if (rng_uniform(r) < ig->p_topic) return (ig->topic_base[topic] + rank) % ig->vocab;
  return rank;
}

// The lengths of examples [first, first + B) of the stream `seed`, and room for every
// feature's values (the labels are set to 0 with the rest, by fill_examples).
static void lengths_of(const Synth *g, uint64_t seed, int64_t first, Batch *b) {
  for (int j = 0; j < g->s->njagged; j++) {
    int64_t *o = b->offsets[j];
    o[0] = 0;
    for (int64_t k = 0; k < b->B; k++) o[k + 1] = o[k] + draw_length(g, seed, first + k, j);
    b->total[j] = o[b->B];
  }
}

static void fill_lengths(const Synth *g, uint64_t seed, int64_t first, Batch *b) {
  const Schema *s = g->s;
  int64_t B = b->B;
  lengths_of(g, seed, first, b);
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    batch_reserve(b, f, (ft->jag >= 0 ? b->total[ft->jag] : B) * ft->width);
  }
}

// Every feature but the labels (set to 0) of batch examples [k0, k1), after fill_lengths.
static void fill_examples(const Synth *g, uint64_t seed, int64_t first, Batch *b, int64_t k0,
                          int64_t k1) {
  const Schema *s = g->s;
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    for (int64_t k = k0; k < k1; k++) {
      int64_t i = first + k;
      Rng r = stream(seed, i, STREAM_FEATURE, (uint32_t)f);
      int64_t at = ft->jag >= 0 ? b->offsets[ft->jag][k] : k;
      int64_t n = ft->jag >= 0 ? b->offsets[ft->jag][k + 1] - at : 1;
      switch (ft->kind) {
      case FEATURE_IDS: {
        int topic = example_topic(seed, i);
        for (int64_t p = 0; p < n; p++) b->ids[f][at + p] = draw_id(&g->ids[f], &r, topic);
        break;
      }
      case FEATURE_FLOATS: {
        float *v = b->values[f] + at * ft->width;
        for (int64_t e = 0; e < n * ft->width; e++)
          v[e] = (float)(ft->jag >= 0 ? -log(1.0 - rng_uniform(&r)) : rng_normal(&r));
        break;
      }
      case FEATURE_LABEL: b->values[f][k] = 0.0f; break;
      }
    }
  }
}

static void fill_features(const Synth *g, uint64_t seed, int64_t first, Batch *b) {
  fill_lengths(g, seed, first, b);
  fill_examples(g, seed, first, b, 0, b->B);
}

// --- the teacher --------------------------------------------------------------------------

static void teacher_vector(uint64_t seed, uint64_t key, int64_t id, double u[UDIM]) {
  uint64_t h = hash3(seed ^ 0x7465616368657231ULL, key, (uint64_t)id);
  for (int d = 0; d < UDIM; d++) {
    if (d == 4) h = mix64(h);
    u[d] = unit16(h >> (16 * (d % 4)));
  }
}

static double teacher_scalar(uint64_t seed, uint64_t key, int64_t id) {
  return unit16(hash3(seed ^ 0x7363616c61723031ULL, key, (uint64_t)id) >> 7);
}

static void summarize_sequence(const Synth *g, const Batch *b, int f, int64_t k,
                               SeqSummary *out) {
  const Feature *ft = &g->s->features[f];
  int64_t at = b->offsets[ft->jag][k], n = b->offsets[ft->jag][k + 1] - at;
  memset(out, 0, sizeof *out);
  double weight = 1.0, weights = 0.0, u[UDIM];
  for (int64_t p = n - 1; p >= 0; p--) {  // from the most recent position back
    teacher_vector(g->cfg.seed, g->ids[f].key, b->ids[f][at + p], u);
    for (int d = 0; d < UDIM; d++) {
      out->mean[d] += u[d];
      out->recent[d] += weight * u[d];
    }
    weights += weight;
    weight *= RECENCY_DECAY;
  }
  for (int d = 0; d < UDIM && n > 0; d++) {
    out->mean[d] /= (double)n;
    out->recent[d] /= weights;
  }
}

static double dot(const double *a, const double *b, int n) {
  double s = 0.0;
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

// The raw (unstandardized) value of every term for example k of b.
static void raw_terms(const Synth *g, const Batch *b, int64_t k, SeqSummary *seq, double *raw) {
  const Schema *s = g->s;
  for (int f = 0; f < s->nfeatures; f++)
    if (s->features[f].kind == FEATURE_IDS && s->features[f].jag >= 0)
      summarize_sequence(g, b, f, k, &seq[f]);
  for (int t = 0; t < g->nterms; t++) {
    const Term *term = &g->terms[t];
    const Feature *ft = term->kind == TERM_SEQ_LENGTH ? NULL : &s->features[term->f];
    double x = 0.0;
    switch (term->kind) {
    case TERM_SEQ_MEAN: x = dot(seq[term->f].mean, term->dir, UDIM); break;
    case TERM_SEQ_RECENT: x = dot(seq[term->f].recent, term->dir, UDIM); break;
    case TERM_SEQ_LENGTH:
      x = log1p((double)(b->offsets[term->f][k + 1] - b->offsets[term->f][k]));
      break;
    case TERM_ID: x = teacher_scalar(g->cfg.seed, g->ids[term->f].key, b->ids[term->f][k]); break;
    case TERM_INTERACT: {
      double u[UDIM];
      teacher_vector(g->cfg.seed, g->ids[term->f].key, b->ids[term->f][k], u);
      x = dot(u, seq[term->h].mean, UDIM);
      break;
    }
    case TERM_DENSE: {
      const float *v = b->values[term->f] + k * ft->width;
      for (int64_t e = 0; e < ft->width; e++) x += (double)v[e] * term->w[e];
      break;
    }
    case TERM_SEQ_FLOAT: {
      int64_t at = b->offsets[ft->jag][k], n = b->offsets[ft->jag][k + 1] - at;
      for (int64_t p = 0; p < n; p++) {
        const float *v = b->values[term->f] + (at + p) * ft->width;
        for (int64_t e = 0; e < ft->width; e++) x += (double)v[e] * term->w[e];
      }
      if (n > 0) x /= (double)n;
      break;
    }
    case TERM_KIND_COUNT: GEMC_UNREACHABLE();
    }
    raw[t] = x;
  }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double score_of(const Synth *g, const double *raw, int slot) {
  const double *alpha = g->alpha + (size_t)slot * (size_t)g->nterms;
  double z = g->bias[slot];
  for (int t = 0; t < g->nterms; t++)
    if (alpha[t] != 0.0) z += alpha[t] * (raw[t] - g->terms[t].mean) / g->terms[t].std;
  return z;
}

double synth_teacher_prob(const Synth *g, const Batch *b, int64_t k, int label) {
  if (label < 0 || label >= g->s->nfeatures || g->label_slot[label] < 0) return NAN;
  double *raw = xcalloc((size_t)g->nterms, sizeof *raw);
  SeqSummary *seq = xcalloc((size_t)g->s->nfeatures, sizeof *seq);
  raw_terms(g, b, k, seq, raw);
  double p = sigmoid(score_of(g, raw, g->label_slot[label]));
  free(raw);
  free(seq);
  return p;
}

// --- construction -------------------------------------------------------------------------

static Term *add_term(Synth *g, TermKind kind, int f, int h) {
  Term *t = &g->terms[g->nterms++];
  t->kind = kind;
  t->f = f;
  t->h = h;
  Rng r = {hash3(g->cfg.seed ^ 0x7465726d73ULL, (uint64_t)kind, ((uint64_t)f << 32) | (uint32_t)h)};
  for (int d = 0; d < UDIM; d++) t->dir[d] = 2.0 * rng_uniform(&r) - 1.0;
  if (kind == TERM_DENSE || kind == TERM_SEQ_FLOAT) {
    int64_t width = g->s->features[f].width;
    t->w = xcalloc((size_t)width, sizeof *t->w);
    for (int64_t e = 0; e < width; e++) t->w[e] = 2.0 * rng_uniform(&r) - 1.0;
  }
  return t;
}

static void setup_ids(Synth *g) {
  const Schema *s = g->s;
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    if (ft->kind != FEATURE_IDS) continue;
    IdGen *ig = &g->ids[f];
    ig->key = hash_string(ft->id_table ? ft->id_table : ft->name);
    int64_t cap = g->cfg.id_vocab > 0 ? g->cfg.id_vocab : 0;
    int64_t vocab = ft->id_limit > 0 ? ft->id_limit : (cap > 0 ? cap : (int64_t)1 << 20);
    if (cap > 0 && cap < vocab) vocab = cap;
    ig->vocab = vocab;
    ig->zipf_top = pow((double)vocab + 1.0, 1.0 - ZIPF_S);
    ig->p_topic = ft->jag >= 0 ? 0.8 : 0.6;
    for (int t = 0; t < NTOPICS; t++)
      ig->topic_base[t] = (int64_t)(hash3(g->cfg.seed, ig->key, (uint64_t)t) % (uint64_t)vocab);
  }
}

// The terms, in schema order (the candidate-history interaction uses the first sequence of
// ids, preferring one that owns its lengths).
static void setup_terms(Synth *g) {
  const Schema *s = g->s;
  g->terms = xcalloc((size_t)(3 * s->nfeatures + s->njagged), sizeof *g->terms);
  int history = -1;
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    if (ft->kind != FEATURE_IDS || ft->jag < 0) continue;
    if (history < 0 || (ft->owns_lengths && !s->features[history].owns_lengths)) history = f;
  }
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    if (ft->kind == FEATURE_IDS && ft->jag >= 0) {
      add_term(g, TERM_SEQ_MEAN, f, 0);
      if (ft->max_len > 1) add_term(g, TERM_SEQ_RECENT, f, 0);
    } else if (ft->kind == FEATURE_IDS) {
      add_term(g, TERM_ID, f, 0);
      if (history >= 0) add_term(g, TERM_INTERACT, f, history);
    } else if (ft->kind == FEATURE_FLOATS) {
      add_term(g, ft->jag >= 0 ? TERM_SEQ_FLOAT : TERM_DENSE, f, 0);
    }
  }
  for (int j = 0; j < s->njagged; j++)
    if (s->ir->jagged[j].max_len > 1) add_term(g, TERM_SEQ_LENGTH, j, 0);
}

// Each term's mean and standard deviation over a calibration sample; `raw` receives the
// sample's raw terms, [CALIBRATION_EXAMPLES][nterms].
static void calibrate_terms(Synth *g, double *raw) {
  Batch b;
  batch_alloc(&b, g->s, CALIBRATION_BATCH);
  uint64_t seed = mix64(g->cfg.seed ^ 0x63616c6962726174ULL);
  for (int64_t first = 0; first < CALIBRATION_EXAMPLES; first += CALIBRATION_BATCH) {
    fill_features(g, seed, first, &b);
    for (int64_t k = 0; k < CALIBRATION_BATCH; k++)
      raw_terms(g, &b, k, g->seq, raw + (size_t)(first + k) * (size_t)g->nterms);
  }
  batch_free(&b);
  for (int t = 0; t < g->nterms; t++) {
    double sum = 0.0, sq = 0.0;
    for (int k = 0; k < CALIBRATION_EXAMPLES; k++) sum += raw[(size_t)k * (size_t)g->nterms + t];
    double mean = sum / CALIBRATION_EXAMPLES;
    for (int k = 0; k < CALIBRATION_EXAMPLES; k++) {
      double d = raw[(size_t)k * (size_t)g->nterms + t] - mean;
      sq += d * d;
    }
    g->terms[t].mean = mean;
    g->terms[t].std = sqrt(sq / CALIBRATION_EXAMPLES);
  }
}

// Label `slot`'s weights: shares of the score variance (randomized for every label after the
// first), random signs, scaled to SCORE_VARIANCE in total.
static void mix_label(Synth *g, int slot, int label_feature) {
  int count[TERM_KIND_COUNT] = {0};
  for (int t = 0; t < g->nterms; t++) count[g->terms[t].kind]++;
  double *alpha = g->alpha + (size_t)slot * (size_t)g->nterms;
  double total = 0.0;
  for (int t = 0; t < g->nterms; t++) {
    const Term *term = &g->terms[t];
    if (!(term->std > 1e-9)) continue;  // a constant term carries no signal
    // The sign of a term is shared by the tasks 3 times in 4, so tasks correlate.
    Rng shared = {hash3(g->cfg.seed ^ 0x7369676eULL, (uint64_t)t, 0)};
    Rng r = {hash3(g->cfg.seed ^ 0x6d6978ULL, (uint64_t)label_feature, (uint64_t)t)};
    double sign = rng_uniform(&shared) < 0.5 ? -1.0 : 1.0;
    double var = TERM_SHARE[term->kind] / count[term->kind];
    if (slot > 0) {
      var *= 0.2 + 1.6 * rng_uniform(&r);
      if (rng_uniform(&r) < 0.25) sign = -sign;
    }
    alpha[t] = sign * sqrt(var);
    total += var;
  }
  double scale = total > 0 ? sqrt(SCORE_VARIANCE / total) : 0.0;
  for (int t = 0; t < g->nterms; t++) alpha[t] *= scale;
}

// The bias that makes the mean teacher probability over the calibration sample `rate`.
static double solve_bias(Synth *g, int slot, const double *raw, double rate) {
  double lo = -30.0, hi = 30.0;
  for (int it = 0; it < 60; it++) {
    g->bias[slot] = 0.5 * (lo + hi);
    double mean = 0.0;
    for (int k = 0; k < CALIBRATION_EXAMPLES; k++)
      mean += sigmoid(score_of(g, raw + (size_t)k * (size_t)g->nterms, slot));
    if (mean / CALIBRATION_EXAMPLES < rate) lo = g->bias[slot];
    else hi = g->bias[slot];
  }
  return 0.5 * (lo + hi);
}

Synth *synth_new(const Schema *s, const SynthConfig *cfg) {
  Synth *g = xcalloc(1, sizeof *g);
  g->s = s;
  g->cfg = *cfg;
  g->ids = xcalloc((size_t)s->nfeatures, sizeof *g->ids);
  g->label_slot = xcalloc((size_t)s->nfeatures, sizeof *g->label_slot);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  g->threads = cores < 1 ? 1 : cores > SYNTH_MAX_THREADS ? SYNTH_MAX_THREADS : (int)cores;
  g->seq = xcalloc((size_t)g->threads * (size_t)s->nfeatures, sizeof *g->seq);
  for (int f = 0; f < s->nfeatures; f++)
    g->label_slot[f] = s->features[f].kind == FEATURE_LABEL ? g->nlabels++ : -1;
  setup_ids(g);
  setup_terms(g);
  g->raw = xcalloc((size_t)g->threads * (size_t)g->nterms, sizeof *g->raw);
  g->alpha = xcalloc((size_t)(g->nlabels * g->nterms), sizeof *g->alpha);
  g->bias = xcalloc((size_t)g->nlabels, sizeof *g->bias);
  if (g->nlabels == 0) return g;
  double *raw = xcalloc((size_t)CALIBRATION_EXAMPLES * (size_t)g->nterms, sizeof *raw);
  calibrate_terms(g, raw);
  for (int f = 0; f < s->nfeatures; f++) {
    int slot = g->label_slot[f];
    if (slot < 0) continue;
    mix_label(g, slot, f);
    Rng r = {hash3(g->cfg.seed ^ 0x62617365ULL, (uint64_t)f, 0)};
    double rate = slot == 0 ? 0.27 : 0.20 + 0.12 * rng_uniform(&r);
    g->bias[slot] = solve_bias(g, slot, raw, rate);
  }
  free(raw);
  return g;
}

void synth_free(Synth *g) {
  if (!g) return;
  for (int t = 0; t < g->nterms; t++) free(g->terms[t].w);
  free(g->terms);
  free(g->ids);
  free(g->label_slot);
  free(g->alpha);
  free(g->bias);
  free(g->raw);
  free(g->seq);
  free(g);
}

// The labels of batch examples [k0, k1), with scratch seq [nfeatures] and raw [nterms].
static void label_examples(const Synth *g, int64_t first, Batch *b, int64_t k0, int64_t k1,
                           SeqSummary *seq, double *raw) {
  for (int64_t k = k0; k < k1; k++) {
    raw_terms(g, b, k, seq, raw);
    for (int f = 0; f < g->s->nfeatures; f++) {
      int slot = g->label_slot[f];
      if (slot < 0) continue;
      double p = sigmoid(score_of(g, raw, slot));
      Rng r = stream(g->cfg.seed, first + k, STREAM_LABEL, (uint32_t)f);
      b->values[f][k] = rng_uniform(&r) < p ? 1.0f : 0.0f;
    }
  }
}

// One thread's share of a batch: examples [k0, k1).
typedef struct SynthShare {
  const Synth *g;
  Batch *b;
  int64_t first, k0, k1;
  SeqSummary *seq;
  double *raw;
} SynthShare;

static void *synth_share(void *arg) {
  SynthShare *w = arg;
  fill_examples(w->g, w->g->cfg.seed, w->first, w->b, w->k0, w->k1);
  if (w->g->nlabels > 0) label_examples(w->g, w->first, w->b, w->k0, w->k1, w->seq, w->raw);
  return NULL;
}

// Every example is a function of its index alone, so threads split a batch by examples (this
// one takes the first share): the result does not depend on how many there are.
void synth_batch(Synth *g, int64_t first, Batch *b) {
  fill_lengths(g, g->cfg.seed, first, b);
  int64_t values = b->B;
  for (int j = 0; j < b->njagged; j++) values += b->total[j];
  int n = values < SYNTH_PARALLEL_VALUES ? 1 : g->threads > b->B ? (int)b->B : g->threads;
  SynthShare share[SYNTH_MAX_THREADS];
  pthread_t thread[SYNTH_MAX_THREADS];
  bool started[SYNTH_MAX_THREADS] = {false};
  for (int w = n - 1; w >= 0; w--) {
    share[w] = (SynthShare){g, b, first, b->B * w / n, b->B * (w + 1) / n,
                            g->seq + (size_t)w * (size_t)g->s->nfeatures,
                            g->raw + (size_t)w * (size_t)g->nterms};
    if (w > 0) started[w] = pthread_create(&thread[w], NULL, synth_share, &share[w]) == 0;
  }
  synth_share(&share[0]);
  for (int w = 1; w < n; w++) {
    if (started[w]) pthread_join(thread[w], NULL);
    else synth_share(&share[w]);  // no thread: its share runs here
  }
}

void synth_lengths(Synth *g, int64_t first, Batch *b) { lengths_of(g, g->cfg.seed, first, b); }
