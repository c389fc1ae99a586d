// gemm_bench.c: cuBLASLt against the generated bf16 GEMM, shape by shape (gemm_bench.h). Every
// kernel is compiled first (so --compile-only checks them without a GPU); then per shape: fresh
// random operands, cuBLASLt and each generated tile shape (128x128, 128x256) timed, the faster
// tile reported, and the generated output compared with cuBLASLt's as
// max |generated - cuBLASLt| / max |cuBLASLt|.
#include "gemm_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cublaslt.h"
#include "cuda_driver.h"
#include "gdpa_gpu.h"     // defines: gdpa_gpu_compile (NVRTC with the cubin cache)
#include "gemm_kernel.h"

enum { NUM_TILES = 2, TARGET_SAMPLE_MS = 1, MAX_INNER = 1000, FILL_BLOCKS = 4096 };
static const int tile_shapes[NUM_TILES][2] = {{128, 128}, {128, 256}};
static const double H200_PEAK_BF16_TFLOPS = 989.4;  // codegen/plan/target.c, dense
static const double AGREEMENT = 2e-2;               // beyond this the row is marked bad

// Random operands on the device: hashed uniform values in [-1, 1].
static const char *const fill_kernels =
    "\nextern \"C\" __global__ void gemm_bench_fill_bf16(bf16_t *p, i64 n, unsigned seed) {\n"
    "  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
    "       i += (i64)gridDim.x * blockDim.x) {\n"
    "    unsigned x = (unsigned)i * 2654435761u ^ (unsigned)(i >> 32) * 40503u ^ seed;\n"
    "    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;\n"
    "    float u = (float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;\n"
    "    gemm_store1(p + i, u);\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void gemm_bench_fill_f32(float *p, i64 n, unsigned seed) {\n"
    "  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
    "       i += (i64)gridDim.x * blockDim.x) {\n"
    "    unsigned x = (unsigned)i * 2654435761u ^ seed;\n"
    "    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;\n"
    "    p[i] = (float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;\n"
    "  }\n"
    "}\n";

// --- shapes from a plan ---------------------------------------------------------------------

static bool same_shape(const GemmBenchShape *a, const GemmBenchShape *b) {
  return strcmp(a->source, b->source) == 0 && a->m == b->m && a->n == b->n && a->k == b->k &&
         a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->has_bias == b->has_bias &&
         a->act == b->act && a->out == b->out;
}

// The dtype a GEMM writes: its C is the output tensor or an fp32 scratch (lower_gemm.c).
static DType output_dtype(const Plan *p, const LaunchArg *c) {
  if (c->kind == ARG_TENSOR && c->tensor >= 0) return p->ir->tensors[c->tensor].dtype;
  return DT_F32;
}

int gemm_bench_shapes_from_plan(const Plan *p, const char *source, int64_t B,
                                const int64_t *totals, GemmBenchShape *shapes, int *n, int cap) {
  int skipped = 0;
  for (int i = 0; i < p->nlaunches; i++) {
    const Launch *l = &p->launches[i];
    if (l->kind != LAUNCH_GEMM) continue;
    if (l->gemm_dtype != DT_BF16) {
      skipped++;
      continue;
    }
    GemmBenchShape s;
    memset(&s, 0, sizeof s);
    snprintf(s.source, sizeof s.source, "%s", source);
    s.m = symsize_eval(l->gemm_m, B, totals);
    s.n = l->gemm_n;
    s.k = symsize_eval(l->gemm_k, B, totals);
    s.trans_a = l->gemm_trans_a;
    s.trans_b = l->gemm_trans_b;
    s.has_bias = l->gemm_has_bias;
    s.act = l->gemm_act;
    s.out = output_dtype(p, &l->gemm_c);
    s.count = 1;
    int j = 0;
    while (j < *n && !same_shape(&shapes[j], &s)) j++;
    if (j < *n) {
      shapes[j].count++;
    } else if (*n < cap) {
      shapes[(*n)++] = s;
    } else {
      skipped++;
    }
  }
  return skipped;
}

// --- the device -------------------------------------------------------------------------------

typedef struct Bench {
  CudaContext ctx;
  const CudaDriver *cu;
  Gemm *lt;
  CUmodule module;
  CUfunction fill_bf16, fill_f32;
  CUstream stream;  // a capturable (non-default) stream for both sides
  char *err;
  size_t err_size;
} Bench;

