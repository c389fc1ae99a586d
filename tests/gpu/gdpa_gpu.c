// gdpa_gpu.c: the GPU harness of the attention tests and benchmark (gdpa_gpu.h).
#include "gdpa_gpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_tiles.h"

// --- the driver, loaded lazily ----------------------------------------------------------

typedef int CuResult;
static struct {
  CuResult (*init)(unsigned);
  CuResult (*device_get)(int *, int);
  CuResult (*device_attr)(int *, int, int);
  CuResult (*primary_ctx_retain)(void **, int);
  CuResult (*ctx_set_current)(void *);
  CuResult (*module_load_data)(void **, const void *);
  CuResult (*module_get_function)(void **, void *, const char *);
  CuResult (*func_set_attribute)(void *, int, int);
  CuResult (*mem_alloc)(GpuPtr *, size_t);
  CuResult (*mem_free)(GpuPtr);
  CuResult (*htod)(GpuPtr, const void *, size_t);
  CuResult (*dtoh)(void *, GpuPtr, size_t);
  CuResult (*memset_d8)(GpuPtr, unsigned char, size_t);
  CuResult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, void *, void **, void **);
  CuResult (*ctx_sync)(void);
  CuResult (*event_create)(void **, unsigned);
  CuResult (*event_record)(void *, void *);
  CuResult (*event_sync)(void *);
  CuResult (*event_elapsed)(float *, void *, void *);
  CuResult (*error_string)(CuResult, const char **);
  int sms, major, minor;
  char arch[16];
} cu;

static void cu_check(CuResult r, const char *what, const char *file, int line) {
  if (r == 0) return;
  const char *msg = "unknown";
  if (cu.error_string) cu.error_string(r, &msg);
  fprintf(stderr, "%s:%d: CUDA error %d (%s) in %s\n", file, line, r, msg, what);
  exit(2);
}
#define CU(x) cu_check((x), #x, __FILE__, __LINE__)

bool gpu_open(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "gpu: no CUDA driver (libcuda.so.1): %s\n", dlerror());
    return false;
  }
#define SYM(field, name)                                                   \
  do {                                                                     \
    *(void **)&cu.field = dlsym(lib, name);                                \
    if (!cu.field) {                                                       \
      fprintf(stderr, "gpu: the driver lacks %s\n", name);                 \
      return false;                                                        \
    }                                                                      \
  } while (0)
  SYM(init, "cuInit");
  SYM(device_get, "cuDeviceGet");
  SYM(device_attr, "cuDeviceGetAttribute");
  SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  SYM(ctx_set_current, "cuCtxSetCurrent");
  SYM(module_load_data, "cuModuleLoadData");
  SYM(module_get_function, "cuModuleGetFunction");
  SYM(func_set_attribute, "cuFuncSetAttribute");
  SYM(mem_alloc, "cuMemAlloc_v2");
  SYM(mem_free, "cuMemFree_v2");
  SYM(htod, "cuMemcpyHtoD_v2");
  SYM(dtoh, "cuMemcpyDtoH_v2");
  SYM(memset_d8, "cuMemsetD8_v2");
  SYM(launch, "cuLaunchKernel");
  SYM(ctx_sync, "cuCtxSynchronize");
  SYM(event_create, "cuEventCreate");
  SYM(event_record, "cuEventRecord");
  SYM(event_sync, "cuEventSynchronize");
  SYM(event_elapsed, "cuEventElapsedTime_v2");
  SYM(error_string, "cuGetErrorString");
#undef SYM
  int dev;
  void *ctx;
  CU(cu.init(0));
  CU(cu.device_get(&dev, 0));
  CU(cu.device_attr(&cu.sms, 16, dev));    // multiprocessor count
  CU(cu.device_attr(&cu.major, 75, dev));  // compute capability
  CU(cu.device_attr(&cu.minor, 76, dev));
  CU(cu.primary_ctx_retain(&ctx, dev));
  CU(cu.ctx_set_current(ctx));
  snprintf(cu.arch, sizeof cu.arch, "sm_%d%d%s", cu.major, cu.minor,
           cu.major >= 9 ? "a" : "");
  return true;
}

int gpu_num_sms(void) { return cu.sms; }
const char *gpu_arch(void) { return cu.arch; }

// --- NVRTC with a cubin cache ------------------------------------------------------------

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = n > 0 ? malloc((size_t)n) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = buf ? (size_t)n : 0;
  return buf;
}

