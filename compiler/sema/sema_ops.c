// sema_ops.c: expressions and layer ops. Lowers names, the infix operators and calls: binds
// each call's arguments by position and name, applies its annotations, and runs the op's own
// lowering: embed, linear, mlp, the norms, the pointwise activations, concat, stack, flatten
// and dot_interact here; gdpa and pma in sema_attention.c; bce in sema_loss.c.
#include <inttypes.h>
#include <string.h>

#include "internal_error.h"  // defines: GEMC_ASSERT
#include "sema_internal.h"   // defines: Sema, Call, OpSpec, sema_* helpers

static int lower_embed(Sema *S, Call *c);
static int lower_linear(Sema *S, Call *c);
static int lower_mlp(Sema *S, Call *c);
static int lower_norm(Sema *S, Call *c);
static int lower_act(Sema *S, Call *c);
static int lower_concat(Sema *S, Call *c);
static int lower_stack(Sema *S, Call *c);
static int lower_flatten(Sema *S, Call *c);
static int lower_dot_interact(Sema *S, Call *c);

// The ops of docs/language.md, "Layers". Parameters given by position come first.
static const OpSpec op_specs[] = {
    {"embed", SOP_EMBED, "embed(t, s, pool = sum|mean)", {"t", "s", "pool"}, 2, 2, 0, 0,
     false, 0, lower_embed},
    {"linear", SOP_LINEAR, "linear(x, n, bias = true)", {"x", "n", "bias"}, 2, 2, 0, 0, true,
     HINTS_MATMUL | HINTS_RECOMPUTE, lower_linear},
    {"mlp", SOP_MLP, "mlp(x, [n1, ..., nk], act = relu)", {"x", "sizes", "act"}, 2, 2, 0, 0,
     true, HINTS_MATMUL | HINTS_GELU | HINTS_RECOMPUTE, lower_mlp},
    {"rmsnorm", SOP_RMSNORM, "rmsnorm(x, eps = 1e-6)", {"x", "eps"}, 1, 1, 0, 0, false,
     HINTS_RECOMPUTE, lower_norm},
    {"layernorm", SOP_LAYERNORM, "layernorm(x, eps = 1e-5)", {"x", "eps"}, 1, 1, 0, 0, false,
     HINTS_RECOMPUTE, lower_norm},
    {"silu", SOP_SILU, "silu(x)", {"x"}, 1, 1, 0, 0, false, HINTS_RECOMPUTE, lower_act},
    {"gelu", SOP_GELU, "gelu(x)", {"x"}, 1, 1, 0, 0, false, HINTS_GELU | HINTS_RECOMPUTE,
     lower_act},
    {"gelu_taylor", SOP_GELU_TAYLOR, "gelu_taylor(x)", {"x"}, 1, 1, 0, 0, false,
     HINTS_RECOMPUTE, lower_act},
    {"relu", SOP_RELU, "relu(x)", {"x"}, 1, 1, 0, 0, false, HINTS_RECOMPUTE, lower_act},
    {"sigmoid", SOP_SIGMOID, "sigmoid(x)", {"x"}, 1, 1, 0, 0, false, HINTS_RECOMPUTE,
     lower_act},
    {"concat", SOP_CONCAT, "concat(x1, ..., xn)", {NULL}, 0, 0, 2, 16, false, HINTS_RECOMPUTE,
     lower_concat},
    {"stack", SOP_STACK, "stack(x1, ..., xn)", {NULL}, 0, 0, 1, 16, false, HINTS_RECOMPUTE,
     lower_stack},
    {"flatten", SOP_FLATTEN, "flatten(x)", {"x"}, 1, 1, 0, 0, false, HINTS_RECOMPUTE,
     lower_flatten},
    {"dot_interact", SOP_DOT_INTERACT, "dot_interact(x1, ..., xn)", {NULL}, 0, 0, 2, 16, true,
     HINTS_MATMUL | HINTS_RECOMPUTE, lower_dot_interact},
    {"gdpa", SOP_GDPA, "gdpa(x, ...) or gdpa(q = ..., kv = ..., ...)",
     {"x", "q", "kv", "heads", "act", "mask", "window", "scale", "hstu_norm"}, 1, 0, 0, 0, true,
     HINTS_ATTENTION | HINTS_RECOMPUTE, sema_lower_gdpa},
    {"pma", SOP_PMA, "pma(x, seeds = k, ...)", {"x", "seeds", "heads", "act", "scale",
     "hstu_norm"}, 1, 1, 0, 0, true, HINTS_ATTENTION | HINTS_RECOMPUTE, sema_lower_pma},
    {"bce", SOP_BCE, "bce(logit, label, name = \"...\")", {"logit", "label", "name"}, 2, 2, 0, 0,
     false, 0, sema_lower_bce},
};
enum { NOPS = sizeof op_specs / sizeof op_specs[0] };

