// diag.c: prints errors, warnings and notes the way gcc and clang do:
//   path:12:13: error: unknown table 'itemz'
//      12 |   h = embed(itemz, history);
//         |             ^~~~~
// The caret marks the first column of the range and '~' the rest of it on that line.
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"  // defines: Diag, Loc, diag_error

// Lines longer than this are shown as a window of ECHO_WINDOW bytes around the caret.
enum { ECHO_MAX = 256, ECHO_WINDOW = 200, ECHO_BEFORE = 100 };

// Redeclared with the format attribute, so its vfprintf call is checked like printf.
void diag_vreport(Diag *d, DiagLevel level, Loc loc, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

void diag_init(Diag *d, const SourceFile *file, FILE *out) {
  memset(d, 0, sizeof *d);
  d->file = file;
  d->out = out ? out : stderr;
}

static const char *path_of(const Diag *d) {
  return d->file && d->file->path ? d->file->path : "gemc";
}

// --- finding a line ---------------------------------------------------------------------

// Finds where line `line` starts and how long it is (without its '\n' or "\r\n"). Starts from
// the line found last time, so diagnostics in file order cost one pass over the file.
static bool find_line(Diag *d, int line, size_t *start, size_t *len) {
  const SourceFile *f = d->file;
  if (!f || !f->text || line < 1) return false;
  int at = 1;
  size_t off = 0;
  if (d->cached_line > 0 && d->cached_line <= line && d->cached_offset <= f->size) {
    at = d->cached_line;
    off = d->cached_offset;
  }
  while (at < line) {
    const char *nl = memchr(f->text + off, '\n', f->size - off);
    if (!nl) return false;
    off = (size_t)(nl - f->text) + 1;
    at++;
  }
  d->cached_line = line;
  d->cached_offset = off;
  const char *nl = memchr(f->text + off, '\n', f->size - off);
  size_t n = nl ? (size_t)(nl - f->text) - off : f->size - off;
  if (n > 0 && f->text[off + n - 1] == '\r') n--;
  *start = off;
  *len = n;
  return true;
}

// --- display cells ----------------------------------------------------------------------
// A source line is echoed cell by cell: a tab, a printable ASCII byte, a whole valid UTF-8
// character, or one byte shown as '?'. The marker line has one cell per echoed cell, so the
// caret lines up under the byte it points at.

static bool is_continuation(unsigned char c) { return c >= 0x80 && c <= 0xBF; }

// The length of the valid UTF-8 character at s[i] (2 to 4), or 0.
static size_t utf8_length(const unsigned char *s, size_t i, size_t end) {
  unsigned char c = s[i];
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (end - i < n || s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (size_t k = 2; k < n; k++)
    if (!is_continuation(s[i + k])) return 0;
  return n;
}

// The byte length of the cell at s[i].
static size_t cell_length(const unsigned char *s, size_t i, size_t end) {
  size_t n = s[i] >= 0x80 ? utf8_length(s, i, end) : 0;
  return n ? n : 1;
}

static void echo_cell(FILE *out, const unsigned char *s, size_t i, size_t n) {
  unsigned char c = s[i];
  if (n > 1)
    fwrite(s + i, 1, n, out);
  else if (c == '\t' || (c >= 0x20 && c < 0x7F))
    fputc(c, out);
  else
    fputc('?', out);
}

// --- the excerpt ------------------------------------------------------------------------

static int digits(int n) {
  int k = 1;
  while (n >= 10) {
    n /= 10;
    k++;
  }
  return k;
}

// Prints the source line of `loc` and the caret line under it.
static void print_excerpt(Diag *d, Loc loc) {
  size_t start, len;
  if (!find_line(d, loc.first_line, &start, &len)) return;
  const unsigned char *s = (const unsigned char *)d->file->text + start;

  // The caret's byte offset in the line, and the last byte to underline.
  size_t caret = loc.first_column > 1 ? (size_t)loc.first_column - 1 : 0;
  if (caret > len) caret = len;
  size_t last = caret;  // inclusive
  if (loc.last_line > loc.first_line)
    last = len > 0 ? len - 1 : 0;
  else if (loc.last_line == loc.first_line && loc.last_column >= loc.first_column)
    last = (size_t)loc.last_column - 1;
  if (last >= len) last = len > 0 ? len - 1 : 0;

  // A long line is cut to a window around the caret.
  size_t from = 0, to = len;
  if (len > ECHO_MAX) {
    from = caret > ECHO_BEFORE ? caret - ECHO_BEFORE : 0;
    to = from + ECHO_WINDOW < len ? from + ECHO_WINDOW : len;
    if (to - from < ECHO_WINDOW) from = to > ECHO_WINDOW ? to - ECHO_WINDOW : 0;
    while (from > 0 && from < caret && is_continuation(s[from])) from++;
    while (to < len && to > caret + 1 && is_continuation(s[to])) to--;
  }

  FILE *out = d->out;
  int width = digits(loc.first_line) > 5 ? digits(loc.first_line) : 5;
  fprintf(out, "%*d | ", width, loc.first_line);
  if (from > 0) fputs("...", out);
  for (size_t i = from; i < to;) {
    size_t n = cell_length(s, i, to);
    echo_cell(out, s, i, n);
    i += n;
  }
  if (to < len) fputs("...", out);
  fputc('\n', out);

  fprintf(out, "%*s | ", width, "");
  if (from > 0) fputs("   ", out);
  size_t i = from;
  while (i < caret) {
    size_t n = cell_length(s, i, to);
    fputc(s[i] == '\t' ? '\t' : ' ', out);
    i += n;
  }
  fputc('^', out);
  if (i < to) i += cell_length(s, i, to);
  while (i <= last && i < to) {
    fputc('~', out);
    i += cell_length(s, i, to);
  }
  fputc('\n', out);
}

// --- reporting --------------------------------------------------------------------------

static const char *level_name(DiagLevel level) {
  switch (level) {
  case DIAG_ERROR: return "error";
  case DIAG_WARNING: return "warning";
  case DIAG_NOTE: return "note";
  }
  return "error";
}

void diag_vreport(Diag *d, DiagLevel level, Loc loc, const char *fmt, va_list ap) {
  if (d->too_many) return;  // after the limit, even warnings and notes would be noise
  if (level == DIAG_WARNING && d->warnings_are_errors) level = DIAG_ERROR;
  if (level == DIAG_ERROR) {
    if (d->errors >= DIAG_MAX_ERRORS) {
      fprintf(d->out, "%s: error: too many errors (%d); stopping\n", path_of(d),
              DIAG_MAX_ERRORS);
      d->too_many = true;
      return;
    }
    d->errors++;
  } else if (level == DIAG_WARNING) {
    d->warnings++;
  }
  // quiet: errors only, with the notes that follow them.
  if (level != DIAG_NOTE) d->last_was_error = level == DIAG_ERROR;
  if (d->quiet && !d->last_was_error) return;

  if (loc.first_line <= 0) {
    fprintf(d->out, "%s: %s: ", path_of(d), level_name(level));
  } else {
    fprintf(d->out, "%s:%d:%d: %s: ", path_of(d), loc.first_line,
            loc.first_column > 0 ? loc.first_column : 1, level_name(level));
  }
  vfprintf(d->out, fmt, ap);
  fputc('\n', d->out);
  if (loc.first_line > 0) print_excerpt(d, loc);
}

void diag_error(Diag *d, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(d, DIAG_ERROR, loc, fmt, ap);
  va_end(ap);
}

void diag_warning(Diag *d, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(d, DIAG_WARNING, loc, fmt, ap);
  va_end(ap);
}

void diag_note(Diag *d, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(d, DIAG_NOTE, loc, fmt, ap);
  va_end(ap);
}
