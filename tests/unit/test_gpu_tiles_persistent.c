// test_gpu_tiles_persistent.c: the persistent deal of gpu_tiles_build (TileList.persistent:
// CTA c of G takes entries c, c + G, ...; example -1 is a hole) and gpu_tiles_spread, without
// a GPU. Every tile is dealt exactly once, each CTA's tiles come largest first, holes stay few,
// and on a lognormal batch the deal's spread beats both the plain order and the zigzag deal.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gdpa_case.h"
#include "gpu_tiles.h"

enum { G = 132 };  // the H200's SMs

// Offsets [B+1] of a self batch whose lengths are the lognormal kv lengths of a PMA workload
// (median N/8, sigma 1, clamped to [1, N]): the bench's lognormal.
static int64_t *lognormal_offsets(int64_t B, int64_t n, uint64_t seed) {
  GdpaLengths l;
  gdpa_lengths_make(GDPA_PMA, B, n, 1.0, 1, seed, &l);
  int64_t *off = malloc((size_t)(B + 1) * sizeof *off);
  off[0] = 0;
  for (int64_t b = 0; b < B; b++) off[b + 1] = off[b] + l.lk[b];
  gdpa_lengths_free(&l);
  return off;
}

static double spread(const TileList *tl, const int64_t *off, const int32_t *tiles, int64_t n) {
  int64_t hi = 0, lo = 0;
  assert_true(gpu_tiles_spread(tl, off, off, tiles, n, G, &hi, &lo));
  assert_true(lo > 0);
  return (double)hi / (double)lo;
}

// The work gpu_tiles_build gives entry i of `tiles` (0 for a hole).
static int64_t entry_work(const TileList *tl, const int64_t *off, const int32_t *tiles,
                          int64_t i) {
  int32_t b = tiles[3 * i], row0 = tiles[3 * i + 1];
  if (b < 0) return 0;
  return gpu_tiles_tile_work(tl, row0, off[b + 1] - off[b], off[b + 1] - off[b]);
}

static int by_triple(const void *x, const void *y) {
  const int32_t *a = x, *b = y;
  for (int i = 0; i < 3; i++)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
}

// The persistent list holds each tile of the plain list once, plus holes that are not last;
// each CTA's tiles come largest first; holes stay under n + 2G.
static void check_persistent_layout(const TileList *tl, int64_t B, const int64_t *off) {
  int32_t *plain = NULL, *dealt = NULL;
  int64_t n = gpu_tiles_build_plain(tl, B, off, off, &plain);
  int64_t entries = gpu_tiles_build(tl, B, off, off, G, &dealt);
  assert_true(n > 0 && entries >= n);
  assert_true(entries - n < n + 2 * G);
  assert_true(dealt[3 * (entries - 1)] >= 0);  // ends on a tile
  int32_t *tiles = malloc((size_t)n * 3 * sizeof *tiles);
  int64_t got = 0;
  for (int64_t i = 0; i < entries; i++) {
    if (dealt[3 * i] < 0) {
      assert_int_equal(dealt[3 * i + 1], 0), assert_int_equal(dealt[3 * i + 2], 0);
      continue;
    }
    assert_true(got < n);
    memcpy(&tiles[3 * got++], &dealt[3 * i], 3 * sizeof *tiles);
    if (i >= G && dealt[3 * (i - G)] >= 0)  // the CTA's previous tile is at least as big
      assert_true(entry_work(tl, off, dealt, i - G) >= entry_work(tl, off, dealt, i));
    if (i >= G) assert_true(dealt[3 * (i - G)] >= 0);  // a CTA's holes come after its tiles
  }
  assert_int_equal(got, n);
  qsort(tiles, (size_t)n, 3 * sizeof *tiles, by_triple);
  qsort(plain, (size_t)n, 3 * sizeof *plain, by_triple);
  assert_memory_equal(tiles, plain, (size_t)n * 3 * sizeof *tiles);
  free(tiles), free(plain), free(dealt);
}

static void test_gpu_tiles_persistent_deals_every_tile_once(void **state) {
  (void)state;
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 128, .tile_kv = 128, .heads = 4,
                 .zigzag = true, .persistent = true};
  const int64_t sizes[] = {1, 7, 64, 500, 1152};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    int64_t *off = lognormal_offsets(sizes[i], 4096, 11 + i);
    check_persistent_layout(&tl, sizes[i], off);
    free(off);
  }
  // causal and windowed work, 64-row tiles
  TileList causal = tl;
  causal.causal = true, causal.window = 100, causal.tile_q = 64, causal.heads = 2;
  int64_t *off = lognormal_offsets(300, 2048, 5);
  check_persistent_layout(&causal, 300, off);
  free(off);
}

