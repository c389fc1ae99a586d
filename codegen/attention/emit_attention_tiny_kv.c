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
#include "target.h"

enum {
  TINY_MAX_KEYS = 32,        // one mxfp8 block of keys (ATTNT_MAX_KEYS)
  TINY_FWD_ROWS = 128,       // ATTNT_FWD_ROWS
  TINY_BWD_ROWS = 256,       // ATTNT_BWD_ROWS
  TINY_WARPS = 8,            // ATTNT_WARPS
  TINY_MAX_ACC = 64,         // dK and dV sums a lane keeps: keys x features per lane
  TINY_MAX_SMEM = 96 * 1024, // the backward's shared memory
};

// Head widths that are a multiple of 16 take the tensor-core forward (attnt_forward_tc). The
// backward stays on the SIMT kernel whatever the width: a tensor-core backward (commit adcef13)
// measured slower on both models' shapes, 0.296 -> 0.429 ms a step on gem_small (H200) and
// 0.530 -> 0.879 ms on gem_full (H100), and was removed (docs/perf.md, session 17).
static bool forward_on_tensor_cores(const AttnNode *a) { return a->dh % 16 == 0; }

static int64_t forward_smem(const AttnNode *a, int64_t keys) {
  if (!forward_on_tensor_cores(a)) return 4 * 2 * keys * a->d;
  int64_t padded = (keys + 15) / 16 * 16;  // AttntTc: kh [KP][D + 8] and vt [D][KP + 8], bf16
  return 2 * (padded * (a->d + 8) + a->d * (padded + 8));
}

static int64_t backward_smem(const AttnNode *a, int64_t keys) {
  return 4 * (5 * keys * a->d + TINY_WARPS * 32 * a->heads * keys * 2);
}

// The shape the lane layout needs (kernels/attention_tiny_kv.cuh, AttntLanes): the features of
// one lane, d/32, divide 32 and dh, and a head dim over 32 is whole blocks of 32. (Then the
// heads are a power of two dividing 32, and the blocks of 32 fall on lane bounds.)
static bool tiny_kv_shape(const Lower *L, const AttnNode *a) {
  const Node *n = a->n;
  const Ir *ir = L->ir;
  int64_t keys = attn_max_rows(ir, a, true), lane_features = a->d / 32;
  if (n->prec != DT_MXFP8 || a->q_shared || n->mask != MASK_NONE || n->window != 0) return false;
  if (keys < 1 || keys > TINY_MAX_KEYS || a->d % 32 != 0) return false;
  if (32 % lane_features != 0 || a->dh % lane_features != 0) return false;
  // The kernels read K, V (and dO) as one element type.
  const char *vt = attn_elem_type(ir->tensors[a->v].dtype);
  return vt && strcmp(vt, a->kt) == 0;
}

bool attn_tiny_kv_forward_applies(const Lower *L, const AttnNode *a) {
  return tiny_kv_shape(L, a) &&
         forward_smem(a, attn_max_rows(L->ir, a, true)) <= target_find(L->p->target)->max_smem_per_block;
}

bool attn_tiny_kv_backward_applies(const Lower *L, const AttnNode *a, const int grads[3]) {
  const Ir *ir = L->ir;
  int64_t keys = attn_max_rows(ir, a, true);
  // The SIMT kernel keeps keys x d/32 sums a lane.
  if (!tiny_kv_shape(L, a) || keys * (a->d / 32) > TINY_MAX_ACC ||
      backward_smem(a, keys) > TINY_MAX_SMEM)
    return false;
  const char *dt = attn_elem_type(ir->tensors[a->dout].dtype), *gt = NULL;
  if (!dt || strcmp(dt, a->kt) != 0) return false;
  for (int g = 0; g < 3; g++) {  // dQ, dK and dV of one element type
    if (grads[g] < 0) continue;
    const char *t = attn_elem_type(ir->tensors[grads[g]].dtype);
    if (!t || (gt && strcmp(gt, t) != 0)) return false;
    gt = t;
  }
  return gt != NULL;
}

