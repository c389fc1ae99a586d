// gdpa_gpu.c: the GPU harness of `gemc bench gdpa` and the attention GPU test (gdpa_gpu.h).
#include "gdpa_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "cuda_driver.h"
#include "gpu_tiles.h"
#include "jit_cache.h"
#include "nvrtc_compile.h"
#include "tensor_map.h"

// --- the driver ---------------------------------------------------------------------------

static CudaContext context;
static const CudaDriver *cu;

// Every CUDA call of the harness, in a function with `err, err_size`: a failure returns false
// with the call and the driver's message in err.
#define CU(call)                                                              \
  do {                                                                        \
    if (!CU_CHECK(call)) return fail(err, err_size, "%s", cuda_last_error()); \
  } while (0)

bool gdpa_gpu_open(char *err, size_t err_size) {
  if (!cuda_context_open(&context, -1, err, err_size)) return false;
  cu = cuda_driver();
  return true;
}

int gdpa_gpu_num_sms(void) { return context.sm_count; }
const char *gdpa_gpu_arch(void) { return context.arch; }
const char *gdpa_gpu_name(void) { return context.name; }

// --- NVRTC with a cubin cache --------------------------------------------------------------

void *gdpa_gpu_compile(const char *src, const char *arch, const char *cache_dir, size_t *size,
                       char *err, size_t err_size) {
  uint64_t key = jit_cache_key(src, arch, NULL, 0, nvrtc_version(), "gdpa-harness");
  void *image = NULL;
  bool corrupt = false;
  if (cache_dir && jit_cache_load(cache_dir, arch, key, &image, size, &corrupt, NULL, 0))
    return image;
  char *cubin = NULL;
  if (!nvrtc_compile(src, "gdpa.cu", arch, NVRTC_CUBIN, &cubin, size, NULL, err, err_size))
    return NULL;
  char reason[1024];
  if (cache_dir && !jit_cache_store(cache_dir, arch, key, cubin, *size, reason, sizeof reason))
    fprintf(stderr, "gdpa: warning: cubin not cached: %s\n", reason);
  return cubin;
}

// --- memory, modules and launches ----------------------------------------------------------

bool gdpa_gpu_load_module(const void *cubin, void **module, char *err, size_t err_size) {
  CUmodule m;
  CU(cu->cuModuleLoadData(&m, cubin));
  *module = m;
  return true;
}

bool gdpa_gpu_unload_module(void *module, char *err, size_t err_size) {
  if (module) CU(cu->cuModuleUnload((CUmodule)module));
  return true;
}

bool gdpa_gpu_function(void *module, const char *name, void **fn, char *err, size_t err_size) {
  CUfunction f;
  CU(cu->cuModuleGetFunction(&f, (CUmodule)module, name));
  *fn = f;
  return true;
}

bool gdpa_gpu_alloc(GpuPtr *p, size_t bytes, char *err, size_t err_size) {
  CUdeviceptr d = 0;
  CU(cu->cuMemAlloc(&d, bytes ? bytes : 16));
  *p = d;
  return true;
}
bool gdpa_gpu_free(GpuPtr p, char *err, size_t err_size) {
  if (p) CU(cu->cuMemFree(p));
  return true;
}
bool gdpa_gpu_upload(GpuPtr dst, const void *src, size_t bytes, char *err, size_t err_size) {
  if (bytes) CU(cu->cuMemcpyHtoD(dst, src, bytes));
  return true;
}
bool gdpa_gpu_download(void *dst, GpuPtr src, size_t bytes, char *err, size_t err_size) {
  if (bytes) CU(cu->cuMemcpyDtoH(dst, src, bytes));
  return true;
}
bool gdpa_gpu_memset0(GpuPtr dst, size_t bytes, char *err, size_t err_size) {
  if (bytes) CU(cu->cuMemsetD8Async(dst, 0, bytes, NULL));
  return true;
}
bool gdpa_gpu_sync(char *err, size_t err_size) {
  CU(cu->cuCtxSynchronize());
  return true;
}

bool gdpa_gpu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem, void **args,
                     char *err, size_t err_size) {
  if (grid == 0) return true;
  CUfunction f = fn;
  if (smem > 48 * 1024)
    CU(cu->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));
  CU(cu->cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, NULL, args, NULL));
  return true;
}

// The timed part of gdpa_gpu_time_ms, between its two events.
static bool time_between(CUevent start, CUevent stop, GdpaGpuBody body, void *ctx, int reps,
                         double *ms, char *err, size_t err_size) {
  CU(cu->cuEventRecord(start, NULL));
  for (int i = 0; i < reps; i++)
    if (!body(ctx, err, err_size)) return false;
  CU(cu->cuEventRecord(stop, NULL));
  CU(cu->cuEventSynchronize(stop));
  float elapsed = 0;
  CU(cu->cuEventElapsedTime(&elapsed, start, stop));
  *ms = elapsed / reps;
  return true;
}

