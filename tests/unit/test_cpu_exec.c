// test_cpu_exec.c: the CPU executor's forward values, precision emulation, table gradients,
// batch binding and initialization.
//
// Models are written in .gem source and compiled by the real front end. Forward values are
// checked against hand-computed numbers (small integers, so most are exact) or, for attention,
// against a naive reference written here from docs/autodiff.md ("Attention, exactly"): every
// shape, softmax and pointwise acts, causal and windowed masks, hstu_norm and empty sequences.
// Precision: a bf16 node's output is exactly round_bf16 of the fp32 result, and fp8/mxfp8
// matmuls equal a reference that quantizes the operands (numerics.h) and then multiplies.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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
#include "cpu_exec_internal.h"
#include "diag.h"
#include "ir.h"
#include "numerics.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"

// --- a deterministic random stream ------------------------------------------------------

static uint64_t rng_state = 1;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_sym(double a) { return a * (2 * ((double)(rng_next() >> 11) * 0x1p-53) - 1); }
static int64_t rng_below(int64_t n) { return (int64_t)(rng_next() % (uint64_t)n); }

// --- compiling and running models -------------------------------------------------------

typedef struct Case {
  Arena arena;
  SourceFile src;
  char *text;
  Ir ir;
  Schema schema;
  Batch batch;
  CpuExec *x;
} Case;

// Compiles a whole model from source; with `grad`, appends its backward graph.
static void case_compile(Case *c, const char *text, bool grad) {
  memset(c, 0, sizeof *c);
  c->text = strdup(text);
  char *diags = NULL;
  size_t diags_len = 0;
  FILE *f = open_memstream(&diags, &diags_len);
  assert_non_null(f);
  source_from_memory(&c->src, "exec.gem", c->text, strlen(c->text));
  Diag d;
  diag_init(&d, &c->src, f);
  ir_init(&c->ir, &c->arena);
  Model *ast = parse_model(&c->src, &c->arena, &d);
  bool ok = ast && d.errors == 0 && sema_lower(ast, NULL, &d, &c->ir) && d.errors == 0;
  ok = ok && passes_run(&c->ir, &d, NULL, NULL) && d.errors == 0;
  if (grad) ok = ok && autodiff(&c->ir, &d) && d.errors == 0;
  fclose(f);
  if (!ok) print_message("the model does not compile:\n%s\n%s", c->text, diags);
  free(diags);
  assert_true(ok);
  schema_from_ir(&c->ir, &c->schema);
}

static void case_free(Case *c) {
  cpu_exec_free(c->x);
  if (c->batch.offsets) batch_free(&c->batch);
  arena_free(&c->arena);
  free(c->text);
}

static int tensor(const Case *c, const char *name) {
  int t = ir_find_tensor(&c->ir, name);
  if (t < 0) print_message("no tensor named %s\n", name);
  assert_true(t >= 0);
  return t;
}

static int feature(const Case *c, const char *name) {
  int f = schema_find(&c->schema, name);
  assert_true(f >= 0);
  return f;
}

// Allocates the batch with B examples and sets the lengths of jagged dim `dim` (by the name
// of the sequence that owns it).
static void set_lengths(Case *c, const char *dim, const int64_t *lengths) {
  int j = -1;
  for (int k = 0; k < c->ir.njagged; k++)
    if (strcmp(c->ir.jagged[k].name, dim) == 0) j = k;
  assert_true(j >= 0);
  Batch *b = &c->batch;
  b->offsets[j][0] = 0;
  for (int64_t e = 0; e < b->B; e++) b->offsets[j][e + 1] = b->offsets[j][e] + lengths[e];
  b->total[j] = b->offsets[j][b->B];
}

static int64_t entries(const Case *c, int f) {
  const Feature *ft = &c->schema.features[f];
  return (ft->jag >= 0 ? c->batch.total[ft->jag] : c->batch.B) * ft->width;
}

static void set_ids(Case *c, const char *name, const int64_t *ids) {
  int f = feature(c, name);
  batch_reserve(&c->batch, f, entries(c, f));
  memcpy(c->batch.ids[f], ids, (size_t)entries(c, f) * sizeof *ids);
}

static void set_floats(Case *c, const char *name, const float *v) {
  int f = feature(c, name);
  batch_reserve(&c->batch, f, entries(c, f));
  memcpy(c->batch.values[f], v, (size_t)entries(c, f) * sizeof *v);
}

// Fills every feature the test left alone at random (ids within their tables).
static void fill_rest_random(Case *c, const bool *set) {
  for (int f = 0; f < c->schema.nfeatures; f++) {
    if (set && set[f]) continue;
    const Feature *ft = &c->schema.features[f];
    int64_t n = entries(c, f);
    batch_reserve(&c->batch, f, n);
    for (int64_t k = 0; k < n; k++) {
      if (ft->kind == FEATURE_IDS)
        c->batch.ids[f][k] = rng_below(ft->id_limit > 0 ? ft->id_limit : 10);
      else if (ft->kind == FEATURE_LABEL)
        c->batch.values[f][k] = (float)rng_below(2);
      else
        c->batch.values[f][k] = (float)rng_sym(1);
    }
  }
}

static void bind(Case *c) {
  char err[256];
  if (!cpu_exec_set_batch(c->x, &c->batch, err, sizeof err)) print_message("bind: %s\n", err);
  assert_true(cpu_exec_set_batch(c->x, &c->batch, err, sizeof err));
}

static float *fdata(Case *c, const char *name) { return cpu_exec_data(c->x, tensor(c, name)); }

static void set_param(Case *c, const char *name, const float *v) {
  int t = tensor(c, name);
  memcpy(cpu_exec_data(c->x, t), v, (size_t)cpu_exec_numel(c->x, t) * sizeof *v);
}

static void random_params(Case *c, double a) {
  for (int t = 0; t < c->ir.ntensors; t++) {
    TensorKind k = c->ir.tensors[t].kind;
    if (k != TENSOR_PARAM && k != TENSOR_TABLE) continue;
    float *w = cpu_exec_data(c->x, t);
    for (int64_t i = 0; i < cpu_exec_numel(c->x, t); i++)
      w[i] = round_to_dtype((float)rng_sym(a), c->ir.tensors[t].dtype);
  }
}

// Compiles `text`, makes an fp32 executor and a batch of B examples.
static void case_setup(Case *c, const char *text, bool grad, int64_t B) {
  case_compile(c, text, grad);
  c->x = cpu_exec_new(&c->ir, EXEC_F32);
  cpu_exec_keep_values(c->x, true);  // the tests read intermediate values
  cpu_exec_init_params(c->x, 3);
  batch_alloc(&c->batch, &c->schema, B);
}

static void assert_close(double got, double want, double tol, const char *what, int64_t i) {
  if (fabs(got - want) <= tol * fmax(1.0, fabs(want)) && !isnan(got)) return;
  print_message("%s[%lld]: got %.9g, want %.9g\n", what, (long long)i, got, want);
  fail();
}

// --- embeddings -------------------------------------------------------------------------

static const char *const EMBED_MODEL =
    "model e {\n"
    "  batch 3; dim 2;\n"
    "  seq history : id max 4;\n"
    "  sparse ad : id;\n"
    "  label click;\n"
    "  table t : rows 5;\n"
    "  a = embed(t, ad);\n"
    "  h = embed(t, history);\n"
    "  m = embed(t, history, pool = mean);\n"
    "  s = embed(t, history, pool = sum);\n"
    "  p = pma(h, seeds = 1, heads = 1, act = silu);\n"
    "  y = linear(concat(a, m, s, flatten(p)), 1);\n"
    "  loss bce(y, click);\n"
    "}\n";

