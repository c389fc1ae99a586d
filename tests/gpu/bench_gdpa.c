// bench_gdpa.c: the standalone GDPA benchmark, the same as `gemc bench gdpa` (runtime/
// gdpa_bench.h) with a cubin cache directory of its own and a compile-only mode.
//   bench_gdpa [--cache DIR] [--compile-only ARCH] [--act ACT] [--reps N] [--quick] [--atomic-dq]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdpa_bench.h"

int main(int argc, char **argv) {
  GdpaBenchOptions o = {.act = ACT_GELU, .reps = 10};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cache") && i + 1 < argc) o.cache_dir = argv[++i];
    else if (!strcmp(argv[i], "--compile-only") && i + 1 < argc) o.compile_only = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) o.quick = true;
    else if (!strcmp(argv[i], "--atomic-dq")) o.atomic_dq = true;
    else if (!strcmp(argv[i], "--act") && i + 1 < argc && act_from_name(argv[i + 1], &o.act)) i++;
    else return fprintf(stderr, "bench_gdpa: unknown or incomplete option '%s'\n", argv[i]), 2;
  }
  if (o.reps < 1) o.reps = 1;
  char err[512];
  GdpaBenchStatus s = gdpa_bench_run(&o, stdout, err, sizeof err);
  if (s == GDPA_BENCH_NO_GPU) fprintf(stderr, "bench_gdpa: no GPU: %s\n", err);
  else if (s != GDPA_BENCH_OK) fprintf(stderr, "bench_gdpa: %s\n", err);
  return s == GDPA_BENCH_OK ? 0 : s == GDPA_BENCH_NO_GPU ? 2 : 1;
}
