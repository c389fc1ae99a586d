// gdpa_gpu.c: the GPU harness of `gemc bench gdpa` and the attention GPU test (gdpa_gpu.h).
#include "gdpa_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "gpu_tiles.h"
#include "jit_cache.h"
#include "nvrtc_compile.h"

// --- the driver ---------------------------------------------------------------------------

static CudaContext context;
static const CudaDriver *cu;

// Every CUDA call of the harness: a failure is fatal (a benchmark or test cannot go on).
static void check_or_exit(bool ok) {
  if (ok) return;
  fprintf(stderr, "gdpa: %s\n", cuda_last_error());
  exit(2);
}
#define CU(call) check_or_exit(CU_CHECK(call))

bool gdpa_gpu_open(char *why, size_t why_size) {
  if (!cuda_context_open(&context, -1, why, why_size)) return false;
  cu = cuda_driver();
  return true;
}

int gdpa_gpu_num_sms(void) { return context.sm_count; }
const char *gdpa_gpu_arch(void) { return context.arch; }

// --- NVRTC with a cubin cache --------------------------------------------------------------

void *gdpa_gpu_compile(const char *src, const char *arch, const char *cache_dir, size_t *size) {
  char why[1024];
  uint64_t key = jit_cache_key(src, arch, NULL, 0, nvrtc_version(), "gdpa-harness");
  void *image = NULL;
  bool corrupt = false;
  if (cache_dir && jit_cache_load(cache_dir, arch, key, &image, size, &corrupt, NULL, 0))
    return image;
  char *cubin = NULL;
  if (!nvrtc_compile(src, "gdpa.cu", arch, NVRTC_CUBIN, &cubin, size, NULL, why, sizeof why)) {
    fprintf(stderr, "gdpa: %s\n", why);
    return NULL;
  }
  if (cache_dir && !jit_cache_store(cache_dir, arch, key, cubin, *size, why, sizeof why))
    fprintf(stderr, "gdpa: warning: cubin not cached: %s\n", why);
  return cubin;
}

// --- memory, modules and launches ----------------------------------------------------------

void *gdpa_gpu_load_module(const void *cubin) {
  CUmodule m;
  CU(cu->cuModuleLoadData(&m, cubin));
  return m;
}

void *gdpa_gpu_function(void *module, const char *name) {
  CUfunction f;
  CU(cu->cuModuleGetFunction(&f, (CUmodule)module, name));
  return f;
}

GpuPtr gdpa_gpu_alloc(size_t bytes) {
  CUdeviceptr p = 0;
  CU(cu->cuMemAlloc(&p, bytes ? bytes : 16));
  return p;
}
void gdpa_gpu_free(GpuPtr p) {
  if (p) CU(cu->cuMemFree(p));
}
void gdpa_gpu_upload(GpuPtr dst, const void *src, size_t bytes) {
  if (bytes) CU(cu->cuMemcpyHtoD(dst, src, bytes));
}
void gdpa_gpu_download(void *dst, GpuPtr src, size_t bytes) {
  if (bytes) CU(cu->cuMemcpyDtoH(dst, src, bytes));
}
void gdpa_gpu_memset0(GpuPtr dst, size_t bytes) {
  if (bytes) CU(cu->cuMemsetD8Async(dst, 0, bytes, NULL));
}
void gdpa_gpu_sync(void) { CU(cu->cuCtxSynchronize()); }

void gdpa_gpu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem, void **args) {
  if (grid == 0) return;
  CUfunction f = fn;
  if (smem > 48 * 1024)
    CU(cu->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));
  CU(cu->cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, NULL, args, NULL));
}

double gdpa_gpu_time_ms(void (*body)(void *), void *ctx, int reps) {
  CUevent start, stop;
  CU(cu->cuEventCreate(&start, 0));
  CU(cu->cuEventCreate(&stop, 0));
  CU(cu->cuEventRecord(start, NULL));
  for (int i = 0; i < reps; i++) body(ctx);
  CU(cu->cuEventRecord(stop, NULL));
  CU(cu->cuEventSynchronize(stop));
  float ms = 0;
  CU(cu->cuEventElapsedTime(&ms, start, stop));
  CU(cu->cuEventDestroy(start));
  CU(cu->cuEventDestroy(stop));
  return ms / reps;
}

// --- a batch and its launches ------------------------------------------------------------

static size_t dtype_bytes(DType t) { return t == DT_F32 ? 4 : 2; }

int64_t gdpa_tensor_rows(const GdpaBatch *bt, int t) {
  const Tensor *x = &bt->e->ir.tensors[t];
  switch (x->layout) {
  case LAYOUT_JAGGED: return bt->totals[x->jag];
  case LAYOUT_SET: return bt->B * x->set_k;
  case LAYOUT_DENSE: return bt->B;
  case LAYOUT_FIXED: return x->fixed[0];
  default: return 1;
  }
}

static int64_t sym_eval(const GdpaBatch *bt, SymSize s) {
  return s.c + s.b * bt->B + (s.jag >= 0 ? s.t * bt->totals[s.jag] : 0);
}

