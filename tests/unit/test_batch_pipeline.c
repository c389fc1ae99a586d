// test_batch_pipeline.c: the host side of getting batches to the GPU off the step's critical
// path. Staging (runtime/gpu/gpu_stage.h): a staged batch holds the inputs and offsets where
// the slot layout says, and every tile list of the plan as gpu_tiles_build makes it, with equal
// lists built once (hstu's layers share theirs). The pipeline (runtime/train/batch_pipeline.h):
// the producer thread's items are exactly the batches made inline, in order, after a jump back
// and after a pause; a failed batch reaches the trainer with its message; a paused producer
// makes nothing. No GPU needed: plans are built for sm_90a on the host.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "batch.h"
#include "batch_pipeline.h"
#include "gpu_stage.h"
#include "gpu_tiles.h"
#include "load_model.h"
#include "lower.h"
#include "numerics.h"
#include "plan.h"
#include "synth.h"

typedef struct Model {
  LoadedModel m;
  Plan p;
  Schema s;
  StagingLayout l;
  Synth *synth;      // the producer's
  Synth *ref_synth;  // the test thread's: the same stream
} Model;

static void model_open(Model *x, const char *path) {
  memset(x, 0, sizeof *x);
  if (!load_model(&x->m, path, NULL, true, true, false)) fail_msg("cannot load %s", path);
  Diag d;
  diag_init(&d, &x->m.src, stderr);
  if (!plan_build(&x->m.ir, "sm_90a", &x->m.arena, &d, &x->p)) fail_msg("no plan for %s", path);
  schema_from_ir(&x->m.ir, &x->s);
  char err[256];
  if (!staging_layout_init(&x->l, &x->p, x->m.ir.batch, 132, err, sizeof err))
    fail_msg("%s", err);
  SynthConfig sc;
  synth_config_default(&sc);
  sc.seed = 7;
  x->synth = synth_new(&x->s, &sc);
  x->ref_synth = synth_new(&x->s, &sc);
}

static void model_close(Model *x) {
  synth_free(x->synth);
  synth_free(x->ref_synth);
  staging_layout_free(&x->l);
  loaded_model_free(&x->m);
}

// Every region of a staged batch against the batch, and every tile list against a fresh build.
static void check_staged(const Model *x, const Batch *b, const GpuStaged *st) {
  const Ir *ir = &x->m.ir;
  assert_int_equal(st->B, b->B);
  for (int j = 0; j < ir->njagged; j++) {
    assert_int_equal(st->totals[j], b->offsets[j][b->B]);
    assert_memory_equal(st->image + x->l.offsets_offset[j], b->offsets[j],
                        (size_t)(b->B + 1) * 8);
  }
  for (int f = 0; f < x->s.nfeatures; f++) {
    int t = x->s.features[f].tensor;
    int64_t rows, width;
    gpu_tensor_shape(ir, t, b->B, st->totals, &rows, &width);
    const unsigned char *at = st->image + x->l.feature_offset[f];
    assert_true(x->l.feature_offset[f] + (size_t)(rows * width * gpu_dtype_bytes(ir->tensors[t].dtype)) <= st->used);
    if (x->s.features[f].kind == FEATURE_IDS) {
      assert_memory_equal(at, b->ids[f], (size_t)(rows * width) * 8);
      continue;
    }
    DType dt = ir->tensors[t].dtype;
    for (int64_t i = 0; i < rows * width; i++) {
      float want = b->values[f][i], got;
      if (dt == DT_F32) memcpy(&got, at + 4 * i, 4);
      else {
        uint16_t h;
        memcpy(&h, at + 2 * i, 2);
        got = dt == DT_FP16 ? fp16_decode(h) : bf16_decode(h);
        want = dt == DT_FP16 ? fp16_decode(fp16_encode(want)) : bf16_decode(bf16_encode(want));
      }
      if (got != want) fail_msg("feature %d value %lld: %g, want %g", f, (long long)i, got, want);
    }
  }
  for (int t = 0; t < x->p.ntiles; t++) {
    const TileList *tl = &x->p.tiles[t];
    int32_t *words = NULL;
    int64_t n = gpu_tiles_build(tl, b->B, tl->q_jag >= 0 ? b->offsets[tl->q_jag] : NULL,
                                tl->kv_jag >= 0 ? b->offsets[tl->kv_jag] : NULL,
                                tl->zigzag ? 132 : 0, &words);
    assert_true(n >= 0);
    assert_int_equal(st->tile_count[t], n);
    assert_true((int64_t)st->tile_offset[t] + n * GPU_TILE_INTS <= st->tile_words);
    if (n > 0) assert_memory_equal(st->tiles + st->tile_offset[t], words, (size_t)n * 12);
    free(words);
  }
}

