// recompute.h: activation recomputation, `@schedule(recompute = true)` (docs/autodiff.md,
// "Recomputation"). Run by autodiff once the backward exists.
// defines: recompute_regions
#ifndef GEMC_RECOMPUTE_H
#define GEMC_RECOMPUTE_H

#include "ir.h"

// Each run of consecutive forward nodes marked recompute = true is a region. The forward
// values of a region that backward nodes read are recomputed instead of kept: the region's
// nodes that compute them are copied (in forward order, from the region's inputs) just before
// the first backward node that reads one, and every backward read goes to the copies. Returns
// the number of nodes copied.
int recompute_regions(Ir *ir);

#endif
