// test_launch_cost.c: the per-launch cost model (codegen/plan/launch_cost.h) against numbers
// worked out here by hand: a GEMM's 2·m·n·k and its operand bytes, a memset's bytes, attention's
// 4·d·Σ visible pairs forward (full, causal, windowed) and its 2.5× backward split 2 : 3 : 4
// over the softmax statistics, dQ and dK/dV kernels, a lookup whose bytes follow the batch and
// never the table's row count, scratch and repeated arguments counted once each; and, over
// whole models, the launches' FLOPs adding up to the IR's step_flops.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batch.h"
#include "flops.h"
#include "launch_cost.h"
#include "load_model.h"
#include "lower.h"
#include "target.h"

// --- a model, its plan and a batch ------------------------------------------------------

typedef struct Case {
  LoadedModel m;
  char *text;   // the model's source when it came from the test, else NULL
  Plan p;
  Schema s;
  Batch b;
  bool batch;
} Case;

// Compiles a model (from `text`, or the file `path` when text is NULL) with its backward pass
// and builds its plan for the model's own target.
static Case *open_case(const char *path, const char *text) {
  Case *c = calloc(1, sizeof *c);
  assert_non_null(c);
  if (!text) {
    assert_true(load_model(&c->m, path, NULL, true, true, false));
  } else {
    c->text = strdup(text);
    source_from_memory(&c->m.src, path, c->text, strlen(c->text));
    Diag d;
    diag_init(&d, &c->m.src, stderr);
    d.quiet = true;
    ir_init(&c->m.ir, &c->m.arena);
    Model *ast = NULL;
    FrontEnd fe = {.with_grad = true};
    assert_true(front_end(&c->m.src, &c->m.arena, &d, &fe, &ast, &c->m.ir));
  }
  Diag d;
  diag_init(&d, &c->m.src, stderr);
  assert_true(plan_build(&c->m.ir, NULL, &c->m.arena, &d, &c->p));
  schema_from_ir(&c->m.ir, &c->s);
  return c;
}

// A batch of B examples whose every jagged dim has the lengths lens[e % nlens].
static void set_batch(Case *c, int64_t B, const int64_t *lens, int nlens) {
  if (c->batch) batch_free(&c->b);
  batch_alloc(&c->b, &c->s, B);
  c->batch = true;
  for (int j = 0; j < c->s.njagged; j++) {
    c->b.offsets[j][0] = 0;
    for (int64_t e = 0; e < B; e++) c->b.offsets[j][e + 1] = c->b.offsets[j][e] + lens[e % nlens];
    c->b.total[j] = c->b.offsets[j][B];
  }
}

static void close_case(Case *c) {
  if (c->batch) batch_free(&c->b);
  if (c->text) {
    arena_free(&c->m.arena);
    free(c->text);
  } else {
    loaded_model_free(&c->m);
  }
  free(c);
}

static LaunchCost cost(const Case *c, int launch) {
  return launch_cost(&c->p, launch, c->b.B, c->b.total, (const int64_t *const *)c->b.offsets);
}

// The first launch of `kind` whose node is op `op` and (when `in0` is not NULL) whose node's
// first input is tensor `in0`; -1 if none.
static int find_launch(const Case *c, LaunchKind kind, OpKind op, const char *in0) {
  const Ir *ir = &c->m.ir;
  int t = in0 ? ir_find_tensor(ir, in0) : -1;
  for (int i = 0; i < c->p.nlaunches; i++) {
    const Launch *l = &c->p.launches[i];
    if (l->kind != kind || l->optimizer || l->node < 0) continue;
    const Node *n = &ir->nodes[l->node];
    if (n->op == op && (!in0 || n->ins[0] == t)) return i;
  }
  return -1;
}

