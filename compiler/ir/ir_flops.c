// ir_flops.c: the FLOP count of one IR node (ir_flops.h).
#include "ir_flops.h"

#include <stddef.h>

// Rows of tensor t in example e (jagged: its length; set: k; dense: 1; fixed: its rows).
static int64_t rows_of_example(const Ir *ir, const int64_t *const *offsets, int t, int64_t e) {
  const Tensor *x = &ir->tensors[t];
  switch (x->layout) {
  case LAYOUT_JAGGED: return offsets[x->jag][e + 1] - offsets[x->jag][e];
  case LAYOUT_SET: return x->set_k;
  case LAYOUT_FIXED: return x->nfixed == 2 ? x->fixed[0] : 1;
  default: return 1;
  }
}

static int64_t total_rows(const Ir *ir, int64_t B, const int64_t *const *offsets, int t) {
  const Tensor *x = &ir->tensors[t];
  switch (x->layout) {
  case LAYOUT_DENSE: return B;
  case LAYOUT_SET: return B * x->set_k;
  case LAYOUT_JAGGED: return offsets[x->jag][B];
  case LAYOUT_FIXED: return x->nfixed == 2 ? x->fixed[0] : 1;
  default: return 1;
  }
}

static int64_t width_of(const Tensor *x) {
  if (x->layout == LAYOUT_FIXED) return x->nfixed == 2 ? x->fixed[1] : x->fixed[0];
  return x->width > 0 ? x->width : 1;
}

// 2·M·K·N with the weight the node's 2-D fixed input [K, N] and M the rows it runs over.
static double matmul_flops(const Ir *ir, int64_t B, const int64_t *const *offsets,
                           const Node *n) {
  const Tensor *w = NULL;
  for (int i = 0; i < n->nins && !w; i++) {
    const Tensor *x = &ir->tensors[n->ins[i]];
    if (x->layout == LAYOUT_FIXED && x->nfixed == 2 &&
        (x->kind == TENSOR_PARAM || x->kind == TENSOR_VALUE))
      w = x;
  }
  const Tensor *out = &ir->tensors[n->out];
  if (!w && out->layout == LAYOUT_FIXED && out->nfixed == 2) w = out;  // linear_bwd_w
  if (!w) return 0;
  int64_t m = out->layout == LAYOUT_FIXED ? total_rows(ir, B, offsets, n->ins[0])
                                          : total_rows(ir, B, offsets, n->out);
  return 2.0 * (double)m * (double)w->fixed[0] * (double)w->fixed[1];
}

double ir_attention_flops(const Ir *ir, const Node *n, int64_t B, const int64_t *const *offsets) {
  int64_t d = width_of(&ir->tensors[n->ins[0]]);
  double pairs = 0;
  for (int64_t e = 0; e < B; e++) {
    int64_t lq = rows_of_example(ir, offsets, n->out, e);
    int64_t lk = rows_of_example(ir, offsets, n->ins[1], e);
    if (n->mask != MASK_CAUSAL && n->window <= 0) {
      pairs += (double)lq * (double)lk;
      continue;
    }
    for (int64_t i = 0; i < lq; i++) {
      int64_t vis = n->mask == MASK_CAUSAL ? (i + 1 < lk ? i + 1 : lk) : lk;
      if (n->window > 0 && vis > n->window) vis = n->window;
      pairs += (double)vis;
    }
  }
  return 4.0 * (double)d * pairs;
}

int ir_attention_forward_of(const Ir *ir, int node) {
  const Node *n = &ir->nodes[node];
  for (int f = 0; f < ir->nnodes; f++) {  // a recomputed copy (after nforward) counts too
    const Node *fw = &ir->nodes[f];
    if (fw->op == OP_ATTENTION && fw->ins[0] == n->ins[0] && fw->ins[1] == n->ins[1]) return f;
  }
  return -1;
}

double ir_node_flops(const Ir *ir, int node, int64_t B, const int64_t *const *offsets) {
  const Node *n = &ir->nodes[node];
  switch (n->op) {
  case OP_LINEAR:
  case OP_LINEAR_ACT_BWD:
  case OP_LINEAR_BWD_X:
  case OP_LINEAR_BWD_W: return matmul_flops(ir, B, offsets, n);
  case OP_DOT_INTERACT: {
    double d = (double)width_of(&ir->tensors[n->ins[0]]), parts = n->nins;
    return 2.0 * (double)B * parts * parts * d;
  }
  case OP_ATTENTION: return ir_attention_flops(ir, n, B, offsets);
  case OP_ATTENTION_BWD_Q:
  case OP_ATTENTION_BWD_K:
  case OP_ATTENTION_BWD_V: {
    // 2.5 x forward for the three together; the output rows are not q's for dK and dV, so
    // the forward node's count is reused.
    int f = ir_attention_forward_of(ir, node);
    return f < 0 ? 0 : ir_attention_flops(ir, &ir->nodes[f], B, offsets) * 2.5 / 3.0;
  }
  default: return 0;
  }
}
