// cpu_attention_real.h: attention, forward and backward, for all four shapes, written over
// `real` (docs/autodiff.md, "Attention, exactly"). For example b and head h:
//
//   S = scale · Q Kᵀ
//   P = act(S) ⊙ M  (÷ L with hstu_norm)   or   P = softmax(S) over the unmasked entries
//   O = P V
//   backward: dP = dO Vᵀ; dS = dP ⊙ act′(S) ⊙ M (÷ L)  or  dS = P ⊙ (dP − rowsum(dP ⊙ P));
//             dQ = scale · dS K,  dK = scale · dSᵀ Q,  dV = Pᵀ dO
//
// Work goes one (example, head) at a time, in tiles of ATTN_TILE query rows: a tile needs only
// the keys its rows can see (the band of a causal or windowed mask), so no more than one
// tile × band block of S and P is ever held, and masked-out blocks cost nothing. A row whose
// keys are all masked gives P = 0 (never NaN). Empty sequences have no rows.
//
// Precision (fp32 mode): fp8/mxfp8 quantize both operands of every matmul, the tensor operands
// (Q, K, V, dO) once per node, the computed ones (P, dS) per tile, each along that matmul's
// reduction (cpu_common_real.h). At fp8 P and dS get one scale per vector along the reduction,
// and a backward tile then spans all query rows so that a column of dS or P is whole.

enum { ATTN_TILE = 64, ATTN_KEY_ALIGN = 32 };

// Where the rows of one attention node live, and its attributes.
typedef struct AttnPlan {
  const Node *n;
  int q, k, v;            // tensors
  int64_t d, dh, heads;
  Act act;
  bool softmax;
  double inv_norm;        // 1 / L with hstu_norm (pointwise acts), else 1
  const int64_t *q_off;   // jagged q: offsets; NULL otherwise
  int64_t q_per_example;  // set q, pma seeds: k; dense q: 1
  bool q_shared;          // pma: every example reads the same seeds rows
  const int64_t *kv_off;  // jagged kv: offsets; NULL for a set
  int64_t kv_per_example; // set kv: k
  int64_t window;
  bool causal;
} AttnPlan;

static AttnPlan K(attn_plan)(const CpuExec *x, const Node *n) {
  const Ir *ir = x->ir;
  const Tensor *q = &ir->tensors[n->ins[0]], *k = &ir->tensors[n->ins[1]];
  AttnPlan p = {.n = n, .q = n->ins[0], .k = n->ins[1], .v = n->ins[2]};
  p.d = k->width;
  p.heads = n->heads;
  p.dh = p.d / p.heads;
  p.act = cpu_node_act(n);
  p.softmax = p.act == ACT_SOFTMAX;
  p.inv_norm = 1;
  if (n->hstu_norm && !p.softmax) {
    int64_t L = k->layout == LAYOUT_JAGGED ? ir->jagged[k->jag].max_len : k->set_k;
    p.inv_norm = 1.0 / (double)L;
  }
  if (n->shape == ATTN_PMA) {
    p.q_per_example = q->fixed[0];
    p.q_shared = true;
  } else if (q->layout == LAYOUT_JAGGED) {
    p.q_off = cpu_offsets_of(x, p.q);
  } else {
    p.q_per_example = q->layout == LAYOUT_SET ? q->set_k : 1;
  }
  if (k->layout == LAYOUT_JAGGED)
    p.kv_off = cpu_offsets_of(x, p.k);
  else
    p.kv_per_example = k->set_k;
  p.window = n->window;
  p.causal = n->mask == MASK_CAUSAL;
  return p;
}

// Example b's query rows [*qs, *qs + *lq) in q (for pma, the seeds), output rows from *os.
static void K(attn_rows)(const AttnPlan *p, int64_t b, int64_t *qs, int64_t *os, int64_t *lq,
                         int64_t *ks, int64_t *lk) {
  if (p->q_off) {
    *qs = *os = p->q_off[b];
    *lq = p->q_off[b + 1] - p->q_off[b];
  } else {
    *qs = p->q_shared ? 0 : b * p->q_per_example;
    *os = b * p->q_per_example;
    *lq = p->q_per_example;
  }
  if (p->kv_off) {
    *ks = p->kv_off[b];
    *lk = p->kv_off[b + 1] - p->kv_off[b];
  } else {
    *ks = b * p->kv_per_example;
    *lk = p->kv_per_example;
  }
}

