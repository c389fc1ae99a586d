// checkpoint.c: the training state on disk. One file, DIR/checkpoint.gemc, little-endian:
//
//   offset  size  field
//        0     8  magic "GEMCCKPT"
//        8     4  format version (1)
//       12     4  length of the model name (at most 127)
//       16     8  total file size in bytes, trailer included
//       24     8  model key (a hash of the model's IR: another key is another model)
//       32     8  step
//       40     4  number of entries
//       44     .  the model name
//                 then per entry: u32 name length, the name, u64 data size, the data
//      end-8   8  FNV-1a 64 of every byte before it
//
// Saving writes a temporary file in DIR (file_io.h's AtomicFile), fsyncs it, renames it over
// the old checkpoint and fsyncs DIR, so a crash leaves either the old file or the new one.
// Loading opens the file once (a save racing it renames a new file in; the open one stays
// whole), checks the magic, the version, the size (truncation), the checksum, the model key,
// that the entries are exactly the ones asked for and that the float entries that must be
// finite are, before it writes a single byte into the caller's buffers.
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "file_io.h"
#include "hash.h"
#include "internal_error.h"

static const unsigned char magic[8] = {'G', 'E', 'M', 'C', 'C', 'K', 'P', 'T'};
enum {
  CKPT_VERSION = 1,
  HEADER_SIZE = 44,
  TRAILER_SIZE = 8,
  MAX_MODEL_NAME = 127,
  MAX_ENTRY_NAME = 4096,
};
static const int64_t MAX_CHECKPOINT_BYTES = (int64_t)1 << 40;  // 1 TiB

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

// --- saving -----------------------------------------------------------------------------

// A buffered writer to an AtomicFile that hashes what it writes. The first error sticks.
typedef struct Writer {
  AtomicFile *out;
  unsigned char buf[1 << 16];
  size_t used;
  uint64_t hash;
  bool failed;
  char err[512];
} Writer;

static void writer_flush(Writer *w) {
  if (!w->failed && w->used > 0)
    w->failed = !atomic_write(w->out, w->buf, w->used, w->err, sizeof w->err);
  w->used = 0;
}

static void writer_put(Writer *w, const void *data, size_t n) {
  const unsigned char *p = data;
  w->hash = fnv1a64(w->hash, data, n);
  while (n > 0 && !w->failed) {
    size_t room = sizeof w->buf - w->used;
    size_t take = n < room ? n : room;
    memcpy(w->buf + w->used, p, take);
    w->used += take;
    p += take;
    n -= take;
    if (w->used == sizeof w->buf) writer_flush(w);
  }
}

bool checkpoint_save(const char *dir, const char *model, uint64_t model_key, int64_t step,
                     const CkptEntry *e, int n, char *err, size_t err_size) {
  return checkpoint_save_named(dir, CHECKPOINT_FILE, model, model_key, step, e, n, err,
                               err_size);
}