static const OpSpec *find_op(const char *name) {
  for (int i = 0; i < NOPS; i++)
    if (strcmp(op_specs[i].name, name) == 0) return &op_specs[i];
  return NULL;
}

static int count_params(const OpSpec *p) {
  int n = 0;
  while (n < SEMA_MAX_PARAMS && p->params[n]) n++;
  return n;
}

// --- naming and nodes -------------------------------------------------------------------

static const char *const sop_names[SOP_COUNT] = {
    "embed", "linear", "mlp", "rmsnorm", "layernorm", "silu", "gelu", "gelu_taylor", "relu",
    "sigmoid", "concat", "stack", "flatten", "dot_interact", "gdpa", "pma", "bce",
    "add", "sub", "mul"};

// "<prefix>.<op><i>", counting the op under the statement's prefix.
static const char *next_name(Sema *S, SemaOp sop) {
  int i = S->op_counts[sop]++;
  return sema_fmt(S, "%s.%s%d", S->prefix, sop_names[sop], i);
}

void sema_call_begin(Sema *S, Call *c) {
  c->base = next_name(S, c->spec->sop);
  if (!c->out) c->out = c->base;
}

Node sema_node_for(const Call *c, OpKind op, int out) {
  Node n;
  memset(&n, 0, sizeof n);
  n.op = op;
  n.loc = c->e->loc;
  n.out = out;
  n.prec = c->prec;
  n.act = ACT_NONE;
  n.mask = MASK_NONE;
  return n;
}

int sema_linear_node(Sema *S, const Call *c, const Schedule *sched, const char *name, int x,
                     int w, int b, int64_t n, Act act) {
  int out = sema_value_like(S, name, x, n, c->value_dtype, c->e->loc);
  Node nd = sema_node_for(c, OP_LINEAR, out);
  nd.ins[nd.nins++] = x;
  nd.ins[nd.nins++] = w;
  if (b >= 0) nd.ins[nd.nins++] = b;
  nd.act = act;
  if (sched) nd.sched = *sched;
  ir_add_node(S->ir, &nd);
  return out;
}

// --- operands and arguments -------------------------------------------------------------

int sema_operand(Sema *S, const Expr *e, const char *op) {
  int t = sema_expr(S, e, NULL);
  if (t < 0) return -1;
  const Tensor *x = sema_tensor(S, t);
  if (x->dtype == DT_I64) {
    diag_error(S->d, e->loc, "%s expects float features, found ids %s; look them up with "
               "embed() first", op, sema_shape(S, t));
    return -1;
  }
  if (x->layout == LAYOUT_SCALAR || x->layout == LAYOUT_FIXED) {
    diag_error(S->d, e->loc, "%s expects a tensor with a batch dim, found %s", op,
               sema_shape(S, t));
    return -1;
  }
  return t;
}

int sema_arg_operand(Sema *S, Call *c, int param) {
  const Arg *a = c->arg[param];
  GEMC_ASSERT(a);
  return sema_operand(S, a->value, c->spec->name);
}

static void wrong_kind(Sema *S, const Call *c, int param, const char *want) {
  const Arg *a = c->arg[param];
  diag_error(S->d, a->value->loc, "argument '%s' of %s expects %s, found %s",
             c->spec->params[param], c->spec->name, want, sema_describe(S, a->value));
}

bool sema_arg_int(Sema *S, Call *c, int param, int64_t dflt, int64_t *out) {
  *out = dflt;
  if (!c->arg[param]) return true;
  if (!sema_int_literal(c->arg[param]->value, out)) {
    wrong_kind(S, c, param, "an integer");
    return false;
  }
  return true;
}

bool sema_arg_positive(Sema *S, Call *c, int param, int64_t dflt, int64_t *out) {
  if (!sema_arg_int(S, c, param, dflt, out)) return false;
  if (!c->arg[param]) return true;
  Loc loc = c->arg[param]->value->loc;
  if (*out <= 0) {
    diag_error(S->d, loc, "argument '%s' of %s must be a positive integer, found %" PRId64,
               c->spec->params[param], c->spec->name, *out);
    return false;
  }
  if (*out > SEMA_MAX_SIZE) {
    diag_error(S->d, loc, "argument '%s' of %s is too large: expected at most %" PRId64
               ", found %" PRId64, c->spec->params[param], c->spec->name, SEMA_MAX_SIZE, *out);
    return false;
  }
  return true;
}

