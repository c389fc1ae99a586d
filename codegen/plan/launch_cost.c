// launch_cost.c: the per-launch cost model of launch_cost.h.
#include "launch_cost.h"

#include <stddef.h>
#include <string.h>

#include "ir_flops.h"
#include "kernel_builder.h"
#include "memplan.h"

// The batch a cost is evaluated for.
typedef struct BatchSizes {
  int64_t B;
  const int64_t *totals;
  const int64_t *const *offsets;
} BatchSizes;

static double eval(const BatchSizes *b, SymSize s) {
  return (double)symsize_eval(s, b->B, b->totals);
}

static bool is_attention(OpKind op) {
  return op == OP_ATTENTION || op == OP_ATTENTION_BWD_Q || op == OP_ATTENTION_BWD_K ||
         op == OP_ATTENTION_BWD_V;
}

static bool is_lookup(OpKind op) { return op == OP_EMBED || op == OP_EMBED_POOL; }

bool attn_simt(const Ir *ir, const Node *n) {
  const Tensor *q = &ir->tensors[n->ins[0]], *k = &ir->tensors[n->ins[1]];
  int64_t dh = n->heads > 0 ? k->width / n->heads : 0;
  return dh % 16 != 0 || k->dtype != DT_BF16 || q->dtype == DT_FP16;
}

// --- tables -----------------------------------------------------------------------------

// The ids the batch looks up in table t, as seen by a launch of node `node`: its own lookup's
// for an embed or embed_pool of t, its pairs' for t's table_grad, else every forward lookup's.
static double lookups(const Plan *p, const BatchSizes *b, int t, int node) {
  const Ir *ir = p->ir;
  const Node *n = node >= 0 ? &ir->nodes[node] : NULL;
  if (n && is_lookup(n->op) && n->ins[0] == t) return eval(b, tensor_rows(ir, n->ins[1]));
  double sum = 0;
  if (n && n->op == OP_TABLE_GRAD && n->ins[0] == t) {
    for (int k = 1; k + 1 < n->nins; k += 2) sum += eval(b, tensor_rows(ir, n->ins[k]));
    return sum;
  }
  for (int i = 0; i < ir->nforward; i++)
    if (is_lookup(ir->nodes[i].op) && ir->nodes[i].ins[0] == t)
      sum += eval(b, tensor_rows(ir, ir->nodes[i].ins[1]));
  return sum;
}

// The rows of table t the batch touches: its lookups, at most the table's rows.
static double touched_rows(const Plan *p, const BatchSizes *b, int t, int node) {
  double rows = (double)p->ir->tensors[t].fixed[0], n = lookups(p, b, t, node);
  return n < rows ? n : rows;
}

// Bytes of something table-shaped (the table, its rowsum) of `full` bytes over all its rows.
static double table_part(const Plan *p, const BatchSizes *b, int t, int node, double full) {
  double rows = (double)p->ir->tensors[t].fixed[0];
  return rows > 0 ? full / rows * touched_rows(p, b, t, node) : 0;
}

// A table's sparse gradient: [int64 U][int64 ids[Umax]][fp32 Umax x D] (plan.h), of which the
// batch writes U <= min(occurrences, rows) rows; the values only in the launch that also takes
// the table (`values`).
static double rows_tensor_bytes(const Plan *p, const BatchSizes *b, int t, bool values) {
  const Ir *ir = p->ir;
  const Tensor *x = &ir->tensors[t];
  double u = touched_rows(p, b, x->table, x->producer);  // the producer: its table_grad
  return 8 + u * 8 + (values ? u * 4 * (double)tensor_width(ir, t) : 0);
}

// --- kernel arguments -------------------------------------------------------------------

// What a pointer argument points at: two arguments with equal keys are the same memory.
typedef struct Pointee {
  ArgKind kind;  // ARG_TENSOR (for ARG_TENSOR, ARG_TENSOR_MAP and ARG_GRAD), or the arg's kind
  int64_t a, b, c;
} Pointee;

