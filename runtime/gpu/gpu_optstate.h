// gpu_optstate.h: how the GPU's optimizer state maps onto the CPU's OptimState, so that a
// checkpoint can carry it from one backend to the other. The plan keeps each piece of state in
// its own persistent fp32 buffer, Plan.optstate_buffer[2 t + slot]: AdamW's m in slot 0 and v
// in slot 1 of a dense parameter, row-wise Adagrad's rowsum (one value a row) in slot 0 of a
// table. Pure host code, no GPU: tests/unit/test_gpu_optstate.c checks every model's plan.
// defines: gpu_optstate_numel, gpu_optstate_host, gpu_optstate_check
#ifndef GEMC_GPU_OPTSTATE_H
#define GEMC_GPU_OPTSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "optim.h"
#include "plan.h"

enum { GPU_OPTSTATE_SLOTS = 2 };

// The fp32 values the plan keeps in slot `slot` of tensor `tensor`; -1 when it keeps none.
int64_t gpu_optstate_numel(const Plan *p, int tensor, int slot);
// The host array of s that holds slot `slot`: m (AdamW) or rowsum (row-wise Adagrad) for slot
// 0, v (AdamW) for slot 1; NULL when s has none.
float *gpu_optstate_host(const OptimState *s, int slot);
// Whether every slot the plan keeps for `tensor` has a host array in s of the same length;
// otherwise false, with err naming the tensor and the two sides.
bool gpu_optstate_check(const Plan *p, int tensor, const OptimState *s, char *err,
                        size_t err_size);

#endif
