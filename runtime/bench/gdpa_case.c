// gdpa_case.c: the IR and the emitted kernels of one attention case, and the lengths of the
// batches it runs on: the lengths-file reader and the benchmark's workloads (gdpa_case.h).
#include "gdpa_case.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"  // defines: fail, xmalloc, xrealloc
#include "file_io.h"  // defines: file_read_all

static int add_tensor(Ir *ir, Arena *a, const char *prefix, const char *name, TensorKind kind,
                      Layout layout, int jag, int64_t set_k, int64_t width, DType dtype) {
  char full[96];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  Tensor t = {.name = arena_strdup(a, full), .kind = kind, .layout = layout, .jag = jag,
              .set_k = set_k, .width = width, .table = -1, .dtype = dtype, .producer = -1};
  if (layout == LAYOUT_FIXED) {
    t.fixed[0] = set_k, t.fixed[1] = width, t.nfixed = 2, t.set_k = 0, t.width = 0;
  }
  return ir_add_tensor(ir, &t);
}

void gdpa_case_name(const GdpaCase *c, char *buf, int cap) {
  int n = snprintf(buf, (size_t)cap, "%s %s", attn_shape_name(c->shape), act_name(c->act));
  if (c->causal) n += snprintf(buf + n, (size_t)(cap - n), " causal");
  if (c->window) n += snprintf(buf + n, (size_t)(cap - n), " w%lld", (long long)c->window);
  if (c->hstu_norm) n += snprintf(buf + n, (size_t)(cap - n), " hstu");
  if (c->q_set) n += snprintf(buf + n, (size_t)(cap - n), " q%lld", (long long)c->q_set);
  if (c->kv_set) n += snprintf(buf + n, (size_t)(cap - n), " kvset%lld", (long long)c->kv_set);
  if (c->storage) n += snprintf(buf + n, (size_t)(cap - n), " fp%d", c->storage);
  snprintf(buf + n, (size_t)(cap - n), " dh%lld h%lld", (long long)c->dh, (long long)c->heads);
}

bool gdpa_case_emit(const GdpaCase *c, const char *prefix, Arena *arena, StrBuf *src,
                    GdpaEmitted *e) {
  return gdpa_case_emit_batch(c, 1, prefix, arena, src, e);
}

bool gdpa_case_emit_batch(const GdpaCase *c, int64_t batch, const char *prefix, Arena *arena,
                          StrBuf *src, GdpaEmitted *e) {
  return gdpa_case_emit_with(c, NULL, batch, prefix, arena, src, e);
}

