// ir_verify.c: checks every invariant of the graph IR (docs/ir.md, "Verifier rules"): the
// header, the jagged dims, each tensor, each node's order, section, arity, input kinds, shapes,
// dtypes and attributes (the backward ops as docs/autodiff.md defines them), and the gradient
// records. It runs after every pass; the first broken rule is reported as one line,
// "node N (%out = op %a, @b): rule", and the IR is left alone. Linear in the IR's size.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"
#include "ir.h"

typedef struct Check {
  const Ir *ir;
  char *err;
  size_t size;
  int node;    // the node being checked, or -1
  int tensor;  // the tensor being checked, or -1
} Check;

static void put_ref(char *buf, size_t size, const Ir *ir, int t) {
  if (t < 0 || t >= ir->ntensors) {
    snprintf(buf, size, "%%?%d", t);
    return;
  }
  const Tensor *x = &ir->tensors[t];
  snprintf(buf, size, "%c%s", x->kind == TENSOR_PARAM || x->kind == TENSOR_TABLE ? '@' : '%',
           x->name ? x->name : "?");
}

// Writes "node N (%out = op %a, @b): " or "tensor %x: " and the message to err; returns false.
__attribute__((format(printf, 2, 3))) static bool verify_fail(Check *c, const char *fmt, ...) {
  if (!c->err || c->size == 0) return false;
  size_t used = 0;
  char ref[300];
  const Ir *ir = c->ir;
  if (c->node >= 0) {
    const Node *n = &ir->nodes[c->node];
    put_ref(ref, sizeof ref, ir, n->out);
    used += (size_t)snprintf(c->err, c->size, "node %d (%s = %s", c->node, ref, op_name(n->op));
    for (int i = 0; i < n->nins && i < IR_MAX_INPUTS && used < c->size; i++) {
      put_ref(ref, sizeof ref, ir, n->ins[i]);
      used += (size_t)snprintf(c->err + used, c->size - used, "%s%s", i ? ", " : " ", ref);
    }
    if (used < c->size) used += (size_t)snprintf(c->err + used, c->size - used, "): ");
  } else if (c->tensor >= 0) {
    put_ref(ref, sizeof ref, ir, c->tensor);
    used += (size_t)snprintf(c->err, c->size, "tensor %s: ", ref);
  }
  if (used < c->size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + used, c->size - used, fmt, ap);
    va_end(ap);
  }
  return false;
}

// --- small facts ------------------------------------------------------------------------

static bool is_identifier(const char *s) {
  if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
  for (s++; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_'))
      return false;
  return true;
}

// Tensor names: [A-Za-z0-9_.]+, what ir_read reads back.
static bool is_tensor_name(const char *s) {
  if (!s || !*s) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '.'))
      return false;
  return true;
}

static bool is_precision(DType t) { return (int)t >= 0 && t <= DT_MXFP8; }

// What a gradient of a value is stored in: a precision that stores its own type.
static bool is_storage_float(DType t) { return t == DT_F32 || t == DT_BF16 || t == DT_FP16; }

static bool is_pointwise(Act a) { return (int)a > ACT_NONE && a < ACT_COUNT && a != ACT_SOFTMAX; }

// The dtype a node's output stores for its precision.
static DType stored_dtype(const Node *n) {
  if (n->op == OP_BCE || n->op == OP_LOSS_SUM) return DT_F32;
  return n->prec == DT_FP8 || n->prec == DT_MXFP8 ? DT_BF16 : n->prec;
}

static const char *type_of(const Ir *ir, int t, char *buf, size_t size) {
  ir_format_type(ir, &ir->tensors[t], buf, size);
  return buf;
}

static bool same_rows(const Tensor *a, const Tensor *b) {
  if (a->layout != b->layout) return false;
  if (a->layout == LAYOUT_SET) return a->set_k == b->set_k;
  if (a->layout == LAYOUT_JAGGED) return a->jag == b->jag;
  if (a->layout == LAYOUT_ROWS) return a->table == b->table;
  return true;
}

static bool same_shape(const Tensor *a, const Tensor *b) {
  if (!same_rows(a, b)) return false;
  if (a->layout == LAYOUT_FIXED)
    return a->nfixed == b->nfixed && a->fixed[0] == b->fixed[0] &&
           (a->nfixed < 2 || a->fixed[1] == b->fixed[1]);
  return a->layout == LAYOUT_SCALAR || a->width == b->width;
}

static bool optim_ok(const Optim *o) {
  const double v[] = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay};
  for (int i = 0; i < 5; i++)
    if (!isfinite(v[i]) || v[i] < 0) return false;
  return true;
}

// --- header, jagged dims, tensors -------------------------------------------------------

static bool check_header(Check *c) {
  const Ir *ir = c->ir;
  if (!is_identifier(ir->model)) return verify_fail(c, "header: the model name is not an identifier");
  if (!is_identifier(ir->target)) return verify_fail(c, "header: the target is not an identifier");
  if (!is_precision(ir->precision))
    return verify_fail(c, "header: precision %s is not one of fp32, bf16, fp16, fp8, mxfp8",
                dtype_name(ir->precision));
  if (ir->batch <= 0) return verify_fail(c, "header: batch %" PRId64 " is not positive", ir->batch);
  if (ir->dim <= 0) return verify_fail(c, "header: dim %" PRId64 " is not positive", ir->dim);
  OptimKind k = ir->dense_optim.kind;
  if (k != OPTIM_ADAMW && k != OPTIM_SGD)
    return verify_fail(c, "header: the dense optimizer is %s; expected adamw or sgd", optim_name(k));
  if (!optim_ok(&ir->dense_optim))
    return verify_fail(c, "header: optimizer settings must be finite and non-negative");
  if (ir->loss < -1 || ir->loss >= ir->ntensors)
    return verify_fail(c, "header: loss index %d is out of range", ir->loss);
  if (ir->nforward < 0 || ir->nforward > ir->nnodes)
    return verify_fail(c, "header: nforward = %d is not in 0..%d (the node count)", ir->nforward,
                ir->nnodes);
  if (ir->ngrads < 0 || (ir->ngrads > 0 && !ir->grads))
    return verify_fail(c, "header: the gradient records are inconsistent");
  return true;
}

