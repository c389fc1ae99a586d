// recompute.c: activation recomputation. Without it, every forward value the backward reads
// (an attention's Q, K, V and O, a linear's input) stays alive from its forward producer to
// its last backward reader, so memory grows with the depth of the model. For a region marked
// `@schedule(recompute = true)`, the backward reads copies instead: the marked nodes that
// compute them run again, from their unmarked inputs, each copy just before the first backward
// node that reads it or a copy made from it. The forward values then die at their last forward
// use and the memory plan (codegen/plan/memplan.c) reuses their buffers; a layer's copies live
// through that layer's backward only, also when marked layers follow one another. The copies
// are the same ops on the same inputs, so the gradients are bit for bit those of the model
// without the hint; the cost is the marked nodes' forward once more.
#include "recompute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"

// `base`.re, or base.re_2, ... when that name is taken.
static const char *copy_name(Ir *ir, const char *base) {
  size_t size = strlen(base) + 32;
  char *name = arena_alloc(ir->arena, size);
  snprintf(name, size, "%s.re", base);
  for (int k = 2; ir_find_tensor(ir, name) >= 0; k++) snprintf(name, size, "%s.re_%d", base, k);
  return name;
}

// Forward nodes marked recompute = true. Returns the nodes copied.
int recompute_regions(Ir *ir) {
  GEMC_ASSERT(ir->in_backward);
  int nt = ir->ntensors, nf = ir->nforward, old_n = ir->nnodes;
  bool *inside = xcalloc((size_t)nt, sizeof *inside);
  for (int i = 0; i < nf; i++)
    if (ir->nodes[i].sched.recompute == RECOMPUTE_TRUE) inside[ir->nodes[i].out] = true;
  // A loss's logits stay: the runtime reads them after the forward pass anyway.
  for (int i = 0; i < nf; i++)
    if (ir->nodes[i].op == OP_BCE) inside[ir->nodes[i].ins[0]] = false;
  // at[v]: where the copy of v must exist, the first backward node that reads v or reads a
  // copy computed from it; old_n when none does (v is not copied).
  int *at = xcalloc((size_t)nt, sizeof *at);
  for (int t = 0; t < nt; t++) at[t] = old_n;
  for (int i = nf; i < old_n; i++)
    for (int k = 0; k < ir->nodes[i].nins; k++) {
      int x = ir->nodes[i].ins[k];
      if (inside[x] && at[x] > i) at[x] = i;
    }
  for (int i = nf - 1; i >= 0; i--) {
    const Node *n = &ir->nodes[i];
    if (!inside[n->out] || at[n->out] == old_n) continue;
    for (int k = 0; k < n->nins; k++)
      if (inside[n->ins[k]] && at[n->ins[k]] > at[n->out]) at[n->ins[k]] = at[n->out];
  }
  // The copies, in forward order, each from the copies of its marked inputs.
  int *copy = xcalloc((size_t)nt, sizeof *copy);
  int *orig_of = xcalloc((size_t)nf + 1, sizeof *orig_of);  // copy c: its original's output
  for (int t = 0; t < nt; t++) copy[t] = -1;
  for (int i = 0; i < nf; i++) {
    Node n = ir->nodes[i];
    if (!inside[n.out] || at[n.out] == old_n) continue;
    for (int k = 0; k < n.nins; k++)
      if (copy[n.ins[k]] >= 0) n.ins[k] = copy[n.ins[k]];
    Tensor t = ir->tensors[n.out];
    t.name = copy_name(ir, t.name);
    t.producer = -1;
    int was = n.out;
    n.out = ir_add_tensor(ir, &t);
    copy[was] = n.out;
    orig_of[ir->nnodes - old_n] = was;
    n.sched.recompute = RECOMPUTE_COPY;
    ir_add_node(ir, &n);
  }
  int copied = ir->nnodes - old_n;
  for (int i = nf; i < old_n; i++) {
    Node *n = &ir->nodes[i];
    for (int k = 0; k < n->nins; k++)
      if (n->ins[k] < nt && copy[n->ins[k]] >= 0) n->ins[k] = copy[n->ins[k]];
  }
  // Each copy goes just before node at[] of its original, copies sharing a place in forward
  // order (a copy's marked inputs have their copies at the same place or earlier), so that a
  // layer's copies live only through that layer's backward.
  int *key = xcalloc((size_t)copied + 1, sizeof *key);  // the copies by place, stably
  for (int c = 0; c < copied; c++) key[c] = c;
  for (int c = 1; c < copied; c++)
    for (int j = c; j > 0 && at[orig_of[key[j]]] < at[orig_of[key[j - 1]]]; j--) {
      int swap = key[j];
      key[j] = key[j - 1];
      key[j - 1] = swap;
    }
  Node *order = xcalloc((size_t)ir->nnodes + 1, sizeof *order);
  int placed = 0, c = 0;
  for (int i = 0; i <= old_n; i++) {
    for (; c < copied && at[orig_of[key[c]]] == i; c++) order[placed++] = ir->nodes[old_n + key[c]];
    if (i < old_n) order[placed++] = ir->nodes[i];
  }
  GEMC_ASSERT(placed == ir->nnodes && c == copied);
  free(key);
  free(orig_of);
  free(inside);
  free(at);
  free(copy);
  memcpy(ir->nodes, order, (size_t)placed * sizeof *order);
  free(order);
  for (int i = nf; i < ir->nnodes; i++) ir->tensors[ir->nodes[i].out].producer = i;
  return copied;
}
