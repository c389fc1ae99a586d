// ir.h: the graph IR. A model is a list of tensors and a list of nodes in topological order.
// Every tensor carries its layout, symbolic shape and dtype; every node its op, source
// location, activation, mask and precision. One IR is printed as stable text, read back, and
// verified after every pass.
// defines: Ir, Tensor, Node, JaggedDim, DType, Layout, Act, Mask, AttnShape, Schedule, Optim,
//          Recompute, NodeAttr, IrGrad
#ifndef GEMC_IR_H
#define GEMC_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"

typedef enum OpKind {
#define OP(name, text, has_matmul, doc) OP_##name,
#include "ops.def"
#undef OP
  OP_COUNT
} OpKind;

const char *op_name(OpKind op);
bool op_from_name(const char *s, OpKind *out);
bool op_has_matmul(OpKind op);
// The backward ops of docs/autodiff.md (slice ... table_grad): legal only after Ir.nforward.
bool op_is_backward(OpKind op);

// Element types. The first five are op precisions as well; I64 holds ids.
#define DTYPES(X)      \
  X(F32, "fp32")       \
  X(BF16, "bf16")      \
  X(FP16, "fp16")      \
  X(FP8, "fp8")        \
  X(MXFP8, "mxfp8")    \
  X(F64, "fp64")       \
  X(I64, "i64")
typedef enum DType {
#define X(name, text) DT_##name,
  DTYPES(X)
#undef X
  DT_COUNT
} DType;
const char *dtype_name(DType t);
bool dtype_from_name(const char *s, DType *out);  // "fp32" (or "f32"), "bf16", ...

#define ACTS(X)                   \
  X(NONE, "none")                 \
  X(SOFTMAX, "softmax")           \
  X(SILU, "silu")                 \
  X(GELU, "gelu")                 \
  X(GELU_TAYLOR, "gelu_taylor")   \
  X(RELU, "relu")                 \
  X(SIGMOID, "sigmoid")
typedef enum Act {
#define X(name, text) ACT_##name,
  ACTS(X)
#undef X
  ACT_COUNT
} Act;
const char *act_name(Act a);
bool act_from_name(const char *s, Act *out);

typedef enum Mask { MASK_NONE, MASK_CAUSAL } Mask;
const char *mask_name(Mask m);
bool mask_from_name(const char *s, Mask *out);

// The four attention shapes of the GEM paper.
typedef enum AttnShape { ATTN_SELF, ATTN_CROSS, ATTN_PMA, ATTN_PFFN } AttnShape;
const char *attn_shape_name(AttnShape s);
bool attn_shape_from_name(const char *s, AttnShape *out);

typedef enum Pool { POOL_SUM, POOL_MEAN } Pool;
const char *pool_name(Pool p);
bool pool_from_name(const char *s, Pool *out);

// Where the batch-major data of a tensor lives:
//   DENSE  [B, w]        (w == 0: [B], one value per example, e.g. ids or labels)
//   SET    [B, k, w]
//   JAGGED [B, *j, w]    values [T_j, w] plus offsets [B+1] (w == 0: ids [T_j])
//   FIXED  [d0] or [d0, d1], no batch dim: parameters and tables
//   SCALAR []            a loss
//   ROWS   [U_t, w]      a table's sparse gradient: U_t distinct row ids (ascending), w wide
typedef enum Layout {
  LAYOUT_DENSE,
  LAYOUT_SET,
  LAYOUT_JAGGED,
  LAYOUT_FIXED,
  LAYOUT_SCALAR,
  LAYOUT_ROWS
} Layout;
const char *layout_name(Layout l);
bool layout_from_name(const char *s, Layout *out);

// A jagged dim: the lengths of one sequence input, shared by every tensor aligned with it.
// Printed as *name; its total is T_name and its max length L_name.
typedef struct JaggedDim {
  const char *name;  // the sequence input that owns the offsets
  int64_t max_len;   // L_name
  Loc loc;
} JaggedDim;

typedef enum OptimKind { OPTIM_NONE, OPTIM_ADAMW, OPTIM_SGD, OPTIM_ROWWISE_ADAGRAD } OptimKind;
typedef struct Optim {
  OptimKind kind;
  double lr, beta1, beta2, eps, weight_decay;
} Optim;
const char *optim_name(OptimKind k);
bool optim_from_name(const char *s, OptimKind *out);

