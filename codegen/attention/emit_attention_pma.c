// emit_attention_pma.c: the backward of a bf16 PMA on the tensor cores in one pass over the
// keys (kernels/attention_pma_backward.cuh, docs/attention.md "PMA"): one launch writes dK, dV
// and the chunks' partial dQ of the seeds, and attn_pma_sum_chunks adds the chunks in order.
#include <stdio.h>

#include "attention_internal.h"

enum {
  PMA_BLOCKS_PER_SM = 4,    // blocks the chunks aim for (2 to 5 fit an SM at head dims 64-128)
  PMA_SMS = 132,            // an H200's SMs
  PMA_TILES_PER_CHUNK = 8,  // at least, at the batch's largest: the Q load and partial amortized
  PMA_SMEM_MAX = 227 * 1024,
};

// The chunks: about PMA_BLOCKS_PER_SM blocks (chunk, head) an SM, but no more chunks than an
// eighth of the key tiles the largest batch can have.
static int64_t pma_chunks(const Ir *ir, const AttnNode *a) {
  int64_t want = (PMA_BLOCKS_PER_SM * PMA_SMS + a->heads - 1) / a->heads;
  int64_t tiles = ir->batch * ((attn_max_rows(ir, a, true) + 63) / 64);
  int64_t most = (tiles + PMA_TILES_PER_CHUNK - 1) / PMA_TILES_PER_CHUNK;
  if (most < want) want = most;
  return want > 0 ? want : 1;
}

// The kernel's shared memory for QROWS seed rows (AttnPmaShape::SMEM).
static int64_t pma_smem(int64_t dh, int64_t qrows) {
  return 2 * (3 * qrows * dh + 4 * 64 * dh + qrows * 64);
}

int attn_pma_backward_qrows(const AttnNode *a) {
  if (!a->q_shared || a->simt || a->dh % 16 != 0 || a->q_fixed < 1) return 0;
  for (int qrows = 16; qrows <= 64; qrows *= 2) {
    int col_groups = 4 / (qrows / 16);
    // each warp's dQ columns (dh / col_groups) a whole number of 16-column mma blocks
    if (a->q_fixed <= qrows && a->dh % (16 * col_groups) == 0 &&
        pma_smem(a->dh, qrows) <= PMA_SMEM_MAX)
      return qrows;
  }
  return 0;
}

void emit_attention_pma_backward(Lower *L, int node, const AttnNode *a, int dq, int dk, int dv,
                                 const char *grad_type, LaunchArg stats) {
  int qrows = attn_pma_backward_qrows(a);
  int64_t chunks = pma_chunks(L->ir, a);
  LaunchArg partial = lower_workspace_arg(dq, ATTN_WS_PMA_PARTIAL, dq,
                                          sym_const(chunks * a->q_fixed * a->d * 4));
  char kernel[128];
  snprintf(kernel, sizeof kernel, "%s_bwd_pma", a->name);
  attn_kernel_comment(L, a->n, chunks > 1 ? "bwd: dK, dV and the chunks' dQ in one pass over the keys"
                                          : "bwd: dQ, dK and dV in one pass over the keys");
  KernelBuilder kb;
  kb_begin(&kb, L, node, kernel, sym_const(chunks * a->heads), 1, 128);
  kb_smem(&kb, (int)pma_smem(a->dh, qrows));
  if (chunks == 1) kb_tensor_out(&kb, "dq", dq);  // one chunk: its sums are dQ itself
  if (dk >= 0) kb_tensor_out(&kb, "dk", dk);
  if (dv >= 0) kb_tensor_out(&kb, "dv", dv);
  kb_size(&kb, "batch", (SymSize){0, 1, 0, -1});
  kb_tensor_in(&kb, "q", a->q);
  kb_tensor_in(&kb, "k", a->k);
  kb_tensor_in(&kb, "v", a->v);
  kb_tensor_in(&kb, "dout", a->dout);
  attn_offsets(&kb, a);
  bool softmax = a->n->act == ACT_SOFTMAX;
  if (softmax) kb_workspace(&kb, "float", "stats", stats, false);
  if (chunks > 1) kb_workspace(&kb, "float", "partial", partial, true);
  StrBuf body = {0};
  attn_rows_value(&body, a);
  char null_grad[32];
  snprintf(null_grad, sizeof null_grad, "(%s *)0", grad_type);
  sb_printf(&body,
            "  enum { CHUNKS = %lld };\n"
            "  attn_backward_pma<%lld, %s, %d>(%s, %s, %s, q, k, v, dout, rows, batch,\n"
            "      %s, CHUNKS);\n",
            (long long)chunks, (long long)a->dh, attn_act_enum(node_act(a->n)), qrows,
            chunks > 1 ? "partial" : "dq", dk >= 0 ? "dk" : null_grad,
            dv >= 0 ? "dv" : null_grad, softmax ? "stats" : "(const float *)0");
  kb_end(&kb, body.data);
  sb_free(&body);
  if (chunks > 1) attn_pma_sum_chunks(L, node, a, dq, partial, chunks);
}
