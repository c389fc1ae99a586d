// kernel_builder.h: what every part of code generation builds with: the state of one
// plan_build run (Lower) and the helpers that add a kernel's text and its launch together
// (KernelBuilder), so that the parameter list of every generated kernel and the argument list
// of its launch cannot drift apart. The op groups (codegen/ops/), the attention emitters
// (codegen/attention/) and the dispatcher (codegen/lower.c) all sit on top of it.
// defines: Lower, KernelBuilder, kb_*, lower_new_launch, lower_new_scratch, lower_fail
#ifndef GEMC_KERNEL_BUILDER_H
#define GEMC_KERNEL_BUILDER_H

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

#endif
