// optim.c: AdamW and SGD for dense parameters; row-wise Adagrad (as FBGEMM defines it) and SGD
// for embedding tables, touching only the rows a batch used. Formulas are in optim.h and
// docs/numerics.md. Per-element arithmetic is in double, state and weights are stored as
// float, so a step is deterministic and independent of the order rows arrive in.
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal_error.h"
#include "numerics.h"

static float *zeroed_floats(int64_t n) {
  if (n <= 0) return NULL;
  float *p = calloc((size_t)n, sizeof *p);
  if (!p) gemc_internal_error(__FILE__, __LINE__, "out of memory for optimizer state");
  return p;
}

void optim_state_init(OptimState *s, Optim cfg, int64_t n, int64_t dim) {
  GEMC_ASSERT(n >= 0 && dim >= 0);
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  s->n = n;
  s->dim = dim;
  if (cfg.kind == OPTIM_ADAMW) {
    s->m = zeroed_floats(n);
    s->v = zeroed_floats(n);
  } else if (cfg.kind == OPTIM_ROWWISE_ADAGRAD) {
    s->rowsum = zeroed_floats(n);
  }
}

void optim_state_init_part(OptimState *s, Optim cfg, int64_t from, int64_t n) {
  GEMC_ASSERT(from >= 0 && n >= 0);
  optim_state_init(s, cfg, n, 0);
  s->base = from;
}

void optim_state_free(OptimState *s) {
  free(s->m);
  free(s->v);
  free(s->rowsum);
  s->m = s->v = s->rowsum = NULL;
}

// w -= lr (m̂ / (sqrt(v̂) + eps) + wd w), with the moments updated first.
// Elements [from, from + n) of w, their moments, with g[0, n).
static void adamw_step(OptimState *s, float *w, const float *g, int64_t from, int64_t n) {
  const Optim *c = &s->cfg;
  double bc1 = 1.0 - pow(c->beta1, (double)s->step);
  double bc2 = 1.0 - pow(c->beta2, (double)s->step);
  for (int64_t k = 0; k < n; k++) {
    int64_t i = from + k, j = i - s->base;  // j: the element's place in the held moments
    double m = c->beta1 * s->m[j] + (1.0 - c->beta1) * g[k];
    double v = c->beta2 * s->v[j] + (1.0 - c->beta2) * (double)g[k] * g[k];
    s->m[j] = (float)m;
    s->v[j] = (float)v;
    double mhat = (double)s->m[j] / bc1;
    double vhat = (double)s->v[j] / bc2;
    w[k] = (float)(w[k] - c->lr * (mhat / (sqrt(vhat) + c->eps) + c->weight_decay * w[k]));
  }
}

void optim_step_dense_part(OptimState *s, float *w, const float *g, int64_t from, int64_t n) {
  GEMC_ASSERT(from >= 0 && n >= 0);
  GEMC_ASSERT(n == 0 || (from >= s->base && from + n <= s->base + s->n));  // the state's part
  s->step++;
  switch (s->cfg.kind) {
    case OPTIM_ADAMW:
      adamw_step(s, w, g, from, n);
      return;
    case OPTIM_SGD:
      for (int64_t k = 0; k < n; k++) w[k] = (float)(w[k] - s->cfg.lr * g[k]);
      return;
    case OPTIM_NONE:  // a frozen parameter
      return;
    case OPTIM_ROWWISE_ADAGRAD:
      break;
  }
  gemc_internal_error(__FILE__, __LINE__,
                      "optim_step_dense: row-wise Adagrad on a dense parameter");
}

void optim_step_dense(OptimState *s, float *w, const float *g, int64_t n) {
  GEMC_ASSERT(n == s->n && s->base == 0);
  optim_step_dense_part(s, w, g, 0, n);
}

static void rowwise_adagrad_row(const Optim *c, float *state, float *w, const float *g, int64_t dim,
                                DType storage) {
  double sum_sq = 0;
  for (int64_t j = 0; j < dim; j++) sum_sq += (double)g[j] * g[j];
  *state = (float)(*state + sum_sq / (double)dim);
  double step = c->lr / (sqrt((double)*state) + c->eps);
  for (int64_t j = 0; j < dim; j++) w[j] = round_to_dtype((float)(w[j] - step * g[j]), storage);
}

void optim_step_rows(OptimState *s, float *w, const int64_t *ids, const float *grad,
                     int64_t nrows, DType storage) {
  GEMC_ASSERT(nrows >= 0 && s->dim > 0);
  s->step++;
  for (int64_t r = 0; r < nrows; r++) {
    // The caller merges duplicates (table_grad gives distinct ascending ids) and the data
    // reader checks ranges, so anything else is a bug upstream.
    GEMC_ASSERT(ids[r] >= 0 && ids[r] < s->n);
    GEMC_ASSERT(r == 0 || ids[r] > ids[r - 1]);
    float *row = w + ids[r] * s->dim;
    const float *g = grad + r * s->dim;
    switch (s->cfg.kind) {
      case OPTIM_ROWWISE_ADAGRAD:
        rowwise_adagrad_row(&s->cfg, &s->rowsum[ids[r]], row, g, s->dim, storage);
        break;
      case OPTIM_SGD:
        for (int64_t j = 0; j < s->dim; j++)
          row[j] = round_to_dtype((float)(row[j] - s->cfg.lr * g[j]), storage);
        break;
      case OPTIM_NONE:
        break;
      case OPTIM_ADAMW:
        gemc_internal_error(__FILE__, __LINE__, "optim_step_rows: AdamW on a table");
    }
  }
}