static void setup_embed(Case *c) {
  case_setup(c, EMBED_MODEL, false, 3);
  const int64_t lengths[] = {2, 0, 3}, history[] = {4, 1, 0, 0, 3}, ad[] = {2, 4, 2};
  set_lengths(c, "history", lengths);
  set_ids(c, "history", history);
  set_ids(c, "ad", ad);
  bool set[3] = {false, false, false};
  set[feature(c, "history")] = set[feature(c, "ad")] = true;
  fill_rest_random(c, set);
  const float table[] = {0, 1, 10, 11, 20, 21, 30, 31, 40, 41};
  set_param(c, "t", table);
  bind(c);
  cpu_exec_forward(c->x);
}

static void test_cpu_exec_embed_lookup_sparse_and_jagged(void **state) {
  (void)state;
  Case c;
  setup_embed(&c);
  const float want_a[] = {20, 21, 40, 41, 20, 21};
  const float want_h[] = {40, 41, 10, 11, 0, 1, 0, 1, 30, 31};
  assert_int_equal(cpu_exec_numel(c.x, tensor(&c, "h")), 10);
  for (int i = 0; i < 6; i++) assert_close(fdata(&c, "a")[i], want_a[i], 0, "a", i);
  for (int i = 0; i < 10; i++) assert_close(fdata(&c, "h")[i], want_h[i], 0, "h", i);
  case_free(&c);
}

static void test_cpu_exec_pooled_mean_and_sum_with_empty_sequence(void **state) {
  (void)state;
  Case c;
  setup_embed(&c);
  // Example 0: rows 4 and 1; example 1: empty; example 2: rows 0, 0 and 3.
  const float want_m[] = {25, 26, 0, 0, 10, 11};
  const float want_s[] = {50, 52, 0, 0, 30, 33};
  for (int i = 0; i < 6; i++) assert_close(fdata(&c, "m")[i], want_m[i], 1e-7, "m", i);
  for (int i = 0; i < 6; i++) assert_close(fdata(&c, "s")[i], want_s[i], 0, "s", i);
  // PMA over the empty example gives zeros, never NaN.
  float *p = fdata(&c, "p.pma0.attn");
  assert_true(p[2] == 0 && p[3] == 0);
  case_free(&c);
}

// --- dense ops --------------------------------------------------------------------------

static const char *const DENSE_MODEL =
    "model d {\n"
    "  batch 2; dim 4;\n"
    "  dense x : f32[3];\n"
    "  dense u : f32[4];\n"
    "  label click;\n"
    "  z = mlp(x, [2, 2], act = relu);\n"
    "  r = rmsnorm(u);\n"
    "  l = layernorm(u);\n"
    "  k = stack(r, l);\n"
    "  c = concat(z, flatten(k), dot_interact(r, l, u));\n"
    "  y = linear(c, 1);\n"
    "  loss bce(y, click);\n"
    "}\n";

static void setup_dense(Case *c) {
  case_setup(c, DENSE_MODEL, false, 2);
  const float x[] = {1, 2, 3, -1, 0, 2}, u[] = {1, 2, 3, 4, -2, 0, 2, 4}, click[] = {1, 0};
  set_floats(c, "x", x);
  set_floats(c, "u", u);
  set_floats(c, "click", click);
  const float w[] = {1, -1, 0, 2, 1, -3}, b[] = {0.5f, -0.5f};
  set_param(c, "z.mlp0.l0.w", w);
  set_param(c, "z.mlp0.l0.b", b);
  const float gain[] = {1, 2, 1, 0.5f}, bias[] = {0, 1, 0, -1};
  set_param(c, "r.rmsnorm0.gain", gain);
  set_param(c, "l.layernorm0.gain", gain);
  set_param(c, "l.layernorm0.bias", bias);
  bind(c);
  cpu_exec_forward(c->x);
}

static void test_cpu_exec_linear_bias_relu(void **state) {
  (void)state;
  Case c;
  setup_dense(&c);
  // x0 = [1 2 3]: [1*1 + 2*0 + 3*1, 1*-1 + 2*2 + 3*-3] + b = [4.5, -6.5] -> relu [4.5, 0]
  // x1 = [-1 0 2]: [-1 + 2, 1 - 6] + b = [1.5, -5.5] -> [1.5, 0]
  const float want[] = {4.5f, 0, 1.5f, 0};
  for (int i = 0; i < 4; i++) assert_close(fdata(&c, "z.mlp0.l0")[i], want[i], 0, "z", i);
  case_free(&c);
}

static void test_cpu_exec_rmsnorm_and_layernorm(void **state) {
  (void)state;
  Case c;
  setup_dense(&c);
  const float u[] = {1, 2, 3, 4, -2, 0, 2, 4}, gain[] = {1, 2, 1, 0.5f}, bias[] = {0, 1, 0, -1};
  for (int b = 0; b < 2; b++) {
    const float *v = u + 4 * b;
    double ms = 0, mean = 0, var = 0;
    for (int j = 0; j < 4; j++) ms += v[j] * v[j] / 4.0, mean += v[j] / 4.0;
    for (int j = 0; j < 4; j++) var += (v[j] - mean) * (v[j] - mean) / 4.0;
    for (int j = 0; j < 4; j++) {
      assert_close(fdata(&c, "r")[4 * b + j], v[j] / sqrt(ms + 1e-6) * gain[j], 1e-6, "r", j);
      assert_close(fdata(&c, "l")[4 * b + j],
                   (v[j] - mean) / sqrt(var + 1e-5) * gain[j] + bias[j], 1e-6, "l", j);
    }
  }
  // Example 0 of rmsnorm by hand: rms = sqrt(30/4), so r[0] = 1/sqrt(7.5).
  assert_close(fdata(&c, "r")[0], 1 / sqrt(7.5 + 1e-6), 1e-7, "r", 0);
  case_free(&c);
}

static void test_cpu_exec_stack_flatten_concat_dot_interact(void **state) {
  (void)state;
  Case c;
  setup_dense(&c);
  const float *r = fdata(&c, "r"), *l = fdata(&c, "l"), *z = fdata(&c, "z");
  const float u[] = {1, 2, 3, 4, -2, 0, 2, 4};
  // stack: k[b, 0] = r[b], k[b, 1] = l[b]; flatten keeps that order.
  const float *k = fdata(&c, "k"), *fl = fdata(&c, "c.flatten0");
  for (int b = 0; b < 2; b++)
    for (int j = 0; j < 4; j++) {
      assert_true(k[(b * 2 + 0) * 4 + j] == r[b * 4 + j]);
      assert_true(k[(b * 2 + 1) * 4 + j] == l[b * 4 + j]);
      assert_true(fl[b * 8 + j] == r[b * 4 + j] && fl[b * 8 + 4 + j] == l[b * 4 + j]);
    }
  // dot_interact: the pairs (r,l), (r,u), (l,u).
  const float *di = fdata(&c, "c.dot_interact0");
  for (int b = 0; b < 2; b++) {
    double rl = 0, ru = 0, lu = 0;
    for (int j = 0; j < 4; j++) {
      rl += r[b * 4 + j] * l[b * 4 + j];
      ru += r[b * 4 + j] * u[b * 4 + j];
      lu += l[b * 4 + j] * u[b * 4 + j];
    }
    assert_close(di[b * 3 + 0], rl, 1e-6, "rl", b);
    assert_close(di[b * 3 + 1], ru, 1e-6, "ru", b);
    assert_close(di[b * 3 + 2], lu, 1e-6, "lu", b);
  }
  // concat: z (2), flatten (8), dot_interact (3), per row.
  const float *cc = fdata(&c, "c");
  assert_int_equal(cpu_exec_numel(c.x, tensor(&c, "c")), 2 * 13);
  for (int b = 0; b < 2; b++) {
    assert_true(cc[b * 13 + 0] == z[b * 2] && cc[b * 13 + 1] == z[b * 2 + 1]);
    for (int j = 0; j < 8; j++) assert_true(cc[b * 13 + 2 + j] == fl[b * 8 + j]);
    for (int j = 0; j < 3; j++) assert_true(cc[b * 13 + 10 + j] == di[b * 3 + j]);
  }
  case_free(&c);
}