// The columns [*c0, *c1) of a block starting at key jlo (nk wide) that query row i sees:
// causal keeps j <= i; a window w keeps i - w < j (with causal) or |i - j| < w (without).
static void attn_visible_cols(const AttnPlan *p, int64_t i, int64_t jlo, int64_t nk, int64_t *c0,
                              int64_t *c1) {
  int64_t lo = 0, hi = nk;
  if (p->causal && i - jlo + 1 < hi) hi = i - jlo + 1;
  if (p->window > 0) {
    if (i - p->window + 1 - jlo > lo) lo = i - p->window + 1 - jlo;
    if (!p->causal && i + p->window - jlo < hi) hi = i + p->window - jlo;
  }
  if (hi < lo) hi = lo;
  *c0 = lo;
  *c1 = hi;
}

// The keys [*jlo, *jhi) that query rows [i0, i1) can see; jlo is rounded down to a multiple
// of ATTN_KEY_ALIGN so that mxfp8 blocks of P start where the sequence's blocks start.
static void attn_key_range(const AttnPlan *p, int64_t i0, int64_t i1, int64_t lk, int64_t *jlo,
                           int64_t *jhi) {
  int64_t lo = 0, hi = lk;
  if (p->causal && i1 < hi) hi = i1;
  if (p->window > 0) {
    lo = i0 - p->window + 1;
    if (lo < 0) lo = 0;
    if (!p->causal && i1 + p->window - 1 < hi) hi = i1 + p->window - 1;
  }
  lo -= lo % ATTN_KEY_ALIGN;
  *jlo = lo;
  *jhi = hi > lo ? hi : lo;
}

// S (nq x nk, row stride nk) -> P in `pr` (same shape): the activation, mask and norm.
static void K(attn_probs)(const AttnPlan *p, const real *s, real *pr, int64_t i0, int64_t nq,
                          int64_t jlo, int64_t nk) {
  for (int64_t r = 0; r < nq; r++) {
    const real *srow = s + r * nk;
    real *prow = pr + r * nk;
    int64_t c0, c1;
    attn_visible_cols(p, i0 + r, jlo, nk, &c0, &c1);
    for (int64_t c = 0; c < c0; c++) prow[c] = 0;
    for (int64_t c = c1; c < nk; c++) prow[c] = 0;
    if (c0 == c1) continue;  // nothing visible: the row stays 0
    if (p->softmax) {
      real m = srow[c0], sum = 0;
      for (int64_t c = c0 + 1; c < c1; c++) m = srow[c] > m ? srow[c] : m;
      for (int64_t c = c0; c < c1; c++) {
        prow[c] = (real)exp((double)(srow[c] - m));
        sum += prow[c];
      }
      real inv = 1 / sum;
      for (int64_t c = c0; c < c1; c++) prow[c] *= inv;
    } else {
      for (int64_t c = c0; c < c1; c++)
        prow[c] = (real)(act_forward(p->act, (double)srow[c]) * p->inv_norm);
    }
  }
}

// dP (nq x nk) -> dS in place, from S and P (docs/autodiff.md).
static void K(attn_grad_scores)(const AttnPlan *p, const real *s, const real *pr, real *dp,
                                int64_t i0, int64_t nq, int64_t jlo, int64_t nk) {
  for (int64_t r = 0; r < nq; r++) {
    real *drow = dp + r * nk;
    const real *prow = pr + r * nk, *srow = s + r * nk;
    int64_t c0, c1;
    attn_visible_cols(p, i0 + r, jlo, nk, &c0, &c1);
    for (int64_t c = 0; c < c0; c++) drow[c] = 0;
    for (int64_t c = c1; c < nk; c++) drow[c] = 0;
    if (p->softmax) {
      real dot = 0;
      for (int64_t c = c0; c < c1; c++) dot += drow[c] * prow[c];
      for (int64_t c = c0; c < c1; c++) drow[c] = prow[c] * (drow[c] - dot);
    } else {
      for (int64_t c = c0; c < c1; c++)
        drow[c] = (real)((double)drow[c] * act_grad(p->act, (double)srow[c]) * p->inv_norm);
    }
  }
}

// A copy of tensor t (rows x d) quantized for a matmul that reduces over each head's dh
// features (Q and K in Q·Kᵀ, dO and V in dO·Vᵀ). Unquantized precisions return t itself.
static const real *K(attn_operand_heads)(CpuExec *x, const AttnPlan *p, int t, int slot) {
  const real *src = K(T)(x, t);
#if EMULATE
  DType prec = p->n->prec;
  if (!is_quantized(prec)) return src;
  int64_t rows = x->buf[t].rows;
  size_t n = (size_t)(rows * p->d);
  float *q = cpu_scratch(x, slot, n * sizeof(float));
  if (prec == DT_FP8) {
    fp8_quantize(src, q, n);
  } else {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t h = 0; h < p->heads; h++) {
        size_t at = (size_t)(r * p->d + h * p->dh);
        mxfp8_quantize(src + at, q + at, 1, (size_t)p->dh, 1);
      }
  }
  return q;
