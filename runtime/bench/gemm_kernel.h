// gemm_kernel.h: the host side of the generated bf16 GEMM of kernels/gemm.cuh: which
// instantiation a product needs (GemmKernelConfig), its extern "C" names, the NVRTC source that
// instantiates a set of them, the launch geometry (tile grid, split-K, shared memory) and the
// launch itself (the tile kernel, then split-K's reduction when there is one). Used by
// `gemc bench gemm` (gemm_bench.h), tests/gpu/test_gemm.c and tests/unit/test_gemm_kernel.c;
// the training plans still use cuBLASLt (codegen/ops/lower_gemm.c).
// defines: GemmKernelConfig, GemmGeometry, gemm_kernel_*
#ifndef GEMC_GEMM_KERNEL_H
#define GEMC_GEMM_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "ir.h"
#include "strbuf.h"

enum { GEMM_KERNEL_THREADS = 256, GEMM_KERNEL_BK = 32, GEMM_KERNEL_STAGES = 4 };

// One instantiation. C[m, n] = act(op(A) · op(B) + bias), A and B bf16.
typedef struct GemmKernelConfig {
  int tile_m, tile_n;  // 128x128 or 128x256
  bool trans_a;        // A stored [k, m] (else [m, k])
  bool trans_b;        // B stored [n, k] (else [k, n])
  bool aligned;        // 16-byte rows: see gemm_kernel_aligned
  Act act;             // ACT_NONE, ACT_RELU, ACT_GELU (exact, erf) or ACT_SILU
  DType out;           // DT_BF16 or DT_F32; the bias, when there is one, is fp32
} GemmKernelConfig;

// True when the config names an instantiation gemm.cuh has (tile shape, act, output type);
// otherwise false, with the reason in err.
bool gemm_kernel_valid(const GemmKernelConfig *c, char *err, size_t err_size);

// Whether the 16-byte (cp.async) path fits the product: every dimension contiguous in memory
// (k of A unless trans_a, m of A with trans_a, n of B unless trans_b, k of B with trans_b, n of
// C) is a multiple of 8. Device pointers from cuMemAlloc are 256-byte aligned.
bool gemm_kernel_aligned(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b);

// "gemm_128x256_nt_gelu_bf16_a8" (a8: aligned, a1: element path); the split-K pass is that name
// with "_reduce" appended.
void gemm_kernel_name(const GemmKernelConfig *c, char *out, size_t size);
// Short text for tables: "128x256".
void gemm_kernel_tile_text(const GemmKernelConfig *c, char *out, size_t size);

// Appends kernels/gemm.cuh and one GEMM_INSTANTIATE per config (duplicates once) to src.
void gemm_kernel_source(const GemmKernelConfig *configs, int n, StrBuf *src);

// How a product of one config is launched.
typedef struct GemmGeometry {
  unsigned grid;           // tiles_m * tiles_n * splits blocks of GEMM_KERNEL_THREADS
  unsigned smem;           // dynamic shared memory bytes of the tile kernel
  int splits;              // split-K factor (1: the tile kernel writes C itself)
  unsigned reduce_grid;    // blocks of 256 threads of the reduction (splits > 1)
  size_t workspace_bytes;  // fp32 [splits][m][n] (0 when splits == 1)
} GemmGeometry;

// splits 0: chosen here. When the output tiles do not fill num_sms SMs, k is split so that they
// do, keeping at least 4 k-steps (128) per split and at most 32 splits. False (with err) when
// a size is negative or too large for the grid.
bool gemm_kernel_geometry(const GemmKernelConfig *c, int64_t m, int64_t n, int64_t k, int num_sms,
                          int splits, GemmGeometry *g, char *err, size_t err_size);

// Enqueues the product on `stream`: the tile kernel `fn` (and `reduce` when g->splits > 1,
// with `workspace` of g->workspace_bytes). bias 0: none. m == 0 or n == 0: nothing to do.
// Sets the function's dynamic shared memory limit when it needs more than 48 KiB. False with
// the CUDA error in err.
bool gemm_kernel_launch(CUfunction fn, CUfunction reduce, const GemmGeometry *g, CUdeviceptr c,
                        CUdeviceptr workspace, CUdeviceptr a, CUdeviceptr b, CUdeviceptr bias,
                        int64_t m, int64_t n, int64_t k, CUstream stream, char *err,
                        size_t err_size);

#endif