bool sema_arg_real(Sema *S, Call *c, int param, double dflt, double *out) {
  *out = dflt;
  if (!c->arg[param]) return true;
  if (!sema_real_literal(c->arg[param]->value, out)) {
    wrong_kind(S, c, param, "a number");
    return false;
  }
  return true;
}

bool sema_arg_bool(Sema *S, Call *c, int param, bool dflt, bool *out) {
  *out = dflt;
  if (!c->arg[param]) return true;
  const Expr *e = c->arg[param]->value;
  if (e->kind == EXPR_NAME && strcmp(e->name, "true") == 0) *out = true;
  else if (e->kind == EXPR_NAME && strcmp(e->name, "false") == 0) *out = false;
  else {
    wrong_kind(S, c, param, "true or false");
    return false;
  }
  return true;
}

bool sema_arg_choice(Sema *S, Call *c, int param, const char *noun, const char *const *names,
                     int n, int dflt, int *out) {
  *out = dflt;
  if (!c->arg[param]) return true;
  const Expr *e = c->arg[param]->value;
  if (e->kind != EXPR_NAME) {
    bool vowel = strchr("aeiou", noun[0]) != NULL;
    wrong_kind(S, c, param, sema_fmt(S, "%s %s name", vowel ? "an" : "a", noun));
    return false;
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(e->name, names[i]) == 0) {
      *out = i;
      return true;
    }
  }
  diag_error(S->d, e->loc, "unknown %s '%s'; expected %s", noun, e->name,
             sema_list(S, names, n));
  sema_suggest(S, e->loc, e->name, names, n);
  return false;
}

bool sema_arg_act(Sema *S, Call *c, int param, bool attention, Act dflt, Act *out) {
  static const char *const attention_acts[] = {"softmax", "silu", "gelu", "gelu_taylor",
                                               "relu", "sigmoid"};
  static const char *const pointwise_acts[] = {"silu", "gelu", "gelu_taylor", "relu",
                                               "sigmoid", "none"};
  const char *const *names = attention ? attention_acts : pointwise_acts;
  *out = dflt;
  const Arg *a = c->arg[param];
  if (!a) return true;
  if (!attention && a->value->kind == EXPR_NAME && strcmp(a->value->name, "softmax") == 0) {
    diag_error(S->d, a->value->loc, "activation 'softmax' is not pointwise; %s expects %s",
               c->spec->name, sema_list(S, names, 6));
    return false;
  }
  int i;
  if (!sema_arg_choice(S, c, param, "activation", names, 6, 0, &i)) return false;
  bool ok = act_from_name(names[i], out);
  GEMC_ASSERT(ok);
  return true;
}

// Binds the arguments of a call to the op's parameters, by position and by name.
static bool bind_args(Sema *S, Call *c) {
  const OpSpec *p = c->spec;
  const Expr *e = c->e;
  int nparams = count_params(p);
  int total_positional = 0;
  for (int i = 0; i < e->nargs; i++) total_positional += e->args[i].name == NULL;
  bool ok = true;
  int npos = 0;
  for (int i = 0; i < e->nargs; i++) {
    const Arg *a = &e->args[i];
    int k = -1;
    if (!a->name) {
      if (p->max_variadic) {
        if (c->nvar < SEMA_MAX_VARIADIC) c->var[c->nvar] = a;
        c->nvar++;
        continue;
      }
      if (npos >= p->npositional) {
        if (npos == p->npositional) {
          const char *names = "";
          for (int j = 0; j < p->npositional; j++)
            names = sema_fmt(S, "%s%s%s", names, j ? ", " : "", p->params[j]);
          diag_error(S->d, a->value->loc,
                     "%s takes %d positional argument%s (%s), found %d; expected %s", p->name,
                     p->npositional, p->npositional == 1 ? "" : "s", names, total_positional,
                     p->signature);
        }
        npos++;
        ok = false;
        continue;
      }
      k = npos++;
    } else {
      for (int j = 0; j < nparams; j++)
        if (strcmp(a->name, p->params[j]) == 0) k = j;
      if (k < 0) {
        if (nparams == 0)
          diag_error(S->d, a->name_loc, "unknown argument '%s' to %s; it takes no named "
                     "arguments, expected %s", a->name, p->name, p->signature);
        else
          diag_error(S->d, a->name_loc, "unknown argument '%s' to %s; expected %s", a->name,
                     p->name, sema_list(S, p->params, nparams));
        sema_suggest(S, a->name_loc, a->name, p->params, nparams);
        ok = false;
        continue;
      }
    }
    if (c->arg[k]) {
      const Arg *prev = c->arg[k];
      diag_error(S->d, a->name ? a->name_loc : a->value->loc,
                 "argument '%s' of %s is given twice", p->params[k], p->name);
      diag_note(S->d, prev->name ? prev->name_loc : prev->value->loc, "first given here");
      ok = false;
      continue;
    }
    c->arg[k] = a;
  }
  if (p->max_variadic && (c->nvar < p->min_variadic || c->nvar > p->max_variadic)) {
    diag_error(S->d, e->loc, "%s takes %d to %d tensors, found %d", p->name, p->min_variadic,
               p->max_variadic, c->nvar);
    ok = false;
  }
  for (int k = 0; ok && k < p->nrequired; k++) {
    if (!c->arg[k]) {
      diag_error(S->d, e->loc, "missing argument '%s' in call to %s; expected %s",
                 p->params[k], p->name, p->signature);
      ok = false;
    }
  }
  return ok;
}

