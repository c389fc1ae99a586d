// train_loop.c: runs a Trainer for some steps with everything around the steps: periodic
// evaluation (a row of the learning curve each time), periodic checkpoints, the progress line,
// and the final numbers of the run. Evaluation and checkpoint steps count from the start of
// training, not of this run, so a resumed run evaluates at the same steps as a straight one.
// The divergence guard's checks of the state run before every evaluation and save.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "clock.h"
#include "internal_error.h"
#include "progress.h"
#include "train.h"

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

// Evaluates, prints a row of the learning curve and records it (unless !record). The mean
// training loss is over the `window_n` steps of the window that were not skipped.
static bool curve_point(Trainer *t, Progress *p, int64_t step, double window_loss,
                        int64_t window_n, double window_seconds, int64_t window_steps,
                        bool record, EvalResult *ev, char *err, size_t err_size) {
  CurvePoint c = {.step = step};
  c.train_loss = window_n > 0 ? window_loss / (double)window_n : NAN;
  c.train_ne = window_n > 0 ? window_ne(t) : NAN;
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
  if (record) trainer_add_curve_point(t, &c);
  trainer_reset_train_metrics(t, true);
  return true;
}

// The exploding-loss warning: a finite loss over EXPLODE_FACTOR times the reference, which is
// the first evaluation's loss (a resumed run's curve included) or, before there is one, the
// lowest loss of this run's first EXPLODE_WINDOW steps (a mean would already hold the blow-up
// of a run that diverges at once). Warned once a run.
enum { EXPLODE_FACTOR = 100, EXPLODE_WINDOW = 10, SKIP_NOTES = 10, PROFILE_WARMUP = 10 };

typedef struct Explode {
  double ref;
  const char *ref_what;
  double first_min;
  int first_n;
  bool warned;
} Explode;

static void explode_init(Explode *e, const Trainer *t) {
  memset(e, 0, sizeof *e);
  e->ref = NAN;
  int n = 0;
  const CurvePoint *c = trainer_curve(t, &n);
  for (int i = 0; i < n && isnan(e->ref); i++)
    if (isfinite(c[i].eval_loss) && c[i].eval_loss > 0) {
      e->ref = c[i].eval_loss;
      e->ref_what = "the first evaluation's";
    }
}

static void explode_check(Explode *e, Progress *p, LoopResult *r, const Trainer *t,
                          int64_t step, double loss, bool eval) {
  if (e->warned || !isfinite(loss)) return;
  if (isnan(e->ref)) {
    if (eval && loss > 0) {
      e->ref = loss;
      e->ref_what = "the first evaluation's";
    } else if (!eval) {
      if (e->first_n++ == 0 || loss < e->first_min) e->first_min = loss;
      if (e->first_n == EXPLODE_WINDOW && e->first_min > 0) {
        e->ref = e->first_min;
        e->ref_what = "the lowest of the first 10 steps' losses,";
      }
    }
    return;
  }
  if (loss <= EXPLODE_FACTOR * e->ref) return;
  e->warned = true;
  snprintf(r->warning, sizeof r->warning, "the %s loss is %.4g at step %" PRId64 ", over %d "
           "times %s %.4g: training is diverging; try a lower --lr (this run's is %g)",
           eval ? "held-out" : "training", loss, step, EXPLODE_FACTOR, e->ref_what, e->ref,
           trainer_dense_optim(t)->lr);
  progress_note(p, "gemc: warning: %s", r->warning);
}

static bool has_curve_point(const Trainer *t, int64_t step) {
  int n = 0;
  const CurvePoint *c = trainer_curve(t, &n);
  return n > 0 && c[n - 1].step == step;
}

