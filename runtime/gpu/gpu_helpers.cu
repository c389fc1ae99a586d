// gpu_helpers.cu: the runtime's own two kernels (not generated per model): a GEMM's fp32 bias
// rounded to the 16-bit type of its output, because cuBLASLt's bias epilogue wants the bias in
// the output's type. Round to nearest even, NaN kept quiet, as numerics.h does.
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