// The first kernel launch whose name ends with `suffix` and whose node is op `op`; -1 if none.
static int find_kernel(const Case *c, OpKind op, const char *suffix) {
  size_t ns = strlen(suffix);
  for (int i = 0; i < c->p.nlaunches; i++) {
    const Launch *l = &c->p.launches[i];
    if (l->kind != LAUNCH_KERNEL || l->optimizer || l->node < 0) continue;
    size_t nk = strlen(l->kernel);
    if (c->m.ir.nodes[l->node].op == op && nk >= ns && strcmp(l->kernel + nk - ns, suffix) == 0)
      return i;
  }
  return -1;
}

// --- GEMMs and memsets ------------------------------------------------------------------

// gem_tiny is fp32 at dim 32: the q projection of the history is [T, 32] · [32, 32] into an
// fp32 [T, 32]; counters [B, 4] · [4, 32] + an fp32 bias [32].
static void test_launch_cost_gemm_is_2mnk_with_its_operand_bytes(void **state) {
  (void)state;
  Case *c = open_case("models/gem_tiny.gem", NULL);
  const int64_t lens[] = {3, 0, 7, 20};  // T = 2 · 30 over B = 8
  set_batch(c, 8, lens, 4);
  double T = 60, B = 8;
  int q = find_launch(c, LAUNCH_GEMM, OP_LINEAR, "h.rmsnorm0");
  assert_true(q >= 0);
  LaunchCost g = cost(c, q);
  assert_true(g.flops == 2 * T * 32 * 32);
  assert_true(g.bytes == (T * 32 + 32 * 32) * 4 + T * 32 * 4);
  assert_false(g.tensor_core);  // fp32: cuBLASLt's COMPUTE_32F, no TF32
  int lin = find_launch(c, LAUNCH_GEMM, OP_LINEAR, "counters");
  assert_true(lin >= 0);
  assert_true(c->p.launches[lin].gemm_has_bias);
  g = cost(c, lin);
  assert_true(g.flops == 2 * B * 4 * 32);
  assert_true(g.bytes == (B * 4 + 4 * 32) * 4 + B * 32 * 4 + 32 * 4);
  // It follows the batch: twice the examples, twice the rows.
  set_batch(c, 16, lens, 4);
  assert_true(cost(c, q).flops == 2 * (2 * T) * 32 * 32);
  close_case(c);
}

// A hand-made plan: a memset of 16 + 4·B + 2·T_0 bytes.
static void test_launch_cost_memset_moves_its_zero_bytes(void **state) {
  (void)state;
  Ir ir;
  memset(&ir, 0, sizeof ir);
  Launch l;
  memset(&l, 0, sizeof l);
  l.kind = LAUNCH_ZERO;
  l.node = -1;
  l.zero_tensor = -1;
  l.zero_arg.kind = ARG_SCRATCH;
  l.zero_bytes = (SymSize){16, 4, 2, 0};
  Plan p;
  memset(&p, 0, sizeof p);
  p.ir = &ir;
  p.launches = &l;
  p.nlaunches = 1;
  const int64_t totals[] = {10}, off[] = {0, 4, 4, 10};
  const int64_t *offsets[] = {off};
  LaunchCost z = launch_cost(&p, 0, 3, totals, offsets);
  assert_true(z.bytes == 16 + 4 * 3 + 2 * 10);
  assert_true(z.flops == 0);
  assert_false(z.tensor_core);
  // The memsets of a real plan: 4 bytes for each fp8 amax, 8 for each table's long-run count,
  // and a lone table's sort state: 2192 ints (counters, 8 histograms, 128 run totals), then
  // 256 tile totals a tile a pass. Several tables zero their states in their shared gather,
  // whose bytes count them.
  const char *const models[] = {"tests/golden/codegen_attention_fp8.gem", "tests/codegen/recompute.gem"};
  for (int m = 0; m < 2; m++) {
    Case *c = open_case(models[m], NULL);
    const int64_t lens[] = {5};
    set_batch(c, 2, lens, 1);
    int zeros = 0, sort_states = 0, shared_gathers = 0;
    for (int i = 0; i < c->p.nlaunches; i++) {
      const Launch *li = &c->p.launches[i];
      int64_t bytes = cost(c, i).bytes;
      if (li->kind == LAUNCH_KERNEL && strncmp(li->kernel, "table_grad_gather_items_", 24) == 0) {
        shared_gathers++;
        assert_true(bytes > 3 * 4 * 2192);
      }
      if (li->kind != LAUNCH_ZERO) continue;
      zeros++;
      bool table = li->node >= 0 && c->p.ir->nodes[li->node].op == OP_TABLE_GRAD;
      if (table && bytes != 8) {
        sort_states++;
        assert_true(bytes > 4 * 2192 && (bytes - 4 * 2192) % (4 * 256) == 0);
      } else {
        assert_true(bytes == (table ? 8 : 4));
      }
    }
    assert_true(zeros > 0);
    assert_int_equal(sort_states, m == 0 ? 0 : 1);
    assert_int_equal(shared_gathers, m == 0 ? 1 : 0);
    close_case(c);
  }
}

