// tune_gpu.c: the GPU half of the attention autotuner (tune.h, docs/tuning.md). For each
// tunable node it emits every candidate through the GDPA harness (gdpa_case.h: the compiler's
// choice with its backward, every other candidate its forward alone), compiles them as NVRTC
// units in parallel through the JIT cache, and times them on one batch drawn like the model's
// synthetic data: TUNE_ROUNDS rounds of a warm-up and `reps` timed forwards per candidate,
// the best round kept. A candidate whose output differs from the compiler's choice's is
// dropped. The fastest wins if it beats the compiler's choice by more than TUNE_MARGIN; the
// winner is cached (tune.c) and applied to the caller's schedules.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"          // defines: Arena, arena_free
#include "checked.h"        // defines: fail, xcalloc, xmalloc
#include "clock.h"
#include "gdpa_gpu.h"       // defines: gdpa_gpu_*, GdpaBatch, gdpa_batch_*, GdpaRange, gdpa_run_range
#include "jit_cache.h"      // defines: JitRequest, JitUnit, jit_compile_units
#include "numerics.h"       // defines: bf16_decode, fp16_decode
#include "nvrtc_compile.h"  // defines: nvrtc_available, nvrtc_version, nvrtc_compile_unit
#include "tune.h"
#include "version.h"        // defines: GEMC_VERSION

enum { TUNE_ROUNDS = 2, WARMUPS = 2, CHECK_ELEMS = 1 << 22 };
// A candidate must be this much faster than the compiler's choice to replace it, so that noise
// does not move a schedule between runs.
#define TUNE_MARGIN 0.02
// The largest relative L2 difference of a candidate's forward output from the compiler's
// choice's (both round P to bf16 or fp16, in other orders).
#define TUNE_TOLERANCE 2e-2

// Fills a bf16 or fp16 tensor with hashed values (bf16 bits: read as fp16 they are finite too,
// between 0.5 and 2 in magnitude), on the device.
static const char *const fill_kernel =
    "\nextern \"C\" __global__ void tune_fill(bf16_t *p, i64 n, unsigned seed, float amp) {\n"
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  unsigned x = (unsigned)i * 2654435761u ^ seed;\n"
    "  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;\n"
    "  float u = (float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;\n"
    "  p[i] = (bf16_t)(attn_pack_bf16(u * amp, 0.0f) & 0xffffu);\n"
    "}\n";

// --- one node's candidates, built ---------------------------------------------------------

typedef struct Built {
  Arena arena;
  GdpaEmitted e;
  char *source;   // NULL when the emitter refused the candidate
  void *module;   // NULL until loaded
  char why[256];  // why it is out: refused, failed to compile, wrong output
} Built;

// What was measured for one node.
typedef struct Timing {
  double fwd_ms[TUNE_MAX_CANDIDATES];  // the best round's mean; NAN when not timed
  double rel_err[TUNE_MAX_CANDIDATES];
  bool good[TUNE_MAX_CANDIDATES];
  double bwd_ms;
  int winner;
  double seconds;
} Timing;

static void emit_candidate(const TuneOp *op, int i, Built *b) {
  GdpaCase c;
  GdpaEmitOptions x;
  tune_case(op, i, &c, &x);
  StrBuf src = {0};
  if (!gdpa_case_emit_with(&c, &x, op->batch, "t.", &b->arena, &src, &b->e)) {
    snprintf(b->why, sizeof b->why, "refused by the attention emitter");
  } else {
    if (i == op->def) sb_puts(&src, fill_kernel);
    b->source = sb_take(&src);
  }
  sb_free(&src);
}

