// tune.c: the CPU half of the attention autotuner (tune.h, docs/tuning.md): a node's
// candidates, its length buckets and key, the cache file, applying a winner, the timed batch.
#include "tune.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checked.h"  // defines: fail, xmalloc
#include "file_io.h"  // defines: file_read_all, file_write_atomic
#include "attention_sm90_smem.h"  // defines: sm90_attn_forward_smem, _stages
#include "hash.h"     // defines: fnv1a64
#include "version.h"  // defines: GEMC_VERSION

// The sm_90a forward's shared memory (kernels/attention_sm90.cuh's SM90_FORWARD_SMEM, as
// codegen/attention/emit_attention_sm90.c and sema_schedule_attention.c compute it) and the
// 227 KB a block may have; the mma.sync forward's (emit_attention.c's forward_smem_rows).
enum { SM90_TILE_Q = SM90_ATTN_TILE_Q, SM90_MAX_SMEM = SM90_ATTN_MAX_SMEM,
       MAX_ENTRY_BYTES = 64 * 1024 };

static int sm90_smem(int64_t dh, int bn, int stages) {
  return (int)sm90_attn_forward_smem(dh, bn, stages);
}
static int mma_smem(int64_t dh, int rows) { return (int)((rows + 4 * 64) * dh * 2); }

int64_t tune_length_bucket(int64_t max_len) {
  int64_t b = 16;
  while (b < max_len && b < ((int64_t)1 << 40)) b *= 2;
  return b;
}

// --- candidates ---------------------------------------------------------------------------

// Whether candidate c has every value the user gave.
static bool agrees(const Schedule *u, const TuneCandidate *c) {
  return (!u->tile_q || u->tile_q == c->tile_q) && (!u->tile_kv || u->tile_kv == c->tile_kv) &&
         (!u->tile_m || u->tile_m == c->tile_m) && (!u->stages || u->stages == c->stages);
}

static bool same_candidate(const TuneCandidate *a, const TuneCandidate *b) {
  return a->kernel == b->kernel && a->tile_q == b->tile_q && a->tile_kv == b->tile_kv &&
         a->tile_m == b->tile_m && a->stages == b->stages;
}

// Adds c when it agrees with the hints and is not there yet.
static void add_candidate(TuneOp *op, TuneCandidate c) {
  if (!agrees(&op->user, &c) || op->ncand == TUNE_MAX_CANDIDATES) return;
  for (int i = 0; i < op->ncand; i++)
    if (same_candidate(&op->cand[i], &c)) return;
  op->cand[op->ncand++] = c;
}

static TuneCandidate sm90_candidate(int64_t dh, int bn, int stages) {
  return (TuneCandidate){TUNE_SM90, SM90_TILE_Q, bn, 0, stages, sm90_smem(dh, bn, stages)};
}
static TuneCandidate mma_candidate(int64_t dh, int rows, int warp_rows) {
  return (TuneCandidate){TUNE_MMA, rows, 64, warp_rows, 2, mma_smem(dh, rows)};
}

// The sm_90a kernel's candidates, the compiler's choice first: its key tile (the hint, else
// sm90_attn_default_tile_kv) with as many stages as fit (or the hint); then 128-, 64- (and over a small set 32- and 16-) key tiles with 4, 3, 2 stages
// where they fit; then the mma.sync kernel at tile_q = 64 when it can run the node (bf16).
static void sm90_candidates(TuneOp *op, int64_t dh, bool mma_ok, bool q_jagged) {
  const Schedule *u = &op->user;
  int bn = u->tile_kv ? u->tile_kv : sm90_attn_default_tile_kv(op->c.kv_set), stages = u->stages;
  if (!stages) stages = sm90_attn_forward_stages(dh, bn);
  if (sm90_smem(dh, bn, stages) > SM90_MAX_SMEM) return;  // hints that do not fit: no default
  add_candidate(op, sm90_candidate(dh, bn, stages));
  if (op->ncand == 0) return;
  // 32- and 16-key tiles only over a set that fits them (a longer kv would take many more).
  static const int tiles[4] = {128, 64, 32, 16};
  for (int t = 0; t < 4; t++) {
    if (tiles[t] < 64 && (op->c.kv_set <= 0 || op->c.kv_set > tiles[t])) continue;
    for (int s = 4; s >= 2; s--)
      if (sm90_smem(dh, tiles[t], s) <= SM90_MAX_SMEM)
        add_candidate(op, sm90_candidate(dh, tiles[t], s));
  }
  if (mma_ok) add_candidate(op, mma_candidate(dh, 64, q_jagged ? 32 : 16));
}

