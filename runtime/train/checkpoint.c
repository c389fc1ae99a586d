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
// Saving writes a temporary file in DIR, fsyncs it, renames it over the old checkpoint and
// fsyncs DIR, so a crash leaves either the old file or the new one. Loading checks the magic,
// the version, the size (truncation), the checksum, the model key and then that the entries
// are exactly the ones asked for, before it writes a single byte into the caller's buffers.
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
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

static void file_path(char *buf, size_t size, const char *dir) {
  snprintf(buf, size, "%s/%s", dir, CHECKPOINT_FILE);
}

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

// A buffered writer to a file descriptor that hashes what it writes. The first error sticks.
typedef struct Writer {
  int fd;
  unsigned char buf[1 << 16];
  size_t used;
  uint64_t hash;
  int error;  // errno of the first failure, 0 when none
} Writer;

static void writer_flush(Writer *w) {
  size_t done = 0;
  while (w->error == 0 && done < w->used) {
    ssize_t got = write(w->fd, w->buf + done, w->used - done);
    if (got < 0) {
      if (errno != EINTR) w->error = errno;
    } else if (got == 0) {
      w->error = EIO;
    } else {
      done += (size_t)got;
    }
  }
  w->used = 0;
}

static void writer_put(Writer *w, const void *data, size_t n) {
  const unsigned char *p = data;
  w->hash = fnv1a64(w->hash, data, n);
  while (n > 0 && w->error == 0) {
    size_t room = sizeof w->buf - w->used;
    size_t take = n < room ? n : room;
    memcpy(w->buf + w->used, p, take);
    w->used += take;
    p += take;
    n -= take;
    if (w->used == sizeof w->buf) writer_flush(w);
  }
}

// mkdir -p: creates DIR and any missing parent.
static bool make_dirs(const char *dir, char *err, size_t err_size) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return fail(err, err_size, "checkpoint directory name is too long: %s", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
      return fail(err, err_size, "cannot create checkpoint directory %s: %s", path,
                  strerror(errno));
    *p = '/';
  }
  if (mkdir(path, 0777) != 0 && errno != EEXIST)
    return fail(err, err_size, "cannot create checkpoint directory %s: %s", dir,
                strerror(errno));
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return fail(err, err_size, "checkpoint directory %s is not a directory", dir);
  return true;
}

static bool fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return false;
  bool ok = fsync(fd) == 0;
  close(fd);
  return ok;
}

bool checkpoint_save(const char *dir, const char *model, uint64_t model_key, int64_t step,
                     const CkptEntry *e, int n, char *err, size_t err_size) {
  size_t name_len = strlen(model);
  if (name_len > MAX_MODEL_NAME)
    return fail(err, err_size, "model name '%s' is too long for a checkpoint", model);
  uint64_t total = HEADER_SIZE + name_len + TRAILER_SIZE;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(e[i].name);
    GEMC_ASSERT(len > 0 && len <= MAX_ENTRY_NAME);
    GEMC_ASSERT(e[i].data != NULL || e[i].size == 0);
    for (int j = 0; j < i; j++) GEMC_ASSERT(strcmp(e[i].name, e[j].name) != 0);
    total += 4 + len + 8 + e[i].size;
  }
  if (!make_dirs(dir, err, err_size)) return false;

  char final_path[4200], temp_path[4200];
  file_path(final_path, sizeof final_path, dir);
  snprintf(temp_path, sizeof temp_path, "%s/.%s.XXXXXX", dir, CHECKPOINT_FILE);
  int fd = mkstemp(temp_path);
  if (fd < 0)
    return fail(err, err_size, "cannot create a temporary file in %s: %s", dir,
                strerror(errno));

  Writer *w = xcalloc(1, sizeof *w);
  w->fd = fd;
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

  int error = w->error;
  free(w);
  if (error == 0 && fsync(fd) != 0) error = errno;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && rename(temp_path, final_path) != 0) error = errno;
  if (error != 0) {
    unlink(temp_path);
    return fail(err, err_size, "cannot write checkpoint %s: %s (the previous one, if any, is "
                "unchanged)", final_path, strerror(error));
  }
  if (!fsync_dir(dir))
    return fail(err, err_size, "cannot fsync checkpoint directory %s: %s", dir,
                strerror(errno));
  return true;
}

