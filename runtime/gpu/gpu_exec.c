// gpu_exec.c: runs a Plan on the GPU (gpu_exec.h): buffers, staging of batches on a copy
// stream, launch of kernels, GEMMs and memsets with their symbolic sizes evaluated per batch,
// CUDA graphs per batch shape, read-back of the loss and the task probabilities, and the
// copies of parameters and optimizer state to and from the host (checkpoints).
#include "gpu_exec.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "cublaslt.h"
#include "gpu_helpers_ptx.h"
#include "gpu_optstate.h"
#include "gpu_stage.h"
#include "gpu_tiles.h"
#include "launch_cost.h"
#include "tensor_map.h"
#include "numerics.h"

enum { NSLOTS = 2, DEFAULT_GRAPH_CACHE = 8 };

// One staging slot: the pinned host copy and the device copy of a batch's inputs, offsets and
// tile lists, laid out identically.
typedef struct Slot {
  void *host;              // pinned
  CUdeviceptr dev;
  size_t bytes;
  int32_t *host_tiles;     // pinned
  CUdeviceptr dev_tiles;
  int64_t tile_words_cap;
  CUevent uploaded;        // copy stream: the upload of this slot's batch finished
  CUevent consumed;        // compute stream: the last step that read this slot finished
  bool used;
  // The batch in it.
  int64_t B;
  int64_t *totals;         // [njagged]
  int64_t *tile_count;     // [ntiles]: grid of each tile list
  size_t *tile_offset;     // [ntiles]: word offset of each list
} Slot;

typedef struct Graph {
  uint64_t key;
  int phases;
  CUgraphExec exec;
  int64_t last_used;
} Graph;

typedef struct Kernel {
  const char *name;
  CUfunction fn;
} Kernel;

struct GpuExec {
  const Plan *p;
  const Ir *ir;
  const CudaDriver *d;
  const CudaContext *ctx;
  GpuExecOptions o;
  CUmodule *modules;
  int nmodules;
  CUfunction *launch_fn;      // [nlaunches] (kernel launches)
  CUdeviceptr *buffers;       // [nbuffers]
  size_t bytes_allocated;
  CUdeviceptr workspace;
  size_t workspace_bytes;
  Gemm *gemm;
  CUstream compute, copy;
  CUevent step_start, step_end, readback;

  // Staging layout: where each input feature and each jagged dim's offsets sit in a slot.
  StagingLayout layout;
  GpuStaged staged;           // gpu_exec_set_batch's, staged on the calling thread
  Slot slots[NSLOTS];
  int cur;                    // slot of the current batch; -1 before any
  int inflight;               // slot of the step gpu_exec_finish waits for
  int next;                   // slot the next set_batch fills

  // Read-back.
  int ntasks;
  int *task_logit;            // [ntasks] tensor of each bce node's logit
  float *host_out;            // pinned: [0] loss, then ntasks * max_batch logits (fp32)
  uint16_t *host_out16;       // pinned: the same for 16-bit logits
  float **task_probs;         // [ntasks][max_batch]
  bool readback_queued;

  Graph *graphs;
  int ngraphs;
  uint64_t seen[64];          // shape keys run once without a graph (a second run captures)
  int seen_next;
  bool capture_failed;        // the last launch_graphed failed while capturing (nothing ran)
  GpuExecStats stats;
  int64_t step_calls;
  bool enqueued;              // the last launch_one put work on the stream
  GpuLaunchHook hook;         // after each backward launch (distributed training)
  void *hook_ctx;

  // Profiling (gpu_exec_profile): each step one CUDA graph with an event before and after
  // every launch, so the kernels run back to back and each one's time is its own.
  bool profile;
  CUevent *prof_start, *prof_end;  // [nlaunches]
  bool *prof_ran;                  // [nlaunches]: the launch put work on the stream this step
  LaunchCost *prof_cost;           // [nlaunches]: its cost for this step's batch
  CUgraphExec prof_exec;           // the step in flight, when it was profiled
  GpuLaunchProfile *prof;          // [nlaunches]: the totals
  int64_t prof_steps;

  // The divergence guard, loaded on first use: gpu_helpers.cu's count kernel and its counters.
  CUmodule guard_module;
  CUfunction guard_fn;
  CUdeviceptr guard_counts;   // 2 x u64 per checked buffer
  int guard_cap;
};

// --- small helpers ----------------------------------------------------------------------

static int64_t sym(SymSize s, int64_t B, const int64_t *totals) {
  return s.c + s.b * B + (s.jag >= 0 && totals ? s.t * totals[s.jag] : 0);
}

static const int64_t *max_totals(const GpuExec *g, int64_t *buf) {
  for (int j = 0; j < g->ir->njagged; j++) buf[j] = g->o.max_batch * g->ir->jagged[j].max_len;
  return buf;
}

static const char *sizes_text(const GpuExec *g, char *out, size_t size) {
  const Slot *s = g->cur >= 0 ? &g->slots[g->cur] : NULL;
  int used = snprintf(out, size, "B=%" PRId64, s ? s->B : (int64_t)0);
  for (int j = 0; s && j < g->ir->njagged && used > 0 && (size_t)used < size; j++)
    used += snprintf(out + used, size - (size_t)used, " T_%s=%" PRId64, g->ir->jagged[j].name,
                     s->totals[j]);
  return out;
}

// --- creation ---------------------------------------------------------------------------

static bool alloc_device(GpuExec *g, CUdeviceptr *p, size_t bytes, const char *what, char *err,
                         size_t err_size) {
  if (!CU_CHECK(g->d->cuMemAlloc(p, bytes ? bytes : 1))) {
    size_t free_b = 0, total = 0;
    g->d->cuMemGetInfo(&free_b, &total);
    return fail(err, err_size, "out of GPU memory allocating %s (%zu bytes; %zu of %zu bytes "
                "free): %s", what, bytes, free_b, total, cuda_last_error());
  }
  g->bytes_allocated += bytes;
  return true;
}

static bool load_kernels(GpuExec *g, const void *const *images, int nimages, char *err,
                         size_t err_size) {
  g->modules = xcalloc((size_t)nimages, sizeof *g->modules);
  for (int i = 0; i < nimages; i++) {
    if (!CU_CHECK(g->d->cuModuleLoadData(&g->modules[i], images[i])))
      return fail(err, err_size, "loading module %d of %d: %s", i + 1, nimages,
                  cuda_last_error());
    g->nmodules++;
  }
  const Plan *p = g->p;
  g->launch_fn = xcalloc((size_t)p->nlaunches, sizeof *g->launch_fn);
  for (int i = 0; i < p->nlaunches; i++) {
    const Launch *l = &p->launches[i];
    if (l->kind != LAUNCH_KERNEL) continue;
    for (int k = 0; k < i && !g->launch_fn[i]; k++)
      if (p->launches[k].kind == LAUNCH_KERNEL && strcmp(p->launches[k].kernel, l->kernel) == 0)
        g->launch_fn[i] = g->launch_fn[k];
    for (int m = 0; m < g->nmodules && !g->launch_fn[i]; m++) {
      CUfunction f;
      if (g->d->cuModuleGetFunction(&f, g->modules[m], l->kernel) == CU_SUCCESS)
        g->launch_fn[i] = f;
    }
    if (!g->launch_fn[i])
      return fail(err, err_size, "kernel %s (launch %d, IR node %d) is in none of the %d "
                  "compiled modules", l->kernel, i, l->node, g->nmodules);
    if (l->smem > 48 * 1024 &&
        !CU_CHECK(g->d->cuFuncSetAttribute(g->launch_fn[i],
                                           CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           l->smem)))
      return fail(err, err_size, "kernel %s asks for %d bytes of shared memory (the GPU allows "
                  "%d): %s", l->kernel, l->smem, g->ctx->max_smem_optin, cuda_last_error());
  }
  return true;
}