// The mma.sync kernel's, the compiler's choice first (emit_attention.c's forward_shape: 128
// rows of 32 a warp for jagged q; 32 rows of 16 for at most 32 fixed query rows, PMA seeds or
// pFFN's; else 64 of 16), then every tile_q in {128, 64} by tile_m in {32, 16}.
static void mma_candidates(TuneOp *op, int64_t dh, bool q_jagged, int64_t q_fixed) {
  const Schedule *u = &op->user;
  bool few_rows = !q_jagged && q_fixed > 0 && q_fixed <= 32;
  add_candidate(op, mma_candidate(dh, u->tile_q ? u->tile_q : q_jagged ? 128 : few_rows ? 32 : 64,
                                  u->tile_m ? u->tile_m : q_jagged ? 32 : 16));
  if (op->ncand == 0) return;
  static const int rows[2] = {128, 64}, warp_rows[2] = {32, 16};
  for (int r = 0; r < 2; r++)
    for (int w = 0; w < 2; w++) add_candidate(op, mma_candidate(dh, rows[r], warp_rows[w]));
}

// The node's form as a GdpaCase (lengths at the buckets). False with the reason when the
// harness cannot build it.
static bool case_of_node(const Ir *ir, const Node *n, TuneOp *op, char *why, size_t why_size) {
  const Tensor *q = &ir->tensors[n->ins[0]], *k = &ir->tensors[n->ins[1]];
  const Tensor *v = &ir->tensors[n->ins[2]];
  DType T = k->dtype;
  if (v->dtype != T || (n->shape != ATTN_PMA && q->dtype != T))
    return fail(why, why_size, "q, k and v have different element types");
  if (T != DT_BF16 && T != DT_FP16 && T != DT_F32)
    return fail(why, why_size, "%s tensors", dtype_name(T));
  if (n->heads <= 0 || k->width % n->heads != 0)
    return fail(why, why_size, "%" PRId64 " heads do not divide d = %" PRId64, n->heads,
                k->width);
  GdpaCase *c = &op->c;
  *c = (GdpaCase){.shape = n->shape, .act = node_act(n), .causal = n->mask == MASK_CAUSAL,
                  .window = n->window, .hstu_norm = n->hstu_norm, .heads = n->heads,
                  .dh = k->width / n->heads, .scale = n->scale,
                  .storage = T == DT_F32 ? 32 : T == DT_FP16 ? 16 : 0};
  op->x = (GdpaEmitOptions){.model_backward = true};
  bool q_jag = q->layout == LAYOUT_JAGGED, kv_jag = k->layout == LAYOUT_JAGGED;
  if (q_jag) op->bucket_q = tune_length_bucket(ir->jagged[q->jag].max_len);
  if (kv_jag) op->bucket_kv = tune_length_bucket(ir->jagged[k->jag].max_len);
  op->one_dim = q_jag && kv_jag && q->jag == k->jag;
  switch (n->shape) {
  case ATTN_SELF:
    if (!op->one_dim) return fail(why, why_size, "self attention off one jagged dim");
    c->max_q = c->max_kv = op->bucket_q;
    break;
  case ATTN_CROSS:
    if (!q_jag) return fail(why, why_size, "cross attention with q not jagged");
    c->max_q = op->bucket_q;
    if (kv_jag) c->max_kv = op->bucket_kv;
    else if (k->layout == LAYOUT_SET) c->kv_set = c->max_kv = k->set_k;
    else return fail(why, why_size, "cross attention over a kv that is neither jagged nor a set");
    break;
  case ATTN_PMA:
  case ATTN_PFFN:
    if (!kv_jag) return fail(why, why_size, "%s over a kv that is not jagged",
                             attn_shape_name(n->shape));
    c->max_kv = op->bucket_kv;
    if (n->shape == ATTN_PMA) c->q_set = q->fixed[0];
    else if (q->layout == LAYOUT_SET) c->q_set = q->set_k;
    else if (q->layout != LAYOUT_DENSE) return fail(why, why_size, "pffn with a jagged q");
    break;
  }
  return true;
}

