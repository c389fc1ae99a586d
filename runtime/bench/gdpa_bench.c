// gdpa_bench.c: GDPA forward and backward TFLOP/s on the public benchmark shapes, or on the
// batches of lengths files (gdpa_bench.h, docs/gdpa_bench.md). Every kernel is compiled first
// (so --compile-only checks them without a GPU), then each row gets a batch of its workload's
// lengths (gdpa_case.h) filled with random bf16 inputs, one warm-up run and `reps` timed runs;
// the outputs are checked for NaN/inf afterwards.
#include "gdpa_bench.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"           // defines: Arena, arena_free
#include "checked.h"         // defines: fail, xmalloc
#include "gdpa_gpu.h"        // defines: GdpaBatch, gdpa_gpu_*, gdpa_batch_*, GdpaRange, gdpa_run_range
#include "gpu_tiles.h"       // defines: gpu_tiles_build, gpu_tiles_build_plain, gpu_tiles_spread
#include "internal_error.h"  // defines: GEMC_ASSERT, GEMC_UNREACHABLE
#include "target.h"          // defines: target_find (the HBM bandwidth of the roofline)

enum { BENCH_B = 1152, BENCH_H = 4, BENCH_DH = 128 };

// --- the rows -----------------------------------------------------------------------------

// The attention forms the rows run on, each compiled once.
typedef enum BenchKernel {
  KERNEL_SELF,          // q and kv on one jagged dim: lq = lk
  KERNEL_CROSS_JAGGED,  // q and kv on jagged dims of their own: Meta's self s < 1, files
  KERNEL_CROSS_KV256,   // kv a set of 256 keys per example
  KERNEL_CROSS_KV16,    // kv a set of 16 keys per example
  KERNEL_PMA16,         // 16 seeds, shared by the batch, over a jagged kv
  KERNEL_PMA32,         // 32 seeds
  NUM_KERNELS
} BenchKernel;

static const char *const kernel_names[NUM_KERNELS] = {
    "self", "cross, jagged kv", "cross, kv set", "cross, kv set", "pma", "pma"};

// Where a Triton number comes from. Neither is this run: tests/gpu/gdpa_vs_triton.sh runs
// both sides on the same batches.
typedef enum PeerSource {
  PEER_NONE,
  PEER_ISSUE,   // issue 10's table (Meta's Triton GDPA, fast_gelu, on our H200)
  PEER_README,  // ../shared/peers/README.md's table, the same runs; marked '*'
} PeerSource;

// One row of the main table: a workload (gdpa_case.h) at one N, and the peer's numbers.
typedef struct BenchRow {
  const char *name;
  GdpaWorkload w;
  double s;
  int64_t n, k;          // N; the keys of a cross set or the seeds of a PMA
  const char *lq, *lk;   // the lengths, in words
  double peer_fwd, peer_bwd;
  PeerSource peer;
} BenchRow;

// The rows of one definition at one N, with the peer's forward / backward and their source.
#define META_SELF_05(n, f, b, src) \
  {"Meta self s=0.5", GDPA_META_SELF, 0.5, n, 0, "U[1,N]", "N", f, b, src}
#define META_SELF_10(n, f, b, src) \
  {"Meta self s=1.0", GDPA_META_SELF, 1.0, n, 0, "N", "N", f, b, src}
#define JAGGED_SELF(n, f, b, src) \
  {"jagged self", GDPA_JAGGED_SELF, 0.5, n, 0, "U[1,N]", "= lq", f, b, src}
#define CROSS_256(n, f, b, src) {"cross KV=256", GDPA_CROSS, 1.0, n, 256, "N", "256", f, b, src}

