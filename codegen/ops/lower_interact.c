// lower_interact.c: dot_interact and its backward, at every precision.
//   dot_interact      out[b, pair(i, j)] = x_i[b] · x_j[b] for i < j, pairs ordered (0,1), (0,2),
//                     ..., (1,2), ...: one thread per (example, pair), the d products added in
//                     order of the feature
//   dot_interact_bwd  dx_s[b] = Σ_{j≠s} dy[b, pair(s, j)] · x_j[b], s = the node's start: one
//                     thread per (example, feature), the n−1 terms added in order of j
// At fp32, bf16 and fp16 the inputs are read as stored. At fp8 and mxfp8 the operands are
// quantized exactly as the CPU executor quantizes them (docs/executor.md, "Quantized matmuls";
// runtime/cpu/cpu_forward_real.h and cpu_backward_real.h) and every product and sum is rounded on
// its own (__fmul_rn, __fadd_rn: never a fused multiply-add) in the CPU's order, so the GPU
// computes the CPU executor's bits:
//   fp8    forward: each input is one tensor with one scale; backward: dy and each x_j, j≠s,
//          likewise (lower_quantize_operand: an amax kernel, then a quantize kernel into fp32
//          scratch, per operand)
//   mxfp8  forward: each input in E8M0 blocks of 32 along its features (lower_quantize_operand,
//          into fp32 scratch); backward: for each (example, feature), the n−1 coefficients
//          dy[b, pair(s, j)] are one block and the n−1 values x_j[b, feature] another (n ≤ 16,
//          so n−1 < 32), both quantized inside the kernel.
#include <stdio.h>

#include "lower_ops.h"

static const char *const ELEM_INDEX =
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n";

static bool is_quantized(DType prec) { return prec == DT_FP8 || prec == DT_MXFP8; }

// The kernel's parameter for input k (x0, x1, ...): the tensor as stored, or its quantized
// copy `q` in fp32 scratch. Returns the load function for it.
static const char *bind_input(KernelBuilder *kb, int k, int tensor, int q) {
  char p[16];
  snprintf(p, sizeof p, "x%d", k);
  if (q >= 0) {
    kb_scratch(kb, "float", p, q, false);
    return "load_f32";
  }
  kb_tensor_in(kb, p, tensor);
  return dtype_load(kb->L->ir->tensors[tensor].dtype);
}

