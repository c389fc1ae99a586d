// sema.c: semantic analysis, the driver. Reads the settings, declares the inputs and tables,
// walks the bindings and the loss in order with a hashed name environment, and lowers each
// to graph IR (the op lowerings live in sema_ops.c, sema_attention.c and sema_loss.c).
// Reports every error it can, continuing after each with an error value (-1).
#include "sema.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "checked_math.h"    // defines: ck_mul, ck_mul3, bytes_text
#include "internal_error.h"  // defines: GEMC_ASSERT
#include "sema_internal.h"   // defines: Sema, Symbol, sema_* helpers

// --- small helpers ----------------------------------------------------------------------

char *sema_fmt(Sema *S, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  GEMC_ASSERT(n >= 0);
  char *s = arena_alloc(S->arena, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

const char *sema_list(Sema *S, const char *const *items, int n) {
  size_t len = 1;
  for (int i = 0; i < n; i++) len += strlen(items[i]) + 4;
  char *s = arena_alloc(S->arena, len);
  char *p = s;
  for (int i = 0; i < n; i++) {
    const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
    p += sprintf(p, "%s%s", sep, items[i]);
  }
  return s;
}

// Levenshtein distance, or 3 when it is surely more than 2 (or the names are long).
static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 255 || lb > 255) return 3;
  if ((la > lb ? la - lb : lb - la) > 2) return 3;
  int prev[256], cur[256];
  for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
      int del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, (lb + 1) * sizeof *prev);
  }
  return prev[lb];
}

void sema_suggest(Sema *S, Loc loc, const char *name, const char *const *candidates, int n) {
  if (S->d->too_many) return;
  const char *best = NULL;
  int best_dist = 3;
  for (int i = 0; i < n; i++) {
    int dist = edit_distance(name, candidates[i]);
    if (dist > 0 && dist < best_dist && dist < (int)strlen(name)) {
      best = candidates[i];
      best_dist = dist;
    }
  }
  if (best) diag_note(S->d, loc, "did you mean '%s'?", best);
}

const char *sema_shape(Sema *S, int i) {
  const Tensor *t = sema_tensor(S, i);
  switch (t->layout) {
  case LAYOUT_DENSE:
    return t->width ? sema_fmt(S, "dense[B, %" PRId64 "]", t->width) : "dense[B]";
  case LAYOUT_SET:
    return sema_fmt(S, "set[B, %" PRId64 ", %" PRId64 "]", t->set_k, t->width);
  case LAYOUT_JAGGED: {
    const char *j = t->jag >= 0 ? S->ir->jagged[t->jag].name : "?";
    return t->width ? sema_fmt(S, "jagged[B, *%s, %" PRId64 "]", j, t->width)
                    : sema_fmt(S, "jagged[B, *%s]", j);
  }
  case LAYOUT_FIXED:
    return t->nfixed == 1 ? sema_fmt(S, "fixed[%" PRId64 "]", t->fixed[0])
                          : sema_fmt(S, "fixed[%" PRId64 ", %" PRId64 "]", t->fixed[0],
                                     t->fixed[1]);
  case LAYOUT_SCALAR: return "scalar[]";
  case LAYOUT_ROWS: break;  // table gradients; sema never makes one
  }
  return "?";
}

const char *sema_describe(Sema *S, const Expr *e) {
  int64_t i;
  double r;
  switch (e->kind) {
  case EXPR_NAME: return sema_fmt(S, "the name '%s'", e->name);
  case EXPR_INT: return sema_fmt(S, "the integer %" PRId64, e->int_value);
  case EXPR_REAL: return sema_fmt(S, "the number %g", e->real_value);
  case EXPR_STRING: return "a string";
  case EXPR_LIST: return "a list";
  case EXPR_CALL: return sema_fmt(S, "a call to %s", e->name);
  case EXPR_BINARY: return sema_fmt(S, "a '%c' expression", e->op);
  case EXPR_NEG:
    if (sema_int_literal(e, &i)) return sema_fmt(S, "the integer %" PRId64, i);
    if (sema_real_literal(e, &r)) return sema_fmt(S, "the number %g", r);
    return "a negation";
  case EXPR_ANNOT:
    while (e->kind == EXPR_ANNOT) e = e->lhs;
    return sema_describe(S, e);
  }
  return "an expression";
}

bool sema_int_literal(const Expr *e, int64_t *out) {
  bool neg = false;
  while (e->kind == EXPR_NEG) {
    neg = !neg;
    e = e->lhs;
  }
  if (e->kind != EXPR_INT) return false;
  *out = neg ? -e->int_value : e->int_value;
  return true;
}

bool sema_real_literal(const Expr *e, double *out) {
  bool neg = false;
  while (e->kind == EXPR_NEG) {
    neg = !neg;
    e = e->lhs;
  }
  double v;
  if (e->kind == EXPR_INT) v = (double)e->int_value;
  else if (e->kind == EXPR_REAL) v = e->real_value;
  else return false;
  *out = neg ? -v : v;
  return true;
}

// --- tensors ----------------------------------------------------------------------------

int sema_value(Sema *S, const char *name, Layout layout, int jag, int64_t set_k,
               int64_t width, DType dtype, Loc loc) {
  Tensor t = {.name = name, .kind = TENSOR_VALUE, .layout = layout, .jag = jag,
              .set_k = set_k, .width = width, .dtype = dtype, .producer = -1, .loc = loc};
  return ir_add_tensor(S->ir, &t);
}

