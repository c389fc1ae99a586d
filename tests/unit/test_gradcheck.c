// test_gradcheck.c: the backward pass of every op, activation, mask and attention shape against
// central finite differences, in fp64.
//
// Each case is a small model written in .gem source. It goes through the whole front end
// (parse_model, sema_lower, passes_run, autodiff), runs on the CPU executor in EXEC_F64 with
// random parameters and a random batch (jagged lengths include 0 and 1, ids repeat), and one
// generic checker, check_gradients, compares the gradient of every parameter and every table
// with (L(θ + h) − L(θ − h)) / 2h, h = 1e-6, to a relative 1e-6. Tensors of up to 96 elements
// are checked whole, larger ones at 96 random elements; every touched table row is checked
// whole, and rows the batch did not touch must get no gradient row (and a zero difference).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "arena.h"
#include "ast.h"
#include "autodiff.h"
#include "batch.h"
#include "cpu_exec.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"

enum { CHECK_MAX_ELEMS = 96, BATCH_EXAMPLES = 5 };
static const double FD_STEP = 1e-6;
static const double REL_TOL = 1e-6;
static const double ABS_TOL = 1e-9;

// --- a deterministic random stream ------------------------------------------------------

static uint64_t rng_state;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }
static int64_t rng_below(int64_t n) { return (int64_t)(rng_next() % (uint64_t)n); }
static double rng_sym(double a) { return a * (2 * rng_unit() - 1); }

// Which ops the cases so far have run: the last test checks that every op of ops.def was
// differentiated at least once.
static bool op_seen[OP_COUNT];

// --- one case: a compiled model, its executor and a batch -------------------------------

typedef struct Case {
  Arena arena;
  SourceFile src;
  char *text;
  Ir ir;
  Schema schema;
  Batch batch;
  CpuExec *x;
} Case;

// The source of a model: the shared inputs and tables, then `body`.
static char *model_source(const char *body) {
  static const char *const head =
      "model g {\n"
      "  batch 4;\n"
      "  dim 8;\n"
      "  seq history : id max 7;\n"
      "  seq actions : id like history;\n"
      "  seq prices : f32[3] like history;\n"
      "  seq other : id max 5;\n"
      "  sparse ad : id;\n"
      "  sparse user : id;\n"
      "  multihot tags : id max 4;\n"
      "  dense counters : f32[3];\n"
      "  label click;\n"
      "  label buy;\n"
      "  table items : rows 13;\n"
      "  table tagt : rows 9;\n";
  size_t n = strlen(head) + strlen(body) + 8;
  char *s = malloc(n);
  assert_non_null(s);
  snprintf(s, n, "%s%s\n}\n", head, body);
  return s;
}

// Source text -> IR with its backward graph (the same path as `gemc ir --grad`).
static void case_compile(Case *c, const char *body) {
  memset(c, 0, sizeof *c);
  c->text = model_source(body);
  char *diags = NULL;
  size_t diags_len = 0;
  FILE *f = open_memstream(&diags, &diags_len);
  assert_non_null(f);
  source_from_memory(&c->src, "gradcheck.gem", c->text, strlen(c->text));
  Diag d;
  diag_init(&d, &c->src, f);
  ir_init(&c->ir, &c->arena);
  Model *ast = parse_model(&c->src, &c->arena, &d);
  bool ok = ast && d.errors == 0 && sema_lower(ast, NULL, &d, &c->ir) && d.errors == 0;
  ok = ok && passes_run(&c->ir, &d, NULL, NULL) && d.errors == 0;
  ok = ok && autodiff(&c->ir, &d) && d.errors == 0;
  fclose(f);
  if (!ok) {
    print_message("the model does not compile:\n%s\n%s", c->text, diags);
    free(diags);
    fail();
  }
  free(diags);
  char err[512];
  if (!ir_verify(&c->ir, err, sizeof err)) {
    print_message("the backward IR fails verification: %s\n", err);
    fail();
  }
  for (int i = 0; i < c->ir.nnodes; i++) op_seen[c->ir.nodes[i].op] = true;
  schema_from_ir(&c->ir, &c->schema);
}