// --- expressions ------------------------------------------------------------------------

static const char *const call_names[NOPS] = {
    "embed", "linear", "mlp", "rmsnorm", "layernorm", "silu", "gelu", "gelu_taylor", "relu",
    "sigmoid", "concat", "stack", "flatten", "dot_interact", "gdpa", "pma", "bce"};

// A call, possibly under annotations (`mlp(...) @mxfp8 @schedule(stages = 2)`).
static int lower_call(Sema *S, const Expr *e, const char *out) {
  int nannots = 0;
  const Expr *call = e;
  for (; call->kind == EXPR_ANNOT; call = call->lhs) nannots++;
  const Expr **annots = NULL;
  if (nannots) {
    annots = arena_alloc(S->arena, (size_t)nannots * sizeof *annots);
    int i = 0;
    for (const Expr *a = e; a->kind == EXPR_ANNOT; a = a->lhs) annots[i++] = a;
  }
  if (call->kind != EXPR_CALL) {
    const Expr *a = annots[nannots - 1];
    diag_error(S->d, a->name_loc, "'@%s' must follow an op call; found %s", a->name,
               sema_describe(S, call));
    return sema_expr(S, call, out);
  }
  const OpSpec *spec = find_op(call->name);
  if (!spec) {
    diag_error(S->d, call->name_loc, "unknown op '%s'; expected %s", call->name,
               sema_list(S, call_names, NOPS));
    sema_suggest(S, call->name_loc, call->name, call_names, NOPS);
    sema_touch(S, call);
    return -1;
  }
  Call c;
  memset(&c, 0, sizeof c);
  c.e = call;
  c.spec = spec;
  c.out = out;
  if (!bind_args(S, &c)) {
    sema_touch(S, call);
    return -1;
  }
  sema_apply_annotations(S, &c, annots, nannots);
  int first = S->ir->nnodes;
  int out_t = spec->lower(S, &c);
  // @schedule(recompute = ...): every node of the call, its nested argument calls included
  // (they are lowered inside it), is recomputed in the backward (compiler/passes/recompute.c),
  // but a nested call's own hint, true or false, wins.
  // The call's result itself is kept (RECOMPUTE_KEEP), the checkpoint from which the next marked call
  // recomputes: without it, a stack of marked layers would be recomputed whole at once.
  for (int i = first; c.sched.recompute && i < S->ir->nnodes; i++)
    if (!S->ir->nodes[i].sched.recompute) S->ir->nodes[i].sched.recompute = c.sched.recompute;
  if (c.sched.recompute == RECOMPUTE_TRUE && out_t >= 0) {
    int p = S->ir->tensors[out_t].producer;
    if (p >= first && S->ir->nodes[p].sched.recompute == RECOMPUTE_TRUE)
      S->ir->nodes[p].sched.recompute = RECOMPUTE_KEEP;
  }
  return out_t;
}

static SemaOp binary_op(char op) { return op == '+' ? SOP_ADD : op == '-' ? SOP_SUB : SOP_MUL; }

static bool same_shape(const Tensor *a, const Tensor *b) {
  return a->layout == b->layout && a->width == b->width &&
         (a->layout != LAYOUT_JAGGED || a->jag == b->jag) &&
         (a->layout != LAYOUT_SET || a->set_k == b->set_k);
}

