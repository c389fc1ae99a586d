// test_tune.c: the CPU half of the attention autotuner (runtime/bench/tune.h, docs/tuning.md):
// length buckets; candidates, the shared-memory limit and the user's hints; the cache key and
// file (round trip, and every kind of bad file); applying a winner without overriding a hint,
// and the plan it gives; the timed batch; `gemc tune` without a GPU. No GPU needed.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "commands.h"        // defines: cmd_tune
#include "run_command.h"     // defines: run_command
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "load_model.h"      // defines: LoadedModel, load_model
#include "lower.h"           // defines: plan_build
#include "arena.h"           // defines: Arena, arena_free
#include "tune.h"

enum { SMEM_LIMIT = 227 * 1024 };

// --- models -------------------------------------------------------------------------------

static char tmp_dir[] = "/tmp/gemc-test-tune-XXXXXX";

// A model with one self gdpa of d = 256 over a jagged history of max `max_len`: `heads` heads,
// and `suffix` after the call ("@schedule(tile_kv = 64)", "@mxfp8", ...); its target `target`.
static LoadedModel *load_gdpa(const char *target, int heads, int64_t max_len, const char *prec,
                              const char *suffix) {
  // The IR keeps a pointer to the path (its `source`): one buffer per model, never reused.
  static int n;
  static char paths[64][512];
  assert_true(n < 64);
  char *path = paths[n], text[2048];
  snprintf(path, sizeof paths[0], "%s/m%d.gem", tmp_dir, n++);
  snprintf(text, sizeof text,
           "model m {\n"
           "  batch 64;\n"
           "  dim 256;\n"
           "  precision %s;\n"
           "  target %s;\n"
           "  seq hist : id max %lld;\n"
           "  label click;\n"
           "  table items : rows 100;\n"
           "  h = embed(items, hist);\n"
           "  h = h + gdpa(h, heads = %d, act = silu, mask = causal) %s;\n"
           "  loss bce(linear(flatten(pma(h, seeds = 1, heads = 4, act = silu)), 1), click);\n"
           "}\n",
           prec, target, (long long)max_len, heads, suffix);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  LoadedModel *m = calloc(1, sizeof *m);
  assert_non_null(m);
  if (!load_model(m, path, NULL, true, true, false)) fail_msg("does not compile:\n%s", text);
  return m;
}

static void unload_model(LoadedModel *m) {
  loaded_model_free(m);
  free(m);
}

// The first forward attention node.
static int gdpa_node(const Ir *ir) {
  for (int i = 0; i < ir->nforward; i++)
    if (ir->nodes[i].op == OP_ATTENTION) return i;
  fail_msg("no attention node");
  return -1;
}

static bool has_candidate(const TuneOp *op, TuneKernel k, int tile_q, int tile_kv, int tile_m,
                          int stages) {
  for (int i = 0; i < op->ncand; i++) {
    const TuneCandidate *c = &op->cand[i];
    if (c->kernel == k && c->tile_q == tile_q && c->tile_kv == tile_kv && c->tile_m == tile_m &&
        c->stages == stages)
      return true;
  }
  return false;
}

// --- buckets and candidates ---------------------------------------------------------------

static void test_tune_length_bucket_rounds_up_to_a_power_of_two(void **state) {
  (void)state;
  assert_int_equal(tune_length_bucket(1), 16);
  assert_int_equal(tune_length_bucket(16), 16);
  assert_int_equal(tune_length_bucket(17), 32);
  assert_int_equal(tune_length_bucket(50), 64);
  assert_int_equal(tune_length_bucket(1000), 1024);
  assert_int_equal(tune_length_bucket(1024), 1024);
  assert_int_equal(tune_length_bucket(1025), 2048);
  assert_int_equal(tune_length_bucket(4096), 4096);
}

