// cpu_forward_real.h: the forward op kernels of the CPU executor except attention
// (cpu_attention_real.h), written over `real`. Each takes the executor and a node index and
// writes the node's output buffer; cpu_exec.c then rounds it to the output's dtype (fp32 mode).
//
// Layouts reach the kernels as rows: a dense[B, w] tensor is B rows of w, a set[B, k, w] B·k
// rows, a jagged[B, *s, w] T_s rows (its offsets say which example each belongs to). Ops that
// treat every row alike (linear, norms, pointwise ops, concat) never look at the layout.

// --- embeddings -------------------------------------------------------------------------

// out[r] = table[ids[r]] for every id (dense ids: one per example; jagged: one per position).
static void K(op_embed)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *table = K(T)(x, n->ins[0]);
  const TensorBuf *ids = &x->buf[n->ins[1]];
  int64_t D = x->buf[n->ins[0]].width;
  real *out = K(T)(x, n->out);
  for (int64_t r = 0; r < ids->rows; r++)
    memcpy(out + r * D, table + ids->ids[r] * D, (size_t)D * sizeof(real));
}

// out[b] = sum (or mean) of table rows over example b's ids; an empty example gives 0.
static void K(op_embed_pool)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *table = K(T)(x, n->ins[0]);
  const int64_t *ids = x->buf[n->ins[1]].ids;
  const int64_t *off = cpu_offsets_of(x, n->ins[1]);
  int64_t D = x->buf[n->ins[0]].width;
  real *out = K(T)(x, n->out);
  for (int64_t b = 0; b < x->B; b++) {
    real *o = out + b * D;
    for (int64_t j = 0; j < D; j++) o[j] = 0;
    for (int64_t t = off[b]; t < off[b + 1]; t++) {
      const real *row = table + ids[t] * D;
      for (int64_t j = 0; j < D; j++) o[j] += row[j];
    }
    int64_t len = off[b + 1] - off[b];
    if (n->pool == POOL_MEAN && len > 0)
      for (int64_t j = 0; j < D; j++) o[j] /= (real)len;
  }
}

// --- linear -----------------------------------------------------------------------------

// z = x·w (+ b) for every row, operands quantized at fp8/mxfp8; z is [rows, n].
static void K(linear_pre)(CpuExec *x, const Node *n, int xt, int wt, int bt, real *z) {
  const TensorBuf *xb = &x->buf[xt], *wb = &x->buf[wt];
  int64_t rows = xb->rows, d = xb->width, m = wb->width;
  const real *xa = K(operand)(x, n->prec, K(T)(x, xt), rows, d, 1, SLOT_QA);
  const real *wa = K(operand)(x, n->prec, K(T)(x, wt), d, m, 0, SLOT_QB);
  K(gemm)(x, rows, m, d, 1, xa, d, 1, wa, m, 1, false, z, m);
  if (bt >= 0) {
    const real *bias = K(T)(x, bt);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < m; j++) z[r * m + j] += bias[j];
  }
}

static void K(op_linear)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  real *y = K(T)(x, n->out);
  K(linear_pre)(x, n, n->ins[0], n->ins[1], n->nins > 2 ? n->ins[2] : -1, y);
  K(act_inplace)(cpu_node_act(n), y, x->buf[n->out].numel);
}

// --- norms ------------------------------------------------------------------------------

// The statistics of one row of d, in double: sum of squares, or mean and variance.
static double K(row_rms)(const real *v, int64_t d, double eps) {
  double ss = 0;
  for (int64_t j = 0; j < d; j++) ss += (double)v[j] * v[j];
  return sqrt(ss / (double)d + eps);
}

static void K(row_mean_std)(const real *v, int64_t d, double eps, double *mean, double *std) {
  double s = 0;
  for (int64_t j = 0; j < d; j++) s += v[j];
  double mu = s / (double)d, var = 0;
  for (int64_t j = 0; j < d; j++) var += ((double)v[j] - mu) * ((double)v[j] - mu);
  *mean = mu;
  *std = sqrt(var / (double)d + eps);
}

// y = x / sqrt(mean(x²) + eps) * gain
static void K(op_rmsnorm)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[0]];
  const real *in = K(T)(x, n->ins[0]), *g = K(T)(x, n->ins[1]);
  real *y = K(T)(x, n->out);
  int64_t d = xb->width;
  for (int64_t r = 0; r < xb->rows; r++) {
    double inv = 1.0 / K(row_rms)(in + r * d, d, n->eps);
    for (int64_t j = 0; j < d; j++) y[r * d + j] = (real)(in[r * d + j] * inv * g[j]);
  }
}

// y = (x - mean) / sqrt(var + eps) * gain + bias
static void K(op_layernorm)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *xb = &x->buf[n->ins[0]];
  const real *in = K(T)(x, n->ins[0]), *g = K(T)(x, n->ins[1]), *bias = K(T)(x, n->ins[2]);
  real *y = K(T)(x, n->out);
  int64_t d = xb->width;
  for (int64_t r = 0; r < xb->rows; r++) {
    double mu, sd;
    K(row_mean_std)(in + r * d, d, n->eps, &mu, &sd);
    for (int64_t j = 0; j < d; j++)
      y[r * d + j] = (real)(((double)in[r * d + j] - mu) / sd * g[j] + bias[j]);
  }
}