int sema_value_like(Sema *S, const char *name, int like, int64_t width, DType dtype, Loc loc) {
  Tensor l = *sema_tensor(S, like);
  return sema_value(S, name, l.layout, l.jag, l.set_k, width, dtype, loc);
}

int sema_param(Sema *S, const char *name, int64_t d0, int64_t d1, Loc loc) {
  Tensor t = {.name = name, .kind = TENSOR_PARAM, .layout = LAYOUT_FIXED, .jag = -1,
              .fixed = {d0, d1}, .nfixed = d1 ? 2 : 1, .dtype = DT_F32, .producer = -1,
              .optim = S->ir->dense_optim, .loc = loc};
  return ir_add_tensor(S->ir, &t);
}

// --- the environment --------------------------------------------------------------------

static unsigned hash_name(const char *s) {
  unsigned h = 2166136261u;  // FNV-1a
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

Symbol *sema_lookup(Sema *S, const char *name) {
  if (!name || S->cap_slots == 0) return NULL;
  unsigned mask = (unsigned)S->cap_slots - 1;
  for (unsigned i = hash_name(name) & mask;; i = (i + 1) & mask) {
    Symbol *y = S->slots[i];
    if (!y) return NULL;
    if (strcmp(y->name, name) == 0) return y;
  }
}

static void slot_insert(Sema *S, Symbol *y) {
  unsigned mask = (unsigned)S->cap_slots - 1;
  unsigned i = hash_name(y->name) & mask;
  while (S->slots[i]) i = (i + 1) & mask;
  S->slots[i] = y;
}

static Symbol *declare(Sema *S, const char *name, SymKind kind, Loc loc) {
  if (2 * (S->nsyms + 1) > S->cap_slots) {
    int cap = S->cap_slots ? 2 * S->cap_slots : 64;
    GEMC_ASSERT(cap > S->cap_slots);
    S->slots = arena_alloc(S->arena, (size_t)cap * sizeof *S->slots);
    S->cap_slots = cap;
    for (int i = 0; i < S->norder; i++) slot_insert(S, S->order[i]);
  }
  Symbol *y = arena_alloc(S->arena, sizeof *y);
  y->name = name;
  y->kind = kind;
  y->loc = loc;
  y->tensor = -1;
  y->jag = -1;
  y->binding = -1;
  slot_insert(S, y);
  S->nsyms++;
  if (S->norder == S->cap_order) {
    int cap = S->cap_order ? 2 * S->cap_order : 64;
    S->order = arena_grow(S->arena, S->order, (size_t)S->norder, (size_t)cap, sizeof *S->order);
    S->cap_order = cap;
  }
  S->order[S->norder++] = y;
  return y;
}

static const char *sym_kind_noun(const Symbol *y) {
  switch (y->kind) {
  case SYM_INPUT: return "input";
  case SYM_LABEL: return "label";
  case SYM_TABLE: return "table";
  case SYM_BINDING: return "binding";
  }
  return "name";
}

// The names visible now (declared, or bound above), optionally of one kind, for did-you-mean.
static void suggest_symbol(Sema *S, Loc loc, const char *name, int only_kind) {
  if (S->d->too_many) return;
  const char **names = arena_alloc(S->arena, (size_t)(S->norder + 1) * sizeof *names);
  int n = 0;
  for (int i = 0; i < S->norder; i++) {
    const Symbol *y = S->order[i];
    if (only_kind >= 0 && (int)y->kind != only_kind) continue;
    if (y->kind == SYM_BINDING && y->binding < 0) continue;
    names[n++] = y->name;
  }
  sema_suggest(S, loc, name, names, n);
}

void sema_unknown_name(Sema *S, const Expr *e, int only_kind, const char *expected) {
  diag_error(S->d, e->loc, "unknown name '%s'; expected %s", e->name, expected);
  suggest_symbol(S, e->loc, e->name, only_kind);
}

static void mark_used(Sema *S, Symbol *y) {
  if (y->kind == SYM_BINDING) {
    if (y->binding >= 0) S->bindings[y->binding].used = true;
  } else {
    y->used = true;
  }
}

int sema_name_tensor(Sema *S, const Expr *e) {
  Symbol *y = sema_lookup(S, e->name);
  if (!y) {
    sema_unknown_name(S, e, -1, "an input, a table or a bound name");
    return -1;
  }
  mark_used(S, y);
  switch (y->kind) {
  case SYM_INPUT: return y->tensor;
  case SYM_LABEL:
    diag_error(S->d, e->loc, "label '%s' can only be used in bce(); found it used as a tensor",
               e->name);
    return -1;
  case SYM_TABLE:
    diag_error(S->d, e->loc,
               "table '%s' can only be the first argument of embed(); found it used as a "
               "tensor",
               e->name);
    return -1;
  case SYM_BINDING:
    if (y->binding < 0) {
      diag_error(S->d, e->loc, "'%s' is used before it is bound; expected a binding above",
                 e->name);
      diag_note(S->d, y->loc, "'%s' is first bound here", e->name);
      return -1;
    }
    return S->bindings[y->binding].tensor;
  }
  return -1;
}

void sema_touch(Sema *S, const Expr *e) {
  while (e) {
    switch (e->kind) {
    case EXPR_NAME: {
      Symbol *y = sema_lookup(S, e->name);
      if (y) mark_used(S, y);
      return;
    }
    case EXPR_BINARY:
      sema_touch(S, e->rhs);
      e = e->lhs;
      break;
    case EXPR_NEG: e = e->lhs; break;
    case EXPR_ANNOT:
      for (int i = 0; i < e->nargs; i++) sema_touch(S, e->args[i].value);
      e = e->lhs;
      break;
    case EXPR_CALL:
    case EXPR_LIST:
      for (int i = 0; i < e->nargs; i++) sema_touch(S, e->args[i].value);
      return;
    default: return;
    }
  }
}

// --- settings ---------------------------------------------------------------------------

// parallel { dense zero2; bucket_mb 25; tables auto; }: at most one block, each setting once.
static const char *const parallel_names[] = {"dense", "bucket_mb", "tables"};
static const char *const dense_names[] = {"data_parallel", "zero1", "zero2", "zero3"};
enum { MAX_BUCKET_MB = 4096 };

// The index in names[n] of attribute a's key, recorded in seen[n]; -1 after reporting an
// unknown key (with a suggestion) or a repeated one. `what` names the kind ("table
// attribute"), `where` (or "") ends the duplicate's message (" in table 't'").
static int attr_index(Sema *S, const TableAttr *a, const char *const *names, int n,
                      const char *what, const char *where, const TableAttr **seen) {
  int k = -1;
  for (int j = 0; j < n; j++)
    if (a->key && strcmp(a->key, names[j]) == 0) k = j;
  if (k < 0) {
    diag_error(S->d, a->key_loc, "unknown %s '%s'; expected %s", what, a->key ? a->key : "?",
               sema_list(S, names, n));
    if (a->key) sema_suggest(S, a->key_loc, a->key, names, n);
    return -1;
  }
  if (seen[k]) {
    diag_error(S->d, a->key_loc, "duplicate %s '%s'%s", what, a->key, where);
    diag_note(S->d, seen[k]->key_loc, "previous '%s' is here", a->key);
    return -1;
  }
  seen[k] = a;
  return k;
}

static const char *read_name(Sema *S, const Expr *e, const char *what);
static bool read_placement(Sema *S, const Expr *e, const char *what, ShardTable *out);

static void read_parallel(Sema *S, const Stmt *s, const Stmt *prev) {
  if (prev) {
    diag_error(S->d, s->loc, "duplicate 'parallel' block; a model has at most one");
    diag_note(S->d, prev->loc, "previous 'parallel' block is here");
    return;
  }
  Parallel *p = &S->ir->parallel;
  const TableAttr *seen[3] = {0};
  for (int i = 0; i < s->nattrs; i++) {
    const TableAttr *a = &s->attrs[i];
    int k = attr_index(S, a, parallel_names, 3, "parallel setting", "", seen);
    if (k < 0 || !a->value) continue;
    if (k == 0) {
      const char *d = read_name(S, a->value, "parallel setting 'dense'");
      if (d && !shard_dense_from_name(d, &p->dense)) {
        diag_error(S->d, a->value->loc, "unknown dense placement '%s'; expected %s", d,
                   sema_list(S, dense_names, 4));
        sema_suggest(S, a->value->loc, d, dense_names, 4);
      }
    } else if (k == 1) {
      int64_t v;
      if (!sema_int_literal(a->value, &v) || v <= 0 || v > MAX_BUCKET_MB)
        diag_error(S->d, a->value->loc, "parallel setting 'bucket_mb' expects a whole number of "
                   "MiB in [1, %d], found %s", MAX_BUCKET_MB, sema_describe(S, a->value));
      else
        p->bucket_mb = v;
    } else {
      read_placement(S, a->value, "parallel setting 'tables'", &p->tables);
    }
  }
}

static const char *const setting_names[] = {"batch", "dim", "precision", "target", "optim"};
static const char *const target_names[] = {"sm_90a", "sm_100a"};

static void record_setting(Sema *S, const Stmt *s) {
  const Stmt *prev = S->setting[s->kind];
  if (prev) {
    diag_error(S->d, s->loc, "duplicate '%s' setting; each setting appears at most once",
               setting_names[s->kind]);
    diag_note(S->d, prev->loc, "previous '%s' setting is here", setting_names[s->kind]);
    return;
  }
  S->setting[s->kind] = s;
}

// Reads a positive size (batch, dim, widths); false after reporting.
static bool read_size(Sema *S, const Expr *e, const char *what, int64_t *out) {
  if (!e) return false;
  int64_t v;
  if (!sema_int_literal(e, &v)) {
    diag_error(S->d, e->loc, "%s expects a positive integer, found %s", what,
               sema_describe(S, e));
    return false;
  }
  if (v <= 0) {
    diag_error(S->d, e->loc, "%s must be positive, found %" PRId64, what, v);
    return false;
  }
  if (v > SEMA_MAX_SIZE) {
    diag_error(S->d, e->loc, "%s %" PRId64 " is too large; expected at most %" PRId64, what, v,
               SEMA_MAX_SIZE);
    return false;
  }
  *out = v;
  return true;
}

// The name in a setting or attribute value (precision bf16); NULL after reporting.
static const char *read_name(Sema *S, const Expr *e, const char *what) {
  if (!e) return NULL;
  if (e->kind != EXPR_NAME) {
    diag_error(S->d, e->loc, "%s expects a name, found %s", what, sema_describe(S, e));
    return NULL;
  }
  return e->name;
}

static void unknown_precision(Sema *S, Loc loc, const char *name) {
  diag_error(S->d, loc, "unknown precision '%s'; expected %s", name,
             sema_list(S, sema_precision_names, 5));
  sema_suggest(S, loc, name, sema_precision_names, 5);
}

// --- optimizers -------------------------------------------------------------------------

typedef struct OptimSpec {
  const char *name;
  OptimKind kind;
  const char *args[6];
  int nargs;
  Optim dflt;
} OptimSpec;

static const OptimSpec optim_specs[] = {
    {"adamw", OPTIM_ADAMW, {"lr", "beta1", "beta2", "eps", "weight_decay"}, 5,
     {OPTIM_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0}},
    {"sgd", OPTIM_SGD, {"lr"}, 1, {OPTIM_SGD, 0.01, 0, 0, 0, 0}},
    {"rowwise_adagrad", OPTIM_ROWWISE_ADAGRAD, {"lr", "eps"}, 2,
     {OPTIM_ROWWISE_ADAGRAD, 0.01, 0, 0, 1e-8, 0}},
};

static bool read_optim_arg(Sema *S, const OptimSpec *o, const Arg *a, Optim *out) {
  int k = -1;
  for (int i = 0; i < o->nargs; i++)
    if (strcmp(a->name, o->args[i]) == 0) k = i;
  if (k < 0) {
    diag_error(S->d, a->name_loc, "unknown argument '%s' to %s; expected %s", a->name, o->name,
               sema_list(S, o->args, o->nargs));
    sema_suggest(S, a->name_loc, a->name, o->args, o->nargs);
    return false;
  }
  double v;
  if (!sema_real_literal(a->value, &v)) {
    diag_error(S->d, a->value->loc, "argument '%s' of %s expects a number, found %s", a->name,
               o->name, sema_describe(S, a->value));
    return false;
  }
  const char *arg = o->args[k];
  bool ok;
  const char *want;
  if (strcmp(arg, "beta1") == 0 || strcmp(arg, "beta2") == 0) {
    ok = v >= 0 && v < 1;
    want = "a number in [0, 1)";
  } else if (strcmp(arg, "weight_decay") == 0) {
    ok = v >= 0;
    want = "a number >= 0";
  } else {
    ok = v > 0;
    want = "a positive number";
  }
  if (!ok) {
    diag_error(S->d, a->value->loc, "argument '%s' of %s must be %s, found %g", arg, o->name,
               want, v);
    return false;
  }
  if (strcmp(arg, "lr") == 0) out->lr = v;
  else if (strcmp(arg, "beta1") == 0) out->beta1 = v;
  else if (strcmp(arg, "beta2") == 0) out->beta2 = v;
  else if (strcmp(arg, "eps") == 0) out->eps = v;
  else out->weight_decay = v;
  return true;
}

// Reads `adamw(lr = 1e-3)` (or a bare `sgd`) for the dense parameters or for a table.
static bool read_optim(Sema *S, const Expr *e, bool for_table, Optim *out) {
  static const char *const dense_ok[] = {"adamw", "sgd"};
  static const char *const table_ok[] = {"rowwise_adagrad", "sgd"};
  const char *const *legal = for_table ? table_ok : dense_ok;
  if (!e) return false;
  if (e->kind != EXPR_CALL && e->kind != EXPR_NAME) {
    diag_error(S->d, e->loc, "optim expects an optimizer such as %s(lr = ...), found %s",
               legal[0], sema_describe(S, e));
    return false;
  }
  Loc name_loc = e->kind == EXPR_CALL ? e->name_loc : e->loc;
  const OptimSpec *o = NULL;
  for (size_t i = 0; i < sizeof optim_specs / sizeof optim_specs[0]; i++)
    if (strcmp(e->name, optim_specs[i].name) == 0) o = &optim_specs[i];
  if (!o) {
    diag_error(S->d, name_loc, "unknown optimizer '%s'; expected %s", e->name,
               sema_list(S, legal, 2));
    sema_suggest(S, name_loc, e->name, legal, 2);
    return false;
  }
  if (for_table && o->kind == OPTIM_ADAMW) {
    diag_error(S->d, name_loc, "optimizer adamw is not legal for tables; expected %s",
               sema_list(S, legal, 2));
    return false;
  }
  if (!for_table && o->kind == OPTIM_ROWWISE_ADAGRAD) {
    diag_error(S->d, name_loc,
               "optimizer rowwise_adagrad is only for tables; expected %s for the dense "
               "parameters",
               sema_list(S, legal, 2));
    return false;
  }
  Optim opt = o->dflt;
  bool ok = true;
  const Arg *seen[6] = {0};
  for (int i = 0; e->kind == EXPR_CALL && i < e->nargs; i++) {
    const Arg *a = &e->args[i];
    if (!a->name) {
      diag_error(S->d, a->value->loc, "optimizer arguments are named (%s = ...); found %s",
                 o->args[0], sema_describe(S, a->value));
      ok = false;
      continue;
    }
    int k = -1;
    for (int j = 0; j < o->nargs; j++)
      if (strcmp(a->name, o->args[j]) == 0) k = j;
    if (k >= 0 && seen[k]) {
      diag_error(S->d, a->name_loc, "argument '%s' of %s is given twice", a->name, o->name);
      diag_note(S->d, seen[k]->name_loc, "first given here");
      ok = false;
      continue;
    }
    if (k >= 0) seen[k] = a;
    ok &= read_optim_arg(S, o, a, &opt);
  }
  if (ok) *out = opt;
  return ok;
}

static void read_settings(Sema *S) {
  const Model *m = S->m;
  Ir *ir = S->ir;
  const Stmt *par = NULL;
  for (int i = 0; i < m->nstmts; i++) {
    if (m->stmts[i].kind <= STMT_OPTIM) record_setting(S, &m->stmts[i]);
    if (m->stmts[i].kind == STMT_PARALLEL) {
      read_parallel(S, &m->stmts[i], par);
      if (!par) par = &m->stmts[i];
    }
  }

  const Stmt *s = S->setting[STMT_BATCH];
  if (!s)
    diag_error(S->d, m->name_loc, "missing batch: expected a 'batch N;' setting in model '%s'",
               m->name);
  else if (!read_size(S, s->value, "batch", &S->batch))
    S->batch = 0;
  s = S->setting[STMT_DIM];
  if (!s)
    diag_error(S->d, m->name_loc, "missing dim: expected a 'dim D;' setting in model '%s'",
               m->name);
  else if (!read_size(S, s->value, "dim", &S->dim))
    S->dim = 0;

  S->precision = DT_F32;
  S->precision_loc = m->name_loc;
  s = S->setting[STMT_PRECISION];
  if (s) {
    const char *p = read_name(S, s->value, "precision");
    if (p && !sema_precision_from_name(p, &S->precision)) unknown_precision(S, s->value->loc, p);
    if (s->value) S->precision_loc = s->value->loc;
  }

  const char *target = "sm_90a";
  s = S->setting[STMT_TARGET];
  if (s) {
    const char *t = read_name(S, s->value, "target");
    if (t && strcmp(t, "sm_90a") != 0 && strcmp(t, "sm_100a") != 0) {
      diag_error(S->d, s->value->loc, "unknown target '%s'; expected sm_90a or sm_100a", t);
      sema_suggest(S, s->value->loc, t, target_names, 2);
    } else if (t) {
      target = strcmp(t, "sm_90a") == 0 ? "sm_90a" : "sm_100a";
    }
  }
  if (S->arch) {
    if (strcmp(S->arch, "sm_90a") == 0 || strcmp(S->arch, "sm_100a") == 0)
      target = strcmp(S->arch, "sm_90a") == 0 ? "sm_90a" : "sm_100a";
    else
      diag_error(S->d, (Loc){0, 0, 0, 0}, "unknown target '%s' given by --arch; expected "
                 "sm_90a or sm_100a", S->arch);
  }

  ir->dense_optim = optim_specs[0].dflt;
  s = S->setting[STMT_OPTIM];
  if (s) read_optim(S, s->value, false, &ir->dense_optim);

  ir->model = m->name;
  ir->source = S->d->file ? S->d->file->path : NULL;
  ir->source_text = S->d->file ? S->d->file->text : NULL;
  ir->target = target;
  ir->precision = S->precision;
  ir->batch = S->batch;
  ir->dim = S->dim;
}

// --- declarations -----------------------------------------------------------------------

static void declare_names(Sema *S) {
  const Model *m = S->m;
  for (int i = 0; i < m->nstmts; i++) {
    const Stmt *s = &m->stmts[i];
    if (s->kind != STMT_INPUT && s->kind != STMT_TABLE) continue;
    if (!s->name) continue;
    Symbol *prev = sema_lookup(S, s->name);
    if (prev) {
      diag_error(S->d, s->name_loc, "redefinition of '%s'; it is already declared as %s %s",
                 s->name, prev->kind == SYM_INPUT ? "an" : "a", sym_kind_noun(prev));
      diag_note(S->d, prev->loc, "previous definition is here");
      continue;
    }
    SymKind kind = s->kind == STMT_TABLE        ? SYM_TABLE
                   : s->input == INPUT_LABEL ? SYM_LABEL
                                               : SYM_INPUT;
    Symbol *y = declare(S, s->name, kind, s->name_loc);
    y->decl = s;
  }
  // Names bound anywhere, so that a use above the first binding says so.
  for (int i = 0; i < m->nstmts; i++) {
    const Stmt *s = &m->stmts[i];
    if (s->kind == STMT_BIND && s->name && !sema_lookup(S, s->name))
      declare(S, s->name, SYM_BINDING, s->name_loc);
  }
}

static bool elem_is_f32(const char *elem) { return elem && strcmp(elem, "f32") == 0; }

static void make_seq(Sema *S, Symbol *y, const Stmt *s) {
  bool has_max = s->max_loc.first_line > 0 || s->max_len != 0;
  int64_t width = 0;
  DType dtype = DT_I64;
  bool ok = true;
  if (elem_is_f32(s->elem)) {
    dtype = DT_F32;
    width = s->width > 0 ? s->width : 1;
    if (width > SEMA_MAX_SIZE) {
      diag_error(S->d, s->elem_loc, "seq '%s' width %" PRId64 " is too large; expected at most "
                 "%" PRId64, s->name, width, SEMA_MAX_SIZE);
      ok = false;
    }
  } else if (!s->elem || strcmp(s->elem, "id") != 0) {
    diag_error(S->d, s->elem_loc, "unknown element type '%s' in seq '%s'; expected id or f32",
               s->elem ? s->elem : "?", s->name);
    ok = false;
  }
  int jag = -1;
  if (has_max && s->like) {
    diag_error(S->d, s->like_loc, "seq '%s' has both 'max' and 'like'; expected one of them",
               s->name);
    ok = false;
  } else if (!has_max && !s->like) {
    diag_error(S->d, s->name_loc, "seq '%s' needs 'max L' or 'like s'; found neither",
               s->name);
    ok = false;
  } else if (has_max) {
    if (s->max_len <= 0 || s->max_len > SEMA_MAX_SIZE) {
      diag_error(S->d, s->max_loc.first_line ? s->max_loc : s->loc,
                 "max of seq '%s' must be in 1..%" PRId64 ", found %" PRId64, s->name,
                 SEMA_MAX_SIZE, s->max_len);
      ok = false;
    } else if (ok) {
      jag = ir_add_jagged(S->ir, s->name, s->max_len, s->loc);
    }
  } else {
    Symbol *t = sema_lookup(S, s->like);
    if (!t) {
      diag_error(S->d, s->like_loc, "unknown sequence '%s' in 'like'; expected a seq input",
                 s->like);
      const char **seqs = arena_alloc(S->arena, (size_t)(S->norder + 1) * sizeof *seqs);
      int n = 0;
      for (int i = 0; i < S->norder; i++)
        if (S->order[i]->kind == SYM_INPUT && S->order[i]->decl->input == INPUT_SEQ)
          seqs[n++] = S->order[i]->name;
      sema_suggest(S, s->like_loc, s->like, seqs, n);
      ok = false;
    } else if (t->kind != SYM_INPUT || t->decl->input != INPUT_SEQ) {
      static const char *const input_nouns[] = {"seq", "sparse", "multihot", "dense", "label"};
      const char *found = t->kind == SYM_INPUT || t->kind == SYM_LABEL
                              ? sema_fmt(S, "a %s input", input_nouns[t->decl->input])
                              : sema_fmt(S, "a %s", sym_kind_noun(t));
      diag_error(S->d, s->like_loc, "'like' needs a seq input; '%s' is %s", s->like, found);
      ok = false;
    } else if (t == y) {
      diag_error(S->d, s->like_loc, "seq '%s' cannot take its lengths from itself; expected "
                 "another seq", s->name);
      ok = false;
    } else if (!t->ready) {
      diag_error(S->d, s->like_loc, "seq '%s' is declared below '%s'; 'like' expects a seq "
                 "declared above", s->like, s->name);
      diag_note(S->d, t->loc, "'%s' is declared here", s->like);
      ok = false;
    } else {
      t->used = true;  // its lengths are used
      jag = t->jag;
      if (jag < 0) ok = false;  // its own declaration had an error
    }
  }
  y->ready = true;
  if (!ok || jag < 0) return;
  y->jag = jag;
  Tensor t = {.name = s->name, .kind = TENSOR_INPUT, .layout = LAYOUT_JAGGED, .jag = jag,
              .width = width, .dtype = dtype, .producer = -1, .loc = s->loc};
  y->tensor = ir_add_tensor(S->ir, &t);
}

static void make_input(Sema *S, Symbol *y, const Stmt *s) {
  Tensor t = {.name = s->name, .kind = TENSOR_INPUT, .layout = LAYOUT_DENSE, .jag = -1,
              .dtype = DT_I64, .producer = -1, .loc = s->loc};
  switch (s->input) {
  case INPUT_SEQ: make_seq(S, y, s); return;
  case INPUT_SPARSE:
    if (s->elem && strcmp(s->elem, "id") != 0) {
      diag_error(S->d, s->elem_loc, "unknown element type '%s' in sparse '%s'; expected id",
                 s->elem, s->name);
      y->ready = true;
      return;
    }
    break;
  case INPUT_MULTIHOT:
    if (s->max_len <= 0 || s->max_len > SEMA_MAX_SIZE) {
      diag_error(S->d, s->max_loc.first_line ? s->max_loc : s->loc,
                 "max of multihot '%s' must be in 1..%" PRId64 ", found %" PRId64, s->name,
                 SEMA_MAX_SIZE, s->max_len);
      y->ready = true;
      return;
    }
    t.layout = LAYOUT_JAGGED;
    t.jag = y->jag = ir_add_jagged(S->ir, s->name, s->max_len, s->loc);
    break;
  case INPUT_DENSE:
    if (!elem_is_f32(s->elem)) {
      diag_error(S->d, s->elem_loc, "unknown element type '%s' in dense '%s'; expected f32",
                 s->elem ? s->elem : "?", s->name);
      y->ready = true;
      return;
    }
    if (s->width <= 0 || s->width > SEMA_MAX_SIZE) {
      diag_error(S->d, s->elem_loc, "dense '%s' needs a width in 1..%" PRId64 ", found f32[%"
                 PRId64 "]", s->name, SEMA_MAX_SIZE, s->width);
      y->ready = true;
      return;
    }
    t.width = s->width;
    t.dtype = DT_F32;
    break;
  case INPUT_LABEL:
    t.kind = TENSOR_LABEL;
    t.dtype = DT_F32;
    break;
  }
  y->ready = true;
  y->tensor = ir_add_tensor(S->ir, &t);
}

// --- tables -----------------------------------------------------------------------------

static const char *const table_attr_names[] = {"rows", "dim", "precision", "optim", "shard"};
static const char *const placement_names[] = {"replicate", "table", "row", "auto"};

// A table placement name (shard row, tables auto); false after reporting.
static bool read_placement(Sema *S, const Expr *e, const char *what, ShardTable *out) {
  const char *p = read_name(S, e, what);
  if (!p) return false;
  if (shard_table_from_name(p, out)) return true;
  diag_error(S->d, e->loc, "unknown placement '%s' for %s; expected %s", p, what,
             sema_list(S, placement_names, 4));
  sema_suggest(S, e->loc, p, placement_names, 4);
  return false;
}
static const char *const storage_names[] = {"fp32", "bf16", "fp16", "fp8"};

static void make_table(Sema *S, Symbol *y, const Stmt *s) {
  const TableAttr *seen[5] = {0};
  ShardTable shard = SHARD_TABLE_UNSET;
  bool ok = true;
  int64_t rows = 0, dim = S->dim;
  DType storage = S->precision == DT_MXFP8 ? DT_F32 : S->precision;
  Optim optim = optim_specs[2].dflt;
  for (int i = 0; i < s->nattrs; i++) {
    const TableAttr *a = &s->attrs[i];
    char where[160];
    snprintf(where, sizeof where, " in table '%s'", s->name);
    int k = attr_index(S, a, table_attr_names, 5, "table attribute", where, seen);
    if (k < 0) {
      ok = false;
      continue;
    }
    if (!a->value) {
      ok = false;
      continue;
    }
    if (k == 0) {
      // Rows may exceed the size limit of widths; only positivity matters.
      int64_t v;
      if (!sema_int_literal(a->value, &v)) {
        diag_error(S->d, a->value->loc, "table attribute 'rows' expects an integer, found %s",
                   sema_describe(S, a->value));
        ok = false;
      } else if (v <= 0) {
        diag_error(S->d, a->value->loc, "rows of table '%s' must be positive, found %" PRId64,
                   s->name, v);
        ok = false;
      } else {
        rows = v;
      }
    } else if (k == 1) {
      int64_t v;
      if (!read_size(S, a->value, "table attribute 'dim'", &v)) {
        ok = false;
      } else if (S->dim > 0 && v != S->dim) {
        diag_error(S->d, a->value->loc,
                   "table '%s' has dim %" PRId64 ", but the model dim is %" PRId64, s->name, v,
                   S->dim);
        ok = false;
      } else {
        dim = v;
      }
    } else if (k == 2) {
      const char *p = read_name(S, a->value, "table attribute 'precision'");
      DType dt;
      if (!p) {
        ok = false;
      } else if (!sema_precision_from_name(p, &dt)) {
        unknown_precision(S, a->value->loc, p);
        ok = false;
      } else if (dt == DT_MXFP8) {
        diag_error(S->d, a->value->loc,
                   "storage precision mxfp8 is not legal for table '%s'; expected %s", s->name,
                   sema_list(S, storage_names, 4));
        ok = false;
      } else {
        storage = dt;
      }
    } else if (k == 3) {
      ok &= read_optim(S, a->value, true, &optim);
    } else {
      ok &= read_placement(S, a->value, "table attribute 'shard'", &shard);
    }
  }
  if (!seen[0]) {
    diag_error(S->d, s->name_loc, "table '%s' needs 'rows N'; found no rows attribute",
               s->name);
    ok = false;
  }
  y->ready = true;
  if (!ok || dim <= 0) return;
  Tensor t = {.name = s->name, .kind = TENSOR_TABLE, .layout = LAYOUT_FIXED, .jag = -1,
              .fixed = {rows, dim}, .nfixed = 2, .dtype = storage, .producer = -1,
              .optim = optim, .shard = shard, .loc = s->loc};
  y->tensor = ir_add_tensor(S->ir, &t);
}

// Inputs first, then tables, each in source order, so the IR lists them that way.
static void make_declarations(Sema *S) {
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < S->m->nstmts && !S->d->too_many; i++) {
      const Stmt *s = &S->m->stmts[i];
      if (s->kind != (pass == 0 ? STMT_INPUT : STMT_TABLE)) continue;
      Symbol *y = sema_lookup(S, s->name);
      if (!y || y->decl != s) continue;  // a redefinition, already reported
      if (pass == 0) make_input(S, y, s);
      else make_table(S, y, s);
    }
  }
}

