// diag.h: diagnostics in the form gcc and clang print them.
//   file:line:col: error: message
//    12 |   h = embed(itemz, history);
//       |             ^~~~~
// defines: Loc, SourceFile, Diag, diag_error, diag_warning, diag_note
#ifndef GEMC_DIAG_H
#define GEMC_DIAG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

// A source range. Lines and columns count from 1; columns count bytes. The range covers
// [first, last] inclusive, and may span lines.
typedef struct Loc {
  int first_line, first_column;
  int last_line, last_column;
} Loc;

// One source file held in memory. `text` is NUL-terminated after `size` bytes but may
// contain NUL bytes itself.
typedef struct SourceFile {
  const char *path;
  const char *text;
  size_t size;
} SourceFile;

enum { DIAG_MAX_ERRORS = 20 };

typedef enum DiagLevel { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } DiagLevel;

typedef struct Diag {
  const SourceFile *file;
  FILE *out;           // where messages go; stderr by default
  int errors;          // errors reported so far (at most DIAG_MAX_ERRORS)
  int warnings;
  bool too_many;       // set once the error limit is hit; callers stop early
  bool warnings_are_errors;
  bool quiet;          // print errors and their notes only: no warnings, no lone notes
  // Private to diag.c: the start of the source line it looked up last, so that a run of
  // diagnostics in file order finds each line without rescanning the file.
  int cached_line;       // 0: nothing cached
  size_t cached_offset;
  bool last_was_error; // private: whether the last error or warning was an error (for -q)
} Diag;

void diag_init(Diag *d, const SourceFile *file, FILE *out);
// Each reports at `loc`, prints the source line with a caret and underline, and returns.
// After DIAG_MAX_ERRORS errors, diag_error prints "too many errors; stopping" once, sets
// too_many, and ignores further errors.
void diag_error(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warning(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_vreport(Diag *d, DiagLevel level, Loc loc, const char *fmt, va_list ap);

// Reads a whole file. On failure prints "gemc: error: cannot read PATH: reason" and returns
// false. Files over 64 MiB are refused with a clear error. The SourceFile owns its text and a
// copy of `path` (what the IR and the messages point at) until source_free.
bool source_read(SourceFile *f, const char *path);
void source_free(SourceFile *f);
// A source file from memory (used by tests and the fuzzer); `text` must outlive it.
void source_from_memory(SourceFile *f, const char *path, const char *text, size_t size);

#endif
