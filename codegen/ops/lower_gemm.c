// lower_gemm.c: linear and its backward ops as cuBLASLt matmuls (LAUNCH_GEMM).
//   linear          C[M, n] = x[M, d] · w[d, n] (+ b), act
//   linear_act_bwd  pre = x · w (+ b) in fp32 scratch, then dz = dy ⊙ act'(pre)
//   linear_bwd_x    dx[M, d] = dz[M, n] · wᵀ
//   linear_bwd_w    dw[d, n] = xᵀ · dz, reducing over the M rows (symbolic k)
// The operand type follows the node's prec: fp32, bf16 or fp16; mxfp8 operands are quantized
// to E4M3 with E8M0 block scales by a generated kernel and handed over dequantized in bf16
// (exact: a 4-bit significand times a power of two); fp8 operands get one per-tensor scale
// (amax / 448, an integer atomicMax of the bits of |x|: order-independent) and go to cuBLASLt's
// FP8 GEMM as E4M3 codes with their scales (below); a biased fp8 linear, or one whose output
// rows are not 16-byte aligned, goes to an fp32 GEMM dequantized instead, because amax/448 ·
// e4m3 is not a bf16 in general. Operands stored in
// another dtype than the GEMM's get a cast kernel. The bias and relu epilogues are cuBLASLt's;
// other activations (cuBLASLt's GELU is the tanh form, not erf) and outputs in a dtype the
// GEMM cannot write go through an fp32 scratch and one pointwise kernel. The quantization
// (lower_quantize_operand) is shared with dot_interact (lower_interact.c).
#include <stdio.h>
#include <string.h>

#include "kernels_embedded.h"
#include "lower_ops.h"

static DType gemm_type(DType prec) {
  switch (prec) {
    case DT_BF16:
    case DT_MXFP8: return DT_BF16;
    case DT_FP16: return DT_FP16;
    default: return DT_F32;
  }
}

static LaunchArg tensor_arg(int t) {
  LaunchArg a;
  memset(&a, 0, sizeof a);
  a.kind = ARG_TENSOR;
  a.tensor = t;
  a.slot = a.jag = a.tiles = -1;
  return a;
}

static LaunchArg scratch_arg(int s) {
  LaunchArg a = tensor_arg(-1);
  a.kind = ARG_SCRATCH;
  a.slot = s;
  return a;
}

// Quantizes operand t (rows x cols; the reduction runs along cols when k_contiguous, else down
// the rows) at prec fp8 or mxfp8 exactly as the CPU executor does (runtime/cpu/numerics.c), into a
// new scratch holding the dequantized values in `type`; returns the scratch slot. mxfp8: a
// warp per block of 32 along a row, or a thread per block of 32 down a column. fp8: an amax
// kernel (a block's max, then an integer atomicMax on the bits of |x|, so the order does not
// matter), then the quantize kernel.
enum { AMAX_PER_THREAD = 16 };