// --- bindings ---------------------------------------------------------------------------

static void lower_binding(Sema *S, const Stmt *s) {
  Symbol *y = sema_lookup(S, s->name);
  GEMC_ASSERT(y);
  if (y->kind != SYM_BINDING) {
    diag_error(S->d, s->name_loc, "cannot rebind %s '%s'; inputs, tables and labels are bound "
               "once, expected a new name", sym_kind_noun(y), s->name);
    diag_note(S->d, y->loc, "'%s' is declared here", s->name);
    sema_touch(S, s->value);
    return;
  }
  const char *out = y->versions == 0 ? s->name : sema_fmt(S, "%s.%d", s->name, y->versions);
  S->prefix = s->name;
  S->op_counts = y->op_counts;
  int t = s->value ? sema_expr(S, s->value, out) : -1;
  if (S->nbindings == S->cap_bindings) {
    int cap = S->cap_bindings ? 2 * S->cap_bindings : 64;
    S->bindings = arena_grow(S->arena, S->bindings, (size_t)S->nbindings, (size_t)cap,
                             sizeof *S->bindings);
    S->cap_bindings = cap;
  }
  S->bindings[S->nbindings] = (Binding){s->name, s->name_loc, t, false, s};
  y->binding = S->nbindings++;
  y->versions++;
}

