// train_gpu.c: the GpuSession of train_gpu.h: device, plan, kernels (JIT with the disk cache,
// in parallel per kernel when there are many, or an artifact's cubin), and the GpuExec.
#include "train_gpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "artifact.h"
#include "checked.h"
#include "cuda_driver.h"
#include "diag.h"
#include "gpu_exec.h"
#include "jit_cache.h"
#include "lower.h"
#include "memplan.h"
#include "nvrtc_compile.h"
#include "plan.h"
#include "version.h"

// Below this many kernels one module compile beats the split's repeated prelude.
enum { SPLIT_MIN_KERNELS = 8 };

struct GpuSession {
  CudaContext ctx;
  bool ctx_open;
  Arena arena;
  Plan plan;
  GpuExec *x;
  JitUnit *units;
  int nunits;
  bool own_sources;  // units[i].source are the split's strings
  int nkernels;
  double cold, warm;
  char device[256];
  CUevent event;     // gpu_session_event
};

static char *plan_text(const Plan *p) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) return NULL;
  plan_print(f, p);
  fclose(f);
  return buf;
}

// Compiles the plan's source for the session's arch through the cache: one unit per kernel
// when there are many (in parallel), else the whole module; the split falls back to the whole
// module when a kernel needs something defined between kernels.
static bool jit_kernels(GpuSession *s, FILE *log, char *err, size_t err_size) {
  char reason[512];
  if (!nvrtc_available(reason, sizeof reason))
    return fail(err, err_size, "NVRTC is needed to compile the kernels (or use --artifact): %s",
                reason);
  char dir[4096];
  bool cache = jit_cache_dir(dir, sizeof dir, reason, sizeof reason);
  if (!cache && log) fprintf(log, "  (no kernel cache: %s)\n", reason);
  static const char *const options[] = {"nvrtc_compile defaults", "cubin"};
  JitRequest r = {.arch = s->ctx.arch, .options = options, .noptions = 2,
                  .compiler_version = nvrtc_version(), .gemc_version = GEMC_VERSION,
                  .cache_dir = cache ? dir : NULL, .compile = nvrtc_compile_unit};
  char **parts = NULL;
  int nparts = jit_split_source(s->plan.source, &parts);
  s->nkernels = nparts;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  bool split = nparts >= SPLIT_MIN_KERNELS && cpus > 1 && getenv("GEMC_JIT_ONE_MODULE") == NULL;
  JitStats st = {0};
  char jerr[8192];
  bool ok = false;
  if (split) {
    s->units = calloc((size_t)nparts, sizeof *s->units);
    s->nunits = nparts;
    for (int i = 0; i < nparts; i++) {
      s->units[i].source = parts[i];
      s->units[i].name = "kernel";  // named by its text in the log
    }
    ok = jit_compile_units(&r, s->units, nparts, &st, jerr, sizeof jerr);
    if (!ok && log)
      fprintf(log, "  (per-kernel compile failed, compiling the module whole)\n");
    if (!ok) {
      free(s->units);
      s->units = NULL;
    }
  }
  if (!ok) {
    s->units = calloc(1, sizeof *s->units);
    s->nunits = 1;
    s->units[0] = (JitUnit){.name = "module", .source = s->plan.source};
    ok = jit_compile_units(&r, s->units, 1, &st, jerr, sizeof jerr);
  }
  if (ok) {
    s->cold = st.misses > 0 ? st.seconds : NAN;
    // The warm time: the same units again, from the cache.
    JitUnit *again = calloc((size_t)s->nunits, sizeof *again);
    for (int i = 0; i < s->nunits; i++) again[i] = (JitUnit){.name = s->units[i].name,
                                                             .source = s->units[i].source};
    JitStats w;
    if (cache && jit_compile_units(&r, again, s->nunits, &w, jerr, sizeof jerr)) {
      s->warm = w.seconds;
      if (isnan(s->cold) && st.hits == s->nunits) s->warm = st.seconds < w.seconds ? st.seconds
                                                                                    : w.seconds;
    } else {
      s->warm = NAN;
    }
    jit_units_free(again, s->nunits);
    free(again);
    if (log) {
      fprintf(log, "  kernels  %d in %d NVRTC unit%s for %s (NVRTC %d.%d): ", nparts, s->nunits,
              s->nunits == 1 ? "" : "s", s->ctx.arch, nvrtc_version() / 1000,
              nvrtc_version() % 1000 / 10);
      if (isnan(s->cold)) fprintf(log, "cold compile skipped (cache hit)");
      else fprintf(log, "cold compile %.2f s", s->cold);
      if (!isnan(s->warm)) fprintf(log, ", warm (cache) %.3f s", s->warm);
      fprintf(log, "\n");
    }
  }
  // The per-kernel sources live on in s->units when the split was used (freed in close).
  s->own_sources = ok && split && s->nunits > 1;
  if (!s->own_sources)
    for (int i = 0; i < nparts; i++) free(parts[i]);
  free(parts);
  if (!ok) return fail(err, err_size, "%s", jerr);
  return true;
}

