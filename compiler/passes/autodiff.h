// autodiff.h: reverse-mode differentiation of the graph IR (docs/autodiff.md).
// defines: autodiff
#ifndef GEMC_AUTODIFF_H
#define GEMC_AUTODIFF_H

#include <stdbool.h>

#include "diag.h"
#include "ir.h"

// Appends the backward nodes of `ir` (which must have a loss), sets ir->nforward, and records
// the gradient of every parameter and table. The result passes ir_verify. Returns false when
// an error was reported to `d` (a model whose gradients cannot be represented).
// `ir` is a verified forward IR (after the passes) without a backward yet; autodiff verifies
// what it built, and a failure there is an internal error (exit 3). Parameters and tables
// through which no gradient flows get no record.
bool autodiff(Ir *ir, Diag *d);

#endif
