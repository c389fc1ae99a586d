// main.c: the gemc driver. Reads each file, runs the front end over it (parse, sema, passes)
// and prints what the command asked for. cli.c parses the command line; docs/cli.md
// documents it. Exit codes are in internal_error.h.
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "arena.h"           // defines: Arena, arena_free
#include "ast.h"             // defines: Model, ast_print
#include "cli.h"             // defines: CliOptions, cli_parse, cli_print_help
#include "commands.h"        // defines: cmd_train, cmd_data
#include "diag.h"            // defines: Diag, SourceFile, source_read
#include "file_io.h"         // defines: file_write_atomic, file_refuse_same
#include "internal_error.h"  // defines: GEMC_EXIT_*, GEMC_ASSERT
#include "ir.h"              // defines: Ir, ir_init, ir_print
#include "load_model.h"      // defines: front_end
#include "numerics.h"        // defines: GELU_TAYLOR_ERROR, GELU_TAYLOR_GRAD_ERROR

// --- one file through the front end -----------------------------------------------------

static bool same_loc(Loc a, Loc b) {
  return a.first_line == b.first_line && a.first_column == b.first_column &&
         a.last_line == b.last_line && a.last_column == b.last_column;
}

// `gemc check -v`: a note with the error bound at each op that evaluates gelu_taylor (act =
// gelu_taylor, or gelu under @schedule(gelu = taylor)); docs/activations.md. One note per
// source op: the layers of one mlp share its location.
static void note_gelu_taylor_bounds(const Ir *ir, Diag *d) {
  for (int i = 0; i < ir->nforward; i++) {
    const Node *n = &ir->nodes[i];
    if (node_act(n) != ACT_GELU_TAYLOR) continue;
    bool noted = false;
    for (int j = 0; j < i && !noted; j++)
      noted = node_act(&ir->nodes[j]) == ACT_GELU_TAYLOR && same_loc(ir->nodes[j].loc, n->loc);
    if (noted) continue;
    diag_note(d, n->loc, "gelu_taylor: |error| <= %.1e over all inputs (its derivative's <= "
              "%.1e; fp32 kernels add <= %.1e of rounding); a degree-%d minimax polynomial on "
              "|x| < %g, x or 0 beyond", GELU_TAYLOR_ERROR, GELU_TAYLOR_GRAD_ERROR,
              GELU_TAYLOR_FP32_ROUNDING, GELU_TAYLOR_DEGREE, GELU_TAYLOR_CLAMP);
  }
}

// Runs every stage up to the one `o` asks for, and prints its result to `out` (NULL: print
// nothing; `gemc check`, which with -v notes gelu_taylor's bound). Returns false when an
// error was reported.
static bool run_front_end(const CliOptions *o, const SourceFile *src, Arena *arena, Diag *d,
                          FILE *out) {
  FrontEnd fe = {.arch = o->arch, .parse_only = o->emit == STAGE_AST, .dump_after = o->dump_after,
                 .dump_out = out, .with_grad = o->grad};
  Model *m = NULL;
  Ir ir;
  ir_init(&ir, arena);
  if (!front_end(src, arena, d, &fe, &m, &ir)) return false;
  if (o->command == CMD_CHECK && o->verbose) note_gelu_taylor_bounds(&ir, d);
  if (out && fe.parse_only) ast_print(out, m);
  else if (out && !o->dump_after) ir_print(out, &ir);
  return true;
}

// Compiles one file; returns GEMC_EXIT_OK or GEMC_EXIT_USER_ERROR.
static int compile_file(const CliOptions *o, const char *path, FILE *out) {
  SourceFile src;
  if (!source_read(&src, path)) return GEMC_EXIT_USER_ERROR;

  Diag d;
  diag_init(&d, &src, stderr);
  d.warnings_are_errors = o->werror;
  d.quiet = o->quiet;
  Arena arena = {0};

  bool ok = run_front_end(o, &src, &arena, &d, out);
  bool failed = !ok || d.errors > 0 || (o->werror && d.warnings > 0);

  arena_free(&arena);
  source_free(&src);
  return failed ? GEMC_EXIT_USER_ERROR : GEMC_EXIT_OK;
}

