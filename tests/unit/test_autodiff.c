// test_autodiff.c: reverse-mode differentiation of the graph IR (docs/autodiff.md). Structure,
// not numbers: which gradients exist, the ops each rule emits and in what order, how
// contributions accumulate, how a table's lookups merge into one table_grad, that inputs get
// nothing; that every model and golden file differentiates, verifies and round-trips; and
// that the verifier rejects each broken rule of the backward ops. The numeric check against
// finite differences is the CPU executor's test.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>

#include <cmocka.h>

#include "arena.h"
#include "ast.h"
#include "autodiff.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"

// --- compiling a model --------------------------------------------------------------------

typedef struct Compiled {
  Arena arena;
  Ir ir;
  SourceFile src;
  char *errors;  // what the diagnostics printed
  size_t errors_size;
} Compiled;

// Parse, sema, passes, then autodiff when `grad`. `text` must outlive c.
static bool compile_text(Compiled *c, const char *path, const char *text, size_t size,
                         bool grad) {
  memset(c, 0, sizeof *c);
  source_from_memory(&c->src, path, text, size);
  FILE *err = open_memstream(&c->errors, &c->errors_size);
  assert_non_null(err);
  Diag d;
  diag_init(&d, &c->src, err);
  ir_init(&c->ir, &c->arena);
  Model *m = parse_model(&c->src, &c->arena, &d);
  bool ok = m && d.errors == 0 && sema_lower(m, NULL, &d, &c->ir) && d.errors == 0 &&
            passes_run(&c->ir, &d, NULL, NULL) && d.errors == 0;
  if (ok && grad) ok = autodiff(&c->ir, &d) && d.errors == 0;
  fclose(err);
  return ok;
}

static void compile_ok(Compiled *c, const char *text) {
  bool ok = compile_text(c, "test.gem", text, strlen(text), true);
  if (!ok) fprintf(stderr, "%s", c->errors);
  assert_true(ok);
}

static void release(Compiled *c) {
  free(c->errors);
  arena_free(&c->arena);
}

// --- looking things up ----------------------------------------------------------------------

static int idx(const Ir *ir, const char *name) {
  int i = ir_find_tensor(ir, name);
  if (i < 0) fprintf(stderr, "no tensor '%s'\n", name);
  assert_true(i >= 0);
  return i;
}
static Tensor *tensor(Ir *ir, const char *name) { return &ir->tensors[idx(ir, name)]; }
// The node that writes `value`.
static Node *node(Ir *ir, const char *value) {
  int p = ir->tensors[idx(ir, value)].producer;
  assert_true(p >= 0);
  return &ir->nodes[p];
}
static const char *name_of(const Ir *ir, int t) { return ir->tensors[t].name; }

// The n-th node (from 0) with op `op`, or NULL.
static Node *nth_op(Ir *ir, OpKind op, int n) {
  for (int i = 0; i < ir->nnodes; i++)
    if (ir->nodes[i].op == op && n-- == 0) return &ir->nodes[i];
  return NULL;
}
static int count_op(const Ir *ir, OpKind op) {
  int n = 0;
  for (int i = 0; i < ir->nnodes; i++) n += ir->nodes[i].op == op;
  return n;
}
static int node_index(const Ir *ir, const Node *n) { return (int)(n - ir->nodes); }

// Inputs of `n` by name, comma-separated, into buf.
static const char *ins_of(const Ir *ir, const Node *n, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < n->nins && used < size; k++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", k ? "," : "", name_of(ir, n->ins[k]));
  return buf;
}
static void assert_ins(const Ir *ir, const Node *n, const char *want) {
  char buf[1024];
  assert_string_equal(ins_of(ir, n, buf, sizeof buf), want);
}