// Compiles every emitted candidate, all in parallel, or one by one when that fails (to keep
// the ones that compile). The images go into units[i].
static void compile_candidates(const TuneOp *op, Built *b, JitUnit *units, const char *cache_dir) {
  static const char *const options[] = {"nvrtc_compile defaults", "cubin"};
  JitRequest r = {.arch = op->arch, .options = options, .noptions = 2,
                  .compiler_version = nvrtc_version(), .gemc_version = GEMC_VERSION,
                  .cache_dir = cache_dir, .compile = nvrtc_compile_unit};
  JitUnit all[TUNE_MAX_CANDIDATES];
  int index[TUNE_MAX_CANDIDATES], n = 0;
  for (int i = 0; i < op->ncand; i++)
    if (b[i].source) {
      all[n] = (JitUnit){.name = "tune candidate", .source = b[i].source};
      index[n++] = i;
    }
  JitStats st;
  char err[1024];
  if (n > 0 && jit_compile_units(&r, all, n, &st, err, sizeof err)) {
    for (int j = 0; j < n; j++) units[index[j]] = all[j];
    return;
  }
  r.threads = 1;
  for (int j = 0; j < n; j++) {
    JitUnit *u = &units[index[j]];
    *u = (JitUnit){.name = "tune candidate", .source = b[index[j]].source};
    if (!jit_compile_units(&r, u, 1, &st, err, sizeof err))
      snprintf(b[index[j]].why, sizeof b[index[j]].why, "NVRTC failed: %.200s", u->log);
  }
}

// --- timing -------------------------------------------------------------------------------

// The first CHECK_ELEMS values of tensor t as floats (*n of them, malloc'd into *out).
static bool read_output(GdpaBatch *bt, int t, float **out, size_t *n, char *err,
                        size_t err_size) {
  DType dt = bt->e->ir.tensors[t].dtype;
  size_t width = dt == DT_F32 ? 4 : 2, count = bt->tensor_bytes[t] / width;
  if (count > CHECK_ELEMS) count = CHECK_ELEMS;
  unsigned char *raw = xmalloc(count * width + 4);
  float *x = xmalloc((count + 1) * sizeof *x);
  bool ok = gdpa_gpu_download(raw, bt->tensor[t], count * width, err, err_size);
  for (size_t i = 0; ok && i < count; i++) {
    if (width == 4) {
      memcpy(&x[i], raw + 4 * i, 4);
    } else {
      uint16_t h;
      memcpy(&h, raw + 2 * i, 2);
      x[i] = dt == DT_FP16 ? fp16_decode(h) : bf16_decode(h);
    }
  }
  free(raw);
  if (!ok) {
    free(x);
    return false;
  }
  *out = x, *n = count;
  return true;
}

// ||x - ref|| / ||ref|| (||x - ref|| when ref is 0); INFINITY when x holds NaN or inf.
static double relative_error(const float *x, const float *ref, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) return INFINITY;
    double d = (double)x[i] - (double)ref[i];
    diff += d * d, norm += (double)ref[i] * ref[i];
  }
  return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

// What timing one candidate needs beside it.
typedef struct Bench {
  int reps;
  int64_t *lengths[4];  // per jagged dim of the case's IR
  int64_t B;
  void *fill;           // tune_fill, from the compiler's choice's module
  float *ref;           // the compiler's choice's output (its first round)
  size_t nref;
} Bench;

