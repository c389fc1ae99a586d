// test_ir.c: the graph IR core: name tables, building, the text form (exact output and round
// trips), the reader's errors, every verifier rule (each broken alone), dead-code elimination,
// the pass driver, and speed on a 10,000-node chain.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena.h"
#include "diag.h"
#include "ir.h"
#include "passes.h"

// --- building helpers -------------------------------------------------------------------

static Loc at(int line, int column) { return (Loc){line, column, line, column}; }

static const Optim adamw = {OPTIM_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0};
static const Optim adagrad = {OPTIM_ROWWISE_ADAGRAD, 0.01, 0, 0, 1e-8, 0};

static void header(Ir *ir, Arena *a, const char *model) {
  ir_init(ir, a);
  ir->model = model;
  ir->source = "models/test.gem";
  ir->target = "sm_90a";
  ir->precision = DT_F32;
  ir->batch = 4;
  ir->dim = 8;
  ir->dense_optim = adamw;
}

static Tensor dense(int64_t width) {
  return (Tensor){.layout = LAYOUT_DENSE, .jag = -1, .width = width, .dtype = DT_F32};
}
static Tensor jagged(int jag, int64_t width) {
  return (Tensor){.layout = LAYOUT_JAGGED, .jag = jag, .width = width, .dtype = DT_F32};
}
static Tensor set(int64_t k, int64_t width) {
  return (Tensor){.layout = LAYOUT_SET, .jag = -1, .set_k = k, .width = width, .dtype = DT_F32};
}
static Tensor scalar(void) {
  return (Tensor){.layout = LAYOUT_SCALAR, .jag = -1, .dtype = DT_F32};
}
static Tensor with_dtype(Tensor t, DType d) {
  t.dtype = d;
  return t;
}

static int declare(Ir *ir, TensorKind kind, const char *name, Tensor t, Loc loc) {
  t.name = name;
  t.kind = kind;
  t.producer = -1;
  t.loc = loc;
  return ir_add_tensor(ir, &t);
}

static int input(Ir *ir, const char *name, Tensor t) {
  return declare(ir, TENSOR_INPUT, name, t, (Loc){0});
}
static int ids(Ir *ir, const char *name, int jag) {
  Tensor t = jag < 0 ? dense(0) : jagged(jag, 0);
  return declare(ir, TENSOR_INPUT, name, with_dtype(t, DT_I64), (Loc){0});
}
static int label(Ir *ir, const char *name) {
  return declare(ir, TENSOR_LABEL, name, dense(0), (Loc){0});
}
static int table(Ir *ir, const char *name, int64_t rows, int64_t dim) {
  Tensor t = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = 2, .fixed = {rows, dim},
              .dtype = DT_F32, .optim = adagrad};
  return declare(ir, TENSOR_TABLE, name, t, (Loc){0});
}
static int param(Ir *ir, const char *name, int64_t d0, int64_t d1) {
  Tensor t = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = d1 ? 2 : 1, .fixed = {d0, d1},
              .dtype = DT_F32};
  return declare(ir, TENSOR_PARAM, name, t, (Loc){0});
}

// A node with defaults that verify: prec fp32; attention self/softmax with 1 head; weights 1.
static Node op(OpKind kind, int nins, ...) {
  Node n = {.op = kind, .nins = nins, .prec = DT_F32};
  va_list ap;
  va_start(ap, nins);
  for (int i = 0; i < nins; i++) n.ins[i] = va_arg(ap, int);
  va_end(ap);
  if (kind == OP_ATTENTION) {
    n.heads = 1;
    n.act = ACT_SOFTMAX;
    n.scale = 1;
  }
  if (kind == OP_LOSS_SUM)
    for (int i = 0; i < nins; i++) n.weights[i] = 1;
  if (kind == OP_RMSNORM) n.eps = 1e-6;
  if (kind == OP_LAYERNORM) n.eps = 1e-5;
  return n;
}

// Adds the value `name` of type `t` and the node that writes it; returns the value's index.
static int emit(Ir *ir, const char *name, Tensor t, Node n) {
  n.out = declare(ir, TENSOR_VALUE, name, t, n.loc);
  ir_add_node(ir, &n);
  return n.out;
}

static int idx(const Ir *ir, const char *name) {
  int i = ir_find_tensor(ir, name);
  assert_true(i >= 0);
  return i;
}
static Tensor *tensor(Ir *ir, const char *name) { return &ir->tensors[idx(ir, name)]; }
static Node *node(Ir *ir, const char *value) {
  return &ir->nodes[ir->tensors[idx(ir, value)].producer];
}

static char *print_text(const Ir *ir) {
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  assert_non_null(f);
  ir_print(f, ir);
  fclose(f);
  return text;
}

// Reads `text` into `out`; the diagnostics, if any, go to *errors (caller frees).
static bool read_text(const char *text, Arena *a, Ir *out, char **errors) {
  SourceFile f;
  source_from_memory(&f, "test.ir", text, strlen(text));
  size_t size = 0;
  char *buf = NULL;
  FILE *err = open_memstream(&buf, &size);
  assert_non_null(err);
  Diag d;
  diag_init(&d, &f, err);
  bool ok = ir_read(&f, a, &d, out);
  fclose(err);
  assert_true(ok == (d.errors == 0));
  if (errors)
    *errors = buf;
  else
    free(buf);
  return ok;
}

static void assert_verifies(const Ir *ir) {
  char err[1024];
  bool ok = ir_verify(ir, err, sizeof err);
  if (!ok) fprintf(stderr, "verify: %s\n", err);
  assert_true(ok);
}

// print(read(print(ir))) == print(ir), and the IR read back verifies too.
static void assert_round_trip(const Ir *ir) {
  char *first = print_text(ir);
  Arena a = {0};
  Ir back;
  char *errors = NULL;
  bool ok = read_text(first, &a, &back, &errors);
  if (!ok) fprintf(stderr, "%s\n%s", first, errors);
  assert_true(ok);
  char *second = print_text(&back);
  assert_string_equal(first, second);
  assert_verifies(&back);
  assert_int_equal(back.ntensors, ir->ntensors);
  assert_int_equal(back.nnodes, ir->nnodes);
  free(first);
  free(second);
  free(errors);
  arena_free(&a);
}

static void assert_has_line(const Ir *ir, const char *line) {
  char *text = print_text(ir);
  char *want = malloc(strlen(line) + 3);
  sprintf(want, "\n%s\n", line);
  if (!strstr(text, want)) fprintf(stderr, "missing line:\n%s\nin:\n%s", line, text);
  assert_non_null(strstr(text, want));
  free(want);
  free(text);
}

// --- the model with every op ------------------------------------------------------------
// Two sequences (*hist, *cand), a sparse id, dense features and a label; every op and every
// attention shape once, a precision override and schedule hints.

static void build_full(Ir *ir, Arena *a) {
  header(ir, a, "full");
  int hist_dim = ir_add_jagged(ir, "hist", 16, at(3, 3));
  int cand_dim = ir_add_jagged(ir, "cand", 8, at(4, 3));
  int hist = ids(ir, "hist", hist_dim);
  int cand = ids(ir, "cand", cand_dim);
  int ad = ids(ir, "ad", -1);
  int c = input(ir, "c", dense(3));
  int click = label(ir, "click");
  int items = table(ir, "items", 50, 8);

  int h = emit(ir, "h", jagged(hist_dim, 8), op(OP_EMBED, 2, items, hist));
  int av = emit(ir, "a", dense(8), op(OP_EMBED, 2, items, ad));
  Node pool = op(OP_EMBED_POOL, 2, items, cand);
  pool.pool = POOL_MEAN;
  int t = emit(ir, "t", dense(8), pool);
  Node lin = op(OP_LINEAR, 3, c, param(ir, "u.w", 3, 8), param(ir, "u.b", 8, 0));
  lin.act = ACT_RELU;
  int u = emit(ir, "u", dense(8), lin);
  int hn = emit(ir, "h.1.rmsnorm0", jagged(hist_dim, 8),
                op(OP_RMSNORM, 2, h, param(ir, "h.1.rmsnorm0.gain", 8, 0)));
  int q = emit(ir, "h.1.gdpa0.q", jagged(hist_dim, 8),
               op(OP_LINEAR, 2, hn, param(ir, "h.1.gdpa0.wq", 8, 8)));
  int k = emit(ir, "h.1.gdpa0.k", jagged(hist_dim, 8),
               op(OP_LINEAR, 2, hn, param(ir, "h.1.gdpa0.wk", 8, 8)));
  int v = emit(ir, "h.1.gdpa0.v", jagged(hist_dim, 8),
               op(OP_LINEAR, 2, hn, param(ir, "h.1.gdpa0.wv", 8, 8)));
  Node self = op(OP_ATTENTION, 3, q, k, v);
  self.heads = 2;
  self.act = ACT_SILU;
  self.mask = MASK_CAUSAL;
  self.window = 4;
  self.scale = 0.5;
  self.sched.tile_q = 64;
  self.sched.zigzag = 1;
  int o = emit(ir, "h.1.gdpa0", jagged(hist_dim, 8), self);
  int h1 = emit(ir, "h.1", jagged(hist_dim, 8), op(OP_ADD, 2, h, o));
  int kv = emit(ir, "kv", set(3, 8), op(OP_STACK, 3, av, t, u));
  Node cross = op(OP_ATTENTION, 3, h1, kv, kv);
  cross.shape = ATTN_CROSS;
  cross.heads = 2;
  cross.act = ACT_GELU;
  cross.sched.gelu_taylor = 1;
  int x = emit(ir, "x", jagged(hist_dim, 8), cross);
  int ce = emit(ir, "ce", jagged(cand_dim, 8), op(OP_EMBED, 2, items, cand));
  Node cross2 = op(OP_ATTENTION, 3, x, ce, ce);
  cross2.shape = ATTN_CROSS;
  cross2.hstu_norm = true;
  int x2 = emit(ir, "x2", jagged(hist_dim, 8), cross2);
  Node pma = op(OP_ATTENTION, 3, param(ir, "p.seeds", 2, 8), x2, x2);
  pma.shape = ATTN_PMA;
  pma.heads = 4;
  int p = emit(ir, "p", set(2, 8), pma);
  Node pffn = op(OP_ATTENTION, 3, av, x2, x2);
  pffn.shape = ATTN_PFFN;
  pffn.act = ACT_RELU;
  int f = emit(ir, "f", dense(8), pffn);
  int ln = emit(ir, "ln", dense(8),
                op(OP_LAYERNORM, 3, f, param(ir, "ln.gain", 8, 0), param(ir, "ln.bias", 8, 0)));
  Node sig = op(OP_ACT, 1, ln);
  sig.act = ACT_SIGMOID;
  int s = emit(ir, "s", dense(8), sig);
  int m = emit(ir, "m", dense(8), op(OP_MUL, 2, s, av));
  int d = emit(ir, "d", dense(8), op(OP_SUB, 2, m, t));
  int di = emit(ir, "di", dense(3), op(OP_DOT_INTERACT, 3, av, t, d));
  int fl = emit(ir, "fl", dense(16), op(OP_FLATTEN, 1, p));
  int z = emit(ir, "z", dense(27), op(OP_CONCAT, 3, fl, di, f));
  Node out = op(OP_LINEAR, 2, z, param(ir, "y.w", 27, 1));
  out.prec = DT_MXFP8;
  out.sched.tile_m = 64;
  out.sched.stages = 2;
  int y = emit(ir, "y", with_dtype(dense(1), DT_BF16), out);
  Node bce = op(OP_BCE, 2, y, click);
  bce.task = "ctr \"main\"";
  int b = emit(ir, "loss.bce0", scalar(), bce);
  ir->loss = emit(ir, "loss", scalar(), op(OP_LOSS_SUM, 1, b));
}

