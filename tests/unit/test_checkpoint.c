// test_checkpoint.c: checkpoint files. A round trip restores every byte; a truncated, flipped,
// foreign or mismatched file is refused with a message naming the file, before a single byte
// reaches the caller's buffers; a save that fails half-way leaves the previous checkpoint.
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "hash.h"

enum { KEY = 0x1234abcd, SENTINEL = 0xab };

// A little training state: a "parameter", an "optimizer moment", an empty entry, a counter.
typedef struct State {
  float w[37];
  float m[37];
  int64_t step;
  char empty[1];
} State;

static void fill_state(State *s, float base) {
  for (int i = 0; i < 37; i++) {
    s->w[i] = base + (float)i * 0.25f;
    s->m[i] = -base * (float)i;
  }
  s->step = (int64_t)base * 1000 + 7;
}

static int state_entries(State *s, CkptEntry *e) {
  e[0] = (CkptEntry){"param:w", s->w, sizeof s->w, CKPT_FINITE};
  e[1] = (CkptEntry){"adamw.m:w", s->m, sizeof s->m, CKPT_FINITE};
  e[2] = (CkptEntry){"train.losses", s->empty, 0, CKPT_ANY};
  e[3] = (CkptEntry){"optim.step:w", &s->step, sizeof s->step, CKPT_ANY};
  return 4;
}

static char *make_temp_dir(void) {
  char *dir = strdup("/tmp/gemc_test_ckpt_XXXXXX");
  assert_non_null(mkdtemp(dir));
  return dir;
}

static void remove_tree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static char *file_of(const char *dir) {
  char *p = malloc(strlen(dir) + 32);
  sprintf(p, "%s/%s", dir, CHECKPOINT_FILE);
  return p;
}

static unsigned char *read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  rewind(f);
  unsigned char *buf = malloc(*size + 1);
  assert_int_equal(fread(buf, 1, *size, f), *size);
  fclose(f);
  return buf;
}

static void write_all(const char *path, const unsigned char *buf, size_t size) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, size, f), size);
  fclose(f);
}

static void save_state(const char *dir, float base, int64_t step) {
  State s;
  fill_state(&s, base);
  CkptEntry e[4];
  int n = state_entries(&s, e);
  char err[512] = "";
  bool ok = checkpoint_save(dir, "tiny", KEY, step, e, n, err, sizeof err);
  if (!ok) fprintf(stderr, "%s\n", err);
  assert_true(ok);
}

// Loads into sentinel-filled buffers. On failure, checks that the message names the file,
// contains `needle`, and that no buffer was touched.
static bool load_expect(const char *dir, uint64_t key, const char *needle) {
  State s;
  memset(&s, SENTINEL, sizeof s);
  CkptEntry e[4];
  int n = state_entries(&s, e);
  char err[512] = "";
  int64_t step = -1;
  bool ok = checkpoint_load(dir, key, &step, e, n, err, sizeof err);
  if (ok) return true;
  char *path = file_of(dir);
  if (!strstr(err, needle) || !strstr(err, path))
    fail_msg("message '%s' lacks '%s' or the path", err, needle);
  free(path);
  const unsigned char *bytes = (const unsigned char *)&s;
  for (size_t i = 0; i < sizeof s; i++) assert_int_equal(bytes[i], SENTINEL);
  assert_int_equal(step, -1);
  return false;
}

// --- tests ------------------------------------------------------------------------------