static void test_tune_candidates_sm90_dh64(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "");
  TuneOp op;
  char why[256] = "";
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  // 128- and 64-key tiles with 2, 3 or 4 stages all fit at dh 64, and the mma.sync kernel
  assert_int_equal(op.ncand, 7);
  assert_int_equal(op.def, 0);
  assert_true(has_candidate(&op, TUNE_SM90, 128, 128, 0, 4));
  assert_int_equal(op.cand[op.def].tile_kv, 128);  // the compiler's choice: 128 keys, 4 stages
  assert_int_equal(op.cand[op.def].stages, 4);
  assert_true(has_candidate(&op, TUNE_SM90, 128, 64, 0, 2));
  assert_true(has_candidate(&op, TUNE_MMA, 64, 64, 32, 2));
  for (int i = 0; i < op.ncand; i++) assert_true(op.cand[i].smem <= SMEM_LIMIT);
  assert_int_equal(op.c.dh, 64);
  assert_int_equal(op.bucket_q, 1024);
  assert_true(op.one_dim);
  assert_non_null(strstr(op.name, "self silu causal"));
  assert_non_null(strstr(op.where, ".gem:10:"));
  unload_model(m);
}

static void test_tune_candidates_respect_the_shared_memory_limit(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 2, 256, "bf16", "");  // dh 128
  TuneOp op;
  char why[256];
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  // 128-key tiles fit only 2 stages at dh 128 (3 need 263296 bytes); 64-key tiles fit 2..4
  assert_true(has_candidate(&op, TUNE_SM90, 128, 128, 0, 2));
  assert_false(has_candidate(&op, TUNE_SM90, 128, 128, 0, 3));
  assert_false(has_candidate(&op, TUNE_SM90, 128, 128, 0, 4));
  assert_true(has_candidate(&op, TUNE_SM90, 128, 64, 0, 4));
  assert_int_equal(op.ncand, 5);  // 1 + 3 sm_90a, 1 mma.sync
  for (int i = 0; i < op.ncand; i++) assert_true(op.cand[i].smem <= SMEM_LIMIT);
  assert_int_equal(op.cand[op.def].stages, 2);
  unload_model(m);
}