// The three definitions side by side at each N, then cross KV=16 and PMA.
static const BenchRow bench_rows[] = {
    META_SELF_05(512, 304, 236, PEER_README),
    META_SELF_10(512, 362, 292, PEER_ISSUE),
    JAGGED_SELF(512, 284, 230, PEER_README),
    CROSS_256(512, 310, 259, PEER_README),
    META_SELF_05(1024, 376, 285, PEER_ISSUE),
    META_SELF_10(1024, 428, 323, PEER_ISSUE),
    JAGGED_SELF(1024, 347, 277, PEER_ISSUE),
    CROSS_256(1024, 318, 270, PEER_ISSUE),
    META_SELF_05(2048, 436, 321, PEER_README),
    META_SELF_10(2048, 467, 342, PEER_ISSUE),
    JAGGED_SELF(2048, 409, 317, PEER_README),
    CROSS_256(2048, 325, 278, PEER_README),
    {"cross KV=16", GDPA_CROSS, 1.0, 1024, 16, "N", "16", 0, 0, PEER_NONE},
    {"PMA 16 seeds", GDPA_PMA, 1.0, 4096, 16, "16 seeds", "lognormal <= N", 0, 0, PEER_NONE},
    {"PMA 32 seeds", GDPA_PMA, 1.0, 4096, 32, "32 seeds", "lognormal <= N", 19, 58, PEER_ISSUE},
};
enum { NUM_ROWS = (int)(sizeof bench_rows / sizeof *bench_rows) };

// The longest jagged q and kv the self and cross kernels of the table are compiled for.
enum { TABLE_MAX_N = 2048, TABLE_PMA_N = 4096 };

static BenchKernel row_kernel(const BenchRow *r) {
  switch (r->w) {
  case GDPA_META_SELF: return r->s == 1.0 ? KERNEL_SELF : KERNEL_CROSS_JAGGED;  // s=1: lq = N
  case GDPA_JAGGED_SELF: return KERNEL_SELF;
  case GDPA_CROSS: return r->k == 16 ? KERNEL_CROSS_KV16 : KERNEL_CROSS_KV256;
  case GDPA_PMA: return r->k == 16 ? KERNEL_PMA16 : KERNEL_PMA32;
  }
  GEMC_UNREACHABLE();
}

// --quick keeps the three definitions at N=1024.
static bool row_in_quick(const BenchRow *r) {
  return r->n == 1024 && (r->w != GDPA_CROSS || r->k == 256);
}

// The same batch for the same row, run after run.
static uint64_t row_seed(const BenchRow *r) {
  return 1000003u * (uint64_t)(r->w + 1) + 7919u * (uint64_t)r->n + (uint64_t)(r->s * 100) +
         (uint64_t)r->k;
}

// The case of kernel `which`; max_q, max_kv: the longest jagged q and kv (only the hstu norm
// reads them, and the jagged dims carry them).
static GdpaCase kernel_case(BenchKernel which, Act act, int64_t max_q, int64_t max_kv) {
  GdpaCase c = {.shape = ATTN_SELF, .act = act, .heads = BENCH_H, .dh = BENCH_DH,
                .max_q = max_q, .max_kv = max_q, .scale = 1.0 / sqrt(BENCH_DH)};
  switch (which) {
  case KERNEL_SELF: break;
  case KERNEL_CROSS_JAGGED: c.shape = ATTN_CROSS, c.max_kv = max_kv; break;
  case KERNEL_CROSS_KV256: c.shape = ATTN_CROSS, c.kv_set = c.max_kv = 256; break;
  case KERNEL_CROSS_KV16: c.shape = ATTN_CROSS, c.kv_set = c.max_kv = 16; break;
  case KERNEL_PMA16: c.shape = ATTN_PMA, c.q_set = 16, c.max_q = 0, c.max_kv = max_kv; break;
  case KERNEL_PMA32: c.shape = ATTN_PMA, c.q_set = 32, c.max_q = 0, c.max_kv = max_kv; break;
  case NUM_KERNELS: GEMC_UNREACHABLE();
  }
  return c;
}

// The activations of the "other activations" section, after the main table.
static const Act other_acts[] = {ACT_GELU, ACT_GELU_TAYLOR, ACT_SILU, ACT_SOFTMAX};
enum { NUM_OTHER_ACTS = (int)(sizeof other_acts / sizeof *other_acts) };

