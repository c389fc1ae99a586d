// ir.c: the graph IR's name tables (from the X-macros) and the calls that build an IR:
// ir_init, ir_add_jagged, ir_add_tensor, ir_add_node, ir_begin_backward, ir_add_grad, and
// ir_find_tensor's hash index.
#include "ir.h"

#include <string.h>

#include "internal_error.h"

// --- name tables ------------------------------------------------------------------------
// Each *_name returns "?" for a value outside its enum, so a broken IR still prints.

static const char *const op_names[] = {
#define OP(name, text, has_matmul, doc) text,
#include "ops.def"
#undef OP
};

static const bool op_matmul[] = {
#define OP(name, text, has_matmul, doc) has_matmul,
#include "ops.def"
#undef OP
};

static const char *const dtype_names[] = {
#define X(name, text) text,
    DTYPES(X)
#undef X
};

static const char *const act_names[] = {
#define X(name, text) text,
    ACTS(X)
#undef X
};

static const char *const mask_names[] = {"none", "causal"};
static const char *const attn_shape_names[] = {"self", "cross", "pma", "pffn"};
static const char *const pool_names[] = {"sum", "mean"};
static const char *const layout_names[] = {"dense", "set", "jagged", "fixed", "scalar", "rows"};
static const char *const optim_names[] = {"none", "adamw", "sgd", "rowwise_adagrad"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *name_at(const char *const *names, int n, int i) {
  return i >= 0 && i < n ? names[i] : "?";
}

// The index of `s` in `names`, or -1.
static int index_of(const char *const *names, int n, const char *s) {
  if (!s) return -1;
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], s) == 0) return i;
  return -1;
}

const char *op_name(OpKind op) { return name_at(op_names, COUNT(op_names), (int)op); }
bool op_has_matmul(OpKind op) { return (int)op >= 0 && op < OP_COUNT && op_matmul[op]; }
bool op_is_backward(OpKind op) { return op >= OP_SLICE && op < OP_COUNT; }
const char *dtype_name(DType t) { return name_at(dtype_names, COUNT(dtype_names), (int)t); }
const char *act_name(Act a) { return name_at(act_names, COUNT(act_names), (int)a); }
const char *mask_name(Mask m) { return name_at(mask_names, COUNT(mask_names), (int)m); }
const char *pool_name(Pool p) { return name_at(pool_names, COUNT(pool_names), (int)p); }
const char *layout_name(Layout l) { return name_at(layout_names, COUNT(layout_names), (int)l); }
const char *optim_name(OptimKind k) { return name_at(optim_names, COUNT(optim_names), (int)k); }
static const char *const shard_dense_names[] = {"unset", "data_parallel", "zero1", "zero2", "zero3"};
static const char *const shard_table_names[] = {"unset", "replicate", "table", "row", "auto"};
const char *shard_dense_name(ShardDense s) {
  return name_at(shard_dense_names, COUNT(shard_dense_names), (int)s);
}
const char *shard_table_name(ShardTable s) {
  return name_at(shard_table_names, COUNT(shard_table_names), (int)s);
}
bool shard_dense_from_name(const char *s, ShardDense *out) {
  for (int i = 1; i < (int)COUNT(shard_dense_names); i++)
    if (strcmp(s, shard_dense_names[i]) == 0) return (*out = (ShardDense)i), true;
  return false;
}
bool shard_table_from_name(const char *s, ShardTable *out) {
  for (int i = 1; i < (int)COUNT(shard_table_names); i++)
    if (strcmp(s, shard_table_names[i]) == 0) return (*out = (ShardTable)i), true;
  return false;
}

const char *attn_shape_name(AttnShape s) {
  return name_at(attn_shape_names, COUNT(attn_shape_names), (int)s);
}

bool op_from_name(const char *s, OpKind *out) {
  int i = index_of(op_names, COUNT(op_names), s);
  if (i >= 0) *out = (OpKind)i;
  return i >= 0;
}

bool dtype_from_name(const char *s, DType *out) {
  if (s && strcmp(s, "f32") == 0) s = "fp32";
  int i = index_of(dtype_names, COUNT(dtype_names), s);
  if (i >= 0) *out = (DType)i;
  return i >= 0;
}

bool act_from_name(const char *s, Act *out) {
  int i = index_of(act_names, COUNT(act_names), s);
  if (i >= 0) *out = (Act)i;
  return i >= 0;
}

bool mask_from_name(const char *s, Mask *out) {
  int i = index_of(mask_names, COUNT(mask_names), s);
  if (i >= 0) *out = (Mask)i;
  return i >= 0;
}

bool attn_shape_from_name(const char *s, AttnShape *out) {
  int i = index_of(attn_shape_names, COUNT(attn_shape_names), s);
  if (i >= 0) *out = (AttnShape)i;
  return i >= 0;
}

