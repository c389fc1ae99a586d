// cpu_pool.c: the buffers of the values the CPU executor computes, shared by liveness. A value
// holds a pooled buffer from the node that writes it to the last node that reads it (forward
// or backward); then the buffer goes back to the pool for a later value. Values nothing reads
// (the loss, parameter and table gradients) keep theirs until the next forward pass, which
// starts with every buffer back in the pool. With cpu_exec_keep_values every value keeps its
// own buffer instead, so tests can read any of them after a run.
//
// A request takes the smallest free buffer that is large enough; when none is, the largest
// free buffer is replaced by a larger one (1/8 headroom), so the pool never holds more buffers
// than the most values ever alive at once. The choices depend only on the sizes, so runs are
// deterministic; every kernel writes all of its output, so a reused buffer's old contents
// never show.
#include <stdlib.h>

#include "cpu_exec_internal.h"
#include "internal_error.h"

static void *pool_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) gemc_internal_error(__FILE__, __LINE__, "cpu executor: out of memory");
  return p;
}

bool cpu_pool_holds(const CpuExec *x, int t) {
  const Tensor *tt = &x->ir->tensors[t];
  return !x->keep_values && tt->kind == TENSOR_VALUE &&
         (tt->layout == LAYOUT_DENSE || tt->layout == LAYOUT_SET || tt->layout == LAYOUT_JAGGED);
}

void cpu_pool_plan(CpuExec *x) {
  const Ir *ir = x->ir;
  x->last_use = pool_calloc((size_t)ir->ntensors, sizeof *x->last_use);
  for (int t = 0; t < ir->ntensors; t++) {
    x->last_use[t] = -1;
    x->buf[t].block = -1;
  }
  for (int i = 0; i < ir->nnodes; i++)
    for (int k = 0; k < ir->nodes[i].nins; k++) x->last_use[ir->nodes[i].ins[k]] = i;
}

void cpu_pool_take(CpuExec *x, int t) {
  TensorBuf *b = &x->buf[t];
  if (b->block >= 0) return;
  int64_t need = b->numel > 0 ? b->numel : 1;
  int best = -1, largest = -1;
  for (int k = 0; k < x->npool; k++) {
    const PoolBlock *p = &x->pool[k];
    if (p->owner >= 0) continue;
    if (p->cap >= need && (best < 0 || p->cap < x->pool[best].cap)) best = k;
    if (largest < 0 || p->cap > x->pool[largest].cap) largest = k;
  }
  if (best < 0) {
    if (largest >= 0) {
      best = largest;
      free(x->pool[best].data);
    } else {
      if (x->npool == x->cap_pool) {
        x->cap_pool = x->cap_pool ? 2 * x->cap_pool : 16;
        x->pool = realloc(x->pool, (size_t)x->cap_pool * sizeof *x->pool);
        if (!x->pool) gemc_internal_error(__FILE__, __LINE__, "cpu executor: out of memory");
      }
      best = x->npool++;
    }
    x->pool[best].cap = need + need / 8;
    x->pool[best].data = pool_calloc((size_t)x->pool[best].cap, x->elem);
  }
  x->pool[best].owner = t;
  b->block = best;
  b->data = x->pool[best].data;
}

static void pool_give_back(CpuExec *x, int t) {
  TensorBuf *b = &x->buf[t];
  if (b->block < 0) return;
  x->pool[b->block].owner = -1;
  b->block = -1;
  b->data = NULL;
}

void cpu_pool_release_inputs(CpuExec *x, int node) {
  const Node *n = &x->ir->nodes[node];
  for (int k = 0; k < n->nins; k++)
    if (x->last_use[n->ins[k]] == node) pool_give_back(x, n->ins[k]);
}

void cpu_pool_reset(CpuExec *x) {
  for (int t = 0; t < x->ir->ntensors; t++) pool_give_back(x, t);
}

void cpu_pool_free(CpuExec *x) {
  for (int k = 0; k < x->npool; k++) free(x->pool[k].data);
  free(x->pool);
  free(x->last_use);
}
