// emit_attention.c: lowers an attention node and its backward ops at bf16, fp16 and fp32 to
// CUDA (docs/attention.md). The kernel bodies are templates in kernels/attention*.cuh,
// embedded into gemc at build time; per node this file writes one extern "C" wrapper per kernel
// that fixes the template arguments (head dim, activation, warps, element types) and the
// node's constants (d, the jagged or fixed row counts, mask, window, scale, hstu norm), and
// builds its signature and its launch together (KernelBuilder).
#include <stdio.h>
#include <string.h>

#include "attention_internal.h"

// The mma.sync forward's shape (docs/schedules.md): query rows per block (schedule hint tile_q:
// 64 or 128) and per warp (tile_m: 16 or 32); keys stream through in ATTN_TILE_KV = 64 tiles,
// double buffered, so tile_kv takes only 64 and stages only 2. By default, for jagged queries,
// 4 warps of 32 rows: every K and V fragment read from shared memory then feeds two MMAs.
// Short queries take 4 warps of 16, and at most 32 fixed rows 2 warps of 16. Sema refuses other values (sema_schedule_attention.c);
// false here for one that gets past it.
static bool forward_shape(const AttnNode *a, int *warps, int *mw) {
  const Schedule *s = &a->n->sched;
  if ((s->tile_q && s->tile_q != 64 && s->tile_q != 128) ||
      (s->tile_m && s->tile_m != 16 && s->tile_m != 32) || (s->tile_kv && s->tile_kv != 64) ||
      (s->stages && s->stages != 2))
    return false;
  // A fixed set of at most 32 query rows (PMA seeds, pFFN's few queries) takes 2 warps of 16:
  // a 64-row block would leave half its MMAs on rows that do not exist.
  bool few_rows = a->q_jag < 0 && a->q_fixed > 0 && a->q_fixed <= 32;
  int rows = s->tile_q ? s->tile_q : a->q_jag >= 0 ? 128 : few_rows ? 32 : 64;
  int warp_rows = s->tile_m ? s->tile_m : a->q_jag >= 0 ? 32 : 16;
  *mw = warp_rows / 16;
  *warps = rows / warp_rows;
  return true;
}

// The SIMT forward: 64 query rows a block (one thread each), 64 keys at a time, one stage;
// it takes those values of tile_q, tile_kv and stages, and no tile_m.
static bool simt_shape_ok(const AttnNode *a) {
  const Schedule *s = &a->n->sched;
  return (!s->tile_q || s->tile_q == 64) && (!s->tile_kv || s->tile_kv == 64) && !s->tile_m &&
         (!s->stages || s->stages == 1);
}

static int forward_smem_rows(const AttnNode *a, int rows) {
  return (int)((rows + 4 * 64) * a->dh * 2);
}

static int backward_smem(const AttnNode *a) { return (int)(6 * 64 * a->dh * 2); }

// The SIMT kernels stage two 64-row fp32 tiles (and, for dK/dV, 64 statistics).
static int simt_smem(const AttnNode *a) { return (int)(2 * 64 * a->dh * 4 + 64 * 8); }
static int bwd_threads(const AttnNode *a) { return a->simt ? 64 : 128; }

// The q, k, v (and dO) parameters every kernel of the node reads.
static void qkv_params(KernelBuilder *kb, const AttnNode *a, bool with_dout) {
  kb_tensor_in(kb, "q", a->q);
  kb_tensor_in(kb, "k", a->k);
  kb_tensor_in(kb, "v", a->v);
  if (with_dout) kb_tensor_in(kb, "dout", a->dout);
}

