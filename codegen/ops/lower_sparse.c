// lower_sparse.c: embedding lookups and the table gradient.
//   embed           out[r, :] = table[ids[r], :] (dense or jagged ids)
//   embed_pool      out[b, :] = sum (or mean) of the rows of example b's ids; empty bag: 0
//   embed_pool_bwd  out[r, :] = dy[b(r), :] (/ length for mean), b(r) by binary search
//   table_grad      the occurrences of every lookup are gathered, grouped by id with integer
//                   passes (kernels/table_grad.cuh), and one block per distinct id sums its
//                   dy rows in occurrence order (the CPU executor's order: same bits) and
//                   applies the table's optimizer (row-wise Adagrad or SGD) to that row:
//                   deterministic, no float atomics.
//                   With ir->defer_table_updates (GPU ranks of several) the sums are only
//                   written, and table_rows_apply, an optimizer launch, applies the optimizer
//                   to the rows the runtime merged across ranks in between.
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "internal_error.h"
#include "kernels_embedded.h"
#include "lower_ops.h"
#include "target.h"


// table_grad_apply: occurrences loaded ahead of their adds; a table is `hot` when its rows take
// HOT_OCCURRENCES or more occurrences each at the largest batch, and a hot row's run longer
// than SPLIT_MIN is summed in parallel parts.
// A hot table's runs are also cut over up to SPLIT_BLOCKS blocks each (enough blocks for
// SPLIT_TARGET in all): a 64-row table had only 64 blocks on 132 SMs.
enum { APPLY_AHEAD = 8, HOT_OCCURRENCES = 64, SPLIT_MIN = 64, APPLY_WARPS = 8, LONG_BLOCKS = 264,
       // the warp kernels: 3 occurrences x 8 columns in flight a lane, beside the row's 8
       // columns loaded early, keep table_grad_apply at 60 registers, 4 blocks of 8 warps an SM
       // (8 ahead took 89, 22% occupancy; 4 ahead with the early row 72: docs/perf.md)
       WARP_AHEAD = 3, LONG_WARPS = 32,
       // the warp apply lists a run longer than this for table_grad_apply_long's 32 warps: one
       // warp walking a run of up to 64 held gem_small's tagt apply at 0.033 ms (docs/perf.md)
       WARP_SPLIT_MIN = 16,
       SPLIT_BLOCKS = 16, SPLIT_TARGET = 4 * 132 };
// An enum constant of kernels/table_grad.cuh (its `NAME = N` text), so the passes, shifts and
// tiles here always match the kernels.
static int table_grad_constant(const char *name, int lo, int hi) {
  char text[64];
  snprintf(text, sizeof text, "%s = ", name);
  const char *at = strstr(kernel_table_grad_cuh, text);
  int v = at ? atoi(at + strlen(text)) : 0;
  if (v < lo || v > hi)
    gemc_internal_error(__FILE__, __LINE__, "kernels/table_grad.cuh has no usable enum constant");
  return v;
}

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

// table_grad_apply's `value(occ)`: occurrence occ's gradient in column col, from its lookup's
// dy rows (the lookups' occurrences are numbered one after another).
static void emit_value_lambda(StrBuf *b, const Ir *ir, const Node *n, int npairs) {
  sb_puts(b, "    // The occurrence's gradient value in column col: its lookup's dy row.\n"
             "    auto value = [&](i64 occ) -> float {\n");
  for (int k = 0; k < npairs; k++)
    sb_printf(b, "      if (occ < n%d) return %s(dy%d, occ * DIM + col);\n      occ -= n%d;\n",
              k, dtype_load(ir->tensors[n->ins[2 + 2 * k]].dtype), k, k);
  sb_puts(b, "      return 0.0f;\n"
             "    };\n");
}

// g += the run's occurrences [lo, hi) in order; the loads of AHEAD occurrences are issued
// before their adds, so that a long run is not one load latency per occurrence.
static void emit_run_sum(StrBuf *b, const char *in, const char *lo, const char *hi) {
  sb_printf(b, "%sint e = %s;\n"
               "%sfor (; e + AHEAD <= %s; e += AHEAD) {\n"
               "%s  int at[AHEAD];\n"
               "%s  float v[AHEAD];\n"
               "#pragma unroll\n"
               "%s  for (int u = 0; u < AHEAD; u++) at[u] = sorted[begin + e + u];\n"
               "#pragma unroll\n"
               "%s  for (int u = 0; u < AHEAD; u++) v[u] = value(at[u]);\n"
               "#pragma unroll\n"
               "%s  for (int u = 0; u < AHEAD; u++) g += v[u];\n"
               "%s}\n"
               "%sfor (; e < %s; e++) g += value(sorted[begin + e]);\n",
            in, lo, in, hi, in, in, in, in, in, in, in, hi);
}

// The warp variants' `values(occ, v)`: occurrence occ's gradient in columns c0 .. c0 + VEC - 1,
// one vector load from its lookup's dy row; and g[] += the run's occurrences [lo, hi), in
// occurrence order, AHEAD at a time: their positions, then their rows, are loaded before any
// add, the last group's missing occurrences neither loaded nor added (so a run of 3 costs two
// load latencies, not six as one occurrence at a time did). `in` indents.
static void emit_values_run_sum(StrBuf *b, const Ir *ir, const Node *n, int npairs, const char *in,
                                const char *lo, const char *hi) {
  sb_printf(b, "%s// The occurrence's gradient in columns c0 .. c0 + VEC - 1: its lookup's dy row.\n"
               "%sauto values = [&](i64 occ, float *v) {\n", in, in);
  for (int k = 0; k < npairs; k++)
    sb_printf(b, "%s  if (occ < n%d) return %s_n<VEC>(dy%d, occ * DIM + c0, v);\n%s  occ -= n%d;\n",
              in, k, dtype_load(ir->tensors[n->ins[2 + 2 * k]].dtype), k, in, k);
  sb_printf(b, "%s  for (int j = 0; j < VEC; j++) v[j] = 0.0f;\n"
               "%s};\n"
               "%sfloat g[VEC] = {};\n"
               "%sfor (int e = %s; e < %s; e += AHEAD) {\n"
               "%s  const int here = %s - e < AHEAD ? %s - e : AHEAD;\n"
               "%s  int at[AHEAD];\n"
               "%s  float v[AHEAD][VEC];\n"
               "#pragma unroll\n"
               "%s  for (int u = 0; u < AHEAD; u++) at[u] = u < here ? sorted[begin + e + u] : 0;\n"
               "#pragma unroll\n"
               "%s  for (int u = 0; u < AHEAD; u++)\n"
               "%s    if (u < here) values(at[u], v[u]);\n"
               "#pragma unroll\n"
               "%s  for (int u = 0; u < AHEAD; u++)\n"
               "#pragma unroll\n"
               "%s    for (int j = 0; j < VEC; j++)\n"
               "%s      if (u < here) g[j] += v[u][j];\n"
               "%s}\n",
            in, in, in, in, lo, hi, in, hi, hi, in, in, in, in, in, in, in, in, in);
}

// The columns a lane of the warp variants owns: VEC adjacent ones (8 for D = 256: one 16-byte
// load an occurrence), the widest that divides DIM and leaves no lane of a 32 x VEC chunk idle.
static int warp_vec(int64_t dim) {
  int vec = 8;
  while (vec > 1 && (dim % vec != 0 || 32 * vec > dim)) vec /= 2;
  return vec;
}

// What table_grad_apply's emitters need to know.
typedef struct ApplyKernel {
  const Ir *ir;
  const Node *n;
  int npairs;
  int64_t dim, gcols;
  int parts;  // the block variant's groups: parallel parts of a long run
  bool warp;  // the kernel of a warp per id (else a block per id)
  int blocks; // the block variant: blocks per id (table_grad_parts), 1 when it sums alone
  bool kept;  // the warp variant: each lane holds its columns' sums in keep[CHUNKS][VEC]
} ApplyKernel;