static void assert_verifies(const Ir *ir) {
  char err[1024];
  bool ok = ir_verify(ir, err, sizeof err);
  if (!ok) fprintf(stderr, "verify: %s\n", err);
  assert_true(ok);
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

// print(read(print(ir))) == print(ir), and what was read has the same backward section.
static void assert_round_trip(const Ir *ir) {
  char *first = print_text(ir);
  SourceFile f;
  source_from_memory(&f, "grad.ir", first, strlen(first));
  char *errors = NULL;
  size_t size = 0;
  FILE *err = open_memstream(&errors, &size);
  Diag d;
  diag_init(&d, &f, err);
  Arena a = {0};
  Ir back;
  bool ok = ir_read(&f, &a, &d, &back);
  fclose(err);
  if (!ok) fprintf(stderr, "%s", errors);
  assert_true(ok);
  char *second = print_text(&back);
  assert_string_equal(first, second);
  assert_verifies(&back);
  assert_int_equal(back.nforward, ir->nforward);
  assert_int_equal(back.nnodes, ir->nnodes);
  assert_int_equal(back.ngrads, ir->ngrads);
  free(first);
  free(second);
  free(errors);
  arena_free(&a);
}

// --- structure ------------------------------------------------------------------------------

// A tiny model: a table, a two-layer MLP with relu and biases, a dense input.
static const char mlp_model[] =
    "model m {\n"
    "  batch 4;\n"
    "  dim 4;\n"
    "  precision bf16;\n"
    "  sparse ad : id;\n"
    "  dense c : f32[2];\n"
    "  label click;\n"
    "  table t : rows 10;\n"
    "  a = embed(t, ad);\n"
    "  u = linear(c, 4);\n"
    "  y = mlp(concat(a, u), [6, 1], act = relu) @mxfp8;\n"
    "  loss bce(y, click);\n"
    "}\n";

// linear with a fused act and a bias: linear_act_bwd, linear_bwd_x, linear_bwd_w, reduce_rows,
// in that order, reading what docs/autodiff.md says, at the forward prec.
static void test_autodiff_linear_with_act_and_bias(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, mlp_model);
  Ir *ir = &c.ir;
  assert_verifies(ir);
  Node *pre = node(ir, "y.mlp0.l0.pre.grad");
  int at = node_index(ir, pre);
  assert_int_equal(pre->op, OP_LINEAR_ACT_BWD);
  assert_ins(ir, pre, "y.mlp0.l0.grad,y.concat0,y.mlp0.l0.w,y.mlp0.l0.b");
  assert_int_equal(pre->act, ACT_RELU);
  assert_int_equal(pre->prec, DT_MXFP8);
  assert_int_equal(tensor(ir, "y.mlp0.l0.pre.grad")->dtype, DT_BF16);
  const Node *next[3] = {&ir->nodes[at + 1], &ir->nodes[at + 2], &ir->nodes[at + 3]};
  assert_int_equal(next[0]->op, OP_LINEAR_BWD_X);
  assert_ins(ir, next[0], "y.mlp0.l0.pre.grad,y.mlp0.l0.w");
  assert_string_equal(name_of(ir, next[0]->out), "y.concat0.grad");
  assert_int_equal(next[0]->prec, DT_MXFP8);
  assert_int_equal(next[1]->op, OP_LINEAR_BWD_W);
  assert_ins(ir, next[1], "y.concat0,y.mlp0.l0.pre.grad");
  assert_string_equal(name_of(ir, next[1]->out), "y.mlp0.l0.w.grad");
  assert_int_equal(next[2]->op, OP_REDUCE_ROWS);
  assert_ins(ir, next[2], "y.mlp0.l0.pre.grad");
  assert_string_equal(name_of(ir, next[2]->out), "y.mlp0.l0.b.grad");
  // Parameter gradients are fp32 and shaped like the parameter.
  const Tensor *w = tensor(ir, "y.mlp0.l0.w.grad");
  assert_int_equal(w->layout, LAYOUT_FIXED);
  assert_int_equal(w->dtype, DT_F32);
  assert_int_equal(w->fixed[0], 8);
  assert_int_equal(w->fixed[1], 6);
  // The last layer has no act: no linear_act_bwd, its dz is dy.
  assert_int_equal(count_op(ir, OP_LINEAR_ACT_BWD), 1);
  assert_ins(ir, node(ir, "y.mlp0.l0.grad"), "y.grad,y.mlp0.l1.w");
  release(&c);
}

// Every parameter and table gets one record, tables first, in declaration order; inputs and
// labels get no gradient, and what depends only on inputs is not differentiated.
static void test_autodiff_grads_exist_and_inputs_get_none(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, mlp_model);
  Ir *ir = &c.ir;
  int weights = 0;
  for (int t = 0; t < ir->ntensors; t++) {
    TensorKind k = ir->tensors[t].kind;
    if (k == TENSOR_PARAM || k == TENSOR_TABLE) {
      weights++;
      assert_true(ir_grad_of(ir, t) >= 0);
    } else if (k != TENSOR_VALUE) {
      assert_int_equal(ir_grad_of(ir, t), -1);
    }
  }
  assert_int_equal(ir->ngrads, weights);
  assert_string_equal(name_of(ir, ir->grads[0].param), "t");
  assert_string_equal(name_of(ir, ir->grads[0].grad), "t.grad");
  assert_string_equal(name_of(ir, ir->grads[1].param), "u.linear0.w");
  assert_int_equal(ir_find_tensor(ir, "c.grad"), -1);
  assert_int_equal(ir_find_tensor(ir, "click.grad"), -1);
  assert_int_equal(ir_find_tensor(ir, "ad.grad"), -1);
  // u = linear(c, 4): weight and bias gradients, but no linear_bwd_x into the input.
  for (int i = ir->nforward; i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    if (n->op == OP_LINEAR_BWD_X) assert_true(n->ins[1] != idx(ir, "u.linear0.w"));
  }
  assert_int_equal(node(ir, "u.linear0.w.grad")->op, OP_LINEAR_BWD_W);
  assert_ins(ir, node(ir, "u.linear0.w.grad"), "c,u.grad");
  // Backward ops only after nforward; the forward part is untouched.
  for (int i = 0; i < ir->nnodes; i++)
    assert_int_equal(op_is_backward(ir->nodes[i].op), i >= ir->nforward);
  release(&c);
}

static void test_autodiff_skips_branches_without_parameters(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, "model m {\n"
                 "  batch 4; dim 4;\n"
                 "  sparse ad : id; dense c : f32[4]; label click;\n"
                 "  table t : rows 10;\n"
                 "  y = linear(concat(embed(t, ad), silu(c)), 1);\n"
                 "  loss bce(y, click);\n"
                 "}\n");
  Ir *ir = &c.ir;
  assert_verifies(ir);
  // silu(c) depends on nothing that trains: no act_bwd, and only one slice (the embedding's).
  assert_int_equal(count_op(ir, OP_ACT_BWD), 0);
  assert_int_equal(count_op(ir, OP_SLICE), 1);
  assert_int_equal(nth_op(ir, OP_SLICE, 0)->start, 0);
  assert_int_equal(ir_find_tensor(ir, "y.silu0.grad"), -1);
  release(&c);
}