// The parallel block and a table's placement print on the header and table lines and read
// back; a malformed one is refused where it is.
static void test_ir_parallel_settings_round_trip(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_full(&ir, &a);
  ir.parallel = (Parallel){.dense = SHARD_DENSE_ZERO1, .bucket_mb = 8,
                           .tables = SHARD_TABLE_AUTO};
  ir.tensors[ir_find_tensor(&ir, "items")].shard = SHARD_TABLE_ROW;
  assert_round_trip(&ir);
  char *text = print_text(&ir);
  assert_non_null(strstr(text, "\nparallel dense=zero1 bucket_mb=8 tables=auto\n"));
  assert_non_null(strstr(text, "eps=1e-08 shard=row"));
  const char *bad[] = {"parallel dense=zero4", "parallel bucket_mb=0", "parallel size=3",
                       "parallel", "parallel tables=row tables=row"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *t = strdup(text), *line = strstr(t, "parallel dense=zero1 bucket_mb=8 tables=auto");
    size_t n = strlen("parallel dense=zero1 bucket_mb=8 tables=auto");
    char *fixed = malloc(strlen(t) + 64);
    snprintf(fixed, strlen(t) + 64, "%.*s%s%s", (int)(line - t), t, bad[i], line + n);
    Arena b = {0};
    Ir back;
    char *errors = NULL;
    assert_false(read_text(fixed, &b, &back, &errors));
    assert_non_null(errors);
    assert_non_null(strstr(errors, "error:"));
    free(errors);
    arena_free(&b);
    free(fixed);
    free(t);
  }
  free(text);
  arena_free(&a);
}

static void test_ir_full_model_verifies_and_round_trips(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_full(&ir, &a);
  assert_int_equal(ir.nnodes, 26);
  assert_verifies(&ir);
  assert_round_trip(&ir);
  assert_has_line(&ir, "%h.1.gdpa0 : fp32 jagged[B, *hist, 8] = attention %h.1.gdpa0.q, "
                       "%h.1.gdpa0.k, %h.1.gdpa0.v {shape=self, heads=2, act=silu, mask=causal, "
                       "window=4, scale=0.5, hstu_norm=false, prec=fp32, tile_q=64, zigzag=on}");
  assert_has_line(&ir, "%y : bf16 dense[B, 1] = linear %z, @y.w {act=none, prec=mxfp8, "
                       "tile_m=64, stages=2}");
  assert_has_line(&ir, "%loss.bce0 : fp32 scalar[] = bce %y, %click {task=\"ctr \\\"main\\\"\"}");
  arena_free(&a);
}

// --- exact text ---------------------------------------------------------------------------
// The small model of docs/ir.md, "Text form"; the text there is this test's expectation.

static void build_tiny(Ir *ir, Arena *a) {
  ir_init(ir, a);
  ir->model = "tiny";
  ir->source = "tiny.gem";
  ir->target = "sm_90a";
  ir->precision = DT_BF16;
  ir->batch = 64;
  ir->dim = 32;
  ir->dense_optim = adamw;
  int hd = ir_add_jagged(ir, "history", 50, at(8, 3));
  int hist = declare(ir, TENSOR_INPUT, "history", with_dtype(jagged(hd, 0), DT_I64), at(8, 3));
  int click = declare(ir, TENSOR_LABEL, "click", dense(0), at(9, 3));
  Tensor tt = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = 2, .fixed = {1000, 32},
               .dtype = DT_BF16, .optim = {OPTIM_ROWWISE_ADAGRAD, 0.05, 0, 0, 1e-8, 0}};
  int items = declare(ir, TENSOR_TABLE, "items", tt, at(10, 3));

  Node e = op(OP_EMBED, 2, items, hist);
  e.prec = DT_BF16;
  e.loc = at(12, 7);
  int h = emit(ir, "h", with_dtype(jagged(hd, 32), DT_BF16), e);
  Tensor seeds = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = 2, .fixed = {1, 32},
                  .dtype = DT_F32};
  int s = declare(ir, TENSOR_PARAM, "p.pma0.seeds", seeds, at(13, 7));
  Tensor wk = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = 2, .fixed = {32, 32},
               .dtype = DT_F32};
  int k = declare(ir, TENSOR_PARAM, "p.pma0.wk", wk, at(13, 7));
  Node kl = op(OP_LINEAR, 2, h, k);
  kl.prec = DT_MXFP8;
  kl.loc = at(13, 7);
  int kv = emit(ir, "p.pma0.k", with_dtype(jagged(hd, 32), DT_BF16), kl);
  Node pma = op(OP_ATTENTION, 3, s, kv, kv);
  pma.shape = ATTN_PMA;
  pma.heads = 2;
  pma.act = ACT_SILU;
  pma.scale = 0.25;
  pma.prec = DT_BF16;
  pma.loc = at(13, 7);
  int p = emit(ir, "p", with_dtype(set(1, 32), DT_BF16), pma);
  Node fl = op(OP_FLATTEN, 1, p);
  fl.prec = DT_BF16;
  fl.loc = at(14, 11);
  int z = emit(ir, "y.flatten0", with_dtype(dense(32), DT_BF16), fl);
  Tensor wy = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = 2, .fixed = {32, 1},
               .dtype = DT_F32};
  Node yl = op(OP_LINEAR, 2, z, declare(ir, TENSOR_PARAM, "y.linear0.w", wy, at(14, 7)));
  yl.prec = DT_BF16;
  yl.loc = at(14, 7);
  int y = emit(ir, "y", with_dtype(dense(1), DT_BF16), yl);
  Node b = op(OP_BCE, 2, y, click);
  b.task = "click";
  b.loc = at(15, 8);
  int bce = emit(ir, "loss.bce0", scalar(), b);
  Node sum = op(OP_LOSS_SUM, 1, bce);
  sum.loc = at(15, 3);
  ir->loss = emit(ir, "loss", scalar(), sum);
}

static const char tiny_text[] =
    "; gemc ir\n"
    "model tiny\n"
    "source \"tiny.gem\"\n"
    "target sm_90a\n"
    "precision bf16\n"
    "batch 64\n"
    "dim 32\n"
    "optim adamw lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0\n"
    "\n"
    "; B = 64; for each jagged dim *s: T_s = sum of lengths, L_s = max length\n"
    "jagged *history L_history=50                                      ; tiny.gem:8:3\n"
    "\n"
    "input %history : i64 jagged[B, *history]                          ; tiny.gem:8:3\n"
    "label %click : fp32 dense[B]                                      ; tiny.gem:9:3\n"
    "table @items : bf16 fixed[1000, 32] rowwise_adagrad lr=0.05 eps=1e-08  ; tiny.gem:10:3\n"
    "param @p.pma0.seeds : fp32 fixed[1, 32]                           ; tiny.gem:13:7\n"
    "param @p.pma0.wk : fp32 fixed[32, 32]                             ; tiny.gem:13:7\n"
    "param @y.linear0.w : fp32 fixed[32, 1]                            ; tiny.gem:14:7\n"
    "\n"
    "%h : bf16 jagged[B, *history, 32] = embed @items, %history {prec=bf16}  ; tiny.gem:12:7\n"
    "%p.pma0.k : bf16 jagged[B, *history, 32] = linear %h, @p.pma0.wk {act=none, prec=mxfp8}  ; tiny.gem:13:7\n"
    "%p : bf16 set[B, 1, 32] = attention @p.pma0.seeds, %p.pma0.k, %p.pma0.k {shape=pma, heads=2, act=silu, mask=none, window=0, scale=0.25, hstu_norm=false, prec=bf16}  ; tiny.gem:13:7\n"
    "%y.flatten0 : bf16 dense[B, 32] = flatten %p {prec=bf16}          ; tiny.gem:14:11\n"
    "%y : bf16 dense[B, 1] = linear %y.flatten0, @y.linear0.w {act=none, prec=bf16}  ; tiny.gem:14:7\n"
    "%loss.bce0 : fp32 scalar[] = bce %y, %click {task=\"click\"}        ; tiny.gem:15:8\n"
    "%loss : fp32 scalar[] = loss_sum %loss.bce0 {weights=[1]}         ; tiny.gem:15:3\n"
    "\n"
    "loss %loss\n";

static void test_ir_print_exact_text(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_tiny(&ir, &a);
  assert_verifies(&ir);
  char *text = print_text(&ir);
  if (strcmp(text, tiny_text) != 0) fprintf(stderr, "%s", text);
  assert_string_equal(text, tiny_text);
  free(text);
  // Printing twice gives the same bytes.
  char *again = print_text(&ir);
  assert_string_equal(again, tiny_text);
  free(again);
  arena_free(&a);
}

static void test_ir_read_exact_text_and_locations(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  assert_true(read_text(tiny_text, &a, &ir, NULL));
  assert_verifies(&ir);
  assert_string_equal(ir.model, "tiny");
  assert_string_equal(ir.source, "tiny.gem");
  assert_int_equal(ir.batch, 64);
  assert_int_equal(ir.precision, DT_BF16);
  assert_int_equal(ir.njagged, 1);
  assert_int_equal(ir.jagged[0].max_len, 50);
  int p = ir_find_tensor(&ir, "p");
  assert_true(p >= 0);
  const Node *n = &ir.nodes[ir.tensors[p].producer];
  assert_int_equal(n->op, OP_ATTENTION);
  assert_int_equal(n->shape, ATTN_PMA);
  assert_int_equal(n->heads, 2);
  assert_true(n->scale == 0.25);
  assert_int_equal(n->loc.first_line, 13);
  assert_int_equal(n->loc.first_column, 7);
  assert_int_equal(ir.tensors[ir.loss].kind, TENSOR_VALUE);
  assert_int_equal(ir.tensors[ir_find_tensor(&ir, "items")].optim.kind, OPTIM_ROWWISE_ADAGRAD);
  assert_true(ir.tensors[ir_find_tensor(&ir, "items")].optim.lr == 0.05);
  char *text = print_text(&ir);
  assert_string_equal(text, tiny_text);
  free(text);
  arena_free(&a);
}

