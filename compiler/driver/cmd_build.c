// cmd_build.c: `gemc build FILE [--arch sm_90a,sm_100a] -o MODEL.gemb`, the AOT path. Compiles
// the model with its backward graph, lowers it for each arch, compiles each arch's module to a
// cubin with NVRTC (through the kernel cache), and writes one artifact (runtime/gpu/artifact.h)
// that `gemc train --artifact MODEL.gemb` trains from without NVRTC.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"        // defines: Artifact, artifact_write
#include "commands.h"        // defines: cmd_build
#include "file_io.h"         // defines: file_probe_output, file_refuse_same
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "jit_cache.h"       // defines: jit_compile_units
#include "load_model.h"      // defines: load_model
#include "lower.h"           // defines: plan_build
#include "nvrtc_compile.h"   // defines: nvrtc_compile
#include "plan.h"            // defines: plan_print
#include "target.h"          // defines: target_find
#include "train.h"           // defines: train_model_key
#include "version.h"         // defines: GEMC_VERSION

static const char build_usage[] =
    "usage: gemc build FILE [--arch sm_90a,sm_100a] -o MODEL.gemb\n";

static int build_usage_error(const char *what, const char *arg) {
  fprintf(stderr, "gemc: error: %s%s%s\n%s", what, arg ? " " : "", arg ? arg : "", build_usage);
  return GEMC_EXIT_USAGE;
}

// Splits "sm_90a,sm_100a" into at most ARTIFACT_MAX_ARCHS known targets.
static int parse_archs(const char *list, char archs[][16]) {
  int n = 0;
  const char *p = list;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 0 || len >= 16 || n == ARTIFACT_MAX_ARCHS) return -1;
    memcpy(archs[n], p, len);
    archs[n][len] = 0;
    if (!target_find(archs[n])) return -1;
    for (int i = 0; i < n; i++)
      if (strcmp(archs[i], archs[n]) == 0) return -1;
    n++;
    p += len + (comma ? 1 : 0);
    if (comma && !*p) return -1;
  }
  return n;
}

int cmd_build(const CliOptions *o) {
  const char *file = NULL, *archs_arg = "sm_90a,sm_100a", *out = NULL;
  for (int i = 0; i < o->nrest; i++) {
    const char *a = o->rest[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("gemc build: compile a model ahead of time into one artifact (docs/gpu.md)\n\n%s",
             build_usage);
      return GEMC_EXIT_OK;
    } else if (strncmp(a, "--arch=", 7) == 0) {
      archs_arg = a + 7;
    } else if (strcmp(a, "--arch") == 0 && i + 1 < o->nrest) {
      archs_arg = o->rest[++i];
    } else if (strcmp(a, "-o") == 0 && i + 1 < o->nrest) {
      out = o->rest[++i];
    } else if (a[0] == '-') {
      return build_usage_error("unknown or incomplete option for 'gemc build':", a);
    } else if (!file) {
      file = a;
    } else {
      return build_usage_error("'gemc build' takes one FILE; extra:", a);
    }
  }
  if (!file) return build_usage_error("'gemc build' needs a FILE", NULL);
  if (!out) return build_usage_error("'gemc build' needs -o MODEL.gemb", NULL);
  char archs[ARTIFACT_MAX_ARCHS][16];
  int narchs = parse_archs(archs_arg, archs);
  if (narchs <= 0)
    return build_usage_error("--arch needs a comma-separated list of distinct targets from "
                             "sm_90a, sm_100a; got", archs_arg);
  char err[1024];
  // The output is checked before any compiling: its directory takes files, it is no input.
  if (!file_probe_output(out, "artifact", err, sizeof err) ||
      !file_refuse_same(out, file, err, sizeof err)) {
    fprintf(stderr, "gemc: error: %s\n", err);
    return GEMC_EXIT_USER_ERROR;
  }
  if (!nvrtc_available(err, sizeof err)) {
    fprintf(stderr, "gemc: error: gemc build needs NVRTC: %s\n", err);
    return GEMC_EXIT_USER_ERROR;
  }

  // Loaded for the model's own target, as `gemc train` loads it: the key must match.
  LoadedModel m;
  if (!load_model(&m, file, NULL, true, o->quiet, o->werror)) {
    loaded_model_free(&m);
    return GEMC_EXIT_USER_ERROR;
  }
  Artifact a;
  memset(&a, 0, sizeof a);
  snprintf(a.gemc_version, sizeof a.gemc_version, "%s", GEMC_VERSION);
  a.model_key = train_model_key(&m.ir);
  a.model_name = (char *)(uintptr_t)m.ir.model;
  char dir[4096];
  bool cache = jit_cache_dir(dir, sizeof dir, err, sizeof err);
  static const char *const options[] = {"nvrtc_compile defaults", "cubin"};
  int rc = GEMC_EXIT_OK;
  Diag d;
  diag_init(&d, &m.src, stderr);
  JitUnit units[ARTIFACT_MAX_ARCHS];
  memset(units, 0, sizeof units);
  for (int i = 0; i < narchs && rc == GEMC_EXIT_OK; i++) {
    Plan p;
    if (!plan_build(&m.ir, archs[i], &m.arena, &d, &p)) {
      rc = GEMC_EXIT_USER_ERROR;
      break;
    }
    ArtifactCubin *c = &a.cubins[a.ncubins++];
    memcpy(c->arch, archs[i], sizeof c->arch);
    size_t n = 0;
    FILE *f = open_memstream(&c->plan_text, &n);
    if (!f) gemc_internal_error(__FILE__, __LINE__, "open_memstream failed");
    plan_print(f, &p);
    fclose(f);
    c->source = (char *)(uintptr_t)p.source;
    JitRequest r = {.arch = archs[i], .options = options, .noptions = 2,
                    .compiler_version = nvrtc_version(), .gemc_version = GEMC_VERSION,
                    .cache_dir = cache ? dir : NULL, .compile = nvrtc_compile_unit, .threads = 1};
    units[i] = (JitUnit){.name = "module", .source = p.source};
    JitStats st;
    char jerr[8192];
    if (!jit_compile_units(&r, &units[i], 1, &st, jerr, sizeof jerr)) {
      fprintf(stderr, "gemc: error: %s\n", jerr);
      rc = GEMC_EXIT_USER_ERROR;
      break;
    }
    c->image = units[i].image;
    c->size = units[i].size;
    if (!o->quiet)
      printf("gemc build: %s for %s: %d launches, cubin %zu bytes (%s %.2f s)\n", m.ir.model,
             archs[i], p.nlaunches, c->size, units[i].from_cache ? "cached," : "compiled in",
             units[i].seconds);
  }
  if (rc == GEMC_EXIT_OK) {
    if (!artifact_write(out, &a, err, sizeof err)) {
      fprintf(stderr, "gemc: error: %s\n", err);
      rc = GEMC_EXIT_USER_ERROR;
    } else if (!o->quiet) {
      printf("gemc build: wrote %s (model key %016llx, gemc %s)\n", out,
             (unsigned long long)a.model_key, GEMC_VERSION);
    }
  }
  for (int i = 0; i < a.ncubins; i++) free(a.cubins[i].plan_text);
  jit_units_free(units, narchs);
  loaded_model_free(&m);
  return rc;
}