bool pool_from_name(const char *s, Pool *out) {
  int i = index_of(pool_names, COUNT(pool_names), s);
  if (i >= 0) *out = (Pool)i;
  return i >= 0;
}

bool layout_from_name(const char *s, Layout *out) {
  int i = index_of(layout_names, COUNT(layout_names), s);
  if (i >= 0) *out = (Layout)i;
  return i >= 0;
}

bool optim_from_name(const char *s, OptimKind *out) {
  int i = index_of(optim_names, COUNT(optim_names), s);
  if (i >= 0) *out = (OptimKind)i;
  return i >= 0;
}

// --- building ---------------------------------------------------------------------------

void ir_init(Ir *ir, Arena *arena) {
  memset(ir, 0, sizeof *ir);
  ir->arena = arena;
  ir->precision = DT_F32;
  ir->loss = -1;
}

int ir_add_jagged(Ir *ir, const char *name, int64_t max_len, Loc loc) {
  if (ir->njagged == ir->cap_jagged) {
    int cap = ir->cap_jagged ? 2 * ir->cap_jagged : 4;
    ir->jagged = arena_grow(ir->arena, ir->jagged, (size_t)ir->njagged, (size_t)cap,
                            sizeof *ir->jagged);
    ir->cap_jagged = cap;
  }
  JaggedDim *j = &ir->jagged[ir->njagged];
  j->name = name ? arena_strdup(ir->arena, name) : NULL;
  j->max_len = max_len;
  j->loc = loc;
  return ir->njagged++;
}

// --- the name index ---------------------------------------------------------------------

