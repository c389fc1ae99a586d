// test_gpu_kernels.c: `make test-gpu`, on a machine with a GPU. No cmocka (the GPU machine has
// none): each check prints PASS or FAIL and the exit status counts the failures.
//
//  1. Every launch of the plans of the given models, forward and backward, against the CPU
//     executor node by node, each node fed the CPU's values of its inputs, on fresh random
//     jagged batches: one with an empty sequence and a
//     length-1 sequence first, lengths that are not multiples of any tile, and one at the max
//     lengths. Each stored output of each node is compared as ||gpu - cpu|| / ||cpu|| within the
//     tolerance of the node's precision (fp32 1e-4, bf16/fp16/fp8/mxfp8 2e-2); in a relu
//     backward, elements zero on one side only (the pre-activation rounded across 0) are
//     counted apart, at most 1% of them; the largest relative error is printed. The loss and
//     the task probabilities through the normal forward path as well, within the tolerance
//     of the least precise forward op (the loss) and 10 times it (the probabilities).
//  2. End to end: gem_tiny trained 200 steps on the GPU and on the CPU from the same seed: the
//     first loss within 1e-4, and every 20-step mean of the curves within 2% of each other.
//
// usage: test_gpu_kernels [--batch B] [--e2e MODEL [--steps N] [--e2e-batch B]] MODEL...
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "cpu_exec.h"
#include "cuda_driver.h"
#include "gpu_exec.h"
#include "jit_cache.h"
#include "load_model.h"
#include "nvrtc_compile.h"
#include "lower.h"
#include "plan.h"
#include "train.h"
#include "gpu_check.h"


