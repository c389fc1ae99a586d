// gdpa_case.c: the IR and the emitted kernels of one attention case (gdpa_case.h).
#include "gdpa_case.h"

#include <stdio.h>
#include <string.h>

static int add_tensor(Ir *ir, Arena *a, const char *prefix, const char *name, TensorKind kind,
                      Layout layout, int jag, int64_t set_k, int64_t width, DType dtype) {
  char full[96];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  Tensor t = {.name = arena_strdup(a, full), .kind = kind, .layout = layout, .jag = jag,
              .set_k = set_k, .width = width, .table = -1, .dtype = dtype, .producer = -1};
  if (layout == LAYOUT_FIXED) {
    t.fixed[0] = set_k, t.fixed[1] = width, t.nfixed = 2, t.set_k = 0, t.width = 0;
  }
  return ir_add_tensor(ir, &t);
}

void gdpa_case_name(const GdpaCase *c, char *buf, int cap) {
  int n = snprintf(buf, (size_t)cap, "%s %s", attn_shape_name(c->shape), act_name(c->act));
  if (c->causal) n += snprintf(buf + n, (size_t)(cap - n), " causal");
  if (c->window) n += snprintf(buf + n, (size_t)(cap - n), " w%lld", (long long)c->window);
  if (c->hstu_norm) n += snprintf(buf + n, (size_t)(cap - n), " hstu");
  if (c->q_set) n += snprintf(buf + n, (size_t)(cap - n), " q%lld", (long long)c->q_set);
  if (c->kv_set) n += snprintf(buf + n, (size_t)(cap - n), " kvset%lld", (long long)c->kv_set);
  if (c->storage) n += snprintf(buf + n, (size_t)(cap - n), " fp%d", c->storage);
  snprintf(buf + n, (size_t)(cap - n), " dh%lld h%lld", (long long)c->dh, (long long)c->heads);
}