// How distributed training spreads the model (docs/distributed.md); the `parallel { }` block
// and a table's `shard` attribute set them, the command line overrides them. They are how a
// model is run, not what it computes: the model key leaves them out.
typedef enum ShardDense {
  SHARD_DENSE_UNSET, SHARD_DENSE_DATA_PARALLEL, SHARD_DENSE_ZERO1, SHARD_DENSE_ZERO2,
  SHARD_DENSE_ZERO3
} ShardDense;
typedef enum ShardTable {
  SHARD_TABLE_UNSET, SHARD_TABLE_REPLICATE, SHARD_TABLE_WHOLE, SHARD_TABLE_ROW, SHARD_TABLE_AUTO
} ShardTable;
const char *shard_dense_name(ShardDense s);  // "data_parallel", "zero1", "zero2", "zero3"
const char *shard_table_name(ShardTable s);  // "replicate", "table", "row", "auto"
bool shard_dense_from_name(const char *s, ShardDense *out);
bool shard_table_from_name(const char *s, ShardTable *out);

typedef struct Parallel {
  ShardDense dense;
  int64_t bucket_mb;     // 0: unset
  ShardTable tables;     // tables without a `shard` of their own
} Parallel;

typedef enum TensorKind {
  TENSOR_INPUT,  // a model input, fed by the data loader
  TENSOR_LABEL,  // a label input
  TENSOR_PARAM,  // a learned parameter: a weight, a gain, PMA seeds
  TENSOR_TABLE,  // an embedding table (a parameter with sparse updates)
  TENSOR_VALUE,  // produced by a node
} TensorKind;

typedef struct Tensor {
  const char *name;  // without sigil; printed %name (inputs, values) or @name (params, tables)
  TensorKind kind;
  Layout layout;
  int jag;           // JAGGED: index into Ir.jagged; -1 otherwise
  int64_t set_k;     // SET: k
  int64_t width;     // DENSE, SET, JAGGED: feature width (0: none)
  int64_t fixed[2];  // FIXED: dims
  int nfixed;        // FIXED: 1 or 2
  int table;         // ROWS: the index of the table whose gradient this is
  DType dtype;
  int producer;      // VALUE: index of the node that writes it; -1 otherwise
  Optim optim;       // PARAM and TABLE
  ShardTable shard;  // TABLE: its `shard` attribute (distributed training)
  Loc loc;
} Tensor;

// Optional schedule hints; 0 means "compiler's choice".
typedef struct Schedule {
  int tile_q, tile_kv, tile_m, tile_n, tile_k, stages;
  int zigzag;        // 0 unset, 1 on, 2 off
  int gelu_taylor;   // 0 unset, 1 taylor, 2 exact
  int deterministic; // 0 unset, 1 true, 2 false (attention: dQ by float atomics)
  int recompute;     // a Recompute: whether the backward recomputes the node's output
                     // instead of keeping it (compiler/passes/recompute.c)
} Schedule;

// Schedule.recompute. TRUE and FALSE are the hint as written; KEEP is the result of a call
// marked TRUE, kept as the checkpoint the next marked call recomputes from; COPY is a
// recomputed copy in the backward. The text prints true, false, keep and copy.
typedef enum Recompute {
  RECOMPUTE_UNSET, RECOMPUTE_TRUE, RECOMPUTE_FALSE, RECOMPUTE_COPY, RECOMPUTE_KEEP
} Recompute;

// IR_MAX_INPUTS bounds every node (table_grad takes a table and up to 15 (ids, dy) pairs);
// the variadic forward ops (concat, stack, dot_interact, loss_sum) take at most IR_MAX_PARTS.
enum { IR_MAX_INPUTS = 32, IR_MAX_PARTS = 16 };
// The most lookups of one table: its table_grad node takes the table and one pair per lookup.
enum { IR_MAX_TABLE_LOOKUPS = (IR_MAX_INPUTS - 1) / 2 };

// The attributes a node prints in {...}, in this order; each op has the subset docs/ir.md
// lists (op_has_attr). Schedule hints that are set follow them.
#define NODE_ATTRS(X)          \
  X(SHAPE, "shape")            \
  X(HEADS, "heads")            \
  X(POOL, "pool")              \
  X(ACT, "act")                \
  X(MASK, "mask")              \
  X(WINDOW, "window")          \
  X(SCALE, "scale")            \
  X(HSTU_NORM, "hstu_norm")    \
  X(EPS, "eps")                \
  X(PREC, "prec")              \
  X(TASK, "task")              \
  X(WEIGHTS, "weights")        \
  X(START, "start")            \
  X(WEIGHT, "weight")
typedef enum NodeAttr {
#define X(name, text) ATTR_##name,
  NODE_ATTRS(X)
#undef X
  ATTR_COUNT
} NodeAttr;
const char *node_attr_name(NodeAttr a);
bool op_has_attr(OpKind op, NodeAttr a);

