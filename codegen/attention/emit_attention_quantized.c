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

enum { QUANT_THREADS = 128, AMAX_PER_THREAD = 8 };

typedef struct QEmit {
  Lower *L;
  int node;
  const AttnNode *a;
  const char *phase;  // "fwd", "bwdq", "bwdkv": keeps kernel names apart
  int owner;          // the tensor that names this group's workspaces
  bool mx;
  int made[16][2];    // (tensor, workspace slot) already quantized in this group
  int nmade;
} QEmit;

static LaunchArg workspace(const QEmit *e, int tensor, int slot, SymSize bytes) {
  return lower_workspace_arg(tensor, slot, e->owner, bytes);
}

// The workspace holding tensor t quantized for `rows` (down each example's rows, from `side`:
// ATTNQ_KV_ROWS, _Q_ROWS or _OUT_ROWS) or along the heads; emits its kernels the first time.
static LaunchArg quantized(QEmit *e, int t, bool rows, const char *side) {
  Lower *L = e->L;
  const Ir *ir = L->ir;
  const AttnNode *a = e->a;
  int slot = !e->mx ? ATTN_WS_FP8 : rows ? ATTN_WS_ROWS_MX : ATTN_WS_HEADS_MX;
  SymSize elems = sym_scale(tensor_rows(ir, t), a->d);
  LaunchArg copy = workspace(e, t, slot, sym_scale(elems, 4));
  for (int i = 0; i < e->nmade; i++)
    if (e->made[i][0] == t && e->made[i][1] == slot) return copy;
  if (e->nmade < 16) e->made[e->nmade][0] = t, e->made[e->nmade][1] = slot, e->nmade++;
  char tid[256], kernel[400], what[300];
  ident(tid, sizeof tid, ir->tensors[t].name);
  KernelBuilder kb;
  if (!e->mx) {  // amax, then scale
    LaunchArg amax = workspace(e, t, ATTN_WS_AMAX, sym_const(4));
    lower_zero(L, e->node, amax, sym_const(4));
    snprintf(kernel, sizeof kernel, "%s_%s_amax_%s", a->name, e->phase, tid);
    snprintf(what, sizeof what, "%s: amax of %s for its fp8 scale", e->phase, ir->tensors[t].name);
    attn_kernel_comment(L, a->n, what);
    kb_begin(&kb, L, e->node, kernel, elems, QUANT_THREADS * AMAX_PER_THREAD, QUANT_THREADS);
    kb_workspace(&kb, "unsigned", "amax", amax, true);
    kb_tensor_in(&kb, "x", t);
    kb_size(&kb, "n", elems);
    kb_end(&kb, "  attnq_amax(amax, x, n);\n");
    snprintf(kernel, sizeof kernel, "%s_%s_fp8_%s", a->name, e->phase, tid);
    snprintf(what, sizeof what, "%s: %s to fp8 (E4M3, one scale)", e->phase, ir->tensors[t].name);
    attn_kernel_comment(L, a->n, what);
    kb_begin(&kb, L, e->node, kernel, elems, QUANT_THREADS, QUANT_THREADS);
    kb_workspace(&kb, "float", "out", copy, true);
    kb_tensor_in(&kb, "x", t);
    kb_size(&kb, "n", elems);
    kb_workspace(&kb, "unsigned", "amax", amax, false);
    kb_end(&kb, "  attnq_quantize_fp8(out, x, n, amax);\n");
    return copy;
  }
  char body[256];
  if (!rows) {  // a warp per (row, head, block of 32 features); a thread per element when
                // the head is a block that divides a warp (attnq_quantize_heads_mx)
    int64_t blocks = (a->dh + 31) / 32;
    bool packed = a->dh < 32 && 32 % a->dh == 0;
    snprintf(kernel, sizeof kernel, "%s_%s_mx_heads_%s", a->name, e->phase, tid);
    snprintf(what, sizeof what, "%s: %s to mxfp8 along each head's %lld features", e->phase,
             ir->tensors[t].name, (long long)a->dh);
    attn_kernel_comment(L, a->n, what);
    kb_begin(&kb, L, e->node, kernel,
             sym_scale(tensor_rows(ir, t), packed ? a->d : a->heads * blocks * 32),
             QUANT_THREADS, QUANT_THREADS);
    kb_workspace(&kb, "float", "out", copy, true);
    kb_tensor_in(&kb, "x", t);
    kb_size(&kb, "rows", tensor_rows(ir, t));
    snprintf(body, sizeof body, "  attnq_quantize_heads_mx<%lld>(out, x, rows, %lld);\n",
             (long long)a->dh, (long long)a->d);
    kb_end(&kb, body);
    return copy;
  }
  // Down the rows: one thread per (example, block of 32 rows, column); PMA's seeds once.
  bool shared_seeds = a->q_shared && strcmp(side, "ATTNQ_Q_ROWS") == 0;
  int64_t blocks = (attn_max_rows(ir, a, strcmp(side, "ATTNQ_KV_ROWS") == 0) + 31) / 32;
  snprintf(kernel, sizeof kernel, "%s_%s_mx_rows_%s", a->name, e->phase, tid);
  snprintf(what, sizeof what, "%s: %s to mxfp8 down each example's rows", e->phase,
           ir->tensors[t].name);
  attn_kernel_comment(L, a->n, what);
  SymSize work = shared_seeds ? sym_const(blocks * a->d) : (SymSize){0, blocks * a->d, 0, -1};
  kb_begin(&kb, L, e->node, kernel, work, QUANT_THREADS, QUANT_THREADS);
  kb_workspace(&kb, "float", "out", copy, true);
  kb_tensor_in(&kb, "x", t);
  kb_size(&kb, "batch", (SymSize){0, 1, 0, -1});
  attn_offsets(&kb, a);
  StrBuf text = {0};
  attn_rows_value(&text, a);
  sb_printf(&text, "  attnq_quantize_rows_mx(out, x, rows, %s, batch, %lld);\n", side,
            (long long)blocks);
  kb_end(&kb, text.data);
  sb_free(&text);
  return copy;
}

