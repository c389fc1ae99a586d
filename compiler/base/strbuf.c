// strbuf.c: a growable string for writing generated source.
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"

static void sb_reserve(StrBuf *s, size_t extra) {
  if (s->len + extra + 1 <= s->cap) return;
  size_t cap = s->cap ? s->cap : 256;
  while (cap < s->len + extra + 1) cap *= 2;
  s->data = xrealloc(s->data, cap);
  s->cap = cap;
}

void sb_putn(StrBuf *s, const char *text, size_t n) {
  sb_reserve(s, n);
  memcpy(s->data + s->len, text, n);
  s->len += n;
  s->data[s->len] = '\0';
}

void sb_puts(StrBuf *s, const char *text) { sb_putn(s, text, strlen(text)); }

void sb_printf(StrBuf *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  GEMC_ASSERT(n >= 0);
  sb_reserve(s, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(s->data + s->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  s->len += (size_t)n;
}

char *sb_take(StrBuf *s) {
  char *p = s->data;
  if (!p) {
    p = xmalloc(1);
    p[0] = '\0';
  }
  s->data = NULL;
  s->len = s->cap = 0;
  return p;
}

void sb_free(StrBuf *s) {
  free(s->data);
  s->data = NULL;
  s->len = s->cap = 0;
}