static void paste_device_code(Lower *L) {
  if (!strstr(L->src.data, "GEMC_ATTENTION_TINY_KV_CUH")) sb_puts(&L->src, kernel_attention_tiny_kv_cuh);
}

bool emit_attention_tiny_kv_forward(Lower *L, int node, const AttnNode *a) {
  const Ir *ir = L->ir;
  const Node *n = a->n;
  if (!attn_elem_type(ir->tensors[n->out].dtype)) return false;
  paste_device_code(L);
  int64_t keys = attn_max_rows(ir, a, true);
  char kernel[128], norm[48], what[160];
  attn_inv_norm_literal(norm, sizeof norm, a);
  snprintf(kernel, sizeof kernel, "%s_tiny_fwd", a->name);
  snprintf(what, sizeof what, "fwd over at most %lld keys: operands quantized in registers, as the "
           "CPU executor quantizes them%s", (long long)keys, forward_on_tensor_cores(a) ? "; mma.sync" : "");
  attn_kernel_comment(L, n, what);
  KernelBuilder kb;
  kb_begin_tiles(&kb, L, node, kernel, attn_tile_list_heads(L, a, node, TINY_FWD_ROWS, false, 1),
                 TINY_WARPS * 32, (int)forward_smem(a, keys));
  kb_tensor_out(&kb, "out", n->out);
  kb_tensor_in(&kb, "q", a->q);
  kb_tensor_in(&kb, "k", a->k);
  kb_tensor_in(&kb, "v", a->v);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  StrBuf body = {0};
  attn_rows_value(&body, a);
  sb_printf(&body, "  attnt_forward%s<%lld, %lld, %lld, %s>(out, q, k, v, rows, %s, tiles);\n",
            forward_on_tensor_cores(a) ? "_tc" : "", (long long)a->d, (long long)a->dh, (long long)keys, attn_act_enum(node_act(n)), norm);
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

bool emit_attention_tiny_kv_backward(Lower *L, int node, const AttnNode *a, int dq, int dk,
                                     int dv) {
  const Ir *ir = L->ir;
  const Node *n = a->n;
  const char *gt = attn_elem_type(ir->tensors[dq >= 0 ? dq : dk >= 0 ? dk : dv].dtype);
  paste_device_code(L);
  int64_t keys = attn_max_rows(ir, a, true);
  int64_t max_q = attn_max_rows(ir, a, false);
  int64_t chunks = (max_q + TINY_BWD_ROWS - 1) / TINY_BWD_ROWS;
  if (chunks < 1) chunks = 1;
  LaunchArg partial = lower_workspace_arg(a->dout, ATTN_WS_TINY_PARTIAL, ir->nodes[node].out,
                                          (SymSize){0, chunks * 2 * keys * a->d * 4, 0, -1});
  char kernel[128], norm[48], what[200], dq_arg[48], dk_arg[48], dv_arg[48];
  attn_inv_norm_literal(norm, sizeof norm, a);
  snprintf(dq_arg, sizeof dq_arg, dq >= 0 ? "dq" : "(%s *)0", gt);
  snprintf(dk_arg, sizeof dk_arg, dk >= 0 ? "dk" : "(%s *)0", gt);
  snprintf(dv_arg, sizeof dv_arg, dv >= 0 ? "dv" : "(%s *)0", gt);

  snprintf(kernel, sizeof kernel, "%s_tiny_bwd", a->name);
  snprintf(what, sizeof what, "bwd over at most %lld keys: dQ, and the sums of dK and dV per "
           "chunk of %d query rows", (long long)keys, TINY_BWD_ROWS);
  attn_kernel_comment(L, n, what);
  KernelBuilder kb;
  kb_begin_tiles(&kb, L, node, kernel, attn_tile_list_heads(L, a, node, TINY_BWD_ROWS, false, 1),
                 TINY_WARPS * 32, (int)backward_smem(a, keys));
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

  snprintf(kernel, sizeof kernel, "%s_tiny_bwd_kv_sum", a->name);
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