static unsigned hash_name(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

// Names are unique; the first duplicate is reported. Uses its own table, so a stale
// ir_find_tensor index cannot hide one.
static bool check_unique_names(Check *c) {
  const Ir *ir = c->ir;
  size_t cap = 16;
  while (cap < 2 * (size_t)ir->ntensors) cap *= 2;
  int *slots = xcalloc(cap, sizeof *slots);
  bool ok = true;
  for (int i = 0; i < ir->ntensors && ok; i++) {
    const char *name = ir->tensors[i].name;
    for (size_t s = hash_name(name) & (cap - 1);; s = (s + 1) & (cap - 1)) {
      if (slots[s] == 0) {
        slots[s] = i + 1;
        break;
      }
      if (strcmp(ir->tensors[slots[s] - 1].name, name) == 0) {
        c->tensor = i;
        ok = verify_fail(c, "the name is also used by tensor %d", slots[s] - 1);
        break;
      }
    }
  }
  free(slots);
  c->tensor = -1;
  return ok;
}

static bool check_tensor(Check *c, int i) {
  const Ir *ir = c->ir;
  const Tensor *t = &ir->tensors[i];
  c->tensor = i;
  if (!is_tensor_name(t->name)) return verify_fail(c, "the name is empty or not made of [A-Za-z0-9_.]");
  if ((int)t->kind < 0 || t->kind > TENSOR_VALUE) return verify_fail(c, "unknown kind %d", (int)t->kind);
  if ((int)t->layout < 0 || t->layout > LAYOUT_ROWS)
    return verify_fail(c, "unknown layout %d", (int)t->layout);
  if ((int)t->dtype < 0 || t->dtype >= DT_COUNT) return verify_fail(c, "unknown dtype %d", (int)t->dtype);
  if (t->layout == LAYOUT_JAGGED && (t->jag < 0 || t->jag >= ir->njagged))
    return verify_fail(c, "jagged dim index %d is out of range (%d jagged dims)", t->jag, ir->njagged);
  if (t->layout == LAYOUT_SET && t->set_k <= 0)
    return verify_fail(c, "set size k = %" PRId64 " is not positive", t->set_k);
  if (t->layout == LAYOUT_FIXED) {
    if (t->nfixed < 1 || t->nfixed > 2) return verify_fail(c, "fixed tensors have 1 or 2 dims");
    for (int d = 0; d < t->nfixed; d++)
      if (t->fixed[d] <= 0) return verify_fail(c, "fixed dim %" PRId64 " is not positive", t->fixed[d]);
  }
  bool batched = t->layout == LAYOUT_DENSE || t->layout == LAYOUT_SET ||
                 t->layout == LAYOUT_JAGGED;
  if (batched && t->width < 0)
    return verify_fail(c, "width %" PRId64 " is negative", t->width);

  char type[128];
  type_of(ir, i, type, sizeof type);
  if (t->layout == LAYOUT_ROWS) {
    if (t->table < 0 || t->table >= ir->ntensors || ir->tensors[t->table].kind != TENSOR_TABLE)
      return verify_fail(c, "a rows tensor names a table; tensor %d is not one", t->table);
    const Tensor *table = &ir->tensors[t->table];
    if (t->kind != TENSOR_VALUE || t->dtype != DT_F32 || table->nfixed != 2 ||
        t->width != table->fixed[1])
      return verify_fail(c, "a table gradient is an fp32 value rows[U_%s, %" PRId64 "], not %s",
                  table->name ? table->name : "?", table->nfixed == 2 ? table->fixed[1] : 0,
                  type);
  }
  switch (t->kind) {
  case TENSOR_INPUT:
    if (t->layout != LAYOUT_DENSE && t->layout != LAYOUT_JAGGED)
      return verify_fail(c, "an input is dense or jagged, not %s", type);
    if (t->width == 0 && t->dtype != DT_I64)
      return verify_fail(c, "ids are i64; this input without a feature dim is %s", type);
    if (t->width > 0 && t->dtype == DT_I64)
      return verify_fail(c, "an input with features holds floats, not %s", type);
    break;
  case TENSOR_LABEL:
    if (t->layout != LAYOUT_DENSE || t->width != 0 || t->dtype != DT_F32)
      return verify_fail(c, "a label is fp32 dense[B], not %s", type);
    break;
  case TENSOR_PARAM:
    if (t->layout != LAYOUT_FIXED) return verify_fail(c, "a parameter is fixed, not %s", type);
    if (t->dtype == DT_I64) return verify_fail(c, "a parameter holds floats, not %s", type);
    if (t->optim.kind == OPTIM_ROWWISE_ADAGRAD)
      return verify_fail(c, "rowwise_adagrad is for tables; a parameter uses adamw, sgd or none");
    if (!optim_ok(&t->optim)) return verify_fail(c, "optimizer settings must be finite and non-negative");
    break;
  case TENSOR_TABLE:
    if (t->layout != LAYOUT_FIXED || t->nfixed != 2)
      return verify_fail(c, "a table is fixed[rows, dim], not %s", type);
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_FP16 && t->dtype != DT_FP8)
      return verify_fail(c, "a table stores fp32, bf16, fp16 or fp8, not %s", dtype_name(t->dtype));
    if (t->optim.kind != OPTIM_ROWWISE_ADAGRAD && t->optim.kind != OPTIM_SGD)
      return verify_fail(c, "a table's optimizer is rowwise_adagrad or sgd, not %s",
                  optim_name(t->optim.kind));
    if (!optim_ok(&t->optim)) return verify_fail(c, "optimizer settings must be finite and non-negative");
    break;
  case TENSOR_VALUE:
    if (batched && t->width <= 0) return verify_fail(c, "a value needs a feature dim: %s", type);
    break;
  }
  if (t->kind == TENSOR_VALUE) {
    if (t->producer < 0 || t->producer >= ir->nnodes)
      return verify_fail(c, "the value is never produced (producer %d)", t->producer);
    if (ir->nodes[t->producer].out != i)
      return verify_fail(c, "its producer, node %d, does not write it", t->producer);
    // Parameter gradients are the only fixed values.
    if (t->layout == LAYOUT_FIXED && (t->dtype != DT_F32 || t->producer < ir->nforward))
      return verify_fail(c, "a value is fixed only as a parameter gradient, fp32 and written by a "
                     "backward node, not %s written by node %d", type, t->producer);
  } else if (t->producer != -1) {
    return verify_fail(c, "only values have a producer; this one names node %d", t->producer);
  }
  c->tensor = -1;
  return true;
}

// ir_find_tensor finds every tensor by its name: a pass that renames or removes tensors
// must call ir_reindex.
static bool check_name_index(Check *c) {
  for (int i = 0; i < c->ir->ntensors; i++)
    if (ir_find_tensor(c->ir, c->ir->tensors[i].name) != i) {
      c->tensor = i;
      return verify_fail(c, "ir_find_tensor does not find it (a pass must call ir_reindex after "
                     "renaming or removing tensors)");
    }
  return true;
}

static bool check_jagged(Check *c, int j) {
  const Ir *ir = c->ir;
  const JaggedDim *d = &ir->jagged[j];
  if (!is_identifier(d->name)) return verify_fail(c, "jagged dim %d: the name is not an identifier", j);
  if (d->max_len <= 0)
    return verify_fail(c, "jagged dim *%s: max length %" PRId64 " is not positive", d->name, d->max_len);
  int owner = ir_find_tensor(ir, d->name);
  if (owner < 0 || ir->tensors[owner].kind != TENSOR_INPUT ||
      ir->tensors[owner].layout != LAYOUT_JAGGED || ir->tensors[owner].jag != j)
    return verify_fail(c, "jagged dim *%s: no jagged input %%%s on it owns its offsets", d->name,
                d->name);
  return true;
}

// --- nodes ------------------------------------------------------------------------------

