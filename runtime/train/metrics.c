// metrics.c: NE, AUC, calibration and log loss for binary tasks, accumulated over batches.
// Sums are in double; predictions and labels are kept for AUC, which sorts them once
// (O(n log n)) and counts tied predictions as half right. Labels may be soft (in [0, 1]): an
// example then counts y as a positive and 1 - y as a negative, as TorchRec weights them.
#include "metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal_error.h"

enum { INITIAL_CAP = 1024 };
static const double PRED_CLAMP = 1e-7;  // predictions are clamped to [1e-7, 1 - 1e-7] for the log

void metrics_reset(Metrics *m) { memset(m, 0, sizeof *m); }

void metrics_free(Metrics *m) {
  free(m->preds);
  free(m->labels);
  metrics_reset(m);
}

static void grow(Metrics *m, int64_t need) {
  if (need <= m->cap) return;
  int64_t cap = m->cap ? m->cap : INITIAL_CAP;
  while (cap < need) cap *= 2;
  float *p = realloc(m->preds, (size_t)cap * sizeof *p);
  if (p) m->preds = p;
  float *l = p ? realloc(m->labels, (size_t)cap * sizeof *l) : NULL;
  if (!p || !l) gemc_internal_error(__FILE__, __LINE__, "out of memory for metrics");
  m->labels = l;
  m->cap = cap;
}

void metrics_add(Metrics *m, const float *pred, const float *label, int64_t n) {
  GEMC_ASSERT(n >= 0);
  grow(m, m->n + n);
  for (int64_t i = 0; i < n; i++) {
    double q = pred[i], y = label[i];
    // NaN stays NaN (a diverged model must not look fine); fmin/fmax would hide it.
    double qc = q < PRED_CLAMP ? PRED_CLAMP : q > 1.0 - PRED_CLAMP ? 1.0 - PRED_CLAMP : q;
    m->sum_logloss -= y * log(qc) + (1.0 - y) * log(1.0 - qc);
    m->sum_pred += q;
    m->sum_label += y;
    m->preds[m->n + i] = pred[i];
    m->labels[m->n + i] = label[i];
  }
  m->n += n;
}

double metrics_logloss(const Metrics *m) { return m->n > 0 ? m->sum_logloss / (double)m->n : NAN; }

double metrics_ne(const Metrics *m) {
  if (m->n == 0) return NAN;
  double p = m->sum_label / (double)m->n;
  if (!(p > 0 && p < 1)) return NAN;  // one class only: the entropy is 0
  double entropy = -(p * log(p) + (1.0 - p) * log(1.0 - p));
  return metrics_logloss(m) / entropy;
}

double metrics_calibration(const Metrics *m) {
  return m->sum_label > 0 ? m->sum_pred / m->sum_label : NAN;
}

typedef struct Scored {
  float pred, label;
} Scored;

static int by_pred(const void *a, const void *b) {
  float x = ((const Scored *)a)->pred, y = ((const Scored *)b)->pred;
  return (x > y) - (x < y);
}

// Sorted by prediction, each group of equal predictions adds: its positives times the
// negatives below it, plus half its positives times its own negatives.
double metrics_auc(const Metrics *m) {
  int64_t n = m->n;
  Scored *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
  if (!s) gemc_internal_error(__FILE__, __LINE__, "out of memory for AUC");
  for (int64_t i = 0; i < n; i++) {
    if (isnan(m->preds[i]) || isnan(m->labels[i])) {
      free(s);
      return NAN;
    }
    s[i] = (Scored){m->preds[i], m->labels[i]};
  }
  qsort(s, (size_t)n, sizeof *s, by_pred);
  double area = 0, neg_below = 0, pos_total = 0;
  for (int64_t i = 0; i < n;) {
    double pos = 0, neg = 0;
    int64_t j = i;
    for (; j < n && s[j].pred == s[i].pred; j++) {
      pos += s[j].label;
      neg += 1.0 - s[j].label;
    }
    area += pos * (neg_below + 0.5 * neg);
    neg_below += neg;
    pos_total += pos;
    i = j;
  }
  free(s);
  if (!(pos_total > 0 && neg_below > 0)) return NAN;
  return area / (pos_total * neg_below);
}