// A random batch: example 0 of every sequence is empty, example 1 has one position, example 2
// is full, the others are random; ids are drawn from two thirds of the rows, so ids repeat
// and some rows stay untouched.
static void case_random_batch(Case *c, int64_t B) {
  batch_alloc(&c->batch, &c->schema, B);
  Batch *b = &c->batch;
  for (int j = 0; j < c->ir.njagged; j++) {
    int64_t max = c->ir.jagged[j].max_len;
    b->offsets[j][0] = 0;
    for (int64_t e = 0; e < B; e++) {
      int64_t len = e == 0 ? 0 : e == 1 ? 1 : e == 2 ? max : rng_below(max + 1);
      b->offsets[j][e + 1] = b->offsets[j][e] + len;
    }
    b->total[j] = b->offsets[j][B];
  }
  for (int i = 0; i < c->schema.nfeatures; i++) {
    const Feature *f = &c->schema.features[i];
    int64_t n = (f->jag >= 0 ? b->total[f->jag] : B) * f->width;
    batch_reserve(b, i, n);
    for (int64_t k = 0; k < n; k++) {
      if (f->kind == FEATURE_IDS) {
        int64_t limit = f->id_limit > 0 ? f->id_limit : 10;
        b->ids[i][k] = rng_below(limit * 2 / 3 + 1);
      } else if (f->kind == FEATURE_LABEL) {
        b->values[i][k] = (float)rng_below(2);
      } else {
        b->values[i][k] = (float)rng_sym(1.0);
      }
    }
  }
}

// Every parameter and table gets random values (gains around 1), so no check sits at a
// special point such as zero biases.
static void case_random_params(Case *c) {
  for (int t = 0; t < c->ir.ntensors; t++) {
    const Tensor *tt = &c->ir.tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    double *w = cpu_exec_data(c->x, t);
    int64_t n = cpu_exec_numel(c->x, t);
    bool gain = strstr(tt->name, "gain") != NULL;
    for (int64_t i = 0; i < n; i++) w[i] = (gain ? 1.0 : 0.0) + rng_sym(0.6);
  }
}

static void case_free(Case *c) {
  cpu_exec_free(c->x);
  batch_free(&c->batch);
  arena_free(&c->arena);
  free(c->text);
}

// --- the generic checker ----------------------------------------------------------------

static double loss_at(Case *c) { return cpu_exec_forward(c->x); }

// Central difference of the loss in element i of tensor t.
static double finite_difference(Case *c, int t, int64_t i) {
  double *w = cpu_exec_data(c->x, t);
  double saved = w[i];
  w[i] = saved + FD_STEP;
  double plus = loss_at(c);
  w[i] = saved - FD_STEP;
  double minus = loss_at(c);
  w[i] = saved;
  return (plus - minus) / (2 * FD_STEP);
}

static int failures;
static double loss_scale;  // |L| at the checked point: the rounding noise of a difference

static void compare(Case *c, int t, int64_t i, double analytic, double numeric) {
  double err = fabs(analytic - numeric);
  double noise = 8 * DBL_EPSILON * loss_scale / FD_STEP;
  double allowed = REL_TOL * fmax(fabs(analytic), fabs(numeric)) + ABS_TOL + noise;
  if (err <= allowed && isfinite(analytic)) return;
  if (failures++ < 8)
    print_message("gradient of @%s[%lld]: backward %.12g, finite difference %.12g\n",
                  c->ir.tensors[t].name, (long long)i, analytic, numeric);
}

// Elements of a tensor of n to check: all of them, or CHECK_MAX_ELEMS random ones.
static int64_t pick_element(int64_t n, int64_t k) {
  return n <= CHECK_MAX_ELEMS ? k : rng_below(n);
}

static void check_param(Case *c, int t, const double *grad) {
  int64_t n = cpu_exec_numel(c->x, t);
  double *g = malloc((size_t)n * sizeof *g);
  memcpy(g, grad, (size_t)n * sizeof *g);  // the finite differences rerun the forward pass
  int64_t count = n <= CHECK_MAX_ELEMS ? n : CHECK_MAX_ELEMS;
  for (int64_t k = 0; k < count; k++) {
    int64_t i = pick_element(n, k);
    compare(c, t, i, g[i], finite_difference(c, t, i));
  }
  free(g);
}

