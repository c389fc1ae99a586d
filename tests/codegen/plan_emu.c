// plan_emu.c: one whole training step of a model's plan, run on the CPU: every generated kernel
// through cuda_on_cpu.h (plan_emu_kernels.cpp), the LAUNCH_GEMMs by a plain loop, LAUNCH_ZERO
// by memset, in the plan's order, over the memory plan's own buffers (poisoned with NaN bytes
// at the start, so a kernel that reads what nothing wrote shows up). The loss, every gradient
// and every updated parameter and table row are compared with the CPU executor on the same
// synthetic batch and initial parameters. Attention runs too, every kernel of it (the
// emulator's ldmatrix, mma, mbarrier, TMA and wgmma), with the tile lists the runtime would
// build (runtime/gpu/gpu_tiles.c; persistent ones dealt for EMU_SMS CTAs) and the emulator's
// tensor maps.
// GEMC_TEST_DEFER_TABLES=1 (load_model.c; gemc emit too) builds the plan of a GPU rank of several (ir->defer_table_updates): the
// optimizer launches run after every other one, and before them the tables' rows are
// rewritten compact, as the runtime does after merging them across ranks (a world of one here).
//   plan_emu MODEL.gem [TOLERANCE [ARCH]]   exit 0 when every relative error is within TOLERANCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "cpu_exec.h"
#include "gpu_tiles.h"
#include "load_model.h"
#include "memplan.h"
#include "numerics.h"
#include "optim.h"
#include "lower.h"
#include "plan.h"
#include "synth.h"

void *emu_find(const char *name);
void emu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem, const uint64_t *args);
int emu_max_args(void);  // how many arguments emu_launch passes

// The SMs a persistent launch is dealt for: few, so that every CTA walks several work items.
enum { EMU_SMS = 3 };

static const Plan *plan;
static const Ir *ir;
static char **base;
static const Batch *batch;
static int failures;
static double tolerance = 3e-2;
static double node_tolerance;  // PLAN_EMU_NODE_TOL: forward nodes checked one by one when > 0
static bool isolate;           // PLAN_EMU_ISOLATE: every node on the executor's inputs
static bool quiet;  // PLAN_EMU_QUIET=1: print failures and the summary only

static int64_t eval(SymSize s) { return symsize_eval(s, batch->B, batch->total); }

static char *tensor_ptr(int t) {
  int b = plan->tensor_buffer[t];
  if (b < 0) {
    fprintf(stderr, "plan_emu: tensor %s has no buffer\n", ir->tensors[t].name);
    exit(2);
  }
  return base[b] + eval(plan->tensor_offset[t]);
}

static char *arg_ptr(const LaunchArg *a) {
  switch (a->kind) {
    case ARG_TENSOR: return tensor_ptr(a->tensor);
    case ARG_SCRATCH: return base[plan->scratch[a->slot].buffer] + eval(plan->scratch[a->slot].offset);
    case ARG_GRAD: return tensor_ptr(ir_grad_of(ir, a->tensor));
    case ARG_OPTSTATE: return base[plan->optstate_buffer[2 * a->tensor + a->slot]];
    case ARG_OFFSETS: return (char *)batch->offsets[a->jag];
    default: break;
  }
  fprintf(stderr, "plan_emu: argument kind %d is not a pointer\n", a->kind);
  exit(2);
}

static DType storage(DType t) { return t == DT_FP8 || t == DT_MXFP8 ? DT_BF16 : t; }