// The quantized copies a kernel reads: `const float *__restrict__ NAME` each.
static void copy_params(KernelBuilder *kb, const char *const *names, const LaunchArg *ws, int n) {
  for (int i = 0; i < n; i++) kb_workspace(kb, "float", names[i], ws[i], false);
}

static int tile_smem(const AttnNode *a, int tiles) { return (int)(tiles * 64 * a->dh * 4); }

// The tensor-core kernels' shared memory (kernels/attention_quantized_tc.cuh, AttnmSmem), in
// `rows` 64-row tiles of one head, `trans` transposed ones, `scores` fp32 64 x 64 tiles and
// `quant` bf16 ones; 0 when the head width leaves them out (a multiple of 16 is needed).
static int tc_smem(const AttnNode *a, int rows, int trans, int scores, int quant) {
  if (a->dh % 16) return 0;
  int dh = (int)a->dh;
  return rows * 64 * (dh + 8) * 2 + trans * dh * 72 * 2 + scores * 64 * 65 * 4 +
         quant * 64 * 72 * 2 + 12 * 64 * 4;
}

static int max_int(int a, int b) { return a > b ? a : b; }

// The operands' fp8 scales (their amax workspaces, for the tensors `t` >= 0 of q, k, v, dout)
// as parameters, and the AttnqScales value the kernel body starts with; all 1 at mxfp8.
static void scale_params(QEmit *e, KernelBuilder *kb, StrBuf *body, const int t[4]) {
  static const char *const names[] = {"amax_q", "amax_k", "amax_v", "amax_do"};
  if (e->mx) {
    sb_puts(body, "  const AttnqScales sc = {1.0f, 1.0f, 1.0f, 1.0f};  // mxfp8: no scales\n");
    return;
  }
  for (int i = 0; i < 4; i++)
    if (t[i] >= 0)
      kb_workspace(kb, "unsigned", names[i], workspace(e, t[i], ATTN_WS_AMAX, sym_const(4)), false);
  sb_printf(body, "  const AttnqScales sc = attnq_scales(%s, %s, %s, %s);\n",
            t[0] >= 0 ? names[0] : "0", t[1] >= 0 ? names[1] : "0", t[2] >= 0 ? names[2] : "0",
            t[3] >= 0 ? names[3] : "0");
}