// The fewest and most inputs of each op.
static void arity(OpKind op, int *lo, int *hi) {
  switch (op) {
  case OP_EMBED:
  case OP_EMBED_POOL:
  case OP_RMSNORM:
  case OP_ADD:
  case OP_SUB:
  case OP_MUL:
  case OP_BCE: *lo = *hi = 2; return;
  case OP_LINEAR: *lo = 2, *hi = 3; return;
  case OP_LAYERNORM:
  case OP_ATTENTION: *lo = *hi = 3; return;
  case OP_ACT:
  case OP_FLATTEN: *lo = *hi = 1; return;
  case OP_CONCAT:
  case OP_DOT_INTERACT: *lo = 2, *hi = IR_MAX_PARTS; return;
  case OP_STACK:
  case OP_LOSS_SUM: *lo = 1, *hi = IR_MAX_PARTS; return;
  case OP_SCALE:
  case OP_SLICE:
  case OP_UNSTACK:
  case OP_UNFLATTEN:
  case OP_REDUCE_ROWS: *lo = *hi = 1; return;
  case OP_ACT_BWD:
  case OP_LINEAR_BWD_X:
  case OP_LINEAR_BWD_W:
  case OP_RMSNORM_BWD_GAIN:
  case OP_LAYERNORM_BWD_GAIN:
  case OP_BCE_BWD:
  case OP_EMBED_POOL_BWD: *lo = *hi = 2; return;
  case OP_RMSNORM_BWD_X:
  case OP_LAYERNORM_BWD_X: *lo = *hi = 3; return;
  case OP_LINEAR_ACT_BWD: *lo = 3, *hi = 4; return;
  case OP_DOT_INTERACT_BWD: *lo = 3, *hi = IR_MAX_PARTS + 1; return;
  case OP_ATTENTION_BWD_Q:
  case OP_ATTENTION_BWD_K:
  case OP_ATTENTION_BWD_V: *lo = *hi = 4; return;
  case OP_TABLE_GRAD: *lo = 3, *hi = IR_MAX_INPUTS; return;
  case OP_COUNT: break;
  }
  *lo = *hi = 0;
}

static const Tensor *in(const Check *c, const Node *n, int k) {
  return &c->ir->tensors[n->ins[k]];
}

static bool is_feature(const Tensor *t) {
  return (t->kind == TENSOR_INPUT || t->kind == TENSOR_VALUE) &&
         (t->layout == LAYOUT_DENSE || t->layout == LAYOUT_SET || t->layout == LAYOUT_JAGGED) &&
         t->width > 0 && t->dtype != DT_I64;
}

// Input k is a feature tensor: an input or value with a feature dim, in floats.
static bool feature(Check *c, const Node *n, int k, const char *role) {
  if (is_feature(in(c, n, k))) return true;
  char type[128];
  const char *kind = in(c, n, k)->kind == TENSOR_LABEL   ? "the label "
                     : in(c, n, k)->kind == TENSOR_VALUE ? ""
                     : in(c, n, k)->kind == TENSOR_INPUT ? "the input "
                                                         : "the parameter ";
  return verify_fail(c, "%s (input %d) must be an input or value with a feature dim, not %s%s", role,
              k, kind, type_of(c->ir, n->ins[k], type, sizeof type));
}

// Input k is a parameter fixed[d0] (nd 1) or fixed[d0, d1] (nd 2); d1 < 0: any.
static bool param(Check *c, const Node *n, int k, const char *role, int nd, int64_t d0,
                  int64_t d1) {
  const Tensor *t = in(c, n, k);
  bool ok = t->kind == TENSOR_PARAM && t->nfixed == nd && t->fixed[0] == d0 &&
            (nd == 1 || d1 < 0 || t->fixed[1] == d1);
  if (ok) return true;
  char type[128], want[64];
  if (nd == 1)
    snprintf(want, sizeof want, "fixed[%" PRId64 "]", d0);
  else if (d1 < 0)
    snprintf(want, sizeof want, "fixed[%" PRId64 ", n]", d0);
  else
    snprintf(want, sizeof want, "fixed[%" PRId64 ", %" PRId64 "]", d0, d1);
  return verify_fail(c, "%s (input %d) must be a parameter %s, not %s%s", role, k, want,
              t->kind == TENSOR_PARAM ? "" : "a non-parameter ",
              type_of(c->ir, n->ins[k], type, sizeof type));
}

// Input k is ids: an i64 input, dense[B] or jagged[B, *s]; jagged_only for embed_pool.
static bool ids(Check *c, const Node *n, int k, bool jagged_only) {
  const Tensor *t = in(c, n, k);
  bool layout_ok = t->layout == LAYOUT_JAGGED || (!jagged_only && t->layout == LAYOUT_DENSE);
  if (t->kind == TENSOR_INPUT && t->dtype == DT_I64 && t->width == 0 && layout_ok) return true;
  char type[128];
  return verify_fail(c, "ids (input %d) must be an i64 input %s, not %s", k,
              jagged_only ? "jagged[B, *s]" : "dense[B] or jagged[B, *s]",
              type_of(c->ir, n->ins[k], type, sizeof type));
}

// The output has the layout and dims of `want` (its dtype is checked elsewhere).
static bool output_shape(Check *c, const Node *n, const Tensor *want) {
  const Tensor *out = &c->ir->tensors[n->out];
  if (same_shape(out, want)) return true;
  char got[128], expect[128];
  Tensor w = *want;
  w.dtype = out->dtype;
  ir_format_type(c->ir, &w, expect, sizeof expect);
  return verify_fail(c, "the output is %s; expected %s", type_of(c->ir, n->out, got, sizeof got),
              expect);
}

static bool output_like(Check *c, const Node *n, const Tensor *x, int64_t width) {
  Tensor want = *x;
  want.width = width;
  return output_shape(c, n, &want);
}

static bool output_dense(Check *c, const Node *n, int64_t width) {
  Tensor want = {.layout = LAYOUT_DENSE, .jag = -1, .width = width};
  return output_shape(c, n, &want);
}

static bool check_embed(Check *c, const Node *n) {
  const Tensor *table = in(c, n, 0);
  if (table->kind != TENSOR_TABLE) {
    char type[128];
    return verify_fail(c, "input 0 must be a table, not %s",
                type_of(c->ir, n->ins[0], type, sizeof type));
  }
  bool pooled = n->op == OP_EMBED_POOL;
  if (!ids(c, n, 1, pooled)) return false;
  if (pooled && n->pool != POOL_SUM && n->pool != POOL_MEAN)
    return verify_fail(c, "pool is %d; expected sum or mean", (int)n->pool);
  const Tensor *id = in(c, n, 1);
  if (pooled || id->layout == LAYOUT_DENSE) return output_dense(c, n, table->fixed[1]);
  return output_like(c, n, id, table->fixed[1]);
}

static bool check_linear(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  const Tensor *x = in(c, n, 0);
  if (!param(c, n, 1, "the weight", 2, x->width, -1)) return false;
  int64_t width = in(c, n, 1)->fixed[1];
  if (n->nins == 3 && !param(c, n, 2, "the bias", 1, width, -1)) return false;
  if ((int)n->act < 0 || n->act >= ACT_COUNT) return verify_fail(c, "unknown act %d", (int)n->act);
  if (n->act == ACT_SOFTMAX) return verify_fail(c, "softmax is not pointwise; linear cannot fuse it");
  return output_like(c, n, x, width);
}

