// gpu_tiles.c: attention tile lists, per batch (gpu_tiles.h): the tiles and their work, the
// zigzag deal for one CTA per tile, the LPT deal for persistent kernels, and the spread of a
// deal.
#include "gpu_tiles.h"

#include <stdlib.h>
#include <string.h>

#include "internal_error.h"

// The keys query row i sees: [lo, hi) clipped to [0, lk), as the kernels' masks have it.
static int64_t row_work(const TileList *tl, int64_t i, int64_t lk) {
  int64_t lo = 0, hi = lk;
  if (tl->causal && i + 1 < hi) hi = i + 1;
  if (tl->window > 0) {
    if (i - tl->window + 1 > lo) lo = i - tl->window + 1;
    if (!tl->causal && i + tl->window < hi) hi = i + tl->window;
  }
  return hi > lo ? hi - lo : 0;
}

// A key-side causal list is the query side reflected: key k of L is seen by the queries i >= k
// (and i < k + w with a window), as many as query row L - 1 - k sees keys. A window alone,
// |i - k| < w, is the same from both sides.
// In closed form, not row by row (a batch has about a hundred thousand rows per list): a row's
// visible keys min(lk, i + c) - max(0, i - w + 1), clipped at 0, are linear in i between the
// points where one of the bounds starts to bind (i = lk - c, i = w - 1) or the count reaches 0
// (i = lk + w - 1), so each piece sums as an arithmetic series from its two ends.
int64_t gpu_tiles_work(const TileList *tl, int64_t i0, int64_t i1, int64_t lk) {
  if (i1 <= i0) return 0;
  if (tl->key_side && tl->causal) {  // key k sees what query row lk - 1 - k does
    int64_t r0 = lk - i1;
    i1 = lk - i0, i0 = r0;
  }
  if (!tl->causal && tl->window <= 0) return (i1 - i0) * (lk > 0 ? lk : 0);
  int64_t cuts[5] = {i0, i1, i1, i1, i1};
  int ncuts = 1;
  const int64_t c = tl->causal ? 1 : tl->window;  // the upper bound's offset: i + c
  const int64_t points[3] = {lk - c, tl->window > 0 ? tl->window - 1 : i1,
                             tl->window > 0 ? lk + tl->window - 1 : i1};
  for (int k = 0; k < 3; k++)
    if (points[k] > i0 && points[k] < i1) cuts[ncuts++] = points[k];
  cuts[ncuts++] = i1;
  for (int a = 1; a < ncuts; a++)  // a few points: insertion sort
    for (int b = a; b > 0 && cuts[b] < cuts[b - 1]; b--) {
      int64_t t = cuts[b];
      cuts[b] = cuts[b - 1], cuts[b - 1] = t;
    }
  int64_t work = 0;
  for (int k = 0; k + 1 < ncuts; k++) {
    int64_t s0 = cuts[k], s1 = cuts[k + 1];
    if (s1 <= s0) continue;
    work += (row_work(tl, s0, lk) + row_work(tl, s1 - 1, lk)) * (s1 - s0) / 2;
  }
  return work;
}

// --- the tiles of a batch ---------------------------------------------------------------

typedef struct TileWork {
  int64_t work, index;
  int32_t b, row0, head;
} TileWork;

static int64_t tile_rows(const TileList *tl) { return tl->tile_q > 0 ? tl->tile_q : 64; }

static int64_t q_len(const TileList *tl, const int64_t *q_offsets, int64_t b) {
  return q_offsets ? q_offsets[b + 1] - q_offsets[b] : tl->q_fixed;
}

static int64_t kv_len(const TileList *tl, const int64_t *kv_offsets, int64_t b) {
  return kv_offsets ? kv_offsets[b + 1] - kv_offsets[b] : tl->kv_fixed;
}

// The tiles of the other side that rows [i0, i1) run over in a persistent (sm_90a) kernel: the
// range their mask lets them see, its low end rounded down to a tile, in tiles of tile_kv (the
// kernels' sm90_item and sm90_bwd_item; attn_key_range and attn_query_range in
// kernels/attention.cuh). Rows are queries over lk keys, or keys over lk queries (key_side).
static int64_t streamed_tiles(const TileList *tl, int64_t i0, int64_t i1, int64_t lk) {
  const int64_t step = tl->tile_kv > 0 ? tl->tile_kv : 64;
  // A window past both sides' rows limits nothing; clamped, its sums cannot overflow.
  const int64_t w = tl->window < i1 + lk + 1 ? tl->window : i1 + lk + 1;
  int64_t lo = 0, hi = lk;
  if (!tl->key_side) {  // query i sees keys j <= i (causal) and i - w < j (< i + w without causal)
    if (tl->causal && i1 < hi) hi = i1;
    if (w > 0) {
      lo = i0 - w + 1 > 0 ? i0 - w + 1 : 0;
      if (!tl->causal && i1 + w - 1 < hi) hi = i1 + w - 1;
    }
  } else {  // key j is seen by queries i >= j (causal) and i < j + w (> j - w without causal)
    if (tl->causal) lo = i0;
    if (w > 0) {
      if (i1 - 1 + w < hi) hi = i1 - 1 + w;
      if (!tl->causal && i0 - w + 1 > lo) lo = i0 - w + 1;
    }
  }
  lo -= lo % step;
  return hi > lo ? (hi - lo + step - 1) / step : 0;
}