static void test_tune_candidates_agree_with_every_hint(void **state) {
  (void)state;
  TuneOp op;
  char why[256];
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "@schedule(tile_kv = 64)");
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  for (int i = 0; i < op.ncand; i++) assert_int_equal(op.cand[i].tile_kv, 64);
  assert_int_equal(op.ncand, 4);  // stages 4, 3, 2 and the mma.sync kernel (64 keys too)
  assert_int_equal(op.cand[op.def].stages, 4);
  assert_non_null(strstr(op.sig, "hints=tile_kv=64"));
  unload_model(m);

  m = load_gdpa("sm_90a", 4, 1000, "bf16", "@schedule(stages = 3)");
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_int_equal(op.ncand, 2);
  assert_true(has_candidate(&op, TUNE_SM90, 128, 128, 0, 3));
  assert_true(has_candidate(&op, TUNE_SM90, 128, 64, 0, 3));
  unload_model(m);

  m = load_gdpa("sm_90a", 4, 1000, "bf16", "@schedule(tile_q = 64)");  // the mma.sync kernel
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_int_equal(op.ncand, 2);
  assert_true(has_candidate(&op, TUNE_MMA, 64, 64, 32, 2));
  assert_true(has_candidate(&op, TUNE_MMA, 64, 64, 16, 2));
  unload_model(m);

  m = load_gdpa("sm_90a", 4, 1000, "bf16", "@schedule(tile_q = 64, tile_m = 16)");
  assert_false(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_non_null(strstr(why, "fix its shape"));
  unload_model(m);

  m = load_gdpa("sm_90a", 4, 1000, "bf16", "@schedule(tile_kv = 128, stages = 4)");
  assert_false(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_non_null(strstr(why, "fix its shape"));
  unload_model(m);
}

static void test_tune_candidates_per_kernel_and_target(void **state) {
  (void)state;
  TuneOp op;
  char why[256] = "";
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "@mxfp8");
  assert_false(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_non_null(strstr(why, "quantized"));
  unload_model(m);

  m = load_gdpa("sm_90a", 4, 1000, "fp32", "");
  assert_false(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_non_null(strstr(why, "SIMT"));
  unload_model(m);

  m = load_gdpa("sm_100a", 4, 1000, "bf16", "");  // mma.sync: tile_q x tile_m
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_100a", 64, &op, why, sizeof why));
  assert_int_equal(op.ncand, 4);
  for (int i = 0; i < op.ncand; i++) assert_int_equal(op.cand[i].kernel, TUNE_MMA);
  assert_int_equal(op.cand[op.def].tile_q, 128);  // jagged q: 128 rows of 32 a warp
  assert_int_equal(op.cand[op.def].tile_m, 32);
  unload_model(m);

  m = load_gdpa("sm_90a", 4, 1000, "fp16", "");  // sm_90a kernel only: fp16 has no mma.sync
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  assert_int_equal(op.ncand, 6);
  for (int i = 0; i < op.ncand; i++) assert_int_equal(op.cand[i].kernel, TUNE_SM90);
  unload_model(m);
}

// --- keys and the cache file --------------------------------------------------------------

static void test_tune_key_names_gpu_nvrtc_op_and_bucket(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "");
  LoadedModel *longer = load_gdpa("sm_90a", 4, 3000, "bf16", "");
  LoadedModel *same_bucket = load_gdpa("sm_90a", 4, 1024, "bf16", "");
  TuneOp a, b, c;
  char why[256], ka[1024], kb[1024], kc[1024], kd[1024], ke[1024];
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &a, why, sizeof why));
  assert_true(tune_op_init(&longer->ir, gdpa_node(&longer->ir), "sm_90a", 64, &b, why, sizeof why));
  assert_true(tune_op_init(&same_bucket->ir, gdpa_node(&same_bucket->ir), "sm_90a", 64, &c, why,
                           sizeof why));
  tune_key(&a, "NVIDIA H200", 13000, ka, sizeof ka);
  assert_non_null(strstr(ka, "gemc-tune 1 | gemc "));
  assert_non_null(strstr(ka, "| gpu NVIDIA H200 | sm_90a | nvrtc 13000 | op self silu "
                             "mask=causal"));
  assert_non_null(strstr(ka, "heads=4 dh=64 bf16"));
  assert_non_null(strstr(ka, "B=64 hints=-"));
  assert_non_null(strstr(ka, "| len q1024"));
  tune_key(&b, "NVIDIA H200", 13000, kb, sizeof kb);
  tune_key(&c, "NVIDIA H200", 13000, kc, sizeof kc);
  assert_string_not_equal(ka, kb);  // bucket 4096
  assert_non_null(strstr(kb, "| len q4096"));
  assert_string_equal(ka, kc);      // 1000 and 1024 share the bucket
  tune_key(&a, "NVIDIA H100", 13000, kd, sizeof kd);
  tune_key(&a, "NVIDIA H200", 12080, ke, sizeof ke);
  assert_string_not_equal(ka, kd);
  assert_string_not_equal(ka, ke);
  char pa[4096], pd[4096];
  tune_cache_path("/c", ka, pa, sizeof pa);
  tune_cache_path("/c", kd, pd, sizeof pd);
  assert_int_equal(strlen(pa), strlen("/c/tune-") + 16 + strlen(".txt"));
  assert_memory_equal(pa, "/c/tune-", 8);
  assert_string_not_equal(pa, pd);
  unload_model(m);
  unload_model(longer);
  unload_model(same_bucket);
}

static void write_file(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  fclose(f);
}

static void test_tune_cache_round_trip(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "");
  TuneOp op;
  char why[256], key[1024], err[1024];
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  tune_key(&op, "NVIDIA H200", 13000, key, sizeof key);
  int winner = -1;
  TuneEntry got;
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_MISS);
  TuneEntry e = {.winner = op.cand[4], .fwd_ms = 0.4125, .bwd_ms = 1.5, .default_fwd_ms = 0.45,
                 .ncand = op.ncand};
  assert_true(tune_cache_store(tmp_dir, key, &e, err, sizeof err));
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_HIT);
  assert_int_equal(winner, 4);
  assert_true(got.fwd_ms == 0.4125 && got.bwd_ms == 1.5 && got.default_fwd_ms == 0.45);
  assert_int_equal(got.ncand, op.ncand);
  assert_int_equal(got.winner.smem, op.cand[4].smem);
  // Another bucket's key is another file: a miss.
  char other[1024];
  op.bucket_q = 2048;
  tune_key(&op, "NVIDIA H200", 13000, other, sizeof other);
  assert_int_equal(tune_cache_load(tmp_dir, other, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_MISS);
  unload_model(m);
}