// bf16 at dim 64: the GEMM operands and its bf16 output are 2 bytes, on tensor cores.
static const char *const ATTN_MODEL =
    "model attn {\n"
    "  batch 4;\n"
    "  dim 64;\n"
    "  precision bf16;\n"
    "  seq history : id max 40;\n"
    "  label click;\n"
    "  table items : rows 1000;\n"
    "  h = embed(items, history);\n"
    "  h = gdpa(h, heads = 2, act = %s%s);\n"
    "  p = pma(h, seeds = 2, heads = 2, act = silu);\n"
    "  y = linear(flatten(p), 1);\n"
    "  loss bce(y, click);\n"
    "}\n";

static Case *attention_case(const char *act, const char *mask) {
  char text[1024];
  snprintf(text, sizeof text, ATTN_MODEL, act, mask);
  return open_case("attn.gem", text);
}

// The self-attention node: the ATTENTION node over the history (q jagged).
static int self_attention(const Case *c) {
  const Ir *ir = &c->m.ir;
  for (int i = 0; i < ir->nforward; i++)
    if (ir->nodes[i].op == OP_ATTENTION && ir->nodes[i].shape == ATTN_SELF) return i;
  return -1;
}

// The cost of every launch of node `node` (non-optimizer), summed.
static LaunchCost node_cost(const Case *c, int node) {
  LaunchCost sum = {0};
  for (int i = 0; i < c->p.nlaunches; i++) {
    if (c->p.launches[i].node != node || c->p.launches[i].optimizer) continue;
    LaunchCost k = cost(c, i);
    sum.flops += k.flops, sum.bytes += k.bytes;
    sum.tensor_core |= k.tensor_core;
  }
  return sum;
}

static void test_launch_cost_bf16_gemm_runs_on_tensor_cores(void **state) {
  (void)state;
  Case *c = attention_case("silu", "");
  const int64_t lens[] = {5, 0, 12, 1};
  set_batch(c, 4, lens, 4);
  int q = find_launch(c, LAUNCH_GEMM, OP_LINEAR, "h");  // q = h · wq: [18, 64] · [64, 64]
  assert_true(q >= 0);
  LaunchCost g = cost(c, q);
  assert_true(g.flops == 2.0 * 18 * 64 * 64);
  assert_true(g.bytes == (18.0 * 64 + 64 * 64) * 2 + 18 * 64 * 2);
  assert_true(g.tensor_core);
  close_case(c);
}

// fp8 linears go to cuBLASLt's FP8 GEMMs (lower_gemm.c): E4M3 codes, both K-major, the reduction
// padded to 16, each operand's scale in a scratch of its own; a byte an operand element and an
// fp32 C. A linear whose output rows are not 16-byte aligned (n = 1) keeps the fp32 GEMM.
static const char *const FP8_MODEL =
    "model fp8 {\n"
    "  batch 4;\n"
    "  dim 64;\n"
    "  seq history : id max 40;\n"
    "  label click;\n"
    "  table items : rows 1000;\n"
    "  h = embed(items, history);\n"
    "  h = gdpa(h, heads = 2, act = silu) @fp8;\n"
    "  p = pma(h, seeds = 2, heads = 2, act = silu);\n"
    "  y = linear(flatten(p), 1) @fp8;\n"
    "  loss bce(y, click);\n"
    "}\n";