int64_t gpu_tiles_tile_work(const TileList *tl, int64_t i0, int64_t lq, int64_t lk) {
  int64_t i1 = i0 + tile_rows(tl) < lq ? i0 + tile_rows(tl) : lq;
  if (tl->key_side && tl->causal) GEMC_ASSERT(lq == lk);  // sema: causal is self-attention
  if (tl->persistent) {
    const int64_t block = tile_rows(tl) * (tl->tile_kv > 0 ? tl->tile_kv : 64);
    return streamed_tiles(tl, i0, i1, lk) * block + block / 2;
  }
  return gpu_tiles_work(tl, i0, i1, lk) + (i1 - i0);
}

// Every tile of the batch with its work, in (example, row tile, head) order, into *w (malloc'd,
// the caller frees it). Returns the count, or -1 when out of memory (*w is then NULL).
static int64_t collect(const TileList *tl, int64_t B, const int64_t *q_offsets,
                       const int64_t *kv_offsets, TileWork **w) {
  const int64_t tile = tile_rows(tl);
  const int64_t heads = tl->heads > 0 ? tl->heads : 1;
  int64_t count = 0;
  for (int64_t b = 0; b < B; b++) count += (q_len(tl, q_offsets, b) + tile - 1) / tile * heads;
  *w = malloc((size_t)(count > 0 ? count : 1) * sizeof **w);
  if (!*w) return -1;
  int64_t n = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t lq = q_len(tl, q_offsets, b), lk = kv_len(tl, kv_offsets, b);
    for (int64_t i0 = 0; i0 < lq; i0 += tile) {
      int64_t work = gpu_tiles_tile_work(tl, i0, lq, lk);
      for (int64_t h = 0; h < heads; h++) {
        (*w)[n] = (TileWork){work, n, (int32_t)b, (int32_t)i0, (int32_t)h};
        n++;
      }
    }
  }
  return n;
}

static void put_tile(int32_t *out, int64_t entry, const TileWork *t) {
  out[GPU_TILE_INTS * entry + 0] = t->b;
  out[GPU_TILE_INTS * entry + 1] = t->row0;
  out[GPU_TILE_INTS * entry + 2] = t->head;
}

// Sorts w (collected in index order) by work, largest first, equal works in index order: a
// stable LSD radix sort of max_work - work, 11 bits a pass (two passes for a 4096-key tile).
// A comparison sort of a batch's tiles took milliseconds of the host's time per step.
static bool sort_by_work(TileWork *w, int64_t n) {
  enum { BITS = 11, BUCKETS = 1 << BITS };
  if (n < 2) return true;
  int64_t most = 0;
  for (int64_t i = 0; i < n; i++)
    if (w[i].work > most) most = w[i].work;
  if (most == 0) return true;
  TileWork *tmp = malloc((size_t)n * sizeof *tmp);
  int64_t *start = malloc(BUCKETS * sizeof *start);
  if (!tmp || !start) {
    free(tmp), free(start);
    return false;
  }
  TileWork *src = w, *dst = tmp;
  for (int shift = 0; shift < 63 && (most >> shift) > 0; shift += BITS) {
    memset(start, 0, BUCKETS * sizeof *start);
    for (int64_t i = 0; i < n; i++) start[((most - src[i].work) >> shift) & (BUCKETS - 1)]++;
    int64_t at = 0;
    for (int d = 0; d < BUCKETS; d++) {
      int64_t c = start[d];
      start[d] = at;
      at += c;
    }
    for (int64_t i = 0; i < n; i++) dst[start[((most - src[i].work) >> shift) & (BUCKETS - 1)]++] = src[i];
    TileWork *t = src;
    src = dst, dst = t;
  }
  if (src != w) memcpy(w, src, (size_t)n * sizeof *w);
  free(tmp), free(start);
  return true;
}

int64_t gpu_tiles_build_plain(const TileList *tl, int64_t B, const int64_t *q_offsets,
                              const int64_t *kv_offsets, int32_t **out) {
  TileWork *w = NULL;
  int64_t n = collect(tl, B, q_offsets, kv_offsets, &w);
  *out = n < 0 ? NULL : malloc((size_t)(n > 0 ? n : 1) * GPU_TILE_INTS * sizeof(int32_t));
  if (!*out) {
    free(w);
    return -1;
  }
  for (int64_t i = 0; i < n; i++) put_tile(*out, i, &w[i]);
  free(w);
  return n;
}

// --- the persistent deal ----------------------------------------------------------------

// A min-heap of CTAs by (work so far, index): the root is the least loaded CTA, the lowest of
// equals.
typedef struct CtaHeap {
  int64_t *load;  // [G] work so far, by CTA
  int64_t *heap;  // [size] CTA indices
  int64_t size;
} CtaHeap;

