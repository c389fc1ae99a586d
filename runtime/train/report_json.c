// report_json.c: writes the JSON report of a training run. Numbers are written with 17
// significant digits, so every double (the per-step losses) reads back bit-exactly; NaN and
// infinities, which JSON lacks, are written as null.
#include "report_json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "file_io.h"
#include "internal_error.h"

// --- the writer -------------------------------------------------------------------------

static void indent(JsonWriter *w) {
  fputc('\n', w->f);
  for (int i = 0; i < w->depth; i++) fputs("  ", w->f);
}

// Starts a value: a comma after the previous one, and a new line in arrays and objects.
static void before_value(JsonWriter *w) {
  if (w->after_key) {
    w->after_key = false;
    return;
  }
  if (w->depth > 0) {
    if (w->need_comma[w->depth]) fputc(',', w->f);
    indent(w);
  }
  w->need_comma[w->depth] = true;
}

static void open_scope(JsonWriter *w, char c) {
  before_value(w);
  fputc(c, w->f);
  GEMC_ASSERT(w->depth + 1 < (int)(sizeof w->need_comma / sizeof w->need_comma[0]));
  w->depth++;
  w->need_comma[w->depth] = false;
}

static void close_scope(JsonWriter *w, char c) {
  bool had_items = w->need_comma[w->depth];
  w->depth--;
  if (had_items) indent(w);
  fputc(c, w->f);
}

void json_begin_object(JsonWriter *w) { open_scope(w, '{'); }
void json_end_object(JsonWriter *w) { close_scope(w, '}'); }
void json_begin_array(JsonWriter *w) { open_scope(w, '['); }
void json_end_array(JsonWriter *w) { close_scope(w, ']'); }

static void write_escaped(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20) fprintf(f, "\\u%04x", *p);
      else fputc(*p, f);
    }
  }
  fputc('"', f);
}

void json_key(JsonWriter *w, const char *key) {
  before_value(w);
  write_escaped(w->f, key);
  fputs(": ", w->f);
  w->after_key = true;
}

void json_string(JsonWriter *w, const char *s) {
  before_value(w);
  if (s) write_escaped(w->f, s);
  else fputs("null", w->f);
}

void json_number(JsonWriter *w, double v) {
  before_value(w);
  if (isfinite(v)) fprintf(w->f, "%.17g", v);
  else fputs("null", w->f);
}

void json_int(JsonWriter *w, int64_t v) {
  before_value(w);
  fprintf(w->f, "%" PRId64, v);
}

void json_bool(JsonWriter *w, bool v) {
  before_value(w);
  fputs(v ? "true" : "false", w->f);
}

// --- the report -------------------------------------------------------------------------

static void key_number(JsonWriter *w, const char *key, double v) {
  json_key(w, key);
  json_number(w, v);
}
static void key_int(JsonWriter *w, const char *key, int64_t v) {
  json_key(w, key);
  json_int(w, v);
}
static void key_string(JsonWriter *w, const char *key, const char *s) {
  json_key(w, key);
  json_string(w, s);
}

static void write_task(JsonWriter *w, const char *name, const TaskMetrics *m, double teacher_ne) {
  json_begin_object(w);
  key_string(w, "name", name);
  key_number(w, "ne", m->ne);
  key_number(w, "auc", m->auc);
  key_number(w, "calibration", m->calibration);
  key_number(w, "logloss", m->logloss);
  key_int(w, "examples", m->examples);
  if (!isnan(teacher_ne)) key_number(w, "teacher_ne", teacher_ne);
  json_end_object(w);
}

