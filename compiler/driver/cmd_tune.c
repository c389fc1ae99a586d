// cmd_tune.c: `gemc tune FILE [--arch A] [--reps N] [--batch B]`, the attention autotuner run
// explicitly (runtime/bench/tune.h, docs/tuning.md): every forward attention node of the model
// is tuned on the GPU, cache or not, the table of its candidates is printed (forward and
// backward milliseconds, the winner), and the winners are stored in the cache that `gemc
// train --backend cuda` reads. Without a GPU it says so and exits 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"         // defines: xcalloc
#include "cli.h"             // defines: CliOptions, cli_usage_error, cli_parse_count
#include "commands.h"        // defines: cmd_tune
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "jit_cache.h"       // defines: jit_cache_dir
#include "load_model.h"      // defines: LoadedModel, load_model
#include "tune.h"            // defines: TuneOptions, tune_model

enum { DEFAULT_TUNE_REPS = 10, MAX_TUNE_REPS = 1000, MAX_TUNE_BATCH = 1 << 20 };

static const char tune_usage[] =
    "usage: gemc tune FILE [--arch sm_90a|sm_100a] [--reps N] [--batch B]\n"
    "       gemc tune FILE --compile-only sm_90a|sm_100a [--batch B]\n";

static void print_tune_help(void) {
  printf("gemc tune: time the legal schedules of every attention node on this GPU, print them\n"
         "and cache the winners for `gemc train --backend cuda` (docs/tuning.md)\n\n%s\n"
         "  --arch A    the arch to check the model for; it must be this GPU's (default: the\n"
         "              model's target for the checks, the GPU's arch for the kernels)\n"
         "  --reps N    timed runs per candidate and round (default %d; 1 to %d)\n"
         "  --batch B   examples per batch (default: the model's batch; 1 to %d), as\n"
         "              `gemc train --batch B` would train it\n"
         "  --compile-only A   emit and compile every candidate for arch A with NVRTC, time\n"
         "              nothing and store nothing (no GPU needed)\n"
         "Each node's candidates are timed even when the cache holds a winner, and the new\n"
         "winners replace the cached ones. A node whose @schedule hints fix its shape is not\n"
         "tuned. Needs a GPU and NVRTC.\n",
         tune_usage, DEFAULT_TUNE_REPS, MAX_TUNE_REPS, MAX_TUNE_BATCH);
}

#define usage(...) cli_usage_error(stderr, tune_usage, "tune", __VA_ARGS__)

int cmd_tune(const CliOptions *o) {
  const char *file = NULL, *arch = o->arch, *compile_only = NULL;
  int64_t reps = DEFAULT_TUNE_REPS, batch = 0;
  char msg[256];
  for (int i = 0; i < o->nrest; i++) {
    const char *a = o->rest[i], *v = NULL;
    int got;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_tune_help();
      return GEMC_EXIT_OK;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--reps", &v)) != 0) {
      if (got < 0 || !cli_parse_count("--reps", v, 1, MAX_TUNE_REPS, &reps, msg, sizeof msg))
        return usage("%s", got < 0 ? "--reps needs a value" : msg), GEMC_EXIT_USAGE;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--batch", &v)) != 0) {
      if (got < 0 || !cli_parse_count("--batch", v, 1, MAX_TUNE_BATCH, &batch, msg, sizeof msg))
        return usage("%s", got < 0 ? "--batch needs a value" : msg), GEMC_EXIT_USAGE;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--arch", &v)) != 0) {
      if (got < 0 || !*v) return usage("--arch needs sm_90a or sm_100a"), GEMC_EXIT_USAGE;
      arch = v;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--compile-only", &v)) != 0) {
      if (got < 0 || !*v) return usage("--compile-only needs sm_90a or sm_100a"), GEMC_EXIT_USAGE;
      compile_only = v;
    } else if (a[0] == '-' && strcmp(a, "-") != 0) {
      return usage("unknown option '%s' for 'gemc tune'", a), GEMC_EXIT_USAGE;
    } else if (file) {
      return usage("'gemc tune' takes one FILE (got '%s' and '%s')", file, a), GEMC_EXIT_USAGE;
    } else {
      file = a;
    }
  }
  if (!file) return usage("'gemc tune' needs a model FILE"), GEMC_EXIT_USAGE;
  if (arch && strcmp(arch, "sm_90a") != 0 && strcmp(arch, "sm_100a") != 0)
    return usage("unknown --arch '%s'; expected one of: sm_90a, sm_100a", arch), GEMC_EXIT_USAGE;
  if (compile_only && strcmp(compile_only, "sm_90a") != 0 && strcmp(compile_only, "sm_100a") != 0)
    return usage("unknown --compile-only arch '%s'; expected one of: sm_90a, sm_100a",
                 compile_only), GEMC_EXIT_USAGE;

  LoadedModel m;
  if (!load_model(&m, file, arch, false, o->quiet, o->werror)) {
    loaded_model_free(&m);
    return GEMC_EXIT_USER_ERROR;
  }
  char cache[4096], err[2048];
  bool cached = jit_cache_dir(cache, sizeof cache, err, sizeof err);
  if (!cached) fprintf(stderr, "gemc: warning: no tuning cache (%s): nothing is stored\n", err);
  Schedule *sched = xcalloc((size_t)m.ir.nnodes + 1, sizeof *sched);
  for (int i = 0; i < m.ir.nnodes; i++) sched[i] = m.ir.nodes[i].sched;
  TuneOptions to = {.reps = (int)reps, .batch = batch, .force = true, .arch = arch,
                    .compile_only = compile_only, .cache_dir = cached ? cache : NULL,
                    .source = file, .table = stdout};
  fflush(stdout);
  int rc = GEMC_EXIT_OK;
  switch (tune_model(&m.ir, &to, sched, NULL, err, sizeof err)) {
  case TUNE_OK: break;
  case TUNE_NO_GPU:
    fprintf(stderr, "gemc: error: gemc tune needs a GPU: %s\n", err);
    rc = GEMC_EXIT_USER_ERROR;
    break;
  case TUNE_FAILED:
    fprintf(stderr, "gemc: error: tune: %s\n", err);
    rc = GEMC_EXIT_USER_ERROR;
    break;
  }
  free(sched);
  loaded_model_free(&m);
  return rc;
}
