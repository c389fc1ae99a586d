// ir_read.c: reads the text form of the graph IR (docs/ir.md, "Text form") back into an Ir.
// One line is one record; the first word says which. Names resolve against the lines above,
// so the text must be in the order ir_print writes it. The first error stops the reader and
// is reported at its line and column. Whether the IR makes sense is ir_verify's business.
#include <stdlib.h>
#include <string.h>

#include "ir.h"

typedef struct Reader {
  Diag *d;
  Ir *ir;
  const char *line;  // the current line
  const char *end;   // its end, before any comment
  const char *p;     // the cursor, in [line, end]
  int lineno;
  Loc loc;           // the `; path:line:col` of the current line, or zeros
  bool seen_model, seen_source, seen_target, seen_precision, seen_batch, seen_dim, seen_optim;
  bool seen_parallel;
  bool seen_backward;
} Reader;

// --- errors -----------------------------------------------------------------------------

__attribute__((format(printf, 3, 4))) static bool fail_at(Reader *r, const char *at,
                                                          const char *fmt, ...) {
  int column = (int)(at - r->line) + 1;
  Loc loc = {r->lineno, column, r->lineno, column};
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(r->d, DIAG_ERROR, loc, fmt, ap);
  va_end(ap);
  return false;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }
static bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.';
}

static void skip_space(Reader *r) {
  while (r->p < r->end && is_space(*r->p)) r->p++;
}

// What the cursor is at, for "expected X, found Y".
static const char *found(Reader *r, char *buf, size_t size) {
  skip_space(r);
  if (r->p >= r->end) return "end of line";
  if (is_word_char(*r->p)) {
    int n = 0;
    while (r->p + n < r->end && is_word_char(r->p[n]) && n < 40) n++;
    snprintf(buf, size, "'%.*s'", n, r->p);
  } else if ((unsigned char)*r->p >= 0x20 && (unsigned char)*r->p < 0x7f) {
    snprintf(buf, size, "'%c'", *r->p);
  } else {
    snprintf(buf, size, "byte 0x%02x", (unsigned char)*r->p);
  }
  return buf;
}

static bool expected(Reader *r, const char *what) {
  char buf[64];
  const char *f = found(r, buf, sizeof buf);
  return fail_at(r, r->p, "expected %s, found %s", what, f);
}

// --- tokens -----------------------------------------------------------------------------

static bool accept(Reader *r, char c) {
  skip_space(r);
  if (r->p < r->end && *r->p == c) {
    r->p++;
    return true;
  }
  return false;
}

static bool expect(Reader *r, char c) {
  if (accept(r, c)) return true;
  char what[8];
  snprintf(what, sizeof what, "'%c'", c);
  return expected(r, what);
}

// A word: [A-Za-z0-9_.]+. Sets *start and *len; false (no report) when there is none.
static bool word(Reader *r, const char **start, size_t *len) {
  skip_space(r);
  const char *s = r->p;
  while (r->p < r->end && is_word_char(*r->p)) r->p++;
  *start = s;
  *len = (size_t)(r->p - s);
  return *len > 0;
}

// Reads a word into `buf` for comparison with keywords; a longer word reads as "".
static bool keyword(Reader *r, char *buf, size_t size, const char *what) {
  const char *s;
  size_t n;
  if (!word(r, &s, &n)) return expected(r, what);
  if (n >= size) n = 0;
  memcpy(buf, s, n);
  buf[n] = '\0';
  return true;
}

static bool name(Reader *r, const char **out, const char *what) {
  const char *s;
  size_t n;
  if (!word(r, &s, &n)) return expected(r, what);
  *out = arena_strndup(r->ir->arena, s, n);
  return true;
}

