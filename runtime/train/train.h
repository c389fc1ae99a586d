// train.h: the training loop of `gemc train` on the CPU executor. A Trainer owns the executor,
// the optimizer state of every parameter and table, the data source (synthetic or a data
// file) with its held-out split, and the history that the report and checkpoints keep.
// docs/train.md describes what it computes; train_loop.c drives it with progress output.
// defines: TrainOptions, OptimOverrides, TaskMetrics, EvalResult, Trainer, trainer_*
#ifndef GEMC_TRAIN_H
#define GEMC_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "comm.h"
#include "dense_sync.h"
#include "ir.h"
#include "metrics.h"
#include "profile_report.h"
#include "synth.h"
#include "table_sync.h"

// Command-line overrides of the optimizers' hyper-parameters; NaN leaves the model's value.
typedef struct OptimOverrides {
  double lr, beta1, beta2, eps, weight_decay;  // the dense parameters' optimizer
  double table_lr, table_eps;                  // every table's optimizer
} OptimOverrides;
void optim_overrides_none(OptimOverrides *o);  // every field NaN

typedef struct TrainOptions {
  int64_t batch;          // examples per step; 0: the model's `batch`
  uint64_t seed;          // parameter initialization and synthetic data
  const char *data_path;  // a data file (docs/data.md); NULL: synthetic data
  LengthDist lengths;     // synthetic: the history length distribution
  int64_t id_vocab;       // synthetic: cap on distinct ids per input; 0: the whole table
  int64_t eval_examples;  // synthetic: held-out examples (rounded up to whole batches)
  OptimOverrides optim;
  bool cuda;              // train on the GPU with generated kernels (train_gpu.h)
  const char *artifact;   // cuda: the kernels of this `gemc build` artifact, not NVRTC
  FILE *gpu_log;          // cuda: start-up facts (device, compile times); NULL: none
  // cuda: the schedule of every node (ir->nnodes entries) for the GPU's plan: the autotuner's
  // picks (runtime/bench/tune.h, docs/tuning.md). Applied to a copy of the IR's nodes, so the
  // model key and checkpoints stay those of the model; not applied with an artifact. NULL:
  // the IR's own schedules.
  const Schedule *node_sched;
  // The divergence guard (docs/train.md): 0 stops at the first non-finite loss (--on-nan
  // stop); N > 0 skips a step whose loss or gradients are not finite, without its update, and
  // stops at the N-th such step in a row (--on-nan skip=N).
  int64_t on_nan_skip;
  // Test hook: steps [nan_first, nan_first + nan_count) (1-based, counted from the start of
  // training) behave as if their loss were NaN. 0: none.
  int64_t test_nan_first, test_nan_count;
  // Distributed training (docs/distributed.md): the world this process is one rank of (NULL,
  // or a world of one: it trains alone). Each rank trains on its share of every global batch
  // of `batch` examples. Dense parameters are kept by dense_mode, with gradients reduced in
  // buckets of bucket_bytes (0: DEFAULT_BUCKET_BYTES); tables are placed by placement
  // [ir->ntensors] (NULL: every table replicated). The CPU backend only, for now.
  Comm *comm;
  DenseMode dense_mode;
  int64_t bucket_bytes;
  const TablePlacement *placement;
} TrainOptions;
enum { DEFAULT_BUCKET_BYTES = 25 << 20 };
void train_options_default(TrainOptions *o);

// Metrics of one task over some examples (NaN where undefined).
typedef struct TaskMetrics {
  double ne, auc, calibration, logloss;
  int64_t examples;
} TaskMetrics;
void task_metrics_from(const Metrics *m, TaskMetrics *out);

typedef struct EvalResult {
  double loss;          // the model's loss, averaged over the held-out batches
  int64_t examples;
  int ntasks;
  TaskMetrics *tasks;   // [ntasks], owned by the trainer; valid until the next eval
  double *teacher_ne;   // [ntasks] synthetic data: NE of the hidden teacher (the best any
                        // model can do); NULL for a data file
} EvalResult;

// One row of the learning curve: recorded at every evaluation.
typedef struct CurvePoint {
  int64_t step;
  double train_loss;    // mean training loss since the previous point
  double eval_loss;
  double train_ne;      // mean over tasks, training predictions since the previous point
  double eval_ne, eval_auc;  // mean over tasks
} CurvePoint;

typedef struct Trainer Trainer;

// What the divergence guard found: the first non-finite value, which stopped training.
typedef struct TrainFailure {
  bool failed;
  int64_t step;          // the step it was found at (its loss or gradient) or after
  char tensor[192];      // "loss", "grad:NAME", or a checkpoint entry: "table:NAME", ...
  const char *what;      // "NaN" (any NaN) or "Inf"
  int64_t nan, inf;      // how many NaN and infinite values
  int64_t values;        // of how many
  int64_t skipped_in_row;  // --on-nan skip: the bad steps in a row that stopped it
} TrainFailure;

