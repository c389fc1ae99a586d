// train_loop.c: runs a Trainer for some steps with everything around the steps: periodic
// evaluation (a row of the learning curve each time), periodic checkpoints, the progress line,
// and the final numbers of the run. Evaluation and checkpoint steps count from the start of
// training, not of this run, so a resumed run evaluates at the same steps as a straight one.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "internal_error.h"
#include "progress.h"
#include "train.h"

static double wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mean_over_tasks(const TaskMetrics *m, int n, bool auc) {
  double sum = 0;
  for (int k = 0; k < n; k++) sum += auc ? m[k].auc : m[k].ne;
  return sum / n;
}

static double window_ne(const Trainer *t) {
  double sum = 0;
  int n = trainer_ntasks(t);
  for (int k = 0; k < n; k++) sum += metrics_ne(trainer_train_metrics(t, true, k));
  return sum / n;
}

// One number of a curve row, right-aligned in `width`; "-" when there is none (NaN).
static void cell(char *buf, int width, int precision, double v) {
  if (isnan(v)) snprintf(buf, 32, "%*s", width, "-");
  else snprintf(buf, 32, "%*.*f", width, precision, v);
}

static void print_header(Progress *p) {
  progress_line(p, "%7s  %10s  %8s  %10s  %8s  %8s  %9s", "step", "train loss", "train NE",
                "eval loss", "eval NE", "eval AUC", "ex/s");
}

// Evaluates, prints a row of the learning curve and records it.
static bool curve_point(Trainer *t, Progress *p, int64_t step, double window_loss,
                        double window_seconds, int64_t window_steps, EvalResult *ev, char *err,
                        size_t err_size) {
  CurvePoint c = {.step = step};
  c.train_loss = window_steps > 0 ? window_loss / (double)window_steps : NAN;
  c.train_ne = window_steps > 0 ? window_ne(t) : NAN;
  if (!trainer_eval(t, ev, err, err_size)) return false;
  c.eval_loss = ev->loss;
  c.eval_ne = mean_over_tasks(ev->tasks, ev->ntasks, false);
  c.eval_auc = mean_over_tasks(ev->tasks, ev->ntasks, true);
  double rate = window_seconds > 0
                    ? (double)(window_steps * trainer_batch(t)) / window_seconds : NAN;
  char cells[6][32];
  cell(cells[0], 10, 4, c.train_loss);
  cell(cells[1], 8, 4, c.train_ne);
  cell(cells[2], 10, 4, c.eval_loss);
  cell(cells[3], 8, 4, c.eval_ne);
  cell(cells[4], 8, 4, c.eval_auc);
  cell(cells[5], 9, 0, rate);
  progress_line(p, "%7" PRId64 "  %s  %s  %s  %s  %s  %s", step, cells[0], cells[1], cells[2],
                cells[3], cells[4], cells[5]);
  trainer_add_curve_point(t, &c);
  trainer_reset_train_metrics(t, true);
  return true;
}

bool train_loop(Trainer *t, const LoopOptions *o, LoopResult *r, char *err, size_t err_size) {
  memset(r, 0, sizeof *r);
  double start = wall_seconds();
  int ntasks = trainer_ntasks(t);
  int64_t first = trainer_step_count(t), last = first + o->steps;
  int64_t tail = o->steps >= 10 ? (o->steps + 9) / 10 : o->steps;
  int64_t tail_start = last - tail;
  double seconds_before = trainer_step_seconds(t);
  Progress p;
  progress_begin(&p, o->out, o->err, o->quiet, o->live, first, o->steps);
  print_header(&p);
  trainer_reset_train_metrics(t, true);
  trainer_reset_train_metrics(t, false);

  double window_loss = 0, window_start = trainer_step_seconds(t), tail_loss = 0;
  int64_t window_steps = 0;
  bool ok = true, evaluated = false;
  for (int64_t s = first; ok && s < last; s++) {
    if (s == tail_start) trainer_reset_train_metrics(t, false);
    double loss;
    if (!(ok = trainer_step(t, &loss, err, err_size))) break;
    int64_t done = s + 1;
    window_loss += loss;
    window_steps++;
    if (s >= tail_start) tail_loss += loss;

    bool eval_now = done == last || (o->eval_every > 0 && done % o->eval_every == 0);
    double progress_loss = window_loss / (double)window_steps, progress_ne = window_ne(t);
    if (eval_now) {
      ok = curve_point(t, &p, done, window_loss, trainer_step_seconds(t) - window_start,
                       window_steps, &r->eval, err, err_size);
      evaluated = true;
      window_loss = 0;
      window_steps = 0;
      window_start = trainer_step_seconds(t);
    }
    bool save_now = o->save_dir && (done == last || (o->save_every > 0 && done % o->save_every == 0));
    if (ok && save_now) ok = trainer_save(t, o->save_dir, err, err_size);
    double run_seconds = trainer_step_seconds(t) - seconds_before;
    double rate = run_seconds > 0
                      ? (double)((done - first) * trainer_batch(t)) / run_seconds : NAN;
    if (ok) progress_step(&p, done, progress_loss, progress_ne, rate, eval_now);
  }
  // With no steps to take, the run is an evaluation of the model as it is.
  if (ok && !evaluated) ok = curve_point(t, &p, last, 0, 0, 0, &r->eval, err, err_size);
  if (ok && o->steps == 0 && o->save_dir) ok = trainer_save(t, o->save_dir, err, err_size);
  progress_end(&p);
  if (!ok) return false;

  r->steps = o->steps;
  r->seconds = wall_seconds() - start;
  double run_seconds = trainer_step_seconds(t) - seconds_before;
  r->examples_per_second =
      run_seconds > 0 ? (double)(o->steps * trainer_batch(t)) / run_seconds : NAN;
  r->train_steps_measured = tail;
  r->train_loss = tail > 0 ? tail_loss / (double)tail : NAN;
  r->train = xcalloc((size_t)ntasks, sizeof *r->train);
  for (int k = 0; k < ntasks; k++) task_metrics_from(trainer_train_metrics(t, false, k), &r->train[k]);
  return true;
}

void loop_result_free(LoopResult *r) {
  free(r->train);
  r->train = NULL;
}
