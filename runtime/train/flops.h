// flops.h: the useful floating-point work of one training step, counted from the IR over the
// batch's real jagged lengths (never the padded max), for Local MFU: matmuls (linear and its
// backward ops, dot_interact) as 2·M·K·N, attention as 4·d per visible (query, key) pair
// forward and 2.5 times that backward (the flash-attention convention), everything else not
// counted. The count per node is compiler/ir/ir_flops.h's; docs/gpu.md gives the formulas.
// defines: step_flops, peak_tflops
#ifndef GEMC_FLOPS_H
#define GEMC_FLOPS_H

#include <stdbool.h>

#include "batch.h"
#include "ir.h"

// FLOPs of the forward nodes (and of the backward ones when `backward`) for batch b.
double step_flops(const Ir *ir, const Batch *b, bool backward);

// The datasheet dense peak, in TFLOP/s, of `target` ("sm_90a") for the model's precision:
// bf16/fp16 989, fp8/mxfp8 1979, fp32 67 on sm_90a. 0 when the target is unknown.
double peak_tflops(const char *target, DType precision);

#endif