// Forward schedule variants (tile_q, tile_m) of the "block shapes" section.
static const int block_shapes[2][2] = {{128, 16}, {64, 16}};

// --- compiling ----------------------------------------------------------------------------

// Fills a bf16 tensor with hashed uniform values in [-amp, amp], on the device.
static const char *const fill_kernel =
    "\nextern \"C\" __global__ void bench_fill(bf16_t *p, i64 n, unsigned seed, float amp) {\n"
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  unsigned x = (unsigned)i * 2654435761u ^ seed;\n"
    "  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;\n"
    "  float u = (float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;\n"
    "  p[i] = (bf16_t)(attn_pack_bf16(u * amp, 0.0f) & 0xffffu);\n"
    "}\n";

// One case, compiled (and loaded, unless compiling only).
typedef struct Compiled {
  GdpaEmitted e;
  Arena arena;
  void *module;
  bool built;
} Compiled;

static bool compile_case(const GdpaCase *c, const char *arch, const char *cache, bool load,
                         bool deal_zigzag, bool atomic_dq, Compiled *out, char *err,
                         size_t err_size) {
  StrBuf src = {0};
  memset(out, 0, sizeof *out);
  void *cubin = NULL;
  GdpaEmitOptions x = {.atomic_dq = atomic_dq};
  if (!gdpa_case_emit_with(c, &x, BENCH_B, "b.", &out->arena, &src, &out->e)) {
    char name[128];
    gdpa_case_name(c, name, sizeof name);
    fail(err, err_size, "the attention emitter refused %s", name);
  } else {
    size_t size = 0;
    sb_puts(&src, fill_kernel);
    cubin = gdpa_gpu_compile(src.data, arch, cache, &size, err, err_size);
  }
  sb_free(&src);
  out->built = true;  // its arena is the caller's to free from here on
  for (int i = 0; deal_zigzag && i < out->e.ntiles; i++) out->e.tiles[i].persistent = false;
  if (!cubin) return false;
  bool ok = !load || gdpa_gpu_load_module(cubin, &out->module, err, err_size);
  free(cubin);
  return ok;
}

// Every kernel the run needs: the rows' forms, the other activations and the block shapes.
typedef struct BenchKernels {
  Compiled main[NUM_KERNELS], other[NUM_OTHER_ACTS], shapes[2];
} BenchKernels;

static void free_all(BenchKernels *k) {
  for (int i = 0; i < NUM_KERNELS; i++)
    if (k->main[i].built) arena_free(&k->main[i].arena);
  for (int i = 0; i < NUM_OTHER_ACTS; i++)
    if (k->other[i].built) arena_free(&k->other[i].arena);
  for (int i = 0; i < 2; i++)
    if (k->shapes[i].built) arena_free(&k->shapes[i].arena);
}

// The kernel a lengths file runs on.
static BenchKernel lengths_kernel(const GdpaLengths *l) {
  return gdpa_lengths_self(l) ? KERNEL_SELF : KERNEL_CROSS_JAGGED;
}