static unsigned hash_name(const char *s) {
  unsigned h = 2166136261u;  // FNV-1a
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

// Puts tensor `i` in the index unless its name is there already (the first one wins, and
// the verifier reports the duplicate).
static void index_insert(Ir *ir, int i) {
  const char *name = ir->tensors[i].name;
  if (!name) return;
  unsigned mask = (unsigned)ir->cap_name_slots - 1;
  for (unsigned s = hash_name(name) & mask;; s = (s + 1) & mask) {
    int at = ir->name_slots[s] - 1;
    if (at < 0) {
      ir->name_slots[s] = i + 1;
      return;
    }
    if (ir->tensors[at].name && strcmp(ir->tensors[at].name, name) == 0) return;
  }
}

// Makes room for `n` names at a load of at most one half, and indexes [0, ntensors).
static void index_rebuild(Ir *ir, int n) {
  int cap = 16;
  while (cap < 2 * n) {
    GEMC_ASSERT(cap < (1 << 29));
    cap *= 2;
  }
  if (cap != ir->cap_name_slots) {
    ir->name_slots = arena_alloc(ir->arena, (size_t)cap * sizeof *ir->name_slots);
    ir->cap_name_slots = cap;
  } else {
    memset(ir->name_slots, 0, (size_t)cap * sizeof *ir->name_slots);
  }
  for (int i = 0; i < ir->ntensors; i++) index_insert(ir, i);
  ir->named = ir->ntensors;
}

void ir_reindex(Ir *ir) { index_rebuild(ir, ir->ntensors); }

int ir_add_tensor(Ir *ir, const Tensor *t) {
  if (ir->ntensors == ir->cap_tensors) {
    int cap = ir->cap_tensors ? 2 * ir->cap_tensors : 16;
    GEMC_ASSERT(cap > ir->cap_tensors);
    ir->tensors = arena_grow(ir->arena, ir->tensors, (size_t)ir->ntensors, (size_t)cap,
                             sizeof *ir->tensors);
    ir->cap_tensors = cap;
  }
  int i = ir->ntensors++;
  ir->tensors[i] = *t;
  if (t->name) ir->tensors[i].name = arena_strdup(ir->arena, t->name);
  if (ir->named != i || 2 * ir->ntensors > ir->cap_name_slots) {
    index_rebuild(ir, 2 * ir->ntensors);
  } else {
    index_insert(ir, i);
    ir->named = ir->ntensors;
  }
  return i;
}

int ir_find_tensor(const Ir *ir, const char *name) {
  if (!name) return -1;
  int named = ir->named <= ir->ntensors ? ir->named : 0;
  if (ir->cap_name_slots > 0 && named > 0) {
    unsigned mask = (unsigned)ir->cap_name_slots - 1;
    for (unsigned s = hash_name(name) & mask;; s = (s + 1) & mask) {
      int at = ir->name_slots[s] - 1;
      if (at < 0) break;
      if (at < ir->ntensors && ir->tensors[at].name && strcmp(ir->tensors[at].name, name) == 0)
        return at;
    }
  }
  // Tensors appended without ir_add_tensor are not indexed yet.
  for (int i = named; i < ir->ntensors; i++)
    if (ir->tensors[i].name && strcmp(ir->tensors[i].name, name) == 0) return i;
  return -1;
}

int ir_add_node(Ir *ir, const Node *n) {
  GEMC_ASSERT(n->out >= 0 && n->out < ir->ntensors);
  if (ir->nnodes == ir->cap_nodes) {
    int cap = ir->cap_nodes ? 2 * ir->cap_nodes : 16;
    GEMC_ASSERT(cap > ir->cap_nodes);
    ir->nodes = arena_grow(ir->arena, ir->nodes, (size_t)ir->nnodes, (size_t)cap,
                           sizeof *ir->nodes);
    ir->cap_nodes = cap;
  }
  int i = ir->nnodes++;
  ir->nodes[i] = *n;
  ir->tensors[n->out].producer = i;
  if (!ir->in_backward) ir->nforward = ir->nnodes;
  return i;
}

void ir_begin_backward(Ir *ir) {
  ir->nforward = ir->nnodes;
  ir->in_backward = true;
}

void ir_add_grad(Ir *ir, int param, int grad) {
  if (ir->ngrads == ir->cap_grads) {
    int cap = ir->cap_grads ? 2 * ir->cap_grads : 16;
    GEMC_ASSERT(cap > ir->cap_grads);
    ir->grads = arena_grow(ir->arena, ir->grads, (size_t)ir->ngrads, (size_t)cap,
                           sizeof *ir->grads);
    ir->cap_grads = cap;
  }
  ir->grads[ir->ngrads++] = (IrGrad){param, grad};
}

int ir_grad_of(const Ir *ir, int param) {
  for (int i = 0; i < ir->ngrads; i++)
    if (ir->grads[i].param == param) return ir->grads[i].grad;
  return -1;
}

// --- node attributes --------------------------------------------------------------------

static const char *const node_attr_names[] = {
#define X(name, text) text,
    NODE_ATTRS(X)
#undef X
};

const char *node_attr_name(NodeAttr a) {
  return name_at(node_attr_names, COUNT(node_attr_names), (int)a);
}

#define BIT(a) (1u << ATTR_##a)

// The table of docs/ir.md, "Ops".
static unsigned op_attrs(OpKind op) {
  switch (op) {
  case OP_EMBED: return BIT(PREC);
  case OP_EMBED_POOL: return BIT(POOL) | BIT(PREC);
  case OP_LINEAR: return BIT(ACT) | BIT(PREC);
  case OP_RMSNORM:
  case OP_LAYERNORM: return BIT(EPS) | BIT(PREC);
  case OP_ACT: return BIT(ACT) | BIT(PREC);
  case OP_ADD:
  case OP_SUB:
  case OP_MUL:
  case OP_CONCAT:
  case OP_STACK:
  case OP_FLATTEN:
  case OP_DOT_INTERACT: return BIT(PREC);
  case OP_ATTENTION:
    return BIT(SHAPE) | BIT(HEADS) | BIT(ACT) | BIT(MASK) | BIT(WINDOW) | BIT(SCALE) |
           BIT(HSTU_NORM) | BIT(PREC);
  case OP_BCE: return BIT(TASK);
  case OP_LOSS_SUM: return BIT(WEIGHTS);
  // The backward ops (docs/autodiff.md). Only those with a matmul have a prec.
  case OP_SCALE: return BIT(SCALE) | BIT(PREC);
  case OP_SLICE:
  case OP_UNSTACK: return BIT(START);
  case OP_UNFLATTEN:
  case OP_REDUCE_ROWS:
  case OP_TABLE_GRAD: return 0;
  case OP_ACT_BWD: return BIT(ACT);
  case OP_LINEAR_ACT_BWD: return BIT(ACT) | BIT(PREC);
  case OP_LINEAR_BWD_X:
  case OP_LINEAR_BWD_W: return BIT(PREC);
  case OP_RMSNORM_BWD_X:
  case OP_RMSNORM_BWD_GAIN:
  case OP_LAYERNORM_BWD_X:
  case OP_LAYERNORM_BWD_GAIN: return BIT(EPS);
  case OP_DOT_INTERACT_BWD: return BIT(PREC) | BIT(START);
  case OP_ATTENTION_BWD_Q:
  case OP_ATTENTION_BWD_K:
  case OP_ATTENTION_BWD_V: return op_attrs(OP_ATTENTION);
  case OP_BCE_BWD: return BIT(WEIGHT);
  case OP_EMBED_POOL_BWD: return BIT(POOL);
  case OP_COUNT: break;
  }
  return 0;
}

bool op_has_attr(OpKind op, NodeAttr a) {
  return (int)a >= 0 && a < ATTR_COUNT && (op_attrs(op) >> a & 1u);
}
