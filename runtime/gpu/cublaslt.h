// cublaslt.h: dense matrix products through cuBLASLt, loaded lazily (dlopen of
// libcublasLt.so.13; gemc never links it). Row-major, as the plan and the kernels store
// tensors: C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C (+ bias[n]) (then relu), with
// fp32 accumulation for fp32, bf16 and fp16 operands. cuBLASLt is column-major, so the product
// runs as C^T = op(B)^T * op(A)^T on the same memory (the usual transposition trick): no copy.
//
// fp32 operands use CUBLAS_COMPUTE_32F (no TF32), so results match the CPU executor to 1e-4.
// The epilogues used are BIAS and RELU(_BIAS); cuBLASLt's GELU is the tanh form, which is not
// gemc's exact gelu, so other activations are the caller's (a generated kernel). The chosen
// algorithm is cached per shape; a 32 MiB workspace is allocated once, so the products can be
// captured in a CUDA graph.
// defines: Gemm, GemmShape, gemm_open, gemm_close, gemm_run
#ifndef GEMC_CUBLASLT_H
#define GEMC_CUBLASLT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "ir.h"

typedef struct Gemm Gemm;

// Loads libcublasLt.so.13 and creates a handle (the CUDA context must be current). Returns
// NULL with the reason in `err`.
Gemm *gemm_open(char *err, size_t err_size);
void gemm_close(Gemm *g);
// cublasLtGetVersion, e.g. 130000.
size_t gemm_library_version(const Gemm *g);

typedef struct GemmShape {
  int64_t m, n, k;
  bool trans_a;       // A is stored [k, m] (else [m, k])
  bool trans_b;       // B is stored [n, k] (else [k, n])
  DType dtype;        // A and B: DT_F32, DT_BF16 or DT_FP16; DT_FP8: E4M3 codes (below)
  DType c_dtype;      // C: the same, or DT_F32 with 16-bit operands (fp32 gradients)
  float alpha, beta;
  bool has_bias;      // bias[n], of bias_dtype (DT_F32 or c_dtype)
  DType bias_dtype;
  Act act;            // ACT_NONE or ACT_RELU
} GemmShape;

// Enqueues the product on `stream`. m == 0, n == 0 or k == 0 (with beta = 0: C zeroed is the
// caller's job) are no-ops. Fails with a message naming the shape when cuBLASLt has no
// algorithm for it or the call fails.
bool gemm_run(Gemm *g, const GemmShape *s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
              CUdeviceptr bias, CUstream stream, char *err, size_t err_size);
// The same, for DT_FP8 too: A and B hold E4M3 codes and the product is scaled by the floats at
// scale_a and scale_b (device memory, read when the GEMM runs): C = alpha · sa · sb · A · Bᵀ +
// beta · C. cuBLASLt's FP8 kernels need both operands K-major (trans_b and not trans_a), k a
// multiple of 16, an fp32 C with n a multiple of 4, no bias or activation, and 16-byte aligned
// scales; FAST_ACCUM off (cuBLASLt promotes the MMA's narrower sums to fp32 as it goes). Other
// shapes are refused with a message, before the handle or the device is used (a NULL g is
// refused the same way). scale_a and scale_b are ignored for other types.
bool gemm_run_scaled(Gemm *g, const GemmShape *s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                     CUdeviceptr bias, CUdeviceptr scale_a, CUdeviceptr scale_b, CUstream stream,
                     char *err, size_t err_size);

#endif
