// cpu_exec.c: the CPU executor's frame: it owns one buffer per tensor, binds a batch (checking
// that it fits the IR), runs the forward and backward nodes in order through the kernels of
// the mode (cpu_kernels_f32.c or cpu_kernels_f64.c), rounds each node's output to its dtype in
// fp32 mode, and hands out values, gradients and per-task probabilities.
//
// Tensors are sized per batch (dense rows B, set rows B·k, jagged rows T_s); values take their
// buffers from the pool of cpu_pool.c as their nodes run; parameters and tables are allocated
// once and persist. docs/executor.md describes the whole executor.
#include "cpu_exec.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "checked_math.h"
#include "cpu_exec_internal.h"
#include "internal_error.h"
#include "numerics.h"

// --- memory -----------------------------------------------------------------------------

void *cpu_scratch(CpuExec *x, int slot, size_t bytes) {
  GEMC_ASSERT(slot >= 0 && slot < CPU_SCRATCH_SLOTS);
  Scratch *s = &x->scratch[slot];
  if (bytes > s->size) {
    free(s->data);
    size_t size = bytes + bytes / 4 + 64;
    s->data = malloc(size);
    if (!s->data) gemc_internal_error(__FILE__, __LINE__, "cpu executor: out of memory");
    s->size = size;
  }
  return s->data;
}

// Makes tensor t's own buffer hold at least numel elements (zeroed when it grows) and points
// its data there. Buffers of batch-sized tensors grow with headroom, so that batches whose
// totals wander by a few percent reuse them (fresh pages cost a page fault each); parameters
// and tables are allocated exactly.
static void ensure_capacity(CpuExec *x, int t, int64_t numel, bool headroom) {
  TensorBuf *b = &x->buf[t];
  if (numel > b->own_cap || !b->own) {
    free(b->own);
    int64_t cap = numel;
    if (headroom) {
      cap = numel + numel / 8;
      if (cap < b->own_cap + b->own_cap / 2) cap = b->own_cap + b->own_cap / 2;
    }
    if (cap < 1) cap = 1;
    b->own = xcalloc((size_t)cap, x->elem);
    b->own_cap = cap;
  }
  b->data = b->own;
}

void cpu_resize_rows(CpuExec *x, int t, int64_t nrows) {
  TensorBuf *b = &x->buf[t];
  if (nrows > b->cap_ids || !b->row_ids) {
    free(b->row_ids);
    b->cap_ids = nrows > 0 ? nrows : 1;
    b->row_ids = xcalloc((size_t)b->cap_ids, sizeof *b->row_ids);
  }
  ensure_capacity(x, t, nrows * b->width, true);
  b->rows = nrows;
  b->numel = nrows * b->width;
}

// --- shapes -----------------------------------------------------------------------------

const int64_t *cpu_offsets_of(const CpuExec *x, int t) {
  const Tensor *tt = &x->ir->tensors[t];
  return tt->layout == LAYOUT_JAGGED ? x->offsets[tt->jag] : NULL;
}

// Rows and width of tensor ti for batch size B and jagged totals (fixed tensors ignore both;
// a rows tensor keeps the rows its table_grad found).
static void shape_of(const CpuExec *x, int ti, int64_t B, const int64_t *total, int64_t *rows,
                     int64_t *width) {
  const Tensor *t = &x->ir->tensors[ti];
  *width = t->width > 0 ? t->width : 1;
  switch (t->layout) {
  case LAYOUT_DENSE: *rows = B; return;
  case LAYOUT_SET: *rows = B * t->set_k; return;
  case LAYOUT_JAGGED: *rows = total[t->jag]; return;
  case LAYOUT_FIXED:
    *rows = t->nfixed == 2 ? t->fixed[0] : 1;
    *width = t->nfixed == 2 ? t->fixed[1] : t->fixed[0];
    return;
  case LAYOUT_SCALAR: *rows = 1, *width = 1; return;
  case LAYOUT_ROWS: *rows = x->buf[ti].rows; return;
  }
  GEMC_UNREACHABLE();
}

// --- creation ---------------------------------------------------------------------------