// --- random batches ---------------------------------------------------------------------

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
static int64_t below(int64_t n) { return n > 0 ? (int64_t)(next_u64() % (uint64_t)n) : 0; }
static float uniform(void) { return (float)(next_u64() >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

// kind 0: example 0 empty, example 1 of length 1, the rest random; 1: random lengths chosen to
// miss tile multiples (L % 16 != 0 where possible); 2: every example at its max length.
static void random_batch(const Schema *s, int64_t B, int kind, Batch *b) {
  batch_alloc(b, s, B);
  for (int j = 0; j < s->njagged; j++) {
    int64_t max_len = s->ir->jagged[j].max_len;
    b->offsets[j][0] = 0;
    for (int64_t e = 0; e < B; e++) {
      int64_t len = below(max_len + 1);
      if (kind == 0 && e == 0) len = 0;
      if (kind == 0 && e == 1) len = 1;
      if (kind == 1 && len % 16 == 0 && len + 1 <= max_len) len++;
      if (kind == 2) len = max_len;
      b->offsets[j][e + 1] = b->offsets[j][e] + len;
    }
    b->total[j] = b->offsets[j][B];
  }
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    int64_t n = (ft->jag >= 0 ? b->total[ft->jag] : B) * (ft->width > 0 ? ft->width : 1);
    batch_reserve(b, f, n);
    for (int64_t i = 0; i < n; i++) {
      if (ft->kind == FEATURE_IDS) b->ids[f][i] = below(ft->id_limit > 0 ? ft->id_limit : 1000);
      else if (ft->kind == FEATURE_LABEL) b->values[f][i] = (float)below(2);
      else b->values[f][i] = uniform();
    }
  }
}

// --- compiling --------------------------------------------------------------------------

// Compiles the plan per kernel (in parallel, through the cache); the units own the images.
static bool compile_plan(const Plan *p, JitUnit **units, int *nunits, char ***parts) {
  char reason[512], dir[4096];
  if (!nvrtc_available(reason, sizeof reason)) {
    check(false, "NVRTC: %s", reason);
    return false;
  }
  bool cache = jit_cache_dir(dir, sizeof dir, reason, sizeof reason);
  static const char *const options[] = {"nvrtc_compile defaults", "cubin"};
  JitRequest r = {.arch = p->target, .options = options, .noptions = 2,
                  .compiler_version = nvrtc_version(), .gemc_version = "test",
                  .cache_dir = cache ? dir : NULL, .compile = nvrtc_compile_unit};
  int n = jit_split_source(p->source, parts);
  *units = calloc((size_t)n + 1, sizeof **units);
  for (int i = 0; i < n; i++) (*units)[i] = (JitUnit){.name = "kernel", .source = (*parts)[i]};
  *nunits = n;
  JitStats st;
  static char err[16384];
  bool ok = jit_compile_units(&r, *units, n, &st, err, sizeof err);
  check(ok, "%s: %d kernels compiled for %s in %.2f s (%d from the cache)%s%s", p->ir->model, n,
        p->target, st.seconds, st.hits, ok ? "" : "\n", ok ? "" : err);
  return ok;
}

// --- comparing --------------------------------------------------------------------------

static double tolerance(DType prec) { return prec == DT_F32 || prec == DT_F64 ? 1e-4 : 2e-2; }

// The loss and the probabilities go through the whole forward path, so they are only as close
// as its least precise op allows: a quantized (fp8, mxfp8) attention summing in another order
// than the CPU can round a P value on an E4M3 boundary the other way, and each later
// quantization magnifies that.
static double path_tolerance(const Ir *ir) {
  double tol = tolerance(ir->precision);
  for (int i = 0; i < ir->nforward; i++) tol = fmax(tol, tolerance(ir->nodes[i].prec));
  return tol;
}

// The largest relative error of a batch's node comparisons, and where it was.
static double g_worst_rel;
static char g_worst_what[320];

// Compares tensor t on the GPU with the CPU executor's value; returns false on a mismatch.
// relu' jumps at 0, so a pre-activation that rounds to the other side of 0 on one backend (a
// bf16 GEMM summing in another order) zeroes a gradient element there and not here: a relu
// backward may have a few such mask flips (one side exactly 0), left out of the error norm.
static bool relu_backward(const Node *n) {
  return (n->op == OP_ACT_BWD || n->op == OP_LINEAR_ACT_BWD) && node_act(n) == ACT_RELU;
}

static bool compare_tensor(GpuExec *g, CpuExec *x, const Ir *ir, int t, const Node *node,
                           const char *what) {
  DType prec = node->prec;
  const Tensor *tt = &ir->tensors[t];
  const float *want = NULL;
  int64_t n = 0, want_rows = 0;
  const int64_t *want_ids = NULL;
  if (tt->layout == LAYOUT_ROWS) {
    want = cpu_exec_grad(x, tt->table, &want_rows, &want_ids);
    n = want_rows * (tt->width > 0 ? tt->width : 1);
  } else {
    want = cpu_exec_data(x, t);
    n = cpu_exec_numel(x, t);
  }
  if (!want) return true;  // the CPU did not keep it (not reached by the loss)
  float *got = calloc((size_t)n + 1, sizeof *got);
  int64_t got_n = 0, got_rows = 0, *got_ids = NULL;
  char err[512];
  bool ok = gpu_exec_read_tensor(g, t, got, n, &got_n, &got_rows, &got_ids, err, sizeof err);
  if (!ok) {
    check(false, "%s: %s: cannot read %s: %s", ir->model, what, tt->name, err);
    free(got);
    return false;
  }
  if (got_n != n || (tt->layout == LAYOUT_ROWS && got_rows != want_rows)) {
    check(false, "%s: %s: %s has %" PRId64 " values on the GPU, %" PRId64 " on the CPU",
          ir->model, what, tt->name, got_n, n);
    free(got);
    free(got_ids);
    return false;
  }
  for (int64_t r = 0; tt->layout == LAYOUT_ROWS && r < got_rows; r++)
    if (got_ids[r] != want_ids[r]) {
      check(false, "%s: %s: %s row %" PRId64 " has id %" PRId64 " on the GPU, %" PRId64
            " on the CPU", ir->model, what, tt->name, r, got_ids[r], want_ids[r]);
      free(got);
      free(got_ids);
      return false;
    }
  double diff = 0, norm = 0, max_abs = 0;
  int64_t worst = 0, flips = 0;
  bool finite = true, kinks = relu_backward(node);
  for (int64_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)want[i];
    finite = finite && isfinite(got[i]);
    if (kinks && d != 0 && (got[i] == 0 || want[i] == 0)) {
      flips++;
      continue;
    }
    diff += d * d;
    norm += (double)want[i] * want[i];
    if (fabs(d) > max_abs) max_abs = fabs(d), worst = i;
  }
  double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
  if (rel > g_worst_rel) {
    g_worst_rel = rel;
    snprintf(g_worst_what, sizeof g_worst_what, "%s, %s", what, tt->name);
  }
  // A node computed in fp32 but stored in bf16 (bce_bwd of a bf16 logit) rounds like bf16.
  double tol = fmax(tolerance(prec), tolerance(tt->dtype));
  int64_t max_flips = n / 100 > 2 ? n / 100 : 2;
  ok = finite && (rel <= tol || (norm == 0 && max_abs <= 1e-6)) && flips <= max_flips;
  if (flips > 0)
    printf("     %s: %s: %" PRId64 " relu mask flip(s) of %" PRId64 " values (at most %" PRId64
           " allowed)\n", ir->model, tt->name, flips, n, max_flips);
  if (!ok)
    check(false, "%s: %s: %s (%s, %" PRId64 " values): relative error %.3g > %.0e; worst at %"
          PRId64 ": gpu %.6g cpu %.6g", ir->model, what, tt->name, dtype_name(tt->dtype), n,
          rel, tol, worst, (double)got[worst], (double)want[worst]);
  free(got);
  free(got_ids);
  return ok;
}