// The step's speed: its time, the useful FLOP rate, Local MFU against the target's datasheet
// peak (the cuda backend; null on the cpu), and --profile's table when there was one.
static void write_speed(JsonWriter *w, const Trainer *t, const LoopResult *r) {
  int64_t timed = trainer_timed_steps(t);
  double secs = trainer_step_seconds(t), peak = trainer_peak_tflops(t);
  double tflops = secs > 0 ? trainer_flops(t) / secs / 1e12 : NAN;
  key_int(w, "timed_steps", r->timed_steps);
  key_number(w, "step_ms", timed > 0 ? 1e3 * secs / (double)timed : NAN);
  key_number(w, "useful_tflops", tflops);
  key_string(w, "device", trainer_device(t));
  key_number(w, "peak_tflops", trainer_device(t) ? peak : NAN);
  key_number(w, "local_mfu", trainer_device(t) && peak > 0 ? tflops / peak : NAN);
  Profile prof;
  json_key(w, "profile");
  if (!trainer_profile(t, &prof)) {
    json_string(w, NULL);
    return;
  }
  double step_ms = timed > 0 ? 1e3 * secs / (double)timed : NAN;
  json_begin_object(w);
  key_int(w, "steps", prof.steps);
  key_number(w, "kernel_ms", prof.kernel_ms);
  key_number(w, "step_ms", step_ms);
  key_number(w, "not_kernel_ms", step_ms - prof.kernel_ms);
  json_key(w, "kernels");
  json_begin_array(w);
  for (int k = 0; k < prof.nrows; k++) {
    const ProfileRow *row = &prof.rows[k];
    json_begin_object(w);
    key_string(w, "kernel", row->kernel);
    key_string(w, "op", row->op);
    key_string(w, "pass", row->optimizer ? "optimizer" : row->backward ? "backward" : "forward");
    key_number(w, "launches", row->launches);
    key_number(w, "ms", row->ms);
    key_number(w, "flops", row->flops);
    key_number(w, "bytes", row->bytes);
    key_string(w, "bound", row->tensor_core ? "tensor_core" : row->flops > 0 ? "fp32" : "bandwidth");
    key_number(w, "roofline_ms", row->roofline_ms);
    key_number(w, "of_roofline", row->ms > 0 ? row->roofline_ms / row->ms : NAN);
    json_end_object(w);
  }
  json_end_array(w);
  json_end_object(w);
  profile_free(&prof);
}

static void write_optim(JsonWriter *w, const Optim *o) {
  json_begin_object(w);
  key_string(w, "kind", optim_name(o->kind));
  key_number(w, "lr", o->lr);
  if (o->kind == OPTIM_ADAMW) {
    key_number(w, "beta1", o->beta1);
    key_number(w, "beta2", o->beta2);
    key_number(w, "eps", o->eps);
    key_number(w, "weight_decay", o->weight_decay);
  }
  json_end_object(w);
}