static void check_table(Case *c, int t, const double *grad, int64_t nrows,
                        const int64_t *row_ids) {
  const Tensor *tt = &c->ir.tensors[t];
  int64_t R = tt->fixed[0], D = tt->fixed[1];
  // Row ids are distinct and ascending.
  for (int64_t r = 1; r < nrows; r++) assert_true(row_ids[r - 1] < row_ids[r]);
  double *g = malloc((size_t)(nrows * D + 1) * sizeof *g);
  memcpy(g, grad, (size_t)(nrows * D) * sizeof *g);
  int64_t *ids = malloc((size_t)(nrows + 1) * sizeof *ids);
  memcpy(ids, row_ids, (size_t)nrows * sizeof *ids);
  int64_t checked = 0;
  for (int64_t r = 0; r < nrows && checked < 4 * CHECK_MAX_ELEMS; r++)
    for (int64_t j = 0; j < D; j++, checked++)
      compare(c, t, ids[r] * D + j, g[r * D + j], finite_difference(c, t, ids[r] * D + j));
  // A row without a gradient row does not move the loss.
  for (int64_t row = 0, u = 0; row < R; row++) {
    while (u < nrows && ids[u] < row) u++;
    if (u < nrows && ids[u] == row) continue;
    compare(c, t, row * D, 0.0, finite_difference(c, t, row * D));
  }
  free(g);
  free(ids);
}

// Compares the backward pass of the bound batch with finite differences, for every parameter
// and table of the model.
static void check_gradients(Case *c) {
  failures = 0;
  double loss = cpu_exec_forward(c->x);
  assert_true(isfinite(loss));
  loss_scale = fabs(loss);
  cpu_exec_backward(c->x);
  int trained = 0;
  for (int t = 0; t < c->ir.ntensors; t++) {
    const Tensor *tt = &c->ir.tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    int64_t nrows = -1;
    const int64_t *row_ids = NULL;
    const double *grad = cpu_exec_grad(c->x, t, &nrows, &row_ids);
    if (!grad) {
      print_message("@%s has no gradient\n", tt->name);
      failures++;
      continue;
    }
    trained++;
    if (tt->kind == TENSOR_TABLE)
      check_table(c, t, grad, nrows, row_ids);
    else
      check_param(c, t, grad);
  }
  assert_true(trained > 0);
  if (failures) print_message("%d mismatches in the model:\n%s", failures, c->text);
  assert_int_equal(failures, 0);
}

// Compiles `body`, binds a random batch and random parameters, and checks every gradient.
static void gradcheck(const char *body) {
  Case c;
  case_compile(&c, body);
  rng_state = 0x5eed0000u + strlen(body);
  c.x = cpu_exec_new(&c.ir, EXEC_F64);
  cpu_exec_init_params(c.x, 7);
  case_random_params(&c);
  case_random_batch(&c, BATCH_EXAMPLES);
  char err[256];
  if (!cpu_exec_set_batch(c.x, &c.batch, err, sizeof err)) {
    print_message("the batch does not bind: %s\n", err);
    fail();
  }
  check_gradients(&c);
  case_free(&c);
}

// --- dense ops --------------------------------------------------------------------------

static void test_gradcheck_linear_bias_and_fused_acts(void **state) {
  (void)state;
  static const char *const acts[] = {"relu", "silu", "gelu", "gelu_taylor", "sigmoid"};
  for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) {
    char body[512];
    snprintf(body, sizeof body,
             "  y = mlp(counters, [6, 5, 1], act = %s);\n"
             "  loss bce(y, click);\n",
             acts[i]);
    gradcheck(body);
  }
}