static bool integer(Reader *r, int64_t *out) {
  skip_space(r);
  const char *s = r->p;
  bool negative = r->p < r->end && *r->p == '-';
  if (negative) r->p++;
  if (r->p >= r->end || *r->p < '0' || *r->p > '9') {
    r->p = s;
    return expected(r, "an integer");
  }
  uint64_t v = 0;
  for (; r->p < r->end && *r->p >= '0' && *r->p <= '9'; r->p++) {
    unsigned digit = (unsigned)(*r->p - '0');
    if (v > (UINT64_C(9223372036854775808) - digit) / 10)
      return fail_at(r, s, "integer out of range");
    v = v * 10 + digit;
  }
  if (r->p < r->end && is_word_char(*r->p)) return fail_at(r, s, "malformed integer");
  if (!negative && v > (uint64_t)INT64_MAX) return fail_at(r, s, "integer out of range");
  *out = negative ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}

static bool small_int(Reader *r, int *out) {
  const char *s = (skip_space(r), r->p);
  int64_t v;
  if (!integer(r, &v)) return false;
  if (v < -1000000000 || v > 1000000000) return fail_at(r, s, "integer out of range");
  *out = (int)v;
  return true;
}

static bool real(Reader *r, double *out) {
  skip_space(r);
  const char *s = r->p;
  // strtod skips leading space and would read across a line; neither can happen here: the
  // cursor is at a non-space, and the line ends at '\n', ';' or the text's final NUL.
  char *after = NULL;
  double v = r->p < r->end ? strtod(r->p, &after) : 0;
  if (!after || after == r->p || after > r->end) return expected(r, "a number");
  r->p = after;
  if (r->p < r->end && is_word_char(*r->p)) return fail_at(r, s, "malformed number");
  *out = v;
  return true;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "..." with the escapes \" \\ \n \t \xHH.
static bool string(Reader *r, const char **out) {
  skip_space(r);
  const char *open = r->p;
  if (!accept(r, '"')) return expected(r, "a string");
  char *buf = arena_alloc(r->ir->arena, (size_t)(r->end - r->p) + 1);
  size_t n = 0;
  for (;;) {
    if (r->p >= r->end) return fail_at(r, open, "unterminated string");
    char c = *r->p++;
    if (c == '"') break;
    if (c == '\0') return fail_at(r, r->p - 1, "NUL byte in a string");
    if (c == '\\') {
      char e = r->p < r->end ? *r->p++ : '\0';
      int hi, lo;
      if (e == '"' || e == '\\') {
        c = e;
      } else if (e == 'n') {
        c = '\n';
      } else if (e == 't') {
        c = '\t';
      } else if (e == 'x' && r->end - r->p >= 2 && (hi = hex_digit(r->p[0])) >= 0 &&
                 (lo = hex_digit(r->p[1])) >= 0 && (hi | lo) != 0) {
        c = (char)(hi * 16 + lo);
        r->p += 2;
      } else {
        return fail_at(r, r->p - 2, "unknown escape in a string");
      }
    }
    buf[n++] = c;
  }
  buf[n] = '\0';
  *out = buf;
  return true;
}

static bool end_of_line(Reader *r) {
  skip_space(r);
  if (r->p < r->end) return expected(r, "end of line");
  return true;
}

// --- types and optimizers ---------------------------------------------------------------

static bool dtype(Reader *r, DType *out) {
  const char *at = (skip_space(r), r->p);
  char buf[16];
  if (!keyword(r, buf, sizeof buf, "a dtype")) return false;
  if (!dtype_from_name(buf, out))
    return fail_at(r, at, "unknown dtype '%s'; expected fp32, bf16, fp16, fp8, mxfp8, fp64 or i64",
                   buf);
  return true;
}

static bool jagged_ref(Reader *r, int *out) {
  const char *at = (skip_space(r), r->p), *s;
  if (!expect(r, '*')) return false;
  size_t n;
  if (!word(r, &s, &n)) return expected(r, "a jagged dim name");
  for (int j = 0; j < r->ir->njagged; j++) {
    const char *jn = r->ir->jagged[j].name;
    if (jn && strlen(jn) == n && memcmp(jn, s, n) == 0) {
      *out = j;
      return true;
    }
  }
  return fail_at(r, at, "unknown jagged dim '*%.*s'", (int)n, s);
}

// "U_items" in a rows type: the table declared on an earlier line whose gradient it is.
static bool table_rows_ref(Reader *r, int *out) {
  const char *at = (skip_space(r), r->p), *s;
  size_t n;
  if (!word(r, &s, &n) || n < 3 || memcmp(s, "U_", 2) != 0) {
    r->p = at;
    return expected(r, "'U_' and a table name");
  }
  char *nm = arena_strndup(r->ir->arena, s + 2, n - 2);
  int t = ir_find_tensor(r->ir, nm);
  if (t < 0 || r->ir->tensors[t].kind != TENSOR_TABLE)
    return fail_at(r, at, "unknown table '%s' in U_%s", nm, nm);
  *out = t;
  return true;
}

// "fp32 jagged[B, *history, 32]" into t's dtype, layout and dims.
static bool type(Reader *r, Tensor *t) {
  if (!dtype(r, &t->dtype)) return false;
  const char *at = (skip_space(r), r->p);
  char buf[16];
  if (!keyword(r, buf, sizeof buf, "a layout")) return false;
  if (!layout_from_name(buf, &t->layout))
    return fail_at(r, at, "unknown layout '%s'; expected dense, set, jagged, fixed, scalar or rows",
                   buf);
  if (!expect(r, '[')) return false;
  t->jag = -1;
  switch (t->layout) {
  case LAYOUT_DENSE:
  case LAYOUT_SET:
  case LAYOUT_JAGGED:
    if (!accept(r, 'B')) return expected(r, "'B'");
    if (t->layout == LAYOUT_SET) {
      if (!expect(r, ',') || !integer(r, &t->set_k) || !expect(r, ',')) return false;
      if (!integer(r, &t->width)) return false;
      break;
    }
    if (t->layout == LAYOUT_JAGGED && (!expect(r, ',') || !jagged_ref(r, &t->jag))) return false;
    if (accept(r, ',') && !integer(r, &t->width)) return false;
    break;
  case LAYOUT_FIXED:
    t->nfixed = 1;
    if (!integer(r, &t->fixed[0])) return false;
    if (accept(r, ',')) {
      t->nfixed = 2;
      if (!integer(r, &t->fixed[1])) return false;
    }
    break;
  case LAYOUT_SCALAR: break;
  case LAYOUT_ROWS:
    if (!table_rows_ref(r, &t->table) || !expect(r, ',') || !integer(r, &t->width)) return false;
    break;
  }
  return expect(r, ']');
}

// "adamw lr=0.001 eps=1e-08 ...": keys in any order, each at most once; a missing key takes
// the default of docs/language.md.
static bool optim(Reader *r, Optim *o) {
  const char *at = (skip_space(r), r->p);
  char buf[24];
  if (!keyword(r, buf, sizeof buf, "an optimizer")) return false;
  memset(o, 0, sizeof *o);
  if (!optim_from_name(buf, &o->kind))
    return fail_at(r, at, "unknown optimizer '%s'; expected none, adamw, sgd or rowwise_adagrad",
                   buf);
  static const char *const keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
  double *fields[] = {&o->lr, &o->beta1, &o->beta2, &o->eps, &o->weight_decay};
  bool allowed[5] = {false};
  switch (o->kind) {
  case OPTIM_NONE: break;
  case OPTIM_ADAMW:
    *o = (Optim){OPTIM_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0};
    allowed[0] = allowed[1] = allowed[2] = allowed[3] = allowed[4] = true;
    break;
  case OPTIM_SGD:
    o->lr = 0.01;
    allowed[0] = true;
    break;
  case OPTIM_ROWWISE_ADAGRAD:
    o->lr = 0.01;
    o->eps = 1e-8;
    allowed[0] = allowed[3] = true;
    break;
  }
  bool seen[5] = {false};
  for (;;) {
    skip_space(r);
    if (r->p >= r->end || !is_word_char(*r->p)) return true;
    if (r->end - r->p > 6 && memcmp(r->p, "shard=", 6) == 0) return true;  // a table's placement
    const char *key_at = r->p;
    if (!keyword(r, buf, sizeof buf, "an optimizer setting")) return false;
    int k = 0;
    while (k < 5 && strcmp(keys[k], buf) != 0) k++;
    if (k == 5 || !allowed[k])
      return fail_at(r, key_at, "optimizer %s has no setting '%s'", optim_name(o->kind), buf);
    if (seen[k]) return fail_at(r, key_at, "duplicate setting '%s'", buf);
    seen[k] = true;
    if (!expect(r, '=') || !real(r, fields[k])) return false;
  }
}

// --- header lines -----------------------------------------------------------------------

// A table's "shard=row".
static bool shard_table(Reader *r, ShardTable *out) {
  const char *at = (skip_space(r), r->p);
  char buf[24];
  if (!keyword(r, buf, sizeof buf, "a table placement")) return false;
  if (!shard_table_from_name(buf, out))
    return fail_at(r, at, "unknown table placement '%s'; expected replicate, table, row or auto",
                   buf);
  return true;
}

// "parallel dense=zero2 bucket_mb=25 tables=auto": each key at most once, at least one.
static bool parallel(Reader *r) {
  Parallel *p = &r->ir->parallel;
  bool seen[3] = {false}, any = false;
  for (;;) {
    skip_space(r);
    if (r->p >= r->end) break;
    const char *at = r->p;
    char key[16];
    if (!keyword(r, key, sizeof key, "a parallel setting")) return false;
    int k = strcmp(key, "dense") == 0 ? 0 : strcmp(key, "bucket_mb") == 0 ? 1
            : strcmp(key, "tables") == 0 ? 2 : -1;
    if (k < 0) return fail_at(r, at, "unknown parallel setting '%s'", key);
    if (seen[k]) return fail_at(r, at, "duplicate parallel setting '%s'", key);
    seen[k] = any = true;
    if (!expect(r, '=')) return false;
    const char *v = (skip_space(r), r->p);
    if (k == 0) {
      char buf[24];
      if (!keyword(r, buf, sizeof buf, "a dense placement")) return false;
      if (!shard_dense_from_name(buf, &p->dense))
        return fail_at(r, v, "unknown dense placement '%s'", buf);
    } else if (k == 1) {
      if (!integer(r, &p->bucket_mb)) return false;
      if (p->bucket_mb <= 0) return fail_at(r, v, "bucket_mb must be positive");
    } else if (!shard_table(r, &p->tables)) {
      return false;
    }
  }
  if (!any) return expected(r, "a parallel setting");
  return true;
}

static bool once(Reader *r, bool *seen, const char *at, const char *what) {
  if (*seen) return fail_at(r, at, "duplicate '%s' line", what);
  *seen = true;
  return true;
}

static bool header_line(Reader *r, const char *key, const char *at) {
  Ir *ir = r->ir;
  if (strcmp(key, "model") == 0)
    return once(r, &r->seen_model, at, key) && name(r, &ir->model, "a model name") &&
           end_of_line(r);
  if (strcmp(key, "source") == 0)
    return once(r, &r->seen_source, at, key) && string(r, &ir->source) && end_of_line(r);
  if (strcmp(key, "target") == 0)
    return once(r, &r->seen_target, at, key) && name(r, &ir->target, "a target") &&
           end_of_line(r);
  if (strcmp(key, "precision") == 0)
    return once(r, &r->seen_precision, at, key) && dtype(r, &ir->precision) && end_of_line(r);
  if (strcmp(key, "batch") == 0)
    return once(r, &r->seen_batch, at, key) && integer(r, &ir->batch) && end_of_line(r);
  if (strcmp(key, "dim") == 0)
    return once(r, &r->seen_dim, at, key) && integer(r, &ir->dim) && end_of_line(r);
  if (strcmp(key, "parallel") == 0) return once(r, &r->seen_parallel, at, key) && parallel(r);
  return once(r, &r->seen_optim, at, key) && optim(r, &ir->dense_optim) && end_of_line(r);
}

// "jagged *history L_history=50"
static bool jagged_line(Reader *r) {
  const char *at = (skip_space(r), r->p), *dim_name;
  if (!expect(r, '*')) return false;
  if (!name(r, &dim_name, "a jagged dim name")) return false;
  for (int j = 0; j < r->ir->njagged; j++)
    if (r->ir->jagged[j].name && strcmp(r->ir->jagged[j].name, dim_name) == 0)
      return fail_at(r, at, "duplicate jagged dim '*%s'", dim_name);
  skip_space(r);
  const char *key_at = r->p, *s;
  size_t n;
  size_t len = strlen(dim_name);
  if (!word(r, &s, &n) || n != len + 2 || memcmp(s, "L_", 2) != 0 || memcmp(s + 2, dim_name, len))
    return fail_at(r, key_at, "expected 'L_%s=' after '*%s'", dim_name, dim_name);
  int64_t max_len;
  if (!expect(r, '=') || !integer(r, &max_len) || !end_of_line(r)) return false;
  ir_add_jagged(r->ir, dim_name, max_len, r->loc);
  return true;
}

// --- tensors and nodes ------------------------------------------------------------------

static bool new_name(Reader *r, char sigil, const char **out) {
  skip_space(r);
  const char *at = r->p;
  if (!accept(r, sigil)) {
    char what[24];
    snprintf(what, sizeof what, "a %c name", sigil);
    return expected(r, what);
  }
  if (!name(r, out, "a name")) return false;
  if (ir_find_tensor(r->ir, *out) >= 0) return fail_at(r, at, "redefinition of %c%s", sigil, *out);
  return true;
}

// "input %history : i64 jagged[B, *history]", and label, table and param lines.
static bool decl_line(Reader *r, TensorKind kind) {
  Tensor t = {.kind = kind, .jag = -1, .producer = -1, .loc = r->loc};
  bool weights = kind == TENSOR_PARAM || kind == TENSOR_TABLE;
  if (!new_name(r, weights ? '@' : '%', &t.name)) return false;
  if (!expect(r, ':') || !type(r, &t)) return false;
  if (kind == TENSOR_TABLE && !optim(r, &t.optim)) return false;
  if (kind == TENSOR_TABLE) {
    skip_space(r);
    if (r->end - r->p > 6 && memcmp(r->p, "shard=", 6) == 0) {
      r->p += 6;
      if (!shard_table(r, &t.shard)) return false;
    }
  }
  if (kind == TENSOR_PARAM) {
    skip_space(r);
    if (r->p < r->end) {
      if (!optim(r, &t.optim)) return false;
    } else {
      t.optim = r->ir->dense_optim;
    }
  }
  if (!end_of_line(r)) return false;
  ir_add_tensor(r->ir, &t);
  return true;
}

// "%name" or "@name", declared on an earlier line.
static bool tensor_ref(Reader *r, int *out) {
  skip_space(r);
  const char *at = r->p;
  char sigil = r->p < r->end ? *r->p : '\0';
  if (sigil != '%' && sigil != '@') return expected(r, "a %name or @name");
  r->p++;
  const char *s;
  size_t n;
  if (!word(r, &s, &n)) return expected(r, "a name");
  char *nm = arena_strndup(r->ir->arena, s, n);
  int t = ir_find_tensor(r->ir, nm);
  if (t < 0) return fail_at(r, at, "unknown tensor %c%s", sigil, nm);
  TensorKind k = r->ir->tensors[t].kind;
  char want = k == TENSOR_PARAM || k == TENSOR_TABLE ? '@' : '%';
  if (sigil != want) return fail_at(r, at, "%c%s is spelled %c%s", sigil, nm, want, nm);
  *out = t;
  return true;
}

static bool word_value(Reader *r, char *buf, size_t size) {
  return keyword(r, buf, size, "a value");
}

// A schedule switch: on/off (zigzag), taylor/exact (gelu), or a raw number.
static bool switch_value(Reader *r, int *out, const char *one, const char *two) {
  skip_space(r);
  if (r->p < r->end && (*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))) return small_int(r, out);
  const char *at = r->p;
  char buf[16];
  if (!word_value(r, buf, sizeof buf)) return false;
  if (strcmp(buf, one) == 0) *out = 1;
  else if (strcmp(buf, two) == 0) *out = 2;
  else return fail_at(r, at, "expected %s or %s", one, two);
  return true;
}