// One round of candidate i: a fresh batch with the same inputs, warm-ups, `reps` timed
// forwards (and, for the compiler's choice in the first round, backwards), and in the first
// round the output check. False when a CUDA call failed.
static bool time_candidate(const TuneOp *op, int i, Built *b, Bench *m, bool first, Timing *t,
                           char *err, size_t err_size) {
  const GdpaEmitted *e = &b->e;
  GdpaBatch bt;
  if (!gdpa_batch_init(&bt, e, b->module, m->B, m->lengths, err, err_size)) return false;
  const int inputs[4] = {e->q, e->k, e->v, e->dout};
  bool ok = true;
  for (int k = 0; ok && k < 4; k++) {
    long long count = (long long)(bt.tensor_bytes[inputs[k]] / 2);
    unsigned seed = 1234u + 977u * (unsigned)k;
    float amp = k < 2 ? 1.5f : 1.0f;
    void *args[] = {&bt.tensor[inputs[k]], &count, &seed, &amp};
    ok = gdpa_gpu_launch(m->fill, (unsigned)((count + 255) / 256), 256, 0, args, err, err_size);
  }
  bool bwd = i == op->def && first;
  GdpaRange f = {&bt, 0, e->nforward}, bw = {&bt, e->nforward, e->nlaunches};
  for (int w = 0; ok && w < WARMUPS; w++)
    ok = gdpa_run_range(&f, err, err_size) && (!bwd || gdpa_run_range(&bw, err, err_size));
  ok = ok && gdpa_gpu_sync(err, err_size);
  double ms = NAN;
  ok = ok && gdpa_gpu_time_ms(gdpa_run_range, &f, m->reps, &ms, err, err_size);
  if (ok && bwd) ok = gdpa_gpu_time_ms(gdpa_run_range, &bw, m->reps, &t->bwd_ms, err, err_size);
  if (ok && (isnan(t->fwd_ms[i]) || ms < t->fwd_ms[i])) t->fwd_ms[i] = ms;
  if (ok && first) {
    float *x = NULL;
    size_t n = 0;
    ok = read_output(&bt, e->out, &x, &n, err, err_size);
    if (ok && i == op->def) {
      m->ref = x, m->nref = n;
      t->rel_err[i] = relative_error(x, x, n);  // 0, or INFINITY when it is not finite
    } else if (ok) {
      t->rel_err[i] = n == m->nref ? relative_error(x, m->ref, n) : INFINITY;
      free(x);
    }
    if (ok && !(t->rel_err[i] <= TUNE_TOLERANCE)) {
      t->good[i] = false;
      snprintf(b->why, sizeof b->why, "wrong output (relative difference %.2g from the "
               "compiler's choice)", t->rel_err[i]);
    }
  }
  return gdpa_batch_free(&bt, ok ? err : NULL, err_size) && ok;
}

// The batch's lengths per jagged dim of the case's IR (every candidate has the same dims):
// q's on q's dim, kv's on kv's (one dim for self, where they are the same).
static void bench_lengths(const TuneOp *op, const GdpaEmitted *e, Bench *m, GdpaLengths *len) {
  tune_lengths(op, len);
  m->B = len->n;
  for (int j = 0; j < e->ir.njagged && j < 4; j++) {
    m->lengths[j] = xcalloc((size_t)len->n + 1, sizeof(int64_t));
    const int64_t *from = j == e->q_jag ? len->lq : j == e->kv_jag ? len->lk : NULL;
    if (from) memcpy(m->lengths[j], from, (size_t)len->n * sizeof(int64_t));
  }
}

// Loads the compiled candidates and times them, the compiler's choice first in each round (its
// output is the reference of the others' check). False when a CUDA call failed (err); *usable
// is false when the compiler's choice did not build or came out wrong (b[op->def].why).
static bool time_all(const TuneOp *op, Built *b, JitUnit *units, int reps, Timing *t,
                     bool *usable, char *err, size_t err_size) {
  *usable = false;
  for (int i = 0; i < op->ncand; i++) {
    t->fwd_ms[i] = NAN;
    t->good[i] = false;
    if (!units[i].image) {
      if (!b[i].why[0]) snprintf(b[i].why, sizeof b[i].why, "not compiled");
      continue;
    }
    if (!gdpa_gpu_load_module(units[i].image, &b[i].module, err, err_size)) return false;
    t->good[i] = true;
  }
  if (!t->good[op->def]) return true;
  Bench m = {.reps = reps};
  GdpaLengths len;
  bench_lengths(op, &b[op->def].e, &m, &len);
  bool ok = gdpa_gpu_function(b[op->def].module, "tune_fill", &m.fill, err, err_size);
  int order[TUNE_MAX_CANDIDATES], n = 0;
  order[n++] = op->def;
  for (int i = 0; i < op->ncand; i++)
    if (i != op->def) order[n++] = i;
  for (int r = 0; ok && r < TUNE_ROUNDS && t->good[op->def]; r++)
    for (int k = 0; ok && k < n && t->good[op->def]; k++)
      if (t->good[order[k]])
        ok = time_candidate(op, order[k], &b[order[k]], &m, r == 0, t, err, err_size);
  free(m.ref);
  for (int j = 0; j < 4; j++) free(m.lengths[j]);
  gdpa_lengths_free(&len);
  *usable = ok && t->good[op->def];
  return ok;
}