// NVRTC's C API, declared here so that no CUDA header is needed to build.
typedef int nvrtcResult;  // 0: success
typedef void *nvrtcProgram;
enum { NVRTC_SUCCESS = 0 };

// NVRTC, opened on first use so that a cached cubin needs no NVRTC at all.
static struct {
  nvrtcResult (*version)(int *, int *);
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                        const char *const *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *);
  nvrtcResult (*log)(nvrtcProgram, char *);
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
  nvrtcResult (*cubin)(nvrtcProgram, char *);
  nvrtcResult (*destroy)(nvrtcProgram *);
  bool tried, ok;
} rtc;

static bool nvrtc_open(void) {
  if (rtc.tried) return rtc.ok;
  rtc.tried = true;
  void *lib = dlopen("libnvrtc.so.13", RTLD_NOW);
  if (!lib) lib = dlopen("/usr/local/cuda/lib64/libnvrtc.so.13", RTLD_NOW);
  if (!lib) lib = dlopen("libnvrtc.so", RTLD_NOW);
  if (!lib) return false;
  *(void **)&rtc.version = dlsym(lib, "nvrtcVersion");
  *(void **)&rtc.create = dlsym(lib, "nvrtcCreateProgram");
  *(void **)&rtc.compile = dlsym(lib, "nvrtcCompileProgram");
  *(void **)&rtc.log_size = dlsym(lib, "nvrtcGetProgramLogSize");
  *(void **)&rtc.log = dlsym(lib, "nvrtcGetProgramLog");
  *(void **)&rtc.cubin_size = dlsym(lib, "nvrtcGetCUBINSize");
  *(void **)&rtc.cubin = dlsym(lib, "nvrtcGetCUBIN");
  *(void **)&rtc.destroy = dlsym(lib, "nvrtcDestroyProgram");
  rtc.ok = rtc.version && rtc.create && rtc.compile && rtc.log_size && rtc.log &&
           rtc.cubin_size && rtc.cubin && rtc.destroy;
  return rtc.ok;
}

// The cache key's NVRTC version: GDPA_NVRTC_VERSION (e.g. "13.0") when NVRTC is absent.
static void nvrtc_version(int *major, int *minor) {
  if (nvrtc_open()) {
    rtc.version(major, minor);
    return;
  }
  *major = 13, *minor = 0;
}

void *gpu_compile(const char *src, const char *arch, const char *cache_dir, size_t *size) {
  int major = 0, minor = 0;
  nvrtc_version(&major, &minor);
  uint64_t h = fnv1a(1469598103934665603ull, src, strlen(src));
  h = fnv1a(h, arch, strlen(arch));
  h = fnv1a(h, &major, sizeof major);
  h = fnv1a(h, &minor, sizeof minor);
  char path[512];
  if (cache_dir) {
    mkdir(cache_dir, 0755);
    snprintf(path, sizeof path, "%s/%016llx.cubin", cache_dir, (unsigned long long)h);
    void *cached = read_file(path, size);
    if (cached) return cached;
  }
  if (!nvrtc_open()) {
    fprintf(stderr, "gpu: no NVRTC (libnvrtc.so.13) and no cached cubin\n");
    return NULL;
  }
  nvrtcProgram prog;
  if (rtc.create(&prog, src, "gdpa.cu", 0, NULL, NULL) != NVRTC_SUCCESS) return NULL;
  char arch_opt[64];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {arch_opt, "-std=c++17", "-default-device"};
  nvrtcResult r = rtc.compile(prog, 3, opts);
  size_t log_size = 0;
  rtc.log_size(prog, &log_size);
  if (r != NVRTC_SUCCESS || log_size > 1) {
    char *log = malloc(log_size + 1);
    rtc.log(prog, log);
    if (r != NVRTC_SUCCESS || strstr(log, "warning")) fprintf(stderr, "nvrtc (%s):\n%s\n", arch, log);
    free(log);
  }
  if (r != NVRTC_SUCCESS) {
    rtc.destroy(&prog);
    return NULL;
  }
  rtc.cubin_size(prog, size);
  void *cubin = malloc(*size);
  rtc.cubin(prog, cubin);
  rtc.destroy(&prog);
  if (cache_dir) {  // atomic: write a temporary, then rename
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (f) {
      bool ok = fwrite(cubin, 1, *size, f) == *size;
      ok = fclose(f) == 0 && ok;
      if (ok) rename(tmp, path);
      else remove(tmp);
    }
  }
  return cubin;
}