// Warnings for declarations and bindings nobody reads, in source order.
static void warn_unused(Sema *S) {
  int b = 0;
  for (int i = 0; i < S->m->nstmts; i++) {
    const Stmt *s = &S->m->stmts[i];
    if (s->kind == STMT_INPUT || s->kind == STMT_TABLE) {
      Symbol *y = sema_lookup(S, s->name);
      if (y && y->decl == s && !y->used && y->tensor >= 0)
        diag_warning(S->d, s->name_loc, "%s '%s' is never used", sym_kind_noun(y), s->name);
    } else if (s->kind == STMT_BIND && b < S->nbindings && S->bindings[b].stmt == s) {
      const Binding *bd = &S->bindings[b++];
      if (!bd->used && bd->tensor >= 0)
        diag_warning(S->d, bd->loc, "binding '%s' is never used", bd->name);
    }
  }
}

// --- sizes ------------------------------------------------------------------------------

// The bytes the executors store per element of t: 8 for ids and fp64, 4 otherwise (the CPU
// executor computes in fp32 whatever the dtype).
static int elem_bytes(const Tensor *t) { return t->dtype == DT_I64 || t->dtype == DT_F64 ? 8 : 4; }

// Every tensor's size at the model's batch, with checked arithmetic: an overflow, a table of
// more than SEMA_MAX_ROWS rows, a tensor over SEMA_MAX_TENSOR_BYTES or a model over
// SEMA_MAX_TOTAL_BYTES is an error at the tensor's statement.
static void check_sizes(Sema *S) {
  const Ir *ir = S->ir;
  int64_t total = 0;
  for (int i = 0; i < ir->ntensors; i++) {
    const Tensor *t = &ir->tensors[i];
    int64_t e = elem_bytes(t), B = S->batch, w = t->width > 0 ? t->width : 1;
    char desc[256];
    int64_t bytes = 0;
    bool ok = true;
    switch (t->layout) {
    case LAYOUT_DENSE:
      snprintf(desc, sizeof desc, "batch x width x %" PRId64 " bytes (%" PRId64 " x %" PRId64
               " x %" PRId64 ")", e, B, w, e);
      ok = ck_mul3(B, w, e, &bytes);
      break;
    case LAYOUT_SET:
      snprintf(desc, sizeof desc, "batch x k x width x %" PRId64 " bytes (%" PRId64 " x %" PRId64
               " x %" PRId64 " x %" PRId64 ")", e, B, t->set_k, w, e);
      ok = ck_mul3(B, t->set_k, w, &bytes) && ck_mul(bytes, e, &bytes);
      break;
    case LAYOUT_JAGGED: {
      int64_t L = ir->jagged[t->jag].max_len;
      snprintf(desc, sizeof desc, "batch x max x width x %" PRId64 " bytes (%" PRId64 " x %"
               PRId64 " x %" PRId64 " x %" PRId64 ")", e, B, L, w, e);
      ok = ck_mul3(B, L, w, &bytes) && ck_mul(bytes, e, &bytes);
      break;
    }
    case LAYOUT_FIXED: {
      int64_t r = t->nfixed == 2 ? t->fixed[0] : 1, c = t->nfixed == 2 ? t->fixed[1] : t->fixed[0];
      if (t->kind == TENSOR_TABLE)
        snprintf(desc, sizeof desc, "rows x dim x %" PRId64 " bytes (%" PRId64 " x %" PRId64
                 " x %" PRId64 ")", e, r, c, e);
      else
        snprintf(desc, sizeof desc, "%" PRId64 " x %" PRId64 " x %" PRId64 " bytes", r, c, e);
      ok = ck_mul3(r, c, e, &bytes);
      break;
    }
    case LAYOUT_SCALAR:
    case LAYOUT_ROWS: continue;
    }
    const char *kind = t->kind == TENSOR_TABLE ? "table" : t->kind == TENSOR_PARAM ? "parameter"
                       : t->kind == TENSOR_VALUE ? "value" : "input";
    if (!ok) {
      diag_error(S->d, t->loc, "%s '%s': %s overflows 64 bits", kind, t->name, desc);
      return;
    }
    if (t->kind == TENSOR_TABLE && t->fixed[0] > SEMA_MAX_ROWS) {
      diag_error(S->d, t->loc, "table '%s' has %" PRId64 " rows; gemc supports at most 2^48 (%"
                 PRId64 ")", t->name, t->fixed[0], SEMA_MAX_ROWS);
      return;
    }
    if (bytes > SEMA_MAX_TENSOR_BYTES) {
      diag_error(S->d, t->loc, "%s '%s': %s is %s; gemc supports at most 2^56 bytes (64 PiB) "
                 "per tensor", kind, t->name, desc, bytes_text(bytes).s);
      return;
    }
    total += bytes;  // at most ntensors x 2^56: no overflow before the check below
    if (total > SEMA_MAX_TOTAL_BYTES) {
      diag_error(S->d, t->loc, "the model's tensors need more than 2^58 bytes (256 PiB) at "
                 "batch %" PRId64 "; %s '%s' (%s) takes them past it", B, kind, t->name, desc);
      return;
    }
  }
}

bool sema_lower(const Model *m, const char *arch, Diag *d, Ir *out) {
  GEMC_ASSERT(m && d && out && out->arena);
  Sema S = {.m = m, .d = d, .ir = out, .arena = out->arena, .arch = arch};
  int errors = d->errors;

  read_settings(&S);
  declare_names(&S);
  make_declarations(&S);
  for (int i = 0; i < m->nstmts && !d->too_many; i++) {
    const Stmt *s = &m->stmts[i];
    if (s->kind == STMT_BIND && s->name) lower_binding(&S, s);
    else if (s->kind == STMT_LOSS) sema_lower_loss(&S, s);
  }
  if (d->too_many) return false;
  if (!S.loss_stmt)
    diag_error(d, m->name_loc, "missing loss: expected a 'loss' statement in model '%s'",
               m->name);
  if (d->errors == errors && S.batch > 0) check_sizes(&S);
  warn_unused(&S);
  return d->errors == errors && !d->too_many;
}