static bool from_artifact(GpuSession *s, const GpuSessionOptions *o, const Ir *ir, FILE *log,
                          char *err, size_t err_size) {
  Artifact a;
  char reason[1024];
  if (!artifact_read(o->artifact, &a, reason, sizeof reason))
    return fail(err, err_size, "%s", reason);
  const ArtifactCubin *c = NULL;
  if (!artifact_check(&a, o->model_key, ir->model, GEMC_VERSION, s->ctx.arch, &c, reason,
                      sizeof reason)) {
    artifact_free(&a);
    return fail(err, err_size, "%s: %s", o->artifact, reason);
  }
  // The plan is rebuilt (deterministic, no NVRTC) and must be the one the cubin was made for.
  char *text = plan_text(&s->plan);
  bool same = text && strcmp(text, c->plan_text) == 0 && strcmp(s->plan.source, c->source) == 0;
  free(text);
  if (!same) {
    artifact_free(&a);
    return fail(err, err_size, "%s: its plan for %s differs from the one this gemc builds for "
                "the model; rebuild it with `gemc build`", o->artifact, s->ctx.arch);
  }
  s->units = calloc(1, sizeof *s->units);
  s->nunits = 1;
  s->units[0].name = "artifact";
  s->units[0].image = malloc(c->size);
  memcpy(s->units[0].image, c->image, c->size);
  s->units[0].size = c->size;
  s->cold = s->warm = NAN;
  char **parts = NULL;
  s->nkernels = jit_split_source(s->plan.source, &parts);
  for (int i = 0; i < s->nkernels; i++) free(parts[i]);
  free(parts);
  if (log)
    fprintf(log, "  kernels  %d from artifact %s (%s cubin, %zu bytes; no NVRTC)\n", s->nkernels,
            o->artifact, c->arch, c->size);
  artifact_free(&a);
  return true;
}

