// attention_internal.h: what the attention emitters share (emit_attention.c for bf16, fp16
// and fp32 nodes; emit_attention_quantized.c for fp8 and mxfp8 ones), all defined in
// attention_shared.c: the facts of one node, the parts of each kernel's text and signature
// (through the KernelBuilder), and the tile lists.
// defines: AttnNode, attn_* helpers, the workspace slots of attention launches
#ifndef GEMC_ATTENTION_INTERNAL_H
#define GEMC_ATTENTION_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "kernel_builder.h"
#include "plan.h"
#include "strbuf.h"

// What every kernel of one attention needs to know, read off the forward node's operands.
typedef struct AttnNode {
  const Node *n;
  int q, k, v, dout;         // tensors (dout: -1 for the forward node)
  int64_t d, dh, heads;
  int q_jag, kv_jag;         // -1 when not jagged
  int64_t q_fixed, kv_fixed; // rows per example when not jagged
  bool q_shared;             // PMA seeds
  double inv_norm;
  const char *qt;            // element type of q: "bf16_t", "fp16_t" or "float"
  const char *kt;            // element type of k, v and dO
  bool simt;                 // fp32 or fp16 storage, or dh not a multiple of 16: SIMT kernels
  char name[96];             // C identifier stem for the kernels
} AttnNode;
// ARG_WORKSPACE slots. A workspace is named by (tensor, slot, owner = LaunchArg.i) and becomes
// one plan scratch per name (codegen/lower.c), alive from its first launch to its last.
enum {
  ATTN_WS_SOFTMAX_STATS = 0,  // float2 {lse2, D} per output row and head; tensor dO
  ATTN_WS_QUANT_STATS = 15,   // quantized softmax: float4 {m, 1/sum, dot, 0}; tensor dO
  ATTN_WS_HEADS_MX = 16,      // tensor t quantized mxfp8 along each head's dh (fp32 copy)
  ATTN_WS_ROWS_MX = 17,       // tensor t quantized mxfp8 down each example's rows
  ATTN_WS_FP8 = 18,           // tensor t quantized fp8 with one scale (fp32 copy)
  ATTN_WS_AMAX = 19,          // tensor t's finite amax, as the bits of a float
  ATTN_WS_PMA_PARTIAL = 20,   // PMA dQ: fp32 [chunks][seeds][d] partial sums; tensor dQ
  ATTN_WS_TINY_PARTIAL = 21,  // tiny key sets: fp32 [B][chunks][dK, dV][keys][d]; tensor dO
  ATTN_WS_DQ_ACC = 22,        // sm_90a atomic dQ: fp32 rows x d, zeroed, then cast; tensor dQ
};

// --- the node ---------------------------------------------------------------------------
const char *attn_elem_type(DType t);  // "bf16_t", "fp16_t", "float" or NULL
// attn_node_shape fills *a for any storage types (false when the head dim is not supported or
// a type has no attention element type); attn_node also wants v and dO in k's type.
bool attn_node_shape(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a);
bool attn_node(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a);
// The stem of a backward node's kernels: dO's name without its ".grad".
void attn_backward_stem(const Ir *ir, int dout, char *stem, size_t cap);
const char *attn_act_enum(Act act);
bool attn_same_inputs(const Node *x, const Node *y);
bool attn_is_backward(OpKind op);
// The backward nodes of n's attention (same four inputs): who[0] attention_bwd_q, who[1] _k,
// who[2] _v, the first of each, or -1.
void attn_siblings(const Ir *ir, const Node *n, int who[3]);
// Rows of the output (and of dO) per batch, as a SymSize times `per_row`.
SymSize attn_output_rows(const AttnNode *a, int64_t per_row);

// --- kernel text and signatures ---------------------------------------------------------
// "// FILE:LINE:COL gdpa SHAPE ACT ... (what)" above a kernel.
void attn_kernel_comment(Lower *L, const Node *n, const char *what);
// The offsets parameters (q_offsets, kv_offsets: those of the jagged sides).
void attn_offsets(KernelBuilder *kb, const AttnNode *a);
// "  AttnRows rows = {};" and one assignment per field, from the offsets parameters and the
// node's constants.
void attn_rows_value(StrBuf *body, const AttnNode *a);
// A tile list over query tiles of `rows` rows, or (kv_side) over key tiles, added to L; the
// _heads form with `heads` heads per row tile (1: one entry {b, i0, 0} for all of them).
int attn_tile_list(Lower *L, const AttnNode *a, int node, int rows, bool kv_side);
int attn_tile_list_heads(Lower *L, const AttnNode *a, int node, int rows, bool kv_side,
                         int heads);
