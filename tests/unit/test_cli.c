// test_cli.c: the gemc command line. The first half tests cli_parse and the help text; the
// second runs the built gemc (next to this test: BUILD/gemc) on small files to pin exit codes,
// output files, -q and --Werror end to end.
#include <limits.h>
#include <math.h>
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
#include "numerics.h"
#include "shell_run.h"

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

typedef ShellRun Run;

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

// Runs `gemc ARGS` in the temporary directory, capturing stdout, stderr and the exit code.
static Run *run_gemc(const char *args) {
  Run *run = shell_run(tmp_dir, "'%s' %s", gemc_path, args);
  assert_true(run->rc >= 0);
  return run;
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

// A launcher's environment with more than one rank is refused before any work (distributed
// training is not built: each rank would train alone and write the same outputs); a world of
// one trains, and a malformed variable is named.
// Several ranks started by hand, without a world to meet in: each is refused before any work,
// its error prefixed with its rank. torchrun's variables on the cpu backend name the way CPU
// ranks meet (OpenMPI); OpenMPI's set by hand are refused by MPI itself (a world of one), or,
// without OpenMPI installed, for want of it. tests/dist runs real worlds.
static void test_cli_driver_train_refuses_several_ranks(void **state) {
  (void)state;
  char tiny[PATH_MAX];  // the tests run from the repository's root
  assert_non_null(realpath("models/gem_tiny.gem", tiny));
  Run *r = shell_run(tmp_dir, "RANK=1 WORLD_SIZE=2 '%s' train '%s' --backend cpu --steps 1",
                     gemc_path, tiny);
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "gemc: rank 1: error: this process is rank 1 of 2, started by "
                                 "torchrun's variables"));
  assert_non_null(strstr(r->err, "meet through OpenMPI"));
  r = shell_run(tmp_dir, "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 '%s' train '%s' "
                "--backend cpu --steps 1", gemc_path, tiny);
  assert_int_equal(r->rc, 1);
  assert_true(strstr(r->err, "gemc: rank 0: error: the launcher says rank 0 of 4, but MPI says "
                             "rank 0 of 1") != NULL ||
              strstr(r->err, "gemc: rank 0: error: cannot load OpenMPI") != NULL);
  r = shell_run(tmp_dir, "SLURM_PROCID=0 SLURM_NTASKS=two '%s' train valid.gem", gemc_path);
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "SLURM_NTASKS=\"two\""));
  r = shell_run(tmp_dir,
                "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 '%s' train '%s' --backend cpu --steps 2 "
                "--batch 8 --eval-examples 8 -q",
                gemc_path, tiny);
  assert_int_equal(r->rc, 0);
}