// A value used three times: contributions .0 .1 .2 in use order, summed left to right just
// before its producer's backward.
static void test_autodiff_accumulates_in_use_order(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, "model m {\n"
                 "  batch 4; dim 4;\n"
                 "  sparse ad : id; label click;\n"
                 "  table t : rows 10;\n"
                 "  a = embed(t, ad);\n"
                 "  u = linear(a, 4, bias = false);\n"
                 "  v = relu(u);\n"
                 "  w = sigmoid(u);\n"
                 "  y = linear(concat(v, w, u), 1);\n"
                 "  loss bce(y, click);\n"
                 "}\n");
  Ir *ir = &c.ir;
  assert_verifies(ir);
  assert_int_equal(node(ir, "u.grad.0")->op, OP_ACT_BWD);  // relu, the first use
  assert_int_equal(node(ir, "u.grad.0")->act, ACT_RELU);
  assert_int_equal(node(ir, "u.grad.1")->act, ACT_SIGMOID);
  assert_int_equal(node(ir, "u.grad.2")->op, OP_SLICE);
  assert_int_equal(node(ir, "u.grad.2")->start, 8);
  Node *sum1 = node(ir, "u.grad.sum1"), *sum = node(ir, "u.grad");
  assert_int_equal(sum1->op, OP_ADD);
  assert_ins(ir, sum1, "u.grad.0,u.grad.1");
  assert_int_equal(sum->op, OP_ADD);
  assert_ins(ir, sum, "u.grad.sum1,u.grad.2");
  assert_true(node_index(ir, sum1) + 1 == node_index(ir, sum));
  // The sum comes after every contribution and right before u's own backward.
  for (int k = 0; k < 3; k++) {
    char name[16];
    snprintf(name, sizeof name, "u.grad.%d", k);
    assert_true(node_index(ir, node(ir, name)) < node_index(ir, sum1));
  }
  assert_int_equal(ir->nodes[node_index(ir, sum) + 1].op, OP_LINEAR_BWD_X);
  release(&c);
}

// add's operands take dy itself; sub's second gets scale -1; mul's get mul.
static void test_autodiff_add_sub_mul(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, "model m {\n"
                 "  batch 4; dim 4;\n"
                 "  sparse ad : id; sparse geo : id; label click;\n"
                 "  table t : rows 10; table g : rows 10;\n"
                 "  a = embed(t, ad);\n"
                 "  b = embed(g, geo);\n"
                 "  s = a - b;\n"
                 "  p = s * a;\n"
                 "  y = linear(p + b, 1);\n"
                 "  loss bce(y, click);\n"
                 "}\n");
  Ir *ir = &c.ir;
  assert_verifies(ir);
  // p + b: p's gradient is the sum's gradient itself (an alias), and b's first contribution.
  int p_grad = idx(ir, "y.add0.grad");
  Node *mul_a = node(ir, "s.grad");
  assert_int_equal(mul_a->op, OP_MUL);
  assert_int_equal(mul_a->ins[0], p_grad);
  assert_int_equal(mul_a->ins[1], idx(ir, "a"));
  Node *mul_b = node(ir, "a.grad.1");
  assert_int_equal(mul_b->op, OP_MUL);
  assert_ins(ir, mul_b, "y.add0.grad,s");
  Node *neg = node(ir, "b.grad.0");
  assert_int_equal(neg->op, OP_SCALE);
  assert_true(neg->scale == -1);
  assert_ins(ir, neg, "s.grad");
  assert_ins(ir, node(ir, "a.grad"), "s.grad,a.grad.1");   // sub's a: dy itself
  assert_ins(ir, node(ir, "b.grad"), "b.grad.0,y.add0.grad");
  release(&c);
}

// Four lookups of one table (sequence, sparse, pooled mean multihot, pooled sum sequence):
// one table_grad with the (ids, dy) pairs in source order; pooled ones through embed_pool_bwd.
static void test_autodiff_table_grad_merges_lookups(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, "model m {\n"
                 "  batch 4; dim 4;\n"
                 "  seq history : id max 8; sparse ad : id; multihot tags : id max 3;\n"
                 "  label click; label convert;\n"
                 "  table items : rows 30;\n"
                 "  h = embed(items, history);\n"
                 "  a = embed(items, ad);\n"
                 "  t = embed(items, tags, pool = mean);\n"
                 "  s = embed(items, history, pool = sum);\n"
                 "  p = pma(h, seeds = 1, heads = 1, act = silu);\n"
                 "  ctr = linear(concat(flatten(p), a, t, s), 1);\n"
                 "  cvr = linear(a, 1);\n"
                 "  loss 2.0 * bce(ctr, click) + 0.25 * bce(cvr, convert);\n"
                 "}\n");
  Ir *ir = &c.ir;
  assert_verifies(ir);
  assert_int_equal(count_op(ir, OP_TABLE_GRAD), 1);
  Node *tg = node(ir, "items.grad");
  assert_int_equal(tg->op, OP_TABLE_GRAD);
  assert_ins(ir, tg, "items,history,h.grad,ad,a.grad,tags,t.grad.per_id,history,s.grad.per_id");
  const Tensor *rows = tensor(ir, "items.grad");
  assert_int_equal(rows->layout, LAYOUT_ROWS);
  assert_int_equal(rows->table, idx(ir, "items"));
  assert_int_equal(rows->width, 4);
  assert_int_equal(rows->dtype, DT_F32);
  assert_int_equal(ir_grad_of(ir, idx(ir, "items")), idx(ir, "items.grad"));
  Node *mean = node(ir, "t.grad.per_id"), *sum = node(ir, "s.grad.per_id");
  assert_int_equal(mean->op, OP_EMBED_POOL_BWD);
  assert_int_equal(mean->pool, POOL_MEAN);
  assert_ins(ir, mean, "tags,t.grad");
  assert_int_equal(sum->pool, POOL_SUM);
  assert_int_equal(tensor(ir, "t.grad.per_id")->jag, tensor(ir, "tags")->jag);
  // The loss weights seed each bce_bwd.
  assert_true(node(ir, "ctr.grad")->weight == 2.0);
  assert_true(node(ir, "cvr.grad")->weight == 0.25);
  assert_int_equal(count_op(ir, OP_LOSS_SUM), 1);
  release(&c);
}