// Writes the CPU's values of every input of the nodes that launch l covers into the GPU's
// buffers, so that each node is checked on exactly the CPU's inputs: a small difference
// upstream (a bf16 rounding that went the other way) cannot grow into a mismatch downstream.
// Parameters and tables are already the CPU's; batch inputs are the same batch.
static bool feed_inputs(const Plan *p, GpuExec *g, CpuExec *x, const Launch *l, char *err,
                        size_t err_size) {
  const Ir *ir = p->ir;
  int nodes = l->nfused > 0 ? l->nfused : 1;
  for (int k = l->node; k >= 0 && k < l->node + nodes && k < ir->nnodes; k++)
    for (int a = 0; a < ir->nodes[k].nins; a++) {
      int t = ir->nodes[k].ins[a];
      if (t < 0) continue;
      const Tensor *tt = &ir->tensors[t];
      if (tt->kind != TENSOR_VALUE || tt->layout == LAYOUT_ROWS) continue;
      const float *v = cpu_exec_data(x, t);
      if (!v || p->tensor_buffer[t] < 0) continue;
      if (!gpu_exec_write_tensor(g, t, v, cpu_exec_numel(x, t), err, err_size)) return false;
    }
  return true;
}

// Runs the plan's forward and backward launches one node group at a time, each on the CPU's
// inputs (feed_inputs), comparing each group's stored outputs with the CPU's.
static void compare_plan(const Plan *p, GpuExec *g, CpuExec *x, const char *batch_name) {
  const Ir *ir = p->ir;
  int bad = 0, compared = 0;
  g_worst_rel = 0;
  g_worst_what[0] = 0;
  for (int i = 0; i < p->nlaunches;) {
    const Launch *l = &p->launches[i];
    if (l->optimizer) {
      i++;
      continue;
    }
    int j = i + 1;
    while (j < p->nlaunches && !p->launches[j].optimizer && p->launches[j].node == l->node) j++;
    char err[1024];
    if (!feed_inputs(p, g, x, l, err, sizeof err)) {
      check(false, "%s: %s: node %d: %s", ir->model, batch_name, l->node, err);
      bad++;
      break;
    }
    if (!gpu_exec_run_range(g, i, j, 1, err, sizeof err)) {
      check(false, "%s: %s: launches %d..%d (node %d): %s", ir->model, batch_name, i, j - 1,
            l->node, err);
      bad++;
      break;
    }
    for (int k = l->node; k < l->node + (l->nfused > 0 ? l->nfused : 1) && k < ir->nnodes; k++) {
      int t = ir->nodes[k].out;
      if (p->tensor_buffer[t] < 0) continue;
      char what[256];
      snprintf(what, sizeof what, "%s, node %d (%s, launch %s)", batch_name, k,
               op_name(ir->nodes[k].op), l->kind == LAUNCH_KERNEL ? l->kernel
                                         : l->kind == LAUNCH_GEMM ? "cuBLASLt" : "memset");
      compared++;
      if (!compare_tensor(g, x, ir, t, &ir->nodes[k], what)) bad++;
    }
    i = j;
  }
  check(bad == 0, "%s: %s: %d node outputs compared, %d mismatched; largest relative error %.3g "
        "(%s)", ir->model, batch_name, compared, bad, g_worst_rel, g_worst_what);
}

