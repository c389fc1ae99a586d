// bench_gdpa.c: GDPA forward and backward TFLOP/s on the public benchmark shapes
// (../shared/design/overview.md): B=1152, H=4, head dim 128, bf16; self (kv = q, non-causal)
// with lengths ~U[max(1,(2s−1)N), N] for N in {512, 1024, 2048} and s in {0.5, 1.0}; cross
// with the same q lengths and KV=256 keys per example. FLOPs are useful FLOPs over the real
// lengths: forward 4·H·dh·Σ(unmasked pairs), backward 2.5× that. Prints a markdown table.
//   bench_gdpa [--cache DIR] [--compile-only ARCH] [--reps N] [--quick]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdpa_gpu.h"

enum { BENCH_B = 1152, BENCH_H = 4, BENCH_DH = 128, BENCH_KV = 256 };

static const char *const fill_kernel =
    "\nextern \"C\" __global__ void bench_fill(attn_bf16 *p, long long n, unsigned seed, float amp) {\n"
    "  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  unsigned x = (unsigned)i * 2654435761u ^ seed;\n"
    "  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;\n"
    "  float u = (float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;\n"
    "  p[i] = (attn_bf16)(attn_pack_bf16(u * amp, 0.0f) & 0xffffu);\n"
    "}\n";

static GdpaCase bench_case(AttnShape shape, Act act, int64_t n) {
  GdpaCase c = {.shape = shape, .act = act, .heads = BENCH_H, .dh = BENCH_DH,
                .kv_set = shape == ATTN_CROSS ? BENCH_KV : 0, .max_q = n,
                .max_kv = shape == ATTN_CROSS ? BENCH_KV : n, .scale = 1.0 / sqrt(BENCH_DH)};
  return c;
}

static uint64_t rng = 88172645463325252ull;
static int64_t uniform_int(int64_t lo, int64_t hi) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return lo + (int64_t)(rng % (uint64_t)(hi - lo + 1));
}

typedef struct Timed {
  GdpaBatch *bt;
  int from, to;
} Timed;

static void run_launches(void *ctx) {
  Timed *t = ctx;
  gdpa_launch_range(t->bt, t->from, t->to);
}

static bool all_finite_sample(GdpaBatch *bt, int t) {
  size_t n = bt->tensor_bytes[t] / 2;
  if (n > (1u << 22)) n = 1u << 22;
  uint16_t *h = malloc(n * 2 + 2);
  gpu_download(h, bt->tensor[t], n * 2);
  bool ok = true, nonzero = n == 0;
  for (size_t i = 0; i < n; i++) {
    if ((h[i] & 0x7f80) == 0x7f80) ok = false;
    if (h[i] & 0x7fff) nonzero = true;
  }
  free(h);
  return ok && nonzero;
}

// Forward and backward TFLOP/s of one configuration; false when a value came out NaN.
static bool measure(const GdpaCase *c, double s, void *module, const GdpaEmitted *e, int reps,
                    double *fwd, double *bwd) {
  int64_t *lengths[4] = {NULL};
  double pairs = 0;
  for (int j = 0; j < e->ir.njagged; j++) lengths[j] = malloc(BENCH_B * sizeof(int64_t));
  int64_t n = c->max_q, lo = (int64_t)((2 * s - 1) * (double)n);
  if (lo < 1) lo = 1;
  for (int b = 0; b < BENCH_B; b++) {
    lengths[0][b] = uniform_int(lo, n);
    pairs += (double)lengths[0][b] * (double)(c->shape == ATTN_CROSS ? c->kv_set : lengths[0][b]);
  }
  GdpaBatch bt;
  gdpa_batch_init(&bt, e, module, BENCH_B, lengths);
  void *fill = gpu_function(module, "bench_fill");
  const int inputs[4] = {e->q, e->k, e->v, e->dout};
  for (int i = 0; i < 4; i++) {
    long long count = (long long)(bt.tensor_bytes[inputs[i]] / 2);
    unsigned seed = 1234u + 977u * (unsigned)i;
    float amp = i < 2 ? 1.5f : 1.0f;
    void *args[] = {&bt.tensor[inputs[i]], &count, &seed, &amp};
    gpu_launch(fill, (unsigned)((count + 255) / 256), 256, 0, args);
  }
  Timed f = {&bt, 0, e->nforward}, b = {&bt, e->nforward, e->nlaunches};
  run_launches(&f), run_launches(&b), gpu_sync();  // warm up
  double flops = 4.0 * c->heads * c->dh * pairs;
  *fwd = flops / (gpu_time_ms(run_launches, &f, reps) * 1e-3) / 1e12;
  *bwd = 2.5 * flops / (gpu_time_ms(run_launches, &b, reps) * 1e-3) / 1e12;
  bool ok = all_finite_sample(&bt, e->out) && all_finite_sample(&bt, e->dq) &&
            all_finite_sample(&bt, e->dk) && all_finite_sample(&bt, e->dv);
  gdpa_batch_free(&bt);
  for (int j = 0; j < 4; j++) free(lengths[j]);
  return ok;
}

typedef struct Compiled {
  GdpaEmitted e;
  Arena arena;
  void *module;
} Compiled;