// 15 lookups of one table fit in one table_grad (31 inputs); a 16th is refused by sema with a
// clear error, and by autodiff on an IR built by hand.
static void test_autodiff_lookup_limit(void **state) {
  (void)state;
  char text[4096];
  for (int n = 15; n <= 16; n++) {
    size_t used = (size_t)snprintf(text, sizeof text, "model m {\n  batch 4; dim 4;\n"
                                   "  sparse ad : id; label click;\n  table t : rows 10;\n"
                                   "  e = embed(t, ad)");
    for (int k = 1; k < n; k++)
      used += (size_t)snprintf(text + used, sizeof text - used, " + embed(t, ad)");
    snprintf(text + used, sizeof text - used, ";\n  loss bce(linear(e, 1), click);\n}\n");
    Compiled c;
    bool ok = compile_text(&c, "lookups.gem", text, strlen(text), true);
    if (n == 15) {
      assert_true(ok);
      assert_verifies(&c.ir);
      assert_int_equal(node(&c.ir, "t.grad")->nins, 31);
      assert_round_trip(&c.ir);
    } else {
      assert_false(ok);
      assert_non_null(strstr(c.errors, "error: table 't' is looked up more than 15 times"));
    }
    release(&c);
  }

  // By hand: 16 embed nodes of one table, which sema would refuse.
  Arena a = {0};
  Ir ir;
  ir_init(&ir, &a);
  ir.model = "m";
  ir.target = "sm_90a";
  ir.batch = 4;
  ir.dim = 4;
  ir.dense_optim = (Optim){OPTIM_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0};
  Tensor ids = {.name = "ad", .kind = TENSOR_INPUT, .layout = LAYOUT_DENSE, .jag = -1,
                .dtype = DT_I64, .producer = -1};
  int ad = ir_add_tensor(&ir, &ids);
  Tensor lab = {.name = "click", .kind = TENSOR_LABEL, .layout = LAYOUT_DENSE, .jag = -1,
                .dtype = DT_F32, .producer = -1};
  int click = ir_add_tensor(&ir, &lab);
  Tensor tab = {.name = "t", .kind = TENSOR_TABLE, .layout = LAYOUT_FIXED, .jag = -1,
                .nfixed = 2, .fixed = {10, 4}, .dtype = DT_F32, .producer = -1,
                .optim = {OPTIM_SGD, 0.1, 0, 0, 0, 0}, .loc = {3, 3, 3, 3}};
  int t = ir_add_tensor(&ir, &tab);
  Node cat = {.op = OP_CONCAT, .prec = DT_F32};
  for (int k = 0; k < 16; k++) {
    char name[16];
    snprintf(name, sizeof name, "e%d", k);
    Tensor v = {.name = name, .kind = TENSOR_VALUE, .layout = LAYOUT_DENSE, .jag = -1,
                .width = 4, .dtype = DT_F32, .producer = -1};
    Node e = {.op = OP_EMBED, .prec = DT_F32, .nins = 2, .ins = {t, ad}};
    e.out = ir_add_tensor(&ir, &v);
    ir_add_node(&ir, &e);
    cat.ins[cat.nins++] = e.out;
  }
  Tensor z = {.name = "z", .kind = TENSOR_VALUE, .layout = LAYOUT_DENSE, .jag = -1,
              .width = 64, .dtype = DT_F32, .producer = -1};
  cat.out = ir_add_tensor(&ir, &z);
  ir_add_node(&ir, &cat);
  Tensor wt = {.name = "w", .kind = TENSOR_PARAM, .layout = LAYOUT_FIXED, .jag = -1,
               .nfixed = 2, .fixed = {64, 1}, .dtype = DT_F32, .producer = -1};
  int w = ir_add_tensor(&ir, &wt);
  Node lin = {.op = OP_LINEAR, .prec = DT_F32, .nins = 2, .ins = {cat.out, w}};
  Tensor y = {.name = "y", .kind = TENSOR_VALUE, .layout = LAYOUT_DENSE, .jag = -1, .width = 1,
              .dtype = DT_F32, .producer = -1};
  lin.out = ir_add_tensor(&ir, &y);
  ir_add_node(&ir, &lin);
  Tensor s = {.name = "loss", .kind = TENSOR_VALUE, .layout = LAYOUT_SCALAR, .jag = -1,
              .dtype = DT_F32, .producer = -1};
  Node bce = {.op = OP_BCE, .nins = 2, .ins = {lin.out, click}, .task = "click"};
  bce.out = ir_add_tensor(&ir, &s);
  ir_add_node(&ir, &bce);
  ir.loss = bce.out;
  assert_verifies(&ir);
  int nnodes = ir.nnodes;
  char *buf = NULL;
  size_t size = 0;
  FILE *err = open_memstream(&buf, &size);
  Diag d;
  diag_init(&d, NULL, err);
  assert_false(autodiff(&ir, &d));
  fclose(err);
  assert_non_null(strstr(buf, "table 't' is looked up 16 times"));
  assert_int_equal(ir.nnodes, nnodes);  // nothing was emitted
  assert_int_equal(ir.nforward, nnodes);
  free(buf);
  arena_free(&a);
}