static void test_launch_cost_fp8_gemm_reads_e4m3_codes_on_tensor_cores(void **state) {
  (void)state;
  Case *c = open_case("fp8.gem", FP8_MODEL);
  const int64_t lens[] = {5, 0, 12, 1};  // 18 rows of h
  set_batch(c, 4, lens, 4);
  int q = find_launch(c, LAUNCH_GEMM, OP_LINEAR, "h");  // q = h · wq: [18, 64] · [64, 64]
  assert_true(q >= 0);
  const Launch *l = &c->p.launches[q];
  assert_int_equal(l->gemm_dtype, DT_FP8);
  assert_true(l->gemm_trans_b && !l->gemm_trans_a);
  assert_int_equal(l->gemm_k_align, 16);
  assert_int_equal(l->gemm_scale_a.kind, ARG_SCRATCH);
  assert_int_equal(l->gemm_scale_b.kind, ARG_SCRATCH);
  assert_true(l->gemm_scale_a.slot != l->gemm_scale_b.slot);
  assert_true(c->p.scratch[l->gemm_scale_a.slot].bytes.c == 4);
  LaunchCost g = cost(c, q);
  assert_true(g.flops == 2.0 * 18 * 64 * 64);
  assert_true(g.bytes == (18.0 * 64 + 64 * 64) * 1 + 18 * 64 * 4);
  assert_true(g.tensor_core);
  // The weight gradient reduces over the jagged rows: k is h's row count, rounded up at run time.
  int dw = -1;
  for (int i = 0; i < c->p.nlaunches && dw < 0; i++) {
    const Launch *x = &c->p.launches[i];
    if (x->kind == LAUNCH_GEMM && x->node >= 0 && c->m.ir.nodes[x->node].op == OP_LINEAR_BWD_W &&
        x->gemm_dtype == DT_FP8)
      dw = i;
  }
  assert_true(dw >= 0);
  const Launch *w = &c->p.launches[dw];
  assert_true(w->gemm_trans_b && !w->gemm_trans_a && w->gemm_k_align == 16);
  assert_true(w->gemm_k.t == 1 && w->gemm_k.jag >= 0 && w->gemm_k.c == 0);
  assert_true(cost(c, dw).flops == 2.0 * 64 * 64 * 18);
  // y = linear(flatten(p), 1): n = 1, an fp32 GEMM over dequantized values, no scales.
  int y = -1;
  for (int i = 0; i < c->p.nlaunches && y < 0; i++) {
    const Launch *x = &c->p.launches[i];
    if (x->kind == LAUNCH_GEMM && x->node >= 0 && c->m.ir.nodes[x->node].op == OP_LINEAR && x->gemm_n == 1)
      y = i;
  }
  assert_true(y >= 0);
  assert_int_equal(c->p.launches[y].gemm_dtype, DT_F32);
  assert_int_equal(c->p.launches[y].gemm_scale_a.kind, ARG_INT);
  assert_int_equal(c->p.launches[y].gemm_k_align, 0);
  close_case(c);
}

// --- attention --------------------------------------------------------------------------

