// ir_print.c: the stable text form of the graph IR (docs/ir.md, "Text form"). The same IR
// always prints the same bytes, and ir_read reads them back. Printing never fails on a
// broken IR: a bad index prints as `%?N`, so the verifier's reports can be read against it.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"
#include "ir.h"

// Trailing `; path:line:col` comments start at this column (counting from 0), or two spaces
// after a longer line.
enum { COMMENT_COLUMN = 66 };

// --- a growable line --------------------------------------------------------------------

typedef struct Line {
  char *text;
  size_t len, cap;
} Line;

static void line_reserve(Line *l, size_t more) {
  if (l->len + more + 1 <= l->cap) return;
  size_t cap = l->cap ? l->cap : 256;
  while (cap < l->len + more + 1) cap *= 2;
  char *text = xrealloc(l->text, cap);
  l->text = text;
  l->cap = cap;
}

__attribute__((format(printf, 2, 3))) static void put(Line *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  GEMC_ASSERT(n >= 0);
  line_reserve(l, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(l->text + l->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  l->len += (size_t)n;
}

static void put_char(Line *l, char c) {
  line_reserve(l, 1);
  l->text[l->len++] = c;
  l->text[l->len] = '\0';
}

// Writes the line, with its source location as a trailing comment when it has one.
static void line_end(FILE *out, Line *l, const Ir *ir, Loc loc) {
  if (loc.first_line > 0) {
    size_t pad = l->len + 2 <= COMMENT_COLUMN ? COMMENT_COLUMN - l->len : 2;
    line_reserve(l, pad);
    memset(l->text + l->len, ' ', pad);
    l->len += pad;
    put(l, "; ");
    // The reader ignores the path, so control characters just become '?'.
    for (const char *p = ir->source ? ir->source : "?"; *p; p++)
      put_char(l, (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p);
    put(l, ":%d:%d", loc.first_line, loc.first_column);
  }
  if (l->len) fwrite(l->text, 1, l->len, out);
  fputc('\n', out);
  l->len = 0;
}

// --- values -----------------------------------------------------------------------------

// The shortest of %.1g ... %.17g that strtod reads back to the same double; whole numbers
// below 10^16 print without an exponent (100, not 1e+02).
static void put_real(Line *l, double v) {
  if (isnan(v)) {
    put(l, "nan");
    return;
  }
  char buf[40];
  if (v == trunc(v) && fabs(v) < 1e16) {
    snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    for (int digits = 1; digits <= 17; digits++) {
      snprintf(buf, sizeof buf, "%.*g", digits, v);
      double back = strtod(buf, NULL);
      if (back == v && signbit(back) == signbit(v)) break;
    }
  }
  put(l, "%s", buf);
}

static void put_string(Line *l, const char *s) {
  put_char(l, '"');
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\') {
      put_char(l, '\\');
      put_char(l, (char)*p);
    } else if (*p == '\n') {
      put(l, "\\n");
    } else if (*p == '\t') {
      put(l, "\\t");
    } else if (*p < 0x20 || *p == 0x7f) {
      put(l, "\\x%02x", *p);
    } else {
      put_char(l, (char)*p);
    }
  }
  put_char(l, '"');
}

static void put_word(Line *l, const char *s) { put(l, "%s", s && *s ? s : "?"); }

static void put_tensor_ref(Line *l, const Ir *ir, int t) {
  if (t < 0 || t >= ir->ntensors) {
    put(l, "%%?%d", t);
    return;
  }
  const Tensor *x = &ir->tensors[t];
  put_char(l, x->kind == TENSOR_PARAM || x->kind == TENSOR_TABLE ? '@' : '%');
  put_word(l, x->name);
}

static void put_jagged_ref(Line *l, const Ir *ir, int j) {
  if (j < 0 || j >= ir->njagged)
    put(l, "*?%d", j);
  else
    put(l, "*%s", ir->jagged[j].name ? ir->jagged[j].name : "?");
}

// "fp32 jagged[B, *history, 32]"
static void put_type(Line *l, const Ir *ir, const Tensor *t) {
  put(l, "%s %s[", dtype_name(t->dtype), layout_name(t->layout));
  switch (t->layout) {
  case LAYOUT_DENSE:
    put(l, "B");
    if (t->width != 0) put(l, ", %" PRId64, t->width);
    break;
  case LAYOUT_SET: put(l, "B, %" PRId64 ", %" PRId64, t->set_k, t->width); break;
  case LAYOUT_JAGGED:
    put(l, "B, ");
    put_jagged_ref(l, ir, t->jag);
    if (t->width != 0) put(l, ", %" PRId64, t->width);
    break;
  case LAYOUT_FIXED:
    for (int i = 0; i < t->nfixed && i < 2; i++) put(l, "%s%" PRId64, i ? ", " : "", t->fixed[i]);
    break;
  case LAYOUT_SCALAR: break;
  case LAYOUT_ROWS:
    put(l, "U_");
    if (t->table >= 0 && t->table < ir->ntensors)
      put_word(l, ir->tensors[t->table].name);
    else
      put(l, "?%d", t->table);
    put(l, ", %" PRId64, t->width);
    break;
  }
  put_char(l, ']');
}

// "adamw lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0"
static void put_optim(Line *l, const Optim *o) {
  put(l, "%s", optim_name(o->kind));
  bool adamw = o->kind == OPTIM_ADAMW, adagrad = o->kind == OPTIM_ROWWISE_ADAGRAD;
  if (o->kind == OPTIM_NONE) return;
  put(l, " lr=");
  put_real(l, o->lr);
  if (adamw) {
    put(l, " beta1=");
    put_real(l, o->beta1);
    put(l, " beta2=");
    put_real(l, o->beta2);
  }
  if (adamw || adagrad) {
    put(l, " eps=");
    put_real(l, o->eps);
  }
  if (adamw) {
    put(l, " weight_decay=");
    put_real(l, o->weight_decay);
  }
}

static bool same_optim(const Optim *a, const Optim *b) {
  return a->kind == b->kind && a->lr == b->lr && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
         a->eps == b->eps && a->weight_decay == b->weight_decay;
}

// --- nodes ------------------------------------------------------------------------------

static void put_attr(Line *l, const Node *n, NodeAttr a) {
  put(l, "%s=", node_attr_name(a));
  switch (a) {
  case ATTR_SHAPE: put(l, "%s", attn_shape_name(n->shape)); break;
  case ATTR_HEADS: put(l, "%" PRId64, n->heads); break;
  case ATTR_POOL: put(l, "%s", pool_name(n->pool)); break;
  case ATTR_ACT: put(l, "%s", act_name(n->act)); break;
  case ATTR_MASK: put(l, "%s", mask_name(n->mask)); break;
  case ATTR_WINDOW: put(l, "%" PRId64, n->window); break;
  case ATTR_SCALE: put_real(l, n->scale); break;
  case ATTR_HSTU_NORM: put(l, "%s", n->hstu_norm ? "true" : "false"); break;
  case ATTR_EPS: put_real(l, n->eps); break;
  case ATTR_PREC: put(l, "%s", dtype_name(n->prec)); break;
  case ATTR_TASK: put_string(l, n->task); break;
  case ATTR_WEIGHTS:
    put_char(l, '[');
    for (int i = 0; i < n->nins && i < IR_MAX_INPUTS; i++) {
      if (i) put(l, ", ");
      put_real(l, n->weights[i]);
    }
    put_char(l, ']');
    break;
  case ATTR_START: put(l, "%" PRId64, n->start); break;
  case ATTR_WEIGHT: put_real(l, n->weight); break;
  case ATTR_COUNT: break;
  }
}

// Opens "{" before the first attribute and writes ", " before each later one.
typedef struct Attrs {
  Line *line;
  bool open;
} Attrs;

static Line *next_attr(Attrs *a) {
  put(a->line, a->open ? ", " : " {");
  a->open = true;
  return a->line;
}

static void put_switch(Attrs *a, const char *key, int v, const char *one, const char *two) {
  Line *l = next_attr(a);
  put(l, "%s=", key);
  if (v == 1)
    put(l, "%s", one);
  else if (v == 2)
    put(l, "%s", two);
  else
    put(l, "%d", v);
}

static void put_schedule(Attrs *a, const Schedule *s) {
  const struct {
    const char *key;
    int value;
  } hints[] = {{"tile_q", s->tile_q}, {"tile_kv", s->tile_kv}, {"tile_m", s->tile_m},
               {"tile_n", s->tile_n}, {"tile_k", s->tile_k},   {"stages", s->stages}};
  for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++)
    if (hints[i].value) put(next_attr(a), "%s=%d", hints[i].key, hints[i].value);
  if (s->zigzag) put_switch(a, "zigzag", s->zigzag, "on", "off");
  if (s->gelu_taylor) put_switch(a, "gelu", s->gelu_taylor, "taylor", "exact");
  if (s->deterministic) put_switch(a, "deterministic", s->deterministic, "true", "false");
  if (s->recompute == RECOMPUTE_COPY) put(next_attr(a), "recompute=copy");
  else if (s->recompute == RECOMPUTE_KEEP) put(next_attr(a), "recompute=keep");
  else if (s->recompute) put_switch(a, "recompute", s->recompute, "true", "false");
}

