// emit_attention_quantized.c: attention nodes at fp8 and mxfp8 (docs/attention.md, "Quantized
// attention"). Each call writes one launch group: the kernels that quantize the tensor operands
// into fp32 copies (workspaces, named per group so each lives only as long as the group), then
// the attention kernel of kernels/attention_quantized.cuh, which quantizes P and dS as it forms
// them. The numerics are the CPU executor's, exactly (docs/executor.md):
//   forward            S = Qh·Khᵀ, O = quant_rows(P)·Vr
//   attention_bwd_q    dQ = scale · quant_rows(dS)·Kr                 (Qh, Kh, Vh, dOh, Kr)
//   attention_bwd_k    dK = scale · quant_cols(dS)ᵀ·Qr, dV = quant_cols(P)ᵀ·dOr (+ dV when a
//                      _v sibling exists; softmax first writes each row's statistics)
//   attention_bwd_v    nothing when a _k sibling exists, else dV alone
// where Xh is X quantized along each head's features and Xr down each example's rows; at fp8
// both are the one per-tensor quantization.
#include <stdio.h>
#include <string.h>

#include "attention_internal.h"
#include "kernel_builder.h"

enum { QUANT_THREADS = 128, AMAX_PER_THREAD = 8 };

typedef struct QEmit {
  const Plan *p;
  const Ir *ir;
  int node;
  StrBuf *src;
  Launch *out;
  int *nout;
  const AttnNode *a;
  const char *phase;  // "fwd", "bwdq", "bwdkv": keeps kernel names apart
  int owner;          // the tensor that names this group's workspaces
  bool mx;
  int made[16][2];    // (tensor, workspace slot) already quantized in this group
  int nmade;
} QEmit;

static LaunchArg workspace(const QEmit *e, int tensor, int slot, SymSize bytes) {
  return (LaunchArg){.kind = ARG_WORKSPACE, .tensor = tensor, .slot = slot, .i = e->owner,
                     .size = bytes};
}

static Launch *new_launch(QEmit *e) {
  Launch *l = &e->out[(*e->nout)++];
  memset(l, 0, sizeof *l);
  l->node = e->node;
  l->nfused = 1;
  l->backward = e->node >= e->ir->nforward;
  l->zero_tensor = -1;
  return l;
}

static Launch *fixed_kernel(QEmit *e, const char *kernel, SymSize size, int64_t per_block,
                            int threads, int smem) {
  Launch *l = new_launch(e);
  l->kind = LAUNCH_KERNEL;
  l->kernel = arena_strdup(e->p->arena, kernel);
  l->grid = GRID_FIXED;
  l->size = size;
  l->per_block = per_block;
  l->threads = threads;
  l->smem = smem;
  return l;
}

static const char *load_type(const Ir *ir, int t) {
  const char *ty = attn_elem_type(ir->tensors[t].dtype);
  return ty ? ty : "float";
}