// gemc launch's own options, and train's distributed ones, refused with the reason.
static void test_cli_driver_launch_usage_errors(void **state) {
  (void)state;
  char tiny[PATH_MAX];
  assert_non_null(realpath("models/gem_tiny.gem", tiny));
  Run *r = run_gemc("launch train valid.gem");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "needs -n N"));
  r = run_gemc("launch -n 0 train valid.gem");
  assert_int_equal(r->rc, 2);
  r = run_gemc("launch -n 2");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "needs `train FILE ...` or `-- PROGRAM ...`"));
  r = run_gemc("launch -n 2 --via ssh train valid.gem");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "--via needs mpirun or env, got 'ssh'"));
  r = run_gemc("launch -n 2 --nnodes 2 train valid.gem");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "needs --node-rank"));
  r = run_gemc("launch -n 2 --nnodes 2 --node-rank 2 train valid.gem");
  assert_int_equal(r->rc, 2);
  r = run_gemc("launch -n 2 --master nohost train valid.gem");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "--master needs HOST:PORT"));
  r = run_gemc("launch --help");
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->out, "--nproc-per-node"));
  r = run_gemc("train valid.gem --dense zero9");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "--dense needs data-parallel, zero1, zero2 or zero3, got 'zero9'"));
  r = run_gemc("train valid.gem --comm-timeout 0");
  assert_int_equal(r->rc, 2);
  r = run_gemc("train valid.gem --bucket-mb -1");
  assert_int_equal(r->rc, 2);
  r = run_gemc("train valid.gem --nccl-cta-policy fast");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "--nccl-cta-policy needs default, bandwidth, efficiency or "
                                 "zero, got 'fast'"));
  r = run_gemc("train valid.gem --nccl-max-ctas 0");
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "--nccl-max-ctas needs a count in [1, 64]"));
  // On the CPU, without a launcher, the NCCL options change nothing: said, then trained.
  r = shell_run(tmp_dir, "'%s' train '%s' --backend cpu --steps 1 -q --nccl-cta-policy zero",
                gemc_path, tiny);
  assert_int_equal(r->rc, 0);
  assert_non_null(strstr(r->err, "only matter for GPU ranks"));
  r = shell_run(tmp_dir, "'%s' train '%s' --backend cpu --steps 1 --shard clicks=row", gemc_path,
                tiny);
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "--shard: model gem_tiny has no table 'clicks' (its tables: "
                                 "items, ads)"));
  r = shell_run(tmp_dir, "'%s' train '%s' --backend cpu --steps 1 --shard items=diagonal",
                gemc_path, tiny);
  assert_int_equal(r->rc, 2);
  assert_non_null(strstr(r->err, "got 'items=diagonal'"));
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

// Every way to ask for gelu_taylor: attention (normed, so no warning), pointwise, and an mlp's
// gelu under @schedule(gelu = taylor), whose two hidden layers are one op.
static const char gelu_taylor_model[] =
    "model m {\n"
    "  batch 8;\n"
    "  dim 16;\n"
    "  seq hist : id max 8;\n"
    "  dense c : f32[4];\n"
    "  label click;\n"
    "  table t : rows 10;\n"
    "  h = embed(t, hist);\n"
    "  h = h + gdpa(rmsnorm(h), heads = 2, act = gelu_taylor);\n"
    "  p = pma(layernorm(h), seeds = 2, heads = 2, act = gelu_taylor);\n"
    "  z = concat(flatten(p), gelu_taylor(linear(c, 16)));\n"
    "  y = mlp(z, [8, 4, 1], act = gelu) @schedule(gelu = taylor);\n"
    "  loss bce(y, click);\n"
    "}\n";

static int count_of(const char *text, const char *needle) {
  int n = 0;
  for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle)) n++;
  return n;
}

