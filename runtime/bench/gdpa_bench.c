// gdpa_bench.c: GDPA forward and backward TFLOP/s on the public benchmark shapes
// (gdpa_bench.h). Every kernel is compiled first (so --compile-only checks them without a
// GPU), then each configuration gets a fresh jagged batch of random bf16 inputs, one warm-up
// run and `reps` timed runs; the outputs are checked for NaN/inf afterwards.
#include "gdpa_bench.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "checked.h"
#include "gdpa_gpu.h"

enum { BENCH_B = 1152, BENCH_H = 4, BENCH_DH = 128, BENCH_KV = 256, BENCH_NUM_N = 3 };

static const int64_t bench_ns[BENCH_NUM_N] = {512, 1024, 2048};

// Meta's Triton GDPA (GELU) on our H200 (overview.md), forward / backward, per N: self
// s=0.5, self s=1.0, cross KV=256.
static const double triton_tflops[BENCH_NUM_N][3][2] = {
    {{299, 236}, {345, 280}, {210, 247}},
    {{381, 287}, {430, 330}, {282, 272}},
    {{444, 315}, {465, 345}, {286, 277}}};

// The activations of the "other activations" section, after the main table.
static const Act other_acts[] = {ACT_GELU, ACT_GELU_TAYLOR, ACT_SILU, ACT_SOFTMAX};
enum { NUM_OTHER_ACTS = (int)(sizeof other_acts / sizeof *other_acts) };

// Forward schedule variants (tile_q, tile_m) of the "block shapes" section.
static const int block_shapes[2][2] = {{128, 16}, {64, 16}};

// Fills a bf16 tensor with hashed uniform values in [-amp, amp], on the device.
static const char *const fill_kernel =
    "\nextern \"C\" __global__ void bench_fill(bf16_t *p, i64 n, unsigned seed, float amp) {\n"
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  unsigned x = (unsigned)i * 2654435761u ^ seed;\n"
    "  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;\n"
    "  float u = (float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;\n"
    "  p[i] = (bf16_t)(attn_pack_bf16(u * amp, 0.0f) & 0xffffu);\n"
    "}\n";

static GdpaCase bench_case(AttnShape shape, Act act, int64_t n) {
  GdpaCase c = {.shape = shape, .act = act, .heads = BENCH_H, .dh = BENCH_DH,
                .kv_set = shape == ATTN_CROSS ? BENCH_KV : 0, .max_q = n,
                .max_kv = shape == ATTN_CROSS ? BENCH_KV : n, .scale = 1.0 / sqrt(BENCH_DH)};
  return c;
}

// xorshift64, so that every run measures the same lengths.
static uint64_t rng_state = 88172645463325252ull;
static int64_t uniform_int(int64_t lo, int64_t hi) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return lo + (int64_t)(rng_state % (uint64_t)(hi - lo + 1));
}

typedef struct Timed {
  GdpaBatch *bt;
  int from, to;
} Timed;

static bool run_launches(void *ctx, char *err, size_t err_size) {
  Timed *t = ctx;
  return gdpa_launch_range(t->bt, t->from, t->to, err, err_size);
}

// Whether a sample of bf16 tensor t holds no NaN/inf and is not all zero, into *good; false
// when reading it back failed.
static bool all_finite_sample(GdpaBatch *bt, int t, bool *good, char *err, size_t err_size) {
  size_t n = bt->tensor_bytes[t] / 2;
  if (n > (1u << 22)) n = 1u << 22;
  uint16_t *h = malloc(n * 2 + 2);
  if (!gdpa_gpu_download(h, bt->tensor[t], n * 2, err, err_size)) {
    free(h);
    return false;
  }
  bool ok = true, nonzero = n == 0;
  for (size_t i = 0; i < n; i++) {
    if ((h[i] & 0x7f80) == 0x7f80) ok = false;
    if (h[i] & 0x7fff) nonzero = true;
  }
  free(h);
  *good = ok && nonzero;
  return true;
}

// One case, compiled (and loaded, unless compiling only).
typedef struct Compiled {
  GdpaEmitted e;
  Arena arena;
  void *module;
} Compiled;

static bool compile_case(const GdpaCase *c, const char *arch, const char *cache, bool load,
                         Compiled *out, char *err, size_t err_size) {
  StrBuf src = {0};
  memset(out, 0, sizeof *out);
  void *cubin = NULL;
  if (!gdpa_case_emit(c, "b.", &out->arena, &src, &out->e)) {
    char name[128];
    gdpa_case_name(c, name, sizeof name);
    fail(err, err_size, "the attention emitter refused %s", name);
  } else {
    size_t size = 0;
    sb_puts(&src, fill_kernel);
    cubin = gdpa_gpu_compile(src.data, arch, cache, &size, err, err_size);
  }
  sb_free(&src);
  if (!cubin) return false;
  bool ok = !load || gdpa_gpu_load_module(cubin, &out->module, err, err_size);
  free(cubin);
  return ok;
}

