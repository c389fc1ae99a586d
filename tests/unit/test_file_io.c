// test_file_io.c: issue 9, items 4-6. Outputs are checked at start-up (a bad --save DIR, a
// locked one), an output that is an input is refused, failed writes leave nothing behind,
// stale temporaries are swept, FIFOs are refused (under a timeout, so a regression cannot hang
// CI), readers have caps, and a checkpoint with absurd fields or NaN parameters is refused on
// resume. Runs BUILD/gemc, found from argv[0] = BUILD/tests/test_file_io.
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "file_io.h"
#include "hash.h"
#include "shell_run.h"

static char gemc_path[PATH_MAX], model_path[PATH_MAX], tsv_path[PATH_MAX];
static char tmp_dir[] = "/tmp/gemc_test_file_io_XXXXXX";

typedef ShellRun Run;

// Runs `gemc ARGS` in the temporary directory under a 20 s timeout.
static Run *run_gemc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static Run *run_gemc(const char *fmt, ...) {
  char args[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return shell_run(tmp_dir, "timeout 20 '%s' %s", gemc_path, args);
}

// Runs a shell command line in the temporary directory, its stderr kept as run_gemc's is.
static Run *run_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static Run *run_sh(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Run *r = shell_vrun(tmp_dir, fmt, ap);
  va_end(ap);
  return r;
}

// The same for a line that must succeed.
static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Run *r = shell_vrun(tmp_dir, fmt, ap);
  va_end(ap);
  if (r->rc != 0) fail_msg("exit %d: %s", r->rc, r->err);
}

static char *in_tmp(const char *name) {
  static char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
  return path;
}

static bool exists(const char *name) {
  struct stat st;
  return stat(in_tmp(name), &st) == 0;
}

static void expect(const Run *r, int rc, const char *needle) {
  if (r->rc != rc || !strstr(r->err, needle))
    fail_msg("rc %d (wanted %d), stderr '%s' lacks '%s'", r->rc, rc, r->err, needle);
}

// Whether DIR (relative to the temporary directory) holds a file whose name starts with
// PREFIX.
static bool has_temp(const char *dir, const char *prefix) {
  char cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd, "cd '%s' && ls -a '%s' | grep -q '^%s'", tmp_dir, dir, prefix);
  return system(cmd) == 0;
}

// --- outputs ----------------------------------------------------------------------------

static void test_same_file_output_is_refused(void **state) {
  (void)state;
  sh("cp '%s' x.tsv && cp '%s' f.gem && cp x.tsv x0.tsv && cp f.gem f0.gem", tsv_path,
     model_path);
  Run *r = run_gemc("data convert f.gem x.tsv -o x.tsv");
  expect(r, 1, "output x.tsv is the same file as input x.tsv");
  sh("cmp x.tsv x0.tsv");
  sh("ln -f x.tsv hard.tsv");
  r = run_gemc("data convert f.gem x.tsv -o hard.tsv");
  expect(r, 1, "is the same file as input x.tsv");
  r = run_gemc("ir f.gem -o f.gem");
  expect(r, 1, "output f.gem is the same file as input f.gem");
  sh("cmp f.gem f0.gem");
  r = run_gemc("ir --dump-after=lower f.gem -o ./f.gem");
  expect(r, 1, "is the same file as input f.gem");
  sh("cmp f.gem f0.gem");
  r = run_gemc("train f.gem --steps 1 -q --report f.gem");
  expect(r, 1, "is the same file as input f.gem");
  sh("cmp f.gem f0.gem");
}

static void test_bad_save_dir_fails_at_start_up(void **state) {
  (void)state;
  sh("echo x > plain");
  // 100000 steps would take minutes: an error at start-up returns at once.
  Run *r = run_gemc("train '%s' --steps 100000 --save plain/ck -q", model_path);
  expect(r, 1, "cannot create checkpoint directory plain/ck");
  r = run_gemc("train '%s' --steps 100000 --report plain/r.json -q", model_path);
  expect(r, 1, "cannot write report plain/r.json: directory plain does not exist");
  r = run_gemc("train '%s' --steps 100000 --report . -q", model_path);
  expect(r, 1, "cannot write report .: it is a directory");
  r = run_gemc("ir '%s' -o plain/x.ir", model_path);
  expect(r, 1, "cannot write plain/x.ir: directory plain does not exist");
  r = run_gemc("emit '%s' -o plain/out", model_path);
  expect(r, 1, "cannot create output directory plain/out");
  assert_false(exists("plain/out"));
}