static bool compile_case(const GdpaCase *c, const char *arch, const char *cache, bool load,
                         Compiled *out) {
  StrBuf src = {0};
  memset(out, 0, sizeof *out);
  if (!gdpa_case_emit(c, "b.", &out->arena, &src, &out->e)) return false;
  sb_puts(&src, fill_kernel);
  size_t size;
  void *cubin = gpu_compile(src.data, arch, cache, &size);
  sb_free(&src);
  if (!cubin) return false;
  if (load) out->module = gpu_load_module(cubin);
  free(cubin);
  return true;
}

int main(int argc, char **argv) {
  const char *cache = NULL, *compile_only = NULL;
  int reps = 10;
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cache") && i + 1 < argc) cache = argv[++i];
    else if (!strcmp(argv[i], "--compile-only") && i + 1 < argc) compile_only = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = true;
  }
  const Act extra_acts[] = {ACT_GELU_TAYLOR, ACT_SILU, ACT_SOFTMAX};
  static Compiled self_gelu, cross_gelu, extra[3], shapes[2];
  const int shape_rows[2][2] = {{128, 16}, {64, 16}};  // forward tile_q, tile_m variants
  const char *arch = compile_only ? compile_only : NULL;
  if (!compile_only && !gpu_open()) return 2;
  if (!arch) arch = gpu_arch();
  bool load = !compile_only;
  GdpaCase self_c = bench_case(ATTN_SELF, ACT_GELU, 1024), cross_c = bench_case(ATTN_CROSS, ACT_GELU, 1024);
  if (!compile_case(&self_c, arch, cache, load, &self_gelu) ||
      !compile_case(&cross_c, arch, cache, load, &cross_gelu))
    return fprintf(stderr, "bench: compile failed\n"), 1;
  for (int i = 0; i < 3; i++) {
    GdpaCase x = bench_case(ATTN_SELF, extra_acts[i], 1024);
    if (!compile_case(&x, arch, cache, load, &extra[i]))
      return fprintf(stderr, "bench: compile failed\n"), 1;
  }
  for (int i = 0; i < 2; i++) {
    GdpaCase x = bench_case(ATTN_SELF, ACT_GELU, 1024);
    x.tile_q = shape_rows[i][0], x.tile_m = shape_rows[i][1];
    if (!compile_case(&x, arch, cache, load, &shapes[i]))
      return fprintf(stderr, "bench: compile failed\n"), 1;
  }
  if (compile_only) return 0;

  // Meta's Triton GDPA on our H200 (overview.md), forward / backward.
  static const double peer[3][3][2] = {{{299, 236}, {345, 280}, {210, 247}},
                                       {{381, 287}, {430, 330}, {282, 272}},
                                       {{444, 315}, {465, 345}, {286, 277}}};
  const int64_t ns[3] = {512, 1024, 2048};
  printf("GDPA on %s (%d SMs): B=%d, H=%d, dh=%d, bf16, act gelu (exact erf), TFLOP/s fwd / bwd\n",
         gpu_arch(), gpu_num_sms(), BENCH_B, BENCH_H, BENCH_DH);
  printf("| N | self s=0.5 | Triton | self s=1.0 | Triton | cross KV=256 s=1.0 | Triton | cross KV=256 s=0.5 |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  bool ok = true;
  for (int ni = 0; ni < 3; ni++) {
    if (quick && ns[ni] != 1024) continue;
    double f[4], b[4];
    GdpaCase sc = bench_case(ATTN_SELF, ACT_GELU, ns[ni]), cc = bench_case(ATTN_CROSS, ACT_GELU, ns[ni]);
    ok &= measure(&sc, 0.5, self_gelu.module, &self_gelu.e, reps, &f[0], &b[0]);
    ok &= measure(&sc, 1.0, self_gelu.module, &self_gelu.e, reps, &f[1], &b[1]);
    ok &= measure(&cc, 1.0, cross_gelu.module, &cross_gelu.e, reps, &f[2], &b[2]);
    ok &= measure(&cc, 0.5, cross_gelu.module, &cross_gelu.e, reps, &f[3], &b[3]);
    printf("| %lld | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f |\n",
           (long long)ns[ni], f[0], b[0], peer[ni][0][0], peer[ni][0][1], f[1], b[1],
           peer[ni][1][0], peer[ni][1][1], f[2], b[2], peer[ni][2][0], peer[ni][2][1], f[3], b[3]);
    fflush(stdout);
  }
  printf("\nOther activations, self s=1.0, N=1024 (fwd / bwd TFLOP/s):\n");
  for (int i = 0; i < 3; i++) {
    double f, b;
    GdpaCase x = bench_case(ATTN_SELF, extra_acts[i], 1024);
    ok &= measure(&x, 1.0, extra[i].module, &extra[i].e, reps, &f, &b);
    printf("  %-12s %.0f / %.0f\n", act_name(extra_acts[i]), f, b);
  }
  printf("\nForward block shapes, self gelu s=1.0, N=1024 (default: 128 rows, 32 per warp):\n");
  for (int i = 0; i < 2; i++) {
    double f, b;
    GdpaCase x = bench_case(ATTN_SELF, ACT_GELU, 1024);
    ok &= measure(&x, 1.0, shapes[i].module, &shapes[i].e, reps, &f, &b);
    printf("  tile_q %d tile_m %d: fwd %.0f\n", shape_rows[i][0], shape_rows[i][1], f);
  }
  if (!ok) printf("FAIL: a benchmark output held NaN/inf or was all zero\n");
  return ok ? 0 : 1;
}
