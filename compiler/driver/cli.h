// cli.h: the gemc command line: what the user asked for, parsed from argv, and the help text.
// main.c runs what cli_parse returns; docs/cli.md documents every command and option.
// defines: Command, Stage, CliOptions, cli_parse, cli_free, cli_print_help, cli_print_version,
//          RealRange, cli_parse_count, cli_parse_u64, cli_parse_real
#ifndef GEMC_CLI_H
#define GEMC_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
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
  CMD_TUNE,     // gemc tune FILE [options] (cmd_tune.c parses the rest)
  CMD_LAUNCH,   // gemc launch -n N train FILE ... (cmd_launch.c parses the rest)
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

// --- numeric option values ----------------------------------------------------------------
// Every numeric option of every command has an explicit range (docs/cli.md lists them), and
// a value outside it, or one that is not a plain number, gets one message that names the
// option, the range and the value: "--steps must be a whole number in [0, 1000000000], got
// 1e3", "--table-lr must be in (0, 1e6], got 1e30". Each parser returns true and sets *out,
// or returns false with that message (no "gemc: error: " prefix) in msg.

// A whole number in [min, max]: decimal digits only, so no sign, spaces, exponent, trailing
// characters or overflow (min >= 0).
bool cli_parse_count(const char *name, const char *value, int64_t min, int64_t max,
                     int64_t *out, char *msg, size_t msg_size);
// The same for an unsigned 64-bit value (seeds): in [0, max].
bool cli_parse_u64(const char *name, const char *value, uint64_t max, uint64_t *out,
                   char *msg, size_t msg_size);

// The range of a real option: [min, max], either end open when its flag says so.
typedef struct RealRange {
  double min, max;
  bool min_open, max_open;
} RealRange;
// A finite decimal number in the range: digits, '.', an exponent and a sign only, so no
// nan, inf, hex, spaces, trailing characters, overflow or underflow.
bool cli_parse_real(const char *name, const char *value, RealRange range, double *out,
                    char *msg, size_t msg_size);
// Writes the range as the messages say it, "[0, 1000000000]" or "(0, 1e6]", into buf.
const char *cli_count_range(int64_t min, int64_t max, char *buf, size_t size);
const char *cli_real_range(RealRange range, char *buf, size_t size);

#endif
