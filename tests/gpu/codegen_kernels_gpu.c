// codegen_kernels_gpu.c: runs generated kernels of tests/golden/codegen_small.gem on the GPU
// against CPU references, on fresh random jagged data (empty and length-1 bags included):
//   - the fused add + rmsnorm (bf16): every output within one bf16 ulp, the sum exact
//   - the pooled mean embedding: exact
//   - the whole table_grad pipeline with row-wise Adagrad for @tagt: the rows gradient and the
//     updated table and state equal the CPU's, and two runs give identical bits
// It executes the plan's own launches (arguments resolved as the runtime does), compiling the
// source with NVRTC for the GPU's arch, or loading the cubin given as argv[1].
//   codegen_kernels_gpu [model.cubin]      exit 0 when every check passes
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "kernel_builder.h"  // tensor_rows
#include "load_model.h"
#include "memplan.h"
#include "numerics.h"
#include "nvrtc_compile.h"
#include "lower.h"
#include "plan.h"

static const CudaDriver *cu;
static const Plan *plan;
static CUmodule module;
static CUdeviceptr *buffers;
static CUdeviceptr offsets_dev[8];
static int64_t B, totals[8];
static int failures;

#define CHECK(x) do { if (!CU_CHECK(x)) { fprintf(stderr, "%s\n", cuda_last_error()); exit(2); } } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {  // [0, 1)
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static CUdeviceptr tensor_ptr(int t) {
  int b = plan->tensor_buffer[t];
  if (b < 0) { fprintf(stderr, "tensor %s has no buffer\n", plan->ir->tensors[t].name); exit(2); }
  return buffers[b] + (CUdeviceptr)symsize_eval(plan->tensor_offset[t], B, totals);
}

static void run_launch(const Launch *l) {
  if (l->kind == LAUNCH_ZERO) {
    CUdeviceptr p = l->zero_arg.kind == ARG_TENSOR ? tensor_ptr(l->zero_arg.tensor)
                                                   : buffers[plan->scratch[l->zero_arg.slot].buffer];
    CHECK(cu->cuMemsetD8Async(p, 0, (size_t)symsize_eval(l->zero_bytes, B, totals), NULL));
    return;
  }
  if (l->kind != LAUNCH_KERNEL) { fprintf(stderr, "not a kernel launch\n"); exit(2); }
  CUfunction f;
  CHECK(cu->cuModuleGetFunction(&f, module, l->kernel));
  union { CUdeviceptr p; int64_t i; float f; } vals[PLAN_MAX_ARGS];
  void *params[PLAN_MAX_ARGS];
  for (int a = 0; a < l->nargs; a++) {
    const LaunchArg *x = &l->args[a];
    switch (x->kind) {
      case ARG_TENSOR: vals[a].p = tensor_ptr(x->tensor); break;
      case ARG_GRAD: vals[a].p = tensor_ptr(ir_grad_of(plan->ir, x->tensor)); break;
      case ARG_OPTSTATE: vals[a].p = buffers[plan->optstate_buffer[2 * x->tensor + x->slot]]; break;
      case ARG_OFFSETS: vals[a].p = offsets_dev[x->jag]; break;
      case ARG_SIZE: vals[a].i = symsize_eval(x->size, B, totals); break;
      case ARG_INT: vals[a].i = x->i; break;
      case ARG_FLOAT: vals[a].f = x->f; break;
      case ARG_STEP: vals[a].i = 1; break;
      case ARG_SCRATCH: vals[a].p = buffers[plan->scratch[x->slot].buffer]; break;
      default: fprintf(stderr, "argument kind %d not supported here\n", x->kind); exit(2);
    }
    params[a] = &vals[a];
  }
  int64_t size = symsize_eval(l->size, B, totals);
  unsigned grid = (unsigned)((size + l->per_block - 1) / l->per_block);
  if (grid == 0) return;
  CHECK(cu->cuLaunchKernel(f, grid, 1, 1, (unsigned)l->threads, 1, 1, (unsigned)l->smem, NULL, params, NULL));
}

static const Launch *launch_named(const char *name) {
  for (int i = 0; i < plan->nlaunches; i++)
    if (plan->launches[i].kind == LAUNCH_KERNEL && strcmp(plan->launches[i].kernel, name) == 0) return &plan->launches[i];
  fprintf(stderr, "no kernel %s in the plan\n", name);
  exit(2);
}

static int tensor(const char *name) {
  int t = ir_find_tensor(plan->ir, name);
  if (t < 0) { fprintf(stderr, "no tensor %s\n", name); exit(2); }
  return t;
}

static void upload(int t, const void *host, size_t bytes) { CHECK(cu->cuMemcpyHtoD(tensor_ptr(t), host, bytes)); }
static void download(void *host, int t, size_t bytes) { CHECK(cu->cuMemcpyDtoH(host, tensor_ptr(t), bytes)); }

