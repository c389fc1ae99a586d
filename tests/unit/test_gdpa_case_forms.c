// test_gdpa_case_forms.c: the attention forms `gemc bench gdpa` runs its rows on, emitted by
// the real codegen without a GPU: self puts q and kv on one jagged dim; Meta's self s < 1 (lq
// != lk) runs as cross over a jagged kv, q and kv on jagged dims of their own, and its forward
// tile list reads both; cross KV=256 has a set kv; PMA at the bench's batch splits its dQ into
// chunks (gdpa_case_emit_batch). Then the host side of a measurement on a Meta s=0.5 batch: the
// lengths go to the right dims and the forward list's spread shrinks after the deal.
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

enum { B = 1152, N = 1024, G = 132 };

static GdpaCase bench_form(AttnShape shape, int64_t kv_set, int64_t q_set) {
  GdpaCase c = {.shape = shape, .act = ACT_GELU, .heads = 4, .dh = 128, .q_set = q_set,
                .kv_set = kv_set, .max_q = shape == ATTN_PMA ? 0 : N, .max_kv = N,
                .scale = 0.088};
  return c;
}

// The first forward launch's tile list.
static const TileList *forward_tiles(const GdpaEmitted *e) {
  for (int i = 0; i < e->nforward; i++)
    if (e->launches[i].grid != GRID_FIXED) return &e->tiles[e->launches[i].tiles];
  fail_msg("no forward tile list");
  return NULL;
}

static void test_gdpa_case_forms_put_q_and_kv_on_their_dims(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  // self: one jagged dim
  GdpaCase self = bench_form(ATTN_SELF, 0, 0);
  assert_true(gdpa_case_emit_batch(&self, B, "s.", &arena, &src, e));
  assert_int_equal(e->ir.njagged, 1);
  assert_int_equal(e->q_jag, 0), assert_int_equal(e->kv_jag, 0);
  // cross over a jagged kv: two dims, and the forward list reads both
  GdpaCase cross = bench_form(ATTN_CROSS, 0, 0);
  assert_true(gdpa_case_emit_batch(&cross, B, "x.", &arena, &src, e));
  assert_int_equal(e->ir.njagged, 2);
  assert_true(e->q_jag >= 0 && e->kv_jag >= 0 && e->q_jag != e->kv_jag);
  assert_int_equal(e->ir.tensors[e->q].jag, e->q_jag);
  assert_int_equal(e->ir.tensors[e->k].layout, LAYOUT_JAGGED);
  assert_int_equal(e->ir.tensors[e->k].jag, e->kv_jag);
  const TileList *tl = forward_tiles(e);
  assert_int_equal(tl->q_jag, e->q_jag), assert_int_equal(tl->kv_jag, e->kv_jag);
  // cross KV=256: a set kv, no kv dim
  GdpaCase set = bench_form(ATTN_CROSS, 256, 0);
  assert_true(gdpa_case_emit_batch(&set, B, "k.", &arena, &src, e));
  assert_int_equal(e->kv_jag, -1);
  assert_int_equal(e->ir.tensors[e->k].layout, LAYOUT_SET);
  assert_int_equal(forward_tiles(e)->kv_fixed, 256);
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

// PMA's backward in one pass (emit_attention_pma.c): the keys in chunks of at least 8 tiles of
// the largest batch, at most 528 / heads; their partial dQ added in order.
static void test_gdpa_case_batch_sets_pma_chunks(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  GdpaCase one = bench_form(ATTN_PMA, 0, 32);
  assert_true(gdpa_case_emit(&one, "p.", &arena, &src, e));
  assert_int_equal(e->ir.batch, 1);
  // one example of up to N keys: N / 64 tiles, 8 a chunk
  char want[64];
  snprintf(want, sizeof want, "enum { CHUNKS = %d };", N / 64 / 8);
  assert_non_null(strstr(src.data, want));
  assert_non_null(strstr(src.data, "attn_backward_pma<128, ATTN_ACT_GELU, 32>(partial, dk, dv,"));
  assert_non_null(strstr(src.data, "_bwd_q_sum"));
  sb_free(&src);
  GdpaCase bench = bench_form(ATTN_PMA, 0, 32);
  assert_true(gdpa_case_emit_batch(&bench, B, "p.", &arena, &src, e));
  assert_int_equal(e->ir.batch, B);
  assert_non_null(strstr(src.data, "enum { CHUNKS = 132 };"));  // 528 blocks of 4 heads
  assert_non_null(strstr(src.data, "_bwd_q_sum"));
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

// What gdpa_bench.c does on the host for a Meta self s=0.5 row: lq on q's dim, lk = N on kv's,
// the offsets, the forward list dealt for G CTAs, and its spread before and after.
static void test_gdpa_case_meta_self_batch_on_the_cross_form(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  GdpaCase cross = bench_form(ATTN_CROSS, 0, 0);
  assert_true(gdpa_case_emit_batch(&cross, B, "x.", &arena, &src, e));
  GdpaLengths l;
  gdpa_lengths_make(GDPA_META_SELF, B, N, 0.5, 0, 1, &l);
  int64_t *off[2];
  for (int j = 0; j < 2; j++) {
    off[j] = malloc((B + 1) * sizeof(int64_t));
    off[j][0] = 0;
  }
  for (int b = 0; b < B; b++) {
    off[e->q_jag][b + 1] = off[e->q_jag][b] + l.lq[b];
    off[e->kv_jag][b + 1] = off[e->kv_jag][b] + l.lk[b];
  }
  assert_int_equal(off[e->kv_jag][B], (int64_t)B * N);  // every example has N keys
  const TileList *tl = forward_tiles(e);
  int32_t *tiles = NULL;
  int64_t hi, lo, n = gpu_tiles_build_plain(tl, B, off[tl->q_jag], off[tl->kv_jag], &tiles);
  int64_t want = 0;
  for (int b = 0; b < B; b++) want += (l.lq[b] + tl->tile_q - 1) / tl->tile_q * 4;
  assert_int_equal(n, want);
  assert_true(gpu_tiles_spread(tl, off[tl->q_jag], off[tl->kv_jag], tiles, n, G, &hi, &lo));
  double before = (double)hi / (double)lo;
  free(tiles);
  n = gpu_tiles_build(tl, B, off[tl->q_jag], off[tl->kv_jag], G, &tiles);
  assert_true(gpu_tiles_spread(tl, off[tl->q_jag], off[tl->kv_jag], tiles, n, G, &hi, &lo));
  double after = (double)hi / (double)lo;
  print_message("Meta self s=0.5, N=%d: forward spread %.4f -> %.4f (%s)\n", N, before, after,
                tl->persistent ? "lpt" : "zigzag");
  assert_true(after <= before && after < 1.01);
  free(tiles);
  free(off[0]), free(off[1]);
  gdpa_lengths_free(&l);
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gdpa_case_forms_put_q_and_kv_on_their_dims),
      cmocka_unit_test(test_gdpa_case_batch_sets_pma_chunks),
      cmocka_unit_test(test_gdpa_case_meta_self_batch_on_the_cross_form),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
