// test_gdpa_case_lengths.c: the batches of `gemc bench gdpa` without a GPU: the lengths-file
// reader (gdpa_lengths_parse, gdpa_lengths_read) takes pairs, comments and any line end, and
// refuses every bad file with "FILE:LINE: error: ..." (never a crash); the workloads follow
// their definitions (Meta's self s has lk = N, jagged self lq = lk, PMA lognormal); and the
// driver reads --lengths before any GPU work, exiting 1 on a bad file.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "commands.h"
#include "run_command.h"
#include "gdpa_case.h"
#include "internal_error.h"

static bool parse(const char *text, GdpaLengths *l, char *err, size_t cap) {
  return gdpa_lengths_parse("f.txt", text, strlen(text), l, err, cap);
}

// --- the reader ---------------------------------------------------------------------------

static void test_gdpa_lengths_parse_reads_pairs_comments_and_line_ends(void **state) {
  (void)state;
  const char *text = "# lq lk\n10 20\n\n\t 5 5   # inline\r\n7 0\r0 9\n# last\n12 3";
  GdpaLengths l;
  char err[256];
  assert_true(parse(text, &l, err, sizeof err));
  const int64_t lq[] = {10, 5, 7, 0, 12}, lk[] = {20, 5, 0, 9, 3};
  assert_int_equal(l.n, 5);
  for (int i = 0; i < 5; i++) assert_int_equal(l.lq[i], lq[i]), assert_int_equal(l.lk[i], lk[i]);
  assert_true(gdpa_lengths_pairs(&l) == 10 * 20 + 25 + 36);
  assert_int_equal(gdpa_lengths_max_q(&l), 12);
  assert_int_equal(gdpa_lengths_max_k(&l), 20);
  assert_int_equal(gdpa_lengths_sum_q(&l), 34);
  assert_false(gdpa_lengths_self(&l));
  gdpa_lengths_free(&l);
  assert_true(parse("3 3\n1 1\n", &l, err, sizeof err));
  assert_true(gdpa_lengths_self(&l));
  gdpa_lengths_free(&l);
}