// --- name tables ----------------------------------------------------------------------------

static void test_ir_name_tables(void **state) {
  (void)state;
  for (int o = 0; o < OP_COUNT; o++) {
    OpKind back;
    assert_true(op_from_name(op_name((OpKind)o), &back));
    assert_int_equal(back, o);
    bool matmul = o == OP_LINEAR || o == OP_DOT_INTERACT || o == OP_ATTENTION ||
                  o == OP_LINEAR_ACT_BWD || o == OP_LINEAR_BWD_X || o == OP_LINEAR_BWD_W ||
                  o == OP_DOT_INTERACT_BWD || o == OP_ATTENTION_BWD_Q ||
                  o == OP_ATTENTION_BWD_K || o == OP_ATTENTION_BWD_V;
    assert_int_equal(op_has_matmul((OpKind)o), matmul);
    assert_int_equal(op_is_backward((OpKind)o), o >= OP_SLICE);
  }
  assert_string_equal(op_name(OP_DOT_INTERACT), "dot_interact");
  assert_string_equal(op_name(OP_COUNT), "?");
  assert_false(op_has_matmul(OP_COUNT));
  for (int t = 0; t < DT_COUNT; t++) {
    DType back;
    assert_true(dtype_from_name(dtype_name((DType)t), &back));
    assert_int_equal(back, t);
  }
  DType dt = DT_I64;
  assert_true(dtype_from_name("f32", &dt));
  assert_int_equal(dt, DT_F32);
  assert_false(dtype_from_name("fp33", &dt));
  assert_false(dtype_from_name(NULL, &dt));
  for (int x = 0; x < ACT_COUNT; x++) {
    Act back;
    assert_true(act_from_name(act_name((Act)x), &back));
    assert_int_equal(back, x);
  }
  Act act;
  assert_false(act_from_name("swish", &act));
  assert_string_equal(act_name(ACT_GELU_TAYLOR), "gelu_taylor");
  assert_string_equal(mask_name(MASK_CAUSAL), "causal");
  assert_string_equal(attn_shape_name(ATTN_PFFN), "pffn");
  assert_string_equal(layout_name(LAYOUT_JAGGED), "jagged");
  assert_string_equal(optim_name(OPTIM_ROWWISE_ADAGRAD), "rowwise_adagrad");
  assert_string_equal(pool_name(POOL_MEAN), "mean");
  assert_string_equal(dtype_name((DType)99), "?");
  OptimKind ok;
  assert_true(optim_from_name("sgd", &ok));
  assert_int_equal(ok, OPTIM_SGD);
  assert_true(op_has_attr(OP_ATTENTION, ATTR_WINDOW));
  assert_false(op_has_attr(OP_LINEAR, ATTR_WINDOW));
  assert_true(op_has_attr(OP_BCE, ATTR_TASK));
  assert_false(op_has_attr(OP_BCE, ATTR_PREC));
}

static void test_ir_find_tensor_uses_the_index(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  header(&ir, &a, "m");
  char name[32];
  for (int i = 0; i < 20000; i++) {
    snprintf(name, sizeof name, "t%d", i);
    assert_int_equal(input(&ir, name, dense(1)), i);
  }
  for (int i = 0; i < 20000; i += 997) {
    snprintf(name, sizeof name, "t%d", i);
    assert_int_equal(ir_find_tensor(&ir, name), i);
  }
  assert_int_equal(ir_find_tensor(&ir, "t20000"), -1);
  assert_int_equal(ir_find_tensor(&ir, NULL), -1);
  // A tensor appended by hand is still found; a renamed one after ir_reindex.
  Tensor extra = dense(1);
  extra.name = "extra";
  assert_true(ir.ntensors < ir.cap_tensors);
  ir.tensors[ir.ntensors++] = extra;
  assert_int_equal(ir_find_tensor(&ir, "extra"), 20000);
  ir.tensors[0].name = "renamed";
  ir_reindex(&ir);
  assert_int_equal(ir_find_tensor(&ir, "renamed"), 0);
  assert_int_equal(ir_find_tensor(&ir, "t0"), -1);
  assert_int_equal(ir_find_tensor(&ir, "t19999"), 19999);
  arena_free(&a);
}

// --- one IR per op and per attention shape ---------------------------------------------------
// The base: sequences *s and *t, ids, dense and jagged features, a label and a table.

typedef struct Base {
  Arena arena;
  Ir ir;
  int s_dim, t_dim;
  int s, t, ad, x, xs, xt, y, emb;
} Base;

static void base(Base *b) {
  memset(b, 0, sizeof *b);
  Ir *ir = &b->ir;
  header(ir, &b->arena, "one_op");
  b->s_dim = ir_add_jagged(ir, "s", 16, (Loc){0});
  b->t_dim = ir_add_jagged(ir, "t", 8, (Loc){0});
  b->s = ids(ir, "s", b->s_dim);
  b->t = ids(ir, "t", b->t_dim);
  b->ad = ids(ir, "ad", -1);
  b->x = input(ir, "x", dense(8));
  b->xs = input(ir, "xs", jagged(b->s_dim, 8));
  b->xt = input(ir, "xt", jagged(b->t_dim, 8));
  b->y = label(ir, "y");
  b->emb = table(ir, "emb", 50, 8);
}

// Verifies, checks the printed line of the last node, and round-trips.
static void check_one(Base *b, const char *line) {
  assert_verifies(&b->ir);
  assert_has_line(&b->ir, line);
  assert_round_trip(&b->ir);
  arena_free(&b->arena);
}

static void test_ir_op_embed(void **state) {
  (void)state;
  Base b;
  base(&b);
  emit(&b.ir, "e0", dense(8), op(OP_EMBED, 2, b.emb, b.ad));
  emit(&b.ir, "e1", jagged(b.s_dim, 8), op(OP_EMBED, 2, b.emb, b.s));
  check_one(&b, "%e1 : fp32 jagged[B, *s, 8] = embed @emb, %s {prec=fp32}");
}

static void test_ir_op_embed_pool(void **state) {
  (void)state;
  Base b;
  base(&b);
  emit(&b.ir, "e", dense(8), op(OP_EMBED_POOL, 2, b.emb, b.t));
  check_one(&b, "%e : fp32 dense[B, 8] = embed_pool @emb, %t {pool=sum, prec=fp32}");
}

static void test_ir_op_linear(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_LINEAR, 3, b.xs, param(&b.ir, "w", 8, 4), param(&b.ir, "b", 4, 0));
  n.act = ACT_GELU;
  n.prec = DT_FP8;
  n.sched = (Schedule){.tile_m = 128, .tile_n = 64, .tile_k = 32, .stages = 3, .gelu_taylor = 2};
  emit(&b.ir, "l", with_dtype(jagged(b.s_dim, 4), DT_BF16), n);
  check_one(&b, "%l : bf16 jagged[B, *s, 4] = linear %xs, @w, @b {act=gelu, prec=fp8, "
                "tile_m=128, tile_n=64, tile_k=32, stages=3, gelu=exact}");
}

static void test_ir_op_rmsnorm(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_RMSNORM, 2, b.x, param(&b.ir, "g", 8, 0));
  n.prec = DT_FP16;
  emit(&b.ir, "r", with_dtype(dense(8), DT_FP16), n);
  check_one(&b, "%r : fp16 dense[B, 8] = rmsnorm %x, @g {eps=1e-06, prec=fp16}");
}

static void test_ir_op_layernorm(void **state) {
  (void)state;
  Base b;
  base(&b);
  emit(&b.ir, "n", jagged(b.t_dim, 8),
       op(OP_LAYERNORM, 3, b.xt, param(&b.ir, "g", 8, 0), param(&b.ir, "bias", 8, 0)));
  check_one(&b, "%n : fp32 jagged[B, *t, 8] = layernorm %xt, @g, @bias {eps=1e-05, prec=fp32}");
}

static void test_ir_op_act(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_ACT, 1, b.x);
  n.act = ACT_GELU;
  n.sched.gelu_taylor = 1;
  emit(&b.ir, "g", dense(8), n);
  check_one(&b, "%g : fp32 dense[B, 8] = act %x {act=gelu, prec=fp32, gelu=taylor}");
}

static void test_ir_op_add_sub_mul(void **state) {
  (void)state;
  Base b;
  base(&b);
  int sum = emit(&b.ir, "sum", jagged(b.s_dim, 8), op(OP_ADD, 2, b.xs, b.xs));
  int dif = emit(&b.ir, "dif", jagged(b.s_dim, 8), op(OP_SUB, 2, sum, b.xs));
  emit(&b.ir, "prod", jagged(b.s_dim, 8), op(OP_MUL, 2, dif, sum));
  assert_has_line(&b.ir, "%sum : fp32 jagged[B, *s, 8] = add %xs, %xs {prec=fp32}");
  assert_has_line(&b.ir, "%dif : fp32 jagged[B, *s, 8] = sub %sum, %xs {prec=fp32}");
  check_one(&b, "%prod : fp32 jagged[B, *s, 8] = mul %dif, %sum {prec=fp32}");
}

static void test_ir_op_concat(void **state) {
  (void)state;
  Base b;
  base(&b);
  int e = emit(&b.ir, "e", jagged(b.s_dim, 8), op(OP_EMBED, 2, b.emb, b.s));
  emit(&b.ir, "c", jagged(b.s_dim, 16), op(OP_CONCAT, 2, e, b.xs));
  check_one(&b, "%c : fp32 jagged[B, *s, 16] = concat %e, %xs {prec=fp32}");
}

static void test_ir_op_stack_and_flatten(void **state) {
  (void)state;
  Base b;
  base(&b);
  int s = emit(&b.ir, "st", set(2, 8), op(OP_STACK, 2, b.x, b.x));
  emit(&b.ir, "f", dense(16), op(OP_FLATTEN, 1, s));
  assert_has_line(&b.ir, "%st : fp32 set[B, 2, 8] = stack %x, %x {prec=fp32}");
  check_one(&b, "%f : fp32 dense[B, 16] = flatten %st {prec=fp32}");
}

static void test_ir_op_dot_interact(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_DOT_INTERACT, 4, b.x, b.x, b.x, b.x);
  n.prec = DT_MXFP8;
  n.sched.tile_n = 16;
  emit(&b.ir, "di", with_dtype(dense(6), DT_BF16), n);
  check_one(&b, "%di : bf16 dense[B, 6] = dot_interact %x, %x, %x, %x {prec=mxfp8, tile_n=16}");
}