// Few tiles: one per CTA, largest first, no holes. A persistent tile weighs the key tiles it
// runs: over 100, 200, 300 and 64 keys, 2, 4, 5 and 1 tiles of 64.
static void test_gpu_tiles_persistent_few_tiles_have_no_holes(void **state) {
  (void)state;
  const int64_t q_off[] = {0, 10, 40, 100, 110};  // 10, 30, 60, 10 rows: one tile each
  const int64_t kv_off[] = {0, 100, 300, 600, 664};
  TileList tl = {.q_jag = 0, .kv_jag = 1, .tile_q = 64, .tile_kv = 64, .heads = 1,
                 .zigzag = true, .persistent = true};
  int32_t *tiles = NULL;
  assert_int_equal(gpu_tiles_build(&tl, 4, q_off, kv_off, G, &tiles), 4);
  const int32_t sorted[] = {2, 1, 0, 3};
  for (int i = 0; i < 4; i++) assert_int_equal(tiles[3 * i], sorted[i]);
  free(tiles);
  // no SM count: no deal, the sorted list
  assert_int_equal(gpu_tiles_build(&tl, 4, q_off, kv_off, 0, &tiles), 4);
  for (int i = 0; i < 4; i++) assert_int_equal(tiles[3 * i], sorted[i]);
  free(tiles);
}

// The deal by hand: five examples of one 64-row tile each over 448, 256, 128, 64 and 0 keys:
// 7, 4, 2, 1 and 0 key tiles of 64, each tile 64 x 64 = 4096 and an item half of one, so they
// weigh 2048 x (15, 9, 5, 3, 1). Over two CTAs, LPT: 15 -> c0, 9 -> c1, 5 -> c1 (9 < 15),
// 3 -> c1 (14 < 15), 1 -> c0 (15 < 17). c0 takes examples 0, 4 and c1 1, 2, 3: entries 0 1 |
// 4 2 | hole 3; loads 2048 x 16 and 2048 x 17.
static void test_gpu_tiles_persistent_is_lpt(void **state) {
  (void)state;
  const int64_t q_off[] = {0, 5, 9, 12, 14, 15};  // 5, 4, 3, 2, 1 rows
  const int64_t kv_off[] = {0, 448, 704, 832, 896, 896};
  TileList tl = {.q_jag = 0, .kv_jag = 1, .tile_q = 64, .tile_kv = 64, .heads = 1,
                 .persistent = true};
  int32_t *tiles = NULL;
  int64_t n = gpu_tiles_build(&tl, 5, q_off, kv_off, 2, &tiles);
  assert_int_equal(n, 6);
  const int32_t want[] = {0, 1, 4, 2, -1, 3};
  for (int i = 0; i < 6; i++) assert_int_equal(tiles[3 * i], want[i]);
  int64_t hi = 0, lo = 0;
  assert_true(gpu_tiles_spread(&tl, q_off, kv_off, tiles, n, 2, &hi, &lo));
  assert_int_equal(hi, 2048 * 17), assert_int_equal(lo, 2048 * 16);
  free(tiles);
}

// gpu_tiles_spread deals round robin: entry i to CTA i mod G, holes weigh 0, and the grid is
// never larger than the entries.
static void test_gpu_tiles_spread_is_round_robin(void **state) {
  (void)state;
  const int64_t off[] = {0, 5, 9, 12};  // works 30, 20, 12
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 64, .heads = 1};
  const int32_t tiles[] = {0, 0, 0, 1, 0, 0, -1, 0, 0, 2, 0, 0};
  int64_t hi = 0, lo = 0;
  assert_true(gpu_tiles_spread(&tl, off, off, tiles, 4, 2, &hi, &lo));
  assert_int_equal(hi, 32), assert_int_equal(lo, 30);  // c0: 30 + a hole; c1: 20 + 12
  assert_true(gpu_tiles_spread(&tl, off, off, tiles, 4, 3, &hi, &lo));
  assert_int_equal(hi, 42), assert_int_equal(lo, 0);  // c0: 30 + 12; c1: 20; c2: a hole
  assert_true(gpu_tiles_spread(&tl, off, off, tiles, 2, 8, &hi, &lo));
  assert_int_equal(hi, 30), assert_int_equal(lo, 20);  // 2 entries: a grid of 2
  assert_true(gpu_tiles_spread(&tl, off, off, tiles, 0, 8, &hi, &lo));
  assert_int_equal(hi, 0), assert_int_equal(lo, 0);
}

