// file_io.c: atomic outputs, checked inputs, the directory lock (file_io.h).
#include "file_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"

enum { TEMP_SUFFIX = 6 };  // mkstemp's XXXXXX

// --- the crash hook ---------------------------------------------------------------------

void file_crash_point(void) {
  static int64_t left = -2;  // -2: not read yet; -1: no hook
  if (left == -2) {
    const char *v = getenv("GEMC_TEST_KILL_AT_WRITE");
    left = v && *v ? strtoll(v, NULL, 10) : -1;
    if (left <= 0) left = -1;
  }
  if (left < 0) return;
  if (--left == 0) raise(SIGKILL);
}

// --- paths ------------------------------------------------------------------------------

// The directory part of `path` ("." when it has none), in a fresh string.
static char *dir_of(const char *path) {
  char *dir = xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = '\0';
  else if (slash) *slash = '\0';
  else strcpy(dir, ".");
  return dir;
}

static const char *base_of(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static bool fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = fsync(fd) == 0 || errno == EINVAL;
  close(fd);
  return ok;
}

// --- atomic outputs ---------------------------------------------------------------------

bool atomic_begin(AtomicFile *a, const char *path, char *err, size_t err_size) {
  memset(a, 0, sizeof *a);
  a->fd = -1;
  const char *base = base_of(path);
  if (!*base) return fail(err, err_size, "cannot write %s: it names a directory", path);
  char *dir = dir_of(path);
  size_t len = strlen(dir) + strlen(base) + TEMP_SUFFIX + 4;
  a->temp = xmalloc(len);
  // A stale-temp sweep in another process may take the file between mkstemp and flock; the
  // lock is only ours once the path still names our file after it is taken.
  for (int attempt = 0; attempt < 8; attempt++) {
    snprintf(a->temp, len, "%s/.%s.XXXXXX", dir, base);
    int fd = mkstemp(a->temp);
    if (fd < 0) {
      int e = errno;
      fail(err, err_size, "cannot create a temporary file for %s in %s: %s", path,
           strcmp(dir, ".") == 0 ? "the current directory" : dir, strerror(e));
      free(dir);
      free(a->temp);
      a->temp = NULL;
      return false;
    }
    struct stat mine, named;
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &mine) == 0 && stat(a->temp, &named) == 0 &&
        mine.st_ino == named.st_ino && mine.st_dev == named.st_dev) {
      a->fd = fd;
      break;
    }
    close(fd);
  }
  free(dir);
  if (a->fd < 0) {
    free(a->temp);
    a->temp = NULL;
    return fail(err, err_size, "cannot create a temporary file for %s: it kept disappearing",
                path);
  }
  fcntl(a->fd, F_SETFD, FD_CLOEXEC);
  a->path = xstrdup(path);
  file_crash_point();
  return true;
}

static bool write_failed(AtomicFile *a, char *err, size_t err_size) {
  return fail(err, err_size, "cannot write %s: %s", a->path, strerror(a->error));
}

bool atomic_write(AtomicFile *a, const void *p, size_t n, char *err, size_t err_size) {
  const unsigned char *b = p;
  while (a->error == 0 && n > 0) {
    ssize_t got = write(a->fd, b, n);
    if (got < 0) {
      if (errno != EINTR) a->error = errno;
    } else if (got == 0) {
      a->error = EIO;
    } else {
      b += got;
      n -= (size_t)got;
    }
  }
  if (a->error) return write_failed(a, err, err_size);
  file_crash_point();
  return true;
}

bool atomic_write_at(AtomicFile *a, const void *p, size_t n, int64_t offset, char *err,
                     size_t err_size) {
  const unsigned char *b = p;
  while (a->error == 0 && n > 0) {
    ssize_t got = pwrite(a->fd, b, n, (off_t)offset);
    if (got < 0) {
      if (errno != EINTR) a->error = errno;
    } else if (got == 0) {
      a->error = EIO;
    } else {
      b += got;
      n -= (size_t)got;
      offset += got;
    }
  }
  if (a->error) return write_failed(a, err, err_size);
  file_crash_point();
  return true;
}

static void atomic_free(AtomicFile *a) {
  free(a->path);
  free(a->temp);
  a->path = a->temp = NULL;
  a->fd = -1;
}