GpuSession *gpu_session_open(const Ir *ir, CpuExec *init, const GpuSessionOptions *o,
                             char *err, size_t err_size) {
  GpuSession *s = calloc(1, sizeof *s);
  char reason[1024];
  if (!cuda_context_open(&s->ctx, -1, reason, sizeof reason)) {
    fail(err, err_size, "no usable GPU: %s", reason);
    goto bad;
  }
  s->ctx_open = true;
  snprintf(s->device, sizeof s->device, "%s (%s, %d SMs, %.0f GiB)", s->ctx.name, s->ctx.arch,
           s->ctx.sm_count, (double)s->ctx.total_mem / (1 << 30));
  if (strcmp(s->ctx.arch, "sm_90a") != 0 && strcmp(s->ctx.arch, "sm_100a") != 0) {
    fail(err, err_size, "gemc generates code for sm_90a and sm_100a; this GPU (%s) is %s",
         s->ctx.name, s->ctx.arch);
    goto bad;
  }
  Diag d;
  diag_init(&d, NULL, stderr);
  if (!plan_build(ir, s->ctx.arch, &s->arena, &d, &s->plan)) {
    fail(err, err_size, "code generation failed for %s (see the messages above)", s->ctx.arch);
    goto bad;
  }
  // Before compiling or allocating anything: do the plan's buffers fit the GPU's free memory?
  size_t free_bytes = 0, total_bytes = 0;
  if (CU_CHECK(cuda_driver()->cuMemGetInfo(&free_bytes, &total_bytes)) &&
      !plan_check_fit(&s->plan, s->device, (int64_t)free_bytes, err, err_size))
    goto bad;
  if (o->log) {  // what @schedule(recompute = true) trades: the step's memory at its batch
    MemplanStats ms = memplan_stats(&s->plan);
    fprintf(o->log, "  memory   %.2f GiB planned at batch %lld, %.2f GiB of it persistent "
            "(parameters, tables, gradients, optimizer state); %.1f GiB free\n",
            (double)ms.planned_bytes / (1u << 30), (long long)ir->batch,
            (double)ms.persistent_bytes / (1u << 30), (double)free_bytes / (1u << 30));
  }
  if (o->artifact ? !from_artifact(s, o, ir, o->log, err, err_size)
                  : !jit_kernels(s, o->log, err, err_size))
    goto bad;
  const void **images = calloc((size_t)s->nunits, sizeof *images);
  for (int i = 0; i < s->nunits; i++) images[i] = s->units[i].image;
  const char *graphs_env = getenv("GEMC_CUDA_GRAPHS");
  const char *sync_env = getenv("GEMC_CUDA_SYNC");
  GpuExecOptions xo = {.max_batch = o->max_batch,
                       .graphs = o->graphs && !(graphs_env && strcmp(graphs_env, "0") == 0),
                       .sync_each_launch = sync_env && strcmp(sync_env, "1") == 0};
  s->x = gpu_exec_new(&s->plan, &s->ctx, (const void *const *)images, s->nunits, &xo, reason,
                      sizeof reason);
  free(images);
  if (!s->x) {
    fail(err, err_size, "%s", reason);
    goto bad;
  }
  if (!gpu_exec_upload_params(s->x, init, reason, sizeof reason)) {
    fail(err, err_size, "uploading the parameters: %s", reason);
    goto bad;
  }
  return s;
bad:
  gpu_session_close(s);
  return NULL;
}

void gpu_session_close(GpuSession *s) {
  if (!s) return;
  if (s->event) cuda_driver()->cuEventDestroy(s->event);
  gpu_exec_free(s->x);
  if (s->units) {
    for (int i = 0; s->own_sources && i < s->nunits; i++)
      free((char *)(uintptr_t)s->units[i].source);
    jit_units_free(s->units, s->nunits);
    free(s->units);
  }
  if (s->ctx_open) cuda_context_close(&s->ctx);
  arena_free(&s->arena);
  free(s);
}

bool gpu_session_set_batch(GpuSession *s, const Batch *b, char *err, size_t err_size) {
  return gpu_exec_set_batch(s->x, b, err, err_size);
}

bool gpu_session_stage(const GpuSession *s, const Batch *b, GpuStaged *st, char *err,
                       size_t err_size) {
  return gpu_stage_batch(gpu_exec_layout(s->x), b, st, err, err_size);
}

bool gpu_session_set_staged(GpuSession *s, const GpuStaged *st, char *err, size_t err_size) {
  return gpu_exec_set_staged(s->x, st, err, err_size);
}

bool gpu_session_profile(GpuSession *s, bool on, char *err, size_t err_size) {
  return gpu_exec_profile(s->x, on, err, err_size);
}

const GpuLaunchProfile *gpu_session_profile_totals(const GpuSession *s, int64_t *steps) {
  return gpu_exec_profile_totals(s->x, steps);
}

const Plan *gpu_session_plan(const GpuSession *s) { return &s->plan; }

bool gpu_session_launch(GpuSession *s, bool train, int64_t step, char *err, size_t err_size) {
  return gpu_exec_launch(s->x, train ? GPU_TRAIN : GPU_FORWARD, step, err, err_size);
}

