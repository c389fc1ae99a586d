// jit_cache.c: the on-disk cubin cache (key, entry format, atomic writes, corruption checks)
// and the parallel get-or-compile of jit_cache.h.
#include "jit_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "crc32.h"
#include "hash.h"

enum { ENTRY_FORMAT = 1, HEADER_BYTES = 40 };
static const char ENTRY_MAGIC[8] = {'G', 'E', 'M', 'C', 'J', 'I', 'T', '1'};

// Hashes a field with its length in front, so that ("ab","c") and ("a","bc") differ.
static uint64_t hash_field(uint64_t h, const void *data, size_t n) {
  uint64_t len = n;
  h = fnv1a64(h, &len, sizeof len);
  return fnv1a64(h, data, n);
}

uint64_t jit_cache_key(const char *source, const char *arch, const char *const *options,
                       int noptions, int compiler_version, const char *gemc_version) {
  uint64_t h = FNV1A64_INIT;
  h = hash_field(h, source, strlen(source));
  h = hash_field(h, arch, strlen(arch));
  for (int i = 0; i < noptions; i++) h = hash_field(h, options[i], strlen(options[i]));
  int64_t v = compiler_version;
  h = hash_field(h, &v, sizeof v);
  return hash_field(h, gemc_version, strlen(gemc_version));
}

static bool make_dirs(const char *path, char *err, size_t err_size) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) goto fail;
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) goto fail;
  return true;
fail:
  snprintf(err, err_size, "cannot create the cache directory %s: %s", buf, strerror(errno));
  return false;
}

bool jit_cache_dir(char *out, size_t size, char *err, size_t err_size) {
  const char *env = getenv("GEMC_CACHE_DIR");
  if (env && *env) {
    snprintf(out, size, "%s", env);
  } else {
    const char *home = getenv("HOME");
    if (!home || !*home) {
      snprintf(err, err_size, "neither GEMC_CACHE_DIR nor HOME is set");
      return false;
    }
    snprintf(out, size, "%s/.cache/gemc", home);
  }
  return make_dirs(out, err, err_size);
}

void jit_cache_path(const char *dir, const char *arch, uint64_t key, char *out, size_t size) {
  snprintf(out, size, "%s/%s-%016llx.cubin", dir, arch, (unsigned long long)key);
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

// Header: magic[8] format[4] reserved[4] key[8] size[8] payload_crc[4] header_crc[4].
static void write_header(unsigned char *h, uint64_t key, const void *image, size_t size) {
  memcpy(h, ENTRY_MAGIC, 8);
  put_u32(h + 8, ENTRY_FORMAT);
  put_u32(h + 12, 0);
  put_u64(h + 16, key);
  put_u64(h + 24, size);
  put_u32(h + 32, crc32_update(0, image, size));
  put_u32(h + 36, crc32_update(0, h, 36));
}

static bool set_err(char *err, size_t err_size, const char *path, const char *reason) {
  if (err && err_size) snprintf(err, err_size, "%s: %s", path, reason);
  return false;
}

bool jit_cache_load(const char *dir, const char *arch, uint64_t key, void **image, size_t *size,
                    bool *corrupt, char *err, size_t err_size) {
  char path[4200];
  jit_cache_path(dir, arch, key, path, sizeof path);
  *image = NULL;
  *size = 0;
  *corrupt = false;
  FILE *f = fopen(path, "rb");
  if (!f) return set_err(err, err_size, path, "not cached");
  unsigned char h[HEADER_BYTES];
  bool ok = fread(h, 1, sizeof h, f) == sizeof h;
  *corrupt = true;
  if (!ok) {
    fclose(f);
    return set_err(err, err_size, path, "truncated header");
  }
  if (memcmp(h, ENTRY_MAGIC, 8) != 0 || get_u32(h + 36) != crc32_update(0, h, 36)) {
    fclose(f);
    return set_err(err, err_size, path, "bad header");
  }
  if (get_u32(h + 8) != ENTRY_FORMAT || get_u64(h + 16) != key) {
    fclose(f);
    return set_err(err, err_size, path, "written for another key or format");
  }
  uint64_t n = get_u64(h + 24);
  void *buf = n < ((uint64_t)1 << 32) ? malloc(n ? n : 1) : NULL;
  if (!buf) {
    fclose(f);
    return set_err(err, err_size, path, "implausible size");
  }
  int extra;
  ok = fread(buf, 1, n, f) == n && (extra = fgetc(f)) == EOF;
  fclose(f);
  if (!ok) {
    free(buf);
    return set_err(err, err_size, path, "truncated or too long");
  }
  if (crc32_update(0, buf, n) != get_u32(h + 32)) {
    free(buf);
    return set_err(err, err_size, path, "checksum mismatch");
  }
  *corrupt = false;
  *image = buf;
  *size = n;
  return true;
}

static bool write_all(int fd, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= (size_t)w;
  }
  return true;
}