static bool pointee_of(const Ir *ir, const LaunchArg *arg, Pointee *out) {
  *out = (Pointee){arg->kind, -1, -1, -1};
  switch (arg->kind) {
  case ARG_TENSOR:
  case ARG_TENSOR_MAP: out->kind = ARG_TENSOR, out->a = arg->tensor; return arg->tensor >= 0;
  case ARG_GRAD: out->kind = ARG_TENSOR, out->a = ir_grad_of(ir, arg->tensor); return out->a >= 0;
  case ARG_OPTSTATE: out->a = arg->tensor, out->b = arg->slot; return true;
  case ARG_SCRATCH: out->a = arg->slot; return true;
  case ARG_OFFSETS: out->a = arg->jag; return true;
  case ARG_WORKSPACE: out->a = arg->tensor, out->b = arg->slot, out->c = arg->i; return true;
  default: return false;  // values, and tile lists (not counted)
  }
}

static bool launch_takes_tensor(const Launch *l, int t) {
  for (int i = 0; i < l->nargs; i++)
    if ((l->args[i].kind == ARG_TENSOR || l->args[i].kind == ARG_TENSOR_MAP) &&
        l->args[i].tensor == t)
      return true;
  return false;
}

static double tensor_bytes_for(const Plan *p, const BatchSizes *b, const Launch *l, int t) {
  const Tensor *x = &p->ir->tensors[t];
  if (x->layout == LAYOUT_ROWS)
    return rows_tensor_bytes(p, b, t, launch_takes_tensor(l, x->table));
  double full = eval(b, plan_tensor_bytes(p, t));
  return x->kind == TENSOR_TABLE ? table_part(p, b, t, l->node, full) : full;
}

static double pointee_bytes(const Plan *p, const BatchSizes *b, const Launch *l,
                            const LaunchArg *arg, const Pointee *at) {
  const Ir *ir = p->ir;
  switch (arg->kind) {
  case ARG_TENSOR:
  case ARG_TENSOR_MAP:
  case ARG_GRAD: return tensor_bytes_for(p, b, l, (int)at->a);
  case ARG_OPTSTATE: {
    int buf = p->optstate_buffer ? p->optstate_buffer[2 * arg->tensor + arg->slot] : -1;
    if (buf < 0) return 0;
    double full = eval(b, p->buffers[buf].bytes);
    bool table = ir->tensors[arg->tensor].kind == TENSOR_TABLE;
    return table ? table_part(p, b, arg->tensor, l->node, full) : full;
  }
  case ARG_SCRATCH:  // a size on the argument: the part of the scratch the kernel touches
    return eval(b, arg->size.c || arg->size.b || arg->size.t ? arg->size : p->scratch[arg->slot].bytes);
  case ARG_OFFSETS: return 8.0 * (double)(b->B + 1);
  case ARG_WORKSPACE: return eval(b, arg->size);
  default: return 0;
  }
}

static double kernel_bytes(const Plan *p, const BatchSizes *b, const Launch *l) {
  Pointee seen[PLAN_MAX_ARGS];
  int nseen = 0;
  double bytes = 0;
  for (int i = 0; i < l->nargs && nseen < PLAN_MAX_ARGS; i++) {
    Pointee at;
    if (!pointee_of(p->ir, &l->args[i], &at)) continue;
    bool dup = false;
    for (int s = 0; s < nseen && !dup; s++)
      dup = seen[s].kind == at.kind && seen[s].a == at.a && seen[s].b == at.b && seen[s].c == at.c;
    if (dup) continue;
    seen[nseen++] = at;
    bytes += pointee_bytes(p, b, l, &l->args[i], &at);
  }
  return bytes;
}

// --- GEMMs ------------------------------------------------------------------------------