bool train_loop(Trainer *t, const LoopOptions *o, LoopResult *r, char *err, size_t err_size) {
  memset(r, 0, sizeof *r);
  double start = monotonic_seconds();
  int ntasks = trainer_ntasks(t);
  int64_t first = trainer_step_count(t), last = first + o->steps;
  int64_t tail = o->steps >= 10 ? (o->steps + 9) / 10 : o->steps;
  int64_t tail_start = last - tail;
  double seconds_before = trainer_step_seconds(t);
  int64_t timed_before = trainer_timed_steps(t);
  if (o->profile_steps > 0) {
    // After a warm-up (the first steps pay for cuBLASLt's heuristics and cold caches), as
    // far into the run as it allows.
    int64_t count = o->profile_steps < o->steps ? o->profile_steps : o->steps;
    int64_t warm = o->steps - count < PROFILE_WARMUP ? o->steps - count : PROFILE_WARMUP;
    trainer_profile_range(t, first + warm, count);
  }
  Progress p;
  progress_begin(&p, o->out, o->err, o->quiet, o->live, first, o->steps);
  print_header(&p);
  trainer_reset_train_metrics(t, true);
  trainer_reset_train_metrics(t, false);
  Explode ex;
  explode_init(&ex, t);

  // window_n, tail_n: the steps of the window and of the tail that were not skipped.
  double window_loss = 0, window_start = trainer_step_seconds(t), tail_loss = 0;
  int64_t window_timed = trainer_timed_steps(t);  // profiled steps have no time: not counted
  int64_t window_steps = 0, window_n = 0, tail_n = 0, taken = 0, skips = 0;
  bool ok = true, evaluated = false;
  for (int64_t s = first; ok && s < last; s++) {
    if (s == tail_start) trainer_reset_train_metrics(t, false);
    double loss;
    if (!(ok = trainer_step(t, &loss, err, err_size))) break;
    int64_t done = s + 1;
    taken++;
    window_steps++;
    if (trainer_step_skipped(t)) {
      if (skips++ < SKIP_NOTES)
        progress_note(&p, "gemc: warning: step %" PRId64 " skipped: its loss or a gradient is "
                      "not finite (--on-nan skip)%s", done,
                      skips == SKIP_NOTES ? "; further skips are not shown" : "");
    } else {
      window_loss += loss;
      window_n++;
      if (s >= tail_start) tail_loss += loss, tail_n++;
      explode_check(&ex, &p, r, t, done, loss, false);
    }

    bool eval_now = done == last || (o->eval_every > 0 && done % o->eval_every == 0);
    double progress_loss = window_n > 0 ? window_loss / (double)window_n : NAN;
    double progress_ne = window_ne(t);
    if (eval_now) {
      ok = trainer_check_finite(t, err, err_size) &&
           curve_point(t, &p, done, window_loss, window_n,
                       trainer_step_seconds(t) - window_start,
                       trainer_timed_steps(t) - window_timed, true, &r->eval,
                       err, err_size);
      if (ok) explode_check(&ex, &p, r, t, done, r->eval.loss, true);
      evaluated = evaluated || ok;
      window_loss = 0;
      window_steps = window_n = 0;
      window_start = trainer_step_seconds(t);
      window_timed = trainer_timed_steps(t);
    }
    bool save_now = o->save_dir && (done == last || (o->save_every > 0 && done % o->save_every == 0));
    if (ok && save_now) ok = trainer_save(t, o->save_dir, err, err_size);
    double run_seconds = trainer_step_seconds(t) - seconds_before;
    double rate = run_seconds > 0
                      ? (double)((trainer_timed_steps(t) - timed_before) * trainer_batch(t)) /
                            run_seconds
                      : NAN;
    if (ok) progress_step(&p, done, progress_loss, progress_ne, rate, eval_now);
  }
  // With no steps to take, the run is an evaluation of the model as it is; the curve gets a
  // row only where it has none (a resumed run's last row is at this very step).
  if (ok && o->steps == 0) {
    ok = trainer_check_finite(t, err, err_size) &&
         curve_point(t, &p, last, 0, 0, 0, 0, !has_curve_point(t, last), &r->eval, err,
                     err_size);
    evaluated = ok;
    if (ok && o->save_dir) ok = trainer_save(t, o->save_dir, err, err_size);
  }
  progress_end(&p);

  // The result, also when the run stopped early (the report still describes it).
  r->steps = ok ? o->steps : taken;
  r->seconds = monotonic_seconds() - start;
  double run_seconds = trainer_step_seconds(t) - seconds_before;
  int64_t timed = trainer_timed_steps(t) - timed_before;
  r->timed_steps = timed;
  r->examples_per_second =
      run_seconds > 0 ? (double)(timed * trainer_batch(t)) / run_seconds : NAN;
  r->train_steps_measured = tail_n;
  r->train_loss = tail_n > 0 ? tail_loss / (double)tail_n : NAN;
  r->train = xcalloc((size_t)ntasks, sizeof *r->train);
  for (int k = 0; k < ntasks; k++) task_metrics_from(trainer_train_metrics(t, false, k), &r->train[k]);
  if (!evaluated) {
    r->no_eval = xcalloc((size_t)ntasks, sizeof *r->no_eval);
    for (int k = 0; k < ntasks; k++)
      r->no_eval[k] = (TaskMetrics){NAN, NAN, NAN, NAN, 0};
    r->eval = (EvalResult){.loss = NAN, .ntasks = ntasks, .tasks = r->no_eval};
  }
  return ok;
}

void loop_result_free(LoopResult *r) {
  free(r->train);
  free(r->no_eval);
  r->train = NULL;
  r->no_eval = NULL;
}