bool checkpoint_save_named(const char *dir, const char *file, const char *model,
                           uint64_t model_key, int64_t step, const CkptEntry *e, int n,
                           char *err, size_t err_size) {
  size_t name_len = strlen(model);
  if (name_len > MAX_MODEL_NAME)
    return fail(err, err_size, "model name '%s' is too long for a checkpoint", model);
  GEMC_ASSERT(step >= 0);
  uint64_t total = HEADER_SIZE + name_len + TRAILER_SIZE;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(e[i].name);
    GEMC_ASSERT(len > 0 && len <= MAX_ENTRY_NAME);
    GEMC_ASSERT(e[i].data != NULL || e[i].size == 0);
    for (int j = 0; j < i; j++) GEMC_ASSERT(strcmp(e[i].name, e[j].name) != 0);
    total += 4 + len + 8 + e[i].size;
  }
  if (total > (uint64_t)MAX_CHECKPOINT_BYTES)
    return fail(err, err_size, "cannot write a checkpoint to %s: it would be %llu bytes, over "
                "the 1 TiB a checkpoint may be", dir, (unsigned long long)total);
  if (!file_make_dirs(dir, "checkpoint directory", err, err_size)) return false;

  char final_path[4200];
  if (snprintf(final_path, sizeof final_path, "%s/%s", dir, file) >= (int)sizeof final_path)
    return fail(err, err_size, "checkpoint directory name is too long: %s", dir);
  AtomicFile out;
  if (!atomic_begin(&out, final_path, err, err_size)) return false;

  Writer *w = xcalloc(1, sizeof *w);
  w->out = &out;
  w->hash = FNV1A64_INIT;

  unsigned char header[HEADER_SIZE];
  memcpy(header, magic, 8);
  put_u32(header + 8, CKPT_VERSION);
  put_u32(header + 12, (uint32_t)name_len);
  put_u64(header + 16, total);
  put_u64(header + 24, model_key);
  put_u64(header + 32, (uint64_t)step);
  put_u32(header + 40, (uint32_t)n);
  writer_put(w, header, sizeof header);
  writer_put(w, model, name_len);
  for (int i = 0; i < n; i++) {
    unsigned char word[8];
    size_t len = strlen(e[i].name);
    put_u32(word, (uint32_t)len);
    writer_put(w, word, 4);
    writer_put(w, e[i].name, len);
    put_u64(word, e[i].size);
    writer_put(w, word, 8);
    writer_put(w, e[i].data, e[i].size);
  }
  unsigned char trailer[8];
  put_u64(trailer, w->hash);
  writer_put(w, trailer, sizeof trailer);
  writer_flush(w);

  bool ok = !w->failed;
  if (!ok) {
    fail(err, err_size, "cannot write checkpoint %s: %s (the previous one, if any, is "
         "unchanged)", final_path, strerror(out.error ? out.error : EIO));
    atomic_abort(&out);
  }
  free(w);
  return ok && atomic_commit(&out, err, err_size);
}

// --- loading ----------------------------------------------------------------------------

// An open, verified checkpoint file: everything but the entries' data, and the descriptor
// the data is read from.
struct CkptFile {
  int fd;
  char path[4200];
  char model[MAX_MODEL_NAME + 1];
  uint64_t model_key;
  int64_t step;
  int n;
  char **names;
  uint64_t *sizes;
  uint64_t *offsets;  // where each entry's data starts in the file
};

static void index_free(CkptFile *x) {
  if (x->fd >= 0) close(x->fd);
  for (int i = 0; i < x->n; i++) free(x->names[i]);
  free(x->names);
  free(x->sizes);
  free(x->offsets);
  free(x);
}

// Reads exactly n bytes at `at`; the size was checked, so a short read is an I/O error.
static bool read_exact(CkptFile *x, void *buf, size_t n, uint64_t at, char *err,
                       size_t err_size) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t got = pread(x->fd, p, n, (off_t)at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return fail(err, err_size, "cannot read checkpoint %s: %s", x->path,
                  got < 0 ? strerror(errno) : "unexpected end of file");
    p += got;
    n -= (size_t)got;
    at += (uint64_t)got;
  }
  return true;
}

