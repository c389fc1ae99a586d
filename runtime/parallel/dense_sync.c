// dense_sync.c: the buckets of dense_sync.h.
#include "dense_sync.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "clock.h"
#include "internal_error.h"

typedef struct DParam {
  int tensor, index;    // IR tensor; position in the caller's `params`
  int64_t numel;
  int final_node;       // the backward node that writes its gradient
  int64_t offset;       // in its bucket
} DParam;

typedef struct Bucket {
  int first, count;     // its parameters: p[first, first + count)
  int64_t size;         // elements
  int last_node;        // its gradients are final after this backward node
  float *buf;           // the packed gradients, then the gathered parameters (ZeRO-3: only
                        // while its reduction is in flight)
  float *shard;         // ZeRO-3: this rank's part of its parameters' values, [own_lo, own_hi)
  float *part;          // ZeRO-2: the reduced gradients of this rank's part; ZeRO: the part to send
  int64_t *parts;       // [world] the parts' sizes
  int64_t own_lo, own_hi;  // this rank's part, in bucket elements
  int handle;
  void **dev;           // GPU ranks: its parameters' device gradient buffers [count]
  int64_t *dev_counts;  // and their elements
} Bucket;

struct DenseSync {
  Comm *c;
  const Ir *ir;
  DenseMode mode;
  DParam *p;
  int np;
  Bucket *b;
  int nb;
  CpuExec *x;
  bool device;          // GPU ranks: gradients in device buffers (dense_sync_new_device)
  void *event;          // GPU ranks: the compute-stream event a starting bucket waits for
  double share;
  int next;             // the next bucket to start
  bool failed;
  char err[320];
  double wait_s;
  double span_start, span_s;
  // ZeRO-3 with the divergence guard (dense_sync_count_bad): each parameter's non-finite
  // gradient values, counted when its bucket packed (and released) them this step.
  bool count_bad;
  int64_t (*bad)[2];    // [np]: NaN, Inf, by `params` index
  bool *counted;        // [np]: packed this step
};

const char *dense_mode_name(DenseMode m) {
  return m == DENSE_ZERO1   ? "zero1"
         : m == DENSE_ZERO2 ? "zero2"
         : m == DENSE_ZERO3 ? "zero3"
                            : "data-parallel";
}

bool dense_mode_parse(const char *s, DenseMode *out) {
  if (strcmp(s, "data-parallel") == 0 || strcmp(s, "dp") == 0) *out = DENSE_DATA_PARALLEL;
  else if (strcmp(s, "zero1") == 0) *out = DENSE_ZERO1;
  else if (strcmp(s, "zero2") == 0) *out = DENSE_ZERO2;
  else if (strcmp(s, "zero3") == 0) *out = DENSE_ZERO3;
  else return false;
  return true;
}