static bool alloc_buffers(GpuExec *g, char *err, size_t err_size) {
  const Plan *p = g->p;
  int64_t tmax[64];
  const int64_t *totals = max_totals(g, tmax);
  g->buffers = xcalloc((size_t)p->nbuffers, sizeof *g->buffers);
  for (int i = 0; i < p->nbuffers; i++) {
    int64_t bytes = sym(p->buffers[i].bytes, g->o.max_batch, totals);
    char what[256];
    snprintf(what, sizeof what, "buffer %s (%s)", p->buffers[i].name,
             p->buffers[i].persistent ? "persistent" : "per batch");
    if (!alloc_device(g, &g->buffers[i], (size_t)(bytes > 0 ? bytes : 0), what, err, err_size))
      return false;
  }
  size_t ws = 0;
  for (int i = 0; i < p->nlaunches; i++)
    for (int a = 0; a < p->launches[i].nargs; a++)
      if (p->launches[i].args[a].kind == ARG_WORKSPACE) {
        int64_t b = sym(p->launches[i].args[a].size, g->o.max_batch, totals);
        if (b > 0 && (size_t)b > ws) ws = (size_t)b;
      }
  g->workspace_bytes = ws;
  return ws == 0 || alloc_device(g, &g->workspace, ws, "the launch workspace", err, err_size);
}

static bool setup_staging(GpuExec *g, char *err, size_t err_size) {
  const Ir *ir = g->ir;
  if (!staging_layout_init(&g->layout, g->p, g->o.max_batch, g->ctx->sm_count, err, err_size))
    return false;
  size_t at = g->layout.bytes;
  for (int s = 0; s < NSLOTS; s++) {
    Slot *sl = &g->slots[s];
    sl->bytes = at;
    if (!CU_CHECK(g->d->cuMemAllocHost(&sl->host, at ? at : 1)))
      return fail(err, err_size, "pinned host memory for batches (%zu bytes): %s", at,
                  cuda_last_error());
    if (!alloc_device(g, &sl->dev, at, "a batch staging slot", err, err_size)) return false;
    if (!CU_CHECK(g->d->cuEventCreate(&sl->uploaded, CU_EVENT_DISABLE_TIMING)) ||
        !CU_CHECK(g->d->cuEventCreate(&sl->consumed, CU_EVENT_DISABLE_TIMING)))
      return fail(err, err_size, "%s", cuda_last_error());
    sl->totals = xcalloc((size_t)ir->njagged + 1, sizeof *sl->totals);
    sl->tile_count = xcalloc((size_t)g->p->ntiles + 1, sizeof *sl->tile_count);
    sl->tile_offset = xcalloc((size_t)g->p->ntiles + 1, sizeof *sl->tile_offset);
  }
  g->cur = -1;
  g->next = 0;
  return true;
}

static bool setup_tasks(GpuExec *g, char *err, size_t err_size) {
  const Ir *ir = g->ir;
  for (int i = 0; i < ir->nforward; i++)
    if (ir->nodes[i].op == OP_BCE) g->ntasks++;
  g->task_logit = xcalloc((size_t)g->ntasks, sizeof *g->task_logit);
  g->task_probs = xcalloc((size_t)g->ntasks, sizeof *g->task_probs);
  int k = 0;
  for (int i = 0; i < ir->nforward; i++)
    if (ir->nodes[i].op == OP_BCE) {
      g->task_logit[k] = ir->nodes[i].ins[0];
      g->task_probs[k++] = xcalloc((size_t)g->o.max_batch, sizeof(float));
    }
  size_t n = 1 + (size_t)g->ntasks * (size_t)g->o.max_batch;
  if (!CU_CHECK(g->d->cuMemAllocHost((void **)&g->host_out, n * 4)) ||
      !CU_CHECK(g->d->cuMemAllocHost((void **)&g->host_out16, n * 2)))
    return fail(err, err_size, "pinned host memory for results: %s", cuda_last_error());
  return true;
}

GpuExec *gpu_exec_new(const Plan *p, const CudaContext *ctx, const void *const *images,
                      int nimages, const GpuExecOptions *o, char *err, size_t err_size) {
  const CudaDriver *d = cuda_driver();
  if (!d) {
    fail(err, err_size, "the CUDA driver is not loaded");
    return NULL;
  }
  if (p->ir->njagged > 64) {
    fail(err, err_size, "the model has %d jagged dims; the GPU executor handles 64",
         p->ir->njagged);
    return NULL;
  }
  GpuExec *g = xcalloc(1, sizeof *g);
  g->p = p;
  g->ir = p->ir;
  g->d = d;
  g->ctx = ctx;
  g->o = *o;
  if (g->o.max_batch <= 0) g->o.max_batch = p->ir->batch;
  if (g->o.graph_cache <= 0) g->o.graph_cache = DEFAULT_GRAPH_CACHE;
  g->graphs = xcalloc((size_t)g->o.graph_cache, sizeof *g->graphs);
  bool ok = cuda_context_make_current(ctx) &&
            CU_CHECK(d->cuStreamCreate(&g->compute, CU_STREAM_NON_BLOCKING)) &&
            CU_CHECK(d->cuStreamCreate(&g->copy, CU_STREAM_NON_BLOCKING)) &&
            CU_CHECK(d->cuEventCreate(&g->step_start, 0)) &&
            CU_CHECK(d->cuEventCreate(&g->step_end, 0)) &&
            CU_CHECK(d->cuEventCreate(&g->readback, CU_EVENT_DISABLE_TIMING));
  if (!ok) fail(err, err_size, "%s", cuda_last_error());
  ok = ok && load_kernels(g, images, nimages, err, err_size);
  ok = ok && alloc_buffers(g, err, err_size);
  ok = ok && setup_staging(g, err, err_size);
  ok = ok && setup_tasks(g, err, err_size);
  bool needs_gemm = false;
  for (int i = 0; i < p->nlaunches; i++) needs_gemm |= p->launches[i].kind == LAUNCH_GEMM;
  if (ok && needs_gemm) {
    g->gemm = gemm_open(err, err_size);
    ok = g->gemm != NULL;
  }
  if (!ok) {
    gpu_exec_free(g);
    return NULL;
  }
  g->stats.bytes_allocated = g->bytes_allocated;
  return g;
}

void gpu_exec_free(GpuExec *g) {
  if (!g) return;
  const CudaDriver *d = g->d;
  if (g->compute) d->cuStreamSynchronize(g->compute);
  if (g->copy) d->cuStreamSynchronize(g->copy);
  for (int i = 0; i < g->o.graph_cache; i++)
    if (g->graphs[i].exec) d->cuGraphExecDestroy(g->graphs[i].exec);
  free(g->graphs);
  gemm_close(g->gemm);
  for (int i = 0; g->buffers && i < g->p->nbuffers; i++)
    if (g->buffers[i]) d->cuMemFree(g->buffers[i]);
  free(g->buffers);
  if (g->workspace) d->cuMemFree(g->workspace);
  for (int s = 0; s < NSLOTS; s++) {
    Slot *sl = &g->slots[s];
    if (sl->host) d->cuMemFreeHost(sl->host);
    if (sl->dev) d->cuMemFree(sl->dev);
    if (sl->host_tiles) d->cuMemFreeHost(sl->host_tiles);
    if (sl->dev_tiles) d->cuMemFree(sl->dev_tiles);
    if (sl->uploaded) d->cuEventDestroy(sl->uploaded);
    if (sl->consumed) d->cuEventDestroy(sl->consumed);
    free(sl->totals);
    free(sl->tile_count);
    free(sl->tile_offset);
  }
  if (g->prof_exec) d->cuGraphExecDestroy(g->prof_exec);
  for (int i = 0; g->prof_start && i < g->p->nlaunches; i++) {
    if (g->prof_start[i]) d->cuEventDestroy(g->prof_start[i]);
    if (g->prof_end[i]) d->cuEventDestroy(g->prof_end[i]);
  }
  free(g->prof_start);
  free(g->prof_end);
  free(g->prof_ran);
  free(g->prof_cost);
  free(g->prof);
  if (g->guard_counts) d->cuMemFree(g->guard_counts);
  if (g->guard_module) d->cuModuleUnload(g->guard_module);
  for (int m = 0; m < g->nmodules; m++) d->cuModuleUnload(g->modules[m]);
  free(g->modules);
  free(g->launch_fn);
  staging_layout_free(&g->layout);
  gpu_staged_free(&g->staged);
  if (g->host_out) d->cuMemFreeHost(g->host_out);
  if (g->host_out16) d->cuMemFreeHost(g->host_out16);
  for (int k = 0; k < g->ntasks; k++) free(g->task_probs[k]);
  free(g->task_probs);
  free(g->task_logit);
  if (g->step_start) d->cuEventDestroy(g->step_start);
  if (g->step_end) d->cuEventDestroy(g->step_end);
  if (g->readback) d->cuEventDestroy(g->readback);
  if (g->compute) d->cuStreamDestroy(g->compute);
  if (g->copy) d->cuStreamDestroy(g->copy);
  free(g);
}