// The workspace holding tensor t quantized for `rows` (down each example's rows, from `side`:
// ATTNQ_KV_ROWS, _Q_ROWS or _OUT_ROWS) or along the heads; emits its kernels the first time.
static LaunchArg quantized(QEmit *e, int t, bool rows, const char *side) {
  const Ir *ir = e->ir;
  const AttnNode *a = e->a;
  int slot = !e->mx ? ATTN_WS_FP8 : rows ? ATTN_WS_ROWS_MX : ATTN_WS_HEADS_MX;
  SymSize elems = sym_scale(tensor_rows(ir, t), a->d);
  LaunchArg copy = workspace(e, t, slot, sym_scale(elems, 4));
  for (int i = 0; i < e->nmade; i++)
    if (e->made[i][0] == t && e->made[i][1] == slot) return copy;
  if (e->nmade < 16) e->made[e->nmade][0] = t, e->made[e->nmade][1] = slot, e->nmade++;
  char tid[256], kernel[400], what[300];
  ident(tid, sizeof tid, ir->tensors[t].name);
  const char *ty = load_type(ir, t);
  StrBuf *src = e->src;
  if (!e->mx) {  // amax, then scale
    LaunchArg amax = workspace(e, t, ATTN_WS_AMAX, sym_const(4));
    Launch *z = new_launch(e);
    z->kind = LAUNCH_ZERO;
    z->zero_arg = amax;
    z->zero_bytes = sym_const(4);
    snprintf(kernel, sizeof kernel, "%s_%s_amax_%s", a->name, e->phase, tid);
    snprintf(what, sizeof what, "%s: amax of %s for its fp8 scale", e->phase, ir->tensors[t].name);
    attn_kernel_comment(src, ir, a->n, what);
    sb_printf(src,
              "extern \"C\" __global__ void __launch_bounds__(%d)\n"
              "%s(unsigned *__restrict__ amax, const %s *__restrict__ x, long long n) {\n"
              "  attnq_amax(amax, x, n);\n}\n",
              QUANT_THREADS, kernel, ty);
    Launch *l = fixed_kernel(e, kernel, elems, QUANT_THREADS * AMAX_PER_THREAD, QUANT_THREADS, 0);
    l->args[l->nargs++] = amax;
    l->args[l->nargs++] = attn_tensor_arg(t);
    l->args[l->nargs++] = (LaunchArg){.kind = ARG_SIZE, .size = elems};
    snprintf(kernel, sizeof kernel, "%s_%s_fp8_%s", a->name, e->phase, tid);
    snprintf(what, sizeof what, "%s: %s to fp8 (E4M3, one scale)", e->phase, ir->tensors[t].name);
    attn_kernel_comment(src, ir, a->n, what);
    sb_printf(src,
              "extern \"C\" __global__ void __launch_bounds__(%d)\n"
              "%s(float *__restrict__ out, const %s *__restrict__ x, long long n,\n"
              "    const unsigned *__restrict__ amax) {\n"
              "  attnq_quantize_fp8(out, x, n, amax);\n}\n",
              QUANT_THREADS, kernel, ty);
    l = fixed_kernel(e, kernel, elems, QUANT_THREADS, QUANT_THREADS, 0);
    l->args[l->nargs++] = copy;
    l->args[l->nargs++] = attn_tensor_arg(t);
    l->args[l->nargs++] = (LaunchArg){.kind = ARG_SIZE, .size = elems};
    l->args[l->nargs++] = amax;
    return copy;
  }
  if (!rows) {  // one thread per (row, head, block of 32 features)
    int64_t blocks = (a->dh + 31) / 32;
    snprintf(kernel, sizeof kernel, "%s_%s_mx_heads_%s", a->name, e->phase, tid);
    snprintf(what, sizeof what, "%s: %s to mxfp8 along each head's %lld features", e->phase,
             ir->tensors[t].name, (long long)a->dh);
    attn_kernel_comment(src, ir, a->n, what);
    sb_printf(src,
              "extern \"C\" __global__ void __launch_bounds__(%d)\n"
              "%s(float *__restrict__ out, const %s *__restrict__ x, long long rows) {\n"
              "  attnq_quantize_heads_mx<%lld>(out, x, rows, %lld);\n}\n",
              QUANT_THREADS, kernel, ty, (long long)a->dh, (long long)a->d);
    Launch *l = fixed_kernel(e, kernel, sym_scale(tensor_rows(ir, t), a->heads * blocks),
                             QUANT_THREADS, QUANT_THREADS, 0);
    l->args[l->nargs++] = copy;
    l->args[l->nargs++] = attn_tensor_arg(t);
    l->args[l->nargs++] = (LaunchArg){.kind = ARG_SIZE, .size = tensor_rows(ir, t)};
    return copy;
  }
  // Down the rows: one thread per (example, column); PMA's seeds once.
  bool shared_seeds = a->q_shared && strcmp(side, "ATTNQ_Q_ROWS") == 0;
  snprintf(kernel, sizeof kernel, "%s_%s_mx_rows_%s", a->name, e->phase, tid);
  snprintf(what, sizeof what, "%s: %s to mxfp8 down each example's rows", e->phase,
           ir->tensors[t].name);
  attn_kernel_comment(src, ir, a->n, what);
  sb_printf(src,
            "extern \"C\" __global__ void __launch_bounds__(%d)\n"
            "%s(float *__restrict__ out, const %s *__restrict__ x, long long batch",
            QUANT_THREADS, kernel, ty);
  attn_offsets_params(src, a);
  sb_puts(src, ") {\n");
  attn_rows_value(src, a);
  sb_printf(src, "  attnq_quantize_rows_mx(out, x, rows, %s, batch);\n}\n", side);
  SymSize work = shared_seeds ? sym_const(a->d) : (SymSize){0, a->d, 0, -1};
  Launch *l = fixed_kernel(e, kernel, work, QUANT_THREADS, QUANT_THREADS, 0);
  l->args[l->nargs++] = copy;
  l->args[l->nargs++] = attn_tensor_arg(t);
  l->args[l->nargs++] = (LaunchArg){.kind = ARG_SIZE, .size = (SymSize){0, 1, 0, -1}};
  attn_offsets_args(a, l);
  return copy;
}