static void test_cpu_exec_bce_loss_and_task_probs(void **state) {
  (void)state;
  Case c;
  setup_dense(&c);
  const float *y = fdata(&c, "y");
  const float click[] = {1, 0};
  double want = 0;
  for (int b = 0; b < 2; b++)
    want += -(click[b] * log(1 / (1 + exp(-y[b]))) + (1 - click[b]) * log(1 - 1 / (1 + exp(-y[b]))));
  want /= 2;
  assert_close(cpu_exec_forward(c.x), want, 1e-6, "loss", 0);
  assert_int_equal(cpu_exec_ntasks(c.x), 1);
  assert_string_equal(cpu_exec_task_name(c.x, 0), "click");
  assert_int_equal(cpu_exec_task_label(c.x, 0), tensor(&c, "click"));
  const float *probs = cpu_exec_task_probs(c.x, 0);
  for (int b = 0; b < 2; b++) assert_close(probs[b], 1 / (1 + exp(-y[b])), 1e-6, "prob", b);
  case_free(&c);
}

// --- attention against a naive reference -------------------------------------------------

// Example b's rows of a tensor: start and count.
typedef struct Span {
  int64_t start, len;
} Span;

static Span rows_of(const Case *c, int t, int64_t b) {
  const Tensor *tt = &c->ir.tensors[t];
  if (tt->layout == LAYOUT_JAGGED) {
    const int64_t *off = c->batch.offsets[tt->jag];
    return (Span){off[b], off[b + 1] - off[b]};
  }
  if (tt->layout == LAYOUT_SET) return (Span){b * tt->set_k, tt->set_k};
  if (tt->layout == LAYOUT_FIXED) return (Span){0, tt->fixed[0]};  // pma seeds
  return (Span){b, 1};
}

static bool visible(const Node *n, int64_t i, int64_t j) {
  if (n->mask == MASK_CAUSAL && j > i) return false;
  if (n->window > 0) {
    if (n->mask == MASK_CAUSAL) return j > i - n->window;
    return llabs(i - j) < n->window;
  }
  return true;
}

// Compares attention node `out` with O = P V computed here in double from its q, k, v values.
static void check_attention_node(Case *c, const char *out) {
  int ot = tensor(c, out);
  const Node *n = &c->ir.nodes[c->ir.tensors[ot].producer];
  assert_int_equal(n->op, OP_ATTENTION);
  const float *q = cpu_exec_data(c->x, n->ins[0]), *k = cpu_exec_data(c->x, n->ins[1]);
  const float *v = cpu_exec_data(c->x, n->ins[2]), *o = cpu_exec_data(c->x, ot);
  const Tensor *kt = &c->ir.tensors[n->ins[1]];
  int64_t d = kt->width, dh = d / n->heads;
  double norm = 1;
  if (n->hstu_norm && n->act != ACT_SOFTMAX)
    norm = (double)(kt->layout == LAYOUT_JAGGED ? c->ir.jagged[kt->jag].max_len : kt->set_k);
  double *p = malloc(4096 * sizeof *p);
  int checked = 0;
  for (int64_t b = 0; b < c->batch.B; b++) {
    Span qs = rows_of(c, n->ins[0], b), ks = rows_of(c, n->ins[1], b), os = rows_of(c, ot, b);
    assert_int_equal(qs.len, os.len);
    for (int64_t h = 0; h < n->heads; h++)
      for (int64_t i = 0; i < qs.len; i++) {
        const float *qi = q + (qs.start + i) * d + h * dh;
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < ks.len; j++) {
          double s = 0;
          for (int64_t e = 0; e < dh; e++) s += (double)qi[e] * k[(ks.start + j) * d + h * dh + e];
          s *= n->scale;
          p[j] = s;
          if (visible(n, i, j) && s > m) m = s;
        }
        for (int64_t j = 0; j < ks.len; j++) {
          if (!visible(n, i, j)) {
            p[j] = 0;
          } else if (n->act == ACT_SOFTMAX) {
            p[j] = exp(p[j] - m);
            sum += p[j];
          } else {
            p[j] = act_forward(n->act, p[j]) / norm;
          }
        }
        for (int64_t j = 0; j < ks.len && n->act == ACT_SOFTMAX; j++) p[j] /= sum;
        for (int64_t e = 0; e < dh; e++) {
          double want = 0;
          for (int64_t j = 0; j < ks.len; j++) want += p[j] * v[(ks.start + j) * d + h * dh + e];
          assert_close(o[(os.start + i) * d + h * dh + e], want, 2e-5, out, i);
          checked++;
        }
      }
  }
  assert_true(checked > 0);
  free(p);
}

// A model with every attention shape over two sequences, one of which has empty examples.
static void attention_model(Case *c, const char *act, const char *self_extra) {
  char text[2048];
  snprintf(text, sizeof text,
           "model a {\n"
           "  batch 4; dim 8;\n"
           "  seq history : id max 9;\n"
           "  seq other : id max 5;\n"
           "  sparse ad : id;\n"
           "  dense counters : f32[3];\n"
           "  label click;\n"
           "  table items : rows 20;\n"
           "  h = embed(items, history);\n"
           "  o = embed(items, other);\n"
           "  a = embed(items, ad);\n"
           "  s = gdpa(h, heads = 2, act = %s%s);\n"
           "  cs = gdpa(q = s, kv = stack(a, linear(counters, 8)), heads = 2, act = %s);\n"
           "  cj = gdpa(q = cs, kv = o, heads = 4, act = %s);\n"
           "  p = pma(cj, seeds = 3, heads = 2, act = %s);\n"
           "  fd = gdpa(q = a, kv = cj, heads = 2, act = %s);\n"
           "  fs = gdpa(q = p, kv = cj, heads = 1, act = %s);\n"
           "  y = linear(concat(flatten(fs), fd), 1);\n"
           "  loss bce(y, click);\n"
           "}\n",
           act, self_extra, act, act, act, act, act);
  case_setup(c, text, false, 4);
  const int64_t hl[] = {9, 0, 1, 6}, ol[] = {0, 5, 2, 3};
  set_lengths(c, "history", hl);
  set_lengths(c, "other", ol);
  fill_rest_random(c, NULL);
  random_params(c, 0.5);
  bind(c);
  cpu_exec_forward(c->x);
}

static void check_all_shapes(Case *c) {
  check_attention_node(c, "s.gdpa0.attn");   // self
  check_attention_node(c, "cs.gdpa0.attn");  // cross, set kv
  check_attention_node(c, "cj.gdpa0.attn");  // cross, jagged kv (an empty one, too)
  check_attention_node(c, "p.pma0.attn");    // pma
  check_attention_node(c, "fd.gdpa0.attn");  // pffn, dense q
  check_attention_node(c, "fs.gdpa0.attn");  // pffn, set q
}

static void test_cpu_exec_attention_every_shape_softmax(void **state) {
  (void)state;
  Case c;
  attention_model(&c, "softmax", "");
  check_all_shapes(&c);
  // Example 0 of cj has no keys: its rows are 0, not NaN.
  const float *cj = fdata(&c, "cj.gdpa0.attn");
  for (int64_t i = 0; i < 9 * 8; i++) assert_true(cj[i] == 0);
  case_free(&c);
}