#else
  (void)x, (void)p, (void)slot;
  return src;
#endif
}

// A copy of tensor t quantized for a matmul that reduces over its rows within each example
// (K in dS·K, V in P·V, Q in dSᵀ·Q, dO in Pᵀ·dO): mxfp8 blocks run down each column from
// the example's first row. `query_side` picks q's rows (for q and dO) or kv's.
static const real *K(attn_operand_rows)(CpuExec *x, const AttnPlan *p, int t, bool query_side,
                                        int slot) {
  const real *src = K(T)(x, t);
#if EMULATE
  DType prec = p->n->prec;
  if (!is_quantized(prec)) return src;
  int64_t rows = x->buf[t].rows;
  size_t n = (size_t)(rows * p->d);
  float *q = cpu_scratch(x, slot, n * sizeof(float));
  if (prec == DT_FP8) {
    fp8_quantize(src, q, n);
    return q;
  }
  bool shared = query_side && p->q_shared && t == p->q;  // pma seeds: one block of k rows
  int64_t nb = shared ? 1 : x->B;
  for (int64_t b = 0; b < nb; b++) {
    int64_t qs, os, lq, ks, lk;
    K(attn_rows)(p, b, &qs, &os, &lq, &ks, &lk);
    int64_t start = query_side ? (t == p->q ? qs : os) : ks, len = query_side ? lq : lk;
    if (len > 0)
      mxfp8_quantize(src + start * p->d, q + start * p->d, (size_t)len, (size_t)p->d, 0);
  }
  return q;
#else
  (void)x, (void)p, (void)query_side, (void)slot;
  return src;
#endif
}

static void K(op_attention)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  AttnPlan p = K(attn_plan)(x, n);
  const real *Q = K(attn_operand_heads)(x, &p, p.q, SLOT_QA);
  const real *Kt = K(attn_operand_heads)(x, &p, p.k, SLOT_QB);
  const real *V = K(attn_operand_rows)(x, &p, p.v, false, SLOT_QC);
  real *O = K(T)(x, n->out);
  int64_t d = p.d, dh = p.dh;
  for (int64_t b = 0; b < x->B; b++) {
    int64_t qs, os, lq, ks, lk;
    K(attn_rows)(&p, b, &qs, &os, &lq, &ks, &lk);
    for (int64_t h = 0; h < p.heads; h++) {
      for (int64_t i0 = 0; i0 < lq; i0 += ATTN_TILE) {
        int64_t nq = lq - i0 < ATTN_TILE ? lq - i0 : ATTN_TILE, jlo, jhi;
        attn_key_range(&p, i0, i0 + nq, lk, &jlo, &jhi);
        int64_t nk = jhi - jlo;
        real *o = O + (os + i0) * d + h * dh;
        if (nk == 0) {
          for (int64_t r = 0; r < nq; r++)
            for (int64_t c = 0; c < dh; c++) o[r * d + c] = 0;
          continue;
        }
        real *s = cpu_scratch(x, SLOT_S, (size_t)(nq * nk) * sizeof(real));
        real *pr = cpu_scratch(x, SLOT_P, (size_t)(nq * nk) * sizeof(real));
        K(gemm)(x, nq, nk, dh, (real)n->scale, Q + (qs + i0) * d + h * dh, d, 1,
                Kt + (ks + jlo) * d + h * dh, 1, d, false, s, nk);
        K(attn_probs)(&p, s, pr, i0, nq, jlo, nk);
        K(quantize_block)(x, n->prec, pr, nq, nk, nk, 1);
        K(gemm)(x, nq, dh, nk, 1, pr, nk, 1, V + (ks + jlo) * d + h * dh, d, 1, false,
                o, d);
      }
    }
  }
}

// The three backward outputs of one attention (any may be NULL).
typedef struct AttnGrads {
  real *dq, *dk, *dv;
} AttnGrads;

// The block m[rows, cols] as a matmul reducing along cols (k_contiguous = 1) or rows (0)
// reads it: m itself, or a quantized copy in `copy`.
static const real *K(quantized_block)(CpuExec *x, DType prec, const real *m, real *copy,
                                      int64_t rows, int64_t cols, int k_contiguous) {
  if (!EMULATE || !is_quantized(prec)) return m;
  memcpy(copy, m, (size_t)(rows * cols) * sizeof(real));
  K(quantize_block)(x, prec, copy, rows, cols, cols, k_contiguous);
  return copy;
}

