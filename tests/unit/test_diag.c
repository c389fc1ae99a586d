// test_diag.c: the diagnostics layer. Pins the exact text of errors, warnings and notes
// (caret, underline, tabs, odd bytes, long lines, the 20-error limit), and the small
// pieces under it: source_read, the arena and gemc_internal_error.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena.h"
#include "diag.h"
#include "internal_error.h"

// A Diag over `text` that writes into a memory buffer.
typedef struct Capture {
  SourceFile src;
  Diag d;
  FILE *out;
  char *buf;
  size_t size;
} Capture;

static void capture_open(Capture *c, const char *text) {
  memset(c, 0, sizeof *c);
  source_from_memory(&c->src, "t.gem", text, strlen(text));
  c->out = open_memstream(&c->buf, &c->size);
  assert_non_null(c->out);
  diag_init(&c->d, &c->src, c->out);
}

// What was printed so far.
static const char *captured(Capture *c) {
  fflush(c->out);
  return c->buf;
}

static void capture_close(Capture *c) {
  fclose(c->out);
  free(c->buf);
}

static Loc loc(int l1, int c1, int l2, int c2) { return (Loc){l1, c1, l2, c2}; }

static void test_diag_error_has_gcc_format(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "model m {\n  h = embed(itemz, history);\n}\n");
  diag_error(&c.d, loc(2, 13, 2, 17), "unknown table '%s'", "itemz");
  assert_string_equal(captured(&c),
                      "t.gem:2:13: error: unknown table 'itemz'\n"
                      "    2 |   h = embed(itemz, history);\n"
                      "      |             ^~~~~\n");
  assert_int_equal(c.d.errors, 1);
  assert_false(c.d.too_many);
  capture_close(&c);
}

static void test_diag_caret_at_first_column_without_underline(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "abc\n");
  diag_error(&c.d, loc(1, 1, 1, 1), "x");
  assert_string_equal(captured(&c), "t.gem:1:1: error: x\n"
                                    "    1 | abc\n"
                                    "      | ^\n");
  capture_close(&c);
}

static void test_diag_multiline_range_underlines_to_end_of_first_line(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "a = f(x,\n      y);\n");
  diag_error(&c.d, loc(1, 5, 2, 8), "call");
  assert_string_equal(captured(&c), "t.gem:1:5: error: call\n"
                                    "    1 | a = f(x,\n"
                                    "      |     ^~~~\n");
  capture_close(&c);
}

static void test_diag_keeps_tabs_so_the_caret_aligns(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "\tx =\tfoo;\n");
  diag_error(&c.d, loc(1, 6, 1, 8), "bad");
  assert_string_equal(captured(&c), "t.gem:1:6: error: bad\n"
                                    "    1 | \tx =\tfoo;\n"
                                    "      | \t   \t^~~\n");
  capture_close(&c);
}

static void test_diag_prints_unprintable_bytes_as_question_marks(void **state) {
  (void)state;
  Capture c;
  const char text[] = "a\x01" "b\xff" "c\0d\n";
  memset(&c, 0, sizeof c);
  source_from_memory(&c.src, "t.gem", text, sizeof text - 1);
  c.out = open_memstream(&c.buf, &c.size);
  diag_init(&c.d, &c.src, c.out);
  diag_error(&c.d, loc(1, 7, 1, 7), "nul");
  assert_string_equal(captured(&c), "t.gem:1:7: error: nul\n"
                                    "    1 | a?b?c?d\n"
                                    "      |       ^\n");
  capture_close(&c);
}

static void test_diag_counts_utf8_characters_as_one_cell(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "# h\xc3\xa9llo\nx\n");  // "# héllo": é is two bytes
  diag_error(&c.d, loc(1, 7, 1, 8), "here");
  assert_string_equal(captured(&c), "t.gem:1:7: error: here\n"
                                    "    1 | # h\xc3\xa9llo\n"
                                    "      |      ^~\n");
  capture_close(&c);
}

static void test_diag_without_location_has_no_excerpt(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "model m {}\n");
  diag_error(&c.d, (Loc){0}, "no loss in model '%s'", "m");
  assert_string_equal(captured(&c), "t.gem: error: no loss in model 'm'\n");
  assert_int_equal(c.d.errors, 1);
  capture_close(&c);
}

static void test_diag_warning_and_note_levels(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "x = 1;\ny = x;\n");
  diag_warning(&c.d, loc(1, 1, 1, 1), "binding 'x' is never used");
  diag_note(&c.d, loc(2, 5, 2, 5), "used here");
  assert_string_equal(captured(&c), "t.gem:1:1: warning: binding 'x' is never used\n"
                                    "    1 | x = 1;\n"
                                    "      | ^\n"
                                    "t.gem:2:5: note: used here\n"
                                    "    2 | y = x;\n"
                                    "      |     ^\n");
  assert_int_equal(c.d.warnings, 1);
  assert_int_equal(c.d.errors, 0);
  capture_close(&c);
}

