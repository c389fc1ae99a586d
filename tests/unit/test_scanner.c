// test_scanner.c: the tokens of a .gem file, their exact locations, and every lexical
// error with its line:col and message. Drives the scanner the way the parser does, through
// parse_next_token.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../grammar/parse_state.h"
#include "arena.h"
#include "diag.h"

enum { MAX_TOKENS = 2000 };

// Every token of one input, and what the scanner reported.
typedef struct Lexed {
  SourceFile src;
  Arena arena;
  Diag d;
  FILE *out;
  char *diag_text;
  size_t diag_size;
  int n;  // tokens before end of file
  int kind[MAX_TOKENS];
  Loc loc[MAX_TOKENS];
  YYSTYPE value[MAX_TOKENS];
  Loc eof;
} Lexed;

static Lexed *lex_bytes(const char *text, size_t size) {
  Lexed *x = calloc(1, sizeof *x);
  assert_non_null(x);
  source_from_memory(&x->src, "t.gem", text, size);
  x->out = open_memstream(&x->diag_text, &x->diag_size);
  assert_non_null(x->out);
  diag_init(&x->d, &x->src, x->out);
  ParseState ps;
  parse_state_open(&ps, &x->src, &x->arena, &x->d);
  for (;;) {
    YYSTYPE v;
    Loc l;
    int k = parse_next_token(&v, &l, &ps);
    if (k == 0) {
      x->eof = l;
      break;
    }
    assert_true(x->n < MAX_TOKENS);
    x->kind[x->n] = k;
    x->loc[x->n] = l;
    x->value[x->n] = v;
    x->n++;
  }
  parse_state_close(&ps);
  fflush(x->out);
  return x;
}

static Lexed *lex(const char *text) { return lex_bytes(text, strlen(text)); }

static void lexed_free(Lexed *x) {
  fclose(x->out);
  free(x->diag_text);
  arena_free(&x->arena);
  free(x);
}

#define assert_loc(l, l1, c1, l2, c2)          \
  do {                                         \
    assert_int_equal((l).first_line, (l1));    \
    assert_int_equal((l).first_column, (c1));  \
    assert_int_equal((l).last_line, (l2));     \
    assert_int_equal((l).last_column, (c2));   \
  } while (0)

// Asserts that the diagnostics contain `text` (a whole header line, say).
static void assert_reported(const Lexed *x, const char *text) {
  if (!x->diag_text || !strstr(x->diag_text, text)) {
    print_error("expected diagnostic: %s\nactual diagnostics:\n%s\n", text,
                x->diag_text ? x->diag_text : "(none)");
    fail();
  }
}

// --- tokens -----------------------------------------------------------------------------

static void test_scanner_keywords(void **state) {
  (void)state;
  Lexed *x = lex("model batch dim precision target optim seq sparse multihot dense label "
                 "table loss id max like");
  int kinds[] = {KW_MODEL, KW_BATCH, KW_DIM, KW_PRECISION, KW_TARGET, KW_OPTIM,
                 KW_SEQ, KW_SPARSE, KW_MULTIHOT, KW_DENSE, KW_LABEL, KW_TABLE,
                 KW_LOSS, KW_ID, KW_MAX, KW_LIKE};
  const char *texts[] = {"model", "batch", "dim", "precision", "target", "optim",
                         "seq", "sparse", "multihot", "dense", "label", "table",
                         "loss", "id", "max", "like"};
  assert_int_equal(x->n, 16);
  for (int i = 0; i < 16; i++) {
    assert_int_equal(x->kind[i], kinds[i]);
    assert_string_equal(x->value[i].str, texts[i]);
  }
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);
}

static void test_scanner_identifiers(void **state) {
  (void)state;
  Lexed *x = lex("abc _x a1_B models identity f32");
  const char *names[] = {"abc", "_x", "a1_B", "models", "identity", "f32"};
  assert_int_equal(x->n, 6);
  for (int i = 0; i < 6; i++) {
    assert_int_equal(x->kind[i], IDENT);
    assert_string_equal(x->value[i].str, names[i]);
  }
  assert_loc(x->loc[2], 1, 8, 1, 11);
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);
}

static void test_scanner_identifier_length_limit(void **state) {
  (void)state;
  char text[600];
  memset(text, 'a', 255);
  strcpy(text + 255, " ");
  memset(text + 256, 'b', 256);
  text[512] = '\0';
  Lexed *x = lex(text);
  assert_int_equal(x->n, 2);
  assert_int_equal(x->kind[1], IDENT);
  assert_int_equal(x->d.errors, 1);  // only the second, 256 characters long
  assert_reported(x, "t.gem:1:257: error: identifier too long: "
                     "'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb...' has 256 characters; "
                     "the limit is 255");
  lexed_free(x);
}