static void test_ir_op_bce_and_loss_sum(void **state) {
  (void)state;
  Base b;
  base(&b);
  int logit = emit(&b.ir, "logit", dense(1), op(OP_LINEAR, 2, b.x, param(&b.ir, "w", 8, 1)));
  Node l0 = op(OP_BCE, 2, logit, b.y);
  l0.task = "ctr";
  Node l1 = op(OP_BCE, 2, logit, b.y);
  l1.task = NULL;  // prints as ""
  int t0 = emit(&b.ir, "l0", scalar(), l0);
  int t1 = emit(&b.ir, "l1", scalar(), l1);
  Node sum = op(OP_LOSS_SUM, 2, t0, t1);
  sum.weights[0] = 1.0;
  sum.weights[1] = 0.1;
  b.ir.loss = emit(&b.ir, "loss", scalar(), sum);
  assert_has_line(&b.ir, "%l0 : fp32 scalar[] = bce %logit, %y {task=\"ctr\"}");
  assert_has_line(&b.ir, "%l1 : fp32 scalar[] = bce %logit, %y {task=\"\"}");
  assert_has_line(&b.ir, "loss %loss");
  check_one(&b, "%loss : fp32 scalar[] = loss_sum %l0, %l1 {weights=[1, 0.1]}");
}

static void test_ir_attention_self(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_ATTENTION, 3, b.xs, b.xs, b.xs);
  n.heads = 4;
  n.mask = MASK_CAUSAL;
  n.window = 3;
  n.sched = (Schedule){.tile_q = 128, .tile_kv = 32, .stages = 2, .zigzag = 2};
  emit(&b.ir, "o", jagged(b.s_dim, 8), n);
  check_one(&b, "%o : fp32 jagged[B, *s, 8] = attention %xs, %xs, %xs {shape=self, heads=4, "
                "act=softmax, mask=causal, window=3, scale=1, hstu_norm=false, prec=fp32, "
                "tile_q=128, tile_kv=32, stages=2, zigzag=off}");
}

static void test_ir_attention_cross(void **state) {
  (void)state;
  Base b;
  base(&b);
  int st = emit(&b.ir, "st", set(3, 8), op(OP_STACK, 3, b.x, b.x, b.x));
  Node n = op(OP_ATTENTION, 3, b.xs, st, st);
  n.shape = ATTN_CROSS;
  n.act = ACT_GELU_TAYLOR;
  emit(&b.ir, "c0", jagged(b.s_dim, 8), n);
  Node m = op(OP_ATTENTION, 3, b.xs, b.xt, b.xt);
  m.shape = ATTN_CROSS;
  m.heads = 8;
  m.scale = 0.125;
  emit(&b.ir, "c1", jagged(b.s_dim, 8), m);
  assert_has_line(&b.ir, "%c0 : fp32 jagged[B, *s, 8] = attention %xs, %st, %st {shape=cross, "
                         "heads=1, act=gelu_taylor, mask=none, window=0, scale=1, "
                         "hstu_norm=false, prec=fp32}");
  check_one(&b, "%c1 : fp32 jagged[B, *s, 8] = attention %xs, %xt, %xt {shape=cross, heads=8, "
                "act=softmax, mask=none, window=0, scale=0.125, hstu_norm=false, prec=fp32}");
}

static void test_ir_attention_pma(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_ATTENTION, 3, param(&b.ir, "seeds", 5, 8), b.xt, b.xt);
  n.shape = ATTN_PMA;
  n.heads = 2;
  n.hstu_norm = true;
  emit(&b.ir, "p", set(5, 8), n);
  check_one(&b, "%p : fp32 set[B, 5, 8] = attention @seeds, %xt, %xt {shape=pma, heads=2, "
                "act=softmax, mask=none, window=0, scale=1, hstu_norm=true, prec=fp32}");
}

static void test_ir_attention_pffn(void **state) {
  (void)state;
  Base b;
  base(&b);
  Node n = op(OP_ATTENTION, 3, b.x, b.xs, b.xs);
  n.shape = ATTN_PFFN;
  n.act = ACT_SIGMOID;
  emit(&b.ir, "f0", dense(8), n);
  int st = emit(&b.ir, "st", set(2, 8), op(OP_STACK, 2, b.x, b.x));
  Node m = op(OP_ATTENTION, 3, st, b.xt, b.xt);
  m.shape = ATTN_PFFN;
  emit(&b.ir, "f1", set(2, 8), m);
  assert_has_line(&b.ir, "%f0 : fp32 dense[B, 8] = attention %x, %xs, %xs {shape=pffn, heads=1, "
                         "act=sigmoid, mask=none, window=0, scale=1, hstu_norm=false, prec=fp32}");
  check_one(&b, "%f1 : fp32 set[B, 2, 8] = attention %st, %xt, %xt {shape=pffn, heads=1, "
                "act=softmax, mask=none, window=0, scale=1, hstu_norm=false, prec=fp32}");
}

// --- round trips of awkward values -----------------------------------------------------------

static void test_ir_round_trip_reals_strings_and_params(void **state) {
  (void)state;
  Base b;
  base(&b);
  Ir *ir = &b.ir;
  ir->source = "dir with space/a;b\"c\\d\te\x01.gem";
  ir->dense_optim = (Optim){OPTIM_SGD, 0.1, 0, 0, 0, 0};
  const double reals[] = {0.1, 1.0 / 3, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.125,
                          2.5e-7, 100, 0, -0.0, 4e6, 1e20, 0.015625};
  int g = param(ir, "g", 8, 0);
  ir->tensors[g].optim = (Optim){OPTIM_ADAMW, 3e-4, 0.8, 0.95, 1e-6, 0.01};  // its own
  int g2 = param(ir, "g2", 8, 0);
  ir->tensors[g2].optim = ir->dense_optim;  // the model's: printed without an optimizer
  char name[16];
  int prev = b.x;
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
    Node n = op(OP_RMSNORM, 2, prev, i % 2 ? g : g2);
    n.eps = reals[i];
    n.loc = at((int)i + 1, 2);
    snprintf(name, sizeof name, "r%zu", i);
    prev = emit(ir, name, dense(8), n);
  }
  Node bce_logit = op(OP_LINEAR, 2, prev, param(ir, "w", 8, 1));
  int logit = emit(ir, "logit", dense(1), bce_logit);
  Node bce = op(OP_BCE, 2, logit, b.y);
  bce.task = "t;\"\\\n\t\x7f ü";
  ir->loss = emit(ir, "bce", scalar(), bce);
  assert_verifies(ir);
  assert_has_line(ir, "param @g : fp32 fixed[8] adamw lr=0.0003 beta1=0.8 beta2=0.95 "
                      "eps=1e-06 weight_decay=0.01");
  assert_has_line(ir, "param @g2 : fp32 fixed[8]");
  assert_has_line(ir, "source \"dir with space/a;b\\\"c\\\\d\\te\\x01.gem\"");
  assert_has_line(ir, "%bce : fp32 scalar[] = bce %logit, %y {task=\"t;\\\"\\\\\\n\\t\\x7f ü\"}");
  char *text = print_text(ir);
  assert_non_null(strstr(text, "{eps=0.1, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=0.3333333333333333, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=1e-300, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=5e-324, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=1.7976931348623157e+308, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=123456789.125, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=2.5e-07, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=100, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=-0, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=4000000, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=1e+20, prec=fp32}"));
  assert_non_null(strstr(text, "{eps=0.015625, prec=fp32}"));
  assert_non_null(strstr(text, "; dir with space/a;b\"c\\d?e?.gem:9:2\n"));
  // Every real reads back to the same double.
  Arena a = {0};
  Ir back;
  assert_true(read_text(text, &a, &back, NULL));
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
    snprintf(name, sizeof name, "r%zu", i);
    const Tensor *t = &back.tensors[ir_find_tensor(&back, name)];
    assert_memory_equal(&back.nodes[t->producer].eps, &reals[i], sizeof(double));
    assert_int_equal(back.nodes[t->producer].loc.first_line, (int)i + 1);
  }
  assert_string_equal(back.source, ir->source);
  assert_string_equal(back.nodes[back.tensors[back.loss].producer].task, bce.task);
  assert_true(back.tensors[ir_find_tensor(&back, "g")].optim.weight_decay == 0.01);
  assert_int_equal(back.tensors[ir_find_tensor(&back, "g2")].optim.kind, OPTIM_SGD);
  free(text);
  arena_free(&a);
  assert_round_trip(ir);
  arena_free(&b.arena);
}

// --- the reader's errors ----------------------------------------------------------------------

static const char reader_base[] =
    "model m\n"
    "batch 4\n"
    "dim 8\n"
    "jagged *s L_s=16\n"
    "input %s : i64 jagged[B, *s]\n"
    "input %x : fp32 dense[B, 8]\n"
    "param @w : fp32 fixed[8, 8]\n";

// Reads reader_base followed by `tail`; asserts failure with `message` at line:col.
static void assert_read_error(const char *tail, const char *where, const char *message) {
  char *text = malloc(strlen(reader_base) + strlen(tail) + 1);
  strcpy(text, reader_base);
  strcat(text, tail);
  Arena a = {0};
  Ir ir;
  char *errors = NULL;
  bool ok = read_text(text, &a, &ir, &errors);
  char want[256];
  snprintf(want, sizeof want, "test.ir:%s: error: %s", where, message);
  if (ok || !strstr(errors, want)) fprintf(stderr, "want: %s\ngot: %s\n", want, errors);
  assert_false(ok);
  assert_non_null(strstr(errors, want));
  free(errors);
  free(text);
  arena_free(&a);
}

static void test_ir_read_accepts_the_base(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  assert_true(read_text(reader_base, &a, &ir, NULL));
  assert_int_equal(ir.ntensors, 3);
  assert_string_equal(ir.target, "sm_90a");  // the defaults of missing header lines
  assert_int_equal(ir.dense_optim.kind, OPTIM_ADAMW);
  arena_free(&a);
}