// Checks magic, version, size and checksum, then reads the directory of entries.
static bool index_open(CkptFile *x, const char *dir, const char *file, char *err,
                       size_t err_size) {
  x->fd = -1;
  if (snprintf(x->path, sizeof x->path, "%s/%s", dir, file) >= (int)sizeof x->path)
    return fail(err, err_size, "checkpoint directory name is too long: %s", dir);
  int64_t size = 0;
  char reason[512];
  x->fd = file_open_input(x->path, "checkpoint", MAX_CHECKPOINT_BYTES, &size, reason,
                          sizeof reason);
  if (x->fd < 0) {
    // "cannot open checkpoint PATH: ..." as before for a missing file.
    return fail(err, err_size, "%s", reason);
  }
  uint64_t actual = (uint64_t)size;

  unsigned char header[HEADER_SIZE];
  memset(header, 0, sizeof header);
  size_t got = actual < HEADER_SIZE ? (size_t)actual : HEADER_SIZE;
  if (!read_exact(x, header, got, 0, err, err_size)) return false;
  size_t magic_bytes = got < 8 ? got : 8;
  if (memcmp(header, magic, magic_bytes) != 0)
    return fail(err, err_size, "%s is not a gemc checkpoint (wrong magic number)", x->path);
  if (got < sizeof header || actual < HEADER_SIZE + TRAILER_SIZE)
    return fail(err, err_size, "checkpoint %s is truncated: %llu bytes, shorter than its "
                "header", x->path, (unsigned long long)actual);
  uint32_t version = get_u32(header + 8);
  if (version != CKPT_VERSION)
    return fail(err, err_size, "checkpoint %s has format version %u; this gemc reads version "
                "%d", x->path, version, CKPT_VERSION);
  uint64_t declared = get_u64(header + 16);
  if (actual < declared)
    return fail(err, err_size, "checkpoint %s is truncated: %llu bytes of the %llu its header "
                "promises", x->path, (unsigned long long)actual,
                (unsigned long long)declared);
  if (actual > declared)
    return fail(err, err_size, "checkpoint %s is corrupt: %llu bytes, but its header says "
                "%llu", x->path, (unsigned long long)actual, (unsigned long long)declared);

  // The checksum, over the whole file in one pass.
  unsigned char *chunk = xmalloc(1 << 20);
  uint64_t hash = FNV1A64_INIT, left = actual - TRAILER_SIZE, at = 0;
  bool ok = true;
  while (ok && left > 0) {
    size_t take = left < (1u << 20) ? (size_t)left : (1u << 20);
    ok = read_exact(x, chunk, take, at, err, err_size);
    hash = fnv1a64(hash, chunk, take);
    left -= take;
    at += take;
  }
  unsigned char trailer[8];
  ok = ok && read_exact(x, trailer, sizeof trailer, at, err, err_size);
  free(chunk);
  if (!ok) return false;
  if (get_u64(trailer) != hash)
    return fail(err, err_size, "checkpoint %s is corrupt: its checksum does not match its "
                "contents", x->path);

  // The directory. The checksum matched, so only a writer bug (or a forged file) could make
  // it inconsistent; it is still checked, since a crash is never the answer to a bad file.
  uint32_t name_len = get_u32(header + 12);
  x->model_key = get_u64(header + 24);
  uint64_t step = get_u64(header + 32);
  uint32_t n = get_u32(header + 40);
  uint64_t pos = HEADER_SIZE + (uint64_t)name_len, end = actual - TRAILER_SIZE;
  if (name_len > MAX_MODEL_NAME || pos > end || n > end / 12)
    return fail(err, err_size, "checkpoint %s is corrupt: bad header", x->path);
  // Every step leaves a loss (8 bytes) in the file, so a sane step is below its size.
  if (step > actual / 8)
    return fail(err, err_size, "checkpoint %s is corrupt: step %llu is out of range (the file "
                "of %llu bytes cannot hold its history)", x->path, (unsigned long long)step,
                (unsigned long long)actual);
  x->step = (int64_t)step;
  if (!read_exact(x, x->model, name_len, HEADER_SIZE, err, err_size)) return false;
  x->model[name_len] = '\0';
  x->names = xcalloc(n, sizeof *x->names);
  x->sizes = xcalloc(n, sizeof *x->sizes);
  x->offsets = xcalloc(n, sizeof *x->offsets);
  for (uint32_t i = 0; i < n; i++) {
    unsigned char word[8];
    if (end - pos < 4) return fail(err, err_size, "checkpoint %s is corrupt: entry %u runs "
                                   "past the end", x->path, i);
    if (!read_exact(x, word, 4, pos, err, err_size)) return false;
    uint32_t len = get_u32(word);
    pos += 4;
    if (len == 0 || len > MAX_ENTRY_NAME || end - pos < (uint64_t)len + 8)
      return fail(err, err_size, "checkpoint %s is corrupt: entry %u has a bad name", x->path,
                  i);
    x->names[i] = xmalloc(len + 1);
    x->n = (int)i + 1;
    if (!read_exact(x, x->names[i], len, pos, err, err_size) ||
        !read_exact(x, word, 8, pos + len, err, err_size))
      return false;
    x->names[i][len] = '\0';
    if (memchr(x->names[i], '\0', len))
      return fail(err, err_size, "checkpoint %s is corrupt: entry %u has a bad name", x->path,
                  i);
    pos += len + 8;
    x->sizes[i] = get_u64(word);
    if (end - pos < x->sizes[i])
      return fail(err, err_size, "checkpoint %s is corrupt: entry '%s' runs past the end",
                  x->path, x->names[i]);
    x->offsets[i] = pos;
    pos += x->sizes[i];
    for (uint32_t j = 0; j < i; j++)
      if (strcmp(x->names[j], x->names[i]) == 0)
        return fail(err, err_size, "checkpoint %s is corrupt: entry '%s' appears twice",
                    x->path, x->names[i]);
  }
  if (pos != end)
    return fail(err, err_size, "checkpoint %s is corrupt: %llu stray bytes after its entries",
                x->path, (unsigned long long)(end - pos));
  return true;
}