static void test_gradcheck_linear_without_bias(void **state) {
  (void)state;
  gradcheck("  y = linear(linear(counters, 5, bias = false), 1, bias = false);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_gelu_schedule_taylor(void **state) {
  (void)state;
  gradcheck("  y = mlp(counters, [6, 1], act = gelu) @schedule(gelu = taylor);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_pointwise_acts(void **state) {
  (void)state;
  gradcheck("  z = linear(counters, 8);\n"
            "  y = linear(concat(silu(z), gelu(z), gelu_taylor(z), relu(z), sigmoid(z)), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_add_sub_mul(void **state) {
  (void)state;
  gradcheck("  z = linear(counters, 8);\n"
            "  w = linear(counters, 8);\n"
            "  y = linear(z + w - z * w, 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_norms(void **state) {
  (void)state;
  gradcheck("  z = linear(counters, 8);\n"
            "  y = linear(layernorm(z) + rmsnorm(z), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_concat_stack_flatten_dot_interact(void **state) {
  (void)state;
  gradcheck("  a = embed(items, ad);\n"
            "  c = linear(counters, 8);\n"
            "  s = stack(a, c, a * c);\n"
            "  y = linear(concat(flatten(s), dot_interact(a, c, a + c), c), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_multi_task_loss(void **state) {
  (void)state;
  gradcheck("  z = mlp(concat(embed(items, ad), linear(counters, 8)), [6], act = gelu);\n"
            "  y1 = linear(z, 1);\n"
            "  y2 = linear(z, 1);\n"
            "  loss 1.0 * bce(y1, click, name = \"ctr\") + 0.5 * bce(y2, buy, name = \"cvr\");\n");
}

static void test_gradcheck_precision_annotations_ignored_in_fp64(void **state) {
  (void)state;
  gradcheck("  z = mlp(counters, [8, 8], act = silu) @mxfp8;\n"
            "  y = linear(rmsnorm(z) @bf16, 1) @fp8;\n"
            "  loss bce(y, click);\n");
}

// --- embeddings -------------------------------------------------------------------------

static void test_gradcheck_embed_sparse(void **state) {
  (void)state;
  gradcheck("  y = linear(embed(items, ad), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_embed_pooled_sum_and_mean(void **state) {
  (void)state;
  gradcheck("  t = embed(tagt, tags, pool = sum);\n"
            "  m = embed(items, history, pool = mean);\n"
            "  y = linear(concat(t, m), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_table_looked_up_four_times(void **state) {
  (void)state;
  gradcheck("  a = embed(items, ad);\n"
            "  u = embed(items, user);\n"
            "  m = embed(items, history, pool = mean);\n"
            "  s = embed(items, tags, pool = sum);\n"
            "  y = linear(concat(a, u * m, s), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_embed_sequence(void **state) {
  (void)state;
  gradcheck("  h = embed(items, history) + embed(tagt, actions) + linear(prices, 8);\n"
            "  p = pma(h, seeds = 2, heads = 2, act = silu);\n"
            "  y = linear(flatten(p), 1);\n"
            "  loss bce(y, click);\n");
}

// --- attention --------------------------------------------------------------------------

// Self-attention with activation `act` and mask arguments `mask` (e.g. ", mask = causal"),
// pre-normed and residual, then a PMA summary.
static void gradcheck_self(const char *act, const char *mask) {
  char body[1024];
  snprintf(body, sizeof body,
           "  h = embed(items, history) + linear(prices, 8);\n"
           "  h = h + gdpa(rmsnorm(h), heads = 2, act = %s%s);\n"
           "  p = pma(h, seeds = 2, heads = 2, act = silu);\n"
           "  y = linear(flatten(p), 1);\n"
           "  loss bce(y, click);\n",
           act, mask);
  gradcheck(body);
}

static const char *const attention_acts[] = {"softmax", "silu", "gelu", "gelu_taylor", "relu",
                                             "sigmoid"};
static const char *const attention_masks[] = {"", ", mask = causal", ", window = 2",
                                              ", mask = causal, window = 2"};

static void test_gradcheck_self_attention_every_act_and_mask(void **state) {
  (void)state;
  for (size_t a = 0; a < sizeof attention_acts / sizeof *attention_acts; a++)
    for (size_t m = 0; m < sizeof attention_masks / sizeof *attention_masks; m++)
      gradcheck_self(attention_acts[a], attention_masks[m]);
}

static void test_gradcheck_self_attention_hstu_norm(void **state) {
  (void)state;
  gradcheck_self("silu", ", mask = causal, hstu_norm = true");
  gradcheck_self("softmax", ", hstu_norm = true");
}

static void test_gradcheck_cross_attention_set_kv(void **state) {
  (void)state;
  for (size_t a = 0; a < sizeof attention_acts / sizeof *attention_acts; a++) {
    char body[1024];
    snprintf(body, sizeof body,
             "  q = embed(items, history);\n"
             "  kv = stack(embed(items, ad), linear(counters, 8));\n"
             "  x = gdpa(q = q, kv = kv, heads = 2, act = %s);\n"
             "  p = pma(x, seeds = 1, heads = 1, act = softmax);\n"
             "  y = linear(flatten(p), 1);\n"
             "  loss bce(y, click);\n",
             attention_acts[a]);
    gradcheck(body);
  }
}

static void test_gradcheck_cross_attention_jagged_kv(void **state) {
  (void)state;
  gradcheck("  q = embed(items, history);\n"
            "  x = gdpa(q = q, kv = embed(items, other), heads = 2, act = softmax);\n"
            "  z = gdpa(q = x, kv = embed(tagt, other), heads = 1, act = gelu);\n"
            "  p = pma(z, seeds = 2, heads = 2, act = sigmoid);\n"
            "  y = linear(flatten(p), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_pma_every_act(void **state) {
  (void)state;
  for (size_t a = 0; a < sizeof attention_acts / sizeof *attention_acts; a++) {
    char body[1024];
    snprintf(body, sizeof body,
             "  p = pma(embed(items, history), seeds = 3, heads = 2, act = %s);\n"
             "  y = linear(flatten(p), 1);\n"
             "  loss bce(y, click);\n",
             attention_acts[a]);
    gradcheck(body);
  }
}

static void test_gradcheck_pffn_dense_q(void **state) {
  (void)state;
  gradcheck("  a = embed(items, ad);\n"
            "  u = gdpa(q = a, kv = embed(items, history), heads = 2, act = silu);\n"
            "  w = gdpa(q = a, kv = embed(items, history), heads = 4, act = softmax);\n"
            "  y = linear(concat(u, w), 1);\n"
            "  loss bce(y, click);\n");
}

static void test_gradcheck_pffn_set_q(void **state) {
  (void)state;
  gradcheck("  s = stack(embed(items, ad), linear(counters, 8));\n"
            "  u = gdpa(q = s, kv = embed(items, history), heads = 2, act = softmax);\n"
            "  y = linear(flatten(u), 1);\n"
            "  loss bce(y, click);\n");
}

// Runs last: the cases above ran every op of ops.def, forward and backward.
static void test_gradcheck_every_op_was_checked(void **state) {
  (void)state;
  for (int op = 0; op < OP_COUNT; op++) {
    if (!op_seen[op]) print_message("no case runs op %s\n", op_name((OpKind)op));
    assert_true(op_seen[op]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradcheck_linear_bias_and_fused_acts),
      cmocka_unit_test(test_gradcheck_linear_without_bias),
      cmocka_unit_test(test_gradcheck_gelu_schedule_taylor),
      cmocka_unit_test(test_gradcheck_pointwise_acts),
      cmocka_unit_test(test_gradcheck_add_sub_mul),
      cmocka_unit_test(test_gradcheck_norms),
      cmocka_unit_test(test_gradcheck_concat_stack_flatten_dot_interact),
      cmocka_unit_test(test_gradcheck_multi_task_loss),
      cmocka_unit_test(test_gradcheck_precision_annotations_ignored_in_fp64),
      cmocka_unit_test(test_gradcheck_embed_sparse),
      cmocka_unit_test(test_gradcheck_embed_pooled_sum_and_mean),
      cmocka_unit_test(test_gradcheck_table_looked_up_four_times),
      cmocka_unit_test(test_gradcheck_embed_sequence),
      cmocka_unit_test(test_gradcheck_self_attention_every_act_and_mask),
      cmocka_unit_test(test_gradcheck_self_attention_hstu_norm),
      cmocka_unit_test(test_gradcheck_cross_attention_set_kv),
      cmocka_unit_test(test_gradcheck_cross_attention_jagged_kv),
      cmocka_unit_test(test_gradcheck_pma_every_act),
      cmocka_unit_test(test_gradcheck_pffn_dense_q),
      cmocka_unit_test(test_gradcheck_pffn_set_q),
      cmocka_unit_test(test_gradcheck_every_op_was_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
