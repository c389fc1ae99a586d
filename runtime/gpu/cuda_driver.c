// cuda_driver.c: dlopens libcuda.so.1 on first use and resolves the driver entry points of
// cuda_driver.h; checks results with a message naming the call and the place; opens a device's
// primary context. No GPU, no driver or GEMC_NO_CUDA=1 are clean failures with a reason.
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CudaDriver g_driver;
static bool g_loaded;
static char g_load_error[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static _Thread_local char t_error[1024];
static _Thread_local CUresult t_result;

bool cuda_check(CUresult r, const char *call, const char *file, int line) {
  if (r == CU_SUCCESS) return true;
  const char *name = "?", *text = "?";
  if (g_loaded) {
    if (g_driver.cuGetErrorName(r, &name) != CU_SUCCESS || !name) name = "unknown error";
    if (g_driver.cuGetErrorString(r, &text) != CU_SUCCESS || !text) text = "no description";
  }
  t_result = r;
  snprintf(t_error, sizeof t_error, "%s failed at %s:%d: %s (%d: %s)", call, file, line, name,
           (int)r, text);
  return false;
}

const char *cuda_last_error(void) { return t_error; }
CUresult cuda_last_result(void) { return t_result; }

void cuda_error_prefix(const char *fmt, ...) {
  char head[512], old[sizeof t_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  snprintf(old, sizeof old, "%s", t_error);
  snprintf(t_error, sizeof t_error, "%.500s: %.500s", head, old);
}

// Resolves the first of the names that the library has.
static bool resolve(void *lib, void **slot, const char *name, const char *alt) {
  *slot = dlsym(lib, name);
  if (!*slot && alt) *slot = dlsym(lib, alt);
  if (*slot) return true;
  snprintf(g_load_error, sizeof g_load_error, "libcuda.so.1 has no entry point %s", name);
  return false;
}

#define RESOLVE(field, name, alt) \
  ok = ok && resolve(lib, (void **)&d->field, name, alt)

static bool resolve_all(CudaDriver *d, void *lib) {
  bool ok = true;
  RESOLVE(cuInit, "cuInit", NULL);
  RESOLVE(cuDriverGetVersion, "cuDriverGetVersion", NULL);
  RESOLVE(cuGetErrorName, "cuGetErrorName", NULL);
  RESOLVE(cuGetErrorString, "cuGetErrorString", NULL);
  RESOLVE(cuDeviceGetCount, "cuDeviceGetCount", NULL);
  RESOLVE(cuDeviceGet, "cuDeviceGet", NULL);
  RESOLVE(cuDeviceGetName, "cuDeviceGetName", NULL);
  RESOLVE(cuDeviceGetAttribute, "cuDeviceGetAttribute", NULL);
  RESOLVE(cuDeviceTotalMem, "cuDeviceTotalMem_v2", "cuDeviceTotalMem");
  RESOLVE(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
  RESOLVE(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
  RESOLVE(cuCtxSetCurrent, "cuCtxSetCurrent", NULL);
  RESOLVE(cuCtxSynchronize, "cuCtxSynchronize", NULL);
  RESOLVE(cuMemGetInfo, "cuMemGetInfo_v2", "cuMemGetInfo");
  RESOLVE(cuMemAlloc, "cuMemAlloc_v2", "cuMemAlloc");
  RESOLVE(cuMemFree, "cuMemFree_v2", "cuMemFree");
  RESOLVE(cuMemAllocHost, "cuMemAllocHost_v2", "cuMemAllocHost");
  RESOLVE(cuMemFreeHost, "cuMemFreeHost", NULL);
  RESOLVE(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync");
  RESOLVE(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync");
  RESOLVE(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync");
  RESOLVE(cuMemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
  RESOLVE(cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
  RESOLVE(cuMemsetD8Async, "cuMemsetD8Async", NULL);
  RESOLVE(cuModuleLoadData, "cuModuleLoadData", NULL);
  RESOLVE(cuModuleUnload, "cuModuleUnload", NULL);
  RESOLVE(cuModuleGetFunction, "cuModuleGetFunction", NULL);
  RESOLVE(cuFuncSetAttribute, "cuFuncSetAttribute", NULL);
  RESOLVE(cuLaunchKernel, "cuLaunchKernel", NULL);
  RESOLVE(cuStreamCreate, "cuStreamCreate", NULL);
  RESOLVE(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
  RESOLVE(cuStreamSynchronize, "cuStreamSynchronize", NULL);
  RESOLVE(cuStreamWaitEvent, "cuStreamWaitEvent", NULL);
  d->cuStreamWaitValue32 = (CUresult(*)(CUstream, CUdeviceptr, unsigned, unsigned))dlsym(
      lib, "cuStreamWaitValue32_v2");
  if (!d->cuStreamWaitValue32)
    d->cuStreamWaitValue32 = (CUresult(*)(CUstream, CUdeviceptr, unsigned, unsigned))dlsym(
        lib, "cuStreamWaitValue32");
  RESOLVE(cuEventCreate, "cuEventCreate", NULL);
  RESOLVE(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
  RESOLVE(cuEventRecord, "cuEventRecord", NULL);
  // Optional (CUDA 11.1 and later): only `gemc train --profile` needs it.
  d->cuEventRecordWithFlags = (CUresult(*)(CUevent, CUstream, unsigned))dlsym(lib, "cuEventRecordWithFlags");
  RESOLVE(cuEventSynchronize, "cuEventSynchronize", NULL);
  RESOLVE(cuEventQuery, "cuEventQuery", NULL);
  RESOLVE(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime");
  RESOLVE(cuStreamBeginCapture, "cuStreamBeginCapture_v2", "cuStreamBeginCapture");
  RESOLVE(cuStreamEndCapture, "cuStreamEndCapture", NULL);
  RESOLVE(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", NULL);
  RESOLVE(cuGraphLaunch, "cuGraphLaunch", NULL);
  RESOLVE(cuGraphExecDestroy, "cuGraphExecDestroy", NULL);
  RESOLVE(cuGraphDestroy, "cuGraphDestroy", NULL);
  RESOLVE(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled", NULL);
  return ok;
}

static void load_once(void) {
  const char *off = getenv("GEMC_NO_CUDA");
  if (off && *off && strcmp(off, "0") != 0) {
    snprintf(g_load_error, sizeof g_load_error, "GEMC_NO_CUDA is set");
    return;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(g_load_error, sizeof g_load_error, "no CUDA driver: cannot load libcuda.so.1 (%s)",
             e ? e : "not found");
    return;
  }
  CudaDriver d = {.lib = lib};
  if (!resolve_all(&d, lib)) {
    dlclose(lib);
    return;
  }
  CUresult r = d.cuInit(0);
  if (r != CU_SUCCESS) {
    const char *name = "?";
    if (d.cuGetErrorName(r, &name) != CU_SUCCESS || !name) name = "unknown error";
    snprintf(g_load_error, sizeof g_load_error, "cuInit failed: %s (%d)%s", name, (int)r,
             r == 100 ? ": no CUDA-capable device" : "");
    dlclose(lib);
    return;
  }
  if (d.cuDriverGetVersion(&d.version) != CU_SUCCESS) d.version = 0;
  g_driver = d;
  g_loaded = true;
}

bool cuda_driver_load(char *err, size_t err_size) {
  pthread_once(&g_once, load_once);
  if (!g_loaded && err && err_size) snprintf(err, err_size, "%s", g_load_error);
  return g_loaded;
}

const CudaDriver *cuda_driver(void) { return g_loaded ? &g_driver : NULL; }

static void arch_name(int major, int minor, char *out, size_t size) {
  // The arch-specific ("a") targets gemc generates for: wgmma on 9.0, tcgen05 on 10.0.
  if ((major == 9 && minor == 0) || (major == 10 && minor == 0))
    snprintf(out, size, "sm_%d%da", major, minor);
  else
    snprintf(out, size, "sm_%d%d", major, minor);
}

bool cuda_context_open(CudaContext *c, int ordinal, char *err, size_t err_size) {
  memset(c, 0, sizeof *c);
  if (!cuda_driver_load(err, err_size)) return false;
  const CudaDriver *d = &g_driver;
  if (ordinal < 0) {
    const char *env = getenv("GEMC_DEVICE");
    ordinal = env && *env ? atoi(env) : 0;
  }
  int count = 0;
  if (!CU_CHECK(d->cuDeviceGetCount(&count))) goto fail;
  if (count == 0) {
    snprintf(err, err_size, "the CUDA driver sees no device");
    return false;
  }
  if (ordinal >= count) {
    snprintf(err, err_size, "device %d requested, but the driver sees %d", ordinal, count);
    return false;
  }
  c->ordinal = ordinal;
  if (!CU_CHECK(d->cuDeviceGet(&c->device, ordinal))) goto fail;
  if (!CU_CHECK(d->cuDeviceGetName(c->name, (int)sizeof c->name, c->device))) goto fail;
  if (!CU_CHECK(d->cuDeviceGetAttribute(&c->sm_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                        c->device)) ||
      !CU_CHECK(d->cuDeviceGetAttribute(&c->sm_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                        c->device)) ||
      !CU_CHECK(d->cuDeviceGetAttribute(&c->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                        c->device)) ||
      !CU_CHECK(d->cuDeviceGetAttribute(&c->max_smem_optin,
                                        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                        c->device)) ||
      !CU_CHECK(d->cuDeviceTotalMem(&c->total_mem, c->device)))
    goto fail;
  arch_name(c->sm_major, c->sm_minor, c->arch, sizeof c->arch);

  if (!CU_CHECK(d->cuDevicePrimaryCtxRetain(&c->ctx, c->device))) goto fail;
  if (!CU_CHECK(d->cuCtxSetCurrent(c->ctx))) {
    d->cuDevicePrimaryCtxRelease(c->device);
    c->ctx = NULL;
    goto fail;
  }
  return true;
fail:
  snprintf(err, err_size, "%s", cuda_last_error());
  return false;
}

void cuda_context_close(CudaContext *c) {
  if (!c->ctx || !g_loaded) return;
  g_driver.cuCtxSynchronize();
  g_driver.cuDevicePrimaryCtxRelease(c->device);
  c->ctx = NULL;
}

bool cuda_context_make_current(const CudaContext *c) {
  return g_loaded && CU_CHECK(g_driver.cuCtxSetCurrent(c->ctx));
}

bool cuda_usable(char *err, size_t err_size) {
  static int cached = -1;
  static char cached_err[512];
  if (cached < 0) {
    cached = 0;
    if (cuda_driver_load(cached_err, sizeof cached_err)) {
      int n = 0;
      if (!CU_CHECK(g_driver.cuDeviceGetCount(&n)))
        snprintf(cached_err, sizeof cached_err, "%.500s", cuda_last_error());
      else if (n == 0)
        snprintf(cached_err, sizeof cached_err, "the CUDA driver sees no device");
      else
        cached = 1;
    }
  }
  if (!cached && err && err_size) snprintf(err, err_size, "%s", cached_err);
  return cached == 1;
}
