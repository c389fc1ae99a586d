// cublaslt.c: the row-major GEMM of cublaslt.h on a dlopened cuBLASLt. Our own mirror of the
// few cublasLt.h types and constants it needs (ABI-stable values from CUDA 12/13's headers).
#include "cublaslt.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_helpers_ptx.h"

typedef int LtStatus;  // cublasStatus_t; 0 is success
typedef struct LtContext *LtHandle;
typedef struct LtMatmulDescOpaque *LtMatmulDesc;
typedef struct LtLayoutOpaque *LtLayout;
typedef struct LtPrefOpaque *LtPref;
typedef struct LtAlgo {
  uint64_t data[8];
} LtAlgo;
typedef struct LtHeuristic {
  LtAlgo algo;
  size_t workspace_size;
  LtStatus state;
  float waves;
  int reserved[4];
} LtHeuristic;

enum {
  R_32F = 0, R_16F = 2, R_16BF = 14, R_8F_E4M3 = 28,       // cudaDataType_t
  COMPUTE_32F = 68,                                        // cublasComputeType_t
  OP_N = 0, OP_T = 1,                                      // cublasOperation_t
  DESC_TRANSA = 3, DESC_TRANSB = 4, DESC_EPILOGUE = 7, DESC_BIAS_POINTER = 8,
  DESC_BIAS_DATA_TYPE = 26, DESC_A_SCALE_POINTER = 17,
  DESC_B_SCALE_POINTER = 18,                               // cublasLtMatmulDescAttributes_t
  EPI_DEFAULT = 1, EPI_RELU = 2, EPI_BIAS = 4, EPI_RELU_BIAS = 6,
  PREF_MAX_WORKSPACE_BYTES = 1, PREF_ALIGN_A = 5, PREF_ALIGN_B = 6, PREF_ALIGN_C = 7,
  PREF_ALIGN_D = 8,
  WORKSPACE_BYTES = 32 << 20,
  ALGO_CACHE = 256,
  BIAS16_MAX = 1 << 20,  // elements of the 16-bit bias staging buffer
};

typedef struct CachedAlgo {
  GemmShape shape;    // m and k as size_bucket gives them: the size it was chosen for
  uint32_t align[3];  // of Lt's A, B and C/D pointers: the algorithm was chosen for them
  LtAlgo algo;
  bool used;
} CachedAlgo;

struct Gemm {
  void *lib;
  LtHandle handle;
  CUdeviceptr workspace;
  size_t version;
  CachedAlgo cache[ALGO_CACHE];
  // A fp32 bias is rounded to a 16-bit output's type first (runtime/gpu/gpu_helpers.cu): cuBLASLt's
  // bias epilogue takes the bias in the output's type.
  CUmodule helpers;
  CUfunction round_bf16, round_fp16;
  CUdeviceptr bias16;
  int next_slot;
  LtStatus (*create)(LtHandle *h);
  LtStatus (*destroy)(LtHandle h);
  size_t (*get_version)(void);
  LtStatus (*desc_create)(LtMatmulDesc *d, int compute, int scale);
  LtStatus (*desc_destroy)(LtMatmulDesc d);
  LtStatus (*desc_set)(LtMatmulDesc d, int attr, const void *buf, size_t size);
  LtStatus (*layout_create)(LtLayout *l, int type, uint64_t rows, uint64_t cols, int64_t ld);
  LtStatus (*layout_destroy)(LtLayout l);
  LtStatus (*pref_create)(LtPref *p);
  LtStatus (*pref_destroy)(LtPref p);
  LtStatus (*pref_set)(LtPref p, int attr, const void *buf, size_t size);
  LtStatus (*heuristic)(LtHandle h, LtMatmulDesc d, LtLayout a, LtLayout b, LtLayout c,
                        LtLayout dd, LtPref p, int requested, LtHeuristic *results,
                        int *returned);
  LtStatus (*matmul)(LtHandle h, LtMatmulDesc d, const void *alpha, const void *a, LtLayout al,
                     const void *b, LtLayout bl, const void *beta, const void *c, LtLayout cl,
                     void *dd, LtLayout dl, const LtAlgo *algo, void *ws, size_t ws_size,
                     CUstream s);
};

static bool sym(void *lib, void **slot, const char *name, char *err, size_t err_size) {
  *slot = dlsym(lib, name);
  if (!*slot) snprintf(err, err_size, "libcublasLt.so.13 has no %s", name);
  return *slot != NULL;
}