static void K(attention_backward)(CpuExec *x, const Node *n, int dout, AttnGrads g) {
  AttnPlan p = K(attn_plan)(x, n);
  int64_t d = p.d, dh = p.dh;
  // Operands of S = Q Kᵀ and dP = dO Vᵀ (reducing over dh), and of dQ = dS K, dK = dSᵀ Q,
  // dV = Pᵀ dO (reducing over rows).
  const real *Qh = K(attn_operand_heads)(x, &p, p.q, SLOT_QA);
  const real *Kh = K(attn_operand_heads)(x, &p, p.k, SLOT_QB);
  const real *Vh = K(attn_operand_heads)(x, &p, p.v, SLOT_QC);
  const real *dOh = K(attn_operand_heads)(x, &p, dout, SLOT_QD);
  const real *Kr = K(attn_operand_rows)(x, &p, p.k, false, SLOT_PART0);
  const real *Qr = K(attn_operand_rows)(x, &p, p.q, true, SLOT_PART0 + 1);
  const real *dOr = K(attn_operand_rows)(x, &p, dout, true, SLOT_PART0 + 2);
  if (g.dq) memset(g.dq, 0, (size_t)x->buf[p.q].numel * sizeof(real));
  if (g.dk) memset(g.dk, 0, (size_t)x->buf[p.k].numel * sizeof(real));
  if (g.dv) memset(g.dv, 0, (size_t)x->buf[p.v].numel * sizeof(real));
  real scale = (real)n->scale;
  bool whole_columns = EMULATE && n->prec == DT_FP8;
  for (int64_t b = 0; b < x->B; b++) {
    int64_t qs, os, lq, ks, lk;
    K(attn_rows)(&p, b, &qs, &os, &lq, &ks, &lk);
    int64_t tile = whole_columns ? (lq > 0 ? lq : 1) : ATTN_TILE;
    for (int64_t h = 0; h < p.heads; h++) {
      for (int64_t i0 = 0; i0 < lq; i0 += tile) {
        int64_t nq = lq - i0 < tile ? lq - i0 : tile, jlo, jhi;
        attn_key_range(&p, i0, i0 + nq, lk, &jlo, &jhi);
        int64_t nk = jhi - jlo;
        if (nk == 0) continue;
        size_t bytes = (size_t)(nq * nk) * sizeof(real);
        real *s = cpu_scratch(x, SLOT_S, bytes), *pr = cpu_scratch(x, SLOT_P, bytes);
        real *dp = cpu_scratch(x, SLOT_DP, bytes), *qp = cpu_scratch(x, SLOT_QP, bytes);
        int64_t qrow = qs + i0, orow = os + i0, krow = ks + jlo, hc = h * dh;
        K(gemm)(x, nq, nk, dh, scale, Qh + qrow * d + hc, d, 1, Kh + krow * d + hc, 1,
                d, false, s, nk);
        K(attn_probs)(&p, s, pr, i0, nq, jlo, nk);
        // dP = dO Vᵀ, then dS in place.
        K(gemm)(x, nq, nk, dh, 1, dOh + orow * d + hc, d, 1, Vh + krow * d + hc, 1, d, false, dp,
                nk);
        K(attn_grad_scores)(&p, s, pr, dp, i0, nq, jlo, nk);
        if (g.dv) {  // dV[keys] += Pᵀ dO[rows]
          const real *pt = K(quantized_block)(x, n->prec, pr, qp, nq, nk, 0);
          K(gemm)(x, nk, dh, nq, 1, pt, 1, nk, dOr + orow * d + hc, d, 1, true,
                  g.dv + krow * d + hc, d);
        }
        if (g.dq) {  // dQ[rows] += scale dS K[keys]
          const real *ds = K(quantized_block)(x, n->prec, dp, qp, nq, nk, 1);
          K(gemm)(x, nq, dh, nk, scale, ds, nk, 1, Kr + krow * d + hc, d, 1, true,
                  g.dq + qrow * d + hc, d);
        }
        if (g.dk) {  // dK[keys] += scale dSᵀ Q[rows]
          const real *ds = K(quantized_block)(x, n->prec, dp, qp, nq, nk, 0);
          K(gemm)(x, nk, dh, nq, scale, ds, 1, nk, Qr + qrow * d + hc, d, 1, true,
                  g.dk + krow * d + hc, d);
        }
      }
    }
  }
}

// attention_bwd_q, _k and _v: the first of a node's siblings computes all of them in one pass
// (cpu_exec.c pairs them up and skips the others).
static void K(op_attention_bwd)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int who[3] = {x->bwd_q[node], x->bwd_k[node], x->bwd_v[node]};
  real *out[3];
  for (int i = 0; i < 3; i++) out[i] = who[i] >= 0 ? K(T)(x, x->ir->nodes[who[i]].out) : NULL;
  AttnGrads g = {out[0], out[1], out[2]};
  K(attention_backward)(x, n, n->ins[3], g);
}