// Schedule hints are read like attributes, numbered after them.
enum {
  HINT_TILE_Q = ATTR_COUNT,
  HINT_TILE_KV,
  HINT_TILE_M,
  HINT_TILE_N,
  HINT_TILE_K,
  HINT_STAGES,
  HINT_ZIGZAG,
  HINT_GELU,
  HINT_DETERMINISTIC,
  HINT_RECOMPUTE,
  HINT_END
};
static const char *const hint_names[] = {"tile_q", "tile_kv", "tile_m", "tile_n", "tile_k",
                                         "stages", "zigzag",  "gelu",   "deterministic",
                                         "recompute"};

// The value of one node attribute or schedule hint.
static bool attr_value(Reader *r, Node *n, int a) {
  const char *at = (skip_space(r), r->p);
  char buf[32];
  switch (a) {
  case ATTR_SHAPE:
    if (!word_value(r, buf, sizeof buf)) return false;
    if (!attn_shape_from_name(buf, &n->shape))
      return fail_at(r, at, "unknown attention shape '%s'; expected self, cross, pma or pffn", buf);
    return true;
  case ATTR_HEADS: return integer(r, &n->heads);
  case ATTR_POOL:
    if (!word_value(r, buf, sizeof buf)) return false;
    if (!pool_from_name(buf, &n->pool)) return fail_at(r, at, "expected sum or mean");
    return true;
  case ATTR_ACT:
    if (!word_value(r, buf, sizeof buf)) return false;
    if (!act_from_name(buf, &n->act)) return fail_at(r, at, "unknown activation '%s'", buf);
    return true;
  case ATTR_MASK:
    if (!word_value(r, buf, sizeof buf)) return false;
    if (!mask_from_name(buf, &n->mask)) return fail_at(r, at, "expected none or causal");
    return true;
  case ATTR_WINDOW: return integer(r, &n->window);
  case ATTR_SCALE: return real(r, &n->scale);
  case ATTR_HSTU_NORM:
    if (!word_value(r, buf, sizeof buf)) return false;
    if (strcmp(buf, "true") != 0 && strcmp(buf, "false") != 0)
      return fail_at(r, at, "expected true or false");
    n->hstu_norm = buf[0] == 't';
    return true;
  case ATTR_EPS: return real(r, &n->eps);
  case ATTR_PREC: return dtype(r, &n->prec);
  case ATTR_TASK: return string(r, &n->task);
  case ATTR_WEIGHTS: {
    if (!expect(r, '[')) return false;
    int count = 0;
    do {
      const char *w_at = (skip_space(r), r->p);
      if (count == n->nins)
        return fail_at(r, w_at, "more weights than inputs (%d)", n->nins);
      if (!real(r, &n->weights[count++])) return false;
    } while (accept(r, ','));
    if (!expect(r, ']')) return false;
    if (count != n->nins)
      return fail_at(r, at, "%d weights for %d inputs; give one per input", count, n->nins);
    return true;
  }
  case ATTR_START: return integer(r, &n->start);
  case ATTR_WEIGHT: return real(r, &n->weight);
  case HINT_TILE_Q: return small_int(r, &n->sched.tile_q);
  case HINT_TILE_KV: return small_int(r, &n->sched.tile_kv);
  case HINT_TILE_M: return small_int(r, &n->sched.tile_m);
  case HINT_TILE_N: return small_int(r, &n->sched.tile_n);
  case HINT_TILE_K: return small_int(r, &n->sched.tile_k);
  case HINT_STAGES: return small_int(r, &n->sched.stages);
  case HINT_ZIGZAG: return switch_value(r, &n->sched.zigzag, "on", "off");
  case HINT_DETERMINISTIC: return switch_value(r, &n->sched.deterministic, "true", "false");
  case HINT_RECOMPUTE: {  // true, false, keep or copy (compiler/passes/recompute.c)
    static const struct { const char *word; int value; } words[] = {
        {"copy", RECOMPUTE_COPY}, {"keep", RECOMPUTE_KEEP}};
    skip_space(r);
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++)
      if (r->end - r->p >= 4 && strncmp(r->p, words[w].word, 4) == 0) {
        r->p += 4;
        n->sched.recompute = words[w].value;
        return true;
      }
    return switch_value(r, &n->sched.recompute, "true", "false");
  }
  default: return switch_value(r, &n->sched.gelu_taylor, "taylor", "exact");
  }
}