static void test_diag_warnings_as_errors(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "x\n");
  c.d.warnings_are_errors = true;
  diag_warning(&c.d, loc(1, 1, 1, 1), "w");
  assert_non_null(strstr(captured(&c), "t.gem:1:1: error: w\n"));
  assert_int_equal(c.d.errors, 1);
  capture_close(&c);
}

static void test_diag_line_number_field_widens(void **state) {
  (void)state;
  // 123456 lines: the number field grows to six characters.
  size_t n = 123456;
  char *text = malloc(2 * n + 8);
  assert_non_null(text);
  for (size_t i = 0; i < n - 1; i++) memcpy(text + 2 * i, ";\n", 2);
  strcpy(text + 2 * (n - 1), "xyz\n");
  Capture c;
  capture_open(&c, text);
  diag_error(&c.d, loc(123456, 2, 123456, 3), "wide");
  assert_string_equal(captured(&c), "t.gem:123456:2: error: wide\n"
                                    "123456 | xyz\n"
                                    "       |  ^~\n");
  // An earlier line after a later one still finds its text.
  diag_error(&c.d, loc(3, 1, 3, 1), "back");
  assert_non_null(strstr(captured(&c), "    3 | ;\n"));
  capture_close(&c);
  free(text);
}

static void test_diag_caret_after_end_of_line(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "batch 8\r\ndim 4;");  // CRLF, and no newline at the end
  diag_error(&c.d, loc(1, 8, 1, 8), "expected ';'");
  diag_error(&c.d, loc(2, 7, 2, 7), "end");
  assert_string_equal(captured(&c), "t.gem:1:8: error: expected ';'\n"
                                    "    1 | batch 8\n"
                                    "      |        ^\n"
                                    "t.gem:2:7: error: end\n"
                                    "    2 | dim 4;\n"
                                    "      |       ^\n");
  capture_close(&c);
}

static void test_diag_line_past_end_of_file_prints_header_only(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "a\n");
  diag_error(&c.d, loc(7, 1, 7, 1), "far");
  assert_string_equal(captured(&c), "t.gem:7:1: error: far\n");
  capture_close(&c);
}

static void test_diag_long_line_is_cut_around_the_caret(void **state) {
  (void)state;
  char text[5001];
  memset(text, 'a', 5000);
  text[5000] = '\0';
  text[3000] = 'X';
  Capture c;
  capture_open(&c, text);
  diag_error(&c.d, loc(1, 3001, 1, 3001), "x");
  const char *out = captured(&c);
  const char *echo = strstr(out, "    1 | ...");
  assert_non_null(echo);
  const char *marker = strstr(echo, "\n      | ");
  assert_non_null(marker);
  marker += 1;
  const char *x = strchr(echo, 'X');
  const char *caret = strchr(marker, '^');
  assert_non_null(x);
  assert_non_null(caret);
  assert_int_equal(x - echo, caret - marker);  // the caret sits under the X
  assert_true(strlen(out) < 600);              // not the whole 5000-byte line
  capture_close(&c);
}

static void test_diag_stops_after_twenty_errors(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "x\n");
  for (int i = 0; i < 25; i++) diag_error(&c.d, loc(1, 1, 1, 1), "error %d", i + 1);
  diag_warning(&c.d, loc(1, 1, 1, 1), "late warning");
  const char *out = captured(&c);
  assert_int_equal(c.d.errors, DIAG_MAX_ERRORS);
  assert_true(c.d.too_many);
  assert_non_null(strstr(out, "error: error 20\n"));
  assert_null(strstr(out, "error 21"));
  assert_null(strstr(out, "late warning"));
  const char *stop = strstr(out, "t.gem: error: too many errors (20); stopping\n");
  assert_non_null(stop);
  assert_null(strstr(stop + strlen("t.gem: error: too many"), "too many"));  // said once
  capture_close(&c);
}

static void test_diag_exactly_twenty_errors_do_not_say_too_many(void **state) {
  (void)state;
  Capture c;
  capture_open(&c, "x\n");
  for (int i = 0; i < 20; i++) diag_error(&c.d, loc(1, 1, 1, 1), "e");
  assert_null(strstr(captured(&c), "too many"));
  assert_false(c.d.too_many);
  capture_close(&c);
}

// --- source_read ------------------------------------------------------------------------

static void test_source_read_whole_file(void **state) {
  (void)state;
  char path[] = "/tmp/gemc_test_diag_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char body[] = "model m {\0}\n";
  assert_int_equal(write(fd, body, sizeof body - 1), (ssize_t)(sizeof body - 1));
  close(fd);
  SourceFile f;
  assert_true(source_read(&f, path));
  assert_int_equal(f.size, sizeof body - 1);
  assert_memory_equal(f.text, body, sizeof body - 1);
  assert_int_equal(f.text[f.size], '\0');
  assert_string_equal(f.path, path);
  // The file keeps its own copy of the path: the caller's buffer may go (a stack buffer gave
  // the generated kernels' comments garbage file names once).
  assert_ptr_not_equal(f.path, path);
  char kept[sizeof path];
  memcpy(kept, path, sizeof path);
  memset(path, 'x', sizeof path - 1);
  assert_string_equal(f.path, kept);
  source_free(&f);
  assert_null(f.path);
  unlink(kept);
}