// --- addresses --------------------------------------------------------------------------

// The device address of tensor t for the current batch: inputs live in the staging slot.
static bool tensor_addr(const GpuExec *g, int t, CUdeviceptr *out) {
  if (t < 0 || t >= g->ir->ntensors) return false;
  int f = g->layout.feature_of[t];
  if (f >= 0) {
    if (g->cur < 0) return false;
    *out = g->slots[g->cur].dev + g->layout.feature_offset[f];
    return true;
  }
  int b = g->p->tensor_buffer[t];
  if (b < 0) return false;
  const Slot *s = g->cur >= 0 ? &g->slots[g->cur] : NULL;
  *out = g->buffers[b] + (CUdeviceptr)sym(g->p->tensor_offset[t], s ? s->B : 0,
                                          s ? s->totals : NULL);
  return true;
}

typedef union ArgValue {
  CUdeviceptr ptr;
  int64_t i;
  float f;
  CUtensorMap map;
} ArgValue;

static bool arg_value(const GpuExec *g, const LaunchArg *a, int64_t step, ArgValue *v,
                      char *err, size_t err_size) {
  const Slot *s = &g->slots[g->cur];
  switch (a->kind) {
  case ARG_TENSOR:
    if (!tensor_addr(g, a->tensor, &v->ptr))
      return fail(err, err_size, "tensor %s has no storage", g->ir->tensors[a->tensor].name);
    return true;
  case ARG_GRAD: {
    int gt = ir_grad_of(g->ir, a->tensor);
    if (gt < 0 || !tensor_addr(g, gt, &v->ptr))
      return fail(err, err_size, "the gradient of %s has no storage",
                  g->ir->tensors[a->tensor].name);
    return true;
  }
  case ARG_OPTSTATE: {
    int b = g->p->optstate_buffer ? g->p->optstate_buffer[2 * a->tensor + a->slot] : -1;
    if (b < 0)
      return fail(err, err_size, "optimizer state %d of %s has no buffer", a->slot,
                  g->ir->tensors[a->tensor].name);
    v->ptr = g->buffers[b];
    return true;
  }
  case ARG_OFFSETS: v->ptr = s->dev + g->layout.offsets_offset[a->jag]; return true;
  case ARG_SIZE: v->i = sym(a->size, s->B, s->totals); return true;
  case ARG_INT: v->i = a->i; return true;
  case ARG_FLOAT: v->f = a->f; return true;
  case ARG_STEP: v->i = step; return true;
  case ARG_TILES: v->ptr = s->dev_tiles + s->tile_offset[a->tiles] * 4; return true;
  case ARG_TILE_COUNT: v->i = s->tile_count[a->tiles]; return true;
  case ARG_TENSOR_MAP: {
    const Tensor *t = &g->ir->tensors[a->tensor];
    CUdeviceptr addr;
    char e[256];
    if (!tensor_addr(g, a->tensor, &addr))
      return fail(err, err_size, "tensor %s has no storage", t->name);
    if (!tensor_map_encode(&v->map, addr, sym(a->size, s->B, s->totals), t->width,
                           t->dtype == DT_FP16, (int)a->i, e, sizeof e))
      return fail(err, err_size, "the tensor map of %s: %s", t->name, e);
    return true;
  }
  case ARG_WORKSPACE: v->ptr = g->workspace; return true;
  case ARG_SCRATCH: {
    const Scratch *sc = &g->p->scratch[a->slot];
    v->ptr = g->buffers[sc->buffer] + (CUdeviceptr)sym(sc->offset, s->B, s->totals);
    return true;
  }
  }
  return fail(err, err_size, "unknown argument kind %d", (int)a->kind);
}

// --- launching --------------------------------------------------------------------------

// How a tensor of dtype t is stored: fp8 and mxfp8 values as bf16.
static DType stored_dtype(DType t) { return t == DT_F32 || t == DT_FP16 ? t : DT_BF16; }

// The type of a GEMM's C: its tensor's, fp32 for a parameter's gradient, and for codegen
// scratch (an fp32 pre-activation, say) what its size says: 4 bytes an element, or the
// operands' type. (The plan names the operand type only.)
static DType gemm_c_dtype(const GpuExec *g, const Launch *l) {
  const LaunchArg *c = &l->gemm_c;
  if (c->kind == ARG_TENSOR) return stored_dtype(g->ir->tensors[c->tensor].dtype);
  if (c->kind == ARG_GRAD) return DT_F32;
  if (c->kind == ARG_SCRATCH) {
    const Slot *s = &g->slots[g->cur];
    int64_t m = sym(l->gemm_m, s->B, s->totals), elems = m * l->gemm_n;
    int64_t bytes = sym(g->p->scratch[c->slot].bytes, s->B, s->totals);
    if (elems > 0 && bytes >= 4 * elems) return DT_F32;
  }
  return l->gemm_dtype;
}

static bool launch_one(GpuExec *g, int i, int64_t step, char *err, size_t err_size) {
  const Launch *l = &g->p->launches[i];
  g->enqueued = false;
  const Slot *s = &g->slots[g->cur];
  char sizes[512];
  const CudaDriver *d = g->d;
  switch (l->kind) {
  case LAUNCH_ZERO: {
    ArgValue v;
    if (!arg_value(g, &l->zero_arg, step, &v, err, err_size)) return false;
    int64_t bytes = sym(l->zero_bytes, s->B, s->totals);
    if (bytes > 0 && !CU_CHECK(d->cuMemsetD8Async(v.ptr, 0, (size_t)bytes, g->compute)))
      return fail(err, err_size, "zeroing %" PRId64 " bytes for IR node %d (%s): %s", bytes,
                  l->node, sizes_text(g, sizes, sizeof sizes), cuda_last_error());
    g->enqueued = bytes > 0;
    return true;
  }
  case LAUNCH_GEMM: {
    ArgValue a, b, c, bias = {0}, scale_a = {0}, scale_b = {0};
    bool fp8 = l->gemm_dtype == DT_FP8;
    if (!arg_value(g, &l->gemm_a, step, &a, err, err_size) ||
        !arg_value(g, &l->gemm_b, step, &b, err, err_size) ||
        !arg_value(g, &l->gemm_c, step, &c, err, err_size) ||
        (l->gemm_has_bias && !arg_value(g, &l->gemm_bias, step, &bias, err, err_size)) ||
        (fp8 && (!arg_value(g, &l->gemm_scale_a, step, &scale_a, err, err_size) ||
                 !arg_value(g, &l->gemm_scale_b, step, &scale_b, err, err_size))))
      return false;
    int64_t k = sym(l->gemm_k, s->B, s->totals);
    if (l->gemm_k_align > 1) k = (k + l->gemm_k_align - 1) / l->gemm_k_align * l->gemm_k_align;
    GemmShape sh = {.m = sym(l->gemm_m, s->B, s->totals), .n = l->gemm_n,
                    .c_dtype = gemm_c_dtype(g, l),
                    .k = k, .trans_a = l->gemm_trans_a,
                    .trans_b = l->gemm_trans_b, .dtype = l->gemm_dtype, .alpha = 1.0f,
                    .beta = l->gemm_beta, .has_bias = l->gemm_has_bias,
                    .bias_dtype = l->gemm_has_bias && l->gemm_bias.kind == ARG_TENSOR
                                      ? stored_dtype(g->ir->tensors[l->gemm_bias.tensor].dtype)
                                      : l->gemm_dtype,
                    .act = l->gemm_act};
    char e[512];
    if (!gemm_run_scaled(g->gemm, &sh, a.ptr, b.ptr, c.ptr, bias.ptr, scale_a.ptr, scale_b.ptr,
                         g->compute, e, sizeof e))
      return fail(err, err_size, "launch %d (IR node %d, %s): %s", i, l->node,
                  sizes_text(g, sizes, sizeof sizes), e);
    g->enqueued = sh.m > 0 && sh.n > 0;
    return true;
  }
  case LAUNCH_KERNEL: break;
  }
  int64_t grid;
  if (l->grid == GRID_TILES) {
    grid = s->tile_count[l->tiles];
  } else if (l->grid == GRID_PERSISTENT) {
    grid = s->tile_count[l->tiles];
    if (grid > g->ctx->sm_count) grid = g->ctx->sm_count;
  } else {
    int64_t work = sym(l->size, s->B, s->totals);
    grid = work <= 0 ? 0 : (work + l->per_block - 1) / l->per_block;
  }
  if (grid == 0) return true;  // an empty batch dim: nothing to do
  if (grid > 0x7fffffff)
    return fail(err, err_size, "kernel %s (IR node %d): grid of %" PRId64 " blocks is too "
                "large (%s)", l->kernel, l->node, grid, sizes_text(g, sizes, sizeof sizes));
  ArgValue vals[PLAN_MAX_ARGS];
  void *params[PLAN_MAX_ARGS];
  for (int a = 0; a < l->nargs; a++) {
    if (!arg_value(g, &l->args[a], step, &vals[a], err, err_size)) return false;
    if (l->args[a].kind == ARG_WORKSPACE) {
      int64_t bytes = sym(l->args[a].size, s->B, s->totals);
      if (bytes > 0 && !CU_CHECK(d->cuMemsetD8Async(g->workspace, 0, (size_t)bytes, g->compute)))
        return fail(err, err_size, "zeroing the workspace of kernel %s: %s", l->kernel,
                    cuda_last_error());
    }
    params[a] = &vals[a];
  }
  if (!CU_CHECK(d->cuLaunchKernel(g->launch_fn[i], (unsigned)grid, 1, 1, (unsigned)l->threads,
                                  1, 1, (unsigned)l->smem, g->compute, params, NULL)))
    return fail(err, err_size, "launching kernel %s (IR node %d; grid %" PRId64 " x %d threads, "
                "%d bytes of shared memory; %s): %s", l->kernel, l->node, grid, l->threads,
                l->smem, sizes_text(g, sizes, sizeof sizes), cuda_last_error());
  g->stats.launches++;
  g->enqueued = true;
  if (g->o.sync_each_launch && !CU_CHECK(d->cuStreamSynchronize(g->compute)))
    return fail(err, err_size, "kernel %s (IR node %d; grid %" PRId64 " x %d threads; %s) "
                "failed: %s", l->kernel, l->node, grid, l->threads,
                sizes_text(g, sizes, sizeof sizes), cuda_last_error());
  return true;
}