bool gdpa_gpu_time_ms(GdpaGpuBody body, void *ctx, int reps, double *ms, char *err,
                      size_t err_size) {
  CUevent start, stop;
  CU(cu->cuEventCreate(&start, 0));
  if (!CU_CHECK(cu->cuEventCreate(&stop, 0))) {
    fail(err, err_size, "%s", cuda_last_error());
    cu->cuEventDestroy(start);
    return false;
  }
  bool ok = time_between(start, stop, body, ctx, reps, ms, err, err_size);
  if (!ok) {
    cu->cuEventDestroy(start), cu->cuEventDestroy(stop);
    return false;
  }
  CU(cu->cuEventDestroy(start));
  CU(cu->cuEventDestroy(stop));
  return true;
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

// The host and device parts of gdpa_batch_init after the arrays are allocated.
static bool batch_fill(GdpaBatch *bt, int64_t *const *lengths, char *err, size_t err_size) {
  const GdpaEmitted *e = bt->e;
  const Ir *ir = &e->ir;
  int64_t B = bt->B;
  for (int j = 0; j < ir->njagged && j < 4; j++) {
    bt->offsets[j] = malloc((size_t)(B + 1) * sizeof(int64_t));
    bt->offsets[j][0] = 0;
    for (int64_t b = 0; b < B; b++) bt->offsets[j][b + 1] = bt->offsets[j][b] + lengths[j][b];
    bt->totals[j] = bt->offsets[j][B];
    size_t bytes = (size_t)(B + 1) * sizeof(int64_t);
    if (!gdpa_gpu_alloc(&bt->d_offsets[j], bytes, err, err_size) ||
        !gdpa_gpu_upload(bt->d_offsets[j], bt->offsets[j], bytes, err, err_size))
      return false;
  }
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *x = &ir->tensors[t];
    int64_t width = x->layout == LAYOUT_FIXED ? x->fixed[1] : x->width;
    bt->tensor_bytes[t] = (size_t)(gdpa_tensor_rows(bt, t) * width) * dtype_bytes(x->dtype);
    if (!gdpa_gpu_alloc(&bt->tensor[t], bt->tensor_bytes[t], err, err_size)) return false;
  }
  for (int i = 0; i < e->ntiles; i++) {
    const TileList *tl = &e->tiles[i];
    int32_t *tiles = NULL;
    bt->ntiles[i] = gpu_tiles_build(tl, B, tl->q_jag >= 0 ? bt->offsets[tl->q_jag] : NULL,
                                    tl->kv_jag >= 0 ? bt->offsets[tl->kv_jag] : NULL,
                                    gdpa_gpu_num_sms(), &tiles);
    size_t bytes = (size_t)bt->ntiles[i] * GPU_TILE_INTS * sizeof(int32_t);
    bool ok = gdpa_gpu_alloc(&bt->d_tiles[i], bytes, err, err_size) &&
              gdpa_gpu_upload(bt->d_tiles[i], tiles, bytes, err, err_size);
    free(tiles);
    if (!ok) return false;
  }
  return true;
}

bool gdpa_batch_init(GdpaBatch *bt, const GdpaEmitted *e, void *module, int64_t B,
                     int64_t *const *lengths, char *err, size_t err_size) {
  memset(bt, 0, sizeof *bt);
  bt->e = e;
  bt->module = module;
  bt->B = B;
  bt->tensor = calloc((size_t)e->ir.ntensors, sizeof *bt->tensor);
  bt->tensor_bytes = calloc((size_t)e->ir.ntensors, sizeof *bt->tensor_bytes);
  if (batch_fill(bt, lengths, err, err_size)) return true;
  gdpa_batch_free(bt, NULL, 0);
  return false;
}

bool gdpa_batch_free(GdpaBatch *bt, char *err, size_t err_size) {
  bool ok = true;
  for (int j = 0; j < 4; j++) {
    free(bt->offsets[j]);
    ok = gdpa_gpu_free(bt->d_offsets[j], ok ? err : NULL, err_size) && ok;
  }
  for (int t = 0; t < bt->e->ir.ntensors; t++)
    ok = gdpa_gpu_free(bt->tensor[t], ok ? err : NULL, err_size) && ok;
  for (int i = 0; i < bt->e->ntiles; i++)
    ok = gdpa_gpu_free(bt->d_tiles[i], ok ? err : NULL, err_size) && ok;
  for (int i = 0; i < bt->nws; i++) ok = gdpa_gpu_free(bt->ws[i], ok ? err : NULL, err_size) && ok;
  free(bt->tensor);
  free(bt->tensor_bytes);
  return ok;
}