static float load(const char *p, DType t, int64_t i) {
  switch (storage(t)) {
    case DT_BF16: return bf16_decode(((const uint16_t *)p)[i]);
    case DT_FP16: return fp16_decode(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
  }
}

static void store(char *p, DType t, int64_t i, float v) {
  switch (storage(t)) {
    case DT_BF16: ((uint16_t *)p)[i] = bf16_encode(v); break;
    case DT_FP16: ((uint16_t *)p)[i] = fp16_encode(v); break;
    default: ((float *)p)[i] = v; break;
  }
}

static DType arg_dtype(const LaunchArg *a, DType scratch_type) {
  return a->kind == ARG_TENSOR ? ir->tensors[a->tensor].dtype : scratch_type;
}

// An fp8 GEMM over E4M3 codes (lower_gemm.c): both K-major, k zero-padded, C = sa · sb · Σ a·b.
static void run_gemm_fp8(const Launch *l) {
  int64_t m = eval(l->gemm_m), n = l->gemm_n, k = eval(l->gemm_k);
  if (l->gemm_k_align > 1) k = (k + l->gemm_k_align - 1) / l->gemm_k_align * l->gemm_k_align;
  const uint8_t *A = (const uint8_t *)arg_ptr(&l->gemm_a), *Bm = (const uint8_t *)arg_ptr(&l->gemm_b);
  float sa = *(const float *)arg_ptr(&l->gemm_scale_a), sb = *(const float *)arg_ptr(&l->gemm_scale_b);
  float *C = (float *)arg_ptr(&l->gemm_c);
  if (l->gemm_trans_a || !l->gemm_trans_b || l->gemm_has_bias || l->gemm_beta != 0 ||
      arg_dtype(&l->gemm_c, DT_F32) != DT_F32) {
    fprintf(stderr, "plan_emu: an fp8 GEMM of a layout cuBLASLt's FP8 kernels refuse\n");
    exit(2);
  }
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0;
      for (int64_t p = 0; p < k; p++) acc += (double)e4m3_decode(A[i * k + p]) * e4m3_decode(Bm[j * k + p]);
      C[i * n + j] = (float)(acc * sa * sb);
    }
}

static void run_gemm(const Launch *l) {
  if (l->gemm_dtype == DT_FP8) {
    run_gemm_fp8(l);
    return;
  }
  int64_t m = eval(l->gemm_m), n = l->gemm_n, k = eval(l->gemm_k);
  const char *A = arg_ptr(&l->gemm_a), *Bm = arg_ptr(&l->gemm_b);
  char *C = arg_ptr(&l->gemm_c);
  DType ta = arg_dtype(&l->gemm_a, l->gemm_dtype), tb = arg_dtype(&l->gemm_b, l->gemm_dtype);
  DType tc = arg_dtype(&l->gemm_c, DT_F32);
  const char *bias = l->gemm_has_bias ? arg_ptr(&l->gemm_bias) : NULL;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0;
      for (int64_t p = 0; p < k; p++)
        acc += (double)load(A, ta, l->gemm_trans_a ? p * m + i : i * k + p) *
               load(Bm, tb, l->gemm_trans_b ? j * k + p : p * n + j);
      float v = (float)acc;
      if (bias) v += load(bias, ir->tensors[l->gemm_bias.tensor].dtype, j);
      if (l->gemm_act == ACT_RELU && !(v > 0)) v = 0;
      store(C, tc, i * n + j, v);
    }
}