static void test_stage_hstu_matches_the_batch_and_shares_equal_tile_lists(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/hstu.gem");
  int distinct = 0;
  for (int t = 0; t < x.p.ntiles; t++) distinct += x.l.tile_alias[t] == t;
  // Six identical causal layers: their forward and backward lists fall into a few classes.
  assert_true(x.p.ntiles >= 12);
  assert_true(distinct < x.p.ntiles / 3);
  // A causal list of keys (dK/dV) weighs its tiles from the keys' side: never one list with a
  // list of queries.
  int key_lists = 0;
  for (int t = 0; t < x.p.ntiles; t++) {
    const TileList *a = &x.p.tiles[t], *b = &x.p.tiles[x.l.tile_alias[t]];
    key_lists += a->key_side;
    if (a->causal) assert_int_equal(a->key_side, b->key_side);
  }
  assert_true(key_lists > 0);
  Batch b;
  batch_alloc(&b, &x.s, x.m.ir.batch);
  GpuStaged st = {0};
  char err[256];
  for (int64_t k = 0; k < 3; k++) {
    synth_batch(x.synth, k * b.B, &b);
    if (!gpu_stage_batch(&x.l, &b, &st, err, sizeof err)) fail_msg("%s", err);
    check_staged(&x, &b, &st);
  }
  // Only the distinct lists take room.
  int64_t words = 0;
  for (int t = 0; t < x.p.ntiles; t++)
    if (x.l.tile_alias[t] == t) words += (st.tile_count[t] * GPU_TILE_INTS + 63) / 64 * 64;
  assert_int_equal(st.tile_words, words);
  gpu_staged_free(&st);
  batch_free(&b);
  model_close(&x);
}

static void test_stage_refuses_a_batch_past_the_layout(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/gem_small.gem");
  Batch b;
  batch_alloc(&b, &x.s, x.m.ir.batch + 1);
  synth_batch(x.synth, 0, &b);
  GpuStaged st = {0};
  char err[256] = "";
  assert_false(gpu_stage_batch(&x.l, &b, &st, err, sizeof err));
  assert_non_null(strstr(err, "at most"));
  gpu_staged_free(&st);
  batch_free(&b);
  model_close(&x);
}

// --- the pipeline -----------------------------------------------------------------------

typedef struct Source {
  Model *x;
  int64_t fail_at;     // this cursor's batch fails
  int made;            // batches made (the producer's count)
  int delay_us;
} Source;

static bool produce(void *ctx, int64_t cursor, Batch *b, GpuStaged *st, double *make_s,
                    double *stage_s, char *err, size_t err_size) {
  Source *src = ctx;
  __atomic_add_fetch(&src->made, 1, __ATOMIC_SEQ_CST);
  *make_s = *stage_s = 0;
  if (src->delay_us) {
    struct timespec ts = {0, src->delay_us * 1000L};
    nanosleep(&ts, NULL);
  }
  if (cursor == src->fail_at) {
    snprintf(err, err_size, "batch at %lld is unreadable", (long long)cursor);
    return false;
  }
  synth_batch(src->x->synth, cursor, b);
  return gpu_stage_batch(&src->x->l, b, st, err, err_size);
}

static void take_and_check(BatchPipeline *p, Model *x, Batch *ref, int64_t cursor) {
  PipelineItem *it = pipeline_take(p, cursor, NULL);
  if (!it->ok) fail_msg("cursor %lld: %s", (long long)cursor, it->err);
  assert_int_equal(it->cursor, cursor);
  synth_batch(x->ref_synth, cursor, ref);
  for (int j = 0; j < ref->njagged; j++)
    assert_memory_equal(it->batch.offsets[j], ref->offsets[j], (size_t)(ref->B + 1) * 8);
  check_staged(x, ref, &it->staged);
  pipeline_release(p, it);
}

static void test_pipeline_gives_the_inline_batches_in_order_and_after_jumps(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/hstu.gem");
  int64_t B = x.m.ir.batch;
  Source src = {.x = &x, .fail_at = -1};
  BatchPipeline *p = pipeline_new(3, &x.s, B, B, produce, &src);
  assert_non_null(p);
  Batch ref;
  batch_alloc(&ref, &x.s, B);
  for (int64_t k = 0; k < 5; k++) take_and_check(p, &x, &ref, k * B);
  take_and_check(p, &x, &ref, 2 * B);    // back: a resume from an earlier checkpoint
  take_and_check(p, &x, &ref, 3 * B);
  take_and_check(p, &x, &ref, 9 * B);    // ahead: the stream starts again there
  take_and_check(p, &x, &ref, 10 * B);
  pipeline_free(p);
  batch_free(&ref);
  model_close(&x);
}

