// train.c: one model being trained on the CPU executor. Each step takes the next batch of the
// training stream, runs forward and backward, and applies every parameter's optimizer (AdamW
// or SGD on dense parameters, row-wise Adagrad or SGD on the rows of a table that the batch
// touched). The held-out split never meets training: synthetic data evaluates on examples far
// past any the training stream reaches; a data file keeps its last tenth. Checkpoints hold the
// whole state, so a resumed run continues bit-exactly. docs/train.md has the details.
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "checked.h"
#include "checkpoint.h"
#include "cpu_exec.h"
#include "datafile.h"
#include "flops.h"
#include "hash.h"
#include "internal_error.h"
#include "optim.h"
#include "train_gpu.h"

// The synthetic held-out examples start here; the training stream would need 2^50 examples
// to get there.
static const int64_t SYNTH_EVAL_FIRST = (int64_t)1 << 50;
enum { DEFAULT_EVAL_EXAMPLES = 4096 };

// A parameter or table and its optimizer.
typedef struct Trained {
  int tensor;
  bool table;
  int64_t numel;       // elements
  int64_t rows, dim;   // tables
  OptimState st;
} Trained;

struct Trainer {
  Ir *ir;
  TrainOptions opt;
  uint64_t key;
  Schema schema;
  int64_t B;
  CpuExec *x;
  Trained *trained;
  int ntrained;
  Optim dense_optim;  // the model's, after overrides (for messages and the report)

  // Data. Synthetic: `synth`. A file: `reader`, the training split [0, train_span) and the
  // held-out split [eval_first, eval_first + eval_count).
  Synth *synth;
  DataReader *reader;
  int64_t train_span, eval_first, eval_count;
  Batch batch, spare;  // `spare`: the second half of a batch that wraps around the split

  int ntasks;
  int *label_feature;  // [ntasks]: the schema index of each task's label

  // The state a checkpoint keeps.
  int64_t step;    // steps taken
  int64_t cursor;  // training examples consumed
  double *losses;  // [step]
  int64_t cap_losses;
  CurvePoint *curve;
  int ncurve, cap_curve;

  // Reporting only.
  Metrics *window, *tail;  // [ntasks] training predictions
  TaskMetrics *eval_tasks;
  double *teacher_ne;
  double step_seconds;
  double flops;          // useful FLOPs of this run's steps