static int index_find(const CkptFile *x, const char *name) {
  for (int i = 0; i < x->n; i++)
    if (strcmp(x->names[i], name) == 0) return i;
  return -1;
}

// Reads entry k into a bounce buffer, a slice at a time, and checks its floats.
static bool check_floats(CkptFile *x, int k, CkptCheck check, char *err, size_t err_size) {
  if (x->sizes[k] % sizeof(float) != 0)
    return fail(err, err_size, "checkpoint %s is corrupt: entry '%s' is not a float array",
                x->path, x->names[k]);
  enum { SLICE = 1 << 16 };
  float *buf = xmalloc(SLICE * sizeof(float));
  uint64_t count = x->sizes[k] / sizeof(float), done = 0;
  bool ok = true;
  while (ok && done < count) {
    size_t take = count - done < SLICE ? (size_t)(count - done) : SLICE;
    ok = read_exact(x, buf, take * sizeof(float), x->offsets[k] + done * sizeof(float), err,
                    err_size);
    for (size_t i = 0; ok && i < take; i++) {
      if (!isfinite(buf[i]))
        ok = fail(err, err_size, "checkpoint %s: entry '%s' holds a non-finite value (%g at "
                  "element %llu); the training it saved had diverged, so it is not resumed",
                  x->path, x->names[k], (double)buf[i], (unsigned long long)(done + i));
      else if (check == CKPT_FINITE_NONNEG && buf[i] < 0)
        ok = fail(err, err_size, "checkpoint %s is corrupt: entry '%s' holds a negative value "
                  "(%g at element %llu), which it cannot", x->path, x->names[k],
                  (double)buf[i], (unsigned long long)(done + i));
    }
    done += take;
  }
  free(buf);
  return ok;
}

CkptFile *checkpoint_open(const char *dir, CkptInfo *info, char *err, size_t err_size) {
  return checkpoint_open_named(dir, CHECKPOINT_FILE, info, err, err_size);
}

CkptFile *checkpoint_open_named(const char *dir, const char *file, CkptInfo *info, char *err,
                                size_t err_size) {
  CkptFile *x = xcalloc(1, sizeof *x);
  if (info) memset(info, 0, sizeof *info);
  if (!index_open(x, dir, file, err, err_size)) {
    index_free(x);
    return NULL;
  }
  if (info) {
    snprintf(info->model, sizeof info->model, "%s", x->model);
    info->model_key = x->model_key;
    info->step = x->step;
    info->nentries = x->n;
    info->names = xcalloc((size_t)x->n, sizeof *info->names);
    info->sizes = xcalloc((size_t)x->n, sizeof *info->sizes);
    for (int i = 0; i < x->n; i++) {
      info->names[i] = xstrdup(x->names[i]);
      info->sizes[i] = (size_t)x->sizes[i];
    }
  }
  return x;
}

const char *checkpoint_path(const CkptFile *f) { return f->path; }