static const NodeKernel *kernels_of(const CpuExec *x) {
  return x->mode == EXEC_F64 ? cpu_kernels_f64 : cpu_kernels_f32;
}

static bool is_attention_bwd(OpKind op) {
  return op == OP_ATTENTION_BWD_Q || op == OP_ATTENTION_BWD_K || op == OP_ATTENTION_BWD_V;
}

// Two attention backward nodes of one forward attention: the same inputs and attributes.
static bool same_attention(const Node *a, const Node *b) {
  return a->nins == 4 && b->nins == 4 && memcmp(a->ins, b->ins, 4 * sizeof *a->ins) == 0 &&
         a->shape == b->shape && a->heads == b->heads && a->act == b->act &&
         a->mask == b->mask && a->window == b->window && a->scale == b->scale &&
         a->hstu_norm == b->hstu_norm && a->prec == b->prec &&
         a->sched.gelu_taylor == b->sched.gelu_taylor;
}

// The three backward nodes of one attention read the same q, k, v and dO: the first one
// computes all three outputs, and the others are skipped.
static void pair_attention_backward(CpuExec *x) {
  const Ir *ir = x->ir;
  for (int i = 0; i < ir->nnodes; i++) x->fused[i] = x->bwd_q[i] = x->bwd_k[i] = x->bwd_v[i] = -1;
  for (int i = x->nforward; i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    if (!is_attention_bwd(n->op) || x->fused[i] >= 0) continue;
    for (int j = i; j < ir->nnodes; j++) {
      const Node *m = &ir->nodes[j];
      if (!is_attention_bwd(m->op) || x->fused[j] >= 0 || !same_attention(m, n)) continue;
      int *slot = m->op == OP_ATTENTION_BWD_Q ? &x->bwd_q[i]
                  : m->op == OP_ATTENTION_BWD_K ? &x->bwd_k[i]
                                                : &x->bwd_v[i];
      if (*slot >= 0) continue;  // two nodes of one kind: each computes its own
      *slot = j;
      if (j != i) x->fused[j] = i;
    }
  }
}

CpuExec *cpu_exec_new(const Ir *ir, ExecMode mode) { return cpu_exec_new_parts(ir, mode, NULL, NULL); }

CpuExec *cpu_exec_new_windowed(const Ir *ir, ExecMode mode, const bool *windowed) {
  return cpu_exec_new_parts(ir, mode, windowed, NULL);
}

static bool is_gathered(const Ir *ir, const bool *gathered, int t) {
  return gathered && gathered[t] && ir->tensors[t].kind == TENSOR_PARAM;
}

// The gradient of a gathered parameter: allocated when the backward pass writes it, and
// released by its owner (cpu_exec_release_grad).
static bool is_gathered_grad(const Ir *ir, const bool *gathered, int t) {
  if (!gathered) return false;
  for (int i = 0; i < ir->ngrads; i++)
    if (ir->grads[i].grad == t && is_gathered(ir, gathered, ir->grads[i].param)) return true;
  return false;
}

// first[p][t], last[p][t]: the first and last node of pass p (0: forward, 1: backward) that
// reads gathered parameter t, or -1.
static void gather_spans(const Ir *ir, const bool *gathered, int nforward, int *first[2],
                         int *last[2]) {
  for (int p = 0; p < 2; p++)
    for (int t = 0; t < ir->ntensors; t++) first[p][t] = last[p][t] = -1;
  for (int i = 0; i < ir->nnodes; i++) {
    int p = i >= nforward;
    for (int k = 0; k < ir->nodes[i].nins; k++) {
      int t = ir->nodes[i].ins[k];
      if (!is_gathered(ir, gathered, t)) continue;
      if (first[p][t] < 0) first[p][t] = i;
      last[p][t] = i;
    }
  }
}

static int64_t param_numel(const Tensor *t) {
  return t->nfixed == 2 ? t->fixed[0] * t->fixed[1] : t->fixed[0];
}

