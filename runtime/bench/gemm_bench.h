// gemm_bench.h: the dense GEMM benchmark behind `gemc bench gemm` (docs/perf.md, "Dense GEMMs:
// cuBLASLt vs generated"): cuBLASLt (cublaslt.h) against the generated bf16 kernel
// (gemm_kernel.h) on the GEMM launches of training plans and on square products. Each shape is
// timed with CUDA events (one warm-up, then the median of `reps` samples, each sample enough
// back-to-back runs to last about a millisecond), on random bf16 operands (uniform in [-1, 1]),
// and the two outputs are compared.
// defines: GemmBenchShape, GemmBenchOptions, GemmBenchStatus, gemm_bench_*
#ifndef GEMC_GEMM_BENCH_H
#define GEMC_GEMM_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ir.h"
#include "plan.h"

typedef struct GemmBenchShape {
  char source[32];   // "gem_small", "hstu", "square"
  int64_t m, n, k;
  bool trans_a, trans_b, has_bias;
  Act act;           // ACT_NONE or ACT_RELU in the plans (other activations are a later kernel)
  DType out;         // DT_BF16 or DT_F32
  int count;         // how many launches of the plan have this shape (1 for squares)
} GemmBenchShape;

// Appends the distinct bf16 GEMMs of p's launches (every LAUNCH_GEMM: m and k evaluated at B
// examples and the jagged totals `totals`, one per jagged dim of p->ir) to shapes[*n..cap),
// counting repeats. Returns how many LAUNCH_GEMMs were not bf16 (not benchmarked).
int gemm_bench_shapes_from_plan(const Plan *p, const char *source, int64_t B,
                                const int64_t *totals, GemmBenchShape *shapes, int *n, int cap);

typedef struct GemmBenchOptions {
  const GemmBenchShape *shapes;
  int nshapes;
  int reps;                  // timed samples per shape and side (median)
  const char *cache_dir;     // cubin cache (jit_cache.h); NULL: compile every time
  const char *compile_only;  // an arch: compile every kernel for it, run nothing (no GPU)
} GemmBenchOptions;

typedef enum GemmBenchStatus {
  GEMM_BENCH_OK,
  GEMM_BENCH_NO_GPU,          // no driver, no device or no cuBLASLt: `err` says which
  GEMM_BENCH_COMPILE_FAILED,
  GEMM_BENCH_CUDA_FAILED,     // a CUDA or cuBLASLt call failed mid-run (out of memory, ...)
  GEMM_BENCH_BAD_OUTPUT,      // an output held NaN/inf, or the two sides disagreed (> 2e-2);
                              // every shape was still measured and printed
} GemmBenchStatus;

// Compiles the kernels the shapes need, opens the GPU and cuBLASLt, measures and prints the
// table to `out`.
GemmBenchStatus gemm_bench_run(const GemmBenchOptions *o, FILE *out, char *err, size_t err_size);

#endif