void atomic_abort(AtomicFile *a) {
  if (a->temp) unlink(a->temp);
  if (a->fd >= 0) close(a->fd);
  atomic_free(a);
}

bool atomic_commit(AtomicFile *a, char *err, size_t err_size) {
  int e = a->error;
  if (e == 0 && fsync(a->fd) != 0) e = errno;
  if (e == 0) file_crash_point();
  if (e == 0 && rename(a->temp, a->path) != 0) e = errno;
  if (e != 0) {
    fail(err, err_size, "cannot write %s: %s (a previous %s, if any, is unchanged)", a->path,
         strerror(e), base_of(a->path));
    atomic_abort(a);
    return false;
  }
  file_crash_point();
  char *dir = dir_of(a->path);
  bool synced = fsync_dir(dir);
  int sync_errno = errno;
  // The lock on the renamed file goes with the descriptor: close only now.
  close(a->fd);
  a->fd = -1;
  file_remove_stale_temps(dir, base_of(a->path));
  bool ok = synced || fail(err, err_size, "cannot fsync directory %s after writing %s: %s",
                           dir, a->path, strerror(sync_errno));
  free(dir);
  atomic_free(a);
  return ok;
}

bool file_write_atomic(const char *path, const void *data, size_t n, char *err,
                       size_t err_size) {
  AtomicFile a;
  if (!atomic_begin(&a, path, err, err_size)) return false;
  if (!atomic_write(&a, data, n, err, err_size)) {
    atomic_abort(&a);
    return false;
  }
  return atomic_commit(&a, err, err_size);
}

// Whether `name` is BASE's temporary: "." BASE "." and six characters of mkstemp's alphabet.
static bool is_temp_of(const char *name, const char *base) {
  size_t nb = strlen(base);
  if (name[0] != '.' || strncmp(name + 1, base, nb) != 0 || name[1 + nb] != '.') return false;
  const char *s = name + 2 + nb;
  if (strlen(s) != TEMP_SUFFIX) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
      return false;
  return true;
}

void file_remove_stale_temps(const char *dir, const char *base) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!is_temp_of(e->d_name, base)) continue;
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    char *path = xmalloc(len);
    snprintf(path, len, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st, named;
    // A writer holds its temporary locked: a lock we get is one nobody alive holds.
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        flock(fd, LOCK_EX | LOCK_NB) == 0 && lstat(path, &named) == 0 &&
        named.st_ino == st.st_ino && named.st_dev == st.st_dev)
      unlink(path);
    if (fd >= 0) close(fd);
    free(path);
  }
  closedir(d);
}

// --- inputs -----------------------------------------------------------------------------

static void format_bytes(char *buf, size_t size, int64_t n) {
  if (n >= ((int64_t)1 << 30) && n % ((int64_t)1 << 30) == 0)
    snprintf(buf, size, "%" PRId64 " GiB", n >> 30);
  else if (n >= (1 << 20) && n % (1 << 20) == 0)
    snprintf(buf, size, "%" PRId64 " MiB", n >> 20);
  else
    snprintf(buf, size, "%" PRId64 " bytes", n);
}

int file_open_input(const char *path, const char *what, int64_t max_bytes, int64_t *size,
                    char *err, size_t err_size) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    fail(err, err_size, "cannot open %s %s: %s", what, path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    const char *kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket";
    fail(err, err_size, "cannot read %s %s: it is %s, not a regular file", what, path, kind);
    close(fd);
    return -1;
  }
  if (max_bytes >= 0 && (int64_t)st.st_size > max_bytes) {
    char cap[32];
    format_bytes(cap, sizeof cap, max_bytes);
    fail(err, err_size, "cannot read %s %s: it is %lld bytes, larger than the %s a %s may be",
         what, path, (long long)st.st_size, cap, what);
    close(fd);
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = (int64_t)st.st_size;
  return fd;
}

