// lower_ops.h: the op groups of code generation, one file each (codegen/ops/lower_*.c), and the
// two composite emitters they share. codegen/lower.c dispatches each IR node to one of them.
// defines: lower_pointwise, lower_norm, lower_gemm, lower_interact, lower_sparse,
//          lower_optimizer, lower_optimizers, lower_column_sum, lower_quantize_operand
#ifndef GEMC_LOWER_OPS_H
#define GEMC_LOWER_OPS_H

#include <stdbool.h>

#include "kernel_builder.h"

// A deterministic, coalesced column sum out[col] = sum over r < rows of TERM (an expression
// of r, col and the inputs `bind` adds) for reduce_rows and the norm gain gradients: a first
// kernel sums COLUMN_SUM_CHUNKS fixed row ranges (32 columns x 8 row lanes per block, the 8
// lanes added in order) into fp64 scratch, a second adds the chunks in order.
enum { COLUMN_SUM_CHUNKS = 64 };
void lower_column_sum(Lower *L, int node, const char *name, int out, SymSize rows, int64_t width,
                      void (*bind)(KernelBuilder *kb, const void *ctx), const void *ctx,
                      const char *term);

// Operand t (rows x cols, reduced along cols when k_contiguous, else down the rows) quantized
// at prec fp8 or mxfp8 exactly as the CPU executor does and dequantized into a new scratch of
// `type` (lower_gemm.c; dot_interact uses it too): returns the scratch slot.
int lower_quantize_operand(Lower *L, int node, int t, DType prec, DType type, bool k_contiguous,
                           const char *role);

// --- the op groups (lower_*.c) ------------------------------------------------------------
bool lower_pointwise(Lower *L, int node);   // act, add/sub/mul/scale (+ act), shapes, losses
bool lower_norm(Lower *L, int node);        // rmsnorm, layernorm and their backward ops
// `add` whose output feeds the very next node, an rmsnorm: one pass writes both.
bool lower_add_rmsnorm(Lower *L, int add_node, int norm_node);
bool lower_gemm(Lower *L, int node);        // linear and its backward ops
bool lower_interact(Lower *L, int node);    // dot_interact and dot_interact_bwd
bool lower_sparse(Lower *L, int node);      // embed, embed_pool, embed_pool_bwd, table_grad
bool lower_optimizer(Lower *L, int param);  // one AdamW or SGD kernel
// The dense parameters' optimizer, up to 20 fp32 parameters of fixed size a launch.
bool lower_optimizers(Lower *L, const int *params, int n);

#endif
