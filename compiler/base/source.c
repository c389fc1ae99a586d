// source.c: reading a .gem file into memory, whole and NUL-terminated.
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "diag.h"            // defines: SourceFile, source_read
#include "internal_error.h"  // defines: gemc_internal_error

enum { SOURCE_MAX_BYTES = 64 * 1024 * 1024 };

static bool read_failed(const char *path, const char *reason) {
  fprintf(stderr, "gemc: error: cannot read %s: %s\n", path, reason);
  return false;
}

bool source_read(SourceFile *f, const char *path) {
  memset(f, 0, sizeof *f);
  FILE *in = fopen(path, "rb");
  if (!in) return read_failed(path, strerror(errno));

  // Read in growing chunks rather than trusting the file size: PATH may be a pipe.
  char *text = NULL;
  size_t size = 0, cap = 0;
  for (;;) {
    if (cap - size < 2) {
      size_t next = cap ? 2 * cap : 64 * 1024;
      char *bigger = xrealloc(text, next);
      text = bigger;
      cap = next;
    }
    size_t n = fread(text + size, 1, cap - size - 1, in);
    size += n;
    if (size > SOURCE_MAX_BYTES) {
      fclose(in);
      free(text);
      return read_failed(path, "the file is larger than 64 MiB");
    }
    if (n == 0) break;
  }
  if (ferror(in)) {
    int err = errno;
    fclose(in);
    free(text);
    return read_failed(path, strerror(err ? err : EIO));
  }
  fclose(in);
  text[size] = '\0';
  f->path = path;
  f->text = text;
  f->size = size;
  return true;
}

void source_free(SourceFile *f) {
  // Only for files from source_read: source_from_memory's text belongs to the caller.
  free((char *)(uintptr_t)f->text);
  f->text = NULL;
  f->size = 0;
}

void source_from_memory(SourceFile *f, const char *path, const char *text, size_t size) {
  f->path = path;
  f->text = text;
  f->size = size;
}
