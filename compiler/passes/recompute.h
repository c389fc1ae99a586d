// recompute.h: activation recomputation, `@schedule(recompute = true)` (docs/autodiff.md,
// "Recomputation"). Run by autodiff once the backward exists.
// defines: recompute_regions
#ifndef GEMC_RECOMPUTE_H
#define GEMC_RECOMPUTE_H

#include "ir.h"

// The forward values of nodes marked recompute = true that backward nodes read are recomputed
// instead of kept: the marked nodes that compute them are copied (from their unmarked inputs;
// RECOMPUTE_COPY marks a copy), each just before the first backward node that reads it or
// a copy made from it, and every backward read goes to the copies. Returns the nodes copied.
int recompute_regions(Ir *ir);

#endif