// The (ids, dy) pairs of a table_grad node as kernel parameters: `<what><p>` is input `first +
// 2p` of the node (1: the ids, 2: the gradients) and `n<p>` the rows of pair p's ids.
static void pair_args(KernelBuilder *kb, const Ir *ir, const Node *n, int npairs, const char *what,
                      int first) {
  for (int p = 0; p < npairs; p++) {
    char name[32];
    snprintf(name, sizeof name, "%s%d", what, p);
    kb_tensor_in(kb, name, n->ins[first + 2 * p]);
    snprintf(name, sizeof name, "n%d", p);
    kb_size(kb, name, tensor_rows(ir, n->ins[1 + 2 * p]));
  }
}

// The parameters both apply kernels share, in this order.
static void apply_args(KernelBuilder *kb, const ApplyKernel *k, int rows_grad, int table,
                       OptimKind optim, int sorted, int dbegin, SymSize occ) {
  kb->launch->optimizer = false;
  kb_tensor_out(kb, "rows_grad", rows_grad);
  kb_tensor_out(kb, "table", table);
  if (optim == OPTIM_ROWWISE_ADAGRAD) kb_optstate(kb, "rowsum", table, 0);
  kb_scratch(kb, "int", "sorted", sorted, false);
  kb_scratch(kb, "int", "distinct_begin", dbegin, false);
  pair_args(kb, k->ir, k->n, k->npairs, "dy", 2);
  kb_size(kb, "max_distinct", occ);
}

// The optimizer's row update after the sum, indented by `in`. A kept sum (the warp apply)
// updates from the lane's registers, VEC columns a vector load and store; otherwise the column
// loop walks the columns as the sum did, so that each thread reads back the grad it wrote.
static void emit_row_update(StrBuf *b, const ApplyKernel *k, const Tensor *tt, const char *in) {
  const char *lt = dtype_load(tt->dtype), *st = dtype_store(tt->dtype);
  char cols[600];
  if (k->warp)
    snprintf(cols, sizeof cols, "%sfor (int c0 = lane * VEC; c0 < DIM; c0 += WARP_SIZE * VEC)\n"
                                "%s  for (int col = c0; col < c0 + VEC; col++)\n%s    ", in, in, in);
  else
    snprintf(cols, sizeof cols, "%sfor (int col = threadIdx.x; col < DIM; col += blockDim.x)\n%s  ", in, in);
  Optim o = tt->optim;
  if (k->kept && o.kind != OPTIM_NONE) {  // the sums are in registers: VEC columns a load
    char step[64];
    snprintf(step, sizeof step, "%s", o.kind == OPTIM_SGD ? num(o.lr).s : "step");
    snprintf(cols, sizeof cols, "#pragma unroll\n"
                                "%sfor (int k = 0; k < CHUNKS; k++) {\n"
                                "%s  const int c0 = (k * WARP_SIZE + lane) * VEC;\n"
                                "%s  if (c0 >= DIM) break;\n"
                                "#pragma unroll\n"
                                "%s  for (int j = 0; j < VEC; j++) w[k][j] = (float)(w[k][j] - %s * keep[k][j]);\n"
                                "%s  %s_n<VEC>(table, row * DIM + c0, w[k]);\n"
                                "%s}\n",
             in, in, in, in, step, in, st, in);
  }
  switch (o.kind) {
    case OPTIM_ROWWISE_ADAGRAD:
      if (k->warp)
        sb_printf(b, "%ssum_sq = warp_sum(sum_sq);\n"
                     "%sfloat state = (float)(%s + sum_sq / DIM);\n"
                     "%s__syncwarp();  // every lane has read rowsum before it is written\n"
                     "%sif (lane == 0) rowsum[row] = state;\n", in, in,
                  k->kept ? "rowsum_was" : "rowsum[row]", in, in);
      else
        sb_printf(b, "%ssum_sq = block_sum(sum_sq, partial);\n"
                     "%sfloat state = (float)(rowsum[row] + sum_sq / DIM);\n"
                     "%s__syncthreads();\n"
                     "%sif (threadIdx.x == 0) rowsum[row] = state;\n", in, in, in, in);
      sb_printf(b, "%sdouble step = %s / (sqrt((double)state) + %s);\n", in, num(o.lr).s,
                num(o.eps).s);
      if (k->kept) sb_puts(b, cols);
      else
        sb_printf(b, "%s%s(table, row * DIM + col, (float)(%s(table, row * DIM + col) - step * grad[col]));\n",
                  cols, st, lt);
      break;
    case OPTIM_SGD:
      if (k->kept) sb_puts(b, cols);
      else
        sb_printf(b, "%s%s(table, row * DIM + col, (float)(%s(table, row * DIM + col) - %s * grad[col]));\n",
                  cols, st, lt, num(o.lr).s);
      break;
    default:
      sb_printf(b, "%s(void)table; (void)sum_sq;  // a frozen table\n", in);
      break;
  }
}

// A warp per distinct id, lanes over the columns, so that a block holds APPLY_WARPS ids and an
// SM many more than with a block per id. Each lane owns VEC adjacent columns (one vector load
// an occurrence), so that a run is walked once per DIM / (32 VEC) column passes: once for
// DIM = 256. Each column sums its run in occurrence order (the CPU's bits). A run longer than
// WARP_SPLIT_MIN goes on the long list for table_grad_apply_long.
static void emit_warp_apply(StrBuf *b, const ApplyKernel *k, const Tensor *tt) {
  int vec = warp_vec(k->dim);
  sb_printf(b, "  enum { DIM = %lld, IDS = %d, AHEAD = %d, VEC = %d, SPLIT_MIN = %d,\n"
               "         CHUNKS = (DIM + WARP_SIZE * VEC - 1) / (WARP_SIZE * VEC) };\n"
               "  i64 *header = (i64 *)rows_grad;  // [U][ids[max_distinct]][values]\n"
               "  i64 d = (i64)blockIdx.x * IDS + threadIdx.x / WARP_SIZE;\n"
               "  const int lane = (int)(threadIdx.x %% WARP_SIZE);\n"
               "  if (d >= header[0]) return;  // the whole warp: nothing below syncs the block\n"
               "  i64 row = header[1 + d];\n"
               "  float *grad = (float *)(header + 1 + max_distinct) + d * DIM;\n"
               "  int begin = distinct_begin[d], count = distinct_begin[d + 1] - begin;\n"
               "  if (count > SPLIT_MIN) {  // table_grad_apply_long sums it\n"
               "    if (lane == 0) long_runs[atomicAdd((unsigned *)&sort_state[SORT_LONG_COUNT], 1u)] = (int)d;\n"
               "    return;\n"
               "  }\n"
               "  double sum_sq = 0.0;\n"
               "  float keep[CHUNKS][VEC];  // the lane's sums, for the update below\n",
            (long long)k->dim, APPLY_WARPS, WARP_AHEAD, vec, WARP_SPLIT_MIN);
  if (tt->optim.kind != OPTIM_NONE) {  // loaded now, so that their latency overlaps the sum's
    sb_printf(b, "  float w[CHUNKS][VEC];  // the lane's columns of the row\n"
                 "#pragma unroll\n"
                 "  for (int k = 0; k < CHUNKS; k++)\n"
                 "    if ((k * WARP_SIZE + lane) * VEC < DIM)\n"
                 "      %s_n<VEC>(table, row * DIM + (k * WARP_SIZE + lane) * VEC, w[k]);\n",
              dtype_load(tt->dtype));
    if (tt->optim.kind == OPTIM_ROWWISE_ADAGRAD)
      sb_puts(b, "  const float rowsum_was = rowsum[row];\n");
  }
  sb_puts(b, "#pragma unroll\n"
               "  for (int k = 0; k < CHUNKS; k++) {\n"
               "    const int c0 = (k * WARP_SIZE + lane) * VEC;\n"
               "    if (c0 >= DIM) break;\n");
  emit_values_run_sum(b, k->ir, k->n, k->npairs, "    ", "0", "count");
  sb_puts(b, "    store_f32_n<VEC>(grad, c0, g);\n"
             "#pragma unroll\n"
             "    for (int j = 0; j < VEC; j++) {\n"
             "      keep[k][j] = g[j];\n"
             "      sum_sq += (double)g[j] * g[j];\n"
             "    }\n"
             "  }\n");
  ApplyKernel kept = *k;
  kept.kept = true;
  emit_row_update(b, &kept, tt, "  ");
}

