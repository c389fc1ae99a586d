// cpu_exec.h: the CPU executor. It runs the forward and backward nodes of any checked IR in
// plain C: jagged tensors are values plus offsets, never padded. It is the oracle every GPU
// kernel is tested against, and the `cpu` backend of `gemc train`.
//
// Two modes: fp32 (float buffers, precision emulated as the GPU computes it: each node's output
// rounded to its dtype, fp8/mxfp8 matmul operands quantized per numerics.h) and fp64 (double
// buffers, no rounding, for gradient checks against finite differences).
// docs/executor.md describes it: layouts, modes, precision emulation, initialization, speed.
// defines: CpuExec, cpu_exec_new, cpu_exec_forward, cpu_exec_backward
#ifndef GEMC_CPU_EXEC_H
#define GEMC_CPU_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "batch.h"
#include "ir.h"

typedef enum ExecMode { EXEC_F32, EXEC_F64 } ExecMode;

typedef struct CpuExec CpuExec;

// Prepares to run `ir` (forward nodes, and backward nodes when ir->nforward < ir->nnodes).
// Allocates every parameter and table, zeroed; cpu_exec_init_params fills them.
CpuExec *cpu_exec_new(const Ir *ir, ExecMode mode);
// The same, but each table t with windowed[t] holds no rows of its own: before each batch the
// caller sizes it with cpu_exec_set_table_rows and fills those rows, and the batch's ids of
// that table index them (a sharded table's window on a CPU rank, table_sync.h). Its
// gradient's row ids are then window rows too. windowed may be NULL (none).
CpuExec *cpu_exec_new_windowed(const Ir *ir, ExecMode mode, const bool *windowed);
// The same, and each parameter t with gathered[t] (ZeRO-3 on CPU ranks, dense_sync.h) holds
// no values between its uses: before the first node of a pass (the forward pass, or the
// backward pass) that reads it, the executor allocates the whole parameter and the fill
// function given to cpu_exec_set_param_fill puts its values there; after the last node of
// that pass that reads it, the buffer is freed. cpu_exec_data gives NULL for it in between,
// and cpu_exec_init_params leaves it alone. fp32 mode only. Either array may be NULL.
CpuExec *cpu_exec_new_parts(const Ir *ir, ExecMode mode, const bool *windowed,
                            const bool *gathered);
typedef void (*CpuParamFill)(void *ctx, int tensor, float *whole);
void cpu_exec_set_param_fill(CpuExec *x, CpuParamFill fill, void *ctx);
// The largest number of gathered parameters' elements whole at once, over both passes.
int64_t cpu_exec_gathered_peak(const Ir *ir, const bool *gathered);
// A windowed table's rows for the next batch: nrows x D elements, their contents left to
// the caller; returns them (cpu_exec_data gives the same).
void *cpu_exec_set_table_rows(CpuExec *x, int t, int64_t nrows);

// The memory a training of `ir` at batch B takes on the CPU, at least: every parameter, table
// and parameter gradient (cpu_exec_new allocates them), their optimizer state (AdamW: m and v;
// row-wise Adagrad: a sum per row) and the dense and set values of one batch (jagged values
// are sized by each batch's totals, so they are not counted). INT64_MAX when it overflows.
int64_t cpu_exec_bytes_needed(const Ir *ir, ExecMode mode, int64_t B);
// The memory the machine can give: MemAvailable of /proc/meminfo, else the physical pages
// times the page size; -1 when neither is known. cpu_memory_set_available (tests) makes it
// return `bytes` instead (a negative value undoes that).
int64_t cpu_memory_available(void);
void cpu_memory_set_available(int64_t bytes);
// False, with "the model needs N bytes of memory on the CPU ...; this machine has M available"
// in err, when cpu_exec_bytes_needed exceeds cpu_memory_available. Call it before
// cpu_exec_new, which allocates.
bool cpu_exec_check_fit(const Ir *ir, ExecMode mode, int64_t B, char *err, size_t err_size);
// The same where table t holds table_rows[t] rows (and their optimizer state) when that is
// >= 0: a rank's windowed tables (table_sync_rows_held). table_rows may be NULL.
// param_elems[t] >= 0 (may be NULL) does the same for a gathered parameter: this rank's part
// of it and its optimizer state, plus (once) the gathered parameters' peak whole at once
// (cpu_exec_gathered_peak); its gradient is left to the caller, who releases it
// (dense_sync_bytes_needed counts what is left of them).
int64_t cpu_exec_bytes_needed_rows(const Ir *ir, ExecMode mode, int64_t B,
                                   const int64_t *table_rows, const int64_t *param_elems);
