// lower_norm.c: rmsnorm and layernorm, forward and backward. One warp per row (8 rows per
// block of 256 threads); the statistics are summed in double in a fixed lane order, as the
// CPU executor evaluates them in double. The gain gradients need every row: a row pass writes
// each row's statistics to a scratch buffer, then one block per column sums over the rows.
// Fusion: an `add` whose output goes straight into an rmsnorm is one kernel that writes the
// sum (still needed: it is the residual) and the normalized row, saving a read of the sum.
#include <stdio.h>
#include <string.h>

#include "lower_ops.h"

static const char *const ROW_INDEX =
    "  i64 row = (i64)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;\n"
    "  int lane = threadIdx.x % WARP_SIZE;\n"
    "  if (row >= rows) return;\n";

static void begin_rows(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize rows) {
  kb_begin(kb, L, node, name, rows, ROWS_PER_BLOCK, ROWS_PER_BLOCK * 32);
}

static bool lower_norm_forward(Lower *L, int node, int add_node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  bool rms = n->op == OP_RMSNORM;
  int64_t w = tensor_width(ir, n->out);
  char name[300], id[256], what[128];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s%s_%s", add_node >= 0 ? "add_" : "", op_name(n->op), id);
  if (add_node >= 0)
    snprintf(what, sizeof what, "eps=%g, with the residual add at %d:%d fused in", n->eps,
             ir->nodes[add_node].loc.first_line, ir->nodes[add_node].loc.first_column);
  else
    snprintf(what, sizeof what, "eps=%g", n->eps);
  lower_comment(L, node, what);
  SymSize rows = tensor_rows(ir, n->out);
  KernelBuilder kb;
  begin_rows(&kb, L, add_node >= 0 ? add_node : node, name, rows);
  kb_tensor_out(&kb, "y", n->out);
  StrBuf b = {0};
  sb_printf(&b, "  enum { WIDTH = %lld, ROWS_PER_BLOCK = %d };\n", (long long)w, ROWS_PER_BLOCK);
  const char *lx;
  if (add_node >= 0) {
    const Node *a = &ir->nodes[add_node];
    kb_tensor_out(&kb, "sum", a->out);
    kb_tensor_in(&kb, "a", a->ins[0]);
    kb_tensor_in(&kb, "b", a->ins[1]);
    kb.launch->nfused = 2;
    L->done[node] = true;
    sb_printf(&b, "%s", ROW_INDEX);
    sb_printf(&b, "  for (int j = lane; j < WIDTH; j += WARP_SIZE) {\n"
                  "    i64 i = row * WIDTH + j;\n"
                  "    %s(sum, i, %s(a, i) + %s(b, i));\n"
                  "  }\n"
                  "  __syncwarp();\n",
              dtype_store(ir->tensors[a->out].dtype), dtype_load(ir->tensors[a->ins[0]].dtype),
              dtype_load(ir->tensors[a->ins[1]].dtype));
    lx = dtype_load(ir->tensors[a->out].dtype);
  } else {
    kb_tensor_in(&kb, "x", n->ins[0]);
    sb_printf(&b, "%s", ROW_INDEX);
    lx = dtype_load(ir->tensors[n->ins[0]].dtype);
  }
  kb_tensor_in(&kb, "gain", n->ins[1]);
  if (!rms) kb_tensor_in(&kb, "bias", n->ins[2]);
  kb_size(&kb, "rows", rows);
  const char *xs = add_node >= 0 ? "sum" : "x";
  const char *st = dtype_store(ir->tensors[n->out].dtype);
  const char *lg = dtype_load(ir->tensors[n->ins[1]].dtype);
  if (rms) {
    sb_printf(&b, "  double sum_sq = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) { double v = %s(%s, row * WIDTH + j); sum_sq += v * v; }\n"
                  "  double inv_rms = 1.0 / sqrt(warp_sum(sum_sq) / WIDTH + %s);\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE)\n"
                  "    %s(y, row * WIDTH + j, (float)((double)%s(%s, row * WIDTH + j) * inv_rms * %s(gain, j)));\n",
              lx, xs, num(n->eps).s, st, lx, xs, lg);
  } else {
    sb_printf(&b, "  double sum = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) sum += %s(%s, row * WIDTH + j);\n"
                  "  double mean = warp_sum(sum) / WIDTH, sum_sq = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) { double v = %s(%s, row * WIDTH + j) - mean; sum_sq += v * v; }\n"
                  "  double inv_std = 1.0 / sqrt(warp_sum(sum_sq) / WIDTH + %s);\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE)\n"
                  "    %s(y, row * WIDTH + j,\n"
                  "        (float)(((double)%s(%s, row * WIDTH + j) - mean) * inv_std * %s(gain, j) + %s(bias, j)));\n",
              lx, xs, lx, xs, num(n->eps).s, st, lx, xs, lg, dtype_load(ir->tensors[n->ins[2]].dtype));
  }
  kb_end(&kb, b.data);
  sb_free(&b);
  return true;
}

