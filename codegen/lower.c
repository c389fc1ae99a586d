// lower.c: plan_build, the driver of code generation. It walks the forward and backward IR
// in order and hands each node to its op group (lower_pointwise.c, lower_norm.c,
// lower_gemm.c, lower_sparse.c, the attention emitter), then appends one optimizer launch per
// dense parameter, and runs the memory plan (memplan.c). Every kernel's text and its launch
// are built together (KernelBuilder), so their argument lists cannot disagree.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal_error.h"
#include "kernels_embedded.h"
#include "lower_internal.h"
#include "memplan.h"
#include "target.h"

// --- sizes and types --------------------------------------------------------------------

SymSize sym_const(int64_t c) { return (SymSize){c, 0, 0, -1}; }

SymSize sym_scale(SymSize s, int64_t k) { return (SymSize){s.c * k, s.b * k, s.t * k, s.jag}; }

SymSize sym_add(SymSize a, SymSize b) {
  GEMC_ASSERT(a.jag < 0 || b.jag < 0 || a.jag == b.jag || a.t == 0 || b.t == 0);
  int jag = a.t != 0 ? a.jag : b.jag;
  return (SymSize){a.c + b.c, a.b + b.b, a.t + b.t, a.t + b.t != 0 ? jag : -1};
}

SymSize tensor_rows(const Ir *ir, int t) {
  const Tensor *x = &ir->tensors[t];
  switch (x->layout) {
    case LAYOUT_DENSE: return (SymSize){0, 1, 0, -1};
    case LAYOUT_SET: return (SymSize){0, x->set_k, 0, -1};
    case LAYOUT_JAGGED: return (SymSize){0, 0, 1, x->jag};
    case LAYOUT_FIXED: return sym_const(x->fixed[0]);
    case LAYOUT_SCALAR: return sym_const(1);
    case LAYOUT_ROWS: break;
  }
  return sym_const(0);  // rows: sized by table_grad (lower_sparse.c)
}

int64_t tensor_width(const Ir *ir, int t) {
  const Tensor *x = &ir->tensors[t];
  switch (x->layout) {
    case LAYOUT_DENSE:
    case LAYOUT_SET:
    case LAYOUT_JAGGED: return x->width > 0 ? x->width : 1;
    case LAYOUT_FIXED: return x->nfixed == 2 ? x->fixed[1] : 1;
    case LAYOUT_SCALAR: return 1;
    case LAYOUT_ROWS: return x->width > 0 ? x->width : 1;
  }
  return 1;
}

SymSize tensor_elems(const Ir *ir, int t) { return sym_scale(tensor_rows(ir, t), tensor_width(ir, t)); }

int dtype_size(DType t) {
  switch (t) {
    case DT_F32: return 4;
    case DT_BF16:
    case DT_FP16:
    case DT_FP8:
    case DT_MXFP8: return 2;  // fp8 and mxfp8 values are stored as bf16
    case DT_F64:
    case DT_I64: return 8;
    case DT_COUNT: break;
  }
  return 4;
}

SymSize tensor_bytes(const Ir *ir, int t) {
  return sym_scale(tensor_elems(ir, t), dtype_size(ir->tensors[t].dtype));
}

const char *dtype_ctype(DType t) {
  switch (t) {
    case DT_BF16:
    case DT_FP8:
    case DT_MXFP8: return "bf16_t";
    case DT_FP16: return "fp16_t";
    case DT_I64: return "i64";
    case DT_F64: return "double";
    default: return "float";
  }
}

const char *dtype_load(DType t) {
  switch (t) {
    case DT_BF16:
    case DT_FP8:
    case DT_MXFP8: return "load_bf16";
    case DT_FP16: return "load_fp16";
    default: return "load_f32";
  }
}

const char *dtype_store(DType t) {
  switch (t) {
    case DT_BF16:
    case DT_FP8:
    case DT_MXFP8: return "store_bf16";
    case DT_FP16: return "store_fp16";
    default: return "store_f32";
  }
}

const char *act_fn(Act a) {
  switch (a) {
    case ACT_SILU: return "act_silu";
    case ACT_GELU: return "act_gelu";
    case ACT_GELU_TAYLOR: return "act_gelu_taylor";
    case ACT_RELU: return "act_relu";
    case ACT_SIGMOID: return "act_sigmoid";
    default: return "act_none";
  }
}

void ident(char *buf, size_t size, const char *name) {
  size_t n = 0;
  for (const char *s = name; *s && n + 1 < size; s++) {
    char c = *s;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    buf[n++] = ok ? c : '_';
  }
  buf[n] = '\0';
}