static void test_checkpoint_round_trip_restores_every_byte(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  char nested[512];
  snprintf(nested, sizeof nested, "%s/a/b", dir);  // save creates missing directories
  save_state(nested, 3.5f, 42);

  State s;
  memset(&s, 0, sizeof s);
  CkptEntry e[4];
  int n = state_entries(&s, e);
  char err[512];
  int64_t step = 0;
  assert_true(checkpoint_load(nested, KEY, &step, e, n, err, sizeof err));
  assert_int_equal(step, 42);
  State want;
  fill_state(&want, 3.5f);
  assert_memory_equal(s.w, want.w, sizeof want.w);
  assert_memory_equal(s.m, want.m, sizeof want.m);
  assert_int_equal(s.step, want.step);

  CkptInfo info;
  assert_true(checkpoint_info(nested, &info, err, sizeof err));
  assert_string_equal(info.model, "tiny");
  assert_int_equal(info.model_key, KEY);
  assert_int_equal(info.step, 42);
  assert_int_equal(info.nentries, 4);
  assert_int_equal(checkpoint_info_size(&info, "param:w"), sizeof want.w);
  assert_int_equal(checkpoint_info_size(&info, "train.losses"), 0);
  assert_int_equal(checkpoint_info_size(&info, "nope"), -1);
  checkpoint_info_free(&info);

  // A second save replaces the first.
  save_state(nested, -1.0f, 43);
  assert_true(checkpoint_load(nested, KEY, &step, e, n, err, sizeof err));
  assert_int_equal(step, 43);
  fill_state(&want, -1.0f);
  assert_memory_equal(s.w, want.w, sizeof want.w);
  remove_tree(dir);
  free(dir);
}

static void test_checkpoint_truncation_is_refused_at_every_offset(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  save_state(dir, 1.0f, 5);
  char *path = file_of(dir);
  size_t size;
  unsigned char *whole = read_all(path, &size);
  for (size_t cut = 0; cut < size; cut++) {
    write_all(path, whole, cut);
    assert_false(load_expect(dir, KEY, "truncated"));
    char err[512];
    CkptInfo info;
    assert_false(checkpoint_info(dir, &info, err, sizeof err));
  }
  write_all(path, whole, size);
  assert_true(load_expect(dir, KEY, ""));
  free(whole);
  free(path);
  remove_tree(dir);
  free(dir);
}

static void test_checkpoint_any_flipped_byte_is_refused(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  save_state(dir, 2.0f, 9);
  char *path = file_of(dir);
  size_t size;
  unsigned char *whole = read_all(path, &size);
  for (size_t at = 0; at < size; at++) {
    whole[at] ^= 0x10;
    write_all(path, whole, size);
    // Most flips break the checksum; in the header they may break the magic, the version or
    // the size first. Each is refused with its own message.
    const char *needle = at < 8 ? "wrong magic" : at < 12 ? "format version"
                       : at >= 16 && at < 24 ? "" : "checksum";
    assert_false(load_expect(dir, KEY, needle));
    whole[at] ^= 0x10;
  }
  write_all(path, whole, size);
  assert_true(load_expect(dir, KEY, ""));
  // Trailing garbage is refused too.
  unsigned char *longer = malloc(size + 3);
  memcpy(longer, whole, size);
  memcpy(longer + size, "xyz", 3);
  write_all(path, longer, size + 3);
  assert_false(load_expect(dir, KEY, "corrupt"));
  free(longer);
  free(whole);
  free(path);
  remove_tree(dir);
  free(dir);
}

static void test_checkpoint_wrong_magic_and_missing_file_are_refused(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  assert_false(load_expect(dir, KEY, "cannot open"));
  char *path = file_of(dir);
  const char text[] = "this is a text file, not a checkpoint, and it is long enough to hold a "
                      "header\n";
  write_all(path, (const unsigned char *)text, sizeof text - 1);
  assert_false(load_expect(dir, KEY, "not a gemc checkpoint (wrong magic number)"));
  free(path);
  remove_tree(dir);
  free(dir);
}

static void test_checkpoint_other_model_key_is_refused(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  save_state(dir, 1.0f, 5);
  assert_false(load_expect(dir, KEY + 1, "was written for model 'tiny' with other shapes"));
  remove_tree(dir);
  free(dir);
}