  // The cuda backend: the session, whether the next training batch is already uploaded
  // (prefetched while the previous step ran), and each task's labels of the step in flight.
  GpuSession *gpu;
  Ir gpu_ir;              // the IR the GPU plan is built from: ir with the optimizer overrides
  Tensor *gpu_tensors;    // gpu_ir's tensors (owned), when overrides are given
  bool gpu_prefetched;
  float **gpu_labels;    // [ntasks][B]
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void optim_overrides_none(OptimOverrides *o) {
  o->lr = o->beta1 = o->beta2 = o->eps = o->weight_decay = NAN;
  o->table_lr = o->table_eps = NAN;
}

void train_options_default(TrainOptions *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1;
  SynthConfig sc;
  synth_config_default(&sc);
  o->lengths = sc.lengths;
  o->id_vocab = sc.id_vocab;
  o->eval_examples = DEFAULT_EVAL_EXAMPLES;
  optim_overrides_none(&o->optim);
}

void task_metrics_from(const Metrics *m, TaskMetrics *out) {
  out->ne = metrics_ne(m);
  out->auc = metrics_auc(m);
  out->calibration = metrics_calibration(m);
  out->logloss = metrics_logloss(m);
  out->examples = m->n;
}

// --- the model key ----------------------------------------------------------------------

uint64_t train_model_key(const Ir *ir) {
  Ir copy = *ir;
  copy.source = "";  // the same model read through another path is the same model
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  if (!f) gemc_internal_error(__FILE__, __LINE__, "open_memstream failed");
  ir_print(f, &copy);
  fclose(f);
  uint64_t key = fnv1a64(FNV1A64_INIT, text, size);
  free(text);
  return key;
}

// --- setting up -------------------------------------------------------------------------

static void apply(double *field, double value) {
  if (!isnan(value)) *field = value;
}

static Optim dense_override(Optim o, const OptimOverrides *v) {
  apply(&o.lr, v->lr);
  apply(&o.beta1, v->beta1);
  apply(&o.beta2, v->beta2);
  apply(&o.eps, v->eps);
  apply(&o.weight_decay, v->weight_decay);
  return o;
}

static Optim table_override(Optim o, const OptimOverrides *v) {
  apply(&o.lr, v->table_lr);
  apply(&o.eps, v->table_eps);
  return o;
}

static void setup_optimizers(Trainer *t) {
  const Ir *ir = t->ir;
  t->trained = xcalloc((size_t)ir->ntensors, sizeof *t->trained);
  for (int i = 0; i < ir->ntensors; i++) {
    const Tensor *x = &ir->tensors[i];
    if (x->kind != TENSOR_PARAM && x->kind != TENSOR_TABLE) continue;
    Trained *p = &t->trained[t->ntrained++];
    p->tensor = i;
    p->table = x->kind == TENSOR_TABLE;
    p->numel = x->fixed[0] * (x->nfixed > 1 ? x->fixed[1] : 1);
    if (p->table) {
      p->rows = x->fixed[0];
      p->dim = x->nfixed > 1 ? x->fixed[1] : 1;
      optim_state_init(&p->st, table_override(x->optim, &t->opt.optim), p->rows, p->dim);
    } else {
      optim_state_init(&p->st, dense_override(x->optim, &t->opt.optim), p->numel, 0);
    }
  }
  t->dense_optim = dense_override(ir->dense_optim, &t->opt.optim);
}

static bool has_overrides(const OptimOverrides *v) {
  return !isnan(v->lr) || !isnan(v->beta1) || !isnan(v->beta2) || !isnan(v->eps) ||
         !isnan(v->weight_decay) || !isnan(v->table_lr) || !isnan(v->table_eps);
}

// The GPU compiles each optimizer's hyper-parameters into its kernel, so the plan is built
// from a copy of the IR whose tensors carry the overridden optimizers. An artifact was
// compiled with the model's own values, so overrides and --artifact do not go together.
static const Ir *gpu_plan_ir(Trainer *t, char *err, size_t err_size) {
  const Ir *ir = t->ir;
  if (!has_overrides(&t->opt.optim)) return ir;
  if (t->opt.artifact) {
    fail(err, err_size, "optimizer overrides (--lr, --table-lr, ...) cannot change an artifact's "
         "kernels, which have the model's values compiled in: train without --artifact (the "
         "kernels are then compiled with the overrides), or edit the model and rebuild");
    return NULL;
  }
  t->gpu_ir = *ir;
  t->gpu_tensors = xcalloc((size_t)ir->ntensors + 1, sizeof *t->gpu_tensors);
  memcpy(t->gpu_tensors, ir->tensors, (size_t)ir->ntensors * sizeof *t->gpu_tensors);
  for (int i = 0; i < ir->ntensors; i++) {
    Tensor *x = &t->gpu_tensors[i];
    if (x->kind == TENSOR_TABLE) x->optim = table_override(x->optim, &t->opt.optim);
    else if (x->kind == TENSOR_PARAM) x->optim = dense_override(x->optim, &t->opt.optim);
  }
  t->gpu_ir.tensors = t->gpu_tensors;
  t->gpu_ir.dense_optim = dense_override(ir->dense_optim, &t->opt.optim);
  return &t->gpu_ir;
}

static bool setup_tasks(Trainer *t, char *err, size_t err_size) {
  t->ntasks = cpu_exec_ntasks(t->x);
  if (t->ntasks <= 0) return fail(err, err_size, "model %s has no bce task to train", t->ir->model);
  t->label_feature = xcalloc((size_t)t->ntasks, sizeof *t->label_feature);
  for (int k = 0; k < t->ntasks; k++) {
    int label = cpu_exec_task_label(t->x, k);
    t->label_feature[k] = -1;
    for (int f = 0; f < t->schema.nfeatures; f++)
      if (t->schema.features[f].tensor == label) t->label_feature[k] = f;
    GEMC_ASSERT(t->label_feature[k] >= 0);
  }
  t->window = xcalloc((size_t)t->ntasks, sizeof *t->window);
  t->tail = xcalloc((size_t)t->ntasks, sizeof *t->tail);
  t->eval_tasks = xcalloc((size_t)t->ntasks, sizeof *t->eval_tasks);
  t->teacher_ne = xcalloc((size_t)t->ntasks, sizeof *t->teacher_ne);
  return true;
}

static Synth *make_synth(const Trainer *t) {
  SynthConfig sc;
  synth_config_default(&sc);
  sc.seed = t->opt.seed;
  sc.lengths = t->opt.lengths;
  sc.id_vocab = t->opt.id_vocab;
  return synth_new(&t->schema, &sc);
}

// Splits a data file: the last tenth (whole batches, at least one) is held out.
static bool setup_data_file(Trainer *t, char *err, size_t err_size) {
  t->reader = datafile_open(t->opt.data_path, &t->schema, err, err_size);
  if (!t->reader) return false;
  int64_t n = datafile_examples(t->reader);
  int64_t eval_batches = n / 10 / t->B;
  if (eval_batches < 1) eval_batches = 1;
  t->eval_count = eval_batches * t->B;
  t->eval_first = n - t->eval_count;
  t->train_span = t->eval_first;
  if (t->train_span < t->B)
    return fail(err, err_size, "data file %s has %" PRId64 " examples; with batch %" PRId64
                " it needs at least %" PRId64 " (a batch to train on and one held out)",
                t->opt.data_path, n, t->B, 2 * t->B);
  return true;
}

Trainer *trainer_new(Ir *ir, const TrainOptions *o, char *err, size_t err_size) {
  GEMC_ASSERT(ir->loss >= 0);
  Trainer *t = xcalloc(1, sizeof *t);
  t->ir = ir;
  t->opt = *o;
  t->key = train_model_key(ir);
  t->B = o->batch > 0 ? o->batch : ir->batch;
  ir->batch = t->B;
  schema_from_ir(ir, &t->schema);

  t->x = cpu_exec_new(ir, EXEC_F32);
  cpu_exec_init_params(t->x, o->seed);
  setup_optimizers(t);
  batch_alloc(&t->batch, &t->schema, t->B);
  bool ok = setup_tasks(t, err, err_size);
  if (ok && o->data_path) {
    ok = setup_data_file(t, err, err_size);
  } else if (ok) {
    t->synth = make_synth(t);
    t->eval_count = (o->eval_examples + t->B - 1) / t->B * t->B;
    if (t->eval_count < t->B) t->eval_count = t->B;
    t->eval_first = SYNTH_EVAL_FIRST;
  }
  if (ok && o->cuda) {
    GpuSessionOptions go = {.artifact = o->artifact, .model_key = t->key, .max_batch = t->B,
                            .graphs = true, .log = o->gpu_log};
    const Ir *plan_ir = gpu_plan_ir(t, err, err_size);
    t->gpu = plan_ir ? gpu_session_open(plan_ir, t->x, &go, err, err_size) : NULL;
    ok = t->gpu != NULL;
    t->gpu_labels = xcalloc((size_t)t->ntasks, sizeof *t->gpu_labels);
    for (int k = 0; ok && k < t->ntasks; k++)
      t->gpu_labels[k] = xcalloc((size_t)t->B, sizeof(float));
  }
  if (!ok) {
    trainer_free(t);
    return NULL;
  }
  return t;
}

void trainer_free(Trainer *t) {
  if (!t) return;
  for (int i = 0; i < t->ntrained; i++) optim_state_free(&t->trained[i].st);
  free(t->trained);
  for (int k = 0; k < t->ntasks; k++) {
    metrics_free(&t->window[k]);
    metrics_free(&t->tail[k]);
  }
  free(t->window);
  free(t->tail);
  free(t->eval_tasks);
  free(t->teacher_ne);
  free(t->label_feature);
  free(t->losses);
  free(t->curve);
  batch_free(&t->batch);
  if (t->spare.B) batch_free(&t->spare);
  if (t->synth) synth_free(t->synth);
  if (t->reader) datafile_close_reader(t->reader);
  if (t->x) cpu_exec_free(t->x);
  gpu_session_close(t->gpu);
  free(t->gpu_tensors);  // after the session: its plan points into gpu_ir
  for (int k = 0; t->gpu_labels && k < t->ntasks; k++) free(t->gpu_labels[k]);
  free(t->gpu_labels);
  free(t);
}

// --- data -------------------------------------------------------------------------------

// Fills t->batch with training examples [cursor, cursor + B) of the stream. A data file's
// training split repeats: examples past its end wrap around to its start.
static bool next_training_batch(Trainer *t, char *err, size_t err_size) {
  if (t->synth) {
    synth_batch(t->synth, t->cursor, &t->batch);
    return true;
  }
  int64_t first = t->cursor % t->train_span;
  if (first + t->B <= t->train_span)
    return datafile_read(t->reader, first, &t->batch, err, err_size);
  // The batch wraps: the split's last examples, then its first ones.
  if (!t->spare.B) batch_alloc(&t->spare, &t->schema, t->B);
  int64_t head = t->train_span - first;
  if (!datafile_read(t->reader, first, &t->spare, err, err_size)) return false;
  batch_copy(&t->schema, &t->batch, 0, &t->spare, 0, head);
  if (!datafile_read(t->reader, 0, &t->spare, err, err_size)) return false;
  batch_copy(&t->schema, &t->batch, head, &t->spare, 0, t->B - head);
  return true;
}

static bool bind_batch(Trainer *t, char *err, size_t err_size) {
  char reason[512];
  if (cpu_exec_set_batch(t->x, &t->batch, reason, sizeof reason)) return true;
  return fail(err, err_size, "the batch does not fit model %s: %s", t->ir->model, reason);
}

static const float *task_labels(const Trainer *t, int task) {
  return t->batch.values[t->label_feature[task]];
}

// --- one step ---------------------------------------------------------------------------

static void push_loss(Trainer *t, double loss) {
  if (t->step >= t->cap_losses) {
    t->cap_losses = t->cap_losses ? 2 * t->cap_losses : 256;
    double *p = xrealloc(t->losses, (size_t)t->cap_losses * sizeof *p);
    t->losses = p;
  }
  t->losses[t->step] = loss;
}

static void apply_optimizers(Trainer *t) {
  for (int i = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    int64_t nrows = 0;
    const int64_t *row_ids = NULL;
    const float *g = cpu_exec_grad(t->x, p->tensor, &nrows, &row_ids);
    if (!g) continue;  // nothing reaches the loss through it
    float *w = cpu_exec_data(t->x, p->tensor);
    if (p->table)
      optim_step_rows(&p->st, w, row_ids, g, nrows, t->ir->tensors[p->tensor].dtype);
    else
      optim_step_dense(&p->st, w, g, p->numel);
  }
}

// One step on the GPU. The batch of this step was usually uploaded during the previous step;
// while this one runs, the next batch is made and uploaded (the copy stream overlaps it with
// compute), then the loss and the probabilities are read back.
static bool gpu_step(Trainer *t, double *loss, char *err, size_t err_size) {
  if (!t->gpu_prefetched &&
      (!next_training_batch(t, err, err_size) ||
       !gpu_session_set_batch(t->gpu, &t->batch, err, err_size)))
    return false;
  t->flops += step_flops(t->ir, &t->batch, true);
  for (int k = 0; k < t->ntasks; k++)
    memcpy(t->gpu_labels[k], task_labels(t, k), (size_t)t->B * sizeof(float));
  if (!gpu_session_launch(t->gpu, true, t->step + 1, err, err_size)) return false;
  t->cursor += t->B;
  t->gpu_prefetched = next_training_batch(t, err, err_size) &&
                      gpu_session_set_batch(t->gpu, &t->batch, err, err_size);
  t->cursor -= t->B;
  double l;
  if (!gpu_session_finish(t->gpu, &l, err, err_size)) return false;
  if (!isfinite(l))
    return fail(err, err_size, "the loss is %g at step %" PRId64 ": training diverged (try a "
                "smaller --lr)", l, t->step + 1);
  for (int k = 0; k < t->ntasks; k++) {
    const float *probs = gpu_session_probs(t->gpu, k);
    metrics_add(&t->window[k], probs, t->gpu_labels[k], t->B);
    metrics_add(&t->tail[k], probs, t->gpu_labels[k], t->B);
  }
  *loss = l;
  return true;
}

bool trainer_step(Trainer *t, double *loss, char *err, size_t err_size) {
  double start = now_seconds();
  if (t->gpu) {
    if (!gpu_step(t, loss, err, err_size)) return false;
    push_loss(t, *loss);
    t->step++;
    t->cursor += t->B;
    t->step_seconds += now_seconds() - start;
    return true;
  }
  if (!next_training_batch(t, err, err_size) || !bind_batch(t, err, err_size)) return false;
  t->flops += step_flops(t->ir, &t->batch, true);
  double l = cpu_exec_forward(t->x);
  if (!isfinite(l))
    return fail(err, err_size, "the loss is %g at step %" PRId64 ": training diverged (try a "
                "smaller --lr)", l, t->step + 1);
  cpu_exec_backward(t->x);
  apply_optimizers(t);
  for (int k = 0; k < t->ntasks; k++) {
    const float *probs = cpu_exec_task_probs(t->x, k);
    metrics_add(&t->window[k], probs, task_labels(t, k), t->B);
    metrics_add(&t->tail[k], probs, task_labels(t, k), t->B);
  }
  push_loss(t, l);
  t->step++;
  t->cursor += t->B;
  *loss = l;
  t->step_seconds += now_seconds() - start;
  return true;
}

// --- evaluation -------------------------------------------------------------------------

bool trainer_eval(Trainer *t, EvalResult *out, char *err, size_t err_size) {
  Metrics *model = xcalloc((size_t)t->ntasks, sizeof *model);
  Metrics *teacher = xcalloc((size_t)t->ntasks, sizeof *teacher);
  float *teacher_probs = t->synth ? xcalloc((size_t)t->B, sizeof *teacher_probs) : NULL;
  double loss_sum = 0;
  int64_t nbatches = t->eval_count / t->B;
  bool ok = true;
  for (int64_t i = 0; ok && i < nbatches; i++) {
    int64_t first = t->eval_first + i * t->B;
    if (t->synth) synth_batch(t->synth, first, &t->batch);
    else ok = datafile_read(t->reader, first, &t->batch, err, err_size);
    if (t->gpu) {
      // The evaluation batches go through the same slots: the prefetched one is dropped.
      t->gpu_prefetched = false;
      double l = NAN;
      ok = ok && gpu_session_set_batch(t->gpu, &t->batch, err, err_size) &&
           gpu_session_launch(t->gpu, false, t->step, err, err_size) &&
           gpu_session_finish(t->gpu, &l, err, err_size);
      if (!ok) break;
      loss_sum += l;
    } else {
      ok = ok && bind_batch(t, err, err_size);
      if (!ok) break;
      loss_sum += cpu_exec_forward(t->x);
    }
    for (int k = 0; k < t->ntasks; k++) {
      metrics_add(&model[k], t->gpu ? gpu_session_probs(t->gpu, k) : cpu_exec_task_probs(t->x, k),
                  task_labels(t, k), t->B);
      if (!t->synth) continue;
      for (int64_t b = 0; b < t->B; b++)
        teacher_probs[b] = (float)synth_teacher_prob(t->synth, &t->batch, b, t->label_feature[k]);
      metrics_add(&teacher[k], teacher_probs, task_labels(t, k), t->B);
    }
  }
  for (int k = 0; k < t->ntasks; k++) {
    task_metrics_from(&model[k], &t->eval_tasks[k]);
    t->teacher_ne[k] = t->synth ? metrics_ne(&teacher[k]) : NAN;
    metrics_free(&model[k]);
    metrics_free(&teacher[k]);
  }
  free(model);
  free(teacher);
  free(teacher_probs);
  if (!ok) return false;
  out->loss = loss_sum / (double)nbatches;
  out->examples = t->eval_count;
  out->ntasks = t->ntasks;
  out->tasks = t->eval_tasks;
  out->teacher_ne = t->synth ? t->teacher_ne : NULL;
  return true;
}

// --- checkpoints ------------------------------------------------------------------------

// The checkpoint entries of the state: every parameter and table, every optimizer state, the
// loop's counters, the loss history and the learning curve. `names` holds their names.
typedef struct Entries {
  CkptEntry *e;
  int n, cap;
  char *names;  // packed, NUL-separated
  size_t names_used, names_cap;
  int64_t counters[3];  // cursor, batch, seed
  double *curve;        // 6 doubles per point
} Entries;

static void add_entry(Entries *s, const char *kind, const char *name, void *data, size_t size) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->e = xrealloc(s->e, (size_t)s->cap * sizeof *s->e);
  }
  size_t len = strlen(kind) + 1 + strlen(name) + 1;
  if (s->names_used + len > s->names_cap) {
    // Grow, and point the names of the earlier entries into the new buffer.
    size_t cap = s->names_cap * 2 + len + 4096;
    char *fresh = xmalloc(cap);
    if (s->names_used) memcpy(fresh, s->names, s->names_used);
    for (int i = 0; i < s->n; i++) s->e[i].name = fresh + (s->e[i].name - s->names);
    free(s->names);
    s->names = fresh;
    s->names_cap = cap;
  }
  char *at = s->names + s->names_used;
  snprintf(at, len, "%s%s%s", kind, *name ? ":" : "", name);
  s->names_used += len;
  s->e[s->n++] = (CkptEntry){at, data, size};
}

