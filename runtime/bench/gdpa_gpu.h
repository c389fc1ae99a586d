// gdpa_gpu.h: a minimal GPU harness for the attention kernels of one GdpaCase, used by
// `gemc bench gdpa` (gdpa_bench.h) and the standalone GPU test tests/gpu/test_gdpa.c. The
// driver comes from cuda_driver.h (loaded lazily), NVRTC from nvrtc_compile.h with cubins
// cached by jit_cache.h, and a runner executes a GdpaEmitted's launches the way the runtime's
// plan executor does (tile lists built per batch, workspaces by (tensor, slot)). Every function
// that can fail returns false with the reason in `err` (for a failing CUDA call: the call and
// the driver's message); none exits, and the caller decides whether its run can go on.
// defines: GpuPtr, gdpa_gpu_open, gdpa_gpu_compile, gdpa_gpu_name, gdpa_gpu_unload_module,
//          GdpaGpuBody, GdpaBatch, gdpa_batch_*, gdpa_launch_range, GdpaRange, gdpa_run_range
#ifndef GEMC_GDPA_GPU_H
#define GEMC_GDPA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gdpa_case.h"

typedef unsigned long long GpuPtr;

// Loads the driver and makes device 0's primary context current. False with the reason in
// `err` when there is no usable GPU.
bool gdpa_gpu_open(char *err, size_t err_size);
int gdpa_gpu_num_sms(void);
const char *gdpa_gpu_arch(void);  // "sm_90a" for compute capability 9.0, else "sm_XY"
const char *gdpa_gpu_name(void);  // the device's name: "NVIDIA H200"

// Compiles `src` for `arch` with NVRTC, or reads the cubin cached in `cache_dir` (NULL: no
// cache) under a key of the source, arch and NVRTC version. Returns a malloc'd cubin, or NULL
// with NVRTC's error in `err`. A cubin that cannot be cached is a warning on stderr.
void *gdpa_gpu_compile(const char *src, const char *arch, const char *cache_dir, size_t *size,
                       char *err, size_t err_size);

bool gdpa_gpu_load_module(const void *cubin, void **module, char *err, size_t err_size);
bool gdpa_gpu_unload_module(void *module, char *err, size_t err_size);  // NULL: nothing to do
bool gdpa_gpu_function(void *module, const char *name, void **fn, char *err, size_t err_size);
bool gdpa_gpu_alloc(GpuPtr *p, size_t bytes, char *err, size_t err_size);
bool gdpa_gpu_free(GpuPtr p, char *err, size_t err_size);
bool gdpa_gpu_upload(GpuPtr dst, const void *src, size_t bytes, char *err, size_t err_size);
bool gdpa_gpu_download(void *dst, GpuPtr src, size_t bytes, char *err, size_t err_size);
bool gdpa_gpu_memset0(GpuPtr dst, size_t bytes, char *err, size_t err_size);
bool gdpa_gpu_sync(char *err, size_t err_size);
bool gdpa_gpu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem, void **args,
                     char *err, size_t err_size);
// What gdpa_gpu_time_ms times: false (with err) when a call in it failed.
typedef bool (*GdpaGpuBody)(void *ctx, char *err, size_t err_size);
// The mean milliseconds of body(ctx) over reps calls, timed with events, into *ms.
bool gdpa_gpu_time_ms(GdpaGpuBody body, void *ctx, int reps, double *ms, char *err,
                      size_t err_size);

// One batch bound to one case: host offsets, device tensors, tile lists, workspaces.
enum { GDPA_MAX_WORKSPACES = 8 };
typedef struct GdpaBatch {
  const GdpaEmitted *e;
  void *module;
  int64_t B;
  int64_t *offsets[4];       // per jagged dim, host [B+1]
  GpuPtr d_offsets[4];
  int64_t totals[4];
  GpuPtr *tensor;            // [ir.ntensors], 0 when not allocated
  size_t *tensor_bytes;
  GpuPtr d_tiles[8];
  int64_t ntiles[8];
  int ws_tensor[GDPA_MAX_WORKSPACES], ws_slot[GDPA_MAX_WORKSPACES], nws;
  GpuPtr ws[GDPA_MAX_WORKSPACES];
} GdpaBatch;

// lengths[j][b] for each jagged dim of e->ir. Allocates every tensor (not initialized); on
// failure frees what it allocated.
bool gdpa_batch_init(GdpaBatch *bt, const GdpaEmitted *e, void *module, int64_t B,
                     int64_t *const *lengths, char *err, size_t err_size);
// Frees everything, even past a failing call; false with the first failure in err.
bool gdpa_batch_free(GdpaBatch *bt, char *err, size_t err_size);
int64_t gdpa_tensor_rows(const GdpaBatch *bt, int t);
// Runs launches [from, to) of e.
bool gdpa_launch_range(GdpaBatch *bt, int from, int to, char *err, size_t err_size);
// Launches [from, to) of a batch as a GdpaGpuBody for gdpa_gpu_time_ms (ctx: a GdpaRange).
typedef struct GdpaRange {
  GdpaBatch *bt;
  int from, to;
} GdpaRange;
bool gdpa_run_range(void *range, char *err, size_t err_size);

#endif
