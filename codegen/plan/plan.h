// plan.h: what codegen hands the GPU runtime. A Plan is the CUDA C source of one model for one
// target, plus the ordered list of launches that run one training step (forward, backward and
// optimizer), plus a memory plan. Sizes that depend on the batch (B and each jagged total T)
// are symbolic: SymSize. The plan prints as stable text (`gemc emit -o DIR` writes plan.txt)
// and reads back, so an AOT artifact can carry it.
// defines: SymSize, Buffer, LaunchArg, Launch, TileList, Scratch, Plan
//
// Storage conventions the runtime and the kernels share:
//   - every tensor is rows x width, row-major, in its dtype (fp8/mxfp8 values are stored as
//     bf16, i64 ids as int64); rows: B (dense), B*k (set), T_j (jagged), d0 (fixed), 1 (scalar)
//   - a ROWS tensor (a table's sparse gradient) is [int64 U][int64 ids[Umax]][fp32 Umax x D],
//     Umax = the occurrences of the table's ids in the batch; written by table_grad on device
//   - scalars (losses) are one fp32
#ifndef GEMC_PLAN_H
#define GEMC_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"
#include "ir.h"

// c + b·B + t·T_jag  (jag == -1: no T term). Every tensor size and every grid is one of these.
typedef struct SymSize {
  int64_t c, b, t;
  int jag;
} SymSize;

// Evaluates s for one batch: B examples and totals[j] = T_j.
int64_t symsize_eval(SymSize s, int64_t B, const int64_t *totals);

// A device buffer. Tensors whose lifetimes do not overlap share a buffer (liveness-based
// reuse); the runtime allocates each buffer at its size for the largest batch the model
// allows (every T_j at B·L_j), or grows it on demand.
typedef struct Buffer {
  const char *name;   // "buf3", or the parameter name for persistent ones
  SymSize bytes;
  bool persistent;    // parameters, tables, optimizer state, gradients of parameters
} Buffer;

typedef enum ArgKind {
  ARG_TENSOR,    // device pointer to tensor `tensor` (its buffer + offset)
  ARG_GRAD,      // device pointer to the gradient buffer of parameter/table `tensor`
  ARG_OPTSTATE,  // device pointer to optimizer state `slot` (0: m or rowsum, 1: v) of `tensor`
  ARG_OFFSETS,   // int64 offsets [B+1] of jagged dim `jag`
  ARG_SIZE,      // int64 value of `size` for this batch
  ARG_INT,       // int64 constant `i`
  ARG_FLOAT,     // fp32 constant `f`
  ARG_STEP,      // int64: the optimizer step (1, 2, ...)
  ARG_TILES,     // int32 device array of the tile list `tiles` (attention; built per batch)
  ARG_WORKSPACE, // device scratch of `size` bytes, zeroed before the launch
  ARG_SCRATCH,   // device pointer to codegen temporary `slot` (Plan.scratch): its buffer + offset
  ARG_TENSOR_MAP,// a TMA tensor map (CUtensorMap, 128 bytes) over tensor `tensor`: `size` rows
                 // of its width, boxes of `i` rows x 64 columns, 128-byte swizzle (sm_90a)
  ARG_TILE_COUNT,// int64: the entries of tile list `tiles` for this batch (persistent kernels)
} ArgKind;

typedef struct LaunchArg {
  ArgKind kind;
  int tensor, slot, jag, tiles;
  SymSize size;
  int64_t i;
  float f;
} LaunchArg;

typedef enum LaunchKind {
  LAUNCH_KERNEL,  // a generated kernel from Plan.source
  LAUNCH_GEMM,    // a cuBLASLt matmul (see gemm_*), for dense linear layers
  LAUNCH_ZERO,    // memset `zero_arg` (ARG_TENSOR or ARG_SCRATCH) to 0 over `zero_bytes`
} LaunchKind;

// How many blocks a kernel launch has.
typedef enum GridKind {
  GRID_FIXED,     // grid = ceil(size / per_block) blocks; 0 blocks (an empty batch): skip it
  GRID_TILES,     // grid = number of tiles in tile list `tiles` (attention, zigzag order)
  GRID_PERSISTENT,// grid = min(entries of tile list `tiles`, SMs): one CTA per SM walks its own
                  // entries c, c + G, c + 2G, ... (gpu_tiles.h deals them for G = the SMs)
} GridKind;

// A kernel's parameters must fit CUDA's classic 4 KB parameter space (every driver and target
// takes it; CUDA 12.1 and later allow 32764 bytes on sm_70 and up, which gemc does not need).
// Each parameter takes at least 4 bytes, so no launch has more than PLAN_MAX_ARGS arguments,
// and a runtime may size its argument arrays by it. The kernels codegen builds stay far below
// (table_grad, the widest, takes about 2 per lookup, and sema allows IR_MAX_TABLE_LOOKUPS);
// kb_param reports a kernel past the limit as a diagnostic, never an internal error.
enum { PLAN_MAX_PARAM_BYTES = 4096, PLAN_MAX_ARGS = PLAN_MAX_PARAM_BYTES / 4 };