// Attention: three backward ops with every forward attribute; PMA's seeds get an fp32
// fixed gradient; k and v that are one tensor get two contributions, k's first.
static void test_autodiff_attention(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, "model m {\n"
                 "  batch 4; dim 8; precision bf16;\n"
                 "  seq history : id max 8; label click;\n"
                 "  table items : rows 30;\n"
                 "  h = embed(items, history);\n"
                 "  h = h + gdpa(h, heads = 2, act = gelu, mask = causal, window = 3,\n"
                 "               hstu_norm = true) @schedule(gelu = taylor, tile_q = 64);\n"
                 "  p = pma(h, seeds = 2, heads = 2, act = softmax);\n"
                 "  y = linear(flatten(p), 1);\n"
                 "  loss bce(y, click);\n"
                 "}\n");
  Ir *ir = &c.ir;
  assert_verifies(ir);
  static const OpKind ops[] = {OP_ATTENTION_BWD_Q, OP_ATTENTION_BWD_K, OP_ATTENTION_BWD_V};
  static const char *const outs[] = {"h.gdpa0.q.grad", "h.gdpa0.k.grad", "h.gdpa0.v.grad"};
  const Node *fwd = node(ir, "h.gdpa0.attn");
  for (int k = 0; k < 3; k++) {
    Node *n = node(ir, outs[k]);
    assert_int_equal(n->op, ops[k]);
    assert_ins(ir, n, "h.gdpa0.q,h.gdpa0.k,h.gdpa0.v,h.gdpa0.attn.grad");
    assert_int_equal(n->shape, ATTN_SELF);
    assert_int_equal(n->heads, 2);
    assert_int_equal(n->act, ACT_GELU);
    assert_int_equal(n->mask, MASK_CAUSAL);
    assert_int_equal(n->window, 3);
    assert_true(n->scale == fwd->scale);
    assert_true(n->hstu_norm);
    assert_int_equal(n->prec, DT_BF16);
    assert_int_equal(n->sched.gelu_taylor, 1);  // the gelu hint changes what act' is
    assert_int_equal(n->sched.tile_q, 0);       // tiles are the forward kernel's
    assert_int_equal(tensor(ir, outs[k])->dtype, DT_BF16);
  }
  const Tensor *seeds = tensor(ir, "p.pma0.seeds.grad");
  assert_int_equal(seeds->layout, LAYOUT_FIXED);
  assert_int_equal(seeds->dtype, DT_F32);
  assert_int_equal(seeds->fixed[0], 2);
  assert_int_equal(node(ir, "p.pma0.seeds.grad")->op, OP_ATTENTION_BWD_Q);
  assert_int_equal(node(ir, "p.pma0.seeds.grad")->act, ACT_SOFTMAX);
  assert_round_trip(ir);
  release(&c);
}

// IR text sema never writes: one weight used by two linears (fixed fp32 contributions summed
// by add), PMA whose k and v are one tensor (two contributions, k's first), and a loss that is
// a bce itself (weight 1).
static const char shared_ir[] =
    "model shared\n"
    "batch 4\n"
    "dim 4\n"
    "jagged *s L_s=8\n"
    "input %s : i64 jagged[B, *s]\n"
    "label %y : fp32 dense[B]\n"
    "table @t : fp32 fixed[10, 4] sgd lr=0.1\n"
    "param @seeds : fp32 fixed[1, 4]\n"
    "param @w : fp32 fixed[4, 4]\n"
    "param @out : fp32 fixed[4, 1]\n"
    "%e : fp32 jagged[B, *s, 4] = embed @t, %s {prec=fp32}\n"
    "%k : fp32 jagged[B, *s, 4] = linear %e, @w {act=silu, prec=fp32}\n"
    "%p : fp32 set[B, 1, 4] = attention @seeds, %k, %k {shape=pma, heads=1, act=relu, "
    "mask=none, window=0, scale=0.5, hstu_norm=false, prec=fp32}\n"
    "%f : fp32 dense[B, 4] = flatten %p {prec=fp32}\n"
    "%g : fp32 dense[B, 4] = linear %f, @w {act=none, prec=fp32}\n"
    "%z : fp32 dense[B, 1] = linear %g, @out {act=none, prec=fp32}\n"
    "%loss : fp32 scalar[] = bce %z, %y {task=\"y\"}\n"
    "loss %loss\n";

static void test_autodiff_shared_weight_and_kv(void **state) {
  (void)state;
  SourceFile f;
  source_from_memory(&f, "shared.ir", shared_ir, strlen(shared_ir));
  Diag d;
  diag_init(&d, &f, stderr);
  Arena a = {0};
  Ir ir;
  assert_true(ir_read(&f, &a, &d, &ir));
  assert_verifies(&ir);
  assert_true(autodiff(&ir, &d));
  assert_verifies(&ir);
  assert_true(node(&ir, "z.grad")->weight == 1.0);
  // @w: the first use (%k's linear) is contribution 0.
  assert_ins(&ir, node(&ir, "w.grad.0"), "e,k.pre.grad");
  assert_ins(&ir, node(&ir, "w.grad.1"), "f,g.grad");
  Node *sum = node(&ir, "w.grad");
  assert_int_equal(sum->op, OP_ADD);
  assert_ins(&ir, sum, "w.grad.0,w.grad.1");
  assert_int_equal(ir.tensors[sum->out].layout, LAYOUT_FIXED);
  assert_int_equal(sum->prec, DT_F32);
  assert_int_equal(ir_grad_of(&ir, idx(&ir, "w")), sum->out);
  // %k as k and as v.
  assert_int_equal(node(&ir, "k.grad.0")->op, OP_ATTENTION_BWD_K);
  assert_int_equal(node(&ir, "k.grad.1")->op, OP_ATTENTION_BWD_V);
  assert_ins(&ir, node(&ir, "k.grad"), "k.grad.0,k.grad.1");
  assert_round_trip(&ir);
  arena_free(&a);
}