static void test_cpu_exec_attention_every_shape_pointwise_acts(void **state) {
  (void)state;
  static const char *const acts[] = {"silu", "gelu", "gelu_taylor", "relu", "sigmoid"};
  for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) {
    Case c;
    attention_model(&c, acts[i], "");
    check_all_shapes(&c);
    case_free(&c);
  }
}

static void test_cpu_exec_attention_masks(void **state) {
  (void)state;
  static const char *const masks[] = {", mask = causal", ", window = 3",
                                      ", mask = causal, window = 2", ", window = 1"};
  static const char *const acts[] = {"softmax", "silu"};
  for (size_t a = 0; a < 2; a++)
    for (size_t m = 0; m < sizeof masks / sizeof *masks; m++) {
      Case c;
      attention_model(&c, acts[a], masks[m]);
      check_attention_node(&c, "s.gdpa0.attn");
      case_free(&c);
    }
}

static void test_cpu_exec_attention_causal_first_row_sees_itself(void **state) {
  (void)state;
  Case c;
  attention_model(&c, "softmax", ", mask = causal");
  // With softmax, row 0 of a causal self-attention is exactly V's row 0.
  int st = tensor(&c, "s.gdpa0.attn");
  const Node *n = &c.ir.nodes[c.ir.tensors[st].producer];
  const float *v = cpu_exec_data(c.x, n->ins[2]), *o = cpu_exec_data(c.x, st);
  for (int e = 0; e < 8; e++) assert_close(o[e], v[e], 1e-6, "row 0", e);
  case_free(&c);
}

static void test_cpu_exec_attention_hstu_norm(void **state) {
  (void)state;
  Case c;
  attention_model(&c, "silu", ", mask = causal, hstu_norm = true");
  check_attention_node(&c, "s.gdpa0.attn");
  case_free(&c);
}

// Long sequences cross the 64-row query tiles and 32-key alignment of the kernel.
static void test_cpu_exec_attention_long_sequences_cross_tiles(void **state) {
  (void)state;
  static const char *const variants[] = {"softmax, mask = causal, window = 40", "silu, window = 70",
                                         "softmax", "gelu, mask = causal"};
  for (size_t i = 0; i < 4; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "model l {\n"
             "  batch 2; dim 8;\n"
             "  seq history : id max 200;\n"
             "  label click;\n"
             "  table items : rows 50;\n"
             "  s = gdpa(embed(items, history), heads = 2, act = %s);\n"
             "  y = linear(flatten(pma(s, seeds = 1, heads = 1, act = silu)), 1);\n"
             "  loss bce(y, click);\n"
             "}\n",
             variants[i]);
    Case c;
    case_setup(&c, text, false, 2);
    const int64_t lengths[] = {200, 131};
    set_lengths(&c, "history", lengths);
    fill_rest_random(&c, NULL);
    random_params(&c, 0.5);
    bind(&c);
    cpu_exec_forward(c.x);
    check_attention_node(&c, "s.gdpa0.attn");
    case_free(&c);
  }
}

// --- precision emulation ----------------------------------------------------------------

// One linear layer at precision `prec` over x [B, 64] (two mxfp8 blocks per row).
static void linear_at(Case *c, const char *prec, const float *x, const float *w) {
  char text[512];
  snprintf(text, sizeof text,
           "model q {\n"
           "  batch 5; dim 8;\n"
           "  dense x : f32[64];\n"
           "  label click;\n"
           "  z = linear(x, 8, bias = false) @%s;\n"
           "  y = linear(z, 1) @fp32;\n"
           "  loss bce(y, click);\n"
           "}\n",
           prec);
  case_setup(c, text, false, 5);
  set_floats(c, "x", x);
  bool set[2] = {false, false};
  set[feature(c, "x")] = true;
  fill_rest_random(c, set);
  set_param(c, "z.linear0.w", w);
  bind(c);
  cpu_exec_forward(c->x);
}

static void random_operands(float *x, float *w) {
  for (int i = 0; i < 5 * 64; i++) x[i] = (float)(rng_sym(1) * exp(rng_sym(3)));
  for (int i = 0; i < 64 * 8; i++) w[i] = (float)rng_sym(0.3);
}

static void test_cpu_exec_bf16_output_is_rounded_fp32(void **state) {
  (void)state;
  float x[5 * 64], w[64 * 8];
  random_operands(x, w);
  Case f32, b16, f16;
  linear_at(&f32, "fp32", x, w);
  linear_at(&b16, "bf16", x, w);
  linear_at(&f16, "fp16", x, w);
  assert_int_equal(b16.ir.tensors[tensor(&b16, "z")].dtype, DT_BF16);
  const float *z32 = fdata(&f32, "z"), *zb = fdata(&b16, "z"), *zh = fdata(&f16, "z");
  int differ = 0;
  for (int i = 0; i < 5 * 8; i++) {
    assert_true(zb[i] == round_bf16(z32[i]));
    assert_true(zh[i] == round_fp16(z32[i]));
    differ += zb[i] != z32[i];
  }
  assert_true(differ > 0);  // the rounding did something
  case_free(&f32);
  case_free(&b16);
  case_free(&f16);
}

// out = x·w with both operands quantized as `prec` defines, in double, then stored in bf16.
static void quantized_reference(const char *prec, const float *x, const float *w, double *out) {
  float qx[5 * 64], qw[64 * 8];
  if (strcmp(prec, "fp8") == 0) {
    fp8_quantize(x, qx, 5 * 64);
    fp8_quantize(w, qw, 64 * 8);
  } else {
    mxfp8_quantize(x, qx, 5, 64, 1);  // reduction along x's columns
    mxfp8_quantize(w, qw, 64, 8, 0);  // ... and along w's rows
  }
  for (int b = 0; b < 5; b++)
    for (int n = 0; n < 8; n++) {
      double s = 0;
      for (int k = 0; k < 64; k++) s += (double)qx[b * 64 + k] * qw[k * 8 + n];
      out[b * 8 + n] = s;
    }
}

static void check_quantized_linear(const char *prec) {
  float x[5 * 64], w[64 * 8];
  random_operands(x, w);
  Case c;
  linear_at(&c, prec, x, w);
  double ref[5 * 8], plain[5 * 8];
  quantized_reference(prec, x, w, ref);
  for (int b = 0; b < 5; b++)
    for (int n = 0; n < 8; n++) {
      plain[b * 8 + n] = 0;
      for (int k = 0; k < 64; k++) plain[b * 8 + n] += (double)x[b * 64 + k] * w[k * 8 + n];
    }
  const float *z = fdata(&c, "z");
  int far_from_plain = 0;
  double scale = 0;
  for (int i = 0; i < 40; i++) scale = fmax(scale, fabs(ref[i]));
  for (int i = 0; i < 40; i++) {
    // The output is bf16: within half a bf16 ulp of the reference, plus fp32 summation noise.
    double tol = fabs(ref[i]) * 0x1p-8 + scale * 1e-6;
    if (fabs(z[i] - ref[i]) > tol) {
      print_message("%s z[%d] = %.9g, reference %.9g\n", prec, i, z[i], ref[i]);
      fail();
    }
    far_from_plain += fabs(z[i] - plain[i]) > tol;
  }
  assert_true(far_from_plain > 0);  // quantization changed the product
  case_free(&c);
}

static void test_cpu_exec_mxfp8_linear_quantizes_then_multiplies(void **state) {
  (void)state;
  check_quantized_linear("mxfp8");
}

static void test_cpu_exec_fp8_linear_quantizes_then_multiplies(void **state) {
  (void)state;
  check_quantized_linear("fp8");
}

