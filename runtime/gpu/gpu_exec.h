// gpu_exec.h: the GPU executor. It runs a codegen Plan (codegen/plan/plan.h) on the device: it
// allocates the plan's buffers, loads the compiled kernels, uploads parameters (copied from a
// CpuExec's initialized parameters, so both backends start from the same bits), and per step
// uploads the batch, evaluates every SymSize and grid for it, and launches the plan in order.
//
// Streams: a copy stream moves batches host -> device from double-buffered pinned memory into
// two device staging slots, while the compute stream runs the previous step; the compute stream
// waits on the copy's event, and the copy into a slot waits on the compute of the step that
// last read it. Input tensors (ids, dense features, labels) and the jagged offsets are read by
// the kernels straight from the staging slot of their batch, and so are the attention tile
// lists (runtime/gpu/gpu_tiles.h builds them on the host per batch).
//
// CUDA graphs: the forward and backward launches of a step are captured into a graph keyed by
// the batch's shape (B, every T_j, every tile count) and the staging slot; a step with a shape
// seen before replays it. Jagged batches rarely repeat their totals, so graphs pay off for
// fixed-length data and evaluation sets (the held-out batches repeat every evaluation); the
// optimizer launches, which take the step number by value, always run outside the graph.
// docs/gpu.md describes all of it.
// defines: GpuExec, GpuExecOptions, gpu_exec_*
#ifndef GEMC_GPU_EXEC_H
#define GEMC_GPU_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "cpu_exec.h"
#include "cuda_driver.h"
#include "gpu_stage.h"
#include "optim.h"
#include "plan.h"

typedef struct GpuExecOptions {
  int64_t max_batch;       // the largest B a batch may have (buffers are sized for it)
  bool graphs;             // capture forward+backward in CUDA graphs
  int graph_cache;         // how many shapes' graphs to keep (default 8)
  bool sync_each_launch;   // debugging: synchronize and check after every launch
} GpuExecOptions;

typedef struct GpuExec GpuExec;

// Loads the module images (cubins; one or several, each holding some of the plan's kernels),
// finds every kernel the plan launches, and allocates every buffer. Fails with a message
// naming the missing kernel or the buffer that did not fit (its name and bytes).
GpuExec *gpu_exec_new(const Plan *p, const CudaContext *ctx, const void *const *images,
                      int nimages, const GpuExecOptions *o, char *err, size_t err_size);
void gpu_exec_free(GpuExec *g);

// Copies every parameter and table of `x` (already initialized) to the device, in its dtype,
// and zeroes the optimizer state.
bool gpu_exec_upload_params(GpuExec *g, CpuExec *x, char *err, size_t err_size);
// The reverse: parameters and tables back into x (checkpoints, tests).
bool gpu_exec_download_params(GpuExec *g, CpuExec *x, char *err, size_t err_size);
// The optimizer state of parameter or table t (checkpoints): every slot the plan keeps for it
// (AdamW m and v, row-wise Adagrad's rowsum; gpu_optstate.h) into s's host arrays, or from
// them onto the device. Both wait for the compute stream first, and the upload is ordered
// before any later launch. Fails, naming t, when s's optimizer does not match the plan's.
bool gpu_exec_download_optstate(GpuExec *g, int t, OptimState *s, char *err, size_t err_size);
bool gpu_exec_upload_optstate(GpuExec *g, int t, const OptimState *s, char *err,
                              size_t err_size);

// Packs batch `b` into pinned memory and enqueues its upload on the copy stream. The batch can
// be reused as soon as this returns.
bool gpu_exec_set_batch(GpuExec *g, const Batch *b, char *err, size_t err_size);

// The same in two halves: gpu_stage_batch(gpu_exec_layout(g), ...) on any thread (it reads
// only the layout and the plan), then gpu_exec_set_staged on the executor's thread, which
// copies the staged batch into a pinned slot and enqueues its upload. `st` can be reused as
// soon as it returns.
const StagingLayout *gpu_exec_layout(const GpuExec *g);
bool gpu_exec_set_staged(GpuExec *g, const GpuStaged *st, char *err, size_t err_size);

enum { GPU_FORWARD = 1, GPU_BACKWARD = 2, GPU_OPTIMIZER = 4, GPU_TRAIN = 7 };
// Enqueues the launches of `phases` for the current batch (optimizer launches with step
// `step`) on the compute stream. Returns at once; gpu_exec_finish waits.
bool gpu_exec_launch(GpuExec *g, int phases, int64_t step, char *err, size_t err_size);
// Waits for the enqueued step and reads back the loss and each task's probabilities. A launch
// failure or a fault names the kernel and its sizes.
bool gpu_exec_finish(GpuExec *g, double *loss, char *err, size_t err_size);

