// train_gpu.h: the `cuda` backend of `gemc train`. A GpuSession opens the GPU, lowers the
// model to a plan for the GPU's arch, gets its kernels (NVRTC through the disk cache, or the
// cubin of an AOT artifact), starts a GpuExec with the CPU executor's initialized parameters,
// and runs training and evaluation steps. docs/gpu.md describes it.
// defines: GpuSessionOptions, GpuSession, gpu_session_*
#ifndef GEMC_TRAIN_GPU_H
#define GEMC_TRAIN_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "batch.h"
#include "cpu_exec.h"
#include "gpu_exec.h"
#include "gpu_stage.h"
#include "ir.h"
#include "optim.h"

typedef struct GpuSessionOptions {
  const char *artifact;   // a `gemc build` artifact; NULL: JIT with NVRTC
  uint64_t model_key;     // train_model_key of the IR as loaded (artifact check)
  int64_t max_batch;
  bool graphs;            // CUDA graphs (default on; GEMC_CUDA_GRAPHS=0 turns them off)
  FILE *log;              // start-up lines (compile times); NULL: quiet
} GpuSessionOptions;

typedef struct GpuSession GpuSession;

// Opens the session for `ir` (with its backward graph), its parameters copied from `init`.
// NULL with the reason when the GPU, the compiler or the artifact cannot be used.
GpuSession *gpu_session_open(const Ir *ir, CpuExec *init, const GpuSessionOptions *o,
                             char *err, size_t err_size);
void gpu_session_close(GpuSession *s);

// Uploads a batch (asynchronously; it may be reused on return).
bool gpu_session_set_batch(GpuSession *s, const Batch *b, char *err, size_t err_size);
// The same in two halves (gpu_exec.h): stage on any thread, then set on the session's.
bool gpu_session_stage(const GpuSession *s, const Batch *b, GpuStaged *st, char *err,
                       size_t err_size);
bool gpu_session_set_staged(GpuSession *s, const GpuStaged *st, char *err, size_t err_size);
// gpu_exec_profile and its totals (gpu_exec.h), and the plan the session runs.
bool gpu_session_profile(GpuSession *s, bool on, char *err, size_t err_size);
const GpuLaunchProfile *gpu_session_profile_totals(const GpuSession *s, int64_t *steps);
const Plan *gpu_session_plan(const GpuSession *s);
// Enqueues a training step (forward, backward, optimizer with step number `step`) or, when
// !train, a forward pass, on the last batch set.
bool gpu_session_launch(GpuSession *s, bool train, int64_t step, char *err, size_t err_size);
// The same training step in two parts, so that the divergence guard can look at the loss and
// the gradients before the update (--on-nan skip): forward and backward, then the optimizer.
bool gpu_session_launch_grads(GpuSession *s, char *err, size_t err_size);
bool gpu_session_launch_update(GpuSession *s, int64_t step, char *err, size_t err_size);
// The divergence guard: counts NaN and infinite values on the device (gpu_exec_check_finite):
// !grads: parameters, tables and optimizer state; grads: the dense parameters' gradients. On a
// hit, *tensor is the tensor, *slot -1 (its values) or the optimizer-state slot (0: AdamW m
// or Adagrad rowsum, 1: AdamW v); *tensor is -1 when everything is finite.
bool gpu_session_check_finite(GpuSession *s, bool grads, int *tensor, int *slot, int64_t *nan,
                              int64_t *inf, int64_t *numel, char *err, size_t err_size);
// Waits for it: the loss, and the task probabilities in gpu_session_probs.
bool gpu_session_finish(GpuSession *s, double *loss, char *err, size_t err_size);
const float *gpu_session_probs(const GpuSession *s, int task);
// Parameters and tables back into the CPU executor.
bool gpu_session_download(GpuSession *s, CpuExec *x, char *err, size_t err_size);
// Checkpoints. gpu_session_upload: parameters and tables from the CPU executor onto the GPU,
// with every optimizer state zeroed; then gpu_session_upload_optstate puts back the state of
// each parameter and table. gpu_session_download_optstate reads it into st's host arrays.
bool gpu_session_upload(GpuSession *s, CpuExec *x, char *err, size_t err_size);
bool gpu_session_download_optstate(GpuSession *s, int tensor, OptimState *st, char *err,
                                   size_t err_size);
bool gpu_session_upload_optstate(GpuSession *s, int tensor, const OptimState *st, char *err,
                                 size_t err_size);

// Distributed training (docs/distributed.md): the launch hook of gpu_exec_set_launch_hook, the
// session's event for ordering collectives after compute (created on first use, recorded on
// the compute stream by gpu_session_record), and a dense parameter's device gradient
// (gpu_exec_grad).
void gpu_session_set_launch_hook(GpuSession *s, GpuLaunchHook hook, void *ctx);
void *gpu_session_event(GpuSession *s, char *err, size_t err_size);
bool gpu_session_record(GpuSession *s, char *err, size_t err_size);
bool gpu_session_grad(const GpuSession *s, int param, void **ptr, int64_t *numel,
                      int *last_launch);
// gpu_exec_read_rows and gpu_exec_write_rows (deferred table updates).
bool gpu_session_read_rows(GpuSession *s, int t, int64_t **ids, float **vals, int64_t *n,
                           char *err, size_t err_size);
bool gpu_session_write_rows(GpuSession *s, int t, const int64_t *ids, const float *vals,
                            int64_t n, char *err, size_t err_size);

// Facts for the banner and the summary.
const char *gpu_session_device(const GpuSession *s);  // "NVIDIA H200 (sm_90a, 132 SMs)"
const char *gpu_session_arch(const GpuSession *s);
double gpu_session_compile_cold(const GpuSession *s); // seconds; NaN when it was a cache hit
double gpu_session_compile_warm(const GpuSession *s); // seconds to load from the cache
int gpu_session_kernels(const GpuSession *s);
double gpu_session_device_ms(const GpuSession *s);    // device time of the last step

#endif