static void entries_free(Entries *s) {
  free(s->e);
  free(s->names);
  free(s->curve);
}

// Lists the state; `nsteps` and `ncurve` size the histories (the trainer's own when saving,
// the checkpoint's when loading into `losses` and s->curve).
static void list_entries(Trainer *t, Entries *s, double *losses, int64_t nsteps, int ncurve) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    const char *name = t->ir->tensors[p->tensor].name;
    add_entry(s, p->table ? "table" : "param", name, cpu_exec_data(t->x, p->tensor),
              (size_t)p->numel * sizeof(float));
    add_entry(s, "optim.step", name, &p->st.step, sizeof p->st.step);
    if (p->st.m) add_entry(s, "adamw.m", name, p->st.m, (size_t)p->st.n * sizeof(float));
    if (p->st.v) add_entry(s, "adamw.v", name, p->st.v, (size_t)p->st.n * sizeof(float));
    if (p->st.rowsum)
      add_entry(s, "adagrad.rowsum", name, p->st.rowsum, (size_t)p->st.n * sizeof(float));
  }
  add_entry(s, "train.counters", "", s->counters, sizeof s->counters);
  add_entry(s, "train.losses", "", losses, (size_t)nsteps * sizeof *losses);
  s->curve = xcalloc((size_t)ncurve * 6, sizeof *s->curve);
  add_entry(s, "train.curve", "", s->curve, (size_t)ncurve * 6 * sizeof *s->curve);
}

