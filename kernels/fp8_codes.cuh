// fp8_codes.cuh: an fp8 GEMM operand as cuBLASLt's FP8 kernels read it (codegen/ops/lower_gemm.c):
// E4M3 codes of x / scale, K-major, the reduction zero-padded to a multiple of 16, and the
// scale itself (amax / 448, 1 for an all-zero tensor: the CPU executor's fp8_quantize) written
// once for the GEMM's scale pointer. amax_bits holds the bits of the tensor's amax (the
// generated amax kernel, an integer atomicMax). Needs the prelude (e4m3_bits, load_*).
// defines: fp8_scale, fp8_codes_rows, fp8_codes_transposed

__device__ __forceinline__ float fp8_value(const float *p, i64 i) { return load_f32(p, i); }
__device__ __forceinline__ float fp8_value(const bf16_t *p, i64 i) { return load_bf16(p, i); }
__device__ __forceinline__ float fp8_value(const fp16_t *p, i64 i) { return load_fp16(p, i); }

// The scale of amax_bits' tensor; block 0's thread 0 also stores it at scale_out.
__device__ __forceinline__ float fp8_scale(const unsigned *__restrict__ amax_bits,
                                           float *__restrict__ scale_out) {
  float scale = __uint_as_float(amax_bits[0]) / 448.0f;
  if (!(scale > 0.0f)) scale = 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  return scale;
}

// x is [rows, K] (K-major already): out is [rows, KP] codes, a thread per 4 of them (one
// 32-bit store), one thread for each of rows · KP / 4.
template <int K, int KP, typename T>
__device__ __forceinline__ void fp8_codes_rows(unsigned *__restrict__ out, const T *__restrict__ x,
                                               const unsigned *__restrict__ amax_bits,
                                               float *__restrict__ scale_out, i64 rows) {
  const float scale = fp8_scale(amax_bits, scale_out);
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * (KP / 4)) return;
  const i64 row = i / (KP / 4);
  const int k0 = (int)(i % (KP / 4)) * 4;
  unsigned word = 0;
#pragma unroll
  for (int j = 0; j < 4; j++)
    if (k0 + j < K) word |= (unsigned)e4m3_bits(fp8_value(x, row * K + k0 + j) / scale) << (8 * j);
  out[i] = word;
}

// x is [kdim, R] (the reduction down its rows, kdim symbolic for a weight gradient): out is
// [R, kp] codes, kp = kdim rounded up to 16 (lower_gemm.c's FP8_K_ALIGN). A block of 256
// threads per 32 x 32 tile of x, read along R (coalesced) into shared memory and written along
// K; block b takes the tile (b / R_TILES, b % R_TILES), and those past the padded K return.
template <int R, typename T>
__device__ __forceinline__ void fp8_codes_transposed(unsigned char *__restrict__ out, const T *__restrict__ x,
                                                     const unsigned *__restrict__ amax_bits,
                                                     float *__restrict__ scale_out, i64 kdim) {
  enum { TILE = 32, R_TILES = (R + TILE - 1) / TILE };
  __shared__ unsigned char tile[TILE][TILE + 4];
  const float scale = fp8_scale(amax_bits, scale_out);
  const i64 kp = (kdim + 15) / 16 * 16;
  const i64 k0 = (i64)(blockIdx.x / R_TILES) * TILE;
  const int r0 = (int)(blockIdx.x % R_TILES) * TILE;
  if (k0 >= kp) return;
  const int lane = threadIdx.x % TILE, group = threadIdx.x / TILE;
  for (int kk = group; kk < TILE; kk += 8) {
    const i64 k = k0 + kk;
    const int r = r0 + lane;
    tile[kk][lane] = k < kdim && r < R ? e4m3_bits(fp8_value(x, k * R + r) / scale) : 0;
  }
  __syncthreads();
  for (int rr = group; rr < TILE; rr += 8) {
    const int r = r0 + rr;
    const i64 k = k0 + lane;
    if (r < R && k < kp) out[r * kp + k] = tile[lane][rr];
  }
}
