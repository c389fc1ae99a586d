// cli.c: parses the gemc command line and prints the help text.
// Options may come before or after the command; the first word that is not an option is the
// command, and the words after it are files. Every mistake is a usage error (exit 2).
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"
#include "passes.h"

static const char *const stage_names[] = {
#define X(name, text, doc) text,
    STAGES(X)
#undef X
};

static const char *const stage_docs[] = {
#define X(name, text, doc) doc,
    STAGES(X)
#undef X
};

static const char *const known_archs[] = {"sm_90a", "sm_100a"};
enum { NUM_ARCHS = sizeof known_archs / sizeof known_archs[0] };

static const char usage_line[] =
    "usage: gemc [options] check FILE...\n"
    "       gemc [options] ir FILE [--emit=STAGE] [--dump-after=PASS] [--grad] [-o OUT]\n"
    "       gemc [options] train FILE [train options]   (gemc train --help)\n"
    "       gemc [options] launch -n N train FILE [train options]   (gemc launch --help)\n"
    "       gemc [options] data convert MODEL.gem IN.tsv -o OUT [--sep tab|comma]\n"
    "       gemc [options] emit FILE [--arch A] [--emit=cu|plan|ptx|cubin] [-o DIR]\n"
    "       gemc [options] build FILE [--arch sm_90a,sm_100a] -o MODEL.gemb\n"
    "       gemc [options] bench gdpa [--act ACT] [--reps N] [--quick]\n"
    "       gemc [options] tune FILE [--arch A] [--reps N] [--batch B]\n"
    "       gemc help | --help | --version\n";

const char *stage_name(Stage s) {
  GEMC_ASSERT(s >= 0 && s < STAGE_COUNT);
  return stage_names[s];
}

// --- usage errors -----------------------------------------------------------------------

static bool usage_error(FILE *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool usage_error(FILE *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gemc: error: ", err);
  vfprintf(err, fmt, ap);
  va_end(ap);
  fprintf(err, "\n%stry 'gemc --help' for more information\n", usage_line);
  return false;
}

// Writes "a, b, c" into buf; used to list what a value may be.
static const char *join_names(char *buf, size_t size, const char *const *names, int n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", names[i]);
  return buf;
}

static const char *pass_list(char *buf, size_t size) {
  const char *names[64];
  int n = 0;
  for (const Pass *p = gemc_passes; p->name && n < 64; p++) names[n++] = p->name;
  return join_names(buf, size, names, n);
}

static bool is_pass(const char *name) {
  for (const Pass *p = gemc_passes; p->name; p++)
    if (strcmp(p->name, name) == 0) return true;
  return false;
}

static bool stage_from_name(const char *name, Stage *out) {
  for (int s = 0; s < STAGE_COUNT; s++) {
    if (strcmp(stage_names[s], name) == 0) {
      *out = (Stage)s;
      return true;
    }
  }
  return false;
}

static bool is_arch(const char *name) {
  for (int i = 0; i < NUM_ARCHS; i++)
    if (strcmp(known_archs[i], name) == 0) return true;
  return false;
}

// --- option values ----------------------------------------------------------------------

// Matches `--name=value` or `--name value` at argv[*i]. Returns 1 and sets *value when it
// matches, 0 when argv[*i] is some other option, -1 when the value is missing.
int cli_option_value(int argc, char **argv, int *i, const char *name, const char **value) {
  const char *arg = argv[*i];
  size_t len = strlen(name);
  if (strncmp(arg, name, len) != 0) return 0;
  if (arg[len] == '=') {
    *value = arg + len + 1;
    return 1;
  }
  if (arg[len] != '\0') return 0;
  if (*i + 1 >= argc) return -1;
  *value = argv[++*i];
  return 1;
}

// --- numeric option values --------------------------------------------------------------

enum { SHOWN_MAX = 40 };  // at most this much of a bad value is echoed

// The value as the messages echo it: '' when empty, cut after SHOWN_MAX characters.
static const char *shown(const char *value, char *buf, size_t size) {
  if (!*value) return "''";
  if (strlen(value) <= SHOWN_MAX) return value;
  snprintf(buf, size, "%.*s...", (int)SHOWN_MAX, value);
  return buf;
}

// A bound as people write it: 1e6, 1e-8, 0.999999, 1000 (%g without "+0" in exponents).
static void format_real(double x, char *buf, size_t size) {
  char raw[64];
  snprintf(raw, sizeof raw, "%g", x);
  size_t o = 0;
  for (const char *p = raw; *p && o + 1 < size; p++) {
    buf[o++] = *p;
    if (*p != 'e') continue;
    if (p[1] == '+') p++;
    else if (p[1] == '-' && o + 1 < size) buf[o++] = *++p;
    while (p[1] == '0' && p[2]) p++;
  }
  buf[o] = '\0';
}

const char *cli_count_range(int64_t min, int64_t max, char *buf, size_t size) {
  snprintf(buf, size, "[%" PRId64 ", %" PRId64 "]", min, max);
  return buf;
}

const char *cli_real_range(RealRange r, char *buf, size_t size) {
  char lo[32], hi[32];
  format_real(r.min, lo, sizeof lo);
  format_real(r.max, hi, sizeof hi);
  snprintf(buf, size, "%c%s, %s%c", r.min_open ? '(' : '[', lo, hi, r.max_open ? ')' : ']');
  return buf;
}

// Digits only, at least one: what a count or a seed may be.
static bool all_digits(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return false;
  return true;
}

bool cli_parse_count(const char *name, const char *value, int64_t min, int64_t max,
                     int64_t *out, char *msg, size_t msg_size) {
  GEMC_ASSERT(min >= 0 && min <= max);
  if (all_digits(value)) {
    errno = 0;
    char *end;
    long long v = strtoll(value, &end, 10);
    if (errno == 0 && *end == '\0' && v >= min && v <= max) {
      *out = v;
      return true;
    }
  }
  char range[64], buf[SHOWN_MAX + 8];
  snprintf(msg, msg_size, "%s must be a whole number in %s, got %s", name,
           cli_count_range(min, max, range, sizeof range), shown(value, buf, sizeof buf));
  return false;
}

bool cli_parse_u64(const char *name, const char *value, uint64_t max, uint64_t *out,
                   char *msg, size_t msg_size) {
  if (all_digits(value)) {
    errno = 0;
    char *end;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno == 0 && *end == '\0' && v <= max) {
      *out = v;
      return true;
    }
  }
  char buf[SHOWN_MAX + 8];
  snprintf(msg, msg_size, "%s must be a whole number in [0, %" PRIu64 "], got %s", name, max,
           shown(value, buf, sizeof buf));
  return false;
}