// The bytes of one element of C, as the runtime types it (gpu_exec.c, gemm_c_dtype): its
// tensor's, fp32 for a parameter's gradient, fp32 for a scratch sized 4 bytes an element.
static double gemm_c_elem(const Plan *p, const BatchSizes *b, const Launch *l, double mn) {
  const LaunchArg *c = &l->gemm_c;
  if (c->kind == ARG_TENSOR && c->tensor >= 0) return dtype_size(p->ir->tensors[c->tensor].dtype);
  if (c->kind == ARG_GRAD) return 4;
  if (c->kind == ARG_SCRATCH && mn > 0 && eval(b, p->scratch[c->slot].bytes) >= 4 * mn) return 4;
  return dtype_size(l->gemm_dtype);
}

static LaunchCost gemm_cost(const Plan *p, const BatchSizes *b, const Launch *l) {
  double m = eval(b, l->gemm_m), n = (double)l->gemm_n, k = eval(b, l->gemm_k);
  // fp8 GEMMs read E4M3 codes, a byte each, over the padded k.
  double op = l->gemm_dtype == DT_FP8 ? 1 : dtype_size(l->gemm_dtype), c = gemm_c_elem(p, b, l, m * n);
  LaunchCost cost = {0};
  cost.flops = 2 * m * n * k;
  cost.bytes = (m * k + k * n) * op + m * n * c * (l->gemm_beta != 0 ? 2 : 1);
  if (l->gemm_has_bias && l->gemm_bias.kind == ARG_TENSOR && l->gemm_bias.tensor >= 0)
    cost.bytes += n * dtype_size(p->ir->tensors[l->gemm_bias.tensor].dtype);
  // bf16, fp16 and fp8 GEMMs run on tensor cores (fp8 bounded here by the bf16 peak, as every
  // tensor-core launch is: half its own); cublaslt.c computes fp32 ones in CUBLAS_COMPUTE_32F,
  // which allows no TF32.
  cost.tensor_core = l->gemm_dtype == DT_BF16 || l->gemm_dtype == DT_FP16 || l->gemm_dtype == DT_FP8;
  return cost;
}

// --- attention --------------------------------------------------------------------------

// The backward nodes of one attention: the same q, k, v and dO.
static bool same_attention_group(const Node *x, const Node *y) {
  if (!is_attention(y->op) || y->op == OP_ATTENTION) return false;
  for (int i = 0; i < 4; i++)
    if (x->ins[i] != y->ins[i]) return false;
  return true;
}

// In the group of `node`: the forward node itself, or the backward nodes of its attention.
static bool in_group(const Ir *ir, int node, int other) {
  if (other < 0 || other >= ir->nnodes) return false;
  const Node *n = &ir->nodes[node];
  if (n->op == OP_ATTENTION) return other == node;
  return same_attention_group(n, &ir->nodes[other]);
}

// A launch that does an attention's matmuls: one of its kernels with dynamic shared memory.
static bool attention_matmul_launch(const Launch *l) {
  return l->kind == LAUNCH_KERNEL && !l->optimizer && l->smem > 0;
}

// The matmuls launch l does for its attention (launch_cost.h): forward 1; backward S
// recomputed, dP when it writes dQ or dK, one per gradient it writes, or 2 for the statistics.
static int attention_matmuls(const Ir *ir, const Launch *l) {
  const Node *n = &ir->nodes[l->node];
  if (n->op == OP_ATTENTION) return 1;
  bool dq = false, dk = false, dv = false;
  for (int i = ir->nforward; i < ir->nnodes; i++) {
    const Node *m = &ir->nodes[i];
    if (!same_attention_group(n, m) || !launch_takes_tensor(l, m->out)) continue;
    dq |= m->op == OP_ATTENTION_BWD_Q, dk |= m->op == OP_ATTENTION_BWD_K;
    dv |= m->op == OP_ATTENTION_BWD_V;
  }
  // PMA's one-pass backward (attn_backward_pma) does dQ = dS·K into its chunks' partials, a
  // workspace, not the dQ tensor (which the ordered sum writes).
  dq |= strstr(l->kernel, "_bwd_pma") != NULL;
  if (!dq && !dk && !dv) return 2;
  return 1 + (dq || dk) + dq + dk + dv;
}

