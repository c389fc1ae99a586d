// lower_sparse.c: embedding lookups and the table gradient.
//   embed           out[r, :] = table[ids[r], :] (dense or jagged ids)
//   embed_pool      out[b, :] = sum (or mean) of the rows of example b's ids; empty bag: 0
//   embed_pool_bwd  out[r, :] = dy[b(r), :] (/ length for mean), b(r) by binary search
//   table_grad      the occurrences of every lookup are gathered, grouped by id with integer
//                   passes (kernels/table_grad.cuh), and one block per distinct id sums its
//                   dy rows in occurrence order (the CPU executor's order: same bits) and
//                   applies the table's optimizer (row-wise Adagrad or SGD) to that row:
//                   deterministic, no float atomics.
#include <stdio.h>
#include <string.h>

#include "kernels_embedded.h"
#include "lower_ops.h"

static bool lower_embed(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  bool pooled = n->op == OP_EMBED_POOL;
  int table = n->ins[0], ids = n->ins[1];
  int64_t dim = tensor_width(ir, table);
  char name[300], id[256], body[1500];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s", pooled ? "embed_pool" : "embed", id);
  lower_comment(L, node, pooled ? pool_name(n->pool) : (ir->tensors[ids].layout == LAYOUT_JAGGED ? "jagged" : "sparse"));
  SymSize elems = tensor_elems(ir, n->out);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  kb_tensor_in(&kb, "table", table);
  kb_tensor_in(&kb, "ids", ids);
  if (pooled) kb_offsets(&kb, "offsets", ir->tensors[ids].jag);
  kb_size(&kb, "n", elems);
  const char *lt = dtype_load(ir->tensors[table].dtype), *st = dtype_store(ir->tensors[n->out].dtype);
  if (!pooled)
    snprintf(body, sizeof body,
             "  enum { DIM = %lld };\n"
             "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i >= n) return;\n"
             "  i64 row = i / DIM, col = i %% DIM;\n"
             "  %s(out, i, %s(table, ids[row] * DIM + col));\n",
             (long long)dim, st, lt);
  else
    snprintf(body, sizeof body,
             "  enum { DIM = %lld };\n"
             "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i >= n) return;\n"
             "  i64 b = i / DIM, col = i %% DIM;\n"
             "  float acc = 0.0f;\n"
             "  for (i64 p = offsets[b]; p < offsets[b + 1]; p++) acc += %s(table, ids[p] * DIM + col);\n"
             "  %s(out, i, %s);\n",
             (long long)dim, lt, st,
             n->pool == POOL_MEAN ? "offsets[b + 1] > offsets[b] ? acc / (float)(offsets[b + 1] - offsets[b]) : 0.0f" : "acc");
  kb_end(&kb, body);
  return true;
}

static bool lower_embed_pool_bwd(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  int ids = n->ins[0], dy = n->ins[1];
  int64_t dim = tensor_width(ir, n->out);
  char name[300], id[256], body[1200];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "embed_pool_bwd_%s", id);
  lower_comment(L, node, pool_name(n->pool));
  SymSize elems = tensor_elems(ir, n->out);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  kb_tensor_in(&kb, "dy", dy);
  kb_offsets(&kb, "offsets", ir->tensors[ids].jag);
  kb_size(&kb, "batch", (SymSize){0, 1, 0, -1});
  kb_size(&kb, "n", elems);
  snprintf(body, sizeof body,
           "  enum { DIM = %lld };\n"
           "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (i >= n) return;\n"
           "  i64 row = i / DIM, col = i %% DIM;\n"
           "  i64 b = example_of_row(offsets, batch, row);\n"
           "  float g = %s(dy, b * DIM + col);\n"
           "  %s(out, i, %s);\n",
           (long long)dim, dtype_load(ir->tensors[dy].dtype), dtype_store(ir->tensors[n->out].dtype),
           n->pool == POOL_MEAN ? "g / (float)(offsets[b + 1] - offsets[b])" : "g");
  kb_end(&kb, body);
  return true;
}

