// sema_attention.c: gdpa and pma. Works out the attention shape from the layouts of q and kv
// (self, cross, pFFN; pma is its own), checks heads, masks and windows against it, and
// lowers each call to Q/K/V projections, one attention node and an output projection.
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "sema_internal.h"  // defines: Sema, Call, sema_* helpers

// The arguments gdpa and pma share.
typedef struct AttnArgs {
  int64_t heads;
  Act act;
  double scale;  // 0: the default 1/sqrt(d/heads)
  bool hstu_norm;
} AttnArgs;

static bool read_common(Sema *S, Call *c, int heads, int act, int scale, int hstu_norm,
                        AttnArgs *a) {
  bool ok = sema_arg_positive(S, c, heads, 1, &a->heads);
  if (sema_arg_act(S, c, act, true, ACT_SOFTMAX, &a->act)) sema_check_gelu_hint(S, c, a->act);
  else ok = false;
  if (!sema_arg_real(S, c, scale, 0, &a->scale)) {
    ok = false;
  } else if (c->arg[scale] && !(a->scale > 0 && isfinite(a->scale))) {
    diag_error(S->d, c->arg[scale]->value->loc, "argument 'scale' of %s must be a positive "
               "number, found %g", c->spec->name, a->scale);
    ok = false;
  }
  ok &= sema_arg_bool(S, c, hstu_norm, false, &a->hstu_norm);
  return ok;
}

// Checks that heads divides the width d of q.
static bool check_heads(Sema *S, Call *c, int heads_param, const AttnArgs *a, int q,
                        const char *qname) {
  int64_t d = sema_tensor(S, q)->width;
  if (d % a->heads == 0) return true;
  diag_error(S->d, c->arg[heads_param] ? c->arg[heads_param]->value->loc : c->e->loc,
             "heads = %" PRId64 " does not divide the width of %s, %s; expected a divisor of %"
             PRId64, a->heads, qname, sema_shape(S, q), d);
  return false;
}

static int attention_node(Sema *S, const Call *c, int out, int q, int k, int v,
                          AttnShape shape, const AttnArgs *a, Mask mask, int64_t window,
                          int64_t d) {
  Node n = sema_node_for(c, OP_ATTENTION, out);
  n.ins[n.nins++] = q;
  n.ins[n.nins++] = k;
  n.ins[n.nins++] = v;
  n.shape = shape;
  n.heads = a->heads;
  n.act = a->act;
  n.mask = mask;
  n.window = window;
  n.scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)(d / a->heads));
  n.hstu_norm = a->hstu_norm;
  n.sched = c->sched;
  ir_add_node(S->ir, &n);
  const Tensor *kt = sema_tensor(S, k);
  sema_warn_idle_hints(S, c, d / a->heads, kt->layout == LAYOUT_SET ? kt->set_k : 0);
  return out;
}

// --- gelu_taylor on scores that no norm bounds ------------------------------------------
// The rule (docs/activations.md): one side of an attention (gdpa's q and kv, pma's x) is
// norm-bounded when its tensor is the output of rmsnorm or layernorm, or a stack, concat or
// flatten of norm-bounded tensors (they move values, never grow them); pma's seeds are
// parameters, bounded too. A norm's rows have a fixed size for given gains, and the Q/K
// projections are linear without a bias, so with both sides bounded |score| is bounded by the
// parameters alone, whatever the data. Otherwise the scores grow with the inputs, and
// gelu_taylor on them (act = gelu_taylor, or gelu with @schedule(gelu = taylor)) draws a
// note. Conservative: any other producer (an add, a linear, an activation, an input) counts
// as unbounded.

enum { NORM_BOUND_MAX_DEPTH = 64 };  // deeper nests of stack/concat count as unbounded

static bool norm_bounded(const Sema *S, int tensor, int depth) {
  const Tensor *t = sema_tensor(S, tensor);
  if (t->kind != TENSOR_VALUE || t->producer < 0) return false;
  const Node *n = &S->ir->nodes[t->producer];
  switch (n->op) {
  case OP_RMSNORM:
  case OP_LAYERNORM: return true;
  case OP_STACK:
  case OP_CONCAT:
  case OP_FLATTEN:
    if (depth >= NORM_BOUND_MAX_DEPTH) return false;
    for (int i = 0; i < n->nins; i++)
      if (!norm_bounded(S, n->ins[i], depth + 1)) return false;
    return true;
  default: return false;
  }
}

// One side of the scores: its name in the call, its tensor and where it is written.
typedef struct ScoreSide {
  const char *name;
  int tensor;
  const Expr *e;
} ScoreSide;

