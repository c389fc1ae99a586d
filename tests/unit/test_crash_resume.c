// test_crash_resume.c: issue 9, item 8. gemc train is killed with SIGKILL at 20 random points
// inside its checkpoint saves (GEMC_TEST_KILL_AT_WRITE=N: the N-th step of an atomic write,
// file_io.h), and each time a resume from whatever the directory holds then finishes the
// training bit-exactly: its final checkpoint equals a straight run's, byte for byte, and no
// temporary file is left behind. Runs BUILD/gemc on models/gem_tiny.gem on the CPU.
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shell_run.h"

// Saves where evaluations are: the curve's train loss is the mean since the last evaluation,
// and a resume between two evaluations starts that window afresh.
enum { STEPS = 20, SAVE_EVERY = 5, KILLS = 20 };

static char gemc_path[PATH_MAX], model_path[PATH_MAX];
static char tmp_dir[] = "/tmp/gemc_test_crash_XXXXXX";
static const char common[] = "--backend cpu --save-every 5 --eval-every 5 --eval-examples 256 "
                             "--seed 3 -q";

// Runs a shell command in the temporary directory; returns its exit status (128 + signal
// when killed, as the shell reports it).
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = shell_vrun(tmp_dir, fmt, ap)->rc;
  va_end(ap);
  return rc;
}

// The step in DIR/checkpoint.gemc's header (offset 32), or -1 when there is no checkpoint.
static int64_t checkpoint_step(const char *dir) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s/checkpoint.gemc", tmp_dir, dir);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  unsigned char h[40];
  size_t got = fread(h, 1, sizeof h, f);
  fclose(f);
  assert_int_equal(got, sizeof h);
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | h[32 + i];
  return (int64_t)v;
}

static void test_kill_during_saves_then_resume_is_bit_exact(void **state) {
  (void)state;
  assert_int_equal(sh("timeout 60 '%s' train '%s' --steps %d --save straight %s", gemc_path,
                      model_path, STEPS, common), 0);
  struct stat st;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/straight/checkpoint.gemc", tmp_dir);
  assert_int_equal(stat(path, &st), 0);
  // Steps of one save: create, one per 64 KiB written, the fsync, the rename.
  int64_t per_save = 3 + (st.st_size + 65535) / 65536;
  int64_t points = per_save * (STEPS / SAVE_EVERY);
  unsigned seed = 20240607u;
  const char *env = getenv("GEMC_CRASH_SEED");
  if (env) seed = (unsigned)strtoul(env, NULL, 10);
  srand(seed);
  int resumed = 0;
  for (int k = 0; k < KILLS; k++) {
    int64_t at = 1 + rand() % points;
    sh("rm -rf run");
      int rc = sh("{ GEMC_TEST_KILL_AT_WRITE=%lld timeout 60 '%s' train '%s' --steps %d --save "
                "run %s; } 2>/dev/null", (long long)at, gemc_path, model_path, STEPS, common);
    if (rc != 128 + 9) fail_msg("kill point %lld (seed %u): exit %d, not SIGKILL", (long long)at,
                                seed, rc);
    int64_t step = checkpoint_step("run");
    if (step >= 0) {
      assert_true(step % SAVE_EVERY == 0 && step <= STEPS);
      resumed++;
      rc = sh("timeout 60 '%s' train '%s' --steps %lld --resume run --save run %s", gemc_path,
              model_path, (long long)(STEPS - step), common);
    } else {
      rc = sh("timeout 60 '%s' train '%s' --steps %d --save run %s", gemc_path, model_path,
              STEPS, common);
    }
    if (rc != 0) fail_msg("kill point %lld (seed %u), step %lld: the resume failed (%d)",
                          (long long)at, seed, (long long)step, rc);
    if (sh("cmp -s run/checkpoint.gemc straight/checkpoint.gemc") != 0)
      fail_msg("kill point %lld (seed %u): resumed from step %lld, the final checkpoint "
               "differs from the straight run's", (long long)at, seed, (long long)step);
    if (sh("ls -a run | grep -q '^\\.checkpoint\\.gemc\\.'") == 0)
      fail_msg("kill point %lld (seed %u): a temporary file was left behind", (long long)at,
               seed);
  }
  // Most kill points fall after the first save: the resume path was taken.
  assert_true(resumed >= KILLS / 2);
}

int main(int argc, char **argv) {
  (void)argc;
  char guess[PATH_MAX];
  snprintf(guess, sizeof guess, "%s", argv[0]);
  char *slash = strrchr(guess, '/');
  if (!slash) return 1;
  snprintf(slash, sizeof guess - (size_t)(slash - guess), "/../gemc");
  if (!realpath(guess, gemc_path) || !realpath("models/gem_tiny.gem", model_path)) {
    fprintf(stderr, "test_crash_resume: needs BUILD/gemc and the repository root\n");
    return 1;
  }
  if (!mkdtemp(tmp_dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_during_saves_then_resume_is_bit_exact),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) failed++;
  return failed;
}
