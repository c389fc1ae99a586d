// internal_error.h: the compiler's own bugs, never the user's. They exit with code 3.
// defines: GEMC_ASSERT, GEMC_UNREACHABLE, gemc_internal_error
#ifndef GEMC_INTERNAL_ERROR_H
#define GEMC_INTERNAL_ERROR_H

// Exit codes of every gemc command.
enum {
  GEMC_EXIT_OK = 0,
  GEMC_EXIT_USER_ERROR = 1,  // errors in the user's input
  GEMC_EXIT_USAGE = 2,       // bad command line
  GEMC_EXIT_INTERNAL = 3,    // a bug in gemc
};

// Prints "gemc: internal error at FILE:LINE: what" and exits with GEMC_EXIT_INTERNAL.
_Noreturn void gemc_internal_error(const char *file, int line, const char *what);

#define GEMC_ASSERT(cond)                                      \
  do {                                                         \
    if (!(cond)) gemc_internal_error(__FILE__, __LINE__, #cond); \
  } while (0)
#define GEMC_UNREACHABLE() gemc_internal_error(__FILE__, __LINE__, "unreachable")

#endif
