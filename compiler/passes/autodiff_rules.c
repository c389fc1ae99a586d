// autodiff_rules.c: the backward rule of every forward op (docs/autodiff.md, "Backward ops").
// Each rule gets the forward node and its output's gradient dy, and emits, for each input
// that gets a gradient through this use (ad_slot >= 0), in input order, the nodes that
// compute that contribution. Matmul ops keep the forward prec; ops with an activation keep the
// forward act and gelu hint; attention's backward ops carry every attribute of the forward.
#include <stdarg.h>

#include "autodiff_internal.h"
#include "internal_error.h"

// A backward node of `f` with `nins` inputs (tensor indices).
static Node node_of(const Node *f, OpKind op, int nins, ...) {
  Node n = ad_node(f, op);
  va_list ap;
  va_start(ap, nins);
  for (int k = 0; k < nins; k++) n.ins[n.nins++] = va_arg(ap, int);
  va_end(ap);
  if (op_has_attr(op, ATTR_ACT)) {
    n.act = f->act;
    n.sched.gelu_taylor = f->sched.gelu_taylor;
  }
  return n;
}

static Tensor type_of(const Ad *a, int t) { return a->ir->tensors[t]; }
static const char *name_of(const Ad *a, int t) { return a->ir->tensors[t].name; }

// embed: the lookup is an (ids, dy) pair of the table's table_grad. embed_pool first spreads
// dy over the ids of each example, %y.grad.per_id (divided by the length for mean).
static void embed_rule(Ad *a, int node, const Node *f, int dy) {
  int slot = ad_slot(a, node, 0);
  if (slot < 0) return;
  int table = f->ins[0], ids = f->ins[1];
  if (f->op == OP_EMBED_POOL) {
    Node n = node_of(f, OP_EMBED_POOL_BWD, 2, ids, dy);
    n.pool = f->pool;
    Tensor per_id = type_of(a, ids);
    per_id.width = type_of(a, table).fixed[1];
    per_id.dtype = DT_F32;
    dy = ad_emit_value(a, n, ad_name(a, name_of(a, f->out), "grad.per_id"), per_id);
  }
  ad_pair(a, table, slot, ids, dy);
}

// linear: with a fused activation, dz = linear_act_bwd(dy, x, w[, b]) (%y.pre.grad), else
// dz = dy; then dx = linear_bwd_x(dz, w), dw = linear_bwd_w(x, dz), db = reduce_rows(dz).
static void linear_rule(Ad *a, int node, const Node *f, int dy) {
  int x = f->ins[0], w = f->ins[1], b = f->nins == 3 ? f->ins[2] : -1;
  int dz = dy;
  if (f->act != ACT_NONE) {
    Node n = node_of(f, OP_LINEAR_ACT_BWD, 3, dy, x, w);
    if (b >= 0) n.ins[n.nins++] = b;
    dz = ad_emit_value(a, n, ad_name(a, name_of(a, f->out), "pre.grad"), type_of(a, dy));
  }
  int slot;
  if ((slot = ad_slot(a, node, 0)) >= 0) ad_emit(a, node_of(f, OP_LINEAR_BWD_X, 2, dz, w), x, slot);
  if ((slot = ad_slot(a, node, 1)) >= 0) ad_emit(a, node_of(f, OP_LINEAR_BWD_W, 2, x, dz), w, slot);
  if (b >= 0 && (slot = ad_slot(a, node, 2)) >= 0)
    ad_emit(a, node_of(f, OP_REDUCE_ROWS, 1, dz), b, slot);
}

// rmsnorm and layernorm: the input, the gain, and layernorm's bias (reduce_rows of dy).
static void norm_rule(Ad *a, int node, const Node *f, int dy) {
  bool rms = f->op == OP_RMSNORM;
  int x = f->ins[0], gain = f->ins[1];
  int slot;
  if ((slot = ad_slot(a, node, 0)) >= 0) {
    Node n = node_of(f, rms ? OP_RMSNORM_BWD_X : OP_LAYERNORM_BWD_X, 3, dy, x, gain);
    n.eps = f->eps;
    ad_emit(a, n, x, slot);
  }
  if ((slot = ad_slot(a, node, 1)) >= 0) {
    Node n = node_of(f, rms ? OP_RMSNORM_BWD_GAIN : OP_LAYERNORM_BWD_GAIN, 2, dy, x);
    n.eps = f->eps;
    ad_emit(a, n, gain, slot);
  }
  if (!rms && (slot = ad_slot(a, node, 2)) >= 0)
    ad_emit(a, node_of(f, OP_REDUCE_ROWS, 1, dy), f->ins[2], slot);
}