static void test_autodiff_refuses_twice_and_no_loss(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, mlp_model);
  FILE *devnull = fopen("/dev/null", "w");
  Diag d;
  diag_init(&d, NULL, devnull);
  int nnodes = c.ir.nnodes;
  assert_false(autodiff(&c.ir, &d));
  assert_int_equal(d.errors, 1);
  assert_int_equal(c.ir.nnodes, nnodes);
  c.ir.loss = -1;
  c.ir.nforward = c.ir.nnodes;
  c.ir.ngrads = 0;
  c.ir.in_backward = false;
  assert_false(autodiff(&c.ir, &d));
  assert_int_equal(d.errors, 2);
  fclose(devnull);
  release(&c);
}

// dce after autodiff keeps every gradient and what it reads.
static void test_autodiff_dce_keeps_the_backward(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, mlp_model);
  char *before = print_text(&c.ir);
  FILE *devnull = fopen("/dev/null", "w");
  Diag d;
  diag_init(&d, NULL, devnull);
  assert_true(passes_run(&c.ir, &d, NULL, NULL));
  char *after = print_text(&c.ir);
  assert_string_equal(before, after);
  fclose(devnull);
  free(before);
  free(after);
  release(&c);
}

// Every example model and every golden .gem that checks: autodiff, verify, round-trip.
static void test_autodiff_every_model_and_golden_file(void **state) {
  (void)state;
  glob_t g;
  assert_int_equal(glob("models/*.gem", 0, NULL, &g), 0);
  assert_int_equal(glob("tests/golden/*.gem", GLOB_APPEND, NULL, &g), 0);
  int differentiated = 0, models = 0;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    const char *path = g.gl_pathv[i];
    SourceFile src;
    assert_true(source_read(&src, path));
    Compiled c;
    bool front = compile_text(&c, path, src.text, src.size, false);
    if (front) {
      FILE *err = fopen("/dev/null", "w");
      Diag d;
      diag_init(&d, &c.src, err);
      bool ok = autodiff(&c.ir, &d);
      fclose(err);
      if (!ok) fprintf(stderr, "autodiff failed on %s\n", path);
      assert_true(ok);
      assert_true(c.ir.nforward < c.ir.nnodes);
      assert_true(c.ir.ngrads > 0);
      assert_verifies(&c.ir);
      assert_round_trip(&c.ir);
      differentiated++;
      models += strncmp(path, "models/", 7) == 0;
    }
    release(&c);
    source_free(&src);
  }
  globfree(&g);
  fprintf(stderr, "  differentiated %d files (%d models)\n", differentiated, models);
  assert_true(models >= 4);
  assert_true(differentiated >= 10);
}

// --- the verifier on the backward ops -------------------------------------------------------
// One model with every backward op; each rule mutates it so that exactly one rule breaks.

static const char every_model[] =
    "model every {\n"
    "  batch 4;\n"
    "  dim 8;\n"
    "  seq history : id max 16;\n"
    "  sparse ad : id;\n"
    "  multihot tags : id max 4;\n"
    "  dense c : f32[3];\n"
    "  label click;\n"
    "  label convert;\n"
    "  table items : rows 50;\n"
    "  h = embed(items, history);\n"
    "  a = embed(items, ad);\n"
    "  t = embed(items, tags, pool = mean);\n"
    "  u = linear(c, 8);\n"
    "  h = h + gdpa(rmsnorm(h), heads = 2, act = silu, mask = causal);\n"
    "  p = pma(h, seeds = 2, heads = 2, act = softmax);\n"
    "  m = relu(a) * t - layernorm(u);\n"
    "  s = flatten(stack(a, m, t));\n"
    "  i = dot_interact(a, m, t);\n"
    "  y = mlp(concat(flatten(p), s, i), [8, 1], act = gelu);\n"
    "  z = linear(a, 1);\n"
    "  loss bce(y, click) + 0.5 * bce(z, convert);\n"
    "}\n";

static Node *op0(Ir *ir, OpKind op) {
  Node *n = nth_op(ir, op, 0);
  assert_non_null(n);
  return n;
}
static Tensor *out0(Ir *ir, OpKind op) { return &ir->tensors[op0(ir, op)->out]; }
static int grad_index(const Ir *ir, const char *param) {
  for (int g = 0; g < ir->ngrads; g++)
    if (strcmp(name_of(ir, ir->grads[g].param), param) == 0) return g;
  fail();
  return -1;
}

