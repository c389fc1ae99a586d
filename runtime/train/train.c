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
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "batch_pipeline.h"
#include "batch_split.h"
#include "checked.h"
#include "checkpoint.h"
#include "checkpoint_set.h"
#include "clock.h"
#include "cpu_exec.h"
#include "datafile.h"
#include "flops.h"
#include "hash.h"
#include "internal_error.h"
#include "optim.h"
#include "target.h"
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
  TrainerTimes times;  // where the GPU steps' wall time went
  double flops;          // useful FLOPs of the timed steps
  int64_t timed_steps;   // steps whose time is in step_seconds (not the profiled ones)
  int64_t profile_from, profile_count;  // the steps gpu_exec_profile times launch by launch
  bool profiling;        // the step in flight is profiled

  // The cuda backend: the session, whether the next training batch is already uploaded
  // (prefetched while the previous step ran), and each task's labels of the step in flight.
  GpuSession *gpu;
  Ir gpu_ir;              // the IR the GPU plan is built from: ir with the optimizer overrides
                          // and the tuned schedules
  Tensor *gpu_tensors;    // gpu_ir's tensors (owned), when overrides are given
  Node *gpu_nodes;        // gpu_ir's nodes (owned), when schedules are given
  bool gpu_prefetched;
  float **gpu_labels;    // [ntasks][B]
  BatchPipeline *pipeline;  // makes and stages the training batches ahead (NULL: inline)

  // The divergence guard.
  TrainFailure failure;
  bool skipped;            // the last step skipped its update
  int64_t skipped_in_row;
  int64_t *skipped_steps;  // this run's, [nskipped]
  int64_t nskipped, cap_skipped;

  // Distributed training (dist_* below): NULL comm: alone.
  Comm *comm;
  DenseSync *dense;
  TableSync *tables;
  Batch local;               // this rank's share of the batch
  int64_t *split;            // [world + 1] the shares
  Batch share_lengths;       // GPU ranks' pipeline thread: the global batch's lengths
  int64_t *share_split;      // and its shares
  OptimState **dense_states; // the dense parameters' optimizers, in dense_sync's order
  OptimState **table_states; // [ir->ntensors] the tables' optimizers (NULL elsewhere)
  int *dense_index;          // ZeRO-3: [ir->ntensors] a gathered parameter's place in
                             // dense_sync's order, or -1 (NULL: not ZeRO-3)
  char gather_err[320];      // ZeRO-3: why a gather failed during the last pass ("": none)
  float *probs_all;          // [B] every rank's predictions of one task
  float *labels_all;         // [B] its labels
  float *teacher_all;        // [B] the synthetic teacher's probabilities (evaluation)
  float *teacher_mine;       // [B] this rank's share of them
  double dist_compute_s, dist_comm_s, global_flops, grad_bytes_s;
  int64_t dist_steps;
  bool failed_together;      // the last failure was agreed by every rank (trainer.h)
};

static bool produce_batch(void *ctx, int64_t cursor, Batch *b, GpuStaged *st, double *make_s,
                          double *stage_s, char *err, size_t err_size);