// --- the commands -----------------------------------------------------------------------

static int run_check(const CliOptions *o) {
  int worst = GEMC_EXIT_OK;
  for (int i = 0; i < o->nfiles; i++) {
    int rc = compile_file(o, o->files[i], NULL);
    if (rc == GEMC_EXIT_OK && o->verbose) printf("%s: ok\n", o->files[i]);
    if (rc > worst) worst = rc;
  }
  return worst;
}

static int write_error(const char *what) {
  fprintf(stderr, "gemc: error: cannot write %s: %s\n", what, strerror(errno));
  return GEMC_EXIT_USER_ERROR;
}

// Opens -o OUT, or returns stdout.
static FILE *open_output(const CliOptions *o) {
  return o->output ? fopen(o->output, "w") : stdout;
}

// Closes -o OUT and reports a failed write. stdout is checked once, at the end of main.
static int close_output(const CliOptions *o, FILE *f) {
  if (!o->output) return GEMC_EXIT_OK;
  bool bad = ferror(f) != 0;
  if (fclose(f) != 0) bad = true;
  return bad ? write_error(o->output) : GEMC_EXIT_OK;
}

// `gemc ir`: the output is buffered and written only when the file compiles, so a failed
// run leaves no half-written OUT. --dump-after writes straight through instead: it is a
// debugging aid, and its output matters most when a later pass fails.
static int run_ir(const CliOptions *o) {
  const char *path = o->files[0];
  if (o->output) {
    // Before anything is read: opening OUT would empty an OUT that is the input.
    char err[1024];
    if (!file_refuse_same(o->output, path, err, sizeof err) ||
        !file_probe_output(o->output, "", err, sizeof err)) {
      fprintf(stderr, "gemc: error: %s\n", err);
      return GEMC_EXIT_USER_ERROR;
    }
  }
  if (o->dump_after) {
    FILE *out = open_output(o);
    if (!out) return write_error(o->output);
    int rc = compile_file(o, path, out);
    int wrc = close_output(o, out);
    return rc != GEMC_EXIT_OK ? rc : wrc;
  }

  char *text = NULL;
  size_t size = 0;
  FILE *buffer = open_memstream(&text, &size);
  if (!buffer) gemc_internal_error(__FILE__, __LINE__, "open_memstream failed");
  int rc = compile_file(o, path, buffer);
  fclose(buffer);
  if (rc == GEMC_EXIT_OK && o->output) {
    // Whole or not at all: a temporary file, fsynced, renamed over OUT.
    char err[1024];
    if (!file_write_atomic(o->output, text, size, err, sizeof err)) {
      fprintf(stderr, "gemc: error: %s\n", err);
      rc = GEMC_EXIT_USER_ERROR;
    }
  } else if (rc == GEMC_EXIT_OK) {
    fwrite(text, 1, size, stdout);
  }
  free(text);
  return rc;
}

int main(int argc, char **argv) {
  CliOptions o;
  if (!cli_parse(argc, argv, &o, stderr)) {
    cli_free(&o);
    return GEMC_EXIT_USAGE;
  }

  int rc = GEMC_EXIT_OK;
  switch (o.command) {
  case CMD_HELP: cli_print_help(stdout); break;
  case CMD_VERSION: cli_print_version(stdout); break;
  case CMD_CHECK: rc = run_check(&o); break;
  case CMD_IR: rc = run_ir(&o); break;
  case CMD_TRAIN: rc = cmd_train(&o); break;
  case CMD_DATA: rc = cmd_data(&o); break;
  case CMD_EMIT: rc = cmd_emit(&o); break;
  case CMD_BUILD: rc = cmd_build(&o); break;
  case CMD_BENCH: rc = cmd_bench(&o); break;
  case CMD_TUNE: rc = cmd_tune(&o); break;
  case CMD_LAUNCH: rc = cmd_launch(&o); break;
  }
  cli_free(&o);

  if (fflush(stdout) != 0 || ferror(stdout)) {
    int wrc = write_error("<stdout>");
    if (rc == GEMC_EXIT_OK) rc = wrc;
  }
  return rc;
}