// The fastest good candidate, if it beats the compiler's choice by more than TUNE_MARGIN.
static int pick_winner(const TuneOp *op, const Timing *t) {
  int best = op->def;
  for (int i = 0; i < op->ncand; i++)
    if (t->good[i] && t->fwd_ms[i] < t->fwd_ms[best]) best = i;
  return t->fwd_ms[best] < (1.0 - TUNE_MARGIN) * t->fwd_ms[op->def] ? best : op->def;
}

// Builds, compiles and times op's candidates. False when a CUDA call failed (err). *usable is
// false (with the reason in `why`) when the node cannot be tuned after all.
static bool measure(const TuneOp *op, int reps, const char *cache_dir, Built *b, Timing *t,
                    bool *usable, char *why, size_t why_size, char *err, size_t err_size) {
  double t0 = monotonic_seconds();
  JitUnit units[TUNE_MAX_CANDIDATES];
  memset(units, 0, sizeof units);
  for (int i = 0; i < op->ncand; i++) emit_candidate(op, i, &b[i]);
  compile_candidates(op, b, units, cache_dir);
  bool ok = time_all(op, b, units, reps, t, usable, err, err_size);
  jit_units_free(units, op->ncand);
  for (int i = 0; i < op->ncand; i++) {
    char unload[256];
    if (!gdpa_gpu_unload_module(b[i].module, unload, sizeof unload) && ok)
      ok = fail(err, err_size, "%s", unload);
    b[i].module = NULL;
  }
  if (ok && !*usable) {
    char text[96];
    tune_candidate_text(&op->cand[op->def], text, sizeof text);
    fail(why, why_size, "the compiler's choice (%s) could not be timed: %s", text,
         b[op->def].why);
  }
  if (ok && *usable) t->winner = pick_winner(op, t);
  t->seconds = monotonic_seconds() - t0;
  return ok;
}

static void free_built(Built *b, int n) {
  for (int i = 0; i < n; i++) {
    free(b[i].source);
    arena_free(&b[i].arena);
  }
}

// --- printing -----------------------------------------------------------------------------

static const char *kernel_label(TuneKernel k) { return k == TUNE_SM90 ? "sm_90a" : "mma.sync"; }

static void print_node_table(FILE *out, const TuneOp *op, const Built *b, const Timing *t) {
  fprintf(out, "  backward %.4f ms (its kernels do not depend on the forward's schedule: timed "
               "once)\n", t->bwd_ms);
  fprintf(out, "| candidate | kernel | shared memory | fwd ms | fwd + bwd ms | vs default | |\n");
  fprintf(out, "|---|---|---|---|---|---|---|\n");
  double def = t->fwd_ms[op->def];
  for (int i = 0; i < op->ncand; i++) {
    char text[96];
    tune_candidate_text(&op->cand[i], text, sizeof text);
    const char *mark = i == t->winner && i == op->def ? "default, **winner**"
                       : i == t->winner               ? "**winner**"
                       : i == op->def                 ? "default"
                                                      : "";
    if (t->good[i])
      fprintf(out, "| %s | %s | %d | %.4f | %.4f | %.3f | %s |\n", text,
              kernel_label(op->cand[i].kernel), op->cand[i].smem, t->fwd_ms[i],
              t->fwd_ms[i] + t->bwd_ms, t->fwd_ms[i] / def, mark);
    else
      fprintf(out, "| %s | %s | %d | - | - | - | %s |\n", text, kernel_label(op->cand[i].kernel),
              op->cand[i].smem, b[i].why);
  }
}