void *gpu_load_module(const void *cubin) {
  void *m;
  CU(cu.module_load_data(&m, cubin));
  return m;
}

void *gpu_function(void *module, const char *name) {
  void *f;
  CU(cu.module_get_function(&f, module, name));
  return f;
}

GpuPtr gpu_alloc(size_t bytes) {
  GpuPtr p = 0;
  CU(cu.mem_alloc(&p, bytes ? bytes : 16));
  return p;
}
void gpu_free(GpuPtr p) {
  if (p) CU(cu.mem_free(p));
}
void gpu_upload(GpuPtr dst, const void *src, size_t bytes) {
  if (bytes) CU(cu.htod(dst, src, bytes));
}
void gpu_download(void *dst, GpuPtr src, size_t bytes) {
  if (bytes) CU(cu.dtoh(dst, src, bytes));
}
void gpu_memset0(GpuPtr dst, size_t bytes) {
  if (bytes) CU(cu.memset_d8(dst, 0, bytes));
}
void gpu_sync(void) { CU(cu.ctx_sync()); }

void gpu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem, void **args) {
  if (grid == 0) return;
  if (smem > 48 * 1024) CU(cu.func_set_attribute(fn, 8, (int)smem));  // max dynamic smem
  CU(cu.launch(fn, grid, 1, 1, threads, 1, 1, smem, NULL, args, NULL));
}

double gpu_time_ms(void (*body)(void *), void *ctx, int reps) {
  void *start, *stop;
  CU(cu.event_create(&start, 0));
  CU(cu.event_create(&stop, 0));
  CU(cu.event_record(start, NULL));
  for (int i = 0; i < reps; i++) body(ctx);
  CU(cu.event_record(stop, NULL));
  CU(cu.event_sync(stop));
  float ms = 0;
  CU(cu.event_elapsed(&ms, start, stop));
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
    bt->d_offsets[j] = gpu_alloc((size_t)(B + 1) * sizeof(int64_t));
    gpu_upload(bt->d_offsets[j], bt->offsets[j], (size_t)(B + 1) * sizeof(int64_t));
  }
  bt->tensor = calloc((size_t)ir->ntensors, sizeof *bt->tensor);
  bt->tensor_bytes = calloc((size_t)ir->ntensors, sizeof *bt->tensor_bytes);
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *x = &ir->tensors[t];
    int64_t width = x->layout == LAYOUT_FIXED ? x->fixed[1] : x->width;
    bt->tensor_bytes[t] = (size_t)(gdpa_tensor_rows(bt, t) * width) * dtype_bytes(x->dtype);
    bt->tensor[t] = gpu_alloc(bt->tensor_bytes[t]);
  }
  for (int i = 0; i < e->ntiles; i++) {
    const TileList *tl = &e->tiles[i];
    int32_t *tiles = NULL;
    bt->ntiles[i] = gpu_tiles_build(tl, B, tl->q_jag >= 0 ? bt->offsets[tl->q_jag] : NULL,
                                    tl->kv_jag >= 0 ? bt->offsets[tl->kv_jag] : NULL,
                                    gpu_num_sms(), &tiles);
    size_t bytes = (size_t)bt->ntiles[i] * GPU_TILE_INTS * sizeof(int32_t);
    bt->d_tiles[i] = gpu_alloc(bytes);
    gpu_upload(bt->d_tiles[i], tiles, bytes);
    free(tiles);
  }
}

void gdpa_batch_free(GdpaBatch *bt) {
  for (int j = 0; j < 4; j++) {
    free(bt->offsets[j]);
    gpu_free(bt->d_offsets[j]);
  }
  for (int t = 0; t < bt->e->ir.ntensors; t++) gpu_free(bt->tensor[t]);
  for (int i = 0; i < bt->e->ntiles; i++) gpu_free(bt->d_tiles[i]);
  for (int i = 0; i < bt->nws; i++) gpu_free(bt->ws[i]);
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
  bt->ws[bt->nws] = gpu_alloc(bytes);
  gpu_memset0(bt->ws[bt->nws], bytes);
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
    gpu_launch(gpu_function(bt->module, l->kernel), grid, (unsigned)l->threads,
               (unsigned)l->smem, args);
  }
}
