// flops.c: the FLOP count of flops.h.
#include "flops.h"

#include "ir_flops.h"
#include "target.h"

// The count per node is the IR's (ir_flops.h), shared with the per-launch cost model.
double step_flops(const Ir *ir, const Batch *b, bool backward) {
  const int64_t *const *offsets = (const int64_t *const *)b->offsets;
  double total = 0;
  int end = backward ? ir->nnodes : ir->nforward;
  // A recomputed copy (compiler/passes/recompute.c) is work the model would not need: not
  // useful FLOPs (the profile's per-launch counts, launch_cost.c, do count it).
  for (int i = 0; i < end; i++)
    if (ir->nodes[i].sched.recompute != RECOMPUTE_COPY) total += ir_node_flops(ir, i, b->B, offsets);
  return total;
}

double peak_tflops(const char *target, DType precision) {
  const Target *t = target_find(target);
  if (!t) return 0;
  switch (precision) {
  case DT_BF16:
  case DT_FP16: return t->peak_tflops_bf16;
  case DT_FP8:
  case DT_MXFP8: return t->peak_tflops_fp8;
  default: return t->peak_tflops_fp32;
  }
}
