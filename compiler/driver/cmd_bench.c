// cmd_bench.c: `gemc bench gdpa [--act ACT] [--reps N] [--quick] [--lengths FILE]... [--deal D]
// [--atomic-dq]`,
// the GDPA benchmark of the generated attention kernels (runtime/bench/gdpa_bench.h,
// docs/gdpa_bench.md): forward and backward TFLOP/s over the real jagged lengths on three
// definitions of the public shapes side by side (Meta's self s, jagged self, cross KV=256),
// cross KV=16 and PMA, with the tile spread and Meta's Triton numbers beside each row, or on the
// batches of lengths files (one `lq lk` pair a line, read before any GPU work; a bad one is
// `FILE:LINE: error: ...`, exit 1); and `gemc bench gemm [--model FILE]... [--reps N]
// [--compile-only ARCH]`, cuBLASLt against the generated bf16 GEMM (runtime/bench/gemm_bench.h,
// docs/perf.md) on the GEMM launches of the models' training plans (B the model's batch, every
// jagged total B * max / 2) and on 4096^3 and 8192^3. Both need a GPU (gemm's --compile-only
// does not); without one they say why and exit 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"             // defines: CliOptions
#include "commands.h"        // defines: cmd_bench
#include "gdpa_bench.h"      // defines: gdpa_bench_run
#include "gdpa_case.h"       // defines: GdpaLengths, gdpa_lengths_read
#include "gemm_bench.h"      // defines: gemm_bench_run, gemm_bench_shapes_from_plan
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "jit_cache.h"       // defines: jit_cache_dir
#include "load_model.h"      // defines: load_model
#include "lower.h"           // defines: plan_build_with
#include "target.h"          // defines: target_find

static const char bench_usage[] =
    "usage: gemc bench gdpa [--act gelu|gelu_taylor|silu|softmax|...] [--reps N] [--quick]\n"
    "                       [--lengths FILE]... [--deal lpt|zigzag] [--atomic-dq]\n"
    "       gemc bench gemm [--model FILE]... [--reps N] [--compile-only sm_90a|sm_100a]\n";

static int bench_usage_error(const char *what, const char *arg) {
  fprintf(stderr, "gemc: error: %s%s%s\n%s", what, arg ? " " : "", arg ? arg : "", bench_usage);
  return GEMC_EXIT_USAGE;
}

static void print_bench_help(void) {
  printf("gemc bench: measure the generated kernels on the GPU (docs/gdpa_bench.md)\n\n%s\n"
         "  gdpa            GDPA forward and backward TFLOP/s, B=1152, H=4, d=128, bf16, N in\n"
         "                  {512, 1024, 2048}: Meta's self s (lq ~ U[max(1,(2s-1)N), N], lk = N;\n"
         "                  s in {0.5, 1.0}), jagged self (lq = lk ~ U[1, N]) and cross KV=256\n"
         "                  side by side, then cross KV=16 and PMA with 16 and 32 seeds over\n"
         "                  lognormal kv up to 4096; each row with its tile spread and Meta's\n"
         "                  Triton numbers where known (issue 10's table, not this run)\n"
         "  --act ACT       the activation of the main table (default gelu, as Triton's)\n"
         "  --reps N        timed runs per cell (default 10; 1 to 1000)\n"
         "  --quick         the three definitions at N=1024 only, and no extra sections\n"
         "  --lengths FILE  time the batch of FILE instead (one 'lq lk' pair a line, '#'\n"
         "                  comments); repeatable, one row per file\n"
         "  --deal D        how persistent kernels' tiles are dealt: lpt (default) or zigzag\n"
         "  --atomic-dq     the backward as @schedule(deterministic = false) emits it: dQ added\n"
         "                  with float atomics inside the dK/dV kernel (sm_90a, head dim 128)\n"
         "  gemm            cuBLASLt against the generated bf16 GEMM (kernels/gemm.cuh, docs/perf.md)\n"
         "                  on every GEMM launch of the models' training plans, B = the model's batch\n"
         "                  and each jagged total T = B * max / 2, then 4096^3 and 8192^3\n"
         "  --model FILE    a model whose plan gives shapes (repeatable; default models/gem_small.gem\n"
         "                  and models/hstu.gem)\n"
         "  --reps N        timed samples per shape and side, median (default 20; 1 to 1000)\n"
         "  --compile-only ARCH   compile the GEMM kernels for ARCH and run nothing (no GPU needed)\n",
         bench_usage);
}

// MAX_REPS: --reps's range is [1, MAX_REPS] (docs/cli.md), for both benchmarks.
enum { MAX_BENCH_MODELS = 8, MAX_GEMM_SHAPES = 512, MAX_REPS = 1000, MAX_LENGTHS_FILES = 16 };

static const char *const default_gemm_models[] = {"models/gem_small.gem", "models/hstu.gem"};
static const int64_t square_sizes[] = {4096, 8192};