bool gdpa_case_emit_with(const GdpaCase *c, const GdpaEmitOptions *x, int64_t batch,
                         const char *prefix, Arena *arena, StrBuf *src, GdpaEmitted *e) {
  static const GdpaEmitOptions none = {0};
  if (!x) x = &none;
  memset(e, 0, sizeof *e);
  Ir *ir = &e->ir;
  const DType T = c->storage == 32 ? DT_F32 : c->storage == 16 ? DT_FP16 : DT_BF16;
  ir_init(ir, arena);
  ir->source = "gdpa_case.gem";
  ir->batch = batch > 0 ? batch : 1;
  int64_t d = c->heads * c->dh;
  Loc loc = {1, 1, 1, 1};
  int jq = ir_add_jagged(ir, "seq", c->max_q, loc);
  e->q_jag = e->kv_jag = -1;
  // q
  switch (c->shape) {
  case ATTN_SELF:
  case ATTN_CROSS:
    e->q = add_tensor(ir, arena, prefix, "q", TENSOR_INPUT, LAYOUT_JAGGED, jq, 0, d, T);
    e->q_jag = jq;
    break;
  case ATTN_PMA:
    e->q = add_tensor(ir, arena, prefix, "seeds", TENSOR_PARAM, LAYOUT_FIXED, -1, c->q_set, d,
                      DT_F32);
    break;
  case ATTN_PFFN:
    e->q = c->q_set ? add_tensor(ir, arena, prefix, "q", TENSOR_INPUT, LAYOUT_SET, -1, c->q_set, d,
                                 T)
                    : add_tensor(ir, arena, prefix, "q", TENSOR_INPUT, LAYOUT_DENSE, -1, 0, d,
                                 T);
    break;
  }
  // k, v
  if (c->shape == ATTN_CROSS && c->kv_set) {
    e->k = add_tensor(ir, arena, prefix, "k", TENSOR_INPUT, LAYOUT_SET, -1, c->kv_set, d, T);
    e->v = add_tensor(ir, arena, prefix, "v", TENSOR_INPUT, LAYOUT_SET, -1, c->kv_set, d, T);
  } else {
    int jk = c->shape == ATTN_CROSS ? ir_add_jagged(ir, "mem", c->max_kv, loc) : jq;
    if (c->shape == ATTN_PMA || c->shape == ATTN_PFFN) ir->jagged[jq].max_len = c->max_kv;
    e->kv_jag = jk;
    e->k = add_tensor(ir, arena, prefix, "k", TENSOR_INPUT, LAYOUT_JAGGED, jk, 0, d, T);
    e->v = add_tensor(ir, arena, prefix, "v", TENSOR_INPUT, LAYOUT_JAGGED, jk, 0, d, T);
  }
  const Tensor *q = &ir->tensors[e->q];
  Layout ol = c->shape == ATTN_PMA ? LAYOUT_SET : q->layout;
  int64_t ok = c->shape == ATTN_PMA ? c->q_set : q->set_k;
  e->out = add_tensor(ir, arena, prefix, "attn", TENSOR_VALUE, ol, q->jag, ok, d, T);
  Node n = {.op = OP_ATTENTION, .loc = loc, .out = e->out, .ins = {e->q, e->k, e->v}, .nins = 3,
            .prec = c->storage == 32 ? DT_F32 : c->storage == 16 ? DT_FP16 : DT_BF16, .act = c->act, .mask = c->causal ? MASK_CAUSAL : MASK_NONE,
            .shape = c->shape, .heads = c->heads, .window = c->window, .scale = c->scale,
            .hstu_norm = c->hstu_norm,
            .sched = {.tile_q = c->tile_q, .tile_m = c->tile_m, .tile_kv = x->tile_kv,
                      .stages = x->stages, .deterministic = x->atomic_dq ? 2 : 0}};
  int fwd = ir_add_node(ir, &n);
  ir_begin_backward(ir);
  e->dout = add_tensor(ir, arena, prefix, "attn.grad", TENSOR_INPUT, ol, q->jag, ok, d, T);
  const Tensor *qt = &ir->tensors[e->q];
  e->dq = c->shape == ATTN_PMA
              ? add_tensor(ir, arena, prefix, "seeds.grad", TENSOR_VALUE, LAYOUT_FIXED, -1,
                           c->q_set, d, DT_F32)
              : add_tensor(ir, arena, prefix, "q.grad", TENSOR_VALUE, qt->layout, qt->jag,
                           qt->set_k, d, T);
  const Tensor *kt = &ir->tensors[e->k];
  e->dk = add_tensor(ir, arena, prefix, "k.grad", TENSOR_VALUE, kt->layout, kt->jag, kt->set_k, d,
                     T);
  e->dv = add_tensor(ir, arena, prefix, "v.grad", TENSOR_VALUE, kt->layout, kt->jag, kt->set_k, d,
                     T);
  const OpKind ops[3] = {OP_ATTENTION_BWD_Q, OP_ATTENTION_BWD_K, OP_ATTENTION_BWD_V};
  const int outs[3] = {e->dq, e->dk, e->dv};
  int bwd[3];
  for (int i = 0; i < 3; i++) {
    Node b = n;
    b.op = ops[i];
    b.out = outs[i];
    b.ins[3] = e->dout;
    b.nins = 4;
    if (x->model_backward)
      b.sched = (Schedule){.gelu_taylor = n.sched.gelu_taylor,
                           .deterministic = n.sched.deterministic};
    bwd[i] = ir_add_node(ir, &b);
  }
  Plan p = {.arena = arena, .ir = ir, .target = x->target ? x->target : "sm_90a"};
  int nodes[4] = {fwd, bwd[0], bwd[1], bwd[2]};
  Lower L;
  lower_standalone_begin(&L, ir, &p, src);
  LowerMark start = lower_mark(&L);
  bool emitted = true;
  int nemit = x->forward_only ? 1 : 4;
  for (int i = 0; i < nemit && emitted; i++) {
    emitted = emit_attention(&L, nodes[i]);
    if (i == 0) e->nforward = L.nlaunches;
  }
  if (emitted && (L.nlaunches > GDPA_MAX_LAUNCHES || L.ntiles > 8)) emitted = false;
  if (!emitted) lower_rollback(&L, start);
  if (emitted) {
    memcpy(e->launches, L.launches, (size_t)L.nlaunches * sizeof *L.launches);
    e->nlaunches = L.nlaunches;
    memcpy(e->tiles, L.tiles, (size_t)L.ntiles * sizeof *L.tiles);
    e->ntiles = L.ntiles;
  } else {
    e->nforward = 0;
  }
  lower_standalone_end(&L, src);
  return emitted;
}

// --- lengths files ----------------------------------------------------------------------

// One word of a line: [s, e).
typedef struct Word {
  const char *s, *e;
} Word;

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }
static bool ends_word(char c) { return is_blank(c) || c == '\n' || c == '\r' || c == '#'; }