static void test_pipeline_reports_a_failed_batch_and_goes_on(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/gem_small.gem");
  int64_t B = x.m.ir.batch;
  Source src = {.x = &x, .fail_at = 2 * B};
  BatchPipeline *p = pipeline_new(2, &x.s, B, B, produce, &src);
  Batch ref;
  batch_alloc(&ref, &x.s, B);
  take_and_check(p, &x, &ref, 0);
  take_and_check(p, &x, &ref, B);
  PipelineItem *it = pipeline_take(p, 2 * B, NULL);
  assert_false(it->ok);
  char want[64];
  snprintf(want, sizeof want, "batch at %lld is unreadable", (long long)(2 * B));
  assert_string_equal(it->err, want);
  pipeline_release(p, it);
  take_and_check(p, &x, &ref, 3 * B);
  pipeline_free(p);
  batch_free(&ref);
  model_close(&x);
}

static void test_pipeline_pause_stops_the_producer(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/gem_small.gem");
  int64_t B = x.m.ir.batch;
  Source src = {.x = &x, .fail_at = -1, .delay_us = 2000};
  BatchPipeline *p = pipeline_new(4, &x.s, B, B, produce, &src);
  Batch ref;
  batch_alloc(&ref, &x.s, B);
  take_and_check(p, &x, &ref, 0);
  pipeline_pause(p);
  int before = __atomic_load_n(&src.made, __ATOMIC_SEQ_CST);
  struct timespec ts = {0, 30 * 1000 * 1000L};
  nanosleep(&ts, NULL);  // 15 batches' time: a running producer would fill the ring
  assert_int_equal(__atomic_load_n(&src.made, __ATOMIC_SEQ_CST), before);
  assert_true(before <= 5);  // the first batch and a full ring
  pipeline_resume(p);
  take_and_check(p, &x, &ref, B);
  take_and_check(p, &x, &ref, 2 * B);
  pipeline_free(p);
  batch_free(&ref);
  model_close(&x);
}

// One item, the producer still making the batch after the one taken when the trainer skips
// ahead: the take must drop it once made and start the stream at the new cursor (it hung).
static void test_pipeline_one_item_skips_ahead(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/gem_small.gem");
  int64_t B = x.m.ir.batch;
  Source src = {.x = &x, .fail_at = -1, .delay_us = 20000};
  BatchPipeline *p = pipeline_new(1, &x.s, B, B, produce, &src);
  Batch ref;
  batch_alloc(&ref, &x.s, B);
  take_and_check(p, &x, &ref, 0);  // the producer now makes cursor B, slowly
  take_and_check(p, &x, &ref, 2 * B);
  take_and_check(p, &x, &ref, 3 * B);
  pipeline_free(p);
  batch_free(&ref);
  model_close(&x);
}

// A reset drops what was made: the next take makes its batch again.
static void test_pipeline_reset_makes_again(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/gem_small.gem");
  int64_t B = x.m.ir.batch;
  Source src = {.x = &x, .fail_at = -1};
  BatchPipeline *p = pipeline_new(3, &x.s, B, B, produce, &src);
  Batch ref;
  batch_alloc(&ref, &x.s, B);
  take_and_check(p, &x, &ref, 0);
  pipeline_pause(p);
  pipeline_reset(p);
  int before = __atomic_load_n(&src.made, __ATOMIC_SEQ_CST);
  pipeline_resume(p);
  take_and_check(p, &x, &ref, B);
  assert_true(__atomic_load_n(&src.made, __ATOMIC_SEQ_CST) > before);
  pipeline_free(p);
  batch_free(&ref);
  model_close(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage_hstu_matches_the_batch_and_shares_equal_tile_lists),
      cmocka_unit_test(test_stage_refuses_a_batch_past_the_layout),
      cmocka_unit_test(test_pipeline_gives_the_inline_batches_in_order_and_after_jumps),
      cmocka_unit_test(test_pipeline_reports_a_failed_batch_and_goes_on),
      cmocka_unit_test(test_pipeline_pause_stops_the_producer),
      cmocka_unit_test(test_pipeline_one_item_skips_ahead),
      cmocka_unit_test(test_pipeline_reset_makes_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
