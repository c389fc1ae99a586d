// lower_internal.h: what the parts of the lowering share: the state of one plan_build run and
// the helpers that add a kernel's text and its launch together, so that the parameter list of
// every generated kernel and the argument list of its launch cannot drift apart.
// defines: Lower, KernelBuilder, kb_*, lower_* helpers
#ifndef GEMC_LOWER_INTERNAL_H
#define GEMC_LOWER_INTERNAL_H

#include <stdbool.h>

#include "plan.h"
#include "strbuf.h"

typedef struct Lower {
  const Ir *ir;
  Plan *p;
  Diag *d;
  StrBuf src;
  Launch *launches;
  int nlaunches, cap_launches;
  Scratch *scratch;
  int nscratch, cap_scratch;
  TileList *tiles;
  int ntiles, cap_tiles;
  bool *done;        // [ir->nnodes]: covered by an earlier fused launch
  bool ok;
  bool have_table_grad_kernels;
} Lower;

// One kernel under construction: its signature grows with its launch's arguments.
typedef struct KernelBuilder {
  Lower *L;
  Launch *launch;
  StrBuf params;
  int nparams;
} KernelBuilder;

enum { ELEMENTWISE_THREADS = 256, ROWS_PER_BLOCK = 8 };

// --- sizes and types --------------------------------------------------------------------
SymSize sym_const(int64_t c);
SymSize sym_scale(SymSize s, int64_t k);
SymSize sym_add(SymSize a, SymSize b);  // the jag terms must agree (or one be absent)
SymSize tensor_rows(const Ir *ir, int t);
int64_t tensor_width(const Ir *ir, int t);
SymSize tensor_elems(const Ir *ir, int t);
SymSize tensor_bytes(const Ir *ir, int t);
int dtype_size(DType t);
const char *dtype_ctype(DType t);   // "float", "bf16_t", "fp16_t", "i64"
const char *dtype_load(DType t);    // "load_f32", ...
const char *dtype_store(DType t);   // "store_f32", ...
const char *act_fn(Act a);          // "act_silu", ...
void ident(char *buf, size_t size, const char *name);  // "h.gdpa0.q" -> "h_gdpa0_q"
// The shortest text that reads back as exactly x ("0.9", not "0.90000000000000002"), for
// constants in generated source: printf("%s", num(x).s).
typedef struct Num {
  char s[40];
} Num;
Num num(double x);

// --- building launches ------------------------------------------------------------------
Launch *lower_new_launch(Lower *L, LaunchKind kind, int node);
int lower_new_scratch(Lower *L, const char *name, SymSize bytes);
void lower_comment(Lower *L, int node, const char *what);  // "// FILE:L:C op ... (fwd)"

// Starts `extern "C" __global__ void __launch_bounds__(threads) NAME(` with a fixed grid of
// `size` work items, `per_block` per block.
void kb_begin(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize size,
              int64_t per_block, int threads);
void kb_tensor_out(KernelBuilder *kb, const char *param, int t);  // T *__restrict__ param
void kb_tensor_in(KernelBuilder *kb, const char *param, int t);   // const T *__restrict__
void kb_scratch(KernelBuilder *kb, const char *ctype, const char *param, int slot, bool out);
void kb_grad_out(KernelBuilder *kb, const char *param, int param_tensor);
void kb_optstate(KernelBuilder *kb, const char *param, int tensor, int slot);
void kb_offsets(KernelBuilder *kb, const char *param, int jag);
void kb_size(KernelBuilder *kb, const char *param, SymSize s);
void kb_int(KernelBuilder *kb, const char *param, int64_t v);
void kb_float(KernelBuilder *kb, const char *param, float v);
void kb_step(KernelBuilder *kb, const char *param);
// Closes the signature and appends `body` (the statements inside the braces).
void kb_end(KernelBuilder *kb, const char *body);

bool lower_fail(Lower *L, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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
bool lower_attention(Lower *L, int node);

#endif