static void note_unbounded_scores(Sema *S, const Call *c, int act_param, const AttnArgs *a,
                                  const ScoreSide *sides, int nsides) {
  Loc at;
  const char *what;
  if (a->act == ACT_GELU_TAYLOR && c->arg[act_param]) {
    at = c->arg[act_param]->value->loc;
    what = "gelu_taylor";
  } else if (a->act == ACT_GELU && c->sched.gelu_taylor == 1) {
    at = c->hint_loc[HINT_GELU];
    what = "@schedule(gelu = taylor)";
  } else {
    return;
  }
  const ScoreSide *open[2];
  int nopen = 0;
  for (int i = 0; i < nsides && nopen < 2; i++)
    if (!norm_bounded(S, sides[i].tensor, 0)) open[nopen++] = &sides[i];
  if (nopen == 0) return;
  // A note, not a warning: the clamped minimax keeps its bound for every input
  // (docs/activations.md), so unbounded scores cost accuracy nowhere; the note says where
  // the scores are not held small, which a user tuning the range may still want to know.
  if (nopen == 1)
    diag_note(S->d, at, "%s on attention scores that no norm bounds: %s is not the output of "
              "rmsnorm or layernorm (the bound of `gemc check -v` holds for any input)", what,
              open[0]->name);
  else
    diag_note(S->d, at, "%s on attention scores that no norm bounds: %s and %s are not "
              "outputs of rmsnorm or layernorm (the bound of `gemc check -v` holds for any "
              "input)", what, open[0]->name, open[1]->name);
  for (int i = 0; i < nopen; i++)
    diag_note(S->d, open[i]->e->loc, "the scores grow with %s here; wrap it in rmsnorm(...) or "
              "layernorm(...), or use exact gelu (docs/activations.md)", open[i]->name);
}

// --- gdpa -------------------------------------------------------------------------------
// Parameters: 0 x, 1 q, 2 kv, 3 heads, 4 act, 5 mask, 6 window, 7 scale, 8 hstu_norm.

// Checks which arguments name q and kv; false after reporting.
static bool gdpa_form(Sema *S, Call *c) {
  const Arg *x = c->arg[0], *q = c->arg[1], *kv = c->arg[2];
  if (x && (q || kv)) {
    const Arg *extra = q ? q : kv;
    diag_error(S->d, extra->name_loc, "gdpa takes either a positional x or q = and kv =, not "
               "both; found x and %s =", extra->name);
    return false;
  }
  if (!x && !q && !kv) {
    diag_error(S->d, c->e->loc, "missing argument 'x' in call to gdpa; expected gdpa(x, ...) "
               "or gdpa(q = ..., kv = ...)");
    return false;
  }
  if (!x && (!q || !kv)) {
    const Arg *given = q ? q : kv;
    diag_error(S->d, given->name_loc, "gdpa needs both q = and kv =; found only %s =",
               given->name);
    return false;
  }
  return true;
}