bool gdpa_case_emit(const GdpaCase *c, const char *prefix, Arena *arena, StrBuf *src,
                    GdpaEmitted *e) {
  memset(e, 0, sizeof *e);
  Ir *ir = &e->ir;
  const DType T = c->storage == 32 ? DT_F32 : c->storage == 16 ? DT_FP16 : DT_BF16;
  ir_init(ir, arena);
  ir->source = "gdpa_case.gem";
  ir->batch = 1;
  int64_t d = c->heads * c->dh;
  Loc loc = {1, 1, 1, 1};
  int jq = ir_add_jagged(ir, "seq", c->max_q, loc);
  e->q_jag = e->kv_jag = -1;
  // q
  switch (c->shape) {
  case ATTN_SELF:
  case ATTN_CROSS:
    e->q = add_tensor(ir, arena, prefix, "q", TENSOR_INPUT, LAYOUT_JAGGED, jq, 0, d, T);
    e->q_jag = jq;
    break;
  case ATTN_PMA:
    e->q = add_tensor(ir, arena, prefix, "seeds", TENSOR_PARAM, LAYOUT_FIXED, -1, c->q_set, d,
                      DT_F32);
    break;
  case ATTN_PFFN:
    e->q = c->q_set ? add_tensor(ir, arena, prefix, "q", TENSOR_INPUT, LAYOUT_SET, -1, c->q_set, d,
                                 T)
                    : add_tensor(ir, arena, prefix, "q", TENSOR_INPUT, LAYOUT_DENSE, -1, 0, d,
                                 T);
    break;
  }
  // k, v
  if (c->shape == ATTN_CROSS && c->kv_set) {
    e->k = add_tensor(ir, arena, prefix, "k", TENSOR_INPUT, LAYOUT_SET, -1, c->kv_set, d, T);
    e->v = add_tensor(ir, arena, prefix, "v", TENSOR_INPUT, LAYOUT_SET, -1, c->kv_set, d, T);
  } else {
    int jk = c->shape == ATTN_CROSS ? ir_add_jagged(ir, "mem", c->max_kv, loc) : jq;
    if (c->shape == ATTN_PMA || c->shape == ATTN_PFFN) ir->jagged[jq].max_len = c->max_kv;
    e->kv_jag = jk;
    e->k = add_tensor(ir, arena, prefix, "k", TENSOR_INPUT, LAYOUT_JAGGED, jk, 0, d, T);
    e->v = add_tensor(ir, arena, prefix, "v", TENSOR_INPUT, LAYOUT_JAGGED, jk, 0, d, T);
  }
  const Tensor *q = &ir->tensors[e->q];
  Layout ol = c->shape == ATTN_PMA ? LAYOUT_SET : q->layout;
  int64_t ok = c->shape == ATTN_PMA ? c->q_set : q->set_k;
  e->out = add_tensor(ir, arena, prefix, "attn", TENSOR_VALUE, ol, q->jag, ok, d, T);
  Node n = {.op = OP_ATTENTION, .loc = loc, .out = e->out, .ins = {e->q, e->k, e->v}, .nins = 3,
            .prec = c->storage == 32 ? DT_F32 : c->storage == 16 ? DT_FP16 : DT_BF16, .act = c->act, .mask = c->causal ? MASK_CAUSAL : MASK_NONE,
            .shape = c->shape, .heads = c->heads, .window = c->window, .scale = c->scale,
            .hstu_norm = c->hstu_norm, .sched = {.tile_q = c->tile_q, .tile_m = c->tile_m}};
  int fwd = ir_add_node(ir, &n);
  ir_begin_backward(ir);
  e->dout = add_tensor(ir, arena, prefix, "attn.grad", TENSOR_INPUT, ol, q->jag, ok, d, T);
  const Tensor *qt = &ir->tensors[e->q];
  e->dq = c->shape == ATTN_PMA
              ? add_tensor(ir, arena, prefix, "seeds.grad", TENSOR_VALUE, LAYOUT_FIXED, -1,
                           c->q_set, d, DT_F32)
              : add_tensor(ir, arena, prefix, "q.grad", TENSOR_VALUE, qt->layout, qt->jag,
                           qt->set_k, d, T);
  const Tensor *kt = &ir->tensors[e->k];
  e->dk = add_tensor(ir, arena, prefix, "k.grad", TENSOR_VALUE, kt->layout, kt->jag, kt->set_k, d,
                     T);
  e->dv = add_tensor(ir, arena, prefix, "v.grad", TENSOR_VALUE, kt->layout, kt->jag, kt->set_k, d,
                     T);
  const OpKind ops[3] = {OP_ATTENTION_BWD_Q, OP_ATTENTION_BWD_K, OP_ATTENTION_BWD_V};
  const int outs[3] = {e->dq, e->dk, e->dv};
  int bwd[3];
  for (int i = 0; i < 3; i++) {
    Node b = n;
    b.op = ops[i];
    b.out = outs[i];
    b.ins[3] = e->dout;
    b.nins = 4;
    bwd[i] = ir_add_node(ir, &b);
  }
  Plan p = {.arena = arena, .ir = ir, .target = "sm_90a"};
  int nodes[4] = {fwd, bwd[0], bwd[1], bwd[2]};
  Lower L;
  lower_standalone_begin(&L, ir, &p, src);
  LowerMark start = lower_mark(&L);
  bool emitted = true;
  for (int i = 0; i < 4 && emitted; i++) {
    emitted = emit_attention(&L, nodes[i]);
    if (i == 0) e->nforward = L.nlaunches;
  }
  if (emitted && (L.nlaunches > GDPA_MAX_LAUNCHES || L.ntiles > 8)) emitted = false;
  if (!emitted) lower_rollback(&L, start);
  if (emitted) {
    memcpy(e->launches, L.launches, (size_t)L.nlaunches * sizeof *L.launches);
    e->nlaunches = L.nlaunches;
    memcpy(e->tiles, L.tiles, (size_t)L.ntiles * sizeof *L.tiles);
    e->ntiles = L.ntiles;
  } else {
    e->nforward = 0;
  }
  lower_standalone_end(&L, src);
  return emitted;
}