// "tile_q=64,stages=3", or "-" for none.
static void hints_text(const Schedule *u, char *buf, size_t cap) {
  const struct { const char *name; int v; } h[4] = {
      {"tile_q", u->tile_q}, {"tile_kv", u->tile_kv}, {"tile_m", u->tile_m}, {"stages", u->stages}};
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < 4; i++)
    if (h[i].v && n < cap)
      n += (size_t)snprintf(buf + n, cap - n, "%s%s=%d", n ? "," : "", h[i].name, h[i].v);
  if (buf[0] == '\0') snprintf(buf, cap, "-");
}

bool tune_op_init(const Ir *ir, int node, const char *arch, int64_t batch, TuneOp *op,
                  char *why, size_t why_size) {
  memset(op, 0, sizeof *op);
  op->node = node;
  op->batch = batch;
  snprintf(op->arch, sizeof op->arch, "%s", arch);
  const Node *n = &ir->nodes[node];
  const char *src = ir->source ? ir->source : "?";
  const char *base = strrchr(src, '/');
  snprintf(op->where, sizeof op->where, "%s:%d:%d", base ? base + 1 : src, n->loc.first_line,
           n->loc.first_column);
  if (n->op != OP_ATTENTION || node >= ir->nforward)
    return fail(why, why_size, "not a forward attention node");
  op->user = (Schedule){.tile_q = n->sched.tile_q, .tile_kv = n->sched.tile_kv,
                        .tile_m = n->sched.tile_m, .stages = n->sched.stages};
  bool formed = case_of_node(ir, n, op, why, why_size);
  if (formed) {
    gdpa_case_name(&op->c, op->name, (int)sizeof op->name);
    if (op->c.storage == 0)
      snprintf(op->name + strlen(op->name), sizeof op->name - strlen(op->name), " bf16");
  } else {
    snprintf(op->name, sizeof op->name, "%s %s", attn_shape_name(n->shape),
             act_name(node_act(n)));
  }
  if (n->prec == DT_FP8 || n->prec == DT_MXFP8)
    return fail(why, why_size, "the quantized attention kernel (%s) has one shape",
                dtype_name(n->prec));
  if (!formed) return false;
  if (strcmp(arch, "sm_90a") != 0 && strcmp(arch, "sm_100a") != 0)
    return fail(why, why_size, "gemc generates no attention kernels for %s", arch);
  op->x.target = strcmp(arch, "sm_90a") == 0 ? "sm_90a" : "sm_100a";  // a literal: op may be copied
  int64_t dh = op->c.dh;
  bool q_jagged = ir->tensors[n->ins[0]].layout == LAYOUT_JAGGED;
  bool bf16 = op->c.storage == 0, fp16 = op->c.storage == 16;
  bool sm90_ok = strcmp(arch, "sm_90a") == 0 && n->shape != ATTN_PMA && (dh == 64 || dh == 128) &&
                 (bf16 || fp16);
  bool mma_ok = bf16 && dh % 16 == 0;
  bool moved = op->user.tile_q == 64 || op->user.tile_m != 0;  // hints that pick mma.sync
  if (sm90_ok && !moved) sm90_candidates(op, dh, mma_ok, q_jagged);
  else if (mma_ok) mma_candidates(op, dh, q_jagged, op->c.q_set ? op->c.q_set : 1);
  else
    return fail(why, why_size, "the SIMT attention kernel (%s, d / heads = %" PRId64 ") has one "
                "shape", dtype_name(bf16 ? DT_BF16 : fp16 ? DT_FP16 : DT_F32), dh);
  op->def = 0;
  char hints[96];
  hints_text(&op->user, hints, sizeof hints);
  snprintf(op->sig, sizeof op->sig, "%s %s mask=%s window=%" PRId64 " hstu_norm=%d heads=%" PRId64
           " dh=%" PRId64 " %s q_set=%" PRId64 " kv_set=%" PRId64 "%s B=%" PRId64 " hints=%s",
           attn_shape_name(n->shape), act_name(node_act(n)), mask_name(n->mask), n->window,
           n->hstu_norm ? 1 : 0, n->heads, dh, dtype_name(bf16 ? DT_BF16 : DT_FP16),
           op->c.q_set, op->c.kv_set, op->one_dim ? " one_dim" : "", batch, hints);
  if (op->ncand == 0)
    return fail(why, why_size, "its @schedule hints (%s) fit none of this GPU's kernel shapes",
                hints);
  if (op->ncand == 1)
    return fail(why, why_size, "its @schedule hints (%s) fix its shape", hints);
  return true;
}

