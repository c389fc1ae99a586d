// sema_loss.c: the loss. Checks that a model has exactly one `loss` statement whose terms are
// `bce(...)` or `w * bce(...)` with a positive weight, lowers each bce (a logit dense[B, 1]
// against a label) and sums the terms with one loss_sum node, %loss, even for one term.
#include <math.h>
#include <string.h>

#include "sema_internal.h"  // defines: Sema, Call, sema_* helpers

enum { MAX_TERMS = IR_MAX_PARTS };

// The label named by bce's second argument; -1 after reporting.
static int bce_label(Sema *S, const Expr *e) {
  if (e->kind != EXPR_NAME) {
    diag_error(S->d, e->loc, "bce expects a label as its second argument, found %s",
               sema_describe(S, e));
    sema_touch(S, e);
    return -1;
  }
  Symbol *y = sema_lookup(S, e->name);
  if (!y) {
    sema_unknown_name(S, e, SYM_LABEL, "a label");
    return -1;
  }
  sema_touch(S, e);
  if (y->kind != SYM_LABEL) {
    diag_error(S->d, e->loc, "bce expects a label as its second argument, found %s '%s'",
               y->kind == SYM_INPUT ? "input" : y->kind == SYM_TABLE ? "table" : "binding",
               e->name);
    return -1;
  }
  return y->tensor;
}

// Parameters: 0 logit, 1 label, 2 name.
int sema_lower_bce(Sema *S, Call *c) {
  if (!S->bce_allowed) {
    if (strcmp(S->prefix, "loss") == 0)
      diag_error(S->d, c->e->name_loc, "bce can only be a term of the loss; found it inside "
                 "another expression");
    else
      diag_error(S->d, c->e->name_loc, "bce can only be used in a loss statement; found it in "
                 "the binding of '%s'", S->prefix);
    sema_touch(S, c->e);
    return -1;
  }
  S->bce_allowed = false;  // not in its own arguments
  int logit = sema_arg_operand(S, c, 0);
  int label = bce_label(S, c->arg[1]->value);
  const char *task = c->arg[1]->value->kind == EXPR_NAME ? c->arg[1]->value->name : NULL;
  bool ok = true;
  if (c->arg[2]) {
    const Expr *e = c->arg[2]->value;
    if (e->kind != EXPR_STRING) {
      diag_error(S->d, e->loc, "argument 'name' of bce expects a string, found %s",
                 sema_describe(S, e));
      ok = false;
    } else if (!e->string || !e->string[0]) {
      diag_error(S->d, e->loc, "argument 'name' of bce expects a task name, found an empty "
                 "string");
      ok = false;
    } else {
      task = e->string;
    }
  }
  if (logit >= 0) {
    const Tensor *t = sema_tensor(S, logit);
    if (t->layout != LAYOUT_DENSE || t->width != 1) {
      diag_error(S->d, c->arg[0]->value->loc, "bce expects a logit of shape dense[B, 1], "
                 "found %s", sema_shape(S, logit));
      ok = false;
    }
  }
  if (logit < 0 || label < 0 || !ok) return -1;
  sema_call_begin(S, c);
  int out = sema_value(S, c->out, LAYOUT_SCALAR, -1, 0, 0, DT_F32, c->e->loc);
  Node n = sema_node_for(c, OP_BCE, out);
  n.ins[n.nins++] = logit;
  n.ins[n.nins++] = label;
  n.prec = DT_F32;
  n.task = task;
  ir_add_node(S->ir, &n);
  return out;
}

static bool is_bce(const Expr *e) {
  while (e->kind == EXPR_ANNOT) e = e->lhs;
  return e->kind == EXPR_CALL && strcmp(e->name, "bce") == 0;
}

// The bce call of one term, and its weight; NULL after reporting.
static const Expr *term_call(Sema *S, const Expr *e, double *weight) {
  *weight = 1.0;
  if (is_bce(e)) return e;
  if (e->kind == EXPR_BINARY && e->op == '*') {
    const Expr *w = NULL, *call = NULL;
    double v;
    if (is_bce(e->rhs) && sema_real_literal(e->lhs, &v)) {
      w = e->lhs;
      call = e->rhs;
    } else if (is_bce(e->lhs) && sema_real_literal(e->rhs, &v)) {
      w = e->rhs;
      call = e->lhs;
    }
    if (call) {
      if (!(v > 0) || !isfinite(v)) {
        diag_error(S->d, w->loc, "a loss weight must be a positive number, found %g", v);
        sema_touch(S, e);
        return NULL;
      }
      *weight = v;
      return call;
    }
  }
  diag_error(S->d, e->loc, "a loss term must be bce(...) or w * bce(...); found %s",
             sema_describe(S, e));
  sema_touch(S, e);
  return NULL;
}

void sema_lower_loss(Sema *S, const Stmt *s) {
  if (S->loss_stmt) {
    diag_error(S->d, s->loc, "a model has exactly one loss statement; found a second one");
    diag_note(S->d, S->loss_stmt->loc, "the first loss statement is here");
    sema_touch(S, s->value);
    return;
  }
  S->loss_stmt = s;
  if (!s->value) return;
  S->prefix = "loss";
  S->op_counts = S->loss_counts;

  // The terms are the left spine of '+', read with a loop.
  int n = 1;
  for (const Expr *x = s->value; x->kind == EXPR_BINARY && x->op == '+'; x = x->lhs) n++;
  const Expr **terms = arena_alloc(S->arena, (size_t)n * sizeof *terms);
  const Expr *x = s->value;
  for (int i = n - 1; i > 0; i--, x = x->lhs) terms[i] = x->rhs;
  terms[0] = x;
  if (n > MAX_TERMS) {
    diag_error(S->d, terms[MAX_TERMS]->loc, "a loss has at most %d terms; found %d", MAX_TERMS,
               n);
    sema_touch(S, s->value);
    return;
  }

  int ts[MAX_TERMS];
  double ws[MAX_TERMS];
  bool ok = true;
  for (int i = 0; i < n && !S->d->too_many; i++) {
    const Expr *call = term_call(S, terms[i], &ws[i]);
    if (!call) {
      ok = false;
      continue;
    }
    S->bce_allowed = true;
    ts[i] = sema_expr(S, call, NULL);
    S->bce_allowed = false;
    ok &= ts[i] >= 0;
  }
  if (!ok || S->d->too_many) return;
  int out = sema_value(S, "loss", LAYOUT_SCALAR, -1, 0, 0, DT_F32, s->value->loc);
  Node nd;
  memset(&nd, 0, sizeof nd);
  nd.op = OP_LOSS_SUM;
  nd.loc = s->value->loc;
  nd.out = out;
  nd.prec = DT_F32;
  for (int i = 0; i < n; i++) {
    nd.ins[nd.nins] = ts[i];
    nd.weights[nd.nins++] = ws[i];
  }
  ir_add_node(S->ir, &nd);
  S->ir->loss = out;
}
