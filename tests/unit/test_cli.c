// test_cli.c: the gemc command line. The first half tests cli_parse and the help text; the
// second runs the built gemc (next to this test: BUILD/gemc) on small files to pin exit codes,
// output files, -q and --Werror end to end.
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

#include "cli.h"

// Parses a NULL-terminated list of words (argv[0] is added). Returns what cli_parse returned;
// its error text, if any, is left in `err_text` (caller frees).
static bool parse_words(CliOptions *o, char **err_text, ...) {
  char *argv[64] = {"gemc"};
  int argc = 1;
  va_list ap;
  va_start(ap, err_text);
  for (char *w; (w = va_arg(ap, char *)) != NULL && argc < 63;) argv[argc++] = w;
  va_end(ap);

  size_t size = 0;
  FILE *err = open_memstream(err_text, &size);
  assert_non_null(err);
  bool ok = cli_parse(argc, argv, o, err);
  fclose(err);
  return ok;
}

// Asserts that the words are a usage error whose message contains `needle`.
#define assert_usage_error(needle, ...)                                \
  do {                                                                 \
    CliOptions o_;                                                     \
    char *err_ = NULL;                                                 \
    assert_false(parse_words(&o_, &err_, __VA_ARGS__, NULL));          \
    assert_non_null(strstr(err_, "gemc: error: "));                    \
    assert_non_null(strstr(err_, needle));                             \
    assert_non_null(strstr(err_, "usage: gemc"));                      \
    free(err_);                                                        \
    cli_free(&o_);                                                     \
  } while (0)

static void test_cli_check_takes_every_file(void **state) {
  (void)state;
  CliOptions o;
  char *err = NULL;
  assert_true(parse_words(&o, &err, "check", "a.gem", "b.gem", "c.gem", NULL));
  assert_int_equal(o.command, CMD_CHECK);
  assert_int_equal(o.nfiles, 3);
  assert_string_equal(o.files[0], "a.gem");
  assert_string_equal(o.files[2], "c.gem");
  assert_null(o.arch);
  assert_false(o.werror);
  assert_string_equal(err, "");
  free(err);
  cli_free(&o);
}

static void test_cli_options_go_before_or_after_the_command(void **state) {
  (void)state;
  CliOptions o;
  char *err = NULL;
  assert_true(parse_words(&o, &err, "--Werror", "check", "a.gem", "-q", "--arch", "sm_100a",
                          NULL));
  assert_true(o.werror);
  assert_true(o.quiet);
  assert_string_equal(o.arch, "sm_100a");
  assert_int_equal(o.nfiles, 1);
  free(err);
  cli_free(&o);
}

static void test_cli_ir_reads_its_options(void **state) {
  (void)state;
  CliOptions o;
  char *err = NULL;
  assert_true(parse_words(&o, &err, "ir", "--emit=ast", "m.gem", "-o", "out.txt",
                          "--arch=sm_90a", NULL));
  assert_int_equal(o.command, CMD_IR);
  assert_int_equal(o.emit, STAGE_AST);
  assert_string_equal(o.output, "out.txt");
  assert_string_equal(o.arch, "sm_90a");
  assert_string_equal(o.files[0], "m.gem");
  free(err);
  cli_free(&o);

  assert_true(parse_words(&o, &err, "ir", "m.gem", NULL));
  assert_int_equal(o.emit, STAGE_IR);  // the default
  assert_null(o.output);
  assert_null(o.dump_after);
  free(err);
  cli_free(&o);
}

static void test_cli_double_dash_ends_options(void **state) {
  (void)state;
  CliOptions o;
  char *err = NULL;
  assert_true(parse_words(&o, &err, "check", "--", "-q.gem", "--arch", NULL));
  assert_false(o.quiet);
  assert_null(o.arch);
  assert_int_equal(o.nfiles, 2);
  assert_string_equal(o.files[0], "-q.gem");
  free(err);
  cli_free(&o);
}