// table_grad_apply_long: the listed long runs (more than WARP_SPLIT_MIN occurrences), LONG_BLOCKS
// blocks of LONG_WARPS warps taking the listed ids c, c + LONG_BLOCKS, ... Warp w sums the w-th
// of LONG_WARPS contiguous parts of the run, VEC columns a lane, WARP_AHEAD occurrences in
// flight (the warp apply's loop), a chunk of 32 VEC columns at a time; the block adds the warps' sums
// in warp order, so the result does not depend on the list's order. Then the row's update.
// (Four groups of one column a thread, as before, walked a popular item's run of thousands
// with 32 loads in flight a block: 0.134 ms of gem_small's step, docs/perf.md.)
static void emit_long_apply(StrBuf *b, const ApplyKernel *k, const Tensor *tt) {
  sb_printf(b, "  enum { DIM = %lld, VEC = %d, AHEAD = %d, WARPS = %d, CHUNK = WARP_SIZE * VEC };\n"
               "  __shared__ double partial[WARP_SIZE];\n"
               "  __shared__ float part[WARPS][CHUNK];  // the warps' sums of one chunk of columns\n"
               "  i64 *header = (i64 *)rows_grad;  // [U][ids[max_distinct]][values]\n"
               "  const int warp = (int)(threadIdx.x / WARP_SIZE), lane = (int)(threadIdx.x %% WARP_SIZE);\n"
               "  const int long_count = sort_state[SORT_LONG_COUNT];\n"
               "  for (int li = blockIdx.x; li < long_count; li += gridDim.x) {\n"
               "    i64 d = long_runs[li];\n"
               "    i64 row = header[1 + d];\n"
               "    float *grad = (float *)(header + 1 + max_distinct) + d * DIM;\n"
               "    int begin = distinct_begin[d], count = distinct_begin[d + 1] - begin;\n"
               "    const int lo = (int)((i64)count * warp / WARPS), hi = (int)((i64)count * (warp + 1) / WARPS);\n"
               "    double sum_sq = 0.0;\n"
               "    for (int chunk = 0; chunk < DIM; chunk += CHUNK) {\n"
               "      const int c0 = chunk + lane * VEC;\n"
               "      if (c0 < DIM) {\n",
            (long long)k->dim, warp_vec(k->dim), WARP_AHEAD, LONG_WARPS);
  emit_values_run_sum(b, k->ir, k->n, k->npairs, "        ", "lo", "hi");
  sb_puts(b, "#pragma unroll\n"
             "        for (int j = 0; j < VEC; j++) part[warp][lane * VEC + j] = g[j];\n"
             "      }\n"
             "      __syncthreads();\n"
             "      for (int t = threadIdx.x; t < CHUNK && chunk + t < DIM; t += blockDim.x) {\n"
             "        float g = 0.0f;\n"
             "        for (int w = 0; w < WARPS; w++) g += part[w][t];\n"
             "        grad[chunk + t] = g;\n"
             "        sum_sq += (double)g * g;\n"
             "      }\n"
             "      __syncthreads();  // part serves the next chunk; the row's gradient is read below\n"
             "    }\n");
  ApplyKernel block = *k;
  block.warp = false;
  emit_row_update(b, &block, tt, "    ");
  sb_puts(b, "    __syncthreads();  // partial serves the next id\n"
             "  }\n");
}

// Inside a block kernel's column loop: g = this group's occurrences [lo, hi) of the run in
// column col, then (GROUPS > 1) the groups' sums added in group order, into group 0's g.
static void emit_groups_sum(StrBuf *b, const ApplyKernel *k) {
  emit_value_lambda(b, k->ir, k->n, k->npairs);
  sb_puts(b, "    float g = 0.0f;\n"
             "    if (col < DIM) {\n");
  emit_run_sum(b, "      ", "lo", "hi");
  sb_puts(b, "    }\n"
             "    if (GROUPS > 1) {  // the groups' sums, added in group order by group 0\n"
             "      part[group * GCOLS + lane_col] = g;\n"
             "      __syncthreads();\n"
             "      if (group == 0) {\n"
             "        g = 0.0f;\n"
             "        for (int p = 0; p < GROUPS; p++) g += part[p * GCOLS + lane_col];\n"
             "      }\n"
             "      __syncthreads();\n"
             "    }\n");
}

// table_grad_parts: block x sums part x % BLOCKS of distinct id x / BLOCKS's run into
// part_sums[x] (every element written). A run of at most SPLIT_MIN is summed whole, in
// occurrence order, by part 0 (the CPU executor's order: the same bits once the zeros of the
// other parts are added); a longer one is cut into BLOCKS contiguous parts, each cut again
// into GROUPS summed in parallel and added in group order.
static void emit_block_parts(StrBuf *b, const ApplyKernel *k) {
  sb_printf(b, "  enum { DIM = %lld, GCOLS = %lld, GROUPS = %d, SPLIT_MIN = %d, AHEAD = %d, "
               "BLOCKS = %d };\n"
               "  __shared__ float part[GROUPS > 1 ? GROUPS * GCOLS : 1];\n"
               "  const i64 *header = rows_grad;  // [U][ids][values]\n"
               "  const int group = (int)(threadIdx.x / GCOLS), lane_col = (int)(threadIdx.x %% GCOLS);\n"
               "  const i64 d = blockIdx.x / BLOCKS;\n"
               "  const int piece = (int)(blockIdx.x %% BLOCKS);\n"
               "  if (d >= header[0]) return;\n"
               "  int begin = distinct_begin[d], count = distinct_begin[d + 1] - begin;\n"
               "  const bool split = count > SPLIT_MIN;\n"
               "  const int p_lo = split ? (int)((i64)count * piece / BLOCKS) : piece == 0 ? 0 : count;\n"
               "  const int p_hi = split ? (int)((i64)count * (piece + 1) / BLOCKS) : count;\n"
               "  const int n_here = p_hi - p_lo;\n"
               "  const bool split_here = GROUPS > 1 && split;\n"
               "  const int lo = p_lo + (split_here ? (int)((i64)n_here * group / GROUPS) : group == 0 ? 0 : n_here);\n"
               "  const int hi = p_lo + (split_here ? (int)((i64)n_here * (group + 1) / GROUPS) : n_here);\n"
               "  float *out = part_sums + (i64)blockIdx.x * DIM;\n"
               "  for (int col0 = 0; col0 < DIM; col0 += GCOLS) {\n"
               "    const int col = col0 + lane_col;\n",
            (long long)k->dim, (long long)k->gcols, k->parts, SPLIT_MIN, APPLY_AHEAD, k->blocks);
  emit_groups_sum(b, k);
  sb_puts(b, "    if (group == 0 && col < DIM) out[col] = g;\n"
             "  }\n");
}

