// test_jit_cache.c: the on-disk cubin cache without NVRTC or a GPU. A fake compiler stands in
// for NVRTC and counts its calls: a second request is a hit, a changed option or version is a
// miss, a truncated, flipped or foreign entry is detected and rebuilt, a failing compile names
// its unit, and a module splits into one source per kernel.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "jit_cache.h"

typedef struct FakeCompiler {
  int calls;
} FakeCompiler;

// "Compiles" by prefixing the arch to the source; fails on sources containing "#error".
static bool fake_compile(void *ctx, const char *source, const char *name, const char *arch,
                         const char *const *options, int noptions, void **image, size_t *size,
                         char *log, size_t log_size) {
  (void)options;
  (void)noptions;
  FakeCompiler *fc = ctx;
  __atomic_fetch_add(&fc->calls, 1, __ATOMIC_SEQ_CST);
  if (strstr(source, "#error")) {
    snprintf(log, log_size, "%s: error: planted", name);
    return false;
  }
  size_t n = strlen(arch) + 1 + strlen(source);
  char *img = malloc(n + 1);
  snprintf(img, n + 1, "%s:%s", arch, source);
  *image = img;
  *size = n;
  return true;
}

static char *make_temp_dir(void) {
  char *dir = strdup("/tmp/gemc_test_jit_XXXXXX");
  assert_non_null(mkdtemp(dir));
  return dir;
}

static void remove_tree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static JitRequest request(const char *dir, FakeCompiler *fc, int version) {
  static const char *const opts[] = {"-O3", "--std=c++17"};
  return (JitRequest){.arch = "sm_90a", .options = opts, .noptions = 2,
                      .compiler_version = version, .gemc_version = "0.1.0", .cache_dir = dir,
                      .compile = fake_compile, .compile_ctx = fc, .threads = 3};
}

static void compile_one(const JitRequest *r, const char *src, JitUnit *u, JitStats *s) {
  memset(u, 0, sizeof *u);
  u->name = "k";
  u->source = src;
  char err[4096];
  assert_true(jit_compile_units(r, u, 1, s, err, sizeof err));
  assert_memory_equal(u->image, "sm_90a:", 7);
}

static void test_jit_cache_second_request_hits(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  FakeCompiler fc = {0};
  JitRequest r = request(dir, &fc, 13000);
  JitUnit u;
  JitStats s;
  compile_one(&r, "kernel A", &u, &s);
  assert_int_equal(fc.calls, 1);
  assert_int_equal(s.misses, 1);
  assert_false(u.from_cache);
  jit_units_free(&u, 1);
  compile_one(&r, "kernel A", &u, &s);
  assert_int_equal(fc.calls, 1);
  assert_int_equal(s.hits, 1);
  assert_true(u.from_cache);
  assert_int_equal(u.size, strlen("sm_90a:kernel A"));
  jit_units_free(&u, 1);
  remove_tree(dir);
  free(dir);
}

// A cache directory that does not exist yet (two levels of it) is made at the first store.
static void test_jit_cache_missing_dir_is_made(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  char sub[512];
  snprintf(sub, sizeof sub, "%s/a/cubins", dir);
  FakeCompiler fc = {0};
  JitRequest r = request(sub, &fc, 13000);
  JitUnit u;
  JitStats s;
  compile_one(&r, "kernel B", &u, &s);
  jit_units_free(&u, 1);
  assert_int_equal(access(sub, W_OK), 0);
  compile_one(&r, "kernel B", &u, &s);
  assert_int_equal(fc.calls, 1);
  assert_true(u.from_cache);
  jit_units_free(&u, 1);
  remove_tree(dir);
  free(dir);
}

static void test_jit_cache_key_covers_every_input(void **state) {
  (void)state;
  const char *o1[] = {"-O3"}, *o2[] = {"-O2"};
  uint64_t k = jit_cache_key("src", "sm_90a", o1, 1, 13000, "0.1.0");
  assert_int_equal(k, jit_cache_key("src", "sm_90a", o1, 1, 13000, "0.1.0"));
  assert_int_not_equal(k, jit_cache_key("src ", "sm_90a", o1, 1, 13000, "0.1.0"));
  assert_int_not_equal(k, jit_cache_key("src", "sm_100a", o1, 1, 13000, "0.1.0"));
  assert_int_not_equal(k, jit_cache_key("src", "sm_90a", o2, 1, 13000, "0.1.0"));
  assert_int_not_equal(k, jit_cache_key("src", "sm_90a", o1, 0, 13000, "0.1.0"));
  assert_int_not_equal(k, jit_cache_key("src", "sm_90a", o1, 1, 13010, "0.1.0"));
  assert_int_not_equal(k, jit_cache_key("src", "sm_90a", o1, 1, 13000, "0.1.1"));
}

static void test_jit_cache_new_compiler_version_misses(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  FakeCompiler fc = {0};
  JitRequest r = request(dir, &fc, 13000);
  JitUnit u;
  JitStats s;
  compile_one(&r, "kernel B", &u, &s);
  jit_units_free(&u, 1);
  r.compiler_version = 13010;
  compile_one(&r, "kernel B", &u, &s);
  assert_int_equal(fc.calls, 2);
  assert_false(u.from_cache);
  jit_units_free(&u, 1);
  remove_tree(dir);
  free(dir);
}

// Damages the only entry in `dir` by `how`: 't' truncates it, 'f' flips a payload byte, 'h'
// flips a header byte.
static void damage_entry(const JitRequest *r, const char *src, char how) {
  uint64_t key = jit_cache_key(src, r->arch, r->options, r->noptions, r->compiler_version,
                               r->gemc_version);
  char path[4200];
  jit_cache_path(r->cache_dir, r->arch, key, path, sizeof path);
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  if (how == 't') {
    fclose(f);
    assert_int_equal(truncate(path, n - 3), 0);
    return;
  }
  long at = how == 'f' ? n - 2 : 17;
  fseek(f, at, SEEK_SET);
  int c = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
}

