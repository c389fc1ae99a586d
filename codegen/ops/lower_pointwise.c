// lower_pointwise.c: ops that touch each element (or each row) once: activations and their
// backward, add/sub/mul/scale (fused with a following act, or with a following rmsnorm),
// concat/slice/stack/unstack/flatten/unflatten, reduce_rows, and the loss ops bce, bce_bwd and
// loss_sum (dot_interact and its backward: lower_interact.c). One thread per output element
// unless noted.
#include <stdio.h>
#include <string.h>

#include "internal_error.h"
#include "lower_ops.h"

static const char *const ELEM_INDEX =
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n";

// The expression an elementwise op computes, in float, from a and b (or x).
static void binary_expr(const Node *n, char *buf, size_t size, const Ir *ir) {
  const char *la = dtype_load(ir->tensors[n->ins[0]].dtype);
  const char *lb = n->nins > 1 ? dtype_load(ir->tensors[n->ins[1]].dtype) : "";
  switch (n->op) {
    case OP_ADD: snprintf(buf, size, "%s(a, i) + %s(b, i)", la, lb); break;
    case OP_SUB: snprintf(buf, size, "%s(a, i) - %s(b, i)", la, lb); break;
    case OP_MUL: snprintf(buf, size, "%s(a, i) * %s(b, i)", la, lb); break;
    case OP_SCALE: snprintf(buf, size, "(float)(%s) * %s(a, i)", num(n->scale).s, la); break;
    default: snprintf(buf, size, "%s(a, i)", la); break;
  }
}

static bool is_binary(OpKind op) {
  return op == OP_ADD || op == OP_SUB || op == OP_MUL || op == OP_SCALE;
}