int64_t cpu_exec_gathered_peak(const Ir *ir, const bool *gathered) {
  int nforward = ir->nforward > 0 && ir->nforward <= ir->nnodes ? ir->nforward : ir->nnodes;
  int *first[2], *last[2];
  for (int p = 0; p < 2; p++) {
    first[p] = xcalloc((size_t)ir->ntensors + 1, sizeof(int));
    last[p] = xcalloc((size_t)ir->ntensors + 1, sizeof(int));
  }
  gather_spans(ir, gathered, nforward, first, last);
  int64_t peak = 0;
  for (int i = 0; i < ir->nnodes; i++) {
    int p = i >= nforward;
    int64_t live = 0;
    for (int t = 0; t < ir->ntensors; t++)
      if (first[p][t] >= 0 && first[p][t] <= i && i <= last[p][t])
        live += param_numel(&ir->tensors[t]);
    if (live > peak) peak = live;
  }
  for (int p = 0; p < 2; p++) free(first[p]), free(last[p]);
  return peak;
}

CpuExec *cpu_exec_new_parts(const Ir *ir, ExecMode mode, const bool *windowed,
                            const bool *gathered) {
  if (gathered && mode != EXEC_F32)
    gemc_internal_error(__FILE__, __LINE__, "gathered parameters need the fp32 mode");
  CpuExec *x = xcalloc(1, sizeof *x);
  x->ir = ir;
  x->mode = mode;
  x->elem = mode == EXEC_F64 ? sizeof(double) : sizeof(float);
  x->nforward = ir->nforward > 0 && ir->nforward <= ir->nnodes ? ir->nforward : ir->nnodes;
  x->buf = xcalloc((size_t)ir->ntensors, sizeof *x->buf);
  x->windowed = xcalloc((size_t)ir->ntensors + 1, sizeof *x->windowed);
  x->feature_of = xcalloc((size_t)ir->ntensors, sizeof *x->feature_of);
  x->total = xcalloc((size_t)ir->njagged + 1, sizeof *x->total);
  x->offsets = xcalloc((size_t)ir->njagged + 1, sizeof *x->offsets);
  x->fused = xcalloc((size_t)ir->nnodes + 1, sizeof *x->fused);
  x->bwd_q = xcalloc((size_t)ir->nnodes + 1, sizeof *x->bwd_q);
  x->bwd_k = xcalloc((size_t)ir->nnodes + 1, sizeof *x->bwd_k);
  x->bwd_v = xcalloc((size_t)ir->nnodes + 1, sizeof *x->bwd_v);
  x->task_node = xcalloc((size_t)ir->nnodes + 1, sizeof *x->task_node);
  x->task_probs = xcalloc((size_t)ir->nnodes + 1, sizeof *x->task_probs);
  x->gemm_work = xcalloc(1, CPU_GEMM_WORK_BYTES);
#if CPU_WIDE_KERNELS
  __builtin_cpu_init();
  x->wide_kernels = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif

  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *tt = &ir->tensors[t];
    x->feature_of[t] = -1;
    if (tt->kind == TENSOR_INPUT || tt->kind == TENSOR_LABEL) x->feature_of[t] = x->nfeatures++;
    TensorBuf *b = &x->buf[t];
    shape_of(x, t, 0, x->total, &b->rows, &b->width);
    // Parameters, tables and parameter gradients have fixed sizes: allocated once, here. A
    // windowed table has the rows its caller gives each batch (cpu_exec_set_table_rows).
    if (windowed && windowed[t] && tt->kind == TENSOR_TABLE) {
      x->windowed[t] = true;
      b->rows = b->numel = 0;
    } else if (is_gathered(ir, gathered, t) || is_gathered_grad(ir, gathered, t)) {
      b->numel = b->rows * b->width;  // allocated while a pass reads (or writes) it
    } else if (tt->layout == LAYOUT_FIXED) {
      b->numel = b->rows * b->width;
      ensure_capacity(x, t, b->numel, false);
    }
  }
  const NodeKernel *k = kernels_of(x);
  for (int i = 0; i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    if ((int)n->op < 0 || n->op >= OP_COUNT || !k[n->op])
      gemc_internal_error(__FILE__, __LINE__, "cpu executor: a node's op has no kernel");
    if (n->op == OP_BCE && i < x->nforward) x->task_node[x->ntasks++] = i;
  }
  pair_attention_backward(x);
  cpu_pool_plan(x);
  for (int p = 0; p < 2; p++) {
    x->gather_first[p] = xcalloc((size_t)ir->ntensors + 1, sizeof(int));
    x->gather_last[p] = xcalloc((size_t)ir->ntensors + 1, sizeof(int));
  }
  gather_spans(ir, gathered, x->nforward, x->gather_first, x->gather_last);
  return x;
}