// d = 64 (2 heads of 32), lengths 5, 0, 12, 1: full 25 + 0 + 144 + 1 = 170 pairs; causal
// l(l+1)/2: 15 + 0 + 78 + 1 = 94; causal with window 4, min(i + 1, 4) per row: 14 + 0 + 42 + 1.
static void test_launch_cost_attention_forward_counts_visible_pairs(void **state) {
  (void)state;
  const int64_t lens[] = {5, 0, 12, 1};
  static const struct {
    const char *mask;
    double pairs;
  } cases[] = {{"", 170}, {", mask = causal", 94}, {", mask = causal, window = 4", 57}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    Case *c = attention_case("silu", cases[k].mask);
    set_batch(c, 4, lens, 4);
    int node = self_attention(c);
    assert_true(node >= 0);
    int fwd = find_kernel(c, OP_ATTENTION, "h_gdpa0_attn_fwd");
    assert_true(fwd >= 0);
    assert_int_equal(c->p.launches[fwd].node, node);
    LaunchCost f = cost(c, fwd);
    assert_true(f.flops == 4.0 * 64 * cases[k].pairs);
    assert_true(f.tensor_core);  // bf16, dh 32: the mma.sync kernels
    // Only the one kernel that does the matmuls carries them.
    assert_true(node_cost(c, node).flops == f.flops);
    // It reads q, k, v and the offsets and writes out: four [18, 64] bf16 and 8 · (B + 1).
    assert_true(f.bytes == 4 * 18.0 * 64 * 2 + 8 * 5);
    close_case(c);
  }
}

// With softmax, the backward is the statistics pass, dQ, and dK with dV: 2.5 times the forward
// over them, split by their matmuls 2 : 3 : 4.
static void test_launch_cost_attention_backward_is_2_5x_split_by_matmuls(void **state) {
  (void)state;
  Case *c = attention_case("softmax", ", mask = causal");
  const int64_t lens[] = {5, 0, 12, 1};
  set_batch(c, 4, lens, 4);
  double fwd = 4.0 * 64 * 94;
  int stats = find_kernel(c, OP_ATTENTION_BWD_Q, "h_gdpa0_attn_bwd_stats");
  int dq = find_kernel(c, OP_ATTENTION_BWD_Q, "h_gdpa0_attn_bwd_q");
  int dkv = find_kernel(c, OP_ATTENTION_BWD_K, "h_gdpa0_attn_bwd_kv");
  assert_true(stats >= 0 && dq >= 0 && dkv >= 0);
  double s = cost(c, stats).flops, q = cost(c, dq).flops, kv = cost(c, dkv).flops;
  assert_true(fabs(s + q + kv - 2.5 * fwd) < 1e-9 * fwd);
  assert_true(fabs(s - 2.5 * fwd * 2 / 9) < 1e-9 * fwd);
  assert_true(fabs(q - 2.5 * fwd * 3 / 9) < 1e-9 * fwd);
  assert_true(fabs(kv - 2.5 * fwd * 4 / 9) < 1e-9 * fwd);
  assert_true(cost(c, stats).tensor_core && cost(c, dq).tensor_core && cost(c, dkv).tensor_core);
  // Without softmax there are no statistics: 3 : 4.
  Case *silu = attention_case("silu", ", mask = causal");
  set_batch(silu, 4, lens, 4);
  assert_int_equal(find_kernel(silu, OP_ATTENTION_BWD_Q, "h_gdpa0_attn_bwd_stats"), -1);
  q = cost(silu, find_kernel(silu, OP_ATTENTION_BWD_Q, "h_gdpa0_attn_bwd_q")).flops;
  kv = cost(silu, find_kernel(silu, OP_ATTENTION_BWD_K, "h_gdpa0_attn_bwd_kv")).flops;
  assert_true(fabs(q - 2.5 * fwd * 3 / 7) < 1e-9 * fwd);
  assert_true(fabs(kv - 2.5 * fwd * 4 / 7) < 1e-9 * fwd);
  close_case(silu);
  close_case(c);
}

// gem_tiny's attention is fp32: the SIMT kernels, whose FLOPs count but not on tensor cores.
static void test_launch_cost_fp32_attention_is_not_on_tensor_cores(void **state) {
  (void)state;
  Case *c = open_case("models/gem_tiny.gem", NULL);
  const int64_t lens[] = {4, 9};
  set_batch(c, 2, lens, 2);
  int fwd = find_kernel(c, OP_ATTENTION, "h_gdpa0_attn_fwd");
  assert_true(fwd >= 0);
  LaunchCost f = cost(c, fwd);
  // causal: 10 + 45 pairs, d = 32
  assert_true(f.flops == 4.0 * 32 * 55);
  assert_false(f.tensor_core);
  close_case(c);
}

