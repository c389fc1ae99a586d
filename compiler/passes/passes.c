// passes.c: the flat list of IR passes, and the driver that runs them in order, verifies the
// IR after each one, and prints it after the pass --dump-after names.
//   lower  sema_lower ran before passes_run; this entry verifies its IR and names it
//   dce    removes nodes, parameters and tables whose values do not reach the loss (or,
//          after autodiff, a recorded gradient)
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"
#include "passes.h"

// --- lower ------------------------------------------------------------------------------

static bool pass_lower(Ir *ir, Diag *d) {
  (void)ir;
  (void)d;
  return true;
}

// --- dce --------------------------------------------------------------------------------

// Walks the nodes backwards from the loss and the recorded gradients (an IR that went through
// autodiff), marking what they read; then drops every node whose output is unmarked and
// every unmarked value, parameter and table. Inputs, labels and jagged dims stay: they are
// the model's interface. Without a loss there is nothing to keep alive for, and the pass
// leaves the IR alone.
static bool pass_dce(Ir *ir, Diag *d) {
  (void)d;
  if (ir->loss < 0) return true;
  bool *live = xcalloc((size_t)ir->ntensors, sizeof *live);
  int *new_index = xcalloc((size_t)ir->ntensors, sizeof *new_index);
  live[ir->loss] = true;
  for (int g = 0; g < ir->ngrads; g++) live[ir->grads[g].param] = live[ir->grads[g].grad] = true;
  for (int i = ir->nnodes - 1; i >= 0; i--) {
    const Node *n = &ir->nodes[i];
    if (!live[n->out]) continue;
    for (int k = 0; k < n->nins; k++) live[n->ins[k]] = true;
  }

  int kept = 0;
  for (int t = 0; t < ir->ntensors; t++) {
    TensorKind kind = ir->tensors[t].kind;
    if (live[t] || kind == TENSOR_INPUT || kind == TENSOR_LABEL) {
      new_index[t] = kept;
      ir->tensors[kept++] = ir->tensors[t];
    } else {
      new_index[t] = -1;
    }
  }
  ir->ntensors = kept;
  for (int t = 0; t < kept; t++) {
    Tensor *x = &ir->tensors[t];
    if (x->layout == LAYOUT_ROWS) x->table = new_index[x->table];
  }

  int nodes = 0, nforward = 0;
  for (int i = 0; i < ir->nnodes; i++) {
    Node n = ir->nodes[i];
    if (new_index[n.out] < 0) continue;
    n.out = new_index[n.out];
    for (int k = 0; k < n.nins; k++) n.ins[k] = new_index[n.ins[k]];
    ir->tensors[n.out].producer = nodes;
    ir->nodes[nodes++] = n;
    if (i < ir->nforward) nforward = nodes;
  }
  ir->nnodes = nodes;
  ir->nforward = nforward;
  ir->loss = new_index[ir->loss];
  for (int g = 0; g < ir->ngrads; g++) {
    ir->grads[g].param = new_index[ir->grads[g].param];
    ir->grads[g].grad = new_index[ir->grads[g].grad];
  }
  free(live);
  free(new_index);
  ir_reindex(ir);
  return true;
}

// --- the driver -------------------------------------------------------------------------

const Pass gemc_passes[] = {
    {"lower", pass_lower},
    {"dce", pass_dce},
    {NULL, NULL},
};

// A broken IR is gemc's bug, never the user's: exit 3 with the verifier's reason.
static void verify_after(const Ir *ir, const char *pass) {
  char err[1024];
  if (ir_verify(ir, err, sizeof err)) return;
  char what[1200];
  snprintf(what, sizeof what, "the IR after pass '%s' fails verification: %s", pass, err);
  gemc_internal_error(__FILE__, __LINE__, what);
}

bool passes_run(Ir *ir, Diag *d, const char *dump_after, FILE *dump) {
  for (const Pass *p = gemc_passes; p->name; p++) {
    if (!p->run(ir, d)) return false;
    verify_after(ir, p->name);
    if (dump && dump_after && strcmp(dump_after, p->name) == 0) ir_print(dump, ir);
  }
  return true;
}
