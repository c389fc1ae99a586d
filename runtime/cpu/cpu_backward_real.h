// cpu_backward_real.h: the backward op kernels of the CPU executor (docs/autodiff.md,
// "Backward ops"), written over `real`; attention's are in cpu_attention_real.h. Each computes
// exactly the formula of its row in that table. Sums over rows (parameter gradients) run in a
// fixed order, so gradients are deterministic.

// --- shape ops --------------------------------------------------------------------------

// y[r, j] = x[r, start + j]: the gradient of one concat part.
static void K(op_slice)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[0]], *yb = &x->buf[n->out];
  const real *in = K(T)(x, n->ins[0]);
  real *y = K(T)(x, n->out);
  for (int64_t r = 0; r < yb->rows; r++)
    memcpy(y + r * yb->width, in + r * xb->width + n->start, (size_t)yb->width * sizeof(real));
}

// y[b] = x[b, start]: the gradient of one stack input.
static void K(op_unstack)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t k = x->ir->tensors[n->ins[0]].set_k, d = x->buf[n->out].width;
  const real *in = K(T)(x, n->ins[0]);
  real *y = K(T)(x, n->out);
  for (int64_t b = 0; b < x->B; b++)
    memcpy(y + b * d, in + (b * k + n->start) * d, (size_t)d * sizeof(real));
}

// y[j] = sum over every row r of x[r, j] (bias gradients), accumulated in double.
static void K(op_reduce_rows)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[0]];
  const real *in = K(T)(x, n->ins[0]);
  real *y = K(T)(x, n->out);
  for (int64_t j = 0; j < xb->width; j++) {
    double s = 0;
    for (int64_t r = 0; r < xb->rows; r++) s += in[r * xb->width + j];
    y[j] = (real)s;
  }
}

// --- activations and linear -------------------------------------------------------------

// dy ⊙ act′(x)
static void K(op_act_bwd)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t numel = x->buf[n->out].numel;
  real *y = K(T)(x, n->out);
  memcpy(y, K(T)(x, n->ins[0]), (size_t)numel * sizeof(real));
  K(act_grad_mul)(cpu_node_act(n), y, K(T)(x, n->ins[1]), numel);
}

// dy ⊙ act′(x·w + b): the pre-activation is recomputed as the forward computed it.
static void K(op_linear_act_bwd)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t numel = x->buf[n->out].numel;
  real *z = cpu_scratch(x, SLOT_S, (size_t)numel * sizeof(real));
  K(linear_pre)(x, n, n->ins[1], n->ins[2], n->nins > 3 ? n->ins[3] : -1, z);
  real *y = K(T)(x, n->out);
  memcpy(y, K(T)(x, n->ins[0]), (size_t)numel * sizeof(real));
  K(act_grad_mul)(cpu_node_act(n), y, z, numel);
}

// dx = dz · wᵀ, reducing over n (both operands quantized along their n).
static void K(op_linear_bwd_x)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *zb = &x->buf[n->ins[0]], *wb = &x->buf[n->ins[1]];
  int64_t rows = zb->rows, m = zb->width, d = wb->rows;
  const real *dz = K(operand)(x, n->prec, K(T)(x, n->ins[0]), rows, m, 1, SLOT_QA);
  const real *w = K(operand)(x, n->prec, K(T)(x, n->ins[1]), d, m, 1, SLOT_QB);
  K(gemm)(x, rows, d, m, 1, dz, m, 1, w, 1, m, false, K(T)(x, n->out), d);
}

// dw = sum over rows of xᵀ dz, reducing over the rows (both quantized along them).
static void K(op_linear_bwd_w)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[0]], *zb = &x->buf[n->ins[1]];
  int64_t rows = xb->rows, d = xb->width, m = zb->width;
  const real *in = K(operand)(x, n->prec, K(T)(x, n->ins[0]), rows, d, 0, SLOT_QA);
  const real *dz = K(operand)(x, n->prec, K(T)(x, n->ins[1]), rows, m, 0, SLOT_QB);
  K(gemm)(x, d, m, rows, 1, in, 1, d, dz, m, 1, false, K(T)(x, n->out), m);
}

// --- norms ------------------------------------------------------------------------------

// With r = sqrt(mean(x²) + eps): dx = g⊙dy / r − x · Σ_j(g_j dy_j x_j) / (d·r³).
static void K(op_rmsnorm_bwd_x)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[1]];
  const real *dy = K(T)(x, n->ins[0]), *in = K(T)(x, n->ins[1]), *g = K(T)(x, n->ins[2]);
  real *dx = K(T)(x, n->out);
  int64_t d = xb->width;
  for (int64_t r = 0; r < xb->rows; r++) {
    const real *xr = in + r * d, *dyr = dy + r * d;
    double rms = K(row_rms)(xr, d, n->eps), dot = 0;
    for (int64_t j = 0; j < d; j++) dot += (double)g[j] * dyr[j] * xr[j];
    double c = dot / ((double)d * rms * rms * rms);
    for (int64_t j = 0; j < d; j++) dx[r * d + j] = (real)(g[j] * dyr[j] / rms - xr[j] * c);
  }
}