static void test_cli_help_and_version_win(void **state) {
  (void)state;
  CliOptions o;
  char *err = NULL;
  assert_true(parse_words(&o, &err, "check", "--help", NULL));
  assert_int_equal(o.command, CMD_HELP);
  free(err);
  cli_free(&o);
  assert_true(parse_words(&o, &err, "help", NULL));
  assert_int_equal(o.command, CMD_HELP);
  free(err);
  cli_free(&o);
  assert_true(parse_words(&o, &err, "--version", NULL));
  assert_int_equal(o.command, CMD_VERSION);
  free(err);
  cli_free(&o);
}

static void test_cli_refuses_unknown_words(void **state) {
  (void)state;
  assert_usage_error("no command given", "-q");
  assert_usage_error("unknown command 'compile'", "compile", "a.gem");
  assert_usage_error("unknown option '--frobnicate'", "check", "--frobnicate", "a.gem");
  assert_usage_error("unknown option '-x'", "-x", "check", "a.gem");
}

static void test_cli_refuses_missing_files(void **state) {
  (void)state;
  assert_usage_error("'gemc check' needs at least one FILE", "check");
  assert_usage_error("'gemc ir' takes exactly one FILE (got 0)", "ir");
  assert_usage_error("'gemc ir' takes exactly one FILE (got 2)", "ir", "a.gem", "b.gem");
}

static void test_cli_refuses_bad_values(void **state) {
  (void)state;
  assert_usage_error("unknown --arch 'sm_80'; expected one of: sm_90a, sm_100a", "--arch",
                     "sm_80", "check", "a.gem");
  assert_usage_error("--arch needs a value", "check", "a.gem", "--arch");
  assert_usage_error("unknown stage 'ptx' for --emit; the stages are: ast, ir", "ir",
                     "--emit=ptx", "a.gem");
  assert_usage_error("unknown pass 'nope' for --dump-after; the passes are: ", "ir",
                     "--dump-after=nope", "a.gem");
  assert_usage_error("-o needs a file name", "ir", "a.gem", "-o");
}

static void test_cli_refuses_ir_options_on_check(void **state) {
  (void)state;
  assert_usage_error("--emit only applies to 'gemc ir'", "check", "--emit=ast", "a.gem");
  assert_usage_error("-o only applies to 'gemc ir'", "check", "a.gem", "-o", "x");
  assert_usage_error("-q and -v cannot be used together", "check", "-q", "-v", "a.gem");
}

static void test_cli_help_names_every_command_and_option(void **state) {
  (void)state;
  char *text = NULL;
  size_t size = 0;
  FILE *out = open_memstream(&text, &size);
  assert_non_null(out);
  cli_print_help(out);
  fclose(out);
  const char *expected[] = {"check FILE...", "ir FILE", "--arch", "sm_90a", "sm_100a",
                            "--Werror", "-q", "-v", "--emit=STAGE", "ast", "--dump-after=PASS",
                            "-o OUT", "--version", "exit codes", "3  internal error"};
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
    if (!strstr(text, expected[i])) fail_msg("help text lacks '%s'", expected[i]);
  }
  free(text);
}

static void test_cli_version_names_the_release(void **state) {
  (void)state;
  char *text = NULL;
  size_t size = 0;
  FILE *out = open_memstream(&text, &size);
  assert_non_null(out);
  cli_print_version(out);
  fclose(out);
  const char prefix[] = "gemc " GEMC_VERSION " (built ";
  assert_int_equal(strncmp(text, prefix, sizeof prefix - 1), 0);
  free(text);
}


// --- the driver, end to end -------------------------------------------------------------

static char gemc_path[PATH_MAX];  // BUILD/gemc, found from argv[0] = BUILD/tests/test_cli
static char tmp_dir[] = "/tmp/gemc_test_cli_XXXXXX";

static const char valid_model[] =
    "model m {\n"
    "  batch 8;\n"
    "  dim 16;\n"
    "  sparse ad : id;\n"
    "  label click;\n"
    "  table t : rows 10;\n"
    "  y = linear(embed(t, ad), 1);\n"
    "  loss bce(y, click);\n"
    "}\n";