// A list that is not persistent is dealt as before (zigzag, no holes) even with SMs given.
static void test_gpu_tiles_not_persistent_never_has_holes(void **state) {
  (void)state;
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 128, .heads = 4, .zigzag = true};
  int64_t *off = lognormal_offsets(64, 4096, 3);
  int32_t *plain = NULL, *dealt = NULL;
  int64_t n = gpu_tiles_build_plain(&tl, 64, off, off, &plain);
  assert_int_equal(gpu_tiles_build(&tl, 64, off, off, G, &dealt), n);
  for (int64_t i = 0; i < n; i++) assert_true(dealt[3 * i] >= 0);
  free(plain), free(dealt), free(off);
}

// Many more small tiles than CTAs after a few huge ones: LPT would put every small tile on the
// one CTA without a huge one; the cap (twice the even share) keeps the holes under n + 2G.
static void test_gpu_tiles_persistent_caps_the_holes(void **state) {
  (void)state;
  enum { HUGE = G - 1, SMALL = 20000, B = HUGE + SMALL };
  int64_t *off = malloc((B + 1) * sizeof *off);
  off[0] = 0;
  for (int b = 0; b < B; b++) off[b + 1] = off[b] + (b < HUGE ? 128 : 1);
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 128, .heads = 1, .persistent = true};
  int32_t *tiles = NULL;
  int64_t entries = gpu_tiles_build(&tl, B, off, off, G, &tiles);
  assert_true(entries >= B && entries < 2 * B + 2 * G);
  check_persistent_layout(&tl, B, off);
  free(tiles), free(off);
}

// The spread of the deals on lognormal batches (B examples of length up to N, 4 heads, 128-row
// tiles, G = 132): plain round robin, the zigzag deal, the persistent (LPT) deal.
static void test_gpu_tiles_persistent_deal_narrows_the_spread(void **state) {
  (void)state;
  const struct {
    int64_t B, n;
    double lpt_max;  // the bound the LPT spread stays under (measured, with margin)
  } batches[] = {{64, 4096, 1.025}, {128, 4096, 1.015}, {256, 1024, 1.05}, {1152, 4096, 1.002}};
  for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
    int64_t B = batches[i].B;
    int64_t *off = lognormal_offsets(B, batches[i].n, 1);
    TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 128, .tile_kv = 128, .heads = 4,
                   .zigzag = true};
    TileList kernel = tl;  // every order measured as the persistent kernel spends
    kernel.persistent = true;
    int32_t *tiles = NULL;
    int64_t n = gpu_tiles_build_plain(&tl, B, off, off, &tiles);
    double plain = spread(&kernel, off, tiles, n);
    free(tiles);
    n = gpu_tiles_build(&tl, B, off, off, G, &tiles);
    double zigzag = spread(&kernel, off, tiles, n);
    free(tiles);
    n = gpu_tiles_build(&kernel, B, off, off, G, &tiles);
    double lpt = spread(&kernel, off, tiles, n);
    free(tiles);
    print_message("B=%lld N=%lld: max/min CTA work plain %.4f, zigzag %.4f, lpt %.4f\n",
                  (long long)B, (long long)batches[i].n, plain, zigzag, lpt);
    assert_true(lpt < plain);
    assert_true(lpt <= zigzag);
    assert_true(lpt <= batches[i].lpt_max);
    free(off);
  }
}

// The query tiles of 64 the dK/dV kernel streams for key rows [k0, k1) of a self-attention over
// L rows, row by row as the kernels' masks have it (causal: key k is seen by the queries
// [k, min(L, k + w)), w = 0 for no window; a window alone: |i - k| < w): from the lowest query
// any of the keys sees, rounded down to a tile, to the highest.
static int64_t key_tiles_reference(int64_t k0, int64_t k1, int64_t L, int64_t w, bool causal) {
  int64_t first = INT64_MAX, last = -1;
  for (int64_t k = k0; k < k1; k++) {
    int64_t lo = causal ? k : (w > 0 && k - w + 1 > 0 ? k - w + 1 : 0);
    int64_t hi = w > 0 && k + w < L ? k + w : L;
    if (hi <= lo) continue;
    if (lo < first) first = lo;
    if (hi - 1 > last) last = hi - 1;
  }
  if (last < 0) return 0;
  first -= first % 64;
  return (last + 1 - first + 63) / 64;
}