static void test_ir_read_errors(void **state) {
  (void)state;
  assert_read_error("%y : fp32 dense[B, 8] = frobnicate %x\n", "8:25", "unknown op 'frobnicate'");
  assert_read_error("backward\nbackward\n", "9:1", "duplicate 'backward' line");
  assert_read_error("backward now\n", "8:10", "expected end of line, found 'now'");
  assert_read_error("grad @w %x\n", "8:9", "expected '=', found '%'");
  assert_read_error("grad @w = %nope\n", "8:11", "unknown tensor %nope");
  assert_read_error("grad %w = %x\n", "8:6", "%w is spelled @w");
  assert_read_error("%g : fp32 rows[U_nope, 8] = table_grad @w\n", "8:16",
                    "unknown table 'nope' in U_nope");
  assert_read_error("%g : fp32 rows[U_w, 8] = table_grad @w\n", "8:16",
                    "unknown table 'w' in U_w");
  assert_read_error("%g : fp32 rows[w, 8] = table_grad @w\n", "8:16",
                    "expected 'U_' and a table name, found 'w'");
  assert_read_error("%y : fp32 dense[B, 8] = slice %x {start=x}\n", "8:41",
                    "expected an integer, found 'x'");
  assert_read_error("%y : fp32 dense[B, 8] = slice %x {start=0, prec=fp32}\n", "8:44",
                    "op slice has no attribute 'prec'");
  assert_read_error("%y : fp32 dense[B, 1] = bce_bwd %x, %x\n", "8:39",
                    "op bce_bwd needs the attribute 'weight'");
  assert_read_error("%y : fp32 dense[B, 8] = linear %x, @nope {act=none, prec=fp32}\n", "8:36",
                    "unknown tensor @nope");
  assert_read_error("%y : fp32 dense[B, 8] = linear %x, %w {act=none, prec=fp32}\n", "8:36",
                    "%w is spelled @w");
  assert_read_error("%x : fp32 dense[B, 8] = act %x {act=relu, prec=fp32}\n", "8:1",
                    "redefinition of %x");
  assert_read_error("%y : fp31 dense[B, 8] = act %x {act=relu, prec=fp32}\n", "8:6",
                    "unknown dtype 'fp31'");
  assert_read_error("%y : fp32 blob[B, 8] = act %x {act=relu, prec=fp32}\n", "8:11",
                    "unknown layout 'blob'");
  assert_read_error("%y : fp32 dense[B, 8] act %x\n", "8:23", "expected '=', found 'act'");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu}\n", "8:32",
                    "op act needs the attribute 'prec'");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu, prec=fp32, heads=2}\n", "8:54",
                    "op act has no attribute 'heads'");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu, act=relu, prec=fp32}\n", "8:43",
                    "duplicate attribute 'act'");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu, prec=fp32, tile_z=2}\n", "8:54",
                    "unknown attribute 'tile_z'");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=swish, prec=fp32}\n", "8:37",
                    "unknown activation 'swish'");
  assert_read_error("%y : fp32 scalar[] = loss_sum %x, %x {weights=[1]}\n", "8:47",
                    "1 weights for 2 inputs");
  assert_read_error("%y : fp32 jagged[B, *q, 8] = act %x {act=relu, prec=fp32}\n", "8:21",
                    "unknown jagged dim '*q'");
  assert_read_error("batch 5\n", "8:1", "duplicate 'batch' line");
  assert_read_error("jagged *s L_s=3\n", "8:8", "duplicate jagged dim '*s'");
  assert_read_error("jagged *u L_v=3\n", "8:11", "expected 'L_u=' after '*u'");
  assert_read_error("input %z : fp32 dense[B, 99999999999999999999]\n", "8:26",
                    "integer out of range");
  assert_read_error("input %z : fp32 dense[B, 12x]\n", "8:26", "malformed integer");
  assert_read_error("table @t : fp32 fixed[4, 8] rowwise_adagrad lr=0.1 beta1=0.5\n", "8:52",
                    "optimizer rowwise_adagrad has no setting 'beta1'");
  assert_read_error("table @t : fp32 fixed[4, 8] adam\n", "8:29", "unknown optimizer 'adam'");
  assert_read_error("%y : fp32 scalar[] = bce %x, %x {task=\"abc}\n", "8:39", "unterminated string");
  assert_read_error("%y : fp32 scalar[] = bce %x, %x {task=\"a\\qb\"}\n", "8:41",
                    "unknown escape in a string");
  assert_read_error("wibble 3\n", "8:1", "unknown line 'wibble'");
  assert_read_error("input @z : fp32 dense[B, 8]\n", "8:7", "expected a % name, found '@'");
  assert_read_error("loss %x\nloss %x\n", "9:1", "duplicate 'loss' line");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu, prec=fp32} extra\n", "8:54",
                    "expected end of line, found 'extra'");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu, prec=fp32\n", "8:52",
                    "expected '}', found end of line");
  assert_read_error("%y : fp32 dense[B, 8] = concat %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, "
                    "%x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, "
                    "%x, %x, %x, %x {prec=fp32}\n",
                    "8:160", "more than 32 inputs");
  assert_read_error("%y : fp32 dense[B, 8] = act %x {act=relu, prec=fp32, zigzag=sideways}\n",
                    "8:61", "expected on or off");
  // Missing header lines are reported at 1:1.
  Arena a = {0};
  Ir ir;
  char *errors = NULL;
  assert_false(read_text("model m\ndim 8\n", &a, &ir, &errors));
  assert_non_null(strstr(errors, "test.ir:1:1: error: missing 'batch' line"));
  free(errors);
  // A NUL byte is an error at its column, not the end of the text.
  static const char with_nul[] = "model m\nbatch 4\ndim 8\nin\0put %x : fp32 dense[B, 8]\n";
  SourceFile f;
  source_from_memory(&f, "nul.ir", with_nul, sizeof with_nul - 1);
  char *buf = NULL;
  size_t size = 0;
  FILE *err = open_memstream(&buf, &size);
  Diag d;
  diag_init(&d, &f, err);
  assert_false(ir_read(&f, &a, &d, &ir));
  fclose(err);
  assert_non_null(strstr(buf, "nul.ir:4:3: error: "));
  free(buf);
  arena_free(&a);
}

// The reader never crashes: every prefix of a valid text, and many corrupted copies, either
// read (and then print and verify without crashing) or fail with an error.
static void test_ir_read_survives_corrupt_text(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_full(&ir, &a);
  char *text = print_text(&ir);
  size_t len = strlen(text);
  char *copy = malloc(len + 1);
  int read_ok = 0, read_failed = 0;
  FILE *devnull = fopen("/dev/null", "w");
  for (size_t cut = 0; cut <= len; cut += 7) {
    memcpy(copy, text, cut);
    copy[cut] = '\0';
    Arena b = {0};
    Ir back;
    SourceFile f;
    source_from_memory(&f, "cut.ir", copy, cut);
    Diag d;
    diag_init(&d, &f, devnull);
    if (ir_read(&f, &b, &d, &back)) {
      read_ok++;
      char err[512];
      (void)ir_verify(&back, err, sizeof err);
      ir_print(devnull, &back);
    } else {
      read_failed++;
    }
    arena_free(&b);
  }
  uint32_t seed = 12345;
  static const char alphabet[] = "%@*:=,[]{}\"\\;\n 0123456789.-eBafixz_";
  for (int round = 0; round < 3000; round++) {
    memcpy(copy, text, len + 1);
    for (int k = 0; k < 3; k++) {
      seed = seed * 1103515245u + 12345u;
      size_t pos = (seed >> 8) % len;
      seed = seed * 1103515245u + 12345u;
      copy[pos] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
    }
    Arena b = {0};
    Ir back;
    SourceFile f;
    source_from_memory(&f, "bad.ir", copy, len);
    Diag d;
    diag_init(&d, &f, devnull);
    if (ir_read(&f, &b, &d, &back)) {
      read_ok++;
      char err[512];
      if (ir_verify(&back, err, sizeof err)) assert_true(strlen(err) == 0);
      ir_print(devnull, &back);
    } else {
      read_failed++;
      assert_true(d.errors == 1);
    }
    arena_free(&b);
  }
  fclose(devnull);
  assert_true(read_ok > 0);
  assert_true(read_failed > 0);
  free(copy);
  free(text);
  arena_free(&a);
}

// --- every verifier rule, broken alone ------------------------------------------------------
// Each entry mutates the full model so that exactly one rule breaks, and names a phrase the
// reason must contain.

typedef struct Rule {
  const char *name;
  void (*breaks)(Ir *ir);
  const char *reason;
} Rule;

