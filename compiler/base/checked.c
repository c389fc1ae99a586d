// checked.c: fail and the checked allocations (checked.h).
#include "checked.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal_error.h"

bool fail(char *err, size_t err_size, const char *fmt, ...) {
  if (err && err_size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
  }
  return false;
}

static void *checked(void *p) {
  if (!p) gemc_internal_error(__FILE__, __LINE__, "out of memory");
  return p;
}

void *xmalloc(size_t n) { return checked(malloc(n ? n : 1)); }

void *xcalloc(size_t n, size_t size) { return checked(calloc(n ? n : 1, size ? size : 1)); }

void *xrealloc(void *p, size_t n) { return checked(realloc(p, n ? n : 1)); }

char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xmalloc(n), s, n);
}