static bool workspace(GdpaBatch *bt, const LaunchArg *a, GpuPtr *ws, char *err,
                      size_t err_size) {
  for (int i = 0; i < bt->nws; i++)
    if (bt->ws_tensor[i] == a->tensor && bt->ws_slot[i] == a->slot) {
      *ws = bt->ws[i];
      return true;
    }
  if (bt->nws == GDPA_MAX_WORKSPACES)
    return fail(err, err_size, "too many workspaces (the harness holds %d)", GDPA_MAX_WORKSPACES);
  size_t bytes = (size_t)sym_eval(bt, a->size);
  if (!gdpa_gpu_alloc(&bt->ws[bt->nws], bytes, err, err_size)) return false;
  bt->ws_tensor[bt->nws] = a->tensor;
  bt->ws_slot[bt->nws] = a->slot;
  *ws = bt->ws[bt->nws++];
  return gdpa_gpu_memset0(*ws, bytes, err, err_size);
}

bool gdpa_run_range(void *range, char *err, size_t err_size) {
  GdpaRange *r = range;
  return gdpa_launch_range(r->bt, r->from, r->to, err, err_size);
}

bool gdpa_launch_range(GdpaBatch *bt, int from, int to, char *err, size_t err_size) {
  const GdpaEmitted *e = bt->e;
  for (int li = from; li < to; li++) {
    const Launch *l = &e->launches[li];
    if (l->kind == LAUNCH_ZERO) {  // a workspace (or tensor) to zero before the next kernel
      GpuPtr z;
      if (l->zero_arg.kind == ARG_WORKSPACE) {
        if (!workspace(bt, &l->zero_arg, &z, err, err_size)) return false;
      } else if (l->zero_arg.kind == ARG_TENSOR) {
        z = bt->tensor[l->zero_arg.tensor];
      } else {
        return fail(err, err_size, "a zero launch of argument kind %d", (int)l->zero_arg.kind);
      }
      if (!gdpa_gpu_memset0(z, (size_t)sym_eval(bt, l->zero_bytes), err, err_size)) return false;
      continue;
    }
    union {
      GpuPtr ptr;
      long long i;
      float f;
      CUtensorMap map;
    } vals[PLAN_MAX_ARGS];
    void *args[PLAN_MAX_ARGS];
    for (int a = 0; a < l->nargs; a++) {
      const LaunchArg *arg = &l->args[a];
      switch (arg->kind) {
      case ARG_TENSOR: vals[a].ptr = bt->tensor[arg->tensor]; break;
      case ARG_OFFSETS: vals[a].ptr = bt->d_offsets[arg->jag]; break;
      case ARG_TILES: vals[a].ptr = bt->d_tiles[arg->tiles]; break;
      case ARG_TILE_COUNT: vals[a].i = bt->ntiles[arg->tiles]; break;
      case ARG_TENSOR_MAP: {
        const Tensor *t = &e->ir.tensors[arg->tensor];
        char m[256];
        if (!tensor_map_encode(&vals[a].map, bt->tensor[arg->tensor], sym_eval(bt, arg->size),
                               t->width, t->dtype == DT_FP16, (int)arg->i, m, sizeof m))
          return fail(err, err_size, "kernel %s: the tensor map of %s: %s", l->kernel, t->name, m);
        break;
      }
      case ARG_WORKSPACE:
        if (!workspace(bt, arg, &vals[a].ptr, err, err_size)) return false;
        break;
      case ARG_SIZE: vals[a].i = sym_eval(bt, arg->size); break;
      case ARG_INT: vals[a].i = arg->i; break;
      case ARG_FLOAT: vals[a].f = arg->f; break;
      default: return fail(err, err_size, "argument kind %d not handled", (int)arg->kind);
      }
      args[a] = &vals[a];
    }
    unsigned grid = l->grid != GRID_FIXED
                        ? (unsigned)bt->ntiles[l->tiles]
                        : (unsigned)((sym_eval(bt, l->size) + l->per_block - 1) / l->per_block);
    if (l->grid == GRID_PERSISTENT && grid > (unsigned)gdpa_gpu_num_sms())
      grid = (unsigned)gdpa_gpu_num_sms();
    void *fn;
    if (!gdpa_gpu_function(bt->module, l->kernel, &fn, err, err_size) ||
        !gdpa_gpu_launch(fn, grid, (unsigned)l->threads, (unsigned)l->smem, args, err, err_size))
      return false;
  }
  return true;
}