static bool lower_table_grad(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  int table = n->ins[0];
  const Tensor *tt = &ir->tensors[table];
  int64_t dim = tensor_width(ir, table), rows = tt->fixed[0];
  int npairs = (n->nins - 1) / 2;
  // The occurrences: the sum of every pair's ids.
  SymSize occ = sym_const(0);
  for (int k = 0; k < npairs; k++) {
    SymSize r = tensor_rows(ir, n->ins[1 + 2 * k]);
    if (occ.t != 0 && r.t != 0 && occ.jag != r.jag)
      return lower_fail(L, node, "lookups over two different jagged dims of one table");
    occ = sym_add(occ, r);
  }
  if (!L->have_table_grad_kernels) {
    sb_puts(&L->src, "\n// --- table gradients: grouping ids by integer passes (kernels/table_grad.cuh) ---\n");
    sb_puts(&L->src, kernel_table_grad_cuh);
    L->have_table_grad_kernels = true;
  }
  const char *tn = tt->name;
  char sname[300], name[300], id[256];
  ident(id, sizeof id, tn);
#define SCRATCH(var, suffix, bytes) \
  snprintf(sname, sizeof sname, "%s.grad.%s", tn, suffix); \
  int var = lower_new_scratch(L, sname, bytes)
  SCRATCH(occ_ids, "occ_ids", sym_scale(occ, 8));
  SCRATCH(count, "count", sym_const(rows * 4));
  SCRATCH(seg_start, "seg_start", sym_const(rows * 4));
  SCRATCH(rank, "distinct_rank", sym_const(rows * 4));
  int64_t nblocks = (rows + 4095) / 4096;
  SCRATCH(totals, "block_totals", sym_const(nblocks * 16));
  SCRATCH(dbegin, "distinct_begin", sym_scale(occ, 4));
  SCRATCH(dcount, "distinct_count", sym_scale(occ, 4));
  SCRATCH(perm, "perm", sym_scale(occ, 4));
  SCRATCH(sorted, "sorted", sym_scale(occ, 4));
#undef SCRATCH

  // 1. gather the ids of every lookup, in use order.
  snprintf(name, sizeof name, "table_grad_gather_%s", id);
  lower_comment(L, node, "gather the ids of every lookup");
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, occ, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_scratch(&kb, "i64", "occ_ids", occ_ids, true);
  StrBuf b = {0};
  sb_puts(&b, "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, k = i;  // k: within one lookup\n");
  for (int k = 0; k < npairs; k++) {
    char p[32];
    snprintf(p, sizeof p, "ids%d", k);
    kb_tensor_in(&kb, p, n->ins[1 + 2 * k]);
    snprintf(p, sizeof p, "n%d", k);
    kb_size(&kb, p, tensor_rows(ir, n->ins[1 + 2 * k]));
  }
  for (int k = 0; k < npairs; k++) {
    sb_printf(&b, "  if (k < n%d) { occ_ids[i] = ids%d[k]; return; }\n  k -= n%d;\n", k, k, k);
  }
  kb_end(&kb, b.data);
  sb_free(&b);

  // 2..6: the integer passes, hand-written kernels (kernels/table_grad.cuh) shared by every
  // table; kb_end_existing checks each launch's arguments against the kernel's parameters.
  LaunchArg count_arg = {.kind = ARG_SCRATCH, .tensor = -1, .slot = count, .jag = -1, .tiles = -1};
  Launch *z = lower_new_launch(L, LAUNCH_ZERO, node);
  z->zero_arg = count_arg;
  z->zero_bytes = sym_const(rows * 4);
  kb_begin_existing(&kb, L, node, "table_grad_count", occ, 256, 256);
  kb_scratch(&kb, "int", "count", count, true);
  kb_scratch(&kb, "i64", "occ_ids", occ_ids, false);
  kb_size(&kb, "n", occ);
  kb_end_existing(&kb);
  kb_begin_existing(&kb, L, node, "table_grad_scan_blocks", sym_const(nblocks), 1, 1024);
  kb_scratch(&kb, "int", "seg_start", seg_start, true);
  kb_scratch(&kb, "int", "distinct_rank", rank, true);
  kb_scratch(&kb, "i64", "block_totals", totals, true);
  kb_scratch(&kb, "int", "count", count, false);
  kb_size(&kb, "rows", sym_const(rows));
  kb_end_existing(&kb);
  kb_begin_existing(&kb, L, node, "table_grad_scan_totals", sym_const(1), 1, 32);
  kb_scratch(&kb, "i64", "block_totals", totals, true);
  kb_tensor_typed(&kb, "i64", "rows_header", n->out, true);
  kb_size(&kb, "nblocks", sym_const(nblocks));
  kb_end_existing(&kb);
  kb_begin_existing(&kb, L, node, "table_grad_scan_add", sym_const(rows), 256, 256);
  kb_scratch(&kb, "int", "seg_start", seg_start, true);
  kb_tensor_typed(&kb, "i64", "rows_tensor", n->out, true);
  kb_scratch(&kb, "int", "distinct_begin", dbegin, true);
  kb_scratch(&kb, "int", "distinct_count", dcount, true);
  kb_scratch(&kb, "int", "count", count, true);
  kb_scratch(&kb, "int", "distinct_rank", rank, false);
  kb_scratch(&kb, "i64", "block_totals", totals, false);
  kb_size(&kb, "rows", sym_const(rows));
  kb_end_existing(&kb);
  kb_begin_existing(&kb, L, node, "table_grad_scatter", occ, 256, 256);
  kb_scratch(&kb, "int", "perm", perm, true);
  kb_scratch(&kb, "int", "fill", count, true);
  kb_scratch(&kb, "int", "seg_start", seg_start, false);
  kb_scratch(&kb, "i64", "occ_ids", occ_ids, false);
  kb_size(&kb, "n", occ);
  kb_end_existing(&kb);
  kb_begin_existing(&kb, L, node, "table_grad_sort", sym_scale(occ, 32), 256, 256);
  kb_scratch(&kb, "int", "sorted", sorted, true);
  kb_scratch(&kb, "int", "perm", perm, false);
  kb_scratch(&kb, "int", "distinct_begin", dbegin, false);
  kb_scratch(&kb, "int", "distinct_count", dcount, false);
  kb_tensor_typed(&kb, "i64", "rows_header", n->out, false);
  kb_size(&kb, "max_distinct", occ);
  kb_end_existing(&kb);

  // 7. one block per distinct id: sum in occurrence order, write the rows, apply the optimizer.
  Optim o = tt->optim;
  snprintf(name, sizeof name, "table_grad_apply_%s", id);
  char what[160];
  snprintf(what, sizeof what, "sum per distinct id, then %s on the row", optim_name(o.kind));
  lower_comment(L, node, what);
  kb_begin(&kb, L, node, name, occ, 1, 256);
  kb.launch->optimizer = false;
  kb_tensor_out(&kb, "rows_grad", n->out);
  kb_tensor_out(&kb, "table", table);
  if (o.kind == OPTIM_ROWWISE_ADAGRAD) kb_optstate(&kb, "rowsum", table, 0);
  kb_scratch(&kb, "int", "sorted", sorted, false);
  kb_scratch(&kb, "int", "distinct_begin", dbegin, false);
  kb_scratch(&kb, "int", "distinct_count", dcount, false);
  for (int k = 0; k < npairs; k++) {
    char p[32];
    snprintf(p, sizeof p, "dy%d", k);
    kb_tensor_in(&kb, p, n->ins[2 + 2 * k]);
    snprintf(p, sizeof p, "n%d", k);
    kb_size(&kb, p, tensor_rows(ir, n->ins[1 + 2 * k]));
  }
  kb_size(&kb, "max_distinct", occ);
  b = (StrBuf){0};
  sb_printf(&b, "  enum { DIM = %lld };\n"
                "  __shared__ double partial[WARP_SIZE];\n"
                "  i64 *header = (i64 *)rows_grad;  // [U][ids[max_distinct]][values]\n"
                "  i64 d = blockIdx.x;\n"
                "  if (d >= header[0]) return;\n"
                "  i64 row = header[1 + d];\n"
                "  float *grad = (float *)(header + 1 + max_distinct) + d * DIM;\n"
                "  int begin = distinct_begin[d], count = distinct_count[d];\n"
                "  double sum_sq = 0.0;\n"
                "  for (int col = threadIdx.x; col < DIM; col += blockDim.x) {\n"
                "    float g = 0.0f;\n"
                "    for (int e = 0; e < count; e++) {\n"
                "      i64 occ = sorted[begin + e];\n",
            (long long)dim);
  for (int k = 0; k < npairs; k++)
    sb_printf(&b, "      %sif (occ < n%d) { g += %s(dy%d, occ * DIM + col); continue; }\n      occ -= n%d;\n",
              "", k, dtype_load(ir->tensors[n->ins[2 + 2 * k]].dtype), k, k);
  sb_puts(&b, "    }\n"
              "    grad[col] = g;\n"
              "    sum_sq += (double)g * g;\n"
              "  }\n");
  const char *lt = dtype_load(tt->dtype), *st = dtype_store(tt->dtype);
  switch (o.kind) {
    case OPTIM_ROWWISE_ADAGRAD:
      sb_printf(&b, "  sum_sq = block_sum(sum_sq, partial);\n"
                    "  float state = (float)(rowsum[row] + sum_sq / DIM);\n"
                    "  __syncthreads();\n"
                    "  if (threadIdx.x == 0) rowsum[row] = state;\n"
                    "  double step = %s / (sqrt((double)state) + %s);\n"
                    "  for (int col = threadIdx.x; col < DIM; col += blockDim.x)\n"
                    "    %s(table, row * DIM + col, (float)(%s(table, row * DIM + col) - step * grad[col]));\n",
                num(o.lr).s, num(o.eps).s, st, lt);
      break;
    case OPTIM_SGD:
      sb_printf(&b, "  for (int col = threadIdx.x; col < DIM; col += blockDim.x)\n"
                    "    %s(table, row * DIM + col, (float)(%s(table, row * DIM + col) - %s * grad[col]));\n",
                st, lt, num(o.lr).s);
      break;
    default:
      sb_puts(&b, "  (void)table; (void)sum_sq;  // a frozen table\n");
      break;
  }
  kb_end(&kb, b.data);
  sb_free(&b);
  return true;
}