bool file_read_all(const char *path, const char *what, int64_t max_bytes, char **data,
                   size_t *size, char *err, size_t err_size) {
  int64_t n = 0;
  int fd = file_open_input(path, what, max_bytes, &n, err, err_size);
  if (fd < 0) return false;
  // The size is the one fstat saw; a file that grows meanwhile is read up to the cap.
  size_t cap = (size_t)n + 1, len = 0;
  char *buf = xmalloc(cap + 1);
  for (;;) {
    if (len == cap) {
      if ((int64_t)cap > max_bytes && max_bytes >= 0) {
        char limit[32];
        format_bytes(limit, sizeof limit, max_bytes);
        free(buf);
        close(fd);
        return fail(err, err_size, "cannot read %s %s: it grew past the %s a %s may be",
                    what, path, limit, what);
      }
      cap *= 2;
      buf = xrealloc(buf, cap + 1);
    }
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return fail(err, err_size, "cannot read %s %s: %s", what, path, strerror(e));
    }
    if (got == 0) break;
    len += (size_t)got;
  }
  close(fd);
  if (max_bytes >= 0 && (int64_t)len > max_bytes) {
    char limit[32];
    format_bytes(limit, sizeof limit, max_bytes);
    free(buf);
    return fail(err, err_size, "cannot read %s %s: it grew past the %s a %s may be", what,
                path, limit, what);
  }
  buf[len] = '\0';
  *data = buf;
  *size = len;
  return true;
}

// --- same files, probes, directories, the lock ------------------------------------------

bool file_same(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

bool file_refuse_same(const char *out, const char *in, char *err, size_t err_size) {
  if (!file_same(out, in)) return true;
  return fail(err, err_size, "output %s is the same file as input %s; writing it would destroy "
              "the input (choose another output)", out, in);
}

bool file_make_dirs(const char *dir, const char *what, char *err, size_t err_size) {
  char *path = xstrdup(dir);
  bool ok = true;
  for (char *p = path + 1; ok && *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
      ok = fail(err, err_size, "cannot create %s %s: %s: %s", what, dir, path, strerror(errno));
    *p = '/';
  }
  if (ok && mkdir(path, 0777) != 0 && errno != EEXIST)
    ok = fail(err, err_size, "cannot create %s %s: %s", what, dir, strerror(errno));
  struct stat st;
  if (ok && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
    ok = fail(err, err_size, "%s %s is not a directory", what, dir);
  free(path);
  return ok;
}

// Creates and removes a file in `dir`; `shown` is what the message names.
static bool probe(const char *dir, const char *what, const char *shown, char *err,
                  size_t err_size) {
  size_t len = strlen(dir) + 32;
  char *name = xmalloc(len);
  snprintf(name, len, "%s/.gemc-probe.XXXXXX", dir);
  int fd = mkstemp(name);
  bool ok = fd >= 0 || fail(err, err_size, "cannot write %s%s%s: %s", what,
                            *what ? " " : "", shown, strerror(errno));
  if (fd >= 0) {
    close(fd);
    unlink(name);
  }
  free(name);
  return ok;
}

bool file_probe_dir(const char *dir, const char *what, char *err, size_t err_size) {
  return probe(dir, what, dir, err, err_size);
}

bool file_probe_output(const char *path, const char *what, char *err, size_t err_size) {
  struct stat st;
  if (!*base_of(path) || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
    return fail(err, err_size, "cannot write %s%s%s: it is a directory", what,
                *what ? " " : "", path);
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return fail(err, err_size, "cannot write %s%s%s: it exists and is not a regular file",
                what, *what ? " " : "", path);
  char *dir = dir_of(path);
  bool ok = true;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    ok = fail(err, err_size, "cannot write %s%s%s: directory %s does not exist", what,
              *what ? " " : "", path, dir);
  else
    ok = probe(dir, what, path, err, err_size);
  free(dir);
  return ok;
}

int file_lock_dir(const char *dir, const char *name, const char *what, char *err,
                  size_t err_size) {
  size_t len = strlen(dir) + strlen(name) + 2;
  char *path = xmalloc(len);
  snprintf(path, len, "%s/%s", dir, name);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) {
    fail(err, err_size, "cannot write %s %s: cannot create its lock file %s: %s", what, dir,
         path, strerror(errno));
  } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    if (e == EWOULDBLOCK)
      fail(err, err_size, "%s %s is in use by another gemc train (it holds %s); wait for it "
           "to finish or choose another directory", what, dir, path);
    else
      fail(err, err_size, "cannot lock %s %s (%s): %s", what, dir, path, strerror(e));
    close(fd);
    fd = -1;
  }
  free(path);
  return fd;
}