static int binary_node(Sema *S, const Expr *e, int a, int b, const char *out) {
  if (a < 0 || b < 0) return -1;
  if (!same_shape(sema_tensor(S, a), sema_tensor(S, b))) {
    diag_error(S->d, e->loc, "shape mismatch in '%c': left is %s, right is %s", e->op,
               sema_shape(S, a), sema_shape(S, b));
    return -1;
  }
  SemaOp sop = binary_op(e->op);
  const char *name = next_name(S, sop);
  DType prec = sema_default_precision(S, false);
  int t = sema_value_like(S, out ? out : name, a, sema_tensor(S, a)->width,
                          sema_value_dtype(prec), e->loc);
  Node n;
  memset(&n, 0, sizeof n);
  n.op = sop == SOP_ADD ? OP_ADD : sop == SOP_SUB ? OP_SUB : OP_MUL;
  n.loc = e->loc;
  n.out = t;
  n.ins[0] = a;
  n.ins[1] = b;
  n.nins = 2;
  n.prec = prec;
  ir_add_node(S->ir, &n);
  return t;
}

// a + b - c * d: the left spine is walked with a loop, so a long chain needs no deep stack.
static int lower_binary(Sema *S, const Expr *e, const char *out) {
  int n = 0;
  for (const Expr *x = e; x->kind == EXPR_BINARY; x = x->lhs) n++;
  const Expr *small[16];
  const Expr **spine = n <= 16 ? small : arena_alloc(S->arena, (size_t)n * sizeof *spine);
  int i = 0;
  for (const Expr *x = e; x->kind == EXPR_BINARY; x = x->lhs) spine[i++] = x;
  const Expr *bottom = spine[n - 1];
  int acc = sema_operand(S, bottom->lhs, sema_fmt(S, "'%c'", bottom->op));
  for (i = n - 1; i >= 0 && !S->d->too_many; i--) {
    const Expr *b = spine[i];
    int rhs = sema_operand(S, b->rhs, sema_fmt(S, "'%c'", b->op));
    acc = binary_node(S, b, acc, rhs, i == 0 ? out : NULL);
  }
  return S->d->too_many ? -1 : acc;
}

int sema_expr(Sema *S, const Expr *e, const char *out) {
  if (S->d->too_many) return -1;
  switch (e->kind) {
  case EXPR_NAME: return sema_name_tensor(S, e);
  case EXPR_INT:
  case EXPR_REAL:
  case EXPR_STRING:
  case EXPR_LIST:
    diag_error(S->d, e->loc, "expected a tensor, found %s", sema_describe(S, e));
    sema_touch(S, e);
    return -1;
  case EXPR_NEG: {
    double v;
    if (sema_real_literal(e, &v))
      diag_error(S->d, e->loc, "expected a tensor, found %s", sema_describe(S, e));
    else
      diag_error(S->d, e->loc, "unary '-' applies to numbers only; expected a number, found "
                 "%s", sema_describe(S, e->lhs));
    sema_touch(S, e);
    return -1;
  }
  case EXPR_BINARY: return lower_binary(S, e, out);
  case EXPR_CALL:
  case EXPR_ANNOT: return lower_call(S, e, out);
  }
  GEMC_UNREACHABLE();
}

// --- embed ------------------------------------------------------------------------------

static int embed_table(Sema *S, const Expr *e) {
  if (e->kind != EXPR_NAME) {
    diag_error(S->d, e->loc, "embed expects a table as its first argument, found %s",
               sema_describe(S, e));
    sema_touch(S, e);
    return -1;
  }
  Symbol *y = sema_lookup(S, e->name);
  if (!y) {
    sema_unknown_name(S, e, SYM_TABLE, "a table");
    return -1;
  }
  sema_touch(S, e);
  if (y->kind != SYM_TABLE) {
    diag_error(S->d, e->loc, "embed expects a table as its first argument, found %s '%s'",
               y->kind == SYM_INPUT ? "input" : y->kind == SYM_LABEL ? "label" : "binding",
               e->name);
    return -1;
  }
  return y->tensor;
}