// --- pointwise --------------------------------------------------------------------------

static void K(op_act)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t numel = x->buf[n->out].numel;
  real *y = K(T)(x, n->out);
  memcpy(y, K(T)(x, n->ins[0]), (size_t)numel * sizeof(real));
  K(act_inplace)(cpu_node_act(n), y, numel);
}

static void K(op_add)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *a = K(T)(x, n->ins[0]), *b = K(T)(x, n->ins[1]);
  real *y = K(T)(x, n->out);
  for (int64_t i = 0; i < x->buf[n->out].numel; i++) y[i] = a[i] + b[i];
}

static void K(op_sub)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *a = K(T)(x, n->ins[0]), *b = K(T)(x, n->ins[1]);
  real *y = K(T)(x, n->out);
  for (int64_t i = 0; i < x->buf[n->out].numel; i++) y[i] = a[i] - b[i];
}

static void K(op_mul)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *a = K(T)(x, n->ins[0]), *b = K(T)(x, n->ins[1]);
  real *y = K(T)(x, n->out);
  for (int64_t i = 0; i < x->buf[n->out].numel; i++) y[i] = a[i] * b[i];
}

// y = c·x (c is the scale attribute).
static void K(op_scale)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *a = K(T)(x, n->ins[0]);
  real *y = K(T)(x, n->out);
  real c = (real)n->scale;
  for (int64_t i = 0; i < x->buf[n->out].numel; i++) y[i] = c * a[i];
}

// --- shape ops --------------------------------------------------------------------------

// Each output row is the parts' rows side by side.
static void K(op_concat)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const TensorBuf *ob = &x->buf[n->out];
  real *y = K(T)(x, n->out);
  int64_t col = 0;
  for (int k = 0; k < n->nins; k++) {
    const TensorBuf *pb = &x->buf[n->ins[k]];
    const real *p = K(T)(x, n->ins[k]);
    for (int64_t r = 0; r < ob->rows; r++)
      memcpy(y + r * ob->width + col, p + r * pb->width, (size_t)pb->width * sizeof(real));
    col += pb->width;
  }
}

// out[b, i] = x_i[b]
static void K(op_stack)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t d = x->buf[n->out].width;
  real *y = K(T)(x, n->out);
  for (int i = 0; i < n->nins; i++) {
    const real *p = K(T)(x, n->ins[i]);
    for (int64_t b = 0; b < x->B; b++)
      memcpy(y + (b * n->nins + i) * d, p + b * d, (size_t)d * sizeof(real));
  }
}

// set[B, k, d] and dense[B, k·d] (and back: unflatten) share one memory order.
static void K(op_copy)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  memcpy(K(T)(x, n->out), K(T)(x, n->ins[0]), (size_t)x->buf[n->out].numel * sizeof(real));
}

// out[b, pair(i, j)] = x_i[b] · x_j[b] for i < j, pairs in the order (0,1), (0,2), ..., (1,2).
// At fp8 each input is one tensor; at mxfp8 the blocks run along d.
static void K(op_dot_interact)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  int64_t d = x->buf[n->ins[0]].width, np = x->buf[n->out].width;
  const real *in[IR_MAX_INPUTS];
  for (int i = 0; i < n->nins; i++)
    in[i] = K(operand)(x, n->prec, K(T)(x, n->ins[i]), x->B, d, 1, SLOT_PART0 + i);
  real *y = K(T)(x, n->out);
  for (int64_t b = 0; b < x->B; b++) {
    int64_t p = 0;
    for (int i = 0; i < n->nins; i++)
      for (int j = i + 1; j < n->nins; j++) {
        const real *u = in[i] + b * d, *v = in[j] + b * d;
        real s = 0;
        for (int64_t c = 0; c < d; c++) s += u[c] * v[c];
        y[b * np + p++] = s;
      }
  }
}

// --- losses -----------------------------------------------------------------------------

// mean over b of log(1 + e^z) - y z, computed stably.
static void K(op_bce)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  const real *z = K(T)(x, n->ins[0]), *y = K(T)(x, n->ins[1]);
  double sum = 0;
  for (int64_t b = 0; b < x->B; b++) {
    double zb = z[b];
    sum += (zb > 0 ? zb : 0) - zb * y[b] + log1p(exp(-fabs(zb)));
  }
  K(T)(x, n->out)[0] = (real)(sum / (double)x->B);
}

static void K(op_loss_sum)(CpuExec *x, int node) {
  const Node *n = K(node_at)(x, node);
  double sum = 0;
  for (int i = 0; i < n->nins; i++) sum += n->weights[i] * K(T)(x, n->ins[i])[0];
  K(T)(x, n->out)[0] = (real)sum;
}