static bool emit_forward(QEmit *e) {
  Lower *L = e->L;
  const Ir *ir = L->ir;
  const AttnNode *a = e->a;
  const Node *n = a->n;
  if (!attn_elem_type(ir->tensors[n->out].dtype)) return false;
  LaunchArg ws[3];  // quantized in this order (each one's kernels come before the next's)
  ws[0] = quantized(e, a->q, false, NULL);
  ws[1] = quantized(e, a->k, false, NULL);
  ws[2] = quantized(e, a->v, true, "ATTNQ_KV_ROWS");
  static const char *const names[] = {"qh", "kh", "vr"};
  char kernel[128], norm[48];
  attn_inv_norm_literal(norm, sizeof norm, a);
  snprintf(kernel, sizeof kernel, "%s_fwd", a->name);
  attn_kernel_comment(L, n, "fwd");
  int tiles = attn_tile_list(L, a, e->node, 64, false);
  KernelBuilder kb;
  kb_begin_tiles(&kb, L, e->node, kernel, tiles, 64,
                 max_int(tile_smem(a, 2), tc_smem(a, 2, 1, 1, 1)));
  kb_tensor_out(&kb, "out", n->out);
  copy_params(&kb, names, ws, 3);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  StrBuf body = {0};
  scale_params(e, &kb, &body, (const int[4]){a->q, a->k, a->v, -1});
  attn_rows_value(&body, a);
  sb_printf(&body, "  attnq_forward_any<%lld, %s, %d>(out, qh, kh, vr, rows, %s, tiles, sc);\n",
            (long long)a->dh, attn_act_enum(node_act(n)), e->mx ? 1 : 0, norm);
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

static bool emit_dq(QEmit *e, int dq) {
  Lower *L = e->L;
  const Ir *ir = L->ir;
  const AttnNode *a = e->a;
  const Node *n = a->n;
  if (!attn_elem_type(ir->tensors[dq].dtype)) return false;
  LaunchArg ws[5];
  ws[0] = quantized(e, a->q, false, NULL);
  ws[1] = quantized(e, a->k, false, NULL);
  ws[2] = quantized(e, a->v, false, NULL);
  ws[3] = quantized(e, a->dout, false, NULL);
  ws[4] = quantized(e, a->k, true, "ATTNQ_KV_ROWS");
  static const char *const names[] = {"qh", "kh", "vh", "doh", "kr"};
  bool pma = a->q_shared;
  char kernel[128], norm[48];
  attn_inv_norm_literal(norm, sizeof norm, a);
  snprintf(kernel, sizeof kernel, "%s_bwd_q", a->name);
  attn_kernel_comment(L, n, pma ? "bwd: dQ summed over the batch" : "bwd: dQ");
  KernelBuilder kb;
  const int dq_smem = max_int(tile_smem(a, 3), tc_smem(a, 4, 1, 2, 1));
  // PMA: the examples in `chunks` ranges, one block per (range, seed tile, head), each summing
  // its range into fp32 partials; a second kernel adds the ranges in order.
  int64_t seed_blocks = (a->q_fixed + 63) / 64 * a->heads;
  int64_t chunks = pma ? attn_pma_chunks(seed_blocks, ir->batch) : 1;
  LaunchArg partial = lower_workspace_arg(dq, ATTN_WS_PMA_PARTIAL, dq,
                                          sym_const(chunks * a->q_fixed * a->d * 4));
  if (pma) {
    kb_begin(&kb, L, e->node, kernel, sym_const(seed_blocks * chunks), 1, 64);
    kb_smem(&kb, dq_smem);
  } else {
    int tiles = attn_tile_list(L, a, e->node, 64, false);
    kb_begin_tiles(&kb, L, e->node, kernel, tiles, 64, dq_smem);
  }
  kb_tensor_out(&kb, "dq", dq);
  if (pma) kb_size(&kb, "batch", (SymSize){0, 1, 0, -1});
  copy_params(&kb, names, ws, 5);
  attn_offsets(&kb, a);
  if (!pma) kb_tiles(&kb, "tiles");
  if (chunks > 1) kb_workspace(&kb, "float", "partial", partial, true);
  StrBuf body = {0};
  if (chunks > 1) sb_printf(&body, "  enum { CHUNKS = %lld };\n", (long long)chunks);
  scale_params(e, &kb, &body, (const int[4]){a->q, a->k, a->v, a->dout});
  attn_rows_value(&body, a);
  sb_printf(&body, "  attnq_backward_q_any<%lld, %s, %d>(dq, %s, qh, kh, vh, doh, kr, rows, %s,\n"
                   "      %s, sc%s);\n",
            (long long)a->dh, attn_act_enum(node_act(n)), e->mx ? 1 : 0, pma ? "batch" : "0LL",
            norm, pma ? "(const int *)0" : "tiles", chunks > 1 ? ", partial, CHUNKS" : "");
  kb_end(&kb, body.data);
  sb_free(&body);
  if (chunks > 1) attn_pma_sum_chunks(L, e->node, a, dq, partial, chunks);
  return true;
}

static bool emit_dkv(QEmit *e, int dk, int dv) {
  Lower *L = e->L;
  const Ir *ir = L->ir;
  const AttnNode *a = e->a;
  const Node *n = a->n;
  const char *gt = attn_elem_type(ir->tensors[dk >= 0 ? dk : dv].dtype);
  if (!gt || (dk >= 0 && dv >= 0 && ir->tensors[dk].dtype != ir->tensors[dv].dtype)) return false;
  bool softmax = n->act == ACT_SOFTMAX;
  LaunchArg ws[6];
  ws[0] = quantized(e, a->q, false, NULL);
  ws[1] = quantized(e, a->k, false, NULL);
  ws[2] = quantized(e, a->v, false, NULL);
  ws[3] = quantized(e, a->dout, false, NULL);
  ws[4] = quantized(e, a->q, true, "ATTNQ_Q_ROWS");
  ws[5] = quantized(e, a->dout, true, "ATTNQ_OUT_ROWS");
  static const char *const names[] = {"qh", "kh", "vh", "doh", "qr", "dor"};
  const int quantized_of[4] = {a->q, a->k, a->v, a->dout};
  char kernel[128], norm[48];
  attn_inv_norm_literal(norm, sizeof norm, a);
  LaunchArg stats = workspace(e, a->dout, ATTN_WS_QUANT_STATS, attn_output_rows(a, a->heads * 16));
  KernelBuilder kb;
  StrBuf body = {0};
  if (softmax) {  // {m, 1/sum, dot} per output row and head
    int64_t max_q = attn_max_rows(ir, a, false);
    int64_t q_tiles = (max_q + 63) / 64;
    snprintf(kernel, sizeof kernel, "%s_bwd_stats", a->name);
    attn_kernel_comment(L, n, "bwd: softmax row statistics");
    kb_begin(&kb, L, e->node, kernel, (SymSize){0, q_tiles * a->heads, 0, -1}, 1, 64);
    kb_smem(&kb, max_int(tile_smem(a, 2), tc_smem(a, 4, 1, 2, 1)));
    kb_workspace(&kb, "float4", "stats", stats, true);
    copy_params(&kb, names, ws, 4);
    attn_offsets(&kb, a);
    scale_params(e, &kb, &body, quantized_of);
    attn_rows_value(&body, a);
    sb_printf(&body,
              "  attnq_backward_stats_any<%lld, %s>(stats, qh, kh, vh, doh, rows, %lld, sc);\n",
              (long long)a->dh, attn_act_enum(node_act(n)), (long long)q_tiles);
    kb_end(&kb, body.data);
    sb_free(&body);
  }
  snprintf(kernel, sizeof kernel, "%s_bwd_kv", a->name);
  attn_kernel_comment(L, n, dk >= 0 && dv >= 0 ? "bwd: dK, dV" : dk >= 0 ? "bwd: dK" : "bwd: dV");
  int tiles = attn_tile_list(L, a, e->node, 64, true);
  kb_begin_tiles(&kb, L, e->node, kernel, tiles, 64,
                 max_int(tile_smem(a, 4) + 64 * 12, tc_smem(a, 4, 2, 2, 2)));
  if (dk >= 0) kb_tensor_out(&kb, "dk", dk);
  if (dv >= 0) kb_tensor_out(&kb, "dv", dv);
  copy_params(&kb, names, ws, 6);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  if (softmax) kb_workspace(&kb, "float4", "stats", stats, false);
  scale_params(e, &kb, &body, quantized_of);
  char dk_arg[48], dv_arg[48];  // a missing gradient is a typed null pointer
  snprintf(dk_arg, sizeof dk_arg, dk >= 0 ? "dk" : "(%s *)0", gt);
  snprintf(dv_arg, sizeof dv_arg, dv >= 0 ? "dv" : "(%s *)0", gt);
  attn_rows_value(&body, a);
  sb_printf(&body,
            "  attnq_backward_kv_any<%lld, %s, %d>(%s, %s, qh, kh, vh, doh, qr, dor, rows, %s,\n"
            "      %s, tiles, sc);\n",
            (long long)a->dh, attn_act_enum(node_act(n)), e->mx ? 1 : 0, dk_arg, dv_arg, norm,
            softmax ? "stats" : "(const float4 *)0");
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

bool emit_attention_quantized(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  AttnNode a;
  QEmit e = {.L = L, .node = node, .a = &a, .mx = n->prec == DT_MXFP8};
  if (n->op == OP_ATTENTION) {
    if (!attn_node_shape(ir, n, -1, ir->tensors[n->out].name, &a)) return false;
    if (attn_tiny_kv_forward_applies(L, &a)) return emit_attention_tiny_kv_forward(L, node, &a);
    e.phase = "fwd";
    e.owner = n->out;
    return emit_forward(&e);
  }
  int who[3];
  attn_siblings(ir, n, who);
  int dout = n->ins[3];
  char stem[96];
  attn_backward_stem(ir, dout, stem, sizeof stem);
  if (!attn_node_shape(ir, n, dout, stem, &a) || !attn_elem_type(ir->tensors[dout].dtype))
    return false;
  e.owner = n->out;
  int grads[3];
  for (int g = 0; g < 3; g++) grads[g] = who[g] >= 0 ? ir->nodes[who[g]].out : -1;
  if (attn_tiny_kv_backward_applies(L, &a, grads)) {  // one group for the three, at the first
    int first = -1;
    for (int g = 0; g < 3; g++)
      if (who[g] >= 0 && (first < 0 || who[g] < first)) first = who[g];
    if (first != node) return true;
    return emit_attention_tiny_kv_backward(L, node, &a, grads[0], grads[1], grads[2]);
  }
  if (n->op == OP_ATTENTION_BWD_Q) {
    if (who[0] != node) return true;
    e.phase = "bwdq";
    return emit_dq(&e, n->out);
  }
  if (n->op == OP_ATTENTION_BWD_V && who[1] >= 0) return true;
  if (n->op == OP_ATTENTION_BWD_K && who[1] != node) return true;
  e.phase = "bwdkv";
  int dk = who[1] >= 0 ? ir->nodes[who[1]].out : -1, dv = who[2] >= 0 ? ir->nodes[who[2]].out : -1;
  return emit_dkv(&e, dk, dv);
}