static void test_second_training_on_a_locked_dir_is_refused(void **state) {
  (void)state;
  sh("mkdir -p locked");
  char err[512];
  int fd = file_lock_dir(in_tmp("locked"), CHECKPOINT_LOCK, "checkpoint directory", err,
                         sizeof err);
  assert_true(fd >= 0);
  // Another process (this one) holds it: gemc train must refuse at start-up.
  Run *r = run_gemc("train '%s' --steps 100000 --save locked -q", model_path);
  expect(r, 1, "checkpoint directory locked is in use by another gemc train");
  assert_false(exists("locked/checkpoint.gemc"));
  close(fd);
  r = run_gemc("train '%s' --steps 2 --save locked -q", model_path);
  expect(r, 0, "");
  assert_true(exists("locked/checkpoint.gemc"));
}

static void test_stale_temps_are_removed_but_live_ones_kept(void **state) {
  (void)state;
  sh("mkdir -p stale && touch stale/.checkpoint.gemc.Ab12Cd stale/.checkpoint.gemc.keep99"
     " stale/.checkpoint.gemc.toolong1 stale/other.txt");
  // A live writer: a temporary that this process holds locked.
  int fd = open(in_tmp("stale/.checkpoint.gemc.keep99"), O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(flock(fd, LOCK_EX), 0);
  Run *r = run_gemc("train '%s' --steps 2 --save stale -q", model_path);
  expect(r, 0, "");
  assert_false(exists("stale/.checkpoint.gemc.Ab12Cd"));
  assert_true(exists("stale/.checkpoint.gemc.keep99"));
  assert_true(exists("stale/.checkpoint.gemc.toolong1"));  // not our pattern
  assert_true(exists("stale/other.txt"));
  close(fd);
  // The generic writer sweeps its own target's temporaries too.
  sh("touch .out.ir.zzZZ00");
  r = run_gemc("ir '%s' -o out.ir", model_path);
  expect(r, 0, "");
  assert_false(exists(".out.ir.zzZZ00"));
}

// A write that fails half-way (RLIMIT_FSIZE) leaves the old target and no temporary.
static void test_failed_write_leaves_no_partial_output(void **state) {
  (void)state;
  sh("mkdir -p partial && echo old > partial/t.bin");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1000, 1000};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
    static char big[1 << 16];
    char err[512];
    bool ok = file_write_atomic(in_tmp("partial/t.bin"), big, sizeof big, err, sizeof err);
    _exit(ok ? 11 : strstr(err, "cannot write") ? 0 : 12);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  sh("test \"$(cat partial/t.bin)\" = old");
  assert_false(has_temp("partial", ".t.bin."));
  // gemc data convert and gemc ir under a limit of 0 bytes (SIGXFSZ ignored, so the write
  // fails rather than killing gemc): exit 1, no OUT, no temporary.
  sh("'%s' data convert '%s' '%s' -o partial/d.gemd >/dev/null", gemc_path, model_path,
     tsv_path);
  Run *r = run_sh("out=$( (trap '' XFSZ; ulimit -f 0; exec '%s' data convert '%s' '%s' -o "
                  "partial/e.gemd) 2>&1 ); rc=$?; echo \"$out\" >&2; exit $rc", gemc_path,
                  model_path, tsv_path);
  expect(r, 1, "cannot write partial/e.gemd: File too large");
  assert_true(exists("partial/d.gemd"));
  assert_false(exists("partial/e.gemd"));
  assert_false(has_temp("partial", ".e.gemd."));
  r = run_sh("out=$( (trap '' XFSZ; ulimit -f 0; exec '%s' ir '%s' -o partial/t.bin) "
             "2>&1 ); rc=$?; echo \"$out\" >&2; exit $rc", gemc_path, model_path);
  expect(r, 1, "cannot write partial/t.bin: File too large");
  sh("test \"$(cat partial/t.bin)\" = old");
  assert_false(has_temp("partial", ".t.bin."));
}

