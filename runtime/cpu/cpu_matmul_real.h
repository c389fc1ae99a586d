// cpu_matmul_real.h: the blocked matrix multiply of the CPU executor, written over `real`
// (included by cpu_kernels_f32.c and cpu_kernels_f64.c, which define `real`, K() and EMULATE).
//
//   C[M, N] = (accumulate ? C : 0) + alpha * A[M, K] B[K, N]
//
// A and B are read through strides, so one routine serves x·W, dZ·Wᵀ, Xᵀ·dZ, Q·Kᵀ, P·V and
// their transposes without copies. The loops follow the classic three-level blocking: panels
// of B (KC x NC) and blocks of A (MC x KC) are packed into contiguous buffers, zero-padded to
// the register tile, and a MR x NR micro-kernel with constant trip counts (which the compiler
// keeps in registers and vectorizes) runs over them. Sums run in `real`, in a fixed order, so
// the result is deterministic.

// The blocking sizes (MM_MR, MM_MC, MM_KC, MM_NC) are in cpu_exec_internal.h, which sizes the
// packing buffers from them; the tile is 64 bytes wide: 16 floats or 8 doubles.
#define MM_NR ((int)(64 / sizeof(real)))

// The register tile, for the baseline instruction set and, on x86-64, for AVX2 with FMA
// (picked at run time when the CPU has them: CpuExec.wide_kernels).
typedef void (*K(MmTile))(int64_t kc, const real *restrict a, const real *restrict b,
                          real *restrict c, int64_t ldc, int64_t m, int64_t n, real alpha);
#define MM_TILE_FN K(mm_tile)
#define MM_TILE_ATTR
#include "cpu_mm_tile_real.h"
#if CPU_WIDE_KERNELS
#define MM_TILE_FN K(mm_tile_avx2)
#define MM_TILE_ATTR __attribute__((target("avx2,fma")))
#include "cpu_mm_tile_real.h"
#endif

// Packs rows [0, mc) x cols [0, kc) of A (element (i, p) at a[i*rs + p*cs]) into MR-row
// panels, each stored k-major: panel[p*MR + i]. Rows past mc are zero.
static void K(mm_pack_a)(real *restrict dst, const real *a, int64_t rs, int64_t cs, int64_t mc,
                         int64_t kc) {
  for (int64_t i0 = 0; i0 < mc; i0 += MM_MR) {
    int64_t m = mc - i0 < MM_MR ? mc - i0 : MM_MR;
    for (int64_t p = 0; p < kc; p++) {
      for (int64_t i = 0; i < m; i++) dst[p * MM_MR + i] = a[(i0 + i) * rs + p * cs];
      for (int64_t i = m; i < MM_MR; i++) dst[p * MM_MR + i] = 0;
    }
    dst += kc * MM_MR;
  }
}

// Packs rows [0, kc) x cols [0, nc) of B (element (p, j) at b[p*rs + j*cs]) into NR-column
// panels, each stored k-major: panel[p*NR + j]. Columns past nc are zero.
static void K(mm_pack_b)(real *restrict dst, const real *b, int64_t rs, int64_t cs, int64_t kc,
                         int64_t nc) {
  for (int64_t j0 = 0; j0 < nc; j0 += MM_NR) {
    int64_t n = nc - j0 < MM_NR ? nc - j0 : MM_NR;
    for (int64_t p = 0; p < kc; p++) {
      real *row = dst + p * MM_NR;
      const real *src = b + p * rs + j0 * cs;
      if (cs == 1 && n == MM_NR) {
        for (int j = 0; j < MM_NR; j++) row[j] = src[j];
      } else {
        for (int64_t j = 0; j < n; j++) row[j] = src[j * cs];
        for (int64_t j = n; j < MM_NR; j++) row[j] = 0;
      }
    }
    dst += kc * MM_NR;
  }
}

// C (row stride ldc) = (accumulate ? C : 0) + alpha * A B, with A[M, Kd] at a[i*ars + p*acs]
// and B[Kd, N] at b[p*brs + j*bcs].
static void K(gemm)(CpuExec *x, int64_t M, int64_t N, int64_t Kd, real alpha, const real *a,
                    int64_t ars, int64_t acs, const real *b, int64_t brs, int64_t bcs,
                    bool accumulate, real *c, int64_t ldc) {
  if (!accumulate)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) c[i * ldc + j] = 0;
  if (M <= 0 || N <= 0 || Kd <= 0) return;
  real *pa = x->gemm_work, *pb = pa + (size_t)MM_MC * MM_KC;
  K(MmTile) tile = K(mm_tile);
#if CPU_WIDE_KERNELS
  if (x->wide_kernels) tile = K(mm_tile_avx2);
#endif
  for (int64_t jc = 0; jc < N; jc += MM_NC) {
    int64_t nc = N - jc < MM_NC ? N - jc : MM_NC;
    for (int64_t pc = 0; pc < Kd; pc += MM_KC) {
      int64_t kc = Kd - pc < MM_KC ? Kd - pc : MM_KC;
      K(mm_pack_b)(pb, b + pc * brs + jc * bcs, brs, bcs, kc, nc);
      for (int64_t ic = 0; ic < M; ic += MM_MC) {
        int64_t mc = M - ic < MM_MC ? M - ic : MM_MC;
        K(mm_pack_a)(pa, a + ic * ars + pc * acs, ars, acs, mc, kc);
        for (int64_t jr = 0; jr < nc; jr += MM_NR) {
          int64_t n = nc - jr < MM_NR ? nc - jr : MM_NR;
          for (int64_t ir = 0; ir < mc; ir += MM_MR) {
            int64_t m = mc - ir < MM_MR ? mc - ir : MM_MR;
            tile(kc, pa + ir * kc, pb + jr * kc, c + (ic + ir) * ldc + jc + jr, ldc, m, n,
                       alpha);
          }
        }
      }
    }
  }
}