static int by_final_node(const void *a, const void *b) {
  const DParam *x = a, *y = b;
  if (x->final_node != y->final_node) return x->final_node < y->final_node ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static int64_t param_numel(const Tensor *t) {
  return t->fixed[0] * (t->nfixed > 1 ? t->fixed[1] : 1);
}

// final[i] (NULL: the IR node producing the gradient) orders the parameters into buckets;
// grads[i] (NULL: host gradients) are the device buffers of GPU ranks.
static DenseSync *build(Comm *c, const Ir *ir, DenseMode mode, int64_t bucket_bytes,
                        const int *params, const int *final, void *const *grads, int n) {
  DenseSync *d = xcalloc(1, sizeof *d);
  d->c = c;
  d->ir = ir;
  d->mode = mode;
  d->device = grads != NULL;
  d->p = xcalloc((size_t)n + 1, sizeof *d->p);
  d->np = n;
  void **dev = xcalloc((size_t)n + 1, sizeof *dev);
  for (int i = 0; i < n; i++) {
    const Tensor *t = &ir->tensors[params[i]];
    int g = ir_grad_of(ir, params[i]);
    d->p[i] = (DParam){.tensor = params[i], .index = i,
                       .numel = param_numel(t),
                       .final_node = final ? final[i]
                                     : g >= 0 ? ir->tensors[g].producer : ir->nnodes - 1};
    if (grads) dev[i] = grads[i];
  }
  qsort(d->p, (size_t)n, sizeof *d->p, by_final_node);
  int64_t cap = bucket_bytes / (int64_t)sizeof(float);
  if (cap < 1) cap = 1;
  d->b = xcalloc((size_t)n + 1, sizeof *d->b);
  int world = comm_world(c), rank = comm_rank(c);
  for (int i = 0; i < n; i++) {
    Bucket *k = d->nb ? &d->b[d->nb - 1] : NULL;
    if (!k || (k->size > 0 && k->size + d->p[i].numel > cap)) {
      k = &d->b[d->nb++];
      k->first = i;
    }
    d->p[i].offset = k->size;
    k->size += d->p[i].numel;
    k->count++;
    k->last_node = d->p[i].final_node;
  }
  for (int j = 0; j < d->nb; j++) {
    Bucket *k = &d->b[j];
    if (mode != DENSE_ZERO3) k->buf = xcalloc((size_t)k->size + 1, sizeof *k->buf);
    k->parts = xcalloc((size_t)world, sizeof *k->parts);
    for (int r = 0; r < world; r++)
      k->parts[r] = k->size * (r + 1) / world - k->size * r / world;
    k->own_lo = k->size * rank / world;
    k->own_hi = k->size * (rank + 1) / world;
    k->part = xcalloc((size_t)(k->own_hi - k->own_lo) + 1, sizeof *k->part);
    if (mode == DENSE_ZERO3)
      k->shard = xcalloc((size_t)(k->own_hi - k->own_lo) + 1, sizeof *k->shard);
    k->handle = -1;
    k->dev = xcalloc((size_t)k->count + 1, sizeof *k->dev);
    k->dev_counts = xcalloc((size_t)k->count + 1, sizeof *k->dev_counts);
    for (int i = 0; i < k->count; i++) {
      k->dev[i] = dev[d->p[k->first + i].index];
      k->dev_counts[i] = d->p[k->first + i].numel;
    }
  }
  free(dev);
  return d;
}

DenseSync *dense_sync_new(Comm *c, const Ir *ir, DenseMode mode, int64_t bucket_bytes,
                          const int *params, int n) {
  return build(c, ir, mode, bucket_bytes, params, NULL, NULL, n);
}

DenseSync *dense_sync_new_device(Comm *c, const Ir *ir, int64_t bucket_bytes,
                                 const int *params, const int *final, void *const *grads,
                                 int n) {
  return build(c, ir, DENSE_DATA_PARALLEL, bucket_bytes, params, final, grads, n);
}

int64_t dense_sync_bytes_needed(const Ir *ir, DenseMode mode, int64_t bucket_bytes,
                                const int *params, int n, int world) {
  int64_t total = 0, biggest = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = param_numel(&ir->tensors[params[i]]);
    total += numel;
    if (numel > biggest) biggest = numel;
  }
  int64_t cap = bucket_bytes / (int64_t)sizeof(float);
  if (cap < biggest) cap = biggest;  // a parameter larger than a bucket is a bucket of its own
  if (cap > total) cap = total;
  int64_t packed = mode == DENSE_ZERO3 ? 3 * cap : total;
  if (packed > total) packed = total;
  return (packed + total / (world > 0 ? world : 1)) * (int64_t)sizeof(float);
}

bool dense_sync_due(const DenseSync *d, int step) {
  return !d->failed && d->next < d->nb && d->b[d->next].last_node <= step;
}

void dense_sync_begin_device(DenseSync *d, double share, void *event) {
  dense_sync_begin(d, NULL, share);
  d->event = event;
}

void dense_sync_free(DenseSync *d) {
  if (!d) return;
  for (int j = 0; j < d->nb; j++) {
    free(d->b[j].buf);
    free(d->b[j].shard);
    free(d->b[j].part);
    free(d->b[j].parts);
    free(d->b[j].dev);
    free(d->b[j].dev_counts);
  }
  free(d->b);
  free(d->p);
  free(d->bad);
  free(d->counted);
  free(d);
}