static bool check_norm(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  const Tensor *x = in(c, n, 0);
  if (!param(c, n, 1, "the gain", 1, x->width, -1)) return false;
  if (n->op == OP_LAYERNORM && !param(c, n, 2, "the bias", 1, x->width, -1)) return false;
  if (!isfinite(n->eps) || n->eps < 0) return verify_fail(c, "eps must be finite and non-negative");
  return output_like(c, n, x, x->width);
}

static bool check_act(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  if ((int)n->act <= ACT_NONE || n->act >= ACT_COUNT)
    return verify_fail(c, "an act node needs an activation other than none");
  if (n->act == ACT_SOFTMAX)
    return verify_fail(c, "softmax is not pointwise; an act node cannot apply it");
  return output_like(c, n, in(c, n, 0), in(c, n, 0)->width);
}

// A fixed value: a parameter gradient, which `add` accumulates.
static bool is_param_grad(const Tensor *t) {
  return t->kind == TENSOR_VALUE && t->layout == LAYOUT_FIXED;
}

static bool check_elementwise(Check *c, const Node *n) {
  if (n->op == OP_ADD && is_param_grad(in(c, n, 0)) && is_param_grad(in(c, n, 1))) {
    if (!same_shape(in(c, n, 0), in(c, n, 1))) {
      char a[128], b[128];
      return verify_fail(c, "a and b must have one shape, not %s and %s",
                  type_of(c->ir, n->ins[0], a, sizeof a), type_of(c->ir, n->ins[1], b, sizeof b));
    }
    return output_shape(c, n, in(c, n, 0));
  }
  if (!feature(c, n, 0, "a") || !feature(c, n, 1, "b")) return false;
  if (!same_shape(in(c, n, 0), in(c, n, 1))) {
    char a[128], b[128];
    return verify_fail(c, "a and b must have one shape, not %s and %s",
                type_of(c->ir, n->ins[0], a, sizeof a), type_of(c->ir, n->ins[1], b, sizeof b));
  }
  return output_like(c, n, in(c, n, 0), in(c, n, 0)->width);
}

static bool check_concat(Check *c, const Node *n) {
  int64_t width = 0;
  for (int k = 0; k < n->nins; k++) {
    if (!feature(c, n, k, "each part")) return false;
    if (!same_rows(in(c, n, 0), in(c, n, k))) {
      char a[128], b[128];
      return verify_fail(c, "parts must share one layout and leading dims, not %s and %s",
                  type_of(c->ir, n->ins[0], a, sizeof a), type_of(c->ir, n->ins[k], b, sizeof b));
    }
    if (in(c, n, k)->width > INT64_MAX - width) return verify_fail(c, "the width overflows");
    width += in(c, n, k)->width;
  }
  return output_like(c, n, in(c, n, 0), width);
}

// stack and dot_interact: dense [B, d] inputs, one d.
static bool dense_same_width(Check *c, const Node *n) {
  for (int k = 0; k < n->nins; k++) {
    if (!feature(c, n, k, "each input")) return false;
    const Tensor *t = in(c, n, k);
    if (t->layout != LAYOUT_DENSE || t->width != in(c, n, 0)->width) {
      char a[128], b[128];
      return verify_fail(c, "inputs must all be dense[B, d] with one d, not %s and %s",
                  type_of(c->ir, n->ins[0], a, sizeof a), type_of(c->ir, n->ins[k], b, sizeof b));
    }
  }
  return true;
}

static bool check_stack(Check *c, const Node *n) {
  if (!dense_same_width(c, n)) return false;
  Tensor want = {.layout = LAYOUT_SET, .jag = -1, .set_k = n->nins, .width = in(c, n, 0)->width};
  return output_shape(c, n, &want);
}

static bool check_flatten(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  const Tensor *x = in(c, n, 0);
  if (x->layout != LAYOUT_SET) {
    char type[128];
    return verify_fail(c, "x must be a set[B, k, d], not %s",
                type_of(c->ir, n->ins[0], type, sizeof type));
  }
  if (x->set_k > INT64_MAX / x->width) return verify_fail(c, "k·d overflows");
  return output_dense(c, n, x->set_k * x->width);
}

static bool check_dot_interact(Check *c, const Node *n) {
  if (!dense_same_width(c, n)) return false;
  return output_dense(c, n, (int64_t)n->nins * (n->nins - 1) / 2);
}

// q, k, v (inputs 0-2) and the attributes of an attention node or of one of its backward ops;
// *o gets the shape of the forward output.
static bool attention_operands(Check *c, const Node *n, Tensor *o) {
  if ((int)n->shape < 0 || n->shape > ATTN_PFFN)
    return verify_fail(c, "unknown attention shape %d", (int)n->shape);
  const char *shape = attn_shape_name(n->shape);
  if (!feature(c, n, 1, "k") || !feature(c, n, 2, "v")) return false;
  const Tensor *q = in(c, n, 0), *k = in(c, n, 1), *v = in(c, n, 2);
  char a[128], b[128];
  if (!same_shape(k, v))
    return verify_fail(c, "k and v must have one shape, not %s and %s",
                type_of(c->ir, n->ins[1], a, sizeof a), type_of(c->ir, n->ins[2], b, sizeof b));
  int64_t d;
  if (n->shape == ATTN_PMA) {
    if (q->kind != TENSOR_PARAM || q->nfixed != 2)
      return verify_fail(c, "pma: q must be the seeds parameter fixed[k, d], not %s",
                  type_of(c->ir, n->ins[0], a, sizeof a));
    d = q->fixed[1];
  } else {
    if (!feature(c, n, 0, "q")) return false;
    d = q->width;
  }
  bool q_ok = true, kv_ok = k->layout == LAYOUT_JAGGED;
  switch (n->shape) {
  case ATTN_SELF: q_ok = q->layout == LAYOUT_JAGGED, kv_ok = kv_ok && k->jag == q->jag; break;
  case ATTN_CROSS: q_ok = q->layout == LAYOUT_JAGGED, kv_ok = kv_ok || k->layout == LAYOUT_SET;
    break;
  case ATTN_PMA: break;
  case ATTN_PFFN: q_ok = q->layout == LAYOUT_DENSE || q->layout == LAYOUT_SET; break;
  }
  static const char *const q_want[] = {"jagged[B, *s, d]", "jagged[B, *s, d]", "fixed[k, d]",
                                       "dense[B, d] or set[B, k, d]"};
  static const char *const kv_want[] = {"jagged[B, *s, d] on q's jagged dim",
                                        "set[B, k, d] or jagged[B, *t, d]", "jagged[B, *s, d]",
                                        "jagged[B, *s, d]"};
  if (!q_ok)
    return verify_fail(c, "%s attention: q must be %s, not %s", shape, q_want[n->shape],
                type_of(c->ir, n->ins[0], a, sizeof a));
  if (!kv_ok)
    return verify_fail(c, "%s attention: k and v must be %s, not %s", shape, kv_want[n->shape],
                type_of(c->ir, n->ins[1], a, sizeof a));
  if (k->width != d)
    return verify_fail(c, "q, k and v must have one width d: q has %" PRId64 ", k and v %" PRId64, d,
                k->width);
  if (n->heads <= 0 || d % n->heads != 0)
    return verify_fail(c, "heads = %" PRId64 " must be positive and divide d = %" PRId64, n->heads, d);
  if ((int)n->act <= ACT_NONE || n->act >= ACT_COUNT)
    return verify_fail(c, "attention needs an activation other than none");
  if ((int)n->mask < 0 || n->mask > MASK_CAUSAL) return verify_fail(c, "unknown mask %d", (int)n->mask);
  if (n->window < 0) return verify_fail(c, "window %" PRId64 " is negative", n->window);
  bool one_dim = q->layout == LAYOUT_JAGGED && k->layout == LAYOUT_JAGGED && q->jag == k->jag;
  if ((n->mask == MASK_CAUSAL || n->window > 0) && !one_dim)
    return verify_fail(c, "%s needs q and k on one jagged dim",
                n->mask == MASK_CAUSAL ? "mask=causal" : "window");
  if (!isfinite(n->scale)) return verify_fail(c, "scale must be finite");
  if (n->shape == ATTN_PMA) {
    *o = (Tensor){.layout = LAYOUT_SET, .jag = -1, .set_k = q->fixed[0], .width = d};
  } else {
    *o = *q;
    o->width = d;
  }
  return true;
}