static void float_params(StrBuf *src, const char *const *names, int n) {
  for (int i = 0; i < n; i++) sb_printf(src, ", const float *__restrict__ %s", names[i]);
}

static void inv_norm_literal(char *buf, size_t cap, const AttnNode *a) {
  snprintf(buf, cap, "%.17g", a->inv_norm);
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

static int tile_smem(const AttnNode *a, int tiles) { return (int)(tiles * 64 * a->dh * 4); }

static bool emit_forward(QEmit *e, TileList *tiles) {
  const Ir *ir = e->ir;
  const AttnNode *a = e->a;
  const Node *n = a->n;
  const char *ot = attn_elem_type(ir->tensors[n->out].dtype);
  if (!ot) return false;
  LaunchArg qh = quantized(e, a->q, false, NULL);
  LaunchArg kh = quantized(e, a->k, false, NULL);
  LaunchArg vr = quantized(e, a->v, true, "ATTNQ_KV_ROWS");
  char kernel[128], norm[48];
  inv_norm_literal(norm, sizeof norm, a);
  snprintf(kernel, sizeof kernel, "%s_fwd", a->name);
  attn_kernel_comment(e->src, ir, n, "fwd");
  sb_printf(e->src, "extern \"C\" __global__ void __launch_bounds__(64)\n%s(%s *__restrict__ out",
            kernel, ot);
  static const char *const names[] = {"qh", "kh", "vr"};
  float_params(e->src, names, 3);
  attn_offsets_params(e->src, a);
  sb_puts(e->src, ", const int *__restrict__ tiles) {\n");
  attn_rows_value(e->src, a);
  sb_printf(e->src, "  attnq_forward<%lld, %s, %d>(out, qh, kh, vr, rows, %s, tiles);\n}\n",
            (long long)a->dh, attn_act_enum(node_act(n)), e->mx ? 1 : 0, norm);
  tiles[0] = attn_tile_list(a, e->node, 64, false);
  Launch *l = new_launch(e);
  *l = attn_tile_launch(e->p, e->node, kernel, 64, tile_smem(a, 2), 0, false);
  l->args[l->nargs++] = attn_tensor_arg(n->out);
  l->args[l->nargs++] = qh;
  l->args[l->nargs++] = kh;
  l->args[l->nargs++] = vr;
  attn_offsets_args(a, l);
  l->args[l->nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l->tiles};
  return true;
}

static bool emit_dq(QEmit *e, int dq, TileList *tiles) {
  const Ir *ir = e->ir;
  const AttnNode *a = e->a;
  const Node *n = a->n;
  const char *gt = attn_elem_type(ir->tensors[dq].dtype);
  if (!gt) return false;
  LaunchArg qh = quantized(e, a->q, false, NULL), kh = quantized(e, a->k, false, NULL);
  LaunchArg vh = quantized(e, a->v, false, NULL), doh = quantized(e, a->dout, false, NULL);
  LaunchArg kr = quantized(e, a->k, true, "ATTNQ_KV_ROWS");
  bool pma = a->q_shared;
  char kernel[128], norm[48];
  inv_norm_literal(norm, sizeof norm, a);
  snprintf(kernel, sizeof kernel, "%s_bwd_q", a->name);
  attn_kernel_comment(e->src, ir, n, pma ? "bwd: dQ summed over the batch" : "bwd: dQ");
  sb_printf(e->src, "extern \"C\" __global__ void __launch_bounds__(64)\n%s(%s *__restrict__ dq%s",
            kernel, gt, pma ? ", long long batch" : "");
  static const char *const names[] = {"qh", "kh", "vh", "doh", "kr"};
  float_params(e->src, names, 5);
  attn_offsets_params(e->src, a);
  if (!pma) sb_puts(e->src, ", const int *__restrict__ tiles");
  sb_puts(e->src, ") {\n");
  attn_rows_value(e->src, a);
  sb_printf(e->src, "  attnq_backward_q<%lld, %s, %d>(dq, %s, qh, kh, vh, doh, kr, rows, %s, %s);\n}\n",
            (long long)a->dh, attn_act_enum(node_act(n)), e->mx ? 1 : 0, pma ? "batch" : "0LL",
            norm, pma ? "(const int *)0" : "tiles");
  Launch *l = new_launch(e);
  if (pma) {
    *l = (Launch){.kind = LAUNCH_KERNEL, .node = e->node, .nfused = 1, .backward = true,
                  .kernel = arena_strdup(e->p->arena, kernel), .grid = GRID_FIXED,
                  .size = sym_const((a->q_fixed + 63) / 64 * a->heads), .per_block = 1,
                  .threads = 64, .smem = tile_smem(a, 3), .zero_tensor = -1};
  } else {
    tiles[0] = attn_tile_list(a, e->node, 64, false);
    *l = attn_tile_launch(e->p, e->node, kernel, 64, tile_smem(a, 3), 0, true);
  }
  l->args[l->nargs++] = attn_tensor_arg(dq);
  if (pma) l->args[l->nargs++] = (LaunchArg){.kind = ARG_SIZE, .size = (SymSize){0, 1, 0, -1}};
  l->args[l->nargs++] = qh;
  l->args[l->nargs++] = kh;
  l->args[l->nargs++] = vh;
  l->args[l->nargs++] = doh;
  l->args[l->nargs++] = kr;
  attn_offsets_args(a, l);
  if (!pma) l->args[l->nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l->tiles};
  return true;
}

static bool emit_dkv(QEmit *e, int dk, int dv, TileList *tiles) {
  const Ir *ir = e->ir;
  const AttnNode *a = e->a;
  const Node *n = a->n;
  const char *gt = attn_elem_type(ir->tensors[dk >= 0 ? dk : dv].dtype);
  if (!gt || (dk >= 0 && dv >= 0 && ir->tensors[dk].dtype != ir->tensors[dv].dtype)) return false;
  bool softmax = n->act == ACT_SOFTMAX;
  LaunchArg qh = quantized(e, a->q, false, NULL), kh = quantized(e, a->k, false, NULL);
  LaunchArg vh = quantized(e, a->v, false, NULL), doh = quantized(e, a->dout, false, NULL);
  LaunchArg qr = quantized(e, a->q, true, "ATTNQ_Q_ROWS");
  LaunchArg dor = quantized(e, a->dout, true, "ATTNQ_OUT_ROWS");
  char kernel[128], norm[48];
  inv_norm_literal(norm, sizeof norm, a);
  LaunchArg stats = workspace(e, a->dout, ATTN_WS_QUANT_STATS, attn_output_rows(a, a->heads * 16));
  if (softmax) {  // {m, 1/sum, dot} per output row and head
    int64_t max_q = a->q_jag >= 0 ? ir->jagged[a->q_jag].max_len : a->q_fixed;
    int64_t q_tiles = (max_q + 63) / 64;
    snprintf(kernel, sizeof kernel, "%s_bwd_stats", a->name);
    attn_kernel_comment(e->src, ir, n, "bwd: softmax row statistics");
    sb_printf(e->src, "extern \"C\" __global__ void __launch_bounds__(64)\n%s(float4 *__restrict__ stats",
              kernel);
    static const char *const names[] = {"qh", "kh", "vh", "doh"};
    float_params(e->src, names, 4);
    attn_offsets_params(e->src, a);
    sb_puts(e->src, ") {\n");
    attn_rows_value(e->src, a);
    sb_printf(e->src, "  attnq_backward_stats<%lld, %s>(stats, qh, kh, vh, doh, rows, %lld);\n}\n",
              (long long)a->dh, attn_act_enum(node_act(n)), (long long)q_tiles);
    Launch *l = fixed_kernel(e, kernel, (SymSize){0, q_tiles * a->heads, 0, -1}, 1, 64,
                             tile_smem(a, 2));
    l->args[l->nargs++] = stats;
    l->args[l->nargs++] = qh;
    l->args[l->nargs++] = kh;
    l->args[l->nargs++] = vh;
    l->args[l->nargs++] = doh;
    attn_offsets_args(a, l);
  }
  snprintf(kernel, sizeof kernel, "%s_bwd_kv", a->name);
  attn_kernel_comment(e->src, ir, n, dk >= 0 && dv >= 0 ? "bwd: dK, dV" : dk >= 0 ? "bwd: dK" : "bwd: dV");
  sb_printf(e->src, "extern \"C\" __global__ void __launch_bounds__(64)\n%s(", kernel);
  if (dk >= 0) sb_printf(e->src, "%s *__restrict__ dk, ", gt);
  if (dv >= 0) sb_printf(e->src, "%s *__restrict__ dv, ", gt);
  sb_puts(e->src, "const float *__restrict__ qh");
  static const char *const names[] = {"kh", "vh", "doh", "qr", "dor"};
  float_params(e->src, names, 5);
  attn_offsets_params(e->src, a);
  sb_puts(e->src, ", const int *__restrict__ tiles");
  if (softmax) sb_puts(e->src, ", const float4 *__restrict__ stats");
  sb_puts(e->src, ") {\n");
  attn_rows_value(e->src, a);
  char dk_arg[48], dv_arg[48];  // a missing gradient is a typed null pointer
  snprintf(dk_arg, sizeof dk_arg, dk >= 0 ? "dk" : "(%s *)0", gt);
  snprintf(dv_arg, sizeof dv_arg, dv >= 0 ? "dv" : "(%s *)0", gt);
  sb_printf(e->src,
            "  attnq_backward_kv<%lld, %s, %d>(%s, %s, qh, kh, vh, doh, qr, dor, rows, %s, %s, tiles);\n}\n",
            (long long)a->dh, attn_act_enum(node_act(n)), e->mx ? 1 : 0, dk_arg, dv_arg, norm,
            softmax ? "stats" : "(const float4 *)0");
  tiles[0] = attn_tile_list(a, e->node, 64, true);
  Launch *l = new_launch(e);
  *l = attn_tile_launch(e->p, e->node, kernel, 64, tile_smem(a, 4) + 64 * 12, 0, true);
  if (dk >= 0) l->args[l->nargs++] = attn_tensor_arg(dk);
  if (dv >= 0) l->args[l->nargs++] = attn_tensor_arg(dv);
  l->args[l->nargs++] = qh;
  l->args[l->nargs++] = kh;
  l->args[l->nargs++] = vh;
  l->args[l->nargs++] = doh;
  l->args[l->nargs++] = qr;
  l->args[l->nargs++] = dor;
  attn_offsets_args(a, l);
  l->args[l->nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l->tiles};
  if (softmax) l->args[l->nargs++] = stats;
  return true;
}

bool emit_attention_quantized(const Plan *p, const Ir *ir, int node, StrBuf *src, Launch *out,
                              int *nout, TileList *tiles) {
  const Node *n = &ir->nodes[node];
  AttnNode a;
  QEmit e = {.p = p, .ir = ir, .node = node, .src = src, .out = out, .nout = nout, .a = &a,
             .mx = n->prec == DT_MXFP8};
  if (n->op == OP_ATTENTION) {
    if (!attn_node_shape(ir, n, -1, ir->tensors[n->out].name, &a)) return false;
    e.phase = "fwd";
    e.owner = n->out;
    return emit_forward(&e, tiles);
  }
  int who[3];
  attn_siblings(ir, n, who);
  int dout = n->ins[3];
  char stem[96];
  snprintf(stem, sizeof stem, "%s", ir->tensors[dout].name);
  char *dot_grad = strstr(stem, ".grad");
  if (dot_grad && dot_grad[5] == 0) *dot_grad = 0;
  if (!attn_node_shape(ir, n, dout, stem, &a) || !attn_elem_type(ir->tensors[dout].dtype))
    return false;
  e.owner = n->out;
  if (n->op == OP_ATTENTION_BWD_Q) {
    if (who[0] != node) return true;
    e.phase = "bwdq";
    return emit_dq(&e, n->out, tiles);
  }
  if (n->op == OP_ATTENTION_BWD_V && who[1] >= 0) return true;
  if (n->op == OP_ATTENTION_BWD_K && who[1] != node) return true;
  e.phase = "bwdkv";
  int dk = who[1] >= 0 ? ir->nodes[who[1]].out : -1, dv = who[2] >= 0 ? ir->nodes[who[2]].out : -1;
  return emit_dkv(&e, dk, dv, tiles);
}