// Only the characters of a plain decimal number: strtod alone would take nan, inf, hex
// floats and leading spaces.
static bool decimal_chars(const char *s) {
  bool digit = false;
  for (; *s; s++) {
    if (*s >= '0' && *s <= '9') digit = true;
    else if (!strchr(".eE+-", *s)) return false;
  }
  return digit;
}

bool cli_parse_real(const char *name, const char *value, RealRange r, double *out, char *msg,
                    size_t msg_size) {
  if (decimal_chars(value)) {
    errno = 0;
    char *end;
    double x = strtod(value, &end);
    bool in = x > r.min || (!r.min_open && x == r.min);
    in = in && (x < r.max || (!r.max_open && x == r.max));
    if (errno == 0 && *end == '\0' && isfinite(x) && in) {
      *out = x;
      return true;
    }
  }
  char range[80], buf[SHOWN_MAX + 8];
  snprintf(msg, msg_size, "%s must be in %s, got %s", name, cli_real_range(r, range, sizeof range),
           shown(value, buf, sizeof buf));
  return false;
}

static bool parse_command(const char *word, Command *out) {
  if (strcmp(word, "check") == 0) *out = CMD_CHECK;
  else if (strcmp(word, "ir") == 0) *out = CMD_IR;
  else if (strcmp(word, "train") == 0) *out = CMD_TRAIN;
  else if (strcmp(word, "data") == 0) *out = CMD_DATA;
  else if (strcmp(word, "emit") == 0) *out = CMD_EMIT;
  else if (strcmp(word, "build") == 0) *out = CMD_BUILD;
  else if (strcmp(word, "bench") == 0) *out = CMD_BENCH;
  else if (strcmp(word, "tune") == 0) *out = CMD_TUNE;
  else if (strcmp(word, "launch") == 0) *out = CMD_LAUNCH;
  else if (strcmp(word, "help") == 0) *out = CMD_HELP;
  else return false;
  return true;
}

// --- the parser -------------------------------------------------------------------------