static bool emit_forward(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  AttnNode a;
  if (!attn_node(ir, n, -1, ir->tensors[n->out].name, &a)) return false;
  if (!attn_elem_type(ir->tensors[n->out].dtype)) return false;
  if (attn_sm90_forward_applies(L, &a)) return emit_attention_forward_sm90(L, node, &a);
  int warps, mw;
  if (a.simt) {
    if (!simt_shape_ok(&a)) return false;
    warps = 2, mw = 2;  // 64 threads, one per query row
  } else if (!forward_shape(&a, &warps, &mw)) {
    return false;
  }
  char kernel[128];
  snprintf(kernel, sizeof kernel, "%s_fwd", a.name);
  attn_kernel_comment(L, n, "fwd");
  int tiles = attn_tile_list(L, &a, node, 16 * warps * mw, false);  // SIMT: 64 rows
  KernelBuilder kb;
  kb_begin_tiles(&kb, L, node, kernel, tiles, 32 * warps,
                 a.simt ? simt_smem(&a) : forward_smem_rows(&a, 16 * warps * mw));
  kb_tensor_out(&kb, "out", n->out);
  qkv_params(&kb, &a, false);
  attn_offsets(&kb, &a);
  kb_tiles(&kb, "tiles");
  StrBuf body = {0};
  attn_rows_value(&body, &a);
  if (a.simt)
    sb_printf(&body, "  attn_forward_simt<%lld, %s>(out, q, k, v, rows, tiles, (float *)0,\n"
                     "      (const %s *)0);\n",
              (long long)a.dh, attn_act_enum(node_act(n)), a.kt);
  else
    sb_printf(&body, "  attn_forward<%lld, %s, %d, %d>(out, q, k, v, rows, tiles, (float *)0,\n"
                     "      (const bf16_t *)0);\n",
              (long long)a.dh, attn_act_enum(node_act(n)), warps, mw);
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

// The element type of the dK and dV outputs that exist (siblings who[1], who[2]), or NULL when
// neither does or they differ.
static const char *fused_kv_type(const Ir *ir, const int *who) {
  const char *t = NULL;
  for (int s = 1; s < 3; s++) {
    if (who[s] < 0) continue;
    const char *e = attn_elem_type(ir->tensors[ir->nodes[who[s]].out].dtype);
    if (!e || (t && strcmp(t, e) != 0)) return NULL;
    t = e;
  }
  return t;
}

// The backward of one attention, split by op so that each call needs one tile list:
//   attention_bwd_q: [softmax row statistics], dQ (PMA: summed over the examples in-kernel)
//   attention_bwd_k: dK, and dV too when an attention_bwd_v sibling exists
//   attention_bwd_v: nothing when attention_bwd_k exists, else dV alone
// The statistics live in a workspace named by (dO tensor, slot 0) that the dK/dV launch
// reads as well (docs/attention.md).
static bool emit_backward(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  int who[3];  // q, k, v
  attn_siblings(ir, n, who);
  int all[3] = {who[0], who[1], who[2]};
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
  attn_backward_stem(ir, dout, stem, sizeof stem);
  AttnNode a;
  if (!attn_node(ir, n, dout, stem, &a)) return false;
  bool softmax = n->act == ACT_SOFTMAX;
  const char *act = attn_act_enum(node_act(n));
  long long dh = (long long)a.dh;
  const char *simt = a.simt ? "_simt" : "";
  char kernel[128];
  LaunchArg stats = lower_workspace_arg(dout, ATTN_WS_SOFTMAX_STATS, 0,
                                        attn_output_rows(&a, a.heads * 8));
  KernelBuilder kb;
  StrBuf body = {0};
  bool pma = a.q_shared;  // dQ: one block per (seed tile, head), summing the examples in order
  bool sm90 = attn_sm90_backward_applies(L, &a);  // dQ on the sm_90a kernel, with its own list
  // @schedule(deterministic = false): dQ inside the dK/dV kernel, all emitted at dQ's node.
  const char *kv_type = fused_kv_type(ir, all);
  bool fused = all[0] >= 0 && kv_type && !pma && attn_sm90_fused_dq_applies(L, &a);
  if (fused && who[0] < 0) return true;  // the dK/dV node: its launches came with dQ's
  // A PMA with dQ and dK or dV: one pass over the keys for all of them, at dQ's node.
  bool pma_one_pass = pma && all[0] >= 0 && kv_type && attn_pma_backward_qrows(&a) > 0;
  if (pma_one_pass && who[0] < 0) return true;
  int q_tiles = -1;  // the 64-row list of the mma.sync dQ and of the statistics (PMA: theirs)
  if (who[0] >= 0 && (softmax || (!pma && !sm90))) q_tiles = attn_tile_list(L, &a, node, 64, false);

  if (softmax && who[0] >= 0) {  // lse2 and D per output row and head, over dQ's tiles
    snprintf(kernel, sizeof kernel, "%s_bwd_stats", a.name);
    attn_kernel_comment(L, n, "bwd: softmax row statistics");
    kb_begin_tiles(&kb, L, node, kernel, q_tiles, bwd_threads(&a),
                   a.simt ? simt_smem(&a) : forward_smem_rows(&a, 64));
    kb_workspace(&kb, "float", "stats", stats, true);
    qkv_params(&kb, &a, true);
    attn_offsets(&kb, &a);
    kb_tiles(&kb, "tiles");
    attn_rows_value(&body, &a);
    sb_printf(&body,
              "  attn_forward%s<%lld, %s%s>((bf16_t *)0, q, k, v, rows, tiles, stats, dout);\n",
              simt, dh, act, a.simt ? "" : ", 4, 1");
    kb_end(&kb, body.data);
    sb_free(&body);
  }

  if (fused) {
    emit_attention_backward_sm90_fused(L, node, &a, ir->nodes[all[0]].out,
                                       all[1] >= 0 ? ir->nodes[all[1]].out : -1,
                                       all[2] >= 0 ? ir->nodes[all[2]].out : -1, kv_type, stats);
    return true;
  }
  if (pma_one_pass) {
    emit_attention_pma_backward(L, node, &a, ir->nodes[all[0]].out,
                                all[1] >= 0 ? ir->nodes[all[1]].out : -1,
                                all[2] >= 0 ? ir->nodes[all[2]].out : -1, kv_type, stats);
    return true;
  }
  if (who[0] >= 0 && sm90 && !pma) {  // dQ on the sm_90a kernel
    emit_attention_backward_sm90(L, node, &a, false, ir->nodes[who[0]].out, -1, gt[0], stats);
  } else if (who[0] >= 0) {  // dQ
    int dq = ir->nodes[who[0]].out;
    snprintf(kernel, sizeof kernel, "%s_bwd_q", a.name);
    attn_kernel_comment(L, n, pma ? "bwd: dQ summed over the batch" : "bwd: dQ");
    int smem = a.simt ? simt_smem(&a) : backward_smem(&a);
    // PMA on tensor cores: the examples in `chunks` ranges, one block per (chunk, seed tile,
    // head), each summing its range into fp32 partials; a second kernel adds the chunks.
    int64_t seed_blocks = (a.q_fixed + 63) / 64 * a.heads;
    int64_t chunks = pma && !a.simt ? attn_pma_chunks(seed_blocks, ir->batch) : 1;
    LaunchArg partial = lower_workspace_arg(dq, ATTN_WS_PMA_PARTIAL, dq,
                                            sym_const(chunks * a.q_fixed * a.d * 4));
    if (pma) {
      kb_begin(&kb, L, node, kernel, sym_const(seed_blocks * chunks), 1, bwd_threads(&a));
      kb_smem(&kb, smem);
    } else {
      kb_begin_tiles(&kb, L, node, kernel, q_tiles, bwd_threads(&a), smem);
    }
    kb_tensor_out(&kb, "dq", dq);
    if (pma) kb_size(&kb, "batch", (SymSize){0, 1, 0, -1});
    qkv_params(&kb, &a, true);
    attn_offsets(&kb, &a);
    if (!pma) kb_tiles(&kb, "tiles");
    if (softmax) kb_workspace(&kb, "float", "stats", stats, false);
    if (chunks > 1) kb_workspace(&kb, "float", "partial", partial, true);
    attn_rows_value(&body, &a);
    sb_printf(&body, "  attn_backward_q%s<%lld, %s>(dq, %s, q, k, v, dout, rows, %s, %s%s);\n",
              simt, dh, act, pma ? "batch" : "0LL", pma ? "(const int *)0" : "tiles",
              softmax ? "stats" : "(const float *)0",
              chunks > 1 ? ",\n      partial, CHUNKS" : "");
    if (chunks > 1) {
      StrBuf full = {0};
      sb_printf(&full, "  enum { CHUNKS = %lld };\n%s", (long long)chunks, body.data);
      sb_free(&body);
      body = full;
    }
    kb_end(&kb, body.data);
    sb_free(&body);
    if (chunks > 1) attn_pma_sum_chunks(L, node, &a, dq, partial, chunks);
  }

  if ((who[1] >= 0 || who[2] >= 0) && sm90) {  // dK and dV on the sm_90a kernel
    emit_attention_backward_sm90(L, node, &a, true, who[1] >= 0 ? ir->nodes[who[1]].out : -1,
                                 who[2] >= 0 ? ir->nodes[who[2]].out : -1,
                                 gt[1] ? gt[1] : gt[2], stats);
  } else if (who[1] >= 0 || who[2] >= 0) {  // dK and dV
    const char *t = gt[1] ? gt[1] : gt[2];
    snprintf(kernel, sizeof kernel, "%s_bwd_kv", a.name);
    attn_kernel_comment(L, n, "bwd: dK, dV");
    int tiles = attn_tile_list(L, &a, node, 64, true);
    kb_begin_tiles(&kb, L, node, kernel, tiles, bwd_threads(&a),
                   a.simt ? simt_smem(&a) : backward_smem(&a));
    if (who[1] >= 0) kb_tensor_out(&kb, "dk", ir->nodes[who[1]].out);
    if (who[2] >= 0) kb_tensor_out(&kb, "dv", ir->nodes[who[2]].out);
    qkv_params(&kb, &a, true);
    attn_offsets(&kb, &a);
    kb_tiles(&kb, "tiles");
    if (softmax) kb_workspace(&kb, "float", "stats", stats, false);
    char null_grad[32];
    snprintf(null_grad, sizeof null_grad, "(%s *)0", t);
    attn_rows_value(&body, &a);
    sb_printf(&body, "  attn_backward_kv%s<%lld, %s>(%s, %s, q, k, v, dout, rows, tiles, %s);\n",
              simt, dh, act, who[1] >= 0 ? "dk" : null_grad, who[2] >= 0 ? "dv" : null_grad,
              softmax ? "stats" : "(const float *)0");
    kb_end(&kb, body.data);
    sb_free(&body);
  }
  return true;
}

bool emit_attention_plain(Lower *L, int node) {
  return L->ir->nodes[node].op == OP_ATTENTION ? emit_forward(L, node) : emit_backward(L, node);
}