static bool check_attention(Check *c, const Node *n) {
  Tensor o;
  return attention_operands(c, n, &o) && output_shape(c, n, &o);
}

// bce and bce_bwd: a logit dense[B, 1] and a label.
static bool bce_inputs(Check *c, const Node *n) {
  if (!feature(c, n, 0, "the logit")) return false;
  const Tensor *logit = in(c, n, 0), *label = in(c, n, 1);
  char type[128];
  if (logit->layout != LAYOUT_DENSE || logit->width != 1)
    return verify_fail(c, "the logit must be dense[B, 1], not %s",
                type_of(c->ir, n->ins[0], type, sizeof type));
  if (label->kind != TENSOR_LABEL)
    return verify_fail(c, "input 1 must be a label, not %s", type_of(c->ir, n->ins[1], type, sizeof type));
  return true;
}

static bool check_bce(Check *c, const Node *n) {
  Tensor want = {.layout = LAYOUT_SCALAR, .jag = -1};
  return bce_inputs(c, n) && output_shape(c, n, &want);
}

static bool check_loss_sum(Check *c, const Node *n) {
  for (int k = 0; k < n->nins; k++) {
    const Tensor *t = in(c, n, k);
    if (t->kind != TENSOR_VALUE || t->layout != LAYOUT_SCALAR) {
      char type[128];
      return verify_fail(c, "input %d must be a scalar loss term, not %s", k,
                  type_of(c->ir, n->ins[k], type, sizeof type));
    }
    if (!isfinite(n->weights[k]) || n->weights[k] <= 0)
      return verify_fail(c, "weight %d must be positive and finite", k);
  }
  Tensor want = {.layout = LAYOUT_SCALAR, .jag = -1};
  return output_shape(c, n, &want);
}

// --- the backward ops (docs/autodiff.md) ---------------------------------------------------

// The output's dtype is input k's: the gradient of a value has the value's dtype.
static bool dtype_of_input(Check *c, const Node *n, int k, const char *role) {
  DType got = c->ir->tensors[n->out].dtype, want = in(c, n, k)->dtype;
  if (got == want) return true;
  return verify_fail(c, "the output dtype is %s; the gradient of %s (input %d) is %s", dtype_name(got),
              role, k, dtype_name(want));
}

// Inputs a and b are feature tensors of one shape (dy and x of a pointwise backward op).
static bool same_feature_shape(Check *c, const Node *n, int a, const char *ra, int b,
                               const char *rb) {
  if (!feature(c, n, a, ra) || !feature(c, n, b, rb)) return false;
  if (same_shape(in(c, n, a), in(c, n, b))) return true;
  char ta[128], tb[128];
  return verify_fail(c, "%s and %s must have one shape, not %s and %s", ra, rb,
              type_of(c->ir, n->ins[a], ta, sizeof ta), type_of(c->ir, n->ins[b], tb, sizeof tb));
}

static bool output_fixed(Check *c, const Node *n, int nd, int64_t d0, int64_t d1) {
  Tensor want = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = nd, .fixed = {d0, d1}};
  return output_shape(c, n, &want);
}

static bool pointwise_act(Check *c, const Node *n) {
  if (is_pointwise(n->act)) return true;
  return verify_fail(c, "act=%s: %s needs a pointwise activation (not none or softmax)",
              act_name(n->act), op_name(n->op));
}

static bool check_scale(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  if (!isfinite(n->scale)) return verify_fail(c, "scale must be finite");
  return output_like(c, n, in(c, n, 0), in(c, n, 0)->width);
}

static bool check_slice(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  const Tensor *x = in(c, n, 0), *out = &c->ir->tensors[n->out];
  if (n->start < 0 || n->start >= x->width)
    return verify_fail(c, "start = %" PRId64 " must be in 0..%" PRId64 " (x's width - 1)", n->start,
                x->width - 1);
  if (!same_rows(out, x) || out->width <= 0 || out->width > x->width - n->start) {
    char got[128], xt[128];
    return verify_fail(c, "the output is %s; expected %s with a width in 1..%" PRId64,
                type_of(c->ir, n->out, got, sizeof got), type_of(c->ir, n->ins[0], xt, sizeof xt),
                x->width - n->start);
  }
  return true;
}

static bool check_unstack(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  const Tensor *x = in(c, n, 0);
  char type[128];
  if (x->layout != LAYOUT_SET)
    return verify_fail(c, "x must be a set[B, n, d], not %s",
                type_of(c->ir, n->ins[0], type, sizeof type));
  if (n->start < 0 || n->start >= x->set_k)
    return verify_fail(c, "start = %" PRId64 " must be in 0..%" PRId64 " (the set's n - 1)", n->start,
                x->set_k - 1);
  return output_dense(c, n, x->width);
}

static bool check_unflatten(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  const Tensor *x = in(c, n, 0), *out = &c->ir->tensors[n->out];
  char type[128];
  if (x->layout != LAYOUT_DENSE)
    return verify_fail(c, "x must be a dense[B, k·d], not %s",
                type_of(c->ir, n->ins[0], type, sizeof type));
  if (out->layout != LAYOUT_SET || out->set_k <= 0 || out->width <= 0 ||
      out->width > x->width / out->set_k || out->set_k * out->width != x->width)
    return verify_fail(c, "the output is %s; expected a set[B, k, d] with k·d = %" PRId64,
                type_of(c->ir, n->out, type, sizeof type), x->width);
  return true;
}

static bool check_reduce_rows(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x")) return false;
  return output_fixed(c, n, 1, in(c, n, 0)->width, 0);
}