// The cuda backend keeps the parameters, the tables and the optimizer state on the GPU, and a
// checkpoint is written from the CPU side (the executor's parameters and each OptimState), so
// the GPU's copies come back first. The file is the same either backend writes. The GPU's
// optimizer launches take the trainer's step (AdamW's bias correction counts from it), so every
// parameter and table with a gradient has taken t->step optimizer steps, as on the CPU.
static bool gpu_state_to_host(Trainer *t, char *err, size_t err_size) {
  char reason[512];
  if (!gpu_session_download(t->gpu, t->x, reason, sizeof reason))
    return fail(err, err_size, "saving a checkpoint: reading the parameters back from the "
                "GPU: %s", reason);
  for (int i = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    if (!gpu_session_download_optstate(t->gpu, p->tensor, &p->st, reason, sizeof reason))
      return fail(err, err_size, "saving a checkpoint: reading the optimizer state back from "
                  "the GPU: %s", reason);
    if (ir_grad_of(t->ir, p->tensor) >= 0) p->st.step = t->step;
  }
  return true;
}

// After a checkpoint is loaded into the CPU side: parameters, tables and optimizer state onto
// the GPU. The buffers keep their addresses, so the CUDA graphs (which capture pointers, not
// values) stay valid; a batch prefetched before the resume would be stale, so none is kept.
static bool gpu_state_from_host(Trainer *t, const char *dir, char *err, size_t err_size) {
  for (int i = 0; i < t->ntrained; i++) {
    const Trained *p = &t->trained[i];
    if (p->st.cfg.kind == OPTIM_ADAMW && ir_grad_of(t->ir, p->tensor) >= 0 &&
        p->st.step != t->step)
      return fail(err, err_size, "checkpoint %s/%s: AdamW on %s has taken %" PRId64 " steps "
                  "of the %" PRId64 " the checkpoint trained; the cuda backend steps every "
                  "parameter at the training step, so it cannot continue it", dir,
                  CHECKPOINT_FILE, t->ir->tensors[p->tensor].name, p->st.step, t->step);
  }
  char reason[512];
  if (!gpu_session_upload(t->gpu, t->x, reason, sizeof reason))
    return fail(err, err_size, "resuming: uploading the parameters to the GPU: %s", reason);
  for (int i = 0; i < t->ntrained; i++) {
    const Trained *p = &t->trained[i];
    if (!gpu_session_upload_optstate(t->gpu, p->tensor, &p->st, reason, sizeof reason))
      return fail(err, err_size, "resuming from %s/%s: %s", dir, CHECKPOINT_FILE, reason);
  }
  t->gpu_prefetched = false;
  return true;
}