typedef struct Launch {
  LaunchKind kind;
  int node;              // the IR node it implements (the first one when fused)
  int nfused;            // how many IR nodes it covers (1 when not fused)
  bool backward;         // part of the backward pass
  bool optimizer;        // part of the optimizer update
  // LAUNCH_KERNEL
  const char *kernel;    // extern "C" name in Plan.source
  GridKind grid;
  SymSize size;          // GRID_FIXED: the work items
  int64_t per_block;     // GRID_FIXED: work items per block
  int threads;           // threads per block
  int smem;              // dynamic shared memory bytes
  int tiles;             // GRID_TILES: tile list index
  LaunchArg *args;       // [nargs], in Plan.arena; at most PLAN_MAX_ARGS
  int nargs;
  int cap_args;          // room at args (kb_param grows it)
  int param_bytes;       // bytes of CUDA parameter space the arguments take
  // LAUNCH_GEMM: C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C, row-major, with an
  // optional epilogue (bias add, activation). For fp8 inputs alpha carries the scales.
  LaunchArg gemm_a, gemm_b, gemm_c, gemm_bias;
  SymSize gemm_m;
  int64_t gemm_n;
  SymSize gemm_k;        // symbolic for linear_bwd_w (the reduction runs over the rows)
  bool gemm_trans_a, gemm_trans_b, gemm_has_bias;
  float gemm_beta;
  Act gemm_act;
  DType gemm_dtype;      // operand type: fp32, bf16, fp16, or fp8: E4M3 codes, both K-major
                         // (trans_b, not trans_a), each scaled by a device float
  LaunchArg gemm_scale_a, gemm_scale_b;  // fp8: the scales (a scratch's float [1]); else ARG_INT
  int gemm_k_align;      // fp8: k is rounded up to this multiple (the codes are zero-padded)
  // LAUNCH_ZERO
  int zero_tensor;       // the tensor when zero_arg is ARG_TENSOR, else -1
  LaunchArg zero_arg;
  SymSize zero_bytes;
} Launch;

// A tile list for an attention node: the runtime builds it per batch from the offsets, keeping
// only valid (example, q tile) pairs, sorted by work and dealt to SMs back and forth (zigzag)
// when `zigzag`.
typedef struct TileList {
  int node;
  int q_jag, kv_jag;     // -1 when q (or kv) is not jagged
  int64_t q_fixed;       // rows of q per example when not jagged (set k, PMA seeds, 1 for dense)
  int64_t kv_fixed;      // rows of kv per example when not jagged
  int tile_q, tile_kv;
  int heads;
  bool causal;
  int64_t window;
  bool zigzag;
  bool persistent;       // dealt for a persistent kernel: entry r*G + c is CTA c's r-th item,
                         // G = the SM count; an entry with example -1 is a hole to skip
  bool key_side;         // the rows are keys (a dK/dV list: q_* describe the keys, kv_* the
                         // queries); causal and window are the node's mask, which the work
                         // estimate applies from the keys' side (a key sees the queries after it)
} TileList;

// A temporary that codegen needs between launches and the IR does not name: a cast or
// quantized GEMM operand, an fp32 pre-activation, norm statistics, the sort of table_grad.
// It takes part in the memory plan like a tensor.
typedef struct Scratch {
  const char *name;          // "y.mlp0.l0.preact", "items.grad.perm"
  SymSize bytes;
  int buffer;                // index into Plan.buffers
  SymSize offset;            // byte offset inside it
} Scratch;

// The name of the generated source: `gemc emit -o DIR` writes DIR/model.cu, NVRTC compiles it
// under this name, and the #line after each kernel body names it.
#define PLAN_SOURCE_NAME "model.cu"

typedef struct Plan {
  Arena *arena;
  const Ir *ir;              // forward + backward IR the plan implements
  const char *target;        // "sm_90a" or "sm_100a"
  const char *source;        // CUDA C of every kernel (with the prelude included inline)
  Buffer *buffers; int nbuffers;
  int *tensor_buffer;        // [ir->ntensors]: buffer index, -1 when the tensor is never stored
  SymSize *tensor_offset;    // [ir->ntensors]: byte offset inside its buffer
  Launch *launches; int nlaunches;
  TileList *tiles; int ntiles;
  Scratch *scratch; int nscratch;
  int *optstate_buffer;      // [2 * ir->ntensors]: buffer of optimizer state slot s of tensor t
                             // at [2t + s] (AdamW m, v; row-wise Adagrad's rowsum in slot 0);
                             // -1 when none
} Plan;

// The bytes one argument of kind k takes in a kernel's parameter space (4 for a float, 8 for a
// pointer or an int64), and those all of l's arguments take, each aligned to its size.
int plan_arg_bytes(ArgKind k);
int launch_param_bytes(const Launch *l);

void plan_print(FILE *out, const Plan *p);
bool plan_read(const SourceFile *f, const Ir *ir, Arena *arena, Diag *d, Plan *out);

#endif