static void run_launch(const Launch *l) {
  if (l->kind == LAUNCH_ZERO) {
    memset(arg_ptr(&l->zero_arg), 0, (size_t)eval(l->zero_bytes));
    return;
  }
  if (l->kind == LAUNCH_GEMM) {
    run_gemm(l);
    return;
  }
  void *fn = emu_find(l->kernel);
  if (!fn) {
    fprintf(stderr, "plan_emu: no kernel %s\n", l->kernel);
    exit(2);
  }
  int32_t *tiles = NULL;
  int64_t ntiles = 0;
  bool persistent = l->grid == GRID_PERSISTENT;
  if (l->grid == GRID_TILES || persistent) {
    const TileList *tl = &plan->tiles[l->tiles];
    ntiles = gpu_tiles_build(tl, batch->B, tl->q_jag >= 0 ? batch->offsets[tl->q_jag] : NULL,
                             tl->kv_jag >= 0 ? batch->offsets[tl->kv_jag] : NULL,
                             persistent ? EMU_SMS : 0, &tiles);
    if (ntiles < 0) exit(2);
  }
  uint64_t maps[PLAN_MAX_ARGS][16];  // the emulator's tensor maps (cuda_on_cpu.h, EmuTmaMap)
  if (l->nargs > emu_max_args()) {
    fprintf(stderr, "plan_emu: kernel %s has %d arguments; the emulator passes %d\n", l->kernel,
            l->nargs, emu_max_args());
    exit(2);
  }
  uint64_t args[PLAN_MAX_ARGS] = {0};
  for (int a = 0; a < l->nargs; a++) {
    const LaunchArg *x = &l->args[a];
    switch (x->kind) {
      case ARG_SIZE: args[a] = (uint64_t)eval(x->size); break;
      case ARG_INT: args[a] = (uint64_t)x->i; break;
      case ARG_STEP: args[a] = 1; break;
      case ARG_TILES: args[a] = (uint64_t)(uintptr_t)tiles; break;
      case ARG_TILE_COUNT: args[a] = (uint64_t)ntiles; break;
      case ARG_TENSOR_MAP: {  // magic, base, width, rows, stride, box cols, box rows, swizzle
        const Tensor *t = &ir->tensors[x->tensor];
        memset(maps[a], 0, sizeof maps[a]);
        maps[a][0] = 0x656d75746d61ull;
        maps[a][1] = (uint64_t)(uintptr_t)tensor_ptr(x->tensor);
        maps[a][2] = (uint64_t)t->width;
        maps[a][3] = (uint64_t)eval(x->size);
        maps[a][4] = (uint64_t)t->width * 2;
        maps[a][5] = 64;
        maps[a][6] = (uint64_t)x->i;
        maps[a][7] = 128;
        args[a] = (uint64_t)(uintptr_t)maps[a];
        break;
      }
      default: args[a] = (uint64_t)(uintptr_t)arg_ptr(x); break;
    }
  }
  int64_t size = eval(l->size);
  unsigned grid = l->grid == GRID_TILES ? (unsigned)ntiles
                 : persistent ? (unsigned)(ntiles < EMU_SMS ? ntiles : EMU_SMS)
                              : (unsigned)((size + l->per_block - 1) / l->per_block);
  if (grid > 0) emu_launch(fn, grid, (unsigned)l->threads, (unsigned)l->smem, args);
  free(tiles);
}

static void compare(const char *what, const float *want, const char *got, DType t, int64_t n) {
  double err = 0, norm = 0;
  int nan = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = load(got, t, i), w = want[i];
    if (isnan(g)) nan++;
    err += (g - w) * (g - w);
    norm += w * w;
  }
  double rel = norm > 0 ? sqrt(err / norm) : sqrt(err);
  bool ok = nan == 0 && rel <= tolerance;
  if (!ok || !quiet)
    printf("%s %-40s relative error %.2e (%lld values)%s\n", ok ? "PASS" : "FAIL", what, rel, (long long)n,
         nan ? " with NaN" : "");
  if (!ok) failures++;
}

// The outputs that node launches[last].node's launches wrote for nodes with no launch of their
// own (an attention's dK and dV, written by its dQ node's kernels), checked as their own.
static void print_node(CpuExec *x, int node);
static void print_siblings(CpuExec *x, int last) {
  int node = plan->launches[last].node;
  for (int m = 0; m < ir->nnodes; m++) {
    if (m == node) continue;
    bool own = false, written = false;
    for (int j = 0; j < plan->nlaunches && !own; j++) own = plan->launches[j].node == m;
    for (int i = last; !own && !written && i >= 0 && plan->launches[i].node == node; i--)
      for (int a = 0; a < plan->launches[i].nargs && !written; a++)
        written = plan->launches[i].args[a].kind == ARG_TENSOR &&
                  plan->launches[i].args[a].tensor == ir->nodes[m].out;
    if (written) print_node(x, m);
  }
}

// Whether PLAN_EMU_NODE_SKIP (names separated by commas) lists tensor `name`: nodes whose
// known inexactness the model's comment explains, printed but not checked.
static bool skipped(const char *name) {
  const char *list = getenv("PLAN_EMU_NODE_SKIP");
  size_t len = strlen(name);
  for (const char *at = list; at && *at;) {
    const char *end = strchr(at, ',');
    size_t n = end ? (size_t)(end - at) : strlen(at);
    if (n == len && strncmp(at, name, len) == 0) return true;
    at = end ? end + 1 : NULL;
  }
  return false;
}