static void test_jit_cache_corrupt_entry_is_rebuilt(void **state) {
  (void)state;
  const char hows[] = {'t', 'f', 'h'};
  for (int i = 0; i < 3; i++) {
    char *dir = make_temp_dir();
    FakeCompiler fc = {0};
    JitRequest r = request(dir, &fc, 13000);
    JitUnit u;
    JitStats s;
    compile_one(&r, "kernel C", &u, &s);
    jit_units_free(&u, 1);
    damage_entry(&r, "kernel C", hows[i]);
    // The direct read says why.
    uint64_t key = jit_cache_key("kernel C", "sm_90a", r.options, 2, 13000, "0.1.0");
    void *img;
    size_t n;
    bool corrupt;
    char err[4400];
    assert_false(jit_cache_load(dir, "sm_90a", key, &img, &n, &corrupt, err, sizeof err));
    assert_true(corrupt);
    assert_non_null(strstr(err, dir));
    // A request rebuilds it, and the rebuilt entry is a hit again.
    compile_one(&r, "kernel C", &u, &s);
    assert_int_equal(fc.calls, 2);
    assert_true(u.rebuilt);
    assert_int_equal(s.rebuilt, 1);
    assert_memory_equal(u.image, "sm_90a:kernel C", u.size);
    jit_units_free(&u, 1);
    compile_one(&r, "kernel C", &u, &s);
    assert_int_equal(fc.calls, 2);
    assert_true(u.from_cache);
    jit_units_free(&u, 1);
    remove_tree(dir);
    free(dir);
  }
}

static void test_jit_cache_parallel_units_and_failure_named(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  FakeCompiler fc = {0};
  JitRequest r = request(dir, &fc, 13000);
  enum { N = 9 };
  char srcs[N][32];
  JitUnit units[N];
  memset(units, 0, sizeof units);
  for (int i = 0; i < N; i++) {
    snprintf(srcs[i], sizeof srcs[i], "kernel %d", i);
    units[i].name = "unit";
    units[i].source = srcs[i];
  }
  JitStats s;
  char err[4096];
  assert_true(jit_compile_units(&r, units, N, &s, err, sizeof err));
  assert_int_equal(s.misses, N);
  for (int i = 0; i < N; i++) {
    char want[400];
    snprintf(want, sizeof want, "sm_90a:%s", srcs[i]);
    assert_int_equal(units[i].size, strlen(want));
    assert_memory_equal(units[i].image, want, units[i].size);
  }
  jit_units_free(units, N);
  assert_true(jit_compile_units(&r, units, N, &s, err, sizeof err));
  assert_int_equal(s.hits, N);
  jit_units_free(units, N);
  units[4].source = "#error here";
  units[4].name = "bad_kernel";
  assert_false(jit_compile_units(&r, units, N, &s, err, sizeof err));
  assert_non_null(strstr(err, "bad_kernel"));
  assert_non_null(strstr(err, "planted"));
  remove_tree(dir);
  free(dir);
}

static void test_jit_cache_dir_from_environment(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  char sub[512], got[4096], err[512];
  snprintf(sub, sizeof sub, "%s/a/b", dir);
  setenv("GEMC_CACHE_DIR", sub, 1);
  assert_true(jit_cache_dir(got, sizeof got, err, sizeof err));
  assert_string_equal(got, sub);
  assert_int_equal(access(sub, W_OK), 0);
  unsetenv("GEMC_CACHE_DIR");
  remove_tree(dir);
  free(dir);
}

static void test_jit_cache_split_source_per_kernel(void **state) {
  (void)state;
  const char *src =
      "// generated\n#define TILE_M 64\n"
      "// model.gem:3: h = relu(x)\n"
      "extern \"C\" __global__ void k_relu(float *out) { if (1) { out[0] = '}'; } }\n"
      "__device__ float helper(void) { return 2; }  /* } */\n"
      "// model.gem:4: y = x + h\n"
      "extern \"C\" __global__ void k_add(float *out) { out[0] = helper(); /* { */ }\n"
      "// end\n";
  char **units;
  int n = jit_split_source(src, &units);
  assert_int_equal(n, 2);
  for (int i = 0; i < 2; i++) {
    assert_non_null(strstr(units[i], "#define TILE_M 64"));
    assert_non_null(strstr(units[i], "__device__ float helper"));
    assert_non_null(strstr(units[i], "// end"));
  }
  assert_non_null(strstr(units[0], "k_relu(float *out) { if (1) { out[0] = '}'; } }"));
  assert_null(strstr(units[0], "k_add"));
  assert_non_null(strstr(units[1], "k_add(float *out) { out[0] = helper(); /* { */ }"));
  assert_null(strstr(units[1], "k_relu"));
  for (int i = 0; i < n; i++) free(units[i]);
  free(units);
  assert_int_equal(jit_split_source("no kernels", &units), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jit_cache_second_request_hits),
      cmocka_unit_test(test_jit_cache_missing_dir_is_made),
      cmocka_unit_test(test_jit_cache_key_covers_every_input),
      cmocka_unit_test(test_jit_cache_new_compiler_version_misses),
      cmocka_unit_test(test_jit_cache_corrupt_entry_is_rebuilt),
      cmocka_unit_test(test_jit_cache_parallel_units_and_failure_named),
      cmocka_unit_test(test_jit_cache_dir_from_environment),
      cmocka_unit_test(test_jit_cache_split_source_per_kernel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