static bool in_phase(const Launch *l, int phases) {
  int ph = l->optimizer ? GPU_OPTIMIZER : l->backward ? GPU_BACKWARD : GPU_FORWARD;
  return (phases & ph) != 0;
}

static bool launch_phase(GpuExec *g, int phases, int64_t step, char *err, size_t err_size) {
  bool hooked = g->hook && phases == GPU_BACKWARD;
  for (int i = 0; i < g->p->nlaunches; i++) {
    if (!in_phase(&g->p->launches[i], phases)) continue;
    if (!launch_one(g, i, step, err, err_size)) return false;
    if (hooked) g->hook(g->hook_ctx, i);
  }
  return true;
}

// The shape key of the current batch: B, every total, every tile count, the slot.
static uint64_t shape_key(const GpuExec *g, int phases) {
  const Slot *s = &g->slots[g->cur];
  uint64_t h = 0xcbf29ce484222325ull;
  int64_t parts[4] = {s->B, g->cur, phases, (int64_t)s->dev_tiles};
  for (int i = 0; i < 4; i++) h = (h ^ (uint64_t)parts[i]) * 0x100000001b3ull;
  for (int j = 0; j < g->ir->njagged; j++) h = (h ^ (uint64_t)s->totals[j]) * 0x100000001b3ull;
  for (int t = 0; t < g->p->ntiles; t++) h = (h ^ (uint64_t)s->tile_count[t]) * 0x100000001b3ull;
  return h;
}

// Runs the launches of `phases` (no optimizer) through a graph for this shape. A shape seen
// for the first time runs directly (most jagged shapes never come back, and a capture costs
// more than it saves on one run); the second time it is captured, then replayed.
static bool launch_graphed(GpuExec *g, int phases, char *err, size_t err_size) {
  uint64_t key = shape_key(g, phases);
  Graph *slot = NULL, *oldest = &g->graphs[0];
  for (int i = 0; i < g->o.graph_cache; i++) {
    Graph *gr = &g->graphs[i];
    if (gr->exec && gr->key == key && gr->phases == phases) slot = gr;
    if (gr->last_used < oldest->last_used) oldest = gr;
  }
  const CudaDriver *d = g->d;
  if (!slot) {
    bool seen = false;
    for (int i = 0; i < 64 && !seen; i++) seen = g->seen[i] == key;
    if (!seen) {
      g->seen[g->seen_next] = key;
      g->seen_next = (g->seen_next + 1) % 64;
      return launch_phase(g, phases, 0, err, err_size);
    }
    slot = oldest;
    if (slot->exec) d->cuGraphExecDestroy(slot->exec);
    slot->exec = NULL;
    if (!CU_CHECK(d->cuStreamBeginCapture(g->compute, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)))
      return fail(err, err_size, "starting a CUDA graph capture: %s", cuda_last_error());
    g->capture_failed = true;  // until the graph exists: nothing has run
    bool ok = launch_phase(g, phases, 0, err, err_size);
    CUgraph graph = NULL;
    bool ended = CU_CHECK(d->cuStreamEndCapture(g->compute, &graph));
    if (!ok) {
      if (graph) d->cuGraphDestroy(graph);
      return false;
    }
    if (!ended) return fail(err, err_size, "ending a CUDA graph capture: %s", cuda_last_error());
    ok = CU_CHECK(d->cuGraphInstantiateWithFlags(&slot->exec, graph, 0));
    d->cuGraphDestroy(graph);
    if (!ok) return fail(err, err_size, "instantiating a CUDA graph: %s", cuda_last_error());
    g->capture_failed = false;
    slot->key = key;
    slot->phases = phases;
    g->stats.graph_captures++;
  } else {
    g->stats.graph_replays++;
  }
  slot->last_used = ++g->step_calls;
  if (!CU_CHECK(d->cuGraphLaunch(slot->exec, g->compute)))
    return fail(err, err_size, "launching the step's CUDA graph: %s", cuda_last_error());
  return true;
}

// After the forward launches: the loss and the logits go to pinned memory (their buffers may
// be reused by the backward pass).
static bool queue_readback(GpuExec *g, char *err, size_t err_size) {
  const Slot *s = &g->slots[g->cur];
  const CudaDriver *d = g->d;
  CUdeviceptr p;
  g->host_out[0] = NAN;
  if (g->ir->loss >= 0 && tensor_addr(g, g->ir->loss, &p) &&
      !CU_CHECK(d->cuMemcpyDtoHAsync(g->host_out, p, 4, g->compute)))
    return fail(err, err_size, "reading the loss: %s", cuda_last_error());
  for (int k = 0; k < g->ntasks; k++) {
    if (!tensor_addr(g, g->task_logit[k], &p)) continue;
    DType dt = g->ir->tensors[g->task_logit[k]].dtype;
    size_t off = 1 + (size_t)k * (size_t)g->o.max_batch;
    bool ok = dt == DT_F32
                  ? CU_CHECK(d->cuMemcpyDtoHAsync(g->host_out + off, p, (size_t)s->B * 4,
                                                  g->compute))
                  : CU_CHECK(d->cuMemcpyDtoHAsync(g->host_out16 + off, p, (size_t)s->B * 2,
                                                  g->compute));
    if (!ok) return fail(err, err_size, "reading the logits: %s", cuda_last_error());
  }
  g->readback_queued = true;
  return true;
}

// One phase, through a graph when graphs are on. A capture that fails (a launch that cannot be
// captured) turns graphs off for the rest of the run, with a note, and runs the phase directly.
static bool run_phase(GpuExec *g, int phase, int64_t step, char *err, size_t err_size) {
  if (!g->o.graphs || g->o.sync_each_launch || (g->hook && phase == GPU_BACKWARD))
    return launch_phase(g, phase, step, err, err_size);
  g->capture_failed = false;
  if (launch_graphed(g, phase, err, err_size)) return true;
  if (!g->capture_failed) return false;  // a launch failed for real
  fprintf(stderr, "gemc: note: CUDA graphs turned off: %s\n", err);
  g->o.graphs = false;
  return launch_phase(g, phase, step, err, err_size);
}