static bool cta_less(const CtaHeap *h, int64_t a, int64_t b) {
  return h->load[a] != h->load[b] ? h->load[a] < h->load[b] : a < b;
}

// Restores the heap below position i after the root's CTA grew (or was replaced).
static void cta_sift_down(CtaHeap *h, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->size && cta_less(h, h->heap[l], h->heap[m])) m = l;
    if (r < h->size && cta_less(h, h->heap[r], h->heap[m])) m = r;
    if (m == i) return;
    int64_t t = h->heap[i];
    h->heap[i] = h->heap[m], h->heap[m] = t;
    i = m;
  }
}

// Deals w (n > 0 tiles, sorted largest first) to G CTAs, longest processing time first: each
// tile goes to the least loaded CTA that has fewer than `cap` tiles, CTA c's r-th tile to entry
// r*G + c. Returns the entries up to the last tile (holes before it: example -1, row 0, head 0)
// into *out, or -1 when out of memory.
static int64_t deal_persistent(const TileWork *w, int64_t n, int64_t G, int32_t **out) {
  const int64_t cap = 2 * ((n + G - 1) / G);  // twice the even share: a CTA of small tiles
                                              // takes more of them, yet holes stay < n + 2G
  CtaHeap h = {calloc((size_t)G, sizeof(int64_t)), malloc((size_t)G * sizeof(int64_t)), G};
  int64_t *count = calloc((size_t)G, sizeof(int64_t));
  *out = malloc((size_t)(cap * G) * GPU_TILE_INTS * sizeof(int32_t));
  if (!h.load || !h.heap || !count || !*out) {
    free(h.load), free(h.heap), free(count), free(*out);
    *out = NULL;
    return -1;
  }
  for (int64_t c = 0; c < G; c++) h.heap[c] = c;  // all loads 0: sorted by index, a heap
  const TileWork hole = {0, 0, -1, 0, 0};
  for (int64_t e = 0; e < cap * G; e++) put_tile(*out, e, &hole);
  int64_t entries = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t c = h.heap[0];
    int64_t e = count[c]++ * G + c;
    put_tile(*out, e, &w[i]);
    if (e + 1 > entries) entries = e + 1;
    h.load[c] += w[i].work;
    if (count[c] == cap) h.heap[0] = h.heap[--h.size];  // full: out of the heap
    cta_sift_down(&h, 0);
  }
  free(h.load), free(h.heap), free(count);
  return entries;
}

int64_t gpu_tiles_build(const TileList *tl, int64_t B, const int64_t *q_offsets,
                        const int64_t *kv_offsets, int num_sms, int32_t **out) {
  TileWork *w = NULL;
  int64_t n = collect(tl, B, q_offsets, kv_offsets, &w);
  if (n < 0) {
    *out = NULL;
    return -1;
  }
  if (!sort_by_work(w, n)) {
    free(w);
    *out = NULL;
    return -1;
  }
  if (tl->persistent && num_sms > 0 && n > 0) {
    int64_t entries = deal_persistent(w, n, num_sms, out);
    free(w);
    return entries;
  }
  *out = malloc((size_t)(n > 0 ? n : 1) * GPU_TILE_INTS * sizeof(int32_t));
  if (!*out) {
    free(w);
    return -1;
  }
  // Deal: wave r of num_sms tiles goes out left to right when r is even, right to left when
  // odd, so the SM that took the biggest tile of one wave takes the smallest of the next.
  int64_t wave = tl->zigzag && num_sms > 0 ? num_sms : n;
  for (int64_t start = 0, r = 0; start < n; start += wave, r++) {
    int64_t end = start + wave < n ? start + wave : n;
    for (int64_t i = start; i < end; i++)
      put_tile(*out, i, &w[(r & 1) ? end - 1 - (i - start) : i]);
  }
  free(w);
  return n;
}

// --- the spread of a deal ---------------------------------------------------------------

bool gpu_tiles_spread(const TileList *tl, const int64_t *q_offsets, const int64_t *kv_offsets,
                      const int32_t *tiles, int64_t n, int ctas, int64_t *max_load,
                      int64_t *min_load) {
  *max_load = *min_load = 0;
  if (n <= 0) return true;
  int64_t G = ctas < 1 ? 1 : ctas < n ? ctas : n;
  int64_t *load = calloc((size_t)G, sizeof *load);
  if (!load) return false;
  for (int64_t i = 0; i < n; i++) {
    int64_t b = tiles[GPU_TILE_INTS * i];
    if (b < 0) continue;  // a hole
    load[i % G] += gpu_tiles_tile_work(tl, tiles[GPU_TILE_INTS * i + 1], q_len(tl, q_offsets, b),
                                       kv_len(tl, kv_offsets, b));
  }
  *max_load = *min_load = load[0];
  for (int64_t c = 1; c < G; c++) {
    if (load[c] > *max_load) *max_load = load[c];
    if (load[c] < *min_load) *min_load = load[c];
  }
  free(load);
  return true;
}