static void expect(bool ok, const char *what) {
  printf("%s %s\n", ok ? "PASS" : "FAIL", what);
  if (!ok) failures++;
}

// --- add + rmsnorm ------------------------------------------------------------------------
static void check_add_rmsnorm(void) {
  const Ir *ir = plan->ir;
  int tn = tensor("n"), tr = tensor("r"), tg = tensor("n.rmsnorm0.gain");
  const Launch *l = launch_named("add_rmsnorm_n");
  int in_a = l->args[2].tensor, in_b = l->args[3].tensor;
  int64_t d = ir->tensors[tn].width, n = B * d;
  uint16_t *a = malloc(n * 2), *b = malloc(n * 2), *y = malloc(n * 2), *s = malloc(n * 2);
  float gain[64];
  for (int64_t i = 0; i < n; i++) { a[i] = bf16_encode((float)(uniform() * 4 - 2)); b[i] = bf16_encode((float)(uniform() * 2 - 1)); }
  for (int j = 0; j < d; j++) gain[j] = (float)(0.5 + uniform());
  upload(in_a, a, n * 2); upload(in_b, b, n * 2); upload(tg, gain, d * 4);
  run_launch(l);
  CHECK(cu->cuCtxSynchronize());
  download(y, tn, n * 2); download(s, tr, n * 2);
  int sum_bad = 0, y_bad = 0;
  double worst = 0;
  for (int64_t r = 0; r < B; r++) {
    double sq = 0;
    float sum[64];
    for (int j = 0; j < d; j++) {
      sum[j] = round_bf16(bf16_decode(a[r * d + j]) + bf16_decode(b[r * d + j]));
      if (bf16_encode(sum[j]) != s[r * d + j]) sum_bad++;
      sq += (double)sum[j] * sum[j];
    }
    double inv = 1.0 / sqrt(sq / d + ir->nodes[ir->tensors[tn].producer].eps);
    for (int j = 0; j < d; j++) {
      float want = round_bf16((float)(sum[j] * inv * gain[j]));
      float got = bf16_decode(y[r * d + j]);
      double ulp = fabs(want) * 0x1p-7 + 1e-30;
      double err = fabs(got - want) / ulp;
      if (err > worst) worst = err;
      if (err > 1.0) y_bad++;
    }
  }
  printf("  add_rmsnorm_n: %lld rows x %lld, sum mismatches %d, worst |y - ref| = %.3f bf16 ulp\n",
         (long long)B, (long long)d, sum_bad, worst);
  expect(sum_bad == 0 && y_bad == 0, "fused add + rmsnorm (bf16) matches the CPU reference");
  free(a); free(b); free(y); free(s);
}

// --- pooled mean embedding ----------------------------------------------------------------
static void check_embed_pool(const int64_t *offs, const int64_t *ids) {
  const Ir *ir = plan->ir;
  int tt = tensor("t"), table = tensor("tagt");
  int64_t d = ir->tensors[table].fixed[1], rows = ir->tensors[table].fixed[0];
  uint16_t *tab = malloc(rows * d * 2), *out = malloc(B * d * 2);
  for (int64_t i = 0; i < rows * d; i++) tab[i] = bf16_encode((float)(uniform() * 2 - 1));
  upload(table, tab, rows * d * 2);
  run_launch(launch_named("embed_pool_t"));
  CHECK(cu->cuCtxSynchronize());
  download(out, tt, B * d * 2);
  int bad = 0;
  for (int64_t b = 0; b < B; b++)
    for (int j = 0; j < d; j++) {
      float acc = 0;
      for (int64_t p = offs[b]; p < offs[b + 1]; p++) acc += bf16_decode(tab[ids[p] * d + j]);
      int64_t len = offs[b + 1] - offs[b];
      float want = round_to_dtype(len > 0 ? acc / (float)len : 0.0f, ir->tensors[tt].dtype);
      if (bf16_encode(want) != out[b * d + j]) bad++;
    }
  expect(bad == 0, "pooled mean embedding (empty bags included) is bit-exact");
  free(tab); free(out);
}

// --- table_grad + row-wise Adagrad --------------------------------------------------------
// The launches that cover table_grad node `node`: the tables whose id sorts share launches are
// one run of launches of the first table's node, covering the others (Launch.nfused). The
// other tables of that run get valid ids and zero gradients, so that their part of the run
// stays inside their tables (their results are not checked here).
static bool covers(const Launch *l, int node) {
  return l->node >= 0 && node >= l->node && node < l->node + (l->nfused > 0 ? l->nfused : 1);
}