bool trainer_save(Trainer *t, const char *dir, char *err, size_t err_size) {
  if (t->gpu && !gpu_state_to_host(t, err, err_size)) return false;
  Entries s;
  list_entries(t, &s, t->losses, t->step, t->ncurve);
  s.counters[0] = t->cursor;
  s.counters[1] = t->B;
  s.counters[2] = (int64_t)t->opt.seed;
  for (int i = 0; i < t->ncurve; i++) {
    const CurvePoint *p = &t->curve[i];
    double row[6] = {(double)p->step, p->train_loss, p->eval_loss, p->train_ne, p->eval_ne,
                     p->eval_auc};
    memcpy(s.curve + 6 * i, row, sizeof row);
  }
  bool ok = checkpoint_save(dir, t->ir->model, t->key, t->step, s.e, s.n, err, err_size);
  entries_free(&s);
  return ok;
}

bool trainer_resume(Trainer *t, const char *dir, char *err, size_t err_size) {
  CkptInfo info;
  if (!checkpoint_info(dir, &info, err, err_size)) return false;
  int64_t nsteps = info.step;
  int64_t curve_bytes = checkpoint_info_size(&info, "train.curve");
  int64_t loss_bytes = checkpoint_info_size(&info, "train.losses");
  checkpoint_info_free(&info);
  if (nsteps < 0 || (loss_bytes >= 0 && loss_bytes != nsteps * (int64_t)sizeof(double)) ||
      curve_bytes % (6 * (int64_t)sizeof(double)) != 0)
    return fail(err, err_size, "checkpoint %s/%s is corrupt: its histories do not match its "
                "step count", dir, CHECKPOINT_FILE);
  int ncurve = curve_bytes > 0 ? (int)(curve_bytes / (6 * (int64_t)sizeof(double))) : 0;

  double *losses = xcalloc((size_t)nsteps, sizeof *losses);
  Entries s;
  list_entries(t, &s, losses, nsteps, ncurve);
  int64_t step = 0;
  bool ok = checkpoint_load(dir, t->key, &step, s.e, s.n, err, err_size);
  if (ok && s.counters[0] < 0)
    ok = fail(err, err_size, "checkpoint %s/%s is corrupt: negative data cursor", dir,
              CHECKPOINT_FILE);
  if (ok) {
    free(t->losses);
    t->losses = losses;
    losses = NULL;
    t->cap_losses = nsteps;
    t->step = step;
    t->cursor = s.counters[0];
    if ((uint64_t)s.counters[2] != t->opt.seed) {
      // The synthetic stream is the checkpoint's, whatever seed this run was given.
      t->opt.seed = (uint64_t)s.counters[2];
      if (t->synth) {
        synth_free(t->synth);
        t->synth = make_synth(t);
      }
    }
    t->ncurve = 0;
    for (int i = 0; i < ncurve; i++) {
      const double *r = s.curve + 6 * i;
      CurvePoint p = {(int64_t)r[0], r[1], r[2], r[3], r[4], r[5]};
      trainer_add_curve_point(t, &p);
    }
    if (t->gpu) ok = gpu_state_from_host(t, dir, err, err_size);
  }
  free(losses);
  entries_free(&s);
  return ok;
}