// dgain = Σ_r dy ⊙ x / r
static void K(op_rmsnorm_bwd_gain)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[1]];
  const real *dy = K(T)(x, n->ins[0]), *in = K(T)(x, n->ins[1]);
  int64_t d = xb->width;
  double *acc = cpu_scratch(x, SLOT_MISC, (size_t)d * sizeof(double));
  for (int64_t j = 0; j < d; j++) acc[j] = 0;
  for (int64_t r = 0; r < xb->rows; r++) {
    const real *xr = in + r * d, *dyr = dy + r * d;
    double inv = 1.0 / K(row_rms)(xr, d, n->eps);
    for (int64_t j = 0; j < d; j++) acc[j] += (double)dyr[j] * xr[j] * inv;
  }
  real *y = K(T)(x, n->out);
  for (int64_t j = 0; j < d; j++) y[j] = (real)acc[j];
}

// With x̂ = (x − μ)/σ, g′ = dy ⊙ gain: dx = (g′ − mean(g′) − x̂·mean(g′ ⊙ x̂)) / σ.
static void K(op_layernorm_bwd_x)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[1]];
  const real *dy = K(T)(x, n->ins[0]), *in = K(T)(x, n->ins[1]), *g = K(T)(x, n->ins[2]);
  real *dx = K(T)(x, n->out);
  int64_t d = xb->width;
  for (int64_t r = 0; r < xb->rows; r++) {
    const real *xr = in + r * d, *dyr = dy + r * d;
    double mu, sd, mg = 0, mgx = 0;
    K(row_mean_std)(xr, d, n->eps, &mu, &sd);
    for (int64_t j = 0; j < d; j++) {
      double gp = (double)dyr[j] * g[j], xh = ((double)xr[j] - mu) / sd;
      mg += gp;
      mgx += gp * xh;
    }
    mg /= (double)d;
    mgx /= (double)d;
    for (int64_t j = 0; j < d; j++) {
      double gp = (double)dyr[j] * g[j], xh = ((double)xr[j] - mu) / sd;
      dx[r * d + j] = (real)((gp - mg - xh * mgx) / sd);
    }
  }
}

// dgain = Σ_r dy ⊙ x̂
static void K(op_layernorm_bwd_gain)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[1]];
  const real *dy = K(T)(x, n->ins[0]), *in = K(T)(x, n->ins[1]);
  int64_t d = xb->width;
  double *acc = cpu_scratch(x, SLOT_MISC, (size_t)d * sizeof(double));
  for (int64_t j = 0; j < d; j++) acc[j] = 0;
  for (int64_t r = 0; r < xb->rows; r++) {
    const real *xr = in + r * d, *dyr = dy + r * d;
    double mu, sd;
    K(row_mean_std)(xr, d, n->eps, &mu, &sd);
    for (int64_t j = 0; j < d; j++) acc[j] += (double)dyr[j] * ((double)xr[j] - mu) / sd;
  }
  real *y = K(T)(x, n->out);
  for (int64_t j = 0; j < d; j++) y[j] = (real)acc[j];
}

// --- dot_interact -----------------------------------------------------------------------

// The column of pair (i, j), i < j, among n inputs: pairs run (0,1), (0,2), ..., (1,2), ...
static int64_t pair_index(int64_t i, int64_t j, int64_t n) {
  return i * n - i * (i + 1) / 2 + (j - i - 1);
}