Num num(double x) {
  Num n;
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(n.s, sizeof n.s, "%.*g", digits, x);
    if (strtod(n.s, NULL) == x) break;
  }
  // A literal that is a double in C++ even when it looks like an integer.
  if (!strpbrk(n.s, ".eEni")) strncat(n.s, ".0", sizeof n.s - strlen(n.s) - 1);
  return n;
}

// --- building launches ------------------------------------------------------------------

bool lower_fail(Lower *L, int node, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const Node *n = &L->ir->nodes[node];
  diag_error(L->d, n->loc, "cannot generate CUDA for %s: %s", op_name(n->op), msg);
  L->ok = false;
  return false;
}

Launch *lower_new_launch(Lower *L, LaunchKind kind, int node) {
  if (L->nlaunches == L->cap_launches) {
    L->cap_launches = L->cap_launches ? 2 * L->cap_launches : 64;
    L->launches = realloc(L->launches, (size_t)L->cap_launches * sizeof *L->launches);
    if (!L->launches) gemc_internal_error(__FILE__, __LINE__, "out of memory");
  }
  Launch *l = &L->launches[L->nlaunches++];
  memset(l, 0, sizeof *l);
  l->kind = kind;
  l->node = node;
  l->nfused = 1;
  l->backward = node >= 0 && node >= L->ir->nforward;
  l->zero_tensor = -1;
  l->threads = ELEMENTWISE_THREADS;
  l->per_block = ELEMENTWISE_THREADS;
  return l;
}

int lower_new_scratch(Lower *L, const char *name, SymSize bytes) {
  if (L->nscratch == L->cap_scratch) {
    L->cap_scratch = L->cap_scratch ? 2 * L->cap_scratch : 16;
    L->scratch = realloc(L->scratch, (size_t)L->cap_scratch * sizeof *L->scratch);
    if (!L->scratch) gemc_internal_error(__FILE__, __LINE__, "out of memory");
  }
  Scratch *s = &L->scratch[L->nscratch];
  memset(s, 0, sizeof *s);
  s->name = arena_strdup(L->p->arena, name);
  s->bytes = bytes;
  s->buffer = -1;
  return L->nscratch++;
}

void lower_comment(Lower *L, int node, const char *what) {
  const Node *n = &L->ir->nodes[node];
  const char *file = L->ir->source ? L->ir->source : "?";
  const char *slash = strrchr(file, '/');
  sb_printf(&L->src, "\n// %s:%d:%d %s %s (%s)\n", slash ? slash + 1 : file, n->loc.first_line,
            n->loc.first_column, op_name(n->op), what, node >= L->ir->nforward ? "bwd" : "fwd");
}