// A block per distinct id d (GCOLS threads a group, GROUPS groups): a run longer than SPLIT_MIN
// is summed in GROUPS contiguous parts added in order.
// k->blocks > 1: table_grad_parts summed the run, and one group adds its blocks' sums.
static void emit_block_apply(StrBuf *b, const ApplyKernel *k, const Tensor *tt) {
  sb_printf(b, "  enum { DIM = %lld, GCOLS = %lld, GROUPS = %d, SPLIT_MIN = %d, AHEAD = %d };\n"
               "  __shared__ double partial[WARP_SIZE];\n"
               "  __shared__ float part[GROUPS > 1 ? GROUPS * GCOLS : 1];\n"
               "  i64 *header = (i64 *)rows_grad;  // [U][ids[max_distinct]][values]\n"
               "  const int group = (int)(threadIdx.x / GCOLS), lane_col = (int)(threadIdx.x %% GCOLS);\n",
            (long long)k->dim, (long long)k->gcols, k->parts, SPLIT_MIN, APPLY_AHEAD);
  sb_puts(b, "  i64 d = blockIdx.x;\n"
             "  if (d >= header[0]) return;\n");
  StrBuf body = {0};
  if (k->blocks > 1) {  // the run was summed by table_grad_parts: add its blocks' sums in order
    sb_printf(&body, "  enum { BLOCKS = %d };\n"
                     "  i64 row = header[1 + d];\n"
                     "  float *grad = (float *)(header + 1 + max_distinct) + d * DIM;\n"
                     "  double sum_sq = 0.0;\n"
                     "  for (int col = lane_col; col < DIM; col += GCOLS) {\n"
                     "    float g = 0.0f;\n"
                     "    for (int p = 0; p < BLOCKS; p++) g += part_sums[((i64)d * BLOCKS + p) * DIM + col];\n"
                     "    grad[col] = g;\n"
                     "    sum_sq += (double)g * g;\n"
                     "  }\n"
                     "  __syncthreads();  // the row's gradient is read below\n",
              k->blocks);
    emit_row_update(&body, k, tt, "  ");
    sb_puts(b, body.data);
    sb_free(&body);
    return;
  }
  sb_puts(&body, "  i64 row = header[1 + d];\n"
                 "  float *grad = (float *)(header + 1 + max_distinct) + d * DIM;\n"
                 "  int begin = distinct_begin[d], count = distinct_begin[d + 1] - begin;\n"
                 "  // This group's part of the run: all of it for group 0 when the run is short.\n"
                 "  const bool split = GROUPS > 1 && count > SPLIT_MIN;\n"
                 "  const int lo = split ? (int)((i64)count * group / GROUPS) : group == 0 ? 0 : count;\n"
                 "  const int hi = split ? (int)((i64)count * (group + 1) / GROUPS) : count;\n"
                 "  double sum_sq = 0.0;\n"
                 "  for (int col0 = 0; col0 < DIM; col0 += GCOLS) {\n"
                 "    const int col = col0 + lane_col;\n");
  emit_groups_sum(&body, k);
  sb_puts(&body, "    if (group == 0 && col < DIM) {\n"
                 "      grad[col] = g;\n"
                 "      sum_sq += (double)g * g;\n"
                 "    }\n"
                 "  }\n"
                 "  __syncthreads();  // the row's gradient, written by group 0, is read below\n");
  ApplyKernel block = *k;
  block.warp = false;
  emit_row_update(&body, &block, tt, "  ");
  sb_puts(b, body.data);
  sb_free(&body);
}

// Deferred table updates: the optimizer over the rows the runtime merged across ranks and
// wrote back compact ([int64 U][int64 ids[U]][fp32 U x D], runtime/gpu/gpu_exec.h), a warp
// per row, APPLY_WARPS rows a block, LONG_BLOCKS blocks striding over the rows. The update is
// table_grad_apply's (emit_row_update), after the sum of squares of the merged row.
static void lower_rows_apply(Lower *L, int node, int table, int rows) {
  const Ir *ir = L->ir;
  const Tensor *tt = &ir->tensors[table];
  int64_t dim = tensor_width(ir, table);
  char name[300], id[256], what[200];
  ident(id, sizeof id, tt->name);
  snprintf(name, sizeof name, "table_rows_apply_%s", id);
  snprintf(what, sizeof what, "%s on the rows merged across ranks (optimizer)",
           optim_name(tt->optim.kind));
  lower_comment(L, node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, sym_const(LONG_BLOCKS * APPLY_WARPS), APPLY_WARPS,
           APPLY_WARPS * 32);
  kb.launch->optimizer = true;
  kb_tensor_typed(&kb, "i64", "merged", rows, false);
  kb_tensor_out(&kb, "table", table);
  if (tt->optim.kind == OPTIM_ROWWISE_ADAGRAD) kb_optstate(&kb, "rowsum", table, 0);
  StrBuf b = {0};
  sb_printf(&b, "  enum { DIM = %lld, IDS = %d, VEC = 1 };\n"
               "  const i64 U = merged[0];\n"
               "  const float *values = (const float *)(const void *)(merged + 1 + U);\n"
               "  const int lane = (int)(threadIdx.x %% WARP_SIZE);\n"
               "  for (i64 d = (i64)blockIdx.x * IDS + threadIdx.x / WARP_SIZE; d < U;\n"
               "       d += (i64)gridDim.x * IDS) {\n"
               "    const i64 row = merged[1 + d];\n"
               "    const float *grad = values + d * DIM;\n"
               "    double sum_sq = 0.0;\n"
               "    for (int col = lane; col < DIM; col += WARP_SIZE)\n"
               "      sum_sq += (double)grad[col] * grad[col];\n",
            (long long)dim, APPLY_WARPS);
  ApplyKernel k = {.ir = ir, .dim = dim, .warp = true};
  emit_row_update(&b, &k, tt, "    ");
  sb_puts(&b, "  }\n");
  kb_end(&kb, b.data);
  sb_free(&b);
}

// One table's id sort as lower_table_grad plans it: its occurrences, scratch, tiles and passes.
typedef struct TableSort {
  int node;
  SymSize occ;
  int64_t occ_max;       // at the largest batch
  int keys[2], vals[2];  // the sort's ping-pong buffers; the gather writes [0]
  int dbegin, state;     // distinct_begin; the sort state (SORT_STATE_INTS, zeroed first)
  int64_t state_bytes;
  int tiles, passes;
} TableSort;

// The tables of one backward whose id sorts share their launches (a kernel's parameters hold
// six a table).
enum { SORT_GROUP_MAX = 16 };

// The table a table_grad node trains, seen as its kernels see it: with deferred updates (GPU
// ranks of several) the sums are written without the optimizer (a frozen table's kernels), and
// lower_rows_apply applies it after the runtime's merge.
static const Tensor *grad_table(const Ir *ir, const Node *n, Tensor *frozen, bool *defer) {
  const Tensor *trained = &ir->tensors[n->ins[0]];
  *frozen = *trained;
  *defer = ir->defer_table_updates && trained->optim.kind != OPTIM_NONE;
  if (*defer) frozen->optim.kind = OPTIM_NONE;
  return *defer ? frozen : trained;
}

