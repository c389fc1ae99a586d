// gdpa_bench.h: the GDPA benchmark behind `gemc bench gdpa` (docs/gdpa_bench.md): forward and
// backward TFLOP/s of the generated attention kernels, B=1152, H=4, head dim 128, bf16,
// non-causal, on three definitions of the public shapes side by side, N in {512, 1024, 2048}:
//   - Meta's "self s" (its generate_jagged_data): lq ~ U[max(1,(2s-1)N), N] and lk = N for
//     every example, s in {0.5, 1.0};
//   - jagged self: lq = lk ~ U[1, N];
//   - cross with KV=256 keys per example (a set), lq = N;
// then cross with KV=16 (N=1024) and PMA with 16 and 32 seeds over lognormal kv lengths up to
// 4096. Each row has the forward tile list's spread (gpu_tiles_spread) and Meta's Triton
// numbers where known (issue 10's table, not this run). With lengths files (--lengths) it times
// those batches instead, one row each. FLOPs are useful FLOPs over the real jagged lengths:
// forward 4*H*dh*sum(lq*lk), backward counted as 2.5x that.
// defines: GdpaBenchOptions, GdpaBenchStatus, gdpa_bench_run
#ifndef GEMC_GDPA_BENCH_H
#define GEMC_GDPA_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "gdpa_case.h"
#include "ir.h"

typedef struct GdpaBenchOptions {
  Act act;                   // the activation of the main table (ACT_GELU: Triton's)
  int reps;                  // timed repetitions per cell (after one warm-up run)
  bool quick;                // N=1024 only, and no extra rows or sections
  const char *cache_dir;     // cubin cache (jit_cache.h); NULL: compile every time
  const char *compile_only;  // an arch: compile every kernel for it, run nothing (no GPU)
  bool atomic_dq;            // emit with @schedule(deterministic = false): dQ inside dK/dV
  bool deal_zigzag;          // deal persistent tile lists back and forth, not LPT (an A/B of
                             // the deal: a zigzag list is a valid persistent list, no holes)
  // Batches to time instead of the tables (--lengths FILE), each with its file's name: one
  // row each, on the self kernel when lq == lk on every line, else on cross over a jagged kv.
  const GdpaLengths *lengths;
  const char *const *lengths_names;
  int nlengths;
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