// `gemc check -v` states gelu_taylor's bound at each op that uses it, and the function keeps
// it: its largest error over a dense grid of [-10, 10] is within the printed number, while the
// 6th-order series gelu_taylor used to be is not (error 4.0 at |x| = 3), so this test can fail.
static void test_cli_driver_check_v_states_the_gelu_taylor_bound(void **state) {
  (void)state;
  write_model("gelu_taylor.gem", gelu_taylor_model);
  Run *r = run_gemc("check gelu_taylor.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->err, "");  // the bound is -v's; the normed scores draw no warning
  r = run_gemc("check -v gelu_taylor.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->out, "gelu_taylor.gem: ok\n");
  assert_int_equal(count_of(r->err, ": note: gelu_taylor: |error| <= "), 4);
  assert_int_equal(count_of(r->err, "warning"), 0);
  const char *lines[] = {"gelu_taylor.gem:9:11: note:", "gelu_taylor.gem:10:7: note:",
                         "gelu_taylor.gem:11:26: note:", "gelu_taylor.gem:12:7: note:"};
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
    assert_non_null(strstr(r->err, lines[i]));

  double bound = 0, grad_bound = 0;
  const char *at = strstr(r->err, "|error| <= ");
  assert_non_null(at);
  assert_int_equal(sscanf(at, "|error| <= %lf over all inputs (its derivative's <= %lf",
                          &bound, &grad_bound), 2);
  double value = max_abs_error(gelu_taylor, gelu_exact, -10, 10, 200000);
  double grad = max_abs_error(gelu_taylor_grad, gelu_exact_grad, -10, 10, 200000);
  print_message("printed bound %g (derivative %g); measured %.4e (%.4e)\n", bound, grad_bound,
                value, grad);
  assert_true(value <= bound);
  assert_true(grad <= grad_bound);
  assert_true(fabs(gelu_series6(3.0) - gelu_exact(3.0)) > bound);
  assert_true(fabs(gelu_series6(-3.0) - gelu_exact(-3.0)) > bound);

  r = run_gemc("check -v valid.gem");  // no gelu_taylor, no note
  assert_string_equal(r->err, "");
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
  shell_slurp(tmp_path("valid.ir"), written, sizeof written);
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

// --- numeric option values (issue 9, item 7) ---------------------------------------------

// Asserts that a count is refused with exactly `message`.
static void assert_count_refused(const char *value, int64_t min, int64_t max,
                                 const char *message) {
  char msg[256] = "";
  int64_t out = -7;
  if (cli_parse_count("--steps", value, min, max, &out, msg, sizeof msg))
    fail_msg("'%s' was accepted as %lld", value, (long long)out);
  assert_int_equal(out, -7);
  assert_string_equal(msg, message);
}

static void test_cli_count_values_state_their_range(void **state) {
  (void)state;
  char msg[256];
  int64_t v;
  assert_true(cli_parse_count("--steps", "1000000000", 0, 1000000000, &v, msg, sizeof msg));
  assert_int_equal(v, 1000000000);
  assert_true(cli_parse_count("--steps", "0", 0, 10, &v, msg, sizeof msg));
  assert_int_equal(v, 0);
  assert_true(cli_parse_count("--steps", "007", 0, 10, &v, msg, sizeof msg));
  assert_int_equal(v, 7);
  const char *past = "--steps must be a whole number in [0, 1000000000], got 1000000001";
  assert_count_refused("1000000001", 0, 1000000000, past);
  assert_count_refused("0", 1, 5, "--steps must be a whole number in [1, 5], got 0");
  // Junk: a sign, spaces, an exponent, a fraction, trailing characters, overflow, nothing.
  static const char *const junk[] = {"-1", "+1", " 1", "1 ", "1e3", "1.0", "12x", "0x10",
                                     "99999999999999999999999", "nan"};
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    char expected[256];
    snprintf(expected, sizeof expected, "--steps must be a whole number in [0, 5], got %s",
             junk[i]);
    assert_count_refused(junk[i], 0, 5, expected);
  }
  assert_count_refused("", 0, 5, "--steps must be a whole number in [0, 5], got ''");
  // A long value is cut after 40 characters.
  assert_count_refused("1234567890123456789012345678901234567890123", 0, 5,
                       "--steps must be a whole number in [0, 5], got "
                       "1234567890123456789012345678901234567890...");
}

static void test_cli_seed_values_state_their_range(void **state) {
  (void)state;
  char msg[256];
  uint64_t v;
  assert_true(cli_parse_u64("--seed", "18446744073709551615", UINT64_MAX, &v, msg, sizeof msg));
  assert_true(v == UINT64_MAX);
  assert_false(cli_parse_u64("--seed", "18446744073709551616", UINT64_MAX, &v, msg, sizeof msg));
  assert_string_equal(msg, "--seed must be a whole number in [0, 18446744073709551615], got "
                           "18446744073709551616");
  assert_false(cli_parse_u64("--seed", "-3", UINT64_MAX, &v, msg, sizeof msg));
  assert_string_equal(msg, "--seed must be a whole number in [0, 18446744073709551615], got -3");
}

static void test_cli_real_values_state_their_range(void **state) {
  (void)state;
  char msg[256];
  double x;
  RealRange lr = {0, 1e6, true, false}, beta = {0, 1, false, true};
  assert_true(cli_parse_real("--table-lr", "1e6", lr, &x, msg, sizeof msg));
  assert_true(x == 1e6);
  assert_true(cli_parse_real("--table-lr", "0.05", lr, &x, msg, sizeof msg));
  assert_true(x == 0.05);
  assert_false(cli_parse_real("--table-lr", "1e30", lr, &x, msg, sizeof msg));
  assert_string_equal(msg, "--table-lr must be in (0, 1e6], got 1e30");
  assert_false(cli_parse_real("--table-lr", "0", lr, &x, msg, sizeof msg));
  assert_string_equal(msg, "--table-lr must be in (0, 1e6], got 0");
  assert_true(cli_parse_real("--beta1", "0", beta, &x, msg, sizeof msg));
  assert_true(cli_parse_real("--beta1", "0.999999", beta, &x, msg, sizeof msg));
  assert_false(cli_parse_real("--beta1", "1", beta, &x, msg, sizeof msg));
  assert_string_equal(msg, "--beta1 must be in [0, 1), got 1");
  assert_false(cli_parse_real("--beta1", "-0.1", beta, &x, msg, sizeof msg));
  assert_string_equal(msg, "--beta1 must be in [0, 1), got -0.1");
  // Junk: NaN, infinities, hex, spaces, trailing characters, overflow, underflow, nothing.
  static const char *const junk[] = {"nan", "NaN", "inf", "-inf", "infinity", "0x1p-3", " 0.1",
                                     "0.1 ", "0.1x", "1e400", "1e-400", ".", "e5", "1e", "--1"};
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    char expected[256];
    snprintf(expected, sizeof expected, "--table-lr must be in (0, 1e6], got %s", junk[i]);
    if (cli_parse_real("--table-lr", junk[i], lr, &x, msg, sizeof msg))
      fail_msg("'%s' was accepted as %g", junk[i], x);
    assert_string_equal(msg, expected);
  }
  assert_false(cli_parse_real("--table-lr", "", lr, &x, msg, sizeof msg));
  assert_string_equal(msg, "--table-lr must be in (0, 1e6], got ''");
  // Bounds print as people write them.
  char buf[80];
  assert_string_equal(cli_real_range((RealRange){1e-8, 0.999999, false, false}, buf, sizeof buf),
                      "[1e-8, 0.999999]");
  assert_string_equal(cli_real_range((RealRange){0, 1e3, true, true}, buf, sizeof buf),
                      "(0, 1000)");
  assert_string_equal(cli_count_range(1, 1048576, buf, sizeof buf), "[1, 1048576]");
}

// One command line and what it must give: the exit code and, for a usage error, the exact
// first line of stderr. An accepted value is shown by a run that gets past the options and
// fails on the missing model instead (exit 1), so that nothing trains.
typedef struct OptionCase {
  const char *args;
  int rc;
  const char *first_line;  // NULL: the run fails on no_such.gem
} OptionCase;

static void check_option_cases(const OptionCase *cases, size_t n, const char *usage) {
  for (size_t i = 0; i < n; i++) {
    Run *r = run_gemc(cases[i].args);
    const char *nl = strchr(r->err, '\n');
    size_t len = nl ? (size_t)(nl - r->err) : strlen(r->err);
    bool ok = r->rc == cases[i].rc;
    if (cases[i].first_line)
      ok = ok && len == strlen(cases[i].first_line) &&
           strncmp(r->err, cases[i].first_line, len) == 0 && strstr(r->err, usage);
    else
      ok = ok && strstr(r->err, "no_such.gem") && !strstr(r->err, "must be");
    if (!ok)
      fail_msg("gemc %s: rc %d (expected %d), stderr:\n%s", cases[i].args, r->rc, cases[i].rc,
               r->err);
  }
}

#define E "gemc: error: "
#define T "train no_such.gem --backend cpu "
static void test_cli_driver_train_options_state_their_limits(void **state) {
  (void)state;
  static const OptionCase cases[] = {
      // --steps [0, 1000000000]
      {T "--steps 0", 1, NULL},
      {T "--steps 1000000000", 1, NULL},
      {T "--steps 1000000001", 2, E "--steps must be a whole number in [0, 1000000000], got "
                                  "1000000001"},
      {T "--steps -1", 2, E "--steps must be a whole number in [0, 1000000000], got -1"},
      {T "--steps 10x", 2, E "--steps must be a whole number in [0, 1000000000], got 10x"},
      {T "--steps=", 2, E "--steps must be a whole number in [0, 1000000000], got ''"},
      {T "--steps", 2, E "--steps needs a value: a whole number in [0, 1000000000]"},
      // --batch [1, 1048576]
      {T "--batch 1", 1, NULL},
      {T "--batch 1048576", 1, NULL},
      {T "--batch 1048577", 2, E "--batch must be a whole number in [1, 1048576], got 1048577"},
      {T "--batch 0", 2, E "--batch must be a whole number in [1, 1048576], got 0"},
      {T "--batch 8.5", 2, E "--batch must be a whole number in [1, 1048576], got 8.5"},
      // --eval-every [0, 1000000000]
      {T "--eval-every 1000000000", 1, NULL},
      {T "--eval-every 1000000001", 2, E "--eval-every must be a whole number in "
                                       "[0, 1000000000], got 1000000001"},
      {T "--eval-every 1e3", 2, E "--eval-every must be a whole number in [0, 1000000000], "
                                "got 1e3"},
      // --eval-examples [1, 1048576]: the 99999999999 ran for ever
      {T "--eval-examples 1048576", 1, NULL},
      {T "--eval-examples 1048577", 2, E "--eval-examples must be a whole number in "
                                       "[1, 1048576], got 1048577"},
      {T "--eval-examples 99999999999", 2, E "--eval-examples must be a whole number in "
                                           "[1, 1048576], got 99999999999"},
      {T "--eval-examples 0", 2, E "--eval-examples must be a whole number in [1, 1048576], "
                                 "got 0"},
      // --save-every [0, 1000000000]
      {T "--save sv --save-every 1000000000", 1, NULL},
      {T "--save sv --save-every 1000000001", 2, E "--save-every must be a whole number in "
                                                 "[0, 1000000000], got 1000000001"},
      {T "--save-every ' 5'", 2, E "--save-every must be a whole number in [0, 1000000000], "
                                   "got  5"},
      // --id-vocab [1, 2147483647]
      {T "--id-vocab 2147483647", 1, NULL},
      {T "--id-vocab 2147483648", 2, E "--id-vocab must be a whole number in [1, 2147483647], "
                                     "got 2147483648"},
      {T "--id-vocab 0", 2, E "--id-vocab must be a whole number in [1, 2147483647], got 0"},
      // --seed [0, 2^64 - 1]
      {T "--seed 0", 1, NULL},
      {T "--seed 18446744073709551615", 1, NULL},
      {T "--seed 18446744073709551616", 2, E "--seed must be a whole number in "
                                           "[0, 18446744073709551615], got 18446744073709551616"},
      {T "--seed -3", 2, E "--seed must be a whole number in [0, 18446744073709551615], got -3"},
      {T "--seed", 2, E "--seed needs a value: a whole number in [0, 18446744073709551615]"},
      // --lr and --table-lr (0, 1e6]
      {T "--lr 1e6", 1, NULL},
      {T "--lr 1e-12", 1, NULL},
      {T "--lr 1.000001e6", 2, E "--lr must be in (0, 1e6], got 1.000001e6"},
      {T "--lr 0", 2, E "--lr must be in (0, 1e6], got 0"},
      {T "--lr nan", 2, E "--lr must be in (0, 1e6], got nan"},
      {T "--lr inf", 2, E "--lr must be in (0, 1e6], got inf"},
      {T "--lr", 2, E "--lr needs a value: a number in (0, 1e6]"},
      {T "--table-lr 1e6", 1, NULL},
      {T "--table-lr 1e30", 2, E "--table-lr must be in (0, 1e6], got 1e30"},
      {T "--table-lr 0.1abc", 2, E "--table-lr must be in (0, 1e6], got 0.1abc"},
      // --beta1, --beta2 [0, 1)
      {T "--beta1 0", 1, NULL},
      {T "--beta1 0.999999", 1, NULL},
      {T "--beta1 1", 2, E "--beta1 must be in [0, 1), got 1"},
      {T "--beta2 0.9999999", 1, NULL},
      {T "--beta2 1", 2, E "--beta2 must be in [0, 1), got 1"},
      {T "--beta2 -0.5", 2, E "--beta2 must be in [0, 1), got -0.5"},
      // --eps, --table-eps (0, 1]
      {T "--eps 1", 1, NULL},
      {T "--eps 1.5", 2, E "--eps must be in (0, 1], got 1.5"},
      {T "--eps 0", 2, E "--eps must be in (0, 1], got 0"},
      {T "--table-eps 1", 1, NULL},
      {T "--table-eps 0", 2, E "--table-eps must be in (0, 1], got 0"},
      {T "--table-eps 1e-400", 2, E "--table-eps must be in (0, 1], got 1e-400"},
      // --weight-decay [0, 1e3]
      {T "--weight-decay 0", 1, NULL},
      {T "--weight-decay 1000", 1, NULL},
      {T "--weight-decay 1000.5", 2, E "--weight-decay must be in [0, 1000], got 1000.5"},
      {T "--weight-decay -1", 2, E "--weight-decay must be in [0, 1000], got -1"},
  };
  check_option_cases(cases, sizeof cases / sizeof cases[0], "usage: gemc train");
}
#undef T

static void test_cli_driver_bench_reps_states_its_limit(void **state) {
  (void)state;
  setenv("GEMC_NO_CUDA", "1", 1);  // an accepted --reps then fails on the GPU, never runs
  static const OptionCase cases[] = {
      {"bench gdpa --reps 1000 --quick", 1, E "no GPU: GEMC_NO_CUDA is set"},
      {"bench gdpa --reps 1001", 2, E "--reps must be a whole number in [1, 1000], got 1001"},
      {"bench gdpa --reps 0", 2, E "--reps must be a whole number in [1, 1000], got 0"},
      {"bench gdpa --reps=5x", 2, E "--reps must be a whole number in [1, 1000], got 5x"},
      {"bench gdpa --reps", 2, E "--reps needs a value: a whole number in [1, 1000]"},
      {"bench gemm --model no_such.gem --reps 1", 1, NULL},
      {"bench gemm --model no_such.gem --reps 1000", 1, NULL},
      {"bench gemm --reps 1001", 2, E "--reps must be a whole number in [1, 1000], got 1001"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Run *r = run_gemc(cases[i].args);
    const char *nl = strchr(r->err, '\n');
    size_t len = nl ? (size_t)(nl - r->err) : strlen(r->err);
    bool ok = r->rc == cases[i].rc;
    if (cases[i].first_line && cases[i].rc == 1)  // the GPU's reason may go on
      ok = ok && strncmp(r->err, E "no GPU: ", strlen(E "no GPU: ")) == 0;
    else if (cases[i].first_line)
      ok = ok && len == strlen(cases[i].first_line) &&
           strncmp(r->err, cases[i].first_line, len) == 0 && strstr(r->err, "usage: gemc bench");
    else
      ok = ok && strstr(r->err, "no_such.gem") && !strstr(r->err, "must be");
    if (!ok)
      fail_msg("gemc %s: rc %d (expected %d), stderr:\n%s", cases[i].args, r->rc, cases[i].rc,
               r->err);
  }
  unsetenv("GEMC_NO_CUDA");
}
#undef E

// Old Mac OS line ends (CR only) are named as such at the first one; CRLF works as LF does.
static void test_cli_driver_cr_only_line_ends_are_diagnosed(void **state) {
  (void)state;
  char text[sizeof valid_model], crlf[2 * sizeof valid_model];
  size_t n = 0;
  for (size_t i = 0; valid_model[i]; i++) {
    text[i] = valid_model[i] == '\n' ? '\r' : valid_model[i];
    if (valid_model[i] == '\n') crlf[n++] = '\r';
    crlf[n++] = valid_model[i];
  }
  text[sizeof valid_model - 1] = '\0';
  crlf[n] = '\0';
  write_model("cr.gem", text);
  write_model("crlf.gem", crlf);
  const char expected[] = "cr.gem:1:10: error: the file uses CR-only line ends; use LF or CRLF\n";
  Run *r = run_gemc("check cr.gem");
  assert_int_equal(r->rc, 1);
  assert_int_equal(strncmp(r->err, expected, sizeof expected - 1), 0);
  assert_null(strstr(r->err + sizeof expected - 1, "error:"));  // and nothing after it
  r = run_gemc("check -q crlf.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->err, "");
  r = run_gemc("ir crlf.gem");
  assert_int_equal(r->rc, 0);
  assert_int_equal(strncmp(r->out, "; gemc ir\nmodel m\n", 18), 0);

  // A '#' comment first, CR-only after it: still the CR message, not "end of file".
  char commented[sizeof text + 16];
  snprintf(commented, sizeof commented, "# a model\r%s", text);
  write_model("cr_comment.gem", commented);
  r = run_gemc("check cr_comment.gem");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "cr_comment.gem:1:10: error: the file uses CR-only line ends"));
  assert_null(strstr(r->err, "end of file"));

  // CR-only with one final LF (an editor's) is still CR-only; a stray CR in LF lines is not.
  char final_lf[sizeof text + 2];
  snprintf(final_lf, sizeof final_lf, "%s\n", text);
  write_model("cr_final_lf.gem", final_lf);
  r = run_gemc("check cr_final_lf.gem");
  assert_int_equal(r->rc, 1);
  assert_non_null(strstr(r->err, "cr_final_lf.gem:1:10: error: the file uses CR-only"));
  write_model("stray_cr.gem", "model m {\n  batch 8; \r dim 16;\n  sparse ad : id;\n"
                              "  label click;\n  table t : rows 10;\n"
                              "  y = linear(embed(t, ad), 1);\n  loss bce(y, click);\n}\n");
  r = run_gemc("check stray_cr.gem");
  assert_int_equal(r->rc, 0);
  assert_string_equal(r->err, "");
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
      cmocka_unit_test(test_cli_count_values_state_their_range),
      cmocka_unit_test(test_cli_seed_values_state_their_range),
      cmocka_unit_test(test_cli_real_values_state_their_range),
  };
  const struct CMUnitTest driver_tests[] = {
      cmocka_unit_test(test_cli_driver_check_is_silent_on_success),
      cmocka_unit_test(test_cli_driver_check_v_states_the_gelu_taylor_bound),
      cmocka_unit_test(test_cli_driver_exit_codes),
      cmocka_unit_test(test_cli_driver_werror_fails_on_warnings),
      cmocka_unit_test(test_cli_driver_quiet_keeps_only_errors),
      cmocka_unit_test(test_cli_driver_ir_writes_output_only_on_success),
      cmocka_unit_test(test_cli_driver_ir_emits_ast_and_dumps),
      cmocka_unit_test(test_cli_driver_train_options_state_their_limits),
      cmocka_unit_test(test_cli_driver_bench_reps_states_its_limit),
      cmocka_unit_test(test_cli_driver_cr_only_line_ends_are_diagnosed),
      cmocka_unit_test(test_cli_driver_train_refuses_several_ranks),
      cmocka_unit_test(test_cli_driver_launch_usage_errors),
  };
  int failed = cmocka_run_group_tests(parse_tests, NULL, NULL);
  failed += cmocka_run_group_tests(driver_tests, setup_driver, teardown_driver);
  return failed;
}