// dx_i[b] = Σ_{j≠i} dy[b, pair(i, j)] · x_j[b], i = start. The reduction runs over j: at fp8
// dy and each x_j are one tensor each; at mxfp8 one block holds the n−1 terms of (b, column).
static void K(op_dot_interact_bwd)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int nx = n->nins - 1;
  int64_t i = n->start, d = x->buf[n->out].width, np = x->buf[n->ins[0]].width;
  const real *dy = K(T)(x, n->ins[0]);
  real *dx = K(T)(x, n->out);
  const real *in[IR_MAX_INPUTS];
  for (int j = 0; j < nx; j++) in[j] = K(T)(x, n->ins[1 + j]);
  if (EMULATE && n->prec == DT_FP8) {
    dy = K(operand)(x, n->prec, dy, x->B, np, 1, SLOT_QA);
    for (int j = 0; j < nx; j++)
      in[j] = j == i ? in[j] : K(operand)(x, n->prec, in[j], x->B, d, 1, SLOT_PART0 + j);
  }
  // Per example: the n−1 coefficients and rows, gathered as a [1, n−1] x [n−1, d] product.
  real *coef = cpu_scratch(x, SLOT_S, (size_t)nx * sizeof(real));
  real *rows = cpu_scratch(x, SLOT_P, (size_t)(nx * d) * sizeof(real));
  for (int64_t b = 0; b < x->B; b++) {
    int64_t m = 0;
    for (int64_t j = 0; j < nx; j++) {
      if (j == i) continue;
      coef[m] = dy[b * np + (j < i ? pair_index(j, i, nx) : pair_index(i, j, nx))];
      memcpy(rows + m * d, in[j] + b * d, (size_t)d * sizeof(real));
      m++;
    }
    if (n->prec == DT_MXFP8) {
      K(quantize_block)(x, n->prec, coef, 1, m, m, 1);
      K(quantize_block)(x, n->prec, rows, m, d, d, 0);
    }
    real *o = dx + b * d;
    for (int64_t c = 0; c < d; c++) o[c] = 0;
    for (int64_t k = 0; k < m; k++)
      for (int64_t c = 0; c < d; c++) o[c] += coef[k] * rows[k * d + c];
  }
}

// --- losses and embeddings --------------------------------------------------------------

// weight · (σ(z_b) − y_b) / B: the seed of the backward pass.
static void K(op_bce_bwd)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *z = K(T)(x, n->ins[0]), *y = K(T)(x, n->ins[1]);
  real *g = K(T)(x, n->out);
  for (int64_t b = 0; b < x->B; b++) {
    double zb = z[b], s = zb >= 0 ? 1 / (1 + exp(-zb)) : exp(zb) / (1 + exp(zb));
    g[b] = (real)(n->weight * (s - y[b]) / (double)x->B);
  }
}

// Each id of example b gets dy[b] (divided by the length for mean pooling).
static void K(op_embed_pool_bwd)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const int64_t *off = cpu_offsets_of(x, n->ins[0]);
  const real *dy = K(T)(x, n->ins[1]);
  int64_t D = x->buf[n->out].width;
  real *out = K(T)(x, n->out);
  for (int64_t b = 0; b < x->B; b++) {
    int64_t len = off[b + 1] - off[b];
    for (int64_t t = off[b]; t < off[b + 1]; t++)
      for (int64_t j = 0; j < D; j++)
        out[t * D + j] = n->pool == POOL_MEAN ? dy[b * D + j] / (real)len : dy[b * D + j];
  }
}

// One occurrence of an id in table_grad's pairs: sorting by (id, seq) puts the occurrences
// of each id together in pair order, then position order.
typedef struct IdOccurrence {
  int64_t id, seq;
} IdOccurrence;

static int compare_occurrence(const void *a, const void *b) {
  const IdOccurrence *u = a, *v = b;
  if (u->id != v->id) return u->id < v->id ? -1 : 1;
  return (u->seq > v->seq) - (u->seq < v->seq);
}

// rows[U, D]: one row per distinct id, ascending, each the sum of dy over the id's
// occurrences, added in pair order, then position order.
static void K(op_table_grad)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t D = x->buf[n->out].width, total = 0;
  for (int k = 1; k + 1 < n->nins; k += 2) total += x->buf[n->ins[k]].rows;
  IdOccurrence *occ = cpu_scratch(x, SLOT_SORT, (size_t)(total > 0 ? total : 1) * sizeof *occ);
  const real **src = cpu_scratch(x, SLOT_MISC, (size_t)(total > 0 ? total : 1) * sizeof *src);
  int64_t seq = 0;
  for (int k = 1; k + 1 < n->nins; k += 2) {
    const TensorBuf *ib = &x->buf[n->ins[k]];
    const real *dy = K(T)(x, n->ins[k + 1]);
    for (int64_t r = 0; r < ib->rows; r++, seq++) {
      occ[seq] = (IdOccurrence){ib->ids[r], seq};
      src[seq] = dy + r * D;
    }
  }
  qsort(occ, (size_t)total, sizeof *occ, compare_occurrence);
  int64_t unique = 0;
  for (int64_t s = 0; s < total; s++) unique += s == 0 || occ[s].id != occ[s - 1].id;
  cpu_resize_rows(x, n->out, unique);
  TensorBuf *ob = &x->buf[n->out];
  real *out = K(T)(x, n->out);
  int64_t u = -1;
  for (int64_t s = 0; s < total; s++) {
    const real *row = src[occ[s].seq];
    if (s == 0 || occ[s].id != occ[s - 1].id) {
      u++;
      ob->row_ids[u] = occ[s].id;
      memcpy(out + u * D, row, (size_t)D * sizeof(real));
    } else {
      for (int64_t j = 0; j < D; j++) out[u * D + j] += row[j];
    }
  }
}
