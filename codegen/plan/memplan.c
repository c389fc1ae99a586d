// memplan.c: liveness-based buffer reuse over one training step. Parameters, tables, the
// gradients of parameters and the optimizer state get persistent buffers of their own. Every
// other tensor, and every codegen scratch, lives from the first launch that touches it to the
// last (inputs and labels from the start); at its first use it takes a free buffer whose size
// has the same jagged term (so the buffer's size, the component-wise max of its tenants, is
// at least each tenant's at any batch), preferring the one closest in size at the largest
// batch, and gives it back after its last use. Sizes are SymSize: the runtime allocates each
// buffer for the largest batch (every T_j at B·L_j).
#include "memplan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "checked_math.h"
#include "internal_error.h"
#include "kernel_builder.h"

// c + b·B + t·T with checked arithmetic: INT64_MAX when a term overflows (sizes are never
// negative), so that an absurd batch reads as "too large", never as a negative size.
static int64_t sym_at(SymSize s, int64_t B, int64_t T) {
  return sat_add(sat_add(s.c, sat_mul(s.b, B)), sat_mul(s.t, T));
}

int64_t symsize_eval(SymSize s, int64_t B, const int64_t *totals) {
  return sym_at(s, B, s.jag >= 0 && s.t != 0 ? totals[s.jag] : 0);
}

int64_t plan_eval_max(const Plan *p, SymSize s) {
  const Ir *ir = p->ir;
  int64_t t = s.jag >= 0 && s.jag < ir->njagged ? sat_mul(ir->batch, ir->jagged[s.jag].max_len) : 0;
  return sym_at(s, ir->batch, t);
}

SymSize plan_tensor_bytes(const Plan *p, int t) {
  const Ir *ir = p->ir;
  const Tensor *x = &ir->tensors[t];
  if (x->layout != LAYOUT_ROWS) return tensor_bytes(ir, t);
  // [U][ids[Umax]][Umax x D fp32], Umax = the occurrences of the table's ids
  const Node *n = &ir->nodes[x->producer];
  SymSize occ = sym_const(0);
  for (int k = 1; k + 1 < n->nins; k += 2) {
    SymSize r = tensor_rows(ir, n->ins[k]);
    if (occ.t == 0 || r.t == 0 || occ.jag == r.jag) occ = sym_add(occ, r);
  }
  return sym_add(sym_const(8), sym_scale(occ, 8 + 4 * tensor_width(ir, t)));
}

static bool persistent(const Ir *ir, int t) {
  const Tensor *x = &ir->tensors[t];
  if (x->kind == TENSOR_PARAM || x->kind == TENSOR_TABLE) return true;
  for (int g = 0; g < ir->ngrads; g++)
    // A table's rows stay until the optimizer when the runtime merges them across ranks first.
    if (ir->grads[g].grad == t && (x->layout != LAYOUT_ROWS || ir->defer_table_updates))
      return true;
  return false;
}

typedef struct Builder {
  Plan *p;
  Buffer *bufs;
  int nbufs, cap;
  bool *busy;
} Builder;

