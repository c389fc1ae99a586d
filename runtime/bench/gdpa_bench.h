// gdpa_bench.h: the GDPA benchmark behind `gemc bench gdpa` (docs/attention.md): forward and
// backward TFLOP/s of the generated attention kernels on the public shapes of
// ../shared/design/overview.md (B=1152, H=4, head dim 128, bf16; self non-causal with lengths
// ~U[max(1,(2s-1)N), N] for N in {512, 1024, 2048} and s in {0.5, 1.0}; cross with KV=256
// keys per example), with Meta's Triton GDPA numbers beside each cell. FLOPs are useful FLOPs
// over the real jagged lengths: forward 4*H*dh*sum(unmasked pairs), backward 2.5x that.
// defines: GdpaBenchOptions, GdpaBenchStatus, gdpa_bench_run
#ifndef GEMC_GDPA_BENCH_H
#define GEMC_GDPA_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "ir.h"

typedef struct GdpaBenchOptions {
  Act act;                   // the activation of the main table (ACT_GELU: Triton's)
  int reps;                  // timed repetitions per cell (after one warm-up run)
  bool quick;                // N=1024 only, and no extra sections
  const char *cache_dir;     // cubin cache (jit_cache.h); NULL: compile every time
  const char *compile_only;  // an arch: compile every kernel for it, run nothing (no GPU)
} GdpaBenchOptions;

typedef enum GdpaBenchStatus {
  GDPA_BENCH_OK,
  GDPA_BENCH_NO_GPU,        // no driver or no device: `err` says which
  GDPA_BENCH_COMPILE_FAILED,
  GDPA_BENCH_CUDA_FAILED,   // a CUDA call failed while measuring: `err` says which
  GDPA_BENCH_BAD_OUTPUT,    // a kernel output held NaN/inf or was all zero
} GdpaBenchStatus;

// Compiles the kernels, opens the GPU, measures and prints the tables to `out`.
GdpaBenchStatus gdpa_bench_run(const GdpaBenchOptions *o, FILE *out, char *err,
                               size_t err_size);

#endif