// --- inputs -----------------------------------------------------------------------------

static void test_fifos_are_refused_not_waited_on(void **state) {
  (void)state;
  sh("rm -f fifo && mkfifo fifo");
  Run *r = run_gemc("check fifo");
  expect(r, 1, "cannot read fifo: it is a FIFO, not a regular file");
  r = run_gemc("train '%s' --data fifo --steps 1 -q", model_path);
  expect(r, 1, "cannot read data file fifo: it is a FIFO, not a regular file");
  r = run_gemc("data convert '%s' fifo -o out.gemd", model_path);
  expect(r, 1, "cannot read input fifo: it is a FIFO, not a regular file");
  r = run_gemc("train '%s' --steps 1 -q --resume fifodir", model_path);
  expect(r, 1, "cannot open checkpoint fifodir/checkpoint.gemc");
  sh("mkdir -p fifodir && rm -f fifodir/checkpoint.gemc && mkfifo fifodir/checkpoint.gemc");
  r = run_gemc("train '%s' --steps 1 -q --resume fifodir", model_path);
  expect(r, 1, "cannot read checkpoint fifodir/checkpoint.gemc: it is a FIFO");
}

static void test_tsv_line_cap(void **state) {
  (void)state;
  // A header line of 64 MiB + 1 byte and no newline: refused at the cap, not read whole.
  sh("head -c 67108865 /dev/zero | tr '\\0' a > long.tsv");
  Run *r = run_gemc("data convert '%s' long.tsv -o long.gemd", model_path);
  expect(r, 1, "long.tsv:1: the line is longer than 64 MiB, the most a line may be");
  assert_false(exists("long.gemd"));
  sh("rm -f long.tsv");
}

// --- checkpoints with absurd contents ----------------------------------------------------

static unsigned char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  rewind(f);
  unsigned char *buf = malloc(*size);
  assert_int_equal(fread(buf, 1, *size, f), *size);
  fclose(f);
  return buf;
}

static void write_file(const char *path, const unsigned char *buf, size_t size) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, size, f), size);
  fclose(f);
}

static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// The offset of entry `name`'s data (the first one whose name starts with it).
static size_t entry_offset(const unsigned char *b, const char *name) {
  uint32_t nlen = (uint32_t)b[12] | (uint32_t)b[13] << 8;
  uint32_t n = (uint32_t)b[40] | (uint32_t)b[41] << 8 | (uint32_t)b[42] << 16;
  size_t pos = 44 + nlen;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t len = (uint32_t)b[pos] | (uint32_t)b[pos + 1] << 8 | (uint32_t)b[pos + 2] << 16;
    const char *at = (const char *)b + pos + 4;
    uint64_t size = get64(b + pos + 4 + len);
    size_t data = pos + 4 + len + 8;
    if (strncmp(at, name, strlen(name)) == 0) return data;
    pos = data + size;
  }
  fail_msg("no entry %s", name);
  return 0;
}

static void reseal(unsigned char *b, size_t size) {
  put64(b + size - 8, fnv1a64(FNV1A64_INIT, b, size - 8));
}

// Copies good/ to bad/, edits it, and expects the resume to fail with `needle`.
typedef void Edit(unsigned char *b, size_t size);
static void expect_resume_refused(Edit *edit, const char *needle) {
  sh("rm -rf bad && cp -r good bad && rm -f bad/checkpoint.lock");
  size_t size;
  unsigned char *b = read_file(in_tmp("bad/checkpoint.gemc"), &size);
  edit(b, size);
  reseal(b, size);
  write_file(in_tmp("bad/checkpoint.gemc"), b, size);
  free(b);
  Run *r = run_gemc("train '%s' --steps 2 -q --resume bad --save bad", model_path);
  expect(r, 1, needle);
}