// The executor's values of node's inputs, into the plan's buffers (PLAN_EMU_ISOLATE).
static void feed_inputs(CpuExec *x, int node) {
  const Node *n = &ir->nodes[node];
  for (int i = 0; i < n->nins; i++) {
    int t = n->ins[i];
    if (t < 0) continue;
    const Tensor *tt = &ir->tensors[t];
    if (tt->layout == LAYOUT_ROWS || plan->tensor_buffer[t] < 0) continue;
    const void *v = cpu_exec_data(x, t);
    int64_t count = cpu_exec_numel(x, t);
    if (!v || count <= 0) continue;
    if (tt->dtype == DT_I64) memcpy(tensor_ptr(t), v, (size_t)count * 8);
    else for (int64_t e = 0; e < count; e++) store(tensor_ptr(t), tt->dtype, e, ((const float *)v)[e]);
  }
}

static void print_node(CpuExec *x, int node) {
  int t = ir->nodes[node].out;
  const Tensor *tt = &ir->tensors[t];
  if (t < 0 || tt->layout == LAYOUT_ROWS || tt->dtype == DT_I64 || plan->tensor_buffer[t] < 0) return;
  const float *want = cpu_exec_data(x, t);
  int64_t n = cpu_exec_numel(x, t);
  if (!want || n <= 0) return;
  const char *got = tensor_ptr(t);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = load(got, tt->dtype, i), w = want[i];
    err += (g - w) * (g - w);
    norm += w * w;
  }
  double rel = norm > 0 ? sqrt(err / norm) : sqrt(err);
  bool checked = node_tolerance > 0 && (isolate || node < ir->nforward) && !skipped(tt->name);
  bool failed = checked && !(rel <= node_tolerance);
  if (failed) failures++;
  if (failed || !quiet)
    printf("%snode %-32s %-16s relative error %.2e (%lld values)\n",
           failed ? "FAIL " : checked ? "PASS " : "", tt->name, op_name(ir->nodes[node].op), rel,
           (long long)n);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (argc > 2) tolerance = atof(argv[2]);
  quiet = getenv("PLAN_EMU_QUIET") && strcmp(getenv("PLAN_EMU_QUIET"), "1") == 0;
  LoadedModel m;
  if (!load_model(&m, argv[1], argc > 3 ? argv[3] : NULL, true, true, false)) return 2;
  ir = &m.ir;
  bool defer = m.ir.defer_table_updates;
  Diag d;
  diag_init(&d, &m.src, stderr);
  Plan p;
  if (!plan_build(ir, NULL, &m.arena, &d, &p)) return 2;
  plan = &p;

  // The oracle: initial parameters, one synthetic batch, forward and backward.
  CpuExec *x = cpu_exec_new(ir, EXEC_F32);
  cpu_exec_init_params(x, 7);
  Schema schema;
  schema_from_ir(ir, &schema);
  Batch b;
  batch_alloc(&b, &schema, ir->batch);
  SynthConfig cfg;
  synth_config_default(&cfg);
  Synth *g = synth_new(&schema, &cfg);
  synth_batch(g, 0, &b);
  batch = &b;
  char err[512];
  if (!cpu_exec_set_batch(x, &b, err, sizeof err)) {
    fprintf(stderr, "plan_emu: %s\n", err);
    return 2;
  }

  // The plan's buffers, poisoned; optimizer state zeroed; parameters and inputs copied in.
  base = calloc((size_t)p.nbuffers, sizeof *base);
  for (int i = 0; i < p.nbuffers; i++) {
    int64_t bytes = eval(p.buffers[i].bytes);
    base[i] = malloc((size_t)(bytes > 0 ? bytes : 64));
    memset(base[i], 0xff, (size_t)(bytes > 0 ? bytes : 64));
  }
  for (int t = 0; t < ir->ntensors; t++)
    for (int s = 0; s < 2; s++)
      if (p.optstate_buffer[2 * t + s] >= 0)
        memset(base[p.optstate_buffer[2 * t + s]], 0, (size_t)eval(p.buffers[p.optstate_buffer[2 * t + s]].bytes));
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *tt = &ir->tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    const float *v = cpu_exec_data(x, t);
    int64_t n = cpu_exec_numel(x, t);
    for (int64_t i = 0; i < n; i++) store(tensor_ptr(t), tt->dtype, i, v[i]);
  }
  for (int f = 0; f < schema.nfeatures; f++) {
    const Feature *ft = &schema.features[f];
    if (p.tensor_buffer[ft->tensor] < 0) continue;
    int64_t n = (ft->jag >= 0 ? b.total[ft->jag] : b.B) * ft->width;
    if (ft->kind == FEATURE_IDS) memcpy(tensor_ptr(ft->tensor), b.ids[f], (size_t)n * 8);
    else for (int64_t i = 0; i < n; i++) store(tensor_ptr(ft->tensor), ir->tensors[ft->tensor].dtype, i, b.values[f][i]);
  }

  // PLAN_EMU_NODES=1: also print each node's output against the executor's right after the
  // node's last launch (a diagnostic: errors there do not fail the run). PLAN_EMU_NODE_TOL=x:
  // every forward node's output must be within x, which catches a kernel whose output the rest
  // of the model drowns (a softmax branch beside larger pointwise ones).
  const char *node_tol_env = getenv("PLAN_EMU_NODE_TOL");
  node_tolerance = node_tol_env ? atof(node_tol_env) : 0;
  // PLAN_EMU_ISOLATE=1: before a node's first launch its inputs are overwritten with the
  // executor's values, and every node is checked (PLAN_EMU_NODE_TOL, default 1e-2): each kernel
  // on exact inputs, as test_gpu_kernels does on the GPU, so no kernel's error hides in the
  // model's own rounding noise. The step's final comparisons still run, over those mixed values.
  isolate = getenv("PLAN_EMU_ISOLATE") && strcmp(getenv("PLAN_EMU_ISOLATE"), "1") == 0;
  if (isolate && node_tolerance <= 0) node_tolerance = 1e-2;
  bool nodes = node_tolerance > 0 ||
               (getenv("PLAN_EMU_NODES") && strcmp(getenv("PLAN_EMU_NODES"), "1") == 0);
  if (nodes) cpu_exec_keep_values(x, true);
  double loss = cpu_exec_forward(x);
  cpu_exec_backward(x);
  // A table's rows gradient is dead once its optimizer has run (its buffer goes to later
  // values), so keep a copy of it right after the last launch of its table_grad node.
  char **rows_copy = calloc((size_t)ir->ntensors, sizeof *rows_copy);
  bool *fed = calloc((size_t)ir->nnodes + 1, sizeof *fed);
  for (int i = 0; i < p.nlaunches; i++) {
    if (defer && p.launches[i].optimizer) continue;
    int node = p.launches[i].node;
    // Fed at the node's first launch only (with the nodes the launch covers): an input dead
    // after a node's first launches (a table's ids, after the gather) may by then hold
    // another table's sort state, and feeding it again would corrupt that.
    if (isolate && node >= 0 && !fed[node]) {
      for (int k = node; k < node + p.launches[i].nfused && k < ir->nnodes; k++) feed_inputs(x, k);
      fed[node] = true;
    }
    run_launch(&p.launches[i]);
    if (nodes && node >= 0 && (i + 1 == p.nlaunches || p.launches[i + 1].node != node)) {
      print_node(x, node);
      print_siblings(x, i);
    }
    if (node < 0 || ir->nodes[node].op != OP_TABLE_GRAD) continue;
    if (i + 1 < p.nlaunches && p.launches[i + 1].node == node &&
        !(defer && p.launches[i + 1].optimizer))
      continue;
    // The tables whose sorts share launches are one group of launches, the first node's,
    // covering the others (Launch.nfused).
    for (int k = node; k < node + p.launches[i].nfused && k < ir->nnodes; k++) {
      if (ir->nodes[k].op != OP_TABLE_GRAD || rows_copy[ir->nodes[k].out]) continue;
      int t = ir->nodes[k].out;
      size_t bytes = (size_t)eval(plan_tensor_bytes(&p, t));
      rows_copy[t] = malloc(bytes);
      memcpy(rows_copy[t], tensor_ptr(t), bytes);
    }
  }

  if (defer) {
    // The runtime's merge of a world of one: each table's rows, [U][ids[Umax]][values], become
    // [U][ids[U]][values] (runtime/gpu/gpu_exec.h); then the optimizer launches.
    for (int gi = 0; gi < ir->ngrads; gi++) {
      int param = ir->grads[gi].param, grad = ir->grads[gi].grad;
      if (ir->tensors[param].kind != TENSOR_TABLE) continue;
      int64_t dim = ir->tensors[param].fixed[1];
      int64_t umax = (eval(plan_tensor_bytes(&p, grad)) - 8) / (8 + 4 * dim);
      int64_t *hdr = (int64_t *)(void *)tensor_ptr(grad);
      memmove(hdr + 1 + hdr[0], hdr + 1 + umax, (size_t)(hdr[0] * dim) * 4);
    }
    for (int i = 0; i < p.nlaunches; i++)
      if (p.launches[i].optimizer) run_launch(&p.launches[i]);
  }
  float want_loss = (float)loss;
  compare("loss", &want_loss, tensor_ptr(ir->loss), DT_F32, 1);
  for (int gi = 0; gi < ir->ngrads; gi++) {
    int param = ir->grads[gi].param, grad = ir->grads[gi].grad;
    const Tensor *pt = &ir->tensors[param];
    int64_t nrows = 0;
    const int64_t *ids = NULL;
    const float *cg = cpu_exec_grad(x, param, &nrows, &ids);
    char what[256];
    int64_t numel = cpu_exec_numel(x, param);
    float *w = malloc((size_t)numel * sizeof *w);
    memcpy(w, cpu_exec_data(x, param), (size_t)numel * sizeof *w);
    OptimState st;
    if (pt->kind == TENSOR_TABLE) {
      int64_t dim = pt->fixed[1];
      const int64_t *hdr = (const int64_t *)rows_copy[grad];
      int64_t umax = (eval(plan_tensor_bytes(&p, grad)) - 8) / (8 + 4 * dim);
      bool ids_ok = hdr[0] == nrows;
      for (int64_t r = 0; ids_ok && r < nrows; r++) ids_ok = hdr[1 + r] == ids[r];
      if (!ids_ok || !quiet)
        printf("%s %-40s %lld distinct ids (plan: %lld)\n", ids_ok ? "PASS" : "FAIL", pt->name, (long long)nrows,
             (long long)hdr[0]);
      if (!ids_ok)
        for (int64_t r = 0; r < nrows && r < 8; r++)
          printf("    id %lld: executor %lld, plan %lld\n", (long long)r, (long long)ids[r], (long long)hdr[1 + r]);
      if (!ids_ok) failures++;
      snprintf(what, sizeof what, "%%%s (rows)", ir->tensors[grad].name);
      compare(what, cg, (const char *)(hdr + 1 + umax), DT_F32, nrows * dim);
      optim_state_init(&st, pt->optim, pt->fixed[0], dim);
      optim_step_rows(&st, w, ids, cg, nrows, pt->dtype);
    } else {
      snprintf(what, sizeof what, "%%%s", ir->tensors[grad].name);
      compare(what, cg, tensor_ptr(grad), DT_F32, numel);
      optim_state_init(&st, ir->dense_optim, numel, 0);
      optim_step_dense(&st, w, cg, numel);
    }
    snprintf(what, sizeof what, "@%s after the step", pt->name);
    compare(what, w, tensor_ptr(param), pt->dtype, numel);
    optim_state_free(&st);
    free(w);
  }
  printf("plan_emu %s: %d launches run on the CPU, %d comparison(s) with the executor failed "
         "(tolerance %g)\n", argv[1], p.nlaunches, failures, tolerance);
  synth_free(g);
  batch_free(&b);
  cpu_exec_free(x);
  return failures ? 1 : 0;
}