static LaunchCost attention_cost(const Plan *p, const BatchSizes *b, const Launch *l) {
  const Ir *ir = p->ir;
  LaunchCost cost = {0};
  if (!attention_matmul_launch(l)) return cost;
  const Node *n = &ir->nodes[l->node];
  double group_flops = 0;
  for (int i = 0; i < ir->nnodes; i++)
    if (in_group(ir, l->node, i)) group_flops += ir_node_flops(ir, i, b->B, b->offsets);
  int all = 0;
  for (int i = 0; i < p->nlaunches; i++)
    if (attention_matmul_launch(&p->launches[i]) && in_group(ir, l->node, p->launches[i].node))
      all += attention_matmuls(ir, &p->launches[i]);
  cost.flops = all > 0 ? group_flops * attention_matmuls(ir, l) / all : 0;
  bool quantized = n->prec == DT_FP8 || n->prec == DT_MXFP8;
  const Tensor *k = &ir->tensors[n->ins[1]];
  int64_t dh = n->heads > 0 ? k->width / n->heads : 0;
  // Quantized attention runs on mma.sync when the head width is a multiple of 16, except the
  // tiny-key-set kernels (emit_attention_tiny_kv.c), which are SIMT.
  cost.tensor_core = quantized ? dh % 16 == 0 && !strstr(l->kernel, "_tiny_") : !attn_simt(ir, n);
  return cost;
}

// --- other kernels ----------------------------------------------------------------------

// The node's IR FLOPs on the kernels that take its output (split when there are several),
// unless a GEMM of the node carries them (a linear's epilogue kernel takes its output too).
static double node_flops_on(const Plan *p, const BatchSizes *b, const Launch *l) {
  const Ir *ir = p->ir;
  int out = ir->nodes[l->node].out;
  if (l->optimizer || !launch_takes_tensor(l, out)) return 0;
  double f = ir_node_flops(ir, l->node, b->B, b->offsets);
  if (f == 0) return 0;
  int writers = 0;
  for (int i = 0; i < p->nlaunches; i++) {
    const Launch *o = &p->launches[i];
    if (o->node != l->node || o->optimizer) continue;
    if (o->kind == LAUNCH_GEMM) return 0;
    writers += o->kind == LAUNCH_KERNEL && launch_takes_tensor(o, out);
  }
  return f / writers;
}

LaunchCost launch_cost(const Plan *p, int launch, int64_t B, const int64_t *totals,
                       const int64_t *const *offsets) {
  const BatchSizes b = {B, totals, offsets};
  const Launch *l = &p->launches[launch];
  LaunchCost cost = {0};
  switch (l->kind) {
  case LAUNCH_GEMM: return gemm_cost(p, &b, l);
  case LAUNCH_ZERO: cost.bytes = eval(&b, l->zero_bytes); return cost;
  case LAUNCH_KERNEL: break;
  }
  bool has_node = l->node >= 0 && l->node < p->ir->nnodes;
  if (has_node && !l->optimizer && is_attention(p->ir->nodes[l->node].op))
    cost = attention_cost(p, &b, l);
  else if (has_node)
    cost.flops = node_flops_on(p, &b, l);
  cost.bytes = kernel_bytes(p, &b, l);
  return cost;
}

double launch_roofline_s(LaunchCost c, const Target *t) {
  double peak = (c.tensor_core ? t->peak_tflops_bf16 : t->peak_tflops_fp32) * 1e12;
  double compute = peak > 0 ? c.flops / peak : 0;
  double memory = t->hbm_tb_per_s > 0 ? c.bytes / (t->hbm_tb_per_s * 1e12) : 0;
  return compute > memory ? compute : memory;
}
