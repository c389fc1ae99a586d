// checked.h: the one checked allocation and the one error-message helper of gemc.
//
// Every library function that can fail for a reason the user should hear about returns false
// (or NULL) and writes the reason into a caller's buffer, the out-parameter pair
// `char *err, size_t err_size`; it never exits. `fail` is how it does so in one line:
//     if (n < 0) return fail(err, err_size, "%s: negative size %lld", path, (long long)n);
// Running out of host memory is not such a reason: the x*alloc helpers report it as an
// internal error (internal_error.h), as every allocation in gemc always has.
// defines: fail, xmalloc, xcalloc, xrealloc, xstrdup
#ifndef GEMC_CHECKED_H
#define GEMC_CHECKED_H

#include <stdbool.h>
#include <stddef.h>

// Formats the message into err[0 .. err_size) (when err is not NULL) and returns false.
bool fail(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// malloc, calloc, realloc and strdup that never return NULL; a zero size allocates one byte.
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

#endif
