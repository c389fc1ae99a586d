// emit_attention_sm90.c: the forward of a bf16 or fp16 attention on sm_90a, through the
// Hopper kernel of kernels/attention_sm90.cuh (TMA, mbarrier, wgmma, warp specialization, a
// persistent CTA per SM). Per node it writes one extern "C" wrapper that fixes the head dim,
// activation, key tile, stages and element types, and takes the three tensor maps, the tile
// list dealt for the persistent grid and its length (docs/attention.md).
#include <stdio.h>
#include <string.h>

#include "attention_internal.h"
#include "attention_sm90_smem.h"
#include "kernels_embedded.h"
#include "target.h"

enum { SM90_THREADS = 384, SM90_TILE_Q = SM90_ATTN_TILE_Q, SM90_MAX_SMEM = SM90_ATTN_MAX_SMEM };

// attention_sm90.cuh's SM90_FORWARD_SMEM (attention_sm90_smem.h).
static int forward_smem(int64_t dh, int bn, int stages) {
  return (int)sm90_attn_forward_smem(dh, bn, stages);
}

// The key tile and pipeline depth: the schedule's tile_kv (16, 32, 64 or 128) and stages (2..4)
// when given, else 128 keys (the smallest of 16, 32, 64 over a set of at most 64 keys) and as
// many stages as shared memory holds (docs/schedules.md). Sema
// refuses any other value and any that does not fit (sema_schedule_attention.c); false here
// for one that gets past it (an IR built without sema, or for another target).
static bool sm90_shape(const AttnNode *a, int *bn, int *stages) {
  const Schedule *s = &a->n->sched;
  if (s->tile_kv != 0 && s->tile_kv != 16 && s->tile_kv != 32 && s->tile_kv != 64 &&
      s->tile_kv != 128)
    return false;
  if (s->stages != 0 && (s->stages < 2 || s->stages > 4)) return false;
  *bn = s->tile_kv ? s->tile_kv : sm90_attn_default_tile_kv(a->kv_jag < 0 ? a->kv_fixed : 0);
  *stages = s->stages;
  if (!*stages) *stages = sm90_attn_forward_stages(a->dh, *bn);
  return forward_smem(a->dh, *bn, *stages) <= SM90_MAX_SMEM;
}

// Whether the sm_90a kernel runs node a: the target, the types, the head dim and the shape
// decide, and then the schedule: tile_q = 64 (or any tile_m) asks for the mma.sync kernel,
// which the sm_90a one does not replace (docs/schedules.md). tile_kv and stages do not choose:
// a value the kernel cannot take makes emit_attention_forward_sm90 refuse the node.
bool attn_sm90_forward_applies(const Lower *L, const AttnNode *a) {
  const Target *t = target_find(L->p->target);
  if (!t || !t->wgmma || !t->tma) return false;
  if (a->q_shared || (a->dh != 64 && a->dh != 128)) return false;
  const Ir *ir = L->ir;
  DType q = ir->tensors[a->q].dtype, k = ir->tensors[a->k].dtype;
  if ((k != DT_BF16 && k != DT_FP16) || q != k || ir->tensors[a->v].dtype != k) return false;
  return (a->n->sched.tile_q == 0 || a->n->sched.tile_q == SM90_TILE_Q) && a->n->sched.tile_m == 0;
}

