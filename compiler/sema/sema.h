// sema.h: semantic analysis. Resolves names, infers shapes over dense, set and jagged
// tensors, checks precision legality per op and per target, and lowers the checked model to
// the graph IR.
// defines: sema_lower
#ifndef GEMC_SEMA_H
#define GEMC_SEMA_H

#include <stdbool.h>

#include "ast.h"
#include "diag.h"
#include "ir.h"

// Lowers `m` into `out`. `arch` (from --arch) overrides the model's target when not NULL.
// Reports every error it finds to `d` and returns false when there was any.
bool sema_lower(const Model *m, const char *arch, Diag *d, Ir *out);

#endif