// The word as a message shows it: quoted, at most 24 characters, unprintable bytes as '?'.
static void show_word(Word w, char *buf, size_t cap) {
  size_t n = 0, len = (size_t)(w.e - w.s);
  buf[n++] = '\'';
  for (size_t i = 0; i < len && i < 24 && n + 6 < cap; i++)
    buf[n++] = w.s[i] >= 0x20 && w.s[i] < 0x7f ? w.s[i] : '?';
  if (len > 24 && n + 5 < cap) buf[n++] = '.', buf[n++] = '.', buf[n++] = '.';
  buf[n++] = '\'';
  buf[n] = '\0';
}

// "NAME:LINE: error: ..." into err; returns false.
__attribute__((format(printf, 5, 6))) static bool line_error(char *err, size_t err_size,
                                                              const char *name, int64_t line,
                                                              const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fail(err, err_size, "%s:%lld: error: %s", name, (long long)line, msg);
}

// Word w as one length (`what`: "lq" or "lk"): a whole number in [0, GDPA_LENGTHS_MAX_LEN].
static bool parse_length(Word w, const char *what, const char *name, int64_t line, int64_t *v,
                         char *err, size_t err_size) {
  char shown[40];
  show_word(w, shown, sizeof shown);
  bool negative = *w.s == '-';
  const char *p = w.s + (negative ? 1 : 0);
  if (p == w.e)
    return line_error(err, err_size, name, line, "%s is not a whole number: %s", what, shown);
  int64_t x = 0;
  for (; p < w.e; p++) {
    if (*p < '0' || *p > '9')
      return line_error(err, err_size, name, line, "%s is not a whole number: %s", what, shown);
    if (x <= GDPA_LENGTHS_MAX_LEN) x = x * 10 + (*p - '0');  // past the cap it stays past it
  }
  if (negative && x > 0)
    return line_error(err, err_size, name, line, "%s is negative: %s", what, shown);
  if (x > GDPA_LENGTHS_MAX_LEN)
    return line_error(err, err_size, name, line, "%s %s is longer than %d, the longest a lengths "
                      "file may give", what, shown, GDPA_LENGTHS_MAX_LEN);
  *v = x;
  return true;
}

// One line's words (at most three kept) into pair (lq, lk); *got is false for a line without
// words (blank or a comment).
static bool parse_line(const Word *words, int nwords, const char *name, int64_t line,
                       int64_t *lq, int64_t *lk, bool *got, char *err, size_t err_size) {
  *got = false;
  if (nwords == 0) return true;
  if (nwords == 1) {
    char shown[40];
    show_word(words[0], shown, sizeof shown);
    return line_error(err, err_size, name, line, "expected two numbers 'lq lk', found only %s",
                      shown);
  }
  if (nwords > 2) {
    char shown[40];
    show_word(words[2], shown, sizeof shown);
    return line_error(err, err_size, name, line, "expected two numbers 'lq lk', found a third "
                      "word %s (comments start with '#')", shown);
  }
  if (!parse_length(words[0], "lq", name, line, lq, err, err_size) ||
      !parse_length(words[1], "lk", name, line, lk, err, err_size))
    return false;
  *got = true;
  return true;
}

bool gdpa_lengths_parse(const char *name, const char *text, size_t size, GdpaLengths *out,
                        char *err, size_t err_size) {
  GdpaLengths l = {0};
  int64_t cap = 0, sum_q = 0, sum_k = 0;
  const char *p = text, *end = text + size;
  bool ok = true;
  for (int64_t line = 1; ok; line++) {
    Word words[3];
    int nwords = 0;
    while (p < end && *p != '\n' && *p != '\r') {
      if (is_blank(*p)) {
        p++;
      } else if (*p == '#') {
        while (p < end && *p != '\n' && *p != '\r') p++;
      } else {
        const char *s = p;
        while (p < end && !ends_word(*p)) p++;
        if (nwords < 3) words[nwords++] = (Word){s, p};
      }
    }
    int64_t lq = 0, lk = 0;
    bool got = false;
    ok = parse_line(words, nwords, name, line, &lq, &lk, &got, err, err_size);
    if (ok && got) {
      if (l.n == GDPA_LENGTHS_MAX_EXAMPLES) {
        ok = line_error(err, err_size, name, line, "more than %d examples, the most a lengths "
                        "file may give", GDPA_LENGTHS_MAX_EXAMPLES);
      } else if ((sum_q += lq) > GDPA_LENGTHS_MAX_ROWS || (sum_k += lk) > GDPA_LENGTHS_MAX_ROWS) {
        ok = line_error(err, err_size, name, line, "the %s lengths add up to more than %d rows, "
                        "the most a batch may have", sum_q > GDPA_LENGTHS_MAX_ROWS ? "lq" : "lk",
                        GDPA_LENGTHS_MAX_ROWS);
      } else {
        if (l.n == cap) {
          cap = cap ? 2 * cap : 1024;
          l.lq = xrealloc(l.lq, (size_t)cap * sizeof *l.lq);
          l.lk = xrealloc(l.lk, (size_t)cap * sizeof *l.lk);
        }
        l.lq[l.n] = lq, l.lk[l.n] = lk, l.n++;
      }
    }
    if (p == end) break;
    if (*p == '\r' && p + 1 < end && p[1] == '\n') p++;  // CRLF is one line end
    p++;
  }
  if (ok && l.n == 0)
    ok = fail(err, err_size, "%s: error: no 'lq lk' pairs: the batch is empty", name);
  if (ok && gdpa_lengths_pairs(&l) == 0)
    ok = fail(err, err_size, "%s: error: no query-key pairs (lq * lk is 0 on every line): "
              "nothing to time", name);
  if (!ok) {
    gdpa_lengths_free(&l);
    return false;
  }
  *out = l;
  return true;
}