// The largest and smallest CTA load of a persistent deal of a key-side list (rows-row tiles of
// keys over 64-row query tiles), each tile weighed as the kernel spends: its streamed tiles
// (key_tiles_reference) of rows x 64, plus half of one.
static void key_side_loads(const int64_t *off, const int32_t *tiles, int64_t n, int64_t rows,
                           int64_t w, bool causal, int64_t *hi, int64_t *lo) {
  int64_t load[G] = {0};
  for (int64_t i = 0; i < n; i++) {
    int32_t b = tiles[3 * i], k0 = tiles[3 * i + 1];
    if (b < 0) continue;
    int64_t L = off[b + 1] - off[b], k1 = k0 + rows < L ? k0 + rows : L;
    load[i % G] += key_tiles_reference(k0, k1, L, w, causal) * rows * 64 + rows * 64 / 2;
  }
  *hi = 0, *lo = INT64_MAX;
  for (int c = 0; c < G; c++) {
    if (load[c] > *hi) *hi = load[c];
    if (load[c] < *lo) *lo = load[c];
  }
}

// A dK/dV list (rows are keys) of a causal self-attention: its work estimate is the query tiles
// each key tile's keys see (the first tile of an example is seen by all of them, the last by a
// few), so the LPT deal balances what the kernel does; with the mask left off every key tile of
// an example would weigh the same.
static void test_gpu_tiles_key_side_counts_the_causal_mask(void **state) {
  (void)state;
  const int64_t windows[] = {0, 256};
  for (int wi = 0; wi < 2; wi++) {
    const int64_t w = windows[wi], B = 128;
    int64_t *off = lognormal_offsets(B, 4096, 3);
    TileList keyed = {.q_jag = 0, .kv_jag = 0, .tile_q = 128, .tile_kv = 64, .heads = 4,
                      .causal = true, .window = w, .persistent = true, .key_side = true};
    TileList maskless = {.q_jag = 0, .kv_jag = 0, .tile_q = 128, .tile_kv = 64, .heads = 4,
                         .persistent = true};
    int32_t *tiles = NULL;
    int64_t n = gpu_tiles_build(&keyed, B, off, off, G, &tiles);
    int64_t hi, lo, est_hi, est_lo;
    key_side_loads(off, tiles, n, 128, w, true, &hi, &lo);
    assert_true(gpu_tiles_spread(&keyed, off, off, tiles, n, G, &est_hi, &est_lo));
    assert_int_equal(est_hi, hi);  // the estimate is the kernel's tiles, tile by tile
    assert_int_equal(est_lo, lo);
    double keyed_spread = (double)hi / (double)lo;
    free(tiles);
    n = gpu_tiles_build(&maskless, B, off, off, G, &tiles);
    key_side_loads(off, tiles, n, 128, w, true, &hi, &lo);
    double maskless_spread = (double)hi / (double)lo;
    free(tiles);
    print_message("causal keys, window %lld: max/min CTA work %.4f (mask counted), %.4f (mask "
                  "left off)\n", (long long)w, keyed_spread, maskless_spread);
    assert_true(keyed_spread < maskless_spread);
    assert_true(keyed_spread <= 1.02);
    free(off);
  }
}

// A window without the causal mask, |i - k| < w: the estimate of a key tile is the row-by-row
// range of queries its keys see, partial tiles included.
static void test_gpu_tiles_key_side_window_is_symmetric(void **state) {
  (void)state;
  const int64_t B = 64;
  int64_t *off = lognormal_offsets(B, 1024, 5);
  const int64_t windows[] = {1, 7, 100, 300};
  for (int wi = 0; wi < 4; wi++) {
    TileList keyed = {.q_jag = 0, .kv_jag = 0, .tile_q = 64, .tile_kv = 64, .heads = 2,
                      .window = windows[wi], .persistent = true, .key_side = true};
    int32_t *tiles = NULL;
    int64_t n = gpu_tiles_build(&keyed, B, off, off, G, &tiles);
    int64_t hi, lo, est_hi, est_lo;
    key_side_loads(off, tiles, n, 64, windows[wi], false, &hi, &lo);
    assert_true(gpu_tiles_spread(&keyed, off, off, tiles, n, G, &est_hi, &est_lo));
    assert_int_equal(est_hi, hi);
    assert_int_equal(est_lo, lo);
    free(tiles);
  }
  free(off);
}

// Whether query i sees key j under the mask, as the kernels' attn_visible has it.
static bool visible(int64_t i, int64_t j, int64_t w, bool causal) {
  if (causal && j > i) return false;
  if (w > 0 && (j <= i - w || (!causal && j >= i + w))) return false;
  return true;
}