// Quantized attention (forward and backward, every shape) stays close to fp32 and finite.
static void test_cpu_exec_quantized_attention_close_to_fp32(void **state) {
  (void)state;
  static const char *const precs[] = {"fp8", "mxfp8", "bf16"};
  for (size_t pi = 0; pi < 3; pi++) {
    double loss[2], *grads[2] = {NULL, NULL};
    int64_t ngrad = 0;
    for (int variant = 0; variant < 2; variant++) {
      char text[2048];
      const char *p = variant ? precs[pi] : "fp32";
      snprintf(text, sizeof text,
               "model a {\n"
               "  batch 4; dim 64;\n"
               "  seq history : id max 80;\n"
               "  sparse ad : id;\n"
               "  label click;\n"
               "  table items : rows 30, precision fp32;\n"
               "  h = embed(items, history);\n"
               "  a = embed(items, ad);\n"
               "  s = gdpa(h, heads = 2, act = softmax, mask = causal, window = 40) @%s;\n"
               "  c = gdpa(q = s, kv = stack(a, a * a), heads = 2, act = silu) @%s;\n"
               "  p = pma(c, seeds = 2, heads = 2, act = gelu) @%s;\n"
               "  f = gdpa(q = a, kv = c, heads = 2, act = softmax) @%s;\n"
               "  y = linear(concat(flatten(p), f), 1);\n"
               "  loss bce(y, click);\n"
               "}\n",
               p, p, p, p);
      Case c;
      rng_state = 99;
      case_setup(&c, text, true, 4);
      const int64_t lengths[] = {80, 0, 33, 65};
      set_lengths(&c, "history", lengths);
      fill_rest_random(&c, NULL);
      random_params(&c, 0.3);
      bind(&c);
      loss[variant] = cpu_exec_forward(c.x);
      cpu_exec_backward(c.x);
      int t = tensor(&c, "s.gdpa0.wq");
      const float *g = cpu_exec_grad(c.x, t, NULL, NULL);
      assert_non_null(g);
      ngrad = cpu_exec_numel(c.x, t);
      grads[variant] = malloc((size_t)ngrad * sizeof(double));
      for (int64_t i = 0; i < ngrad; i++) {
        assert_true(isfinite(g[i]));
        grads[variant][i] = g[i];
      }
      case_free(&c);
    }
    assert_true(isfinite(loss[1]));
    assert_close(loss[1], loss[0], 0.05, precs[pi], 0);
    double num = 0, den = 0;
    for (int64_t i = 0; i < ngrad; i++) {
      num += (grads[1][i] - grads[0][i]) * (grads[1][i] - grads[0][i]);
      den += grads[0][i] * grads[0][i];
    }
    double rel = sqrt(num / den);
    if (!(rel < 0.25 && rel > 0)) print_message("%s: gradient relative error %g\n", precs[pi], rel);
    assert_true(rel < 0.25 && rel > 0);
    free(grads[0]);
    free(grads[1]);
  }
}

static void test_cpu_exec_tables_stored_in_their_dtype(void **state) {
  (void)state;
  Case c;
  case_setup(&c,
             "model t {\n"
             "  batch 2; dim 4;\n"
             "  sparse ad : id;\n"
             "  label click;\n"
             "  table t : rows 50, precision bf16;\n"
             "  y = linear(embed(t, ad), 1);\n"
             "  loss bce(y, click);\n"
             "}\n",
             false, 2);
  const float *t = fdata(&c, "t");
  int nonzero = 0;
  for (int i = 0; i < 200; i++) {
    assert_true(t[i] == round_bf16(t[i]));
    nonzero += t[i] != 0;
  }
  assert_true(nonzero > 150);
  case_free(&c);
}

// --- table gradients --------------------------------------------------------------------

static void test_cpu_exec_table_grad_merges_duplicates_in_order(void **state) {
  (void)state;
  Case c;
  case_setup(&c,
             "model g {\n"
             "  batch 4; dim 4;\n"
             "  seq history : id max 5;\n"
             "  sparse ad : id;\n"
             "  label click;\n"
             "  table t : rows 10;\n"
             "  h = embed(t, history);\n"
             "  a = embed(t, ad);\n"
             "  y = linear(concat(flatten(pma(h, seeds = 1, heads = 1, act = softmax)), a), 1);\n"
             "  loss bce(y, click);\n"
             "}\n",
             true, 4);
  const int64_t lengths[] = {3, 0, 5, 1}, history[] = {7, 2, 7, 2, 2, 9, 0, 7, 3};
  const int64_t ad[] = {7, 3, 5, 7};
  set_lengths(&c, "history", lengths);
  set_ids(&c, "history", history);
  set_ids(&c, "ad", ad);
  bool set[3] = {false, false, false};
  set[feature(&c, "history")] = set[feature(&c, "ad")] = true;
  fill_rest_random(&c, set);
  random_params(&c, 0.5);
  bind(&c);
  cpu_exec_forward(c.x);
  cpu_exec_backward(c.x);
  int64_t nrows = 0;
  const int64_t *ids = NULL;
  const float *g = cpu_exec_grad(c.x, tensor(&c, "t"), &nrows, &ids);
  assert_non_null(g);
  const int64_t want_ids[] = {0, 2, 3, 5, 7, 9};
  assert_int_equal(nrows, 6);
  for (int r = 0; r < 6; r++) assert_int_equal(ids[r], want_ids[r]);
  // Each row sums dy over the id's occurrences: first the sequence (pair 0), position order,
  // then the sparse lookup (pair 1), in the same float order.
  const float *dh = fdata(&c, "h.grad"), *da = fdata(&c, "a.grad");
  for (int r = 0; r < 6; r++)
    for (int j = 0; j < 4; j++) {
      float sum = 0;
      bool first = true;
      for (int p = 0; p < 9; p++)
        if (history[p] == want_ids[r]) sum = first ? dh[p * 4 + j] : sum + dh[p * 4 + j], first = false;
      for (int b = 0; b < 4; b++)
        if (ad[b] == want_ids[r]) sum = first ? da[b * 4 + j] : sum + da[b * 4 + j], first = false;
      assert_true(g[r * 4 + j] == sum);
    }
  // Running the same step again gives the same bits.
  float first_row[24];
  memcpy(first_row, g, sizeof first_row);
  cpu_exec_forward(c.x);
  cpu_exec_backward(c.x);
  g = cpu_exec_grad(c.x, tensor(&c, "t"), &nrows, &ids);
  assert_memory_equal(first_row, g, sizeof first_row);
  case_free(&c);
}

// --- binding batches --------------------------------------------------------------------

static void expect_refused(Case *c, const char *needle) {
  char err[256] = "";
  assert_false(cpu_exec_set_batch(c->x, &c->batch, err, sizeof err));
  if (!strstr(err, needle)) print_message("message '%s' lacks '%s'\n", err, needle);
  assert_non_null(strstr(err, needle));
}

static void test_cpu_exec_bad_batches_are_refused(void **state) {
  (void)state;
  Case c;
  setup_embed(&c);  // history: max 4, table t: 5 rows
  Batch *b = &c.batch;
  int fh = feature(&c, "history"), fa = feature(&c, "ad");
  b->offsets[0][1] = 5;  // example 0 longer than max 4
  b->offsets[0][2] = 5, b->offsets[0][3] = 8, b->total[0] = 8;
  expect_refused(&c, "above the maximum 4");
  b->offsets[0][1] = 2, b->offsets[0][2] = 1;  // out of order
  expect_refused(&c, "out of order");
  b->offsets[0][2] = 2, b->offsets[0][3] = 5, b->total[0] = 6;
  expect_refused(&c, "total 6");
  b->total[0] = 5;
  b->offsets[0][0] = 1;
  expect_refused(&c, "start at 1");
  b->offsets[0][0] = 0;
  b->ids[fh][3] = 5;
  expect_refused(&c, "id 5");
  b->ids[fh][3] = -1;
  expect_refused(&c, "outside [0, 5)");
  b->ids[fh][3] = 0;
  int64_t saved_cap = b->capacity[fa];
  b->capacity[fa] = 1;
  expect_refused(&c, "%ad holds 1");
  b->capacity[fa] = saved_cap;
  b->nfeatures = 2;
  expect_refused(&c, "2 features");
  b->nfeatures = 3;
  b->njagged = 0;
  expect_refused(&c, "0 jagged dims");
  b->njagged = 1;
  b->B = 0;
  expect_refused(&c, "0 examples");
  b->B = 3;
  int64_t *ids = b->ids[fa];
  b->ids[fa] = NULL;
  expect_refused(&c, "%ad has no ids");
  b->ids[fa] = ids;
  assert_false(cpu_exec_set_batch(c.x, NULL, NULL, 0));
  bind(&c);  // and the repaired batch binds again
  case_free(&c);
}

