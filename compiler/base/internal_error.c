// internal_error.c: reports a bug in gemc itself and exits with GEMC_EXIT_INTERNAL (3).
// Under the fuzzer (GEMC_FUZZING) it aborts instead, so libFuzzer keeps the input.
#include <stdio.h>
#include <stdlib.h>

#include "internal_error.h"  // defines: gemc_internal_error, GEMC_EXIT_INTERNAL

_Noreturn void gemc_internal_error(const char *file, int line, const char *what) {
  fflush(stdout);
  fprintf(stderr, "gemc: internal error at %s:%d: %s\n", file, line, what);
#ifdef GEMC_FUZZING
  abort();
#else
  exit(GEMC_EXIT_INTERNAL);
#endif
}