bool jit_cache_store(const char *dir, const char *arch, uint64_t key, const void *image,
                     size_t size, char *err, size_t err_size) {
  char path[4200], tmp[4300];
  jit_cache_path(dir, arch, key, path, sizeof path);
  static _Atomic unsigned counter;
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), counter++);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  // A directory named by --cache or GEMC_CACHE_DIR that does not exist yet is made.
  if (fd < 0 && errno == ENOENT && make_dirs(dir, err, err_size))
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return set_err(err, err_size, tmp, "cannot write the cache entry");
  unsigned char h[HEADER_BYTES];
  write_header(h, key, image, size);
  bool ok = write_all(fd, h, sizeof h) && write_all(fd, image, size) && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (ok) ok = rename(tmp, path) == 0;
  if (!ok) {
    unlink(tmp);
    return set_err(err, err_size, path, "cannot write the cache entry");
  }
  return true;
}

// --- get or compile, in parallel --------------------------------------------------------

typedef struct Worker {
  const JitRequest *r;
  JitUnit *units;
  int nunits;
  pthread_mutex_t *lock;
  int *next;
  int *failed;      // index of the first failing unit, or -1
  int hits, misses, rebuilt;
} Worker;

static bool run_unit(const JitRequest *r, JitUnit *u, Worker *w) {
  double t0 = monotonic_seconds();
  uint64_t key = 0;
  bool corrupt = false;
  if (r->cache_dir) {
    key = jit_cache_key(u->source, r->arch, r->options, r->noptions, r->compiler_version,
                        r->gemc_version);
    if (jit_cache_load(r->cache_dir, r->arch, key, &u->image, &u->size, &corrupt, NULL, 0)) {
      u->from_cache = true;
      u->seconds = monotonic_seconds() - t0;
      w->hits++;
      return true;
    }
  }
  u->log[0] = 0;
  if (!r->compile(r->compile_ctx, u->source, u->name, r->arch, r->options, r->noptions,
                  &u->image, &u->size, u->log, sizeof u->log))
    return false;
  w->misses++;
  if (corrupt) {
    u->rebuilt = true;
    w->rebuilt++;
  }
  if (r->cache_dir) {
    char err[256];
    (void)jit_cache_store(r->cache_dir, r->arch, key, u->image, u->size, err, sizeof err);
  }
  u->seconds = monotonic_seconds() - t0;
  return true;
}

static void *worker_main(void *arg) {
  Worker *w = arg;
  for (;;) {
    pthread_mutex_lock(w->lock);
    int i = *w->failed < 0 && *w->next < w->nunits ? (*w->next)++ : -1;
    pthread_mutex_unlock(w->lock);
    if (i < 0) return NULL;
    if (!run_unit(w->r, &w->units[i], w)) {
      pthread_mutex_lock(w->lock);
      if (*w->failed < 0 || i < *w->failed) *w->failed = i;
      pthread_mutex_unlock(w->lock);
    }
  }
}

