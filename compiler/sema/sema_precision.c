// sema_precision.c: how precisely and how each op runs. Resolves an op's precision from the
// model default and its @P override, checks it is legal on the op (fp8 and mxfp8 need a
// matmul) and on the target (mxfp8 is emulated on sm_90a, with one note per model), and
// reads @schedule hints, checking each against the op it follows and warning about those that
// codegen does not act on yet (matmul ops; attention ops check theirs against their kernel in
// sema_schedule_attention.c).
#include <inttypes.h>
#include <string.h>

#include "sema_internal.h"  // defines: Sema, Call, Hint, sema_* helpers

const char *const sema_precision_names[5] = {"fp32", "bf16", "fp16", "fp8", "mxfp8"};
static const DType precision_dtypes[5] = {DT_F32, DT_BF16, DT_FP16, DT_FP8, DT_MXFP8};

bool sema_precision_from_name(const char *s, DType *out) {
  for (int i = 0; i < 5; i++) {
    if (strcmp(s, sema_precision_names[i]) == 0) {
      *out = precision_dtypes[i];
      return true;
    }
  }
  return false;
}

DType sema_value_dtype(DType p) { return p == DT_FP8 || p == DT_MXFP8 ? DT_BF16 : p; }

static bool is_fp8(DType p) { return p == DT_FP8 || p == DT_MXFP8; }

DType sema_default_precision(const Sema *S, bool has_matmul) {
  return !has_matmul && is_fp8(S->precision) ? DT_BF16 : S->precision;
}

void sema_note_mxfp8(Sema *S, Loc loc) {
  if (S->mxfp8_noted || strcmp(S->ir->target, "sm_90a") != 0) return;
  S->mxfp8_noted = true;
  diag_note(S->d, loc, "mxfp8 on sm_90a is emulated: operands are quantized to E4M3 with E8M0 "
            "block scales, then multiplied in bf16 or fp32 with the same numerics");
}

// --- @schedule --------------------------------------------------------------------------

static const char *const hint_names[HINT_COUNT] = {
    "tile_q", "tile_kv", "tile_m", "tile_n", "tile_k", "stages", "zigzag", "gelu",
    "deterministic", "recompute"};

const char *sema_hint_name(Hint h) { return hint_names[h]; }

// Which ops take each hint, for "does not apply" messages.
static const char *hint_ops(Hint h) {
  switch (h) {
  case HINT_TILE_Q:
  case HINT_TILE_KV:
  case HINT_ZIGZAG:
  case HINT_DETERMINISTIC: return "gdpa and pma";
  case HINT_TILE_M: return "linear, mlp, dot_interact, gdpa and pma";
  case HINT_TILE_N:
  case HINT_TILE_K: return "linear, mlp and dot_interact";
  case HINT_STAGES: return "linear, mlp, dot_interact, gdpa and pma";
  case HINT_GELU: return "ops whose activation is gelu";
  case HINT_RECOMPUTE: return "every op but embed and bce";
  case HINT_COUNT: break;
  }
  return "?";
}

// Reads one hint's value into c->sched; false after reporting.
static bool read_hint(Sema *S, Call *c, Hint h, const Expr *v) {
  const char *name = hint_names[h];
  if (h == HINT_ZIGZAG || h == HINT_GELU || h == HINT_DETERMINISTIC || h == HINT_RECOMPUTE) {
    // The two names each takes, a (1 in c->sched) and b (2); messages list the default first.
    const char *a = h == HINT_ZIGZAG ? "on" : h == HINT_GELU ? "taylor" : "true";
    const char *b = h == HINT_ZIGZAG ? "off" : h == HINT_GELU ? "exact" : "false";
    bool a_first = h != HINT_GELU;
    int which = 0;
    if (v->kind == EXPR_NAME && strcmp(v->name, a) == 0) which = 1;
    if (v->kind == EXPR_NAME && strcmp(v->name, b) == 0) which = 2;
    if (!which) {
      diag_error(S->d, v->loc, "schedule hint '%s' expects %s or %s, found %s", name,
                 a_first ? a : b, a_first ? b : a, sema_describe(S, v));
      return false;
    }
    if (h == HINT_ZIGZAG) c->sched.zigzag = which;
    else if (h == HINT_GELU) c->sched.gelu_taylor = which;
    else if (h == HINT_RECOMPUTE) c->sched.recompute = which;
    else c->sched.deterministic = which;
    return true;
  }
  int64_t n;
  if (!sema_int_literal(v, &n)) {
    diag_error(S->d, v->loc, "schedule hint '%s' expects an integer, found %s", name,
               sema_describe(S, v));
    return false;
  }
  if (h == HINT_STAGES) {
    if (n < 1 || n > 8) {
      diag_error(S->d, v->loc, "schedule hint 'stages' must be in 1..8, found %" PRId64, n);
      return false;
    }
    c->sched.stages = (int)n;
    return true;
  }
  if (n < 16 || n > 256 || (n & (n - 1)) != 0) {
    diag_error(S->d, v->loc, "schedule hint '%s' must be a power of two in 16..256, found %"
               PRId64, name, n);
    return false;
  }
  int *slot[] = {&c->sched.tile_q, &c->sched.tile_kv, &c->sched.tile_m, &c->sched.tile_n,
                 &c->sched.tile_k};
  *slot[h] = (int)n;
  return true;
}