static void feed_other_tables(int node) {
  const Ir *ir = plan->ir;
  int first = -1;
  for (int i = 0; i < plan->nlaunches && first < 0; i++)
    if (covers(&plan->launches[i], node) && !plan->launches[i].optimizer) first = i;
  if (first < 0) return;
  const Launch *l = &plan->launches[first];
  for (int k = l->node; k < l->node + l->nfused; k++) {
    const Node *n = &ir->nodes[k];
    if (k == node || n->op != OP_TABLE_GRAD) continue;
    int64_t rows = ir->tensors[n->ins[0]].fixed[0];
    for (int a = 1; a + 1 < n->nins; a += 2) {
      int ids_t = n->ins[a], dy_t = n->ins[a + 1];
      int64_t count = symsize_eval(tensor_rows(ir, ids_t), B, totals);
      int64_t *v = malloc((size_t)(count + 1) * 8);
      for (int64_t i = 0; i < count; i++) v[i] = (int64_t)(uniform() * (double)rows) % rows;
      if (count > 0) CHECK(cu->cuMemcpyHtoD(tensor_ptr(ids_t), v, (size_t)count * 8));
      free(v);
      size_t bytes = (size_t)symsize_eval(plan_tensor_bytes(plan, dy_t), B, totals);
      if (bytes > 0) CHECK(cu->cuMemsetD8Async(tensor_ptr(dy_t), 0, bytes, NULL));
    }
  }
}

static void run_table_grad(int node) {
  feed_other_tables(node);
  for (int i = 0; i < plan->nlaunches; i++)
    if (covers(&plan->launches[i], node) && !plan->launches[i].optimizer) run_launch(&plan->launches[i]);
  CHECK(cu->cuCtxSynchronize());
}

static void check_table_grad(const int64_t *ids, int64_t nocc) {
  const Ir *ir = plan->ir;
  int tags = tensor("tags");
  int table = tensor("tagt"), dy_t = tensor("t.grad.per_id"), rows_t = tensor("tagt.grad");
  int node = ir->tensors[rows_t].producer;
  int64_t d = ir->tensors[table].fixed[1], rows = ir->tensors[table].fixed[0];
  Optim o = ir->tensors[table].optim;
  uint16_t *tab0 = malloc(rows * d * 2), *tab = malloc(rows * d * 2), *tab2 = malloc(rows * d * 2);
  float *dy = malloc(nocc * d * 4), *rowsum = calloc(rows, 4), *rowsum_gpu = malloc(rows * 4);
  for (int64_t i = 0; i < rows * d; i++) tab0[i] = bf16_encode((float)(uniform() * 2 - 1));
  for (int64_t i = 0; i < nocc * d; i++) dy[i] = (float)(uniform() * 2 - 1);
  size_t rows_bytes = (size_t)symsize_eval(plan_tensor_bytes(plan, rows_t), B, totals);
  char *grad1 = malloc(rows_bytes), *grad2 = malloc(rows_bytes);
  CUdeviceptr state = buffers[plan->optstate_buffer[2 * table]];
  for (int run = 0; run < 2; run++) {
    // The memory plan lends the ids' buffer to the pipeline's scratch after the gather, as it
    // may (an input is written before every step): upload them again for the second run.
    upload(tags, ids, nocc * 8);
    upload(table, tab0, rows * d * 2);
    upload(dy_t, dy, nocc * d * 4);
    CHECK(cu->cuMemsetD8Async(state, 0, rows * 4, NULL));
    run_table_grad(node);
    download(run ? grad2 : grad1, rows_t, rows_bytes);
    download(run ? tab2 : tab, table, rows * d * 2);
  }
  CHECK(cu->cuMemcpyDtoH(rowsum_gpu, state, rows * 4));
  expect(memcmp(grad1, grad2, rows_bytes) == 0 && memcmp(tab, tab2, rows * d * 2) == 0,
         "table_grad: two runs give identical bits");
  // CPU: distinct ids ascending, each the sum of its dy rows in occurrence order.
  int64_t U = 0;
  int bad_ids = 0, bad_grad = 0, bad_table = 0;
  const int64_t *gids = (const int64_t *)grad1 + 1;
  const float *gvals = (const float *)(gids + nocc);
  float *g = malloc(d * 4);
  for (int64_t id = 0; id < rows; id++) {
    int hits = 0;
    for (int j = 0; j < d; j++) g[j] = 0;
    for (int64_t p = 0; p < nocc; p++)
      if (ids[p] == id) { hits++; for (int j = 0; j < d; j++) g[j] += dy[p * d + j]; }
    if (!hits) {
      if (memcmp(tab + id * d, tab0 + id * d, d * 2) != 0) bad_table++;
      continue;
    }
    if (U >= ((const int64_t *)grad1)[0] || gids[U] != id) { bad_ids++; U++; continue; }
    for (int j = 0; j < d; j++) if (gvals[U * d + j] != g[j]) bad_grad++;
    double sum_sq = 0;
    for (int j = 0; j < d; j++) sum_sq += (double)g[j] * g[j];
    rowsum[id] = (float)(rowsum[id] + sum_sq / (double)d);
    double step = o.lr / (sqrt((double)rowsum[id]) + o.eps);
    for (int j = 0; j < d; j++) {
      float want = round_bf16((float)(bf16_decode(tab0[id * d + j]) - step * g[j]));
      if (bf16_encode(want) != tab[id * d + j]) bad_table++;
    }
    if (rowsum[id] != rowsum_gpu[id]) bad_table++;
    U++;
  }
  printf("  table_grad @tagt: %lld occurrences, %lld distinct ids (GPU says %lld); id mismatches %d, "
         "gradient mismatches %d, table/state mismatches %d\n",
         (long long)nocc, (long long)U, (long long)((const int64_t *)grad1)[0], bad_ids, bad_grad, bad_table);
  expect(U == ((const int64_t *)grad1)[0] && bad_ids == 0 && bad_grad == 0,
         "table_grad rows equal the CPU's (ids ascending, sums bit-exact)");
  expect(bad_table == 0, "row-wise Adagrad update of the touched rows equals the CPU's (bf16 table)");
  free(tab0); free(tab); free(tab2); free(dy); free(rowsum); free(rowsum_gpu); free(grad1); free(grad2); free(g);
}

