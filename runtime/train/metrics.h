// metrics.h: evaluation metrics for binary tasks, as TorchRec defines them.
//   NE (normalized entropy) = mean log loss / entropy of the mean label (base rate p):
//       -(1/N) Σ [y log q + (1-y) log(1-q)]  /  -[p log p + (1-p) log(1-p)]
//   AUC: the probability that a random positive scores above a random negative (ties 1/2).
//   Calibration: Σ q / Σ y.
// defines: Metrics, metrics_add, metrics_ne, metrics_auc, metrics_calibration
#ifndef GEMC_METRICS_H
#define GEMC_METRICS_H

#include <stdint.h>

typedef struct Metrics {
  double sum_logloss, sum_pred, sum_label;
  int64_t n;
  float *preds, *labels;  // kept for AUC
  int64_t cap;
} Metrics;

// metrics_reset makes *m empty without freeing (use it to initialize); metrics_free frees the
// kept predictions and leaves *m empty and reusable. Labels may be soft (in [0, 1]).
void metrics_reset(Metrics *m);
void metrics_free(Metrics *m);
// Adds n predictions (probabilities in [0,1], clamped to [1e-7, 1-1e-7] for the log) and labels.
void metrics_add(Metrics *m, const float *pred, const float *label, int64_t n);
double metrics_ne(const Metrics *m);           // NaN when all labels are equal
double metrics_auc(const Metrics *m);          // NaN when one class is absent; O(n log n)
double metrics_calibration(const Metrics *m);  // NaN when there is no positive
double metrics_logloss(const Metrics *m);

#endif
