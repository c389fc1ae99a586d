// cuda_driver.h: the CUDA driver API, loaded lazily. gemc never links libcuda: the first call
// of cuda_driver_load dlopens libcuda.so.1 and resolves the entry points it needs, so a machine
// without a GPU (or without the driver) still runs the compiler, the CPU executor and the tests;
// there cuda_driver_load returns false with a reason, and nothing crashes.
//
// The types are our own minimal mirror of cuda.h (ABI-compatible: opaque handles, int results,
// 64-bit device pointers), so building gemc needs no CUDA headers either. Every call goes
// through CU_CHECK, which records the failing call, its error name and string, and the file and
// line, in a message cuda_last_error returns.
// defines: CudaDriver, cuda_driver_load, cuda_driver, CU_CHECK, CudaContext, cuda_context_*
#ifndef GEMC_CUDA_DRIVER_H
#define GEMC_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;                 // CUDA_SUCCESS == 0
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
// cuda.h's CUtensorMap: 128 opaque bytes, 64-byte aligned, that cuTensorMapEncodeTiled fills
// and a kernel takes by value (a __grid_constant__ parameter) for its TMA copies.
typedef struct CUtensorMap {
  _Alignas(64) uint64_t opaque[16];
} CUtensorMap;

enum {
  CU_SUCCESS = 0,
  CU_ERROR_OUT_OF_MEMORY = 2,
  CU_STREAM_NON_BLOCKING = 1,
  CU_EVENT_DISABLE_TIMING = 2,
  CU_ERROR_NOT_READY = 600,
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_EVENT_RECORD_EXTERNAL = 1,  // under stream capture: an event record node in the graph
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  // cuTensorMapEncodeTiled's enums (cuda.h values)
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
  CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_128B = 3,
  CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2,
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
};

// The entry points gemc uses, resolved by name from libcuda.so.1 (the _v2 names where cuda.h
// maps the plain name to them).
typedef struct CudaDriver {
  void *lib;
  int version;  // cuDriverGetVersion: 13000 for CUDA 13.0
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int *v);
  CUresult (*cuGetErrorName)(CUresult e, const char **s);
  CUresult (*cuGetErrorString)(CUresult e, const char **s);
  CUresult (*cuDeviceGetCount)(int *n);
  CUresult (*cuDeviceGet)(CUdevice *d, int ordinal);
  CUresult (*cuDeviceGetName)(char *name, int len, CUdevice d);
  CUresult (*cuDeviceGetAttribute)(int *v, int attr, CUdevice d);
  CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice d);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *c, CUdevice d);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice d);
  CUresult (*cuCtxSetCurrent)(CUcontext c);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuMemGetInfo)(size_t *free_bytes, size_t *total);
  CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t bytes);
  CUresult (*cuMemFree)(CUdeviceptr p);
  CUresult (*cuMemAllocHost)(void **p, size_t bytes);
  CUresult (*cuMemFreeHost)(void *p);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
  CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
  CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
  CUresult (*cuMemsetD8Async)(CUdeviceptr p, unsigned char v, size_t n, CUstream s);
  CUresult (*cuModuleLoadData)(CUmodule *m, const void *image);
  CUresult (*cuModuleUnload)(CUmodule m);
  CUresult (*cuModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
  CUresult (*cuFuncSetAttribute)(CUfunction f, int attr, int value);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                             void **extra);
  CUresult (*cuStreamCreate)(CUstream *s, unsigned flags);
  CUresult (*cuStreamDestroy)(CUstream s);
  CUresult (*cuStreamSynchronize)(CUstream s);
  CUresult (*cuStreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
  // Optional: the stream waits until the 32-bit word at addr is >= value (flags 0); only the
  // test hook GEMC_TEST_COMM_HANG uses it. NULL: none.
  CUresult (*cuStreamWaitValue32)(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags);
  CUresult (*cuEventCreate)(CUevent *e, unsigned flags);
  CUresult (*cuEventDestroy)(CUevent e);
  CUresult (*cuEventRecord)(CUevent e, CUstream s);
  CUresult (*cuEventRecordWithFlags)(CUevent e, CUstream s, unsigned flags);  // NULL: none
  CUresult (*cuEventSynchronize)(CUevent e);
  CUresult (*cuEventQuery)(CUevent e);  // CU_SUCCESS: done; CUDA_ERROR_NOT_READY: not yet
  CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
  CUresult (*cuStreamBeginCapture)(CUstream s, int mode);
  CUresult (*cuStreamEndCapture)(CUstream s, CUgraph *g);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *e, CUgraph g, unsigned long long flags);
  CUresult (*cuGraphLaunch)(CUgraphExec e, CUstream s);
  CUresult (*cuGraphExecDestroy)(CUgraphExec e);
  CUresult (*cuGraphDestroy)(CUgraph g);
  // Tensor maps for the sm_90a TMA kernels (CUDA 12.0 and later drivers).
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *map, int dtype, unsigned rank, void *addr,
                                     const uint64_t *dims, const uint64_t *strides,
                                     const unsigned *box, const unsigned *elem_strides,
                                     int interleave, int swizzle, int l2_promotion,
                                     int oob_fill);
} CudaDriver;

// Loads the driver once (thread-safe) and calls cuInit(0). Returns false with the reason in
// `err` when there is no libcuda.so.1, an entry point is missing, or cuInit fails (no device,
// driver too old). GEMC_NO_CUDA=1 in the environment makes it fail on purpose (tests).
bool cuda_driver_load(char *err, size_t err_size);
// The loaded driver; NULL before a successful cuda_driver_load.
const CudaDriver *cuda_driver(void);

// "cuMemAlloc(&p, n) failed at runtime/gpu/gpu_exec.c:120: CUDA_ERROR_OUT_OF_MEMORY (out of
// memory)". Records the message (per thread) and returns false when r is not CU_SUCCESS.
bool cuda_check(CUresult r, const char *call, const char *file, int line);
#define CU_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
// The message of the last failing CU_CHECK on this thread ("" when none), and its result.
const char *cuda_last_error(void);
CUresult cuda_last_result(void);
// Adds context ("while launching kernel k grid=..") in front of the last error message.
void cuda_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// One device and its primary context, current on the calling thread.
typedef struct CudaContext {
  CUdevice device;
  CUcontext ctx;
  int ordinal;
  int sm_major, sm_minor, sm_count;
  int max_smem_optin;
  size_t total_mem;
  char name[128];
  char arch[16];  // "sm_90a" for 9.0, "sm_100a" for 10.0, else "sm_XY"
} CudaContext;

// Loads the driver and opens device `ordinal` (0 unless $GEMC_DEVICE says otherwise when
// ordinal < 0). Returns false with a reason when there is no usable GPU.
bool cuda_context_open(CudaContext *c, int ordinal, char *err, size_t err_size);
void cuda_context_close(CudaContext *c);
// Makes c's context current on the calling thread (worker threads).
bool cuda_context_make_current(const CudaContext *c);

// Cheap probe for `--backend auto`: true when the driver loads and sees a device; else the
// reason. Caches its answer.
bool cuda_usable(char *err, size_t err_size);

#endif