static void test_model(const char *path, int64_t B) {
  LoadedModel m;
  if (!load_model(&m, path, NULL, true, true, false)) {
    check(false, "%s: does not load", path);
    loaded_model_free(&m);
    return;
  }
  m.ir.batch = B;
  CudaContext ctx;
  char err[1024];
  if (!cuda_context_open(&ctx, -1, err, sizeof err)) {
    check(false, "no GPU: %s", err);
    loaded_model_free(&m);
    return;
  }
  Diag d;
  diag_init(&d, &m.src, stderr);
  Plan p;
  if (!plan_build(&m.ir, ctx.arch, &m.arena, &d, &p)) {
    check(false, "%s: plan_build for %s failed", path, ctx.arch);
    loaded_model_free(&m);
    return;
  }
  JitUnit *units = NULL;
  int nunits = 0;
  char **parts = NULL;
  if (!compile_plan(&p, &units, &nunits, &parts)) goto out;
  const void **images = calloc((size_t)nunits + 1, sizeof *images);
  for (int i = 0; i < nunits; i++) images[i] = units[i].image;
  GpuExecOptions o = {.max_batch = B, .sync_each_launch = true};
  GpuExec *g = gpu_exec_new(&p, &ctx, (const void *const *)images, nunits, &o, err, sizeof err);
  free(images);
  check(g != NULL, "%s: GPU executor created (%d launches)%s%s", path, p.nlaunches,
        g ? "" : ": ", g ? "" : err);
  if (!g) goto out;
  CpuExec *x = cpu_exec_new(&m.ir, EXEC_F32);
  cpu_exec_init_params(x, 7);
  cpu_exec_keep_values(x, true);
  check(gpu_exec_upload_params(g, x, err, sizeof err), "%s: parameters uploaded %s", path, err);
  Schema s;
  schema_from_ir(&m.ir, &s);
  const char *names[3] = {"batch with empty and length-1 sequences", "batch off the tiles",
                          "batch at max lengths"};
  for (int kind = 0; kind < 3; kind++) {
    Batch b;
    random_batch(&s, B, kind, &b);
    if (!cpu_exec_set_batch(x, &b, err, sizeof err)) {
      check(false, "%s: %s: the CPU refuses it: %s", path, names[kind], err);
      batch_free(&b);
      continue;
    }
    double cpu_loss = cpu_exec_forward(x);
    cpu_exec_backward(x);
    // Each batch starts from the initial parameters: the backward pass updates the tables
    // (the row-wise optimizer is fused into table_grad), and the CPU executor's do not move.
    bool ok = gpu_exec_upload_params(g, x, err, sizeof err) &&
              gpu_exec_set_batch(g, &b, err, sizeof err);
    check(ok, "%s: %s uploaded %s", path, names[kind], ok ? "" : err);
    // The loss and the probabilities through the normal path (graphs off: sync_each_launch).
    double gpu_loss = NAN;
    ok = ok && gpu_exec_launch(g, GPU_FORWARD, 1, err, sizeof err) &&
         gpu_exec_finish(g, &gpu_loss, err, sizeof err);
    double tol = path_tolerance(&m.ir);
    check(ok && fabs(gpu_loss - cpu_loss) <= tol * fabs(cpu_loss) + 1e-6,
          "%s: %s: loss gpu %.7g cpu %.7g%s%s", path, names[kind], gpu_loss, cpu_loss,
          ok ? "" : ": ", ok ? "" : err);
    for (int k = 0; ok && k < gpu_exec_ntasks(g); k++) {
      const float *gp = gpu_exec_task_probs(g, k), *cp = cpu_exec_task_probs(x, k);
      double worst = 0;
      for (int64_t e = 0; e < B; e++) worst = fmax(worst, fabs((double)gp[e] - cp[e]));
      check(worst <= 10 * tol, "%s: %s: task %d probabilities differ by at most %.3g", path,
            names[kind], k, worst);
    }
    if (ok) compare_plan(&p, g, x, names[kind]);
    batch_free(&b);
  }
  cpu_exec_free(x);
  gpu_exec_free(g);
out:
  for (int i = 0; i < nunits; i++) free(parts[i]);
  free(parts);
  jit_units_free(units, nunits);
  free(units);
  cuda_context_close(&ctx);
  loaded_model_free(&m);
}

