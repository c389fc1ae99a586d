// file_io.h: the one implementation of gemc's file checks and atomic outputs.
//
// Outputs appear whole or not at all: an AtomicFile writes a temporary file next to its target
// (DIR/.NAME.XXXXXX, flock'ed while it is written), fsyncs it, renames it over the target and
// fsyncs DIR. A successful commit removes the stale temporaries of the same target that a
// killed gemc left behind (only names of that pattern, and only ones no live process holds
// locked). Inputs are refused unless they are regular files (a FIFO would block forever) no
// larger than the reader's cap; an output that is the same file as an input is refused.
// docs/cli.md ("Files") describes what the user sees.
// defines: AtomicFile, atomic_begin, atomic_write, atomic_write_at, atomic_commit,
//          atomic_abort, file_write_atomic, file_open_input, file_read_all, file_same,
//          file_refuse_same, file_make_dirs, file_probe_output, file_probe_dir, file_lock_dir,
//          file_remove_stale_temps, file_crash_point
#ifndef GEMC_FILE_IO_H
#define GEMC_FILE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A temporary file being written, to be renamed over `path` by atomic_commit.
typedef struct AtomicFile {
  int fd;      // -1 when closed
  char *path;  // the target
  char *temp;  // DIR/.NAME.XXXXXX
  int error;   // errno of the first failed write, 0 when none
} AtomicFile;

// Creates the temporary file in the target's directory (which must exist).
bool atomic_begin(AtomicFile *a, const char *path, char *err, size_t err_size);
// Appends n bytes; the first error sticks and is reported by atomic_commit too.
bool atomic_write(AtomicFile *a, const void *p, size_t n, char *err, size_t err_size);
// Writes n bytes at `offset` without moving the append position.
bool atomic_write_at(AtomicFile *a, const void *p, size_t n, int64_t offset, char *err,
                     size_t err_size);
// fsync, rename over the target, fsync of the directory, removal of stale temporaries. On any
// failure the temporary file is removed and the target is left as it was.
bool atomic_commit(AtomicFile *a, char *err, size_t err_size);
// Removes the temporary file; the target is untouched. Safe on a closed AtomicFile.
void atomic_abort(AtomicFile *a);
// The whole of `data` to `path`, atomically.
bool file_write_atomic(const char *path, const void *data, size_t n, char *err,
                       size_t err_size);

// Opens `path` for reading without blocking (a FIFO is refused, not waited on), and refuses
// anything but a regular file of at most `max_bytes`. `what` names the file in messages
// ("data file"). Returns the descriptor (blocking again), or -1 after writing the reason.
int file_open_input(const char *path, const char *what, int64_t max_bytes, int64_t *size,
                    char *err, size_t err_size);
// Reads a whole regular file of at most `max_bytes`, NUL-terminated (*data is the caller's).
bool file_read_all(const char *path, const char *what, int64_t max_bytes, char **data,
                   size_t *size, char *err, size_t err_size);

// Whether both paths exist and are the same file (st_dev and st_ino).
bool file_same(const char *a, const char *b);
// Fails when output `out` is the same file as input `in`.
bool file_refuse_same(const char *out, const char *in, char *err, size_t err_size);

// mkdir -p. `what` names the directory in messages ("checkpoint directory").
bool file_make_dirs(const char *dir, const char *what, char *err, size_t err_size);
// Checks, before any work, that the file `path` can be written: it is not a directory, and
// its directory exists and takes a new file (a probe file is created and removed). `what`
// may be "" ("cannot write PATH: ...").
bool file_probe_output(const char *path, const char *what, char *err, size_t err_size);
// The same for a directory that takes new files.
bool file_probe_dir(const char *dir, const char *what, char *err, size_t err_size);

// Takes an exclusive flock on DIR/NAME (created) for as long as the returned descriptor is
// open; -1, with the reason, when another process holds it or it cannot be created.
int file_lock_dir(const char *dir, const char *name, const char *what, char *err,
                  size_t err_size);

// Removes DIR/.BASE.XXXXXX files (the temporaries of target BASE) that no process holds.
void file_remove_stale_temps(const char *dir, const char *base);

// A test hook: with GEMC_TEST_KILL_AT_WRITE=N in the environment, the N-th step of an atomic
// write (creating the temporary, each write, the fsync, the rename) kills the process with
// SIGKILL, as a crash would (tests/unit/test_crash_resume.c). Without it, nothing happens.
void file_crash_point(void);

#endif