// " {act=none, prec=fp32, tile_m=64}", or nothing when the op has no attributes and no
// schedule hint is set.
static void put_attrs(Line *l, const Node *n) {
  Attrs a = {l, false};
  for (int i = 0; i < ATTR_COUNT; i++)
    if (op_has_attr(n->op, (NodeAttr)i)) put_attr(next_attr(&a), n, (NodeAttr)i);
  put_schedule(&a, &n->sched);
  if (a.open) put_char(l, '}');
}

static void print_node(FILE *out, Line *l, const Ir *ir, const Node *n) {
  put_tensor_ref(l, ir, n->out);
  put(l, " : ");
  if (n->out >= 0 && n->out < ir->ntensors)
    put_type(l, ir, &ir->tensors[n->out]);
  else
    put(l, "?");
  put(l, " = %s", op_name(n->op));
  for (int i = 0; i < n->nins && i < IR_MAX_INPUTS; i++) {
    put(l, i ? ", " : " ");
    put_tensor_ref(l, ir, n->ins[i]);
  }
  put_attrs(l, n);
  line_end(out, l, ir, n->loc);
}

// --- the whole IR -----------------------------------------------------------------------

static void print_header(FILE *out, Line *l, const Ir *ir) {
  static const Loc none;
  fprintf(out, "; gemc ir\n");
  put(l, "model ");
  put_word(l, ir->model);
  line_end(out, l, ir, none);
  put(l, "source ");
  put_string(l, ir->source);
  line_end(out, l, ir, none);
  put(l, "target ");
  put_word(l, ir->target);
  line_end(out, l, ir, none);
  fprintf(out, "precision %s\n", dtype_name(ir->precision));
  fprintf(out, "batch %" PRId64 "\n", ir->batch);
  fprintf(out, "dim %" PRId64 "\n", ir->dim);
  put(l, "optim ");
  put_optim(l, &ir->dense_optim);
  line_end(out, l, ir, none);
  const Parallel *p = &ir->parallel;
  if (p->dense || p->bucket_mb || p->tables) {
    put(l, "parallel");
    if (p->dense) put(l, " dense=%s", shard_dense_name(p->dense));
    if (p->bucket_mb) put(l, " bucket_mb=%" PRId64, p->bucket_mb);
    if (p->tables) put(l, " tables=%s", shard_table_name(p->tables));
    line_end(out, l, ir, none);
  }
}

