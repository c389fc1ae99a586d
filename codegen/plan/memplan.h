// memplan.h: the memory plan of one training step (memplan.c).
// defines: memplan_build, MemplanStats, memplan_stats, plan_check_fit
#ifndef GEMC_MEMPLAN_H
#define GEMC_MEMPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"

// Fills p->buffers, p->tensor_buffer/offset, p->scratch[].buffer/offset, p->optstate_buffer.
void memplan_build(Plan *p);

typedef struct MemplanStats {
  int64_t planned_bytes;    // every buffer at the largest batch
  int64_t unshared_bytes;   // one buffer per tensor and scratch, at the largest batch
  int64_t persistent_bytes; // parameters, tables, their gradients and optimizer state
} MemplanStats;
MemplanStats memplan_stats(const Plan *p);
// The bytes of tensor t (a rows gradient included) and SymSize at the largest batch.
SymSize plan_tensor_bytes(const Plan *p, int t);
int64_t plan_eval_max(const Plan *p, SymSize s);  // INT64_MAX when it overflows
// False, with "the model needs N of GPU memory ...; DEVICE has M free" in err, when the plan's
// buffers at the largest batch (memplan_stats' planned_bytes) exceed `available` bytes (the
// GPU's free memory, cuMemGetInfo; a negative value: unknown, no check). Call it before
// allocating.
bool plan_check_fit(const Plan *p, const char *device, int64_t available, char *err,
                    size_t err_size);

#endif