Gemm *gemm_open(char *err, size_t err_size) {
  const CudaDriver *d = cuda_driver();
  if (!d) {
    snprintf(err, err_size, "cuBLASLt needs the CUDA driver, which is not loaded");
    return NULL;
  }
  void *lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(err, err_size, "cannot load libcublasLt.so.13 (%s)", e ? e : "not found");
    return NULL;
  }
  Gemm *g = calloc(1, sizeof *g);
  g->lib = lib;
  bool ok = sym(lib, (void **)&g->create, "cublasLtCreate", err, err_size) &&
            sym(lib, (void **)&g->destroy, "cublasLtDestroy", err, err_size) &&
            sym(lib, (void **)&g->get_version, "cublasLtGetVersion", err, err_size) &&
            sym(lib, (void **)&g->desc_create, "cublasLtMatmulDescCreate", err, err_size) &&
            sym(lib, (void **)&g->desc_destroy, "cublasLtMatmulDescDestroy", err, err_size) &&
            sym(lib, (void **)&g->desc_set, "cublasLtMatmulDescSetAttribute", err, err_size) &&
            sym(lib, (void **)&g->layout_create, "cublasLtMatrixLayoutCreate", err, err_size) &&
            sym(lib, (void **)&g->layout_destroy, "cublasLtMatrixLayoutDestroy", err, err_size) &&
            sym(lib, (void **)&g->pref_create, "cublasLtMatmulPreferenceCreate", err, err_size) &&
            sym(lib, (void **)&g->pref_destroy, "cublasLtMatmulPreferenceDestroy", err,
                err_size) &&
            sym(lib, (void **)&g->pref_set, "cublasLtMatmulPreferenceSetAttribute", err,
                err_size) &&
            sym(lib, (void **)&g->heuristic, "cublasLtMatmulAlgoGetHeuristic", err, err_size) &&
            sym(lib, (void **)&g->matmul, "cublasLtMatmul", err, err_size);
  if (ok && g->create(&g->handle) != 0) {
    snprintf(err, err_size, "cublasLtCreate failed");
    ok = false;
  }
  if (ok && !CU_CHECK(d->cuMemAlloc(&g->workspace, WORKSPACE_BYTES))) {
    snprintf(err, err_size, "cuBLASLt workspace: %s", cuda_last_error());
    ok = false;
  }
  if (ok && !(CU_CHECK(d->cuModuleLoadData(&g->helpers, gpu_helpers_ptx)) &&
              CU_CHECK(d->cuModuleGetFunction(&g->round_bf16, g->helpers,
                                              "gemc_round_bias_bf16")) &&
              CU_CHECK(d->cuModuleGetFunction(&g->round_fp16, g->helpers,
                                              "gemc_round_bias_fp16")) &&
              CU_CHECK(d->cuMemAlloc(&g->bias16, (size_t)BIAS16_MAX * 2)))) {
    snprintf(err, err_size, "the GEMM helper kernels: %s", cuda_last_error());
    ok = false;
  }
  if (!ok) {
    gemm_close(g);
    return NULL;
  }
  g->version = g->get_version();
  return g;
}

void gemm_close(Gemm *g) {
  if (!g) return;
  const CudaDriver *d = cuda_driver();
  if (g->workspace && d) d->cuMemFree(g->workspace);
  if (g->bias16 && d) d->cuMemFree(g->bias16);
  if (g->helpers && d) d->cuModuleUnload(g->helpers);
  if (g->handle) g->destroy(g->handle);
  if (g->lib) dlclose(g->lib);
  free(g);
}

size_t gemm_library_version(const Gemm *g) { return g->version; }

static int lt_type(DType t) {
  switch (t) {
  case DT_BF16: return R_16BF;
  case DT_FP16: return R_16F;
  case DT_FP8: return R_8F_E4M3;
  default: return R_32F;
  }
}

static bool same_shape(const GemmShape *a, const GemmShape *b) {
  return a->m == b->m && a->n == b->n && a->k == b->k && a->trans_a == b->trans_a &&
         a->trans_b == b->trans_b && a->dtype == b->dtype && a->c_dtype == b->c_dtype &&
         a->has_bias == b->has_bias &&
         a->bias_dtype == b->bias_dtype && a->act == b->act && (a->beta == 0) == (b->beta == 0);
}