static bool check_act_bwd(Check *c, const Node *n) {
  if (!same_feature_shape(c, n, 0, "dy", 1, "x") || !pointwise_act(c, n)) return false;
  return output_like(c, n, in(c, n, 1), in(c, n, 1)->width) && dtype_of_input(c, n, 1, "x");
}

// dy, x, w [, b]: the gradient before linear's fused activation, shaped like dy.
static bool check_linear_act_bwd(Check *c, const Node *n) {
  if (!feature(c, n, 0, "dy") || !feature(c, n, 1, "x")) return false;
  const Tensor *dy = in(c, n, 0), *x = in(c, n, 1);
  if (!param(c, n, 2, "the weight", 2, x->width, dy->width)) return false;
  if (n->nins == 4 && !param(c, n, 3, "the bias", 1, dy->width, -1)) return false;
  if (!same_rows(dy, x)) {
    char a[128], b[128];
    return verify_fail(c, "dy and x must share one layout and leading dims, not %s and %s",
                type_of(c->ir, n->ins[0], a, sizeof a), type_of(c->ir, n->ins[1], b, sizeof b));
  }
  if (!pointwise_act(c, n)) return false;
  return output_like(c, n, dy, dy->width) && dtype_of_input(c, n, 0, "dy");
}

// dz, w fixed[d, n]: dz · wᵀ, shaped like dz with width d.
static bool check_linear_bwd_x(Check *c, const Node *n) {
  if (!feature(c, n, 0, "dz")) return false;
  const Tensor *dz = in(c, n, 0), *w = in(c, n, 1);
  if (w->kind != TENSOR_PARAM || w->nfixed != 2 || w->fixed[1] != dz->width) {
    char type[128];
    return verify_fail(c, "the weight (input 1) must be a parameter fixed[d, %" PRId64 "], not %s",
                dz->width, type_of(c->ir, n->ins[1], type, sizeof type));
  }
  return output_like(c, n, dz, w->fixed[0]);
}

// x, dz: Σ_r x[r]ᵀ dz[r], fixed[d, n].
static bool check_linear_bwd_w(Check *c, const Node *n) {
  if (!feature(c, n, 0, "x") || !feature(c, n, 1, "dz")) return false;
  const Tensor *x = in(c, n, 0), *dz = in(c, n, 1);
  if (!same_rows(x, dz)) {
    char a[128], b[128];
    return verify_fail(c, "x and dz must share one layout and leading dims, not %s and %s",
                type_of(c->ir, n->ins[0], a, sizeof a), type_of(c->ir, n->ins[1], b, sizeof b));
  }
  return output_fixed(c, n, 2, x->width, dz->width);
}

static bool check_norm_bwd(Check *c, const Node *n) {
  if (!same_feature_shape(c, n, 0, "dy", 1, "x")) return false;
  if (!isfinite(n->eps) || n->eps < 0) return verify_fail(c, "eps must be finite and non-negative");
  const Tensor *x = in(c, n, 1);
  if (n->op == OP_RMSNORM_BWD_GAIN || n->op == OP_LAYERNORM_BWD_GAIN)
    return output_fixed(c, n, 1, x->width, 0);
  if (!param(c, n, 2, "the gain", 1, x->width, -1)) return false;
  return output_like(c, n, x, x->width) && dtype_of_input(c, n, 1, "x");
}

// dy dense[B, n(n-1)/2], then x1 … xn dense[B, d]: the gradient of x_start.
static bool check_dot_interact_bwd(Check *c, const Node *n) {
  int parts = n->nins - 1;
  for (int k = 1; k < n->nins; k++) {
    if (!feature(c, n, k, "each x")) return false;
    const Tensor *t = in(c, n, k);
    if (t->layout != LAYOUT_DENSE || t->width != in(c, n, 1)->width) {
      char a[128], b[128];
      return verify_fail(c, "x1 … xn must all be dense[B, d] with one d, not %s and %s",
                  type_of(c->ir, n->ins[1], a, sizeof a), type_of(c->ir, n->ins[k], b, sizeof b));
    }
  }
  if (!feature(c, n, 0, "dy")) return false;
  const Tensor *dy = in(c, n, 0);
  int64_t pairs = (int64_t)parts * (parts - 1) / 2;
  if (dy->layout != LAYOUT_DENSE || dy->width != pairs) {
    char type[128];
    return verify_fail(c, "dy must be dense[B, %" PRId64 "] for %d inputs, not %s", pairs, parts,
                type_of(c->ir, n->ins[0], type, sizeof type));
  }
  if (n->start < 0 || n->start >= parts)
    return verify_fail(c, "start = %" PRId64 " must name one of the %d inputs (0..%d)", n->start, parts,
                parts - 1);
  int x = 1 + (int)n->start;
  return output_like(c, n, in(c, n, x), in(c, n, x)->width) && dtype_of_input(c, n, x, "x_start");
}

// q, k, v, dO: dO is shaped like the forward output; the result like q (PMA: the seeds,
// fixed[k, d]), k or v.
static bool check_attention_bwd(Check *c, const Node *n) {
  Tensor o;
  if (!attention_operands(c, n, &o) || !feature(c, n, 3, "dO")) return false;
  if (!same_shape(in(c, n, 3), &o)) {
    char got[128], want[128];
    o.dtype = in(c, n, 3)->dtype;
    ir_format_type(c->ir, &o, want, sizeof want);
    return verify_fail(c, "dO must be shaped like the attention's output, %s, not %s", want,
                type_of(c->ir, n->ins[3], got, sizeof got));
  }
  int k = n->op == OP_ATTENTION_BWD_Q ? 0 : n->op == OP_ATTENTION_BWD_K ? 1 : 2;
  const Tensor *x = in(c, n, k);
  if (x->layout == LAYOUT_FIXED) return output_fixed(c, n, 2, x->fixed[0], x->fixed[1]);
  static const char *const roles[] = {"q", "k", "v"};
  return output_like(c, n, x, x->width) && dtype_of_input(c, n, k, roles[k]);
}

static bool check_bce_bwd(Check *c, const Node *n) {
  if (!bce_inputs(c, n)) return false;
  if (!isfinite(n->weight) || n->weight <= 0) return verify_fail(c, "weight must be positive and finite");
  return output_dense(c, n, 1) && dtype_of_input(c, n, 0, "the logit");
}

// ids jagged[B, *s], dy dense[B, D]: jagged[B, *s, D] fp32.
static bool check_embed_pool_bwd(Check *c, const Node *n) {
  if (!ids(c, n, 0, true) || !feature(c, n, 1, "dy")) return false;
  const Tensor *dy = in(c, n, 1);
  if (dy->layout != LAYOUT_DENSE) {
    char type[128];
    return verify_fail(c, "dy must be dense[B, D], not %s", type_of(c->ir, n->ins[1], type, sizeof type));
  }
  if (n->pool != POOL_SUM && n->pool != POOL_MEAN)
    return verify_fail(c, "pool is %d; expected sum or mean", (int)n->pool);
  return output_like(c, n, in(c, n, 0), dy->width);
}