static void edit_step(unsigned char *b, size_t size) {
  (void)size;
  put64(b + 32, (uint64_t)1 << 62);
}
static void edit_step_negative(unsigned char *b, size_t size) {
  (void)size;
  put64(b + 32, UINT64_MAX);
}
static void edit_cursor(unsigned char *b, size_t size) {
  (void)size;
  put64(b + entry_offset(b, "train.counters"), (uint64_t)INT64_MAX - 3);
}
static void edit_batch(unsigned char *b, size_t size) {
  (void)size;
  put64(b + entry_offset(b, "train.counters") + 8, 0);
}
static void edit_optim_step(unsigned char *b, size_t size) {
  (void)size;
  put64(b + entry_offset(b, "optim.step:"), (uint64_t)1 << 40);
}
static void edit_nan_param(unsigned char *b, size_t size) {
  (void)size;
  float nan = NAN;
  memcpy(b + entry_offset(b, "param:") + 4, &nan, 4);
}
static void edit_inf_moment(unsigned char *b, size_t size) {
  (void)size;
  float inf = INFINITY;
  memcpy(b + entry_offset(b, "adamw.m:"), &inf, 4);
}

static void test_checkpoint_absurd_fields_are_refused(void **state) {
  (void)state;
  Run *r = run_gemc("train '%s' --steps 3 -q --save good", model_path);
  expect(r, 0, "");
  sh("cp good/checkpoint.gemc good.orig");
  expect_resume_refused(edit_step, "bad/checkpoint.gemc is corrupt: step 4611686018427387904 "
                        "is out of range");
  expect_resume_refused(edit_step_negative, "is out of range");
  expect_resume_refused(edit_cursor, "bad/checkpoint.gemc is corrupt: its data cursor "
                        "9223372036854775804 is out of range");
  expect_resume_refused(edit_batch, "its batch size 0 is out of range");
  expect_resume_refused(edit_optim_step, "optimizer steps, out of range");
  expect_resume_refused(edit_nan_param, "holds a non-finite value (nan at element 1)");
  expect_resume_refused(edit_inf_moment, "holds a non-finite value (inf at element 0)");
  // The refused resume wrote nothing: the checkpoint is the edited one, not a new one.
  sh("cmp -s bad/checkpoint.gemc good.orig; test $? = 1");
  // And the good one still resumes.
  r = run_gemc("train '%s' --steps 2 -q --resume good --save good", model_path);
  expect(r, 0, "");
}

static void test_caps_are_stated(void **state) {
  (void)state;
  char err[512];
  int fd = file_open_input(model_path, "model", 10, NULL, err, sizeof err);
  assert_int_equal(fd, -1);
  assert_non_null(strstr(err, "larger than the 10 bytes a model may be"));
  char *data = NULL;
  size_t n = 0;
  assert_false(file_read_all("/tmp", "artifact", 1 << 20, &data, &n, err, sizeof err));
  assert_non_null(strstr(err, "cannot read artifact /tmp: it is a directory"));
  assert_true(file_read_all(model_path, "model", 1 << 20, &data, &n, err, sizeof err));
  assert_true(n > 0 && data[n] == '\0');
  free(data);
}

int main(int argc, char **argv) {
  (void)argc;
  char guess[PATH_MAX];
  snprintf(guess, sizeof guess, "%s", argv[0]);
  char *slash = strrchr(guess, '/');
  if (!slash) return 1;
  snprintf(slash, sizeof guess - (size_t)(slash - guess), "/../gemc");
  if (!realpath(guess, gemc_path)) {
    fprintf(stderr, "test_file_io: no gemc next to %s\n", argv[0]);
    return 1;
  }
  if (!realpath("models/gem_tiny.gem", model_path) ||
      !realpath("tests/data/gem_tiny_records.tsv", tsv_path)) {
    fprintf(stderr, "test_file_io: run from the repository root\n");
    return 1;
  }
  if (!mkdtemp(tmp_dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_file_output_is_refused),
      cmocka_unit_test(test_bad_save_dir_fails_at_start_up),
      cmocka_unit_test(test_second_training_on_a_locked_dir_is_refused),
      cmocka_unit_test(test_stale_temps_are_removed_but_live_ones_kept),
      cmocka_unit_test(test_failed_write_leaves_no_partial_output),
      cmocka_unit_test(test_fifos_are_refused_not_waited_on),
      cmocka_unit_test(test_tsv_line_cap),
      cmocka_unit_test(test_checkpoint_absurd_fields_are_refused),
      cmocka_unit_test(test_caps_are_stated),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) failed++;
  return failed;
}
