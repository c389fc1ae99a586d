// attention_shared.c: what both attention emitters use (attention_internal.h): the facts of
// one node, the comment, offsets parameters and AttnRows value of each kernel, the tile lists,
// and emit_attention itself, which pastes the device code once and picks the emitter:
// emit_attention.c (bf16, fp16, fp32) or emit_attention_quantized.c (fp8, mxfp8).
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "attention_internal.h"
#include "kernels_embedded.h"
#include "launch_cost.h"

// --- the device code --------------------------------------------------------------------

// The .cuh files, embedded by the Makefile (kernels_embedded.h), pasted in include order.
void attention_device_source(StrBuf *src) {
  if (!src->data || !strstr(src->data, "GEMC_PRELUDE_CUH")) sb_puts(src, kernel_prelude_cuh);
  sb_puts(src, kernel_attention_cuh);
  sb_puts(src, kernel_attention_forward_cuh);
  sb_puts(src, kernel_attention_backward_cuh);
  sb_puts(src, kernel_attention_pma_backward_cuh);
  sb_puts(src, kernel_attention_simt_cuh);
}

bool emit_attention(Lower *L, int node) {
  const Node *n = &L->ir->nodes[node];
  if (n->op != OP_ATTENTION && !attn_is_backward(n->op)) return false;
  LowerMark mark = lower_mark(L);
  if (!L->src.data || !strstr(L->src.data, "GEMC_ATTENTION_CUH")) attention_device_source(&L->src);
  bool quantized = n->prec == DT_FP8 || n->prec == DT_MXFP8;
  if (quantized && !strstr(L->src.data, "GEMC_ATTENTION_QUANTIZED_CUH")) {
    sb_puts(&L->src, kernel_attention_quantized_cuh);
    sb_puts(&L->src, kernel_attention_quantized_tc_cuh);
  }
  bool ok = quantized ? emit_attention_quantized(L, node) : emit_attention_plain(L, node);
  if (!ok) lower_rollback(L, mark);  // add nothing
  return ok;
}

// --- the node ---------------------------------------------------------------------------

const char *attn_elem_type(DType t) {
  if (t == DT_BF16) return "bf16_t";
  if (t == DT_F32) return "float";
  if (t == DT_FP16) return "fp16_t";
  if (t == DT_FP8 || t == DT_MXFP8) return "bf16_t";  // stored as bf16
  return NULL;
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
  a->simt = attn_simt(ir, n);  // launch_cost.h: the cost model reads the same rule
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
    int64_t len = a->kv_jag >= 0 ? ir->jagged[a->kv_jag].max_len : k->set_k;
    if (len > 0) a->inv_norm = 1.0 / (double)len;
  }
  ident(a->name, sizeof a->name, stem);
  return a->qt && a->kt;
}

bool attn_node(const Ir *ir, const Node *n, int dout, const char *stem, AttnNode *a) {
  if (!attn_node_shape(ir, n, dout, stem, a)) return false;
  const Tensor *k = &ir->tensors[n->ins[1]];
  if (ir->tensors[a->v].dtype != k->dtype) return false;
  return dout < 0 || ir->tensors[dout].dtype == k->dtype;
}