static bool compile_all(const GdpaBenchOptions *o, const char *arch, bool load,
                        BenchKernels *k, char *err, size_t err_size) {
  bool need[NUM_KERNELS] = {false};
  int64_t max_q = 1, max_kv = 1, pma_kv = TABLE_PMA_N;
  if (o->nlengths > 0) {
    for (int i = 0; i < o->nlengths; i++) {
      int64_t q = gdpa_lengths_max_q(&o->lengths[i]), kv = gdpa_lengths_max_k(&o->lengths[i]);
      need[lengths_kernel(&o->lengths[i])] = true;
      max_q = q > max_q ? q : max_q;
      max_kv = kv > max_kv ? kv : max_kv;
    }
  } else {
    for (int i = 0; i < NUM_ROWS; i++)
      if (!o->quick || row_in_quick(&bench_rows[i])) need[row_kernel(&bench_rows[i])] = true;
    max_q = max_kv = TABLE_MAX_N;
  }
  for (int i = 0; i < NUM_KERNELS; i++) {
    bool pma = i == KERNEL_PMA16 || i == KERNEL_PMA32;
    GdpaCase c = kernel_case((BenchKernel)i, o->act, max_q, pma ? pma_kv : max_kv);
    if (need[i] &&
        !compile_case(&c, arch, o->cache_dir, load, o->deal_zigzag, o->atomic_dq, &k->main[i], err, err_size))
      return false;
  }
  if (o->quick || o->nlengths > 0) return true;
  for (int i = 0; i < NUM_OTHER_ACTS; i++) {
    GdpaCase x = kernel_case(KERNEL_SELF, other_acts[i], max_q, max_q);
    if (other_acts[i] != o->act &&
        !compile_case(&x, arch, o->cache_dir, load, o->deal_zigzag, o->atomic_dq, &k->other[i], err, err_size))
      return false;
  }
  for (int i = 0; i < 2; i++) {
    GdpaCase x = kernel_case(KERNEL_SELF, o->act, max_q, max_q);
    x.tile_q = block_shapes[i][0], x.tile_m = block_shapes[i][1];
    if (!compile_case(&x, arch, o->cache_dir, load, o->deal_zigzag, o->atomic_dq, &k->shapes[i], err, err_size))
      return false;
  }
  return true;
}

// --- measuring ----------------------------------------------------------------------------

// Whether a sample of tensor t (bf16, fp16 or fp32) holds no NaN/inf and is not all zero, into
// *good; false when reading it back failed.
static bool all_finite_sample(GdpaBatch *bt, int t, bool *good, char *err, size_t err_size) {
  DType dt = bt->e->ir.tensors[t].dtype;
  size_t width = dt == DT_F32 ? 4 : 2;
  size_t n = bt->tensor_bytes[t] / width;
  if (n > (1u << 22)) n = 1u << 22;
  unsigned char *h = xmalloc(n * width + 4);
  if (!gdpa_gpu_download(h, bt->tensor[t], n * width, err, err_size)) {
    free(h);
    return false;
  }
  // exponent bits all set: inf or NaN
  uint32_t exp_mask = dt == DT_F32 ? 0x7f800000u : dt == DT_FP16 ? 0x7c00u : 0x7f80u;
  uint32_t abs_mask = dt == DT_F32 ? 0x7fffffffu : 0x7fffu;
  bool ok = true, nonzero = n == 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t x = 0;
    if (width == 4) {
      memcpy(&x, h + 4 * i, 4);
    } else {
      uint16_t x16;
      memcpy(&x16, h + 2 * i, 2);
      x = x16;
    }
    if ((x & exp_mask) == exp_mask) ok = false;
    if (x & abs_mask) nonzero = true;
  }
  free(h);
  *good = ok && nonzero;
  return true;
}

// What every measurement shares: the timed repetitions, the CTAs of the spread (the SMs),
// whether every output so far came out good, and where a failing CUDA call is reported.
typedef struct Bench {
  int reps;
  int ctas;
  bool good;  // no output so far held NaN/inf or was all zero
  char *err;
  size_t err_size;
} Bench;

// The forward tile list's spread: the largest over the smallest per-CTA work of a persistent
// grid (gpu_tiles_spread), before (plain order) and after this run's deal.
typedef struct Spread {
  double before, after;  // 0: not measured (out of memory); INFINITY: a CTA without work
  const char *deal;      // "lpt", "zigzag" or "sorted": how gpu_tiles_build dealt the list
} Spread;

// One measured row.
typedef struct Measured {
  double fwd, bwd;        // TFLOP/s
  double fwd_ms, bwd_ms;  // per run
  Spread spread;
} Measured;