// --- loading ----------------------------------------------------------------------------

// The verified directory of a checkpoint file: everything but the entries' data.
typedef struct Index {
  FILE *f;
  char path[4200];
  char model[MAX_MODEL_NAME + 1];
  uint64_t model_key;
  int64_t step;
  int n;
  char **names;
  uint64_t *sizes;
  uint64_t *offsets;  // where each entry's data starts in the file
} Index;

static void index_free(Index *x) {
  if (x->f) fclose(x->f);
  for (int i = 0; i < x->n; i++) free(x->names[i]);
  free(x->names);
  free(x->sizes);
  free(x->offsets);
  memset(x, 0, sizeof *x);
}

// Reads exactly n bytes; the size was checked, so a short read is an I/O error.
static bool read_exact(Index *x, void *buf, size_t n, char *err, size_t err_size) {
  if (fread(buf, 1, n, x->f) == n) return true;
  return fail(err, err_size, "cannot read checkpoint %s: %s", x->path,
              ferror(x->f) ? strerror(errno) : "unexpected end of file");
}

// Checks magic, version, size and checksum, then reads the directory of entries.
static bool index_open(Index *x, const char *dir, char *err, size_t err_size) {
  memset(x, 0, sizeof *x);
  file_path(x->path, sizeof x->path, dir);
  x->f = fopen(x->path, "rb");
  if (!x->f)
    return fail(err, err_size, "cannot open checkpoint %s: %s", x->path, strerror(errno));
  struct stat st;
  if (fstat(fileno(x->f), &st) != 0 || !S_ISREG(st.st_mode))
    return fail(err, err_size, "checkpoint %s is not a regular file", x->path);
  uint64_t actual = (uint64_t)st.st_size;

  unsigned char header[HEADER_SIZE];
  size_t got = fread(header, 1, sizeof header, x->f);
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
  rewind(x->f);
  uint64_t hash = FNV1A64_INIT, left = actual - TRAILER_SIZE;
  bool ok = true;
  while (ok && left > 0) {
    size_t take = left < (1u << 20) ? (size_t)left : (1u << 20);
    ok = read_exact(x, chunk, take, err, err_size);
    hash = fnv1a64(hash, chunk, take);
    left -= take;
  }
  unsigned char trailer[8];
  ok = ok && read_exact(x, trailer, sizeof trailer, err, err_size);
  free(chunk);
  if (!ok) return false;
  if (get_u64(trailer) != hash)
    return fail(err, err_size, "checkpoint %s is corrupt: its checksum does not match its "
                "contents", x->path);

  // The directory. The checksum matched, so only a writer bug could make it inconsistent;
  // it is still checked, since a crash is never the answer to a bad file.
  uint32_t name_len = get_u32(header + 12);
  x->model_key = get_u64(header + 24);
  x->step = (int64_t)get_u64(header + 32);
  uint32_t n = get_u32(header + 40);
  uint64_t pos = HEADER_SIZE + (uint64_t)name_len, end = actual - TRAILER_SIZE;
  if (name_len > MAX_MODEL_NAME || pos > end || n > end / 12)
    return fail(err, err_size, "checkpoint %s is corrupt: bad header", x->path);
  if (fseek(x->f, HEADER_SIZE, SEEK_SET) != 0 || !read_exact(x, x->model, name_len, err, err_size))
    return false;
  x->model[name_len] = '\0';
  x->names = xcalloc(n, sizeof *x->names);
  x->sizes = xcalloc(n, sizeof *x->sizes);
  x->offsets = xcalloc(n, sizeof *x->offsets);
  for (uint32_t i = 0; i < n; i++) {
    unsigned char word[8];
    if (end - pos < 4) return fail(err, err_size, "checkpoint %s is corrupt: entry %u runs "
                                   "past the end", x->path, i);
    if (fseek(x->f, (long)pos, SEEK_SET) != 0 || !read_exact(x, word, 4, err, err_size))
      return false;
    uint32_t len = get_u32(word);
    pos += 4;
    if (len == 0 || len > MAX_ENTRY_NAME || end - pos < (uint64_t)len + 8)
      return fail(err, err_size, "checkpoint %s is corrupt: entry %u has a bad name", x->path,
                  i);
    x->names[i] = xmalloc(len + 1);
    x->n = (int)i + 1;
    if (!read_exact(x, x->names[i], len, err, err_size) || !read_exact(x, word, 8, err, err_size))
      return false;
    x->names[i][len] = '\0';
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

static int index_find(const Index *x, const char *name) {
  for (int i = 0; i < x->n; i++)
    if (strcmp(x->names[i], name) == 0) return i;
  return -1;
}

bool checkpoint_load(const char *dir, uint64_t model_key, int64_t *step, const CkptEntry *e,
                     int n, char *err, size_t err_size) {
  Index x;
  bool ok = index_open(&x, dir, err, err_size);
  if (ok && x.model_key != model_key)
    ok = fail(err, err_size, "checkpoint %s was written for model '%s' with other shapes or "
              "another graph (model key %016llx; this model's is %016llx); it cannot be "
              "loaded into this model", x.path, x.model, (unsigned long long)x.model_key,
              (unsigned long long)model_key);
  // Every entry asked for is there with its size, and there is no other.
  for (int i = 0; ok && i < n; i++) {
    int k = index_find(&x, e[i].name);
    if (k < 0)
      ok = fail(err, err_size, "checkpoint %s has no entry '%s' (written by another version "
                "of the training loop?)", x.path, e[i].name);
    else if (x.sizes[k] != e[i].size)
      ok = fail(err, err_size, "checkpoint %s: entry '%s' has %llu bytes, this model needs "
                "%llu (other shapes)", x.path, e[i].name, (unsigned long long)x.sizes[k],
                (unsigned long long)e[i].size);
  }
  for (int k = 0; ok && k < x.n; k++) {
    bool wanted = false;
    for (int i = 0; i < n && !wanted; i++) wanted = strcmp(e[i].name, x.names[k]) == 0;
    if (!wanted)
      ok = fail(err, err_size, "checkpoint %s has an entry '%s' that this model does not have",
                x.path, x.names[k]);
  }
  for (int i = 0; ok && i < n; i++) {
    int k = index_find(&x, e[i].name);
    ok = fseek(x.f, (long)x.offsets[k], SEEK_SET) == 0 &&
         read_exact(&x, e[i].data, e[i].size, err, err_size);
  }
  if (ok) *step = x.step;
  index_free(&x);
  return ok;
}

bool checkpoint_info(const char *dir, CkptInfo *info, char *err, size_t err_size) {
  memset(info, 0, sizeof *info);
  Index x;
  if (!index_open(&x, dir, err, err_size)) {
    index_free(&x);
    return false;
  }
  snprintf(info->model, sizeof info->model, "%s", x.model);
  info->model_key = x.model_key;
  info->step = x.step;
  info->nentries = x.n;
  info->names = xcalloc((size_t)x.n, sizeof *info->names);
  info->sizes = xcalloc((size_t)x.n, sizeof *info->sizes);
  for (int i = 0; i < x.n; i++) {
    info->names[i] = x.names[i];
    x.names[i] = NULL;
    info->sizes[i] = (size_t)x.sizes[i];
  }
  index_free(&x);
  return true;
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
