// emit_attention_tiny_kv.c: mxfp8 attention over at most 32 keys per example and no mask
// (kernels/attention_tiny_kv.cuh; docs/attention.md, "Tiny key sets"). Its kernels read the
// bf16 operands once and quantize them in registers, where the general quantized path
// (emit_attention_quantized.c) writes fp32 copies of every operand first and gives dK and dV one
// thread per key. The numerics are the same: the CPU executor's.
//   forward   {name}_fwd          one CTA per 128 query rows of an example
//   backward  {name}_bwd          dQ, and per 256-row chunk the sums of dK and dV
//             {name}_bwd_kv_sum   the chunks of each example added in order, times the scale
#include <stdio.h>
#include <string.h>

#include "attention_internal.h"
#include "kernels_embedded.h"

enum {
  TINY_MAX_KEYS = 32,        // one mxfp8 block of keys (ATTNT_MAX_KEYS)
  TINY_FWD_ROWS = 128,       // ATTNT_FWD_ROWS
  TINY_BWD_ROWS = 256,       // ATTNT_BWD_ROWS
  TINY_WARPS = 8,            // ATTNT_WARPS
  TINY_MAX_ACC = 64,         // dK and dV sums a lane keeps: keys x features per lane
  TINY_MAX_SMEM = 96 * 1024, // the backward's shared memory
};

// The most keys any example has: the set's size, or the jagged side's max length.
static int64_t tiny_keys(const Ir *ir, const AttnNode *a) {
  return a->kv_jag >= 0 ? ir->jagged[a->kv_jag].max_len : a->kv_fixed;
}

static int64_t backward_smem(const AttnNode *a, int64_t keys) {
  return 4 * (5 * keys * a->d + TINY_WARPS * 32 * a->heads * keys * 2);
}

bool attn_tiny_kv_applies(const Lower *L, const AttnNode *a, bool backward) {
  const Node *n = a->n;
  int64_t keys = tiny_keys(L->ir, a), lane_features = a->d / 32;
  if (n->prec != DT_MXFP8 || a->q_shared || n->mask != MASK_NONE || n->window != 0) return false;
  if (keys < 1 || keys > TINY_MAX_KEYS || a->d % 32 != 0 || lane_features > 32) return false;
  if (32 % lane_features != 0 || a->dh % lane_features != 0) return false;  // whole lanes
  if (a->dh > 32 && a->dh % 32 != 0) return false;  // the 32-feature blocks on lane bounds
  if (!backward) return true;
  return keys * lane_features <= TINY_MAX_ACC && backward_smem(a, keys) <= TINY_MAX_SMEM;
}

static void paste_device_code(Lower *L) {
  if (!strstr(L->src.data, "GEMC_ATTENTION_TINY_KV_CUH")) sb_puts(&L->src, kernel_attention_tiny_kv_cuh);
}