// Like valid_model, plus a binding that is never used: one warning.
static const char warning_model[] =
    "model m {\n"
    "  batch 8;\n"
    "  dim 16;\n"
    "  sparse ad : id;\n"
    "  label click;\n"
    "  table t : rows 10;\n"
    "  y = linear(embed(t, ad), 1);\n"
    "  unused = y;\n"
    "  loss bce(y, click);\n"
    "}\n";

// Like warning_model, plus an unknown name: one error and one warning.
static const char error_model[] =
    "model m {\n"
    "  batch 8;\n"
    "  dim 16;\n"
    "  sparse ad : id;\n"
    "  label click;\n"
    "  table t : rows 10;\n"
    "  y = linear(embed(t, ad), 1);\n"
    "  unused = y;\n"
    "  z = nosuchname;\n"
    "  loss bce(y, click);\n"
    "}\n";

typedef struct Run {
  int rc;
  char out[1 << 16];
  char err[1 << 16];
} Run;

static char *tmp_path(const char *name) {
  static char paths[8][4200];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof paths[0], "%s/%s", tmp_dir, name);
  return p;
}

static const char *write_model(const char *name, const char *text) {
  const char *path = tmp_path(name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static void read_all(const char *path, char *buf, size_t size) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(buf, 1, size - 1, f);
  buf[n] = '\0';
  fclose(f);
}

// Runs `gemc ARGS` in the temporary directory, capturing stdout, stderr and the exit code.
static Run *run_gemc(const char *args) {
  static Run run;
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >stdout.txt 2>stderr.txt", tmp_dir, gemc_path,
           args);
  int status = system(cmd);
  assert_true(WIFEXITED(status));
  run.rc = WEXITSTATUS(status);
  read_all(tmp_path("stdout.txt"), run.out, sizeof run.out);
  read_all(tmp_path("stderr.txt"), run.err, sizeof run.err);
  return &run;
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static int setup_driver(void **state) {
  (void)state;
  if (!mkdtemp(tmp_dir)) return -1;
  write_model("valid.gem", valid_model);
  write_model("warning.gem", warning_model);
  write_model("error.gem", error_model);
  return file_exists(gemc_path) ? 0 : -1;
}

static int teardown_driver(void **state) {
  (void)state;
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_cli_driver_check_is_silent_on_success(void **state) {
  (void)state;
  Run *r = run_gemc("check valid.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->out, "");
  assert_string_equal(r->err, "");
  r = run_gemc("check -v valid.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->out, "valid.gem: ok\n");
}

static void test_cli_driver_exit_codes(void **state) {
  (void)state;
  Run *r = run_gemc("check error.gem");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "error.gem:9:7: error: "));
  r = run_gemc("check valid.gem error.gem valid.gem");  // the worst file decides
  assert_int_equal(r->rc, 1);
  r = run_gemc("check no_such_file.gem");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "gemc: error: cannot read no_such_file.gem"));
  r = run_gemc("check --arch sm_80 valid.gem");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "sm_90a, sm_100a"));
  r = run_gemc("frobnicate valid.gem");
  assert_int_equal(r->rc, 2);
  r = run_gemc("");
  assert_int_equal(r->rc, 2);
  r = run_gemc("--version");
  assert_int_equal(r->rc, 0);
  assert_int_equal(strncmp(r->out, "gemc " GEMC_VERSION, 10), 0);
  r = run_gemc("--help");
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->out, "usage: gemc"));
  assert_string_equal(r->err, "");
}

static void test_cli_driver_werror_fails_on_warnings(void **state) {
  (void)state;
  Run *r = run_gemc("check warning.gem");
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->err, "warning.gem:8:3: warning: "));
  r = run_gemc("check --Werror warning.gem");
  assert_int_equal(r->rc, 1);
  r = run_gemc("--Werror check valid.gem");
  assert_int_equal(r->rc, 0);
}