// The model's name for the table: the file name without directory and extension.
static void model_label(const char *path, char *out, size_t size) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strcspn(base, ".");
  if (n >= size) n = size - 1;
  memcpy(out, base, n);
  out[n] = '\0';
}

// Appends the GEMMs of one model's plan; prints how its sizes were evaluated. False (with the
// front end's messages on stderr) when the model does not compile.
static bool add_model_shapes(const CliOptions *o, const char *path, GemmBenchShape *shapes,
                             int *n) {
  LoadedModel m;
  if (!load_model(&m, path, NULL, true, true, o->werror)) {
    loaded_model_free(&m);
    return false;
  }
  Diag d;
  diag_init(&d, &m.src, stderr);
  Plan p;
  PlanOptions popt = {.skip_attention = true};  // attention lowers to kernels, never to GEMMs
  bool ok = plan_build_with(&m.ir, NULL, &popt, &m.arena, &d, &p);
  if (ok) {
    int64_t totals[64] = {0};
    char label[32];
    model_label(path, label, sizeof label);
    printf("%s: B = %lld", label, (long long)m.ir.batch);
    for (int j = 0; j < m.ir.njagged && j < 64; j++) {
      totals[j] = m.ir.batch * m.ir.jagged[j].max_len / 2;
      printf(", T_%s = B * %lld / 2 = %lld", m.ir.jagged[j].name, (long long)m.ir.jagged[j].max_len,
             (long long)totals[j]);
    }
    int skipped = gemm_bench_shapes_from_plan(&p, label, m.ir.batch, totals, shapes, n,
                                              MAX_GEMM_SHAPES - 2);
    printf("%s\n", skipped ? " (some GEMMs are not bf16 and are left out)" : "");
  }
  loaded_model_free(&m);
  return ok;
}