// Test hooks: enqueue launches [from, to) only, then wait.
bool gpu_exec_run_range(GpuExec *g, int from, int to, int64_t step, char *err, size_t err_size);
// Tensor t of the current batch as fp32 (converted from its dtype): *numel elements, written
// to out (cap elements); for a ROWS tensor the values of its U rows, with the ids in *row_ids
// (malloc'd) and U in *nrows. Returns false when t is not stored.
bool gpu_exec_read_tensor(GpuExec *g, int t, float *out, int64_t cap, int64_t *numel,
                          int64_t *nrows, int64_t **row_ids, char *err, size_t err_size);
// Writes tensor t from fp32 host data (tests feed a node its CPU inputs).
bool gpu_exec_write_tensor(GpuExec *g, int t, const float *data, int64_t numel, char *err,
                           size_t err_size);

// The divergence guard (docs/train.md): counts the NaN and infinite values on the device, one
// small reduction kernel per buffer (runtime/gpu/gpu_helpers.cu) and one read-back of the
// counts, never the buffers. !grads: every parameter and table, then its optimizer state;
// grads: the gradients of the dense parameters of the step just run. Waits for the compute
// stream. `first` gets the first buffer, in tensor order, that holds any (first->tensor -1
// when none does): slot -1 is the values (or the gradient), 0 and 1 the optimizer-state slots
// of gpu_optstate.h.
typedef struct GpuNonFinite {
  int tensor, slot;
  int64_t nan, inf, numel;
} GpuNonFinite;
bool gpu_exec_check_finite(GpuExec *g, bool grads, GpuNonFinite *first, char *err,
                           size_t err_size);

// Distributed training (runtime/parallel/dense_sync.h, docs/distributed.md). While a hook is
// set, hook(ctx, i) runs on the calling thread right after backward launch i is enqueued, the
// backward phase runs without a CUDA graph, and steps are not profiled. NULL removes it.
typedef void (*GpuLaunchHook)(void *ctx, int launch);
void gpu_exec_set_launch_hook(GpuExec *g, GpuLaunchHook hook, void *ctx);
// Records event e on the compute stream (after everything enqueued so far).
bool gpu_exec_record(GpuExec *g, CUevent e, char *err, size_t err_size);
// Dense parameter `param`'s gradient: its fp32 device buffer, its elements, and the last
// backward launch that reads or writes that buffer (after it the gradient is final and no
// later launch of the backward pass touches it). False when the gradient is not stored as an
// fp32 buffer of its own.
bool gpu_exec_grad(const GpuExec *g, int param, CUdeviceptr *ptr, int64_t *numel,
                   int *last_launch);

// A table's rows gradient (a ROWS tensor) of the step just run, for GPU ranks of several,
// which merge it across ranks between the backward pass and the optimizer
// (ir->defer_table_updates): read as U ids and U x width fp32 values (malloc'd), and written
// back merged in the compact layout [int64 U][int64 ids[U]][fp32 U x width] that the plan's
// table_rows_apply launches read. The write fails, naming the table, when the rows do not fit
// the buffer (sized for the largest batch's occurrences).
bool gpu_exec_read_rows(GpuExec *g, int t, int64_t **ids, float **vals, int64_t *n, char *err,
                        size_t err_size);
bool gpu_exec_write_rows(GpuExec *g, int t, const int64_t *ids, const float *vals, int64_t n,
                         char *err, size_t err_size);

int gpu_exec_ntasks(const GpuExec *g);
const float *gpu_exec_task_probs(const GpuExec *g, int task);  // after gpu_exec_finish

typedef struct GpuExecStats {
  int64_t steps, graph_replays, graph_captures, launches;
  double device_ms;          // compute-stream time of the last step (events)
  size_t bytes_allocated;    // device memory of the plan's buffers, staging and workspace
} GpuExecStats;
void gpu_exec_stats(const GpuExec *g, GpuExecStats *out);

// Profiling. While on, each gpu_exec_launch captures its launches into one CUDA graph with an
// event before and after every launch and runs it (the kernels back to back, the host's launch
// time out of their times); gpu_exec_finish adds each launch's time and its cost for the batch
// (launch_cost.h) to the totals. Such a step is slower than a plain one: time steps apart.
typedef struct GpuLaunchProfile {
  int64_t runs;        // steps in which the launch put work on the GPU
  double ms;           // their summed time
  double flops, bytes; // their summed cost
  bool tensor_core;
} GpuLaunchProfile;
bool gpu_exec_profile(GpuExec *g, bool on, char *err, size_t err_size);
// [Plan.nlaunches] totals over `*steps` profiled steps, or NULL before any.
const GpuLaunchProfile *gpu_exec_profile_totals(const GpuExec *g, int64_t *steps);


#endif