static void test_cli_driver_quiet_keeps_only_errors(void **state) {
  (void)state;
  Run *r = run_gemc("check -q warning.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->err, "");
  r = run_gemc("check -q error.gem");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "error.gem:9:7: error: "));
  assert_null(strstr(r->err, "warning:"));
  assert_null(strstr(r->err, "unused = y"));  // nor the warning's source excerpt
}

static void test_cli_driver_ir_writes_output_only_on_success(void **state) {
  (void)state;
  Run *r = run_gemc("ir valid.gem");
  assert_int_equal(r->rc, 0);
  assert_int_equal(strncmp(r->out, "; gemc ir\nmodel m\n", 18), 0);
  char expected[sizeof r->out];
  strcpy(expected, r->out);

  r = run_gemc("ir valid.gem -o valid.ir");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->out, "");
  char written[sizeof r->out];
  read_all(tmp_path("valid.ir"), written, sizeof written);
  assert_string_equal(written, expected);

  r = run_gemc("ir error.gem -o error.ir");
  assert_int_equal(r->rc, 1);
  assert_false(file_exists(tmp_path("error.ir")));
  r = run_gemc("ir error.gem");
  assert_int_equal(r->rc, 1);
  assert_string_equal(r->out, "");
  r = run_gemc("ir valid.gem -o /dev/full");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "gemc: error: cannot write /dev/full: "));
  r = run_gemc("ir valid.gem -o no_such_dir/x.ir");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "gemc: error: cannot write no_such_dir/x.ir"));
}

static void test_cli_driver_ir_emits_ast_and_dumps(void **state) {
  (void)state;
  Run *r = run_gemc("ir --emit=ast valid.gem");
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->out, "linear"));
  assert_null(strstr(r->out, "; gemc ir"));
  r = run_gemc("ir --dump-after=lower valid.gem");
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->out, "model m\n"));
  r = run_gemc("ir --arch=sm_100a valid.gem");
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->out, "\ntarget sm_100a\n"));
}

int main(int argc, char **argv) {
  (void)argc;
  // argv[0] is BUILD/tests/test_cli; the driver is BUILD/gemc.
  char guess[PATH_MAX + 16];
  const char *slash = strrchr(argv[0], '/');
  int dir_len = slash ? (int)(slash - argv[0]) : 1;
  snprintf(guess, sizeof guess, "%.*s/../gemc", dir_len, slash ? argv[0] : ".");
  if (!realpath(guess, gemc_path)) {
    fprintf(stderr, "test_cli: no gemc at %s\n", guess);
    return 1;
  }

  const struct CMUnitTest parse_tests[] = {
      cmocka_unit_test(test_cli_check_takes_every_file),
      cmocka_unit_test(test_cli_options_go_before_or_after_the_command),
      cmocka_unit_test(test_cli_ir_reads_its_options),
      cmocka_unit_test(test_cli_double_dash_ends_options),
      cmocka_unit_test(test_cli_help_and_version_win),
      cmocka_unit_test(test_cli_refuses_unknown_words),
      cmocka_unit_test(test_cli_refuses_missing_files),
      cmocka_unit_test(test_cli_refuses_bad_values),
      cmocka_unit_test(test_cli_refuses_ir_options_on_check),
      cmocka_unit_test(test_cli_help_names_every_command_and_option),
      cmocka_unit_test(test_cli_version_names_the_release),
  };
  const struct CMUnitTest driver_tests[] = {
      cmocka_unit_test(test_cli_driver_check_is_silent_on_success),
      cmocka_unit_test(test_cli_driver_exit_codes),
      cmocka_unit_test(test_cli_driver_werror_fails_on_warnings),
      cmocka_unit_test(test_cli_driver_quiet_keeps_only_errors),
      cmocka_unit_test(test_cli_driver_ir_writes_output_only_on_success),
      cmocka_unit_test(test_cli_driver_ir_emits_ast_and_dumps),
  };
  int failed = cmocka_run_group_tests(parse_tests, NULL, NULL);
  failed += cmocka_run_group_tests(driver_tests, setup_driver, teardown_driver);
  return failed;
}