bool lower_sparse(Lower *L, int node) {
  switch (L->ir->nodes[node].op) {
    case OP_EMBED:
    case OP_EMBED_POOL: return lower_embed(L, node);
    case OP_EMBED_POOL_BWD: return lower_embed_pool_bwd(L, node);
    default: return lower_table_grad(L, node);
  }
}

// AdamW (runtime/cpu/optim.c, exactly: moments in double then stored fp32) or SGD, one thread per
// element, at the end of the step.
bool lower_optimizer(Lower *L, int param) {
  const Ir *ir = L->ir;
  const Tensor *t = &ir->tensors[param];
  Optim o = ir->dense_optim;
  if (o.kind != OPTIM_ADAMW && o.kind != OPTIM_SGD) return true;
  char name[300], id[256], body[2048];
  ident(id, sizeof id, t->name);
  snprintf(name, sizeof name, "%s_%s", optim_name(o.kind), id);
  char what[300];
  snprintf(what, sizeof what, "%s @%s (optimizer)", optim_name(o.kind), t->name);
  lower_comment_at(L, t->loc, what);
  SymSize elems = tensor_elems(ir, param);
  KernelBuilder kb;
  kb_begin(&kb, L, -1, name, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb.launch->optimizer = true;
  kb.launch->node = ir->tensors[ir_grad_of(ir, param)].producer;
  kb_tensor_out(&kb, "w", param);
  if (o.kind == OPTIM_ADAMW) {
    kb_optstate(&kb, "m", param, 0);
    kb_optstate(&kb, "v", param, 1);
  }
  kb_tensor_in(&kb, "g", ir_grad_of(ir, param));
  if (o.kind == OPTIM_ADAMW) kb_step(&kb, "step");
  kb_size(&kb, "n", elems);
  if (o.kind == OPTIM_ADAMW)
    snprintf(body, sizeof body,
             "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i >= n) return;\n"
             "  const double lr = %s, beta1 = %s, beta2 = %s, eps = %s, weight_decay = %s;\n"
             "  double bias1 = 1.0 - pow(beta1, (double)step), bias2 = 1.0 - pow(beta2, (double)step);\n"
             "  double grad = g[i];\n"
             "  float m_new = (float)(beta1 * m[i] + (1.0 - beta1) * grad);\n"
             "  float v_new = (float)(beta2 * v[i] + (1.0 - beta2) * grad * grad);\n"
             "  m[i] = m_new;\n"
             "  v[i] = v_new;\n"
             "  double m_hat = (double)m_new / bias1, v_hat = (double)v_new / bias2;\n"
             "  w[i] = (float)(w[i] - lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w[i]));\n",
             num(o.lr).s, num(o.beta1).s, num(o.beta2).s, num(o.eps).s, num(o.weight_decay).s);
  else
    snprintf(body, sizeof body,
             "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) w[i] = (float)(w[i] - %s * g[i]);\n",
             num(o.lr).s);
  kb_end(&kb, body);
  return true;
}