enum { DEFAULT_ON_NAN_SKIPS = 10 };  // --on-nan skip without =N

// Prepares to train `ir`, which must hold its backward graph (autodiff) and a loss. The model
// key (checkpoint.h) is computed from the IR as given, before options change the batch size
// or the optimizers. Parameters are initialized from o->seed. Returns NULL with a message in
// `err` when the data file cannot be used.
Trainer *trainer_new(Ir *ir, const TrainOptions *o, char *err, size_t err_size);
void trainer_free(Trainer *t);

// One optimizer step on the next training batch; *loss is that batch's loss. Fails (with a
// message) when the data file is bad or the loss is not finite; with o->on_nan_skip, a step
// whose loss or gradients are not finite is skipped instead (its batch is consumed and the
// step counted, its update is not applied: trainer_step_skipped, *loss NaN) until
// o->on_nan_skip of them come in a row. A divergence is recorded in trainer_failure.
bool trainer_step(Trainer *t, double *loss, char *err, size_t err_size);
bool trainer_step_skipped(const Trainer *t);    // the last trainer_step skipped its update
// The guard's check of the state: every parameter, table and optimizer state is finite (on the
// GPU, counted on the device). Fails naming the first tensor that is not, and records it.
// trainer_save runs it first and writes nothing when it fails.
bool trainer_check_finite(Trainer *t, char *err, size_t err_size);
const TrainFailure *trainer_failure(const Trainer *t);
// Steps skipped this run (--on-nan skip), [n] step numbers.
const int64_t *trainer_skipped_steps(const Trainer *t, int64_t *n);
// The held-out evaluation. Does not change the training state.
bool trainer_eval(Trainer *t, EvalResult *out, char *err, size_t err_size);

// Checkpoints: the whole training state (parameters, tables, optimizer moments, step, data
// cursor, loss history, learning curve). Resuming continues bit-exactly.
bool trainer_save(Trainer *t, const char *dir, char *err, size_t err_size);
bool trainer_resume(Trainer *t, const char *dir, char *err, size_t err_size);

// Training predictions since the last reset, per task (`window`: since the last curve point;
// the other: since the last trainer_reset_train_metrics(t, false)).
const Metrics *trainer_train_metrics(const Trainer *t, bool window, int task);
void trainer_reset_train_metrics(Trainer *t, bool window);
void trainer_add_curve_point(Trainer *t, const CurvePoint *p);

// Facts about the run.
int64_t trainer_step_count(const Trainer *t);       // steps taken, resumed ones included
const double *trainer_losses(const Trainer *t);     // [trainer_step_count]
const CurvePoint *trainer_curve(const Trainer *t, int *n);
int64_t trainer_batch(const Trainer *t);
const char *trainer_model_name(const Trainer *t);
int trainer_ntasks(const Trainer *t);
const char *trainer_task_name(const Trainer *t, int task);
uint64_t trainer_model_key(const Trainer *t);
uint64_t trainer_seed(const Trainer *t);             // a resumed run takes the checkpoint's
int64_t trainer_param_count(const Trainer *t, int64_t *in_tables);  // learned scalars
int64_t trainer_eval_examples(const Trainer *t);
int64_t trainer_train_examples(const Trainer *t);   // data file: the training split; 0: synthetic
const Optim *trainer_dense_optim(const Trainer *t); // after overrides
// Where the wall time of the GPU steps went (plain steps; --on-nan skip steps are not split).
// Each step launches its kernels (launch_s), then takes the next batch and enqueues its upload
// while the GPU runs (prefetch_s), then waits for the step to end (wait_s). The next batch is
// made (batch_s) and staged for the GPU (upload_s: inputs encoded, tile lists dealt) on the
// batch pipeline's thread, off the critical path, unless GEMC_PIPELINE=0; prefetch_s holds the
// wait for it (batch_wait_s) and its copy into pinned memory (copy_s). device_s sums the
// steps' CUDA-event times.
typedef struct TrainerTimes {
  int64_t steps;
  double launch_s, prefetch_s, wait_s, other_s, device_s;
  double batch_s, upload_s, batch_wait_s, copy_s;
  bool pipelined;
} TrainerTimes;
const TrainerTimes *trainer_times(const Trainer *t);
double trainer_step_seconds(const Trainer *t);      // wall time spent in trainer_step this run
                                                    // (the profiled steps left out)
int64_t trainer_timed_steps(const Trainer *t);      // the steps in trainer_step_seconds
// --profile: steps [from, from + count) of the cuda backend are timed launch by launch
// (profile_report.h) and left out of the step time; trainer_profile groups what they measured.
void trainer_profile_range(Trainer *t, int64_t from, int64_t count);
bool trainer_profile(const Trainer *t, Profile *out);
// The cuda backend: the device ("NVIDIA H200 (sm_90a, ...)"), or NULL on the CPU backend.
const char *trainer_device(const Trainer *t);
// Useful FLOPs of the steps taken this run (flops.h, over the real jagged lengths), and the
// datasheet peak (TFLOP/s) of the target for the model's precision: Local MFU is
// flops / trainer_step_seconds / (peak * 1e12).
double trainer_flops(const Trainer *t);
double trainer_peak_tflops(const Trainer *t);