static double load_ratio(const TileList *tl, const GdpaBatch *bt, const int32_t *tiles,
                         int64_t n, int ctas) {
  int64_t hi = 0, lo = 0;
  const int64_t *q = tl->q_jag >= 0 ? bt->offsets[tl->q_jag] : NULL;
  const int64_t *kv = tl->kv_jag >= 0 ? bt->offsets[tl->kv_jag] : NULL;
  if (n < 0 || !gpu_tiles_spread(tl, q, kv, tiles, n, ctas, &hi, &lo)) return 0;
  return lo > 0 ? (double)hi / (double)lo : hi > 0 ? INFINITY : 1.0;
}

// The spread of the forward's tile list (the first forward launch that has one) over bt.
static Spread forward_spread(const GdpaBatch *bt, int ctas) {
  const GdpaEmitted *e = bt->e;
  Spread s = {0, 0, "-"};
  int list = -1;
  for (int i = 0; i < e->nforward && list < 0; i++)
    if (e->launches[i].grid != GRID_FIXED) list = e->launches[i].tiles;
  if (list < 0) return s;
  const TileList *tl = &e->tiles[list];
  const int64_t *q = tl->q_jag >= 0 ? bt->offsets[tl->q_jag] : NULL;
  const int64_t *kv = tl->kv_jag >= 0 ? bt->offsets[tl->kv_jag] : NULL;
  int32_t *tiles = NULL;
  int64_t n = gpu_tiles_build_plain(tl, bt->B, q, kv, &tiles);
  s.before = load_ratio(tl, bt, tiles, n, ctas);
  free(tiles);
  n = gpu_tiles_build(tl, bt->B, q, kv, ctas, &tiles);  // as gdpa_gpu.c deals it
  s.after = load_ratio(tl, bt, tiles, n, ctas);
  free(tiles);
  s.deal = tl->persistent ? "lpt" : tl->zigzag ? "zigzag" : "sorted";
  return s;
}

// Forward and backward TFLOP/s of kernel k over the batch `len` (m->good turns false when an
// output came out bad); false when a CUDA call failed, with m->err saying which.
static bool measure(Bench *m, const Compiled *k, const GdpaLengths *len, Measured *r) {
  const GdpaEmitted *e = &k->e;
  char *err = m->err;
  size_t err_size = m->err_size;
  // q's lengths on q's jagged dim, kv's on kv's; self has one dim, so they must agree
  GEMC_ASSERT(e->q_jag < 0 || e->q_jag != e->kv_jag || gdpa_lengths_self(len));
  GEMC_ASSERT(e->ir.njagged <= 4);
  int64_t *lengths[4] = {NULL};
  for (int j = 0; j < e->ir.njagged; j++) lengths[j] = xmalloc((size_t)len->n * sizeof(int64_t));
  if (e->q_jag >= 0) memcpy(lengths[e->q_jag], len->lq, (size_t)len->n * sizeof(int64_t));
  if (e->kv_jag >= 0) memcpy(lengths[e->kv_jag], len->lk, (size_t)len->n * sizeof(int64_t));
  GdpaBatch bt;
  bool ok = gdpa_batch_init(&bt, e, k->module, len->n, lengths, err, err_size);
  for (int j = 0; j < 4; j++) free(lengths[j]);
  if (!ok) return false;
  r->spread = forward_spread(&bt, m->ctas);
  void *fill = NULL;
  ok = gdpa_gpu_function(k->module, "bench_fill", &fill, err, err_size);
  const int inputs[4] = {e->q, e->k, e->v, e->dout};
  for (int i = 0; ok && i < 4; i++) {
    long long count = (long long)(bt.tensor_bytes[inputs[i]] / 2);
    unsigned seed = 1234u + 977u * (unsigned)i;
    float amp = i < 2 ? 1.5f : 1.0f;
    void *args[] = {&bt.tensor[inputs[i]], &count, &seed, &amp};
    ok = gdpa_gpu_launch(fill, (unsigned)((count + 255) / 256), 256, 0, args, err, err_size);
  }
  GdpaRange f = {&bt, 0, e->nforward}, b = {&bt, e->nforward, e->nlaunches};
  ok = ok && gdpa_run_range(&f, err, err_size) && gdpa_run_range(&b, err, err_size) &&
       gdpa_gpu_sync(err, err_size);  // warm up
  double flops = 4.0 * BENCH_H * BENCH_DH * gdpa_lengths_pairs(len);
  r->fwd_ms = r->bwd_ms = 0;
  ok = ok && gdpa_gpu_time_ms(gdpa_run_range, &f, m->reps, &r->fwd_ms, err, err_size) &&
       gdpa_gpu_time_ms(gdpa_run_range, &b, m->reps, &r->bwd_ms, err, err_size);
  r->fwd = flops / (r->fwd_ms * 1e-3) / 1e12;
  r->bwd = 2.5 * flops / (r->bwd_ms * 1e-3) / 1e12;
  const int outs[4] = {e->out, e->dq, e->dk, e->dv};
  for (int i = 0; ok && i < 4; i++) {
    bool good = true;
    ok = all_finite_sample(&bt, outs[i], &good, err, err_size);
    m->good = m->good && good;
  }
  // A failure freeing the batch is reported only when nothing failed before it.
  return gdpa_batch_free(&bt, ok ? err : NULL, err_size) && ok;
}

