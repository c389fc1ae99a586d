// cpu_exec_internal.h: what the parts of the CPU executor share. cpu_exec.c owns the CpuExec
// (buffers, the bound batch, the node loop); the op kernels are written once over a `real`
// type (cpu_*_real.h) and compiled twice, over float in cpu_kernels_f32.c and over double in
// cpu_kernels_f64.c; cpu_init.c fills the parameters.
// defines: CpuExec, TensorBuf, NodeKernel, cpu_kernels_f32, cpu_kernels_f64, cpu_scratch
#ifndef GEMC_CPU_EXEC_INTERNAL_H
#define GEMC_CPU_EXEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_exec.h"
#include "ir.h"

// The storage of one tensor for the bound batch. `data` holds float or double per the mode:
// the tensor's own buffer, or a pooled one (cpu_pool.c) while the value is alive.
typedef struct TensorBuf {
  void *data;         // NULL for a pooled value that is not alive
  void *own;          // the tensor's own buffer (inputs, parameters, kept values)
  int64_t own_cap;    // elements allocated in `own`
  int block;          // the pool block holding it, or -1
  int64_t numel;      // elements for the bound batch (rows * width)
  int64_t rows;       // dense: B; set: B*k; jagged: T; fixed[d0, d1]: d0; rows layout: U;
                      // fixed[d0] and scalars: 1
  int64_t width;      // elements per row (fixed[d0]: d0; [B] tensors and scalars: 1)
  int64_t *ids;       // i64 inputs: the batch's ids (not copied)
  int64_t *row_ids;   // rows layout (table gradients): the distinct ids, ascending
  int64_t cap_ids;
} TensorBuf;

// One buffer of the value pool (cpu_pool.c).
typedef struct PoolBlock {
  void *data;
  int64_t cap;        // elements
  int owner;          // the tensor using it, or -1 when free
} PoolBlock;

// A growable scratch buffer; kernels ask for what they need per call.
typedef struct Scratch {
  void *data;
  size_t size;
} Scratch;

enum { CPU_SCRATCH_SLOTS = 48 };

struct CpuExec {
  const Ir *ir;
  ExecMode mode;
  size_t elem;          // sizeof(float) or sizeof(double)
  int nforward;         // nodes [0, nforward) are the forward pass
  TensorBuf *buf;       // one per tensor
  bool *windowed;       // per tensor: a windowed table (cpu_exec_new_windowed)
  int *feature_of;      // tensor -> batch feature index, or -1
  int nfeatures;        // inputs and labels: what a batch must hold
  // The bound batch.
  const Batch *batch;
  int64_t B;
  int64_t *total;       // per jagged dim: T
  const int64_t **offsets;  // per jagged dim: B+1 offsets
  // Attention backward: the three nodes of one forward attention are computed in one pass.
  // fused[i] >= 0 names the node that already wrote node i's output (then it is skipped);
  // for the node that runs, bwd_q/k/v[i] are the nodes whose outputs it writes, itself
  // included (-1: none of that kind).
  int *fused, *bwd_q, *bwd_k, *bwd_v;
  // Tasks: one per bce node.
  int ntasks;
  int *task_node;
  float **task_probs;   // [ntasks][task_cap]
  int64_t task_cap;
  // The value pool: each value's last reader, and the buffers.
  bool keep_values;     // every value keeps its own buffer (cpu_exec_keep_values)
  CpuNodeHook backward_hook;  // cpu_exec_set_backward_hook
  void *backward_hook_ctx;
  bool forward_ran;     // a forward pass since the last backward pass (pooled buffers live)
  // Gathered parameters (cpu_exec_new_parts): per tensor, the first and last node of each pass
  // (0: forward, 1: backward) that reads it, or -1 (not gathered, or not read in that pass).
  int *gather_first[2], *gather_last[2];
  CpuParamFill param_fill;  // cpu_exec_set_param_fill
  void *param_fill_ctx;
  int *last_use;        // per tensor: the last node that reads it, or -1
  PoolBlock *pool;
  int npool, cap_pool;
  Scratch scratch[CPU_SCRATCH_SLOTS];
  void *gemm_work;      // packing buffers of the blocked matmul
  bool wide_kernels;    // use the AVX2+FMA matmul tile (x86-64 CPUs that have it)
};

// x86-64 builds carry a second matmul tile compiled for AVX2 and FMA, used when the CPU has
// them; elsewhere the baseline tile (vectorized for the target's default ISA) is all.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_WIDE_KERNELS 1
#else
#define CPU_WIDE_KERNELS 0
#endif

// The blocked matmul's register tile (MR x NR) and cache blocks (MC x KC of A, KC x NC of B),
// in elements; CpuExec.gemm_work holds one packed block of each.
// The tile is MM_MR rows by 64 bytes (16 floats or 8 doubles).
enum { MM_MR = 6, MM_MC = 72, MM_KC = 256, MM_NC = 1024 };
_Static_assert(MM_MC % MM_MR == 0 && MM_NC % 16 == 0, "blocks hold whole register tiles");
#define CPU_GEMM_WORK_BYTES (((size_t)MM_MC * MM_KC + (size_t)MM_KC * MM_NC) * sizeof(double))

// The activation a node evaluates: its act, with gelu replaced by gelu_taylor when the
// schedule asks for it (@schedule(gelu = taylor)).
static inline Act cpu_node_act(const Node *n) {
  return node_act(n);
}

typedef void (*NodeKernel)(CpuExec *x, int node);

// The kernel of each op (NULL: not an op this executor knows), per mode.
extern const NodeKernel cpu_kernels_f32[OP_COUNT];
extern const NodeKernel cpu_kernels_f64[OP_COUNT];

// The offsets of tensor t's jagged dim for the bound batch (NULL when t is not jagged).
const int64_t *cpu_offsets_of(const CpuExec *x, int t);
// Ensures the rows tensor t can hold nrows rows (ids and values), sets its rows and numel.
void cpu_resize_rows(CpuExec *x, int t, int64_t nrows);
// A scratch buffer of at least `bytes` (one per slot, kept across calls; contents are not).
void *cpu_scratch(CpuExec *x, int slot, size_t bytes);

// The value pool (cpu_pool.c): whether tensor t lives in it; the liveness plan (cpu_exec_new);
// a buffer for output t; giving back the buffers of node's inputs that it read last; giving
// back every buffer (each forward pass starts so); freeing the pool.
bool cpu_pool_holds(const CpuExec *x, int t);
void cpu_pool_plan(CpuExec *x);
void cpu_pool_take(CpuExec *x, int t);
void cpu_pool_release_inputs(CpuExec *x, int node);
void cpu_pool_reset(CpuExec *x);
void cpu_pool_free(CpuExec *x);

#endif