// table, then pairs (ids, dy): ids dense[B] with dy dense[B, D], or ids jagged[B, *s] with
// dy jagged[B, *s, D].
static bool check_table_grad(Check *c, const Node *n) {
  const Tensor *table = in(c, n, 0);
  char type[128];
  if (table->kind != TENSOR_TABLE)
    return verify_fail(c, "input 0 must be a table, not %s", type_of(c->ir, n->ins[0], type, sizeof type));
  if (n->nins % 2 == 0)
    return verify_fail(c, "table_grad takes a table and (ids, dy) pairs; %d inputs leave one unpaired",
                n->nins);
  int64_t dim = table->fixed[1];
  for (int k = 1; k < n->nins; k += 2) {
    if (!ids(c, n, k, false) || !feature(c, n, k + 1, "dy")) return false;
    Tensor want = *in(c, n, k);
    want.width = dim;
    if (!same_shape(in(c, n, k + 1), &want)) {
      char got[128], expect[128];
      want.dtype = in(c, n, k + 1)->dtype;
      ir_format_type(c->ir, &want, expect, sizeof expect);
      return verify_fail(c, "dy (input %d) must be %s to match its ids, not %s", k + 1, expect,
                  type_of(c->ir, n->ins[k + 1], got, sizeof got));
    }
  }
  Tensor want = {.layout = LAYOUT_ROWS, .jag = -1, .table = n->ins[0], .width = dim};
  return output_shape(c, n, &want);
}

static bool is_tile(int v) { return v == 0 || (v >= 16 && v <= 256 && (v & (v - 1)) == 0); }

// Schedule hints: which ops take each, and their ranges (docs/language.md).
static bool check_schedule(Check *c, const Node *n) {
  const Schedule *s = &n->sched;
  bool attention = n->op == OP_ATTENTION;
  bool matmul = n->op == OP_LINEAR || n->op == OP_DOT_INTERACT;
  const char *op = op_name(n->op);
  if ((s->tile_q || s->tile_kv || s->zigzag) && !attention)
    return verify_fail(c, "tile_q, tile_kv and zigzag are attention hints, not %s hints", op);
  if ((s->tile_n || s->tile_k) && !matmul)
    return verify_fail(c, "tile_m, tile_n and tile_k are linear and dot_interact hints, not %s hints", op);
  if (s->tile_m && !matmul && !attention)  // attention: query rows per warp (docs/schedules.md)
    return verify_fail(c, "tile_m is a linear, dot_interact and attention hint, not a %s hint", op);
  if (s->stages && !matmul && !attention) return verify_fail(c, "stages is a matmul hint, not a %s hint", op);
  if (s->gelu_taylor && !op_has_attr(n->op, ATTR_ACT))
    return verify_fail(c, "the gelu hint needs an op with an activation, not %s", op);
  const int tiles[] = {s->tile_q, s->tile_kv, s->tile_m, s->tile_n, s->tile_k};
  for (int i = 0; i < 5; i++)
    if (!is_tile(tiles[i])) return verify_fail(c, "tile size %d is not a power of two in 16..256", tiles[i]);
  if (s->stages < 0 || s->stages > 8) return verify_fail(c, "stages = %d is not in 1..8", s->stages);
  if (s->zigzag < 0 || s->zigzag > 2) return verify_fail(c, "zigzag = %d is not on or off", s->zigzag);
  if (s->gelu_taylor < 0 || s->gelu_taylor > 2)
    return verify_fail(c, "gelu = %d is not taylor or exact", s->gelu_taylor);
  return true;
}

// A backward op's output: parameter and table gradients (fixed, rows) and embed_pool_bwd's
// per-id rows are fp32; other gradients are stored in fp32, bf16 or fp16 (their value's
// dtype, which the op checks compare with an input where one has it).
static bool check_backward_dtype(Check *c, const Node *n) {
  const Tensor *out = &c->ir->tensors[n->out];
  bool fp32 = out->layout == LAYOUT_FIXED || out->layout == LAYOUT_ROWS ||
              n->op == OP_EMBED_POOL_BWD;
  if (fp32 && out->dtype != DT_F32)
    return verify_fail(c, "the output dtype is %s; %s gives fp32", dtype_name(out->dtype),
                out->layout == LAYOUT_FIXED  ? "a parameter gradient"
                : out->layout == LAYOUT_ROWS ? "a table gradient"
                                             : "embed_pool_bwd");
  if (!is_storage_float(out->dtype))
    return verify_fail(c, "the output dtype is %s; a gradient is stored in fp32, bf16 or fp16",
                dtype_name(out->dtype));
  return true;
}

