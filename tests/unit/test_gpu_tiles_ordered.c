// test_gpu_tiles_ordered.c: the order word of an ordered tile list (TileList.ordered, the fused
// deterministic sm_90a backward: gpu_tiles.h), without a GPU. Each entry counts the entries of
// its (example, head) before it in the list; and a simulation of the kernel's protocol (CTA c
// of G walks entries c, c + G, ...; an entry adds its share to a query tile only when that
// tile's counter has reached its order word, then bumps the counter) runs every deal to the end,
// under any interleaving of the CTAs, with each tile's shares added in list order.
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

enum { W = GPU_TILE_ORDERED_INTS };

// A key-side (dK/dV) list as the fused backward makes it: 128 keys an item, 64-query tiles.
static TileList ordered_list(int heads) {
  return (TileList){.q_jag = 0, .kv_jag = 0, .tile_q = 128, .tile_kv = 64, .heads = heads,
                    .zigzag = true, .persistent = true, .key_side = true, .ordered = true};
}

// Offsets [B+1] of Meta's jagged self batch (lq = lk ~ U[1, N]).
static int64_t *jagged_offsets(int64_t B, int64_t n, uint64_t seed) {
  GdpaLengths l;
  gdpa_lengths_make(GDPA_JAGGED_SELF, B, n, 0.5, 1, seed, &l);
  int64_t *off = malloc((size_t)(B + 1) * sizeof *off);
  off[0] = 0;
  for (int64_t b = 0; b < B; b++) off[b + 1] = off[b] + l.lk[b];
  gdpa_lengths_free(&l);
  return off;
}

// The order word of every tile is the count of its (example, head)'s tiles before it; the other
// three words are those of the same list unordered.
static void check_order_words(int64_t B, const int64_t *off, int heads, int sms) {
  TileList tl = ordered_list(heads), plain = tl;
  plain.ordered = false;
  int32_t *t = NULL, *u = NULL;
  int64_t n = gpu_tiles_build(&tl, B, off, off, sms, &t);
  int64_t m = gpu_tiles_build(&plain, B, off, off, sms, &u);
  assert_true(n > 0);
  assert_int_equal(n, m);
  int32_t *seen = calloc((size_t)(B * heads), sizeof *seen);
  for (int64_t i = 0; i < n; i++) {
    assert_memory_equal(&t[W * i], &u[GPU_TILE_INTS * i], GPU_TILE_INTS * sizeof *t);
    if (t[W * i] < 0) {
      assert_int_equal(t[W * i + 3], 0);
      continue;
    }
    assert_int_equal(t[W * i + 3], seen[t[W * i] * heads + t[W * i + 2]]++);
  }
  free(seen), free(t), free(u);
}

static void test_gpu_tiles_ordered_counts_earlier_entries(void **state) {
  (void)state;
  int64_t *off = jagged_offsets(300, 1024, 7);
  check_order_words(300, off, 2, 132);  // dealt (LPT, holes)
  check_order_words(300, off, 1, 7);
  check_order_words(300, off, 2, 0);    // sorted, not dealt
  free(off);
}