// "{act=none, prec=fp32, tile_m=64}": each attribute of the op exactly once, schedule hints
// at most once, in any order.
static bool attrs(Reader *r, Node *n) {
  bool seen[HINT_END] = {false};
  const char *open = (skip_space(r), r->p);
  if (accept(r, '{')) {
    do {
      const char *at = (skip_space(r), r->p);
      char key[32];
      if (!keyword(r, key, sizeof key, "an attribute")) return false;
      int a = 0;
      while (a < ATTR_COUNT && strcmp(node_attr_name((NodeAttr)a), key) != 0) a++;
      if (a == ATTR_COUNT) {
        while (a < HINT_END && strcmp(hint_names[a - ATTR_COUNT], key) != 0) a++;
        if (a == HINT_END) return fail_at(r, at, "unknown attribute '%s'", key);
      } else if (!op_has_attr(n->op, (NodeAttr)a)) {
        return fail_at(r, at, "op %s has no attribute '%s'", op_name(n->op), key);
      }
      if (seen[a]) return fail_at(r, at, "duplicate attribute '%s'", key);
      seen[a] = true;
      if (!expect(r, '=') || !attr_value(r, n, a)) return false;
    } while (accept(r, ','));
    if (!expect(r, '}')) return false;
  }
  for (int a = 0; a < ATTR_COUNT; a++)
    if (op_has_attr(n->op, (NodeAttr)a) && !seen[a])
      return fail_at(r, open, "op %s needs the attribute '%s'", op_name(n->op),
                     node_attr_name((NodeAttr)a));
  return true;
}