DenseMode dense_sync_mode(const DenseSync *d) { return d->mode; }
int dense_sync_buckets(const DenseSync *d) { return d->nb; }
int64_t dense_sync_elements(const DenseSync *d) {
  int64_t n = 0;
  for (int j = 0; j < d->nb; j++) n += d->b[j].size;
  return n;
}
double dense_sync_wait_seconds(const DenseSync *d) { return d->wait_s; }
double dense_sync_span_seconds(const DenseSync *d) { return d->span_s; }

void dense_sync_begin(DenseSync *d, CpuExec *x, double share) {
  d->x = x;
  d->share = share;
  d->next = 0;
  d->failed = false;
  d->wait_s = 0;
  d->span_start = 0;
  d->span_s = 0;
  if (d->bad) {
    memset(d->bad, 0, (size_t)d->np * sizeof *d->bad);
    memset(d->counted, 0, (size_t)d->np * sizeof *d->counted);
  }
}

// GPU ranks: the bucket's gradients all-reduced in place, scaled by the share, after the
// compute stream's event.
static void start_device_bucket(DenseSync *d, Bucket *k, int index) {
  char what[64];
  snprintf(what, sizeof what, "dense gradients, bucket %d of %d", index + 1, d->nb);
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .nbufs = k->count,
                   .bufs = k->dev, .buf_counts = k->dev_counts, .scale = (float)d->share,
                   .device = true, .wait_for = d->event, .what = what};
  if (call.scale == 1) call.scale = 0;
  k->handle = comm_start(d->c, &call, d->err, sizeof d->err);
  if (k->handle < 0) d->failed = true;
}

static void start_bucket(DenseSync *d, Bucket *k, int index) {
  if (index == 0) d->span_start = monotonic_seconds();
  if (d->device) {
    start_device_bucket(d, k, index);
    return;
  }
  float s = (float)d->share;
  // (ZeRO-3 allocates it per step: it lives while the bucket's reduction is in flight)
  if (!k->buf) k->buf = xcalloc((size_t)k->size + 1, sizeof *k->buf);
  for (int i = k->first; i < k->first + k->count; i++) {
    const float *g = cpu_exec_grad(d->x, d->p[i].tensor, NULL, NULL);
    float *dst = k->buf + d->p[i].offset;
    if (!g) memset(dst, 0, (size_t)d->p[i].numel * sizeof *dst);
    else for (int64_t e = 0; e < d->p[i].numel; e++) dst[e] = g[e] * s;
    if (d->mode != DENSE_ZERO3 || !g) continue;
    // ZeRO-3: the divergence guard's count, then the executor's buffer goes.
    if (d->count_bad) {
      int64_t *bad = d->bad[d->p[i].index];
      for (int64_t e = 0; e < d->p[i].numel; e++)
        if (!isfinite(g[e])) bad[isnan(g[e]) ? 0 : 1]++;
      d->counted[d->p[i].index] = true;
    }
    cpu_exec_release_grad(d->x, d->p[i].tensor);
  }
  char what[64];
  snprintf(what, sizeof what, "dense gradients, bucket %d of %d", index + 1, d->nb);
  CommCall call = {.dtype = COMM_F32, .send = k->buf, .what = what};
  if (d->mode == DENSE_ZERO2 || d->mode == DENSE_ZERO3) {
    call.kind = COMM_REDUCE_SCATTER;
    call.recv = k->part;
    call.counts = k->parts;
  } else {
    call.kind = COMM_ALLREDUCE;
    call.recv = k->buf;
    call.count = k->size;
  }
  k->handle = comm_start(d->c, &call, d->err, sizeof d->err);
  if (k->handle < 0) d->failed = true;
}

// ZeRO-3 keeps at most two buckets' packed gradients: the one before last is waited for
// (and its buffer freed) before the next starts.
static void retire_bucket(DenseSync *d, int j) {
  Bucket *k = &d->b[j];
  double t0 = monotonic_seconds();
  if (k->handle >= 0 && !comm_wait(d->c, k->handle, d->err, sizeof d->err)) d->failed = true;
  d->wait_s += monotonic_seconds() - t0;
  k->handle = -1;
  free(k->buf);
  k->buf = NULL;
}