// Over every attention of these plans, the launches that carry FLOPs are exactly the matmul
// kernels (with dynamic shared memory), never a quantize, amax or chunk-sum helper.
static void test_launch_cost_attention_flops_only_on_matmul_kernels(void **state) {
  (void)state;
  static const char *const models[] = {"models/gem_small.gem", "models/gem_full.gem",
                                       "tests/golden/codegen_attention_fp8.gem",
                                       "tests/golden/codegen_attention_tiny_kv.gem"};
  static const char *const matmul[] = {"_fwd", "_bwd_q", "_bwd_kv", "_bwd_stats", "_bwd_pma",
                                       "_tiny_fwd", "_tiny_bwd", "_bwd"};
  for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
    Case *c = open_case(models[m], NULL);
    const int64_t lens[] = {7, 1, 30};
    set_batch(c, 3, lens, 3);
    int carrying = 0;
    for (int i = 0; i < c->p.nlaunches; i++) {
      const Launch *l = &c->p.launches[i];
      if (l->kind != LAUNCH_KERNEL || l->optimizer || l->node < 0) continue;
      OpKind op = c->m.ir.nodes[l->node].op;
      if (op != OP_ATTENTION && op != OP_ATTENTION_BWD_Q && op != OP_ATTENTION_BWD_K &&
          op != OP_ATTENTION_BWD_V)
        continue;
      bool named = false;
      size_t nk = strlen(l->kernel);
      for (size_t s = 0; s < sizeof matmul / sizeof matmul[0]; s++) {
        size_t ns = strlen(matmul[s]);
        named |= nk > ns && strcmp(l->kernel + nk - ns, matmul[s]) == 0 &&
                 strstr(l->kernel, "_attn") == l->kernel + nk - ns - 5;
      }
      LaunchCost k = cost(c, i);
      if (named != (k.flops > 0))
        print_message("%s: %s has %g FLOPs\n", models[m], l->kernel, k.flops);
      assert_true(named == (k.flops > 0));
      // Quantized attention is on the tensor cores for head widths that are multiples of 16,
      // except the tiny-key-set kernels.
      const Node *n = &c->m.ir.nodes[l->node];
      int64_t dh = c->m.ir.tensors[n->ins[1]].width / n->heads;
      if (named && (n->prec == DT_FP8 || n->prec == DT_MXFP8))
        assert_true(k.tensor_core == (dh % 16 == 0 && !strstr(l->kernel, "_tiny_")));
      carrying += named;
    }
    assert_true(carrying >= 4);
    close_case(c);
  }
}

// --- tables -----------------------------------------------------------------------------

static const char *const TABLE_MODEL =
    "model tables {\n"
    "  batch 8;\n"
    "  dim 32;\n"
    "  precision fp32;\n"
    "  multihot tags : id max 40;\n"
    "  sparse ad : id;\n"
    "  label click;\n"
    "  table items : rows %s, optim rowwise_adagrad(lr = 0.05);\n"
    "  t = embed(items, tags, pool = sum);\n"
    "  a = embed(items, ad);\n"
    "  y = linear(t + a, 1);\n"
    "  loss bce(y, click);\n"
    "}\n";

static Case *table_case(const char *rows) {
  char text[1024];
  snprintf(text, sizeof text, TABLE_MODEL, rows);
  return open_case("tables.gem", text);
}

// The bytes of the pooled lookup, of the single-id lookup and of table_grad's apply kernel.
typedef struct TableBytes {
  double pool, single, apply;
} TableBytes;

static TableBytes table_bytes(const Case *c) {
  int pool = find_kernel(c, OP_EMBED_POOL, "embed_pool_t");
  int single = find_kernel(c, OP_EMBED, "embed_a");
  int apply = find_kernel(c, OP_TABLE_GRAD, "table_grad_apply_items");
  assert_true(pool >= 0 && single >= 0 && apply >= 0);
  return (TableBytes){cost(c, pool).bytes, cost(c, single).bytes, cost(c, apply).bytes};
}