static void winner_text(const TuneOp *op, int winner, char *buf, size_t cap) {
  char text[96];
  tune_candidate_text(&op->cand[winner], text, sizeof text);
  snprintf(buf, cap, "%s%s", text, winner == op->def ? ", the compiler's choice" : "");
}

// --- the model ----------------------------------------------------------------------------

// The nodes tuned so far in this run, by key: a node with the key of an earlier one takes its
// winner (hstu's six identical layers are tuned once).
typedef struct Seen {
  char key[1024];
  int node, winner;
} Seen;

typedef struct Run {
  const TuneOptions *o;
  const char *gpu;
  Seen *seen;
  int nseen;
} Run;

// A winner for op without timing: from an earlier node of this run with the same key, or from
// the cache (unless forced). True with *winner when found; a bad cache entry is a warning.
static bool known_winner(Run *run, const TuneOp *op, const char *key, const char *path,
                         int *winner) {
  const TuneOptions *o = run->o;
  char text[160], why[512];
  for (int s = 0; s < run->nseen; s++)
    if (strcmp(run->seen[s].key, key) == 0) {
      *winner = run->seen[s].winner;
      winner_text(op, *winner, text, sizeof text);
      if (o->log) fprintf(o->log, "  tune     %s %s: %s (as node %d)\n", op->where, op->name,
                          text, run->seen[s].node);
      if (o->table)
        fprintf(o->table, "  the same op as node %d: %s\n\n", run->seen[s].node, text);
      return true;
    }
  if (!o->cache_dir || o->force) return false;
  TuneEntry entry;
  switch (tune_cache_load(o->cache_dir, key, op, winner, &entry, why, sizeof why)) {
  case TUNE_CACHE_HIT:
    winner_text(op, *winner, text, sizeof text);
    if (o->log) fprintf(o->log, "  tune     %s %s: %s (cached)\n", op->where, op->name, text);
    if (o->table) fprintf(o->table, "  cached in %s: %s\n\n", path, text);
    return true;
  case TUNE_CACHE_BAD:
    fprintf(stderr, "gemc: warning: tuning cache entry %s: %s; tuning again\n", path, why);
    return false;
  case TUNE_CACHE_MISS: return false;
  }
  return false;
}

// Prints what was measured for op and caches the winner.
static void report_timed(const TuneOptions *o, const TuneOp *op, const Built *b, const Timing *t,
                         const char *key, const char *path) {
  int timed = 0, w = t->winner;
  for (int i = 0; i < op->ncand; i++) timed += t->good[i];
  char text[160];
  winner_text(op, w, text, sizeof text);
  if (o->log)
    fprintf(o->log, "  tune     %s %s: %s (timed %d candidates in %.1f s; fwd %.4f ms, the "
            "compiler's choice %.4f ms)\n", op->where, op->name, text, timed, t->seconds,
            t->fwd_ms[w], t->fwd_ms[op->def]);
  if (o->table) {
    print_node_table(o->table, op, b, t);
    fprintf(o->table, "  winner: %s", text);
    if (w != op->def)
      fprintf(o->table, ", %.1f%% faster forward", 100 * (1.0 - t->fwd_ms[w] / t->fwd_ms[op->def]));
    fprintf(o->table, " (%d candidates timed in %.1f s)\n", timed, t->seconds);
  }
  TuneEntry entry = {.winner = op->cand[w], .fwd_ms = t->fwd_ms[w], .bwd_ms = t->bwd_ms,
                     .default_fwd_ms = t->fwd_ms[op->def], .ncand = timed};
  char err[1024];
  if (o->cache_dir && !tune_cache_store(o->cache_dir, key, &entry, err, sizeof err))
    fprintf(stderr, "gemc: warning: the tuning result is not cached: %s\n", err);
  else if (o->cache_dir && o->table)
    fprintf(o->table, "  stored in %s\n", path);
  if (o->table) fprintf(o->table, "\n");
}