bool gpu_session_launch_grads(GpuSession *s, char *err, size_t err_size) {
  return gpu_exec_launch(s->x, GPU_FORWARD | GPU_BACKWARD, 0, err, err_size);
}

bool gpu_session_launch_update(GpuSession *s, int64_t step, char *err, size_t err_size) {
  return gpu_exec_launch(s->x, GPU_OPTIMIZER, step, err, err_size);
}

bool gpu_session_check_finite(GpuSession *s, bool grads, int *tensor, int *slot, int64_t *nan,
                              int64_t *inf, int64_t *numel, char *err, size_t err_size) {
  GpuNonFinite f;
  if (!gpu_exec_check_finite(s->x, grads, &f, err, err_size)) return false;
  *tensor = f.tensor;
  *slot = f.slot;
  *nan = f.nan;
  *inf = f.inf;
  *numel = f.numel;
  return true;
}

bool gpu_session_finish(GpuSession *s, double *loss, char *err, size_t err_size) {
  return gpu_exec_finish(s->x, loss, err, err_size);
}

const float *gpu_session_probs(const GpuSession *s, int task) {
  return gpu_exec_task_probs(s->x, task);
}

bool gpu_session_download(GpuSession *s, CpuExec *x, char *err, size_t err_size) {
  return gpu_exec_download_params(s->x, x, err, err_size);
}

bool gpu_session_upload(GpuSession *s, CpuExec *x, char *err, size_t err_size) {
  return gpu_exec_upload_params(s->x, x, err, err_size);
}

bool gpu_session_download_optstate(GpuSession *s, int tensor, OptimState *st, char *err,
                                   size_t err_size) {
  return gpu_exec_download_optstate(s->x, tensor, st, err, err_size);
}

bool gpu_session_upload_optstate(GpuSession *s, int tensor, const OptimState *st, char *err,
                                 size_t err_size) {
  return gpu_exec_upload_optstate(s->x, tensor, st, err, err_size);
}

void gpu_session_set_launch_hook(GpuSession *s, GpuLaunchHook hook, void *ctx) {
  gpu_exec_set_launch_hook(s->x, hook, ctx);
}

void *gpu_session_event(GpuSession *s, char *err, size_t err_size) {
  if (!s->event && !CU_CHECK(cuda_driver()->cuEventCreate(&s->event, CU_EVENT_DISABLE_TIMING))) {
    fail(err, err_size, "creating an event: %s", cuda_last_error());
    s->event = NULL;
  }
  return s->event;
}

bool gpu_session_record(GpuSession *s, char *err, size_t err_size) {
  return gpu_session_event(s, err, err_size) && gpu_exec_record(s->x, s->event, err, err_size);
}

bool gpu_session_grad(const GpuSession *s, int param, void **ptr, int64_t *numel,
                      int *last_launch) {
  CUdeviceptr p;
  if (!gpu_exec_grad(s->x, param, &p, numel, last_launch)) return false;
  *ptr = (void *)(uintptr_t)p;
  return true;
}

bool gpu_session_read_rows(GpuSession *s, int t, int64_t **ids, float **vals, int64_t *n,
                           char *err, size_t err_size) {
  return gpu_exec_read_rows(s->x, t, ids, vals, n, err, err_size);
}

bool gpu_session_write_rows(GpuSession *s, int t, const int64_t *ids, const float *vals,
                            int64_t n, char *err, size_t err_size) {
  return gpu_exec_write_rows(s->x, t, ids, vals, n, err, err_size);
}

const char *gpu_session_device(const GpuSession *s) { return s->device; }
const char *gpu_session_arch(const GpuSession *s) { return s->ctx.arch; }
double gpu_session_compile_cold(const GpuSession *s) { return s->cold; }
double gpu_session_compile_warm(const GpuSession *s) { return s->warm; }
int gpu_session_kernels(const GpuSession *s) { return s->nkernels; }
double gpu_session_device_ms(const GpuSession *s) {
  GpuExecStats st;
  gpu_exec_stats(s->x, &st);
  return st.device_ms;
}