#define RULES(X)                                                                               \
  X(model_name, "the model name is not an identifier", ir->model = "two words")                \
  X(target_missing, "the target is not an identifier", ir->target = NULL)                      \
  X(model_precision, "precision fp64 is not one of", ir->precision = DT_F64)                   \
  X(batch_positive, "batch 0 is not positive", ir->batch = 0)                                  \
  X(dim_positive, "dim -1 is not positive", ir->dim = -1)                                      \
  X(dense_optim_kind, "the dense optimizer is rowwise_adagrad",                                \
    ir->dense_optim.kind = OPTIM_ROWWISE_ADAGRAD)                                              \
  X(dense_optim_finite, "finite and non-negative", ir->dense_optim.lr = INFINITY)             \
  X(loss_index, "loss index 999 is out of range", ir->loss = 999)                              \
  X(jagged_max_len, "jagged dim *cand: max length 0", ir->jagged[1].max_len = 0)               \
  X(jagged_name, "jagged dim 1: the name is not an identifier", ir->jagged[1].name = "1x")     \
  X(jagged_owner, "no jagged input %cand on it owns its offsets",                              \
    tensor(ir, "cand")->layout = LAYOUT_DENSE)                                                 \
  X(tensor_name_chars, "the name is empty or not made of",                                     \
    ir->tensors[idx(ir, "kv")].name = "k v"; ir_reindex(ir))                                   \
  X(tensor_name_unique, "the name is also used by tensor",                                     \
    ir->tensors[idx(ir, "m")].name = "d"; ir_reindex(ir))                                      \
  X(tensor_name_index, "ir_find_tensor does not find it", ir->tensors[idx(ir, "m")].name = "mm") \
  X(tensor_kind, "unknown kind 9", tensor(ir, "c")->kind = (TensorKind)9)                      \
  X(tensor_layout, "unknown layout 7", tensor(ir, "c")->layout = (Layout)7)                    \
  X(tensor_dtype, "unknown dtype 42", tensor(ir, "c")->dtype = (DType)42)                      \
  X(jag_index, "jagged dim index 5 is out of range", tensor(ir, "h")->jag = 5)                 \
  X(set_k, "set size k = 0 is not positive", tensor(ir, "kv")->set_k = 0)                      \
  X(fixed_dims, "fixed dim 0 is not positive", tensor(ir, "u.b")->fixed[0] = 0)                \
  X(fixed_rank, "fixed tensors have 1 or 2 dims", tensor(ir, "u.b")->nfixed = 3)               \
  X(width_negative, "width -2 is negative", tensor(ir, "c")->width = -2)                       \
  X(input_layout, "an input is dense or jagged", tensor(ir, "c")->layout = LAYOUT_SCALAR)      \
  X(ids_are_i64, "ids are i64", tensor(ir, "ad")->dtype = DT_F32)                              \
  X(input_features_float, "an input with features holds floats",                               \
    tensor(ir, "c")->dtype = DT_I64)                                                           \
  X(label_shape, "a label is fp32 dense[B]", tensor(ir, "click")->width = 1)                   \
  X(param_layout, "a parameter is fixed", *tensor(ir, "u.b") = (Tensor){                       \
    .name = "u.b", .kind = TENSOR_PARAM, .layout = LAYOUT_DENSE, .width = 8, .producer = -1})  \
  X(param_dtype, "a parameter holds floats", tensor(ir, "u.b")->dtype = DT_I64)                \
  X(param_optim, "rowwise_adagrad is for tables",                                              \
    tensor(ir, "u.b")->optim.kind = OPTIM_ROWWISE_ADAGRAD)                                     \
  X(table_rank, "a table is fixed[rows, dim]", tensor(ir, "items")->nfixed = 1)                \
  X(table_dtype, "a table stores fp32, bf16, fp16 or fp8", tensor(ir, "items")->dtype = DT_F64) \
  X(table_optim, "a table's optimizer is rowwise_adagrad or sgd",                              \
    tensor(ir, "items")->optim.kind = OPTIM_ADAMW)                                             \
  X(table_optim_finite, "finite and non-negative", tensor(ir, "items")->optim.eps = -1)        \
  X(value_fixed, "a value is fixed only as a parameter gradient", tensor(ir, "s")->layout = LAYOUT_FIXED;             \
    tensor(ir, "s")->nfixed = 1; tensor(ir, "s")->fixed[0] = 8)                                \
  X(value_width, "a value needs a feature dim", tensor(ir, "s")->width = 0)                    \
  X(value_produced, "the value is never produced",                                             \
    declare(ir, TENSOR_VALUE, "orphan", dense(8), (Loc){0}))                                   \
  X(producer_link, "its producer, node 4, does not write it", tensor(ir, "u")->producer = 4)   \
  X(non_value_producer, "only values have a producer", tensor(ir, "c")->producer = 0)          \
  X(op_known, "node 25: unknown op 77", ir->nodes[25].op = (OpKind)77)                         \
  X(output_index, "node 26 (attention): output index 500 is out of range",                     \
    Node n = *node(ir, "x"); n.out = 500; ir->nodes[ir->nnodes++] = n)                         \
  X(input_index, "input 1 has index -4, out of range", node(ir, "h")->ins[1] = -4)             \
  X(output_is_value, "the output is not a value tensor",                                       \
    Node n = op(OP_ACT, 1, idx(ir, "c")); n.act = ACT_RELU; n.out = idx(ir, "c");              \
    ir_add_node(ir, &n); tensor(ir, "c")->producer = -1)                                       \
  X(produced_once, "is also written by node 26; each value is produced once",                  \
    Node n = *node(ir, "u"); ir_add_node(ir, &n))                                              \
  X(topological, "input 0 is produced by node 9, not by an earlier node",                      \
    node(ir, "h.1.gdpa0.q")->ins[0] = idx(ir, "h.1"))                                          \
  X(arity_fixed, "add takes 2 inputs, not 3",                                                  \
    node(ir, "h.1")->ins[2] = idx(ir, "h"); node(ir, "h.1")->nins = 3)                         \
  X(arity_range, "concat takes 2 to 16 inputs, not 1", node(ir, "z")->nins = 1)                \
  X(arity_linear, "linear takes 2 to 3 inputs, not 0", node(ir, "u")->nins = 0)                   \
  X(embed_table, "input 0 must be a table", node(ir, "a")->ins[0] = idx(ir, "y.w"))            \
  X(embed_ids, "ids (input 1) must be an i64 input dense[B] or jagged[B, *s]",                 \
    node(ir, "a")->ins[1] = idx(ir, "c"))                                                      \
  X(embed_output, "the output is fp32 dense[B, 9]; expected fp32 dense[B, 8]",                 \
    tensor(ir, "a")->width = 9)                                                                \
  X(embed_pool_ids, "must be an i64 input jagged[B, *s]", node(ir, "t")->ins[1] = idx(ir, "ad")) \
  X(embed_pool_pool, "pool is 5", node(ir, "t")->pool = (Pool)5)                               \
  X(feature_input, "a (input 0) must be an input or value with a feature dim, not the label",  \
    node(ir, "m")->ins[0] = idx(ir, "click"))                                                  \
  X(feature_param, "x (input 0) must be an input or value with a feature dim, not the parameter", \
    node(ir, "s")->ins[0] = idx(ir, "u.b"))                                                    \
  X(linear_weight, "the weight (input 1) must be a parameter fixed[3, n]",                     \
    node(ir, "u")->ins[1] = idx(ir, "h.1.gdpa0.wq"))                                           \
  X(linear_weight_kind, "must be a parameter fixed[3, n], not a non-parameter",                \
    node(ir, "u")->ins[1] = idx(ir, "items"))                                                  \
  X(linear_bias, "the bias (input 2) must be a parameter fixed[8]",                            \
    node(ir, "u")->ins[2] = idx(ir, "p.seeds"))                                                \
  X(linear_output, "the output is bf16 dense[B, 8]; expected bf16 dense[B, 1]",                \
    tensor(ir, "y")->width = 8)                                                                \
  X(linear_act, "unknown act 12", node(ir, "u")->act = (Act)12)                                \
  X(rmsnorm_gain, "the gain (input 1) must be a parameter fixed[8]",                           \
    node(ir, "h.1.rmsnorm0")->ins[1] = idx(ir, "y.w"))                                         \
  X(norm_eps, "eps must be finite and non-negative", node(ir, "ln")->eps = -1e-5)              \
  X(layernorm_bias, "the bias (input 2) must be a parameter fixed[8]",                         \
    node(ir, "ln")->ins[2] = idx(ir, "u.w"))                                                   \
  X(act_none, "an act node needs an activation other than none", node(ir, "s")->act = ACT_NONE) \
  X(elementwise_shape, "a and b must have one shape, not fp32 dense[B, 8] and fp32 jagged",    \
    node(ir, "m")->ins[1] = idx(ir, "h"))                                                      \
  X(concat_rows, "parts must share one layout and leading dims",                               \
    node(ir, "z")->ins[1] = idx(ir, "h"))                                                      \
  X(concat_width, "the output is fp32 dense[B, 26]; expected fp32 dense[B, 27]",               \
    tensor(ir, "z")->width = 26; tensor(ir, "y.w")->fixed[0] = 26)                             \
  X(stack_widths, "inputs must all be dense[B, d] with one d",                                 \
    node(ir, "kv")->ins[1] = idx(ir, "c"))                                                    \
  X(stack_output, "the output is fp32 set[B, 4, 8]; expected fp32 set[B, 3, 8]",               \
    tensor(ir, "kv")->set_k = 4)                                                               \
  X(flatten_set, "x must be a set[B, k, d], not fp32 dense[B, 8]",                             \
    node(ir, "fl")->ins[0] = idx(ir, "a"))                                                     \
  X(dot_interact_output, "the output is fp32 dense[B, 3]; expected fp32 dense[B, 6]",          \
    node(ir, "di")->ins[3] = idx(ir, "a"); node(ir, "di")->nins = 4)                           \
  X(attention_shape, "unknown attention shape 9", node(ir, "x")->shape = (AttnShape)9)         \
  X(self_kv_jag, "self attention: k and v must be jagged[B, *s, d] on q's jagged dim",         \
    node(ir, "x2")->shape = ATTN_SELF)                                                         \
  X(cross_q, "cross attention: q must be jagged[B, *s, d], not fp32 dense[B, 8]",              \
    node(ir, "x")->ins[0] = idx(ir, "a"))                                                      \
  X(cross_kv, "cross attention: k and v must be set[B, k, d] or jagged[B, *t, d]",             \
    node(ir, "x")->ins[1] = idx(ir, "a"); node(ir, "x")->ins[2] = idx(ir, "a"))                \
  X(pma_seeds, "pma: q must be the seeds parameter fixed[k, d]",                               \
    node(ir, "p")->ins[0] = idx(ir, "u.b"))                                                    \
  X(pma_kv, "pma attention: k and v must be jagged[B, *s, d], not fp32 set[B, 3, 8]",          \
    node(ir, "p")->ins[1] = idx(ir, "kv"); node(ir, "p")->ins[2] = idx(ir, "kv"))              \
  X(pma_output, "the output is fp32 set[B, 3, 8]; expected fp32 set[B, 2, 8]",                 \
    tensor(ir, "p")->set_k = 3; tensor(ir, "fl")->width = 24; tensor(ir, "z")->width = 35;     \
    tensor(ir, "y.w")->fixed[0] = 35)                                                          \
  X(pffn_q, "pffn attention: q must be dense[B, d] or set[B, k, d], not fp32 jagged",          \
    node(ir, "f")->ins[0] = idx(ir, "h"))                                                      \
  X(attention_kv_same, "k and v must have one shape", node(ir, "x")->ins[2] = idx(ir, "h"))   \
  X(attention_width, "q, k and v must have one width d: q has 1, k and v 8",                   \
    node(ir, "p")->ins[0] = idx(ir, "y.w"))                                                    \
  X(heads_divide, "heads = 3 must be positive and divide d = 8", node(ir, "x")->heads = 3)     \
  X(heads_positive, "heads = 0 must be positive", node(ir, "p")->heads = 0)                    \
  X(attention_act, "attention needs an activation other than none",                            \
    node(ir, "f")->act = ACT_NONE)                                                             \
  X(attention_mask, "unknown mask 4", node(ir, "x")->mask = (Mask)4)                           \
  X(causal_one_dim, "mask=causal needs q and k on one jagged dim",                             \
    node(ir, "x2")->mask = MASK_CAUSAL)                                                        \
  X(window_one_dim, "window needs q and k on one jagged dim", node(ir, "f")->window = 2)       \
  X(window_negative, "window -1 is negative", node(ir, "h.1.gdpa0")->window = -1)              \
  X(attention_scale, "scale must be finite", node(ir, "x")->scale = NAN)                 \
  X(bce_logit, "the logit must be dense[B, 1], not fp32 dense[B, 8]",                          \
    node(ir, "loss.bce0")->ins[0] = idx(ir, "a"))                                              \
  X(bce_label, "input 1 must be a label", node(ir, "loss.bce0")->ins[1] = idx(ir, "ad"))       \
  X(bce_output, "the output is fp32 dense[B, 1]; expected fp32 scalar[]",                      \
    tensor(ir, "loss.bce0")->layout = LAYOUT_DENSE; tensor(ir, "loss.bce0")->width = 1)        \
  X(loss_sum_inputs, "input 0 must be a scalar loss term", node(ir, "loss")->ins[0] = idx(ir, "y")) \
  X(loss_sum_weight, "weight 0 must be positive and finite", node(ir, "loss")->weights[0] = 0) \
  X(prec_kind, "prec=fp64 is not one of", node(ir, "m")->prec = DT_F64;                        \
    tensor(ir, "m")->dtype = DT_F64)                                                           \
  X(prec_matmul, "prec=fp8 is legal only on ops with a matmul", node(ir, "m")->prec = DT_FP8;  \
    tensor(ir, "m")->dtype = DT_BF16)                                                          \
  X(prec_matmul_mx, "prec=mxfp8 is legal only on ops with a matmul",                           \
    node(ir, "ln")->prec = DT_MXFP8; tensor(ir, "ln")->dtype = DT_BF16)                        \
  X(dtype_follows_prec, "the output dtype is fp32, but prec=bf16 stores bf16",                 \
    node(ir, "u")->prec = DT_BF16)                                                             \
  X(dtype_mxfp8_bf16, "the output dtype is mxfp8, but prec=mxfp8 stores bf16",                 \
    tensor(ir, "y")->dtype = DT_MXFP8)                                                         \
  X(dtype_loss_fp32, "the output dtype is bf16; bce always gives fp32",                        \
    tensor(ir, "loss.bce0")->dtype = DT_BF16)                                                  \
  X(sched_attention_hint, "tile_q, tile_kv and zigzag are attention hints, not linear hints",  \
    node(ir, "y")->sched.tile_q = 64)                                                          \
  X(sched_matmul_hint, "tile_m, tile_n and tile_k are linear and dot_interact hints",          \
    node(ir, "x")->sched.tile_k = 64)                                                          \
  X(sched_stages_op, "stages is a matmul hint, not a add hint", node(ir, "h.1")->sched.stages = 2) \
  X(sched_gelu_op, "the gelu hint needs an op with an activation, not concat",                 \
    node(ir, "z")->sched.gelu_taylor = 1)                                                      \
  X(sched_tile_range, "tile size 100 is not a power of two in 16..256",                        \
    node(ir, "y")->sched.tile_n = 100)                                                         \
  X(sched_tile_small, "tile size 8 is not a power of two in 16..256",                          \
    node(ir, "h.1.gdpa0")->sched.tile_kv = 8)                                                  \
  X(sched_stages_range, "stages = 9 is not in 1..8", node(ir, "y")->sched.stages = 9)          \
  X(sched_zigzag, "zigzag = 3 is not on or off", node(ir, "x")->sched.zigzag = 3)              \
  X(sched_gelu, "gelu = 7 is not taylor or exact", node(ir, "x")->sched.gelu_taylor = 7)       \
  X(loss_scalar, "tensor %y: the loss must be an fp32 scalar[] value", ir->loss = idx(ir, "y"))