static int lower_embed(Sema *S, Call *c) {
  static const char *const pools[] = {"sum", "mean"};
  int table = embed_table(S, c->arg[0]->value);
  const Expr *ids_expr = c->arg[1]->value;
  int ids = sema_expr(S, ids_expr, NULL);
  int pool;
  bool ok = sema_arg_choice(S, c, 2, "pool", pools, 2, POOL_SUM, &pool);
  if (table < 0 || ids < 0 || !ok) return -1;
  Tensor it = *sema_tensor(S, ids);
  if (it.dtype != DT_I64 || it.width != 0 ||
      (it.layout != LAYOUT_DENSE && it.layout != LAYOUT_JAGGED)) {
    diag_error(S->d, ids_expr->loc, "embed expects ids (a seq, sparse or multihot input) as "
               "its second argument, found %s", sema_shape(S, ids));
    return -1;
  }
  bool pooled = c->arg[2] != NULL;
  if (it.layout == LAYOUT_DENSE && pooled) {
    diag_error(S->d, c->arg[2]->value->loc, "pool needs a seq or multihot input, found sparse "
               "ids %s", sema_shape(S, ids));
    return -1;
  }
  if (it.layout == LAYOUT_JAGGED) {
    const Symbol *owner = sema_lookup(S, S->ir->jagged[it.jag].name);
    if (owner && owner->kind == SYM_INPUT && owner->decl->input == INPUT_MULTIHOT)
      pooled = true;  // a bag of ids is always pooled; sum unless said otherwise
  }
  // The table's gradient is one table_grad node, which takes at most so many lookups.
  int lookups = 0;
  for (int i = 0; i < S->ir->nnodes; i++) {
    const Node *e = &S->ir->nodes[i];
    if ((e->op == OP_EMBED || e->op == OP_EMBED_POOL) && e->ins[0] == table) lookups++;
  }
  if (lookups >= IR_MAX_TABLE_LOOKUPS) {
    diag_error(S->d, c->arg[0]->value->loc, "table '%s' is looked up more than %d times; its "
               "gradient supports at most %d lookups of one table", sema_tensor(S, table)->name,
               IR_MAX_TABLE_LOOKUPS, IR_MAX_TABLE_LOOKUPS);
    return -1;
  }
  int64_t dim = sema_tensor(S, table)->fixed[1];
  sema_call_begin(S, c);
  int out = pooled ? sema_value(S, c->out, LAYOUT_DENSE, -1, 0, dim, c->value_dtype, c->e->loc)
                   : sema_value_like(S, c->out, ids, dim, c->value_dtype, c->e->loc);
  Node n = sema_node_for(c, pooled ? OP_EMBED_POOL : OP_EMBED, out);
  n.ins[n.nins++] = table;
  n.ins[n.nins++] = ids;
  n.pool = (Pool)pool;
  ir_add_node(S->ir, &n);
  return out;
}

// --- linear and mlp ---------------------------------------------------------------------

static int lower_linear(Sema *S, Call *c) {
  int x = sema_arg_operand(S, c, 0);
  int64_t n;
  bool bias;
  bool ok = sema_arg_positive(S, c, 1, 0, &n);
  ok &= sema_arg_bool(S, c, 2, true, &bias);
  if (x < 0 || !ok) return -1;
  int64_t d = sema_tensor(S, x)->width;
  sema_call_begin(S, c);
  int w = sema_param(S, sema_fmt(S, "%s.w", c->base), d, n, c->e->loc);
  int b = bias ? sema_param(S, sema_fmt(S, "%s.b", c->base), n, 0, c->e->loc) : -1;
  return sema_linear_node(S, c, &c->sched, c->out, x, w, b, n, ACT_NONE);
}

// Reads [n1, ..., nk]; returns k, or -1 after reporting.
static int mlp_sizes(Sema *S, Call *c, int64_t **sizes) {
  const Expr *e = c->arg[1]->value;
  if (e->kind != EXPR_LIST) {
    diag_error(S->d, e->loc, "argument 'sizes' of mlp expects a list of layer sizes such as "
               "[1024, 1], found %s", sema_describe(S, e));
    sema_touch(S, e);
    return -1;
  }
  if (e->nargs == 0) {
    diag_error(S->d, e->loc, "mlp needs at least one layer size; found []");
    return -1;
  }
  *sizes = arena_alloc(S->arena, (size_t)e->nargs * sizeof **sizes);
  bool ok = true;
  for (int i = 0; i < e->nargs; i++) {
    const Expr *item = e->args[i].value;
    int64_t v;
    if (!sema_int_literal(item, &v)) {
      diag_error(S->d, item->loc, "mlp layer sizes must be positive integers, found %s",
                 sema_describe(S, item));
      sema_touch(S, item);
      ok = false;
    } else if (v <= 0 || v > SEMA_MAX_SIZE) {
      diag_error(S->d, item->loc, "mlp layer sizes must be in 1..%" PRId64 ", found %" PRId64,
                 SEMA_MAX_SIZE, v);
      ok = false;
    } else {
      (*sizes)[i] = v;
    }
  }
  return ok ? e->nargs : -1;
}