void tune_candidate_text(const TuneCandidate *c, char *buf, size_t cap) {
  if (c->kernel == TUNE_SM90)
    snprintf(buf, cap, "tile_q=%d tile_kv=%d stages=%d", c->tile_q, c->tile_kv, c->stages);
  else
    snprintf(buf, cap, "tile_q=%d tile_m=%d", c->tile_q, c->tile_m);
}

void tune_apply(Schedule *s, const TuneOp *op, int winner) {
  if (winner == op->def || winner < 0 || winner >= op->ncand) return;
  const TuneCandidate *c = &op->cand[winner];
  if (!s->tile_q) s->tile_q = c->tile_q;
  if (!s->tile_kv) s->tile_kv = c->tile_kv;
  if (!s->tile_m) s->tile_m = c->tile_m;
  if (!s->stages) s->stages = c->stages;
}

void tune_case(const TuneOp *op, int i, GdpaCase *c, GdpaEmitOptions *x) {
  const TuneCandidate *k = i == op->def ? NULL : &op->cand[i];
  const Schedule *u = &op->user;
  *c = op->c;
  *x = op->x;
  c->tile_q = k ? k->tile_q : u->tile_q, c->tile_m = k ? k->tile_m : u->tile_m;
  x->tile_kv = k ? k->tile_kv : u->tile_kv, x->stages = k ? k->stages : u->stages;
  x->forward_only = k != NULL;
}

// --- the key ------------------------------------------------------------------------------

void tune_key(const TuneOp *op, const char *gpu, int nvrtc_version, char *buf, size_t cap) {
  char len[64] = "";
  int n = 0;
  if (op->bucket_q) n += snprintf(len + n, sizeof len - (size_t)n, " q%" PRId64, op->bucket_q);
  if (op->bucket_kv && !op->one_dim)
    snprintf(len + n, sizeof len - (size_t)n, " kv%" PRId64, op->bucket_kv);
  snprintf(buf, cap, "gemc-tune %d | gemc %s | gpu %s | %s | nvrtc %d | op %s | len%s",
           TUNE_FORMAT, GEMC_VERSION, gpu, op->arch, nvrtc_version, op->sig, len);
}

void tune_cache_path(const char *dir, const char *key, char *buf, size_t cap) {
  uint64_t h = fnv1a64(FNV1A64_INIT, key, strlen(key));
  snprintf(buf, cap, "%s/tune-%016" PRIx64 ".txt", dir, h);
}

// --- the cache file -----------------------------------------------------------------------