// "%h.embed0 : fp32 jagged[B, *history, 32] = embed @items, %history {prec=fp32}"
static bool node_line(Reader *r) {
  Tensor t = {.kind = TENSOR_VALUE, .jag = -1, .producer = -1, .loc = r->loc};
  Node n = {.loc = r->loc, .prec = DT_F32};
  if (!new_name(r, '%', &t.name) || !expect(r, ':') || !type(r, &t) || !expect(r, '='))
    return false;
  const char *at = (skip_space(r), r->p);
  char op[32];
  if (!keyword(r, op, sizeof op, "an op")) return false;
  if (!op_from_name(op, &n.op)) return fail_at(r, at, "unknown op '%s'", op);
  skip_space(r);
  if (r->p < r->end && *r->p != '{') {
    do {
      skip_space(r);
      if (n.nins == IR_MAX_INPUTS)
        return fail_at(r, r->p, "more than %d inputs", IR_MAX_INPUTS);
      if (!tensor_ref(r, &n.ins[n.nins++])) return false;
    } while (accept(r, ','));
  }
  if (!attrs(r, &n) || !end_of_line(r)) return false;
  n.out = ir_add_tensor(r->ir, &t);
  ir_add_node(r->ir, &n);
  return true;
}

static bool loss_line(Reader *r, const char *at) {
  if (r->ir->loss >= 0) return fail_at(r, at, "duplicate 'loss' line");
  return tensor_ref(r, &r->ir->loss) && end_of_line(r);
}