// Checks the options that only make sense together, once every word is read.
static bool check_combination(CliOptions *o, bool has_command, const char *emit,
                              FILE *err) {
  char list[512];
  if (!has_command) return usage_error(err, "no command given");
  if (o->command == CMD_HELP) return true;
  if (o->command == CMD_TRAIN || o->command == CMD_DATA || o->command == CMD_EMIT ||
      o->command == CMD_BUILD || o->command == CMD_BENCH || o->command == CMD_TUNE ||
      o->command == CMD_LAUNCH) {
    if (emit || o->dump_after || o->output || o->grad)
      return usage_error(err, "--emit, --dump-after, --grad and -o only apply to 'gemc ir'");
    return true;  // the command's own parser checks the rest, --arch included
  }
  if (o->arch && !is_arch(o->arch))
    return usage_error(err, "unknown --arch '%s'; expected one of: %s", o->arch,
                       join_names(list, sizeof list, known_archs, NUM_ARCHS));
  if (o->command == CMD_CHECK) {
    if (emit) return usage_error(err, "--emit only applies to 'gemc ir'");
    if (o->dump_after) return usage_error(err, "--dump-after only applies to 'gemc ir'");
    if (o->output) return usage_error(err, "-o only applies to 'gemc ir'");
    if (o->grad) return usage_error(err, "--grad only applies to 'gemc ir'");
    if (o->nfiles == 0) return usage_error(err, "'gemc check' needs at least one FILE");
    return true;
  }
  // CMD_IR
  if (o->nfiles != 1)
    return usage_error(err, "'gemc ir' takes exactly one FILE (got %d)", o->nfiles);
  if (emit && !stage_from_name(emit, &o->emit))
    return usage_error(err, "unknown stage '%s' for --emit; the stages are: %s", emit,
                       join_names(list, sizeof list, stage_names, STAGE_COUNT));
  if (o->dump_after && !is_pass(o->dump_after))
    return usage_error(err, "unknown pass '%s' for --dump-after; the passes are: %s",
                       o->dump_after, pass_list(list, sizeof list));
  if (o->dump_after && o->emit != STAGE_IR)
    return usage_error(err, "--dump-after needs --emit=ir");
  if (o->grad && o->emit != STAGE_IR) return usage_error(err, "--grad needs --emit=ir");
  return true;
}

bool cli_parse(int argc, char **argv, CliOptions *o, FILE *err) {
  memset(o, 0, sizeof *o);
  o->emit = STAGE_IR;
  o->files = xcalloc((size_t)(argc > 0 ? argc : 1), sizeof *o->files);

  bool has_command = false, only_files = false;
  const char *emit = NULL;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *value = NULL;
    int got;
    if (only_files || arg[0] != '-' || strcmp(arg, "-") == 0) {
      if (!has_command) {
        if (!parse_command(arg, &o->command))
          return usage_error(err, "unknown command '%s'; the commands are: check, ir, "
                             "train, launch, data, emit, build, bench, tune, help", arg);
        has_command = true;
        // train and data parse their own options (commands.h): hand them the rest.
        if (o->command == CMD_TRAIN || o->command == CMD_DATA || o->command == CMD_EMIT ||
            o->command == CMD_BUILD || o->command == CMD_BENCH || o->command == CMD_TUNE ||
      o->command == CMD_LAUNCH) {
          o->rest = argv + i + 1;
          o->nrest = argc - i - 1;
          break;
        }
      } else {
        o->files[o->nfiles++] = arg;
      }
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      only_files = true;
    } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      o->command = CMD_HELP;
      return true;
    } else if (strcmp(arg, "--version") == 0) {
      o->command = CMD_VERSION;
      return true;
    } else if (strcmp(arg, "--Werror") == 0) {
      o->werror = true;
    } else if (strcmp(arg, "-q") == 0 || strcmp(arg, "--quiet") == 0) {
      o->quiet = true;
    } else if (strcmp(arg, "-v") == 0 || strcmp(arg, "--verbose") == 0) {
      o->verbose = true;
    } else if ((got = cli_option_value(argc, argv, &i, "--arch", &value)) != 0) {
      if (got < 0) return usage_error(err, "--arch needs a value (sm_90a or sm_100a)");
      o->arch = value;
    } else if ((got = cli_option_value(argc, argv, &i, "--emit", &value)) != 0) {
      if (got < 0) return usage_error(err, "--emit needs a STAGE");
      emit = value;
    } else if ((got = cli_option_value(argc, argv, &i, "--dump-after", &value)) != 0) {
      if (got < 0) return usage_error(err, "--dump-after needs a PASS");
      o->dump_after = value;
    } else if (strcmp(arg, "--grad") == 0) {
      o->grad = true;
    } else if (strcmp(arg, "-o") == 0) {
      if (i + 1 >= argc) return usage_error(err, "-o needs a file name");
      o->output = argv[++i];
    } else {
      return usage_error(err, "unknown option '%s'", arg);
    }
  }
  if (o->quiet && o->verbose) return usage_error(err, "-q and -v cannot be used together");
  return check_combination(o, has_command, emit, err);
}

