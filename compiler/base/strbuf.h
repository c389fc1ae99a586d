// strbuf.h: a growable string for writing generated source.
// defines: StrBuf, sb_printf, sb_puts, sb_free
#ifndef GEMC_STRBUF_H
#define GEMC_STRBUF_H

#include <stddef.h>

typedef struct StrBuf {
  char *data;  // NUL-terminated; NULL while empty
  size_t len, cap;
} StrBuf;

void sb_printf(StrBuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_puts(StrBuf *s, const char *text);
void sb_putn(StrBuf *s, const char *text, size_t n);
// Returns the string (never NULL) and leaves `s` empty; the caller frees it.
char *sb_take(StrBuf *s);
void sb_free(StrBuf *s);

#endif
