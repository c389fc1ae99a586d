// cmd_data.c: `gemc data convert MODEL.gem IN.tsv -o OUT [--sep tab|comma]`. Compiles the
// model for its inputs (the schema), converts the records with datafile_convert, and reads
// the result back to count and validate it. docs/data.md describes both formats.
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "batch.h"           // defines: Schema, schema_from_ir
#include "commands.h"        // defines: cmd_data
#include "datafile.h"        // defines: datafile_convert, datafile_open
#include "file_io.h"         // defines: file_probe_output, file_refuse_same
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "load_model.h"      // defines: LoadedModel, load_model

static const char data_usage[] =
    "usage: gemc data convert MODEL.gem IN.tsv -o OUT [--sep tab|comma]\n";

#define usage(err, ...) cli_usage_error(err, data_usage, "data", __VA_ARGS__)

static void print_data_help(FILE *out) {
  fprintf(out,
          "gemc data: data files for gemc train\n"
          "\n%s\n"
          "  convert   reads IN (the first line names the columns: every input and label of\n"
          "            MODEL; id lists and float vectors as space-separated numbers) and writes\n"
          "            the binary data file OUT, which gemc train --data reads\n"
          "  --sep S   the column separator: tab or comma (default: from IN's extension,\n"
          "            .csv for comma, anything else tab)\n"
          "  -o OUT    the data file to write (it appears whole or not at all)\n"
          "\n"
          "docs/data.md describes both formats.\n",
          data_usage);
}

typedef struct DataCli {
  const char *model, *in, *out;
  char sep;  // 0: from the extension
  bool quiet, werror;
  const char *arch;
} DataCli;

// Returns 1 to run, 0 after a usage error, 2 after --help.
static int parse_data(const CliOptions *o, DataCli *c, FILE *err) {
  memset(c, 0, sizeof *c);
  c->quiet = o->quiet;
  c->werror = o->werror;
  c->arch = o->arch;
  const char *words[3];
  int nwords = 0;
  for (int i = 0; i < o->nrest; i++) {
    const char *arg = o->rest[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 2;
    if (strcmp(arg, "-q") == 0 || strcmp(arg, "--quiet") == 0) {
      c->quiet = true;
    } else if (strcmp(arg, "-o") == 0) {
      if (i + 1 >= o->nrest) return usage(err, "-o needs a file name");
      c->out = o->rest[++i];
    } else if (strncmp(arg, "--sep", 5) == 0 && (arg[5] == '\0' || arg[5] == '=')) {
      const char *v = arg[5] == '=' ? arg + 6 : (i + 1 < o->nrest ? o->rest[++i] : "");
      if (strcmp(v, "tab") == 0) c->sep = '\t';
      else if (strcmp(v, "comma") == 0) c->sep = ',';
      else return usage(err, "--sep needs tab or comma, got '%s'", v);
    } else if (arg[0] == '-' && arg[1] != '\0') {
      return usage(err, "unknown option '%s' for 'gemc data'", arg);
    } else if (nwords < 3) {
      words[nwords++] = arg;
    } else {
      return usage(err, "too many arguments for 'gemc data convert' ('%s')", arg);
    }
  }
  if (nwords == 0) return usage(err, "'gemc data' needs a subcommand: convert");
  if (strcmp(words[0], "convert") != 0)
    return usage(err, "unknown subcommand 'gemc data %s'; the subcommands are: convert",
                 words[0]);
  if (nwords != 3) return usage(err, "'gemc data convert' needs MODEL.gem and IN");
  if (!c->out) return usage(err, "'gemc data convert' needs -o OUT");
  c->model = words[1];
  c->in = words[2];
  return 1;
}

int cmd_data(const CliOptions *o) {
  DataCli c;
  int parsed = parse_data(o, &c, stderr);
  if (parsed == 2) {
    print_data_help(stdout);
    return GEMC_EXIT_OK;
  }
  if (parsed == 0) return GEMC_EXIT_USAGE;

  // The output is checked before any work: its directory takes files, and it is no input.
  char perr[1024];
  if (!file_probe_output(c.out, "data file", perr, sizeof perr) ||
      !file_refuse_same(c.out, c.in, perr, sizeof perr) ||
      !file_refuse_same(c.out, c.model, perr, sizeof perr)) {
    fprintf(stderr, "gemc: error: %s\n", perr);
    return GEMC_EXIT_USER_ERROR;
  }
  LoadedModel m;
  int rc = GEMC_EXIT_USER_ERROR;
  if (load_model(&m, c.model, c.arch, false, c.quiet, c.werror)) {
    Schema s;
    schema_from_ir(&m.ir, &s);
    char err[1024];
    if (datafile_convert(c.in, c.out, &s, c.sep, err, sizeof err)) {
      DataReader *r = datafile_open(c.out, &s, err, sizeof err);
      if (r) {
        if (!c.quiet)
          printf("%s: %" PRId64 " examples for model %s\n", c.out, datafile_examples(r),
                 m.ir.model);
        datafile_close_reader(r);
        rc = GEMC_EXIT_OK;
      }
    }
    if (rc != GEMC_EXIT_OK) fprintf(stderr, "gemc: error: %s\n", err);
  }
  loaded_model_free(&m);
  return rc;
}