// Jagged GEMMs change m (or k, for weight gradients) every step, so the algorithm cache keys on
// a size's quarter octave, not on the size: a cuBLASLt heuristic query costs tens of
// microseconds, a step has dozens of such GEMMs, and an algorithm chosen for a size serves its
// neighbours (cuBLASLt refuses one that does not; gemm_run then asks again for the exact size).
static int64_t size_bucket(int64_t n) {
  if (n <= 64) return n;
  int top = 63 - __builtin_clzll((unsigned long long)n);
  int64_t step = (int64_t)1 << (top - 2);
  return (n + step - 1) / step * step;
}

static GemmShape bucketed(const GemmShape *s) {
  GemmShape b = *s;
  b.m = size_bucket(s->m);
  b.k = size_bucket(s->k);
  return b;
}

// cuBLASLt's layouts of shape s (row-major through the transposition: Lt's A is our B).
static bool make_layouts(Gemm *g, const GemmShape *s, int type, LtLayout *la, LtLayout *lb,
                         LtLayout *lc) {
  uint64_t a_rows = s->trans_b ? (uint64_t)s->k : (uint64_t)s->n;   // Lt A = our B, stored
  uint64_t a_cols = s->trans_b ? (uint64_t)s->n : (uint64_t)s->k;
  uint64_t b_rows = s->trans_a ? (uint64_t)s->m : (uint64_t)s->k;   // Lt B = our A, stored
  uint64_t b_cols = s->trans_a ? (uint64_t)s->k : (uint64_t)s->m;
  return g->layout_create(la, type, a_rows, a_cols, (int64_t)a_rows) == 0 &&
         g->layout_create(lb, type, b_rows, b_cols, (int64_t)b_rows) == 0 &&
         g->layout_create(lc, lt_type(s->c_dtype), (uint64_t)s->n, (uint64_t)s->m, s->n) == 0;
}