// --- profiling --------------------------------------------------------------------------

bool gpu_exec_profile(GpuExec *g, bool on, char *err, size_t err_size) {
  if (on && g->o.sync_each_launch)
    return fail(err, err_size, "a profile cannot run with GEMC_CUDA_SYNC=1 (a graph has no "
                "synchronization inside)");
  if (on && !g->d->cuEventRecordWithFlags)
    return fail(err, err_size, "a profile needs cuEventRecordWithFlags (a CUDA 11.1 or later "
                "driver)");
  if (on && !g->prof_start) {
    int n = g->p->nlaunches;
    g->prof_start = xcalloc((size_t)n + 1, sizeof *g->prof_start);
    g->prof_end = xcalloc((size_t)n + 1, sizeof *g->prof_end);
    g->prof_ran = xcalloc((size_t)n + 1, sizeof *g->prof_ran);
    g->prof_cost = xcalloc((size_t)n + 1, sizeof *g->prof_cost);
    g->prof = xcalloc((size_t)n + 1, sizeof *g->prof);
    for (int i = 0; i < n; i++)
      if (!CU_CHECK(g->d->cuEventCreate(&g->prof_start[i], 0)) ||
          !CU_CHECK(g->d->cuEventCreate(&g->prof_end[i], 0)))
        return fail(err, err_size, "events for the profile: %s", cuda_last_error());
  }
  g->profile = on;
  return true;
}

const GpuLaunchProfile *gpu_exec_profile_totals(const GpuExec *g, int64_t *steps) {
  *steps = g->prof_steps;
  return g->prof;
}

// The batch's jagged offsets, from the slot's pinned copy (for the cost of attention).
static void slot_offsets(const GpuExec *g, const Slot *sl, const int64_t **out) {
  for (int j = 0; j < g->ir->njagged; j++)
    out[j] = (const int64_t *)(const void *)((const unsigned char *)sl->host +
                                             g->layout.offsets_offset[j]);
}

// One profiled step: every launch of `phases` (and the read-back after the forward) captured
// into one graph with an event node before and after each launch, then the graph launched.
// gpu_exec_finish reads the events. Replaying the whole step as a graph keeps the host's
// launch time out of the kernels' times.
static bool launch_profiled(GpuExec *g, int phases, int64_t step, char *err, size_t err_size) {
  const CudaDriver *d = g->d;
  const Slot *sl = &g->slots[g->cur];
  const int64_t *offsets[GPU_MAX_JAGGED];
  slot_offsets(g, sl, offsets);
  g->capture_failed = true;  // until the graph is launched: nothing has run
  if (!CU_CHECK(d->cuStreamBeginCapture(g->compute, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)))
    return fail(err, err_size, "starting the profile's graph capture: %s", cuda_last_error());
  bool ok = true, said = false;  // said: err holds the failure's message
  static const int order[] = {GPU_FORWARD, GPU_BACKWARD, GPU_OPTIMIZER};
  for (int o = 0; o < 3 && ok; o++) {
    if (!(phases & order[o])) continue;
    for (int i = 0; i < g->p->nlaunches && ok; i++) {
      if (!in_phase(&g->p->launches[i], order[o])) continue;
      ok = CU_CHECK(d->cuEventRecordWithFlags(g->prof_start[i], g->compute,
                                              CU_EVENT_RECORD_EXTERNAL));
      if (ok && !launch_one(g, i, step, err, err_size)) ok = false, said = true;
      g->prof_ran[i] = ok && g->enqueued;
      ok = ok && CU_CHECK(d->cuEventRecordWithFlags(g->prof_end[i], g->compute,
                                                    CU_EVENT_RECORD_EXTERNAL));
      if (g->prof_ran[i])
        g->prof_cost[i] = launch_cost(g->p, i, sl->B, sl->totals, offsets);
    }
    if (ok && order[o] == GPU_FORWARD && !queue_readback(g, err, err_size)) ok = false, said = true;
  }
  CUgraph graph = NULL;
  bool ended = CU_CHECK(d->cuStreamEndCapture(g->compute, &graph));
  ok = ok && ended && CU_CHECK(d->cuGraphInstantiateWithFlags(&g->prof_exec, graph, 0));
  if (graph) d->cuGraphDestroy(graph);
  if (!ok) {  // nothing ran: a capture enqueues no work
    for (int i = 0; i < g->p->nlaunches; i++) g->prof_ran[i] = false;
    if (g->prof_exec) d->cuGraphExecDestroy(g->prof_exec);
    g->prof_exec = NULL;
    g->capture_failed = true;
    if (!said) fail(err, err_size, "the profile's CUDA graph: %s", cuda_last_error());
    return false;
  }
  if (!CU_CHECK(d->cuGraphLaunch(g->prof_exec, g->compute))) {
    for (int i = 0; i < g->p->nlaunches; i++) g->prof_ran[i] = false;
    d->cuGraphExecDestroy(g->prof_exec);
    g->prof_exec = NULL;
    g->capture_failed = false;  // a launch that failed for real
    return fail(err, err_size, "launching the profile's graph: %s", cuda_last_error());
  }
  g->capture_failed = false;
  return true;
}

// After a profiled step ended: each launch's time and cost go to the totals.
static bool collect_profile(GpuExec *g, char *err, size_t err_size) {
  const CudaDriver *d = g->d;
  bool ok = true;
  for (int i = 0; i < g->p->nlaunches && ok; i++) {
    if (!g->prof_ran[i]) continue;
    float ms = 0;
    ok = CU_CHECK(d->cuEventElapsedTime(&ms, g->prof_start[i], g->prof_end[i]));
    if (!ok) break;
    g->prof[i].runs++;
    g->prof[i].ms += ms;
    g->prof[i].flops += g->prof_cost[i].flops;
    g->prof[i].bytes += g->prof_cost[i].bytes;
    g->prof[i].tensor_core = g->prof_cost[i].tensor_core;
    g->prof_ran[i] = false;
  }
  d->cuGraphExecDestroy(g->prof_exec);
  g->prof_exec = NULL;
  if (!ok) return fail(err, err_size, "reading the profile's events: %s", cuda_last_error());
  g->prof_steps++;
  return true;
}

bool gpu_exec_launch(GpuExec *g, int phases, int64_t step, char *err, size_t err_size) {
  if (g->cur < 0) return fail(err, err_size, "no batch was set");
  Slot *s = &g->slots[g->cur];
  const CudaDriver *d = g->d;
  g->readback_queued = false;
  g->inflight = g->cur;
  if (!CU_CHECK(d->cuStreamWaitEvent(g->compute, s->uploaded, 0)) ||
      !CU_CHECK(d->cuEventRecord(g->step_start, g->compute)))
    return fail(err, err_size, "%s", cuda_last_error());
  // Training steps only: an evaluation's forward would count as a profiled step. A capture
  // that fails (nothing has run) turns the profile off for the run, with a note, as run_phase
  // does for graphs, and the step runs directly.
  bool profiled = false;
  if (g->profile && !g->hook && !g->prof_exec && (phases & GPU_BACKWARD)) {
    profiled = launch_profiled(g, phases, step, err, err_size);
    if (!profiled && !g->capture_failed) return false;
    if (!profiled) {
      fprintf(stderr, "gemc: note: the profile is off: %s\n", err);
      g->profile = false;
    }
  }
  if (!profiled) {
    if ((phases & GPU_FORWARD) && (!run_phase(g, GPU_FORWARD, step, err, err_size) ||
                                   !queue_readback(g, err, err_size)))
      return false;
    if ((phases & GPU_BACKWARD) && !run_phase(g, GPU_BACKWARD, step, err, err_size))
      return false;
    if ((phases & GPU_OPTIMIZER) && !launch_phase(g, GPU_OPTIMIZER, step, err, err_size))
      return false;
  }
  if (!CU_CHECK(d->cuEventRecord(g->step_end, g->compute)) ||
      !CU_CHECK(d->cuEventRecord(s->consumed, g->compute)))
    return fail(err, err_size, "%s", cuda_last_error());
  g->stats.steps++;
  return true;
}