// --- printing -----------------------------------------------------------------------------

static void ratio_text(double x, char *buf, size_t cap) {
  if (x == 0) snprintf(buf, cap, "-");
  else if (isinf(x)) snprintf(buf, cap, "inf");
  else snprintf(buf, cap, "%.3f", x);
}

static void spread_text(const Spread *s, char *buf, size_t cap) {
  char before[16], after[16];
  ratio_text(s->before, before, sizeof before);
  ratio_text(s->after, after, sizeof after);
  snprintf(buf, cap, "%s -> %s (%s)", before, after, s->deal);
}

static void print_header(const GdpaBenchOptions *o, FILE *out, bool table) {
  if (table)
    fprintf(out, "GDPA on %s (%d SMs): B=%d, H=%d, dh=%d, bf16, act %s, non-causal\n",
            gdpa_gpu_arch(), gdpa_gpu_num_sms(), BENCH_B, BENCH_H, BENCH_DH, act_name(o->act));
  else
    fprintf(out, "GDPA on %s (%d SMs): the batches of lengths files, H=%d, dh=%d, bf16, act %s, "
                 "non-causal\n", gdpa_gpu_arch(), gdpa_gpu_num_sms(), BENCH_H, BENCH_DH,
            act_name(o->act));
  fprintf(out, "TFLOP/s of useful FLOPs over the real lengths: fwd 4*H*dh*sum(lq*lk), bwd counted "
               "as 2.5x fwd; mean of %d runs after a warm-up\n", o->reps);
  if (o->atomic_dq)
    fprintf(out, "backward with @schedule(deterministic = false): dQ added with float atomics in "
                 "the dK/dV kernel where it applies (sm_90a, dh 128)\n");
}

static void print_footer(const GdpaBenchOptions *o, FILE *out, bool table) {
  if (table) {
    fprintf(out, "Triton: Meta's Triton GDPA (fast_gelu) on our H200, from issue 10's table, "
                 "not this run%s;\n", o->act != ACT_GELU ? " (and for gelu)" : "");
    fprintf(out, "  * from ../shared/peers/README.md's table (the same runs). Same batches, same "
                 "run: tests/gpu/gdpa_vs_triton.sh.\n");
    fprintf(out, "  PMA 32 seeds, Triton: 32 queries of its own per example, not seeds shared "
                 "by the batch.\n");
  }
  fprintf(out, "Tile spread: the largest over the smallest per-CTA work of the forward tile list "
               "(per tile: the key tiles\n  a persistent kernel runs + half a tile, else visible "
               "pairs + rows)\n");
  fprintf(out, "  when CTA c of G=%d takes entries c, c+G, c+2G, ... (a persistent grid); "
               "before: (example, row, head)\n", gdpa_gpu_num_sms());
  fprintf(out, "  order; after: gpu_tiles_build's deal for this run's kernel (lpt: longest first "
               "to the least loaded\n");
  fprintf(out, "  CTA, for a persistent kernel; zigzag: back and forth in waves of G, for a "
               "grid of one CTA per tile).\n");
}