// extra_bytes: what the caller keeps beside the executor (distributed training's gradient
// buckets, dense_sync_bytes_needed).
bool cpu_exec_check_fit_rows(const Ir *ir, ExecMode mode, int64_t B, const int64_t *table_rows,
                             const int64_t *param_elems, int64_t extra_bytes, char *err,
                             size_t err_size);
void cpu_exec_free(CpuExec *x);

// Deterministic initialization from `seed` (cpu_init.c, docs/executor.md): tables uniform with
// mean 0 and standard deviation 1/sqrt(D); weights uniform +-sqrt(6/(fan_in+fan_out)); biases
// 0; gains 1; PMA seeds N(0, 0.02²). Each tensor has its own stream, keyed by its name.
void cpu_exec_init_params(CpuExec *x, uint64_t seed);
// The fp32 initial values cpu_exec_init_params gives rows ids[n] of table t, into out[n x D]:
// a windowed table's owner makes its own rows without the rest.
void cpu_init_table_rows(const Ir *ir, int t, uint64_t seed, const int64_t *ids, int64_t n,
                         float *out);

// The fp32 initial values cpu_exec_init_params gives elements [from, from + n) of parameter
// t (row-major), into out[n]: a gathered parameter's part (cpu_exec_new_parts).
void cpu_init_param_part(const Ir *ir, int t, uint64_t seed, int64_t from, int64_t n,
                         float *out);

// Binds one batch (its sizes and data); the batch must outlive the next forward/backward.
// Returns false (and writes err) when it does not match the IR: the number of jagged dims or
// features, offsets that do not start at 0, run backwards, exceed a max length or disagree
// with the totals, too few entries, or ids outside a table. B may differ from the model's
// batch (value buffers are sized per batch).
bool cpu_exec_set_batch(CpuExec *x, const Batch *b, char *err, size_t err_size);

// Runs nodes [0, nforward) and returns the loss (NaN when the IR has none).
double cpu_exec_forward(CpuExec *x);
// Runs nodes [nforward, nnodes); afterwards cpu_exec_grad holds every gradient.
void cpu_exec_backward(CpuExec *x);
// Calls hook(ctx, node) after each backward node ran (NULL: none). Distributed training starts
// a bucket's all-reduce from it as soon as the bucket's gradients are final.
typedef void (*CpuNodeHook)(void *ctx, int node);
void cpu_exec_set_backward_hook(CpuExec *x, CpuNodeHook hook, void *ctx);

// The buffer of tensor t (float * in EXEC_F32 mode, double * in EXEC_F64), and its number of
// elements for the bound batch. Parameters and tables persist across batches. Values share
// buffers by liveness (a buffer goes back to a pool after the last node that reads it), so
// after cpu_exec_forward the values the backward pass reads are still there, and after
// cpu_exec_backward only the loss and the gradients are; a value whose buffer was given back
// has data NULL. cpu_exec_keep_values keeps them all. Each cpu_exec_backward needs its own
// cpu_exec_forward before it.
void *cpu_exec_data(CpuExec *x, int t);
int64_t cpu_exec_numel(const CpuExec *x, int t);
// Gives every value its own buffer, kept after the run, so any value can be read (tests,
// debugging); costs the memory of all values at once. Takes effect from the next forward.
void cpu_exec_keep_values(CpuExec *x, bool keep);
// The gradient of parameter or table tensor t: for a parameter, a dense buffer like the
// parameter (*nrows = 0, *row_ids = NULL); for a table, its rows tensor: *nrows distinct
// ascending ids in *row_ids and *nrows x D values. Returns NULL when t has no gradient.
// nrows and row_ids may be NULL.
void *cpu_exec_grad(CpuExec *x, int t, int64_t *nrows, const int64_t **row_ids);

// Frees the gradient buffer of parameter t until the next backward pass writes it again
// (ZeRO-3: once its bucket has packed it); cpu_exec_grad gives NULL for it until then.
void cpu_exec_release_grad(CpuExec *x, int t);

// The model's tasks: one per bce node, in IR order. After a forward, cpu_exec_task_probs
// gives sigmoid(logit) for each of the B examples (float, in both modes).
int cpu_exec_ntasks(const CpuExec *x);
const char *cpu_exec_task_name(const CpuExec *x, int task);
int cpu_exec_task_label(const CpuExec *x, int task);  // the label's IR tensor index
const float *cpu_exec_task_probs(CpuExec *x, int task);

#endif