static void print_jagged(FILE *out, Line *l, const Ir *ir) {
  fprintf(out, "; B = %" PRId64 "; for each jagged dim *s: T_s = sum of lengths, L_s = max length\n",
          ir->batch);
  for (int j = 0; j < ir->njagged; j++) {
    const JaggedDim *d = &ir->jagged[j];
    const char *name = d->name ? d->name : "?";
    put(l, "jagged *%s L_%s=%" PRId64, name, name, d->max_len);
    line_end(out, l, ir, d->loc);
  }
}

static void print_decl(FILE *out, Line *l, const Ir *ir, int i) {
  static const char *const keywords[] = {"input", "label", "param", "table", "value"};
  const Tensor *t = &ir->tensors[i];
  put(l, "%s ", (int)t->kind >= 0 && t->kind <= TENSOR_VALUE ? keywords[t->kind] : "?");
  put_tensor_ref(l, ir, i);
  put(l, " : ");
  put_type(l, ir, t);
  bool model_optim = t->optim.kind == OPTIM_NONE || same_optim(&t->optim, &ir->dense_optim);
  if (t->kind == TENSOR_TABLE || (t->kind == TENSOR_PARAM && !model_optim)) {
    put_char(l, ' ');
    put_optim(l, &t->optim);
  }
  if (t->kind == TENSOR_TABLE && t->shard) put(l, " shard=%s", shard_table_name(t->shard));
  line_end(out, l, ir, t->loc);
}

