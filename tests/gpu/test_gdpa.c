// test_gdpa.c: every attention kernel, forward and backward, against a double-precision
// reference of docs/autodiff.md's "Attention, exactly", on fresh random jagged batches that
// include empty sequences, length-1 sequences and lengths that are not multiples of a tile.
// Passes when ||gpu − ref|| / ||ref|| < 1e-2 (bf16; fp16 2e-3, fp32 1e-4) for the output and every gradient, no value is
// NaN or infinite, and a second backward run gives bit-identical gradients (no atomics).
//   test_gdpa [--cache DIR] [--compile-only ARCH] [--case N]...
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdpa_cases.h"
#include "gdpa_gpu.h"
#include "numerics.h"

enum { BATCH = 11 };

// A failing CUDA call ends the run (the harness returns it; a broken context fails every case
// after it anyway).
static char gpu_err[1024];
static void check_gpu(bool ok) {
  if (ok) return;
  fprintf(stderr, "test_gdpa: %s\n", gpu_err);
  exit(2);
}
#define GPU_ERR gpu_err, sizeof gpu_err

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {  // [0, 1)
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static uint16_t to_bf16(float x) {
  uint32_t u;
  x = round_bf16(x);
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// IEEE half <-> float, round to nearest even (normal and subnormal; no overflow in tests).
static uint16_t to_half(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  float a = fabsf(x);
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24
    return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
  }
  uint32_t mant = u & 0x7fffffu, exp = ((u >> 23) & 0xffu) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}
static float from_half(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float x = exp == 0 ? (float)mant / 16777216.0f : ldexpf((float)(mant | 0x400u), (int)exp - 25);
  uint32_t u;
  memcpy(&u, &x, 4);
  u |= sign;
  memcpy(&x, &u, 4);
  return x;
}

// Host copy of a tensor, as floats.
typedef struct HostTensor {
  float *v;
  int64_t rows, width;
  DType dtype;
} HostTensor;

static HostTensor host_random(GdpaBatch *bt, int t, double amp) {
  const Tensor *x = &bt->e->ir.tensors[t];
  HostTensor h = {.rows = gdpa_tensor_rows(bt, t),
                  .width = x->layout == LAYOUT_FIXED ? x->fixed[1] : x->width, .dtype = x->dtype};
  size_t n = (size_t)(h.rows * h.width);
  h.v = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) h.v[i] = round_bf16((float)((2 * uniform() - 1) * amp));
  if (x->dtype == DT_F32) {
    check_gpu(gdpa_gpu_upload(bt->tensor[t], h.v, n * 4, GPU_ERR));
  } else {
    uint16_t *b = malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) {
      b[i] = x->dtype == DT_FP16 ? to_half(h.v[i]) : to_bf16(h.v[i]);
      h.v[i] = x->dtype == DT_FP16 ? from_half(b[i]) : h.v[i];
    }
    check_gpu(gdpa_gpu_upload(bt->tensor[t], b, n * 2, GPU_ERR));
    free(b);
  }
  return h;
}

static float *download(GdpaBatch *bt, int t, size_t *n) {
  const Tensor *x = &bt->e->ir.tensors[t];
  *n = bt->tensor_bytes[t] / (x->dtype == DT_F32 ? 4 : 2);
  float *out = malloc((*n ? *n : 1) * sizeof(float));
  if (x->dtype == DT_F32) {
    check_gpu(gdpa_gpu_download(out, bt->tensor[t], *n * 4, GPU_ERR));
  } else {
    uint16_t *b = malloc((*n ? *n : 1) * 2);
    check_gpu(gdpa_gpu_download(b, bt->tensor[t], *n * 2, GPU_ERR));
    for (size_t i = 0; i < *n; i++) out[i] = x->dtype == DT_FP16 ? from_half(b[i]) : from_bf16(b[i]);
    free(b);
  }
  return out;
}

// --- the reference -----------------------------------------------------------------------

static bool visible(const GdpaCase *c, int64_t i, int64_t j) {
  if (c->causal && j > i) return false;
  if (c->window > 0) {
    if (j <= i - c->window) return false;
    if (!c->causal && j >= i + c->window) return false;
  }
  return true;
}

typedef struct Ref {
  double *o, *dq, *dk, *dv;
} Ref;