static void test_tune_cache_bad_files_are_reported_not_fatal(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "");
  TuneOp op;
  char why[256], key[1024], path[4096], err[1024];
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 64, &op, why, sizeof why));
  tune_key(&op, "NVIDIA H200", 13000, key, sizeof key);
  tune_cache_path(tmp_dir, key, path, sizeof path);
  int winner = -1;
  TuneEntry got;
  StrBuf good = {0};
  TuneEntry e = {.winner = op.cand[1], .fwd_ms = 1, .bwd_ms = 2, .default_fwd_ms = 1.1,
                 .ncand = 7};
  tune_entry_format(key, &e, &good);
  assert_int_equal(tune_entry_parse(good.data, good.len, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_HIT);
  assert_int_equal(winner, 1);

  struct { const char *text; const char *why; } bad[] = {
      {"\x7f" "ELF garbage \x01\x02", "no 'format' line"},
      {"format 2\n", "format '2'"},
      {"format 1\nkey another key\n", "another key"},
      {"format 1\n", "no 'key' line"},
      {"winner\n", "without a value"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    write_file(path, bad[i].text, strlen(bad[i].text));
    why[0] = '\0';
    assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                     TUNE_CACHE_BAD);
    if (!strstr(why, bad[i].why)) fail_msg("case %zu: '%s' lacks '%s'", i, why, bad[i].why);
  }
  // Truncated: the good text cut before its winner line.
  const char *cut = strstr(good.data, "winner");
  write_file(path, good.data, (size_t)(cut - good.data));
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_BAD);
  assert_non_null(strstr(why, "no 'winner' line"));
  // A NUL byte: not text.
  write_file(path, "format 1\n\0key", 13);
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_BAD);
  assert_non_null(strstr(why, "not a text file"));
  // A winner this gemc does not offer for the node (an older gemc's, or edited by hand).
  StrBuf stale = {0};
  TuneEntry s = e;
  s.winner.tile_kv = 32;
  tune_entry_format(key, &s, &stale);
  write_file(path, stale.data, stale.len);
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_BAD);
  assert_non_null(strstr(why, "not a candidate"));
  // A time that is not a number.
  StrBuf times = {0};
  sb_puts(&times, good.data);
  sb_puts(&times, "fwd_ms nan\n");
  assert_int_equal(tune_entry_parse(times.data, times.len, key, &op, &winner, &got, why,
                                    sizeof why), TUNE_CACHE_BAD);
  assert_non_null(strstr(why, "fwd_ms is not a time"));
  // Re-tuning overwrites the bad entry, which then reads back.
  assert_true(tune_cache_store(tmp_dir, key, &e, err, sizeof err));
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_HIT);
  // A directory where the file should be: unreadable, still not fatal.
  assert_int_equal(unlink(path), 0);
  assert_int_equal(mkdir(path, 0700), 0);
  assert_int_equal(tune_cache_load(tmp_dir, key, &op, &winner, &got, why, sizeof why),
                   TUNE_CACHE_BAD);
  assert_int_equal(rmdir(path), 0);
  sb_free(&good);
  sb_free(&stale);
  sb_free(&times);
  unload_model(m);
}

// --- applying a winner --------------------------------------------------------------------

