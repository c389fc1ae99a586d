// cli.h: the gemc command line: what the user asked for, parsed from argv, and the help text.
// main.c runs what cli_parse returns; docs/cli.md documents every command and option.
// defines: Command, Stage, CliOptions, cli_parse, cli_free, cli_print_help, cli_print_version
#ifndef GEMC_CLI_H
#define GEMC_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "version.h"  // defines: GEMC_VERSION

typedef enum Command {
  CMD_CHECK,    // gemc check FILE...
  CMD_IR,       // gemc ir FILE
  CMD_TRAIN,    // gemc train FILE [train options] (cmd_train.c parses the rest)
  CMD_DATA,     // gemc data convert ... (cmd_data.c parses the rest)
  CMD_EMIT,     // gemc emit FILE [emit options] (cmd_emit.c parses the rest)
  CMD_BUILD,    // gemc build FILE --arch A,B -o OUT.gemb (cmd_build.c parses the rest)
  CMD_BENCH,    // gemc bench gdpa [options] (cmd_bench.c parses the rest)
  CMD_HELP,     // gemc help, gemc --help
  CMD_VERSION,  // gemc --version
} Command;

// The stages `gemc ir --emit=STAGE` can stop after, in pipeline order.
#define STAGES(X)                          \
  X(AST, "ast", "the syntax tree, as parsed") \
  X(IR, "ir", "the graph IR after every pass")
typedef enum Stage {
#define X(name, text, doc) STAGE_##name,
  STAGES(X)
#undef X
  STAGE_COUNT
} Stage;
const char *stage_name(Stage s);

typedef struct CliOptions {
  Command command;
  const char **files;      // the FILE arguments, in order
  int nfiles;
  const char *arch;        // --arch: overrides the model's target; NULL: keep it
  bool werror;             // --Werror: warnings count as errors
  bool quiet;              // -q: print errors only
  bool verbose;            // -v: say "FILE: ok" for each file that passes
  Stage emit;              // ir --emit=STAGE; STAGE_IR by default
  const char *dump_after;  // ir --dump-after=PASS: print the IR after PASS instead
  const char *output;      // ir -o OUT; NULL: stdout
  bool grad;               // ir --grad: append the backward graph (docs/autodiff.md)
  char **rest;             // train, data: the words after the command, which that command
  int nrest;               // parses itself (commands.h)
} CliOptions;

// Parses argv into `o`. On a usage error writes "gemc: error: ..." and a hint to `err`, and
// returns false; the caller exits with GEMC_EXIT_USAGE. Call cli_free afterwards either way.
bool cli_parse(int argc, char **argv, CliOptions *o, FILE *err);
void cli_free(CliOptions *o);

void cli_print_help(FILE *out);

// Matches `--name=value` or `--name value` at argv[*i]: 1 and *value when it matches, 0 when
// argv[*i] is another option, -1 when the value is missing.
int cli_option_value(int argc, char **argv, int *i, const char *name, const char **value);
// Prints "gemc: error: MESSAGE", the command's usage text and a pointer to its --help, and
// returns false (for the commands' own option parsers).
bool cli_usage_error(FILE *err, const char *usage_text, const char *command, const char *fmt,
                     ...) __attribute__((format(printf, 4, 5)));
void cli_print_version(FILE *out);

#endif