static void reference(const GdpaCase *c, const GdpaBatch *bt, const HostTensor *q,
                      const HostTensor *k, const HostTensor *v, const HostTensor *dout,
                      Ref *r) {
  const GdpaEmitted *e = bt->e;
  int64_t d = c->heads * c->dh, dh = c->dh;
  r->o = calloc((size_t)(dout->rows * d) + 1, sizeof(double));
  r->dq = calloc((size_t)(q->rows * d) + 1, sizeof(double));
  r->dk = calloc((size_t)(k->rows * d) + 1, sizeof(double));
  r->dv = calloc((size_t)(k->rows * d) + 1, sizeof(double));
  double inv_norm = 1;
  if (c->hstu_norm && c->act != ACT_SOFTMAX)
    inv_norm = 1.0 / (double)(e->kv_jag >= 0 ? e->ir.jagged[e->kv_jag].max_len : c->kv_set);
  for (int64_t b = 0; b < bt->B; b++) {
    int64_t qs, os, lq, ks, lk;
    if (e->q_jag >= 0) {
      qs = os = bt->offsets[e->q_jag][b];
      lq = bt->offsets[e->q_jag][b + 1] - qs;
    } else {
      int64_t per = c->shape == ATTN_PMA || c->q_set ? c->q_set : 1;
      qs = c->shape == ATTN_PMA ? 0 : b * per;
      os = b * per;
      lq = per;
    }
    if (e->kv_jag >= 0) {
      ks = bt->offsets[e->kv_jag][b];
      lk = bt->offsets[e->kv_jag][b + 1] - ks;
    } else {
      ks = b * c->kv_set;
      lk = c->kv_set;
    }
    if (lq == 0 || lk == 0) continue;
    double *S = malloc((size_t)(lq * lk) * sizeof(double)), *P = malloc((size_t)(lq * lk) * sizeof(double));
    double *dS = malloc((size_t)(lq * lk) * sizeof(double));
    for (int64_t h = 0; h < c->heads; h++) {
      int64_t hc = h * dh;
      for (int64_t i = 0; i < lq; i++) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < lk; j++) {
          double s = 0;
          for (int64_t x = 0; x < dh; x++)
            s += (double)q->v[(qs + i) * d + hc + x] * k->v[(ks + j) * d + hc + x];
          S[i * lk + j] = s * c->scale;
          if (visible(c, i, j) && S[i * lk + j] > m) m = S[i * lk + j];
        }
        for (int64_t j = 0; j < lk; j++) {
          double p = 0;
          if (visible(c, i, j))
            p = c->act == ACT_SOFTMAX ? exp(S[i * lk + j] - m)
                                      : act_forward(c->act, S[i * lk + j]) * inv_norm;
          P[i * lk + j] = p;
          sum += p;
        }
        if (c->act == ACT_SOFTMAX && sum > 0)
          for (int64_t j = 0; j < lk; j++) P[i * lk + j] /= sum;
        for (int64_t x = 0; x < dh; x++) {
          double o = 0;
          for (int64_t j = 0; j < lk; j++) o += P[i * lk + j] * v->v[(ks + j) * d + hc + x];
          r->o[(os + i) * d + hc + x] = o;
        }
        // dP, dS
        double dot = 0;
        for (int64_t j = 0; j < lk; j++) {
          double dp = 0;
          for (int64_t x = 0; x < dh; x++)
            dp += (double)dout->v[(os + i) * d + hc + x] * v->v[(ks + j) * d + hc + x];
          dS[i * lk + j] = dp;
          dot += dp * P[i * lk + j];
        }
        for (int64_t j = 0; j < lk; j++) {
          double dp = dS[i * lk + j];
          if (!visible(c, i, j))
            dS[i * lk + j] = 0;
          else if (c->act == ACT_SOFTMAX)
            dS[i * lk + j] = P[i * lk + j] * (dp - dot);
          else
            dS[i * lk + j] = dp * act_grad(c->act, S[i * lk + j]) * inv_norm;
        }
      }
      for (int64_t i = 0; i < lq; i++)
        for (int64_t j = 0; j < lk; j++) {
          double ds = dS[i * lk + j] * c->scale, p = P[i * lk + j];
          for (int64_t x = 0; x < dh; x++) {
            r->dq[(qs + i) * d + hc + x] += ds * k->v[(ks + j) * d + hc + x];
            r->dk[(ks + j) * d + hc + x] += ds * q->v[(qs + i) * d + hc + x];
            r->dv[(ks + j) * d + hc + x] += p * dout->v[(os + i) * d + hc + x];
          }
        }
    }
    free(S), free(P), free(dS);
  }
}