#define RULES(X)                                                                               \
  X(nforward_range, "header: nforward = ", ir->nforward = ir->nnodes + 1)                      \
  X(backward_op_in_forward, "is a backward op; it belongs after the backward line",           \
    ir->nforward++)                                                                            \
  X(loss_in_backward, "loss_sum computes the loss; it belongs before the backward line",      \
    ir->nforward = ir->tensors[ir->loss].producer)                                             \
  X(scale_finite, "scale must be finite", op0(ir, OP_SCALE)->scale = INFINITY)                 \
  X(slice_start, "start = -1 must be in 0..", op0(ir, OP_SLICE)->start = -1)                   \
  X(slice_width, "with a width in 1..", op0(ir, OP_SLICE)->start = 30)                         \
  X(unstack_start, "start = 3 must be in 0..2 (the set's n - 1)",                              \
    op0(ir, OP_UNSTACK)->start = 3)                                                            \
  X(unstack_set, "x must be a set[B, n, d], not fp32 dense[B, 8]",                            \
    op0(ir, OP_UNSTACK)->ins[0] = idx(ir, "a"))                                                \
  X(unflatten_output, "expected a set[B, k, d] with k·d = 16", out0(ir, OP_UNFLATTEN)->set_k = 4) \
  X(reduce_rows_output, "expected fp32 fixed[1]", out0(ir, OP_REDUCE_ROWS)->fixed[0] = 7)      \
  X(act_bwd_pointwise, "act=softmax: act_bwd needs a pointwise activation",                   \
    op0(ir, OP_ACT_BWD)->act = ACT_SOFTMAX)                                                    \
  X(act_bwd_shapes, "dy and x must have one shape",                                            \
    op0(ir, OP_ACT_BWD)->ins[0] = idx(ir, "h"))                                                \
  X(act_bwd_dtype, "the gradient of x (input 1) is fp32", out0(ir, OP_ACT_BWD)->dtype = DT_BF16) \
  X(linear_act_bwd_weight, "the weight (input 2) must be a parameter fixed[",                  \
    op0(ir, OP_LINEAR_ACT_BWD)->ins[2] = idx(ir, "z.linear0.w"))                               \
  X(linear_act_bwd_act, "act=none: linear_act_bwd needs a pointwise activation",              \
    op0(ir, OP_LINEAR_ACT_BWD)->act = ACT_NONE)                                                \
  X(linear_act_bwd_dtype, "the gradient of dy (input 0) is fp32",                              \
    out0(ir, OP_LINEAR_ACT_BWD)->dtype = DT_FP16)                                              \
  X(linear_bwd_x_weight, "the weight (input 1) must be a parameter fixed[d, 1]",               \
    op0(ir, OP_LINEAR_BWD_X)->ins[1] = idx(ir, "u.linear0.w"))                                 \
  X(linear_bwd_w_rows, "x and dz must share one layout",                                       \
    op0(ir, OP_LINEAR_BWD_W)->ins[0] = idx(ir, "h"))                                           \
  X(linear_bwd_w_output, "the output is fp32 fixed[8, 2]; expected fp32 fixed[8, 1]",          \
    out0(ir, OP_LINEAR_BWD_W)->fixed[1] = 2)                                                   \
  X(norm_bwd_eps, "eps must be finite and non-negative", op0(ir, OP_RMSNORM_BWD_X)->eps = -1)  \
  X(norm_bwd_gain, "the gain (input 2) must be a parameter fixed[8]",                          \
    op0(ir, OP_LAYERNORM_BWD_X)->ins[2] = idx(ir, "z.linear0.w"))                              \
  X(norm_bwd_gain_output, "expected fp32 fixed[8]",                                            \
    out0(ir, OP_RMSNORM_BWD_GAIN)->fixed[0] = 9)                                               \
  X(dot_interact_bwd_start, "start = 3 must name one of the 3 inputs",                         \
    op0(ir, OP_DOT_INTERACT_BWD)->start = 3)                                                   \
  X(dot_interact_bwd_dy, "dy must be dense[B, 3] for 3 inputs",                                \
    op0(ir, OP_DOT_INTERACT_BWD)->ins[0] = idx(ir, "a"))                                       \
  X(attention_bwd_do, "dO must be shaped like the attention's output",                         \
    op0(ir, OP_ATTENTION_BWD_K)->ins[3] = idx(ir, "a"))                                        \
  X(attention_bwd_heads, "heads = 3 must be positive and divide d = 8",                        \
    op0(ir, OP_ATTENTION_BWD_V)->heads = 3)                                                    \
  X(attention_bwd_pma_q, "the output is fp32 fixed[3, 8]; expected fp32 fixed[2, 8]",          \
    tensor(ir, "p.pma0.seeds.grad")->fixed[0] = 3)                                             \
  X(attention_bwd_dtype, "the gradient of k (input 1) is fp32",                                \
    out0(ir, OP_ATTENTION_BWD_K)->dtype = DT_BF16)                                             \
  X(bce_bwd_weight, "weight must be positive and finite", op0(ir, OP_BCE_BWD)->weight = 0)      \
  X(bce_bwd_label, "input 1 must be a label", op0(ir, OP_BCE_BWD)->ins[1] = idx(ir, "ad"))     \
  X(bce_bwd_output, "expected fp32 dense[B, 1]", out0(ir, OP_BCE_BWD)->width = 2)              \
  X(embed_pool_bwd_ids, "must be an i64 input jagged[B, *s]",                                  \
    op0(ir, OP_EMBED_POOL_BWD)->ins[0] = idx(ir, "ad"))                                        \
  X(embed_pool_bwd_pool, "pool is 7", op0(ir, OP_EMBED_POOL_BWD)->pool = (Pool)7)               \
  X(embed_pool_bwd_dtype, "the output dtype is bf16; embed_pool_bwd gives fp32",               \
    out0(ir, OP_EMBED_POOL_BWD)->dtype = DT_BF16)                                              \
  X(table_grad_table, "input 0 must be a table",                                               \
    op0(ir, OP_TABLE_GRAD)->ins[0] = idx(ir, "u.linear0.w"))                                   \
  X(table_grad_unpaired, "leave one unpaired", op0(ir, OP_TABLE_GRAD)->nins--)                 \
  X(table_grad_dy, "dy (input 2) must be fp32 jagged[B, *history, 8] to match its ids",        \
    op0(ir, OP_TABLE_GRAD)->ins[2] = idx(ir, "a.grad"))                                        \
  X(table_grad_arity, "table_grad takes 3 to 32 inputs, not 1", op0(ir, OP_TABLE_GRAD)->nins = 1) \
  X(rows_table, "a rows tensor names a table", out0(ir, OP_TABLE_GRAD)->table = idx(ir, "c"))  \
  X(rows_width, "a table gradient is an fp32 value rows[U_items, 8]",                          \
    out0(ir, OP_TABLE_GRAD)->width = 4)                                                        \
  X(fixed_value_dtype, "a value is fixed only as a parameter gradient",                        \
    out0(ir, OP_LINEAR_BWD_W)->dtype = DT_BF16)                                                \
  X(gradient_storage, "a gradient is stored in fp32, bf16 or fp16",                            \
    out0(ir, OP_SLICE)->dtype = DT_F64)                                                        \
  X(grad_param_kind, "is not a parameter or table", ir->grads[0].param = idx(ir, "c"))          \
  X(grad_duplicate, "already has a gradient", ir->grads[1].param = ir->grads[0].param)          \
  X(grad_forward_value, "the gradient must be a value a backward node writes",                 \
    ir->grads[grad_index(ir, "z.linear0.w")].grad = idx(ir, "a"))                              \
  X(grad_param_shape, "expected fp32 shaped like @z.linear0.w",                                \
    ir->grads[grad_index(ir, "z.linear0.w")].grad = idx(ir, "z.linear0.b.grad"))               \
  X(grad_table_rows, "expected fp32 rows[U_items, 8]",                                         \
    ir->grads[grad_index(ir, "items")].grad = idx(ir, "z.linear0.b.grad"))                     \
  X(grad_index, "a tensor index is out of range", ir->grads[0].grad = 100000)

