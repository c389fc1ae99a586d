// attention_internal.h: what the attention emitters share (emit_attention.c for bf16, fp16
// and fp32 nodes; emit_attention_quantized.c for fp8 and mxfp8 ones): the facts of one node,
// the parts of each kernel's text, and the launch and tile-list builders.
// defines: AttnNode, attn_* helpers, the workspace slots of attention launches
#ifndef GEMC_ATTENTION_INTERNAL_H
#define GEMC_ATTENTION_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
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
  const char *qt;            // element type of q: "attn_bf16", "attn_half" or "float"
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
};

const char *attn_elem_type(DType t);  // "attn_bf16", "attn_half", "float" or NULL
// attn_node_shape fills *a for any storage types (false when the head dim is not supported or
// a type has no attention element type); attn_node also wants v and dO in k's type.
bool attn_node_shape(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a);
bool attn_node(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a);
const char *attn_act_enum(Act act);
int attn_simt_smem(const AttnNode *a);
// "// FILE:LINE:COL gdpa SHAPE ACT ... (what)" above a kernel.
void attn_kernel_comment(StrBuf *src, const Ir *ir, const Node *n, const char *what);
void attn_offsets_params(StrBuf *src, const AttnNode *a);
void attn_float_literal(char *buf, size_t cap, double x);
// "  const AttnRows rows = {...};" from the kernel's offsets parameters and the node.
void attn_rows_value(StrBuf *src, const AttnNode *a);
LaunchArg attn_tensor_arg(int t);
void attn_offsets_args(const AttnNode *a, Launch *l);
TileList attn_tile_list(const AttnNode *a, int node, int rows, bool kv_side);
Launch attn_tile_launch(const Plan *p, int node, const char *kernel, int threads, int smem,
                        int tiles, bool backward);
SymSize attn_output_rows(const AttnNode *a, int64_t per_row);
bool attn_same_inputs(const Node *x, const Node *y);
bool attn_is_backward(OpKind op);
// The backward nodes of n's attention (same four inputs): who[0] attention_bwd_q, who[1] _k,
// who[2] _v, the first of each, or -1.
void attn_siblings(const Ir *ir, const Node *n, int who[3]);

// fp8 and mxfp8 nodes (emit_attention_quantized.c); same contract as emit_attention.
bool emit_attention_quantized(const Plan *p, const Ir *ir, int node, StrBuf *src, Launch *out,
                              int *nout, TileList *tiles);

#endif