// "backward": the nodes below it are the backward pass.
static bool backward_line(Reader *r, const char *at) {
  if (!once(r, &r->seen_backward, at, "backward") || !end_of_line(r)) return false;
  ir_begin_backward(r->ir);
  return true;
}

// "grad @w = %w.grad"
static bool grad_line(Reader *r) {
  int param, grad;
  if (!tensor_ref(r, &param) || !expect(r, '=') || !tensor_ref(r, &grad) || !end_of_line(r))
    return false;
  ir_add_grad(r->ir, param, grad);
  return true;
}

// --- lines ------------------------------------------------------------------------------

// The first ';' outside a string, or `end`.
static const char *comment_start(const char *p, const char *end) {
  bool in_string = false;
  for (; p < end; p++) {
    if (in_string && *p == '\\' && p + 1 < end) p++;
    else if (*p == '"') in_string = !in_string;
    else if (*p == ';' && !in_string) return p;
  }
  return end;
}

// A comment ending in ":LINE:COL" is a source location; any other comment is just a comment.
static Loc comment_loc(const char *c, const char *end) {
  Loc none = {0, 0, 0, 0};
  while (end > c && is_space(end[-1])) end--;
  int v[2];
  for (int k = 1; k >= 0; k--) {
    const char *digits_end = end;
    while (end > c && end[-1] >= '0' && end[-1] <= '9' && digits_end - end < 9) end--;
    if (end == digits_end || end == c || end[-1] != ':') return none;
    v[k] = (int)strtol(end, NULL, 10);
    end--;
  }
  return (Loc){v[0], v[1], v[0], v[1]};
}

