// nvrtc_compile.c: NVRTC through dlopen ("libnvrtc.so.13", then "libnvrtc.so", then the CUDA
// toolkit's lib64 directory). The functions are looked up by name once; nothing here links
// against CUDA at build time.
#include "nvrtc_compile.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
  bool tried, loaded;
  char err[256];
  const char *(*get_error_string)(nvrtcResult);
  nvrtcResult (*version)(int *, int *);
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                        const char *const *);
  nvrtcResult (*destroy)(nvrtcProgram *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*ptx_size)(nvrtcProgram, size_t *);
  nvrtcResult (*ptx)(nvrtcProgram, char *);
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
  nvrtcResult (*cubin)(nvrtcProgram, char *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *);
  nvrtcResult (*log)(nvrtcProgram, char *);
} nv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void *sym(void *lib, const char *name, bool *ok) {
  void *p = dlsym(lib, name);
  if (!p) *ok = false;
  return p;
}

static void load(void) {
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  nv.tried = true;
  if (!lib) {
    snprintf(nv.err, sizeof nv.err, "cannot load libnvrtc (libnvrtc.so.13 or libnvrtc.so): %s", dlerror());
    return;
  }
  bool ok = true;
  *(void **)&nv.get_error_string = sym(lib, "nvrtcGetErrorString", &ok);
  *(void **)&nv.version = sym(lib, "nvrtcVersion", &ok);
  *(void **)&nv.create = sym(lib, "nvrtcCreateProgram", &ok);
  *(void **)&nv.destroy = sym(lib, "nvrtcDestroyProgram", &ok);
  *(void **)&nv.compile = sym(lib, "nvrtcCompileProgram", &ok);
  *(void **)&nv.ptx_size = sym(lib, "nvrtcGetPTXSize", &ok);
  *(void **)&nv.ptx = sym(lib, "nvrtcGetPTX", &ok);
  *(void **)&nv.cubin_size = sym(lib, "nvrtcGetCUBINSize", &ok);
  *(void **)&nv.cubin = sym(lib, "nvrtcGetCUBIN", &ok);
  *(void **)&nv.log_size = sym(lib, "nvrtcGetProgramLogSize", &ok);
  *(void **)&nv.log = sym(lib, "nvrtcGetProgramLog", &ok);
  if (!ok) {
    snprintf(nv.err, sizeof nv.err, "libnvrtc lacks a function gemc needs: %s", dlerror());
    return;
  }
  nv.loaded = true;
}

bool nvrtc_available(char *err, size_t err_size) {
  pthread_once(&load_once, load);
  if (!nv.loaded && err) snprintf(err, err_size, "%s", nv.err);
  return nv.loaded;
}

int nvrtc_version(void) {
  if (!nvrtc_available(NULL, 0)) return 0;
  int major = 0, minor = 0;
  if (nv.version(&major, &minor) != 0) return 0;
  return major * 1000 + minor * 10;
}

bool nvrtc_compile(const char *source, const char *name, const char *arch, NvrtcOutput kind,
                   char **out, size_t *size, char **log, char *err, size_t err_size) {
  *out = NULL;
  *size = 0;
  if (log) *log = NULL;
  if (!nvrtc_available(err, err_size)) return false;
  if (strcmp(arch, "sm_90a") != 0 && strcmp(arch, "sm_100a") != 0) {
    snprintf(err, err_size, "unknown arch '%s'; expected sm_90a or sm_100a", arch);
    return false;
  }
  char arch_opt[64];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {arch_opt, "-std=c++17", "-default-device", "-lineinfo"};
  int nopts = (int)(sizeof opts / sizeof *opts);
  nvrtcProgram prog = NULL;
  nvrtcResult rc = nv.create(&prog, source, name, 0, NULL, NULL);
  if (rc != 0) {
    snprintf(err, err_size, "nvrtcCreateProgram: %s", nv.get_error_string(rc));
    return false;
  }
  rc = nv.compile(prog, nopts, opts);
  size_t log_size = 0;
  char *text = NULL;
  if (nv.log_size(prog, &log_size) == 0 && log_size > 1) {
    text = malloc(log_size);
    if (text && nv.log(prog, text) != 0) text[0] = '\0';
  }
  if (rc != 0) {
    snprintf(err, err_size, "NVRTC could not compile %s for %s: %s\n%.1500s", name, arch,
             nv.get_error_string(rc), text ? text : "");
    if (log) *log = text; else free(text);
    nv.destroy(&prog);
    return false;
  }
  if (log) *log = text; else free(text);
  size_t n = 0;
  rc = kind == NVRTC_PTX ? nv.ptx_size(prog, &n) : nv.cubin_size(prog, &n);
  char *buf = rc == 0 ? malloc(n + 1) : NULL;
  if (buf) rc = kind == NVRTC_PTX ? nv.ptx(prog, buf) : nv.cubin(prog, buf);
  nv.destroy(&prog);
  if (!buf || rc != 0) {
    free(buf);
    snprintf(err, err_size, "NVRTC: cannot fetch the %s of %s", kind == NVRTC_PTX ? "PTX" : "cubin", name);
    return false;
  }
  buf[n] = '\0';
  *out = buf;
  *size = kind == NVRTC_PTX ? strlen(buf) : n;
  return true;
}

bool nvrtc_compile_unit(void *ctx, const char *source, const char *name, const char *arch,
                        const char *const *options, int noptions, void **image, size_t *size,
                        char *log, size_t log_size) {
  (void)ctx;
  (void)options;
  (void)noptions;
  char *out = NULL;
  if (!nvrtc_compile(source, name, arch, NVRTC_CUBIN, &out, size, NULL, log, log_size))
    return false;
  *image = out;
  return true;
}