// Runs source_read on `path` and returns what it printed to stderr (caller frees).
static char *source_read_stderr(const char *path, bool *ok) {
  fflush(stderr);
  int saved = dup(2);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  dup2(fileno(tmp), 2);
  SourceFile f;
  *ok = source_read(&f, path);
  if (*ok) source_free(&f);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char *text = calloc(1, 1024);
  assert_non_null(text);
  rewind(tmp);
  size_t n = fread(text, 1, 1023, tmp);
  text[n] = '\0';
  fclose(tmp);
  return text;
}

static void test_source_read_refuses_missing_and_huge_files(void **state) {
  (void)state;
  bool ok;
  char *err = source_read_stderr("/nonexistent/dir/x.gem", &ok);
  assert_false(ok);
  assert_string_equal(err, "gemc: error: cannot read /nonexistent/dir/x.gem: No such file or "
                           "directory\n");
  free(err);

  err = source_read_stderr("/tmp", &ok);  // a directory
  assert_false(ok);
  assert_string_equal(err, "gemc: error: cannot read /tmp: Is a directory\n");
  free(err);

  char path[] = "/tmp/gemc_test_diag_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 64 * 1024 * 1024 + 1), 0);  // sparse: cheap to make
  close(fd);
  err = source_read_stderr(path, &ok);
  assert_false(ok);
  assert_non_null(strstr(err, ": the file is larger than 64 MiB\n"));
  free(err);
  unlink(path);
}

// --- the arena --------------------------------------------------------------------------

static void test_arena_gives_zeroed_aligned_memory(void **state) {
  (void)state;
  Arena a = {0};
  for (int i = 1; i < 2000; i += 37) {
    unsigned char *p = arena_alloc(&a, (size_t)i);
    assert_int_equal((uintptr_t)p % _Alignof(max_align_t), 0);
    for (int k = 0; k < i; k++) assert_int_equal(p[k], 0);
    memset(p, 0xAB, (size_t)i);
  }
  char *big = arena_alloc(&a, 1 << 20);  // bigger than a block
  assert_int_equal(big[(1 << 20) - 1], 0);
  assert_string_equal(arena_strdup(&a, "hello"), "hello");
  assert_string_equal(arena_strndup(&a, "hello", 3), "hel");
  arena_free(&a);
  assert_null(a.head);
}

static void test_arena_grow_keeps_the_elements(void **state) {
  (void)state;
  Arena a = {0};
  int *v = NULL;
  int n = 0, cap = 0;
  for (int i = 0; i < 100000; i++) {
    if (n == cap) {
      int next = cap ? 2 * cap : 4;
      v = arena_grow(&a, v, (size_t)n, (size_t)next, sizeof *v);
      cap = next;
    }
    v[n++] = i;
  }
  for (int i = 0; i < n; i++) assert_int_equal(v[i], i);
  arena_free(&a);
}

// --- internal errors --------------------------------------------------------------------

static void test_internal_error_exits_with_code_3(void **state) {
  (void)state;
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(pipefd[1], 2);
    gemc_internal_error("sema.c", 42, "a tensor without a shape");
  }
  close(pipefd[1]);
  char buf[256] = {0};
  ssize_t got = read(pipefd[0], buf, sizeof buf - 1);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(got > 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), GEMC_EXIT_INTERNAL);
  assert_string_equal(buf, "gemc: internal error at sema.c:42: a tensor without a shape\n");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_diag_error_has_gcc_format),
      cmocka_unit_test(test_diag_caret_at_first_column_without_underline),
      cmocka_unit_test(test_diag_multiline_range_underlines_to_end_of_first_line),
      cmocka_unit_test(test_diag_keeps_tabs_so_the_caret_aligns),
      cmocka_unit_test(test_diag_prints_unprintable_bytes_as_question_marks),
      cmocka_unit_test(test_diag_counts_utf8_characters_as_one_cell),
      cmocka_unit_test(test_diag_without_location_has_no_excerpt),
      cmocka_unit_test(test_diag_warning_and_note_levels),
      cmocka_unit_test(test_diag_warnings_as_errors),
      cmocka_unit_test(test_diag_line_number_field_widens),
      cmocka_unit_test(test_diag_caret_after_end_of_line),
      cmocka_unit_test(test_diag_line_past_end_of_file_prints_header_only),
      cmocka_unit_test(test_diag_long_line_is_cut_around_the_caret),
      cmocka_unit_test(test_diag_stops_after_twenty_errors),
      cmocka_unit_test(test_diag_exactly_twenty_errors_do_not_say_too_many),
      cmocka_unit_test(test_source_read_whole_file),
      cmocka_unit_test(test_source_read_refuses_missing_and_huge_files),
      cmocka_unit_test(test_arena_gives_zeroed_aligned_memory),
      cmocka_unit_test(test_arena_grow_keeps_the_elements),
      cmocka_unit_test(test_internal_error_exits_with_code_3),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