// What every measurement shares: the timed repetitions, whether every output so far came out
// good, and where a failing CUDA call is reported.
typedef struct Bench {
  int reps;
  bool good;  // no output so far held NaN/inf or was all zero
  char *err;
  size_t err_size;
} Bench;

// Forward and backward TFLOP/s of one configuration (m->good turns false when an output came
// out bad); false when a CUDA call failed, with m->err saying which.
static bool measure(Bench *m, const GdpaCase *c, double s, const Compiled *k, double *fwd,
                    double *bwd) {
  const GdpaEmitted *e = &k->e;
  char *err = m->err;
  size_t err_size = m->err_size;
  int64_t *lengths[4] = {NULL};
  double pairs = 0;
  for (int j = 0; j < e->ir.njagged && j < 4; j++) lengths[j] = malloc(BENCH_B * sizeof(int64_t));
  int64_t n = c->max_q, lo = (int64_t)((2 * s - 1) * (double)n);
  if (lo < 1) lo = 1;
  for (int b = 0; b < BENCH_B; b++) {
    lengths[0][b] = uniform_int(lo, n);
    pairs += (double)lengths[0][b] * (double)(c->shape == ATTN_CROSS ? c->kv_set : lengths[0][b]);
  }
  GdpaBatch bt;
  bool ok = gdpa_batch_init(&bt, e, k->module, BENCH_B, lengths, err, err_size);
  for (int j = 0; j < 4; j++) free(lengths[j]);
  if (!ok) return false;
  void *fill = NULL;
  ok = gdpa_gpu_function(k->module, "bench_fill", &fill, err, err_size);
  const int inputs[4] = {e->q, e->k, e->v, e->dout};
  for (int i = 0; ok && i < 4; i++) {
    long long count = (long long)(bt.tensor_bytes[inputs[i]] / 2);
    unsigned seed = 1234u + 977u * (unsigned)i;
    float amp = i < 2 ? 1.5f : 1.0f;
    void *args[] = {&bt.tensor[inputs[i]], &count, &seed, &amp};
    ok = gdpa_gpu_launch(fill, (unsigned)((count + 255) / 256), 256, 0, args, err, err_size);
  }
  Timed f = {&bt, 0, e->nforward}, b = {&bt, e->nforward, e->nlaunches};
  ok = ok && run_launches(&f, err, err_size) && run_launches(&b, err, err_size) &&
       gdpa_gpu_sync(err, err_size);  // warm up
  double flops = 4.0 * (double)c->heads * (double)c->dh * pairs, fwd_ms = 0, bwd_ms = 0;
  ok = ok && gdpa_gpu_time_ms(run_launches, &f, m->reps, &fwd_ms, err, err_size) &&
       gdpa_gpu_time_ms(run_launches, &b, m->reps, &bwd_ms, err, err_size);
  *fwd = flops / (fwd_ms * 1e-3) / 1e12;
  *bwd = 2.5 * flops / (bwd_ms * 1e-3) / 1e12;
  const int outs[4] = {e->out, e->dq, e->dk, e->dv};
  for (int i = 0; ok && i < 4; i++) {
    bool good = true;
    ok = all_finite_sample(&bt, outs[i], &good, err, err_size);
    m->good = m->good && good;
  }
  // A failure freeing the batch is reported only when nothing failed before it.
  return gdpa_batch_free(&bt, ok ? err : NULL, err_size) && ok;
}

// Every kernel the run needs: the main table's self and cross, the other activations and the
// block-shape variants.
typedef struct BenchKernels {
  Compiled self, cross, other[NUM_OTHER_ACTS], shapes[2];
} BenchKernels;

static bool compile_all(const GdpaBenchOptions *o, const char *arch, bool load,
                        BenchKernels *k, char *err, size_t err_size) {
  GdpaCase self_c = bench_case(ATTN_SELF, o->act, 1024);
  GdpaCase cross_c = bench_case(ATTN_CROSS, o->act, 1024);
  if (!compile_case(&self_c, arch, o->cache_dir, load, &k->self, err, err_size) ||
      !compile_case(&cross_c, arch, o->cache_dir, load, &k->cross, err, err_size))
    return false;
  if (o->quick) return true;
  for (int i = 0; i < NUM_OTHER_ACTS; i++) {
    GdpaCase x = bench_case(ATTN_SELF, other_acts[i], 1024);
    if (other_acts[i] != o->act &&
        !compile_case(&x, arch, o->cache_dir, load, &k->other[i], err, err_size))
      return false;
  }
  for (int i = 0; i < 2; i++) {
    GdpaCase x = bench_case(ATTN_SELF, o->act, 1024);
    x.tile_q = block_shapes[i][0], x.tile_m = block_shapes[i][1];
    if (!compile_case(&x, arch, o->cache_dir, load, &k->shapes[i], err, err_size)) return false;
  }
  return true;
}

static void free_all(BenchKernels *k) {
  arena_free(&k->self.arena);
  arena_free(&k->cross.arena);
  for (int i = 0; i < NUM_OTHER_ACTS; i++) arena_free(&k->other[i].arena);
  for (int i = 0; i < 2; i++) arena_free(&k->shapes[i].arena);
}