static void test_cpu_exec_batch_size_may_change(void **state) {
  (void)state;
  Case c;
  case_setup(&c, EMBED_MODEL, true, 3);
  const int64_t lengths[] = {2, 0, 3};
  set_lengths(&c, "history", lengths);
  fill_rest_random(&c, NULL);
  bind(&c);
  double l3 = cpu_exec_forward(c.x);
  cpu_exec_backward(c.x);
  batch_free(&c.batch);
  batch_alloc(&c.batch, &c.schema, 7);
  const int64_t longer[] = {4, 4, 4, 1, 0, 2, 3};
  set_lengths(&c, "history", longer);
  fill_rest_random(&c, NULL);
  bind(&c);
  double l7 = cpu_exec_forward(c.x);
  cpu_exec_backward(c.x);
  assert_true(isfinite(l3) && isfinite(l7));
  assert_int_equal(cpu_exec_numel(c.x, tensor(&c, "h")), 18 * 2);
  assert_int_equal(cpu_exec_numel(c.x, tensor(&c, "a")), 7 * 2);
  case_free(&c);
}

// --- modes, kernels and initialization --------------------------------------------------

static const char *const SMALL_MODEL =
    "model s {\n"
    "  batch 6; dim 16;\n"
    "  seq history : id max 40;\n"
    "  sparse ad : id;\n"
    "  multihot tags : id max 5;\n"
    "  dense counters : f32[4];\n"
    "  label click;\n"
    "  table items : rows 100;\n"
    "  h = embed(items, history);\n"
    "  h = h + gdpa(rmsnorm(h), heads = 2, act = silu, mask = causal);\n"
    "  p = pma(layernorm(h), seeds = 2, heads = 2, act = softmax);\n"
    "  z = concat(flatten(p), embed(items, ad), embed(items, tags, pool = mean),\n"
    "             linear(counters, 16));\n"
    "  y = mlp(z, [24, 1], act = gelu);\n"
    "  loss bce(y, click);\n"
    "}\n";

// Runs SMALL_MODEL in `mode` (optionally without the wide matmul tile); returns the loss and
// the gradient of @y.mlp0.l0.w in doubles.
static double run_small(ExecMode mode, bool wide, double *grad, int64_t n) {
  Case c;
  case_compile(&c, SMALL_MODEL, true);
  c.x = cpu_exec_new(&c.ir, mode);
  if (!wide) c.x->wide_kernels = false;
  cpu_exec_init_params(c.x, 11);
  batch_alloc(&c.batch, &c.schema, 6);
  rng_state = 5;
  const int64_t lengths[] = {40, 0, 1, 17, 33, 8}, tags[] = {5, 0, 2, 1, 3, 4};
  set_lengths(&c, "history", lengths);
  set_lengths(&c, "tags", tags);
  fill_rest_random(&c, NULL);
  bind(&c);
  double loss = cpu_exec_forward(c.x);
  cpu_exec_backward(c.x);
  int t = tensor(&c, "y.mlp0.l0.w");
  assert_int_equal(cpu_exec_numel(c.x, t), n);
  const void *g = cpu_exec_grad(c.x, t, NULL, NULL);
  for (int64_t i = 0; i < n; i++)
    grad[i] = mode == EXEC_F64 ? ((const double *)g)[i] : ((const float *)g)[i];
  case_free(&c);
  return loss;
}

static void test_cpu_exec_fp32_and_fp64_agree(void **state) {
  (void)state;
  enum { N = (32 + 16 + 16 + 16) * 24 };
  static double g32[N], g64[N], gbase[N];
  double l32 = run_small(EXEC_F32, true, g32, N), l64 = run_small(EXEC_F64, true, g64, N);
  double lbase = run_small(EXEC_F32, false, gbase, N);
  assert_close(l32, l64, 1e-5, "loss", 0);
  assert_close(lbase, l64, 1e-5, "loss (baseline tile)", 0);
  double scale = 0;
  for (int i = 0; i < N; i++) scale = fmax(scale, fabs(g64[i]));
  for (int i = 0; i < N; i++) {
    assert_close(g32[i] / scale, g64[i] / scale, 1e-4, "grad", i);
    assert_close(gbase[i] / scale, g64[i] / scale, 1e-4, "grad (baseline tile)", i);
  }
}

// Values share pooled buffers by liveness; the results are the same bits as with every value
// kept, and values read for the last time give their buffers back.
static void test_cpu_exec_pooled_buffers_change_nothing(void **state) {
  (void)state;
  float *grads[2] = {NULL, NULL};
  double loss[2];
  int64_t total = 0;
  for (int keep = 0; keep < 2; keep++) {
    Case c;
    case_compile(&c, SMALL_MODEL, true);
    c.x = cpu_exec_new(&c.ir, EXEC_F32);
    cpu_exec_keep_values(c.x, keep);
    cpu_exec_init_params(c.x, 11);
    batch_alloc(&c.batch, &c.schema, 6);
    rng_state = 8;
    const int64_t lengths[] = {40, 0, 1, 17, 33, 8}, tags[] = {5, 0, 2, 1, 3, 4};
    set_lengths(&c, "history", lengths);
    set_lengths(&c, "tags", tags);
    fill_rest_random(&c, NULL);
    bind(&c);
    for (int step = 0; step < 2; step++) {  // the second step reuses the pool's buffers
      loss[keep] = cpu_exec_forward(c.x);
      cpu_exec_backward(c.x);
    }
    total = 0;
    for (int t = 0; t < c.ir.ntensors; t++)
      if (cpu_exec_grad(c.x, t, NULL, NULL)) total += cpu_exec_numel(c.x, ir_grad_of(&c.ir, t));
    grads[keep] = malloc((size_t)total * sizeof(float));
    int64_t at = 0;
    for (int t = 0; t < c.ir.ntensors; t++) {
      const float *g = cpu_exec_grad(c.x, t, NULL, NULL);
      if (!g) continue;
      int64_t n = cpu_exec_numel(c.x, ir_grad_of(&c.ir, t));
      memcpy(grads[keep] + at, g, (size_t)n * sizeof(float));
      at += n;
    }
    // The attention's output was last read in the backward pass: pooled, it is gone.
    void *attn = cpu_exec_data(c.x, tensor(&c, "h.gdpa0.attn"));
    assert_true(keep ? attn != NULL : attn == NULL);
    case_free(&c);
  }
  assert_true(loss[0] == loss[1]);
  assert_memory_equal(grads[0], grads[1], (size_t)total * sizeof(float));
  free(grads[0]);
  free(grads[1]);
}

// A sharded table's owner makes its rows without the rest (cpu_init_table_rows), and a
// windowed table runs on a window of rows: both give what the whole table gives.
// ZeRO-3's executor: every parameter gathered (no values between the passes that read it,
// filled from a copy by the fill function) gives the loss and the gradients of the executor
// holding them, bit for bit; each pass asks for each parameter once, and a parameter's
// values and gradient are gone after its last reader. cpu_init_param_part gives the whole
// parameter's initial values, part by part.
typedef struct FillLog {
  CpuExec *source;  // holds every parameter
  int calls[512];   // per tensor
} FillLog;