// --- reporting --------------------------------------------------------------------------

const Metrics *trainer_train_metrics(const Trainer *t, bool window, int task) {
  GEMC_ASSERT(task >= 0 && task < t->ntasks);
  return window ? &t->window[task] : &t->tail[task];
}

void trainer_reset_train_metrics(Trainer *t, bool window) {
  for (int k = 0; k < t->ntasks; k++) metrics_free(window ? &t->window[k] : &t->tail[k]);
}

void trainer_add_curve_point(Trainer *t, const CurvePoint *p) {
  if (t->ncurve == t->cap_curve) {
    t->cap_curve = t->cap_curve ? 2 * t->cap_curve : 32;
    t->curve = xrealloc(t->curve, (size_t)t->cap_curve * sizeof *t->curve);
  }
  t->curve[t->ncurve++] = *p;
}

int64_t trainer_step_count(const Trainer *t) { return t->step; }
const double *trainer_losses(const Trainer *t) { return t->losses; }
const CurvePoint *trainer_curve(const Trainer *t, int *n) {
  *n = t->ncurve;
  return t->curve;
}
int64_t trainer_batch(const Trainer *t) { return t->B; }
const char *trainer_model_name(const Trainer *t) { return t->ir->model; }
int trainer_ntasks(const Trainer *t) { return t->ntasks; }
const char *trainer_task_name(const Trainer *t, int task) {
  return cpu_exec_task_name(t->x, task);
}
uint64_t trainer_model_key(const Trainer *t) { return t->key; }
uint64_t trainer_seed(const Trainer *t) { return t->opt.seed; }
int64_t trainer_eval_examples(const Trainer *t) { return t->eval_count; }
int64_t trainer_train_examples(const Trainer *t) { return t->synth ? 0 : t->train_span; }
const Optim *trainer_dense_optim(const Trainer *t) { return &t->dense_optim; }
double trainer_step_seconds(const Trainer *t) { return t->step_seconds; }
const char *trainer_device(const Trainer *t) { return t->gpu ? gpu_session_device(t->gpu) : NULL; }
double trainer_flops(const Trainer *t) { return t->flops; }
double trainer_peak_tflops(const Trainer *t) {
  return peak_tflops(t->gpu ? gpu_session_arch(t->gpu) : t->ir->target, t->ir->precision);
}

int64_t trainer_param_count(const Trainer *t, int64_t *in_tables) {
  int64_t total = 0, tables = 0;
  for (int i = 0; i < t->ntrained; i++) {
    total += t->trained[i].numel;
    if (t->trained[i].table) tables += t->trained[i].numel;
  }
  if (in_tables) *in_tables = tables;
  return total;
}