int sema_lower_gdpa(Sema *S, Call *c) {
  static const char *const masks[] = {"none", "causal"};
  if (!gdpa_form(S, c)) {
    sema_touch(S, c->e);
    return -1;
  }
  bool self_form = c->arg[0] != NULL;
  const Expr *qe = self_form ? c->arg[0]->value : c->arg[1]->value;
  const Expr *kve = self_form ? qe : c->arg[2]->value;
  int q = sema_operand(S, qe, "gdpa");
  int kv = self_form ? q : sema_operand(S, kve, "gdpa");
  AttnArgs a;
  int mask;
  int64_t window;
  bool ok = read_common(S, c, 3, 4, 7, 8, &a);
  ok &= sema_arg_choice(S, c, 5, "mask", masks, 2, MASK_NONE, &mask);
  ok &= sema_arg_positive(S, c, 6, 0, &window);
  if (q < 0 || kv < 0 || !ok) return -1;

  Tensor Q = *sema_tensor(S, q), K = *sema_tensor(S, kv);
  AttnShape shape;
  if (self_form) {
    if (Q.layout != LAYOUT_JAGGED) {
      diag_error(S->d, qe->loc, "gdpa(x) is self-attention and needs a sequence: x is %s, "
                 "expected jagged", sema_shape(S, q));
      return -1;
    }
    shape = ATTN_SELF;
  } else if (Q.layout == LAYOUT_JAGGED) {
    if (K.layout == LAYOUT_JAGGED && K.jag == Q.jag) {
      shape = ATTN_SELF;
    } else if (K.layout == LAYOUT_JAGGED || K.layout == LAYOUT_SET) {
      shape = ATTN_CROSS;
    } else {
      diag_error(S->d, kve->loc, "gdpa with a jagged q needs kv to be a set or a sequence: kv "
                 "is %s, expected set or jagged", sema_shape(S, kv));
      return -1;
    }
  } else if (K.layout == LAYOUT_JAGGED) {
    shape = ATTN_PFFN;
  } else {
    diag_error(S->d, kve->loc, "gdpa needs a sequence on one side: q is %s and kv is %s, "
               "expected a jagged q or kv", sema_shape(S, q), sema_shape(S, kv));
    return -1;
  }
  if (!check_heads(S, c, 3, &a, q, "q")) return -1;
  bool one_seq = shape == ATTN_SELF;
  if (mask == MASK_CAUSAL && !one_seq) {
    diag_error(S->d, c->arg[5]->value->loc, "causal mask needs q and kv from one sequence; q "
               "is %s, kv is %s", sema_shape(S, q), sema_shape(S, kv));
    ok = false;
  }
  if (window && Q.layout != LAYOUT_JAGGED) {
    diag_error(S->d, c->arg[6]->value->loc, "window needs a sequence: q is %s, expected "
               "jagged", sema_shape(S, q));
    ok = false;
  } else if (window && !one_seq) {
    diag_error(S->d, c->arg[6]->value->loc, "window needs q and kv from one sequence; q is "
               "%s, kv is %s", sema_shape(S, q), sema_shape(S, kv));
    ok = false;
  }
  if (!ok) return -1;

  int64_t d = Q.width, dkv = K.width;
  Loc loc = c->e->loc;
  sema_call_begin(S, c);
  const char *b = c->base;
  int wq = sema_param(S, sema_fmt(S, "%s.wq", b), d, d, loc);
  int wk = sema_param(S, sema_fmt(S, "%s.wk", b), dkv, d, loc);
  int wv = sema_param(S, sema_fmt(S, "%s.wv", b), dkv, d, loc);
  int wo = sema_param(S, sema_fmt(S, "%s.wo", b), d, d, loc);
  int qp = sema_linear_node(S, c, NULL, sema_fmt(S, "%s.q", b), q, wq, -1, d, ACT_NONE);
  int kp = sema_linear_node(S, c, NULL, sema_fmt(S, "%s.k", b), kv, wk, -1, d, ACT_NONE);
  int vp = sema_linear_node(S, c, NULL, sema_fmt(S, "%s.v", b), kv, wv, -1, d, ACT_NONE);
  int att = sema_value_like(S, sema_fmt(S, "%s.attn", b), qp, d, c->value_dtype, loc);
  attention_node(S, c, att, qp, kp, vp, shape, &a, (Mask)mask, window, d);
  ScoreSide sides[2] = {{self_form ? "x" : "q", q, qe}, {"kv", kv, kve}};
  note_unbounded_scores(S, c, 4, &a, sides, self_form ? 1 : 2);
  return sema_linear_node(S, c, NULL, c->out, att, wo, -1, d, ACT_NONE);
}

// --- pma --------------------------------------------------------------------------------
// Parameters: 0 x, 1 seeds, 2 heads, 3 act, 4 scale, 5 hstu_norm.

int sema_lower_pma(Sema *S, Call *c) {
  int x = sema_arg_operand(S, c, 0);
  int64_t seeds = 0;
  bool ok = true;
  if (!c->arg[1]) {
    diag_error(S->d, c->e->loc, "missing argument 'seeds' in call to pma; expected %s",
               c->spec->signature);
    ok = false;
  } else {
    ok = sema_arg_positive(S, c, 1, 0, &seeds);
  }
  AttnArgs a;
  ok &= read_common(S, c, 2, 3, 4, 5, &a);
  if (x < 0 || !ok) return -1;
  if (sema_tensor(S, x)->layout != LAYOUT_JAGGED) {
    diag_error(S->d, c->arg[0]->value->loc, "pma needs a sequence: x is %s, expected jagged",
               sema_shape(S, x));
    return -1;
  }
  if (!check_heads(S, c, 2, &a, x, "x")) return -1;

  int64_t d = sema_tensor(S, x)->width;
  Loc loc = c->e->loc;
  sema_call_begin(S, c);
  const char *b = c->base;
  int sp = sema_param(S, sema_fmt(S, "%s.seeds", b), seeds, d, loc);
  int wk = sema_param(S, sema_fmt(S, "%s.wk", b), d, d, loc);
  int wv = sema_param(S, sema_fmt(S, "%s.wv", b), d, d, loc);
  int wo = sema_param(S, sema_fmt(S, "%s.wo", b), d, d, loc);
  int kp = sema_linear_node(S, c, NULL, sema_fmt(S, "%s.k", b), x, wk, -1, d, ACT_NONE);
  int vp = sema_linear_node(S, c, NULL, sema_fmt(S, "%s.v", b), x, wv, -1, d, ACT_NONE);
  int att = sema_value(S, sema_fmt(S, "%s.attn", b), LAYOUT_SET, -1, seeds, d, c->value_dtype,
                       loc);
  attention_node(S, c, att, sp, kp, vp, ATTN_PMA, &a, MASK_NONE, 0, d);
  ScoreSide side = {"x", x, c->arg[0]->value};  // the other side, the seeds, is a parameter
  note_unbounded_scores(S, c, 3, &a, &side, 1);
  return sema_linear_node(S, c, NULL, c->out, att, wo, -1, d, ACT_NONE);
}