static int lower_mlp(Sema *S, Call *c) {
  int x = sema_arg_operand(S, c, 0);
  int64_t *sizes = NULL;
  int k = mlp_sizes(S, c, &sizes);
  Act act;
  bool ok = sema_arg_act(S, c, 2, false, ACT_RELU, &act);
  if (ok) sema_check_gelu_hint(S, c, act);
  if (x < 0 || k < 0 || !ok) return -1;
  sema_call_begin(S, c);
  int cur = x;
  for (int i = 0; i < k; i++) {
    int64_t d = sema_tensor(S, cur)->width;
    bool last = i == k - 1;
    int w = sema_param(S, sema_fmt(S, "%s.l%d.w", c->base, i), d, sizes[i], c->e->loc);
    int b = sema_param(S, sema_fmt(S, "%s.l%d.b", c->base, i), sizes[i], 0, c->e->loc);
    Act a = last ? ACT_NONE : act;
    Schedule sched = c->sched;
    if (a != ACT_GELU) sched.gelu_taylor = 0;
    const char *name = last ? c->out : sema_fmt(S, "%s.l%d", c->base, i);
    cur = sema_linear_node(S, c, &sched, name, cur, w, b, sizes[i], a);
  }
  return cur;
}

// --- norms and activations --------------------------------------------------------------

static int lower_norm(Sema *S, Call *c) {
  bool layer = c->spec->sop == SOP_LAYERNORM;
  int x = sema_arg_operand(S, c, 0);
  double eps;
  bool ok = sema_arg_real(S, c, 1, layer ? 1e-5 : 1e-6, &eps);
  if (ok && !(eps > 0)) {
    diag_error(S->d, c->arg[1]->value->loc, "argument 'eps' of %s must be positive, found %g",
               c->spec->name, eps);
    ok = false;
  }
  if (x < 0 || !ok) return -1;
  int64_t d = sema_tensor(S, x)->width;
  sema_call_begin(S, c);
  int gain = sema_param(S, sema_fmt(S, "%s.gain", c->base), d, 0, c->e->loc);
  int bias = layer ? sema_param(S, sema_fmt(S, "%s.bias", c->base), d, 0, c->e->loc) : -1;
  int out = sema_value_like(S, c->out, x, d, c->value_dtype, c->e->loc);
  Node n = sema_node_for(c, layer ? OP_LAYERNORM : OP_RMSNORM, out);
  n.ins[n.nins++] = x;
  n.ins[n.nins++] = gain;
  if (bias >= 0) n.ins[n.nins++] = bias;
  n.eps = eps;
  ir_add_node(S->ir, &n);
  return out;
}

static int lower_act(Sema *S, Call *c) {
  Act act = ACT_NONE;
  switch (c->spec->sop) {
  case SOP_SILU: act = ACT_SILU; break;
  case SOP_GELU: act = ACT_GELU; break;
  case SOP_GELU_TAYLOR: act = ACT_GELU_TAYLOR; break;
  case SOP_RELU: act = ACT_RELU; break;
  case SOP_SIGMOID: act = ACT_SIGMOID; break;
  default: GEMC_UNREACHABLE();
  }
  int x = sema_arg_operand(S, c, 0);
  if (x < 0) return -1;
  sema_call_begin(S, c);
  int out = sema_value_like(S, c->out, x, sema_tensor(S, x)->width, c->value_dtype, c->e->loc);
  Node n = sema_node_for(c, OP_ACT, out);
  n.ins[n.nins++] = x;
  n.act = act;
  n.sched = c->sched;
  ir_add_node(S->ir, &n);
  return out;
}

// --- concat, stack, flatten, dot_interact -----------------------------------------------

// Lowers every variadic operand; false when any failed.
static bool lower_operands(Sema *S, Call *c, int *ts) {
  bool ok = true;
  for (int i = 0; i < c->nvar; i++) {
    ts[i] = sema_operand(S, c->var[i]->value, c->spec->name);
    ok &= ts[i] >= 0;
  }
  return ok;
}

static int variadic_node(Sema *S, Call *c, OpKind op, const int *ts, int out) {
  Node n = sema_node_for(c, op, out);
  for (int i = 0; i < c->nvar; i++) n.ins[n.nins++] = ts[i];
  n.sched = c->sched;
  ir_add_node(S->ir, &n);
  return out;
}