static void fill_from_source(void *ctx, int t, float *whole) {
  FillLog *log = ctx;
  log->calls[t]++;
  memcpy(whole, cpu_exec_data(log->source, t), (size_t)cpu_exec_numel(log->source, t) * sizeof *whole);
}

static void test_cpu_exec_gathered_params_and_their_parts(void **state) {
  (void)state;
  Case c;
  case_compile(&c,
               "model g {\n  batch 6; dim 8;\n  seq history : id max 10;\n  dense cnt : f32[3];\n"
               "  label click;\n  table items : rows 50;\n"
               "  h = embed(items, history);\n  h = h + gdpa(rmsnorm(h), heads = 2, act = silu);\n"
               "  p = pma(h, seeds = 2, heads = 1, act = softmax);\n"
               "  z = concat(flatten(p), linear(cnt, 8));\n  y = mlp(z, [16, 1], act = relu);\n"
               "  loss bce(y, click);\n}\n",
               true);
  assert_true(c.ir.ntensors <= 512);
  bool *gathered = calloc((size_t)c.ir.ntensors, sizeof *gathered);
  int nparams = 0;
  for (int t = 0; t < c.ir.ntensors; t++)
    if (c.ir.tensors[t].kind == TENSOR_PARAM) gathered[t] = true, nparams++;
  assert_true(nparams >= 6);
  CpuExec *whole = cpu_exec_new(&c.ir, EXEC_F32);
  CpuExec *parts = cpu_exec_new_parts(&c.ir, EXEC_F32, NULL, gathered);
  cpu_exec_init_params(whole, 11);
  cpu_exec_init_params(parts, 11);
  FillLog log = {.source = whole};
  cpu_exec_set_param_fill(parts, fill_from_source, &log);
  for (int t = 0; t < c.ir.ntensors; t++) {
    if (!gathered[t]) continue;
    assert_null(cpu_exec_data(parts, t));  // nothing held, nothing initialized
    // The initial values, in three parts cut anywhere.
    int64_t n = cpu_exec_numel(whole, t), cut1 = n / 3, cut2 = n - n / 5;
    float *v = calloc((size_t)n + 1, sizeof *v);
    cpu_init_param_part(&c.ir, t, 11, 0, cut1, v);
    cpu_init_param_part(&c.ir, t, 11, cut1, cut2 - cut1, v + cut1);
    cpu_init_param_part(&c.ir, t, 11, cut2, n - cut2, v + cut2);
    assert_memory_equal(v, cpu_exec_data(whole, t), (size_t)n * sizeof *v);
    free(v);
  }
  batch_alloc(&c.batch, &c.schema, 6);
  rng_state = 3;
  const int64_t lengths[] = {4, 0, 10, 7, 1, 2};
  set_lengths(&c, "history", lengths);
  fill_rest_random(&c, NULL);
  char err[256];
  assert_true(cpu_exec_set_batch(whole, &c.batch, err, sizeof err));
  assert_true(cpu_exec_set_batch(parts, &c.batch, err, sizeof err));
  double lw = cpu_exec_forward(whole);
  cpu_exec_backward(whole);
  for (int pass = 0; pass < 2; pass++) {  // a second step reads them again
    memset(log.calls, 0, sizeof log.calls);
    double lp = cpu_exec_forward(parts);
    assert_true(lw == lp);
    for (int t = 0; t < c.ir.ntensors; t++) {
      if (!gathered[t]) continue;
      assert_int_equal(log.calls[t], 1);  // once in the forward pass
      assert_null(cpu_exec_data(parts, t));  // freed after its last reader
    }
    cpu_exec_backward(parts);
    for (int t = 0; t < c.ir.ntensors; t++) {
      if (!gathered[t]) continue;
      bool read_backward = false;
      for (int i = c.ir.nforward; i < c.ir.nnodes; i++)
        for (int k = 0; k < c.ir.nodes[i].nins; k++) read_backward |= c.ir.nodes[i].ins[k] == t;
      assert_int_equal(log.calls[t], 1 + read_backward);
      assert_null(cpu_exec_data(parts, t));
      const float *gw = cpu_exec_grad(whole, t, NULL, NULL), *gp = cpu_exec_grad(parts, t, NULL, NULL);
      if (!gw) continue;
      assert_non_null(gp);
      assert_memory_equal(gw, gp, (size_t)cpu_exec_numel(whole, t) * sizeof *gw);
      cpu_exec_release_grad(parts, t);
      assert_null(cpu_exec_grad(parts, t, NULL, NULL));
    }
  }
  // The memory check counts a part of each and the gathered peak, not the whole parameters.
  int64_t *elems = calloc((size_t)c.ir.ntensors, sizeof *elems);
  int64_t whole_params = 0, peak = cpu_exec_gathered_peak(&c.ir, gathered);
  for (int t = 0; t < c.ir.ntensors; t++) {
    elems[t] = gathered[t] ? cpu_exec_numel(whole, t) / 4 : -1;
    if (gathered[t]) whole_params += cpu_exec_numel(whole, t);
  }
  assert_true(peak > 0 && peak < whole_params);
  assert_true(cpu_exec_bytes_needed_rows(&c.ir, EXEC_F32, 6, NULL, elems) <
              cpu_exec_bytes_needed(&c.ir, EXEC_F32, 6));
  free(elems);
  cpu_exec_free(whole);
  cpu_exec_free(parts);
  free(gathered);
  case_free(&c);
}