void tune_entry_format(const char *key, const TuneEntry *e, StrBuf *out) {
  const TuneCandidate *w = &e->winner;
  sb_printf(out, "# gemc autotuner cache entry (docs/tuning.md); delete it to tune again\n");
  sb_printf(out, "format %d\n", TUNE_FORMAT);
  sb_printf(out, "key %s\n", key);
  sb_printf(out, "winner %s tile_q=%d tile_kv=%d tile_m=%d stages=%d\n",
            w->kernel == TUNE_SM90 ? "sm90" : "mma", w->tile_q, w->tile_kv, w->tile_m, w->stages);
  sb_printf(out, "fwd_ms %.6f\n", e->fwd_ms);
  sb_printf(out, "bwd_ms %.6f\n", e->bwd_ms);
  sb_printf(out, "default_fwd_ms %.6f\n", e->default_fwd_ms);
  sb_printf(out, "candidates %d\n", e->ncand);
}

// A time field: a finite number >= 0.
static bool parse_ms(const char *v, double *out) {
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end != '\0' || errno || !isfinite(x) || x < 0) return false;
  *out = x;
  return true;
}

static bool parse_winner(const char *v, TuneCandidate *w) {
  char kernel[8];
  int used = 0;
  if (sscanf(v, "%7s tile_q=%d tile_kv=%d tile_m=%d stages=%d%n", kernel, &w->tile_q, &w->tile_kv,
             &w->tile_m, &w->stages, &used) != 5 || v[used] != '\0')
    return false;
  if (strcmp(kernel, "sm90") == 0) w->kernel = TUNE_SM90;
  else if (strcmp(kernel, "mma") == 0) w->kernel = TUNE_MMA;
  else return false;
  return true;
}

// One "name value" line into the entry; false with the reason.
static bool parse_line(const char *name, const char *value, const char *key, TuneEntry *e,
                       unsigned *seen, char *why, size_t why_size) {
  double ms = 0;
  if (strcmp(name, "format") == 0) {
    if (strcmp(value, "1") != 0) return fail(why, why_size, "format '%.32s', not 1", value);
    *seen |= 1;
  } else if (strcmp(name, "key") == 0) {
    if (strcmp(value, key) != 0) return fail(why, why_size, "it holds another key");
    *seen |= 2;
  } else if (strcmp(name, "winner") == 0) {
    if (!parse_winner(value, &e->winner))
      return fail(why, why_size, "a winner line that does not parse: '%.80s'", value);
    *seen |= 4;
  } else if (strcmp(name, "fwd_ms") == 0 || strcmp(name, "bwd_ms") == 0 ||
             strcmp(name, "default_fwd_ms") == 0) {
    if (!parse_ms(value, &ms)) return fail(why, why_size, "%s is not a time: '%.32s'", name, value);
    *(name[0] == 'f' ? &e->fwd_ms : name[0] == 'b' ? &e->bwd_ms : &e->default_fwd_ms) = ms;
  } else if (strcmp(name, "candidates") == 0) {
    char *end = NULL;
    long n = strtol(value, &end, 10);
    if (end == value || *end || n < 1 || n > TUNE_MAX_CANDIDATES)
      return fail(why, why_size, "candidates is not a count: '%.32s'", value);
    e->ncand = (int)n;
  }  // other names: from a later gemc; ignored
  return true;
}