// B = 8 bags of 3, 0, 10 and 2 ids (T = 30) and one id each (8), in fp32 rows of 32.
static void test_launch_cost_lookup_bytes_follow_the_batch_not_the_table(void **state) {
  (void)state;
  const int64_t lens[] = {3, 0, 10, 2};
  Case *small = table_case("1000"), *big = table_case("4_000_000");
  set_batch(small, 8, lens, 4);
  set_batch(big, 8, lens, 4);
  TableBytes s = table_bytes(small), b = table_bytes(big);
  // The pooled lookup writes [8, 32] fp32, reads 30 int64 ids, 9 offsets and 30 table rows.
  assert_true(s.pool == 8 * 32 * 4 + 30 * 8 + 9 * 8 + 30 * 32 * 4);
  // The single lookup: [8, 32] out, 8 ids, 8 rows.
  assert_true(s.single == 8 * 32 * 4 + 8 * 8 + 8 * 32 * 4);
  // 4,000 times the rows, the same bytes: only the rows the batch touches count.
  assert_true(b.pool == s.pool && b.single == s.single && b.apply == s.apply);
  // The apply kernel touches the 38 looked-up rows of the table and of its rowsum, far from the
  // 512 MB of the big table.
  assert_true(s.apply > 38 * 32 * 4 + 38 * 4);
  assert_true(s.apply < 1e5);
  // Fewer rows than lookups: the table counts at most its 10 rows.
  Case *tiny = table_case("10");
  set_batch(tiny, 8, lens, 4);
  TableBytes t = table_bytes(tiny);
  assert_true(t.pool == 8 * 32 * 4 + 30 * 8 + 9 * 8 + 10 * 32 * 4);
  assert_true(t.apply < s.apply);
  close_case(tiny);
  close_case(small);
  close_case(big);
}

// A GEMM with a gelu epilogue (the mlp's first layer) goes through an fp32 scratch: the
// epilogue reads it and writes the layer's output. A tensor named twice (c * c) counts once.
static const char *const SCRATCH_MODEL =
    "model scratch {\n"
    "  batch 8;\n"
    "  dim 32;\n"
    "  precision fp32;\n"
    "  dense counters : f32[4];\n"
    "  label click;\n"
    "  c = mlp(counters, [32, 32], act = gelu);\n"
    "  y = linear(c * c, 1);\n"
    "  loss bce(y, click);\n"
    "}\n";

static void test_launch_cost_scratch_counts_and_repeats_count_once(void **state) {
  (void)state;
  Case *c = open_case("scratch.gem", SCRATCH_MODEL);
  set_batch(c, 8, NULL, 0);
  const Ir *ir = &c->m.ir;
  int lin = find_launch(c, LAUNCH_GEMM, OP_LINEAR, "counters");
  assert_true(lin >= 0);
  assert_int_equal(c->p.launches[lin].gemm_c.kind, ARG_SCRATCH);
  assert_int_equal(ir->nodes[c->p.launches[lin].node].act, ACT_GELU);
  // The GEMM writes the [8, 32] fp32 pre-activation, plus its fp32 bias.
  assert_true(cost(c, lin).bytes == (8 * 4 + 4 * 32) * 4 + 8 * 32 * 4 + 32 * 4);
  int epi = -1, mul = -1;
  for (int i = 0; i < c->p.nlaunches; i++) {
    const Launch *l = &c->p.launches[i];
    if (l->kind != LAUNCH_KERNEL || l->optimizer || l->backward) continue;
    if (l->node == c->p.launches[lin].node) epi = i;
    if (ir->nodes[l->node].op == OP_MUL) mul = i;
  }
  assert_true(epi >= 0 && mul >= 0);
  assert_true(cost(c, epi).bytes == 8 * 32 * 4 + 8 * 32 * 4);  // the scratch in, the layer out
  const Launch *ml = &c->p.launches[mul];
  assert_true(ml->nargs >= 3 && ml->args[1].kind == ARG_TENSOR &&
              ml->args[1].tensor == ml->args[2].tensor);  // the plan does name c twice
  assert_true(cost(c, mul).bytes == 2 * 8 * 32 * 4);     // c in once, c * c out
  assert_true(cost(c, epi).flops == 0 && cost(c, mul).flops == 0);
  close_case(c);
}

