// autodiff_internal.h: what the two halves of autodiff share. autodiff.c analyses the forward
// graph (which tensors need a gradient, which uses contribute one, and in what order), names
// and accumulates the gradients and emits the table and parameter gradients; autodiff_rules.c
// holds the backward rule of each forward op (docs/autodiff.md, "Backward ops").
// defines: Ad, ad_rule, ad_slot, ad_node, ad_name, ad_emit, ad_emit_value, ad_alias, ad_pair
#ifndef GEMC_AUTODIFF_INTERNAL_H
#define GEMC_AUTODIFF_INTERNAL_H

#include <stdbool.h>

#include "diag.h"
#include "ir.h"

// The state of one autodiff run. The per-tensor arrays cover the tensors of the forward
// graph, [0, ntensors); gradients are appended after them.
//
// A "use" is one (forward node, input) pair. A use contributes a gradient to its input when
// the node's output has one and the input needs one; the contributions of tensor t are
// numbered 0 … ncontrib[t]-1 in use order (node order, then input order), and slot
// first[t] + k of `contrib` holds contribution k once its rule has emitted it.
typedef struct Ad {
  Ir *ir;
  Diag *d;
  int nforward;      // the forward nodes: [0, nforward)
  int ntensors;      // the forward tensors: [0, ntensors)
  bool *needs;       // t depends on a parameter or table (inputs and labels never do)
  bool *flows;       // a gradient reaches t from the loss
  double *coef;      // scalars (bce terms, the loss): d loss / d t, from the loss_sum weights
  int *ncontrib;     // contributions to t
  int *first;        // t's first slot in contrib
  int *contrib;      // per slot: the contribution's tensor, -1 until emitted
  int *contrib_ids;  // per slot of a table: the ids tensor of that lookup
  int *use_slot;     // [node * IR_MAX_INPUTS + k]: contribution number of the use, or -1
  int *grad;         // t's finished gradient (the sum of its contributions), or -1
} Ad;

// Appends the backward nodes of forward node `node`, whose output's gradient is `dy` (-1 for
// a bce node, which seeds the pass with its loss coefficient). autodiff_rules.c.
void ad_rule(Ad *a, int node, int dy);

// The contribution number of input k of forward node `node`, or -1 when that input gets no
// gradient through this use.
int ad_slot(const Ad *a, int node, int k);
// A backward node of op `op` for forward node `fwd`: its source location, and the forward
// node's prec when `op` has one (other fields zero, set by the caller).
Node ad_node(const Node *fwd, OpKind op);
// Emits `n` writing contribution `slot` of tensor x: a new value shaped like x in x's dtype
// (fp32 fixed for a parameter), named %x.grad or %x.grad.SLOT. Returns it.
int ad_emit(Ad *a, Node n, int x, int slot);
// "NAME.SUFFIX", in the IR's arena.
const char *ad_name(Ad *a, const char *name, const char *suffix);
// Emits `n` writing a new value named `name` (made unique) of type `type`. Returns it.
int ad_emit_value(Ad *a, Node n, const char *name, Tensor type);
// Contribution `slot` of x is the existing gradient g (an identity: add's operands, sub's
// first); a `scale {scale=1}` converts it when its dtype is not x's.
void ad_alias(Ad *a, const Node *fwd, int x, int slot, int g);
// Contribution `slot` of table t is the lookup (ids, dy), for its table_grad node.
void ad_pair(Ad *a, int t, int slot, int ids, int dy);

#endif