// --- memory needed and available ----------------------------------------------------------

int64_t cpu_exec_bytes_needed(const Ir *ir, ExecMode mode, int64_t B) {
  return cpu_exec_bytes_needed_rows(ir, mode, B, NULL, NULL);
}

int64_t cpu_exec_bytes_needed_rows(const Ir *ir, ExecMode mode, int64_t B,
                                   const int64_t *table_rows, const int64_t *param_elems) {
  int64_t elem = mode == EXEC_F64 ? (int64_t)sizeof(double) : (int64_t)sizeof(float);
  int64_t total = 0;
  bool *gathered = NULL;
  if (param_elems) {  // the gathered parameters whole at once, at their peak
    gathered = xcalloc((size_t)ir->ntensors + 1, sizeof *gathered);
    for (int i = 0; i < ir->ntensors; i++) gathered[i] = param_elems[i] >= 0;
    total = sat_mul(cpu_exec_gathered_peak(ir, gathered), elem);
  }
  for (int i = 0; i < ir->ntensors; i++) {
    const Tensor *t = &ir->tensors[i];
    if (is_gathered_grad(ir, gathered, i)) continue;  // released as its bucket packs it
    int64_t w = t->width > 0 ? t->width : 1, n = 0, state = 0;
    switch (t->layout) {
    case LAYOUT_DENSE: n = sat_mul(B, w); break;
    case LAYOUT_SET: n = sat_mul(sat_mul(B, t->set_k), w); break;
    case LAYOUT_FIXED: {
      int64_t rows = t->nfixed == 2 ? t->fixed[0] : 1;
      if (t->kind == TENSOR_TABLE && table_rows && table_rows[i] >= 0) rows = table_rows[i];
      n = sat_mul(rows, t->nfixed == 2 ? t->fixed[1] : t->fixed[0]);
      if (t->kind == TENSOR_PARAM && param_elems && param_elems[i] >= 0) n = param_elems[i];
      // Optimizer state in fp32 (optim.c): tables keep one entry per row, parameters one per
      // element.
      int64_t per = t->kind == TENSOR_TABLE ? rows : n;
      if (t->kind == TENSOR_PARAM || t->kind == TENSOR_TABLE) {
        if (t->optim.kind == OPTIM_ADAMW) state = sat_mul(per, 2 * (int64_t)sizeof(float));
        if (t->optim.kind == OPTIM_ROWWISE_ADAGRAD) state = sat_mul(per, (int64_t)sizeof(float));
      }
      break;
    }
    case LAYOUT_SCALAR: n = 1; break;
    case LAYOUT_JAGGED:
    case LAYOUT_ROWS: break;
    }
    total = sat_add(total, sat_add(sat_mul(n, elem), state));
  }
  free(gathered);
  return total;
}

static int64_t available_override = -1;

void cpu_memory_set_available(int64_t bytes) { available_override = bytes; }

int64_t cpu_memory_available(void) {
  if (available_override >= 0) return available_override;
  // Test hook: GEMC_TEST_MEMORY_AVAILABLE=BYTES stands for the machine's memory (tests/dist
  // checks the refusal of a table too large for it, and that sharding it fits).
  const char *hook = getenv("GEMC_TEST_MEMORY_AVAILABLE");
  if (hook && *hook) {
    char *end;
    long long v = strtoll(hook, &end, 10);
    if (*end == '\0' && v >= 0) return (int64_t)v;
  }
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    if (kb >= 0) return sat_mul((int64_t)kb, 1024);
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return sat_mul(pages, page);
  return -1;
}