// fp8's per-tensor amax of operand t into a new 4-byte scratch (the bits of |x|'s max, zeroed
// first; an integer atomicMax, so the order does not matter); returns the slot. AMAX_PER_THREAD
// elements a thread (strided by the block: coalesced), the block's max in shared memory, one
// atomic a block: a single address takes few atomics.
static int fp8_amax(Lower *L, int node, int t, const char *sname, const char *role) {
  const Ir *ir = L->ir;
  SymSize elems = tensor_elems(ir, t);
  char aname[320], name[340], id[330], what[128], body[1024];
  snprintf(aname, sizeof aname, "%s.amax", sname);
  int amax = lower_new_scratch(L, aname, sym_const(4));
  Launch *z = lower_new_launch(L, LAUNCH_ZERO, node);
  z->zero_arg = scratch_arg(amax);
  z->zero_bytes = sym_const(4);
  ident(id, sizeof id, sname);
  snprintf(name, sizeof name, "amax_%s", id);
  snprintf(what, sizeof what, "%s operand: amax for the fp8 scale", role);
  lower_comment(L, node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, elems, ELEMENTWISE_THREADS * AMAX_PER_THREAD, ELEMENTWISE_THREADS);
  kb_scratch(&kb, "unsigned", "amax_bits", amax, true);
  kb_tensor_in(&kb, "x", t);
  kb_size(&kb, "n", elems);
  snprintf(body, sizeof body,
           "  __shared__ float warp_amax[WARP_SIZE];\n"
           "  i64 first = (i64)blockIdx.x * blockDim.x * %d + threadIdx.x;\n"
           "  float m = 0.0f;\n"
           "  for (int k = 0; k < %d; k++) {\n"
           "    i64 i = first + (i64)k * blockDim.x;\n"
           "    float v = i < n ? fabsf(%s(x, i)) : 0.0f;\n"
           "    if (isfinite(v)) m = fmaxf(m, v);\n"
           "  }\n"
           "  m = warp_max(m);\n"
           "  if (threadIdx.x %% WARP_SIZE == 0) warp_amax[threadIdx.x / WARP_SIZE] = m;\n"
           "  __syncthreads();\n"
           "  if (threadIdx.x >= WARP_SIZE) return;\n"
           "  m = threadIdx.x < blockDim.x / WARP_SIZE ? warp_amax[threadIdx.x] : 0.0f;\n"
           "  m = warp_max(m);\n"
           "  if (threadIdx.x == 0 && m > 0.0f) atomicMax(amax_bits, __float_as_uint(m));\n",
           AMAX_PER_THREAD, AMAX_PER_THREAD, dtype_load(ir->tensors[t].dtype));
  kb_end(&kb, body);
  return amax;
}