static void test_tune_apply_keeps_the_users_hints(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "@schedule(tile_kv = 64, zigzag = off)");
  int node = gdpa_node(&m->ir);
  TuneOp op;
  char why[256];
  assert_true(tune_op_init(&m->ir, node, "sm_90a", 64, &op, why, sizeof why));
  Schedule s = m->ir.nodes[node].sched;
  tune_apply(&s, &op, op.def);  // the compiler's choice: nothing changes
  assert_memory_equal(&s, &m->ir.nodes[node].sched, sizeof s);
  int three = -1;
  for (int i = 0; i < op.ncand; i++)
    if (op.cand[i].kernel == TUNE_SM90 && op.cand[i].stages == 3) three = i;
  assert_true(three >= 0);
  tune_apply(&s, &op, three);
  assert_int_equal(s.tile_kv, 64);  // the hint
  assert_int_equal(s.stages, 3);    // the winner's
  assert_int_equal(s.zigzag, 2);    // untouched
  assert_int_equal(s.tile_m, 0);    // the sm_90a kernel has none
  // A field the user set is never written, even by a candidate that would differ there.
  Schedule hinted = {.tile_kv = 64, .stages = 2};
  tune_apply(&hinted, &op, three);
  assert_int_equal(hinted.stages, 2);
  assert_int_equal(hinted.tile_q, 128);
  unload_model(m);
}

// Every candidate, applied to the model's node, gives a plan whose forward kernel is that
// candidate's, and so does the harness's case of it (tune_case): the tuner times what training
// will run. For the compiler's choice (nothing applied) this checks that the tuner predicts
// codegen's default shape: the gdpa's sm_90a 128 keys and 4 stages, the PMA's 32 rows.
static void test_tune_apply_gives_the_candidates_kernel(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "");
  int nodes[2] = {gdpa_node(&m->ir), -1};
  for (int i = nodes[0] + 1; i < m->ir.nforward; i++)
    if (m->ir.nodes[i].op == OP_ATTENTION) nodes[1] = i;
  assert_true(nodes[1] > nodes[0]);
  assert_int_equal(m->ir.nodes[nodes[1]].shape, ATTN_PMA);
  for (int which = 0; which < 2; which++) {
    int node = nodes[which];
    TuneOp op;
    char why[256];
    assert_true(tune_op_init(&m->ir, node, "sm_90a", 64, &op, why, sizeof why));
    assert_int_equal(op.ncand, which == 0 ? 7 : 5);
    Schedule orig = m->ir.nodes[node].sched;
    for (int i = 0; i < op.ncand; i++) {
      const TuneCandidate *c = &op.cand[i];
      m->ir.nodes[node].sched = orig;
      tune_apply(&m->ir.nodes[node].sched, &op, i);
      Diag d;
      diag_init(&d, &m->src, stderr);
      Plan p;
      assert_true(plan_build(&m->ir, "sm_90a", &m->arena, &d, &p));
      char call[128];
      if (c->kernel == TUNE_SM90)
        snprintf(call, sizeof call, "attn_forward_sm90<64, ATTN_ACT_SILU, %d, %d, false>",
                 c->tile_kv, c->stages);
      else
        snprintf(call, sizeof call, "attn_forward<64, ATTN_ACT_SILU, %d, %d>(out",
                 c->tile_q / c->tile_m, c->tile_m / 16);
      if (!strstr(p.source, call))
        fail_msg("node %d candidate %d: no '%s' in the plan", node, i, call);
      if (which == 0)  // the backward keeps the sm_90a kernels whatever the forward runs
        assert_non_null(strstr(p.source, "attn_backward_sm90<64, ATTN_ACT_SILU"));
      GdpaCase hc;
      GdpaEmitOptions x;
      tune_case(&op, i, &hc, &x);
      Arena arena = {0};
      StrBuf src = {0};
      GdpaEmitted *e = calloc(1, sizeof *e);
      assert_non_null(e);
      assert_true(gdpa_case_emit_with(&hc, &x, op.batch, "t.", &arena, &src, e));
      if (!strstr(src.data, call))
        fail_msg("node %d candidate %d: no '%s' in the harness's case", node, i, call);
      assert_int_equal(e->nforward, 1);
      if (i == op.def) assert_true(e->nlaunches > e->nforward);  // and its backward
      else assert_int_equal(e->nlaunches, 1);                     // the forward alone
      sb_free(&src);
      arena_free(&arena);
      free(e);
    }
    m->ir.nodes[node].sched = orig;
  }
  unload_model(m);
}