bool cpu_exec_check_fit(const Ir *ir, ExecMode mode, int64_t B, char *err, size_t err_size) {
  return cpu_exec_check_fit_rows(ir, mode, B, NULL, NULL, 0, err, err_size);
}

bool cpu_exec_check_fit_rows(const Ir *ir, ExecMode mode, int64_t B, const int64_t *table_rows,
                             const int64_t *param_elems, int64_t extra_bytes, char *err,
                             size_t err_size) {
  int64_t need = sat_add(cpu_exec_bytes_needed_rows(ir, mode, B, table_rows, param_elems),
                         extra_bytes);
  int64_t have = cpu_memory_available();
  if (have < 0 || need <= have) return true;
  return fail(err, err_size, "the model needs %s of memory on the CPU at batch %" PRId64
              " (parameters, tables%s, their gradients and optimizer state, one batch's "
              "values%s); this machine has %s available", bytes_text(need).s, B,
              table_rows ? " (this rank's rows of the sharded ones)" : "",
              extra_bytes > 0 ? ", the gradient buckets" : "", bytes_text(have).s);
}

void cpu_exec_free(CpuExec *x) {
  if (!x) return;
  for (int t = 0; t < x->ir->ntensors; t++) {
    free(x->buf[t].own);
    free(x->buf[t].row_ids);
  }
  cpu_pool_free(x);
  for (int s = 0; s < CPU_SCRATCH_SLOTS; s++) free(x->scratch[s].data);
  for (int k = 0; k < x->ntasks; k++) free(x->task_probs[k]);
  free(x->buf);
  free(x->windowed);
  free(x->feature_of);
  free(x->total);
  free(x->offsets);
  free(x->fused);
  free(x->bwd_q);
  free(x->bwd_k);
  free(x->bwd_v);
  free(x->task_node);
  free(x->task_probs);
  for (int p = 0; p < 2; p++) free(x->gather_first[p]), free(x->gather_last[p]);
  free(x->gemm_work);
  free(x);
}

// --- binding a batch --------------------------------------------------------------------

__attribute__((format(printf, 3, 4))) static bool refuse(char *err, size_t size,
                                                         const char *fmt, ...) {
  if (err && size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
  }
  return false;
}

// The fewest rows among the tables that ids tensor t is looked up in (0: none); a windowed
// table has the rows of its window.
static int64_t id_limit(const CpuExec *x, int t) {
  const Ir *ir = x->ir;
  int64_t limit = 0;
  for (int i = 0; i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    if ((n->op != OP_EMBED && n->op != OP_EMBED_POOL) || n->ins[1] != t) continue;
    int64_t rows = x->windowed[n->ins[0]] ? x->buf[n->ins[0]].rows : ir->tensors[n->ins[0]].fixed[0];
    if (limit == 0 || rows < limit) limit = rows;
  }
  return limit;
}

static bool check_offsets(const CpuExec *x, const Batch *b, int j, char *err, size_t size) {
  const JaggedDim *dim = &x->ir->jagged[j];
  const int64_t *off = b->offsets[j];
  if (!off) return refuse(err, size, "jagged dim *%s has no offsets", dim->name);
  if (off[0] != 0)
    return refuse(err, size, "jagged dim *%s: offsets start at %" PRId64 ", not 0", dim->name,
                  off[0]);
  for (int64_t e = 0; e < b->B; e++) {
    int64_t len = off[e + 1] - off[e];
    if (len < 0)
      return refuse(err, size, "jagged dim *%s: example %" PRId64 " has offsets out of order "
                    "(%" PRId64 " then %" PRId64 ")", dim->name, e, off[e], off[e + 1]);
    if (len > dim->max_len)
      return refuse(err, size, "jagged dim *%s: example %" PRId64 " has length %" PRId64
                    ", above the maximum %" PRId64, dim->name, e, len, dim->max_len);
  }
  if (b->total && b->total[j] != off[b->B])
    return refuse(err, size, "jagged dim *%s: total %" PRId64 " differs from the last offset %"
                  PRId64, dim->name, b->total[j], off[b->B]);
  return true;
}

