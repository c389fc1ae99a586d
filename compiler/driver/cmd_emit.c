// cmd_emit.c: `gemc emit FILE [--arch A] [--emit=cu|plan|ptx|cubin] [-o DIR]`. Compiles the
// model with its backward graph, lowers it to a plan of CUDA kernels (codegen/) and writes the
// stage asked for: with -o, DIR/model.cu and DIR/plan.txt (and DIR/model.ptx or model.cubin
// for those stages, compiled by NVRTC); without -o, the .cu (or the plan) on stdout.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"        // defines: cmd_emit
#include "file_io.h"         // defines: file_write_atomic, file_make_dirs
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "load_model.h"      // defines: load_model
#include "lower.h"           // defines: plan_build
#include "memplan.h"         // defines: memplan_stats
#include "nvrtc_compile.h"   // defines: nvrtc_compile
#include "plan.h"            // defines: plan_print
#include "target.h"          // defines: target_find

static const char emit_usage[] =
    "usage: gemc emit FILE [--arch sm_90a|sm_100a] [--emit=cu|plan|ptx|cubin] [-o DIR] [--stats]\n"
    "                 [--skip-attention]\n";

static int usage(const char *fmt, const char *arg) __attribute__((format(printf, 1, 0)));
static int usage(const char *fmt, const char *arg) {
  fprintf(stderr, "gemc: error: ");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  fprintf(stderr, fmt, arg);
#pragma GCC diagnostic pop
  fprintf(stderr, "\n%s", emit_usage);
  return GEMC_EXIT_USAGE;
}

// DIR/NAME, whole or not at all (a temporary file, fsynced, renamed over it); never the model.
static bool write_file(const char *dir, const char *name, const char *data, size_t size,
                       const char *model) {
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!file_refuse_same(path, model, err, sizeof err) ||
      !file_write_atomic(path, data, size, err, sizeof err)) {
    fprintf(stderr, "gemc: error: %s\n", err);
    return false;
  }
  return true;
}

int cmd_emit(const CliOptions *o) {
  const char *file = NULL, *arch = o->arch, *stage = "cu", *dir = NULL;
  bool stats = false;
  PlanOptions popt = {false};
  for (int i = 0; i < o->nrest; i++) {
    const char *a = o->rest[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("gemc emit: lower a model to CUDA C and a launch plan (docs/codegen.md)\n\n%s", emit_usage);
      return GEMC_EXIT_OK;
    } else if (strncmp(a, "--emit=", 7) == 0) {
      stage = a + 7;
    } else if (strcmp(a, "--emit") == 0 && i + 1 < o->nrest) {
      stage = o->rest[++i];
    } else if (strncmp(a, "--arch=", 7) == 0) {
      arch = a + 7;
    } else if (strcmp(a, "--arch") == 0 && i + 1 < o->nrest) {
      arch = o->rest[++i];
    } else if (strcmp(a, "-o") == 0 && i + 1 < o->nrest) {
      dir = o->rest[++i];
    } else if (strcmp(a, "--stats") == 0) {
      stats = true;
    } else if (strcmp(a, "--skip-attention") == 0) {
      popt.skip_attention = true;
    } else if (a[0] == '-') {
      return usage("unknown or incomplete option '%s' for 'gemc emit'", a);
    } else if (!file) {
      file = a;
    } else {
      return usage("'gemc emit' takes one FILE (extra '%s')", a);
    }
  }
  if (!file) return usage("%s", "'gemc emit' needs a FILE");
  bool cu = strcmp(stage, "cu") == 0, plan_stage = strcmp(stage, "plan") == 0;
  bool ptx = strcmp(stage, "ptx") == 0, cubin = strcmp(stage, "cubin") == 0;
  if (!cu && !plan_stage && !ptx && !cubin)
    return usage("unknown stage '%s' for --emit; the stages are: cu, plan, ptx, cubin", stage);
  if (arch && !target_find(arch)) return usage("unknown --arch '%s'; expected one of: sm_90a, sm_100a", arch);
  if (cubin && !dir) return usage("%s", "--emit=cubin needs -o DIR (a cubin is binary)");

  if (dir) {
    // The output directory is created and probed before any compiling.
    char err[1024];
    if (!file_make_dirs(dir, "output directory", err, sizeof err) ||
        !file_probe_dir(dir, "output directory", err, sizeof err)) {
      fprintf(stderr, "gemc: error: %s\n", err);
      return GEMC_EXIT_USER_ERROR;
    }
  }
  LoadedModel m;
  if (!load_model(&m, file, arch, true, o->quiet, o->werror)) {
    loaded_model_free(&m);
    return GEMC_EXIT_USER_ERROR;
  }
  Diag d;
  diag_init(&d, &m.src, stderr);
  Plan p;
  int rc = GEMC_EXIT_OK;
  if (!plan_build_with(&m.ir, arch, &popt, &m.arena, &d, &p)) {
    loaded_model_free(&m);
    return GEMC_EXIT_USER_ERROR;
  }
  char *plan_text = NULL;
  size_t plan_size = 0;
  FILE *pf = open_memstream(&plan_text, &plan_size);
  if (!pf) gemc_internal_error(__FILE__, __LINE__, "open_memstream failed");
  plan_print(pf, &p);
  fclose(pf);

  char *bin = NULL;
  size_t bin_size = 0;
  if (ptx || cubin) {
    char err[2048];
    if (!nvrtc_compile(p.source, PLAN_SOURCE_NAME, p.target, ptx ? NVRTC_PTX : NVRTC_CUBIN, &bin, &bin_size, NULL,
                       err, sizeof err)) {
      fprintf(stderr, "gemc: error: %s\n", err);
      rc = GEMC_EXIT_USER_ERROR;
    }
  }
  if (rc == GEMC_EXIT_OK && dir) {
    if (!write_file(dir, PLAN_SOURCE_NAME, p.source, strlen(p.source), file) ||
        !write_file(dir, "plan.txt", plan_text, plan_size, file) ||
        (bin && !write_file(dir, ptx ? "model.ptx" : "model.cubin", bin, bin_size, file))) {
      rc = GEMC_EXIT_USER_ERROR;
    }
  } else if (rc == GEMC_EXIT_OK) {
    if (plan_stage) fwrite(plan_text, 1, plan_size, stdout);
    else if (ptx) fwrite(bin, 1, bin_size, stdout);
    else fputs(p.source, stdout);
  }
  if (stats && rc == GEMC_EXIT_OK) {
    MemplanStats s = memplan_stats(&p);
    fprintf(stderr, "%s: %d launches, %d buffers; at the largest batch: planned %lld bytes, one buffer per "
                    "tensor %lld bytes (saved %lld), persistent %lld\n",
            file, p.nlaunches, p.nbuffers, (long long)s.planned_bytes, (long long)s.unshared_bytes,
            (long long)(s.unshared_bytes - s.planned_bytes), (long long)s.persistent_bytes);
  }
  free(bin);
  free(plan_text);
  loaded_model_free(&m);
  return rc;
}
