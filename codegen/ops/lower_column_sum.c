// lower_column_sum.c: the deterministic two-kernel column sum that reduce_rows and the norm
// gain gradients share (lower_ops.h).
#include <stdio.h>

#include "lower_ops.h"

// --- column sums ------------------------------------------------------------------------

void lower_column_sum(Lower *L, int node, const char *name, int out, SymSize rows, int64_t width,
                      void (*bind)(KernelBuilder *kb, const void *ctx), const void *ctx,
                      const char *term) {
  const Ir *ir = L->ir;
  char sname[320], kname[320];
  snprintf(sname, sizeof sname, "%s.column_partials", ir->tensors[out].name);
  int partial = lower_new_scratch(L, sname, sym_const(COLUMN_SUM_CHUNKS * width * 8));
  int64_t tiles = (width + 31) / 32;
  snprintf(kname, sizeof kname, "%s_partial", name);
  KernelBuilder kb;
  kb_begin(&kb, L, node, kname, sym_const(tiles * COLUMN_SUM_CHUNKS), 1, 256);
  kb_scratch(&kb, "double", "partial", partial, true);
  bind(&kb, ctx);
  kb_size(&kb, "rows", rows);
  StrBuf b = {0};
  sb_printf(&b,
            "  enum { WIDTH = %lld, TILES = %lld, CHUNKS = %d, ROW_LANES = 8 };\n"
            "  __shared__ double lane_sum[ROW_LANES][WARP_SIZE];\n"
            "  i64 chunk = blockIdx.x / TILES, col = (blockIdx.x %% TILES) * WARP_SIZE + threadIdx.x %% WARP_SIZE;\n"
            "  int row_lane = threadIdx.x / WARP_SIZE;\n"
            "  i64 chunk_rows = (rows + CHUNKS - 1) / CHUNKS;\n"
            "  i64 end = (chunk + 1) * chunk_rows < rows ? (chunk + 1) * chunk_rows : rows;\n"
            "  double acc = 0.0;\n"
            "  if (col < WIDTH)\n"
            "    for (i64 r = chunk * chunk_rows + row_lane; r < end; r += ROW_LANES)\n"
            "      acc += %s;\n"
            "  lane_sum[row_lane][threadIdx.x %% WARP_SIZE] = acc;\n"
            "  __syncthreads();\n"
            "  if (row_lane != 0 || col >= WIDTH) return;\n"
            "  double total = 0.0;\n"
            "  for (int k = 0; k < ROW_LANES; k++) total += lane_sum[k][threadIdx.x];\n"
            "  partial[chunk * WIDTH + col] = total;\n",
            (long long)width, (long long)tiles, COLUMN_SUM_CHUNKS, term);
  kb_end(&kb, b.data);
  sb_free(&b);

  lower_comment(L, node, "the column chunks added in order");
  kb_begin(&kb, L, node, name, sym_const(width), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", out);
  kb_scratch(&kb, "double", "partial", partial, false);
  char body[1024];
  snprintf(body, sizeof body,
           "  enum { WIDTH = %lld, CHUNKS = %d };\n"
           "  i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (col >= WIDTH) return;\n"
           "  double total = 0.0;\n"
           "  for (int chunk = 0; chunk < CHUNKS; chunk++) total += partial[chunk * WIDTH + col];\n"
           "  %s(out, col, (float)total);\n",
           (long long)width, COLUMN_SUM_CHUNKS, dtype_store(ir->tensors[out].dtype));
  kb_end(&kb, body);
}