static void write_report(JsonWriter *w, const Trainer *t, const LoopResult *r,
                         const ReportRun *run) {
  int ntasks = trainer_ntasks(t);
  char key[32];
  snprintf(key, sizeof key, "%016" PRIx64, trainer_model_key(t));
  int64_t in_tables = 0, params = trainer_param_count(t, &in_tables);

  json_begin_object(w);
  key_string(w, "model", trainer_model_name(t));
  key_string(w, "source", run->source);
  key_string(w, "model_key", key);
  key_string(w, "backend", run->backend);
  key_string(w, "backend_reason", run->backend_reason);
  key_int(w, "seed", (int64_t)trainer_seed(t));
  key_int(w, "batch", trainer_batch(t));
  key_int(w, "steps", trainer_step_count(t));
  key_int(w, "steps_this_run", r->steps);
  json_key(w, "resumed_from_step");
  if (run->resumed_from >= 0) json_int(w, run->resumed_from);
  else json_string(w, NULL);
  key_string(w, "resume_dir", run->resume_dir);
  key_string(w, "save_dir", run->save_dir);
  key_int(w, "parameters", params);
  key_int(w, "table_parameters", in_tables);

  json_key(w, "data");
  json_begin_object(w);
  key_string(w, "kind", run->data ? "file" : "synthetic");
  if (run->data) {
    key_string(w, "path", run->data);
    key_int(w, "train_examples", trainer_train_examples(t));
  } else {
    key_string(w, "lengths", run->lengths);
  }
  key_int(w, "eval_examples", trainer_eval_examples(t));
  json_end_object(w);

  json_key(w, "dense_optimizer");
  write_optim(w, trainer_dense_optim(t));

  key_number(w, "examples_per_second", r->examples_per_second);
  key_number(w, "step_seconds", trainer_step_seconds(t));
  key_number(w, "wall_seconds", r->seconds);
  write_speed(w, t, r);

  json_key(w, "train");
  json_begin_object(w);
  key_number(w, "loss", r->train_loss);
  key_int(w, "steps", r->train_steps_measured);
  json_key(w, "tasks");
  json_begin_array(w);
  for (int k = 0; k < ntasks; k++) write_task(w, trainer_task_name(t, k), &r->train[k], NAN);
  json_end_array(w);
  json_end_object(w);

  json_key(w, "eval");
  json_begin_object(w);
  key_number(w, "loss", r->eval.loss);
  key_int(w, "examples", r->eval.examples);
  json_key(w, "tasks");
  json_begin_array(w);
  for (int k = 0; k < ntasks; k++)
    write_task(w, trainer_task_name(t, k), &r->eval.tasks[k],
               r->eval.teacher_ne ? r->eval.teacher_ne[k] : NAN);
  json_end_array(w);
  json_end_object(w);

  int ncurve = 0;
  const CurvePoint *curve = trainer_curve(t, &ncurve);
  json_key(w, "curve");
  json_begin_array(w);
  for (int i = 0; i < ncurve; i++) {
    json_begin_object(w);
    key_int(w, "step", curve[i].step);
    key_number(w, "train_loss", curve[i].train_loss);
    key_number(w, "train_ne", curve[i].train_ne);
    key_number(w, "eval_loss", curve[i].eval_loss);
    key_number(w, "eval_ne", curve[i].eval_ne);
    key_number(w, "eval_auc", curve[i].eval_auc);
    json_end_object(w);
  }
  json_end_array(w);

  // A distributed run (docs/distributed.md): null for a single process.
  json_key(w, "distributed");
  if (run->dist) {
    const DistSummary *d = run->dist;
    json_begin_object(w);
    key_int(w, "world", d->world);
    key_string(w, "backend", d->backend);
    key_string(w, "dense", d->dense_mode);
    key_int(w, "buckets", d->buckets);
    key_number(w, "step_ms", 1e3 * d->step_s);
    key_number(w, "compute_ms", 1e3 * d->compute_s);
    key_number(w, "exposed_comm_ms", 1e3 * d->exposed_comm_s);
    key_number(w, "local_mfu", d->local_mfu);
    key_number(w, "e2e_mfu", d->e2e_mfu);
    key_number(w, "scaling_ratio", d->scaling_ratio);
    key_number(w, "straggler_spread", d->straggler_spread);
    key_number(w, "allreduce_bus_gbps", d->allreduce_gbps);
    key_string(w, "dense_collective", d->dense_collective ? d->dense_collective : "all-reduce");
    key_number(w, "alltoall_gbps", d->alltoall_gbps);
    key_string(w, "tables", d->placement);
    key_number(w, "max_rss_mib", d->max_rss_mib);
    json_end_object(w);
  } else {
    json_string(w, NULL);
  }

  // The divergence guard: what stopped the run (null when nothing did), the steps that
  // --on-nan skip skipped, and the exploding-loss warning.
  const TrainFailure *f = trainer_failure(t);
  json_key(w, "failure");
  if (f->failed) {
    json_begin_object(w);
    key_int(w, "step", f->step);
    key_string(w, "tensor", f->tensor);
    key_string(w, "what", f->what);
    key_int(w, "nan", f->nan);
    key_int(w, "inf", f->inf);
    key_int(w, "values", f->values);
    key_int(w, "skipped_in_row", f->skipped_in_row);
    key_string(w, "message", run->error);
    json_end_object(w);
  } else if (run->error) {
    json_begin_object(w);
    key_int(w, "step", trainer_step_count(t));
    key_string(w, "tensor", NULL);
    key_string(w, "what", "error");
    key_string(w, "message", run->error);
    json_end_object(w);
  } else {
    json_string(w, NULL);
  }
  int64_t nskipped = 0;
  const int64_t *skipped = trainer_skipped_steps(t, &nskipped);
  json_key(w, "skipped_steps");
  json_begin_array(w);
  for (int64_t i = 0; i < nskipped; i++) json_int(w, skipped[i]);
  json_end_array(w);
  key_string(w, "loss_warning", r->warning[0] ? r->warning : NULL);

  // The per-step losses, several to a line.
  json_key(w, "loss");
  fputc('[', w->f);
  const double *losses = trainer_losses(t);
  int64_t n = trainer_step_count(t);
  for (int64_t i = 0; i < n; i++) {
    if (i % 4 == 0) {
      fputs(i ? ",\n" : "\n", w->f);
      fputs("    ", w->f);
    } else {
      fputs(", ", w->f);
    }
    if (isfinite(losses[i])) fprintf(w->f, "%.17g", losses[i]);
    else fputs("null", w->f);
  }
  fputs(n ? "\n  ]" : "]", w->f);
  w->need_comma[w->depth] = true;
  json_end_object(w);
  fputc('\n', w->f);
}

bool report_write_json(const char *path, const Trainer *t, const LoopResult *r,
                       const ReportRun *run, char *err, size_t err_size) {
  // The JSON is built in memory, then written atomically (a temp file beside PATH, fsync,
  // rename: compiler/base/file_io.h), so a failed write never leaves a partial report.
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (!f) return fail(err, err_size, "cannot write report %s: %s", path, strerror(errno));
  JsonWriter w = {.f = f};
  write_report(&w, t, r, run);
  bool ok = !ferror(f);
  if (fclose(f) != 0) ok = false;
  if (!ok) {
    free(text);
    return fail(err, err_size, "cannot write report %s: %s", path, strerror(errno));
  }
  char reason[512];
  ok = file_write_atomic(path, text, n, reason, sizeof reason);
  free(text);
  if (!ok) return fail(err, err_size, "cannot write report %s: %s", path, reason);
  return true;
}