// 1. The sort's input and state: the ids of every lookup, in use order, with their positions
// (keys = the ids, vals = 0, 1, 2, ...); the sort state zeroed. False (reported) when the node
// cannot be planned.
static bool table_sort_prepare(Lower *L, int node, TableSort *ts) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  Tensor frozen;
  bool defer;
  const Tensor *tt = grad_table(ir, n, &frozen, &defer);
  int64_t rows = tt->fixed[0];
  int npairs = (n->nins - 1) / 2;
  // The occurrences: the sum of every pair's ids.
  SymSize occ = sym_const(0);
  for (int k = 0; k < npairs; k++) {
    SymSize r = tensor_rows(ir, n->ins[1 + 2 * k]);
    if (occ.t != 0 && r.t != 0 && occ.jag != r.jag)
      return lower_fail(L, node, "lookups over two different jagged dims of one table");
    occ = sym_add(occ, r);
  }
  const int bits = table_grad_constant("RADIX_BITS", 1, 16);
  const int max_tiles = table_grad_constant("SORT_MAX_TILES", 1, 4096);
  const int max_passes = table_grad_constant("SORT_MAX_PASSES", 1, 64);
  int64_t occ_cap[64];
  for (int j = 0; j < ir->njagged && j < 64; j++) occ_cap[j] = ir->batch * ir->jagged[j].max_len;
  int64_t occ_max = symsize_eval(occ, ir->batch, occ_cap);
  if (occ_max >= INT32_MAX / 2)
    return lower_fail(L, node, "a table's lookups number 2^30 or more in one batch; the id sort "
                               "counts them in 31 bits");
  // Each sort kernel is `tiles` blocks of 1024 threads (one block an SM, so every tile is
  // resident at once, though none needs to be: a block waits only for tiles claimed before
  // it), at least 1024 occurrences a tile at the largest batch.
  int tiles = (int)((occ_max + 1023) / 1024);
  if (tiles > max_tiles) tiles = max_tiles;
  if (tiles < 1) tiles = 1;
  int id_bits = 0;
  while (id_bits < 62 && ((int64_t)1 << id_bits) < rows) id_bits++;
  int passes = id_bits <= bits ? 1 : (id_bits + bits - 1) / bits;
  if (passes > max_passes) return lower_fail(L, node, "a table of more than 2^62 rows");

  if (!L->have_table_grad_kernels) {
    sb_puts(&L->src, "\n// --- table gradients: grouping ids by integer passes (kernels/table_grad.cuh) ---\n");
    sb_puts(&L->src, kernel_table_grad_cuh);
    L->have_table_grad_kernels = true;
  }
  const char *tn = tt->name;
  char sname[300];
  *ts = (TableSort){.node = node, .occ = occ, .occ_max = occ_max, .tiles = tiles, .passes = passes};
#define SCRATCH(var, suffix, bytes) \
  snprintf(sname, sizeof sname, "%s.grad.%s", tn, suffix); \
  var = lower_new_scratch(L, sname, bytes)
  SCRATCH(ts->keys[0], "keys0", sym_scale(occ, 8));
  SCRATCH(ts->vals[0], "vals0", sym_scale(occ, 4));
  SCRATCH(ts->keys[1], "keys1", sym_scale(occ, 8));
  SCRATCH(ts->vals[1], "vals1", sym_scale(occ, 4));
  // distinct_begin[U] = n ends the last run: U + 1 entries.
  SCRATCH(ts->dbegin, "distinct_begin", sym_add(sym_scale(occ, 4), sym_const(4)));
#undef SCRATCH

  return true;
}

// One table's gather: the ids of every lookup into the sort's keys, their positions into its
// values (a thread an occurrence).
static void table_sort_gather(Lower *L, const TableSort *ts) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[ts->node];
  int npairs = (n->nins - 1) / 2;
  char name[300], id[256];
  ident(id, sizeof id, ir->tensors[n->ins[0]].name);
  snprintf(name, sizeof name, "table_grad_gather_%s", id);
  lower_comment(L, ts->node, "gather the ids of every lookup and their positions");
  KernelBuilder kb;
  kb_begin(&kb, L, ts->node, name, ts->occ, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_scratch(&kb, "i64", "keys", ts->keys[0], true);
  kb_scratch(&kb, "int", "vals", ts->vals[0], true);
  StrBuf b = {0};
  sb_puts(&b, "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, k = i;  // k: within one lookup\n");
  pair_args(&kb, ir, n, npairs, "ids", 1);
  for (int k = 0; k < npairs; k++) {
    sb_printf(&b, "  if (k < n%d) { keys[i] = ids%d[k]; vals[i] = (int)i; return; }\n  k -= n%d;\n",
              k, k, k);
  }
  kb_end(&kb, b.data);
  sb_free(&b);
}

// The sort state of ts->tiles tiles (zeroed before the sort: the tile counters, the long-run
// count, every pass's digit histogram and the tiles' published totals).
static void table_sort_state(Lower *L, TableSort *ts) {
  const int buckets = 1 << table_grad_constant("RADIX_BITS", 1, 16);
  const int max_tiles = table_grad_constant("SORT_MAX_TILES", 1, 4096);
  const int max_passes = table_grad_constant("SORT_MAX_PASSES", 1, 64);
  const int pass_totals = table_grad_constant("SORT_COUNTERS", 1, 1024) + max_passes * buckets + max_tiles;
  ts->state_bytes = 4 * ((int64_t)pass_totals + (int64_t)ts->passes * ts->tiles * buckets);
  char sname[300];
  snprintf(sname, sizeof sname, "%s.grad.sort_state", L->ir->tensors[L->ir->nodes[ts->node].ins[0]].name);
  ts->state = lower_new_scratch(L, sname, sym_const(ts->state_bytes));
}

// One table: its gather, then a memset of its sort state.
static void table_sort_input(Lower *L, const TableSort *ts) {
  table_sort_gather(L, ts);
  Launch *zero = lower_new_launch(L, LAUNCH_ZERO, ts->node);
  zero->zero_arg = (LaunchArg){.kind = ARG_SCRATCH, .tensor = -1, .slot = ts->state, .jag = -1,
                               .tiles = -1};
  zero->zero_bytes = sym_const(ts->state_bytes);
}