void dense_sync_node_done(DenseSync *d, int node) {
  while (!d->failed && d->next < d->nb && d->b[d->next].last_node <= node) {
    if (d->mode == DENSE_ZERO3 && d->next >= 2) retire_bucket(d, d->next - 2);
    start_bucket(d, &d->b[d->next], d->next);
    d->next++;
  }
  comm_progress(d->c);
}

// Waits for every bucket's collective in flight.
static bool wait_all(DenseSync *d, char *err, size_t err_size) {
  double t0 = monotonic_seconds();
  bool ok = true;
  for (int j = 0; j < d->nb; j++) {
    Bucket *k = &d->b[j];
    if (k->handle >= 0 && !comm_wait(d->c, k->handle, err, err_size)) ok = false;
    k->handle = -1;
  }
  d->wait_s += monotonic_seconds() - t0;
  return ok;
}

bool dense_sync_finish(DenseSync *d, char *err, size_t err_size) {
  dense_sync_node_done(d, INT_MAX);  // buckets the hook did not start
  if (!wait_all(d, err, err_size)) return false;
  if (d->nb > 0) d->span_s = monotonic_seconds() - d->span_start;
  if (d->failed) {
    snprintf(err, err_size, "%s", d->err);
    return false;
  }
  if (d->mode == DENSE_ZERO3)
    for (int j = 0; j < d->nb; j++) free(d->b[j].buf), d->b[j].buf = NULL;
  if (d->mode == DENSE_ZERO2 || d->mode == DENSE_ZERO3 || d->device) return true;
  for (int j = 0; j < d->nb; j++)
    for (int i = d->b[j].first; i < d->b[j].first + d->b[j].count; i++) {
      float *g = cpu_exec_grad(d->x, d->p[i].tensor, NULL, NULL);
      if (g) memcpy(g, d->b[j].buf + d->p[i].offset, (size_t)d->p[i].numel * sizeof *g);
    }
  return true;
}

// This rank's part of parameter i of bucket k, in the parameter's elements: [*from, *from + n).
// The elements of parameter p that bucket elements [lo, hi) hold: [*from, *from + return).
static int64_t overlap(const DParam *p, int64_t lo, int64_t hi, int64_t *from) {
  if (p->offset > lo) lo = p->offset;
  if (p->offset + p->numel < hi) hi = p->offset + p->numel;
  if (hi <= lo) {
    *from = 0;
    return 0;
  }
  *from = lo - p->offset;
  return hi - lo;
}

static int64_t own_range(const Bucket *k, const DParam *p, int64_t *from) {
  return overlap(p, k->own_lo, k->own_hi, from);
}

// Every bucket: this rank's part of each parameter to every rank, then unpacked.
static bool gather_params(DenseSync *d, char *err, size_t err_size) {
  for (int j = 0; j < d->nb; j++) {
    Bucket *k = &d->b[j];
    for (int i = k->first; i < k->first + k->count; i++) {
      const DParam *p = &d->p[i];
      const float *w = cpu_exec_data(d->x, p->tensor);
      int64_t from, n = own_range(k, p, &from);
      if (n > 0) memcpy(k->part + (p->offset + from - k->own_lo), w + from, (size_t)n * sizeof *w);
    }
    CommCall call = {.kind = COMM_ALLGATHER, .dtype = COMM_F32, .send = k->part,
                     .recv = k->buf, .counts = k->parts, .what = "updated parameters (ZeRO)"};
    k->handle = comm_start(d->c, &call, err, err_size);
    if (k->handle < 0) return false;
  }
  if (!wait_all(d, err, err_size)) return false;
  for (int j = 0; j < d->nb; j++)
    for (int i = d->b[j].first; i < d->b[j].first + d->b[j].count; i++) {
      const DParam *p = &d->p[i];
      memcpy(cpu_exec_data(d->x, p->tensor), d->b[j].buf + p->offset,
             (size_t)p->numel * sizeof(float));
    }
  return true;
}