static void test_scanner_integers(void **state) {
  (void)state;
  Lexed *x = lex("0 42 4_000_000 007 9223372036854775807");
  int64_t values[] = {0, 42, 4000000, 7, INT64_MAX};
  assert_int_equal(x->n, 5);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(x->kind[i], INT);
    assert_true(x->value[i].integer == values[i]);
  }
  assert_loc(x->loc[2], 1, 6, 1, 14);
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);
}

static void test_scanner_integer_too_large(void **state) {
  (void)state;
  Lexed *x = lex("batch\n  9223372036854775808 99999999999999999999999;");
  assert_int_equal(x->n, 4);
  assert_int_equal(x->kind[1], INT);
  assert_int_equal(x->d.errors, 2);
  assert_reported(x, "t.gem:2:3: error: integer literal too large: '9223372036854775808' "
                     "exceeds 9223372036854775807\n");
  assert_reported(x, "t.gem:2:23: error: integer literal too large: "
                     "'99999999999999999999999' exceeds 9223372036854775807\n");
  assert_loc(x->loc[2], 2, 23, 2, 45);
  lexed_free(x);
}

static void test_scanner_integer_separators(void **state) {
  (void)state;
  Lexed *x = lex("1_ 1__0 1_0");
  assert_int_equal(x->n, 3);
  assert_int_equal(x->d.errors, 2);
  assert_reported(x, "t.gem:1:1: error: misplaced '_' in integer literal '1_'");
  assert_reported(x, "t.gem:1:4: error: misplaced '_' in integer literal '1__0'");
  assert_true(x->value[2].integer == 10);
  lexed_free(x);
}

static void test_scanner_reals(void **state) {
  (void)state;
  Lexed *x = lex("1.5 .5 1e-3 2.5E+4 1. 0.02");
  double values[] = {1.5, .5, 1e-3, 2.5e4, 1.0, 0.02};
  assert_int_equal(x->n, 6);
  for (int i = 0; i < 6; i++) {
    assert_int_equal(x->kind[i], REAL);
    assert_true(x->value[i].real == values[i]);
  }
  assert_loc(x->loc[3], 1, 13, 1, 18);
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);
}

static void test_scanner_real_too_large(void **state) {
  (void)state;
  Lexed *x = lex("x = 1e999;");
  assert_int_equal(x->n, 4);
  assert_int_equal(x->kind[2], REAL);
  assert_reported(x, "t.gem:1:5: error: real literal too large: '1e999' does not fit in a "
                     "double\n");
  assert_int_equal(x->d.errors, 1);
  lexed_free(x);
}

static void test_scanner_malformed_numbers(void **state) {
  (void)state;
  Lexed *x = lex("12abc 1e 1.5x");
  assert_int_equal(x->n, 3);
  assert_int_equal(x->d.errors, 3);
  assert_reported(x, "t.gem:1:1: error: malformed number '12abc'");
  assert_reported(x, "t.gem:1:7: error: malformed number '1e'");
  assert_reported(x, "t.gem:1:10: error: malformed number '1.5x'");
  lexed_free(x);
}

static void test_scanner_punctuation(void **state) {
  (void)state;
  const char *p = "{}()[];:,=+-*@";
  Lexed *x = lex("{ } ( ) [ ] ; : , = + - * @");
  assert_int_equal(x->n, 14);
  for (int i = 0; i < 14; i++) {
    assert_int_equal(x->kind[i], p[i]);
    assert_loc(x->loc[i], 1, 2 * i + 1, 1, 2 * i + 1);
  }
  lexed_free(x);
}

static void test_scanner_strings_and_escapes(void **state) {
  (void)state;
  Lexed *x = lex("name = \"ctr\" \"a\\\"b\\\\c\\nd\\te\" \"h\xc3\xa9\" \"\"");
  assert_int_equal(x->n, 6);
  assert_int_equal(x->kind[2], STRING);
  assert_string_equal(x->value[2].str, "ctr");
  assert_loc(x->loc[2], 1, 8, 1, 12);
  assert_string_equal(x->value[3].str, "a\"b\\c\nd\te");
  assert_string_equal(x->value[4].str, "h\xc3\xa9");
  assert_string_equal(x->value[5].str, "");
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);
}

static void test_scanner_unknown_escape(void **state) {
  (void)state;
  Lexed *x = lex("x = \"a\\qb\";");
  assert_int_equal(x->n, 4);
  assert_string_equal(x->value[2].str, "ab");
  assert_reported(x, "t.gem:1:7: error: unknown escape sequence '\\q' in a string; the "
                     "escapes are \\\", \\\\, \\n and \\t\n");
  assert_int_equal(x->d.errors, 1);
  lexed_free(x);
}