// The most rows an example has on the query side (or kv_side): the jagged max or the fixed count.
int64_t attn_max_rows(const Ir *ir, const AttnNode *a, bool kv_side);
// a->inv_norm as a double literal for the kernel text ("1.0", "0.20000000000000001").
void attn_inv_norm_literal(char *buf, size_t cap, const AttnNode *a);

// PMA's dQ sums over the whole batch: the examples are cut into attn_pma_chunks ranges, one
// block per (range, seed tile, head) writing fp32 partial sums (workspace ATTN_WS_PMA_PARTIAL),
// and attn_pma_sum_chunks emits the kernel that adds the ranges in order into dQ (no atomics).
int64_t attn_pma_chunks(int64_t seed_blocks, int64_t batch);
void attn_pma_sum_chunks(Lower *L, int node, const AttnNode *a, int dq, LaunchArg partial,
                         int64_t chunks);

// The backward of a PMA in one pass over the keys (emit_attention_pma.c): the seed rows a tile
// takes (16, 32 or 64), or 0 when it does not apply (not a PMA, SIMT, more than 64 seeds, or
// a head too narrow for the tile's split); and its emitter: dK and dV (either may be -1), the
// chunks' partial dQ, then the ordered sum into dq.
int attn_pma_backward_qrows(const AttnNode *a);
void emit_attention_pma_backward(Lower *L, int node, const AttnNode *a, int dq, int dk, int dv,
                                 const char *grad_type, LaunchArg stats);

// --- the two emitters -------------------------------------------------------------------
// bf16, fp16 and fp32 nodes (emit_attention.c) and fp8, mxfp8 ones
// (emit_attention_quantized.c); the contract of emit_attention, which picks one.
bool emit_attention_plain(Lower *L, int node);
// The sm_90a forward (emit_attention_sm90.c): whether it takes node a (bf16 or fp16 q, k, v of
// head dim 64 or 128, not PMA, the target has wgmma and TMA, no tile_q but 128 and no tile_m),
// and its emitter (false for a tile_kv or stages it cannot take: docs/schedules.md).
bool attn_sm90_forward_applies(const Lower *L, const AttnNode *a);
bool emit_attention_forward_sm90(Lower *L, int node, const AttnNode *a);
// The sm_90a backward: dQ (kv false; g1 = dQ) or dK and dV (kv true; g1 = dK, g2 = dV, either
// -1 when not wanted), of element type grad_type, with the softmax statistics `stats`.
bool attn_sm90_backward_applies(const Lower *L, const AttnNode *a);
// Whether the backward takes dQ inside the dK/dV kernel: @schedule(deterministic = false) on
// an attention the sm_90a backward runs at head dim 128 (emit_attention_backward_sm90_fused).
bool attn_sm90_fused_dq_applies(const Lower *L, const AttnNode *a);
// dQ with dK and dV (either may be -1): zero an fp32 workspace, the dK/dV kernel adding each
// key tile's part of dQ into it with float atomics, and a cast into dq.
void emit_attention_backward_sm90_fused(Lower *L, int node, const AttnNode *a, int dq, int dk,
                                        int dv, const char *grad_type, LaunchArg stats);
void emit_attention_backward_sm90(Lower *L, int node, const AttnNode *a, bool kv, int g1, int g2,
                                  const char *grad_type, LaunchArg stats);
bool emit_attention_quantized(Lower *L, int node);
// mxfp8 over at most 32 keys and no mask (emit_attention_tiny_kv.c): whether its forward (or
// its backward, with gradient tensors grads = {dQ, dK, dV}, each -1 when not wanted) takes node
// a, and the emitters; the backward writes the three in one group of launches.
bool attn_tiny_kv_forward_applies(const Lower *L, const AttnNode *a);
bool attn_tiny_kv_backward_applies(const Lower *L, const AttnNode *a, const int grads[3]);
bool emit_attention_tiny_kv_forward(Lower *L, int node, const AttnNode *a);
bool emit_attention_tiny_kv_backward(Lower *L, int node, const AttnNode *a, int dq, int dk,
                                     int dv);

#endif