static bool check_feature(const CpuExec *x, const Batch *b, int t, char *err, size_t size) {
  const Ir *ir = x->ir;
  const Tensor *tt = &ir->tensors[t];
  int f = x->feature_of[t];
  int64_t rows = tt->layout == LAYOUT_JAGGED ? b->offsets[tt->jag][b->B] : b->B;
  int64_t count = rows * (tt->width > 0 ? tt->width : 1);
  bool is_ids = tt->dtype == DT_I64;
  if (is_ids ? !b->ids || !b->ids[f] : !b->values || !b->values[f])
    return refuse(err, size, "input %%%s has no %s", tt->name, is_ids ? "ids" : "values");
  if (b->capacity && b->capacity[f] < count)
    return refuse(err, size, "input %%%s holds %" PRId64 " entries; the batch needs %" PRId64,
                  tt->name, b->capacity[f], count);
  if (!is_ids) return true;
  int64_t limit = id_limit(x, t);
  for (int64_t r = 0; r < rows; r++) {
    int64_t id = b->ids[f][r];
    if (id < 0 || (limit > 0 && id >= limit))
      return refuse(err, size, "input %%%s: id %" PRId64 " at entry %" PRId64
                    " is outside [0, %" PRId64 ")", tt->name, id, r, limit);
  }
  return true;
}

static bool check_batch(const CpuExec *x, const Batch *b, char *err, size_t size) {
  const Ir *ir = x->ir;
  if (!b) return refuse(err, size, "no batch");
  if (b->B < 1) return refuse(err, size, "the batch has %" PRId64 " examples", b->B);
  if (b->njagged != ir->njagged)
    return refuse(err, size, "the batch has %d jagged dims; model %s has %d", b->njagged,
                  ir->model, ir->njagged);
  if (b->nfeatures != x->nfeatures)
    return refuse(err, size, "the batch has %d features; model %s has %d inputs and labels",
                  b->nfeatures, ir->model, x->nfeatures);
  if (ir->njagged > 0 && !b->offsets) return refuse(err, size, "the batch has no offsets");
  for (int j = 0; j < ir->njagged; j++)
    if (!check_offsets(x, b, j, err, size)) return false;
  for (int t = 0; t < ir->ntensors; t++)
    if (x->feature_of[t] >= 0 && !check_feature(x, b, t, err, size)) return false;
  return true;
}

// Copies a float feature into tensor t's buffer, as reals.
static void load_values(CpuExec *x, int t, const float *src) {
  TensorBuf *b = &x->buf[t];
  if (x->mode == EXEC_F64) {
    double *dst = b->data;
    for (int64_t i = 0; i < b->numel; i++) dst[i] = src[i];
  } else {
    memcpy(b->data, src, (size_t)b->numel * sizeof(float));
  }
}

bool cpu_exec_set_batch(CpuExec *x, const Batch *b, char *err, size_t err_size) {
  const Ir *ir = x->ir;
  if (!check_batch(x, b, err, err_size)) return false;
  x->batch = b;
  x->B = b->B;
  for (int j = 0; j < ir->njagged; j++) {
    x->offsets[j] = b->offsets[j];
    x->total[j] = b->offsets[j][b->B];
  }
  // New sizes for every batch-sized tensor; inputs are loaded now, values get buffers as
  // their nodes run.
  cpu_pool_reset(x);
  x->forward_ran = false;
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *tt = &ir->tensors[t];
    TensorBuf *buf = &x->buf[t];
    if (tt->layout == LAYOUT_FIXED || tt->layout == LAYOUT_ROWS) continue;
    shape_of(x, t, x->B, x->total, &buf->rows, &buf->width);
    buf->numel = buf->rows * buf->width;
    int f = x->feature_of[t];
    if (f >= 0 && tt->dtype == DT_I64) {
      buf->ids = b->ids[f];
    } else if (f >= 0) {
      ensure_capacity(x, t, buf->numel, true);
      load_values(x, t, b->values[f]);
    }
  }
  if (x->B > x->task_cap) {
    for (int k = 0; k < x->ntasks; k++) {
      free(x->task_probs[k]);
      x->task_probs[k] = xcalloc((size_t)x->B, sizeof(float));
    }
    x->task_cap = x->B;
  }
  return true;
}