int lower_quantize_operand(Lower *L, int node, int t, DType prec, DType type, bool k_contiguous,
                           const char *role) {
  const Ir *ir = L->ir;
  SymSize rows = tensor_rows(ir, t);
  int64_t cols = tensor_width(ir, t);
  SymSize elems = sym_scale(rows, cols);
  char sname[300], name[300], id[256], what[128];
  snprintf(sname, sizeof sname, "%s.%s.%s", ir->tensors[ir->nodes[node].out].name, role, dtype_name(prec));
  int s = lower_new_scratch(L, sname, sym_scale(elems, dtype_size(type)));
  ident(id, sizeof id, sname);
  const char *lt = dtype_load(ir->tensors[t].dtype), *st = dtype_store(type);
  KernelBuilder kb;
  if (prec == DT_MXFP8) {
    snprintf(name, sizeof name, "quantize_mxfp8_%s", id);
    snprintf(what, sizeof what, "%s operand to mxfp8 (E4M3, E8M0 scale per 32 along %s)", role,
             k_contiguous ? "a row" : "a column");
    lower_comment(L, node, what);
    int64_t col_blocks = (cols + 31) / 32;
    StrBuf b = {0};
    sb_printf(&b, "  enum { COLS = %lld };\n", (long long)cols);
    if (k_contiguous) {
      // A group of MX_BLOCK / VEC lanes per block of 32 along a row, VEC adjacent elements a
      // lane (one vector load and store when the row width allows): coalesced, and the
      // block's amax by a butterfly within the group (a max: the same bits in any order).
      int vec = cols % 8 == 0 ? 8 : cols % 4 == 0 ? 4 : cols % 2 == 0 ? 2 : 1;
      kb_begin(&kb, L, node, name, sym_scale(rows, col_blocks * 32), vec * ELEMENTWISE_THREADS,
               ELEMENTWISE_THREADS);
      kb_scratch(&kb, dtype_ctype(type), "out", s, true);
      kb_tensor_in(&kb, "x", t);
      kb_size(&kb, "rows", rows);
      sb_printf(&b, "  enum { COL_BLOCKS = (COLS + MX_BLOCK - 1) / MX_BLOCK, VEC = %d, GROUP = MX_BLOCK / VEC };\n"
                    "  i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
                    "  i64 blk = t / GROUP;\n"
                    "  int col = (int)(blk %% COL_BLOCKS) * MX_BLOCK + (int)(t %% GROUP) * VEC;\n"
                    "  bool mine = blk < rows * COL_BLOCKS && col < COLS;\n"
                    "  i64 at = (blk / COL_BLOCKS) * COLS + col;\n"
                    "  float v[VEC] = {}, amax = 0.0f;\n"
                    "  if (mine) %s_n<VEC>(x, at, v);\n"
                    "#pragma unroll\n"
                    "  for (int k = 0; k < VEC; k++) {\n"
                    "    float a = fabsf(v[k]);\n"
                    "    if (isfinite(a) && a > amax) amax = a;\n"
                    "  }\n"
                    "#pragma unroll\n"
                    "  for (int off = GROUP / 2; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));\n"
                    "  int e = mx_block_exponent(amax);\n"
                    "  float inv_scale = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);\n"
                    "#pragma unroll\n"
                    "  for (int k = 0; k < VEC; k++) v[k] = e4m3_round(v[k] * inv_scale) * scale;\n"
                    "  if (mine) %s_n<VEC>(out, at, v);\n",
                vec, lt, st);
    } else {
      // A CUDA block per (block of 32 rows, chunk of up to 256 columns), a thread per column:
      // a warp reads 32 adjacent columns of a row, and each thread's 32 values are read once,
      // all loads in flight together, into registers. The grid counts (rows + 31) / 32 row
      // blocks of CHUNKS blocks; the few past the last row block return. (A thread per block
      // and column over a flat index ran 1.6x slower on the H200; a block per row block
      // alone left a 512-row, 4864-column operand 16 blocks: docs/perf.md.)
      int64_t threads = cols < 256 ? (cols + 31) / 32 * 32 : 256;
      int64_t chunks = (cols + threads - 1) / threads;
      kb_begin(&kb, L, node, name, sym_add(sym_scale(rows, chunks), sym_const(31 * chunks)), 32,
               (int)threads);
      kb_scratch(&kb, dtype_ctype(type), "out", s, true);
      kb_tensor_in(&kb, "x", t);
      kb_size(&kb, "rows", rows);
      sb_printf(&b, "  enum { CHUNKS = %lld };\n"
                    "  const i64 row0 = (i64)(blockIdx.x / CHUNKS) * MX_BLOCK;\n"
                    "  const int col = (int)(blockIdx.x %% CHUNKS) * blockDim.x + threadIdx.x;\n"
                    "  if (row0 >= rows || col >= COLS) return;\n"
                    "  const int count = rows - row0 < MX_BLOCK ? (int)(rows - row0) : MX_BLOCK;\n"
                    "  const i64 first = row0 * COLS + col;\n"
                    "  float v[MX_BLOCK], amax = 0.0f;\n"
                    "#pragma unroll\n"
                    "  for (int k = 0; k < MX_BLOCK; k++) v[k] = k < count ? %s(x, first + k * COLS) : 0.0f;\n"
                    "#pragma unroll\n"
                    "  for (int k = 0; k < MX_BLOCK; k++) {\n"
                    "    float a = fabsf(v[k]);\n"
                    "    if (isfinite(a) && a > amax) amax = a;\n"
                    "  }\n"
                    "  int e = mx_block_exponent(amax);\n"
                    "  float inv_scale = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);\n"
                    "#pragma unroll\n"
                    "  for (int k = 0; k < MX_BLOCK; k++)\n"
                    "    if (k < count) %s(out, first + k * COLS, e4m3_round(v[k] * inv_scale) * scale);\n",
                (long long)chunks, lt, st);
    }
    kb_end(&kb, b.data);
    sb_free(&b);
    return s;
  }
  // fp8: amax over the whole tensor, then quantize with scale = amax / 448.
  int amax = fp8_amax(L, node, t, sname, role);
  char body[1024];
  snprintf(name, sizeof name, "quantize_fp8_%s", id);
  snprintf(what, sizeof what, "%s operand to fp8 (E4M3, one scale)", role);
  lower_comment(L, node, what);
  kb_begin(&kb, L, node, name, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_scratch(&kb, dtype_ctype(type), "out", s, true);
  kb_tensor_in(&kb, "x", t);
  kb_scratch(&kb, "unsigned", "amax_bits", amax, false);
  kb_size(&kb, "n", elems);
  snprintf(body, sizeof body,
           "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (i >= n) return;\n"
           "  float scale = __uint_as_float(*amax_bits) / 448.0f;\n"
           "  if (!(scale > 0.0f)) scale = 1.0f;\n"
           "  %s(out, i, e4m3_round(%s(x, i) / scale) * scale);\n",
           st, lt);
  kb_end(&kb, body);
  return s;
}

// --- fp8 on the tensor cores (cuBLASLt FP8) ------------------------------------------------
//
// cuBLASLt's FP8 GEMMs take E4M3 bytes with one fp32 scale per operand, read from device memory,
// and both operands K-major (its "TN" form; our row-major C = A · Bᵀ with A stored [m, k] and B
// stored [n, k]), leading dimensions a multiple of 16 bytes, and an fp32 C here. So an fp8
// operand is written once, K-major, as E4M3 codes: a row of R·Kp bytes per non-reduced index, the
// reduction padded with zeros to Kp = K rounded up to 16 (zeros add nothing to the products),
// and the GEMM's k rounded the same way (Launch.gemm_k_align). The codes and the scale are the
// CPU's (fp8_quantize: amax / 448, e4m3(x / scale)); the GEMM's products of codes are exact in
// fp32 and it multiplies the sum by both scales, so only the order of the fp32 sum differs
// from the executor's (Σ (qa·sa)(qb·sb)).
enum { FP8_K_ALIGN = 16 };

static Launch *new_gemm(Lower *L, int node, LaunchArg a, LaunchArg b, LaunchArg c, SymSize m,
                        int64_t n, SymSize k, DType type);

// The GEMM's fp8 path is taken when cuBLASLt's FP8 kernels can write the result: an fp32 C of
// a row width that keeps its rows 16-byte aligned, and no bias (the fp32 path keeps biased fp8
// linears).
static bool fp8_on_tensor_cores(const Node *n, int64_t c_cols, bool has_bias) {
  return n->prec == DT_FP8 && !has_bias && c_cols % 4 == 0;
}

// The operand's amax (fp8_amax), then the E4M3 codes, K-major and zero-padded, into a new
// scratch; the quantize kernel also writes the scale, a float in a scratch of its own
// (*scale_slot), for the GEMM. src_k_major: t is stored [R, K] (else [K, R], transposed here
// through shared memory, a 32 x 32 tile a block). Returns the codes' slot.
static int quantize_fp8_codes(Lower *L, int node, int t, bool src_k_major, const char *role,
                              int *scale_slot) {
  const Ir *ir = L->ir;
  SymSize rows = tensor_rows(ir, t);
  int64_t cols = tensor_width(ir, t);
  char sname[300], cname[320], name[300], id[256], what[160], body[256];
  snprintf(sname, sizeof sname, "%s.%s.e4m3", ir->tensors[ir->nodes[node].out].name, role);
  ident(id, sizeof id, sname);
  snprintf(cname, sizeof cname, "%s.scale", sname);
  int amax = fp8_amax(L, node, t, sname, role);
  int scale = lower_new_scratch(L, cname, sym_const(4));
  *scale_slot = scale;
  KernelBuilder kb;
  if (!L->have_fp8_codes_kernels) {
    sb_puts(&L->src, "\n// --- fp8 GEMM operands: E4M3 codes, K-major (kernels/fp8_codes.cuh) ---\n");
    sb_puts(&L->src, kernel_fp8_codes_cuh);
    L->have_fp8_codes_kernels = true;
  }
  snprintf(name, sizeof name, "quantize_fp8_codes_%s", id);
  snprintf(what, sizeof what, "%s operand to E4M3 codes, K-major%s, K padded to %d", role,
           src_k_major ? "" : " (transposed)", FP8_K_ALIGN);
  lower_comment(L, node, what);
  int codes;
  if (src_k_major) {
    // t is [R, K], K = cols fixed: a thread per 4 codes of a row.
    int64_t kp = (cols + FP8_K_ALIGN - 1) / FP8_K_ALIGN * FP8_K_ALIGN;
    codes = lower_new_scratch(L, sname, sym_scale(rows, kp));
    kb_begin(&kb, L, node, name, sym_scale(rows, kp / 4), ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
    kb_scratch(&kb, "unsigned", "out", codes, true);
    kb_tensor_in(&kb, "x", t);
    kb_scratch(&kb, "unsigned", "amax_bits", amax, false);
    kb_scratch(&kb, "float", "scale_out", scale, true);
    kb_size(&kb, "rows", rows);
    snprintf(body, sizeof body, "  fp8_codes_rows<%lld, %lld>(out, x, amax_bits, scale_out, rows);\n",
             (long long)cols, (long long)kp);
    kb_end(&kb, body);
    return codes;
  }
  // t is [K, R], K = its rows (symbolic for a weight gradient's jagged reduction), R = cols: a
  // block per 32 x 32 tile. The grid counts (K + 31) / 32 tiles down K for each of the
  // r_tiles across (the few past the padded K return).
  int64_t r_tiles = (cols + 31) / 32;
  codes = lower_new_scratch(L, sname, sym_scale(sym_add(rows, sym_const(FP8_K_ALIGN - 1)), cols));
  kb_begin(&kb, L, node, name, sym_add(sym_scale(rows, r_tiles), sym_const(31 * r_tiles)), 32, 256);
  kb_scratch(&kb, "unsigned char", "out", codes, true);
  kb_tensor_in(&kb, "x", t);
  kb_scratch(&kb, "unsigned", "amax_bits", amax, false);
  kb_scratch(&kb, "float", "scale_out", scale, true);
  kb_size(&kb, "kdim", rows);
  snprintf(body, sizeof body, "  fp8_codes_transposed<%lld>(out, x, amax_bits, scale_out, kdim);\n",
           (long long)cols);
  kb_end(&kb, body);
  return codes;
}

// The fp8 GEMM C[m, n] = A · Bᵀ over E4M3 codes: a (stored [m, K]) and b ([n, K]) are the
// operand tensors with their layouts as stored (a_k_major: a is [m, K], else [K, m]; the same
// for b with n).
static Launch *fp8_gemm(Lower *L, int node, int a, bool a_k_major, int b, bool b_k_major,
                        const char *ra, const char *rb, LaunchArg c, SymSize m, int64_t n, SymSize k) {
  int sa, sb;
  int qa = quantize_fp8_codes(L, node, a, a_k_major, ra, &sa);
  int qb = quantize_fp8_codes(L, node, b, b_k_major, rb, &sb);
  Launch *g = new_gemm(L, node, scratch_arg(qa), scratch_arg(qb), c, m, n, k, DT_FP8);
  g->gemm_trans_b = true;
  g->gemm_scale_a = scratch_arg(sa);
  g->gemm_scale_b = scratch_arg(sb);
  g->gemm_k_align = FP8_K_ALIGN;
  return g;
}

// Prepares operand t (rows x cols, reduction along cols when k_contiguous) for a GEMM of
// type `type` at precision `prec`: returns the argument the GEMM reads.
static LaunchArg prepare_operand(Lower *L, int node, int t, DType prec, DType type, bool k_contiguous,
                                 const char *role) {
  const Ir *ir = L->ir;
  DType have = ir->tensors[t].dtype;
  if (prec == DT_FP8 || prec == DT_MXFP8)
    return scratch_arg(lower_quantize_operand(L, node, t, prec, type, k_contiguous, role));
  if (have == type || (type == DT_BF16 && (have == DT_FP8 || have == DT_MXFP8))) return tensor_arg(t);
  SymSize elems = tensor_elems(ir, t);
  char sname[300], name[300], id[256], what[128], body[512];
  snprintf(sname, sizeof sname, "%s.%s.%s", ir->tensors[ir->nodes[node].out].name, role, dtype_name(type));
  int s = lower_new_scratch(L, sname, sym_scale(elems, dtype_size(type)));
  ident(id, sizeof id, sname);
  snprintf(name, sizeof name, "cast_%s", id);
  snprintf(what, sizeof what, "%s operand %s to %s", role, dtype_name(have), dtype_name(type));
  lower_comment(L, node, what);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_scratch(&kb, dtype_ctype(type), "out", s, true);
  kb_tensor_in(&kb, "x", t);
  kb_size(&kb, "n", elems);
  snprintf(body, sizeof body,
           "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (i < n) %s(out, i, %s(x, i));\n", dtype_store(type), dtype_load(have));
  kb_end(&kb, body);
  return scratch_arg(s);
}

static Launch *new_gemm(Lower *L, int node, LaunchArg a, LaunchArg b, LaunchArg c, SymSize m,
                        int64_t n, SymSize k, DType type) {
  Launch *g = lower_new_launch(L, LAUNCH_GEMM, node);
  g->gemm_a = a;
  g->gemm_b = b;
  g->gemm_c = c;
  g->gemm_bias = tensor_arg(-1);
  g->gemm_bias.kind = ARG_INT;
  g->gemm_m = m;
  g->gemm_n = n;
  g->gemm_k = k;
  g->gemm_dtype = type;
  g->gemm_act = ACT_NONE;
  g->gemm_scale_a = tensor_arg(-1);
  g->gemm_scale_a.kind = ARG_INT;
  g->gemm_scale_b = g->gemm_scale_a;
  g->gemm_k_align = 0;
  g->threads = 0;
  g->per_block = 0;
  return g;
}

// The pointwise tail of a GEMM that went through fp32 scratch: act (forward) or dy ⊙ act'
// (linear_act_bwd), written in the output's dtype.
static void epilogue_kernel(Lower *L, int node, int scratch, bool bwd) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  char name[300], id[256], body[1024];
  ident(id, sizeof id, ir->tensors[n->out].name);
  snprintf(name, sizeof name, "%s_%s_%s", bwd ? "act_grad" : "act", act_name(node_act(n)), id);
  lower_comment(L, node, bwd ? "dy times act' of the recomputed pre-activation" : "activation epilogue");
  SymSize elems = tensor_elems(ir, n->out);
  KernelBuilder kb;
  kb_begin(&kb, L, node, name, elems, ELEMENTWISE_THREADS, ELEMENTWISE_THREADS);
  kb_tensor_out(&kb, "out", n->out);
  if (bwd) kb_tensor_in(&kb, "dy", n->ins[0]);
  kb_scratch(&kb, "float", "pre", scratch, false);
  kb_size(&kb, "n", elems);
  if (bwd)
    snprintf(body, sizeof body,
             "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) %s(out, i, (float)((double)%s(dy, i) * %s_grad((double)pre[i])));\n",
             dtype_store(ir->tensors[n->out].dtype), dtype_load(ir->tensors[n->ins[0]].dtype), act_fn(node_act(n)));
  else
    snprintf(body, sizeof body,
             "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) %s(out, i, (float)%s((double)pre[i]));\n",
             dtype_store(ir->tensors[n->out].dtype), act_fn(node_act(n)));
  kb_end(&kb, body);
}

bool lower_gemm(Lower *L, int node) {
  const Ir *ir = L->ir;
  const Node *n = &ir->nodes[node];
  DType type = gemm_type(n->prec);
  switch (n->op) {
    case OP_LINEAR:
    case OP_LINEAR_ACT_BWD: {
      bool bwd = n->op == OP_LINEAR_ACT_BWD;
      int x = n->ins[bwd ? 1 : 0], w = n->ins[bwd ? 2 : 1];
      int bias = n->nins > (bwd ? 3 : 2) ? n->ins[bwd ? 3 : 2] : -1;
      DType out = ir->tensors[n->out].dtype;
      SymSize m = tensor_rows(ir, x);
      int64_t cols = tensor_width(ir, w);
      if (fp8_on_tensor_cores(n, cols, bias >= 0)) {
        // x is [M, d] (K-major), w is [d, n] (transposed into [n, d] codes).
        bool direct = !bwd && out == DT_F32 && node_act(n) == ACT_NONE;
        int pre = -1;
        LaunchArg c = tensor_arg(n->out);
        if (!direct) {
          char sname[300];
          snprintf(sname, sizeof sname, "%s.preact", ir->tensors[n->out].name);
          pre = lower_new_scratch(L, sname, sym_scale(m, cols * 4));
          c = scratch_arg(pre);
        }
        fp8_gemm(L, node, x, true, w, false, "x", "w", c, m, cols, sym_const(tensor_width(ir, x)));
        if (!direct) epilogue_kernel(L, node, pre, bwd);
        return true;
      }
      LaunchArg a = prepare_operand(L, node, x, n->prec, type, true, "x");
      LaunchArg b = prepare_operand(L, node, w, n->prec, type, false, "w");
      bool direct = !bwd && (out == type || out == DT_F32) &&
                    (node_act(n) == ACT_NONE || node_act(n) == ACT_RELU);
      LaunchArg c;
      int pre = -1;
      if (direct) {
        c = tensor_arg(n->out);
      } else {
        char sname[300];
        snprintf(sname, sizeof sname, "%s.preact", ir->tensors[n->out].name);
        pre = lower_new_scratch(L, sname, sym_scale(m, cols * 4));
        c = scratch_arg(pre);
      }
      Launch *g = new_gemm(L, node, a, b, c, m, cols, sym_const(tensor_width(ir, x)), type);
      if (bias >= 0) {
        g->gemm_bias = tensor_arg(bias);
        g->gemm_has_bias = true;
      }
      if (direct) g->gemm_act = node_act(n);
      if (!direct) epilogue_kernel(L, node, pre, bwd);
      return true;
    }
    case OP_LINEAR_BWD_X: {
      int dz = n->ins[0], w = n->ins[1];
      DType out = ir->tensors[n->out].dtype;
      SymSize m = tensor_rows(ir, dz);
      int64_t d = tensor_width(ir, n->out);
      if (fp8_on_tensor_cores(n, d, false)) {
        // dz is [M, n] and w is [d, n]: both K-major already.
        LaunchArg c = tensor_arg(n->out);
        int s = -1;
        if (out != DT_F32) {
          char sname[300];
          snprintf(sname, sizeof sname, "%s.fp32", ir->tensors[n->out].name);
          s = lower_new_scratch(L, sname, sym_scale(m, d * 4));
          c = scratch_arg(s);
        }
        fp8_gemm(L, node, dz, true, w, true, "dz", "w", c, m, d, sym_const(tensor_width(ir, dz)));
        if (s >= 0) epilogue_kernel(L, node, s, false);  // act none: a rounding copy
        return true;
      }
      LaunchArg a = prepare_operand(L, node, dz, n->prec, type, true, "dz");
      LaunchArg b = prepare_operand(L, node, w, n->prec, type, true, "w");
      if (out == type || out == DT_F32) {
        Launch *g = new_gemm(L, node, a, b, tensor_arg(n->out), m, d, sym_const(tensor_width(ir, dz)), type);
        g->gemm_trans_b = true;
        return true;
      }
      char sname[300];
      snprintf(sname, sizeof sname, "%s.fp32", ir->tensors[n->out].name);
      int s = lower_new_scratch(L, sname, sym_scale(m, d * 4));
      Launch *g = new_gemm(L, node, a, b, scratch_arg(s), m, d, sym_const(tensor_width(ir, dz)), type);
      g->gemm_trans_b = true;
      epilogue_kernel(L, node, s, false);  // act none: a rounding copy
      return true;
    }
    case OP_LINEAR_BWD_W: {
      int x = n->ins[0], dz = n->ins[1];
      if (fp8_on_tensor_cores(n, tensor_width(ir, dz), false) && ir->tensors[n->out].dtype == DT_F32) {
        // x is [M, d] and dz is [M, n], the reduction over M: both transposed into codes.
        fp8_gemm(L, node, x, false, dz, false, "x", "dz", tensor_arg(n->out),
                 sym_const(tensor_width(ir, x)), tensor_width(ir, dz), tensor_rows(ir, x));
        return true;
      }
      LaunchArg a = prepare_operand(L, node, x, n->prec, type, false, "x");
      LaunchArg b = prepare_operand(L, node, dz, n->prec, type, false, "dz");
      Launch *g = new_gemm(L, node, a, b, tensor_arg(n->out), sym_const(tensor_width(ir, x)),
                           tensor_width(ir, dz), tensor_rows(ir, x), type);
      g->gemm_trans_a = true;
      return true;
    }
    default: break;
  }
  return lower_fail(L, node, "not a linear op");
}