// gpu_tiles_tile_work on a persistent list against the row-by-row count of what the sm_90a
// kernels run: from the lowest row of the other side any of the tile's rows sees, rounded down
// to a streamed tile, to the highest, in streamed tiles of tile_q x tile_kv, plus half of one;
// random lengths, tiles, masks, both sides. (Rows that see nothing may run one masked tile.)
static void test_gpu_tiles_persistent_work_is_the_kernels_tiles(void **state) {
  (void)state;
  uint64_t x = 12345;
  for (int trial = 0; trial < 3000; trial++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const bool key_side = (x >> 20) & 1, causal = (x >> 21) & 1;
    const int64_t w = (x >> 22) & 1 ? (int64_t)((x >> 24) % 200) : 0;
    const int tile_q = (x >> 32) & 1 ? 128 : 64, tile_kv = 16 << ((x >> 33) % 4);
    const int64_t lq = 1 + (int64_t)((x >> 36) % 500);
    const int64_t lk = causal ? lq : (int64_t)((x >> 46) % 500);
    const int64_t i0 = (int64_t)((x >> 40) % (uint64_t)lq) / tile_q * tile_q;
    const int64_t i1 = i0 + tile_q < lq ? i0 + tile_q : lq;
    TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = tile_q, .tile_kv = tile_kv, .heads = 1,
                   .causal = causal, .window = w, .persistent = true, .key_side = key_side};
    int64_t first = INT64_MAX, last = -1;
    for (int64_t r = i0; r < i1; r++)
      for (int64_t o = 0; o < lk; o++)
        if (key_side ? visible(o, r, w, causal) : visible(r, o, w, causal)) {
          if (o < first) first = o;
          if (o > last) last = o;
        }
    int64_t tiles = 0;
    if (last >= 0) {
      first -= first % tile_kv;
      tiles = (last + 1 - first + tile_kv - 1) / tile_kv;
    }
    const int64_t block = (int64_t)tile_q * tile_kv;
    const int64_t got = gpu_tiles_tile_work(&tl, i0, lq, lk);
    // Rows that see nothing: the kernels' range [lo, hi) is empty before lo is rounded down,
    // and may not be after it (one fully masked tile is run), as the estimate follows.
    if (last < 0 && got == block + block / 2) continue;
    if (got != tiles * block + block / 2)
      fail_msg("trial %d: %s, causal %d, window %lld, tiles %d x %d, lq %lld lk %lld, rows "
               "[%lld, %lld): %lld, want %lld streamed tiles", trial,
               key_side ? "keys" : "queries", causal, (long long)w, tile_q, tile_kv,
               (long long)lq, (long long)lk, (long long)i0, (long long)i1,
               (long long)got, (long long)tiles);
  }
}

// Meta's s=0.5 (every example over N = 1024 keys): a 10-row item runs the same 8 key tiles as a
// full 128-row one, so the persistent deal weighs them the same; the pairs (a list that is not
// persistent) weigh it 10/128 of one.
static void test_gpu_tiles_partial_item_weighs_a_full_one(void **state) {
  (void)state;
  TileList tl = {.q_jag = 0, .kv_jag = 1, .tile_q = 128, .tile_kv = 128, .heads = 4,
                 .persistent = true};
  assert_int_equal(gpu_tiles_tile_work(&tl, 128, 138, 1024), gpu_tiles_tile_work(&tl, 0, 138, 1024));
  assert_int_equal(gpu_tiles_tile_work(&tl, 0, 138, 1024), 8 * 128 * 128 + 128 * 128 / 2);
  tl.persistent = false;
  assert_int_equal(gpu_tiles_tile_work(&tl, 128, 138, 1024), 10 * 1024 + 10);
  assert_int_equal(gpu_tiles_tile_work(&tl, 0, 138, 1024), 128 * 1024 + 128);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_tiles_persistent_deals_every_tile_once),
      cmocka_unit_test(test_gpu_tiles_persistent_few_tiles_have_no_holes),
      cmocka_unit_test(test_gpu_tiles_persistent_is_lpt),
      cmocka_unit_test(test_gpu_tiles_spread_is_round_robin),
      cmocka_unit_test(test_gpu_tiles_not_persistent_never_has_holes),
      cmocka_unit_test(test_gpu_tiles_persistent_caps_the_holes),
      cmocka_unit_test(test_gpu_tiles_persistent_deal_narrows_the_spread),
      cmocka_unit_test(test_gpu_tiles_key_side_counts_the_causal_mask),
      cmocka_unit_test(test_gpu_tiles_key_side_window_is_symmetric),
      cmocka_unit_test(test_gpu_tiles_persistent_work_is_the_kernels_tiles),
      cmocka_unit_test(test_gpu_tiles_partial_item_weighs_a_full_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
