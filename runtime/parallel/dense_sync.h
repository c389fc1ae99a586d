// dense_sync.h: the dense parameters' gradients across ranks, in buckets.
//   - Data parallel: each bucket's gradients are all-reduced as soon as the backward pass has
//     finished all of them (dense_sync_node_done runs after every backward node), so the
//     communication overlaps the rest of the backward. Every rank then applies the same
//     update to the same parameters.
//   - ZeRO-1: the same all-reduce, but each rank owns one contiguous part of every bucket and
//     updates only that part (its optimizer arithmetic and state are 1/world of the whole);
//     the updated parameters are then all-gathered.
//   - ZeRO-2: a reduce-scatter instead of the all-reduce, so each rank receives only the
//     reduced gradients of its part; then the same update and all-gather as ZeRO-1.
//   - ZeRO-3: the same reduce-scatter and update as ZeRO-2, but the parameters are sharded
//     too: a rank keeps only its part of their values (dense_sync_shard), and the executor
//     gathers a parameter whole for the nodes of a pass that read it (dense_sync_gather,
//     cpu_exec_new_parts), then frees it. The packed gradients of a bucket exist only while
//     its reduction is in flight. CPU ranks only.
// A rank's gradients are scaled by its share of the global batch (its examples / B) before
// the sum, so the result is the gradient of the global batch's mean loss.
// defines: DenseMode, DenseSync, dense_sync_*
#ifndef GEMC_DENSE_SYNC_H
#define GEMC_DENSE_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "cpu_exec.h"
#include "ir.h"
#include "optim.h"

typedef enum DenseMode { DENSE_DATA_PARALLEL, DENSE_ZERO1, DENSE_ZERO2, DENSE_ZERO3 } DenseMode;
const char *dense_mode_name(DenseMode m);  // "data-parallel", "zero1", "zero2", "zero3"
bool dense_mode_parse(const char *s, DenseMode *out);

typedef struct DenseSync DenseSync;

// params[n]: the IR tensors of the dense parameters that have gradients. Buckets hold whole
// parameters, in the order the backward pass finishes their gradients, up to bucket_bytes
// (one parameter larger than that is a bucket of its own).
DenseSync *dense_sync_new(Comm *c, const Ir *ir, DenseMode mode, int64_t bucket_bytes,
                          const int *params, int n);
// The memory the buckets of a CPU rank take, at their peak: every bucket's packed gradients
// and this rank's part of each, for the parameters params[n] over `world` ranks. ZeRO-3 keeps
// two buckets packed (the most in flight) and the executor's gradients of one more, which it
// releases as they are packed.
int64_t dense_sync_bytes_needed(const Ir *ir, DenseMode mode, int64_t bucket_bytes,
                                const int *params, int n, int world);
// GPU ranks (NCCL), data parallel: the gradients stay in the executor's device buffers,
// grads[i] holding params[i]'s (fp32, its numel). final[i] is the step after which that
// gradient is final: a plan launch index, which dense_sync_node_done then takes instead of an
// IR node. Each bucket becomes one grouped in-place all-reduce, each rank's values scaled by
// its share before the sum (NCCL's PreMulSum), ordered after the compute-stream event given
// to dense_sync_begin_device, which the caller records just before a node_done that starts
// a bucket (dense_sync_due), and records again after the whole backward pass before
// dense_sync_finish (which starts any bucket not yet started, after that event).
DenseSync *dense_sync_new_device(Comm *c, const Ir *ir, int64_t bucket_bytes,
                                 const int *params, const int *final, void *const *grads,
                                 int n);
void dense_sync_begin_device(DenseSync *d, double share, void *event);
bool dense_sync_due(const DenseSync *d, int step);  // node_done(step) would start a bucket
void dense_sync_free(DenseSync *d);
DenseMode dense_sync_mode(const DenseSync *d);
int dense_sync_buckets(const DenseSync *d);
int64_t dense_sync_elements(const DenseSync *d);  // gradient elements sent per step

// A step's backward pass: begin (share = this rank's examples / B), then node_done after each
// backward node, then finish, which waits for every bucket. After finish, data parallel and
// ZeRO-1 have the global gradients in the executor's gradient buffers; ZeRO-2 has them only
// for this rank's parts, inside the sync.
void dense_sync_begin(DenseSync *d, CpuExec *x, double share);
void dense_sync_node_done(DenseSync *d, int node);
bool dense_sync_finish(DenseSync *d, char *err, size_t err_size);
// ZeRO: the update of this rank's parts (states[i]: parameter i's optimizer, in the order of
// `params`), then the all-gather of the updated parameters. Each state's step advances.
bool dense_sync_update(DenseSync *d, OptimState *const *states, char *err, size_t err_size);
// ZeRO: the elements of parameter i (in the order of `params`) that this rank owns,
// [*from, *from + n); n is 0 when it owns none (and always for data parallel).
int64_t dense_sync_owned(const DenseSync *d, int i, int64_t *from);
// ZeRO-3: the values of this rank's part of parameter i, [*from, *from + *n) of its elements
// (NULL and 0 when it owns none); they persist, and dense_sync_update updates them.
float *dense_sync_shard(DenseSync *d, int i, int64_t *from, int64_t *n);
// ZeRO-3: parameter i whole into whole[numel], from every rank's part (a collective: every
// rank calls it for the same parameters in the same order).
bool dense_sync_gather(DenseSync *d, int i, float *whole, char *err, size_t err_size);
// ZeRO-3: the gradients a bucket packs are released from the executor then, so the divergence
// guard reads their non-finite values here. dense_sync_count_bad(d, true) makes the packing
// count them; dense_sync_bad_grad then gives parameter i's counts (in the order of `params`)
// and true once this step's backward has packed it (false before, and when not counting).
void dense_sync_count_bad(DenseSync *d, bool on);
bool dense_sync_bad_grad(const DenseSync *d, int i, int64_t *nan, int64_t *inf);
// Seconds this step spent waiting in finish and update (the exposed communication).
double dense_sync_wait_seconds(const DenseSync *d);
// Seconds from the step's first bucket start to the end of finish (the gradients' reduction,
// overlapped or not).
double dense_sync_span_seconds(const DenseSync *d);

#endif