bool gdpa_lengths_read(const char *path, GdpaLengths *out, char *err, size_t err_size) {
  char *data = NULL, why[1024];
  size_t size = 0;
  if (!file_read_all(path, "lengths file", GDPA_LENGTHS_MAX_BYTES, &data, &size, why, sizeof why))
    return fail(err, err_size, "gemc: error: %s", why);
  bool ok = gdpa_lengths_parse(path, data, size, out, err, err_size);
  free(data);
  return ok;
}

void gdpa_lengths_free(GdpaLengths *l) {
  free(l->lq);
  free(l->lk);
  *l = (GdpaLengths){0};
}

double gdpa_lengths_pairs(const GdpaLengths *l) {
  double pairs = 0;
  for (int64_t b = 0; b < l->n; b++) pairs += (double)l->lq[b] * (double)l->lk[b];
  return pairs;
}

int64_t gdpa_lengths_max_q(const GdpaLengths *l) {
  int64_t m = 0;
  for (int64_t b = 0; b < l->n; b++) m = l->lq[b] > m ? l->lq[b] : m;
  return m;
}

int64_t gdpa_lengths_max_k(const GdpaLengths *l) {
  int64_t m = 0;
  for (int64_t b = 0; b < l->n; b++) m = l->lk[b] > m ? l->lk[b] : m;
  return m;
}

int64_t gdpa_lengths_sum_q(const GdpaLengths *l) {
  int64_t sum = 0;
  for (int64_t b = 0; b < l->n; b++) sum += l->lq[b];
  return sum;
}

bool gdpa_lengths_self(const GdpaLengths *l) {
  for (int64_t b = 0; b < l->n; b++)
    if (l->lq[b] != l->lk[b]) return false;
  return true;
}

// --- the benchmark's workloads ----------------------------------------------------------

static uint64_t xorshift64(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *state = x;
}

static int64_t uniform_length(uint64_t *state, int64_t lo, int64_t hi) {  // [lo, hi]
  return lo + (int64_t)(xorshift64(state) % (uint64_t)(hi - lo + 1));
}

// A standard normal sample (Box-Muller).
static double normal_sample(uint64_t *state) {
  double u1 = ((double)(xorshift64(state) >> 11) + 1.0) * 0x1p-53;  // (0, 1]
  double u2 = (double)(xorshift64(state) >> 11) * 0x1p-53;          // [0, 1)
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void gdpa_lengths_make(GdpaWorkload w, int64_t B, int64_t n, double s, int64_t k, uint64_t seed,
                       GdpaLengths *out) {
  uint64_t state = seed ^ 88172645463325252ull;
  if (state == 0) state = 88172645463325252ull;  // xorshift never leaves 0
  out->n = B > 0 ? B : 0;
  out->lq = xmalloc((size_t)out->n * sizeof *out->lq);
  out->lk = xmalloc((size_t)out->n * sizeof *out->lk);
  int64_t lo = (int64_t)((2 * s - 1) * (double)n);  // Meta's int((2s - 1) N)
  if (lo < 1) lo = 1;
  for (int64_t b = 0; b < out->n; b++) {
    int64_t lq = n >= lo ? uniform_length(&state, lo, n) : 0;
    switch (w) {
    case GDPA_META_SELF: out->lq[b] = lq, out->lk[b] = n; break;
    case GDPA_JAGGED_SELF: out->lq[b] = out->lk[b] = lq; break;
    case GDPA_CROSS: out->lq[b] = lq, out->lk[b] = k; break;
    case GDPA_PMA: {
      double x = round((double)n / 8.0 * exp(normal_sample(&state)));
      out->lq[b] = k;
      out->lk[b] = x < 1 ? 1 : x > (double)n ? n : (int64_t)x;
      break;
    }
    }
  }
}