// The bytes a cross forward over a key set must move at least: Q read and O written once (bf16,
// d = H·dh a row), and each example's K and V read once.
static double cross_set_forward_bytes(const GdpaLengths *len) {
  double rows = 0, keys = 0;
  for (int64_t i = 0; i < len->n; i++) rows += (double)len->lq[i], keys += (double)len->lk[i];
  return 2.0 * BENCH_H * BENCH_DH * (2 * rows + 2 * keys);
}

// A forward bound by memory (cross KV=16: 16 FLOP a byte) against the HBM roofline.
static void print_bandwidth(const char *name, const GdpaLengths *len, const Measured *x,
                            FILE *out) {
  const Target *t = target_find("sm_90a");
  double bytes = cross_set_forward_bytes(len), tbps = bytes / (x->fwd_ms * 1e-3) / 1e12;
  double flops = 4.0 * BENCH_H * BENCH_DH * gdpa_lengths_pairs(len);
  double roof = t->hbm_tb_per_s * 1e12 * flops / bytes / 1e12;
  fprintf(out, "%s forward against HBM: %.1f MB moved at least (Q, O, K, V once) in %.4f ms: "
               "%.2f TB/s, %.0f%% of %.1f TB/s; its roofline is %.0f TFLOP/s, %.0f reached\n",
          name, bytes / 1e6, x->fwd_ms, tbps, 100 * tbps / t->hbm_tb_per_s, t->hbm_tb_per_s, roof,
          x->fwd);
}

// The main table, one row per (definition, N). False when a CUDA call failed.
static bool print_main_table(const GdpaBenchOptions *o, const BenchKernels *k, Bench *m,
                             FILE *out) {
  print_header(o, out, true);
  fprintf(out, "| N | definition | lq | lk | kernel | gemc fwd / bwd | Triton fwd / bwd (issue "
               "table, not this run) | tile spread, before -> after |\n");
  fprintf(out, "|---|---|---|---|---|---|---|---|\n");
  GdpaLengths kv16_len = {0};
  Measured kv16 = {0};
  for (int i = 0; i < NUM_ROWS; i++) {
    const BenchRow *r = &bench_rows[i];
    if (o->quick && !row_in_quick(r)) continue;
    GdpaLengths len;
    gdpa_lengths_make(r->w, BENCH_B, r->n, r->s, r->k, row_seed(r), &len);
    BenchKernel which = row_kernel(r);
    Measured x;
    bool ok = measure(m, &k->main[which], &len, &x);
    if (ok && which == KERNEL_CROSS_KV16) kv16 = x, kv16_len = len;
    else gdpa_lengths_free(&len);
    if (!ok) return false;
    char peer[32], spread[64];
    if (r->peer == PEER_NONE)
      snprintf(peer, sizeof peer, "-");
    else
      snprintf(peer, sizeof peer, "%.0f / %.0f%s", r->peer_fwd, r->peer_bwd,
               r->peer == PEER_README ? " *" : "");
    spread_text(&x.spread, spread, sizeof spread);
    fprintf(out, "| %lld | %s | %s | %s | %s | %.0f / %.0f | %s | %s |\n", (long long)r->n,
            r->name, r->lq, r->lk, kernel_names[which], x.fwd, x.bwd, peer, spread);
    fflush(out);
  }
  print_footer(o, out, true);
  if (kv16_len.n) {
    print_bandwidth("cross KV=16", &kv16_len, &kv16, out);
    gdpa_lengths_free(&kv16_len);
  }
  return true;
}