bool gpu_exec_finish(GpuExec *g, double *loss, char *err, size_t err_size) {
  const CudaDriver *d = g->d;
  char sizes[512];
  if (!CU_CHECK(d->cuEventSynchronize(g->step_end)))
    return fail(err, err_size, "a kernel failed during the step (%s): %s; run with "
                "GEMC_CUDA_SYNC=1 to name it", sizes_text(g, sizes, sizeof sizes),
                cuda_last_error());
  float ms = 0;
  if (d->cuEventElapsedTime(&ms, g->step_start, g->step_end) == CU_SUCCESS)
    g->stats.device_ms = ms;
  if (g->prof_exec && !collect_profile(g, err, err_size)) return false;
  if (!g->readback_queued) {
    if (loss) *loss = NAN;
    return true;
  }
  const Slot *s = &g->slots[g->inflight];
  if (loss) *loss = g->host_out[0];
  for (int k = 0; k < g->ntasks; k++) {
    DType dt = g->ir->tensors[g->task_logit[k]].dtype;
    size_t off = 1 + (size_t)k * (size_t)g->o.max_batch;
    for (int64_t b = 0; b < s->B; b++) {
      double z = dt == DT_F32 ? g->host_out[off + (size_t)b]
                 : dt == DT_FP16 ? (double)fp16_decode(g->host_out16[off + (size_t)b])
                                 : (double)bf16_decode(g->host_out16[off + (size_t)b]);
      g->task_probs[k][b] = (float)(z >= 0 ? 1 / (1 + exp(-z)) : exp(z) / (1 + exp(z)));
    }
  }
  return true;
}

bool gpu_exec_run_range(GpuExec *g, int from, int to, int64_t step, char *err,
                        size_t err_size) {
  if (g->cur < 0) return fail(err, err_size, "no batch was set");
  const CudaDriver *d = g->d;
  if (!CU_CHECK(d->cuStreamWaitEvent(g->compute, g->slots[g->cur].uploaded, 0)))
    return fail(err, err_size, "%s", cuda_last_error());
  for (int i = from; i < to; i++)
    if (!launch_one(g, i, step, err, err_size)) return false;
  if (!CU_CHECK(d->cuEventRecord(g->slots[g->cur].consumed, g->compute)) ||
      !CU_CHECK(d->cuStreamSynchronize(g->compute)))
    return fail(err, err_size, "launches %d..%d: %s", from, to - 1, cuda_last_error());
  return true;
}

// --- batches ----------------------------------------------------------------------------

// Copies the staged tile lists into the slot's pinned memory (growing it and its device copy
// as needed; the slot's earlier upload and readers are done, see set_staged) and enqueues
// their upload.
static bool upload_tiles(GpuExec *g, Slot *sl, const GpuStaged *st, char *err,
                         size_t err_size) {
  const CudaDriver *d = g->d;
  int64_t words = st->tile_words;
  if (words > sl->tile_words_cap) {
    int64_t cap = sl->tile_words_cap ? sl->tile_words_cap : 1 << 16;
    while (cap < words) cap *= 2;
    if (sl->host_tiles) d->cuMemFreeHost(sl->host_tiles);
    if (sl->dev_tiles) d->cuMemFree(sl->dev_tiles);
    sl->host_tiles = NULL;
    sl->dev_tiles = 0;
    sl->tile_words_cap = 0;
    if (!CU_CHECK(d->cuMemAllocHost((void **)&sl->host_tiles, (size_t)cap * 4)))
      return fail(err, err_size, "pinned memory for tile lists: %s", cuda_last_error());
    if (!alloc_device(g, &sl->dev_tiles, (size_t)cap * 4, "attention tile lists", err,
                      err_size))
      return false;
    sl->tile_words_cap = cap;
  }
  memcpy(sl->tile_count, st->tile_count, (size_t)g->p->ntiles * sizeof *sl->tile_count);
  memcpy(sl->tile_offset, st->tile_offset, (size_t)g->p->ntiles * sizeof *sl->tile_offset);
  if (words == 0) return true;
  memcpy(sl->host_tiles, st->tiles, (size_t)words * 4);
  if (!CU_CHECK(d->cuMemcpyHtoDAsync(sl->dev_tiles, sl->host_tiles, (size_t)words * 4,
                                     g->copy)))
    return fail(err, err_size, "uploading the tile lists: %s", cuda_last_error());
  return true;
}

const StagingLayout *gpu_exec_layout(const GpuExec *g) { return &g->layout; }

bool gpu_exec_set_staged(GpuExec *g, const GpuStaged *st, char *err, size_t err_size) {
  const CudaDriver *d = g->d;
  const Ir *ir = g->ir;
  Slot *sl = &g->slots[g->next];
  // The slot's pinned memory must not be overwritten while its previous upload runs, nor its
  // device copy while a step still reads it.
  if (sl->used && (!CU_CHECK(d->cuEventSynchronize(sl->uploaded)) ||
                   !CU_CHECK(d->cuEventSynchronize(sl->consumed))))
    return fail(err, err_size, "waiting for the previous use of a batch slot: %s",
                cuda_last_error());
  sl->B = st->B;
  for (int j = 0; j < ir->njagged; j++) sl->totals[j] = st->totals[j];
  if (st->used > 0) {
    memcpy(sl->host, st->image, st->used);
    // One copy of the whole used prefix: the regions are laid out back to back.
    if (!CU_CHECK(d->cuMemcpyHtoDAsync(sl->dev, sl->host, st->used, g->copy)))
      return fail(err, err_size, "uploading the batch: %s", cuda_last_error());
  }
  if (g->p->ntiles > 0 && !upload_tiles(g, sl, st, err, err_size)) return false;
  if (!CU_CHECK(d->cuEventRecord(sl->uploaded, g->copy)))
    return fail(err, err_size, "%s", cuda_last_error());
  sl->used = true;
  g->cur = g->next;
  g->next = (g->next + 1) % NSLOTS;
  return true;
}

bool gpu_exec_set_batch(GpuExec *g, const Batch *b, char *err, size_t err_size) {
  return gpu_stage_batch(&g->layout, b, &g->staged, err, err_size) &&
         gpu_exec_set_staged(g, &g->staged, err, err_size);
}

// --- parameters and tensors -------------------------------------------------------------

static int64_t stored_numel(const GpuExec *g, int t) {
  const Slot *s = g->cur >= 0 ? &g->slots[g->cur] : NULL;
  int64_t zero[64] = {0};
  int64_t rows, width;
  gpu_tensor_shape(g->ir, t, s ? s->B : 0, s ? s->totals : zero, &rows, &width);
  return rows * width;
}

bool gpu_exec_write_tensor(GpuExec *g, int t, const float *data, int64_t numel, char *err,
                           size_t err_size) {
  CUdeviceptr p;
  if (!tensor_addr(g, t, &p))
    return fail(err, err_size, "tensor %s has no storage", g->ir->tensors[t].name);
  DType dt = g->ir->tensors[t].dtype;
  size_t bytes = (size_t)(numel * gpu_dtype_bytes(dt));
  void *tmp = xcalloc(bytes ? bytes : 1, 1);
  if (dt == DT_I64) {
    for (int64_t i = 0; i < numel; i++) ((int64_t *)tmp)[i] = (int64_t)data[i];
  } else {
    gpu_encode_values(tmp, data, numel, dt);
  }
  // On the compute stream (not the legacy default stream, which the non-blocking compute
  // stream does not wait for), then waited for, so tmp can go and later launches see it.
  bool ok = bytes == 0 || (CU_CHECK(g->d->cuStreamSynchronize(g->compute)) &&
                           CU_CHECK(g->d->cuMemcpyHtoDAsync(p, tmp, bytes, g->compute)) &&
                           CU_CHECK(g->d->cuStreamSynchronize(g->compute)));
  free(tmp);
  return ok || fail(err, err_size, "writing tensor %s: %s", g->ir->tensors[t].name,
                    cuda_last_error());
}

static void decode_values(float *dst, const void *src, int64_t n, DType dt) {
  if (dt == DT_F32) {
    memcpy(dst, src, (size_t)n * 4);
  } else if (dt == DT_I64) {
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((const int64_t *)src)[i];
  } else if (dt == DT_F64) {
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
  } else {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = dt == DT_FP16 ? fp16_decode(h[i]) : bf16_decode(h[i]);
  }
}