// The heuristic's preference: the workspace and the pointers' alignments (Lt's A, B, C/D).
// On failure *pref may hold a half-set preference for the caller to destroy.
static bool make_pref(Gemm *g, const uint32_t align[3], LtPref *pref) {
  uint64_t ws = WORKSPACE_BYTES;
  return g->pref_create(pref) == 0 &&
         g->pref_set(*pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == 0 &&
         g->pref_set(*pref, PREF_ALIGN_A, &align[0], sizeof align[0]) == 0 &&
         g->pref_set(*pref, PREF_ALIGN_B, &align[1], sizeof align[1]) == 0 &&
         g->pref_set(*pref, PREF_ALIGN_C, &align[2], sizeof align[2]) == 0 &&
         g->pref_set(*pref, PREF_ALIGN_D, &align[2], sizeof align[2]) == 0;
}

// The largest power of two (at most 256) that divides the address.
static uint32_t alignment(CUdeviceptr p) {
  uint32_t a = 256;
  while (a > 1 && (p & (a - 1)) != 0) a /= 2;
  return a;
}

static void describe(const GemmShape *s, char *out, size_t size) {
  snprintf(out, size, "%s->%s GEMM m=%lld n=%lld k=%lld%s%s%s%s", dtype_name(s->dtype),
           dtype_name(s->c_dtype), (long long)s->m, (long long)s->n, (long long)s->k, s->trans_a ? " A^T" : "",
           s->trans_b ? " B^T" : "", s->has_bias ? " +bias" : "", s->act == ACT_RELU ? " relu" : "");
}

bool gemm_run(Gemm *g, const GemmShape *s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
              CUdeviceptr bias, CUstream stream, char *err, size_t err_size) {
  return gemm_run_scaled(g, s, a, b, c, bias, 0, 0, stream, err, err_size);
}

// Why cuBLASLt's FP8 kernels cannot take shape s, or NULL when they can.
static const char *fp8_refusal(const GemmShape *s, CUdeviceptr scale_a, CUdeviceptr scale_b) {
  if (s->trans_a || !s->trans_b) return "fp8 operands must both be K-major (B^T, not A^T)";
  if (s->k % 16 != 0) return "fp8 needs k a multiple of 16";
  if (s->c_dtype != DT_F32 || s->n % 4 != 0) return "fp8 writes an fp32 C with n a multiple of 4";
  if (s->has_bias || s->act != ACT_NONE) return "fp8 takes no bias or activation epilogue";
  if (!scale_a || !scale_b) return "fp8 needs both operands' scales";
  // Measured on the H200: cublasLtMatmul fails on a scale 4 bytes past a 16-byte boundary.
  if ((scale_a | scale_b) & 15) return "fp8 scales must be 16-byte aligned";
  return NULL;
}

bool gemm_run_scaled(Gemm *g, const GemmShape *s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                     CUdeviceptr bias, CUdeviceptr scale_a, CUdeviceptr scale_b, CUstream stream,
                     char *err, size_t err_size) {
  char shape[160];
  describe(s, shape, sizeof shape);
  if (s->dtype == DT_FP8) {
    const char *why = fp8_refusal(s, scale_a, scale_b);
    if (why) {
      snprintf(err, err_size, "%s: %s", shape, why);
      return false;
    }
  }
  if (s->m == 0 || s->n == 0) return true;
  const CudaDriver *drv = cuda_driver();
  size_t elem = s->c_dtype == DT_F32 ? 4 : 2;
  if (s->k == 0) {
    // An empty reduction: C = beta * C; with beta 0 that is zeros (a bias, if any, is not
    // added: the plan only has k = 0 for weight gradients, which have none).
    if (s->beta == 0.0f &&
        !CU_CHECK(drv->cuMemsetD8Async(c, 0, (size_t)(s->m * s->n) * elem, stream))) {
      snprintf(err, err_size, "%s: %s", shape, cuda_last_error());
      return false;
    }
    return true;
  }
  if (s->act != ACT_NONE && s->act != ACT_RELU) {
    snprintf(err, err_size, "%s: cuBLASLt has no epilogue for %s", shape, act_name(s->act));
    return false;
  }
  DType bias_dtype = s->bias_dtype;
  if (s->has_bias && bias_dtype != DT_F32 && s->c_dtype == DT_F32) {
    snprintf(err, err_size, "%s: a %s bias on an fp32 output is not supported", shape,
             dtype_name(bias_dtype));
    return false;
  }
  if (s->has_bias && bias_dtype == DT_F32 && s->c_dtype != DT_F32) {
    if (s->n > BIAS16_MAX) {
      snprintf(err, err_size, "%s: a bias of %lld elements is longer than the %d the runtime "
               "stages", shape, (long long)s->n, BIAS16_MAX);
      return false;
    }
    long long n = s->n;
    CUdeviceptr out = g->bias16;
    void *params[] = {&out, &bias, &n};
    unsigned blocks = (unsigned)((s->n + 255) / 256);
    if (!CU_CHECK(drv->cuLaunchKernel(s->c_dtype == DT_FP16 ? g->round_fp16 : g->round_bf16,
                                      blocks, 1, 1, 256, 1, 1, 0, stream, params, NULL))) {
      snprintf(err, err_size, "%s: rounding the bias: %s", shape, cuda_last_error());
      return false;
    }
    bias = g->bias16;
    bias_dtype = s->c_dtype;
  }
  int type = lt_type(s->dtype);
  LtMatmulDesc desc = NULL;
  LtLayout la = NULL, lb = NULL, lc = NULL;
  LtPref pref = NULL;
  bool ok = false;
  LtStatus status = 0;  // of a failed cublasLtMatmul, for the message
  const char *step = "cublasLtMatmulDescCreate";
  if (g->desc_create(&desc, COMPUTE_32F, R_32F) != 0) goto done;
  // Column-major view: C^T[n, m] = op(B)^T[n, k] * op(A)^T[k, m]; Lt's A is our B.
  int32_t op_a = s->trans_b ? OP_T : OP_N, op_b = s->trans_a ? OP_T : OP_N;
  uint32_t epi = s->has_bias ? (s->act == ACT_RELU ? EPI_RELU_BIAS : EPI_BIAS)
                             : (s->act == ACT_RELU ? EPI_RELU : EPI_DEFAULT);
  step = "cublasLtMatmulDescSetAttribute";
  if (g->desc_set(desc, DESC_TRANSA, &op_a, sizeof op_a) != 0 ||
      g->desc_set(desc, DESC_TRANSB, &op_b, sizeof op_b) != 0 ||
      g->desc_set(desc, DESC_EPILOGUE, &epi, sizeof epi) != 0)
    goto done;
  if (s->dtype == DT_FP8) {
    // Lt's A is our B: its scale is ours of B.
    void *sa = (void *)(uintptr_t)scale_b, *sb = (void *)(uintptr_t)scale_a;
    if (g->desc_set(desc, DESC_A_SCALE_POINTER, &sa, sizeof sa) != 0 ||
        g->desc_set(desc, DESC_B_SCALE_POINTER, &sb, sizeof sb) != 0)
      goto done;
  }
  if (s->has_bias) {
    void *bias_ptr = (void *)(uintptr_t)bias;
    int32_t bias_type = lt_type(bias_dtype);
    if (g->desc_set(desc, DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr) != 0 ||
        g->desc_set(desc, DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type) != 0)
      goto done;
  }
  step = "cublasLtMatrixLayoutCreate";
  if (!make_layouts(g, s, type, &la, &lb, &lc)) goto done;
  uint32_t align[3] = {alignment(b), alignment(a), alignment(c)};  // Lt's A is our B
  GemmShape key = bucketed(s);
  CachedAlgo *hit = NULL;
  for (int i = 0; i < ALGO_CACHE && !hit; i++)
    if (g->cache[i].used && same_shape(&g->cache[i].shape, &key) &&
        memcmp(g->cache[i].align, align, sizeof align) == 0)
      hit = &g->cache[i];
  step = "cublasLtMatmulPreferenceCreate";
  if (!hit && !make_pref(g, align, &pref)) goto done;
  if (!hit) {
    // Chosen at the bucket's own size, so that the choice does not depend on which size of
    // the bucket came first: a resumed run picks what a straight one did (bit-exact resume).
    LtLayout qa = NULL, qb = NULL, qc = NULL;
    LtHeuristic h;
    int got = 0;
    step = "cublasLtMatmulAlgoGetHeuristic (no algorithm for this shape)";
    bool found = make_layouts(g, &key, type, &qa, &qb, &qc) &&
                 g->heuristic(g->handle, desc, qa, qb, qc, qc, pref, 1, &h, &got) == 0 &&
                 got >= 1;
    if (qc) g->layout_destroy(qc);
    if (qb) g->layout_destroy(qb);
    if (qa) g->layout_destroy(qa);
    if (found) {
      hit = &g->cache[g->next_slot];
      g->next_slot = (g->next_slot + 1) % ALGO_CACHE;
      *hit = (CachedAlgo){.shape = key, .algo = h.algo, .used = true};
      memcpy(hit->align, align, sizeof align);
    }
  }
  step = "cublasLtMatmul";
  void *cp = (void *)(uintptr_t)c;
  if (hit && (status = g->matmul(g->handle, desc, &s->alpha, (const void *)(uintptr_t)b, la,
                                 (const void *)(uintptr_t)a, lb, &s->beta, cp, lc, cp, lc, &hit->algo,
                                 (void *)(uintptr_t)g->workspace, WORKSPACE_BYTES, stream)) == 0) {
    ok = true;
    goto done;
  }
  // The bucket's algorithm does not take this size (or the bucket has none): this size's own,
  // not cached (the bucket keeps its choice).
  step = "cublasLtMatmulPreferenceCreate";
  if (!pref && !make_pref(g, align, &pref)) goto done;
  LtHeuristic h;
  int got = 0;
  step = "cublasLtMatmulAlgoGetHeuristic (no algorithm for this shape)";
  if (g->heuristic(g->handle, desc, la, lb, lc, lc, pref, 1, &h, &got) != 0 || got < 1)
    goto done;
  step = "cublasLtMatmul";
  if ((status = g->matmul(g->handle, desc, &s->alpha, (const void *)(uintptr_t)b, la,
                          (const void *)(uintptr_t)a, lb, &s->beta, cp, lc, cp, lc, &h.algo,
                          (void *)(uintptr_t)g->workspace, WORKSPACE_BYTES, stream)) != 0)
    goto done;
  ok = true;
done:
  if (!ok && status != 0)
    snprintf(err, err_size, "%s: %s failed (cublasStatus_t %d)", shape, step, status);
  else if (!ok)
    snprintf(err, err_size, "%s: %s failed", shape, step);
  if (pref) g->pref_destroy(pref);
  if (lc) g->layout_destroy(lc);
  if (lb) g->layout_destroy(lb);
  if (la) g->layout_destroy(la);
  if (desc) g->desc_destroy(desc);
  return ok;
}
