// passes.h: the flat list of IR passes. The verifier runs after every one.
// defines: Pass, passes_run
#ifndef GEMC_PASSES_H
#define GEMC_PASSES_H

#include <stdbool.h>
#include <stdio.h>

#include "diag.h"
#include "ir.h"

typedef struct Pass {
  const char *name;
  bool (*run)(Ir *ir, Diag *d);  // false: an error was reported to d
} Pass;

// Runs every pass in order, verifying after each (a failed verify is an internal error).
// When dump_after names a pass, prints the IR after it to `dump`. Returns false on error.
bool passes_run(Ir *ir, Diag *d, const char *dump_after, FILE *dump);
// The pass list, terminated by a {NULL, NULL} entry; for --help and tests.
extern const Pass gemc_passes[];

#endif