bool jit_compile_units(const JitRequest *r, JitUnit *units, int nunits, JitStats *stats,
                       char *err, size_t err_size) {
  double t0 = monotonic_seconds();
  int threads = r->threads;
  if (threads <= 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cpus > 0 ? (int)cpus : 1;
    if (threads > 16) threads = 16;
  }
  if (threads > nunits) threads = nunits > 0 ? nunits : 1;
  for (int i = 0; i < nunits; i++) {
    units[i].image = NULL;
    units[i].size = 0;
    units[i].from_cache = units[i].rebuilt = false;
    units[i].seconds = 0;
    units[i].log[0] = 0;
  }
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  int next = 0, failed = -1;
  Worker *workers = calloc((size_t)threads, sizeof *workers);
  pthread_t *ids = calloc((size_t)threads, sizeof *ids);
  bool *started = calloc((size_t)threads, sizeof *started);
  for (int k = 0; k < threads; k++) {
    workers[k] = (Worker){.r = r, .units = units, .nunits = nunits, .lock = &lock,
                          .next = &next, .failed = &failed};
    // The calling thread is worker 0; the others are threads (or run inline if one cannot
    // start).
    if (k > 0) started[k] = pthread_create(&ids[k], NULL, worker_main, &workers[k]) == 0;
  }
  worker_main(&workers[0]);
  for (int k = 1; k < threads; k++)
    if (started[k]) pthread_join(ids[k], NULL);
  JitStats s = {.units = nunits};
  for (int k = 0; k < threads; k++) {
    s.hits += workers[k].hits;
    s.misses += workers[k].misses;
    s.rebuilt += workers[k].rebuilt;
  }
  s.seconds = monotonic_seconds() - t0;
  if (stats) *stats = s;
  free(workers);
  free(ids);
  free(started);
  pthread_mutex_destroy(&lock);
  if (failed >= 0) {
    snprintf(err, err_size, "compiling %s for %s failed:\n%s", units[failed].name, r->arch,
             units[failed].log[0] ? units[failed].log : "(no log)");
    jit_units_free(units, nunits);
    return false;
  }
  return true;
}

void jit_units_free(JitUnit *units, int nunits) {
  for (int i = 0; i < nunits; i++) {
    free(units[i].image);
    units[i].image = NULL;
    units[i].size = 0;
  }
}

// --- splitting a module into kernels ----------------------------------------------------

static bool starts_line_with(const char *s, const char *p, const char *prefix) {
  return (p == s || p[-1] == '\n') && strncmp(p, prefix, strlen(prefix)) == 0;
}

// The end of the kernel whose `extern "C"` line starts at p: just past the '}' that closes its
// body (comments, strings and character literals skipped). NULL when it does not close.
static const char *kernel_end(const char *p) {
  int depth = 0;
  bool opened = false;
  for (; *p; p++) {
    if (p[0] == '/' && p[1] == '/') {
      while (*p && *p != '\n') p++;
      if (!*p) return NULL;
    } else if (p[0] == '/' && p[1] == '*') {
      const char *e = strstr(p + 2, "*/");
      if (!e) return NULL;
      p = e + 1;
    } else if (*p == '"' || *p == '\'') {
      char q = *p;
      for (p++; *p && *p != q; p++)
        if (*p == '\\' && p[1]) p++;
      if (!*p) return NULL;
    } else if (*p == '{') {
      depth++;
      opened = true;
    } else if (*p == '}') {
      if (--depth == 0 && opened) return p + 1;
    } else if (*p == ';' && !opened) {
      return NULL;  // a declaration, not a definition
    }
  }
  return NULL;
}

int jit_split_source(const char *source, char ***out) {
  *out = NULL;
  int n = 0, cap = 0;
  const char **starts = NULL, **ends = NULL;
  const char *p = source;
  while ((p = strstr(p, "extern \"C\"")) != NULL) {
    if (!starts_line_with(source, p, "extern \"C\"")) {
      p++;
      continue;
    }
    const char *end = kernel_end(p);
    if (!end) {
      p++;
      continue;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      starts = realloc(starts, (size_t)cap * sizeof *starts);
      ends = realloc(ends, (size_t)cap * sizeof *ends);
    }
    starts[n] = p;
    ends[n++] = end;
    p = end;
  }
  if (n == 0) {
    free(starts);
    free(ends);
    return 0;
  }
  // Unit i: the whole source with every other kernel's definition left out, so that helpers
  // and types defined anywhere between kernels stay visible to each kernel.
  size_t total = strlen(source), kernels = 0;
  for (int i = 0; i < n; i++) kernels += (size_t)(ends[i] - starts[i]);
  char **units = calloc((size_t)n, sizeof *units);
  for (int i = 0; i < n; i++) {
    size_t len = total - kernels + (size_t)(ends[i] - starts[i]);
    char *u = malloc(len + 1), *w = u;
    const char *from = source;
    for (int k = 0; k < n; k++) {
      const char *upto = k == i ? ends[k] : starts[k];
      memcpy(w, from, (size_t)(upto - from));
      w += upto - from;
      from = ends[k];
    }
    memcpy(w, from, (size_t)(source + total - from));
    w += source + total - from;
    *w = 0;
    units[i] = u;
  }
  free(starts);
  free(ends);
  *out = units;
  return n;
}
