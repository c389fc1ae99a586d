// source.c: reading a .gem file into memory, whole and NUL-terminated.
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
  // O_NONBLOCK: a FIFO is refused below rather than waited on for ever.
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return read_failed(path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return read_failed(path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    if (S_ISDIR(st.st_mode)) return read_failed(path, strerror(EISDIR));
    return read_failed(path, S_ISFIFO(st.st_mode) ? "it is a FIFO, not a regular file"
                                                  : "not a regular file");
  }
  if (st.st_size > SOURCE_MAX_BYTES) {
    close(fd);
    return read_failed(path, "the file is larger than 64 MiB");
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  FILE *in = fdopen(fd, "rb");
  if (!in) {
    close(fd);
    return read_failed(path, strerror(errno));
  }

  // Read in growing chunks rather than trusting the size: the file may grow meanwhile.
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
  f->path = xstrdup(path);  // its own copy: the IR and the messages keep pointing at it
  f->text = text;
  f->size = size;
  return true;
}

void source_free(SourceFile *f) {
  // Only for files from source_read: source_from_memory's path and text belong to the caller.
  free((char *)(uintptr_t)f->text);
  free((char *)(uintptr_t)f->path);
  f->text = NULL;
  f->path = NULL;
  f->size = 0;
}

void source_from_memory(SourceFile *f, const char *path, const char *text, size_t size) {
  f->path = path;
  f->text = text;
  f->size = size;
}