static void read_schedule(Sema *S, Call *c, const Expr *a) {
  for (int i = 0; i < a->nargs; i++) {
    const Arg *arg = &a->args[i];
    if (!arg->name) {
      diag_error(S->d, arg->value->loc, "schedule hints are named (stages = 2); found %s",
                 sema_describe(S, arg->value));
      continue;
    }
    int h = -1;
    for (int k = 0; k < HINT_COUNT; k++)
      if (strcmp(arg->name, hint_names[k]) == 0) h = k;
    if (h < 0) {
      diag_error(S->d, arg->name_loc, "unknown schedule hint '%s'; expected %s", arg->name,
                 sema_list(S, hint_names, HINT_COUNT));
      sema_suggest(S, arg->name_loc, arg->name, hint_names, HINT_COUNT);
      continue;
    }
    if (c->hints_set & (1u << h)) {
      diag_error(S->d, arg->name_loc, "schedule hint '%s' is given twice", arg->name);
      diag_note(S->d, c->hint_loc[h], "first given here");
      continue;
    }
    c->hints_set |= 1u << h;
    c->hint_loc[h] = arg->name_loc;
    if (!(c->spec->hints & (1u << h))) {
      diag_error(S->d, arg->name_loc, "schedule hint '%s' does not apply to %s; it applies to "
                 "%s", arg->name, c->spec->name, hint_ops((Hint)h));
      continue;
    }
    if (!read_hint(S, c, (Hint)h, arg->value)) c->hints_set &= ~(1u << h);
  }
}

void sema_check_gelu_hint(Sema *S, const Call *c, Act act) {
  if (!(c->hints_set & (1u << HINT_GELU)) || act == ACT_GELU) return;
  diag_error(S->d, c->hint_loc[HINT_GELU], "schedule hint 'gelu' needs an op whose activation "
             "is gelu; %s has act = %s", c->spec->name, act_name(act));
}

Hint sema_next_hint(const Call *c, unsigned *left) {
  int h = -1;  // the first left in the source
  for (int k = 0; k < HINT_COUNT; k++) {
    if (!(*left & (1u << k))) continue;
    const Loc *at = &c->hint_loc[k];
    if (h < 0 || at->first_line < c->hint_loc[h].first_line ||
        (at->first_line == c->hint_loc[h].first_line &&
         at->first_column < c->hint_loc[h].first_column))
      h = k;
  }
  *left &= ~(1u << h);
  return (Hint)h;
}

void sema_warn_idle_hints(Sema *S, const Call *c, int64_t dh, int64_t kv_set) {
  if (c->spec->sop == SOP_GDPA || c->spec->sop == SOP_PMA) {
    sema_check_attention_schedule(S, c, dh, kv_set);
    return;
  }
  unsigned left = c->hints_set & c->spec->hints & HINTS_NO_EFFECT_YET;  // read without an error
  while (left) {
    Hint h = sema_next_hint(c, &left);
    diag_warning(S->d, c->hint_loc[h], "@schedule(%s) has no effect on this op yet",
                 hint_names[h]);
  }
}

// --- precision --------------------------------------------------------------------------

void sema_apply_annotations(Sema *S, Call *c, const Expr *const *annots, int nannots) {
  const OpSpec *op = c->spec;
  const Expr *prec_annot = NULL;
  DType prec = DT_F32;
  for (int i = nannots - 1; i >= 0; i--) {  // innermost first: source order
    const Expr *a = annots[i];
    DType p;
    if (strcmp(a->name, "schedule") == 0) {
      read_schedule(S, c, a);
    } else if (sema_precision_from_name(a->name, &p)) {
      if (a->has_parens) {
        diag_error(S->d, a->name_loc, "precision '@%s' takes no arguments; expected '@%s'",
                   a->name, a->name);
      } else if (prec_annot) {
        diag_error(S->d, a->name_loc, "duplicate precision '@%s'; the op already has '@%s'",
                   a->name, prec_annot->name);
        diag_note(S->d, prec_annot->name_loc, "first precision is here");
      } else {
        prec_annot = a;
        prec = p;
      }
    } else {
      diag_error(S->d, a->name_loc, "unknown annotation '@%s'; expected a precision (%s) or "
                 "@schedule(...)", a->name, sema_list(S, sema_precision_names, 5));
      static const char *const all[] = {"fp32", "bf16", "fp16", "fp8", "mxfp8", "schedule"};
      sema_suggest(S, a->name_loc, a->name, all, 6);
    }
  }

  c->prec = sema_default_precision(S, op->has_matmul);
  c->prec_loc = S->precision_loc;
  if (prec_annot) {
    if (op->sop == SOP_BCE && prec != DT_F32) {
      diag_error(S->d, prec_annot->name_loc, "precision %s is not legal on bce: a loss is "
                 "always computed in fp32; expected fp32", dtype_name(prec));
    } else if (is_fp8(prec) && !op->has_matmul) {
      diag_error(S->d, prec_annot->name_loc, "precision %s is not legal on %s: it has no "
                 "matmul; expected fp32, bf16 or fp16", dtype_name(prec), op->name);
    } else {
      c->prec = prec;
      c->prec_loc = prec_annot->name_loc;
    }
  }
  if (op->sop == SOP_BCE) c->prec = DT_F32;
  if (c->prec == DT_MXFP8) sema_note_mxfp8(S, c->prec_loc);
  c->value_dtype = sema_value_dtype(c->prec);
  // Attention ops check their hints once they know d / heads (sema_attention.c).
  if (op->sop != SOP_GDPA && op->sop != SOP_PMA) sema_warn_idle_hints(S, c, 0, 0);
}
