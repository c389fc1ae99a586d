// nvrtc_compile.h: compiles CUDA C to PTX or a cubin with NVRTC, loaded lazily (dlopen) so that
// gemc runs on machines without the CUDA toolkit until a compile is asked for.
// defines: NvrtcOutput, nvrtc_available, nvrtc_version, nvrtc_compile, nvrtc_compile_unit
#ifndef GEMC_NVRTC_COMPILE_H
#define GEMC_NVRTC_COMPILE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum NvrtcOutput { NVRTC_PTX, NVRTC_CUBIN } NvrtcOutput;

// True when libnvrtc could be loaded; otherwise writes the reason to `err`.
bool nvrtc_available(char *err, size_t err_size);
// NVRTC's version as major * 1000 + minor * 10 (13.0 -> 13000), 0 when not loadable.
int nvrtc_version(void);
// Compiles `source` (named `name` in messages) for `arch` ("sm_90a", "sm_100a"). On success
// *out (malloc'd, the caller frees) holds the PTX text (NUL-terminated) or the cubin, *size its
// bytes. On failure returns false with the error and the start of NVRTC's log in `err`, and
// the whole log in *log when log is not NULL (malloc'd).
bool nvrtc_compile(const char *source, const char *name, const char *arch, NvrtcOutput kind,
                   char **out, size_t *size, char **log, char *err, size_t err_size);

// nvrtc_compile to a cubin in the shape of a JitCompileFn (jit_cache.h), for jit_compile_units:
// ctx, options and noptions are unused (the options are fixed, and the cache key names them);
// *image is malloc'd; the error goes to `log`.
bool nvrtc_compile_unit(void *ctx, const char *source, const char *name, const char *arch,
                        const char *const *options, int noptions, void **image, size_t *size,
                        char *log, size_t log_size);

#endif