// --compile-only: emits and compiles op's candidates and says which failed. False when one did.
static bool compile_only(const TuneOptions *o, const TuneOp *op) {
  Built *b = xcalloc(TUNE_MAX_CANDIDATES, sizeof *b);
  JitUnit units[TUNE_MAX_CANDIDATES];
  memset(units, 0, sizeof units);
  double t0 = monotonic_seconds();
  for (int i = 0; i < op->ncand; i++) emit_candidate(op, i, &b[i]);
  compile_candidates(op, b, units, o->cache_dir);
  int built = 0;
  for (int i = 0; i < op->ncand; i++) {
    char text[96];
    tune_candidate_text(&op->cand[i], text, sizeof text);
    built += units[i].image != NULL;
    const char *what = units[i].image ? "compiled" : b[i].why[0] ? b[i].why : "not compiled";
    if (o->table)
      fprintf(o->table, "  %-34s %-8s %6d bytes  %s\n", text, kernel_label(op->cand[i].kernel),
              op->cand[i].smem, what);
  }
  if (o->table)
    fprintf(o->table, "  %d of %d candidates compiled for %s in %.1f s\n\n", built, op->ncand,
            op->arch, monotonic_seconds() - t0);
  jit_units_free(units, op->ncand);
  free_built(b, TUNE_MAX_CANDIDATES);
  free(b);
  return built == op->ncand;
}

// Tunes one node, or takes its winner from the cache or an earlier node: *winner, or -1 when
// the node keeps its schedule. False when a CUDA call failed.
static bool tune_node(Run *run, const TuneOp *op, int *winner, char *err, size_t err_size) {
  const TuneOptions *o = run->o;
  *winner = -1;
  char key[1024], path[4096] = "", why[512];
  tune_key(op, run->gpu, nvrtc_version(), key, sizeof key);
  if (o->cache_dir) tune_cache_path(o->cache_dir, key, path, sizeof path);
  bool ok = true;
  if (!known_winner(run, op, key, path, winner)) {
    Built *b = xcalloc(TUNE_MAX_CANDIDATES, sizeof *b);
    Timing t = {.winner = -1};
    bool usable = false;
    ok = measure(op, o->reps, o->cache_dir, b, &t, &usable, why, sizeof why, err, err_size);
    if (ok && usable) {
      *winner = t.winner;
      report_timed(o, op, b, &t, key, path);
    } else if (ok) {
      fprintf(stderr, "gemc: warning: %s: not tuned: %s\n", op->where, why);
      if (o->log) fprintf(o->log, "  tune     %s %s: not tuned (%s)\n", op->where, op->name, why);
      if (o->table) fprintf(o->table, "  not tuned: %s\n\n", why);
    }
    free_built(b, TUNE_MAX_CANDIDATES);
    free(b);
  }
  if (*winner >= 0) {
    run->seen = xrealloc(run->seen, (size_t)(run->nseen + 1) * sizeof *run->seen);
    Seen *s = &run->seen[run->nseen++];
    snprintf(s->key, sizeof s->key, "%s", key);
    s->node = op->node;
    s->winner = *winner;
  }
  return ok;
}

