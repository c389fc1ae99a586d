// kernel_builder.c: the sizes, types and names every generated kernel uses, and the
// KernelBuilder, which grows a kernel's parameter list and its launch's argument list together.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "hash.h"
#include "internal_error.h"
#include "kernel_builder.h"

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
    L->launches = xrealloc(L->launches, (size_t)L->cap_launches * sizeof *L->launches);
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
    L->scratch = xrealloc(L->scratch, (size_t)L->cap_scratch * sizeof *L->scratch);
  }
  Scratch *s = &L->scratch[L->nscratch];
  memset(s, 0, sizeof *s);
  s->name = arena_strdup(L->p->arena, name);
  s->bytes = bytes;
  s->buffer = -1;
  return L->nscratch++;
}

static const char *file_name(const Ir *ir) {
  const char *file = ir->source && *ir->source ? ir->source : "?";
  const char *slash = strrchr(file, '/');
  return slash ? slash + 1 : file;
}

enum { MAX_SOURCE_LINES = 4, MAX_LINE = 118 };

void lower_source_text(StrBuf *out, const Ir *ir, Loc loc) {
  if (!ir->source_text || loc.first_line <= 0) return;
  const char *p = ir->source_text;
  for (int line = 1; line < loc.first_line && *p; p++)
    if (*p == '\n') line++;
  int last = loc.last_line >= loc.first_line ? loc.last_line : loc.first_line;
  for (int line = loc.first_line; line <= last && *p; line++) {
    if (line - loc.first_line == MAX_SOURCE_LINES) {
      sb_puts(out, "//   ...\n");
      break;
    }
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r')) n--;
    size_t room = MAX_LINE - 5;  // after "//   "
    // Only printable ASCII goes into the comment; anything else (a tab, UTF-8) becomes '?'.
    char text[MAX_LINE];
    size_t k = 0;
    for (size_t i = 0; i < n && k < room; i++) {
      unsigned char c = (unsigned char)p[i];
      text[k++] = c == '\t' ? ' ' : (c >= 32 && c < 127 ? (char)c : '?');
    }
    if (n > room) memcpy(text + room - 3, "...", 3);
    text[k] = '\0';
    sb_printf(out, "//   %s\n", text);
    if (!end) break;
    p = end + 1;
  }
}

void lower_comment_at(Lower *L, Loc loc, const char *what) {
  sb_printf(&L->src, "\n// %s:%d:%d %s\n", file_name(L->ir), loc.first_line, loc.first_column,
            what);
  lower_source_text(&L->src, L->ir, loc);
  L->comment_loc = loc;
}

void lower_comment(Lower *L, int node, const char *what) {
  const Node *n = &L->ir->nodes[node];
  char text[512];
  snprintf(text, sizeof text, "%s %s (%s)", op_name(n->op), what,
           node >= L->ir->nforward ? "bwd" : "fwd");
  lower_comment_at(L, n->loc, text);
}

void lower_line_directive(StrBuf *out, const Ir *ir, int line) {
  if (line > 0) sb_printf(out, "#line %d \"%s\"\n", line, file_name(ir));
}

char *lower_finish_lines(const char *src, const char *generated_name) {
  StrBuf out = {0};
  int line = 1;
  size_t reset_len = strlen(LOWER_LINE_RESET);
  for (const char *p = src; *p;) {
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == reset_len && memcmp(p, LOWER_LINE_RESET, n) == 0)
      sb_printf(&out, "#line %d \"%s\"", line + 1, generated_name);
    else
      sb_printf(&out, "%.*s", (int)n, p);
    if (!end) break;
    sb_puts(&out, "\n");
    line++;
    p = end + 1;
  }
  return out.data;
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
  kb->start = L->src.len;
  sb_printf(&L->src, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", threads, name);
}