// --- end to end -------------------------------------------------------------------------

static bool train_curve(const char *path, bool cuda, int64_t steps, int64_t batch,
                        double *losses) {
  LoadedModel m;
  if (!load_model(&m, path, NULL, true, true, false)) {
    loaded_model_free(&m);
    return false;
  }
  TrainOptions o;
  train_options_default(&o);
  o.seed = 3;
  o.cuda = cuda;
  o.batch = batch;
  o.eval_examples = 64;
  char err[2048];
  Trainer *t = trainer_new(&m.ir, &o, err, sizeof err);
  bool ok = t != NULL;
  for (int64_t i = 0; ok && i < steps; i++) ok = trainer_step(t, &losses[i], err, sizeof err);
  if (!ok) check(false, "%s: training on the %s failed: %s", path, cuda ? "GPU" : "CPU", err);
  double secs = t ? trainer_step_seconds(t) : 0;
  if (ok)
    printf("     %s on the %s: %" PRId64 " steps in %.2f s (%.2f ms/step)\n", path,
           cuda ? "GPU" : "CPU", steps, secs, 1e3 * secs / (double)steps);
  trainer_free(t);
  loaded_model_free(&m);
  return ok;
}

static void test_end_to_end(const char *path, int64_t steps, int64_t batch) {
  double *gpu = calloc((size_t)steps, sizeof *gpu), *cpu = calloc((size_t)steps, sizeof *cpu);
  if (train_curve(path, true, steps, batch, gpu) && train_curve(path, false, steps, batch, cpu)) {
    check(fabs(gpu[0] - cpu[0]) <= 1e-4 * fabs(cpu[0]), "%s: first loss gpu %.7g cpu %.7g",
          path, gpu[0], cpu[0]);
    int bad = 0;
    for (int64_t w = 0; w + 20 <= steps; w += 20) {
      double a = 0, c = 0;
      for (int64_t i = w; i < w + 20; i++) a += gpu[i], c += cpu[i];
      a /= 20, c /= 20;
      bool ok = fabs(a - c) <= 0.02 * fabs(c);
      printf("     steps %4" PRId64 "-%4" PRId64 ": mean loss gpu %.5f cpu %.5f %s\n", w + 1,
             w + 20, a, c, ok ? "" : "(off)");
      bad += !ok;
    }
    check(bad == 0, "%s: %" PRId64 "-step loss curves match within 2%% (%d windows off)", path,
          steps, bad);
  }
  free(gpu);
  free(cpu);
}

int main(int argc, char **argv) {
  const char *e2e = NULL;
  int64_t steps = 200, B = 24, e2e_batch = 0;
  int first_model = argc;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--e2e") == 0 && i + 1 < argc) e2e = argv[++i];
    else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoll(argv[++i]);
    else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) B = atoll(argv[++i]);
    else if (strcmp(argv[i], "--e2e-batch") == 0 && i + 1 < argc) e2e_batch = atoll(argv[++i]);
    else {
      first_model = i;
      break;
    }
  }
  char err[512];
  if (!cuda_usable(err, sizeof err)) {
    printf("FAIL no usable GPU: %s\n", err);
    return 1;
  }
  for (int i = first_model; i < argc; i++) test_model(argv[i], B);
  if (e2e) test_end_to_end(e2e, steps, e2e_batch);
  printf("\n%d checks, %d failed\n", gpu_check_count, gpu_check_failures);
  return gpu_check_failures ? 1 : 0;
}
