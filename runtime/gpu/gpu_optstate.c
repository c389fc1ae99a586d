// gpu_optstate.c: the GPU's optimizer-state slots and the CPU's OptimState arrays
// (gpu_optstate.h).
#include "gpu_optstate.h"

#include <inttypes.h>
#include <stdio.h>

int64_t gpu_optstate_numel(const Plan *p, int tensor, int slot) {
  if (!p->optstate_buffer || tensor < 0 || tensor >= p->ir->ntensors || slot < 0 ||
      slot >= GPU_OPTSTATE_SLOTS)
    return -1;
  int b = p->optstate_buffer[2 * tensor + slot];
  if (b < 0 || b >= p->nbuffers) return -1;
  // Optimizer state is persistent: its size does not depend on the batch.
  SymSize s = p->buffers[b].bytes;
  if (s.b != 0 || (s.jag >= 0 && s.t != 0) || s.c < 0) return -1;
  return s.c / 4;
}

float *gpu_optstate_host(const OptimState *s, int slot) {
  switch (s->cfg.kind) {
    case OPTIM_ADAMW: return slot == 0 ? s->m : slot == 1 ? s->v : NULL;
    case OPTIM_ROWWISE_ADAGRAD: return slot == 0 ? s->rowsum : NULL;
    case OPTIM_SGD:
    case OPTIM_NONE: break;
  }
  return NULL;
}

bool gpu_optstate_check(const Plan *p, int tensor, const OptimState *s, char *err,
                        size_t err_size) {
  static const char *const what[2][2] = {{"AdamW m", "AdamW v"}, {"row-wise Adagrad rowsum", "?"}};
  bool table = p->ir->tensors[tensor].kind == TENSOR_TABLE;
  for (int slot = 0; slot < GPU_OPTSTATE_SLOTS; slot++) {
    int64_t n = gpu_optstate_numel(p, tensor, slot);
    if (n < 0) continue;
    const char *name = what[table][slot];
    if (!gpu_optstate_host(s, slot)) {
      snprintf(err, err_size, "%s: the GPU keeps %s state (%" PRId64 " values) that its %s "
               "optimizer on the CPU side does not have", p->ir->tensors[tensor].name, name, n,
               optim_name(s->cfg.kind));
      return false;
    }
    if (n != s->n) {
      snprintf(err, err_size, "%s: the GPU keeps %" PRId64 " values of %s state, the CPU side "
               "%" PRId64, p->ir->tensors[tensor].name, n, name, s->n);
      return false;
    }
  }
  return true;
}