// ||a − ref|| / ||ref||, and whether every value of a is finite.
static double rel_error(const float *a, const double *ref, size_t n, bool *finite) {
  double num = 0, den = 0;
  *finite = true;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i])) *finite = false;
    double diff = a[i] - ref[i];
    num += diff * diff, den += ref[i] * ref[i];
  }
  if (!*finite) return INFINITY;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int64_t random_length(int64_t max, int b) {
  static const int fixed[] = {0, 1, 64, 65, 63, 128, 129};
  if (b < 7) return fixed[b] < max ? fixed[b] : max;
  if (b == 7) return max;
  return (int64_t)(uniform() * (double)(max + 1));
}

// Whether the emitted backward takes dQ inside the dK/dV kernel (its `_bwd_qkv` launch).
static bool has_fused_dq(const GdpaEmitted *e) {
  for (int i = e->nforward; i < e->nlaunches; i++)
    if (e->launches[i].kind == LAUNCH_KERNEL && strstr(e->launches[i].kernel, "_bwd_qkv"))
      return true;
  return false;
}

// One case against the double reference. atomic: with @schedule(deterministic = false), whose
// dQ is added with float atomics; then only dK and dV must repeat bit for bit. Returns 1 passed,
// 0 failed, -1 skipped (atomic, and the case's backward does not take it).
static int run_case(int ci, const char *cache, bool atomic) {
  const GdpaCase *c = &gdpa_test_cases[ci];
  char name[128];
  gdpa_case_name(c, name, sizeof name);
  if (atomic) strncat(name, " atomic-dq", sizeof name - strlen(name) - 1);
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  GdpaEmitOptions x = {.atomic_dq = atomic};
  if (!gdpa_case_emit_with(c, &x, 1, "t.", &arena, &src, e)) {
    printf("FAIL %-40s emit_attention refused it\n", name);
    return 0;
  }
  if (atomic && !has_fused_dq(e)) {
    sb_free(&src), arena_free(&arena), free(e);
    return -1;
  }
  size_t size;
  void *cubin = gdpa_gpu_compile(src.data, gdpa_gpu_arch(), cache, &size, GPU_ERR);
  if (!cubin) {
    printf("FAIL %-40s NVRTC: %s\n", name, gpu_err);
    return 0;
  }
  void *module = NULL;
  check_gpu(gdpa_gpu_load_module(cubin, &module, GPU_ERR));
  int64_t *lengths[4] = {NULL};
  for (int j = 0; j < e->ir.njagged; j++) {
    lengths[j] = malloc(BATCH * sizeof(int64_t));
    for (int b = 0; b < BATCH; b++)
      lengths[j][b] = random_length(e->ir.jagged[j].max_len, j == 0 ? b : (b + 3) % BATCH);
  }
  GdpaBatch bt;
  check_gpu(gdpa_batch_init(&bt, e, module, BATCH, lengths, GPU_ERR));
  HostTensor q = host_random(&bt, e->q, 1.5), k = host_random(&bt, e->k, 1.5);
  HostTensor v = host_random(&bt, e->v, 1.0), dout = host_random(&bt, e->dout, 1.0);
  check_gpu(gdpa_gpu_memset0(bt.tensor[e->out], bt.tensor_bytes[e->out], GPU_ERR));
  check_gpu(gdpa_launch_range(&bt, 0, e->nforward, GPU_ERR));
  check_gpu(gdpa_launch_range(&bt, e->nforward, e->nlaunches, GPU_ERR));
  check_gpu(gdpa_gpu_sync(GPU_ERR));
  Ref ref;
  reference(c, &bt, &q, &k, &v, &dout, &ref);
  const int outs[4] = {e->out, e->dq, e->dk, e->dv};
  double *refs[4] = {ref.o, ref.dq, ref.dk, ref.dv};
  const char *what[4] = {"out", "dq", "dk", "dv"};
  bool ok = true;
  char line[512];
  int n = snprintf(line, sizeof line, "%-40s", name);
  float *first[4];
  for (int i = 0; i < 4; i++) {
    size_t count;
    first[i] = download(&bt, outs[i], &count);
    bool finite;
    double err = rel_error(first[i], refs[i], count, &finite);
    // bf16: 1e-2; fp16: its 11-bit significand; fp32: fp32 arithmetic, fast exp in the act
    double tol = c->storage == 32 ? 1e-4 : c->storage == 16 ? 2e-3 : 1e-2;
    bool pass = finite && err < tol;
    ok = ok && pass;
    n += snprintf(line + n, sizeof line - (size_t)n, " %s %.2e%s", what[i], err, pass ? "" : "!");
  }
  // Determinism: the backward again, bit for bit.
  check_gpu(gdpa_launch_range(&bt, e->nforward, e->nlaunches, GPU_ERR));
  check_gpu(gdpa_gpu_sync(GPU_ERR));
  bool same = true;
  for (int i = atomic ? 2 : 1; i < 4; i++) {
    size_t count;
    float *again = download(&bt, outs[i], &count);
    if (memcmp(again, first[i], count * sizeof(float)) != 0) same = false;
    free(again);
  }
  for (int i = 0; i < 4; i++) free(first[i]), free(refs[i]);
  ok = ok && same;
  printf("%s %s%s\n", ok ? "PASS" : "FAIL", line, same ? "" : " (backward not deterministic)");
  free(q.v), free(k.v), free(v.v), free(dout.v);
  check_gpu(gdpa_batch_free(&bt, GPU_ERR));
  for (int j = 0; j < 4; j++) free(lengths[j]);
  free(cubin);
  sb_free(&src);
  arena_free(&arena);
  free(e);
  return ok;
}