static void norm_literal(char *buf, size_t cap, const AttnNode *a) {
  snprintf(buf, cap, "%.17g", a->inv_norm);
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

// Query tiles of `rows` rows over every head at once (entries {b, i0, 0}).
static int row_tiles(Lower *L, const AttnNode *a, int node, int rows) {
  TileList t = {.node = node, .tile_q = rows, .tile_kv = 64, .heads = 1,
                .zigzag = a->n->sched.zigzag != 2, .q_jag = a->q_jag, .kv_jag = a->kv_jag,
                .q_fixed = a->q_fixed, .kv_fixed = a->kv_fixed};
  return lower_new_tiles(L, t);
}

bool emit_attention_tiny_kv_forward(Lower *L, int node, const AttnNode *a) {
  const Ir *ir = L->ir;
  const Node *n = a->n;
  if (!attn_elem_type(ir->tensors[n->out].dtype)) return false;
  paste_device_code(L);
  int64_t keys = tiny_keys(ir, a);
  char kernel[128], norm[48], what[160];
  norm_literal(norm, sizeof norm, a);
  snprintf(kernel, sizeof kernel, "%s_fwd", a->name);
  snprintf(what, sizeof what, "fwd over at most %lld keys: operands quantized in registers, as the "
           "CPU executor quantizes them", (long long)keys);
  attn_kernel_comment(L, n, what);
  KernelBuilder kb;
  kb_begin_tiles(&kb, L, node, kernel, row_tiles(L, a, node, TINY_FWD_ROWS), TINY_WARPS * 32,
                 (int)(4 * 2 * keys * a->d));
  kb_tensor_out(&kb, "out", n->out);
  kb_tensor_in(&kb, "q", a->q);
  kb_tensor_in(&kb, "k", a->k);
  kb_tensor_in(&kb, "v", a->v);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  StrBuf body = {0};
  attn_rows_value(&body, a);
  sb_printf(&body, "  attnt_forward<%lld, %lld, %lld, %s>(out, q, k, v, rows, %s, tiles);\n",
            (long long)a->d, (long long)a->dh, (long long)keys, attn_act_enum(node_act(n)), norm);
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

bool emit_attention_tiny_kv_backward(Lower *L, int node, const AttnNode *a, int dq, int dk,
                                     int dv) {
  const Ir *ir = L->ir;
  const Node *n = a->n;
  const int grads[3] = {dq, dk, dv};
  const char *gt = NULL;
  for (int g = 0; g < 3; g++) {
    if (grads[g] < 0) continue;
    const char *t = attn_elem_type(ir->tensors[grads[g]].dtype);
    if (!t || (gt && strcmp(gt, t) != 0)) return false;
    gt = t;
  }
  if (!gt) return true;  // nothing wanted
  paste_device_code(L);
  int64_t keys = tiny_keys(ir, a);
  int64_t max_q = a->q_jag >= 0 ? ir->jagged[a->q_jag].max_len : a->q_fixed;
  int64_t chunks = (max_q + TINY_BWD_ROWS - 1) / TINY_BWD_ROWS;
  if (chunks < 1) chunks = 1;
  LaunchArg partial = lower_workspace_arg(a->dout, ATTN_WS_TINY_PARTIAL, ir->nodes[node].out,
                                          (SymSize){0, chunks * 2 * keys * a->d * 4, 0, -1});
  char kernel[128], norm[48], what[200], dq_arg[48], dk_arg[48], dv_arg[48];
  norm_literal(norm, sizeof norm, a);
  snprintf(dq_arg, sizeof dq_arg, dq >= 0 ? "dq" : "(%s *)0", gt);
  snprintf(dk_arg, sizeof dk_arg, dk >= 0 ? "dk" : "(%s *)0", gt);
  snprintf(dv_arg, sizeof dv_arg, dv >= 0 ? "dv" : "(%s *)0", gt);

  snprintf(kernel, sizeof kernel, "%s_bwd", a->name);
  snprintf(what, sizeof what, "bwd over at most %lld keys: dQ, and the sums of dK and dV per "
           "chunk of %d query rows", (long long)keys, TINY_BWD_ROWS);
  attn_kernel_comment(L, n, what);
  KernelBuilder kb;
  kb_begin_tiles(&kb, L, node, kernel, row_tiles(L, a, node, TINY_BWD_ROWS), TINY_WARPS * 32,
                 (int)backward_smem(a, keys));
  if (dq >= 0) kb_tensor_out(&kb, "dq", dq);
  kb_tensor_in(&kb, "q", a->q);
  kb_tensor_in(&kb, "k", a->k);
  kb_tensor_in(&kb, "v", a->v);
  kb_tensor_in(&kb, "dout", a->dout);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  kb_workspace(&kb, "float", "partial", partial, true);
  StrBuf body = {0};
  attn_rows_value(&body, a);
  sb_printf(&body,
            "  attnt_backward<%lld, %lld, %lld, %s>(%s, q, k, v, dout, rows, %s, tiles, %lld,\n"
            "      partial);\n",
            (long long)a->d, (long long)a->dh, (long long)keys, attn_act_enum(node_act(n)),
            dq_arg, norm, (long long)chunks);
  kb_end(&kb, body.data);
  sb_free(&body);
  if (dk < 0 && dv < 0) return true;

  snprintf(kernel, sizeof kernel, "%s_bwd_kv_sum", a->name);
  attn_kernel_comment(L, n, "bwd: dK and dV, the chunks of each example summed in order");
  kb_begin(&kb, L, node, kernel, (SymSize){0, 2 * keys * a->d, 0, -1}, 256, 256);
  if (dk >= 0) kb_tensor_out(&kb, "dk", dk);
  if (dv >= 0) kb_tensor_out(&kb, "dv", dv);
  kb_workspace(&kb, "float", "partial", partial, false);
  kb_size(&kb, "batch", (SymSize){0, 1, 0, -1});
  attn_offsets(&kb, a);
  StrBuf sum = {0};
  attn_rows_value(&sum, a);
  sb_printf(&sum, "  attnt_backward_sum<%lld, %lld>(%s, %s, partial, rows, batch, %lld);\n",
            (long long)a->d, (long long)keys, dk_arg, dv_arg, (long long)chunks);
  kb_end(&kb, sum.data);
  sb_free(&sum);
  return true;
}