static void test_cpu_exec_windowed_table_and_its_rows(void **state) {
  (void)state;
  Case c;
  case_compile(&c,
               "model w {\n  batch 6; dim 8;\n  seq history : id max 10;\n  sparse ad : id;\n"
               "  label click;\n  table items : rows 50;\n  table ads : rows 20;\n"
               "  h = embed(items, history);\n  p = pma(h, seeds = 1, heads = 1, act = softmax);\n"
               "  z = concat(flatten(p), embed(ads, ad));\n  y = mlp(z, [8, 1], act = relu);\n"
               "  loss bce(y, click);\n}\n",
               true);
  bool *windowed = calloc((size_t)c.ir.ntensors, sizeof *windowed);
  int table = tensor(&c, "items");
  windowed[table] = true;
  CpuExec *whole = cpu_exec_new(&c.ir, EXEC_F32);
  CpuExec *win = cpu_exec_new_windowed(&c.ir, EXEC_F32, windowed);
  cpu_exec_init_params(whole, 5);
  cpu_exec_init_params(win, 5);
  assert_int_equal(cpu_exec_numel(win, table), 0);  // no rows of its own
  const Tensor *tt = &c.ir.tensors[table];
  int64_t rows = tt->fixed[0], D = tt->fixed[1];
  const float *w = cpu_exec_data(whole, table);
  // Every third row, as a row-wise rank would own them, from the same stream.
  int64_t n = (rows + 2) / 3, *ids = calloc((size_t)n, sizeof *ids);
  for (int64_t i = 0; i < n; i++) ids[i] = 3 * i + 1 < rows ? 3 * i + 1 : rows - 1;
  float *mine = calloc((size_t)(n * D), sizeof *mine);
  cpu_init_table_rows(&c.ir, table, 5, ids, n, mine);
  for (int64_t i = 0; i < n; i++)
    assert_memory_equal(mine + i * D, w + ids[i] * D, (size_t)D * sizeof *mine);
  // One batch on both: the windowed run's table is the batch's distinct ids, and its ids index
  // them. Loss and gradient rows agree bit for bit.
  batch_alloc(&c.batch, &c.schema, 6);
  rng_state = 9;
  const int64_t lengths[] = {10, 0, 3, 7, 1, 10};
  set_lengths(&c, "history", lengths);
  fill_rest_random(&c, NULL);
  const Feature *f = NULL;
  int fi = -1;
  for (int k = 0; k < c.schema.nfeatures; k++)
    for (int i = 0; i < c.ir.nnodes; i++)
      if ((c.ir.nodes[i].op == OP_EMBED || c.ir.nodes[i].op == OP_EMBED_POOL) &&
          c.ir.nodes[i].ins[0] == table && c.ir.nodes[i].ins[1] == c.schema.features[k].tensor)
        f = &c.schema.features[k], fi = k;
  assert_non_null(f);
  int64_t cnt = (f->jag >= 0 ? c.batch.total[f->jag] : c.batch.B) * f->width;
  int64_t *orig = calloc((size_t)cnt + 1, sizeof *orig), *win_ids = calloc((size_t)cnt + 1, sizeof *win_ids);
  memcpy(orig, c.batch.ids[fi], (size_t)cnt * sizeof *orig);
  int64_t u = 0;  // the distinct ids, ascending
  for (int64_t r = 0; r < cnt; r++) win_ids[u++] = orig[r];
  for (int64_t i = 1; i < u; i++)  // insertion sort, then drop repeats
    for (int64_t j = i; j > 0 && win_ids[j - 1] > win_ids[j]; j--) {
      int64_t x = win_ids[j]; win_ids[j] = win_ids[j - 1]; win_ids[j - 1] = x;
    }
  int64_t m = 0;
  for (int64_t i = 0; i < u; i++) if (m == 0 || win_ids[i] != win_ids[m - 1]) win_ids[m++] = win_ids[i];
  float *rowsbuf = cpu_exec_set_table_rows(win, table, m);
  for (int64_t i = 0; i < m; i++) memcpy(rowsbuf + i * D, w + win_ids[i] * D, (size_t)D * sizeof *w);
  char err[256];
  assert_true(cpu_exec_set_batch(whole, &c.batch, err, sizeof err));
  double lw = cpu_exec_forward(whole);
  cpu_exec_backward(whole);
  for (int64_t r = 0; r < cnt; r++)
    for (int64_t i = 0; i < m; i++) if (win_ids[i] == orig[r]) c.batch.ids[fi][r] = i;
  assert_true(cpu_exec_set_batch(win, &c.batch, err, sizeof err));
  double lv = cpu_exec_forward(win);
  cpu_exec_backward(win);
  assert_true(lw == lv);
  int64_t nw = 0, nv = 0;
  const int64_t *gw_ids, *gv_ids;
  const float *gw = cpu_exec_grad(whole, table, &nw, &gw_ids), *gv = cpu_exec_grad(win, table, &nv, &gv_ids);
  assert_non_null(gw);
  assert_int_equal(nw, nv);
  for (int64_t i = 0; i < nw; i++) assert_true(gw_ids[i] == win_ids[gv_ids[i]]);
  assert_memory_equal(gw, gv, (size_t)(nw * D) * sizeof *gw);
  memcpy(c.batch.ids[fi], orig, (size_t)cnt * sizeof *orig);
  free(orig);
  free(win_ids);
  free(ids);
  free(mine);
  free(windowed);
  cpu_exec_free(whole);
  cpu_exec_free(win);
  case_free(&c);
}

static void test_cpu_exec_init_is_deterministic_per_seed(void **state) {
  (void)state;
  Case c;
  case_compile(&c, SMALL_MODEL, false);
  CpuExec *a = cpu_exec_new(&c.ir, EXEC_F32), *b = cpu_exec_new(&c.ir, EXEC_F32);
  CpuExec *other = cpu_exec_new(&c.ir, EXEC_F32), *f64 = cpu_exec_new(&c.ir, EXEC_F64);
  cpu_exec_init_params(a, 42);
  cpu_exec_init_params(b, 42);
  cpu_exec_init_params(other, 43);
  cpu_exec_init_params(f64, 42);
  for (int t = 0; t < c.ir.ntensors; t++) {
    const Tensor *tt = &c.ir.tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    int64_t n = cpu_exec_numel(a, t);
    const float *wa = cpu_exec_data(a, t), *wb = cpu_exec_data(b, t), *wo = cpu_exec_data(other, t);
    const double *wd = cpu_exec_data(f64, t);
    assert_memory_equal(wa, wb, (size_t)n * sizeof *wa);
    bool zero = strstr(tt->name, ".b") == tt->name + strlen(tt->name) - 2 ||
                strstr(tt->name, "layernorm0.bias") != NULL;
    bool one = strstr(tt->name, "gain") != NULL;
    double bound = tt->kind == TENSOR_TABLE ? sqrt(3.0 / (double)tt->fixed[1])
                   : tt->nfixed == 2        ? sqrt(6.0 / (double)(tt->fixed[0] + tt->fixed[1]))
                                            : 1.0;
    if (strstr(tt->name, "seeds")) bound = 0.2;  // N(0, 0.02²): 10 sigma
    int same = 0;
    for (int64_t i = 0; i < n; i++) {
      assert_true(wa[i] == (float)wd[i]);
      if (zero) assert_true(wa[i] == 0);
      if (one) assert_true(wa[i] == 1);
      if (!zero && !one) assert_true(fabs(wa[i]) <= bound);
      same += wa[i] == wo[i];
    }
    if (!zero && !one) assert_true(same < n / 4 + 1);  // another seed draws other values
  }
  cpu_exec_free(a);
  cpu_exec_free(b);
  cpu_exec_free(other);
  cpu_exec_free(f64);
  arena_free(&c.arena);
  free(c.text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_exec_embed_lookup_sparse_and_jagged),
      cmocka_unit_test(test_cpu_exec_windowed_table_and_its_rows),
      cmocka_unit_test(test_cpu_exec_gathered_params_and_their_parts),
      cmocka_unit_test(test_cpu_exec_pooled_mean_and_sum_with_empty_sequence),
      cmocka_unit_test(test_cpu_exec_linear_bias_relu),
      cmocka_unit_test(test_cpu_exec_rmsnorm_and_layernorm),
      cmocka_unit_test(test_cpu_exec_stack_flatten_concat_dot_interact),
      cmocka_unit_test(test_cpu_exec_bce_loss_and_task_probs),
      cmocka_unit_test(test_cpu_exec_attention_every_shape_softmax),
      cmocka_unit_test(test_cpu_exec_attention_every_shape_pointwise_acts),
      cmocka_unit_test(test_cpu_exec_attention_masks),
      cmocka_unit_test(test_cpu_exec_attention_causal_first_row_sees_itself),
      cmocka_unit_test(test_cpu_exec_attention_hstu_norm),
      cmocka_unit_test(test_cpu_exec_attention_long_sequences_cross_tiles),
      cmocka_unit_test(test_cpu_exec_bf16_output_is_rounded_fp32),
      cmocka_unit_test(test_cpu_exec_mxfp8_linear_quantizes_then_multiplies),
      cmocka_unit_test(test_cpu_exec_fp8_linear_quantizes_then_multiplies),
      cmocka_unit_test(test_cpu_exec_quantized_attention_close_to_fp32),
      cmocka_unit_test(test_cpu_exec_tables_stored_in_their_dtype),
      cmocka_unit_test(test_cpu_exec_table_grad_merges_duplicates_in_order),
      cmocka_unit_test(test_cpu_exec_bad_batches_are_refused),
      cmocka_unit_test(test_cpu_exec_batch_size_may_change),
      cmocka_unit_test(test_cpu_exec_fp32_and_fp64_agree),
      cmocka_unit_test(test_cpu_exec_pooled_buffers_change_nothing),
      cmocka_unit_test(test_cpu_exec_init_is_deterministic_per_seed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