TuneLoad tune_entry_parse(const char *text, size_t size, const char *key, const TuneOp *op,
                          int *winner, TuneEntry *e, char *why, size_t why_size) {
  memset(e, 0, sizeof *e);
  if (memchr(text, '\0', size)) return (fail(why, why_size, "not a text file"), TUNE_CACHE_BAD);
  unsigned seen = 0;
  const char *p = text, *end = text + size;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    size_t len = eol ? (size_t)(eol - p) : (size_t)(end - p);
    if (len > 0 && p[len - 1] == '\r') len--;
    if (len > 0 && p[0] != '#') {
      char line[1024];
      if (len >= sizeof line) return (fail(why, why_size, "a line too long"), TUNE_CACHE_BAD);
      memcpy(line, p, len);
      line[len] = '\0';
      char *space = strchr(line, ' ');
      if (!space)
        return (fail(why, why_size, "a line without a value: '%.40s'", line), TUNE_CACHE_BAD);
      *space = '\0';
      if (!parse_line(line, space + 1, key, e, &seen, why, why_size)) return TUNE_CACHE_BAD;
    }
    p = eol ? eol + 1 : end;
  }
  if (!(seen & 1)) return (fail(why, why_size, "no 'format' line"), TUNE_CACHE_BAD);
  if (!(seen & 2)) return (fail(why, why_size, "no 'key' line"), TUNE_CACHE_BAD);
  if (!(seen & 4)) return (fail(why, why_size, "no 'winner' line"), TUNE_CACHE_BAD);
  for (int i = 0; i < op->ncand; i++)
    if (same_candidate(&op->cand[i], &e->winner)) {
      *winner = i;
      e->winner.smem = op->cand[i].smem;
      return TUNE_CACHE_HIT;
    }
  char text_w[96];
  tune_candidate_text(&e->winner, text_w, sizeof text_w);
  fail(why, why_size, "its winner (%s) is not a candidate for this node", text_w);
  return TUNE_CACHE_BAD;
}

TuneLoad tune_cache_load(const char *dir, const char *key, const TuneOp *op, int *winner,
                         TuneEntry *e, char *why, size_t why_size) {
  char path[4096];
  tune_cache_path(dir, key, path, sizeof path);
  struct stat st;
  if (stat(path, &st) != 0 && errno == ENOENT) return TUNE_CACHE_MISS;
  char *data = NULL;
  size_t size = 0;
  if (!file_read_all(path, "tuning cache entry", MAX_ENTRY_BYTES, &data, &size, why, why_size))
    return TUNE_CACHE_BAD;
  TuneLoad r = tune_entry_parse(data, size, key, op, winner, e, why, why_size);
  free(data);
  return r;
}

bool tune_cache_store(const char *dir, const char *key, const TuneEntry *e, char *err,
                      size_t err_size) {
  char path[4096];
  tune_cache_path(dir, key, path, sizeof path);
  StrBuf text = {0};
  tune_entry_format(key, e, &text);
  bool ok = file_write_atomic(path, text.data, text.len, err, err_size);
  sb_free(&text);
  return ok;
}

// --- the timed batch ----------------------------------------------------------------------

static uint64_t xorshift64(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *state = x;
}

static double uniform01(uint64_t *state) { return (double)(xorshift64(state) >> 11) * 0x1p-53; }

// One length as synth.c's lognormal draws it: 2% empty, else median bucket/8, sigma 1,
// clamped to [1, bucket].
static int64_t draw_length(uint64_t *state, int64_t bucket) {
  if (uniform01(state) < 0.02) return 0;
  double u1 = uniform01(state) + 0x1p-53, u2 = uniform01(state);  // (0, 1], [0, 1)
  double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  double x = round((double)bucket / 8.0 * exp(z));
  return x < 1 ? 1 : x > (double)bucket ? bucket : (int64_t)x;
}

void tune_lengths(const TuneOp *op, GdpaLengths *out) {
  uint64_t state = fnv1a64(FNV1A64_INIT, op->sig, strlen(op->sig)) ^
                   (uint64_t)op->bucket_q * 1000003u ^ (uint64_t)op->bucket_kv;
  if (state == 0) state = 88172645463325252ull;
  int64_t B = op->batch > 0 ? op->batch : 1;
  out->n = B;
  out->lq = xmalloc((size_t)B * sizeof *out->lq);
  out->lk = xmalloc((size_t)B * sizeof *out->lk);
  const GdpaCase *c = &op->c;
  for (int64_t b = 0; b < B; b++) {
    int64_t lq = op->bucket_q ? draw_length(&state, op->bucket_q) : c->q_set ? c->q_set : 1;
    int64_t lk = op->one_dim ? lq : op->bucket_kv ? draw_length(&state, op->bucket_kv) : c->kv_set;
    out->lq[b] = lq, out->lk[b] = lk;
  }
}