bool checkpoint_read(CkptFile *x, uint64_t model_key, const CkptEntry *e, int n, char *err,
                     size_t err_size) {
  bool ok = true;
  if (x->model_key != model_key)
    ok = fail(err, err_size, "checkpoint %s was written for model '%s' with other shapes or "
              "another graph (model key %016llx; this model's is %016llx); it cannot be "
              "loaded into this model", x->path, x->model, (unsigned long long)x->model_key,
              (unsigned long long)model_key);
  // Every entry asked for is there with its size, and there is no other.
  for (int i = 0; ok && i < n; i++) {
    int k = index_find(x, e[i].name);
    if (k < 0)
      ok = fail(err, err_size, "checkpoint %s has no entry '%s' (written by another version "
                "of the training loop?)", x->path, e[i].name);
    else if (x->sizes[k] != e[i].size)
      ok = fail(err, err_size, "checkpoint %s: entry '%s' has %llu bytes, this model needs "
                "%llu (other shapes)", x->path, e[i].name, (unsigned long long)x->sizes[k],
                (unsigned long long)e[i].size);
  }
  for (int k = 0; ok && k < x->n; k++) {
    bool wanted = false;
    for (int i = 0; i < n && !wanted; i++) wanted = strcmp(e[i].name, x->names[k]) == 0;
    if (!wanted)
      ok = fail(err, err_size, "checkpoint %s has an entry '%s' that this model does not have",
                x->path, x->names[k]);
  }
  for (int i = 0; ok && i < n; i++)
    if (e[i].check != CKPT_ANY)
      ok = check_floats(x, index_find(x, e[i].name), e[i].check, err, err_size);
  for (int i = 0; ok && i < n; i++) {
    if (!e[i].data) continue;  // checked only: the caller reads it with checkpoint_read_slice
    int k = index_find(x, e[i].name);
    ok = read_exact(x, e[i].data, e[i].size, x->offsets[k], err, err_size);
  }
  return ok;
}

bool checkpoint_read_slice(CkptFile *x, const char *name, uint64_t offset, void *data,
                           size_t size, char *err, size_t err_size) {
  int k = index_find(x, name);
  if (k < 0)
    return fail(err, err_size, "checkpoint %s has no entry '%s' (written by another version "
                "of the training loop?)", x->path, name);
  if (offset > x->sizes[k] || size > x->sizes[k] - offset)
    return fail(err, err_size, "checkpoint %s: entry '%s' has %llu bytes, not the %llu from "
                "byte %llu asked for (other shapes)", x->path, name,
                (unsigned long long)x->sizes[k], (unsigned long long)size,
                (unsigned long long)offset);
  return read_exact(x, data, size, x->offsets[k] + offset, err, err_size);
}

bool checkpoint_read_entry(CkptFile *x, const char *name, void *data, size_t size, char *err,
                           size_t err_size) {
  int k = index_find(x, name);
  if (k < 0)
    return fail(err, err_size, "checkpoint %s has no entry '%s' (written by another version "
                "of the training loop?)", x->path, name);
  if (x->sizes[k] != size)
    return fail(err, err_size, "checkpoint %s: entry '%s' has %llu bytes, this model needs "
                "%llu (other shapes)", x->path, name, (unsigned long long)x->sizes[k],
                (unsigned long long)size);
  return read_exact(x, data, size, x->offsets[k], err, err_size);
}

void checkpoint_close(CkptFile *f) {
  if (f) index_free(f);
}

bool checkpoint_load(const char *dir, uint64_t model_key, int64_t *step, const CkptEntry *e,
                     int n, char *err, size_t err_size) {
  CkptFile *x = checkpoint_open(dir, NULL, err, err_size);
  if (!x) return false;
  bool ok = checkpoint_read(x, model_key, e, n, err, err_size);
  if (ok) *step = x->step;
  checkpoint_close(x);
  return ok;
}

bool checkpoint_info(const char *dir, CkptInfo *info, char *err, size_t err_size) {
  CkptFile *x = checkpoint_open(dir, info, err, err_size);
  checkpoint_close(x);
  return x != NULL;
}

void checkpoint_info_free(CkptInfo *info) {
  for (int i = 0; i < info->nentries; i++) free(info->names[i]);
  free(info->names);
  free(info->sizes);
  memset(info, 0, sizeof *info);
}

int64_t checkpoint_info_size(const CkptInfo *info, const char *name) {
  for (int i = 0; i < info->nentries; i++)
    if (strcmp(info->names[i], name) == 0) return (int64_t)info->sizes[i];
  return -1;
}