// add: both gradients are dy; sub: dy and -dy; mul: dy·b and dy·a. The scale and mul nodes
// compute in the dtype of the input whose gradient they write.
static void pointwise_rule(Ad *a, int node, const Node *f, int dy) {
  for (int k = 0; k < f->nins; k++) {
    int slot = ad_slot(a, node, k), x = f->ins[k];
    if (slot < 0) continue;
    if (f->op == OP_ADD || (f->op == OP_SUB && k == 0)) {
      ad_alias(a, f, x, slot, dy);
      continue;
    }
    Node n;
    if (f->op == OP_MUL) {
      n = node_of(f, OP_MUL, 2, dy, f->ins[1 - k]);
    } else {  // sub's b, or a scale node
      n = node_of(f, OP_SCALE, 1, dy);
      n.scale = f->op == OP_SUB ? -1 : f->scale;
    }
    n.prec = type_of(a, x).dtype;
    ad_emit(a, n, x, slot);
  }
}

static void act_rule(Ad *a, int node, const Node *f, int dy) {
  int slot = ad_slot(a, node, 0);
  if (slot >= 0) ad_emit(a, node_of(f, OP_ACT_BWD, 2, dy, f->ins[0]), f->ins[0], slot);
}

// concat: part k is slice(dy) from the sum of the widths before it; stack: unstack(dy) k;
// flatten: unflatten(dy).
static void shape_rule(Ad *a, int node, const Node *f, int dy) {
  int64_t start = 0;
  for (int k = 0; k < f->nins; k++) {
    int slot = ad_slot(a, node, k), x = f->ins[k];
    if (slot >= 0) {
      OpKind op = f->op == OP_CONCAT ? OP_SLICE : f->op == OP_STACK ? OP_UNSTACK : OP_UNFLATTEN;
      Node n = node_of(f, op, 1, dy);
      n.start = f->op == OP_CONCAT ? start : k;
      ad_emit(a, n, x, slot);
    }
    start += type_of(a, x).width;
  }
}

static void dot_interact_rule(Ad *a, int node, const Node *f, int dy) {
  for (int k = 0; k < f->nins; k++) {
    int slot = ad_slot(a, node, k);
    if (slot < 0) continue;
    Node n = node_of(f, OP_DOT_INTERACT_BWD, 1, dy);
    for (int j = 0; j < f->nins; j++) n.ins[n.nins++] = f->ins[j];
    n.start = k;
    ad_emit(a, n, f->ins[k], slot);
  }
}

// attention_bwd_q, _k, _v (q, k, v, dO), each with every attribute of the forward node.
static void attention_rule(Ad *a, int node, const Node *f, int dy) {
  static const OpKind ops[] = {OP_ATTENTION_BWD_Q, OP_ATTENTION_BWD_K, OP_ATTENTION_BWD_V};
  for (int k = 0; k < 3; k++) {
    int slot = ad_slot(a, node, k);
    if (slot < 0) continue;
    Node n = *f;
    n.op = ops[k];
    n.ins[3] = dy;
    n.nins = 4;
    n.sched = (Schedule){.gelu_taylor = f->sched.gelu_taylor,
                         .deterministic = f->sched.deterministic};
    ad_emit(a, n, f->ins[k], slot);
  }
}

// bce: the seed, weighted by the term's loss coefficient.
static void bce_rule(Ad *a, int node, const Node *f) {
  int slot = ad_slot(a, node, 0);
  if (slot < 0) return;
  Node n = node_of(f, OP_BCE_BWD, 2, f->ins[0], f->ins[1]);
  n.weight = a->coef[f->out];
  ad_emit(a, n, f->ins[0], slot);
}

void ad_rule(Ad *a, int node, int dy) {
  const Node f = a->ir->nodes[node];  // a copy: emitting nodes may move the array
  switch (f.op) {
  case OP_EMBED:
  case OP_EMBED_POOL: embed_rule(a, node, &f, dy); return;
  case OP_LINEAR: linear_rule(a, node, &f, dy); return;
  case OP_RMSNORM:
  case OP_LAYERNORM: norm_rule(a, node, &f, dy); return;
  case OP_ACT: act_rule(a, node, &f, dy); return;
  case OP_ADD:
  case OP_SUB:
  case OP_MUL:
  case OP_SCALE: pointwise_rule(a, node, &f, dy); return;
  case OP_CONCAT:
  case OP_STACK:
  case OP_FLATTEN: shape_rule(a, node, &f, dy); return;
  case OP_DOT_INTERACT: dot_interact_rule(a, node, &f, dy); return;
  case OP_ATTENTION: attention_rule(a, node, &f, dy); return;
  case OP_BCE: bce_rule(a, node, &f); return;
  default: break;  // loss_sum passes coefficients (autodiff.c); backward ops never get here
  }
  gemc_internal_error(__FILE__, __LINE__, "autodiff: no backward rule for this op");
}