#define X(name, reason, ...) \
  static void break_##name(Ir *ir) { __VA_ARGS__; }
RULES(X)
#undef X

typedef struct Rule {
  const char *name;
  void (*breaks)(Ir *ir);
  const char *reason;
} Rule;

static Rule rules[] = {
#define X(name, reason, ...) {#name, break_##name, reason},
    RULES(X)
#undef X
};

static void test_autodiff_verify_rule(void **state) {
  const Rule *rule = *state;
  Compiled c;
  compile_ok(&c, every_model);
  char err[1024];
  assert_true(ir_verify(&c.ir, err, sizeof err));
  rule->breaks(&c.ir);
  bool ok = ir_verify(&c.ir, err, sizeof err);
  if (ok || !strstr(err, rule->reason))
    fprintf(stderr, "rule %s: want \"%s\"\n  got %s: \"%s\"\n", rule->name, rule->reason,
            ok ? "pass" : "fail", err);
  assert_false(ok);
  assert_non_null(strstr(err, rule->reason));
  release(&c);
}

// The model with every backward op has them all, verifies and round-trips.
static void test_autodiff_every_backward_op(void **state) {
  (void)state;
  Compiled c;
  compile_ok(&c, every_model);
  for (int op = OP_SLICE; op < OP_COUNT; op++) {
    if (count_op(&c.ir, (OpKind)op) == 0) fprintf(stderr, "no %s\n", op_name((OpKind)op));
    assert_true(count_op(&c.ir, (OpKind)op) > 0);
  }
  assert_true(count_op(&c.ir, OP_SCALE) > 0);
  assert_round_trip(&c.ir);
  release(&c);
}

int main(void) {
  const struct CMUnitTest fixed[] = {
      cmocka_unit_test(test_autodiff_linear_with_act_and_bias),
      cmocka_unit_test(test_autodiff_grads_exist_and_inputs_get_none),
      cmocka_unit_test(test_autodiff_skips_branches_without_parameters),
      cmocka_unit_test(test_autodiff_accumulates_in_use_order),
      cmocka_unit_test(test_autodiff_add_sub_mul),
      cmocka_unit_test(test_autodiff_table_grad_merges_lookups),
      cmocka_unit_test(test_autodiff_lookup_limit),
      cmocka_unit_test(test_autodiff_attention),
      cmocka_unit_test(test_autodiff_shared_weight_and_kv),
      cmocka_unit_test(test_autodiff_refuses_twice_and_no_loss),
      cmocka_unit_test(test_autodiff_dce_keeps_the_backward),
      cmocka_unit_test(test_autodiff_every_model_and_golden_file),
      cmocka_unit_test(test_autodiff_every_backward_op),
  };
  enum { NFIXED = sizeof fixed / sizeof fixed[0], NRULES = sizeof rules / sizeof rules[0] };
  static struct CMUnitTest tests[NFIXED + NRULES];
  static char names[NRULES][96];
  memcpy(tests, fixed, sizeof fixed);
  for (int i = 0; i < NRULES; i++) {
    snprintf(names[i], sizeof names[i], "test_autodiff_verify_rejects_%s", rules[i].name);
    tests[NFIXED + i] = (struct CMUnitTest){names[i], test_autodiff_verify_rule, NULL, NULL,
                                            &rules[i]};
  }
  return _cmocka_run_group_tests("test_autodiff", tests, NFIXED + NRULES, NULL, NULL);
}
