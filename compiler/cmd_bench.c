// cmd_bench.c: `gemc bench gdpa [--act ACT] [--reps N] [--quick]`, the GDPA benchmark of the
// generated attention kernels on the public shapes (runtime/gdpa_bench.h, docs/attention.md):
// forward and backward TFLOP/s over the real jagged lengths, with Meta's Triton numbers beside
// each cell. Needs a GPU; without one it says why and exits 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"             // defines: CliOptions
#include "commands.h"        // defines: cmd_bench
#include "gdpa_bench.h"      // defines: gdpa_bench_run
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "jit_cache.h"       // defines: jit_cache_dir

static const char bench_usage[] =
    "usage: gemc bench gdpa [--act gelu|gelu_taylor|silu|softmax|...] [--reps N] [--quick]\n";

static int bench_usage_error(const char *what, const char *arg) {
  fprintf(stderr, "gemc: error: %s%s%s\n%s", what, arg ? " " : "", arg ? arg : "", bench_usage);
  return GEMC_EXIT_USAGE;
}

static void print_bench_help(void) {
  printf("gemc bench: measure the generated kernels on the GPU (docs/attention.md)\n\n%s\n"
         "  gdpa            GDPA forward and backward TFLOP/s on the public shapes: B=1152, H=4,\n"
         "                  d=128, bf16, N in {512, 1024, 2048}, s in {0.5, 1.0}, self and\n"
         "                  cross with KV=256; Meta's Triton numbers beside each cell\n"
         "  --act ACT       the activation of the main table (default gelu, as Triton's)\n"
         "  --reps N        timed runs per cell (default 10)\n"
         "  --quick         N=1024 only, and no extra sections\n",
         bench_usage);
}

int cmd_bench(const CliOptions *o) {
  GdpaBenchOptions b = {.act = ACT_GELU, .reps = 10};
  const char *what = NULL;
  for (int i = 0; i < o->nrest; i++) {
    const char *a = o->rest[i];
    const char *value = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_bench_help();
      return GEMC_EXIT_OK;
    } else if (strcmp(a, "--quick") == 0) {
      b.quick = true;
    } else if (strncmp(a, "--act", 5) == 0 && (a[5] == '=' || a[5] == '\0')) {
      value = a[5] == '=' ? a + 6 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      if (!value) return bench_usage_error("--act needs a value", NULL);
      if (!act_from_name(value, &b.act)) return bench_usage_error("unknown activation", value);
    } else if (strncmp(a, "--reps", 6) == 0 && (a[6] == '=' || a[6] == '\0')) {
      value = a[6] == '=' ? a + 7 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      char *end = NULL;
      long reps = value ? strtol(value, &end, 10) : 0;
      if (!value || *end != '\0' || reps < 1 || reps > 100000)
        return bench_usage_error("--reps needs a count from 1 to 100000, not", value ? value : "nothing");
      b.reps = (int)reps;
    } else if (a[0] == '-') {
      return bench_usage_error("unknown option for 'gemc bench':", a);
    } else if (!what) {
      what = a;
    } else {
      return bench_usage_error("unexpected argument", a);
    }
  }
  if (!what) return bench_usage_error("say what to benchmark:", "gdpa");
  if (strcmp(what, "gdpa") != 0)
    return bench_usage_error("unknown benchmark (the benchmarks are: gdpa):", what);

  char cache[1024], why[1024];
  b.cache_dir = jit_cache_dir(cache, sizeof cache, why, sizeof why) ? cache : NULL;
  GdpaBenchStatus s = gdpa_bench_run(&b, stdout, why, sizeof why);
  switch (s) {
  case GDPA_BENCH_OK: return GEMC_EXIT_OK;
  case GDPA_BENCH_NO_GPU: fprintf(stderr, "gemc: error: no GPU: %s\n", why); break;
  case GDPA_BENCH_COMPILE_FAILED:
  case GDPA_BENCH_BAD_OUTPUT: fprintf(stderr, "gemc: error: bench gdpa: %s\n", why); break;
  }
  return GEMC_EXIT_USER_ERROR;
}
