// test_artifact.c: the AOT artifact without a GPU. A round trip restores the plan, the source
// and every cubin; a flipped or truncated file is "corrupted"; another model, another gemc
// version or a missing arch each get a message that says so and what the artifact holds.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "artifact.h"

enum { KEY = 0x5eed };

static char g_path[256];

static int setup(void **state) {
  (void)state;
  snprintf(g_path, sizeof g_path, "/tmp/gemc_test_artifact_%ld.gemb", (long)getpid());
  static unsigned char cubin90[] = {0x7f, 'E', 'L', 'F', 0, 1, 2, 3};
  static unsigned char cubin100[] = {0x7f, 'E', 'L', 'F', 9, 9};
  Artifact a = {.model_key = KEY, .model_name = "gem_tiny", .ncubins = 2};
  snprintf(a.gemc_version, sizeof a.gemc_version, "0.1.0");
  a.cubins[0] = (ArtifactCubin){.arch = "sm_90a", .image = cubin90, .size = sizeof cubin90,
                                .plan_text = "plan v1\nlaunch k\n",
                                .source = "extern \"C\" __global__ void k(float *out) {}\n"};
  a.cubins[1] = (ArtifactCubin){.arch = "sm_100a", .image = cubin100, .size = sizeof cubin100,
                                .plan_text = "plan v1 for sm_100a\n", .source = "// sm_100a\n"};
  char err[512];
  if (!artifact_write(g_path, &a, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_path);
  return 0;
}

static void test_artifact_round_trip(void **state) {
  (void)state;
  Artifact a;
  char err[512];
  assert_true(artifact_read(g_path, &a, err, sizeof err));
  assert_string_equal(a.gemc_version, "0.1.0");
  assert_int_equal(a.model_key, KEY);
  assert_string_equal(a.model_name, "gem_tiny");
  assert_string_equal(a.cubins[0].plan_text, "plan v1\nlaunch k\n");
  assert_non_null(strstr(a.cubins[0].source, "__global__ void k"));
  assert_int_equal(a.ncubins, 2);
  const ArtifactCubin *c = NULL;
  assert_true(artifact_check(&a, KEY, "gem_tiny", "0.1.0", "sm_100a", &c, err, sizeof err));
  assert_string_equal(c->arch, "sm_100a");
  assert_string_equal(c->plan_text, "plan v1 for sm_100a\n");
  assert_string_equal(c->source, "// sm_100a\n");
  assert_int_equal(c->size, 6);
  assert_memory_equal(c->image, "\x7f" "ELF\x09\x09", 6);
  artifact_free(&a);
}

// Copies the artifact to `out`, changed by `how`: 'f' flips the byte at `at`, 't' cuts it to
// `at` bytes.
static void damaged_copy(const char *out, char how, long at) {
  FILE *in = fopen(g_path, "rb");
  assert_non_null(in);
  unsigned char buf[8192];
  size_t n = fread(buf, 1, sizeof buf, in);
  fclose(in);
  if (how == 'f') buf[at] ^= 0x10;
  if (how == 't') n = (size_t)at;
  FILE *o = fopen(out, "wb");
  assert_non_null(o);
  assert_int_equal(fwrite(buf, 1, n, o), n);
  fclose(o);
}

static void test_artifact_corruption_detected(void **state) {
  (void)state;
  char bad[300];
  snprintf(bad, sizeof bad, "%s.bad", g_path);
  FILE *in = fopen(g_path, "rb");
  fseek(in, 0, SEEK_END);
  long n = ftell(in);
  fclose(in);
  long flips[] = {20, 40, n / 2, n - 3, n - 1};
  for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
    damaged_copy(bad, 'f', flips[i]);
    Artifact a;
    char err[512];
    assert_false(artifact_read(bad, &a, err, sizeof err));
    assert_non_null(strstr(err, "corrupted"));
  }
  long cuts[] = {n - 1, n / 2, 18};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    damaged_copy(bad, 't', cuts[i]);
    Artifact a;
    char err[512];
    assert_false(artifact_read(bad, &a, err, sizeof err));
    assert_non_null(strstr(err, "corrupted"));
  }
  damaged_copy(bad, 'f', 0);
  Artifact a;
  char err[512];
  assert_false(artifact_read(bad, &a, err, sizeof err));
  assert_non_null(strstr(err, "not a gemc artifact"));
  unlink(bad);
}

static void test_artifact_wrong_model_version_or_arch(void **state) {
  (void)state;
  Artifact a;
  char err[512];
  assert_true(artifact_read(g_path, &a, err, sizeof err));
  assert_false(artifact_check(&a, KEY + 1, "gem_small", "0.1.0", "sm_90a", NULL, err, sizeof err));
  assert_non_null(strstr(err, "another model"));
  assert_non_null(strstr(err, "gem_tiny"));
  assert_false(artifact_check(&a, KEY, "gem_tiny", "0.2.0", "sm_90a", NULL, err, sizeof err));
  assert_non_null(strstr(err, "gemc 0.1.0"));
  assert_false(artifact_check(&a, KEY, "gem_tiny", "0.1.0", "sm_120", NULL, err, sizeof err));
  assert_non_null(strstr(err, "sm_120"));
  assert_non_null(strstr(err, "sm_90a, sm_100a"));
  artifact_free(&a);
}

static void test_artifact_missing_file_named(void **state) {
  (void)state;
  Artifact a;
  char err[512];
  assert_false(artifact_read("/nonexistent/x.gemb", &a, err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent/x.gemb"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_artifact_round_trip),
      cmocka_unit_test(test_artifact_corruption_detected),
      cmocka_unit_test(test_artifact_wrong_model_version_or_arch),
      cmocka_unit_test(test_artifact_missing_file_named),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