static bool fail_cuda(Bench *b, const char *what) {
  snprintf(b->err, b->err_size, "%s: %s", what, cuda_last_error());
  return false;
}

static bool dev_alloc(Bench *b, CUdeviceptr *p, size_t bytes) {
  *p = 0;
  if (!CU_CHECK(b->cu->cuMemAlloc(p, bytes ? bytes : 16))) return fail_cuda(b, "cuMemAlloc");
  return true;
}
static void dev_free(Bench *b, CUdeviceptr p) {
  if (p) b->cu->cuMemFree(p);
}

static bool fill(Bench *b, CUfunction fn, CUdeviceptr p, long long n, unsigned seed) {
  void *args[] = {&p, &n, &seed};
  if (!CU_CHECK(b->cu->cuLaunchKernel(fn, FILL_BLOCKS, 1, 1, 256, 1, 1, 0, NULL, args, NULL)))
    return fail_cuda(b, "filling an operand");
  return true;
}

// --- timing -------------------------------------------------------------------------------------

typedef bool (*BenchBody)(void *ctx);

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// Captures `inner` calls of body(ctx) on `stream` into a graph. False (capture ended, nothing
// leaked) when the capture failed.
static bool capture(Bench *b, BenchBody body, void *ctx, int inner, CUstream stream,
                    CUgraphExec *exec) {
  const CudaDriver *cu = b->cu;
  CUgraph graph = NULL;
  bool ok = CU_CHECK(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  bool capturing = ok;
  for (int i = 0; ok && i < inner; i++) ok = body(ctx);
  if (capturing) ok = CU_CHECK(cu->cuStreamEndCapture(stream, &graph)) && ok;
  ok = ok && CU_CHECK(cu->cuGraphInstantiateWithFlags(exec, graph, 0));
  if (graph) cu->cuGraphDestroy(graph);
  return ok;
}

// Median milliseconds of one body(ctx) over `reps` samples. A sample is one CUDA graph of
// `inner` back-to-back calls (as the runtime replays a training step), so the host's launch
// overhead is not timed; inner makes a sample last about TARGET_SAMPLE_MS (a first, warm-up
// call sets it). Where a graph cannot be captured the calls are timed directly (noted once).
// Negative when a call failed (err is set).
static double time_median_ms(Bench *b, BenchBody body, void *ctx, int reps, CUstream stream) {
  const CudaDriver *cu = b->cu;
  CUevent start, stop;
  if (!CU_CHECK(cu->cuEventCreate(&start, 0)) || !CU_CHECK(cu->cuEventCreate(&stop, 0))) {
    fail_cuda(b, "cuEventCreate");
    return -1;
  }
  double result = -1;
  double *samples = calloc((size_t)reps, sizeof *samples);
  float ms = 0;
  bool ok = body(ctx) && CU_CHECK(cu->cuStreamSynchronize(stream)) &&  // warm-up
            CU_CHECK(cu->cuEventRecord(start, stream)) && body(ctx) &&
            CU_CHECK(cu->cuEventRecord(stop, stream)) && CU_CHECK(cu->cuEventSynchronize(stop)) &&
            CU_CHECK(cu->cuEventElapsedTime(&ms, start, stop));
  int inner = ms > 0 ? (int)ceil(TARGET_SAMPLE_MS / ms) : MAX_INNER;
  if (inner < 1) inner = 1;
  if (inner > MAX_INNER) inner = MAX_INNER;
  CUgraphExec exec = NULL;
  static bool warned;
  if (ok && !capture(b, body, ctx, inner, stream, &exec)) {
    exec = NULL;
    b->err[0] = '\0';
    if (!warned) fprintf(stderr, "gemc: warning: bench gemm: no CUDA graph (%s); timing launches "
                                 "directly\n", cuda_last_error());
    warned = true;
  }
  for (int r = 0; ok && r < reps; r++) {
    ok = CU_CHECK(cu->cuEventRecord(start, stream));
    if (exec) ok = ok && CU_CHECK(cu->cuGraphLaunch(exec, stream));
    for (int i = 0; !exec && ok && i < inner; i++) ok = body(ctx);
    ok = ok && CU_CHECK(cu->cuEventRecord(stop, stream)) && CU_CHECK(cu->cuEventSynchronize(stop)) &&
         CU_CHECK(cu->cuEventElapsedTime(&ms, start, stop));
    samples[r] = (double)ms / inner;
  }
  if (ok) {
    qsort(samples, (size_t)reps, sizeof *samples, compare_doubles);
    result = reps % 2 ? samples[reps / 2] : 0.5 * (samples[reps / 2 - 1] + samples[reps / 2]);
  } else if (b->err[0] == '\0') {
    fail_cuda(b, "timing");
  }
  if (exec) cu->cuGraphExecDestroy(exec);
  free(samples);
  cu->cuEventDestroy(start);
  cu->cuEventDestroy(stop);
  return result;
}

// --- one shape ----------------------------------------------------------------------------------

typedef struct Operands {
  Bench *b;
  const GemmBenchShape *s;
  CUdeviceptr a, bm, bias, c_lt, c_gen, workspace;
  CUstream stream;
  // the generated side
  CUfunction fn, reduce;
  GemmGeometry geo;
} Operands;

static bool run_cublaslt(void *ctx) {
  Operands *o = ctx;
  const GemmBenchShape *s = o->s;
  GemmShape shape = {.m = s->m, .n = s->n, .k = s->k, .trans_a = s->trans_a,
                     .trans_b = s->trans_b, .dtype = DT_BF16, .c_dtype = s->out, .alpha = 1.0f,
                     .beta = 0.0f, .has_bias = s->has_bias, .bias_dtype = DT_F32, .act = s->act};
  return gemm_run(o->b->lt, &shape, o->a, o->bm, o->c_lt, s->has_bias ? o->bias : 0, o->stream,
                  o->b->err, o->b->err_size);
}

static bool run_generated(void *ctx) {
  Operands *o = ctx;
  const GemmBenchShape *s = o->s;
  return gemm_kernel_launch(o->fn, o->reduce, &o->geo, o->c_gen, o->workspace, o->a, o->bm,
                            s->has_bias ? o->bias : 0, s->m, s->n, s->k, o->stream, o->b->err,
                            o->b->err_size);
}

static GemmKernelConfig shape_config(const GemmBenchShape *s, int tile) {
  GemmKernelConfig c = {.tile_m = tile_shapes[tile][0], .tile_n = tile_shapes[tile][1],
                        .trans_a = s->trans_a, .trans_b = s->trans_b,
                        .aligned = gemm_kernel_aligned(s->m, s->n, s->k, s->trans_a, s->trans_b),
                        .act = s->act, .out = s->out};
  return c;
}

static float element(const void *p, DType t, size_t i) {
  if (t == DT_F32) return ((const float *)p)[i];
  uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// max |gen - lt| / max |lt| over the whole output; NaN when either holds NaN/inf.
static double compare_outputs(Bench *b, const Operands *o, bool *ok) {
  size_t count = (size_t)o->s->m * (size_t)o->s->n, bytes = count * (o->s->out == DT_F32 ? 4 : 2);
  void *lt = malloc(bytes ? bytes : 1), *gen = malloc(bytes ? bytes : 1);
  double diff = 0, scale = 0;
  *ok = lt && gen && CU_CHECK(b->cu->cuMemcpyDtoH(lt, o->c_lt, bytes)) &&
        CU_CHECK(b->cu->cuMemcpyDtoH(gen, o->c_gen, bytes));
  if (!*ok) fail_cuda(b, "reading the outputs back");
  for (size_t i = 0; *ok && i < count; i++) {
    double x = element(lt, o->s->out, i), y = element(gen, o->s->out, i);
    if (!isfinite(x) || !isfinite(y)) {
      diff = NAN;
      break;
    }
    if (fabs(x - y) > diff) diff = fabs(x - y);
    if (fabs(x) > scale) scale = fabs(x);
  }
  free(lt);
  free(gen);
  if (isnan(diff)) return diff;
  return scale > 0 ? diff / scale : diff;
}

typedef struct Row {
  double lt_ms, gen_ms;
  int tile;
  double rel_diff;
} Row;

static bool measure_shape(Bench *b, const GemmBenchShape *s, CUfunction fns[NUM_TILES][2],
                          int reps, int seed, Row *row) {
  Operands o = {.b = b, .s = s, .stream = b->stream};
  size_t a_elems = (size_t)s->m * (size_t)s->k, b_elems = (size_t)s->k * (size_t)s->n;
  size_t c_bytes = (size_t)s->m * (size_t)s->n * (s->out == DT_F32 ? 4 : 2);
  GemmGeometry geo[NUM_TILES];
  size_t workspace = 0;
  for (int t = 0; t < NUM_TILES; t++) {
    GemmKernelConfig c = shape_config(s, t);
    if (!gemm_kernel_geometry(&c, s->m, s->n, s->k, b->ctx.sm_count, 0, &geo[t], b->err,
                              b->err_size))
      return false;
    if (geo[t].workspace_bytes > workspace) workspace = geo[t].workspace_bytes;
  }
  bool ok = dev_alloc(b, &o.a, a_elems * 2) && dev_alloc(b, &o.bm, b_elems * 2) &&
            dev_alloc(b, &o.bias, (size_t)s->n * 4) && dev_alloc(b, &o.c_lt, c_bytes) &&
            dev_alloc(b, &o.c_gen, c_bytes) && dev_alloc(b, &o.workspace, workspace) &&
            fill(b, b->fill_bf16, o.a, (long long)a_elems, 1234u + 977u * (unsigned)seed) &&
            fill(b, b->fill_bf16, o.bm, (long long)b_elems, 4321u + 131u * (unsigned)seed) &&
            fill(b, b->fill_f32, o.bias, (long long)s->n, 99u + (unsigned)seed);
  ok = ok && CU_CHECK(b->cu->cuCtxSynchronize());  // the fills, on the default stream
  row->lt_ms = ok ? time_median_ms(b, run_cublaslt, &o, reps, o.stream) : -1;
  ok = ok && row->lt_ms >= 0;
  row->gen_ms = -1;
  row->tile = 0;
  for (int t = 0; ok && t < NUM_TILES; t++) {
    o.fn = fns[t][0], o.reduce = fns[t][1], o.geo = geo[t];
    double ms = time_median_ms(b, run_generated, &o, reps, o.stream);
    ok = ms >= 0;
    if (ok && (row->gen_ms < 0 || ms < row->gen_ms)) row->gen_ms = ms, row->tile = t;
  }
  // The outputs of the same inputs: cuBLASLt's last run, and the faster tile's run again.
  if (ok) {
    o.fn = fns[row->tile][0], o.reduce = fns[row->tile][1], o.geo = geo[row->tile];
    ok = run_generated(&o) && CU_CHECK(b->cu->cuStreamSynchronize(o.stream));
    if (!ok && b->err[0] == '\0') fail_cuda(b, "the generated GEMM");
  }
  if (ok) row->rel_diff = compare_outputs(b, &o, &ok);
  dev_free(b, o.a), dev_free(b, o.bm), dev_free(b, o.bias);
  dev_free(b, o.c_lt), dev_free(b, o.c_gen), dev_free(b, o.workspace);
  return ok;
}

// --- compiling and the table --------------------------------------------------------------------

static const char *op_text(const GemmBenchShape *s) {
  static const char *const ops[2][2] = {{"NN x.w", "NT dz.w^T"}, {"TN x^T.dz", "TT"}};
  return ops[s->trans_a][s->trans_b];
}

static void epilogue_text(const GemmBenchShape *s, char *out, size_t size) {
  snprintf(out, size, "%s%s%s->%s", s->has_bias ? "bias" : "",
           s->has_bias && s->act != ACT_NONE ? "+" : "", s->act != ACT_NONE ? act_name(s->act) : "",
           s->out == DT_F32 ? "fp32" : "bf16");
}

static double tflops(const GemmBenchShape *s, double ms) {
  return ms > 0 ? 2.0 * (double)s->m * (double)s->n * (double)s->k / (ms * 1e-3) / 1e12 : 0;
}

// The source of every instantiation the shapes need, and the fill kernels.
static char *bench_source(const GemmBenchOptions *o) {
  int n = o->nshapes * NUM_TILES;
  GemmKernelConfig *configs = calloc((size_t)(n > 0 ? n : 1), sizeof *configs);
  for (int i = 0; i < o->nshapes; i++)
    for (int t = 0; t < NUM_TILES; t++) configs[i * NUM_TILES + t] = shape_config(&o->shapes[i], t);
  StrBuf src = {0};
  gemm_kernel_source(configs, n, &src);
  sb_puts(&src, fill_kernels);
  free(configs);
  return sb_take(&src);
}

static bool shapes_valid(const GemmBenchOptions *o, char *err, size_t err_size) {
  for (int i = 0; i < o->nshapes; i++)
    for (int t = 0; t < NUM_TILES; t++) {
      GemmKernelConfig c = shape_config(&o->shapes[i], t);
      if (!gemm_kernel_valid(&c, err, err_size)) return false;
    }
  return true;
}

static void print_row(FILE *out, const GemmBenchShape *s, const Row *r) {
  char epi[48], tile[16];
  epilogue_text(s, epi, sizeof epi);
  GemmKernelConfig c = shape_config(s, r->tile);
  gemm_kernel_tile_text(&c, tile, sizeof tile);
  fprintf(out, "| %s | %lld | %lld | %lld | %s | %s | %d | %.4f | %.0f | %.4f | %.0f | %s%s | %.2f | %.1e%s |\n",
          s->source, (long long)s->m, (long long)s->n, (long long)s->k, op_text(s), epi, s->count,
          r->lt_ms, tflops(s, r->lt_ms), r->gen_ms, tflops(s, r->gen_ms), tile,
          c.aligned ? "" : " (elementwise)", r->gen_ms > 0 ? r->lt_ms / r->gen_ms : 0.0,
          r->rel_diff, r->rel_diff <= AGREEMENT ? "" : " BAD");
  fflush(out);
}

// Per source: the sum over its shapes of count x time, both sides.
static void print_totals(FILE *out, const GemmBenchOptions *o, const Row *rows) {
  fprintf(out, "\nPer source, every GEMM launch once (sum of count x median):\n");
  for (int i = 0; i < o->nshapes; i++) {
    bool first = true;
    for (int j = 0; j < i && first; j++) first = strcmp(o->shapes[j].source, o->shapes[i].source) != 0;
    if (!first) continue;
    double lt = 0, gen = 0, best = 0;
    int launches = 0;
    for (int j = i; j < o->nshapes; j++) {
      if (strcmp(o->shapes[j].source, o->shapes[i].source) != 0) continue;
      lt += o->shapes[j].count * rows[j].lt_ms;
      gen += o->shapes[j].count * rows[j].gen_ms;
      best += o->shapes[j].count * (rows[j].gen_ms < rows[j].lt_ms ? rows[j].gen_ms : rows[j].lt_ms);
      launches += o->shapes[j].count;
    }
    fprintf(out, "  %-10s %3d launches: cuBLASLt %.3f ms, generated %.3f ms, faster of the two "
                 "per shape %.3f ms\n", o->shapes[i].source, launches, lt, gen, best);
  }
}

GemmBenchStatus gemm_bench_run(const GemmBenchOptions *o, FILE *out, char *err, size_t err_size) {
  err[0] = '\0';
  if (!shapes_valid(o, err, err_size)) return GEMM_BENCH_COMPILE_FAILED;
  static Bench b;  // holds the context; one run per process
  memset(&b, 0, sizeof b);
  b.err = err;
  b.err_size = err_size;
  if (!o->compile_only && !cuda_context_open(&b.ctx, -1, err, err_size)) return GEMM_BENCH_NO_GPU;
  const char *arch = o->compile_only ? o->compile_only : b.ctx.arch;
  char *src = bench_source(o);
  size_t size = 0;
  char reason[1024];
  void *cubin = gdpa_gpu_compile(src, arch, o->cache_dir, &size, reason, sizeof reason);
  free(src);
  if (!cubin) {
    snprintf(err, err_size, "compiling the GEMM kernels for %s failed: %s", arch, reason);
    return GEMM_BENCH_COMPILE_FAILED;
  }
  if (o->compile_only) {
    fprintf(out, "compiled %d GEMM shapes x %d tiles for %s (%zu bytes of cubin):\n", o->nshapes,
            NUM_TILES, arch, size);
    for (int i = 0; i < o->nshapes; i++) {
      const GemmBenchShape *s = &o->shapes[i];
      char epi[48], name[96];
      epilogue_text(s, epi, sizeof epi);
      GemmKernelConfig c = shape_config(s, 1);
      gemm_kernel_name(&c, name, sizeof name);
      fprintf(out, "  %-10s m=%-7lld n=%-5lld k=%-7lld %-9s %-14s x%-3d %s\n", s->source,
              (long long)s->m, (long long)s->n, (long long)s->k, op_text(s), epi, s->count, name);
    }
    free(cubin);
    return GEMM_BENCH_OK;
  }
  b.cu = cuda_driver();
  bool loaded = CU_CHECK(b.cu->cuModuleLoadData(&b.module, cubin)) &&
                CU_CHECK(b.cu->cuModuleGetFunction(&b.fill_bf16, b.module, "gemm_bench_fill_bf16")) &&
                CU_CHECK(b.cu->cuModuleGetFunction(&b.fill_f32, b.module, "gemm_bench_fill_f32"));
  free(cubin);
  if (!loaded) {
    fail_cuda(&b, "loading the GEMM kernels");
    return GEMM_BENCH_COMPILE_FAILED;
  }
  b.lt = gemm_open(err, err_size);
  if (!b.lt) return GEMM_BENCH_NO_GPU;
  if (!CU_CHECK(b.cu->cuStreamCreate(&b.stream, CU_STREAM_NON_BLOCKING))) {
    fail_cuda(&b, "cuStreamCreate");
    gemm_close(b.lt);
    return GEMM_BENCH_CUDA_FAILED;
  }

  fprintf(out, "Dense GEMMs on %s (%s, %d SMs), cuBLASLt %zu: bf16 operands, fp32 accumulation; "
               "median of %d samples; bf16 dense peak %.0f TFLOP/s\n",
          b.ctx.name, b.ctx.arch, b.ctx.sm_count, gemm_library_version(b.lt), o->reps,
          H200_PEAK_BF16_TFLOPS);
  fprintf(out, "| source | m | n | k | op | epilogue | count | cuBLASLt ms | TFLOP/s | generated ms "
               "| TFLOP/s | tile | cuBLASLt/generated | max rel diff |\n");
  fprintf(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  Row *rows = calloc((size_t)(o->nshapes > 0 ? o->nshapes : 1), sizeof *rows);
  GemmBenchStatus status = GEMM_BENCH_OK;
  bool disagree = false;
  for (int i = 0; i < o->nshapes && status == GEMM_BENCH_OK; i++) {
    const GemmBenchShape *s = &o->shapes[i];
    CUfunction fns[NUM_TILES][2];
    for (int t = 0; t < NUM_TILES; t++) {
      GemmKernelConfig c = shape_config(s, t);
      char name[96], reduce[112];
      gemm_kernel_name(&c, name, sizeof name);
      snprintf(reduce, sizeof reduce, "%s_reduce", name);
      if (!CU_CHECK(b.cu->cuModuleGetFunction(&fns[t][0], b.module, name)) ||
          !CU_CHECK(b.cu->cuModuleGetFunction(&fns[t][1], b.module, reduce))) {
        fail_cuda(&b, name);
        status = GEMM_BENCH_COMPILE_FAILED;
      }
    }
    if (status != GEMM_BENCH_OK) break;
    if (!measure_shape(&b, s, fns, o->reps, i, &rows[i])) {
      status = GEMM_BENCH_CUDA_FAILED;  // err says which call
      break;
    }
    print_row(out, s, &rows[i]);
    if (!(rows[i].rel_diff <= AGREEMENT) && !disagree) {
      disagree = true;
      snprintf(err, err_size, "m=%lld n=%lld k=%lld: the generated output differs from "
               "cuBLASLt's by %.2e (relative to max |C|)", (long long)s->m, (long long)s->n,
               (long long)s->k, rows[i].rel_diff);
    }
  }
  if (status == GEMM_BENCH_OK) print_totals(out, o, rows);
  if (status == GEMM_BENCH_OK && disagree) status = GEMM_BENCH_BAD_OUTPUT;
  free(rows);
  gemm_close(b.lt);
  b.cu->cuStreamDestroy(b.stream);
  b.cu->cuModuleUnload(b.module);
  return status;
}