// Several tables: every gather and every state's zeroing in one launch of a grid-stride loop
// over the tables' occurrences, then their states' words (3 + 2 lookups arguments a table; a
// group whose arguments would pass SORT_INPUT_ARGS keeps a gather and a memset a table).
// Returns false when it did not fit.
enum { SORT_INPUT_ARGS = 64, SORT_INPUT_BLOCKS_PER_SM = 8 };
static bool table_sort_shared_input(Lower *L, const TableSort *ts, int n, const char *tables) {
  const Ir *ir = L->ir;
  int args = 0;
  for (int t = 0; t < n; t++) args += 3 + 2 * ((ir->nodes[ts[t].node].nins - 1) / 2);
  if (args > SORT_INPUT_ARGS) return false;
  const Target *tg = target_find(L->p->target);
  int sms = tg && tg->num_sms > 0 ? tg->num_sms : 132;
  int64_t threads = (int64_t)sms * SORT_INPUT_BLOCKS_PER_SM * ELEMENTWISE_THREADS;
  char name[300], p[64], what[200], id[256];
  snprintf(name, sizeof name, "table_grad_gather_%s", tables);
  snprintf(what, sizeof what, "gather the lookup ids of %d tables and zero their sort states", n);
  lower_comment(L, ts[0].node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, ts[0].node, name, sym_const(threads), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  StrBuf b = {0};
  sb_puts(&b, "  const i64 stride = (i64)gridDim.x * blockDim.x;\n");
  StrBuf total = {0};
  for (int t = 0; t < n; t++) {
    const Node *g = &ir->nodes[ts[t].node];
    int npairs = (g->nins - 1) / 2;
    snprintf(p, sizeof p, "keys%d", t), kb_scratch(&kb, "i64", p, ts[t].keys[0], true);
    snprintf(p, sizeof p, "vals%d", t), kb_scratch(&kb, "int", p, ts[t].vals[0], true);
    snprintf(p, sizeof p, "state%d", t), kb_scratch(&kb, "int", p, ts[t].state, true);
    sb_printf(&b, "  const i64 occ%d = ", t);
    for (int k = 0; k < npairs; k++) {
      snprintf(p, sizeof p, "ids%d_%d", t, k), kb_tensor_in(&kb, p, g->ins[1 + 2 * k]);
      snprintf(p, sizeof p, "n%d_%d", t, k), kb_size(&kb, p, tensor_rows(ir, g->ins[1 + 2 * k]));
      sb_printf(&b, "%sn%d_%d", k ? " + " : "", t, k);
    }
    sb_puts(&b, npairs ? ";\n" : "0;\n");
    sb_printf(&total, "occ%d + ", t);
  }
  int64_t words = 0;
  for (int t = 0; t < n; t++) words += ts[t].state_bytes / 4;
  sb_printf(&b, "  const i64 total = %s%lld;  // the occurrences, then the states' words\n",
            total.data ? total.data : "", (long long)words);
  sb_free(&total);
  sb_puts(&b, "  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {\n"
              "    i64 k = i;\n");
  for (int t = 0; t < n; t++) {
    const Node *g = &ir->nodes[ts[t].node];
    int npairs = (g->nins - 1) / 2;
    ident(id, sizeof id, ir->tensors[g->ins[0]].name);
    sb_printf(&b, "    if (k < occ%d) {  // @%s: its lookups' ids\n      i64 j = k;\n", t, id);
    for (int k = 0; k < npairs; k++) {
      sb_printf(&b, "      if (j < n%d_%d) { keys%d[k] = ids%d_%d[j]; vals%d[k] = (int)k; continue; }\n",
                t, k, t, t, k, t);
      if (k + 1 < npairs) sb_printf(&b, "      j -= n%d_%d;\n", t, k);
    }
    sb_printf(&b, "    }\n    k -= occ%d;\n", t);
  }
  for (int t = 0; t < n; t++) {
    ident(id, sizeof id, ir->tensors[ir->nodes[ts[t].node].ins[0]].name);
    sb_printf(&b, "    if (k < %lld) { state%d[k] = 0; continue; }  // @%s's sort state\n",
              (long long)(ts[t].state_bytes / 4), t, id);
    if (t + 1 < n) sb_printf(&b, "    k -= %lld;\n", (long long)(ts[t].state_bytes / 4));
  }
  sb_puts(&b, "  }\n");
  kb_end(&kb, b.data);
  sb_free(&b);
  return true;
}

// A shared sort's tiles: every table's blocks in one wave of the target's SMs (a sort block of
// 1024 threads at 64 registers takes a whole SM's registers), shared in proportion to the
// tables' occurrences at the largest batch, at least one each. A tile of more occurrences costs
// a block little more (its warps walk their ranges 32 at a time, bound by latency), while a
// second wave would wait for the first.
static void table_sort_share_tiles(Lower *L, TableSort *ts, int n) {
  const Target *tg = target_find(L->p->target);
  int sms = tg && tg->num_sms > 0 ? tg->num_sms : 132;
  int64_t all = 0;
  int tiles = 0;
  for (int t = 0; t < n; t++) all += ts[t].occ_max, tiles += ts[t].tiles;
  if (tiles <= sms || n > sms) return;
  for (int t = 0; t < n; t++) {
    int64_t share = all > 0 ? (int64_t)(sms - n) * ts[t].occ_max / all : 0;
    int want = 1 + (int)share;  // sums to at most sms
    if (want < ts[t].tiles) ts[t].tiles = want;
  }
}

// 2. A stable radix sort of each table's occurrences by id, RADIX_BITS (8) bits a pass, as many
// passes as its row count needs; then the runs of equal ids. Hand-written kernels
// (kernels/table_grad.cuh) shared by every table; nothing here walks a table's rows.
// One table: the extern "C" kernels, whose arguments kb_end_existing checks against their
// parameters. Several (one sort launch for several tables): the sorts are independent, so each
// step (the histogram, every pass, the runs) is one generated launch that gives table t its
// own `tiles` blocks and calls the kernels' __device__ bodies with its arguments; a table
// whose passes are done sits out the later passes. Each table still claims, sums and
// publishes its own tiles in its own state, so the bits are those of its own launches.
static void table_sort_single(Lower *L, const TableSort *ts) {
  int node = ts->node;
  KernelBuilder kb;
  kb_begin_existing(&kb, L, node, "table_grad_radix_histogram", sym_const(ts->tiles), 1, 1024);
  kb_scratch(&kb, "int", "state", ts->state, true);
  kb_scratch(&kb, "i64", "keys", ts->keys[0], false);
  kb_size(&kb, "n", ts->occ);
  kb_int(&kb, "passes", ts->passes);
  kb_end_existing(&kb);
  for (int pass = 0; pass < ts->passes; pass++) {
    int in = pass & 1, out = in ^ 1;
    kb_begin_existing(&kb, L, node, "table_grad_radix_pass", sym_const(ts->tiles), 1, 1024);
    kb_scratch(&kb, "i64", "keys_out", ts->keys[out], true);
    kb_scratch(&kb, "int", "vals_out", ts->vals[out], true);
    kb_scratch(&kb, "i64", "keys", ts->keys[in], false);
    kb_scratch(&kb, "int", "vals", ts->vals[in], false);
    kb_scratch(&kb, "int", "state", ts->state, true);
    kb_size(&kb, "n", ts->occ);
    kb_int(&kb, "pass", pass);
    kb_end_existing(&kb);
  }
  kb_begin_existing(&kb, L, node, "table_grad_runs", sym_const(ts->tiles), 1, 1024);
  kb_tensor_typed(&kb, "i64", "rows_tensor", L->ir->nodes[node].out, true);
  kb_scratch(&kb, "int", "distinct_begin", ts->dbegin, true);
  kb_scratch(&kb, "i64", "keys", ts->keys[ts->passes & 1], false);
  kb_scratch(&kb, "int", "state", ts->state, true);
  kb_size(&kb, "n", ts->occ);
  kb_end_existing(&kb);
}

// The steps of a shared sort launch.
typedef enum SortStep { STEP_HISTOGRAM, STEP_PASS, STEP_RUNS } SortStep;

static void table_sort_shared_step(Lower *L, const TableSort *ts, int n, const char *tables,
                                   SortStep step, int pass) {
  const Ir *ir = L->ir;
  char name[300], what[300], p[64];
  const char *kernel = step == STEP_HISTOGRAM ? "radix_histogram" : step == STEP_PASS ? "radix_pass" : "runs";
  if (step == STEP_PASS) snprintf(name, sizeof name, "table_grad_%s%d_%s", kernel, pass, tables);
  else snprintf(name, sizeof name, "table_grad_%s_%s", kernel, tables);
  int blocks = 0;
  for (int t = 0; t < n; t++)
    if (step != STEP_PASS || pass < ts[t].passes) blocks += ts[t].tiles;
  // (short: the kernel's name lists the tables, and the text after the name says what else)
  snprintf(what, sizeof what, "%s, %d tables' sorts in one launch",
           step == STEP_HISTOGRAM ? "digit histograms" : step == STEP_PASS ? "radix pass" : "id runs",
           n);
  lower_comment(L, ts[0].node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, ts[0].node, name, sym_const(blocks), 1, 1024);
  StrBuf b = {0};
  sb_puts(&b, "  const int block = (int)blockIdx.x;  // every table's blocks in turn\n");
  int base = 0;
  for (int t = 0; t < n; t++) {
    const TableSort *s = &ts[t];
    if (step == STEP_PASS && pass >= s->passes) continue;
    int in = pass & 1, out = in ^ 1;
    if (step == STEP_HISTOGRAM) {
      snprintf(p, sizeof p, "state%d", t), kb_scratch(&kb, "int", p, s->state, true);
      snprintf(p, sizeof p, "keys%d", t), kb_scratch(&kb, "i64", p, s->keys[0], false);
      snprintf(p, sizeof p, "n%d", t), kb_size(&kb, p, s->occ);
      sb_printf(&b, "  if (block < %d) {\n"
                    "    radix_histogram_block(state%d, keys%d, n%d, %d, block - %d, %d);\n"
                    "    return;\n  }\n",
                base + s->tiles, t, t, t, s->passes, base, s->tiles);
    } else if (step == STEP_PASS) {
      snprintf(p, sizeof p, "keys_out%d", t), kb_scratch(&kb, "i64", p, s->keys[out], true);
      snprintf(p, sizeof p, "vals_out%d", t), kb_scratch(&kb, "int", p, s->vals[out], true);
      snprintf(p, sizeof p, "keys%d", t), kb_scratch(&kb, "i64", p, s->keys[in], false);
      snprintf(p, sizeof p, "vals%d", t), kb_scratch(&kb, "int", p, s->vals[in], false);
      snprintf(p, sizeof p, "state%d", t), kb_scratch(&kb, "int", p, s->state, true);
      snprintf(p, sizeof p, "n%d", t), kb_size(&kb, p, s->occ);
      sb_printf(&b, "  if (block < %d) {\n"
                    "    radix_pass_tile(keys_out%d, vals_out%d, keys%d, vals%d, state%d, n%d, %d, %d);\n"
                    "    return;\n  }\n",
                base + s->tiles, t, t, t, t, t, t, pass, s->tiles);
    } else {
      snprintf(p, sizeof p, "rows_tensor%d", t);
      kb_tensor_typed(&kb, "i64", p, ir->nodes[s->node].out, true);
      snprintf(p, sizeof p, "distinct_begin%d", t), kb_scratch(&kb, "int", p, s->dbegin, true);
      snprintf(p, sizeof p, "keys%d", t), kb_scratch(&kb, "i64", p, s->keys[s->passes & 1], false);
      snprintf(p, sizeof p, "state%d", t), kb_scratch(&kb, "int", p, s->state, true);
      snprintf(p, sizeof p, "n%d", t), kb_size(&kb, p, s->occ);
      sb_printf(&b, "  if (block < %d) {\n"
                    "    runs_tile(rows_tensor%d, distinct_begin%d, keys%d, state%d, n%d, %d);\n"
                    "    return;\n  }\n",
                base + s->tiles, t, t, t, t, t, s->tiles);
    }
    base += s->tiles;
  }
  kb_end(&kb, b.data);
  sb_free(&b);
}

// The shared launches' names end with the tables' (`items_acts_tagt`), or their count when long.
static void table_sort_names(Lower *L, const TableSort *ts, int n, char *tables, size_t size) {
  char id[256];
  tables[0] = '\0';
  for (int t = 0; t < n; t++) {
    ident(id, sizeof id, L->ir->tensors[L->ir->nodes[ts[t].node].ins[0]].name);
    if (strlen(tables) + strlen(id) + 2 > size) {
      snprintf(tables, size, "%d_tables", n);
      return;
    }
    if (t) strcat(tables, "_");
    strcat(tables, id);
  }
}

static void table_sort_shared(Lower *L, const TableSort *ts, int n, const char *tables) {
  int passes = 0;
  for (int t = 0; t < n; t++) passes = ts[t].passes > passes ? ts[t].passes : passes;
  table_sort_shared_step(L, ts, n, tables, STEP_HISTOGRAM, 0);
  for (int pass = 0; pass < passes; pass++) table_sort_shared_step(L, ts, n, tables, STEP_PASS, pass);
  table_sort_shared_step(L, ts, n, tables, STEP_RUNS, 0);
}

// 3. Sum each distinct id's run, write the row, apply the optimizer.
// A table whose rows take many occurrences each (a small one such as gem_small's 64-row
// `acts`, about 1,500 each) cuts a run longer than SPLIT_MIN over `blocks` blocks
// (table_grad_parts), each splitting its part again into GROUPS summed in parallel, and the
// apply kernel adds an id's blocks in order (deterministic; a run of at most SPLIT_MIN is
// summed in occurrence order as the CPU executor does, the same bits). Other tables get a
// warp per id; a run longer than SPLIT_MIN there (a popular item of a large table) is put on
// a list instead, and a second kernel of LONG_BLOCKS blocks sums those runs as the hot
// table's blocks do: one warp walking a run of thousands was most of the kernel's time
// (docs/perf.md).
static void table_grad_apply(Lower *L, const TableSort *ts) {
  const Ir *ir = L->ir;
  int node = ts->node;
  const Node *n = &ir->nodes[node];
  int table = n->ins[0];
  Tensor frozen;
  bool defer;
  const Tensor *tt = grad_table(ir, n, &frozen, &defer);
  int64_t dim = tensor_width(ir, table), rows = tt->fixed[0];
  int npairs = (n->nins - 1) / 2;
  SymSize occ = ts->occ;
  int64_t occ_max = ts->occ_max;
  int sorted = ts->vals[ts->passes & 1];  // occurrence indices grouped by id, each group in order
  const char *tn = tt->name;
  char sname[300], name[300], id[256];
  ident(id, sizeof id, tn);
  KernelBuilder kb;
  StrBuf b;

  int64_t gcols = dim < 1024 ? (dim + 31) / 32 * 32 : 1024;
  bool hot = rows > 0 && occ_max / rows >= HOT_OCCURRENCES;
  int parts = gcols <= 512 ? (int)(1024 / gcols) : 1;  // a block's groups for long runs
  bool warp = !hot || parts == 1;  // a warp per distinct id, APPLY_WARPS ids a block
  // A hot table's runs, cut over `blocks` blocks each (table_grad_parts), then added per id.
  int blocks = 1;
  if (!warp) {
    blocks = (int)((SPLIT_TARGET + rows - 1) / rows);
    if (blocks > SPLIT_BLOCKS) blocks = SPLIT_BLOCKS;
    if (blocks < 1) blocks = 1;
  }
  ApplyKernel k = {ir, n, npairs, dim, gcols, parts, warp, blocks, false};
  // The long runs' list; their count is the sort state's SORT_LONG_COUNT counter, zeroed with
  // it (a memset of its own was a launch a table).
  int long_list = -1;
  if (warp) {
    snprintf(sname, sizeof sname, "%s.grad.long_runs", tn);
    long_list = lower_new_scratch(L, sname, sym_scale(occ, 4));
  }
  Optim o = tt->optim;
  char what[200];
  int part_sums = -1;
  if (blocks > 1) {
    snprintf(sname, sizeof sname, "%s.grad.part_sums", tn);
    part_sums = lower_new_scratch(L, sname, sym_const(rows * blocks * dim * 4));
    snprintf(name, sizeof name, "table_grad_parts_%s", id);
    snprintf(what, sizeof what, "each distinct id's run summed in %d parts, a block each", blocks);
    lower_comment(L, node, what);
    kb_begin(&kb, L, node, name, sym_const(rows * blocks), 1, (int)gcols * parts);
    kb_tensor_typed(&kb, "i64", "rows_grad", n->out, false);  // its header: U
    kb_scratch(&kb, "int", "sorted", sorted, false);
    kb_scratch(&kb, "int", "distinct_begin", ts->dbegin, false);
    pair_args(&kb, ir, n, npairs, "dy", 2);
    kb_scratch(&kb, "float", "part_sums", part_sums, true);
    b = (StrBuf){0};
    emit_block_parts(&b, &k);
    kb_end(&kb, b.data);
    sb_free(&b);
  }
  snprintf(name, sizeof name, "table_grad_apply_%s", id);
  snprintf(what, sizeof what, "sum per distinct id%s, then %s",
           warp ? " (long runs listed)" : blocks > 1 ? " (its parts in order)" : " (in parts)",
           optim_name(o.kind));
  lower_comment(L, node, what);
  if (blocks > 1)
    kb_begin(&kb, L, node, name, sym_const(rows), 1, (int)gcols);
  else
    kb_begin(&kb, L, node, name, occ, warp ? APPLY_WARPS : 1,
             warp ? APPLY_WARPS * 32 : (int)gcols * parts);
  ApplyKernel apply = k;
  if (blocks > 1) apply.parts = 1;  // one group of gcols threads adds the blocks' sums
  apply_args(&kb, &apply, n->out, table, o.kind, sorted, ts->dbegin, occ);
  if (blocks > 1) kb_scratch(&kb, "float", "part_sums", part_sums, false);
  if (warp) {
    kb_scratch(&kb, "int", "long_runs", long_list, true);
    kb_scratch_part(&kb, "int", "sort_state", ts->state, true, 4);  // its SORT_LONG_COUNT
  }
  b = (StrBuf){0};
  if (warp) emit_warp_apply(&b, &k, tt);
  else emit_block_apply(&b, &apply, tt);
  kb_end(&kb, b.data);
  sb_free(&b);
  if (!warp) return;

  // The listed long runs: LONG_BLOCKS blocks, each taking ids c, c + LONG_BLOCKS, ...
  snprintf(name, sizeof name, "table_grad_apply_long_%s", id);
  snprintf(what, sizeof what, "the long runs, summed in parts, then %s",
           optim_name(o.kind));
  lower_comment(L, node, what);
  kb_begin(&kb, L, node, name, sym_const(LONG_BLOCKS), 1, LONG_WARPS * 32);
  apply_args(&kb, &k, n->out, table, o.kind, sorted, ts->dbegin, occ);
  kb_scratch(&kb, "int", "long_runs", long_list, false);
  kb_scratch_part(&kb, "int", "sort_state", ts->state, false, 4);
  b = (StrBuf){0};
  emit_long_apply(&b, &k, tt);
  kb_end(&kb, b.data);
  sb_free(&b);
}

// The table_grad nodes from `node` on that follow one another in the backward (autodiff puts
// every table's after the last lookup gradient) are lowered together: each table's gather,
// then their sorts' shared launches, then each table's apply (and, with deferred updates, the
// optimizer launches after them all). Every launch of the group is the first node's, covering
// the group's nodes (Launch.nfused), so that whoever runs a node's launches (the tests that
// check node by node) runs the group whole.
static bool lower_table_grad(Lower *L, int node) {
  const Ir *ir = L->ir;
  TableSort ts[SORT_GROUP_MAX];
  int n = 0, first = L->nlaunches, last_node = node;
  bool ok = true;
  for (int m = node; m < ir->nnodes && n < SORT_GROUP_MAX && ir->nodes[m].op == OP_TABLE_GRAD &&
                     (m == node || !L->done[m]);
       m++) {
    if (m != node) L->done[m] = true;
    last_node = m;
    if (table_sort_prepare(L, m, &ts[n])) n++;
    else ok = false;
  }
  if (n > 1) table_sort_share_tiles(L, ts, n);
  for (int t = 0; t < n; t++) table_sort_state(L, &ts[t]);
  char tables[160];
  table_sort_names(L, ts, n, tables, sizeof tables);
  if (n == 1 || !table_sort_shared_input(L, ts, n, tables))
    for (int t = 0; t < n; t++) table_sort_input(L, &ts[t]);
  if (n == 1) table_sort_single(L, &ts[0]);
  else if (n > 1) table_sort_shared(L, ts, n, tables);
  for (int t = 0; t < n; t++) table_grad_apply(L, &ts[t]);
  for (int i = first; i < L->nlaunches; i++) {
    L->launches[i].node = node;
    L->launches[i].nfused = last_node - node + 1;
  }
  for (int t = 0; t < n; t++) {
    const Node *g = &ir->nodes[ts[t].node];
    Tensor frozen;
    bool defer;
    grad_table(ir, g, &frozen, &defer);
    if (defer) lower_rows_apply(L, ts[t].node, g->ins[0], g->out);
  }
  return ok;
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

// The dense optimizer of several parameters in one launch: block ranges of one kernel go to
// each parameter in turn (the same per-element update as lower_optimizer, so the same bits),
// so a step launches one optimizer kernel for up to OPT_FUSE parameters instead of one each.
// Parameters whose sizes depend on the batch, or not stored as fp32 with an fp32 gradient,
// keep their own launch. 20 parameters take 81 arguments, inside what tests/codegen/plan_emu.c
// passes (96).
enum { OPT_FUSE = 20 };

static bool fusable(const Ir *ir, int param) {
  SymSize e = tensor_elems(ir, param);
  int g = ir_grad_of(ir, param);
  return e.b == 0 && e.t == 0 && e.c > 0 && g >= 0 && ir->tensors[param].dtype == DT_F32 &&
         ir->tensors[g].dtype == DT_F32;
}

static void lower_optimizer_group(Lower *L, const int *params, int n) {
  const Ir *ir = L->ir;
  Optim o = ir->dense_optim;
  bool adamw = o.kind == OPTIM_ADAMW;
  char name[320], id[256], what[200];
  ident(id, sizeof id, ir->tensors[params[0]].name);
  snprintf(name, sizeof name, "%s_%d_params_%s", optim_name(o.kind), n, id);
  snprintf(what, sizeof what, "%s of %d parameters, @%.60s first (optimizer)", optim_name(o.kind),
           n, ir->tensors[params[0]].name);
  lower_comment_at(L, ir->tensors[params[0]].loc, what);
  int64_t blocks = 0;
  for (int k = 0; k < n; k++)
    blocks += (tensor_elems(ir, params[k]).c + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS;
  KernelBuilder kb;
  kb_begin(&kb, L, -1, name, sym_const(blocks * ELEMENTWISE_THREADS), ELEMENTWISE_THREADS,
           ELEMENTWISE_THREADS);
  kb.launch->optimizer = true;
  kb.launch->node = ir->tensors[ir_grad_of(ir, params[0])].producer;
  for (int k = 0; k < n; k++) {
    char p[32];
    snprintf(p, sizeof p, "w%d", k);
    kb_tensor_out(&kb, p, params[k]);
    if (adamw) {
      snprintf(p, sizeof p, "m%d", k);
      kb_optstate(&kb, p, params[k], 0);
      snprintf(p, sizeof p, "v%d", k);
      kb_optstate(&kb, p, params[k], 1);
    }
    snprintf(p, sizeof p, "g%d", k);
    kb_tensor_in(&kb, p, ir_grad_of(ir, params[k]));
  }
  if (adamw) kb_step(&kb, "step");
  StrBuf b = {0};
  sb_printf(&b, "  const i64 blk = blockIdx.x;\n"
                "  float *w%s;\n"
                "  const float *g;\n"
                "  i64 n, i;\n", adamw ? ", *m, *v" : "");
  int64_t first = 0;
  for (int k = 0; k < n; k++) {
    int64_t elems = tensor_elems(ir, params[k]).c;
    int64_t end = first + (elems + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS;
    sb_printf(&b, "  %sif (blk < %lld) {  // @%.60s\n"
                  "    w = w%d, g = g%d, n = %lld, i = (blk - %lld) * blockDim.x + threadIdx.x;\n",
              k ? "else " : "", (long long)end, ir->tensors[params[k]].name, k, k,
              (long long)elems, (long long)first);
    if (adamw) sb_printf(&b, "    m = m%d, v = v%d;\n", k, k);
    sb_puts(&b, "  }\n");
    first = end;
  }
  sb_puts(&b, "  else return;\n"
              "  if (i >= n) return;\n");
  if (adamw)
    sb_printf(&b, "  const double lr = %s, beta1 = %s, beta2 = %s, eps = %s, weight_decay = %s;\n"
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
    sb_printf(&b, "  w[i] = (float)(w[i] - %s * g[i]);\n", num(o.lr).s);
  kb_end(&kb, b.data);
  sb_free(&b);
}

bool lower_optimizers(Lower *L, const int *params, int n) {
  const Ir *ir = L->ir;
  Optim o = ir->dense_optim;
  if (o.kind != OPTIM_ADAMW && o.kind != OPTIM_SGD) return true;
  int *group = xcalloc((size_t)(n > 0 ? n : 1), sizeof *group);
  int ng = 0;
  for (int k = 0; k <= n; k++) {
    bool take = k < n && fusable(ir, params[k]);
    if (take) group[ng++] = params[k];
    if (ng > 0 && (!take || ng == OPT_FUSE || k == n)) {
      if (ng == 1) lower_optimizer(L, group[0]);
      else lower_optimizer_group(L, group, ng);
      ng = 0;
    }
    if (k < n && !take) lower_optimizer(L, params[k]);
  }
  free(group);
  return true;
}