static int add_buffer(Builder *b, const char *name, SymSize bytes, bool pers) {
  if (b->nbufs == b->cap) {
    b->cap = b->cap ? 2 * b->cap : 64;
    b->bufs = xrealloc(b->bufs, (size_t)b->cap * sizeof *b->bufs);
    b->busy = xrealloc(b->busy, (size_t)b->cap * sizeof *b->busy);
  }
  char tmp[32];
  if (!name) {
    snprintf(tmp, sizeof tmp, "buf%d", b->nbufs);
    name = tmp;
  }
  b->bufs[b->nbufs] = (Buffer){arena_strdup(b->p->arena, name), bytes, pers};
  b->busy[b->nbufs] = true;
  return b->nbufs++;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// A free buffer that can hold `bytes`, or a new one.
static int take_buffer(Builder *b, SymSize bytes) {
  int best = -1;
  int64_t want = plan_eval_max(b->p, bytes), best_gap = 0;
  for (int i = 0; i < b->nbufs; i++) {
    Buffer *f = &b->bufs[i];
    if (b->busy[i] || f->persistent) continue;
    bool same_jag = f->bytes.t == 0 || bytes.t == 0 || f->bytes.jag == bytes.jag;
    if (!same_jag) continue;
    int64_t have = plan_eval_max(b->p, f->bytes);
    int64_t gap = have >= want ? have - want : (want - have) * 4;  // growing costs more
    if (best < 0 || gap < best_gap) best = i, best_gap = gap;
  }
  if (best < 0) return add_buffer(b, NULL, bytes, false);
  Buffer *f = &b->bufs[best];
  int jag = f->bytes.t != 0 ? f->bytes.jag : bytes.jag;
  f->bytes = (SymSize){max64(f->bytes.c, bytes.c), max64(f->bytes.b, bytes.b), max64(f->bytes.t, bytes.t),
                       max64(f->bytes.t, bytes.t) ? jag : -1};
  b->busy[best] = true;
  return best;
}

// Calls fn on every tensor and scratch a launch touches: a tensor map reads its tensor as much
// as a pointer does.
static void note_arg(const LaunchArg *a, int li, int *first_t, int *last_t, int *first_s, int *last_s) {
  if ((a->kind == ARG_TENSOR || a->kind == ARG_TENSOR_MAP) && a->tensor >= 0) {
    if (first_t[a->tensor] < 0) first_t[a->tensor] = li;
    last_t[a->tensor] = li;
  } else if (a->kind == ARG_SCRATCH && a->slot >= 0) {
    if (first_s[a->slot] < 0) first_s[a->slot] = li;
    last_s[a->slot] = li;
  }
}

void memplan_build(Plan *p) {
  const Ir *ir = p->ir;
  int nt = ir->ntensors, ns = p->nscratch, nl = p->nlaunches;
  int *first_t = xmalloc((size_t)(nt + 1) * sizeof *first_t);
  int *last_t = xmalloc((size_t)(nt + 1) * sizeof *last_t);
  int *first_s = xmalloc((size_t)(ns + 1) * sizeof *first_s);
  int *last_s = xmalloc((size_t)(ns + 1) * sizeof *last_s);
  for (int i = 0; i < nt; i++) first_t[i] = last_t[i] = -1;
  for (int i = 0; i < ns; i++) first_s[i] = last_s[i] = -1;
  for (int li = 0; li < nl; li++) {
    const Launch *l = &p->launches[li];
    for (int a = 0; a < l->nargs; a++) note_arg(&l->args[a], li, first_t, last_t, first_s, last_s);
    if (l->kind == LAUNCH_GEMM) {
      note_arg(&l->gemm_a, li, first_t, last_t, first_s, last_s);
      note_arg(&l->gemm_b, li, first_t, last_t, first_s, last_s);
      note_arg(&l->gemm_c, li, first_t, last_t, first_s, last_s);
      if (l->gemm_has_bias) note_arg(&l->gemm_bias, li, first_t, last_t, first_s, last_s);
      note_arg(&l->gemm_scale_a, li, first_t, last_t, first_s, last_s);  // ARG_INT unless fp8
      note_arg(&l->gemm_scale_b, li, first_t, last_t, first_s, last_s);
    }
    if (l->kind == LAUNCH_ZERO) note_arg(&l->zero_arg, li, first_t, last_t, first_s, last_s);
  }
  // The loss is read after the step, and every bce's logits after the forward launches
  // (gpu_exec.c, queue_readback): neither buffer may pass to a later tensor before that.
  if (ir->loss >= 0) last_t[ir->loss] = nl;
  for (int i = 0; i < ir->nforward; i++)
    if (ir->nodes[i].op == OP_BCE && last_t[ir->nodes[i].ins[0]] >= 0) last_t[ir->nodes[i].ins[0]] = nl;
  // A run of launches that covers several nodes (Launch.nfused; the tables whose id sorts share
  // launches) keeps every covered node's output to the run's end, where whoever checks node by
  // node reads them all (plan_emu, test_gpu_kernels).
  for (int li = 0; li < nl; li++) {
    const Launch *l = &p->launches[li];
    if (l->nfused <= 1 || l->node < 0 || (li > 0 && p->launches[li - 1].node == l->node)) continue;
    int end = li;
    while (end + 1 < nl && p->launches[end + 1].node == l->node) end++;
    for (int k = l->node; k < l->node + l->nfused && k < ir->nnodes; k++) {
      int t = ir->nodes[k].out;
      if (t >= 0 && last_t[t] >= 0 && last_t[t] < end) last_t[t] = end;
    }
  }

  Builder b = {p, NULL, 0, 0, NULL};
  p->tensor_buffer = arena_alloc(p->arena, (size_t)(nt + 1) * sizeof *p->tensor_buffer);
  p->tensor_offset = arena_alloc(p->arena, (size_t)(nt + 1) * sizeof *p->tensor_offset);
  p->optstate_buffer = arena_alloc(p->arena, (size_t)(2 * nt + 1) * sizeof *p->optstate_buffer);
  for (int t = 0; t < nt; t++) {
    p->tensor_buffer[t] = -1;
    p->tensor_offset[t] = sym_const(0);
    p->optstate_buffer[2 * t] = p->optstate_buffer[2 * t + 1] = -1;
  }
  // Persistent: parameters, tables, their dense gradients, optimizer state.
  char name[300];
  for (int t = 0; t < nt; t++) {
    const Tensor *x = &ir->tensors[t];
    if (!persistent(ir, t)) continue;
    snprintf(name, sizeof name, "%s%s", x->kind == TENSOR_VALUE ? "%" : "@", x->name);
    p->tensor_buffer[t] = add_buffer(&b, name, plan_tensor_bytes(p, t), true);
    if (x->kind == TENSOR_TABLE && x->optim.kind == OPTIM_ROWWISE_ADAGRAD) {
      snprintf(name, sizeof name, "@%s.rowsum", x->name);
      p->optstate_buffer[2 * t] = add_buffer(&b, name, sym_const(x->fixed[0] * 4), true);
    }
    if (x->kind == TENSOR_PARAM && ir->dense_optim.kind == OPTIM_ADAMW && ir_grad_of(ir, t) >= 0) {
      snprintf(name, sizeof name, "@%s.m", x->name);
      p->optstate_buffer[2 * t] = add_buffer(&b, name, plan_tensor_bytes(p, t), true);
      snprintf(name, sizeof name, "@%s.v", x->name);
      p->optstate_buffer[2 * t + 1] = add_buffer(&b, name, plan_tensor_bytes(p, t), true);
    }
  }
  // Inputs and labels are written before the first launch.
  for (int t = 0; t < nt; t++) {
    TensorKind k = ir->tensors[t].kind;
    if ((k == TENSOR_INPUT || k == TENSOR_LABEL) && first_t[t] >= 0) first_t[t] = -1;
    if ((k == TENSOR_INPUT || k == TENSOR_LABEL) && last_t[t] >= 0)
      p->tensor_buffer[t] = take_buffer(&b, plan_tensor_bytes(p, t));
  }
  // Values and scratch, launch by launch.
  for (int li = 0; li <= nl; li++) {
    for (int t = 0; t < nt; t++)
      if (first_t[t] == li && p->tensor_buffer[t] < 0 && !persistent(ir, t))
        p->tensor_buffer[t] = take_buffer(&b, plan_tensor_bytes(p, t));
    for (int s = 0; s < ns; s++)
      if (first_s[s] == li) p->scratch[s].buffer = take_buffer(&b, p->scratch[s].bytes);
    for (int t = 0; t < nt; t++)
      if (last_t[t] == li && p->tensor_buffer[t] >= 0 && !persistent(ir, t)) b.busy[p->tensor_buffer[t]] = false;
    for (int s = 0; s < ns; s++)
      if (last_s[s] == li && p->scratch[s].buffer >= 0) b.busy[p->scratch[s].buffer] = false;
  }
  for (int s = 0; s < ns; s++) p->scratch[s].offset = sym_const(0);
  p->nbuffers = b.nbufs;
  p->buffers = arena_alloc(p->arena, (size_t)(b.nbufs + 1) * sizeof *p->buffers);
  if (b.nbufs) memcpy(p->buffers, b.bufs, (size_t)b.nbufs * sizeof *b.bufs);
  free(b.bufs);
  free(b.busy);
  free(first_t);
  free(last_t);
  free(first_s);
  free(last_s);
}

MemplanStats memplan_stats(const Plan *p) {
  MemplanStats s = {0, 0, 0};
  for (int i = 0; i < p->nbuffers; i++) {
    int64_t bytes = plan_eval_max(p, p->buffers[i].bytes);
    s.planned_bytes = sat_add(s.planned_bytes, bytes);
    if (p->buffers[i].persistent) s.persistent_bytes = sat_add(s.persistent_bytes, bytes);
  }
  s.unshared_bytes = s.persistent_bytes;
  for (int t = 0; t < p->ir->ntensors; t++) {
    int bi = p->tensor_buffer[t];
    if (bi >= 0 && !p->buffers[bi].persistent)
      s.unshared_bytes = sat_add(s.unshared_bytes, plan_eval_max(p, plan_tensor_bytes(p, t)));
  }
  for (int i = 0; i < p->nscratch; i++)
    if (p->scratch[i].buffer >= 0)
      s.unshared_bytes = sat_add(s.unshared_bytes, plan_eval_max(p, p->scratch[i].bytes));
  return s;
}

bool plan_check_fit(const Plan *p, const char *device, int64_t available, char *err,
                    size_t err_size) {
  int64_t need = memplan_stats(p).planned_bytes;
  if (available < 0 || need <= available) return true;
  return fail(err, err_size, "the model needs %s of GPU memory at batch %" PRId64 " (its "
              "buffers at the largest batch: parameters, tables, gradients, optimizer state, "
              "activations); %s has %s free", bytes_text(need).s, p->ir->batch, device,
              bytes_text(available).s);
}
