// profile_report.h: `gemc train --profile`'s table. The GPU executor times every launch of the
// profiled steps (gpu_exec_profile: one CUDA graph a step, an event around each launch) and
// counts its FLOPs and bytes (launch_cost.h); this groups the launches by kernel and the .gem
// op they come from, and sets each group's time against its roofline: the tensor-core peak
// for its FLOPs or the DRAM bandwidth for its bytes, whichever bounds it.
// defines: ProfileRow, Profile, profile_build, profile_print, profile_free
#ifndef GEMC_PROFILE_REPORT_H
#define GEMC_PROFILE_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu_exec.h"
#include "plan.h"
#include "target.h"

typedef struct ProfileRow {
  char kernel[96];       // the kernel's name, "gemm 512x256x256 bf16" or "memset"
  char op[96];           // "gem_small.gem:23:11 attention" (the first node when fused)
  bool backward, optimizer;
  double launches;       // per profiled step
  double ms;             // per profiled step
  double flops, bytes;   // per profiled step
  bool tensor_core;
  double roofline_ms;    // the least time its FLOPs and bytes allow, per step
} ProfileRow;

typedef struct Profile {
  int64_t steps;         // profiled steps
  ProfileRow *rows;      // sorted by time, longest first
  int nrows;
  double kernel_ms;      // per step, all rows
  double flops;          // per step, all rows
  const Target *target;
} Profile;

// Groups the executor's totals (nlaunches entries over `steps` steps) for plan p. False when
// nothing was profiled.
bool profile_build(const Plan *p, const GpuLaunchProfile *totals, int64_t steps,
                   const Target *target, Profile *out);

// The table, the kernels' sum against the step's wall time (step_ms, from the steps that were
// not profiled; <= 0: unknown) and the top `max_rows` rows (0: all).
void profile_print(FILE *f, const Profile *prof, double step_ms, int max_rows);

void profile_free(Profile *prof);

#endif