TuneStatus tune_model(const Ir *ir, const TuneOptions *o, Schedule *sched, int *tuned, char *err,
                      size_t err_size) {
  if (tuned) *tuned = 0;
  if (!o->compile_only && !gdpa_gpu_open(err, err_size)) return TUNE_NO_GPU;
  char why[512];
  if (!nvrtc_available(why, sizeof why)) {
    fail(err, err_size, "NVRTC is needed to compile the candidates: %s", why);
    return TUNE_FAILED;
  }
  int64_t batch = o->batch > 0 ? o->batch : ir->batch;
  const char *arch = o->compile_only ? o->compile_only : gdpa_gpu_arch();
  if (o->compile_only && o->table) {
    fprintf(o->table, "gemc tune: %s, every candidate compiled for %s (nothing timed or "
            "stored); B = %" PRId64 "\n\n", o->source ? o->source : ir->model, arch, batch);
  } else if (o->arch && strcmp(o->arch, arch) != 0) {
    fail(err, err_size, "--arch %s, but this GPU (%s) is %s: the tuner times the kernels of the "
         "GPU it runs on", o->arch, gdpa_gpu_name(), arch);
    return TUNE_FAILED;
  }
  if (o->table && !o->compile_only) {
    fprintf(o->table, "gemc tune: %s on %s (%s, %d SMs), NVRTC %d.%d; B = %" PRId64 ", %d timed "
            "runs a round, the best of %d rounds\n", o->source ? o->source : ir->model,
            gdpa_gpu_name(), arch, gdpa_gpu_num_sms(), nvrtc_version() / 1000,
            nvrtc_version() % 1000 / 10, batch, o->reps, TUNE_ROUNDS);
    fprintf(o->table, "cache: %s\n\n", o->cache_dir ? o->cache_dir : "(none)");
  }
  Run run = {.o = o, .gpu = o->compile_only ? "" : gdpa_gpu_name()};
  TuneStatus status = TUNE_OK;
  int nattn = 0;
  for (int i = 0; i < ir->nforward && status == TUNE_OK; i++) {
    if (ir->nodes[i].op != OP_ATTENTION) continue;
    nattn++;
    TuneOp op;
    bool tunable = tune_op_init(ir, i, arch, batch, &op, why, sizeof why);
    if (o->table) {
      fprintf(o->table, "node %d (%s): %s", i, op.where, op.name);
      if (tunable && op.one_dim)
        fprintf(o->table, "; lengths lognormal up to %" PRId64, op.bucket_q);
      else if (tunable && op.bucket_q && op.bucket_kv)
        fprintf(o->table, "; lengths lognormal up to %" PRId64 " (q), %" PRId64 " (kv)",
                op.bucket_q, op.bucket_kv);
      else if (tunable)
        fprintf(o->table, "; lengths lognormal up to %" PRId64,
                op.bucket_q ? op.bucket_q : op.bucket_kv);
      fprintf(o->table, "%s%s\n", tunable ? "" : ": not tuned: ", tunable ? "" : why);
      if (!tunable) fprintf(o->table, "\n");
    }
    if (!tunable) {
      if (o->log) fprintf(o->log, "  tune     %s %s: not tuned (%s)\n", op.where, op.name, why);
      continue;
    }
    int winner = -1;
    if (o->compile_only) {
      if (!compile_only(o, &op))
        status = (fail(err, err_size, "%s: a candidate did not compile", op.where), TUNE_FAILED);
      continue;
    }
    if (!tune_node(&run, &op, &winner, err, err_size)) status = TUNE_FAILED;
    if (winner >= 0) {
      tune_apply(&sched[i], &op, winner);
      if (tuned && winner != op.def) (*tuned)++;
    }
  }
  if (nattn == 0 && o->table) fprintf(o->table, "no attention nodes: nothing to tune\n");
  // A recomputed attention (a copy in the backward, compiler/passes/recompute.c) runs the
  // schedule of the forward node it copies, which has its source position.
  for (int i = ir->nforward; i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    for (int j = 0; n->sched.recompute == RECOMPUTE_COPY && n->op == OP_ATTENTION && j < ir->nforward; j++)
      if (ir->nodes[j].op == OP_ATTENTION && ir->nodes[j].loc.first_line == n->loc.first_line &&
          ir->nodes[j].loc.first_column == n->loc.first_column) {
        sched[i] = sched[j];
        sched[i].recompute = RECOMPUTE_COPY;
        break;
      }
  }
  free(run.seen);
  return status;
}