bool lower_add_rmsnorm(Lower *L, int add_node, int norm_node) {
  return lower_norm_forward(L, norm_node, add_node);
}

// rmsnorm_bwd_x: dx = g dy / r - x * sum_j(g_j dy_j x_j) / (d r^3)
// layernorm_bwd_x: dx = (g' - mean(g') - xhat * mean(g' xhat)) / sigma, g' = dy g
static bool lower_norm_bwd_x(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  bool rms = n->op == OP_RMSNORM_BWD_X;
  int64_t w = tensor_width(ir, n->out);
  char name[300], id[256], what[64];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s", op_name(n->op), id);
  snprintf(what, sizeof what, "eps=%g", n->eps);
  lower_comment(L, node, what);
  SymSize rows = tensor_rows(ir, n->out);
  KernelBuilder kb;
  begin_rows(&kb, L, node, name, rows);
  kb_tensor_out(&kb, "dx", n->out);
  kb_tensor_in(&kb, "dy", n->ins[0]);
  kb_tensor_in(&kb, "x", n->ins[1]);
  kb_tensor_in(&kb, "gain", n->ins[2]);
  kb_size(&kb, "rows", rows);
  const char *ldy = dtype_load(ir->tensors[n->ins[0]].dtype), *lx = dtype_load(ir->tensors[n->ins[1]].dtype),
             *lg = dtype_load(ir->tensors[n->ins[2]].dtype), *st = dtype_store(ir->tensors[n->out].dtype);
  StrBuf b = {0};
  sb_printf(&b, "  enum { WIDTH = %lld, ROWS_PER_BLOCK = %d };\n%s", (long long)w, ROWS_PER_BLOCK, ROW_INDEX);
  if (rms) {
    sb_printf(&b, "  double sum_sq = 0.0, dot = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) {\n"
                  "    double v = %s(x, row * WIDTH + j);\n"
                  "    sum_sq += v * v;\n"
                  "    dot += %s(gain, j) * %s(dy, row * WIDTH + j) * v;\n"
                  "  }\n"
                  "  double r = sqrt(warp_sum(sum_sq) / WIDTH + %s);\n"
                  "  dot = warp_sum(dot);\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) {\n"
                  "    i64 i = row * WIDTH + j;\n"
                  "    %s(dx, i, (float)(%s(gain, j) * %s(dy, i) / r - %s(x, i) * dot / (WIDTH * r * r * r)));\n"
                  "  }\n",
              lx, lg, ldy, num(n->eps).s, st, lg, ldy, lx);
  } else {
    sb_printf(&b, "  double sum = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) sum += %s(x, row * WIDTH + j);\n"
                  "  double mean = warp_sum(sum) / WIDTH, sum_sq = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) { double v = %s(x, row * WIDTH + j) - mean; sum_sq += v * v; }\n"
                  "  double sigma = sqrt(warp_sum(sum_sq) / WIDTH + %s);\n"
                  "  double sum_g = 0.0, sum_gx = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) {\n"
                  "    i64 i = row * WIDTH + j;\n"
                  "    double g = (double)%s(dy, i) * %s(gain, j), xhat = (%s(x, i) - mean) / sigma;\n"
                  "    sum_g += g;\n"
                  "    sum_gx += g * xhat;\n"
                  "  }\n"
                  "  double mean_g = warp_sum(sum_g) / WIDTH, mean_gx = warp_sum(sum_gx) / WIDTH;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) {\n"
                  "    i64 i = row * WIDTH + j;\n"
                  "    double g = (double)%s(dy, i) * %s(gain, j), xhat = (%s(x, i) - mean) / sigma;\n"
                  "    %s(dx, i, (float)((g - mean_g - xhat * mean_gx) / sigma));\n"
                  "  }\n",
              lx, lx, num(n->eps).s, ldy, lg, lx, ldy, lg, lx, st);
  }
  kb_end(&kb, b.data);
  sb_free(&b);
  return true;
}