bool gpu_exec_read_tensor(GpuExec *g, int t, float *out, int64_t cap, int64_t *numel,
                          int64_t *nrows, int64_t **row_ids, char *err, size_t err_size) {
  CUdeviceptr p;
  const Tensor *tt = &g->ir->tensors[t];
  if (!tensor_addr(g, t, &p)) return fail(err, err_size, "tensor %s has no storage", tt->name);
  const CudaDriver *d = g->d;
  if (!CU_CHECK(d->cuStreamSynchronize(g->compute)))
    return fail(err, err_size, "%s", cuda_last_error());
  if (tt->layout == LAYOUT_ROWS) {
    // [int64 U][int64 ids[Umax]][fp32 Umax x D]
    const Slot *sl = g->cur >= 0 ? &g->slots[g->cur] : NULL;
    int64_t zero[64] = {0}, umax, width, u = 0;
    gpu_tensor_shape(g->ir, t, sl ? sl->B : 0, sl ? sl->totals : zero, &umax, &width);
    if (!CU_CHECK(d->cuMemcpyDtoH(&u, p, 8)))
      return fail(err, err_size, "reading %s: %s", tt->name, cuda_last_error());
    if (u < 0 || u > umax)
      return fail(err, err_size, "%s holds %" PRId64 " rows, more than its %" PRId64,
                  tt->name, u, umax);
    if (u * width > cap) return fail(err, err_size, "%s: output too small", tt->name);
    int64_t *ids = xcalloc((size_t)u + 1, 8);
    bool ok = (u == 0 || CU_CHECK(d->cuMemcpyDtoH(ids, p + 8, (size_t)u * 8))) &&
              (u == 0 || CU_CHECK(d->cuMemcpyDtoH(out, p + 8 + (CUdeviceptr)umax * 8,
                                                  (size_t)(u * width) * 4)));
    if (!ok) {
      free(ids);
      return fail(err, err_size, "reading %s: %s", tt->name, cuda_last_error());
    }
    if (nrows) *nrows = u;
    if (row_ids) *row_ids = ids;
    else free(ids);
    *numel = u * width;
    return true;
  }
  int64_t n = stored_numel(g, t);
  if (n > cap) return fail(err, err_size, "%s: output too small", tt->name);
  size_t bytes = (size_t)(n * gpu_dtype_bytes(tt->dtype));
  void *tmp = xcalloc(bytes ? bytes : 1, 1);
  bool ok = bytes == 0 || CU_CHECK(d->cuMemcpyDtoH(tmp, p, bytes));
  if (ok) decode_values(out, tmp, n, tt->dtype);
  free(tmp);
  if (!ok) return fail(err, err_size, "reading %s: %s", tt->name, cuda_last_error());
  *numel = n;
  if (nrows) *nrows = 0;
  if (row_ids) *row_ids = NULL;
  return true;
}

bool gpu_exec_upload_params(GpuExec *g, CpuExec *x, char *err, size_t err_size) {
  const CudaDriver *d = g->d;
  for (int i = 0; i < g->p->nbuffers; i++) {
    if (!g->p->buffers[i].persistent) continue;
    int64_t bytes = sym(g->p->buffers[i].bytes, 0, NULL);
    if (bytes > 0 && !CU_CHECK(d->cuMemsetD8Async(g->buffers[i], 0, (size_t)bytes, g->compute)))
      return fail(err, err_size, "zeroing %s: %s", g->p->buffers[i].name, cuda_last_error());
  }
  for (int t = 0; t < g->ir->ntensors; t++) {
    const Tensor *tt = &g->ir->tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    const float *src = cpu_exec_data(x, t);
    if (!src || g->p->tensor_buffer[t] < 0) continue;
    if (!gpu_exec_write_tensor(g, t, src, cpu_exec_numel(x, t), err, err_size)) return false;
  }
  return CU_CHECK(d->cuStreamSynchronize(g->compute)) ||
         fail(err, err_size, "%s", cuda_last_error());
}

bool gpu_exec_download_params(GpuExec *g, CpuExec *x, char *err, size_t err_size) {
  for (int t = 0; t < g->ir->ntensors; t++) {
    const Tensor *tt = &g->ir->tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    float *dst = cpu_exec_data(x, t);
    if (!dst || g->p->tensor_buffer[t] < 0) continue;
    int64_t n = cpu_exec_numel(x, t), got = 0;
    if (!gpu_exec_read_tensor(g, t, dst, n, &got, NULL, NULL, err, err_size)) return false;
  }
  return true;
}

// Copies the optimizer state of tensor t between the plan's buffers and s, one slot at a time,
// on the compute stream, and waits: the host arrays are the caller's.
static bool transfer_optstate(GpuExec *g, int t, const OptimState *s, bool upload, char *err,
                              size_t err_size) {
  if (!gpu_optstate_check(g->p, t, s, err, err_size)) return false;
  const CudaDriver *d = g->d;
  if (!CU_CHECK(d->cuStreamSynchronize(g->compute)))
    return fail(err, err_size, "%s", cuda_last_error());
  for (int slot = 0; slot < GPU_OPTSTATE_SLOTS; slot++) {
    int64_t n = gpu_optstate_numel(g->p, t, slot);
    if (n <= 0) continue;
    CUdeviceptr dev = g->buffers[g->p->optstate_buffer[2 * t + slot]];
    void *host = gpu_optstate_host(s, slot);
    bool ok = upload ? CU_CHECK(d->cuMemcpyHtoDAsync(dev, host, (size_t)n * 4, g->compute))
                     : CU_CHECK(d->cuMemcpyDtoHAsync(host, dev, (size_t)n * 4, g->compute));
    if (!ok)
      return fail(err, err_size, "%s optimizer state %d of %s: %s", upload ? "writing" : "reading",
                  slot, g->ir->tensors[t].name, cuda_last_error());
  }
  return CU_CHECK(d->cuStreamSynchronize(g->compute)) ||
         fail(err, err_size, "%s the optimizer state of %s: %s", upload ? "writing" : "reading",
              g->ir->tensors[t].name, cuda_last_error());
}

bool gpu_exec_download_optstate(GpuExec *g, int t, OptimState *s, char *err, size_t err_size) {
  return transfer_optstate(g, t, s, false, err, err_size);
}

bool gpu_exec_upload_optstate(GpuExec *g, int t, const OptimState *s, char *err,
                              size_t err_size) {
  return transfer_optstate(g, t, s, true, err, err_size);
}

// --- the divergence guard ---------------------------------------------------------------

typedef struct Checked {
  int tensor, slot;
  CUdeviceptr p;
  int64_t numel;
  int kind;  // gemc_count_nonfinite's: 0 fp32, 1 bf16, 2 fp16
} Checked;

static int guard_kind(DType dt) {
  return dt == DT_FP16 ? 2 : gpu_dtype_bytes(dt) == 2 ? 1 : 0;
}

// The buffers gpu_exec_check_finite looks at, into list (malloc'd); returns how many.
static int guard_list(GpuExec *g, bool grads, Checked **list) {
  const Ir *ir = g->ir;
  int n = 0, cap = 16;
  Checked *l = xcalloc((size_t)cap, sizeof *l);
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *tt = &ir->tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) continue;
    for (int slot = -1; slot < GPU_OPTSTATE_SLOTS; slot++) {
      Checked c = {.tensor = t, .slot = slot};
      if (grads) {
        int gt = ir_grad_of(ir, t);
        if (slot >= 0 || tt->kind != TENSOR_PARAM || gt < 0 || !tensor_addr(g, gt, &c.p) ||
            ir->tensors[gt].layout == LAYOUT_ROWS)
          continue;
        c.numel = stored_numel(g, gt);
        c.kind = guard_kind(ir->tensors[gt].dtype);
      } else if (slot < 0) {
        if (!tensor_addr(g, t, &c.p)) continue;
        c.numel = stored_numel(g, t);
        c.kind = guard_kind(tt->dtype);
      } else {
        c.numel = gpu_optstate_numel(g->p, t, slot);
        if (c.numel <= 0) continue;
        c.p = g->buffers[g->p->optstate_buffer[2 * t + slot]];
      }
      if (c.numel <= 0) continue;
      if (n == cap) l = xrealloc(l, (size_t)(cap *= 2) * sizeof *l);
      l[n++] = c;
    }
  }
  *list = l;
  return n;
}