static void test_scanner_unterminated_string(void **state) {
  (void)state;
  // A string stops at the end of its line; the next line scans normally.
  Lexed *x = lex("a = \"abc;\n  b = 1;");
  assert_int_equal(x->d.errors, 1);
  assert_reported(x, "t.gem:1:5: error: unterminated string: no closing '\"' before the end "
                     "of the line\n");
  assert_int_equal(x->kind[2], STRING);
  assert_string_equal(x->value[2].str, "abc;");
  assert_loc(x->loc[2], 1, 5, 1, 9);
  assert_int_equal(x->kind[3], IDENT);
  assert_loc(x->loc[3], 2, 3, 2, 3);
  lexed_free(x);

  x = lex("a = \"abc");  // at the end of the file
  assert_int_equal(x->n, 2);
  assert_reported(x, "t.gem:1:5: error: unterminated string");
  assert_int_equal(x->d.errors, 1);
  lexed_free(x);
}

// --- comments and locations -------------------------------------------------------------

static void test_scanner_comments_and_locations(void **state) {
  (void)state;
  Lexed *x = lex("# line comment\n"
                 "a /* block\n"
                 "   spanning ** lines */ b\n"
                 "\tc # tab counts as one column\n"
                 "/**/d/***/e");
  assert_int_equal(x->n, 5);
  assert_loc(x->loc[0], 2, 1, 2, 1);
  assert_loc(x->loc[1], 3, 25, 3, 25);
  assert_loc(x->loc[2], 4, 2, 4, 2);
  assert_loc(x->loc[3], 5, 5, 5, 5);
  assert_loc(x->loc[4], 5, 11, 5, 11);
  assert_string_equal(x->value[4].str, "e");
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);
}

static void test_scanner_unterminated_block_comment(void **state) {
  (void)state;
  Lexed *x = lex("a;\n  b /* never\n closed * /");
  assert_int_equal(x->n, 3);
  assert_int_equal(x->d.errors, 1);
  assert_reported(x, "t.gem:2:5: error: unterminated comment: '/*' has no closing '*/'\n"
                     "    2 |   b /* never\n"
                     "      |     ^~\n");
  lexed_free(x);
}

static void test_scanner_end_of_file_location(void **state) {
  (void)state;
  Lexed *x = lex("ab\ncd\n");
  assert_loc(x->eof, 2, 3, 2, 3);  // after "cd", not on an empty line 3
  lexed_free(x);
  x = lex("");
  assert_loc(x->eof, 1, 1, 1, 1);
  lexed_free(x);
  x = lex("x /* y */");
  assert_loc(x->eof, 1, 10, 1, 10);
  lexed_free(x);
}

// --- bad bytes --------------------------------------------------------------------------

static void test_scanner_stray_characters(void **state) {
  (void)state;
  Lexed *x = lex("a $ b\x01 ` c");
  assert_int_equal(x->n, 3);  // scanning goes on after each
  assert_string_equal(x->value[2].str, "c");
  assert_int_equal(x->d.errors, 3);
  assert_reported(x, "t.gem:1:3: error: unexpected character '$'\n");
  assert_reported(x, "t.gem:1:6: error: unexpected character '\\x01'\n");
  assert_reported(x, "t.gem:1:8: error: unexpected character '`'\n");
  lexed_free(x);
}

static void test_scanner_nul_bytes(void **state) {
  (void)state;
  const char text[] = "a\0b # c\0\n\"s\0t\" /*\0*/ d";
  Lexed *x = lex_bytes(text, sizeof text - 1);
  assert_int_equal(x->n, 4);  // a b "st" d
  assert_string_equal(x->value[2].str, "st");
  assert_int_equal(x->d.errors, 4);
  assert_reported(x, "t.gem:1:2: error: unexpected NUL byte\n");
  assert_reported(x, "t.gem:1:8: error: NUL byte in a comment\n");
  assert_reported(x, "t.gem:2:3: error: NUL byte in a string\n");
  assert_reported(x, "t.gem:2:9: error: NUL byte in a comment\n");
  lexed_free(x);
}

static void test_scanner_non_ascii_outside_comments(void **state) {
  (void)state;
  Lexed *x = lex("a \xc3\xa9 \xff \xe2\x82 b");
  assert_int_equal(x->n, 2);
  assert_int_equal(x->d.errors, 3);
  assert_reported(x, "t.gem:1:3: error: unexpected character '\xc3\xa9' (U+00E9): non-ASCII "
                     "text is allowed only in comments and strings\n");
  assert_reported(x, "t.gem:1:6: error: invalid UTF-8 byte '\\xFF'\n");
  assert_reported(x, "t.gem:1:8: error: invalid UTF-8 sequence '\\xE2\\x82'\n");
  lexed_free(x);
}