static void test_gdpa_lengths_parse_reports_file_and_line(void **state) {
  (void)state;
  const struct {
    const char *text, *want;
  } bad[] = {
      {"1 2\n3 x\n", "f.txt:2: error: lk is not a whole number: 'x'"},
      {"1.5 2\n", "f.txt:1: error: lq is not a whole number: '1.5'"},
      {"+5 2\n", "f.txt:1: error: lq is not a whole number: '+5'"},
      {"-\t2\n", "f.txt:1: error: lq is not a whole number: '-'"},
      {"1 2\n-3 4\n", "f.txt:2: error: lq is negative: '-3'"},
      {"1 -0x4\n", "f.txt:1: error: lk is not a whole number: '-0x4'"},
      {"1 2\r\n3 4\r\n5,6\r\n", "f.txt:3: error: expected two numbers 'lq lk', found only '5,6'"},
      {"4\n", "f.txt:1: error: expected two numbers 'lq lk', found only '4'"},
      {"1 2 3\n", "f.txt:1: error: expected two numbers 'lq lk', found a third word '3'"},
      {"2000000 1\n", "f.txt:1: error: lq '2000000' is longer than 1048576"},
      {"1 99999999999999999999999999\n", "f.txt:1: error: lk '9999999999999999999999"},
      {"", "f.txt: error: no 'lq lk' pairs: the batch is empty"},
      {"# only a comment\n\n  \n", "f.txt: error: no 'lq lk' pairs: the batch is empty"},
      {"0 5\n5 0\n", "f.txt: error: no query-key pairs (lq * lk is 0 on every line)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    GdpaLengths l = {0};
    char err[256] = "";
    assert_false(parse(bad[i].text, &l, err, sizeof err));
    if (!strstr(err, bad[i].want))
      fail_msg("for %s\n  got:  %s\n  want: %s", bad[i].text, err, bad[i].want);
    assert_null(l.lq);
  }
}

// A NUL or a control byte is shown as '?'; a huge word is cut short.
static void test_gdpa_lengths_parse_shows_bytes_safely(void **state) {
  (void)state;
  const char text[] = "1 2\n3 4\x01\n5\0 6\n";
  GdpaLengths l;
  char err[256];
  assert_false(gdpa_lengths_parse("f.txt", text, sizeof text - 1, &l, err, sizeof err));
  assert_string_equal(err, "f.txt:2: error: lk is not a whole number: '4?'");
  char *long_word = malloc(5000);
  memset(long_word, '7', 4998);
  long_word[0] = 'z', long_word[4998] = '\n', long_word[4999] = '\0';
  assert_false(gdpa_lengths_parse("f.txt", long_word, 4999, &l, err, sizeof err));
  assert_non_null(strstr(err, "f.txt:1: error: expected two numbers 'lq lk', found only 'z7777"));
  assert_true(strlen(err) < 120);
  free(long_word);
}

// The caps: examples, and the rows of either side.
static void test_gdpa_lengths_parse_refuses_a_batch_too_large(void **state) {
  (void)state;
  size_t n = (size_t)GDPA_LENGTHS_MAX_EXAMPLES + 1;
  char *text = malloc(4 * n + 1);
  for (size_t i = 0; i < n; i++) memcpy(text + 4 * i, "1 1\n", 4);
  text[4 * n] = '\0';
  GdpaLengths l;
  char err[256];
  assert_true(gdpa_lengths_parse("f.txt", text, 4 * (n - 1), &l, err, sizeof err));
  assert_int_equal(l.n, GDPA_LENGTHS_MAX_EXAMPLES);
  gdpa_lengths_free(&l);
  assert_false(gdpa_lengths_parse("f.txt", text, 4 * n, &l, err, sizeof err));
  assert_string_equal(err, "f.txt:1048577: error: more than 1048576 examples, the most a lengths "
                           "file may give");
  free(text);
  // 128 examples of 2^20 rows are 2^27, the most; one more row passes it
  StrBuf sb = {0};
  for (int i = 0; i < 128; i++) sb_puts(&sb, "1048576 1\n");
  assert_true(gdpa_lengths_parse("f.txt", sb.data, sb.len, &l, err, sizeof err));
  gdpa_lengths_free(&l);
  sb_puts(&sb, "1 1\n");
  assert_false(gdpa_lengths_parse("f.txt", sb.data, sb.len, &l, err, sizeof err));
  assert_string_equal(err, "f.txt:129: error: the lq lengths add up to more than 134217728 rows, "
                           "the most a batch may have");
  sb_free(&sb);
}

static void test_gdpa_lengths_read_files(void **state) {
  (void)state;
  char dir[] = "/tmp/gemc_lengths_XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/l.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("# from a file\n3 4\n", f);
  fclose(f);
  GdpaLengths l;
  char err[512];
  assert_true(gdpa_lengths_read(path, &l, err, sizeof err));
  assert_int_equal(l.n, 1), assert_int_equal(l.lq[0], 3), assert_int_equal(l.lk[0], 4);
  gdpa_lengths_free(&l);
  // a bad line names the path
  f = fopen(path, "w");
  fputs("3 4\n3 four\n", f);
  fclose(f);
  assert_false(gdpa_lengths_read(path, &l, err, sizeof err));
  char want[128];
  snprintf(want, sizeof want, "%s:2: error: lk is not a whole number: 'four'", path);
  assert_string_equal(err, want);
  // missing, a directory
  unlink(path);
  assert_false(gdpa_lengths_read(path, &l, err, sizeof err));
  assert_non_null(strstr(err, "gemc: error: cannot open lengths file "));
  assert_non_null(strstr(err, "No such file or directory"));
  assert_false(gdpa_lengths_read(dir, &l, err, sizeof err));
  assert_non_null(strstr(err, "it is a directory, not a regular file"));
  rmdir(dir);
}

// --- the workloads ------------------------------------------------------------------------

static void test_gdpa_workloads_follow_their_definitions(void **state) {
  (void)state;
  enum { B = 1152, N = 1024 };
  GdpaLengths l, again;
  // Meta's self s=0.5: lq ~ U[1, N], lk = N for every example
  gdpa_lengths_make(GDPA_META_SELF, B, N, 0.5, 0, 7, &l);
  int64_t lo = N, hi = 0;
  for (int b = 0; b < B; b++) {
    assert_int_equal(l.lk[b], N);
    assert_true(l.lq[b] >= 1 && l.lq[b] <= N);
    lo = l.lq[b] < lo ? l.lq[b] : lo, hi = l.lq[b] > hi ? l.lq[b] : hi;
  }
  assert_true(lo < 20 && hi > N - 20);  // it spans [1, N]
  assert_false(gdpa_lengths_self(&l));
  gdpa_lengths_make(GDPA_META_SELF, B, N, 0.5, 0, 7, &again);  // the same batch again
  assert_memory_equal(l.lq, again.lq, B * sizeof *l.lq);
  gdpa_lengths_free(&l), gdpa_lengths_free(&again);
  // s=0.75: lq in [N/2, N]; s=1.0: lq = lk = N, a self batch
  gdpa_lengths_make(GDPA_META_SELF, B, N, 0.75, 0, 7, &l);
  for (int b = 0; b < B; b++) assert_true(l.lq[b] >= N / 2 && l.lq[b] <= N);
  gdpa_lengths_free(&l);
  gdpa_lengths_make(GDPA_META_SELF, B, N, 1.0, 0, 7, &l);
  for (int b = 0; b < B; b++) assert_int_equal(l.lq[b], N);
  assert_true(gdpa_lengths_self(&l));
  gdpa_lengths_free(&l);
  // jagged self: lq = lk ~ U[1, N]
  gdpa_lengths_make(GDPA_JAGGED_SELF, B, N, 0.5, 0, 7, &l);
  assert_true(gdpa_lengths_self(&l));
  for (int b = 0; b < B; b++) assert_true(l.lq[b] >= 1 && l.lq[b] <= N);
  gdpa_lengths_free(&l);
  // cross KV=256 at s=1: lq = N, lk = 256
  gdpa_lengths_make(GDPA_CROSS, B, N, 1.0, 256, 7, &l);
  for (int b = 0; b < B; b++) assert_int_equal(l.lq[b], N), assert_int_equal(l.lk[b], 256);
  gdpa_lengths_free(&l);
  // PMA: 32 seeds over lognormal kv, median N/8, clamped to [1, 4096]
  gdpa_lengths_make(GDPA_PMA, B, 4096, 1.0, 32, 7, &l);
  int below = 0, at_max = 0;
  for (int b = 0; b < B; b++) {
    assert_int_equal(l.lq[b], 32);
    assert_true(l.lk[b] >= 1 && l.lk[b] <= 4096);
    below += l.lk[b] < 512;
    at_max += l.lk[b] == 4096;
  }
  print_message("PMA lognormal: %d of %d below N/8, %d at N\n", below, B, at_max);
  assert_true(below > B * 45 / 100 && below < B * 55 / 100);  // the median is N/8
  assert_true(at_max > 0 && at_max < B / 50);  // e^2 = N/8 * 7.4: about 2% past N
  gdpa_lengths_free(&l);
}

// --- the driver ---------------------------------------------------------------------------

// cmd_bench on the words, stderr captured into err (run_command.h).
static int run_bench(char *err, size_t cap, int nwords, char **words) {
  return run_command(cmd_bench, CMD_BENCH, false, err, cap, nwords, words);
}

static void test_gdpa_lengths_option_reads_files_before_the_gpu(void **state) {
  (void)state;
  setenv("GEMC_NO_CUDA", "1", 1);
  char dir[] = "/tmp/gemc_lengths_XXXXXX", good[64], bad[64], missing[64];
  assert_non_null(mkdtemp(dir));
  snprintf(good, sizeof good, "%s/good.txt", dir);
  snprintf(bad, sizeof bad, "%s/bad.txt", dir);
  snprintf(missing, sizeof missing, "%s/missing.txt", dir);
  FILE *f = fopen(good, "w");
  fputs("512 1024\n3 1024\n", f);
  fclose(f);
  f = fopen(bad, "w");
  fputs("512 1024\n# fine\n3 -1024\n", f);
  fclose(f);
  char err[2048], want[128];
  char *ok_words[] = {"gdpa", "--lengths", good};
  assert_int_equal(run_bench(err, sizeof err, 3, ok_words), GEMC_EXIT_USER_ERROR);
  assert_non_null(strstr(err, "no GPU: "));
  char *bad_words[] = {"gdpa", "--lengths", good, "--lengths", bad};
  assert_int_equal(run_bench(err, sizeof err, 5, bad_words), GEMC_EXIT_USER_ERROR);
  snprintf(want, sizeof want, "%s:3: error: lk is negative: '-1024'\n", bad);
  assert_string_equal(err, want);
  char lengths_eq[96];
  snprintf(lengths_eq, sizeof lengths_eq, "--lengths=%s", missing);
  char *missing_words[] = {"gdpa", lengths_eq};
  assert_int_equal(run_bench(err, sizeof err, 2, missing_words), GEMC_EXIT_USER_ERROR);
  assert_non_null(strstr(err, "gemc: error: cannot open lengths file "));
  assert_null(strstr(err, "no GPU"));
  // usage errors
  char *no_file[] = {"gdpa", "--lengths"};
  assert_int_equal(run_bench(err, sizeof err, 2, no_file), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "--lengths needs a file"));
  char *quick[] = {"gdpa", "--quick", "--lengths", good};
  assert_int_equal(run_bench(err, sizeof err, 4, quick), GEMC_EXIT_USAGE);
  char *deal[] = {"gdpa", "--deal", "snake"};
  assert_int_equal(run_bench(err, sizeof err, 3, deal), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "--deal takes lpt or zigzag, not snake"));
  char *zigzag[] = {"gdpa", "--deal=zigzag", "--lengths", good};
  assert_int_equal(run_bench(err, sizeof err, 4, zigzag), GEMC_EXIT_USER_ERROR);
  assert_non_null(strstr(err, "no GPU: "));
  char *gemm[] = {"gemm", "--lengths", good};
  assert_int_equal(run_bench(err, sizeof err, 3, gemm), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "are options of 'gemc bench gdpa'"));
  unlink(good), unlink(bad), rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gdpa_lengths_parse_reads_pairs_comments_and_line_ends),
      cmocka_unit_test(test_gdpa_lengths_parse_reports_file_and_line),
      cmocka_unit_test(test_gdpa_lengths_parse_shows_bytes_safely),
      cmocka_unit_test(test_gdpa_lengths_parse_refuses_a_batch_too_large),
      cmocka_unit_test(test_gdpa_lengths_read_files),
      cmocka_unit_test(test_gdpa_workloads_follow_their_definitions),
      cmocka_unit_test(test_gdpa_lengths_option_reads_files_before_the_gpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