// add/sub/mul/scale, and the act right after it when the act reads its output.
static bool lower_elementwise(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  int next = node + 1;
  if (n->op == OP_ADD && next < ir->nnodes && ir->nodes[next].op == OP_RMSNORM &&
      ir->nodes[next].ins[0] == n->out && !L->done[next] &&
      (node < ir->nforward) == (next < ir->nforward))
    return lower_add_rmsnorm(L, node, next);
  bool fuse_act = next < ir->nnodes && ir->nodes[next].op == OP_ACT &&
                  ir->nodes[next].ins[0] == n->out && (node < ir->nforward) == (next < ir->nforward);
  char name[300], id[256], what[128], expr[256], body[1200];
  ident(id, sizeof id, ir->tensors[fuse_act ? ir->nodes[next].out : n->out].name);
  snprintf(name, sizeof name, "%s%s_%s", op_name(n->op), fuse_act ? "_act" : "", id);
  if (fuse_act)
    snprintf(what, sizeof what, "then act %s, fused", act_name(node_act(&ir->nodes[next])));
  else
    snprintf(what, sizeof what, "%s", dtype_name(ir->tensors[n->out].dtype));
  lower_comment(L, node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, tensor_elems(ir, n->out), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  if (fuse_act) kb_tensor_out(&kb, "y", ir->nodes[next].out);
  kb_tensor_out(&kb, "out", n->out);
  kb_tensor_in(&kb, "a", n->ins[0]);
  if (n->op != OP_SCALE) kb_tensor_in(&kb, "b", n->ins[1]);
  kb_size(&kb, "n", tensor_elems(ir, n->out));
  binary_expr(n, expr, sizeof expr, ir);
  const char *st = dtype_store(ir->tensors[n->out].dtype);
  if (fuse_act) {
    const Node *a = &ir->nodes[next];
    snprintf(body, sizeof body,
             "%s"
             "  %s(out, i, %s);\n"
             "  float stored = %s(out, i);  // the act reads what its input holds\n"
             "  %s(y, i, (float)%s((double)stored));\n",
             ELEM_INDEX, st, expr, dtype_load(ir->tensors[n->out].dtype),
             dtype_store(ir->tensors[a->out].dtype), act_fn(node_act(a)));
    kb.launch->nfused = 2;
    L->done[next] = true;
  } else {
    snprintf(body, sizeof body, "%s  %s(out, i, %s);\n", ELEM_INDEX, st, expr);
  }
  kb_end(&kb, body);
  return true;
}

static bool lower_act(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  char name[300], id[256], body[1024];
  ident(id, sizeof id, ir->tensors[n->out].name);
  bool bwd = n->op == OP_ACT_BWD;
  snprintf(name, sizeof name, "%s_%s_%s", bwd ? "act_bwd" : "act", act_name(node_act(n)), id);
  lower_comment(L, node, act_name(node_act(n)));
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, tensor_elems(ir, n->out), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  if (bwd) {
    kb_tensor_in(&kb, "dy", n->ins[0]);
    kb_tensor_in(&kb, "x", n->ins[1]);
  } else {
    kb_tensor_in(&kb, "x", n->ins[0]);
  }
  kb_size(&kb, "n", tensor_elems(ir, n->out));
  if (bwd)
    snprintf(body, sizeof body, "%s  %s(out, i, (float)((double)%s(dy, i) * %s_grad((double)%s(x, i))));\n",
             ELEM_INDEX, dtype_store(ir->tensors[n->out].dtype), dtype_load(ir->tensors[n->ins[0]].dtype),
             act_fn(node_act(n)), dtype_load(ir->tensors[n->ins[1]].dtype));
  else
    snprintf(body, sizeof body, "%s  %s(out, i, (float)%s((double)%s(x, i)));\n", ELEM_INDEX,
             dtype_store(ir->tensors[n->out].dtype), act_fn(node_act(n)),
             dtype_load(ir->tensors[n->ins[0]].dtype));
  kb_end(&kb, body);
  return true;
}

// Copies between layouts that are all rows x width: concat, slice, stack, unstack, flatten,
// unflatten. Each output element knows its source from its row and column.
static bool lower_copy(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  char name[300], id[256], line[512];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s", op_name(n->op), id);
  lower_comment(L, node, dtype_name(ir->tensors[n->out].dtype));
  int64_t w = tensor_width(ir, n->out);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, tensor_elems(ir, n->out), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  int nin = n->nins;
  for (int k = 0; k < nin; k++) {
    char p[16];
    snprintf(p, sizeof p, nin == 1 ? "x" : "x%d", k);
    kb_tensor_in(&kb, p, n->ins[k]);
  }
  kb_size(&kb, "n", tensor_elems(ir, n->out));
  StrBuf body = {0};
  sb_printf(&body, "  enum { WIDTH = %lld };\n%s", (long long)w, ELEM_INDEX);
  sb_puts(&body, "  i64 row = i / WIDTH, col = i % WIDTH;\n");
  const char *st = dtype_store(ir->tensors[n->out].dtype);
  switch (n->op) {
    case OP_CONCAT: {
      int64_t start = 0;
      for (int k = 0; k < nin; k++) {
        int64_t wk = tensor_width(ir, n->ins[k]);
        snprintf(line, sizeof line, "  %sif (col < %lld) { %s(out, i, %s(x%d, row * %lld + col - %lld)); return; }\n",
                 k ? "else " : "", (long long)(start + wk), st,
                 dtype_load(ir->tensors[n->ins[k]].dtype), k, (long long)wk, (long long)start);
        sb_puts(&body, line);
        start += wk;
      }
      break;
    }
    case OP_STACK: {
      // out: set [B, n, d]: row = b * n + k
      for (int k = 0; k < nin; k++) {
        snprintf(line, sizeof line, "  %sif (row %% %d == %d) %s(out, i, %s(x%d, (row / %d) * WIDTH + col));\n",
                 k ? "else " : "", nin, k, st, dtype_load(ir->tensors[n->ins[k]].dtype), k, nin);
        sb_puts(&body, line);
      }
      break;
    }
    case OP_SLICE:
      sb_printf(&body, "  %s(out, i, %s(x, row * %lld + %lld + col));\n", st,
                dtype_load(ir->tensors[n->ins[0]].dtype), (long long)tensor_width(ir, n->ins[0]),
                (long long)n->start);
      break;
    case OP_UNSTACK: {
      int64_t k = ir->tensors[n->ins[0]].set_k;
      sb_printf(&body, "  %s(out, i, %s(x, (row * %lld + %lld) * WIDTH + col));\n", st,
                dtype_load(ir->tensors[n->ins[0]].dtype), (long long)k, (long long)n->start);
      break;
    }
    default:  // flatten, unflatten: the same bytes, reshaped
      sb_printf(&body, "  %s(out, i, %s(x, i));\n", st, dtype_load(ir->tensors[n->ins[0]].dtype));
      break;
  }
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

// reduce_rows: a deterministic two-pass column sum (lower_column_sum).
static void bind_reduce_rows(KernelBuilder *kb, const void *ctx) {
  kb_tensor_in(kb, "x", *(const int *)ctx);
}

static bool lower_reduce_rows(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  char name[300], id[256], term[256];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "reduce_rows_%s", id);
  lower_comment(L, node, "column sums in fixed row chunks, then the chunks in order");
  snprintf(term, sizeof term, "(double)%s(x, r * WIDTH + col)", dtype_load(ir->tensors[n->ins[0]].dtype));
  lower_column_sum(L, node, name, n->out, tensor_rows(ir, n->ins[0]), tensor_width(ir, n->ins[0]),
                   bind_reduce_rows, &n->ins[0], term);
  return true;
}

static bool lower_loss(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  char name[300], id[256], body[2048];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s", op_name(n->op), id);
  KernelBuilder kb;
  if (n->op == OP_BCE) {
    lower_comment(L, node, "mean over the batch, one block");
    kb_begin(&kb, L, node, name, sym_const(1), 1, 1024);
    kb_tensor_out(&kb, "loss", n->out);
    kb_tensor_in(&kb, "logit", n->ins[0]);
    kb_tensor_in(&kb, "label", n->ins[1]);
    kb_size(&kb, "batch", tensor_rows(ir, n->ins[0]));
    snprintf(body, sizeof body,
             "  __shared__ double partial[WARP_SIZE];\n"
             "  double acc = 0.0;\n"
             "  for (i64 b = threadIdx.x; b < batch; b += blockDim.x) {\n"
             "    double z = %s(logit, b), y = %s(label, b);\n"
             "    acc += (z > 0 ? z : 0.0) - z * y + log1p(exp(-fabs(z)));\n"
             "  }\n"
             "  acc = block_sum(acc, partial);\n"
             "  if (threadIdx.x == 0) loss[0] = batch > 0 ? (float)(acc / (double)batch) : 0.0f;\n",
             dtype_load(ir->tensors[n->ins[0]].dtype), dtype_load(ir->tensors[n->ins[1]].dtype));
  } else if (n->op == OP_BCE_BWD) {
    lower_comment(L, node, "the seed of the backward pass");
    kb_begin(&kb, L, node, name, tensor_rows(ir, n->out), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
    kb_tensor_out(&kb, "dz", n->out);
    kb_tensor_in(&kb, "logit", n->ins[0]);
    kb_tensor_in(&kb, "label", n->ins[1]);
    kb_size(&kb, "n", tensor_rows(ir, n->out));
    snprintf(body, sizeof body,
             "%s"
             "  double z = %s(logit, i), y = %s(label, i);\n"
             "  %s(dz, i, (float)(%s * (act_sigmoid(z) - y) / (double)n));\n",
             ELEM_INDEX, dtype_load(ir->tensors[n->ins[0]].dtype), dtype_load(ir->tensors[n->ins[1]].dtype),
             dtype_store(ir->tensors[n->out].dtype), num(n->weight).s);
  } else {  // loss_sum
    lower_comment(L, node, "weighted sum of the terms");
    kb_begin(&kb, L, node, name, sym_const(1), 1, 32);
    kb_tensor_out(&kb, "loss", n->out);
    StrBuf b = {0};
    sb_puts(&b, "  if (threadIdx.x != 0) return;\n  double acc = 0.0;\n");
    for (int k = 0; k < n->nins; k++) {
      char p[16];
      snprintf(p, sizeof p, "term%d", k);
      kb_tensor_in(&kb, p, n->ins[k]);
      sb_printf(&b, "  acc += %s * (double)term%d[0];\n", num(n->weights[k]).s, k);
    }
    sb_puts(&b, "  loss[0] = (float)acc;\n");
    kb_end(&kb, b.data);
    sb_free(&b);
    return true;
  }
  kb_end(&kb, body);
  return true;
}

bool lower_pointwise(Lower *L, int node) {
  const Node *n = &L->ir->nodes[node];
  if (is_binary(n->op)) return lower_elementwise(L, node);
  switch (n->op) {
    case OP_ACT:
    case OP_ACT_BWD: return lower_act(L, node);
    case OP_CONCAT:
    case OP_SLICE:
    case OP_STACK:
    case OP_UNSTACK:
    case OP_FLATTEN:
    case OP_UNFLATTEN: return lower_copy(L, node);
    case OP_DOT_INTERACT:
    case OP_DOT_INTERACT_BWD: return lower_interact(L, node);  // lower_interact.c
    case OP_REDUCE_ROWS: return lower_reduce_rows(L, node);
    case OP_BCE:
    case OP_BCE_BWD:
    case OP_LOSS_SUM: return lower_loss(L, node);
    default: break;
  }
  return lower_fail(L, node, "no lowering for this op");
}