#define X(name, reason, ...) \
  static void break_##name(Ir *ir) { __VA_ARGS__; }
RULES(X)
#undef X

static Rule rules[] = {
#define X(name, reason, ...) {#name, break_##name, reason},
    RULES(X)
#undef X
};

static void test_ir_verify_rule(void **state) {
  const Rule *rule = *state;
  Arena a = {0};
  Ir ir;
  build_full(&ir, &a);
  char err[1024];
  assert_true(ir_verify(&ir, err, sizeof err));
  rule->breaks(&ir);
  bool ok = ir_verify(&ir, err, sizeof err);
  if (ok || !strstr(err, rule->reason))
    fprintf(stderr, "rule %s: want \"%s\"\n  got %s: \"%s\"\n", rule->name, rule->reason,
            ok ? "pass" : "fail", err);
  assert_false(ok);
  assert_non_null(strstr(err, rule->reason));
  arena_free(&a);
}

static void test_ir_verify_names_the_node(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_full(&ir, &a);
  node(&ir, "x")->heads = 3;
  char err[1024];
  assert_false(ir_verify(&ir, err, sizeof err));
  assert_string_equal(err, "node 11 (%x = attention %h.1, %kv, %kv): heads = 3 must be "
                           "positive and divide d = 8");
  // A tiny buffer is filled, never overrun.
  char small[12];
  memset(small, 'z', sizeof small);
  assert_false(ir_verify(&ir, small, 8));
  assert_string_equal(small, "node 11");
  assert_int_equal(small[8], 'z');
  arena_free(&a);
}

static void test_ir_verify_accepts_no_loss_and_empty(void **state) {
  (void)state;
  Base b;
  base(&b);
  assert_verifies(&b.ir);
  assert_round_trip(&b.ir);
  arena_free(&b.arena);
}

// --- the backward section -------------------------------------------------------------------
// build_full plus a hand-written backward for its output layer: a bce_bwd seed, the linear's
// gradients, a slice of the concat, an unflatten, a dot_interact_bwd and a table_grad, with
// two gradient records.

static void build_with_backward(Ir *ir, Arena *a) {
  build_full(ir, a);
  assert_int_equal(ir->nforward, ir->nnodes);
  ir_begin_backward(ir);
  Node seed = op(OP_BCE_BWD, 2, idx(ir, "y"), idx(ir, "click"));
  seed.weight = 0.5;
  int dy = emit(ir, "y.grad", with_dtype(dense(1), DT_BF16), seed);
  Node dw = op(OP_LINEAR_BWD_W, 2, idx(ir, "z"), dy);
  dw.prec = DT_MXFP8;
  Tensor wgrad = {.layout = LAYOUT_FIXED, .jag = -1, .nfixed = 2, .fixed = {27, 1},
                  .dtype = DT_F32};
  int w_grad = emit(ir, "y.w.grad", wgrad, dw);
  Node dx = op(OP_LINEAR_BWD_X, 2, dy, idx(ir, "y.w"));
  dx.prec = DT_MXFP8;
  int z_grad = emit(ir, "z.grad", dense(27), dx);
  Node sl = op(OP_SLICE, 1, z_grad);
  int fl_grad = emit(ir, "fl.grad", dense(16), sl);
  emit(ir, "p.grad", set(2, 8), op(OP_UNFLATTEN, 1, fl_grad));
  sl.start = 16;
  int di_grad = emit(ir, "di.grad", dense(3), sl);
  Node dib = op(OP_DOT_INTERACT_BWD, 4, di_grad, idx(ir, "a"), idx(ir, "t"), idx(ir, "d"));
  int a_grad = emit(ir, "a.grad", dense(8), dib);
  Tensor rows = {.layout = LAYOUT_ROWS, .jag = -1, .table = idx(ir, "items"), .width = 8,
                 .dtype = DT_F32};
  int items_grad = emit(ir, "items.grad", rows,
                        op(OP_TABLE_GRAD, 3, idx(ir, "items"), idx(ir, "ad"), a_grad));
  ir_add_grad(ir, idx(ir, "items"), items_grad);
  ir_add_grad(ir, idx(ir, "y.w"), w_grad);
}

static void test_ir_backward_section_prints_and_reads_back(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_with_backward(&ir, &a);
  assert_int_equal(ir.nforward, 26);
  assert_int_equal(ir.nnodes, 34);
  assert_verifies(&ir);
  assert_round_trip(&ir);
  assert_int_equal(ir_grad_of(&ir, idx(&ir, "y.w")), idx(&ir, "y.w.grad"));
  assert_int_equal(ir_grad_of(&ir, idx(&ir, "c")), -1);
  char *text = print_text(&ir);
  assert_non_null(strstr(text, "{weights=[1]}\n\nbackward\n%y.grad : bf16 dense[B, 1] = bce_bwd "
                               "%y, %click {weight=0.5}\n"));
  assert_non_null(strstr(text, "\n%items.grad : fp32 rows[U_items, 8] = table_grad @items, "
                               "%ad, %a.grad\n\nloss %loss\n\ngrad @items = %items.grad\n"
                               "grad @y.w = %y.w.grad\n"));
  assert_non_null(strstr(text, "\n%a.grad : fp32 dense[B, 8] = dot_interact_bwd %di.grad, %a, "
                               "%t, %d {prec=fp32, start=0}\n"));
  assert_non_null(strstr(text, "\n%di.grad : fp32 dense[B, 3] = slice %z.grad {start=16}\n"));
  assert_non_null(strstr(text, "\n%p.grad : fp32 set[B, 2, 8] = unflatten %fl.grad\n"));
  // Read back: the section boundary, the rows tensor's table and the records.
  Arena b = {0};
  Ir back;
  assert_true(read_text(text, &b, &back, NULL));
  assert_int_equal(back.nforward, 26);
  assert_int_equal(back.ngrads, 2);
  assert_int_equal(back.tensors[idx(&back, "items.grad")].layout, LAYOUT_ROWS);
  assert_int_equal(back.tensors[idx(&back, "items.grad")].table, idx(&back, "items"));
  assert_true(back.nodes[back.tensors[idx(&back, "y.grad")].producer].weight == 0.5);
  // A node added after reading is a backward node.
  Node more = op(OP_SCALE, 1, idx(&back, "a.grad"));
  more.scale = 2;
  emit(&back, "a.grad.twice", dense(8), more);
  assert_int_equal(back.nforward, 26);
  assert_verifies(&back);
  free(text);
  arena_free(&a);
  arena_free(&b);
}

// The reader never crashes on a corrupted backward section either.
static void test_ir_read_survives_corrupt_backward(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_with_backward(&ir, &a);
  char *text = print_text(&ir);
  size_t len = strlen(text);
  char *copy = malloc(len + 1);
  FILE *devnull = fopen("/dev/null", "w");
  uint32_t seed = 777;
  static const char alphabet[] = "%@*:=,[]{}\"\\;\n 0123456789.-eBU_abdgikrw";
  size_t from = 0;  // corrupt only the backward section and what follows it
  while (from + 10 < len && memcmp(text + from, "\nbackward\n", 10) != 0) from++;
  assert_true(from + 10 < len);
  int read_ok = 0;
  for (int round = 0; round < 2000; round++) {
    memcpy(copy, text, len + 1);
    for (int k = 0; k < 2; k++) {
      seed = seed * 1103515245u + 12345u;
      size_t pos = from + (seed >> 8) % (len - from);
      seed = seed * 1103515245u + 12345u;
      copy[pos] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
    }
    Arena b = {0};
    Ir back;
    SourceFile f;
    source_from_memory(&f, "bad.ir", copy, len);
    Diag d;
    diag_init(&d, &f, devnull);
    if (ir_read(&f, &b, &d, &back)) {
      read_ok++;
      char err[512];
      (void)ir_verify(&back, err, sizeof err);
      ir_print(devnull, &back);
    }
    arena_free(&b);
  }
  assert_true(read_ok > 0);
  fclose(devnull);
  free(copy);
  free(text);
  arena_free(&a);
}