static void test_scanner_utf8_in_comments_and_strings(void **state) {
  (void)state;
  // Valid UTF-8 (2, 3 and 4 bytes) is fine in comments and strings.
  Lexed *x = lex("# caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n"
                 "/* \xe6\x97\xa5\xe6\x9c\xac */ \"\xe2\x82\xac\"");
  assert_int_equal(x->n, 1);
  assert_string_equal(x->value[0].str, "\xe2\x82\xac");
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);

  // Invalid bytes are reported where they are, not at the valid character before them.
  x = lex("# \xc3\xa9\x80 ok\n"
          "/* \xed\xa0\x80 */\n"
          "\"a\xf0\x9f\" x");
  assert_int_equal(x->n, 2);
  assert_int_equal(x->d.errors, 4);
  assert_reported(x, "t.gem:1:5: error: invalid UTF-8 byte '\\x80' in a comment\n");
  assert_reported(x, "t.gem:2:4: error: invalid UTF-8 sequence '\\xED\\xA0' in a comment\n");
  assert_reported(x, "t.gem:2:6: error: invalid UTF-8 byte '\\x80' in a comment\n");
  assert_reported(x, "t.gem:3:3: error: invalid UTF-8 sequence '\\xF0\\x9F' in a string\n");
  lexed_free(x);
}

// --- nesting ----------------------------------------------------------------------------

static void test_scanner_nesting_limit(void **state) {
  (void)state;
  char text[700];
  // 256 levels are fine; '(' and '[' and a unary minus all count.
  size_t n = 0;
  for (int i = 0; i < 128; i++) text[n++] = '(';
  for (int i = 0; i < 64; i++) text[n++] = '[';
  for (int i = 0; i < 64; i++) text[n++] = '-';
  text[n++] = 'x';
  text[n] = '\0';
  Lexed *x = lex(text);
  assert_int_equal(x->n, 257);
  assert_int_equal(x->d.errors, 0);
  lexed_free(x);

  // The 257th level stops the scan with one error at the bracket that opens it.
  text[n - 1] = '(';
  text[n++] = 'x';
  text[n] = '\0';
  x = lex(text);
  assert_int_equal(x->n, 256);
  assert_int_equal(x->d.errors, 1);
  assert_reported(x, "t.gem:1:257: error: nesting too deep: more than 256 levels\n");
  lexed_free(x);
}

static void test_scanner_binary_minus_and_closed_brackets_do_not_nest(void **state) {
  (void)state;
  // 300 levels opened and closed in turn, and a long chain of binary minuses.
  char text[4000];
  size_t n = 0;
  for (int i = 0; i < 300; i++) n += (size_t)sprintf(text + n, "(a)-");
  for (int i = 0; i < 300; i++) n += (size_t)sprintf(text + n, "b-");
  strcpy(text + n, "c");
  Lexed *x = lex(text);
  assert_int_equal(x->d.errors, 0);
  assert_int_equal(x->n, 300 * 4 + 300 * 2 + 1);
  lexed_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scanner_keywords),
      cmocka_unit_test(test_scanner_identifiers),
      cmocka_unit_test(test_scanner_identifier_length_limit),
      cmocka_unit_test(test_scanner_integers),
      cmocka_unit_test(test_scanner_integer_too_large),
      cmocka_unit_test(test_scanner_integer_separators),
      cmocka_unit_test(test_scanner_reals),
      cmocka_unit_test(test_scanner_real_too_large),
      cmocka_unit_test(test_scanner_malformed_numbers),
      cmocka_unit_test(test_scanner_punctuation),
      cmocka_unit_test(test_scanner_strings_and_escapes),
      cmocka_unit_test(test_scanner_unknown_escape),
      cmocka_unit_test(test_scanner_unterminated_string),
      cmocka_unit_test(test_scanner_comments_and_locations),
      cmocka_unit_test(test_scanner_unterminated_block_comment),
      cmocka_unit_test(test_scanner_end_of_file_location),
      cmocka_unit_test(test_scanner_stray_characters),
      cmocka_unit_test(test_scanner_nul_bytes),
      cmocka_unit_test(test_scanner_non_ascii_outside_comments),
      cmocka_unit_test(test_scanner_utf8_in_comments_and_strings),
      cmocka_unit_test(test_scanner_nesting_limit),
      cmocka_unit_test(test_scanner_binary_minus_and_closed_brackets_do_not_nest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