int main(int argc, char **argv) {
  const char *cache = NULL, *compile_only = NULL;
  bool only[GDPA_NUM_TEST_CASES] = {false}, some = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cache") && i + 1 < argc) cache = argv[++i];
    else if (!strcmp(argv[i], "--compile-only") && i + 1 < argc) compile_only = argv[++i];
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
      int c = atoi(argv[++i]);
      if (c >= 0 && c < GDPA_NUM_TEST_CASES) only[c] = some = true;
    }
  }
  if (compile_only) {  // fill the cubin cache without a GPU
    int failed = 0;
    for (int n = 0; n < 2 * GDPA_NUM_TEST_CASES; n++) {
      int ci = n % GDPA_NUM_TEST_CASES;
      GdpaEmitOptions x = {.atomic_dq = n >= GDPA_NUM_TEST_CASES};
      Arena arena = {0};
      StrBuf src = {0};
      GdpaEmitted *e = calloc(1, sizeof *e);
      size_t size;
      char err[1024] = "emit_attention refused it";
      bool emitted = gdpa_case_emit_with(&gdpa_test_cases[ci], &x, 1, "t.", &arena, &src, e);
      void *cubin = NULL;
      if (emitted && (!x.atomic_dq || has_fused_dq(e)))
        cubin = gdpa_gpu_compile(src.data, compile_only, cache, &size, err, sizeof err);
      else if (emitted)
        strcpy(err, "");  // no atomic dQ for this case: nothing to compile
      if (!cubin && err[0]) failed++, fprintf(stderr, "case %d failed: %s\n", ci, err);
      free(cubin), sb_free(&src), arena_free(&arena), free(e);
    }
    return failed != 0;
  }
  char err[512];
  if (!gdpa_gpu_open(err, sizeof err)) {
    fprintf(stderr, "test_gdpa: no GPU: %s\n", err);
    return 2;
  }
  printf("gdpa kernels vs the double reference on %s, %d SMs (relative L2 errors)\n", gdpa_gpu_arch(),
         gdpa_gpu_num_sms());
  int failed = 0, ran = 0;
  for (int atomic = 0; atomic < 2; atomic++)
    for (int ci = 0; ci < GDPA_NUM_TEST_CASES; ci++) {
      if (some && !only[ci]) continue;
      int r = run_case(ci, cache, atomic);
      if (r >= 0) failed += r == 0, ran++;
    }
  printf("%d of %d cases passed\n", ran - failed, ran);
  return failed != 0;
}