static void kb_param(KernelBuilder *kb, const char *decl, LaunchArg a) {
  Launch *l = kb->launch;
  int size = plan_arg_bytes(a.kind);
  int bytes = (l->param_bytes + size - 1) / size * size + size;
  if (bytes > PLAN_MAX_PARAM_BYTES || l->nargs >= PLAN_MAX_ARGS) {
    // Unreachable from a model sema accepts; a diagnostic all the same, once per kernel.
    if (l->param_bytes <= PLAN_MAX_PARAM_BYTES && l->node >= 0)
      lower_fail(kb->L, l->node, "kernel %s needs more than the %d bytes of CUDA kernel "
                 "parameter space", l->kernel ? l->kernel : "?", PLAN_MAX_PARAM_BYTES);
    kb->L->ok = false;
    l->param_bytes = PLAN_MAX_PARAM_BYTES + 1;
    return;
  }
  if (l->nargs == l->cap_args) {
    int cap = l->cap_args ? 2 * l->cap_args : 8;
    l->args = arena_grow(kb->L->p->arena, l->args, (size_t)l->nargs, (size_t)cap,
                         sizeof *l->args);
    l->cap_args = cap;
  }
  l->args[l->nargs++] = a;
  l->param_bytes = bytes;
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

// kb_param with the parameter's declaration formatted from fmt.
static void kb_declare(KernelBuilder *kb, LaunchArg a, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kb_declare(KernelBuilder *kb, LaunchArg a, const char *fmt, ...) {
  char decl[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(decl, sizeof decl, fmt, ap);
  va_end(ap);
  kb_param(kb, decl, a);
}

static const char *tensor_ctype(const KernelBuilder *kb, int t) {
  return dtype_ctype(kb->L->ir->tensors[t].dtype);
}

void kb_tensor_out(KernelBuilder *kb, const char *param, int t) {
  LaunchArg a = arg_of(ARG_TENSOR);
  a.tensor = t;
  kb_declare(kb, a, "%s *__restrict__ %s", tensor_ctype(kb, t), param);
}

void kb_tensor_in(KernelBuilder *kb, const char *param, int t) {
  LaunchArg a = arg_of(ARG_TENSOR);
  a.tensor = t;
  kb_declare(kb, a, "const %s *__restrict__ %s", tensor_ctype(kb, t), param);
}

void kb_scratch(KernelBuilder *kb, const char *ctype, const char *param, int slot, bool out) {
  LaunchArg a = arg_of(ARG_SCRATCH);
  a.slot = slot;
  kb_declare(kb, a, "%s%s *__restrict__ %s", out ? "" : "const ", ctype, param);
}

void kb_scratch_part(KernelBuilder *kb, const char *ctype, const char *param, int slot, bool out,
                     int64_t used) {
  LaunchArg a = arg_of(ARG_SCRATCH);
  a.slot = slot;
  a.size = sym_const(used);
  kb_declare(kb, a, "%s%s *__restrict__ %s", out ? "" : "const ", ctype, param);
}

void kb_grad_out(KernelBuilder *kb, const char *param, int param_tensor) {
  LaunchArg a = arg_of(ARG_GRAD);
  a.tensor = param_tensor;
  kb_declare(kb, a, "float *__restrict__ %s", param);
}

void kb_optstate(KernelBuilder *kb, const char *param, int tensor, int slot) {
  LaunchArg a = arg_of(ARG_OPTSTATE);
  a.tensor = tensor;
  a.slot = slot;
  kb_declare(kb, a, "float *__restrict__ %s", param);
}

void kb_offsets(KernelBuilder *kb, const char *param, int jag) {
  LaunchArg a = arg_of(ARG_OFFSETS);
  a.jag = jag;
  kb_declare(kb, a, "const i64 *__restrict__ %s", param);
}

void kb_size(KernelBuilder *kb, const char *param, SymSize s) {
  LaunchArg a = arg_of(ARG_SIZE);
  a.size = s;
  kb_declare(kb, a, "i64 %s", param);
}

void kb_int(KernelBuilder *kb, const char *param, int64_t v) {
  LaunchArg a = arg_of(ARG_INT);
  a.i = v;
  kb_declare(kb, a, "i64 %s", param);
}

void kb_float(KernelBuilder *kb, const char *param, float v) {
  LaunchArg a = arg_of(ARG_FLOAT);
  a.f = v;
  kb_declare(kb, a, "float %s", param);
}

void kb_step(KernelBuilder *kb, const char *param) {
  kb_declare(kb, arg_of(ARG_STEP), "i64 %s", param);
}

// A kernel as kb_end compares it: everything but its name and its #line.
typedef struct EmittedKernel {
  uint64_t hash;
  char *key;         // "threads\nparams\nbody"
  const char *name;
} EmittedKernel;

void kb_end(KernelBuilder *kb, const char *body) {
  Lower *L = kb->L;
  Launch *l = kb->launch;
  const char *params = kb->params.data ? kb->params.data : "";
  StrBuf key = {0};
  sb_printf(&key, "%d\n%s\n%s", l->threads, params, body);
  uint64_t h = fnv1a64(FNV1A64_INIT, key.data, key.len);
  for (int i = 0; i < L->nkernels; i++) {
    EmittedKernel *k = &L->kernels[i];
    if (k->hash != h || strcmp(k->key, key.data) != 0) continue;
    // The same kernel under another name: launch the first one instead.
    L->src.len = kb->start;
    L->src.data[L->src.len] = '\0';
    sb_printf(&L->src, "// launches %s (the same kernel) with this op's arguments\n", k->name);
    l->kernel = k->name;
    sb_free(&key);
    sb_free(&kb->params);
    return;
  }
  if (L->nkernels == L->cap_kernels) {
    L->cap_kernels = L->cap_kernels ? 2 * L->cap_kernels : 64;
    L->kernels = xrealloc(L->kernels, (size_t)L->cap_kernels * sizeof *L->kernels);
  }
  L->kernels[L->nkernels++] = (EmittedKernel){h, key.data, l->kernel};

  // The position the comment above the kernel names (for a fused kernel, the op it is named
  // after), else its node's.
  Loc loc = L->comment_loc;
  if (loc.first_line <= 0 && l->node >= 0) loc = L->ir->nodes[l->node].loc;
  sb_printf(&L->src, "%s) {\n", params);
  lower_line_directive(&L->src, L->ir, loc.first_line);
  sb_printf(&L->src, "%s}\n", body);
  if (loc.first_line > 0) sb_printf(&L->src, "%s\n", LOWER_LINE_RESET);
  sb_free(&kb->params);
}

void lower_free(Lower *L) {
  for (int i = 0; i < L->nkernels; i++) free(L->kernels[i].key);
  free(L->kernels);
  L->kernels = NULL;
  L->nkernels = L->cap_kernels = 0;
}

// --- attention launches, and a Lower outside plan_build ---------------------------------

// What kb_begin leaves for a fixed grid, made a grid over tile list `tiles`.
static void launch_on_tiles(Launch *l, int tiles, int smem) {
  l->grid = GRID_TILES;
  l->tiles = tiles;
  l->size = sym_const(0);
  l->per_block = 1;
  l->smem = smem;
}

// The Launch of a kernel with a fixed grid, as kb_begin makes it, without the kernel's text.
static void kb_setup(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize size,
                     int64_t per_block, int threads) {
  memset(kb, 0, sizeof *kb);
  kb->L = L;
  kb->launch = lower_new_launch(L, LAUNCH_KERNEL, node);
  kb->launch->kernel = arena_strdup(L->p->arena, name);
  kb->launch->grid = GRID_FIXED;
  kb->launch->size = size;
  kb->launch->per_block = per_block;
  kb->launch->threads = threads;
  kb->start = L->src.len;
}

// s without its whitespace, into *out.
static void squeeze(StrBuf *out, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') sb_putn(out, s + i, 1);
}

void kb_begin_existing(KernelBuilder *kb, Lower *L, int node, const char *name, SymSize size,
                       int64_t per_block, int threads) {
  kb_setup(kb, L, node, name, size, per_block, threads);
}

void kb_end_existing(KernelBuilder *kb) {
  const char *src = kb->L->src.data ? kb->L->src.data : "";
  const char *name = kb->launch->kernel;
  size_t len = strlen(name);
  const char *at = NULL;  // "\nNAME(" : where the kernel's parameter list starts
  for (const char *p = strstr(src, name); p && !at; p = strstr(p + 1, name))
    if (p > src && p[-1] == '\n' && p[len] == '(') at = p + len + 1;
  const char *end = at ? strchr(at, ')') : NULL;
  StrBuf want = {0}, have = {0};
  if (end) squeeze(&want, at, (size_t)(end - at));
  const char *params = kb->params.data ? kb->params.data : "";
  squeeze(&have, params, strlen(params));
  bool same = end && strcmp(want.data ? want.data : "", have.data ? have.data : "") == 0;
  sb_free(&want);
  sb_free(&have);
  sb_free(&kb->params);
  if (!same) {
    char what[400];
    snprintf(what, sizeof what, "the launch of %s does not match its parameters", name);
    gemc_internal_error(__FILE__, __LINE__, what);
  }
}

void kb_tensor_typed(KernelBuilder *kb, const char *ctype, const char *param, int t, bool out) {
  LaunchArg a = arg_of(ARG_TENSOR);
  a.tensor = t;
  kb_declare(kb, a, "%s%s *__restrict__ %s", out ? "" : "const ", ctype, param);
}

int lower_new_tiles(Lower *L, TileList t) {
  if (L->ntiles == L->cap_tiles) {
    L->cap_tiles = L->cap_tiles ? 2 * L->cap_tiles : 8;
    L->tiles = xrealloc(L->tiles, (size_t)L->cap_tiles * sizeof *L->tiles);
  }
  L->tiles[L->ntiles] = t;
  return L->ntiles++;
}

void kb_begin_tiles(KernelBuilder *kb, Lower *L, int node, const char *name, int tiles,
                    int threads, int smem) {
  kb_begin(kb, L, node, name, sym_const(0), 1, threads);
  launch_on_tiles(kb->launch, tiles, smem);
}

void kb_begin_persistent(KernelBuilder *kb, Lower *L, int node, const char *name, int tiles,
                         int threads, int smem) {
  kb_setup(kb, L, node, name, sym_const(0), 1, threads);
  launch_on_tiles(kb->launch, tiles, smem);
  kb->launch->grid = GRID_PERSISTENT;
  sb_printf(&L->src, "extern \"C\" __global__ void __launch_bounds__(%d, 1)\n%s(", threads, name);
}

void kb_tensor_map(KernelBuilder *kb, const char *param, int t, int box_rows) {
  LaunchArg a = arg_of(ARG_TENSOR_MAP);
  a.tensor = t;
  a.size = tensor_rows(kb->L->ir, t);
  a.i = box_rows;
  kb_declare(kb, a, "const __grid_constant__ TmaMap %s", param);
}

void kb_tile_count(KernelBuilder *kb, const char *param) {
  LaunchArg a = arg_of(ARG_TILE_COUNT);
  a.tiles = kb->launch->tiles;
  kb_declare(kb, a, "i64 %s", param);
}

void kb_smem(KernelBuilder *kb, int bytes) { kb->launch->smem = bytes; }

void kb_tiles(KernelBuilder *kb, const char *param) {
  LaunchArg a = arg_of(ARG_TILES);
  a.tiles = kb->launch->tiles;
  kb_declare(kb, a, "const int *__restrict__ %s", param);
}

LaunchArg lower_workspace_arg(int tensor, int slot, int owner, SymSize bytes) {
  LaunchArg a = arg_of(ARG_WORKSPACE);
  a.tensor = tensor;
  a.slot = slot;
  a.i = owner;
  a.size = bytes;
  return a;
}

void kb_workspace(KernelBuilder *kb, const char *ctype, const char *param, LaunchArg ws,
                  bool out) {
  GEMC_ASSERT(ws.kind == ARG_WORKSPACE);
  kb_declare(kb, ws, "%s%s *__restrict__ %s", out ? "" : "const ", ctype, param);
}

Launch *lower_zero(Lower *L, int node, LaunchArg arg, SymSize bytes) {
  Launch *l = lower_new_launch(L, LAUNCH_ZERO, node);
  l->zero_arg = arg;
  l->zero_bytes = bytes;
  if (arg.kind == ARG_TENSOR) l->zero_tensor = arg.tensor;
  return l;
}

LowerMark lower_mark(const Lower *L) {
  return (LowerMark){L->src.len, L->nlaunches, L->ntiles, L->nscratch, L->nkernels};
}

void lower_rollback(Lower *L, LowerMark m) {
  if (L->src.data) L->src.data[m.src] = '\0';
  L->src.len = m.src;
  L->nlaunches = m.nlaunches;
  L->ntiles = m.ntiles;
  L->nscratch = m.nscratch;
  for (int i = m.nkernels; i < L->nkernels; i++) free(L->kernels[i].key);
  L->nkernels = m.nkernels;
}

void lower_standalone_begin(Lower *L, const Ir *ir, Plan *p, StrBuf *src) {
  memset(L, 0, sizeof *L);
  L->ir = ir;
  L->p = p;
  L->ok = true;
  L->src = *src;
  memset(src, 0, sizeof *src);
}

void lower_standalone_end(Lower *L, StrBuf *src) {
  char *text = lower_finish_lines(L->src.data ? L->src.data : "", PLAN_SOURCE_NAME);
  sb_free(&L->src);
  *src = (StrBuf){0};
  if (text) sb_puts(src, text);
  free(text);
  lower_free(L);
  free(L->launches);
  free(L->scratch);
  free(L->tiles);
  free(L->done);
  L->launches = NULL, L->scratch = NULL, L->tiles = NULL, L->done = NULL;
  L->nlaunches = L->nscratch = L->ntiles = 0;
}