// The other activations and the forward block shapes, Meta self s=1.0 (lq = lk = N), N=1024.
// False when a CUDA call failed.
static bool print_extra_sections(const GdpaBenchOptions *o, const BenchKernels *k, Bench *m,
                                 FILE *out) {
  GdpaLengths len;
  gdpa_lengths_make(GDPA_META_SELF, BENCH_B, 1024, 1.0, 0, 1, &len);
  bool ok = true;
  fprintf(out, "\nOther activations, Meta self s=1.0, N=1024 (fwd / bwd TFLOP/s):\n");
  for (int i = 0; ok && i < NUM_OTHER_ACTS; i++) {
    if (other_acts[i] == o->act) continue;
    Measured x;
    ok = measure(m, &k->other[i], &len, &x);
    if (ok) fprintf(out, "  %-12s %.0f / %.0f\n", act_name(other_acts[i]), x.fwd, x.bwd);
  }
  if (ok)
    fprintf(out, "\nForward block shapes, self %s s=1.0, N=1024 (default: 128 rows, 32 per "
                 "warp):\n", act_name(o->act));
  for (int i = 0; ok && i < 2; i++) {
    Measured x;
    ok = measure(m, &k->shapes[i], &len, &x);
    if (ok)
      fprintf(out, "  tile_q %d tile_m %d: fwd %.0f\n", block_shapes[i][0], block_shapes[i][1],
              x.fwd);
  }
  gdpa_lengths_free(&len);
  return ok;
}

// One row per lengths file. False when a CUDA call failed.
static bool print_lengths_table(const GdpaBenchOptions *o, const BenchKernels *k, Bench *m,
                                FILE *out) {
  print_header(o, out, false);
  fprintf(out, "| lengths file | B | sum lq | max lq | max lk | kernel | gemc fwd / bwd | "
               "ms fwd / bwd | tile spread, before -> after |\n");
  fprintf(out, "|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < o->nlengths; i++) {
    const GdpaLengths *len = &o->lengths[i];
    BenchKernel which = lengths_kernel(len);
    Measured x;
    if (!measure(m, &k->main[which], len, &x)) return false;
    char spread[64];
    spread_text(&x.spread, spread, sizeof spread);
    fprintf(out, "| %s | %lld | %lld | %lld | %lld | %s | %.0f / %.0f | %.4f / %.4f | %s |\n",
            o->lengths_names[i], (long long)len->n, (long long)gdpa_lengths_sum_q(len),
            (long long)gdpa_lengths_max_q(len), (long long)gdpa_lengths_max_k(len),
            kernel_names[which], x.fwd, x.bwd, x.fwd_ms, x.bwd_ms, spread);
    fflush(out);
  }
  print_footer(o, out, false);
  return true;
}

GdpaBenchStatus gdpa_bench_run(const GdpaBenchOptions *o, FILE *out, char *err,
                               size_t err_size) {
  if (!o->compile_only && !gdpa_gpu_open(err, err_size)) return GDPA_BENCH_NO_GPU;
  const char *arch = o->compile_only ? o->compile_only : gdpa_gpu_arch();
  static BenchKernels kernels;  // large: keep it off the stack
  memset(&kernels, 0, sizeof kernels);
  GdpaBenchStatus status = GDPA_BENCH_OK;
  char reason[1024];
  if (!compile_all(o, arch, !o->compile_only, &kernels, reason, sizeof reason)) {
    fail(err, err_size, "compiling the attention kernels for %s failed: %s", arch, reason);
    status = GDPA_BENCH_COMPILE_FAILED;
  } else if (!o->compile_only) {
    Bench m = {.reps = o->reps, .ctas = gdpa_gpu_num_sms(), .good = true, .err = err,
               .err_size = err_size};
    bool ok = o->nlengths > 0 ? print_lengths_table(o, &kernels, &m, out)
                              : print_main_table(o, &kernels, &m, out) &&
                                    (o->quick || print_extra_sections(o, &kernels, &m, out));
    if (!ok) {
      status = GDPA_BENCH_CUDA_FAILED;
    } else if (!m.good) {
      fail(err, err_size, "a benchmark output held NaN/inf or was all zero");
      status = GDPA_BENCH_BAD_OUTPUT;
    }
  }
  free_all(&kernels);
  return status;
}
