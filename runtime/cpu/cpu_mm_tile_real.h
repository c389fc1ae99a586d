// cpu_mm_tile_real.h: the register tile of the blocked matmul (cpu_matmul_real.h), written over
// `real`. It is included once per instruction set: MM_TILE_FN names the function and
// MM_TILE_ATTR gives its target attribute (empty for the baseline). The loops have constant
// trip counts, so the compiler keeps the MM_MR x MM_NR accumulators in vector registers.
//
// c[0..m, 0..n] += alpha * (packed a panel)(packed b panel) over kc steps.
MM_TILE_ATTR static void MM_TILE_FN(int64_t kc, const real *restrict a, const real *restrict b,
                                    real *restrict c, int64_t ldc, int64_t m, int64_t n,
                                    real alpha) {
  real acc[MM_MR][MM_NR];
  for (int i = 0; i < MM_MR; i++)
    for (int j = 0; j < MM_NR; j++) acc[i][j] = 0;
  for (int64_t p = 0; p < kc; p++) {
    const real *bp = b + p * MM_NR;
    for (int i = 0; i < MM_MR; i++) {
      real ai = a[p * MM_MR + i];
      for (int j = 0; j < MM_NR; j++) acc[i][j] += ai * bp[j];
    }
  }
  if (m == MM_MR && n == MM_NR) {
    for (int i = 0; i < MM_MR; i++)
      for (int j = 0; j < MM_NR; j++) c[i * ldc + j] += alpha * acc[i][j];
  } else {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] += alpha * acc[i][j];
  }
}

#undef MM_TILE_FN
#undef MM_TILE_ATTR