static bool read_line(Reader *r) {
  for (const char *c = r->line; c < r->end; c++)
    if (((unsigned char)*c < 0x20 && !is_space(*c)) || *c == 0x7f)
      return fail_at(r, c, "unexpected byte 0x%02x", (unsigned char)*c);
  skip_space(r);
  if (r->p >= r->end) return true;  // blank or comment only
  const char *at = r->p;
  if (*r->p == '%') return node_line(r);
  char key[16];
  if (!keyword(r, key, sizeof key, "a line keyword")) return false;
  static const char *const header[] = {"model", "source", "target", "precision",
                                       "batch", "dim",    "optim",  "parallel"};
  for (size_t i = 0; i < sizeof header / sizeof header[0]; i++)
    if (strcmp(key, header[i]) == 0) return header_line(r, key, at);
  if (strcmp(key, "jagged") == 0) return jagged_line(r);
  if (strcmp(key, "input") == 0) return decl_line(r, TENSOR_INPUT);
  if (strcmp(key, "label") == 0) return decl_line(r, TENSOR_LABEL);
  if (strcmp(key, "table") == 0) return decl_line(r, TENSOR_TABLE);
  if (strcmp(key, "param") == 0) return decl_line(r, TENSOR_PARAM);
  if (strcmp(key, "loss") == 0) return loss_line(r, at);
  if (strcmp(key, "backward") == 0) return backward_line(r, at);
  if (strcmp(key, "grad") == 0) return grad_line(r);
  return fail_at(r, at, "unknown line '%.*s'; expected a header line, jagged, input, label, "
                 "table, param, a %%value, backward, loss or grad", (int)(r->p - at), at);
}

bool ir_read(const SourceFile *f, Arena *arena, Diag *d, Ir *out) {
  ir_init(out, arena);
  out->source = "";
  out->target = "sm_90a";
  out->dense_optim = (Optim){OPTIM_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0};
  Reader r = {.d = d, .ir = out};
  const char *text = f->text, *text_end = f->text + f->size;
  for (const char *line = text; line < text_end;) {
    const char *nl = memchr(line, '\n', (size_t)(text_end - line));
    const char *line_end = nl ? nl : text_end;
    r.lineno++;
    r.line = r.p = line;
    r.end = comment_start(line, line_end);
    r.loc = r.end < line_end ? comment_loc(r.end + 1, line_end) : (Loc){0, 0, 0, 0};
    if (!read_line(&r)) return false;
    line = nl ? nl + 1 : text_end;
  }
  r.line = r.p = r.end = text;  // a missing line is reported at 1:1
  r.lineno = 1;
  if (!r.seen_model) return fail_at(&r, r.p, "missing 'model' line");
  if (!r.seen_batch) return fail_at(&r, r.p, "missing 'batch' line");
  if (!r.seen_dim) return fail_at(&r, r.p, "missing 'dim' line");
  return true;
}