int main(int argc, char **argv) {
  LoadedModel m;
  if (!load_model(&m, "tests/golden/codegen_small.gem", NULL, true, true, false)) return 2;
  Diag d;
  diag_init(&d, &m.src, stderr);
  Plan p;
  if (!plan_build(&m.ir, NULL, &m.arena, &d, &p)) return 2;
  plan = &p;
  CudaContext ctx;
  char err[4096];
  if (!cuda_context_open(&ctx, 0, err, sizeof err)) {
    printf("SKIP: no GPU: %s\n", err);
    return 0;
  }
  printf("device: %s (%s), %d SMs\n", ctx.name, ctx.arch, ctx.sm_count);
  cu = cuda_driver();
  char *image = NULL;
  size_t size = 0;
  if (nvrtc_compile(p.source, "codegen_small.cu", ctx.arch, NVRTC_CUBIN, &image, &size, NULL, err, sizeof err)) {
    printf("NVRTC on the device: compiled %zu bytes of source to a %zu-byte cubin for %s\n", strlen(p.source), size, ctx.arch);
  } else if (argc > 1) {
    printf("NVRTC on the device failed (%.200s); loading %s\n", err, argv[1]);
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    image = malloc(8 << 20);
    size = fread(image, 1, 8 << 20, f);
    fclose(f);
  } else {
    printf("FAIL: NVRTC: %s\n", err);
    return 1;
  }
  CHECK(cu->cuModuleLoadData(&module, image));

  // A random batch: B examples, bag lengths in [0, max] with 0 and 1 forced in.
  const Ir *ir = &m.ir;
  B = ir->batch;
  int64_t *offs[8];
  for (int j = 0; j < ir->njagged; j++) {
    offs[j] = malloc((B + 1) * 8);
    offs[j][0] = 0;
    for (int64_t b = 0; b < B; b++) {
      int64_t len = b == 0 ? 0 : b == 1 ? 1 : (int64_t)(uniform() * (ir->jagged[j].max_len + 1));
      offs[j][b + 1] = offs[j][b] + len;
    }
    totals[j] = offs[j][B];
    CHECK(cu->cuMemAlloc(&offsets_dev[j], (B + 1) * 8));
    CHECK(cu->cuMemcpyHtoD(offsets_dev[j], offs[j], (B + 1) * 8));
  }
  buffers = calloc(p.nbuffers, sizeof *buffers);
  for (int i = 0; i < p.nbuffers; i++) {
    int64_t bytes = symsize_eval(p.buffers[i].bytes, B, totals);
    CHECK(cu->cuMemAlloc(&buffers[i], bytes > 0 ? (size_t)bytes : 16));
  }
  // ids of the tags bag and the ad (the tagt table has the pooled lookup only)
  int tags = tensor("tags"), jag = ir->tensors[tags].jag;
  int64_t ntags = totals[jag];
  int64_t *ids = malloc((ntags + 1) * 8);
  int64_t trows = ir->tensors[tensor("tagt")].fixed[0];
  for (int64_t i = 0; i < ntags; i++) ids[i] = (int64_t)(uniform() * 12) % trows;  // duplicates on purpose
  upload(tags, ids, ntags * 8);

  check_add_rmsnorm();
  check_embed_pool(offs[jag], ids);
  check_table_grad(ids, ntags);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