// Order, arity and the output link; then the op's own rules, precision and dtype.
static bool check_node(Check *c, int i) {
  const Ir *ir = c->ir;
  const Node *n = &ir->nodes[i];
  c->node = -1;
  if ((int)n->op < 0 || n->op >= OP_COUNT)
    return verify_fail(c, "node %d: unknown op %d", i, (int)n->op);
  if (n->out < 0 || n->out >= ir->ntensors)
    return verify_fail(c, "node %d (%s): output index %d is out of range", i, op_name(n->op), n->out);
  int lo, hi;
  arity(n->op, &lo, &hi);
  if (n->nins < 0 || n->nins > IR_MAX_INPUTS)
    return verify_fail(c, "node %d (%s): %d inputs", i, op_name(n->op), n->nins);
  for (int k = 0; k < n->nins; k++)
    if (n->ins[k] < 0 || n->ins[k] >= ir->ntensors)
      return verify_fail(c, "node %d (%s): input %d has index %d, out of range", i, op_name(n->op), k,
                  n->ins[k]);
  c->node = i;

  const Tensor *out = &ir->tensors[n->out];
  if (out->kind != TENSOR_VALUE) return verify_fail(c, "the output is not a value tensor");
  if (out->producer != i)
    return verify_fail(c, "the output is also written by node %d; each value is produced once",
                out->producer);
  if (n->nins < lo || n->nins > hi) {
    if (lo == hi) return verify_fail(c, "%s takes %d inputs, not %d", op_name(n->op), lo, n->nins);
    return verify_fail(c, "%s takes %d to %d inputs, not %d", op_name(n->op), lo, hi, n->nins);
  }
  for (int k = 0; k < n->nins; k++) {
    const Tensor *t = in(c, n, k);
    if (t->kind == TENSOR_VALUE && t->producer >= i)
      return verify_fail(c, "input %d is produced by node %d, not by an earlier node (topological order)",
                  k, t->producer);
  }
  // Sections: backward ops after the `backward` line; the loss before it.
  if (op_is_backward(n->op) && i < ir->nforward)
    return verify_fail(c, "%s is a backward op; it belongs after the backward line (node %d on)",
                op_name(n->op), ir->nforward);
  if ((n->op == OP_BCE || n->op == OP_LOSS_SUM) && i >= ir->nforward)
    return verify_fail(c, "%s computes the loss; it belongs before the backward line (nodes 0..%d)",
                op_name(n->op), ir->nforward - 1);

  bool ok = true;
  switch (n->op) {
  case OP_EMBED:
  case OP_EMBED_POOL: ok = check_embed(c, n); break;
  case OP_LINEAR: ok = check_linear(c, n); break;
  case OP_RMSNORM:
  case OP_LAYERNORM: ok = check_norm(c, n); break;
  case OP_ACT: ok = check_act(c, n); break;
  case OP_ADD:
  case OP_SUB:
  case OP_MUL: ok = check_elementwise(c, n); break;
  case OP_CONCAT: ok = check_concat(c, n); break;
  case OP_STACK: ok = check_stack(c, n); break;
  case OP_FLATTEN: ok = check_flatten(c, n); break;
  case OP_DOT_INTERACT: ok = check_dot_interact(c, n); break;
  case OP_ATTENTION: ok = check_attention(c, n); break;
  case OP_BCE: ok = check_bce(c, n); break;
  case OP_LOSS_SUM: ok = check_loss_sum(c, n); break;
  case OP_SCALE: ok = check_scale(c, n); break;
  case OP_SLICE: ok = check_slice(c, n); break;
  case OP_UNSTACK: ok = check_unstack(c, n); break;
  case OP_UNFLATTEN: ok = check_unflatten(c, n); break;
  case OP_REDUCE_ROWS: ok = check_reduce_rows(c, n); break;
  case OP_ACT_BWD: ok = check_act_bwd(c, n); break;
  case OP_LINEAR_ACT_BWD: ok = check_linear_act_bwd(c, n); break;
  case OP_LINEAR_BWD_X: ok = check_linear_bwd_x(c, n); break;
  case OP_LINEAR_BWD_W: ok = check_linear_bwd_w(c, n); break;
  case OP_RMSNORM_BWD_X:
  case OP_RMSNORM_BWD_GAIN:
  case OP_LAYERNORM_BWD_X:
  case OP_LAYERNORM_BWD_GAIN: ok = check_norm_bwd(c, n); break;
  case OP_DOT_INTERACT_BWD: ok = check_dot_interact_bwd(c, n); break;
  case OP_ATTENTION_BWD_Q:
  case OP_ATTENTION_BWD_K:
  case OP_ATTENTION_BWD_V: ok = check_attention_bwd(c, n); break;
  case OP_BCE_BWD: ok = check_bce_bwd(c, n); break;
  case OP_EMBED_POOL_BWD: ok = check_embed_pool_bwd(c, n); break;
  case OP_TABLE_GRAD: ok = check_table_grad(c, n); break;
  case OP_COUNT: break;
  }
  if (!ok) return false;

  if (op_has_attr(n->op, ATTR_PREC)) {
    if (!is_precision(n->prec))
      return verify_fail(c, "prec=%s is not one of fp32, bf16, fp16, fp8, mxfp8", dtype_name(n->prec));
    if ((n->prec == DT_FP8 || n->prec == DT_MXFP8) && !op_has_matmul(n->op))
      return verify_fail(c, "prec=%s is legal only on ops with a matmul (linear, dot_interact, "
                  "attention)", dtype_name(n->prec));
  }
  if (op_is_backward(n->op)) return check_backward_dtype(c, n) && check_schedule(c, n);
  DType want = stored_dtype(n);
  if (out->dtype != want) {
    if (op_has_attr(n->op, ATTR_PREC))
      return verify_fail(c, "the output dtype is %s, but prec=%s stores %s", dtype_name(out->dtype),
                  dtype_name(n->prec), dtype_name(want));
    return verify_fail(c, "the output dtype is %s; %s always gives fp32", dtype_name(out->dtype),
                op_name(n->op));
  }
  return check_schedule(c, n);
}

// Each record pairs a parameter or table, at most once, with a value a backward node writes:
// fp32 and shaped like the parameter, or rows[U_t, D] of that table.
static bool check_grads(Check *c) {
  const Ir *ir = c->ir;
  bool *seen = xcalloc((size_t)ir->ntensors + 1, sizeof *seen);
  bool ok = true;
  for (int i = 0; i < ir->ngrads && ok; i++) {
    int p = ir->grads[i].param, g = ir->grads[i].grad;
    char pr[300], gr[300], type[128];
    put_ref(pr, sizeof pr, ir, p);
    put_ref(gr, sizeof gr, ir, g);
    if (p < 0 || p >= ir->ntensors || g < 0 || g >= ir->ntensors) {
      ok = verify_fail(c, "grad %d (%s = %s): a tensor index is out of range", i, pr, gr);
      break;
    }
    const Tensor *param = &ir->tensors[p], *grad = &ir->tensors[g];
    type_of(ir, g, type, sizeof type);
    if (param->kind != TENSOR_PARAM && param->kind != TENSOR_TABLE)
      ok = verify_fail(c, "grad %d (%s = %s): %s is not a parameter or table", i, pr, gr, pr);
    else if (seen[p])
      ok = verify_fail(c, "grad %d (%s = %s): %s already has a gradient", i, pr, gr, pr);
    else if (grad->kind != TENSOR_VALUE || grad->producer < ir->nforward)
      ok = verify_fail(c, "grad %d (%s = %s): the gradient must be a value a backward node writes", i,
                pr, gr);
    else if (param->kind == TENSOR_PARAM &&
             (grad->layout != LAYOUT_FIXED || !same_shape(grad, param) || grad->dtype != DT_F32))
      ok = verify_fail(c, "grad %d (%s = %s): the gradient is %s; expected fp32 shaped like %s", i, pr,
                gr, type, pr);
    else if (param->kind == TENSOR_TABLE && (grad->layout != LAYOUT_ROWS || grad->table != p))
      ok = verify_fail(c, "grad %d (%s = %s): the gradient is %s; expected fp32 rows[U_%s, %" PRId64
                "]", i, pr, gr, type, param->name, param->fixed[1]);
    seen[p] = true;
  }
  free(seen);
  return ok;
}

bool ir_verify(const Ir *ir, char *err, size_t err_size) {
  Check c = {ir, err, err_size, -1, -1};
  if (err && err_size) err[0] = '\0';
  if (ir->ntensors < 0 || ir->nnodes < 0 || ir->njagged < 0 ||
      (ir->ntensors > 0 && !ir->tensors) || (ir->nnodes > 0 && !ir->nodes) ||
      (ir->njagged > 0 && !ir->jagged))
    return verify_fail(&c, "header: tensor, node or jagged dim arrays are inconsistent");
  if (!check_header(&c)) return false;
  for (int i = 0; i < ir->ntensors; i++)
    if (!check_tensor(&c, i)) return false;
  if (!check_unique_names(&c) || !check_name_index(&c)) return false;
  for (int j = 0; j < ir->njagged; j++)
    if (!check_jagged(&c, j)) return false;
  for (int i = 0; i < ir->nnodes; i++)
    if (!check_node(&c, i)) return false;
  c.node = -1;
  if (ir->loss >= 0) {
    const Tensor *loss = &ir->tensors[ir->loss];
    c.tensor = ir->loss;
    if (loss->kind != TENSOR_VALUE || loss->layout != LAYOUT_SCALAR || loss->dtype != DT_F32)
      return verify_fail(&c, "the loss must be an fp32 scalar[] value");
    if (loss->producer >= ir->nforward)
      return verify_fail(&c, "the loss must be written by a forward node, not node %d", loss->producer);
    c.tensor = -1;
  }
  return check_grads(&c);
}