static bool produce_share(void *ctx, int64_t cursor, Batch *b, GpuStaged *st, double *make_s,
                          double *stage_s, char *err, size_t err_size);

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
  // How the model is spread over ranks is not what it computes: a checkpoint resumes under any
  // placement.
  copy.parallel = (Parallel){0};
  Tensor *tensors = xcalloc((size_t)ir->ntensors + 1, sizeof *tensors);
  memcpy(tensors, ir->tensors, (size_t)ir->ntensors * sizeof *tensors);
  for (int i = 0; i < ir->ntensors; i++) tensors[i].shard = SHARD_TABLE_UNSET;
  copy.tensors = tensors;
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  if (!f) gemc_internal_error(__FILE__, __LINE__, "open_memstream failed");
  ir_print(f, &copy);
  fclose(f);
  uint64_t key = fnv1a64(FNV1A64_INIT, text, size);
  free(text);
  free(tensors);
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
      // A windowed table's state covers this rank's own rows (table_sync_own_rows).
      int64_t nown = 0;
      bool windowed = t->tables && table_sync_own_rows(t->tables, i, &nown) != NULL;
      optim_state_init(&p->st, table_override(x->optim, &t->opt.optim),
                       windowed ? nown : p->rows, p->dim);
    } else if (t->dense_index && t->dense_index[i] >= 0) {  // ZeRO-3: this rank's part
      int64_t from, n;
      dense_sync_shard(t->dense, t->dense_index[i], &from, &n);
      optim_state_init_part(&p->st, dense_override(x->optim, &t->opt.optim), from, n);
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
// The tuned schedules (TrainOptions.node_sched) go into a copy of the nodes the same way, so
// the model key (train_model_key of t->ir) and checkpoints do not depend on what was tuned;
// an artifact keeps the schedules it was built with, so they are not applied to one.
// A GPU rank of several defers its table updates (ir->defer_table_updates, set only here for
// the plan; one process never does, whatever GEMC_TEST_DEFER_TABLES said to load_model).
static bool defers_tables(const Trainer *t);

static const Ir *gpu_plan_ir(Trainer *t, char *err, size_t err_size) {
  const Ir *ir = t->ir;
  bool overrides = has_overrides(&t->opt.optim);
  bool scheds = t->opt.node_sched && !t->opt.artifact;
  bool defer = defers_tables(t);
  if (defer && t->opt.artifact) {
    fail(err, err_size, "an artifact's kernels update the tables inside the backward pass; "
         "these GPU ranks merge the tables' gradients first: train without --artifact");
    return NULL;
  }
  if (!overrides && !scheds && defer == ir->defer_table_updates) return ir;
  if (overrides && t->opt.artifact) {
    fail(err, err_size, "optimizer overrides (--lr, --table-lr, ...) cannot change an artifact's "
         "kernels, which have the model's values compiled in: train without --artifact (the "
         "kernels are then compiled with the overrides), or edit the model and rebuild");
    return NULL;
  }
  t->gpu_ir = *ir;
  t->gpu_ir.defer_table_updates = defer;
  if (overrides) {
    t->gpu_tensors = xcalloc((size_t)ir->ntensors + 1, sizeof *t->gpu_tensors);
    memcpy(t->gpu_tensors, ir->tensors, (size_t)ir->ntensors * sizeof *t->gpu_tensors);
    for (int i = 0; i < ir->ntensors; i++) {
      Tensor *x = &t->gpu_tensors[i];
      if (x->kind == TENSOR_TABLE) x->optim = table_override(x->optim, &t->opt.optim);
      else if (x->kind == TENSOR_PARAM) x->optim = dense_override(x->optim, &t->opt.optim);
    }
    t->gpu_ir.tensors = t->gpu_tensors;
    t->gpu_ir.dense_optim = dense_override(ir->dense_optim, &t->opt.optim);
  }
  if (scheds) {
    t->gpu_nodes = xcalloc((size_t)ir->nnodes + 1, sizeof *t->gpu_nodes);
    memcpy(t->gpu_nodes, ir->nodes, (size_t)ir->nnodes * sizeof *t->gpu_nodes);
    for (int i = 0; i < ir->nnodes; i++) t->gpu_nodes[i].sched = t->opt.node_sched[i];
    t->gpu_ir.nodes = t->gpu_nodes;
  }
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

static bool dist_setup(Trainer *t, char *err, size_t err_size);
static bool dist_agree(Trainer *t, bool mine, const char *what, char *err, size_t err_size);

// The dense parameters distributed training keeps in sync: those with a gradient, in the IR's
// order (dense_sync's `params`). Returns their number.
static int dense_params(const Ir *ir, int *params) {
  int n = 0;
  for (int i = 0; i < ir->ntensors; i++)
    if (ir->tensors[i].kind == TENSOR_PARAM && ir_grad_of(ir, i) >= 0) params[n++] = i;
  return n;
}

static int64_t bucket_bytes(const Trainer *t) {
  return t->opt.bucket_bytes > 0 ? t->opt.bucket_bytes : DEFAULT_BUCKET_BYTES;
}

// ZeRO-3 on CPU ranks: the dense sync comes first, since it decides which part of each
// parameter this rank keeps; gathered[p] and param_elems[p] (that part's size, -1 elsewhere)
// tell the executor and the memory check.
static void zero3_setup(Trainer *t, bool *gathered, int64_t *param_elems) {
  const Ir *ir = t->ir;
  int *params = xcalloc((size_t)ir->ntensors + 1, sizeof *params);
  int np = dense_params(ir, params);
  t->dense = dense_sync_new(t->opt.comm, ir, DENSE_ZERO3, bucket_bytes(t), params, np);
  dense_sync_count_bad(t->dense, t->opt.on_nan_skip > 0);  // for the divergence guard
  t->dense_index = xcalloc((size_t)ir->ntensors + 1, sizeof *t->dense_index);
  for (int i = 0; i < ir->ntensors; i++) t->dense_index[i] = -1, param_elems[i] = -1;
  for (int i = 0; i < np; i++) {
    int64_t from, n;
    dense_sync_shard(t->dense, i, &from, &n);
    t->dense_index[params[i]] = i;
    gathered[params[i]] = true;
    param_elems[params[i]] = n;
  }
  free(params);
}

// A dense parameter this rank holds only a ZeRO-3 part of (dense_sync_shard).
static bool zero3_param(const Trainer *t, const Trained *p) {
  return !p->table && t->dense_index && t->dense_index[p->tensor] >= 0;
}

// The executor's fill of a gathered parameter: every rank's part of it. A failure is kept for
// the step to report (the executor's pass runs to its end on zeros).
static void zero3_fill(void *ctx, int tensor, float *whole) {
  Trainer *t = ctx;
  double t0 = monotonic_seconds();
  bool ok = !t->gather_err[0] && dense_sync_gather(t->dense, t->dense_index[tensor], whole,
                                                   t->gather_err, sizeof t->gather_err);
  t->dist_comm_s += monotonic_seconds() - t0;  // a step's, or an evaluation's (as allreduces)
  if (!ok) {
    if (!t->gather_err[0]) snprintf(t->gather_err, sizeof t->gather_err, "a gather failed");
    int64_t n = cpu_exec_numel(t->x, tensor);
    memset(whole, 0, (size_t)n * sizeof *whole);
  }
}

// This rank's part of each gathered parameter, with the values the whole parameter gets from
// `seed`.
static void zero3_init(Trainer *t, uint64_t seed) {
  for (int i = 0; i < t->ir->ntensors; i++) {
    if (t->dense_index[i] < 0) continue;
    int64_t from, n;
    float *part = dense_sync_shard(t->dense, t->dense_index[i], &from, &n);
    if (part) cpu_init_param_part(t->ir, i, seed, from, n, part);
  }
  cpu_exec_set_param_fill(t->x, zero3_fill, t);
}

// A pass that gathered parameters: a failed gather fails the step.
static bool zero3_pass_ok(Trainer *t, char *err, size_t err_size) {
  if (!t->gather_err[0]) return true;
  fail(err, err_size, "%s", t->gather_err);
  t->gather_err[0] = '\0';
  return false;
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

  // CPU ranks place the tables first: each holds only its own rows of a sharded table
  // (table_sync_windowed), and the memory check counts those. Under ZeRO-3 each holds only its
  // part of the dense parameters, gathered whole while a pass reads them (zero3_fill).
  bool *windowed = NULL, *gathered = NULL;
  int64_t *held = NULL, *param_elems = NULL;
  if (o->comm && !o->cuda && comm_world(o->comm) > 1) {
    TablePlacement *none = o->placement ? NULL : xcalloc((size_t)ir->ntensors + 1, sizeof *none);
    t->tables = table_sync_new(o->comm, ir, &t->schema, none ? none : o->placement);
    free(none);
    windowed = xcalloc((size_t)ir->ntensors + 1, sizeof *windowed);
    held = xcalloc((size_t)ir->ntensors + 1, sizeof *held);
    table_sync_windowed(t->tables, windowed);
    for (int i = 0; i < ir->ntensors; i++) held[i] = table_sync_rows_held(t->tables, i, t->B);
    if (o->dense_mode == DENSE_ZERO3) {
      gathered = xcalloc((size_t)ir->ntensors + 1, sizeof *gathered);
      param_elems = xcalloc((size_t)ir->ntensors + 1, sizeof *param_elems);
      zero3_setup(t, gathered, param_elems);
    }
  }
  // Both backends start from the CPU executor's parameters: refuse a model that cannot fit
  // before allocating anything large.
  int64_t buckets = 0;  // distributed training's gradient buckets, beside the executor
  if (held) {
    int *params = xcalloc((size_t)ir->ntensors + 1, sizeof *params);
    int np = dense_params(ir, params);
    buckets = dense_sync_bytes_needed(ir, o->dense_mode, bucket_bytes(t), params, np,
                                      comm_world(o->comm));
    free(params);
  }
  if (!cpu_exec_check_fit_rows(ir, EXEC_F32, t->B, held, param_elems, buckets, err,
                               err_size)) {
    table_sync_free(t->tables);
    dense_sync_free(t->dense);
    free(t->dense_index);
    free(windowed);
    free(gathered);
    free(held);
    free(param_elems);
    free(t);
    return NULL;
  }
  t->x = cpu_exec_new_parts(ir, EXEC_F32, windowed, gathered);
  free(windowed);
  free(gathered);
  free(held);
  free(param_elems);
  cpu_exec_init_params(t->x, o->seed);
  if (t->tables) table_sync_init_rows(t->tables, o->seed);
  if (t->dense_index) zero3_init(t, o->seed);
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
  // CPU ranks join a world of several; GPU ranks any world a launcher started (NCCL even for
  // one rank), once their session is open.
  if (ok && o->comm && !o->cuda && comm_world(o->comm) > 1) ok = dist_setup(t, err, err_size);
  if (ok && o->cuda) {
    GpuSessionOptions go = {.artifact = o->artifact, .model_key = t->key, .max_batch = t->B,
                            .graphs = true, .log = o->gpu_log};
    const Ir *plan_ir = gpu_plan_ir(t, err, err_size);
    t->gpu = plan_ir ? gpu_session_open(plan_ir, t->x, &go, err, err_size) : NULL;
    ok = t->gpu != NULL;
    t->gpu_labels = xcalloc((size_t)t->ntasks, sizeof *t->gpu_labels);
    for (int k = 0; ok && k < t->ntasks; k++)
      t->gpu_labels[k] = xcalloc((size_t)t->B, sizeof(float));
    // Three items: the one being copied, the next one ready, one being made.
    // A GPU rank's pipeline makes its share of each synthetic batch (produce_share); with a
    // data file it cuts its share on the step's thread.
    const char *env = getenv("GEMC_PIPELINE");
    bool pipelined = !(env && strcmp(env, "0") == 0) && (!o->comm || t->synth);
    if (ok && pipelined && o->comm) {
      batch_alloc(&t->share_lengths, &t->schema, t->B);
      t->share_split = xcalloc((size_t)comm_world(o->comm) + 1, sizeof *t->share_split);
    }
    if (ok && pipelined)
      t->pipeline = pipeline_new(3, &t->schema, t->B, t->B,
                                 o->comm ? produce_share : produce_batch, t);
    t->times.pipelined = t->pipeline != NULL;
    if (ok && o->comm) ok = dist_setup(t, err, err_size);
  }
  if (!ok) {
    trainer_free(t);
    return NULL;
  }
  return t;
}

void trainer_free(Trainer *t) {
  if (!t) return;
  dense_sync_free(t->dense);
  table_sync_free(t->tables);
  if (t->comm) batch_free(&t->local);
  free(t->split);
  free(t->share_split);
  free(t->dense_states);
  free(t->dense_index);
  free(t->table_states);
  free(t->probs_all);
  free(t->labels_all);
  free(t->teacher_all);
  free(t->teacher_mine);
  pipeline_free(t->pipeline);  // before the data source and the session it uses
  if (t->share_lengths.B) batch_free(&t->share_lengths);
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
  free(t->gpu_nodes);
  for (int k = 0; t->gpu_labels && k < t->ntasks; k++) free(t->gpu_labels[k]);
  free(t->gpu_labels);
  free(t->skipped_steps);
  free(t);
}

// --- data -------------------------------------------------------------------------------

// Fills *b with training examples [cursor, cursor + B) of the stream. A data file's training
// split repeats: examples past its end wrap around to its start. With the pipeline, only its
// producer thread calls this (the evaluation pauses it first).
static bool training_batch_at(Trainer *t, int64_t cursor, Batch *b, char *err,
                              size_t err_size) {
  if (t->synth) {
    synth_batch(t->synth, cursor, b);
    return true;
  }
  int64_t first = cursor % t->train_span;
  if (first + t->B <= t->train_span)
    return datafile_read(t->reader, first, b, err, err_size);
  // The batch wraps: the split's last examples, then its first ones.
  if (!t->spare.B) batch_alloc(&t->spare, &t->schema, t->B);
  int64_t head = t->train_span - first;
  if (!datafile_read(t->reader, first, &t->spare, err, err_size)) return false;
  batch_copy(&t->schema, b, 0, &t->spare, 0, head);
  if (!datafile_read(t->reader, 0, &t->spare, err, err_size)) return false;
  batch_copy(&t->schema, b, head, &t->spare, 0, t->B - head);
  return true;
}

static bool next_training_batch(Trainer *t, char *err, size_t err_size) {
  return training_batch_at(t, t->cursor, &t->batch, err, err_size);
}

// The pipeline's producer: the batch of `cursor`, staged for the GPU.
static bool produce_batch(void *ctx, int64_t cursor, Batch *b, GpuStaged *st, double *make_s,
                          double *stage_s, char *err, size_t err_size) {
  Trainer *t = ctx;
  double t0 = monotonic_seconds();
  bool ok = training_batch_at(t, cursor, b, err, err_size);
  double t1 = monotonic_seconds();
  ok = ok && gpu_session_stage(t->gpu, b, st, err, err_size);
  *make_s = t1 - t0;
  *stage_s = monotonic_seconds() - t1;
  return ok;
}

// A GPU rank's pipeline producer (synthetic data): this rank's share of the global batch of
// `cursor`, cut as dist_share cuts it, made and staged.
static bool produce_share(void *ctx, int64_t cursor, Batch *b, GpuStaged *st, double *make_s,
                          double *stage_s, char *err, size_t err_size) {
  Trainer *t = ctx;
  double t0 = monotonic_seconds();
  int rank = comm_rank(t->opt.comm), world = comm_world(t->opt.comm);
  t->share_lengths.B = t->B;
  synth_lengths(t->synth, cursor, &t->share_lengths);
  batch_split(&t->share_lengths, world, t->share_split);
  int64_t first = t->share_split[rank];
  b->B = t->share_split[rank + 1] - first;
  synth_batch(t->synth, cursor + first, b);
  double t1 = monotonic_seconds();
  bool ok = gpu_session_stage(t->gpu, b, st, err, err_size);
  *make_s = t1 - t0;
  *stage_s = monotonic_seconds() - t1;
  return ok;
}

// Where gpu_batch_at's time went: making and staging the batch (on the pipeline's thread, or
// here without one), waiting for the pipeline, copying into the slot.
typedef struct BatchTimes {
  double make_s, stage_s, wait_s, copy_s;
} BatchTimes;

// Makes the batch of `cursor` current on the GPU (its upload enqueued) and in t->batch: from
// the pipeline, or made here when there is none.
static bool gpu_batch_at(Trainer *t, int64_t cursor, BatchTimes *bt, char *err,
                         size_t err_size) {
  *bt = (BatchTimes){0};
  double t0 = monotonic_seconds();
  if (!t->pipeline) {
    bool ok = training_batch_at(t, cursor, &t->batch, err, err_size);
    double t1 = monotonic_seconds();
    ok = ok && gpu_session_set_batch(t->gpu, &t->batch, err, err_size);
    bt->make_s = t1 - t0;
    bt->stage_s = monotonic_seconds() - t1;
    return ok;
  }
  PipelineItem *it = pipeline_take(t->pipeline, cursor, &bt->wait_s);
  if (!it->ok) {
    fail(err, err_size, "%s", it->err);
    pipeline_release(t->pipeline, it);
    return false;
  }
  Batch mine = t->batch;  // the item keeps this one's storage for a later batch
  t->batch = it->batch;
  it->batch = mine;
  double t1 = monotonic_seconds();
  bool ok = gpu_session_set_staged(t->gpu, &it->staged, err, err_size);
  bt->make_s = it->make_s;
  bt->stage_s = it->stage_s;
  bt->copy_s = monotonic_seconds() - t1;
  pipeline_release(t->pipeline, it);
  return ok;
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

// --- the divergence guard ---------------------------------------------------------------

static void count_nonfinite(const float *v, int64_t n, int64_t *nan, int64_t *inf) {
  for (int64_t i = 0; i < n; i++) {
    if (isnan(v[i])) (*nan)++;
    else if (isinf(v[i])) (*inf)++;
  }
}

// What to lower: the dense learning rate, and for a table's values or state also --table-lr.
static void lr_hint(const Trainer *t, const char *tensor, char *buf, size_t size) {
  bool table = strncmp(tensor, "table:", 6) == 0 || strncmp(tensor, "adagrad.", 8) == 0;
  snprintf(buf, size, "try a lower --lr (this run's is %g)%s", t->dense_optim.lr,
           table ? " or --table-lr" : "");
}

// "the loss is NaN", "table:items holds 64000 NaN and 0 infinite values (of 64000)".
static void describe(const char *tensor, int64_t nan, int64_t inf, int64_t values, char *buf,
                     size_t size) {
  if (strcmp(tensor, "loss") == 0)
    snprintf(buf, size, "the loss is %s", nan > 0 ? "NaN" : "infinite");
  else
    snprintf(buf, size, "%s holds %" PRId64 " NaN and %" PRId64 " infinite values (of %" PRId64
             ")", tensor, nan, inf, values);
}

static void record_failure(Trainer *t, int64_t step, const char *tensor, int64_t nan,
                           int64_t inf, int64_t values) {
  TrainFailure *f = &t->failure;
  f->failed = true;
  f->step = step;
  snprintf(f->tensor, sizeof f->tensor, "%s", tensor);
  f->what = nan > 0 ? "NaN" : "Inf";
  f->nan = nan;
  f->inf = inf;
  f->values = values;
  f->skipped_in_row = t->skipped_in_row;
}

// The test hook: this step's loss counts as NaN.
static bool test_nan(const Trainer *t) {
  int64_t s = t->step + 1;
  return t->opt.test_nan_count > 0 && s >= t->opt.test_nan_first &&
         s < t->opt.test_nan_first + t->opt.test_nan_count;
}

// The step being taken has a non-finite loss or gradient, `tensor`. --on-nan stop: fails,
// recording it. --on-nan skip=N: returns true, the step to be skipped, unless it is the N-th
// such step in a row.
static bool guard_step(Trainer *t, const char *tensor, int64_t nan, int64_t inf,
                       int64_t values, char *err, size_t err_size) {
  int64_t step = t->step + 1, n = t->opt.on_nan_skip;
  if (n > 0 && t->skipped_in_row + 1 < n) {
    t->skipped_in_row++;
    if (t->nskipped == t->cap_skipped) {
      t->cap_skipped = t->cap_skipped ? 2 * t->cap_skipped : 16;
      t->skipped_steps = xrealloc(t->skipped_steps, (size_t)t->cap_skipped * sizeof(int64_t));
    }
    t->skipped_steps[t->nskipped++] = step;
    return true;
  }
  if (n > 0) t->skipped_in_row++;
  record_failure(t, step, tensor, nan, inf, values);
  t->failed_together = t->comm != NULL;  // every rank saw the same global loss and gradients
  char bad[320], hint[96];
  describe(tensor, nan, inf, values, bad, sizeof bad);
  lr_hint(t, tensor, hint, sizeof hint);
  if (n > 0)
    return fail(err, err_size, "training diverged at step %" PRId64 ": %s (%" PRId64
                " non-finite steps in a row; --on-nan skip=%" PRId64 " stops there); %s", step,
                bad, n, n, hint);
  return fail(err, err_size, "training diverged at step %" PRId64 ": %s; %s", step, bad, hint);
}

// The GPU's gradients checked for NaN and inf (gpu_session_check_finite): when a tensor holds
// one, guard_step decides, by --on-nan, whether the run stops (false, with err) or the step is
// skipped (*bad set).
static bool gpu_guard_grads(Trainer *t, bool *bad, char *err, size_t err_size) {
  int tensor = -1, slot = -1;
  int64_t nan = 0, inf = 0, values = 0;
  *bad = false;
  if (!gpu_session_check_finite(t->gpu, true, &tensor, &slot, &nan, &inf, &values, err,
                                err_size))
    return false;
  if (tensor < 0) return true;
  char name[192];
  snprintf(name, sizeof name, "grad:%s", t->ir->tensors[tensor].name);
  if (!guard_step(t, name, nan, inf, values, err, err_size)) return false;
  *bad = true;
  return true;
}

// A skipped step leaves the parameters, the tables and the optimizer moments as they were;
// only AdamW's step count advances, as it does on the GPU, whose optimizer launches take the
// training step (so a checkpoint reads the same from either backend).
static void skip_update(Trainer *t) {
  for (int i = 0; i < t->ntrained; i++)
    if (ir_grad_of(t->ir, t->trained[i].tensor) >= 0) t->trained[i].st.step++;
  t->skipped = true;
}

// --on-nan skip on the CPU: the first gradient that is not finite; false when all are.
static bool cpu_bad_grad(Trainer *t, char *name, size_t size, int64_t *nan, int64_t *inf,
                         int64_t *values) {
  for (int i = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    int64_t nrows = 0;
    const int64_t *row_ids = NULL;
    const float *g = cpu_exec_grad(t->x, p->tensor, &nrows, &row_ids);
    *values = p->table ? nrows * p->dim : p->numel;
    *nan = *inf = 0;
    if (g) {
      count_nonfinite(g, *values, nan, inf);
    } else if (!zero3_param(t, p) ||  // ZeRO-3: released once packed, and counted then
               !dense_sync_bad_grad(t->dense, t->dense_index[p->tensor], nan, inf)) {
      continue;
    }
    if (*nan + *inf == 0) continue;
    snprintf(name, size, "grad:%s", t->ir->tensors[p->tensor].name);
    return true;
  }
  return false;
}

// The state's entry names, as in a checkpoint: "table:items", "adamw.v:w1", ...
static void state_name(const Trainer *t, const Trained *p, int slot, char *buf, size_t size) {
  const char *kind = slot < 0 ? (p->table ? "table" : "param")
                     : slot == 1 ? "adamw.v"
                     : p->st.cfg.kind == OPTIM_ADAMW ? "adamw.m" : "adagrad.rowsum";
  snprintf(buf, size, "%s:%s", kind, t->ir->tensors[p->tensor].name);
}

static bool gpu_check_state(Trainer *t, char *name, size_t size, int64_t *nan, int64_t *inf,
                            int64_t *values, bool *bad, char *err, size_t err_size) {
  int tensor = -1, slot = -1;
  if (!gpu_session_check_finite(t->gpu, false, &tensor, &slot, nan, inf, values, err, err_size))
    return false;
  *bad = tensor >= 0;
  for (int i = 0; *bad && i < t->ntrained; i++)
    if (t->trained[i].tensor == tensor) state_name(t, &t->trained[i], slot, name, size);
  return true;
}

bool trainer_check_finite(Trainer *t, char *err, size_t err_size) {
  char name[192] = "";
  int64_t nan = 0, inf = 0, values = 0;
  bool bad = false;
  if (t->gpu) {
    if (!gpu_check_state(t, name, sizeof name, &nan, &inf, &values, &bad, err, err_size))
      return false;
  }
  for (int i = 0; !t->gpu && !bad && i < t->ntrained; i++) {
    const Trained *p = &t->trained[i];
    int64_t nown = 0;
    const float *own = t->tables ? table_sync_own_rows(t->tables, p->tensor, &nown) : NULL;
    int64_t len = own ? nown * p->dim : p->numel, from;
    if (t->dense_index && t->dense_index[p->tensor] >= 0)  // ZeRO-3: this rank's part
      own = dense_sync_shard(t->dense, t->dense_index[p->tensor], &from, &len);
    const float *arrays[3] = {own ? own : cpu_exec_data(t->x, p->tensor),
                              p->st.m ? p->st.m : p->st.rowsum, p->st.v};
    int64_t lens[3] = {len, p->st.n, p->st.n};
    for (int k = 0; !bad && k < 3; k++) {
      if (!arrays[k]) continue;
      nan = inf = 0;
      count_nonfinite(arrays[k], lens[k], &nan, &inf);
      if (nan + inf == 0) continue;
      bad = true;
      values = lens[k];
      state_name(t, p, k - 1, name, sizeof name);
    }
  }
  if (t->comm) {
    char why[256] = "";
    bool all_fine = dist_agree(t, !bad, "the state check", why, sizeof why);
    if (why[0]) return fail(err, err_size, "%s", why);
    if (!bad && !all_fine) {
      t->failed_together = true;
      return fail(err, err_size, "training diverged: after step %" PRId64 ", another rank's "
                  "state is not finite (that rank names it)", t->step);
    }
  }
  if (!bad) return true;
  t->failed_together = t->comm != NULL;
  record_failure(t, t->step, name, nan, inf, values);
  char what[320], hint[96];
  describe(name, nan, inf, values, what, sizeof what);
  lr_hint(t, name, hint, sizeof hint);
  return fail(err, err_size, "training diverged: after step %" PRId64 ", %s; %s", t->step, what,
              hint);
}

const TrainFailure *trainer_failure(const Trainer *t) { return &t->failure; }
bool trainer_step_skipped(const Trainer *t) { return t->skipped; }
const int64_t *trainer_skipped_steps(const Trainer *t, int64_t *n) {
  *n = t->nskipped;
  return t->skipped_steps;
}

// One step on the GPU with --on-nan skip: forward and backward, then the loss and the dense
// gradients are checked (on the device) before the optimizer is launched, or not. The next
// batch is uploaded while the update runs.
static bool gpu_step_checked(Trainer *t, double *loss, char *err, size_t err_size) {
  BatchTimes ignore;
  if (!t->gpu_prefetched && !gpu_batch_at(t, t->cursor, &ignore, err, err_size)) return false;
  t->gpu_prefetched = false;
  if (!gpu_session_launch_grads(t->gpu, err, err_size)) return false;
  t->flops += step_flops(t->ir, &t->batch, true);  // while the GPU runs, as in gpu_step
  for (int k = 0; k < t->ntasks; k++)
    memcpy(t->gpu_labels[k], task_labels(t, k), (size_t)t->B * sizeof(float));
  double l;
  if (!gpu_session_finish(t->gpu, &l, err, err_size)) return false;
  if (test_nan(t)) l = NAN;
  bool skip = false;
  if (!isfinite(l)) {
    if (!guard_step(t, "loss", isnan(l), !isnan(l), 1, err, err_size)) return false;
    skip = true;
  } else if (!gpu_guard_grads(t, &skip, err, err_size)) {
    return false;
  }
  if (!skip && !gpu_session_launch_update(t->gpu, t->step + 1, err, err_size)) return false;
  t->gpu_prefetched = gpu_batch_at(t, t->cursor + t->B, &ignore, err, err_size);
  double ignored;
  if (!skip && !gpu_session_finish(t->gpu, &ignored, err, err_size)) return false;
  if (skip) {
    skip_update(t);
    *loss = NAN;
    return true;
  }
  for (int k = 0; k < t->ntasks; k++) {
    const float *probs = gpu_session_probs(t->gpu, k);
    metrics_add(&t->window[k], probs, t->gpu_labels[k], t->B);
    metrics_add(&t->tail[k], probs, t->gpu_labels[k], t->B);
  }
  *loss = l;
  return true;
}

// One step on the GPU. The batch of this step was usually uploaded during the previous step;
// while this one runs, the next batch is made and uploaded (the copy stream overlaps it with
// compute), then the loss and the probabilities are read back.
// Turns the profile on for the steps of trainer_profile_range, off after them.
static bool set_profiling(Trainer *t, char *err, size_t err_size) {
  bool on = t->step >= t->profile_from && t->step < t->profile_from + t->profile_count;
  if (on == t->profiling) return true;
  t->profiling = on;
  return gpu_session_profile(t->gpu, on, err, err_size);
}

static bool gpu_step(Trainer *t, double *loss, char *err, size_t err_size) {
  double t0 = monotonic_seconds();
  BatchTimes first = {0}, next = {0};
  if (!t->gpu_prefetched && !gpu_batch_at(t, t->cursor, &first, err, err_size)) return false;
  if (!set_profiling(t, err, err_size)) return false;
  double t1 = monotonic_seconds();
  if (!gpu_session_launch(t->gpu, true, t->step + 1, err, err_size)) return false;
  double t2 = monotonic_seconds();
  // While the GPU runs (before the next batch replaces t->batch): the step's FLOPs (a walk
  // over every example's lengths, about 0.7 ms for gem_small: it left the GPU idle when it
  // ran before the launch) and the labels the metrics read after the step.
  if (!t->profiling) t->flops += step_flops(t->ir, &t->batch, true);
  for (int k = 0; k < t->ntasks; k++)
    memcpy(t->gpu_labels[k], task_labels(t, k), (size_t)t->B * sizeof(float));
  double t2b = monotonic_seconds();
  // The next batch: its making and staging ran on the pipeline's thread meanwhile (or run
  // here without one); its copy into a slot and its upload overlap this step.
  t->gpu_prefetched = gpu_batch_at(t, t->cursor + t->B, &next, err, err_size);
  double t3 = monotonic_seconds();
  double l;
  if (!gpu_session_finish(t->gpu, &l, err, err_size)) return false;
  double t4 = monotonic_seconds();
  if (!t->profiling) {
    t->times.steps++;
    t->times.launch_s += t2 - t1;
    t->times.prefetch_s += t3 - t2b;
    t->times.wait_s += t4 - t3;
    t->times.other_s += (t1 - t0) + (t2b - t2);
    t->times.device_s += 1e-3 * gpu_session_device_ms(t->gpu);
    // The batches this step took (the next one; this one too when it was not prefetched).
    t->times.batch_s += first.make_s + next.make_s;
    t->times.upload_s += first.stage_s + next.stage_s;
    t->times.batch_wait_s += first.wait_s + next.wait_s;
    t->times.copy_s += first.copy_s + next.copy_s;
  }
  if (test_nan(t)) l = NAN;
  // The update ran with the step; training stops here, and nothing is saved after it.
  if (!isfinite(l)) return guard_step(t, "loss", isnan(l), !isnan(l), 1, err, err_size);
  for (int k = 0; k < t->ntasks; k++) {
    const float *probs = gpu_session_probs(t->gpu, k);
    metrics_add(&t->window[k], probs, t->gpu_labels[k], t->B);
    metrics_add(&t->tail[k], probs, t->gpu_labels[k], t->B);
  }
  *loss = l;
  return true;
}

// --- distributed training ---------------------------------------------------------------
// One rank of a world (docs/distributed.md). Every rank makes the same global batch, trains
// on its token-balanced share of it, and agrees with the others on everything that decides
// what happens next: the loss, the divergence guard, the state's finiteness, a save's success.

static void dist_backward_hook(void *ctx, int node) {
  Trainer *t = ctx;
  dense_sync_node_done(t->dense, node);
}

// GPU ranks: after backward launch `launch` is enqueued, the buckets whose gradients are now
// final start on the comm stream, after an event recorded here on the compute stream.
static void dist_gpu_launch_hook(void *ctx, int launch) {
  Trainer *t = ctx;
  if (!dense_sync_due(t->dense, launch)) return;
  char err[256];
  // Without the event a bucket could be reduced before its gradients are final: stop.
  if (!gpu_session_record(t->gpu, err, sizeof err)) {
    fprintf(stderr, "gemc: rank %d: error: %s\n", comm_rank(t->comm), err);
    comm_abort(t->comm, 1);
  }
  dense_sync_node_done(t->dense, launch);
}

bool trainer_gpu_world_check(const Ir *ir, int world, DenseMode dense,
                             const TablePlacement *placement, bool artifact, char *err,
                             size_t err_size) {
  if (dense != DENSE_DATA_PARALLEL)
    return fail(err, err_size, "--dense %s is not built for GPU ranks (their optimizer kernels "
                "update whole parameters); use --dense data-parallel, or the CPU executor's "
                "ranks (--backend cpu)", dense_mode_name(dense));
  if (world == 1) return true;
  bool tables = false;
  for (int i = 0; i < ir->ntensors; i++) {
    const Tensor *p = &ir->tensors[i];
    if (p->kind != TENSOR_TABLE) continue;
    tables = tables || ir_grad_of(ir, i) >= 0;
    if (placement && placement[i] != PLACE_REPLICATE)
      return fail(err, err_size, "table %s is placed %s, and GPU ranks keep every table whole "
                  "(replicated) so far: use --shard replicate, or the CPU executor's ranks "
                  "(--backend cpu)", p->name, table_placement_name(placement[i]));
  }
  if (tables && artifact)
    return fail(err, err_size, "an artifact's kernels update the tables inside the backward "
                "pass, and %d GPU ranks must merge the tables' gradients first: train without "
                "--artifact (the kernels are then compiled for it)", world);
  return true;
}

// GPU ranks of several (or GEMC_TEST_DEFER_TABLES=1 with one): the plan's table updates wait
// for the rows merged across ranks (dist_gpu_tables).
static bool defers_tables(const Trainer *t) {
  return t->opt.cuda && t->opt.comm &&
         (comm_world(t->opt.comm) > 1 || t->ir->defer_table_updates);
}

// GPU ranks' dense buckets: each parameter's device gradient and the launch after which it is
// final.
static bool dist_gpu_dense(Trainer *t, const int *params, int np, int64_t bucket, char *err,
                           size_t err_size) {
  void **grads = xcalloc((size_t)np + 1, sizeof *grads);
  int *final = xcalloc((size_t)np + 1, sizeof *final);
  bool ok = true;
  for (int i = 0; ok && i < np; i++) {
    int64_t numel;
    if (!gpu_session_grad(t->gpu, params[i], &grads[i], &numel, &final[i]))
      ok = fail(err, err_size, "the gradient of %s is not an fp32 buffer on the GPU, which "
                "distributed training reduces", t->ir->tensors[params[i]].name);
  }
  if (ok) {
    t->dense = dense_sync_new_device(t->comm, t->ir, bucket, params, final, grads, np);
    gpu_session_set_launch_hook(t->gpu, dist_gpu_launch_hook, t);
  }
  free(grads);
  free(final);
  return ok;
}

static bool dist_setup(Trainer *t, char *err, size_t err_size) {
  Comm *c = t->opt.comm;
  int world = comm_world(c);
  if (t->gpu && !trainer_gpu_world_check(t->ir, world, t->opt.dense_mode, t->opt.placement,
                                         t->opt.artifact != NULL, err, err_size))
    return false;
  if (t->B < world)
    return fail(err, err_size, "the global batch of %" PRId64 " examples is smaller than the "
                "%d ranks: every rank needs at least one example (--batch)", t->B, world);
  t->comm = c;
  t->split = xcalloc((size_t)world + 1, sizeof *t->split);
  t->probs_all = xcalloc((size_t)t->B, sizeof *t->probs_all);
  t->labels_all = xcalloc((size_t)t->B, sizeof *t->labels_all);
  t->teacher_all = xcalloc((size_t)t->B, sizeof *t->teacher_all);
  t->teacher_mine = xcalloc((size_t)t->B, sizeof *t->teacher_mine);
  batch_alloc(&t->local, &t->schema, t->B);
  int *params = xcalloc((size_t)t->ir->ntensors + 1, sizeof *params);
  int np = dense_params(t->ir, params);
  t->dense_states = xcalloc((size_t)t->ntrained + 1, sizeof *t->dense_states);
  t->table_states = xcalloc((size_t)t->ir->ntensors + 1, sizeof *t->table_states);
  for (int i = 0, d = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    if (p->table) t->table_states[p->tensor] = &p->st;
    else if (d < np && params[d] == p->tensor) t->dense_states[d++] = &p->st;
  }
  int64_t bucket = bucket_bytes(t);
  bool ok = true;
  if (t->gpu) ok = dist_gpu_dense(t, params, np, bucket, err, err_size);
  else if (!t->dense)  // (ZeRO-3 made it before the executor, zero3_setup)
    t->dense = dense_sync_new(c, t->ir, t->opt.dense_mode, bucket, params, np);
  free(params);
  if (!ok) return false;
  if (!t->gpu && dense_sync_mode(t->dense) != DENSE_DATA_PARALLEL) {
    // ZeRO: each rank keeps the optimizer state of its own parts only.
    for (int i = 0; i < np; i++) {
      OptimState *st = t->dense_states[i];
      int64_t from = 0, n = dense_sync_owned(t->dense, i, &from);
      Optim cfg = st->cfg;
      int64_t step = st->step;
      optim_state_free(st);
      optim_state_init_part(st, cfg, n > 0 ? from : 0, n);
      st->step = step;
    }
  }
  // GPU ranks keep every table whole (in a world of one every placement is that).
  TablePlacement *all = NULL;
  if (!t->opt.placement || t->gpu) all = xcalloc((size_t)t->ir->ntensors + 1, sizeof *all);
  if (!t->tables) t->tables = table_sync_new(c, t->ir, &t->schema, all ? all : t->opt.placement);
  free(all);
  if (!t->gpu) cpu_exec_set_backward_hook(t->x, dist_backward_hook, t);
  return true;
}

bool trainer_distributed(const Trainer *t) { return t->comm != NULL; }

// A collective of a few values, timed as communication.
static bool dist_allreduce(Trainer *t, void *v, int64_t n, CommDtype d, const char *what,
                           char *err, size_t err_size) {
  double t0 = monotonic_seconds();
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = d, .send = v, .recv = v, .count = n,
                   .what = what};
  bool ok = comm_run(t->comm, &call, err, err_size);
  t->dist_comm_s += monotonic_seconds() - t0;
  return ok;
}

// Every rank's predictions of task k for the global batch, in example order.
// Every rank's share of a per-example array, in example order (all[B]).
static bool dist_gather(Trainer *t, const float *mine, float *all, const char *what, char *err,
                        size_t err_size) {
  int world = comm_world(t->comm);
  int64_t *counts = xcalloc((size_t)world, sizeof *counts);
  for (int r = 0; r < world; r++) counts[r] = t->split[r + 1] - t->split[r];
  double t0 = monotonic_seconds();
  CommCall call = {.kind = COMM_ALLGATHER, .dtype = COMM_F32, .send = mine, .recv = all,
                   .counts = counts, .what = what};
  bool ok = comm_run(t->comm, &call, err, err_size);
  t->dist_comm_s += monotonic_seconds() - t0;
  free(counts);
  return ok;
}

// Task k's predictions and labels of the whole batch, into probs_all and labels_all.
static bool dist_gather_probs(Trainer *t, int k, char *err, size_t err_size) {
  const float *mine = t->gpu ? gpu_session_probs(t->gpu, k) : cpu_exec_task_probs(t->x, k);
  return dist_gather(t, mine, t->probs_all, "predictions", err, err_size) &&
         dist_gather(t, t->local.values[t->label_feature[k]], t->labels_all, "labels", err,
                     err_size);
}

// The updates of a step whose gradients every rank now holds reduced.
static bool dist_apply(Trainer *t, char *err, size_t err_size) {
  bool zero = dense_sync_mode(t->dense) != DENSE_DATA_PARALLEL;
  for (int i = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    float *w = cpu_exec_data(t->x, p->tensor);
    if (p->table) {
      const int64_t *ids;
      const float *g;
      int64_t nrows;
      table_sync_grad(t->tables, p->tensor, &ids, &g, &nrows);
      int64_t nown;
      float *own = table_sync_own_rows(t->tables, p->tensor, &nown);
      int64_t *local = NULL;
      if (own) {  // this rank's rows, at their places in its own rows
        local = xcalloc((size_t)nrows + 1, sizeof *local);
        for (int64_t k = 0; k < nrows; k++)
          local[k] = table_sync_local_row(t->tables, p->tensor, ids[k]);
        w = own;
        ids = local;
      }
      if (ir_grad_of(t->ir, p->tensor) >= 0)
        optim_step_rows(&p->st, w, ids, g, nrows, t->ir->tensors[p->tensor].dtype);
      free(local);
    } else if (!zero) {
      const float *g = cpu_exec_grad(t->x, p->tensor, NULL, NULL);
      if (g) optim_step_dense(&p->st, w, g, p->numel);
    }
  }
  return !zero || dense_sync_update(t->dense, t->dense_states, err, err_size);
}

// The global batch of B examples from `first` of the stream, ahead of dist_forward: from a
// data file, the whole batch into t->batch; synthetic, only its lengths (every rank cuts the
// same shares from them, and makes only its own share).
static bool dist_batch_at(Trainer *t, int64_t first, bool eval, char *err, size_t err_size) {
  if (t->synth) {
    t->batch.B = t->B;
    synth_lengths(t->synth, first, &t->batch);
    return true;
  }
  if (eval) return datafile_read(t->reader, first, &t->batch, err, err_size);
  return training_batch_at(t, first, &t->batch, err, err_size);
}

// The forward pass of this rank's share of the global batch of dist_batch_at(first): the
// share is cut, made (synthetic) or copied, the rows of sharded tables it reads are fetched,
// and the global batch's mean loss is all-reduced into *loss. *share: this rank's examples
// over B.
// This rank's token-balanced share of the global batch of dist_batch_at(first), into t->local
// (made, when synthetic, or copied); *share: its examples over B.
static void dist_share(Trainer *t, int64_t stream_first, double *share) {
  int rank = comm_rank(t->comm), world = comm_world(t->comm);
  batch_split(&t->batch, world, t->split);
  int64_t first = t->split[rank], n = t->split[rank + 1] - first;
  t->local.B = n;
  if (t->synth) synth_batch(t->synth, stream_first + first, &t->local);
  else batch_copy(&t->schema, &t->local, 0, &t->batch, first, n);
  *share = (double)n / (double)t->batch.B;
}

static bool dist_forward(Trainer *t, int64_t stream_first, double *loss, double *share,
                         char *err, size_t err_size) {
  dist_share(t, stream_first, share);
  if (t->gpu) {  // an evaluation's forward pass
    double l = NAN;
    if (!gpu_session_set_batch(t->gpu, &t->local, err, err_size) ||
        !gpu_session_launch(t->gpu, false, t->step, err, err_size) ||
        !gpu_session_finish(t->gpu, &l, err, err_size))
      return false;
    *loss = *share * l;
    return dist_allreduce(t, loss, 1, COMM_F64, "the loss", err, err_size);
  }
  char reason[512];
  const Batch *bound;
  if (!table_sync_fetch(t->tables, t->x, &t->local, &bound, err, err_size)) return false;
  if (!cpu_exec_set_batch(t->x, bound, reason, sizeof reason))
    return fail(err, err_size, "the batch does not fit model %s: %s", t->ir->model, reason);
  *loss = *share * cpu_exec_forward(t->x);
  return zero3_pass_ok(t, err, err_size) &&
         dist_allreduce(t, loss, 1, COMM_F64, "the loss", err, err_size);
}

// The end of a distributed step on either backend: the loss history, the counters, the times.
static void dist_step_done(Trainer *t, double l, double start, double comm_before,
                           double tables_before) {
  push_loss(t, l);
  t->step++;
  t->cursor += t->B;
  double took = monotonic_seconds() - start;
  t->dist_comm_s += table_sync_seconds(t->tables) - tables_before +
                    dense_sync_wait_seconds(t->dense);
  t->dist_compute_s += took - (t->dist_comm_s - comm_before);
  t->grad_bytes_s += dense_sync_span_seconds(t->dense);
  t->dist_steps++;
  t->step_seconds += took;
  t->timed_steps++;
}

// The training metrics of a step that updated: every rank's predictions and labels.
static bool dist_metrics(Trainer *t, char *err, size_t err_size) {
  for (int k = 0; k < t->ntasks; k++) {
    if (!dist_gather_probs(t, k, err, err_size)) return false;
    metrics_add(&t->window[k], t->probs_all, t->labels_all, t->B);
    metrics_add(&t->tail[k], t->probs_all, t->labels_all, t->B);
  }
  return true;
}

// A GPU rank's share of the training batch of dist_batch_at(cursor), into t->local and onto
// the GPU: from the pipeline, which made and staged it on its thread (synthetic data), or cut
// and uploaded here.
static bool dist_gpu_share(Trainer *t, int64_t cursor, double *share, char *err,
                           size_t err_size) {
  if (!t->pipeline) {
    dist_share(t, cursor, share);
    return gpu_session_set_batch(t->gpu, &t->local, err, err_size);
  }
  int rank = comm_rank(t->comm), world = comm_world(t->comm);
  batch_split(&t->batch, world, t->split);
  double waited = 0;
  PipelineItem *it = pipeline_take(t->pipeline, cursor, &waited);
  t->times.batch_wait_s += waited;
  if (!it->ok) {
    fail(err, err_size, "%s", it->err);
    pipeline_release(t->pipeline, it);
    return false;
  }
  GEMC_ASSERT(it->batch.B == t->split[rank + 1] - t->split[rank]);
  Batch mine = t->local;  // the item keeps this one's storage for a later batch
  t->local = it->batch;
  it->batch = mine;
  *share = (double)t->local.B / (double)t->batch.B;
  bool ok = gpu_session_set_staged(t->gpu, &it->staged, err, err_size);
  pipeline_release(t->pipeline, it);
  return ok;
}

// Deferred table updates: each trained table's rows of this rank, read off the device, are
// summed across ranks (table_sync, as on CPU ranks: every rank gets every row, summed in rank
// order, each rank's rows scaled by its share) and written back for the plan's
// table_rows_apply launches.
static bool dist_gpu_tables(Trainer *t, double share, char *err, size_t err_size) {
  for (int i = 0; i < t->ntrained; i++) {
    const Trained *p = &t->trained[i];
    int rows = ir_grad_of(t->ir, p->tensor);
    if (!p->table || rows < 0) continue;
    int64_t *ids = NULL, n = 0, merged = 0;
    float *vals = NULL;
    const int64_t *mids;
    const float *mg;
    bool ok = gpu_session_read_rows(t->gpu, rows, &ids, &vals, &n, err, err_size) &&
              table_sync_reduce_rows(t->tables, p->tensor, ids, vals, n, share, err, err_size);
    if (ok) {
      table_sync_grad(t->tables, p->tensor, &mids, &mg, &merged);
      ok = gpu_session_write_rows(t->gpu, rows, mids, mg, merged, err, err_size);
    }
    free(ids);
    free(vals);
    if (!ok) return false;
  }
  return true;
}

// One step of a GPU rank. Forward and backward run on this rank's share; while the backward
// is enqueued, each bucket of dense gradients starts its all-reduce on the comm stream as soon
// as its last launch is (dist_gpu_launch_hook), so NCCL overlaps the rest of the backward.
// Then the loss is summed over ranks, the buckets are waited for, and the divergence guard
// looks at the loss and (--on-nan skip) at the reduced gradients, the same on every rank,
// before the optimizer launches. In a world of one the tables were updated inside the
// backward, as on one GPU; with several ranks their rows are merged first (dist_gpu_tables)
// and updated by the optimizer launches.
static bool dist_gpu_step(Trainer *t, double *loss, char *err, size_t err_size) {
  double start = monotonic_seconds(), comm_before = t->dist_comm_s;
  double tables_before = table_sync_seconds(t->tables);
  comm_set_step(t->comm, t->step + 1);
  comm_test_faults(t->comm);
  if (!dist_batch_at(t, t->cursor, false, err, err_size)) return false;
  double share, l = NAN;
  void *event = gpu_session_event(t->gpu, err, err_size);
  if (!event || !dist_gpu_share(t, t->cursor, &share, err, err_size)) return false;
  dense_sync_begin_device(t->dense, share, event);
  if (!gpu_session_launch_grads(t->gpu, err, err_size) ||
      !gpu_session_record(t->gpu, err, err_size))
    return false;
  t->flops += step_flops(t->ir, &t->local, true);  // while the GPU runs
  t->global_flops += step_flops(t->ir, &t->batch, true);
  if (!gpu_session_finish(t->gpu, &l, err, err_size)) return false;
  l *= share;
  if (!dist_allreduce(t, &l, 1, COMM_F64, "the loss", err, err_size) ||
      !dense_sync_finish(t->dense, err, err_size))
    return false;
  if (test_nan(t)) l = NAN;
  if (!isfinite(l)) {
    if (!guard_step(t, "loss", isnan(l), !isnan(l), 1, err, err_size)) return false;
    skip_update(t);
  } else if (t->opt.on_nan_skip > 0) {
    bool bad = false;
    if (!gpu_guard_grads(t, &bad, err, err_size)) return false;
    if (bad) skip_update(t);
  }
  if (t->skipped) {
    l = NAN;
  } else {
    t->skipped_in_row = 0;
    double ignored;
    if ((defers_tables(t) && !dist_gpu_tables(t, share, err, err_size)) ||
        !gpu_session_launch_update(t->gpu, t->step + 1, err, err_size) ||
        !gpu_session_finish(t->gpu, &ignored, err, err_size) || !dist_metrics(t, err, err_size))
      return false;
  }
  dist_step_done(t, l, start, comm_before, tables_before);
  *loss = l;
  return true;
}

static bool dist_step(Trainer *t, double *loss, char *err, size_t err_size) {
  if (t->gpu) return dist_gpu_step(t, loss, err, err_size);
  Comm *c = t->comm;
  double start = monotonic_seconds(), comm_before = t->dist_comm_s;
  double tables_before = table_sync_seconds(t->tables);
  comm_set_step(c, t->step + 1);
  comm_test_faults(c);
  if (!dist_batch_at(t, t->cursor, false, err, err_size)) return false;
  double l, share;
  if (!dist_forward(t, t->cursor, &l, &share, err, err_size)) return false;
  dense_sync_begin(t->dense, t->x, share);
  t->flops += step_flops(t->ir, &t->local, true);
  t->global_flops += step_flops(t->ir, &t->batch, true);
  if (test_nan(t)) l = NAN;
  if (!isfinite(l)) {
    if (!guard_step(t, "loss", isnan(l), !isnan(l), 1, err, err_size)) return false;
    skip_update(t);
  } else {
    cpu_exec_backward(t->x);
    if (!zero3_pass_ok(t, err, err_size)) return false;
    // The guard looks at each rank's own gradients; any rank's bad value stops every rank.
    char name[192] = "a gradient of another rank";
    int64_t bad[3] = {0, 0, 0};  // NaN, Inf, values
    if (t->opt.on_nan_skip > 0) {
      cpu_bad_grad(t, name, sizeof name, &bad[0], &bad[1], &bad[2]);
      if (!dist_allreduce(t, bad, 3, COMM_I64, "the divergence guard", err, err_size))
        return false;
    }
    if (!dense_sync_finish(t->dense, err, err_size) ||
        !table_sync_reduce(t->tables, t->x, share, err, err_size))
      return false;
    if (bad[0] + bad[1] > 0) {
      if (!guard_step(t, name, bad[0], bad[1], bad[2], err, err_size)) return false;
      skip_update(t);
    }
  }
  if (t->skipped) {
    l = NAN;
  } else {
    t->skipped_in_row = 0;
    if (!dist_apply(t, err, err_size) || !dist_metrics(t, err, err_size)) return false;
  }
  dist_step_done(t, l, start, comm_before, tables_before);
  *loss = l;
  return true;
}

// Every rank's answer to "did it go well?" combined: one rank's failure fails them all.
// Checkpoint writes and reads take as long as the disk does, and the lightest rank waits for
// the heaviest, so their agreements get an hour on top of --comm-timeout.
static bool dist_agree(Trainer *t, bool mine, const char *what, char *err, size_t err_size) {
  int64_t bad = mine ? 0 : 1;
  char why[256];
  bool disk = strstr(what, "checkpoint") != NULL;
  double t0 = monotonic_seconds();
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = COMM_I64, .send = &bad, .recv = &bad,
                   .count = 1, .what = what,
                   .timeout_s = disk ? comm_timeout(t->comm) + 3600 : 0};
  bool ok = comm_run(t->comm, &call, why, sizeof why);
  t->dist_comm_s += monotonic_seconds() - t0;
  if (!ok) return fail(err, err_size, "%s", why);
  return bad == 0;
}

bool trainer_dist_summary(Trainer *t, DistSummary *out, char *err, size_t err_size) {
  memset(out, 0, sizeof *out);
  if (!t->comm) return fail(err, err_size, "not a distributed run");
  int world = comm_world(t->comm);
  out->world = world;
  out->backend = comm_backend_name(t->comm);
  out->dense_mode = dense_mode_name(dense_sync_mode(t->dense));
  out->buckets = dense_sync_buckets(t->dense);
  int64_t steps = t->dist_steps > 0 ? t->dist_steps : 1;
  struct rusage ru;
  double rss_mib = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0;
  double mine[3] = {t->dist_compute_s / (double)steps, t->grad_bytes_s, rss_mib};
  double *all = xcalloc(3 * (size_t)world, sizeof *all);
  int64_t *twos = xcalloc((size_t)world, sizeof *twos);
  for (int r = 0; r < world; r++) twos[r] = 3;
  CommCall call = {.kind = COMM_ALLGATHER, .dtype = COMM_F64, .send = mine, .recv = all,
                   .counts = twos, .what = "the run's numbers"};
  bool ok = comm_run(t->comm, &call, err, err_size);
  double lo = all[0], hi = all[0];
  for (int r = 0; ok && r < world; r++) {
    if (all[3 * r] < lo) lo = all[3 * r];
    if (all[3 * r] > hi) hi = all[3 * r];
    if (all[3 * r + 2] > out->max_rss_mib) out->max_rss_mib = all[3 * r + 2];
  }
  free(all);
  free(twos);
  if (!ok) return false;
  double peak = trainer_peak_tflops(t) * 1e12;
  out->step_s = t->step_seconds / (double)steps;
  out->compute_s = mine[0];
  out->exposed_comm_s = out->step_s - out->compute_s;
  out->local_mfu = t->dist_compute_s > 0 && peak > 0 ? t->flops / t->dist_compute_s / peak : 0;
  out->e2e_mfu = t->step_seconds > 0 && peak > 0
                     ? t->global_flops / (t->step_seconds * world) / peak : 0;
  out->scaling_ratio = out->local_mfu > 0 ? out->e2e_mfu / out->local_mfu : 0;
  out->straggler_spread = lo > 0 ? hi / lo : 0;
  double bytes = 4.0 * (double)dense_sync_elements(t->dense) * (double)t->dist_steps;
  DenseMode mode = dense_sync_mode(t->dense);
  bool scatter = mode == DENSE_ZERO2 || mode == DENSE_ZERO3;  // each rank receives its part
  out->dense_collective = scatter ? "reduce-scatter" : "all-reduce";
  out->allreduce_gbps = t->grad_bytes_s > 0 ? bytes * (scatter ? 1.0 : 2.0) * (world - 1) /
                                                  world / t->grad_bytes_s / 1e9
                                            : 0;
  out->alltoall_gbps = table_sync_alltoall_gbps(t->tables);
  table_sync_describe(t->tables, out->placement, sizeof out->placement);
  return true;
}

bool trainer_step(Trainer *t, double *loss, char *err, size_t err_size) {
  double start = monotonic_seconds();
  t->skipped = false;
  if (t->comm) return dist_step(t, loss, err, err_size);
  if (t->gpu) {
    if (!(t->opt.on_nan_skip > 0 ? gpu_step_checked(t, loss, err, err_size)
                                 : gpu_step(t, loss, err, err_size)))
      return false;
    if (!t->skipped) t->skipped_in_row = 0;
    push_loss(t, *loss);
    t->step++;
    t->cursor += t->B;
    if (!t->profiling) {
      t->step_seconds += monotonic_seconds() - start;
      t->timed_steps++;
    }
    return true;
  }
  if (!next_training_batch(t, err, err_size) || !bind_batch(t, err, err_size)) return false;
  t->flops += step_flops(t->ir, &t->batch, true);
  double l = cpu_exec_forward(t->x);
  if (test_nan(t)) l = NAN;
  // The loss is checked before the backward pass and the update, so a step that stops or is
  // skipped leaves the state as the previous step left it.
  if (!isfinite(l)) {
    if (!guard_step(t, "loss", isnan(l), !isnan(l), 1, err, err_size)) return false;
    skip_update(t);
  } else {
    cpu_exec_backward(t->x);
    char name[192];
    int64_t nan = 0, inf = 0, values = 0;
    if (t->opt.on_nan_skip > 0 && cpu_bad_grad(t, name, sizeof name, &nan, &inf, &values)) {
      if (!guard_step(t, name, nan, inf, values, err, err_size)) return false;
      skip_update(t);
    }
  }
  if (t->skipped) {
    l = NAN;
  } else {
    t->skipped_in_row = 0;
    apply_optimizers(t);
    for (int k = 0; k < t->ntasks; k++) {
      const float *probs = cpu_exec_task_probs(t->x, k);
      metrics_add(&t->window[k], probs, task_labels(t, k), t->B);
      metrics_add(&t->tail[k], probs, task_labels(t, k), t->B);
    }
  }
  push_loss(t, l);
  t->step++;
  t->cursor += t->B;
  *loss = l;
  t->step_seconds += monotonic_seconds() - start;
  t->timed_steps++;
  return true;
}

// --- evaluation -------------------------------------------------------------------------

// One held-out batch on a rank: its share evaluated, every rank's predictions, labels and (on
// synthetic data) the teacher's probabilities gathered into the metrics.
static bool dist_eval_batch(Trainer *t, int64_t first, Metrics *model, Metrics *teacher,
                            double *loss_sum, char *err, size_t err_size) {
  double l = 0, share;
  if (!dist_batch_at(t, first, true, err, err_size) ||
      !dist_forward(t, first, &l, &share, err, err_size))
    return false;
  *loss_sum += l;
  for (int k = 0; k < t->ntasks; k++) {
    if (!dist_gather_probs(t, k, err, err_size)) return false;
    metrics_add(&model[k], t->probs_all, t->labels_all, t->B);
    if (!t->synth) continue;
    for (int64_t b = 0; b < t->local.B; b++)
      t->teacher_mine[b] =
          (float)synth_teacher_prob(t->synth, &t->local, b, t->label_feature[k]);
    if (!dist_gather(t, t->teacher_mine, t->teacher_all, "teacher probabilities", err,
                     err_size))
      return false;
    metrics_add(&teacher[k], t->teacher_all, t->labels_all, t->B);
  }
  return true;
}

bool trainer_eval(Trainer *t, EvalResult *out, char *err, size_t err_size) {
  Metrics *model = xcalloc((size_t)t->ntasks, sizeof *model);
  Metrics *teacher = xcalloc((size_t)t->ntasks, sizeof *teacher);
  float *teacher_probs = t->synth ? xcalloc((size_t)t->B, sizeof *teacher_probs) : NULL;
  double loss_sum = 0;
  int64_t nbatches = t->eval_count / t->B;
  bool ok = true;
  // The evaluation uses the data source itself: the producer rests meanwhile.
  if (t->pipeline) pipeline_pause(t->pipeline);
  for (int64_t i = 0; ok && i < nbatches; i++) {
    int64_t first = t->eval_first + i * t->B;
    if (t->comm) {
      ok = dist_eval_batch(t, first, model, teacher, &loss_sum, err, err_size);
      continue;
    }
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
    for (int k = 0; ok && k < t->ntasks; k++) {
      const float *probs = NULL;
      if (t->gpu) probs = gpu_session_probs(t->gpu, k);
      else probs = cpu_exec_task_probs(t->x, k);
      metrics_add(&model[k], probs, task_labels(t, k), t->B);
      if (!t->synth) continue;
      for (int64_t b = 0; b < t->B; b++)
        teacher_probs[b] = (float)synth_teacher_prob(t->synth, &t->batch, b, t->label_feature[k]);
      metrics_add(&teacher[k], teacher_probs, task_labels(t, k), t->B);
    }
  }
  if (t->pipeline) pipeline_resume(t->pipeline);
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
  int64_t *steps;       // [ntrained]: each optimizer's step, staged (validated on resume)
  // [ntrained][2]: a ZeRO part's AdamW moments as whole arrays (its part in place, zeros
  // elsewhere), which the whole checkpoint's entries point at; NULL for a state held whole.
  float *(*full)[2];
  int nfull;
} Entries;

static void add_entry(Entries *s, const char *kind, const char *name, void *data, size_t size,
                      CkptCheck check) {
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
  s->e[s->n++] = (CkptEntry){.name = at, .data = data, .size = size, .check = check};
}

static void entries_free(Entries *s) {
  for (int i = 0; i < s->nfull; i++) free(s->full[i][0]), free(s->full[i][1]);
  free(s->full);
  free(s->e);
  free(s->names);
  free(s->curve);
  free(s->steps);
}

// A dense parameter whose AdamW moments this rank holds only a ZeRO part of.
static bool zero_part(const Trained *p) {
  return !p->table && p->st.cfg.kind == OPTIM_ADAMW && (p->st.base != 0 || p->st.n != p->numel);
}

// After a resume read the whole moments into s->full: this rank's part into its state.
static void entries_take_parts(Trainer *t, const Entries *s) {
  for (int i = 0; i < s->nfull; i++) {
    OptimState *st = &t->trained[i].st;
    if (!s->full[i][0] || st->n == 0) continue;
    memcpy(st->m, s->full[i][0] + st->base, (size_t)st->n * sizeof(float));
    memcpy(st->v, s->full[i][1] + st->base, (size_t)st->n * sizeof(float));
  }
}

// Lists the state; `nsteps` and `ncurve` size the histories (the trainer's own when saving,
// the checkpoint's when loading into `losses` and s->curve).
// A windowed table (table_sync_windowed) is not held whole: a save writes it as parts (each
// rank its own rows, list_parts), and a resume takes this rank's rows from a whole entry of the
// file (info) if it has one (read_own_rows), and from the parts. `info`: the file a resume
// reads (NULL when saving): a table's whole entries are listed only where it has them, and a
// windowed table's and the parts (read by read_parts) without a buffer, so that they are
// checked but not read.
// A replicated table windowed with a sharded one (they share an id feature) owns all its
// rows, in id order, on every rank: it is saved whole, from them (whole_own).
static float *own_rows(const Trainer *t, const Trained *p, int64_t *nown) {
  *nown = 0;
  return p->table && t->tables ? table_sync_own_rows(t->tables, p->tensor, nown) : NULL;
}

static float *whole_own(const Trainer *t, const Trained *p) {
  int64_t nown;
  float *own = own_rows(t, p, &nown);
  return own && table_sync_placement(t->tables, p->tensor) == PLACE_REPLICATE ? own : NULL;
}

static bool file_has(const CkptInfo *info, const char *kind, const char *name) {
  char entry[4200];
  snprintf(entry, sizeof entry, "%s:%s", kind, name);
  return checkpoint_info_size(info, entry) >= 0;
}

static void list_entries(Trainer *t, Entries *s, double *losses, int64_t nsteps, int ncurve,
                         const CkptInfo *info) {
  memset(s, 0, sizeof *s);
  s->steps = xcalloc((size_t)t->ntrained + 1, sizeof *s->steps);
  s->full = xcalloc((size_t)t->ntrained + 1, sizeof *s->full);
  s->nfull = t->ntrained;
  for (int i = 0; i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    const char *name = t->ir->tensors[p->tensor].name;
    size_t bytes = (size_t)p->st.n * sizeof(float);
    int64_t nown;
    bool windowed = own_rows(t, p, &nown) != NULL, z3 = zero3_param(t, p);
    float *all_own = whole_own(t, p);  // (saved whole, though windowed)
    // A ZeRO-3 parameter, like a windowed table, is saved as parts; one whole in the file is
    // checked here and this rank's part of it read by read_own_part.
    bool whole = info ? file_has(info, p->table ? "table" : "param", name)
                      : (!windowed || all_own) && !z3;
    if (whole)
      add_entry(s, p->table ? "table" : "param", name,
                info && (windowed || z3) ? NULL
                : all_own                ? all_own
                                         : cpu_exec_data(t->x, p->tensor),
                (size_t)p->numel * sizeof(float), CKPT_FINITE);
    s->steps[i] = p->st.step;
    add_entry(s, "optim.step", name, &s->steps[i], sizeof s->steps[i], CKPT_ANY);
    float *m = p->st.m, *v = p->st.v;
    bool in_parts = info && !p->table && !file_has(info, "adamw.m", name);  // read_parts
    if (z3) {
      if (info && p->st.cfg.kind == OPTIM_ADAMW && !in_parts) {  // whole: read_own_part
        add_entry(s, "adamw.m", name, NULL, (size_t)p->numel * sizeof(float), CKPT_FINITE);
        add_entry(s, "adamw.v", name, NULL, (size_t)p->numel * sizeof(float),
                  CKPT_FINITE_NONNEG);
      }
      m = v = NULL;
    } else if (zero_part(p)) {  // the checkpoint holds whole moments: this rank's part, zeros around
      bytes = (size_t)p->numel * sizeof(float);
      for (int k = 0; k < 2; k++) {
        s->full[i][k] = xcalloc((size_t)p->numel + 1, sizeof(float));
        const float *held = k == 0 ? p->st.m : p->st.v;
        if (held) memcpy(s->full[i][k] + p->st.base, held, (size_t)p->st.n * sizeof(float));
      }
      m = s->full[i][0], v = s->full[i][1];
    }
    if (in_parts) m = v = NULL;
    if (m) add_entry(s, "adamw.m", name, m, bytes, CKPT_FINITE);
    if (v) add_entry(s, "adamw.v", name, v, bytes, CKPT_FINITE_NONNEG);
    // (a windowed table may hold no rows here, and then has no sums either)
    // A table whole in the file must have its sums there too (checkpoint_read refuses it
    // otherwise); one in parts has them in its parts.
    if (info ? p->st.cfg.kind == OPTIM_ROWWISE_ADAGRAD &&
                   (file_has(info, "adagrad.rowsum", name) || (p->table && whole))
             : p->st.rowsum && (!windowed || all_own))
      add_entry(s, "adagrad.rowsum", name, info && windowed ? NULL : p->st.rowsum,
                (size_t)p->rows * sizeof(float), CKPT_FINITE_NONNEG);
  }
  for (int k = 0; info && k < info->nentries; k++) {
    const char *e = info->names[k], *colon = strchr(e, ':');
    if (strncmp(e, "part.", 5) != 0 || !colon || colon - e >= 64) continue;
    char kind[64];
    snprintf(kind, sizeof kind, "%.*s", (int)(colon - e), e);
    add_entry(s, kind, colon + 1, NULL, info->sizes[k], CKPT_ANY);
  }
  add_entry(s, "train.counters", "", s->counters, sizeof s->counters, CKPT_ANY);
  add_entry(s, "train.losses", "", losses, (size_t)nsteps * sizeof *losses, CKPT_ANY);
  s->curve = xcalloc((size_t)ncurve * 6, sizeof *s->curve);
  add_entry(s, "train.curve", "", s->curve, (size_t)ncurve * 6 * sizeof *s->curve, CKPT_ANY);
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

// The entries of a whole checkpoint, counters and curve filled in.
static void whole_entries(Trainer *t, Entries *s) {
  list_entries(t, s, t->losses, t->step, t->ncurve, NULL);
  s->counters[0] = t->cursor;
  s->counters[1] = t->B;
  s->counters[2] = (int64_t)t->opt.seed;
  for (int i = 0; i < t->ncurve; i++) {
    const CurvePoint *p = &t->curve[i];
    double row[6] = {(double)p->step, p->train_loss, p->eval_loss, p->train_ne, p->eval_ne,
                     p->eval_auc};
    memcpy(s->curve + 6 * i, row, sizeof row);
  }
}

static bool dist_save(Trainer *t, const char *dir, char *err, size_t err_size);

bool trainer_save(Trainer *t, const char *dir, char *err, size_t err_size) {
  // The guard: a state that is not finite is never written; the last checkpoint stays.
  char why[768];
  if (!trainer_check_finite(t, why, sizeof why))
    return fail(err, err_size, "%s; not saved: the checkpoint in %s is left as it was", why,
                dir);
  if (t->gpu && !gpu_state_to_host(t, err, err_size)) return false;
  // Distributed: each rank writes its shard, then rank 0 the manifest (dist_save), and every
  // rank knows how it went.
  if (t->comm) {
    bool ok = dist_save(t, dir, err, err_size);
    if (!ok) t->failed_together = true;
    return ok;
  }
  Entries s;
  whole_entries(t, &s);
  bool ok = checkpoint_save(dir, t->ir->model, t->key, t->step, s.e, s.n, err, err_size);
  entries_free(&s);
  if (ok) checkpoint_set_remove(dir);  // a distributed checkpoint there is replaced
  return ok;
}

// --- distributed checkpoints --------------------------------------------------------------
// Rank 0's shard is a whole checkpoint's entries (its copies of other ranks' parts are stale
// and are overwritten on resume); rank r's holds only the parts it owns: "part.ids:T",
// "part.table:T" and "part.adagrad.rowsum:T" for a sharded table T, "part.range:P" (from,
// count), "part.adamw.m:P" and "part.adamw.v:P" for a ZeRO parameter P, and "part.param:P"
// (the values) for a ZeRO-3 one, which every rank writes, rank 0 included. Each part names
// what it covers, so any world size can put the state back together (resharding).

// The buffers of a shard's entries, freed with it.
typedef struct Parts {
  Entries s;
  void **owned;
  int nowned, cap;
} Parts;

static void *parts_alloc(Parts *p, size_t bytes) {
  if (p->nowned == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 16;
    p->owned = xrealloc(p->owned, (size_t)p->cap * sizeof *p->owned);
  }
  return p->owned[p->nowned++] = xcalloc(bytes + 1, 1);
}

static void parts_free(Parts *p) {
  for (int i = 0; i < p->nowned; i++) free(p->owned[i]);
  free(p->owned);
  entries_free(&p->s);
}

// The parts this rank owns into p->s (added to what is there): every one, or (rank 0, whose
// shard holds the rest whole) only those of windowed tables and ZeRO-3 parameters.
static void list_parts(Trainer *t, Parts *p, bool windowed_only) {
  int rank = comm_rank(t->comm), di = 0;
  for (int i = 0; i < t->ntrained; i++) {
    Trained *q = &t->trained[i];
    const char *name = t->ir->tensors[q->tensor].name;
    int64_t nown;
    float *own = own_rows(t, q, &nown);
    if (q->table && (own || !windowed_only)) {
      int64_t n = table_sync_owned_ids(t->tables, q->tensor, rank, NULL);
      if (n == 0) continue;
      int64_t *ids = parts_alloc(p, (size_t)n * sizeof *ids);
      table_sync_owned_ids(t->tables, q->tensor, rank, ids);
      // A windowed table's own rows are its owned ids' rows in order (table_sync_local_row).
      float *rows = own, *sums = own ? q->st.rowsum : NULL;
      if (!own) {
        rows = parts_alloc(p, (size_t)(n * q->dim) * sizeof *rows);
        const float *w = cpu_exec_data(t->x, q->tensor);
        for (int64_t k = 0; k < n; k++)
          memcpy(rows + k * q->dim, w + ids[k] * q->dim, (size_t)q->dim * sizeof *rows);
      }
      add_entry(&p->s, "part.ids", name, ids, (size_t)n * sizeof *ids, CKPT_ANY);
      add_entry(&p->s, "part.table", name, rows, (size_t)(n * q->dim) * sizeof *rows,
                CKPT_FINITE);
      if (q->st.rowsum) {
        if (!sums) {
          sums = parts_alloc(p, (size_t)n * sizeof *sums);
          for (int64_t k = 0; k < n; k++) sums[k] = q->st.rowsum[ids[k]];
        }
        add_entry(&p->s, "part.adagrad.rowsum", name, sums, (size_t)n * sizeof *sums,
                  CKPT_FINITE_NONNEG);
      }
    } else if (!q->table && ir_grad_of(t->ir, q->tensor) >= 0) {
      // ZeRO-1/2: the moments' part (rank 0's shard holds the rest whole); ZeRO-3: the
      // values' part too, from every rank.
      bool z3 = zero3_param(t, q);
      int64_t from, n = dense_sync_owned(t->dense, di++, &from);
      if ((windowed_only && !z3) || n == 0 || (!q->st.m && !z3)) continue;
      int64_t *range = parts_alloc(p, 2 * sizeof *range);
      range[0] = from;
      range[1] = n;
      add_entry(&p->s, "part.range", name, range, 2 * sizeof *range, CKPT_ANY);
      if (z3) {
        int64_t sfrom, sn;
        float *part = dense_sync_shard(t->dense, t->dense_index[q->tensor], &sfrom, &sn);
        add_entry(&p->s, "part.param", name, part, (size_t)n * sizeof(float), CKPT_FINITE);
      }
      if (!q->st.m) continue;
      add_entry(&p->s, "part.adamw.m", name, q->st.m + (from - q->st.base),
                (size_t)n * sizeof(float), CKPT_FINITE);
      add_entry(&p->s, "part.adamw.v", name, q->st.v + (from - q->st.base),
                (size_t)n * sizeof(float), CKPT_FINITE_NONNEG);
    }
  }
}

static bool dist_save(Trainer *t, const char *dir, char *err, size_t err_size) {
  int rank = comm_rank(t->comm), world = comm_world(t->comm);
  // The save's id, rank 0's draw: the shards of two saves never share a name.
  int64_t id = 0;
  if (rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = (int64_t)fnv1a64(FNV1A64_INIT, &ts, sizeof ts) ^ (int64_t)getpid() ^ t->step;
  }
  if (!dist_allreduce(t, &id, 1, COMM_I64, "the checkpoint's id", err, err_size)) return false;
  CkptSet set = {.step = t->step, .id = (uint64_t)id, .world = world};
  char file[96];
  checkpoint_shard_file(file, sizeof file, &set, rank);
  bool ok;
  if (rank == 0) {
    Parts p;
    memset(&p, 0, sizeof p);
    whole_entries(t, &p.s);
    list_parts(t, &p, true);
    ok = checkpoint_save_named(dir, file, t->ir->model, t->key, t->step, p.s.e, p.s.n, err,
                               err_size);
    parts_free(&p);
  } else {
    // No history here: the header's step is 0 and the step is an entry (as in the manifest).
    Parts p;
    memset(&p, 0, sizeof p);
    list_parts(t, &p, false);
    int64_t step = t->step;
    add_entry(&p.s, "set.step", "", &step, sizeof step, CKPT_ANY);
    ok = checkpoint_save_named(dir, file, t->ir->model, t->key, 0, p.s.e, p.s.n, err,
                               err_size);
    parts_free(&p);
  }
  char agree_err[256];
  if (!dist_agree(t, ok, "the checkpoint's shards", agree_err, sizeof agree_err))
    return ok ? fail(err, err_size, "another rank could not write its shard of the checkpoint "
                     "in %s (that rank names why); the previous checkpoint stays", dir)
              : false;
  // Test hook: GEMC_TEST_CKPT_NO_MANIFEST=1 stops before the manifest, as a crash there would.
  const char *hook = getenv("GEMC_TEST_CKPT_NO_MANIFEST");
  bool commit = !(hook && strcmp(hook, "1") == 0);
  if (rank == 0 && commit)
    ok = checkpoint_set_commit(dir, t->ir->model, t->key, &set, err, err_size);
  if (!dist_agree(t, ok, "the checkpoint's manifest", agree_err, sizeof agree_err) && ok)
    return fail(err, err_size, "rank 0 could not write the checkpoint's manifest in %s", dir);
  return ok;
}

// One shard's "part.range:P" of dense parameter q (trained[qi]): its AdamW moments and, from
// a ZeRO-3 run, its values ("part.param:P"). A ZeRO-3 rank takes the elements of its own part
// (in slices of the file's part), any other rank the whole range. covered/mcovered count the
// values' and the moments' elements put in place, seen[qi] marks each (NULL: the values were
// whole in the file).
static bool read_range_part(Trainer *t, const char *dir, const char *file, CkptFile *f,
                            const CkptInfo *info, const Entries *s, Trained *q, int qi,
                            int64_t *covered, int64_t *mcovered, unsigned char **seen,
                            char *err, size_t err_size) {
  const char *name = t->ir->tensors[q->tensor].name;
  char e[4200], pe[4200], me[4200], ve[4200];
  snprintf(e, sizeof e, "part.range:%s", name);
  snprintf(pe, sizeof pe, "part.param:%s", name);
  snprintf(me, sizeof me, "part.adamw.m:%s", name);
  snprintf(ve, sizeof ve, "part.adamw.v:%s", name);
  int64_t range[2] = {0, 0};
  if (!checkpoint_read_entry(f, e, range, sizeof range, err, err_size)) return false;
  bool values = checkpoint_info_size(info, pe) >= 0;
  bool moments = checkpoint_info_size(info, me) >= 0 || checkpoint_info_size(info, ve) >= 0;
  bool fits = range[0] >= 0 && range[1] > 0 && range[0] <= q->numel &&
              range[1] <= q->numel - range[0];
  int64_t bytes = fits ? range[1] * (int64_t)sizeof(float) : 0;
  if (!fits || (values && checkpoint_info_size(info, pe) != bytes) ||
      (moments && (checkpoint_info_size(info, me) != bytes ||
                   checkpoint_info_size(info, ve) != bytes)) ||
      (!values && !moments))
    return fail(err, err_size, "%s/%s is corrupt: its part of '%s' (%" PRId64 " elements from "
                "element %" PRId64 ", of %" PRId64 ") does not match its values and moments",
                dir, file, name, range[1], range[0], q->numel);
  // Where the part's elements go: this rank's ZeRO-3 part, or the whole parameter.
  int64_t lo = 0, n = q->numel;
  float *w = NULL, *m = q->st.m, *v = q->st.v;
  if (zero3_param(t, q)) {
    w = dense_sync_shard(t->dense, t->dense_index[q->tensor], &lo, &n);
  } else {
    w = cpu_exec_data(t->x, q->tensor);
    // The whole moments: staged ones for a ZeRO-1/2 part (entries_take_parts keeps its part).
    if (s->full[qi][0]) m = s->full[qi][0], v = s->full[qi][1];
  }
  int64_t a = range[0] > lo ? range[0] : lo;
  int64_t b = range[0] + range[1] < lo + n ? range[0] + range[1] : lo + n;
  if (values && !seen[qi]) values = false;  // whole in the file, read already
  if (moments && !m) moments = false;        // this run keeps none (another optimizer)
  enum { SLICE = 4096 };
  float buf[3][SLICE];
  bool ok = true;
  for (int64_t at = a; ok && at < b; at += SLICE) {
    int64_t k = b - at < SLICE ? b - at : SLICE;
    uint64_t off = (uint64_t)(at - range[0]) * sizeof(float);
    ok = (!values || checkpoint_read_slice(f, pe, off, buf[0], (size_t)k * sizeof(float), err,
                                           err_size)) &&
         (!moments ||
          (checkpoint_read_slice(f, me, off, buf[1], (size_t)k * sizeof(float), err,
                                 err_size) &&
           checkpoint_read_slice(f, ve, off, buf[2], (size_t)k * sizeof(float), err,
                                 err_size)));
    for (int64_t j = 0; ok && j < k; j++) {
      int64_t el = at + j - lo;  // the element's place here
      bool finite = (!values || isfinite(buf[0][j])) &&
                    (!moments || (isfinite(buf[1][j]) && isfinite(buf[2][j]) && buf[2][j] >= 0));
      if (!finite || (values && seen[qi][el]))
        ok = fail(err, err_size, "%s/%s is corrupt: element %" PRId64 " of '%s' %s", dir, file,
                  at + j, name,
                  finite ? "is in two parts"
                         : "holds a value that is not finite (or a negative second moment)");
      if (!ok) break;
      if (values) {
        seen[qi][el] = 1;
        w[el] = buf[0][j];
        covered[qi]++;
      }
      if (moments) {
        m[el] = buf[1][j];
        v[el] = buf[2][j];
        mcovered[qi]++;
      }
    }
  }
  return ok;
}

// Puts the parts of shards 1 .. world - 1 of the set over the state read from shard 0.
// covered[i]: rows of trained table i put in place (counted up); seen[i][row]: that row was
// (a row in two parts is refused).
static bool read_parts(Trainer *t, const char *dir, const CkptSet *set, const Entries *s,
                       int64_t *covered, int64_t *mcovered, unsigned char **seen, char *err,
                       size_t err_size) {
  bool ok = true;
  for (int r = 0; ok && r < set->world; r++) {  // shard 0 has parts of windowed tables
    char file[96];
    checkpoint_shard_file(file, sizeof file, set, r);
    CkptInfo info;
    CkptFile *f = checkpoint_open_named(dir, file, &info, err, err_size);
    if (!f) return false;
    int64_t step = -1;
    if (r == 0) step = set->step;  // shard 0's step is its header's, checked before
    else ok = checkpoint_read_entry(f, "set.step", &step, sizeof step, err, err_size);
    if (ok && (info.model_key != t->key || step != set->step))
      ok = fail(err, err_size, "%s/%s belongs to another model or step than its manifest; "
                "refused", dir, file);
    for (int k = 0; ok && k < info.nentries; k++) {
      const char *e = info.names[k], *colon = strchr(e, ':');
      bool ids_entry = colon && strncmp(e, "part.ids:", 9) == 0;
      bool range_entry = colon && strncmp(e, "part.range:", 11) == 0;
      if (!ids_entry && !range_entry) continue;  // the data entries are read with them
      int tensor = ir_find_tensor(t->ir, colon + 1);
      Trained *q = NULL;
      int qi = -1;
      for (int i = 0; tensor >= 0 && i < t->ntrained; i++)
        if (t->trained[i].tensor == tensor) q = &t->trained[i], qi = i;
      if (!q || q->table != ids_entry) {
        ok = fail(err, err_size, "%s/%s has a part of '%s', which this model has no %s of; "
                  "refused", dir, file, colon + 1, ids_entry ? "table" : "parameter");
        break;
      }
      if (ids_entry) {
        // In slices of ids, so that no part is ever whole in memory (a table-wise part is the
        // whole table); a slice none of whose rows this rank holds is not read.
        int64_t n = (int64_t)(info.sizes[k] / sizeof(int64_t));
        char tname[256], sname[256];
        snprintf(tname, sizeof tname, "part.table:%s", colon + 1);
        snprintf(sname, sizeof sname, "part.adagrad.rowsum:%s", colon + 1);
        bool with_sums = q->st.cfg.kind == OPTIM_ROWWISE_ADAGRAD;
        if (info.sizes[k] % sizeof(int64_t) != 0 ||
            checkpoint_info_size(&info, tname) != n * q->dim * (int64_t)sizeof(float) ||
            (with_sums && checkpoint_info_size(&info, sname) != n * (int64_t)sizeof(float)))
          ok = fail(err, err_size, "%s/%s is corrupt: the ids, rows and sums of its part of "
                    "table '%s' do not match", dir, file, colon + 1);
        int64_t nown;
        float *own = own_rows(t, q, &nown);
        float *w = own ? own : cpu_exec_data(t->x, q->tensor);
        enum { SLICE = 1024 };
        int64_t ids[SLICE];
        float sums[SLICE];
        float *rows = xcalloc((size_t)(SLICE * q->dim) + 1, sizeof *rows);
        for (int64_t from = 0; ok && from < n; from += SLICE) {
          int64_t m = n - from < SLICE ? n - from : SLICE, mine = 0;
          ok = checkpoint_read_slice(f, e, (uint64_t)from * sizeof *ids, ids,
                                     (size_t)m * sizeof *ids, err, err_size);
          for (int64_t i = 0; ok && i < m; i++) {
            if (ids[i] < 0 || ids[i] >= q->rows)
              ok = fail(err, err_size, "%s/%s is corrupt: row %" PRId64 " of table '%s', which "
                        "has %" PRId64, dir, file, ids[i], colon + 1, q->rows);
            else mine += !own || table_sync_local_row(t->tables, q->tensor, ids[i]) >= 0;
          }
          if (!ok || mine == 0) continue;
          ok = checkpoint_read_slice(f, tname, (uint64_t)(from * q->dim) * sizeof(float), rows,
                                     (size_t)(m * q->dim) * sizeof(float), err, err_size) &&
               (!with_sums ||
                checkpoint_read_slice(f, sname, (uint64_t)from * sizeof(float), sums,
                                      (size_t)m * sizeof(float), err, err_size));
          for (int64_t i = 0; ok && i < m; i++) {
            // A windowed table takes the rows this rank owns and leaves the rest to theirs.
            int64_t row = own ? table_sync_local_row(t->tables, q->tensor, ids[i]) : ids[i];
            if (row < 0) continue;
            bool finite = !with_sums || (isfinite(sums[i]) && sums[i] >= 0);
            for (int64_t d = 0; d < q->dim; d++) finite = finite && isfinite(rows[i * q->dim + d]);
            if (seen[qi][row] || !finite) {
              ok = fail(err, err_size, "%s/%s is corrupt: row %" PRId64 " of table '%s' %s", dir,
                        file, ids[i], colon + 1,
                        seen[qi][row] ? "is in two parts" : "holds a value that is not finite");
              break;
            }
            seen[qi][row] = 1;
            memcpy(w + row * q->dim, rows + i * q->dim, (size_t)q->dim * sizeof *rows);
            if (q->st.rowsum) q->st.rowsum[row] = sums[i];
            covered[qi]++;
          }
        }
        free(rows);
      } else {
        ok = read_range_part(t, dir, file, f, &info, s, q, qi, covered, mcovered, seen, err,
                             err_size);
      }
    }
    checkpoint_close(f);
    checkpoint_info_free(&info);
  }
  return ok;
}

// The largest data cursor a checkpoint of `nsteps` steps can hold: every step consumed at most
// the largest batch, and the synthetic training stream stays far below its held-out examples.
static int64_t max_cursor(int64_t nsteps) {
  const int64_t max_batch = (int64_t)1 << 24, cap = SYNTH_EVAL_FIRST / 4;
  return nsteps > cap / max_batch ? cap : nsteps * max_batch;
}

// Checks the small fields of an open checkpoint (step, counters, each optimizer's step, the
// histories' sizes) before anything is loaded; sets *ncurve.
static bool resume_validate(Trainer *t, CkptFile *f, const CkptInfo *info, int *ncurve,
                            char *err, size_t err_size) {
  const char *path = checkpoint_path(f);
  int64_t nsteps = info->step;
  int64_t curve_bytes = checkpoint_info_size(info, "train.curve");
  int64_t loss_bytes = checkpoint_info_size(info, "train.losses");
  const int64_t row = 6 * (int64_t)sizeof(double);
  if (nsteps < 0 || nsteps > INT64_MAX / 8 ||
      (loss_bytes >= 0 && loss_bytes != nsteps * (int64_t)sizeof(double)) ||
      curve_bytes % row != 0 || curve_bytes / row > INT32_MAX)
    return fail(err, err_size, "checkpoint %s is corrupt: its histories do not match its "
                "step count", path);
  *ncurve = curve_bytes > 0 ? (int)(curve_bytes / row) : 0;
  int64_t counters[3];
  if (!checkpoint_read_entry(f, "train.counters", counters, sizeof counters, err, err_size))
    return false;
  int64_t cap = max_cursor(nsteps);
  if (counters[0] < 0 || counters[0] > cap)
    return fail(err, err_size, "checkpoint %s is corrupt: its data cursor %" PRId64 " is out "
                "of range (0 to %" PRId64 " after %" PRId64 " steps)", path, counters[0], cap,
                nsteps);
  if (counters[1] < 1 || counters[1] > ((int64_t)1 << 24))
    return fail(err, err_size, "checkpoint %s is corrupt: its batch size %" PRId64 " is out "
                "of range (1 to %d)", path, counters[1], 1 << 24);
  for (int i = 0; i < t->ntrained; i++) {
    const char *name = t->ir->tensors[t->trained[i].tensor].name;
    char entry[4200];
    snprintf(entry, sizeof entry, "optim.step:%s", name);
    int64_t v;
    if (!checkpoint_read_entry(f, entry, &v, sizeof v, err, err_size)) return false;
    if (v < 0 || v > nsteps)
      return fail(err, err_size, "checkpoint %s is corrupt: entry '%s' says %" PRId64 " "
                  "optimizer steps, out of range (0 to the checkpoint's %" PRId64 ")", path,
                  entry, v, nsteps);
  }
  return true;
}

// A windowed table's own rows (and Adagrad sums) from the file's whole entries, in slices of
// rows, so that the whole table is never in memory (nothing to do for any other table: its
// whole entries were read into it).
static bool read_own_rows(Trainer *t, CkptFile *f, Trained *p, char *err, size_t err_size) {
  int64_t nown;
  float *own = own_rows(t, p, &nown);
  if (!own) return true;
  const char *name = t->ir->tensors[p->tensor].name;
  char table[4200], sums[4200];
  snprintf(table, sizeof table, "table:%s", name);
  snprintf(sums, sizeof sums, "adagrad.rowsum:%s", name);
  enum { SLICE = 1024 };
  float *rows = xcalloc((size_t)(SLICE * p->dim) + 1, sizeof *rows);
  float rowsum[SLICE];
  bool ok = true;
  for (int64_t from = 0; ok && from < p->rows; from += SLICE) {
    int64_t n = p->rows - from < SLICE ? p->rows - from : SLICE, mine = 0;
    for (int64_t i = 0; i < n; i++) mine += table_sync_local_row(t->tables, p->tensor, from + i) >= 0;
    if (mine == 0) continue;  // a table-wise table this rank does not hold: nothing to read
    ok = checkpoint_read_slice(f, table, (uint64_t)(from * p->dim) * sizeof(float), rows,
                               (size_t)(n * p->dim) * sizeof(float), err, err_size) &&
         (!p->st.rowsum || checkpoint_read_slice(f, sums, (uint64_t)from * sizeof(float), rowsum,
                                                 (size_t)n * sizeof(float), err, err_size));
    for (int64_t i = 0; ok && i < n; i++) {
      int64_t row = table_sync_local_row(t->tables, p->tensor, from + i);
      if (row < 0) continue;
      memcpy(own + row * p->dim, rows + i * p->dim, (size_t)p->dim * sizeof *rows);
      if (p->st.rowsum) p->st.rowsum[row] = rowsum[i];
    }
  }
  free(rows);
  return ok;
}

// A ZeRO-3 parameter's part (values, AdamW moments) from the file's whole entries (checked
// by checkpoint_read), read as slices: the whole parameter is never in memory.
static bool read_own_part(Trainer *t, CkptFile *f, const CkptInfo *info, Trained *p,
                          char *err, size_t err_size) {
  const char *name = t->ir->tensors[p->tensor].name;
  int64_t from, n;
  float *part = dense_sync_shard(t->dense, t->dense_index[p->tensor], &from, &n);
  if (!part) return true;
  char e[4200];
  snprintf(e, sizeof e, "param:%s", name);
  bool ok = checkpoint_read_slice(f, e, (uint64_t)from * sizeof(float), part,
                                  (size_t)n * sizeof(float), err, err_size);
  if (ok && p->st.m && file_has(info, "adamw.m", name)) {
    snprintf(e, sizeof e, "adamw.m:%s", name);
    ok = checkpoint_read_slice(f, e, (uint64_t)from * sizeof(float), p->st.m,
                               (size_t)n * sizeof(float), err, err_size);
    snprintf(e, sizeof e, "adamw.v:%s", name);
    ok = ok && checkpoint_read_slice(f, e, (uint64_t)from * sizeof(float), p->st.v,
                                     (size_t)n * sizeof(float), err, err_size);
  }
  return ok;
}

// Reads what checkpoint_set_find chose: DIR/checkpoint.gemc (kind 0) or the set (kind 1).
static bool resume_read(Trainer *t, const char *dir, int kind, const CkptSet *set, char *err,
                        size_t err_size) {
  // One open file for the sizes, the checks and the data: a save that renames a new
  // checkpoint in meanwhile does not mix two files.
  char file[96] = CHECKPOINT_FILE;
  if (kind == 1) checkpoint_shard_file(file, sizeof file, set, 0);
  CkptInfo info;
  CkptFile *f = checkpoint_open_named(dir, file, &info, err, err_size);
  if (!f) return false;
  if (kind == 1 && info.step != set->step) {
    fail(err, err_size, "%s/%s is at step %" PRId64 ", its manifest says %" PRId64 ": refused",
         dir, file, info.step, set->step);
    checkpoint_info_free(&info);
    checkpoint_close(f);
    return false;
  }
  int64_t nsteps = info.step;
  int ncurve = 0;
  bool ok = resume_validate(t, f, &info, &ncurve, err, err_size);
  if (!ok) {
    checkpoint_info_free(&info);
    checkpoint_close(f);
    return false;
  }

  double *losses = xcalloc((size_t)nsteps, sizeof *losses);
  Entries s;
  list_entries(t, &s, losses, nsteps, ncurve, &info);
  // Which tables and parameters (and AdamW moments) the file holds whole; the others come from
  // parts, which must cover what this rank holds of them: rows of a table, elements of a
  // parameter (covered, seen; mcovered for the moments).
  bool *whole = xcalloc((size_t)t->ntrained + 1, sizeof *whole);
  bool *mwhole = xcalloc((size_t)t->ntrained + 1, sizeof *mwhole);
  int64_t *covered = xcalloc((size_t)t->ntrained + 1, sizeof *covered);
  int64_t *mcovered = xcalloc((size_t)t->ntrained + 1, sizeof *mcovered);
  int64_t *want = xcalloc((size_t)t->ntrained + 1, sizeof *want);
  unsigned char **seen = xcalloc((size_t)t->ntrained + 1, sizeof *seen);
  for (int i = 0; i < t->ntrained; i++) {
    const Trained *p = &t->trained[i];
    const char *name = t->ir->tensors[p->tensor].name;
    int64_t nown, from;
    bool windowed = own_rows(t, p, &nown) != NULL;
    whole[i] = file_has(&info, p->table ? "table" : "param", name);
    mwhole[i] = file_has(&info, "adamw.m", name);
    want[i] = p->table ? (windowed ? nown : p->rows) : p->numel;
    if (zero3_param(t, p)) dense_sync_shard(t->dense, t->dense_index[p->tensor], &from, &want[i]);
    if (p->table || !whole[i]) seen[i] = xcalloc((size_t)want[i] + 1, 1);
  }
  ok = checkpoint_read(f, t->key, s.e, s.n, err, err_size);
  for (int i = 0; ok && i < t->ntrained; i++) {
    Trained *p = &t->trained[i];
    if (whole[i] && p->table) ok = read_own_rows(t, f, p, err, err_size);
    else if (whole[i] && zero3_param(t, p)) ok = read_own_part(t, f, &info, p, err, err_size);
  }
  checkpoint_info_free(&info);
  for (int i = 0; ok && i < ncurve; i++) {
    const double r0 = s.curve[6 * i];
    if (!(r0 >= 0 && r0 <= (double)nsteps && r0 == floor(r0)))
      ok = fail(err, err_size, "checkpoint %s is corrupt: learning-curve row %d is at step "
                "%g, out of range (0 to %" PRId64 ")", checkpoint_path(f), i + 1, r0, nsteps);
  }
  checkpoint_close(f);
  if (ok && kind == 1)
    ok = read_parts(t, dir, set, &s, covered, mcovered, seen, err, err_size);
  for (int i = 0; ok && i < t->ntrained; i++) {
    const Trained *p = &t->trained[i];
    const char *name = t->ir->tensors[p->tensor].name;
    if (!whole[i] && covered[i] != want[i])
      ok = fail(err, err_size, "checkpoint in %s is corrupt: %s '%s' is neither whole in it "
                "nor in parts that cover its %s (%" PRId64 " of %" PRId64 " found)", dir,
                p->table ? "table" : "parameter", name, p->table ? "rows" : "elements",
                covered[i], want[i]);
    else if (!p->table && p->st.m && !mwhole[i] && mcovered[i] != want[i])
      ok = fail(err, err_size, "checkpoint in %s has no AdamW moments of parameter '%s' (%"
                PRId64 " of %" PRId64 " elements found): it was saved with another optimizer, "
                "or is corrupt", dir, name, mcovered[i], want[i]);
  }
  for (int i = 0; i < t->ntrained; i++) free(seen[i]);
  free(seen);
  free(whole);
  free(mwhole);
  free(covered);
  free(mcovered);
  free(want);
  if (ok) entries_take_parts(t, &s);
  if (ok) {
    free(t->losses);
    t->losses = losses;
    losses = NULL;
    t->cap_losses = nsteps;
    t->step = nsteps;
    t->cursor = s.counters[0];
    for (int i = 0; i < t->ntrained; i++) t->trained[i].st.step = s.steps[i];
    if ((uint64_t)s.counters[2] != t->opt.seed) {
      // The synthetic stream is the checkpoint's, whatever seed this run was given.
      t->opt.seed = (uint64_t)s.counters[2];
      if (t->synth) {
        // The producer must not be making a batch from the synth being replaced.
        if (t->pipeline) pipeline_pause(t->pipeline);
        synth_free(t->synth);
        t->synth = make_synth(t);
        if (t->pipeline) pipeline_reset(t->pipeline);  // batches of the old stream are gone
        if (t->pipeline) pipeline_resume(t->pipeline);
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

bool trainer_resume(Trainer *t, const char *dir, char *err, size_t err_size) {
  CkptSet set = {0};
  if (!t->comm) {
    int kind = checkpoint_set_find(dir, &set, err, err_size);
    return kind >= 0 && resume_read(t, dir, kind, &set, err, err_size);
  }
  // Distributed: rank 0 decides what the run resumes from (ranks on other nodes might see the
  // directory differently), every rank reads that, and one agreement covers every failure.
  int64_t pick[4] = {0, 0, 0, 0};  // kind + 1 (0: refused), step, id, world
  char why[512] = "";
  if (comm_rank(t->comm) == 0) {
    int kind = checkpoint_set_find(dir, &set, why, sizeof why);
    pick[0] = kind + 1;
    pick[1] = set.step;
    pick[2] = (int64_t)set.id;
    pick[3] = set.world;
  }
  if (!dist_allreduce(t, pick, 4, COMM_I64, "the checkpoint to resume from", err, err_size))
    return false;
  int kind = (int)pick[0] - 1;
  set = (CkptSet){.step = pick[1], .id = (uint64_t)pick[2], .world = (int)pick[3]};
  bool ok;
  if (kind < 0)
    ok = fail(err, err_size, "%s", why[0] ? why : "rank 0 found no checkpoint it could use in "
              "the directory (it names why)");
  else
    ok = resume_read(t, dir, kind, &set, err, err_size);
  char agree_err[256];
  if (!dist_agree(t, ok, "reading the checkpoint", agree_err, sizeof agree_err) && ok)
    ok = fail(err, err_size, "another rank could not read the checkpoint in %s (that rank "
              "names why)", dir);
  if (!ok) t->failed_together = true;
  return ok;
}

bool trainer_failed_together(const Trainer *t) { return t && t->failed_together; }

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
int64_t trainer_timed_steps(const Trainer *t) { return t->timed_steps; }

void trainer_profile_range(Trainer *t, int64_t from, int64_t count) {
  t->profile_from = from;
  t->profile_count = t->gpu ? count : 0;
}

bool trainer_profile(const Trainer *t, Profile *out) {
  memset(out, 0, sizeof *out);
  if (!t->gpu) return false;
  int64_t steps = 0;
  const GpuLaunchProfile *totals = gpu_session_profile_totals(t->gpu, &steps);
  return profile_build(gpu_session_plan(t->gpu), totals, steps,
                       target_find(gpu_session_arch(t->gpu)), out);
}
const TrainerTimes *trainer_times(const Trainer *t) { return &t->times; }
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