void gdpa_batch_init(GdpaBatch *bt, const GdpaEmitted *e, void *module, int64_t B,
                     int64_t *const *lengths) {
  memset(bt, 0, sizeof *bt);
  bt->e = e;
  bt->module = module;
  bt->B = B;
  const Ir *ir = &e->ir;
  for (int j = 0; j < ir->njagged && j < 4; j++) {
    bt->offsets[j] = malloc((size_t)(B + 1) * sizeof(int64_t));
    bt->offsets[j][0] = 0;
    for (int64_t b = 0; b < B; b++) bt->offsets[j][b + 1] = bt->offsets[j][b] + lengths[j][b];
    bt->totals[j] = bt->offsets[j][B];
    bt->d_offsets[j] = gdpa_gpu_alloc((size_t)(B + 1) * sizeof(int64_t));
    gdpa_gpu_upload(bt->d_offsets[j], bt->offsets[j], (size_t)(B + 1) * sizeof(int64_t));
  }
  bt->tensor = calloc((size_t)ir->ntensors, sizeof *bt->tensor);
  bt->tensor_bytes = calloc((size_t)ir->ntensors, sizeof *bt->tensor_bytes);
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *x = &ir->tensors[t];
    int64_t width = x->layout == LAYOUT_FIXED ? x->fixed[1] : x->width;
    bt->tensor_bytes[t] = (size_t)(gdpa_tensor_rows(bt, t) * width) * dtype_bytes(x->dtype);
    bt->tensor[t] = gdpa_gpu_alloc(bt->tensor_bytes[t]);
  }
  for (int i = 0; i < e->ntiles; i++) {
    const TileList *tl = &e->tiles[i];
    int32_t *tiles = NULL;
    bt->ntiles[i] = gpu_tiles_build(tl, B, tl->q_jag >= 0 ? bt->offsets[tl->q_jag] : NULL,
                                    tl->kv_jag >= 0 ? bt->offsets[tl->kv_jag] : NULL,
                                    gdpa_gpu_num_sms(), &tiles);
    size_t bytes = (size_t)bt->ntiles[i] * GPU_TILE_INTS * sizeof(int32_t);
    bt->d_tiles[i] = gdpa_gpu_alloc(bytes);
    gdpa_gpu_upload(bt->d_tiles[i], tiles, bytes);
    free(tiles);
  }
}

void gdpa_batch_free(GdpaBatch *bt) {
  for (int j = 0; j < 4; j++) {
    free(bt->offsets[j]);
    gdpa_gpu_free(bt->d_offsets[j]);
  }
  for (int t = 0; t < bt->e->ir.ntensors; t++) gdpa_gpu_free(bt->tensor[t]);
  for (int i = 0; i < bt->e->ntiles; i++) gdpa_gpu_free(bt->d_tiles[i]);
  for (int i = 0; i < bt->nws; i++) gdpa_gpu_free(bt->ws[i]);
  free(bt->tensor);
  free(bt->tensor_bytes);
}

static GpuPtr workspace(GdpaBatch *bt, const LaunchArg *a) {
  for (int i = 0; i < bt->nws; i++)
    if (bt->ws_tensor[i] == a->tensor && bt->ws_slot[i] == a->slot) return bt->ws[i];
  if (bt->nws == GDPA_MAX_WORKSPACES) {
    fprintf(stderr, "gdpa: too many workspaces\n");
    exit(2);
  }
  size_t bytes = (size_t)sym_eval(bt, a->size);
  bt->ws_tensor[bt->nws] = a->tensor;
  bt->ws_slot[bt->nws] = a->slot;
  bt->ws[bt->nws] = gdpa_gpu_alloc(bytes);
  gdpa_gpu_memset0(bt->ws[bt->nws], bytes);
  return bt->ws[bt->nws++];
}

void gdpa_launch_range(GdpaBatch *bt, int from, int to) {
  const GdpaEmitted *e = bt->e;
  for (int li = from; li < to; li++) {
    const Launch *l = &e->launches[li];
    union {
      GpuPtr ptr;
      long long i;
      float f;
    } vals[PLAN_MAX_ARGS];
    void *args[PLAN_MAX_ARGS];
    for (int a = 0; a < l->nargs; a++) {
      const LaunchArg *arg = &l->args[a];
      switch (arg->kind) {
      case ARG_TENSOR: vals[a].ptr = bt->tensor[arg->tensor]; break;
      case ARG_OFFSETS: vals[a].ptr = bt->d_offsets[arg->jag]; break;
      case ARG_TILES: vals[a].ptr = bt->d_tiles[arg->tiles]; break;
      case ARG_WORKSPACE: vals[a].ptr = workspace(bt, arg); break;
      case ARG_SIZE: vals[a].i = sym_eval(bt, arg->size); break;
      case ARG_INT: vals[a].i = arg->i; break;
      case ARG_FLOAT: vals[a].f = arg->f; break;
      default:
        fprintf(stderr, "gdpa: argument kind %d not handled\n", (int)arg->kind);
        exit(2);
      }
      args[a] = &vals[a];
    }
    unsigned grid = l->grid == GRID_TILES
                        ? (unsigned)bt->ntiles[l->tiles]
                        : (unsigned)((sym_eval(bt, l->size) + l->per_block - 1) / l->per_block);
    gdpa_gpu_launch(gdpa_gpu_function(bt->module, l->kernel), grid, (unsigned)l->threads,
               (unsigned)l->smem, args);
  }
}