void cli_free(CliOptions *o) {
  free(o->files);
  o->files = NULL;
  o->nfiles = 0;
}

// --- help -------------------------------------------------------------------------------

void cli_print_version(FILE *out) {
  fprintf(out, "gemc %s (built %s)\n", GEMC_VERSION, __DATE__);
}

void cli_print_help(FILE *out) {
  char list[512];
  fprintf(out,
          "gemc %s: the compiler for .gem model files\n"
          "\n"
          "%s"
          "\n"
          "commands:\n"
          "  check FILE...        parse, check and lower each file; print only diagnostics\n"
          "  ir FILE              print the final graph IR of FILE (or another stage)\n"
          "  train FILE           train the model on the GPU or the CPU (gemc train --help)\n"
          "  launch -n N train FILE\n"
          "                       train on N ranks (gemc launch --help, docs/distributed.md)\n"
          "  data convert MODEL.gem IN.tsv -o OUT\n"
          "                       turn a TSV/CSV of records into a data file for MODEL\n"
          "  emit FILE            lower FILE to CUDA C and a launch plan (docs/codegen.md)\n"
          "  build FILE           compile FILE ahead of time into a .gemb artifact: the plan,\n"
          "                       the CUDA source and one cubin per arch (docs/gpu.md)\n"
          "  bench gdpa           GDPA forward/backward TFLOP/s on the public shapes, beside\n"
          "                       Meta's Triton numbers; needs a GPU (gemc bench --help)\n"
          "  tune FILE            time the schedules of FILE's attention nodes on this GPU and\n"
          "                       cache the winners for train; needs a GPU (gemc tune --help)\n"
          "  help                 print this text\n"
          "\n"
          "options for every command:\n"
          "  --arch ARCH          compile for ARCH instead of the model's target: %s\n"
          "  --Werror             treat warnings as errors\n"
          "  -q, --quiet          print errors (and their notes) only, no warnings\n"
          "  -v, --verbose        check: print 'FILE: ok' for each file that passes, and a\n"
          "                       note with the error bound at each op using gelu_taylor\n"
          "  -h, --help           print this text\n"
          "  --version            print the version and build date\n"
          "\n"
          "options for 'gemc ir':\n"
          "  --emit=STAGE         print STAGE instead of the final IR:\n",
          GEMC_VERSION, usage_line, join_names(list, sizeof list, known_archs, NUM_ARCHS));
  for (int s = 0; s < STAGE_COUNT; s++)
    fprintf(out, "                         %-6s %s%s\n", stage_names[s], stage_docs[s],
            s == STAGE_IR ? " (default)" : "");
  fprintf(out,
          "  --dump-after=PASS    print the IR right after PASS instead of the final IR;\n"
          "                       the passes, in order: %s\n"
          "  --grad               append the backward graph: gradients of every parameter\n"
          "                       and table (docs/autodiff.md)\n"
          "  -o OUT               write to OUT instead of stdout\n"
          "\n"
          "An option that takes a value accepts both --opt=VALUE and --opt VALUE.\n"
          "\n"
          "exit codes:\n"
          "  0  success (warnings and notes may have been printed)\n"
          "  1  the input has errors, or a file cannot be read or written\n"
          "  2  bad command line\n"
          "  3  internal error: a bug in gemc; please report it with the input\n"
          "\n"
          "The language: docs/language.md. The IR: docs/ir.md. This command: docs/cli.md.\n",
          pass_list(list, sizeof list));
}

bool cli_usage_error(FILE *err, const char *usage_text, const char *command, const char *fmt,
                     ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gemc: error: ", err);
  vfprintf(err, fmt, ap);
  va_end(ap);
  fprintf(err, "\n%stry 'gemc %s --help' for more information\n", usage_text, command);
  return false;
}
