// emit_attention.c: lowers an attention node and its backward ops to CUDA (docs/attention.md).
// The kernel bodies are templates in kernels/attention*.cuh, embedded into gemc at build time;
// per node this file writes one extern "C" wrapper per kernel that fixes the template
// arguments (head dim, activation, warps, element types) and the node's constants (d, the
// jagged or fixed row counts, mask, window, scale, hstu norm), and describes its launch.
#include "attention.h"
#include "attention_internal.h"

#include "kernels_embedded.h"

#include <stdio.h>
#include <string.h>

// The four .cuh files, embedded by the Makefile (kernels_embedded.h), pasted in include order.
void attention_device_source(StrBuf *src) {
  sb_puts(src, kernel_attention_cuh);
  sb_puts(src, kernel_attention_forward_cuh);
  sb_puts(src, kernel_attention_backward_cuh);
  sb_puts(src, kernel_attention_simt_cuh);
}


const char *attn_elem_type(DType t) {
  if (t == DT_BF16) return "attn_bf16";
  if (t == DT_F32) return "float";
  if (t == DT_FP16) return "attn_half";
  if (t == DT_FP8 || t == DT_MXFP8) return "attn_bf16";  // stored as bf16
  return NULL;
}

// `text` with every character that is not a letter or digit made '_'.
static void identifier(char *out, size_t cap, const char *text) {
  size_t i = 0;
  for (; text[i] && i + 1 < cap; i++) {
    char c = text[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out[i] = ok ? c : '_';
  }
  out[i] = 0;
}

bool attn_node_shape(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a) {
  const Tensor *q = &ir->tensors[n->ins[0]], *k = &ir->tensors[n->ins[1]];
  memset(a, 0, sizeof *a);
  a->n = n;
  a->q = n->ins[0], a->k = n->ins[1], a->v = n->ins[2], a->dout = dout;
  a->d = k->width;
  a->heads = n->heads;
  if (a->heads <= 0 || a->d % a->heads) return false;
  a->dh = a->d / a->heads;
  if (a->dh > 128) return false;
  a->qt = attn_elem_type(q->dtype);
  a->kt = attn_elem_type(k->dtype);
  a->simt = a->dh % 16 != 0 || k->dtype != DT_BF16 || q->dtype == DT_FP16;
  a->q_jag = q->layout == LAYOUT_JAGGED ? q->jag : -1;
  a->kv_jag = k->layout == LAYOUT_JAGGED ? k->jag : -1;
  if (n->shape == ATTN_PMA) {
    a->q_fixed = q->fixed[0];
    a->q_shared = true;
  } else if (q->layout == LAYOUT_SET) {
    a->q_fixed = q->set_k;
  } else if (q->layout != LAYOUT_JAGGED) {
    a->q_fixed = 1;
  }
  if (a->kv_jag < 0) a->kv_fixed = k->set_k;
  a->inv_norm = 1;
  if (n->hstu_norm && n->act != ACT_SOFTMAX) {
    int64_t L = a->kv_jag >= 0 ? ir->jagged[a->kv_jag].max_len : k->set_k;
    if (L > 0) a->inv_norm = 1.0 / (double)L;
  }
  identifier(a->name, sizeof a->name, stem);
  return a->qt && a->kt;
}

bool attn_node(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a) {
  if (!attn_node_shape(ir, n, dout, stem, a)) return false;
  const Tensor *k = &ir->tensors[n->ins[1]];
  if (ir->tensors[a->v].dtype != k->dtype) return false;
  return dout < 0 || ir->tensors[dout].dtype == k->dtype;
}

const char *attn_act_enum(Act act) {
  switch (act) {
  case ACT_SOFTMAX: return "ATTN_ACT_SOFTMAX";
  case ACT_SILU: return "ATTN_ACT_SILU";
  case ACT_GELU: return "ATTN_ACT_GELU";
  case ACT_GELU_TAYLOR: return "ATTN_ACT_GELU_TAYLOR";
  case ACT_RELU: return "ATTN_ACT_RELU";
  case ACT_SIGMOID: return "ATTN_ACT_SIGMOID";
  default: return "ATTN_ACT_NONE";
  }
}

// The forward kernel's shape: query rows per block (schedule hint tile_q: 64 or 128) and per
// warp (tile_m: 16 or 32). By default, for jagged queries, 4 warps of 32 rows: every K and V
// fragment read from shared memory then feeds two MMAs. Short queries take 4 warps of 16.
static void forward_shape(const AttnNode *a, int *warps, int *mw) {
  int rows = a->q_jag >= 0 ? 128 : 64, warp_rows = a->q_jag >= 0 ? 32 : 16;
  if (a->n->sched.tile_q == 64 || a->n->sched.tile_q == 128) rows = a->n->sched.tile_q;
  if (a->n->sched.tile_m == 16 || a->n->sched.tile_m == 32) warp_rows = a->n->sched.tile_m;
  *mw = warp_rows / 16;
  *warps = rows / warp_rows;
}

static int forward_smem_rows(const AttnNode *a, int rows) {
  return (int)((rows + 4 * 64) * a->dh * 2);
}

static int backward_smem(const AttnNode *a) { return (int)(6 * 64 * a->dh * 2); }

// The SIMT kernels stage two 64-row fp32 tiles (and, for dK/dV, 64 statistics).
int attn_simt_smem(const AttnNode *a) { return (int)(2 * 64 * a->dh * 4 + 64 * 8); }
static int bwd_threads(const AttnNode *a) { return a->simt ? 64 : 128; }

// The comment above each kernel: source line, op and attributes.
void attn_kernel_comment(StrBuf *src, const Ir *ir, const Node *n, const char *what) {
  const char *file = ir->source ? ir->source : "model";
  const char *slash = strrchr(file, '/');
  sb_printf(src, "\n// %s:%d:%d gdpa %s %s", slash ? slash + 1 : file, n->loc.first_line,
            n->loc.first_column, attn_shape_name(n->shape), act_name(node_act(n)));
  if (n->mask == MASK_CAUSAL) sb_puts(src, " causal");
  if (n->window > 0) sb_printf(src, " window %lld", (long long)n->window);
  if (n->hstu_norm && n->act != ACT_SOFTMAX) sb_puts(src, " hstu_norm");
  if (n->prec == DT_FP8 || n->prec == DT_MXFP8)
    sb_printf(src, " @%s (quantized as the CPU executor does)", dtype_name(n->prec));
  sb_printf(src, " (%s)\n", what);
}

// The kernel parameters for the offsets, and the AttnRows value built from them.
void attn_offsets_params(StrBuf *src, const AttnNode *a) {
  if (a->q_jag >= 0) sb_puts(src, ", const long long *__restrict__ q_offsets");
  if (a->kv_jag >= 0) sb_puts(src, ", const long long *__restrict__ kv_offsets");
}

// A float constant as CUDA reads it: "0.125f", "1.0f".
void attn_float_literal(char *buf, size_t cap, double x) {
  snprintf(buf, cap, "%.9g", x);
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
  strncat(buf, "f", cap - strlen(buf) - 1);
}

void attn_rows_value(StrBuf *src, const AttnNode *a) {
  const Node *n = a->n;
  char scale[40], norm[40];
  attn_float_literal(scale, sizeof scale, n->scale);
  attn_float_literal(norm, sizeof norm, a->inv_norm);
  sb_printf(src,
            "  const AttnRows rows = {%s, %s, %lld, %lld, %d, %lld, %lld, %d, %s, %s};\n",
            a->q_jag >= 0 ? "q_offsets" : "0", a->kv_jag >= 0 ? "kv_offsets" : "0",
            (long long)a->q_fixed, (long long)a->kv_fixed, a->q_shared ? 1 : 0, (long long)a->d,
            (long long)n->window, n->mask == MASK_CAUSAL ? 1 : 0, scale, norm);
}

LaunchArg attn_tensor_arg(int t) { return (LaunchArg){.kind = ARG_TENSOR, .tensor = t}; }

void attn_offsets_args(const AttnNode *a, Launch *l) {
  if (a->q_jag >= 0) l->args[l->nargs++] = (LaunchArg){.kind = ARG_OFFSETS, .jag = a->q_jag};
  if (a->kv_jag >= 0) l->args[l->nargs++] = (LaunchArg){.kind = ARG_OFFSETS, .jag = a->kv_jag};
}

// A tile list over query tiles of `rows` rows, or (kv_side) over key tiles.
TileList attn_tile_list(const AttnNode *a, int node, int rows, bool kv_side) {
  const Node *n = a->n;
  TileList t = {.node = node, .tile_q = rows, .tile_kv = 64, .heads = (int)a->heads,
                .zigzag = n->sched.zigzag != 2};
  if (!kv_side) {
    t.q_jag = a->q_jag, t.kv_jag = a->kv_jag, t.q_fixed = a->q_fixed, t.kv_fixed = a->kv_fixed;
    t.causal = n->mask == MASK_CAUSAL;
    t.window = n->window;
  } else {  // rows are keys; work per tile is estimated without the mask
    t.q_jag = a->kv_jag, t.kv_jag = a->q_jag, t.q_fixed = a->kv_fixed, t.kv_fixed = a->q_fixed;
  }
  return t;
}

Launch attn_tile_launch(const Plan *p, int node, const char *kernel, int threads, int smem,
                          int tiles, bool backward) {
  char *name = arena_strdup(p->arena, kernel);
  return (Launch){.kind = LAUNCH_KERNEL, .node = node, .nfused = 1, .backward = backward,
                  .kernel = name, .grid = GRID_TILES, .threads = threads, .smem = smem,
                  .tiles = p->ntiles + tiles};
}

// Rows of the output (and of dO) per batch, as a SymSize times `per_row`.
SymSize attn_output_rows(const AttnNode *a, int64_t per_row) {
  if (a->q_jag >= 0) return (SymSize){0, 0, per_row, a->q_jag};
  return (SymSize){0, a->q_fixed * per_row, 0, -1};
}

static bool emit_forward(const Plan *p, const Ir *ir, int node, StrBuf *src, Launch *out,
                         int *nout, TileList *tiles) {
  const Node *n = &ir->nodes[node];
  AttnNode a;
  const char *ot = attn_elem_type(ir->tensors[n->out].dtype);
  if (!attn_node(ir, n, -1, ir->tensors[n->out].name, &a) || !ot) return false;
  int warps, mw;
  forward_shape(&a, &warps, &mw);
  if (a.simt) warps = 2, mw = 2;  // 64 threads, one per query row
  char kernel[128];
  snprintf(kernel, sizeof kernel, "%s_fwd", a.name);
  attn_kernel_comment(src, ir, n, "fwd");
  sb_printf(src,
            "extern \"C\" __global__ void __launch_bounds__(%d)\n"
            "%s(%s *__restrict__ out, const %s *__restrict__ q, const %s *__restrict__ k,\n"
            "    const %s *__restrict__ v",
            32 * warps, kernel, ot, a.qt, a.kt, a.kt);
  attn_offsets_params(src, &a);
  sb_puts(src, ", const int *__restrict__ tiles) {\n");
  attn_rows_value(src, &a);
  if (a.simt)
    sb_printf(src, "  attn_forward_simt<%lld, %s>(out, q, k, v, rows, tiles, (float *)0, (const %s *)0);\n}\n",
              (long long)a.dh, attn_act_enum(node_act(n)), a.kt);
  else
    sb_printf(src, "  attn_forward<%lld, %s, %d, %d>(out, q, k, v, rows, tiles, (float *)0, "
                   "(const attn_bf16 *)0);\n}\n",
              (long long)a.dh, attn_act_enum(node_act(n)), warps, mw);

  tiles[0] = attn_tile_list(&a, node, 16 * warps * mw, false);  // SIMT: 64 rows
  Launch l = attn_tile_launch(p, node, kernel, 32 * warps,
                         a.simt ? attn_simt_smem(&a) : forward_smem_rows(&a, 16 * warps * mw), 0, false);
  l.args[l.nargs++] = attn_tensor_arg(n->out);
  l.args[l.nargs++] = attn_tensor_arg(a.q);
  l.args[l.nargs++] = attn_tensor_arg(a.k);
  l.args[l.nargs++] = attn_tensor_arg(a.v);
  attn_offsets_args(&a, &l);
  l.args[l.nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l.tiles};
  out[(*nout)++] = l;
  return true;
}

bool attn_same_inputs(const Node *x, const Node *y) {
  for (int i = 0; i < 4; i++)
    if (x->ins[i] != y->ins[i]) return false;
  return true;
}

void attn_siblings(const Ir *ir, const Node *n, int who[3]) {
  who[0] = who[1] = who[2] = -1;
  for (int i = ir->nforward; i < ir->nnodes; i++) {
    const Node *m = &ir->nodes[i];
    if (!attn_is_backward(m->op) || !attn_same_inputs(m, n)) continue;
    int slot = m->op == OP_ATTENTION_BWD_Q ? 0 : m->op == OP_ATTENTION_BWD_K ? 1 : 2;
    if (who[slot] < 0) who[slot] = i;
  }
}

bool attn_is_backward(OpKind op) {
  return op == OP_ATTENTION_BWD_Q || op == OP_ATTENTION_BWD_K || op == OP_ATTENTION_BWD_V;
}

// The backward of one attention, split by op so that each call needs one tile list:
//   attention_bwd_q: [softmax row statistics], dQ (PMA: summed over the examples in-kernel)
//   attention_bwd_k: dK, and dV too when an attention_bwd_v sibling exists
//   attention_bwd_v: nothing when attention_bwd_k exists, else dV alone
// The statistics live in a workspace named by (dO tensor, slot 0) that the dK/dV launch
// reads as well (docs/attention.md).
static bool emit_backward(const Plan *p, const Ir *ir, int node, StrBuf *src, Launch *out,
                          int *nout, TileList *tiles) {
  const Node *n = &ir->nodes[node];
  int who[3];  // q, k, v
  attn_siblings(ir, n, who);
  if (n->op == OP_ATTENTION_BWD_Q) {
    if (who[0] != node) return true;
    who[1] = who[2] = -1;
  } else {
    if (n->op == OP_ATTENTION_BWD_V && who[1] >= 0) return true;
    if (n->op == OP_ATTENTION_BWD_K && who[1] != node) return true;
    if (n->act == ACT_SOFTMAX && who[0] < 0) return false;  // no statistics without dQ's call
    who[0] = -1;
  }
  const char *gt[3] = {NULL, NULL, NULL};
  for (int s = 0; s < 3; s++)
    if (who[s] >= 0 && !(gt[s] = attn_elem_type(ir->tensors[ir->nodes[who[s]].out].dtype)))
      return false;
  if (gt[1] && gt[2] && strcmp(gt[1], gt[2]) != 0) return false;
  int dout = n->ins[3];
  char stem[96];
  snprintf(stem, sizeof stem, "%s", ir->tensors[dout].name);
  char *dot_grad = strstr(stem, ".grad");
  if (dot_grad && dot_grad[5] == 0) *dot_grad = 0;
  AttnNode a;
  if (!attn_node(ir, n, dout, stem, &a)) return false;
  bool softmax = n->act == ACT_SOFTMAX;
  const char *act = attn_act_enum(node_act(n));
  long long dh = (long long)a.dh;
  char kernel[128];
  LaunchArg stats = {.kind = ARG_WORKSPACE, .tensor = dout, .slot = 0,
                     .size = attn_output_rows(&a, a.heads * 8)};

  if (softmax && who[0] >= 0) {  // lse2 and D per output row and head, over dQ's tiles
    snprintf(kernel, sizeof kernel, "%s_bwd_stats", a.name);
    attn_kernel_comment(src, ir, n, "bwd: softmax row statistics");
    sb_printf(src,
              "extern \"C\" __global__ void __launch_bounds__(%d)\n"
              "%s(float *__restrict__ stats, const %s *__restrict__ q,\n"
              "    const %s *__restrict__ k, const %s *__restrict__ v,\n"
              "    const %s *__restrict__ dout",
              bwd_threads(&a), kernel, a.qt, a.kt, a.kt, a.kt);
    attn_offsets_params(src, &a);
    sb_puts(src, ", const int *__restrict__ tiles) {\n");
    attn_rows_value(src, &a);
    sb_printf(src, "  attn_forward%s<%lld, %s%s>((attn_bf16 *)0, q, k, v, rows, tiles, stats, dout);\n}\n",
              a.simt ? "_simt" : "", dh, act, a.simt ? "" : ", 4, 1");
    Launch l = attn_tile_launch(p, node, kernel, bwd_threads(&a),
                           a.simt ? attn_simt_smem(&a) : forward_smem_rows(&a, 64), 0, true);
    l.args[l.nargs++] = stats;
    l.args[l.nargs++] = attn_tensor_arg(a.q);
    l.args[l.nargs++] = attn_tensor_arg(a.k);
    l.args[l.nargs++] = attn_tensor_arg(a.v);
    l.args[l.nargs++] = attn_tensor_arg(dout);
    attn_offsets_args(&a, &l);
    l.args[l.nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l.tiles};
    out[(*nout)++] = l;
  }

  if (who[0] >= 0) {  // dQ
    bool pma = a.q_shared;  // one block per (seed tile, head), summing the examples in order
    int dq = ir->nodes[who[0]].out;
    snprintf(kernel, sizeof kernel, "%s_bwd_q", a.name);
    attn_kernel_comment(src, ir, n, pma ? "bwd: dQ summed over the batch" : "bwd: dQ");
    sb_printf(src,
              "extern \"C\" __global__ void __launch_bounds__(%d)\n"
              "%s(%s *__restrict__ dq, %sconst %s *__restrict__ q,\n"
              "    const %s *__restrict__ k, const %s *__restrict__ v,\n"
              "    const %s *__restrict__ dout",
              bwd_threads(&a), kernel, gt[0], pma ? "long long batch, " : "", a.qt, a.kt, a.kt,
              a.kt);
    attn_offsets_params(src, &a);
    if (!pma) sb_puts(src, ", const int *__restrict__ tiles");
    if (softmax) sb_puts(src, ", const float *__restrict__ stats");
    sb_puts(src, ") {\n");
    attn_rows_value(src, &a);
    sb_printf(src, "  attn_backward_q%s<%lld, %s>(dq, %s, q, k, v, dout, rows, %s, %s);\n}\n",
              a.simt ? "_simt" : "", dh, act, pma ? "batch" : "0LL",
              pma ? "(const int *)0" : "tiles", softmax ? "stats" : "(const float *)0");
    Launch l;
    if (pma) {
      l = (Launch){.kind = LAUNCH_KERNEL, .node = node, .nfused = 1, .backward = true,
                   .kernel = arena_strdup(p->arena, kernel), .grid = GRID_FIXED,
                   .size = (SymSize){(a.q_fixed + 63) / 64 * a.heads, 0, 0, -1}, .per_block = 1,
                   .threads = bwd_threads(&a),
                   .smem = a.simt ? attn_simt_smem(&a) : backward_smem(&a)};
      if (softmax) tiles[0] = attn_tile_list(&a, node, 64, false);  // the statistics' tiles
    } else {
      tiles[0] = attn_tile_list(&a, node, 64, false);
      l = attn_tile_launch(p, node, kernel, bwd_threads(&a), a.simt ? attn_simt_smem(&a) : backward_smem(&a),
                      0, true);
    }
    l.args[l.nargs++] = attn_tensor_arg(dq);
    if (pma) l.args[l.nargs++] = (LaunchArg){.kind = ARG_SIZE, .size = (SymSize){0, 1, 0, -1}};
    l.args[l.nargs++] = attn_tensor_arg(a.q);
    l.args[l.nargs++] = attn_tensor_arg(a.k);
    l.args[l.nargs++] = attn_tensor_arg(a.v);
    l.args[l.nargs++] = attn_tensor_arg(dout);
    attn_offsets_args(&a, &l);
    if (!pma) l.args[l.nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l.tiles};
    if (softmax) l.args[l.nargs++] = stats;
    out[(*nout)++] = l;
  }

  if (who[1] >= 0 || who[2] >= 0) {  // dK and dV
    const char *t = gt[1] ? gt[1] : gt[2];
    snprintf(kernel, sizeof kernel, "%s_bwd_kv", a.name);
    attn_kernel_comment(src, ir, n, "bwd: dK, dV");
    sb_printf(src, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", bwd_threads(&a),
              kernel);
    if (who[1] >= 0) sb_printf(src, "%s *__restrict__ dk, ", t);
    if (who[2] >= 0) sb_printf(src, "%s *__restrict__ dv, ", t);
    sb_printf(src,
              "const %s *__restrict__ q,\n"
              "    const %s *__restrict__ k, const %s *__restrict__ v,\n"
              "    const %s *__restrict__ dout",
              a.qt, a.kt, a.kt, a.kt);
    attn_offsets_params(src, &a);
    sb_puts(src, ", const int *__restrict__ tiles");
    if (softmax) sb_puts(src, ", const float *__restrict__ stats");
    sb_puts(src, ") {\n");
    attn_rows_value(src, &a);
    char null_grad[32];
    snprintf(null_grad, sizeof null_grad, "(%s *)0", t);
    sb_printf(src, "  attn_backward_kv%s<%lld, %s>(%s, %s, q, k, v, dout, rows, tiles, %s);\n}\n",
              a.simt ? "_simt" : "", dh, act, who[1] >= 0 ? "dk" : null_grad, who[2] >= 0 ? "dv" : null_grad,
              softmax ? "stats" : "(const float *)0");
    tiles[0] = attn_tile_list(&a, node, 64, true);
    Launch l = attn_tile_launch(p, node, kernel, bwd_threads(&a),
                           a.simt ? attn_simt_smem(&a) : backward_smem(&a), 0, true);
    if (who[1] >= 0) l.args[l.nargs++] = attn_tensor_arg(ir->nodes[who[1]].out);
    if (who[2] >= 0) l.args[l.nargs++] = attn_tensor_arg(ir->nodes[who[2]].out);
    l.args[l.nargs++] = attn_tensor_arg(a.q);
    l.args[l.nargs++] = attn_tensor_arg(a.k);
    l.args[l.nargs++] = attn_tensor_arg(a.v);
    l.args[l.nargs++] = attn_tensor_arg(dout);
    attn_offsets_args(&a, &l);
    l.args[l.nargs++] = (LaunchArg){.kind = ARG_TILES, .tiles = l.tiles};
    if (softmax) l.args[l.nargs++] = stats;
    out[(*nout)++] = l;
  }
  return true;
}

bool emit_attention(const Plan *p, const Ir *ir, int node, StrBuf *src, Launch *out, int *nout,
                    TileList *tiles) {
  *nout = 0;
  *tiles = (TileList){.node = -1};
  const Node *n = &ir->nodes[node];
  if (n->op != OP_ATTENTION && !attn_is_backward(n->op)) return false;
  size_t mark = src->len;
  if (!src->data || !strstr(src->data, "GEMC_ATTENTION_CUH")) {
    attention_device_source(src);
  }
  bool quantized = n->prec == DT_FP8 || n->prec == DT_MXFP8;
  if (quantized && !strstr(src->data, "GEMC_ATTENTION_QUANTIZED_CUH")) sb_puts(src, kernel_attention_quantized_cuh);
  bool ok = quantized ? emit_attention_quantized(p, ir, node, src, out, nout, tiles)
          : n->op == OP_ATTENTION ? emit_forward(p, ir, node, src, out, nout, tiles)
                                  : emit_backward(p, ir, node, src, out, nout, tiles);
  if (!ok) {  // write nothing
    src->len = mark;
    if (src->data) src->data[mark] = 0;
    *nout = 0;
    *tiles = (TileList){.node = -1};
  }
  return ok;
}
