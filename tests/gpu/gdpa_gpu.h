// gdpa_gpu.h: a minimal GPU harness for the attention kernels, for the standalone GPU test
// and benchmark: the CUDA driver through dlopen (no libcuda at link time), NVRTC with a cubin
// cache on disk, and a runner that executes a GdpaEmitted's launches the way the runtime's
// plan executor will (tile lists built per batch, workspaces by (tensor, slot)).
// defines: GpuApi, gpu_open, gpu_compile, GdpaBatch, gdpa_batch_*, gdpa_launch_range
#ifndef GEMC_GDPA_GPU_H
#define GEMC_GDPA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gdpa_case.h"

typedef unsigned long long GpuPtr;

// Opens the driver and a context on device 0. Returns false with a message on stderr.
bool gpu_open(void);
int gpu_num_sms(void);
const char *gpu_arch(void);  // "sm_90a" for compute capability 9.0, else "sm_XY"

// Compiles `src` for `arch` with NVRTC, or reads the cubin cached in `cache_dir` under a
// hash of the source, arch and NVRTC version. Returns a malloc'd cubin.
void *gpu_compile(const char *src, const char *arch, const char *cache_dir, size_t *size);

void *gpu_load_module(const void *cubin);  // a CUmodule
void *gpu_function(void *module, const char *name);
GpuPtr gpu_alloc(size_t bytes);
void gpu_free(GpuPtr p);
void gpu_upload(GpuPtr dst, const void *src, size_t bytes);
void gpu_download(void *dst, GpuPtr src, size_t bytes);
void gpu_memset0(GpuPtr dst, size_t bytes);
void gpu_sync(void);
void gpu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem, void **args);
double gpu_time_ms(void (*body)(void *), void *ctx, int reps);  // mean over reps, events

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

// lengths[j][b] for each jagged dim of e->ir. Allocates every tensor (not initialized).
void gdpa_batch_init(GdpaBatch *bt, const GdpaEmitted *e, void *module, int64_t B,
                     int64_t *const *lengths);
void gdpa_batch_free(GdpaBatch *bt);
int64_t gdpa_tensor_rows(const GdpaBatch *bt, int t);
// Runs launches [from, to) of e.
void gdpa_launch_range(GdpaBatch *bt, int from, int to);

#endif