// --- whole plans ------------------------------------------------------------------------

// The launches' FLOPs add up to the IR's count for the step, in every model: no matmul counted
// twice (a GEMM and its epilogue) and none dropped (dot_interact, every attention backward).
static void test_launch_cost_sums_to_step_flops(void **state) {
  (void)state;
  static const char *const models[] = {"models/gem_tiny.gem", "models/gem_small.gem",
                                       "models/gem_full.gem", "models/hstu.gem"};
  for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
    Case *c = open_case(models[m], NULL);
    const int64_t lens[] = {0, 1, 17, 50, 3};
    set_batch(c, 10, lens, 5);
    double sum = 0, tc = 0;
    for (int i = 0; i < c->p.nlaunches; i++) {
      LaunchCost k = cost(c, i);
      sum += k.flops;
      tc += k.tensor_core ? k.flops : 0;
      assert_true(k.bytes >= 0);
    }
    double step = step_flops(&c->m.ir, &c->b, true);
    assert_true(step > 0);
    if (fabs(sum - step) > 1e-9 * step) print_message("%s: %g vs %g\n", models[m], sum, step);
    assert_true(fabs(sum - step) <= 1e-9 * step);
    // bf16 models do most of their FLOPs on tensor cores; fp32 gem_tiny none.
    if (m == 0) assert_true(tc == 0);
    if (m == 1) assert_true(tc > 0.9 * sum);
    close_case(c);
  }
}

static void test_launch_cost_roofline_takes_the_binding_limit(void **state) {
  (void)state;
  const Target *h = target_find("sm_90a");
  assert_non_null(h);
  // The bf16 peak's FLOPs in one second on tensor cores, 989 / 67 seconds on CUDA cores.
  LaunchCost c = {h->peak_tflops_bf16 * 1e12, 0, true};
  assert_true(fabs(launch_roofline_s(c, h) - 1) < 1e-12);
  c.tensor_core = false;
  assert_true(fabs(launch_roofline_s(c, h) - h->peak_tflops_bf16 / h->peak_tflops_fp32) < 1e-9);
  assert_true(launch_roofline_s(c, h) > 14);
  // Bytes bind when they take longer: 4.8 TB at 4.8 TB/s.
  LaunchCost m = {1e9, h->hbm_tb_per_s * 1e12, true};
  assert_true(fabs(launch_roofline_s(m, h) - 1) < 1e-12);
  assert_true(launch_roofline_s((LaunchCost){0, 0, false}, h) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_launch_cost_gemm_is_2mnk_with_its_operand_bytes),
      cmocka_unit_test(test_launch_cost_memset_moves_its_zero_bytes),
      cmocka_unit_test(test_launch_cost_bf16_gemm_runs_on_tensor_cores),
      cmocka_unit_test(test_launch_cost_fp8_gemm_reads_e4m3_codes_on_tensor_cores),
      cmocka_unit_test(test_launch_cost_attention_forward_counts_visible_pairs),
      cmocka_unit_test(test_launch_cost_attention_backward_is_2_5x_split_by_matmuls),
      cmocka_unit_test(test_launch_cost_fp32_attention_is_not_on_tensor_cores),
      cmocka_unit_test(test_launch_cost_attention_flops_only_on_matmul_kernels),
      cmocka_unit_test(test_launch_cost_lookup_bytes_follow_the_batch_not_the_table),
      cmocka_unit_test(test_launch_cost_scratch_counts_and_repeats_count_once),
      cmocka_unit_test(test_launch_cost_sums_to_step_flops),
      cmocka_unit_test(test_launch_cost_roofline_takes_the_binding_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