// A distributed run's numbers (docs/distributed.md), gathered from every rank: call it on
// every rank (it is a collective), at the end. Local MFU: this rank's FLOPs over its compute
// time (the step without its waits for communication); E2E MFU: the global batch's FLOPs
// over the step time of all ranks; Scaling Ratio = E2E / Local.
typedef struct DistSummary {
  int world;
  const char *backend;      // "mpi"
  const char *dense_mode;   // "data-parallel", "zero1", "zero2", "zero3"
  int buckets;
  double step_s, compute_s, exposed_comm_s;  // per step, this rank (rank 0 when printed)
  double local_mfu, e2e_mfu, scaling_ratio;
  double straggler_spread;  // max over min of the ranks' compute time
  double allreduce_gbps;    // the dense gradients' bus bandwidth, GB/s: 2 (n-1)/n of their
                            // bytes (all-reduce), (n-1)/n under ZeRO-2/3 (reduce-scatter),
                            // over the span from the first bucket's start to the last one's
                            // end (so at least this)
  const char *dense_collective;  // "all-reduce" or "reduce-scatter"
  double alltoall_gbps;     // the sharded tables' all-to-alls: bytes sent to other ranks over
                            // their time, GB/s (0: no sharded table)
  char placement[1024];     // the tables' placement, one line each
  double max_rss_mib;       // the largest peak resident memory of any rank, MiB
} DistSummary;
bool trainer_dist_summary(Trainer *t, DistSummary *out, char *err, size_t err_size);
// What GPU ranks (NCCL) cannot train yet, for a world of `world`: ZeRO dense modes, and with
// several ranks a table placed other than replicated (placement[ir->ntensors], NULL: all
// replicated) or an artifact's kernels (which update tables inside the backward pass). False
// with the reason; `gemc train` asks before the ranks meet.
bool trainer_gpu_world_check(const Ir *ir, int world, DenseMode dense,
                             const TablePlacement *placement, bool artifact, char *err,
                             size_t err_size);
bool trainer_distributed(const Trainer *t);  // a world of more than one
// The last failure was decided by every rank together (the divergence guard, the state check,
// a checkpoint's save or read), so every rank stops at once of its own accord; any other
// failure is one rank's alone, and the job must be ended for the others (train_world_leave).
bool trainer_failed_together(const Trainer *t);

// --- the loop (train_loop.c) -------------------------------------------------------------

typedef struct LoopOptions {
  int64_t steps;          // steps to take in this run (after those a resumed run has)
  int64_t eval_every;     // evaluate every this many steps; 0: only at the end
  const char *save_dir;   // checkpoint here; NULL: never
  int64_t save_every;     // and every this many steps; 0: only at the end
  bool quiet;             // no progress, no learning curve
  int live;               // progress: -1 decide from the terminal, 0 plain lines, 1 live line
  FILE *out;              // the learning curve (stdout)
  FILE *err;              // the progress (stderr)
  int64_t profile_steps;  // cuda: time this many steps launch by launch (after a warm-up of
                          // up to 10 steps); they are left out of the step time
} LoopOptions;

typedef struct LoopResult {
  int64_t steps;              // steps taken in this run
  int64_t timed_steps;        // of which timed (not --profile's)
  double seconds;             // wall time of the whole loop, evaluations included
  double examples_per_second; // training throughput: examples / time spent in steps
  double train_loss;          // mean loss over the last tenth of this run's steps
  int64_t train_steps_measured; // how many steps that is
  TaskMetrics *train;         // [ntasks] over the same steps; owned by the result
  EvalResult eval;            // the final evaluation (NaN when the run stopped before one)
  TaskMetrics *no_eval;       // [ntasks] NaN: eval.tasks when there was none; owned
  char warning[320];          // the exploding-loss warning, when there was one
} LoopResult;

// Runs o->steps steps, evaluating every o->eval_every steps and at the end (a row of the
// learning curve each time), checkpointing every o->save_every steps and at the end. Before
// every evaluation and save the state is checked (trainer_check_finite). A loss over 100
// times the first evaluation's (or the first steps') is warned about once. When it fails,
// `r` still describes the run up to the failure (for the report); free it either way.
// With no steps, it evaluates, and records a curve row only when the curve has none there.
bool train_loop(Trainer *t, const LoopOptions *o, LoopResult *r, char *err, size_t err_size);
void loop_result_free(LoopResult *r);

// The model key: FNV-1a 64 of the printed IR (forward and backward), without the source path.
uint64_t train_model_key(const Ir *ir);

#endif
