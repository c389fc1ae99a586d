// cpu_common_real.h: what every op kernel of the CPU executor uses, written over `real`:
// access to a node's tensors, pointwise activations over arrays, and the precision emulation
// of matmul operands. Included first by cpu_kernels_f32.c and cpu_kernels_f64.c; in the fp64
// instantiation (EMULATE 0) quantization is the identity.
//
// Matmul operands at fp8 and mxfp8 (numerics.h):
//   fp8    a tensor operand is quantized as one tensor (one scale for all its elements);
//   mxfp8  blocks of 32 consecutive elements along the matmul's reduction dimension share a
//          scale, starting at the operand's first element of that dimension.

// The node, and the buffer of tensor t as reals.
static const Node *K(node_at)(const CpuExec *x, int node) { return &x->ir->nodes[node]; }
static real *K(T)(const CpuExec *x, int t) { return (real *)x->buf[t].data; }

// Scratch slots (cpu_scratch): each kernel uses its own, so nested use cannot collide.
enum {
  SLOT_QA,      // quantized copy of a matmul's left operand
  SLOT_QB,      // ... of its right operand
  SLOT_QC,      // ... of a third operand
  SLOT_QD,      // ... of a fourth
  SLOT_S,       // attention: a block of scores
  SLOT_P,       // attention: the probabilities
  SLOT_DP,      // attention backward: dP, then dS
  SLOT_QP,      // attention: quantized P or dS
  SLOT_SORT,    // table_grad: the sorted occurrences
  SLOT_MISC,
  SLOT_PART0,   // dot_interact: one quantized copy per input
};
_Static_assert(SLOT_PART0 + IR_MAX_INPUTS <= CPU_SCRATCH_SLOTS, "enough scratch slots");

// y[i] = act(y[i]) in place. Softmax is not pointwise; attention handles it.
static void K(act_inplace)(Act a, real *y, int64_t n) {
  switch (a) {
  case ACT_NONE: return;
  case ACT_RELU:
    for (int64_t i = 0; i < n; i++) y[i] = y[i] > 0 ? y[i] : 0;
    return;
  default:
    for (int64_t i = 0; i < n; i++) y[i] = (real)act_forward(a, (double)y[i]);
    return;
  }
}

// g[i] *= act'(z[i]).
static void K(act_grad_mul)(Act a, real *g, const real *z, int64_t n) {
  switch (a) {
  case ACT_NONE: return;
  case ACT_RELU:
    for (int64_t i = 0; i < n; i++) g[i] = z[i] > 0 ? g[i] : 0;
    return;
  default:
    for (int64_t i = 0; i < n; i++) g[i] = (real)((double)g[i] * act_grad(a, (double)z[i]));
    return;
  }
}

static inline bool is_quantized(DType prec) { return prec == DT_FP8 || prec == DT_MXFP8; }

// The operand src[rows, cols] (row-major) as the node's precision feeds it to a matmul whose
// reduction runs along cols (k_contiguous = 1) or rows (0): src itself, or a quantized copy in
// scratch `slot`.
static const real *K(operand)(CpuExec *x, DType prec, const real *src, int64_t rows,
                              int64_t cols, int k_contiguous, int slot) {
#if EMULATE
  if (!is_quantized(prec) || rows <= 0 || cols <= 0) return src;
  size_t n = (size_t)rows * (size_t)cols;
  float *q = cpu_scratch(x, slot, n * sizeof(float));
  if (prec == DT_FP8) {
    fp8_quantize(src, q, n);
  } else {
    mxfp8_quantize(src, q, (size_t)rows, (size_t)cols, k_contiguous);
  }
  return q;
#else
  (void)x, (void)prec, (void)rows, (void)cols, (void)k_contiguous, (void)slot;
  return src;
#endif
}

// Quantizes a computed block m[rows, cols] (row stride ld) in place, for a matmul reducing
// along cols (k_contiguous = 1) or rows (0). fp8 gives every vector along the reduction its
// own scale (a row of P for P·V, a column of P for Pᵀ·dO): the block is computed on the fly,
// so no scale can span more than what one vector of the product sees.
static void K(quantize_block)(CpuExec *x, DType prec, real *m, int64_t rows, int64_t cols,
                              int64_t ld, int k_contiguous) {
#if EMULATE
  if (!is_quantized(prec) || rows <= 0 || cols <= 0) return;
  if (k_contiguous) {
    for (int64_t r = 0; r < rows; r++) {
      if (prec == DT_FP8)
        fp8_quantize(m + r * ld, m + r * ld, (size_t)cols);
      else
        mxfp8_quantize(m + r * ld, m + r * ld, 1, (size_t)cols, 1);
    }
    return;
  }
  float *col = cpu_scratch(x, SLOT_MISC, (size_t)rows * sizeof(float));
  for (int64_t c = 0; c < cols; c++) {
    for (int64_t r = 0; r < rows; r++) col[r] = m[r * ld + c];
    if (prec == DT_FP8)
      fp8_quantize(col, col, (size_t)rows);
    else
      mxfp8_quantize(col, col, (size_t)rows, 1, 0);
    for (int64_t r = 0; r < rows; r++) m[r * ld + c] = col[r];
  }
#else
  (void)x, (void)prec, (void)m, (void)rows, (void)cols, (void)ld, (void)k_contiguous;
#endif
}
