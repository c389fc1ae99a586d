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
  bool have_fp8_codes_kernels;  // kernels/fp8_codes.cuh is in the source
  Loc comment_loc;   // the .gem position lower_comment last named: the next kernel's #line
  // The distinct kernels emitted so far (kb_end): a kernel whose launch bounds, parameters and
  // body equal an earlier one's is not emitted again; its launch calls the earlier kernel.
  struct EmittedKernel *kernels;
  int nkernels, cap_kernels;
} Lower;

// One kernel under construction: its signature grows with its launch's arguments.
typedef struct KernelBuilder {
  Lower *L;
  Launch *launch;
  StrBuf params;
  int nparams;
  size_t start;      // where its text begins in L->src
} KernelBuilder;

// The line kb_end writes after each kernel body; plan_build replaces it with the `#line` that
// points back at the generated file (lower_finish_lines).
#define LOWER_LINE_RESET "#line __gemc_generated__"

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
// The comment above a node's kernels: "// FILE:L:C op ... (fwd)", then the op's statement as
// written in the .gem file.
void lower_comment(Lower *L, int node, const char *what);
// The same for any position: "// FILE:L:C what", then the source text at loc.
void lower_comment_at(Lower *L, Loc loc, const char *what);
// Appends the .gem text of loc's lines, each as "//   TEXT" (none when the IR has no source).
void lower_source_text(StrBuf *out, const Ir *ir, Loc loc);
// The #line directive that makes what follows read as line `line` of the .gem file.
void lower_line_directive(StrBuf *out, const Ir *ir, int line);
// Replaces each LOWER_LINE_RESET line of src with `#line N "generated"` naming its own line, so
// that text after a kernel body maps back to the generated file. Returns a new string.
char *lower_finish_lines(const char *src, const char *generated_name);
// Frees what plan_build's Lower holds besides the plan itself.
void lower_free(Lower *L);

// Starts `extern "C" __global__ void __launch_bounds__(threads) NAME(` with a fixed grid of
// `size` work items, `per_block` per block.
void kb_begin(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize size,
              int64_t per_block, int threads);
void kb_tensor_out(KernelBuilder *kb, const char *param, int t);  // T *__restrict__ param
void kb_tensor_in(KernelBuilder *kb, const char *param, int t);   // const T *__restrict__
void kb_scratch(KernelBuilder *kb, const char *ctype, const char *param, int slot, bool out);
// A scratch of which the kernel touches only `used` bytes (a counter in a larger state), so
// that the launch's counted bytes (launch_cost.h) are those, not the whole scratch's.
void kb_scratch_part(KernelBuilder *kb, const char *ctype, const char *param, int slot, bool out,
                     int64_t used);
void kb_grad_out(KernelBuilder *kb, const char *param, int param_tensor);
void kb_optstate(KernelBuilder *kb, const char *param, int tensor, int slot);
void kb_offsets(KernelBuilder *kb, const char *param, int jag);
void kb_size(KernelBuilder *kb, const char *param, SymSize s);
void kb_int(KernelBuilder *kb, const char *param, int64_t v);
void kb_float(KernelBuilder *kb, const char *param, float v);
void kb_step(KernelBuilder *kb, const char *param);
// Closes the signature and appends `body` (the statements inside the braces), preceded by a
// #line naming the node's .gem line. When an earlier kernel has the same launch bounds,
// parameters and body, this one is not emitted: its launch calls the earlier kernel, and a
// comment says so.
void kb_end(KernelBuilder *kb, const char *body);

bool lower_fail(Lower *L, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// --- attention launches, and a Lower outside plan_build ---------------------------------
// What the attention emitters (codegen/attention/) need beyond kb_begin, still through one
// KernelBuilder per kernel: a grid of one block per tile of a tile list, dynamic shared memory,
// the tile list and workspace arguments; LAUNCH_ZERO launches; and a Lower of its own for an IR
// that plan_build does not see (the GDPA benchmark's cases, runtime/bench/gdpa_case.c).

// Appends tile list t to L; returns its index (for kb_begin_tiles).
int lower_new_tiles(Lower *L, TileList t);
// kb_begin for a launch of one block per tile of tile list `tiles` (GRID_TILES), with `smem`
// bytes of dynamic shared memory.
void kb_begin_tiles(KernelBuilder *kb, Lower *L, int node, const char *name, int tiles,
                    int threads, int smem);
// kb_begin_tiles for a persistent kernel (GRID_PERSISTENT, __launch_bounds__(threads, 1)): one
// CTA per SM walks its entries of tile list `tiles`, dealt for that grid (plan.h).
void kb_begin_persistent(KernelBuilder *kb, Lower *L, int node, const char *name, int tiles,
                         int threads, int smem);
// `const __grid_constant__ TmaMap param`: the TMA tensor map of tensor t (all its rows, boxes
// of box_rows x 64 columns), built by the runtime per batch (ARG_TENSOR_MAP).
void kb_tensor_map(KernelBuilder *kb, const char *param, int t, int box_rows);
void kb_tile_count(KernelBuilder *kb, const char *param);  // i64: entries of the launch's list
void kb_smem(KernelBuilder *kb, int bytes);           // the launch's dynamic shared memory
void kb_tiles(KernelBuilder *kb, const char *param);  // const int *: the launch's tile list
// An ARG_WORKSPACE of `bytes` bytes named by (tensor, slot, owner): every launch naming it
// shares its memory (codegen/lower.c makes each name one plan scratch).
LaunchArg lower_workspace_arg(int tensor, int slot, int owner, SymSize bytes);
// `[const] ctype *__restrict__ param` (out: not const), bound to workspace ws.
void kb_workspace(KernelBuilder *kb, const char *ctype, const char *param, LaunchArg ws,
                  bool out);
// A LAUNCH_ZERO that zeroes `bytes` bytes of arg (tensor, scratch or workspace).
Launch *lower_zero(Lower *L, int node, LaunchArg arg, SymSize bytes);

// A launch of a hand-written kernel that L->src already holds (kernels/table_grad.cuh): like
// kb_begin, without writing the kernel; then the kb_* calls declare its parameters as they add
// the arguments, and kb_end_existing checks that those are the kernel's own parameters
// (whitespace aside), stopping with an internal error if not.
void kb_begin_existing(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize size,
                       int64_t per_block, int threads);
void kb_end_existing(KernelBuilder *kb);
// Tensor t seen as `ctype` rather than its dtype's type (table_grad's rows tensor as i64).
void kb_tensor_typed(KernelBuilder *kb, const char *ctype, const char *param, int t, bool out);

// How far L's source, launches, tile lists, scratch and kernels reach; lower_rollback drops
// what came after (a node an emitter refused half-way adds nothing).
typedef struct LowerMark {
  size_t src;
  int nlaunches, ntiles, nscratch, nkernels;
} LowerMark;
LowerMark lower_mark(const Lower *L);
void lower_rollback(Lower *L, LowerMark m);

// A Lower for `ir` outside plan_build: p gives the arena and the target; the kernel text is
// appended to *src, which L holds until lower_standalone_end hands it back (with the #line
// resets resolved). lower_standalone_end frees L's launches, tile lists and scratch too: copy
// them out first.
void lower_standalone_begin(Lower *L, const Ir *ir, Plan *p, StrBuf *src);
void lower_standalone_end(Lower *L, StrBuf *src);

#endif
