// recompute.c: activation recomputation. Without it, every forward value the backward reads
// (an attention's Q, K, V and O, a linear's input) stays alive from its forward producer to
// its last backward reader, so memory grows with the depth of the model. For a region marked
// `@schedule(recompute = true)`, the backward reads copies instead: the region's nodes that
// compute them run again, from the region's inputs, just before the first backward node that
// needs one. The forward values then die at their last forward use and the memory plan
// (codegen/plan/memplan.c) reuses their buffers; the copies live through the region's
// backward only. The copies are the same ops on the same inputs, so the gradients are bit for
// bit those of the model without the hint; the cost is the region's forward once more.
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

// Moves the nodes appended after `old_n` to position `at`, after which every node from `at`
// on is renumbered (and its output's producer with it).
static void move_tail(Ir *ir, int at, int old_n) {
  int tail = old_n - at, added = ir->nnodes - old_n;
  Node *keep = xcalloc((size_t)tail + 1, sizeof *keep);
  memcpy(keep, &ir->nodes[at], (size_t)tail * sizeof *keep);
  memmove(&ir->nodes[at], &ir->nodes[old_n], (size_t)added * sizeof *keep);
  memcpy(&ir->nodes[at + added], keep, (size_t)tail * sizeof *keep);
  free(keep);
  for (int i = at; i < ir->nnodes; i++) ir->tensors[ir->nodes[i].out].producer = i;
}

// Forward nodes [lo, hi] are one region. Returns the nodes copied.
static int recompute_region(Ir *ir, int lo, int hi) {
  int nt = ir->ntensors;
  bool *inside = xcalloc((size_t)nt, sizeof *inside), *need = xcalloc((size_t)nt, sizeof *need);
  for (int i = lo; i <= hi; i++) inside[ir->nodes[i].out] = true;
  // A loss's logits stay: the runtime reads them after the forward pass anyway.
  for (int i = 0; i < ir->nforward; i++)
    if (ir->nodes[i].op == OP_BCE) inside[ir->nodes[i].ins[0]] = false;
  int first = -1;  // the first backward node that reads a value of the region
  for (int i = ir->nforward; i < ir->nnodes; i++)
    for (int k = 0; k < ir->nodes[i].nins; k++)
      if (inside[ir->nodes[i].ins[k]]) {
        need[ir->nodes[i].ins[k]] = true;
        if (first < 0) first = i;
      }
  int copied = 0;
  if (first >= 0) {
    // What the needed values are computed from, inside the region.
    for (int i = hi; i >= lo; i--) {
      const Node *n = &ir->nodes[i];
      if (!need[n->out]) continue;
      for (int k = 0; k < n->nins; k++)
        if (inside[n->ins[k]]) need[n->ins[k]] = true;
    }
    int *copy = xcalloc((size_t)nt, sizeof *copy);
    for (int t = 0; t < nt; t++) copy[t] = -1;
    int old_n = ir->nnodes;
    for (int i = lo; i <= hi; i++) {
      Node n = ir->nodes[i];
      if (!need[n.out]) continue;
      for (int k = 0; k < n.nins; k++)
        if (copy[n.ins[k]] >= 0) n.ins[k] = copy[n.ins[k]];
      Tensor t = ir->tensors[n.out];
      t.name = copy_name(ir, t.name);
      t.producer = -1;
      int was = n.out;
      n.out = ir_add_tensor(ir, &t);
      copy[was] = n.out;
      n.sched.recompute = 0;  // a copy is a backward node; the hint stays on the original
      ir_add_node(ir, &n);
      copied++;
    }
    for (int i = first; i < old_n; i++) {
      Node *n = &ir->nodes[i];
      for (int k = 0; k < n->nins; k++)
        if (n->ins[k] < nt && copy[n->ins[k]] >= 0) n->ins[k] = copy[n->ins[k]];
    }
    move_tail(ir, first, old_n);
    free(copy);
  }
  free(inside);
  free(need);
  return copied;
}

int recompute_regions(Ir *ir) {
  GEMC_ASSERT(ir->in_backward);
  int copied = 0;
  for (int lo = 0; lo < ir->nforward;) {
    if (ir->nodes[lo].sched.recompute != 1) {
      lo++;
      continue;
    }
    int hi = lo;
    while (hi + 1 < ir->nforward && ir->nodes[hi + 1].sched.recompute == 1) hi++;
    copied += recompute_region(ir, lo, hi);
    lo = hi + 1;
  }
  return copied;
}