bool emit_attention_forward_sm90(Lower *L, int node, const AttnNode *a) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  int bn, stages;
  if (!sm90_shape(a, &bn, &stages)) return false;
  if (!strstr(L->src.data, "GEMC_ATTENTION_SM90_CUH")) sb_puts(&L->src, kernel_attention_sm90_cuh);
  char kernel[128];
  snprintf(kernel, sizeof kernel, "%s_fwd", a->name);
  attn_kernel_comment(L, n, "fwd");
  int tiles = attn_tile_list(L, a, node, SM90_TILE_Q, false);
  L->tiles[tiles].tile_kv = bn;
  L->tiles[tiles].persistent = true;
  KernelBuilder kb;
  kb_begin_persistent(&kb, L, node, kernel, tiles, SM90_THREADS, forward_smem(a->dh, bn, stages));
  kb_tensor_out(&kb, "out", n->out);
  kb_tensor_map(&kb, "q_map", a->q, SM90_TILE_Q);
  kb_tensor_map(&kb, "k_map", a->k, bn);
  kb_tensor_map(&kb, "v_map", a->v, bn);
  // O through TMA stores where it has q's 16-bit type (64-row boxes: one per warpgroup).
  bool o_tma = ir->tensors[n->out].dtype == ir->tensors[a->k].dtype;
  if (o_tma) kb_tensor_map(&kb, "o_map", n->out, 64);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  kb_tile_count(&kb, "tile_count");
  StrBuf body = {0};
  attn_rows_value(&body, a);
  sb_printf(&body, "  attn_forward_sm90<%lld, %s, %d, %d, %s>(out, q_map, k_map, v_map, %s, rows,\n"
                   "      tiles, (int)tile_count);\n",
            (long long)a->dh, attn_act_enum(node_act(n)), bn, stages,
            ir->tensors[a->k].dtype == DT_FP16 ? "true" : "false", o_tma ? "&o_map" : "nullptr");
  kb_end(&kb, body.data);
  sb_free(&body);
  return true;
}

// --- the backward ------------------------------------------------------------------------

// attention_sm90_backward.cuh's SM90_BACKWARD_SMEM (attention_sm90_smem.h).
static int backward_smem(int64_t dh, int stages) { return (int)sm90_attn_backward_smem(dh, stages); }

bool attn_sm90_backward_applies(const Lower *L, const AttnNode *a) {
  if (!attn_sm90_forward_applies(L, a)) return false;
  return a->dout >= 0 && L->ir->tensors[a->dout].dtype == L->ir->tensors[a->k].dtype &&
         backward_smem(a->dh, 2) <= SM90_MAX_SMEM;
}

// The atomic dQ takes bf16 only: at fp16 the backward scales each key row's dS
// (attention_sm90_backward.cuh, sm90_ds_scale_rows), which dQ's sum over the keys cannot undo.
bool attn_sm90_fused_dq_applies(const Lower *L, const AttnNode *a) {
  return a->n->sched.deterministic == 2 && a->dh == 128 &&
         L->ir->tensors[a->k].dtype == DT_BF16 && attn_sm90_backward_applies(L, a) &&
         sm90_attn_backward_dq_smem(a->dh, 2) <= SM90_MAX_SMEM;
}