static int lower_concat(Sema *S, Call *c) {
  int ts[SEMA_MAX_VARIADIC] = {0};
  if (!lower_operands(S, c, ts)) return -1;
  const Tensor *first = sema_tensor(S, ts[0]);
  int64_t width = first->width;
  for (int i = 1; i < c->nvar; i++) {
    const Tensor *t = sema_tensor(S, ts[i]);
    bool same = t->layout == first->layout &&
                (t->layout != LAYOUT_JAGGED || t->jag == first->jag) &&
                (t->layout != LAYOUT_SET || t->set_k == first->set_k);
    if (!same) {
      diag_error(S->d, c->var[i]->value->loc, "concat needs one layout and leading dims: "
                 "argument 1 is %s, argument %d is %s", sema_shape(S, ts[0]), i + 1,
                 sema_shape(S, ts[i]));
      return -1;
    }
    width += t->width;
  }
  if (width > SEMA_MAX_SIZE) {
    diag_error(S->d, c->e->loc, "concat gives width %" PRId64 ", which is too large; expected "
               "at most %" PRId64, width, SEMA_MAX_SIZE);
    return -1;
  }
  sema_call_begin(S, c);
  int out = sema_value_like(S, c->out, ts[0], width, c->value_dtype, c->e->loc);
  return variadic_node(S, c, OP_CONCAT, ts, out);
}

// Checks that every operand is dense[B, d] with one d (stack, dot_interact).
static bool dense_same_width(Sema *S, Call *c, const int *ts) {
  for (int i = 0; i < c->nvar; i++) {
    const Tensor *t = sema_tensor(S, ts[i]);
    if (t->layout != LAYOUT_DENSE) {
      diag_error(S->d, c->var[i]->value->loc, "%s expects dense[B, d] tensors; argument %d is "
                 "%s", c->spec->name, i + 1, sema_shape(S, ts[i]));
      return false;
    }
    if (t->width != sema_tensor(S, ts[0])->width) {
      diag_error(S->d, c->var[i]->value->loc, "%s needs one width d: argument 1 is %s, "
                 "argument %d is %s", c->spec->name, sema_shape(S, ts[0]), i + 1,
                 sema_shape(S, ts[i]));
      return false;
    }
  }
  return true;
}

static int lower_stack(Sema *S, Call *c) {
  int ts[SEMA_MAX_VARIADIC] = {0};
  if (!lower_operands(S, c, ts) || !dense_same_width(S, c, ts)) return -1;
  sema_call_begin(S, c);
  int out = sema_value(S, c->out, LAYOUT_SET, -1, c->nvar, sema_tensor(S, ts[0])->width,
                       c->value_dtype, c->e->loc);
  return variadic_node(S, c, OP_STACK, ts, out);
}

static int lower_flatten(Sema *S, Call *c) {
  int x = sema_arg_operand(S, c, 0);
  if (x < 0) return -1;
  Tensor t = *sema_tensor(S, x);
  if (t.layout != LAYOUT_SET) {
    diag_error(S->d, c->arg[0]->value->loc, "flatten expects a set[B, k, d], found %s",
               sema_shape(S, x));
    return -1;
  }
  int64_t width = t.set_k * t.width;  // both at most SEMA_MAX_SIZE: no overflow
  if (width > SEMA_MAX_SIZE) {
    diag_error(S->d, c->e->loc, "flatten gives width %" PRId64 ", which is too large; expected "
               "at most %" PRId64, width, SEMA_MAX_SIZE);
    return -1;
  }
  sema_call_begin(S, c);
  int out = sema_value(S, c->out, LAYOUT_DENSE, -1, 0, width, c->value_dtype, c->e->loc);
  Node n = sema_node_for(c, OP_FLATTEN, out);
  n.ins[n.nins++] = x;
  ir_add_node(S->ir, &n);
  return out;
}

static int lower_dot_interact(Sema *S, Call *c) {
  int ts[SEMA_MAX_VARIADIC] = {0};
  if (!lower_operands(S, c, ts) || !dense_same_width(S, c, ts)) return -1;
  sema_call_begin(S, c);
  int64_t pairs = (int64_t)c->nvar * (c->nvar - 1) / 2;
  int out = sema_value(S, c->out, LAYOUT_DENSE, -1, 0, pairs, c->value_dtype, c->e->loc);
  return variadic_node(S, c, OP_DOT_INTERACT, ts, out);
}