// --- running ----------------------------------------------------------------------------

// fp32 mode stores each node's output in its dtype: bf16 and fp16 round to nearest even (fp8
// and mxfp8 outputs are bf16 already). Parameter and table gradients are fp32.
static void round_output(CpuExec *x, int t) {
  const Tensor *tt = &x->ir->tensors[t];
  if (x->mode != EXEC_F32 || tt->dtype == DT_F32) return;
  round_array(x->buf[t].data, (size_t)x->buf[t].numel, tt->dtype);
}

// A buffer for output t of a node about to run: from the pool, or the tensor's own. A rows
// tensor is sized by its table_grad.
static void prepare_output(CpuExec *x, int t) {
  const Tensor *tt = &x->ir->tensors[t];
  if (tt->layout == LAYOUT_ROWS) return;
  if (cpu_pool_holds(x, t))
    cpu_pool_take(x, t);
  else
    ensure_capacity(x, t, x->buf[t].numel, tt->layout != LAYOUT_FIXED);
}

// σ(logit) of every example for the task of bce node i, read as soon as the node has run.
static void store_task_probs(CpuExec *x, int i) {
  for (int k = 0; k < x->ntasks; k++) {
    if (x->task_node[k] != i) continue;
    int logit = x->ir->nodes[i].ins[0];
    for (int64_t b = 0; b < x->B; b++) {
      double z = x->mode == EXEC_F64 ? ((const double *)x->buf[logit].data)[b]
                                     : (double)((const float *)x->buf[logit].data)[b];
      x->task_probs[k][b] = (float)(z >= 0 ? 1 / (1 + exp(-z)) : exp(z) / (1 + exp(z)));
    }
  }
}

// Runs nodes [from, to). A fused attention backward node computes (and rounds) its siblings'
// outputs too, and the siblings are skipped. After each node, the inputs it read last give
// their buffers back to the pool.
// A gathered parameter's whole values, from its first reader of the pass to its last.
static void gather_params(CpuExec *x, int node, bool release) {
  const Node *n = &x->ir->nodes[node];
  int p = node >= x->nforward;
  for (int k = 0; k < n->nins; k++) {
    int t = n->ins[k];
    TensorBuf *b = &x->buf[t];
    if (!release && x->gather_first[p][t] == node && !b->own) {
      ensure_capacity(x, t, b->numel, false);
      if (!x->param_fill)
        gemc_internal_error(__FILE__, __LINE__, "a gathered parameter without a fill");
      x->param_fill(x->param_fill_ctx, t, b->data);
    } else if (release && x->gather_last[p][t] == node && b->own) {
      free(b->own);
      b->own = b->data = NULL;
      b->own_cap = 0;
    }
  }
}

void cpu_exec_set_param_fill(CpuExec *x, CpuParamFill fill, void *ctx) {
  x->param_fill = fill;
  x->param_fill_ctx = ctx;
}

static void run_nodes(CpuExec *x, int from, int to) {
  const NodeKernel *k = kernels_of(x);
  for (int i = from; i < to; i++) {
    const Node *n = &x->ir->nodes[i];
    gather_params(x, i, false);
    if (x->fused[i] < 0) {
      bool group = is_attention_bwd(n->op);
      const int writes[3] = {group ? x->bwd_q[i] : i, group ? x->bwd_k[i] : -1,
                             group ? x->bwd_v[i] : -1};
      for (int s = 0; s < 3; s++)
        if (writes[s] >= 0) prepare_output(x, x->ir->nodes[writes[s]].out);
      k[n->op](x, i);
      for (int s = 0; s < 3; s++)
        if (writes[s] >= 0) round_output(x, x->ir->nodes[writes[s]].out);
      if (n->op == OP_BCE) store_task_probs(x, i);
    }
    cpu_pool_release_inputs(x, i);
    gather_params(x, i, true);
    if (i >= x->nforward && x->backward_hook) x->backward_hook(x->backward_hook_ctx, i);
  }
}

