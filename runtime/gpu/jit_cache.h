// jit_cache.h: compiled kernel images (cubins) cached on disk, and the parallel JIT that fills
// the cache at training start. The compiler itself (NVRTC) is a callback, so the cache works
// and is tested without NVRTC or a GPU.
//
// The key is FNV-1a 64 over the source, the options, the arch, the NVRTC version and the gemc
// version. An entry is one file <dir>/<arch>-<key as 16 hex digits>.cubin: a 40-byte header
// (magic "GEMCJIT1", format version, key, payload size, CRC-32 of the payload, CRC-32 of the
// header) and the image. Writes are atomic (a temporary file in the same directory, fsync,
// rename); a truncated or corrupt entry, or one whose header names another key, reads as a
// miss and is rebuilt. The directory is $GEMC_CACHE_DIR, else ~/.cache/gemc (created).
// docs/gpu.md describes it.
// defines: JitCompileFn, JitUnit, JitStats, jit_cache_*, jit_compile_units, jit_split_source
#ifndef GEMC_JIT_CACHE_H
#define GEMC_JIT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Compiles `source` for `arch` ("sm_90a") with `options`; on success *image is a malloc'd cubin
// of *size bytes. On failure writes the compiler's log (or why) into `log`.
typedef bool (*JitCompileFn)(void *ctx, const char *source, const char *name, const char *arch,
                             const char *const *options, int noptions, void **image,
                             size_t *size, char *log, size_t log_size);

uint64_t jit_cache_key(const char *source, const char *arch, const char *const *options,
                       int noptions, int compiler_version, const char *gemc_version);

// Fills `out` with $GEMC_CACHE_DIR or $HOME/.cache/gemc and creates it (with parents). Returns
// false with a reason when it cannot.
bool jit_cache_dir(char *out, size_t size, char *err, size_t err_size);

// The entry of `key` for `arch`: true with a malloc'd image when it is present and intact.
// False when absent, or (with *corrupt set and a reason in err) truncated, corrupt or for
// another key. err may be NULL.
bool jit_cache_load(const char *dir, const char *arch, uint64_t key, void **image, size_t *size,
                    bool *corrupt, char *err, size_t err_size);
// Writes the entry atomically. False with a reason when the directory is not writable.
bool jit_cache_store(const char *dir, const char *arch, uint64_t key, const void *image,
                     size_t size, char *err, size_t err_size);
// The entry's path (for tests and messages).
void jit_cache_path(const char *dir, const char *arch, uint64_t key, char *out, size_t size);

// One compilation unit: a source to compile for an arch, and its resulting image.
typedef struct JitUnit {
  const char *name;     // for messages: the kernel (or "module")
  const char *source;
  void *image;          // out: malloc'd cubin
  size_t size;
  bool from_cache;      // out
  bool rebuilt;         // out: the cache entry was corrupt and got rebuilt
  double seconds;       // out: time spent on this unit (load or compile)
  char log[2048];       // out: the compiler's log on failure
} JitUnit;

typedef struct JitStats {
  int units, hits, misses, rebuilt;
  double seconds;       // wall time of jit_compile_units
} JitStats;

typedef struct JitRequest {
  const char *arch;
  const char *const *options; int noptions;
  int compiler_version;       // NVRTC major*1000 + minor*10
  const char *gemc_version;
  const char *cache_dir;      // NULL: no cache (always compile)
  JitCompileFn compile; void *compile_ctx;
  int threads;                // 0: min(units, online CPUs, 16)
} JitRequest;

// Loads each unit from the cache or compiles it (and stores it), with up to r->threads threads.
// Fails with the first failing unit's name and log in err; a cache that cannot be written is
// not an error (the image is still returned).
bool jit_compile_units(const JitRequest *r, JitUnit *units, int nunits, JitStats *stats,
                       char *err, size_t err_size);
void jit_units_free(JitUnit *units, int nunits);

// Splits a generated module into per-kernel sources: unit i is the whole module with the
// definitions of every kernel but kernel i left out (a kernel: a line starting with
// `extern "C"` through the '}' closing its body), so the prelude and any helper defined between
// kernels stay in every unit. Returns the count (0 when the source has no kernel) and fills
// *out with malloc'd strings (free each and the array).
int jit_split_source(const char *source, char ***out);

#endif