// dce after autodiff: backward nodes no gradient needs go (the unflatten to %p.grad, which no
// record reads, and a dead scale); the records, the rows tensor's table and nforward follow
// the renumbering.
static void test_ir_dce_keeps_what_gradients_need(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_with_backward(&ir, &a);
  Node dead = op(OP_SCALE, 1, idx(&ir, "a.grad"));
  dead.scale = 3;
  emit(&ir, "dead.grad", dense(8), dead);
  table(&ir, "unused_table", 10, 8);  // shifts nothing before it, but is dropped
  assert_verifies(&ir);
  Diag d;
  diag_init(&d, NULL, stderr);
  assert_true(passes_run(&ir, &d, NULL, NULL));
  assert_verifies(&ir);
  assert_int_equal(ir_find_tensor(&ir, "dead.grad"), -1);
  assert_int_equal(ir_find_tensor(&ir, "p.grad"), -1);
  assert_int_equal(ir_find_tensor(&ir, "fl.grad"), -1);
  assert_int_equal(ir_find_tensor(&ir, "unused_table"), -1);
  assert_int_equal(ir.nforward, 26);
  assert_int_equal(ir.nnodes, 32);
  assert_int_equal(ir.tensors[idx(&ir, "items.grad")].table, idx(&ir, "items"));
  assert_int_equal(ir_grad_of(&ir, idx(&ir, "y.w")), idx(&ir, "y.w.grad"));
  // The same as the clean backward without the two unflatten-side nodes.
  Arena b = {0};
  Ir clean;
  build_with_backward(&clean, &b);
  assert_true(passes_run(&clean, &d, NULL, NULL));
  char *want = print_text(&clean);
  arena_free(&b);
  char *got = print_text(&ir);
  assert_string_equal(got, want);
  free(got);
  free(want);
  arena_free(&a);
}

// --- dead-code elimination and the pass driver ---------------------------------------------

// The full model, plus a dead branch, an unused table and parameter, and an unused input.
static void build_with_dead_code(Ir *ir, Arena *a) {
  build_full(ir, a);
  int unused_table = table(ir, "unused_table", 10, 8);
  (void)unused_table;
  param(ir, "unused_param", 4, 0);
  input(ir, "unused_input", dense(2));
  int w = param(ir, "dead.w", 8, 8);
  int d0 = emit(ir, "dead0", dense(8), op(OP_LINEAR, 2, idx(ir, "a"), w));
  emit(ir, "dead1", dense(8), op(OP_ADD, 2, d0, idx(ir, "t")));
  int e = emit(ir, "dead2", dense(8), op(OP_EMBED, 2, unused_table, idx(ir, "ad")));
  (void)e;
}

static void test_ir_dce_removes_what_does_not_reach_the_loss(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  build_with_dead_code(&ir, &a);
  assert_verifies(&ir);
  assert_int_equal(ir.nnodes, 29);
  Diag d;
  diag_init(&d, NULL, stderr);
  assert_true(passes_run(&ir, &d, NULL, NULL));
  assert_int_equal(ir.nnodes, 26);
  assert_int_equal(ir_find_tensor(&ir, "dead0"), -1);
  assert_int_equal(ir_find_tensor(&ir, "dead.w"), -1);
  assert_int_equal(ir_find_tensor(&ir, "unused_table"), -1);
  assert_int_equal(ir_find_tensor(&ir, "unused_param"), -1);
  assert_true(ir_find_tensor(&ir, "unused_input") >= 0);  // inputs stay
  assert_true(ir_find_tensor(&ir, "click") >= 0);
  assert_verifies(&ir);

  // What is left prints exactly like the model built without the dead code, except for the
  // unused input, which stays.
  Arena b = {0};
  Ir clean;
  build_full(&clean, &b);
  input(&clean, "unused_input", dense(2));
  char *got = print_text(&ir), *want = print_text(&clean);
  assert_string_equal(got, want);
  free(got);
  free(want);
  assert_round_trip(&ir);
  arena_free(&a);
  arena_free(&b);
}

static void test_ir_dce_without_a_loss_keeps_everything(void **state) {
  (void)state;
  Base b;
  base(&b);
  emit(&b.ir, "e", dense(8), op(OP_EMBED, 2, b.emb, b.ad));
  Diag d;
  diag_init(&d, NULL, stderr);
  assert_true(passes_run(&b.ir, &d, NULL, NULL));
  assert_int_equal(b.ir.nnodes, 1);
  assert_true(ir_find_tensor(&b.ir, "emb") >= 0);
  arena_free(&b.arena);
}

static void test_ir_passes_list_and_dump_after(void **state) {
  (void)state;
  assert_string_equal(gemc_passes[0].name, "lower");
  assert_string_equal(gemc_passes[1].name, "dce");
  assert_null(gemc_passes[2].name);
  assert_null(gemc_passes[2].run);

  const char *passes[] = {"lower", "dce"};
  for (int i = 0; i < 2; i++) {
    Arena a = {0};
    Ir ir;
    build_with_dead_code(&ir, &a);
    char *text = NULL;
    size_t size = 0;
    FILE *dump = open_memstream(&text, &size);
    Diag d;
    diag_init(&d, NULL, stderr);
    assert_true(passes_run(&ir, &d, passes[i], dump));
    fclose(dump);
    // After lower the dead branch is still there; after dce it is gone.
    assert_true((strstr(text, "%dead0 : ") != NULL) == (i == 0));
    assert_non_null(strstr(text, "\nloss %loss\n"));
    free(text);
    arena_free(&a);
  }
}

// A broken IR handed to the passes is an internal error: exit 3 with the verifier's reason.
static void test_ir_passes_verify_failure_exits_3(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    Arena a = {0};
    Ir ir;
    build_full(&ir, &a);
    node(&ir, "x")->heads = 3;
    Diag d;
    diag_init(&d, NULL, stderr);
    passes_run(&ir, &d, NULL, NULL);
    _exit(0);
  }
  close(fds[1]);
  char buf[2048] = {0};
  size_t n = 0;
  ssize_t got;
  while (n < sizeof buf - 1 && (got = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0)
    n += (size_t)got;
  close(fds[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 3);
  assert_non_null(strstr(buf, "gemc: internal error at "));
  assert_non_null(strstr(buf, "the IR after pass 'lower' fails verification: node 11 (%x = "
                              "attention %h.1, %kv, %kv): heads = 3"));
}

// --- speed --------------------------------------------------------------------------------

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// A chain of n linear layers, each with its own weight, ending in a loss.
static void build_chain(Ir *ir, Arena *a, int n) {
  header(ir, a, "chain");
  int x = input(ir, "x", dense(8));
  int y = label(ir, "y");
  char name[32];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "l%d.w", i);
    int w = param(ir, name, 8, 8);
    snprintf(name, sizeof name, "l%d", i);
    Node l = op(OP_LINEAR, 2, x, w);
    l.act = ACT_RELU;
    l.loc = at(i + 10, 3);
    x = emit(ir, name, dense(8), l);
  }
  int logit = emit(ir, "logit", dense(1), op(OP_LINEAR, 2, x, param(ir, "out.w", 8, 1)));
  int b = emit(ir, "bce", scalar(), op(OP_BCE, 2, logit, y));
  ir->loss = emit(ir, "loss", scalar(), op(OP_LOSS_SUM, 1, b));
}

static void test_ir_10000_node_chain_is_fast(void **state) {
  (void)state;
  Arena a = {0};
  Ir ir;
  double t0 = seconds();
  build_chain(&ir, &a, 10000);
  double t1 = seconds();
  assert_verifies(&ir);
  double t2 = seconds();
  char *text = print_text(&ir);
  double t3 = seconds();
  Arena b = {0};
  Ir back;
  assert_true(read_text(text, &b, &back, NULL));
  double t4 = seconds();
  Diag d;
  diag_init(&d, NULL, stderr);
  assert_true(passes_run(&back, &d, NULL, NULL));
  double t5 = seconds();
  assert_int_equal(back.nnodes, 10003);
  char *again = print_text(&back);
  assert_string_equal(text, again);
  fprintf(stderr, "  10,000-node chain: build %.3fs, verify %.3fs, print %.3fs, read %.3fs, "
          "passes %.3fs (%zu bytes)\n", t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, strlen(text));
  assert_true(t1 - t0 < 1.0);
  assert_true(t2 - t1 < 1.0);
  assert_true(t3 - t2 < 1.0);
  assert_true(t4 - t3 < 1.0);
  assert_true(t5 - t4 < 1.0);
  free(text);
  free(again);
  arena_free(&a);
  arena_free(&b);
}

int main(void) {
  const struct CMUnitTest fixed[] = {
      cmocka_unit_test(test_ir_name_tables),
      cmocka_unit_test(test_ir_find_tensor_uses_the_index),
      cmocka_unit_test(test_ir_full_model_verifies_and_round_trips),
      cmocka_unit_test(test_ir_parallel_settings_round_trip),
      cmocka_unit_test(test_ir_print_exact_text),
      cmocka_unit_test(test_ir_read_exact_text_and_locations),
      cmocka_unit_test(test_ir_op_embed),
      cmocka_unit_test(test_ir_op_embed_pool),
      cmocka_unit_test(test_ir_op_linear),
      cmocka_unit_test(test_ir_op_rmsnorm),
      cmocka_unit_test(test_ir_op_layernorm),
      cmocka_unit_test(test_ir_op_act),
      cmocka_unit_test(test_ir_op_add_sub_mul),
      cmocka_unit_test(test_ir_op_concat),
      cmocka_unit_test(test_ir_op_stack_and_flatten),
      cmocka_unit_test(test_ir_op_dot_interact),
      cmocka_unit_test(test_ir_op_bce_and_loss_sum),
      cmocka_unit_test(test_ir_attention_self),
      cmocka_unit_test(test_ir_attention_cross),
      cmocka_unit_test(test_ir_attention_pma),
      cmocka_unit_test(test_ir_attention_pffn),
      cmocka_unit_test(test_ir_round_trip_reals_strings_and_params),
      cmocka_unit_test(test_ir_read_accepts_the_base),
      cmocka_unit_test(test_ir_read_errors),
      cmocka_unit_test(test_ir_read_survives_corrupt_text),
      cmocka_unit_test(test_ir_backward_section_prints_and_reads_back),
      cmocka_unit_test(test_ir_read_survives_corrupt_backward),
      cmocka_unit_test(test_ir_dce_keeps_what_gradients_need),
      cmocka_unit_test(test_ir_verify_names_the_node),
      cmocka_unit_test(test_ir_verify_accepts_no_loss_and_empty),
      cmocka_unit_test(test_ir_dce_removes_what_does_not_reach_the_loss),
      cmocka_unit_test(test_ir_dce_without_a_loss_keeps_everything),
      cmocka_unit_test(test_ir_passes_list_and_dump_after),
      cmocka_unit_test(test_ir_passes_verify_failure_exits_3),
      cmocka_unit_test(test_ir_10000_node_chain_is_fast),
  };
  enum { NFIXED = sizeof fixed / sizeof fixed[0], NRULES = sizeof rules / sizeof rules[0] };
  static struct CMUnitTest tests[NFIXED + NRULES];
  static char names[NRULES][96];
  memcpy(tests, fixed, sizeof fixed);
  for (int i = 0; i < NRULES; i++) {
    snprintf(names[i], sizeof names[i], "test_ir_verify_rejects_%s", rules[i].name);
    tests[NFIXED + i] = (struct CMUnitTest){names[i], test_ir_verify_rule, NULL, NULL,
                                            &rules[i]};
  }
  return _cmocka_run_group_tests("test_ir", tests, NFIXED + NRULES, NULL, NULL);
}