// Reads the lengths files and runs the GDPA benchmark; a bad file is the user's error, before
// any GPU work.
static int bench_gdpa(GdpaBenchOptions *b, const char *const *files, int nfiles) {
  static GdpaLengths lengths[MAX_LENGTHS_FILES];
  char cache[1024], err[1024];
  for (int i = 0; i < nfiles; i++) {
    if (!gdpa_lengths_read(files[i], &lengths[i], err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      for (int j = 0; j < i; j++) gdpa_lengths_free(&lengths[j]);
      return GEMC_EXIT_USER_ERROR;
    }
  }
  b->lengths = lengths, b->lengths_names = files, b->nlengths = nfiles;
  b->cache_dir = jit_cache_dir(cache, sizeof cache, err, sizeof err) ? cache : NULL;
  fflush(stdout);
  GdpaBenchStatus s = gdpa_bench_run(b, stdout, err, sizeof err);
  for (int i = 0; i < nfiles; i++) gdpa_lengths_free(&lengths[i]);
  switch (s) {
  case GDPA_BENCH_OK: return GEMC_EXIT_OK;
  case GDPA_BENCH_NO_GPU: fprintf(stderr, "gemc: error: no GPU: %s\n", err); break;
  case GDPA_BENCH_COMPILE_FAILED:
  case GDPA_BENCH_CUDA_FAILED:
  case GDPA_BENCH_BAD_OUTPUT: fprintf(stderr, "gemc: error: bench gdpa: %s\n", err); break;
  }
  return GEMC_EXIT_USER_ERROR;
}

static int bench_gemm(const CliOptions *o, const char *const *models, int nmodels, int reps,
                      const char *compile_only) {
  if (compile_only && !target_find(compile_only))
    return bench_usage_error("unknown --compile-only arch (sm_90a, sm_100a):", compile_only);
  static GemmBenchShape shapes[MAX_GEMM_SHAPES];
  int n = 0;
  for (int i = 0; i < nmodels; i++)
    if (!add_model_shapes(o, models[i], shapes, &n)) return GEMC_EXIT_USER_ERROR;
  for (size_t i = 0; i < sizeof square_sizes / sizeof *square_sizes; i++) {
    GemmBenchShape s = {.source = "square", .m = square_sizes[i], .n = square_sizes[i],
                        .k = square_sizes[i], .act = ACT_NONE, .out = DT_BF16, .count = 1};
    shapes[n++] = s;
  }
  char cache[1024], err[1024];
  GemmBenchOptions b = {.shapes = shapes, .nshapes = n, .reps = reps,
                        .compile_only = compile_only};
  b.cache_dir = jit_cache_dir(cache, sizeof cache, err, sizeof err) ? cache : NULL;
  fflush(stdout);
  switch (gemm_bench_run(&b, stdout, err, sizeof err)) {
  case GEMM_BENCH_OK: return GEMC_EXIT_OK;
  case GEMM_BENCH_NO_GPU: fprintf(stderr, "gemc: error: no GPU: %s\n", err); break;
  case GEMM_BENCH_COMPILE_FAILED:
  case GEMM_BENCH_CUDA_FAILED:
  case GEMM_BENCH_BAD_OUTPUT: fprintf(stderr, "gemc: error: bench gemm: %s\n", err); break;
  }
  return GEMC_EXIT_USER_ERROR;
}

int cmd_bench(const CliOptions *o) {
  GdpaBenchOptions b = {.act = ACT_GELU, .reps = 10};
  const char *what = NULL, *compile_only = NULL, *models[MAX_BENCH_MODELS];
  const char *lengths_files[MAX_LENGTHS_FILES];
  int nmodels = 0, nlengths = 0;
  bool reps_given = false, gdpa_only = false;
  for (int i = 0; i < o->nrest; i++) {
    const char *a = o->rest[i];
    const char *value = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_bench_help();
      return GEMC_EXIT_OK;
    } else if (strcmp(a, "--quick") == 0) {
      b.quick = gdpa_only = true;
    } else if (strcmp(a, "--atomic-dq") == 0) {
      b.atomic_dq = gdpa_only = true;
    } else if (strncmp(a, "--act", 5) == 0 && (a[5] == '=' || a[5] == '\0')) {
      value = a[5] == '=' ? a + 6 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      if (!value) return bench_usage_error("--act needs a value", NULL);
      if (!act_from_name(value, &b.act)) return bench_usage_error("unknown activation", value);
      gdpa_only = true;
    } else if (strncmp(a, "--model", 7) == 0 && (a[7] == '=' || a[7] == '\0')) {
      value = a[7] == '=' ? a + 8 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      if (!value || !*value) return bench_usage_error("--model needs a file", NULL);
      if (nmodels == MAX_BENCH_MODELS) return bench_usage_error("too many --model files:", value);
      models[nmodels++] = value;
    } else if (strncmp(a, "--lengths", 9) == 0 && (a[9] == '=' || a[9] == '\0')) {
      value = a[9] == '=' ? a + 10 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      if (!value || !*value) return bench_usage_error("--lengths needs a file", NULL);
      if (nlengths == MAX_LENGTHS_FILES)
        return bench_usage_error("too many --lengths files (at most 16):", value);
      lengths_files[nlengths++] = value;
      gdpa_only = true;
    } else if (strncmp(a, "--deal", 6) == 0 && (a[6] == '=' || a[6] == '\0')) {
      value = a[6] == '=' ? a + 7 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      if (!value) return bench_usage_error("--deal needs lpt or zigzag", NULL);
      if (strcmp(value, "lpt") != 0 && strcmp(value, "zigzag") != 0)
        return bench_usage_error("--deal takes lpt or zigzag, not", value);
      b.deal_zigzag = strcmp(value, "zigzag") == 0;
      gdpa_only = true;
    } else if (strncmp(a, "--compile-only", 14) == 0 && (a[14] == '=' || a[14] == '\0')) {
      value = a[14] == '=' ? a + 15 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      if (!value || !*value) return bench_usage_error("--compile-only needs an arch", NULL);
      compile_only = value;
    } else if (strncmp(a, "--reps", 6) == 0 && (a[6] == '=' || a[6] == '\0')) {
      value = a[6] == '=' ? a + 7 : i + 1 < o->nrest ? o->rest[++i] : NULL;
      char msg[256];
      int64_t reps;
      if (!value) {
        snprintf(msg, sizeof msg, "--reps needs a value: a whole number in [1, %d]", MAX_REPS);
        return bench_usage_error(msg, NULL);
      }
      if (!cli_parse_count("--reps", value, 1, MAX_REPS, &reps, msg, sizeof msg))
        return bench_usage_error(msg, NULL);
      b.reps = (int)reps;
      reps_given = true;
    } else if (a[0] == '-') {
      return bench_usage_error("unknown option for 'gemc bench':", a);
    } else if (!what) {
      what = a;
    } else {
      return bench_usage_error("unexpected argument", a);
    }
  }
  if (!what) return bench_usage_error("say what to benchmark:", "gdpa or gemm");
  if (strcmp(what, "gemm") == 0) {
    if (gdpa_only)
      return bench_usage_error("--act, --quick, --lengths, --deal and --atomic-dq are options of",
                               "'gemc bench gdpa'");
    if (nmodels == 0)
      for (size_t i = 0; i < sizeof default_gemm_models / sizeof *default_gemm_models; i++)
        models[nmodels++] = default_gemm_models[i];
    return bench_gemm(o, models, nmodels, reps_given ? b.reps : 20, compile_only);
  }
  if (strcmp(what, "gdpa") != 0)
    return bench_usage_error("unknown benchmark (the benchmarks are: gdpa, gemm):", what);
  if (nmodels > 0 || compile_only)
    return bench_usage_error("--model and --compile-only are options of", "'gemc bench gemm'");

  if (b.quick && nlengths > 0)
    return bench_usage_error("--quick does not go with --lengths:",
                             "the files' batches are all it times");
  return bench_gdpa(&b, lengths_files, nlengths);
}