void kb_begin(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize size,
              int64_t per_block, int threads) {
  memset(kb, 0, sizeof *kb);
  kb->L = L;
  kb->launch = lower_new_launch(L, LAUNCH_KERNEL, node);
  kb->launch->kernel = arena_strdup(L->p->arena, name);
  kb->launch->grid = GRID_FIXED;
  kb->launch->size = size;
  kb->launch->per_block = per_block;
  kb->launch->threads = threads;
  sb_printf(&L->src, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", threads, name);
}

static void kb_param(KernelBuilder *kb, const char *decl, LaunchArg a) {
  Launch *l = kb->launch;
  if (l->nargs >= PLAN_MAX_ARGS)
    gemc_internal_error(__FILE__, __LINE__, "a generated kernel has too many arguments");
  l->args[l->nargs++] = a;
  sb_printf(&kb->params, "%s%s", kb->nparams ? ",\n    " : "", decl);
  kb->nparams++;
}

static LaunchArg arg_of(ArgKind k) {
  LaunchArg a;
  memset(&a, 0, sizeof a);
  a.kind = k;
  a.tensor = a.slot = a.jag = a.tiles = -1;
  return a;
}

void kb_tensor_out(KernelBuilder *kb, const char *param, int t) {
  char decl[256];
  snprintf(decl, sizeof decl, "%s *__restrict__ %s", dtype_ctype(kb->L->ir->tensors[t].dtype), param);
  LaunchArg a = arg_of(ARG_TENSOR);
  a.tensor = t;
  kb_param(kb, decl, a);
}

void kb_tensor_in(KernelBuilder *kb, const char *param, int t) {
  char decl[256];
  snprintf(decl, sizeof decl, "const %s *__restrict__ %s", dtype_ctype(kb->L->ir->tensors[t].dtype),
           param);
  LaunchArg a = arg_of(ARG_TENSOR);
  a.tensor = t;
  kb_param(kb, decl, a);
}

void kb_scratch(KernelBuilder *kb, const char *ctype, const char *param, int slot, bool out) {
  char decl[256];
  snprintf(decl, sizeof decl, "%s%s *__restrict__ %s", out ? "" : "const ", ctype, param);
  LaunchArg a = arg_of(ARG_SCRATCH);
  a.slot = slot;
  kb_param(kb, decl, a);
}

void kb_grad_out(KernelBuilder *kb, const char *param, int param_tensor) {
  char decl[256];
  snprintf(decl, sizeof decl, "float *__restrict__ %s", param);
  LaunchArg a = arg_of(ARG_GRAD);
  a.tensor = param_tensor;
  kb_param(kb, decl, a);
}

void kb_optstate(KernelBuilder *kb, const char *param, int tensor, int slot) {
  char decl[256];
  snprintf(decl, sizeof decl, "float *__restrict__ %s", param);
  LaunchArg a = arg_of(ARG_OPTSTATE);
  a.tensor = tensor;
  a.slot = slot;
  kb_param(kb, decl, a);
}

void kb_offsets(KernelBuilder *kb, const char *param, int jag) {
  char decl[256];
  snprintf(decl, sizeof decl, "const i64 *__restrict__ %s", param);
  LaunchArg a = arg_of(ARG_OFFSETS);
  a.jag = jag;
  kb_param(kb, decl, a);
}

void kb_size(KernelBuilder *kb, const char *param, SymSize s) {
  char decl[128];
  snprintf(decl, sizeof decl, "i64 %s", param);
  LaunchArg a = arg_of(ARG_SIZE);
  a.size = s;
  kb_param(kb, decl, a);
}

void kb_int(KernelBuilder *kb, const char *param, int64_t v) {
  char decl[128];
  snprintf(decl, sizeof decl, "i64 %s", param);
  LaunchArg a = arg_of(ARG_INT);
  a.i = v;
  kb_param(kb, decl, a);
}

void kb_float(KernelBuilder *kb, const char *param, float v) {
  char decl[128];
  snprintf(decl, sizeof decl, "float %s", param);
  LaunchArg a = arg_of(ARG_FLOAT);
  a.f = v;
  kb_param(kb, decl, a);
}

void kb_step(KernelBuilder *kb, const char *param) {
  char decl[128];
  snprintf(decl, sizeof decl, "i64 %s", param);
  kb_param(kb, decl, arg_of(ARG_STEP));
}

void kb_end(KernelBuilder *kb, const char *body) {
  Lower *L = kb->L;
  sb_printf(&L->src, "%s) {\n%s}\n", kb->params.data ? kb->params.data : "", body);
  sb_free(&kb->params);
}

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
            "    for (i64 r = chunk * chunk_rows + row_lane; r < end; r += ROW_LANES) acc += %s;\n"
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

// --- attention --------------------------------------------------------------------------

#ifdef GEMC_HAVE_EMIT_ATTENTION
#include "attention.h"

// An attention launch's ARG_WORKSPACE, named by (tensor, slot, owner = arg.i), becomes the plan
// scratch of that name (made on first use), so that every launch naming it, in this call or a
// sibling's, gets the same memory, alive from its first launch to its last (memplan.c).
static void workspace_to_scratch(Lower *L, LaunchArg *a) {
  if (a->kind != ARG_WORKSPACE) return;
  const Ir *ir = L->ir;
  char name[600];
  if (a->slot == 0)
    snprintf(name, sizeof name, "%s.softmax_stats", ir->tensors[a->tensor].name);
  else
    snprintf(name, sizeof name, "%s.%s.ws%d", ir->tensors[(int)a->i].name,
             ir->tensors[a->tensor].name, a->slot);
  int s = -1;
  for (int i = 0; i < L->nscratch && s < 0; i++)
    if (strcmp(L->scratch[i].name, name) == 0) s = i;
  if (s < 0) s = lower_new_scratch(L, name, a->size);
  LaunchArg b = {.kind = ARG_SCRATCH, .tensor = -1, .slot = s, .jag = -1, .tiles = -1};
  *a = b;
}
bool lower_attention(Lower *L, int node) {
  Launch out[PLAN_MAX_ATTENTION_LAUNCHES];
  int nout = 0;
  TileList tile;
  memset(&tile, 0, sizeof tile);
  tile.node = -1;
  L->p->ntiles = L->ntiles;
  L->p->source = L->src.data;
  if (!emit_attention(L->p, L->ir, node, &L->src, out, &nout, &tile))
    return lower_fail(L, node, "the attention emitter refused it");
  if (tile.node == node) {
    if (L->ntiles == L->cap_tiles) {
      L->cap_tiles = L->cap_tiles ? 2 * L->cap_tiles : 8;
      L->tiles = realloc(L->tiles, (size_t)L->cap_tiles * sizeof *L->tiles);
      if (!L->tiles) gemc_internal_error(__FILE__, __LINE__, "out of memory");
    }
    L->tiles[L->ntiles++] = tile;
  }
  for (int i = 0; i < nout; i++) {
    Launch *l = lower_new_launch(L, out[i].kind, node);
    *l = out[i];
    for (int a = 0; a < l->nargs; a++) workspace_to_scratch(L, &l->args[a]);
    if (l->kind == LAUNCH_ZERO) workspace_to_scratch(L, &l->zero_arg);
  }
  return true;
}
#else
bool lower_attention(Lower *L, int node) {
  return lower_fail(L, node, "attention codegen not available in this build");
}
#endif

// --- the driver -------------------------------------------------------------------------

static bool lower_node(Lower *L, int node) {
  switch (L->ir->nodes[node].op) {
    case OP_EMBED:
    case OP_EMBED_POOL:
    case OP_EMBED_POOL_BWD:
    case OP_TABLE_GRAD: return lower_sparse(L, node);
    case OP_LINEAR:
    case OP_LINEAR_ACT_BWD:
    case OP_LINEAR_BWD_X:
    case OP_LINEAR_BWD_W: return lower_gemm(L, node);
    case OP_RMSNORM:
    case OP_LAYERNORM:
    case OP_RMSNORM_BWD_X:
    case OP_RMSNORM_BWD_GAIN:
    case OP_LAYERNORM_BWD_X:
    case OP_LAYERNORM_BWD_GAIN: return lower_norm(L, node);
    case OP_ATTENTION:
    case OP_ATTENTION_BWD_Q:
    case OP_ATTENTION_BWD_K:
    case OP_ATTENTION_BWD_V: return lower_attention(L, node);
    default: return lower_pointwise(L, node);
  }
}

bool plan_build(const Ir *ir, const char *target, Arena *arena, Diag *d, Plan *out) {
  PlanOptions opt = {false};
  return plan_build_with(ir, target, &opt, arena, d, out);
}

bool plan_build_with(const Ir *ir, const char *target, const PlanOptions *opt, Arena *arena,
                     Diag *d, Plan *out) {
  memset(out, 0, sizeof *out);
  out->arena = arena;
  out->ir = ir;
  const char *tname = target ? target : ir->target;
  const Target *tg = target_find(tname);
  if (!tg) {
    diag_error(d, (Loc){0, 0, 0, 0}, "unknown target '%s'; expected one of: %s",
               tname ? tname : "(none)", target_names());
    return false;
  }
  out->target = tg->name;

  Lower L;
  memset(&L, 0, sizeof L);
  L.ir = ir;
  L.p = out;
  L.d = d;
  L.ok = true;
  L.done = calloc((size_t)ir->nnodes + 1, sizeof *L.done);
  if (!L.done) gemc_internal_error(__FILE__, __LINE__, "out of memory");

  sb_printf(&L.src, "// generated by gemc from %s; do not edit\n",
            ir->source ? ir->source : "(unknown)");
  sb_printf(&L.src, "// model %s, target %s (%s): one training step, forward, backward and "
                    "optimizer\n\n", ir->model ? ir->model : "?", tg->name, tg->gpu);
  sb_puts(&L.src, kernel_prelude_cuh);

  for (int i = 0; i < ir->nnodes; i++) {
    if (L.done[i]) continue;
    OpKind op = ir->nodes[i].op;
    if (opt->skip_attention && (op == OP_ATTENTION || op == OP_ATTENTION_BWD_Q ||
                                op == OP_ATTENTION_BWD_K || op == OP_ATTENTION_BWD_V)) {
      lower_comment(&L, i, "left out (--skip-attention)");
      continue;
    }
    lower_node(&L, i);
  }
  for (int g = 0; g < ir->ngrads; g++) {
    int param = ir->grads[g].param;
    if (ir->tensors[param].kind == TENSOR_PARAM) lower_optimizer(&L, param);
  }

  out->source = arena_strdup(arena, L.src.data ? L.src.data : "");
  out->nlaunches = L.nlaunches;
  out->launches = arena_alloc(arena, (size_t)(L.nlaunches + 1) * sizeof *out->launches);
  if (L.nlaunches) memcpy(out->launches, L.launches, (size_t)L.nlaunches * sizeof *L.launches);
  out->nscratch = L.nscratch;
  out->scratch = arena_alloc(arena, (size_t)(L.nscratch + 1) * sizeof *out->scratch);
  if (L.nscratch) memcpy(out->scratch, L.scratch, (size_t)L.nscratch * sizeof *L.scratch);
  out->ntiles = L.ntiles;
  out->tiles = arena_alloc(arena, (size_t)(L.ntiles + 1) * sizeof *out->tiles);
  if (L.ntiles) memcpy(out->tiles, L.tiles, (size_t)L.ntiles * sizeof *L.tiles);
  free(L.launches);
  free(L.scratch);
  free(L.tiles);
  free(L.done);
  sb_free(&L.src);
  if (!L.ok) return false;
  memplan_build(out);
  return true;
}