void attn_backward_stem(const Ir *ir, int dout, char *stem, size_t cap) {
  snprintf(stem, cap, "%s", ir->tensors[dout].name);
  char *dot_grad = strstr(stem, ".grad");
  if (dot_grad && dot_grad[5] == 0) *dot_grad = 0;
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

bool attn_same_inputs(const Node *x, const Node *y) {
  for (int i = 0; i < 4; i++)
    if (x->ins[i] != y->ins[i]) return false;
  return true;
}

bool attn_is_backward(OpKind op) {
  return op == OP_ATTENTION_BWD_Q || op == OP_ATTENTION_BWD_K || op == OP_ATTENTION_BWD_V;
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

SymSize attn_output_rows(const AttnNode *a, int64_t per_row) {
  if (a->q_jag >= 0) return (SymSize){0, 0, per_row, a->q_jag};
  return (SymSize){0, a->q_fixed * per_row, 0, -1};
}

// --- kernel text and signatures ---------------------------------------------------------

enum { COMMENT_WIDTH = 116 };

// The comment above each kernel: source line, op and attributes (lower_comment_at, with the
// op's .gem text under it when the IR has it), then what the kernel does of it, word-wrapped.
void attn_kernel_comment(Lower *L, const Node *n, const char *what) {
  StrBuf head = {0};
  sb_printf(&head, "gdpa %s %s", attn_shape_name(n->shape), act_name(node_act(n)));
  if (n->mask == MASK_CAUSAL) sb_puts(&head, " causal");
  if (n->window > 0) sb_printf(&head, " window %lld", (long long)n->window);
  if (n->hstu_norm && n->act != ACT_SOFTMAX) sb_puts(&head, " hstu_norm");
  bool quantized = n->prec == DT_FP8 || n->prec == DT_MXFP8;
  if (quantized) sb_printf(&head, " @%s", dtype_name(n->prec));
  bool fwd = strcmp(what, "fwd") == 0;
  sb_printf(&head, " (%s)", fwd ? "fwd" : "bwd");
  lower_comment_at(L, n->loc, head.data);
  sb_free(&head);
  if (fwd && !quantized) return;
  StrBuf text = {0};
  sb_printf(&text, "%s%s", what, quantized ? "; quantized as the CPU executor does" : "");
  const char *s = text.data;
  while (*s) {  // "// " lines of at most COMMENT_WIDTH characters, broken at spaces
    size_t n_left = strlen(s), cut = n_left;
    if (n_left > COMMENT_WIDTH - 3) {
      cut = COMMENT_WIDTH - 3;
      while (cut > 0 && s[cut] != ' ') cut--;
      if (cut == 0) cut = COMMENT_WIDTH - 3;
    }
    sb_printf(&L->src, "// %.*s\n", (int)cut, s);
    s += cut;
    while (*s == ' ') s++;
  }
  sb_free(&text);
}

void attn_offsets(KernelBuilder *kb, const AttnNode *a) {
  if (a->q_jag >= 0) kb_offsets(kb, "q_offsets", a->q_jag);
  if (a->kv_jag >= 0) kb_offsets(kb, "kv_offsets", a->kv_jag);
}

// A float constant as CUDA reads it: "0.125f", "1.0f".
static void float_literal(char *buf, size_t cap, double x) {
  snprintf(buf, cap, "%.9g", x);
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
  strncat(buf, "f", cap - strlen(buf) - 1);
}

void attn_rows_value(StrBuf *body, const AttnNode *a) {
  const Node *n = a->n;
  char scale[40], norm[40];
  float_literal(scale, sizeof scale, n->scale);
  float_literal(norm, sizeof norm, a->inv_norm);
  sb_puts(body, "  AttnRows rows = {};\n");
  sb_printf(body, "  rows.q_off = %s;\n", a->q_jag >= 0 ? "q_offsets" : "0");
  sb_printf(body, "  rows.kv_off = %s;\n", a->kv_jag >= 0 ? "kv_offsets" : "0");
  sb_printf(body, "  rows.q_fixed = %lld;\n", (long long)a->q_fixed);
  sb_printf(body, "  rows.kv_fixed = %lld;\n", (long long)a->kv_fixed);
  sb_printf(body, "  rows.q_shared = %d;\n", a->q_shared ? 1 : 0);
  sb_printf(body, "  rows.d = %lld;\n", (long long)a->d);
  sb_printf(body, "  rows.window = %lld;\n", (long long)n->window);
  sb_printf(body, "  rows.causal = %d;\n", n->mask == MASK_CAUSAL ? 1 : 0);
  sb_printf(body, "  rows.scale = %s;\n", scale);
  sb_printf(body, "  rows.inv_norm = %s;\n", norm);
}

int attn_tile_list_heads(Lower *L, const AttnNode *a, int node, int rows, bool kv_side,
                         int heads) {
  const Node *n = a->n;
  TileList t = {.node = node, .tile_q = rows, .tile_kv = 64, .heads = heads,
                .zigzag = n->sched.zigzag != 2};
  t.causal = n->mask == MASK_CAUSAL;
  t.window = n->window;
  if (!kv_side) {
    t.q_jag = a->q_jag, t.kv_jag = a->kv_jag, t.q_fixed = a->q_fixed, t.kv_fixed = a->kv_fixed;
  } else {  // rows are keys: the work per tile is the queries that see them
    t.q_jag = a->kv_jag, t.kv_jag = a->q_jag, t.q_fixed = a->kv_fixed, t.kv_fixed = a->q_fixed;
    t.key_side = true;
  }
  return lower_new_tiles(L, t);
}

int attn_tile_list(Lower *L, const AttnNode *a, int node, int rows, bool kv_side) {
  return attn_tile_list_heads(L, a, node, rows, kv_side, (int)a->heads);
}

int64_t attn_max_rows(const Ir *ir, const AttnNode *a, bool kv_side) {
  int jag = kv_side ? a->kv_jag : a->q_jag;
  return jag >= 0 ? ir->jagged[jag].max_len : kv_side ? a->kv_fixed : a->q_fixed;
}

void attn_inv_norm_literal(char *buf, size_t cap, const AttnNode *a) {
  snprintf(buf, cap, "%.17g", a->inv_norm);
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

// How many example ranges the PMA dQ kernel cuts the batch into: enough blocks for about four
// per SM of a 132-SM H200 with the seed tiles and heads, at most one range per example.
int64_t attn_pma_chunks(int64_t seed_blocks, int64_t batch) {
  int64_t want = (4 * 132 + seed_blocks - 1) / seed_blocks;
  return want < batch ? want : (batch > 0 ? batch : 1);
}

// dQ of a PMA: the chunks' fp32 partial sums added in chunk order, one thread per element.
void attn_pma_sum_chunks(Lower *L, int node, const AttnNode *a, int dq, LaunchArg partial,
                           int64_t chunks) {
  const Ir *ir = L->ir;
  char kernel[160];
  snprintf(kernel, sizeof kernel, "%s_bwd_q_sum", a->name);
  attn_kernel_comment(L, a->n, "bwd: dQ, the chunks added in order");
  int64_t elems = a->q_fixed * a->d;
  KernelBuilder kb;
  kb_begin(&kb, L, node, kernel, sym_const(elems), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "dq", dq);
  kb_workspace(&kb, "float", "partial", partial, false);
  char body[640];
  snprintf(body, sizeof body,
           "  enum { ELEMS = %lld, CHUNKS = %lld };\n"
           "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (i >= ELEMS) return;\n"
           "  float sum = 0.0f;\n"
           "  for (int c = 0; c < CHUNKS; c++) sum += partial[(i64)c * ELEMS + i];\n"
           "  %s(dq, i, sum);\n",
           (long long)elems, (long long)chunks, dtype_store(ir->tensors[dq].dtype));
  kb_end(&kb, body);
}