static bool is_kind(const Tensor *t, TensorKind a, TensorKind b) {
  return t->kind == a || t->kind == b;
}

void ir_print(FILE *out, const Ir *ir) {
  Line l = {0};
  print_header(out, &l, ir);
  fputc('\n', out);
  print_jagged(out, &l, ir);

  // Declarations: inputs and labels, then tables, then parameters, each in index order.
  static const TensorKind groups[][2] = {{TENSOR_INPUT, TENSOR_LABEL},
                                         {TENSOR_TABLE, TENSOR_TABLE},
                                         {TENSOR_PARAM, TENSOR_PARAM}};
  bool any = false;
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < ir->ntensors; i++) {
      if (!is_kind(&ir->tensors[i], groups[g][0], groups[g][1])) continue;
      if (!any) fputc('\n', out);
      any = true;
      print_decl(out, &l, ir, i);
    }

  // The forward nodes, then the backward nodes after a `backward` line.
  int nforward = ir->nforward >= 0 && ir->nforward < ir->nnodes ? ir->nforward : ir->nnodes;
  if (nforward > 0) fputc('\n', out);
  for (int i = 0; i < nforward; i++) print_node(out, &l, ir, &ir->nodes[i]);
  if (nforward < ir->nnodes) fputs("\nbackward\n", out);
  for (int i = nforward; i < ir->nnodes; i++) print_node(out, &l, ir, &ir->nodes[i]);

  static const Loc none;
  if (ir->loss >= 0) {
    fputc('\n', out);
    put(&l, "loss ");
    put_tensor_ref(&l, ir, ir->loss);
    line_end(out, &l, ir, none);
  }
  if (ir->ngrads > 0) fputc('\n', out);
  for (int i = 0; i < ir->ngrads; i++) {
    put(&l, "grad ");
    put_tensor_ref(&l, ir, ir->grads[i].param);
    put(&l, " = ");
    put_tensor_ref(&l, ir, ir->grads[i].grad);
    line_end(out, &l, ir, none);
  }
  free(l.text);
}

void ir_format_type(const Ir *ir, const Tensor *t, char *buf, size_t size) {
  Line l = {0};
  put_type(&l, ir, t);
  if (size > 0) snprintf(buf, size, "%s", l.text);
  free(l.text);
}
