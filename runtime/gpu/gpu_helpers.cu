// gpu_helpers.cu: the runtime's own kernels (not generated per model): a GEMM's fp32 bias
// rounded to the 16-bit type of its output, because cuBLASLt's bias epilogue wants the bias in
// the output's type (round to nearest even, NaN kept quiet, as numerics.h does); and the
// divergence guard's count of the NaN and infinite values of a buffer (gpu_exec_check_finite).
extern "C" __global__ void __launch_bounds__(256)
gemc_round_bias_bf16(unsigned short *__restrict__ out, const float *__restrict__ in, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned int bits = __float_as_uint(in[i]);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    out[i] = (unsigned short)((bits >> 16) | 0x40u);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  out[i] = (unsigned short)(bits >> 16);
}

extern "C" __global__ void __launch_bounds__(256)
gemc_round_bias_fp16(unsigned short *__restrict__ out, const float *__restrict__ in, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(in[i]));
  out[i] = h;
}

// Counts the NaN and infinite values among n elements of `data` (kind 0: fp32, 1: bf16, 2:
// fp16) into counts[0] (NaN) and counts[1] (infinities), which the caller zeroed. A grid-stride
// loop, a warp reduction, one atomic pair per warp that found any.
extern "C" __global__ void __launch_bounds__(256)
gemc_count_nonfinite(const void *__restrict__ data, long long n, int kind,
                     unsigned long long *__restrict__ counts) {
  unsigned long long nan = 0, inf = 0;
  unsigned int exp_mask = kind == 0 ? 0x7f800000u : kind == 1 ? 0x7f80u : 0x7c00u;
  unsigned int man_mask = kind == 0 ? 0x007fffffu : kind == 1 ? 0x007fu : 0x03ffu;
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    unsigned int bits = kind == 0 ? ((const unsigned int *)data)[i]
                                  : (unsigned int)((const unsigned short *)data)[i];
    if ((bits & exp_mask) == exp_mask) {
      if (bits & man_mask) nan++;
      else inf++;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    nan += __shfl_down_sync(0xffffffffu, nan, off);
    inf += __shfl_down_sync(0xffffffffu, inf, off);
  }
  if ((threadIdx.x & 31) == 0 && (nan | inf)) {
    atomicAdd(&counts[0], nan);
    atomicAdd(&counts[1], inf);
  }
}