static bool lower_interact_forward(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  bool quantized = is_quantized(n->prec);
  int nx = n->nins;
  int64_t d = tensor_width(ir, n->ins[0]);
  int64_t npairs = (int64_t)nx * (nx - 1) / 2;
  int q[IR_MAX_INPUTS];
  for (int k = 0; k < nx; k++) {
    q[k] = -1;
    if (!quantized) continue;
    char role[16];
    snprintf(role, sizeof role, "x%d", k);
    q[k] = lower_quantize_operand(L, node, n->ins[k], n->prec, DT_F32, true, role);
  }
  char name[300], id[256], what[128];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s", op_name(n->op), id);
  if (quantized)
    snprintf(what, sizeof what, "%s: quantized inputs, each product and sum rounded, in order",
             dtype_name(n->prec));
  else
    snprintf(what, sizeof what, "%s", dtype_name(n->prec));
  lower_comment(L, node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, tensor_elems(ir, n->out), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  const char *load[IR_MAX_INPUTS];
  for (int k = 0; k < nx; k++) load[k] = bind_input(&kb, k, n->ins[k], q[k]);
  kb_size(&kb, "n", tensor_elems(ir, n->out));
  StrBuf body = {0};
  sb_printf(&body, "  enum { DIM = %lld, PAIRS = %lld };\n%s", (long long)d, (long long)npairs, ELEM_INDEX);
  sb_puts(&body, "  i64 b = i / PAIRS;\n  int pair = (int)(i % PAIRS);\n  float acc = 0.0f;\n");
  int pair = 0;
  for (int a = 0; a < nx; a++)
    for (int c = a + 1; c < nx; c++, pair++) {
      if (quantized)
        sb_printf(&body,
                  "  %sif (pair == %d)\n"
                  "    for (int k = 0; k < DIM; k++)\n"
                  "      acc = __fadd_rn(acc, __fmul_rn(%s(x%d, b * DIM + k), %s(x%d, b * DIM + k)));\n",
                  pair ? "else " : "", pair, load[a], a, load[c], c);
      else
        sb_printf(&body, "  %sif (pair == %d) for (int k = 0; k < DIM; k++) acc += %s(x%d, b * DIM + k) * %s(x%d, b * DIM + k);\n",
                  pair ? "else " : "", pair, load[a], a, load[c], c);
    }
  sb_printf(&body, "  %s(out, i, acc);\n", dtype_store(ir->tensors[n->out].dtype));
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

// The pair column of input `self` with input `other` among nx inputs.
static int pair_column(int self, int other, int nx) {
  int a = self < other ? self : other, c = self < other ? other : self;
  return a * nx - a * (a + 1) / 2 + (c - a - 1);
}

static bool lower_interact_backward(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  int nx = n->nins - 1, self = (int)n->start;
  int64_t d = tensor_width(ir, n->ins[1]);
  int64_t npairs = (int64_t)nx * (nx - 1) / 2;
  if (n->prec == DT_MXFP8 && nx - 1 > 32)
    return lower_fail(L, node, "mxfp8 dot_interact_bwd takes at most 33 inputs, not %d", nx);
  // fp8: dy and every other input quantized as whole tensors first.
  int qdy = -1, q[IR_MAX_INPUTS];
  for (int k = 0; k < nx; k++) q[k] = -1;
  if (n->prec == DT_FP8) {
    qdy = lower_quantize_operand(L, node, n->ins[0], n->prec, DT_F32, true, "dy");
    for (int k = 0; k < nx; k++) {
      if (k == self) continue;
      char role[16];
      snprintf(role, sizeof role, "x%d", k);
      q[k] = lower_quantize_operand(L, node, n->ins[1 + k], n->prec, DT_F32, true, role);
    }
  }
  char name[300], id[256], what[160];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s", op_name(n->op), id);
  if (n->prec == DT_MXFP8)
    snprintf(what, sizeof what, "of input %d, mxfp8: the n-1 terms of an (example, column) are a block", self);
  else if (n->prec == DT_FP8)
    snprintf(what, sizeof what, "of input %d, fp8: quantized dy and inputs, each product and sum rounded", self);
  else
    snprintf(what, sizeof what, "of input %d", self);
  lower_comment(L, node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, tensor_elems(ir, n->out), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  const char *load_dy, *load[IR_MAX_INPUTS];
  if (qdy >= 0) {
    kb_scratch(&kb, "float", "dy", qdy, false);
    load_dy = "load_f32";
  } else {
    kb_tensor_in(&kb, "dy", n->ins[0]);
    load_dy = dtype_load(ir->tensors[n->ins[0]].dtype);
  }
  for (int k = 0; k < nx; k++) load[k] = bind_input(&kb, k, n->ins[1 + k], q[k]);
  kb_size(&kb, "n", tensor_elems(ir, n->out));
  StrBuf body = {0};
  sb_printf(&body, "  enum { DIM = %lld, PAIRS = %lld };\n%s", (long long)d, (long long)npairs, ELEM_INDEX);
  sb_puts(&body, "  i64 b = i / DIM, k = i % DIM;\n  float acc = 0.0f;\n");
  if (!is_quantized(n->prec)) {
    // Pair order visits the partners of `self` in ascending order.
    for (int other = 0; other < nx; other++)
      if (other != self)
        sb_printf(&body, "  acc += %s(dy, b * PAIRS + %d) * %s(x%d, b * DIM + k);\n", load_dy,
                  pair_column(self, other, nx), load[other], other);
  } else if (n->prec == DT_FP8) {
    for (int other = 0; other < nx; other++)
      if (other != self)
        sb_printf(&body, "  acc = __fadd_rn(acc, __fmul_rn(%s(dy, b * PAIRS + %d), %s(x%d, b * DIM + k)));\n",
                  load_dy, pair_column(self, other, nx), load[other], other);
  } else {
    // mxfp8: gather the n-1 coefficients and values, one E8M0 block each (runtime/cpu/numerics.c
    // mx_block: scale 2^e, e = floor(log2 finite amax) - 8), then the terms in order.
    sb_printf(&body, "  enum { TERMS = %d };\n  float coef[TERMS], val[TERMS];\n", nx - 1);
    int m = 0;
    for (int other = 0; other < nx; other++)
      if (other != self) {
        sb_printf(&body, "  coef[%d] = %s(dy, b * PAIRS + %d);\n  val[%d] = %s(x%d, b * DIM + k);\n", m,
                  load_dy, pair_column(self, other, nx), m, load[other], other);
        m++;
      }
    sb_puts(&body,
            "  float coef_amax = 0.0f, val_amax = 0.0f;\n"
            "  for (int t = 0; t < TERMS; t++) {\n"
            "    float c = fabsf(coef[t]), v = fabsf(val[t]);\n"
            "    if (isfinite(c) && c > coef_amax) coef_amax = c;\n"
            "    if (isfinite(v) && v > val_amax) val_amax = v;\n"
            "  }\n"
            "  int ce = mx_block_exponent(coef_amax), ve = mx_block_exponent(val_amax);\n"
            "  float coef_inv = ldexpf(1.0f, -ce), coef_scale = ldexpf(1.0f, ce);\n"
            "  float val_inv = ldexpf(1.0f, -ve), val_scale = ldexpf(1.0f, ve);\n"
            "  for (int t = 0; t < TERMS; t++) {\n"
            "    float c = e4m3_round(coef[t] * coef_inv) * coef_scale;\n"
            "    float v = e4m3_round(val[t] * val_inv) * val_scale;\n"
            "    acc = __fadd_rn(acc, __fmul_rn(c, v));\n"
            "  }\n");
  }
  sb_printf(&body, "  %s(out, i, acc);\n", dtype_store(ir->tensors[n->out].dtype));
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

bool lower_interact(Lower *L, int node) {
  switch (L->ir->nodes[node].op) {
    case OP_DOT_INTERACT: return lower_interact_forward(L, node);
    case OP_DOT_INTERACT_BWD: return lower_interact_backward(L, node);
    default: break;
  }
  return lower_fail(L, node, "not a dot_interact op");
}