void cpu_exec_set_backward_hook(CpuExec *x, CpuNodeHook hook, void *ctx) {
  x->backward_hook = hook;
  x->backward_hook_ctx = ctx;
}

static double scalar_at(const CpuExec *x, int t) {
  return x->mode == EXEC_F64 ? ((const double *)x->buf[t].data)[0]
                             : (double)((const float *)x->buf[t].data)[0];
}

double cpu_exec_forward(CpuExec *x) {
  if (!x->batch) gemc_internal_error(__FILE__, __LINE__, "cpu_exec_forward before a batch");
  cpu_pool_reset(x);
  run_nodes(x, 0, x->nforward);
  x->forward_ran = true;
  return x->ir->loss >= 0 ? scalar_at(x, x->ir->loss) : NAN;
}

void cpu_exec_backward(CpuExec *x) {
  if (!x->batch) gemc_internal_error(__FILE__, __LINE__, "cpu_exec_backward before a batch");
  // The backward pass gives the forward values back to the pool as it reads them last, so
  // each one needs its own forward pass (unless every value is kept).
  if (!x->forward_ran && !x->keep_values)
    gemc_internal_error(__FILE__, __LINE__, "cpu_exec_backward without a forward pass first");
  run_nodes(x, x->nforward, x->ir->nnodes);
  x->forward_ran = false;
}

void cpu_exec_keep_values(CpuExec *x, bool keep) {
  cpu_pool_reset(x);
  x->forward_ran = false;
  x->keep_values = keep;
}

// --- access -----------------------------------------------------------------------------

void *cpu_exec_set_table_rows(CpuExec *x, int t, int64_t nrows) {
  TensorBuf *b = &x->buf[t];
  ensure_capacity(x, t, nrows * b->width, true);
  b->rows = nrows;
  b->numel = nrows * b->width;
  return b->data;
}

void *cpu_exec_data(CpuExec *x, int t) {
  if (t < 0 || t >= x->ir->ntensors) return NULL;
  if (x->buf[t].ids) return x->buf[t].ids;
  return x->buf[t].data;
}

int64_t cpu_exec_numel(const CpuExec *x, int t) {
  if (t < 0 || t >= x->ir->ntensors) return 0;
  return x->buf[t].numel;
}

void *cpu_exec_grad(CpuExec *x, int t, int64_t *nrows, const int64_t **row_ids) {
  if (nrows) *nrows = 0;
  if (row_ids) *row_ids = NULL;
  if (t < 0 || t >= x->ir->ntensors) return NULL;
  int g = ir_grad_of(x->ir, t);
  if (g < 0) return NULL;
  if (x->ir->tensors[g].layout == LAYOUT_ROWS) {
    if (nrows) *nrows = x->buf[g].rows;
    if (row_ids) *row_ids = x->buf[g].row_ids;
    if (!x->buf[g].data) cpu_resize_rows(x, g, 0);
  }
  return x->buf[g].data;
}

void cpu_exec_release_grad(CpuExec *x, int t) {
  int g = t >= 0 && t < x->ir->ntensors ? ir_grad_of(x->ir, t) : -1;
  if (g < 0 || x->ir->tensors[g].layout != LAYOUT_FIXED) return;
  TensorBuf *b = &x->buf[g];
  free(b->own);
  b->own = b->data = NULL;
  b->own_cap = 0;
}

int cpu_exec_ntasks(const CpuExec *x) { return x->ntasks; }

const char *cpu_exec_task_name(const CpuExec *x, int task) {
  if (task < 0 || task >= x->ntasks) return NULL;
  const char *name = x->ir->nodes[x->task_node[task]].task;
  return name ? name : "";
}

int cpu_exec_task_label(const CpuExec *x, int task) {
  if (task < 0 || task >= x->ntasks) return -1;
  return x->ir->nodes[x->task_node[task]].ins[1];
}

const float *cpu_exec_task_probs(CpuExec *x, int task) {
  if (task < 0 || task >= x->ntasks) return NULL;
  return x->task_probs[task];
}