static const DParam *param_at(const DenseSync *d, int i, const Bucket **k);

int64_t dense_sync_owned(const DenseSync *d, int i, int64_t *from) {
  *from = 0;
  const Bucket *k;
  const DParam *p = d->mode == DENSE_DATA_PARALLEL ? NULL : param_at(d, i, &k);
  return p ? own_range(k, p, from) : 0;
}

bool dense_sync_update(DenseSync *d, OptimState *const *states, char *err, size_t err_size) {
  for (int j = 0; j < d->nb; j++) {
    Bucket *k = &d->b[j];
    for (int i = k->first; i < k->first + k->count; i++) {
      const DParam *p = &d->p[i];
      int64_t from, n = own_range(k, p, &from);
      // ZeRO-1 reduced the whole bucket; ZeRO-2 and 3 only this rank's part.
      const float *g = d->mode == DENSE_ZERO1 ? k->buf + p->offset + from
                                              : k->part + (p->offset + from - k->own_lo);
      float *w = d->mode == DENSE_ZERO3 ? k->shard + (p->offset + from - k->own_lo)
                                        : (float *)cpu_exec_data(d->x, p->tensor) + from;
      optim_step_dense_part(states[p->index], w, g, from, n);
    }
  }
  return d->mode == DENSE_ZERO3 || gather_params(d, err, err_size);
}

// Parameter i (in the order of `params`) and its bucket.
static const DParam *param_at(const DenseSync *d, int i, const Bucket **k) {
  for (int j = 0; j < d->nb; j++)
    for (int q = d->b[j].first; q < d->b[j].first + d->b[j].count; q++)
      if (d->p[q].index == i) {
        *k = &d->b[j];
        return &d->p[q];
      }
  return NULL;
}

float *dense_sync_shard(DenseSync *d, int i, int64_t *from, int64_t *n) {
  const Bucket *k;
  const DParam *p = param_at(d, i, &k);
  *from = *n = 0;
  if (!p || d->mode != DENSE_ZERO3) return NULL;
  *n = own_range(k, p, from);
  return *n > 0 ? k->shard + (p->offset + *from - k->own_lo) : NULL;
}

bool dense_sync_gather(DenseSync *d, int i, float *whole, char *err, size_t err_size) {
  const Bucket *k;
  const DParam *p = param_at(d, i, &k);
  GEMC_ASSERT(p && d->mode == DENSE_ZERO3);
  int world = comm_world(d->c);
  int64_t *counts = xcalloc((size_t)world, sizeof *counts);
  int64_t lo = 0, from;  // the ranks' parts tile the bucket in rank order
  for (int r = 0; r < world; r++) {
    counts[r] = overlap(p, lo, lo + k->parts[r], &from);
    lo += k->parts[r];
  }
  int64_t n = own_range(k, p, &from);
  char what[320];
  snprintf(what, sizeof what, "parameter '%s' gathered (ZeRO-3)", d->ir->tensors[p->tensor].name);
  CommCall call = {.kind = COMM_ALLGATHER, .dtype = COMM_F32,
                   .send = n > 0 ? k->shard + (p->offset + from - k->own_lo) : whole,
                   .recv = whole, .counts = counts, .what = what};
  int h = comm_start(d->c, &call, err, err_size);
  bool ok = h >= 0 && comm_wait(d->c, h, err, err_size);
  free(counts);
  return ok;
}

void dense_sync_count_bad(DenseSync *d, bool on) {
  if (on && !d->bad) {
    d->bad = xcalloc((size_t)d->np + 1, sizeof *d->bad);
    d->counted = xcalloc((size_t)d->np + 1, sizeof *d->counted);
  }
  d->count_bad = on;
}

bool dense_sync_bad_grad(const DenseSync *d, int i, int64_t *nan, int64_t *inf) {
  if (!d->count_bad || !d->bad || i < 0 || i >= d->np || !d->counted[i]) return false;
  *nan = d->bad[i][0];
  *inf = d->bad[i][1];
  return true;
}