// One backward kernel: KV (dK into g1, dV into g2; with dq_acc, dQ added into it too) or Q
// (dQ into g1).
static void backward_kernel(Lower *L, int node, const AttnNode *a, bool kv, int g1, int g2,
                            const char *grad_type, LaunchArg stats, const LaunchArg *dq_acc) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  if (!strstr(L->src.data, "GEMC_ATTENTION_SM90_BACKWARD_CUH"))
    sb_puts(&L->src, kernel_attention_sm90_backward_cuh);
  bool softmax = n->act == ACT_SOFTMAX;
  int stages = dq_acc ? sm90_attn_backward_dq_stages(a->dh) : sm90_attn_backward_stages(a->dh);
  int smem = dq_acc ? (int)sm90_attn_backward_dq_smem(a->dh, stages) : backward_smem(a->dh, stages);
  char kernel[128];
  snprintf(kernel, sizeof kernel, "%s_bwd_%s", a->name, dq_acc ? "qkv" : kv ? "kv" : "q");
  attn_kernel_comment(L, n, dq_acc ? "bwd: dK, dV, and dQ by float atomics" : kv ? "bwd: dK, dV" : "bwd: dQ");
  int tiles = attn_tile_list(L, a, node, SM90_ATTN_BWD_RESIDENT, kv);
  L->tiles[tiles].tile_kv = SM90_ATTN_BWD_STREAM;  // the streamed tiles the work estimate counts
  L->tiles[tiles].persistent = true;
  KernelBuilder kb;
  kb_begin_persistent(&kb, L, node, kernel, tiles, SM90_THREADS, smem);
  if (g1 >= 0) kb_tensor_out(&kb, kv ? "dk" : "dq", g1);
  if (g2 >= 0) kb_tensor_out(&kb, "dv", g2);
  if (dq_acc) kb_workspace(&kb, "float", "dq_acc", *dq_acc, true);
  int maps[4] = {kv ? a->k : a->q, kv ? a->v : a->dout, kv ? a->q : a->k, kv ? a->dout : a->v};
  const char *names[4] = {"res1_map", "res2_map", "str1_map", "str2_map"};
  for (int i = 0; i < 4; i++)
    kb_tensor_map(&kb, names[i], maps[i], i < 2 ? SM90_ATTN_BWD_RESIDENT : SM90_ATTN_BWD_STREAM);
  // The gradients through TMA stores where they have k's 16-bit type (64-row boxes: one per
  // warpgroup), out of the consumed resident tiles.
  DType kt = ir->tensors[a->k].dtype;
  bool g1_tma = g1 >= 0 && ir->tensors[g1].dtype == kt;
  bool g2_tma = kv && g2 >= 0 && ir->tensors[g2].dtype == kt;
  if (g1_tma) kb_tensor_map(&kb, "g1_map", g1, 64);
  if (g2_tma) kb_tensor_map(&kb, "g2_map", g2, 64);
  attn_offsets(&kb, a);
  kb_tiles(&kb, "tiles");
  kb_tile_count(&kb, "tile_count");
  if (softmax) kb_workspace(&kb, "float", "stats", stats, false);
  StrBuf body = {0};
  attn_rows_value(&body, a);
  char null_grad[40];
  snprintf(null_grad, sizeof null_grad, "(%s *)0", grad_type);
  sb_printf(&body,
            "  attn_backward_sm90<%lld, %s, %d, %s, %s, %s%s>(%s, %s, %s, %s,\n"
            "      res1_map, res2_map, str1_map, str2_map, rows, tiles, (int)tile_count, %s%s);\n",
            (long long)a->dh, attn_act_enum(node_act(n)), stages,
            ir->tensors[a->k].dtype == DT_FP16 ? "true" : "false", kv ? "true" : "false",
            a->simt ? "true" : "false", dq_acc ? ", true" : "",
            g1 >= 0 ? (kv ? "dk" : "dq") : null_grad, g2 >= 0 ? "dv" : null_grad,
            g1_tma ? "&g1_map" : "nullptr", g2_tma ? "&g2_map" : "nullptr",
            softmax ? "stats" : "(const float *)0", dq_acc ? ", dq_acc" : "");
  kb_end(&kb, body.data);
  sb_free(&body);
}

void emit_attention_backward_sm90(Lower *L, int node, const AttnNode *a, bool kv, int g1, int g2,
                                  const char *grad_type, LaunchArg stats) {
  backward_kernel(L, node, a, kv, g1, g2, grad_type, stats, NULL);
}

void emit_attention_backward_sm90_fused(Lower *L, int node, const AttnNode *a, int dq, int dk,
                                        int dv, const char *grad_type, LaunchArg stats) {
  const Ir *ir = L->ir;
  SymSize elems = sym_scale(tensor_rows(ir, dq), a->d);
  LaunchArg acc = lower_workspace_arg(dq, ATTN_WS_DQ_ACC, dq, sym_scale(elems, 4));
  lower_zero(L, node, acc, sym_scale(elems, 4));
  backward_kernel(L, node, a, true, dk, dv, grad_type, stats, &acc);
  char kernel[128];
  snprintf(kernel, sizeof kernel, "%s_bwd_q_cast", a->name);
  attn_kernel_comment(L, a->n, "bwd: dQ from its fp32 sums");
  KernelBuilder kb;
  kb_begin(&kb, L, node, kernel, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "dq", dq);
  kb_workspace(&kb, "float", "dq_acc", acc, false);
  kb_size(&kb, "elems", elems);
  char body[256];
  snprintf(body, sizeof body,
           "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (i < elems) %s(dq, i, dq_acc[i]);\n",
           dtype_store(ir->tensors[dq].dtype));
  kb_end(&kb, body);
}