typedef struct GainInputs {
  int dy, x, stats;
} GainInputs;

static void bind_gain(KernelBuilder *kb, const void *ctx) {
  const GainInputs *in = ctx;
  kb_tensor_in(kb, "dy", in->dy);
  kb_tensor_in(kb, "x", in->x);
  kb_scratch(kb, "double", "stats", in->stats, false);
}

// The gain gradients: per row statistics (mean, 1/r or 1/sigma) to scratch, then a block per
// column sums dy * x * inv (rmsnorm) or dy * (x - mean) * inv (layernorm) over the rows.
static bool lower_norm_bwd_gain(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  bool rms = n->op == OP_RMSNORM_BWD_GAIN;
  int64_t w = tensor_width(ir, n->ins[1]);
  SymSize rows = tensor_rows(ir, n->ins[1]);
  char name[300], id[256], sname[300];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(sname, sizeof sname, "%s.row_stats", ir->tensors[n->out].name);
  int stats = lower_new_scratch(L, sname, sym_scale(rows, 16));
  const char *lx = dtype_load(ir->tensors[n->ins[1]].dtype), *ldy = dtype_load(ir->tensors[n->ins[0]].dtype);

  snprintf(name, sizeof name, "%s_stats_%s", op_name(n->op), id);
  lower_comment(L, node, "row statistics");
  KernelBuilder kb;
  begin_rows(&kb, L, node, name, rows);
  kb_scratch(&kb, "double", "stats", stats, true);
  kb_tensor_in(&kb, "x", n->ins[1]);
  kb_size(&kb, "rows", rows);
  StrBuf b = {0};
  sb_printf(&b, "  enum { WIDTH = %lld, ROWS_PER_BLOCK = %d };\n%s", (long long)w, ROWS_PER_BLOCK, ROW_INDEX);
  if (rms)
    sb_printf(&b, "  double sum_sq = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) { double v = %s(x, row * WIDTH + j); sum_sq += v * v; }\n"
                  "  double inv = 1.0 / sqrt(warp_sum(sum_sq) / WIDTH + %s);\n"
                  "  if (lane == 0) { stats[2 * row] = 0.0; stats[2 * row + 1] = inv; }\n",
              lx, num(n->eps).s);
  else
    sb_printf(&b, "  double sum = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) sum += %s(x, row * WIDTH + j);\n"
                  "  double mean = warp_sum(sum) / WIDTH, sum_sq = 0.0;\n"
                  "  for (int j = lane; j < WIDTH; j += WARP_SIZE) { double v = %s(x, row * WIDTH + j) - mean; sum_sq += v * v; }\n"
                  "  double inv = 1.0 / sqrt(warp_sum(sum_sq) / WIDTH + %s);\n"
                  "  if (lane == 0) { stats[2 * row] = mean; stats[2 * row + 1] = inv; }\n",
              lx, lx, num(n->eps).s);
  kb_end(&kb, b.data);
  sb_free(&b);

  snprintf(name, sizeof name, "%s_%s", op_name(n->op), id);
  lower_comment(L, node, "column sums in fixed row chunks, then the chunks in order");
  GainInputs in = {n->ins[0], n->ins[1], stats};
  char term[512];
  snprintf(term, sizeof term,
           "(double)%s(dy, r * WIDTH + col) *\n"
           "             (%s(x, r * WIDTH + col) - stats[2 * r]) * stats[2 * r + 1]",
           ldy, lx);
  lower_column_sum(L, node, name, n->out, rows, w, bind_gain, &in, term);
  return true;
}

bool lower_norm(Lower *L, int node) {
  switch (L->ir->nodes[node].op) {
    case OP_RMSNORM:
    case OP_LAYERNORM: return lower_norm_forward(L, node, -1);
    case OP_RMSNORM_BWD_X:
    case OP_LAYERNORM_BWD_X: return lower_norm_bwd_x(L, node);
    default: return lower_norm_bwd_gain(L, node);
  }
}