bool gpu_exec_check_finite(GpuExec *g, bool grads, GpuNonFinite *first, char *err,
                           size_t err_size) {
  const CudaDriver *d = g->d;
  memset(first, 0, sizeof *first);
  first->tensor = -1;
  if (!g->guard_fn &&
      !(CU_CHECK(d->cuModuleLoadData(&g->guard_module, gpu_helpers_ptx)) &&
        CU_CHECK(d->cuModuleGetFunction(&g->guard_fn, g->guard_module,
                                        "gemc_count_nonfinite"))))
    return fail(err, err_size, "loading the finite-check kernel: %s", cuda_last_error());
  Checked *list;
  int n = guard_list(g, grads, &list);
  bool ok = true;
  if (n > g->guard_cap) {
    if (g->guard_counts) d->cuMemFree(g->guard_counts);
    g->guard_counts = 0;
    g->guard_cap = 0;
    if (!alloc_device(g, &g->guard_counts, (size_t)n * 16, "the finite-check counters", err,
                      err_size)) {
      free(list);
      return false;
    }
    g->guard_cap = n;
  }
  uint64_t *counts = xcalloc((size_t)n * 2 + 2, sizeof *counts);
  ok = ok && (n == 0 || CU_CHECK(d->cuMemsetD8Async(g->guard_counts, 0, (size_t)n * 16,
                                                     g->compute)));
  for (int i = 0; ok && i < n; i++) {
    CUdeviceptr out = g->guard_counts + (CUdeviceptr)i * 16;
    long long numel = list[i].numel;
    int kind = list[i].kind;
    void *params[] = {&list[i].p, &numel, &kind, &out};
    int64_t blocks = (numel + 255) / 256;
    if (blocks > 1024) blocks = 1024;
    ok = CU_CHECK(d->cuLaunchKernel(g->guard_fn, (unsigned)blocks, 1, 1, 256, 1, 1, 0,
                                    g->compute, params, NULL));
  }
  ok = ok && (n == 0 || CU_CHECK(d->cuMemcpyDtoHAsync(counts, g->guard_counts, (size_t)n * 16,
                                                      g->compute))) &&
       CU_CHECK(d->cuStreamSynchronize(g->compute));
  for (int i = 0; ok && i < n && first->tensor < 0; i++) {
    if (counts[2 * i] == 0 && counts[2 * i + 1] == 0) continue;
    *first = (GpuNonFinite){list[i].tensor, list[i].slot, (int64_t)counts[2 * i],
                            (int64_t)counts[2 * i + 1], list[i].numel};
  }
  free(counts);
  free(list);
  return ok || fail(err, err_size, "checking the %s for NaN and infinite values: %s",
                    grads ? "gradients" : "parameters", cuda_last_error());
}

// --- distributed training ---------------------------------------------------------------

void gpu_exec_set_launch_hook(GpuExec *g, GpuLaunchHook hook, void *ctx) {
  g->hook = hook;
  g->hook_ctx = ctx;
}

bool gpu_exec_record(GpuExec *g, CUevent e, char *err, size_t err_size) {
  if (!CU_CHECK(g->d->cuEventRecord(e, g->compute)))
    return fail(err, err_size, "recording an event: %s", cuda_last_error());
  return true;
}

// Buffer b of the plan, as launch l's pointer arguments reach it.
static bool arg_buffer(const Plan *p, const Ir *ir, const LaunchArg *a, int b) {
  switch (a->kind) {
    case ARG_TENSOR:
    case ARG_TENSOR_MAP: return a->tensor >= 0 && p->tensor_buffer[a->tensor] == b;
    case ARG_GRAD: {
      int gt = ir_grad_of(ir, a->tensor);
      return gt >= 0 && p->tensor_buffer[gt] == b;
    }
    case ARG_OPTSTATE:
      return p->optstate_buffer && p->optstate_buffer[2 * a->tensor + a->slot] == b;
    case ARG_SCRATCH: return p->scratch[a->slot].buffer == b;
    default: return false;
  }
}

static bool launch_touches(const Plan *p, const Ir *ir, const Launch *l, int b) {
  switch (l->kind) {
    case LAUNCH_ZERO: return arg_buffer(p, ir, &l->zero_arg, b);
    case LAUNCH_GEMM:
      return arg_buffer(p, ir, &l->gemm_a, b) || arg_buffer(p, ir, &l->gemm_b, b) ||
             arg_buffer(p, ir, &l->gemm_c, b) ||
             (l->gemm_has_bias && arg_buffer(p, ir, &l->gemm_bias, b)) ||
             arg_buffer(p, ir, &l->gemm_scale_a, b) || arg_buffer(p, ir, &l->gemm_scale_b, b);
    case LAUNCH_KERNEL:
      for (int i = 0; i < l->nargs; i++)
        if (arg_buffer(p, ir, &l->args[i], b)) return true;
      return false;
  }
  return false;
}

bool gpu_exec_grad(const GpuExec *g, int param, CUdeviceptr *ptr, int64_t *numel,
                   int *last_launch) {
  int gt = ir_grad_of(g->ir, param);
  if (gt < 0 || g->ir->tensors[gt].dtype != DT_F32 || g->layout.feature_of[gt] >= 0) return false;
  int b = g->p->tensor_buffer[gt];
  if (b < 0 || !tensor_addr(g, gt, ptr)) return false;
  *numel = stored_numel(g, gt);
  *last_launch = -1;
  for (int i = 0; i < g->p->nlaunches; i++) {
    const Launch *l = &g->p->launches[i];
    if (l->backward && !l->optimizer && launch_touches(g->p, g->ir, l, b)) *last_launch = i;
  }
  return true;
}

bool gpu_exec_read_rows(GpuExec *g, int t, int64_t **ids, float **vals, int64_t *n, char *err,
                        size_t err_size) {
  const Slot *sl = g->cur >= 0 ? &g->slots[g->cur] : NULL;
  int64_t zero[64] = {0}, umax = 0, width = 0, numel = 0;
  gpu_tensor_shape(g->ir, t, sl ? sl->B : 0, sl ? sl->totals : zero, &umax, &width);
  *vals = xcalloc((size_t)(umax * width) + 1, sizeof **vals);
  *ids = NULL;
  if (!gpu_exec_read_tensor(g, t, *vals, umax * width, &numel, n, ids, err, err_size)) {
    free(*vals);
    *vals = NULL;
    return false;
  }
  return true;
}

bool gpu_exec_write_rows(GpuExec *g, int t, const int64_t *ids, const float *vals, int64_t n,
                         char *err, size_t err_size) {
  const Tensor *tt = &g->ir->tensors[t];
  int b = g->p->tensor_buffer[t];
  CUdeviceptr p;
  if (tt->layout != LAYOUT_ROWS || b < 0 || !tensor_addr(g, t, &p))
    return fail(err, err_size, "%s is not a table's rows on the device", tt->name);
  int64_t tmax[64], umax = 0, width = 0;
  const int64_t *totals = max_totals(g, tmax);
  gpu_tensor_shape(g->ir, t, g->o.max_batch, totals, &umax, &width);
  int64_t cap = sym(g->p->buffers[b].bytes, g->o.max_batch, totals) -
                (int64_t)(p - g->buffers[b]);
  int64_t bytes = 8 + n * 8 + n * width * 4;
  if (n < 0 || bytes > cap)
    return fail(err, err_size, "%" PRId64 " merged rows of %s take %" PRId64 " bytes, more "
                "than its buffer's %" PRId64, n, tt->name, bytes, cap);
  unsigned char *host = xcalloc((size_t)bytes, 1);
  memcpy(host, &n, 8);
  if (n > 0) {
    memcpy(host + 8, ids, (size_t)n * 8);
    memcpy(host + 8 + (size_t)n * 8, vals, (size_t)(n * width) * 4);
  }
  // Ordered on the compute stream, before the optimizer launches that read it.
  bool ok = CU_CHECK(g->d->cuMemcpyHtoDAsync(p, host, (size_t)bytes, g->compute)) &&
            CU_CHECK(g->d->cuStreamSynchronize(g->compute));
  free(host);
  if (!ok) return fail(err, err_size, "writing %s: %s", tt->name, cuda_last_error());
  return true;
}

int gpu_exec_ntasks(const GpuExec *g) { return g->ntasks; }
const float *gpu_exec_task_probs(const GpuExec *g, int task) { return g->task_probs[task]; }

void gpu_exec_stats(const GpuExec *g, GpuExecStats *out) { *out = g->stats; }