// --- the timed batch ----------------------------------------------------------------------

static void test_tune_lengths_are_lognormal_in_the_bucket(void **state) {
  (void)state;
  LoadedModel *m = load_gdpa("sm_90a", 4, 1000, "bf16", "");
  TuneOp op;
  char why[256];
  assert_true(tune_op_init(&m->ir, gdpa_node(&m->ir), "sm_90a", 4096, &op, why, sizeof why));
  GdpaLengths a, b;
  tune_lengths(&op, &a);
  tune_lengths(&op, &b);
  assert_int_equal(a.n, 4096);
  int64_t empty = 0, below_median = 0;
  for (int64_t i = 0; i < a.n; i++) {
    assert_int_equal(a.lq[i], a.lk[i]);  // self: one jagged dim
    assert_true(a.lq[i] >= 0 && a.lq[i] <= 1024);
    assert_int_equal(a.lq[i], b.lq[i]);  // the same batch every time
    empty += a.lq[i] == 0;
    below_median += a.lq[i] > 0 && a.lq[i] <= 128;  // median bucket / 8
  }
  assert_in_range(empty, 40, 130);                  // 2% of 4096 is 82
  assert_in_range(below_median, 1700, 2300);        // about half of the non-empty ones
  gdpa_lengths_free(&a);
  gdpa_lengths_free(&b);
  unload_model(m);
}

// --- gemc tune ----------------------------------------------------------------------------

// cmd_tune on the words, stderr captured into err (run_command.h).
static int run_tune(char *err, size_t cap, int nwords, char **words) {
  return run_command(cmd_tune, CMD_TUNE, true, err, cap, nwords, words);
}

static void test_cmd_tune_without_gpu_fails_cleanly(void **state) {
  (void)state;
  setenv("GEMC_NO_CUDA", "1", 1);
  char err[4096];
  char *words[] = {"models/gem_small.gem", "--reps", "2"};
  assert_int_equal(run_tune(err, sizeof err, 3, words), GEMC_EXIT_USER_ERROR);
  assert_non_null(strstr(err, "gemc: error: gemc tune needs a GPU: "));
  assert_non_null(strstr(err, "GEMC_NO_CUDA"));
  char *none[] = {"--reps", "2"};
  assert_int_equal(run_tune(err, sizeof err, 2, none), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "needs a model FILE"));
  char *reps[] = {"models/gem_small.gem", "--reps", "0"};
  assert_int_equal(run_tune(err, sizeof err, 3, reps), GEMC_EXIT_USAGE);
  assert_null(strstr(err, "needs a GPU"));
  char *arch[] = {"models/gem_small.gem", "--arch", "sm_75"};
  assert_int_equal(run_tune(err, sizeof err, 3, arch), GEMC_EXIT_USAGE);
  assert_non_null(strstr(err, "unknown --arch"));
}

static int setup(void **state) {
  (void)state;
  return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tune_length_bucket_rounds_up_to_a_power_of_two),
      cmocka_unit_test(test_tune_candidates_sm90_dh64),
      cmocka_unit_test(test_tune_candidates_respect_the_shared_memory_limit),
      cmocka_unit_test(test_tune_candidates_agree_with_every_hint),
      cmocka_unit_test(test_tune_candidates_per_kernel_and_target),
      cmocka_unit_test(test_tune_key_names_gpu_nvrtc_op_and_bucket),
      cmocka_unit_test(test_tune_cache_round_trip),
      cmocka_unit_test(test_tune_cache_bad_files_are_reported_not_fatal),
      cmocka_unit_test(test_tune_apply_keeps_the_users_hints),
      cmocka_unit_test(test_tune_apply_gives_the_candidates_kernel),
      cmocka_unit_test(test_tune_lengths_are_lognormal_in_the_bucket),
      cmocka_unit_test(test_cmd_tune_without_gpu_fails_cleanly),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