typedef struct Node {
  OpKind op;
  Loc loc;
  int out;                  // tensor index
  int ins[IR_MAX_INPUTS];   // tensor indices, params included (see ir_verify.c for each op's order)
  int nins;
  DType prec;               // the precision the op computes in
  Act act;                  // ACT, LINEAR (fused), ATTENTION; ACT_BWD, LINEAR_ACT_BWD
  Mask mask;                // ATTENTION (and its backward ops)
  AttnShape shape;          // ATTENTION
  int64_t heads;            // ATTENTION
  int64_t window;           // ATTENTION; 0: none
  double scale;             // ATTENTION; SCALE: the factor
  bool hstu_norm;           // ATTENTION: divide P by the max kv length
  double eps;               // RMSNORM, LAYERNORM (and their backward ops)
  Pool pool;                // EMBED_POOL, EMBED_POOL_BWD
  double weights[IR_MAX_INPUTS];  // LOSS_SUM: one per input
  const char *task;         // BCE: the task name for reports
  int64_t start;            // SLICE: first column; UNSTACK: element; DOT_INTERACT_BWD: input
  double weight;            // BCE_BWD: the loss weight of its bce term
  Schedule sched;
} Node;

// The activation a node computes: gelu under @schedule(gelu = taylor) is gelu_taylor. Every
// backend reads this, never n->act alone.
static inline Act node_act(const Node *n) {
  return n->act == ACT_GELU && n->sched.gelu_taylor == 1 ? ACT_GELU_TAYLOR : n->act;
}

// One parameter's or table's gradient: `grad @w = %w.grad`.
typedef struct IrGrad {
  int param;  // a PARAM or TABLE tensor
  int grad;   // the value holding its gradient: fp32 like the parameter, rows[U_t, D] for a table
} IrGrad;

typedef struct Ir {
  Arena *arena;
  const char *model;
  const char *source;       // the .gem path
  const char *source_text;  // the .gem text (not printed; NULL for an IR read from text), for
                            // the source lines in generated code's comments
  const char *target;       // "sm_90a" or "sm_100a"
  DType precision;          // model default
  int64_t batch;            // B
  int64_t dim;              // model dim
  Optim dense_optim;
  Parallel parallel;        // the `parallel { }` block; all unset without one
  bool defer_table_updates; // not from the language (never printed): the GPU plan of a rank
                            // of several, whose table rows are merged across ranks between
                            // the backward pass and the optimizer (codegen/ops/lower_sparse.c)
  JaggedDim *jagged;
  int njagged, cap_jagged;
  Tensor *tensors;
  int ntensors, cap_tensors;
  Node *nodes;
  int nnodes, cap_nodes;
  // Nodes [0, nforward) are the forward pass and [nforward, nnodes) the backward pass
  // (docs/autodiff.md). ir_add_node keeps nforward == nnodes until ir_begin_backward.
  int nforward;
  bool in_backward;         // set by ir_begin_backward
  IrGrad *grads;            // gradient records, in print order (tables, then parameters)
  int ngrads, cap_grads;
  int loss;                 // tensor index of the scalar loss; -1 when none
  // ir_find_tensor's index: open addressing, tensor index + 1 per slot (0: empty). Kept by
  // ir_add_tensor; a pass that removes, reorders or renames tensors calls ir_reindex.
  int *name_slots;
  int cap_name_slots;       // a power of two, or 0
  int named;                // tensors [0, named) are in the index
} Ir;

void ir_init(Ir *ir, Arena *arena);
int ir_add_jagged(Ir *ir, const char *name, int64_t max_len, Loc loc);
int ir_add_tensor(Ir *ir, const Tensor *t);          // returns its index
int ir_add_node(Ir *ir, const Node *n);              // sets the out tensor's producer
// Marks the end of the forward pass: nodes added from now on are backward nodes.
void ir_begin_backward(Ir *ir);
void ir_add_grad(Ir *ir, int param, int grad);       // records `grad @param = %grad`
int ir_grad_of(const Ir *ir, int param);             // its gradient's tensor index, or -1
int ir_find_tensor(const Ir *ir, const char *name);  // -1 if absent
void ir_reindex(Ir *ir);  // rebuilds the name index after tensors were removed or renamed

// Text form. Stable: the same IR always prints the same bytes, and ir_read of the output
// gives an IR that prints identically.
void ir_print(FILE *out, const Ir *ir);
// A tensor's type as ir_print writes it ("fp32 jagged[B, *history, 32]"), for messages.
void ir_format_type(const Ir *ir, const Tensor *t, char *buf, size_t size);
// Parses ir_print output. Errors go to d with line and column in the text.
bool ir_read(const SourceFile *f, Arena *arena, Diag *d, Ir *out);

// Checks every invariant (topological order, arity, shapes, dtypes, layouts). On failure
// writes one line naming the node and the broken rule to `err` and returns false.
bool ir_verify(const Ir *ir, char *err, size_t err_size);

#endif