// The main table: one row per N, self s=0.5 and 1.0, cross s=1.0 and 0.5. False when a CUDA
// call failed.
static bool print_main_table(const GdpaBenchOptions *o, const BenchKernels *k, Bench *m,
                             FILE *out) {
  fprintf(out, "GDPA on %s (%d SMs): B=%d, H=%d, dh=%d, bf16, act %s, TFLOP/s fwd / bwd\n",
          gdpa_gpu_arch(), gdpa_gpu_num_sms(), BENCH_B, BENCH_H, BENCH_DH, act_name(o->act));
  if (o->act != ACT_GELU) fprintf(out, "(the Triton columns are Meta's numbers for gelu)\n");
  fprintf(out, "| N | self s=0.5 | Triton | self s=1.0 | Triton | cross KV=256 s=1.0 | Triton "
               "| cross KV=256 s=0.5 |\n");
  fprintf(out, "|---|---|---|---|---|---|---|---|\n");
  for (int ni = 0; ni < BENCH_NUM_N; ni++) {
    if (o->quick && bench_ns[ni] != 1024) continue;
    double f[4], b[4];
    GdpaCase sc = bench_case(ATTN_SELF, o->act, bench_ns[ni]);
    GdpaCase cc = bench_case(ATTN_CROSS, o->act, bench_ns[ni]);
    if (!measure(m, &sc, 0.5, &k->self, &f[0], &b[0]) ||
        !measure(m, &sc, 1.0, &k->self, &f[1], &b[1]) ||
        !measure(m, &cc, 1.0, &k->cross, &f[2], &b[2]) ||
        !measure(m, &cc, 0.5, &k->cross, &f[3], &b[3]))
      return false;
    const double(*peer)[2] = triton_tflops[ni];
    fprintf(out, "| %lld | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f "
                 "| %.0f / %.0f | %.0f / %.0f |\n",
            (long long)bench_ns[ni], f[0], b[0], peer[0][0], peer[0][1], f[1], b[1], peer[1][0],
            peer[1][1], f[2], b[2], peer[2][0], peer[2][1], f[3], b[3]);
    fflush(out);
  }
  return true;
}

// The other activations and the forward block shapes, self s=1.0, N=1024. False when a CUDA
// call failed.
static bool print_extra_sections(const GdpaBenchOptions *o, const BenchKernels *k, Bench *m,
                                 FILE *out) {
  fprintf(out, "\nOther activations, self s=1.0, N=1024 (fwd / bwd TFLOP/s):\n");
  for (int i = 0; i < NUM_OTHER_ACTS; i++) {
    if (other_acts[i] == o->act) continue;
    double f, b;
    GdpaCase x = bench_case(ATTN_SELF, other_acts[i], 1024);
    if (!measure(m, &x, 1.0, &k->other[i], &f, &b)) return false;
    fprintf(out, "  %-12s %.0f / %.0f\n", act_name(other_acts[i]), f, b);
  }
  fprintf(out, "\nForward block shapes, self %s s=1.0, N=1024 (default: 128 rows, 32 per "
               "warp):\n", act_name(o->act));
  for (int i = 0; i < 2; i++) {
    double f, b;
    GdpaCase x = bench_case(ATTN_SELF, o->act, 1024);
    if (!measure(m, &x, 1.0, &k->shapes[i], &f, &b)) return false;
    fprintf(out, "  tile_q %d tile_m %d: fwd %.0f\n", block_shapes[i][0], block_shapes[i][1], f);
  }
  return true;
}

GdpaBenchStatus gdpa_bench_run(const GdpaBenchOptions *o, FILE *out, char *err,
                               size_t err_size) {
  if (!o->compile_only && !gdpa_gpu_open(err, err_size)) return GDPA_BENCH_NO_GPU;
  const char *arch = o->compile_only ? o->compile_only : gdpa_gpu_arch();
  static BenchKernels kernels;  // large: keep it off the stack
  memset(&kernels, 0, sizeof kernels);
  GdpaBenchStatus status = GDPA_BENCH_OK;
  char reason[1024];
  if (!compile_all(o, arch, !o->compile_only, &kernels, reason, sizeof reason)) {
    fail(err, err_size, "compiling the attention kernels for %s failed: %s", arch, reason);
    status = GDPA_BENCH_COMPILE_FAILED;
  } else if (!o->compile_only) {
    Bench m = {.reps = o->reps, .good = true, .err = err, .err_size = err_size};
    if (!print_main_table(o, &kernels, &m, out) ||
        (!o->quick && !print_extra_sections(o, &kernels, &m, out))) {
      status = GDPA_BENCH_CUDA_FAILED;
    } else if (!m.good) {
      fail(err, err_size, "a benchmark output held NaN/inf or was all zero");
      status = GDPA_BENCH_BAD_OUTPUT;
    }
  }
  free_all(&kernels);
  return status;
}