static void test_checkpoint_missing_extra_and_resized_entries_are_refused(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  save_state(dir, 1.0f, 5);
  char err[512];
  int64_t step = -1;
  float w[37], m[37], extra[4], small[36];
  int64_t st;
  char empty[1];

  // One more entry than the file has.
  CkptEntry more[5] = {{"param:w", w, sizeof w, CKPT_ANY}, {"adamw.m:w", m, sizeof m, CKPT_ANY},
                       {"train.losses", empty, 0, CKPT_ANY}, {"optim.step:w", &st, sizeof st, CKPT_ANY},
                       {"adamw.v:w", extra, sizeof extra, CKPT_ANY}};
  assert_false(checkpoint_load(dir, KEY, &step, more, 5, err, sizeof err));
  assert_non_null(strstr(err, "has no entry 'adamw.v:w'"));

  // One fewer.
  assert_false(checkpoint_load(dir, KEY, &step, more, 3, err, sizeof err));
  assert_non_null(strstr(err, "has an entry 'optim.step:w' that this model does not have"));

  // Another size.
  CkptEntry resized[4] = {{"param:w", small, sizeof small, CKPT_ANY}, {"adamw.m:w", m, sizeof m, CKPT_ANY},
                          {"train.losses", empty, 0, CKPT_ANY}, {"optim.step:w", &st, sizeof st, CKPT_ANY}};
  assert_false(checkpoint_load(dir, KEY, &step, resized, 4, err, sizeof err));
  assert_non_null(strstr(err, "entry 'param:w' has 148 bytes, this model needs 144"));
  assert_int_equal(step, -1);
  remove_tree(dir);
  free(dir);
}

static int count_temp_files(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, ".checkpoint.gemc.", 17) == 0) n++;
  closedir(d);
  return n;
}

// A save that runs out of room half-way (the file size limit stands in for a full disk)
// fails, removes its temporary file and leaves the previous checkpoint as it was.
static void test_checkpoint_failed_save_leaves_the_old_one(void **state) {
  (void)state;
  char *dir = make_temp_dir();
  save_state(dir, 1.0f, 5);

  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {100000, 100000};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
    size_t big = 1 << 20;
    void *data = calloc(1, big);
    CkptEntry e = {"param:w", data, big, CKPT_ANY};
    char err[512] = "";
    bool ok = checkpoint_save(dir, "tiny", KEY, 99, &e, 1, err, sizeof err);
    _exit(ok ? 11 : strstr(err, "cannot write checkpoint") && strstr(err, "unchanged") ? 0 : 12);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  // The old checkpoint loads, with its own contents and step.
  State s;
  CkptEntry e[4];
  int n = state_entries(&s, e);
  char err[512];
  int64_t step = 0;
  assert_true(checkpoint_load(dir, KEY, &step, e, n, err, sizeof err));
  assert_int_equal(step, 5);
  State want;
  fill_state(&want, 1.0f);
  assert_memory_equal(s.w, want.w, sizeof want.w);
  assert_int_equal(count_temp_files(dir), 0);
  remove_tree(dir);
  free(dir);
}

static void test_checkpoint_hash_is_fnv1a(void **state) {
  (void)state;
  // Published FNV-1a 64 values.
  assert_true(fnv1a64(FNV1A64_INIT, "", 0) == 0xcbf29ce484222325ull);
  assert_true(fnv1a64(FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cull);
  assert_true(fnv1a64(FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ull);
  // Hashing in pieces is hashing the whole.
  uint64_t h = fnv1a64(FNV1A64_INIT, "foo", 3);
  assert_true(fnv1a64(h, "bar", 3) == 0x85944171f73967e8ull);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checkpoint_round_trip_restores_every_byte),
      cmocka_unit_test(test_checkpoint_truncation_is_refused_at_every_offset),
      cmocka_unit_test(test_checkpoint_any_flipped_byte_is_refused),
      cmocka_unit_test(test_checkpoint_wrong_magic_and_missing_file_are_refused),
      cmocka_unit_test(test_checkpoint_other_model_key_is_refused),
      cmocka_unit_test(test_checkpoint_missing_extra_and_resized_entries_are_refused),
      cmocka_unit_test(test_checkpoint_failed_save_leaves_the_old_one),
      cmocka_unit_test(test_checkpoint_hash_is_fnv1a),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