// The kernel's protocol, one query tile share at a time, CTAs picked at random: an entry of
// example b walks its example's query tiles in order and may add its share to tile j only when
// that tile's counter equals its order word. Every entry finishes (no deadlock), and each tile's
// shares arrive in list order.
static void simulate(int64_t B, const int64_t *off, int heads, int sms, uint64_t seed) {
  TileList tl = ordered_list(heads);
  int32_t *t = NULL;
  int64_t n = gpu_tiles_build(&tl, B, off, off, sms, &t);
  assert_true(n > 0);
  int64_t G = sms < 1 ? 1 : sms < n ? sms : n;
  // Counter of (example, head, query tile), and the list index that last added to it.
  int64_t *tile0 = malloc((size_t)(B + 1) * sizeof *tile0);
  tile0[0] = 0;
  for (int64_t b = 0; b < B; b++) tile0[b + 1] = tile0[b] + (off[b + 1] - off[b] + 63) / 64;
  int64_t tiles = tile0[B] * heads;
  int32_t *count = calloc((size_t)(tiles > 0 ? tiles : 1), sizeof *count);
  int64_t *last = malloc((size_t)(tiles > 0 ? tiles : 1) * sizeof *last);
  for (int64_t i = 0; i < tiles; i++) last[i] = -1;
  int64_t *at = calloc((size_t)G, sizeof *at);  // CTA c's entry: c + G * at[c]
  int64_t *step = calloc((size_t)G, sizeof *step);  // and its next query tile there
  int64_t live = G;
  uint64_t r = seed;
  int64_t stalls = 0;
  while (live > 0) {
    bool moved = false;
    for (int64_t k = 0; k < G; k++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      int64_t c = (int64_t)((r >> 33) % (uint64_t)G);
      int64_t e = c + G * at[c];
      if (e >= n) continue;
      const int32_t *x = &t[W * e];
      int64_t nq = x[0] < 0 ? 0 : (off[x[0] + 1] - off[x[0]] + 63) / 64;
      if (step[c] < nq) {
        int64_t id = (tile0[x[0]] + step[c]) * heads + x[2];
        if (count[id] != x[3]) {
          stalls++;
          continue;  // waits for an earlier entry
        }
        assert_true(last[id] < e);  // list order
        last[id] = e;
        count[id]++;
        step[c]++;
        moved = true;
      }
      if (step[c] >= nq) {  // the entry is done (or a hole): the CTA's next
        at[c]++, step[c] = 0;
        if (c + G * at[c] >= n) live--;
        moved = true;
      }
    }
    if (!moved) {  // every CTA may just have been unlucky: try each once in order
      for (int64_t c = 0; c < G && !moved; c++) {
        int64_t e = c + G * at[c];
        if (e >= n) continue;
        const int32_t *x = &t[W * e];
        if (x[0] < 0) moved = true;
        else {
          int64_t id = (tile0[x[0]] + step[c]) * heads + x[2];
          moved = count[id] == x[3];
        }
      }
      assert_true(moved);  // else every live CTA waits: a deadlock
    }
  }
  // Every tile got one share from each of its example's key items.
  for (int64_t b = 0; b < B; b++) {
    int64_t items = (off[b + 1] - off[b] + 127) / 128;
    for (int64_t j = tile0[b]; j < tile0[b + 1]; j++)
      for (int h = 0; h < heads; h++) assert_int_equal(count[j * heads + h], items);
  }
  free(tile0), free(count), free(last), free(at), free(step), free(t);
}

static void test_gpu_tiles_ordered_never_deadlocks(void **state) {
  (void)state;
  int64_t *off = jagged_offsets(200, 1024, 11);
  simulate(200, off, 2, 132, 1);
  simulate(200, off, 1, 5, 2);
  simulate(200, off, 3, 0, 3);
  free(off);
  // Meta's s=1.0 shape: every example 8 key items and 16 query tiles.
  int64_t *full = malloc(65 * sizeof *full);
  for (int64_t b = 0; b <= 64; b++) full[b] = 1024 * b;
  simulate(64, full, 2, 132, 4);
  simulate(64, full, 2, 16, 5);
  free(full);
}

// An unordered list keeps three words an entry; an ordered one four.
static void test_gpu_tiles_ordered_entry_width(void **state) {
  (void)state;
  TileList tl = ordered_list(1);
  assert_int_equal(gpu_tile_ints(&tl), 4);
  tl.ordered = false;
  assert_int_equal(gpu_tile_ints(&tl), 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_tiles_ordered_counts_earlier_entries),
      cmocka_unit_test(test_gpu_tiles_ordered_never_deadlocks),
      cmocka_unit_test(test_gpu_tiles_ordered_entry_width),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
