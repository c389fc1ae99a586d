// optim.h: the optimizers, on fp32 masters.
//   AdamW (dense):  m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²; w -= lr (m̂/(sqrt(v̂)+eps) + wd w)
//                   with bias correction m̂ = m/(1-b1^t), v̂ = v/(1-b2^t); t counts from 1.
//   SGD:            w -= lr g
//   Row-wise Adagrad (tables, as FBGEMM defines it): one fp32 state per row;
//                   for each distinct row touched: s += mean(g²); w -= lr g / (sqrt(s) + eps).
//                   Rows the batch did not touch are not changed.
// defines: OptimState, optim_state_init, optim_step_dense,
//          optim_step_dense_part, optim_step_rows
#ifndef GEMC_OPTIM_H
#define GEMC_OPTIM_H

#include <stdint.h>

#include "ir.h"

typedef struct OptimState {
  Optim cfg;
  int64_t step;   // steps taken (AdamW bias correction)
  int64_t n;      // elements (dense) or rows (tables) held
  int64_t base;   // dense: the first element held (a ZeRO part: [base, base + n)), else 0
  int64_t dim;    // tables: row width
  float *m, *v;   // AdamW moments, n each: elements base .. base + n - 1
  float *rowsum;  // row-wise Adagrad, one per row
} OptimState;

void optim_state_init(OptimState *s, Optim cfg, int64_t n, int64_t dim);
// The state of elements [from, from + n) of a dense parameter only (a ZeRO rank's part).
void optim_state_init_part(OptimState *s, Optim cfg, int64_t from, int64_t n);
void optim_state_free(OptimState *s);
// One step on a dense parameter w[n] with gradient g[n].
void optim_step_dense(OptimState *s, float *w, const float *g, int64_t n);
// One step on elements [from, from + n) of a dense parameter, held in w[n] (w points at
// element `from`; the state holds at least those elements; g holds their n gradients): the
// update of one ZeRO shard. The step count advances as for a whole step, also when n is 0.
void optim_step_dense_part(OptimState *s, float *w, const float *g, int64_t from, int64_t n);
// One step on a table w[rows, dim] from a rows-gradient: nrows distinct ascending ids, grad
// nrows x dim. Rows outside the table are an internal error (the data reader checks ids).
void optim_step_rows(OptimState *s, float *w, const int64_t *ids, const float *grad,
                     int64_t nrows, DType storage);

#endif
