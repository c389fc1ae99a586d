// test_parallel.c: the pieces of distributed training that need no second process: the
// token-balanced batch split, a ZeRO shard's optimizer step (optim_step_dense_part), the
// collectives of a world of one (COMM_SELF), ZeRO-3's sync in a world of one, the option
// names. tests/dist/run.sh runs real worlds of 2 and 4 ranks.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "autodiff.h"
#include "batch_split.h"
#include "comm.h"
#include "cpu_exec.h"
#include "dense_sync.h"
#include "load_text.h"
#include "optim.h"
#include "table_sync.h"

// A batch of one jagged dim with the given lengths (only what batch_split reads).
typedef struct Lengths {
  Batch b;
  int64_t *offsets[1];
  int64_t off[64];
} Lengths;

static void make_lengths(Lengths *l, const int64_t *len, int64_t B) {
  memset(l, 0, sizeof *l);
  l->off[0] = 0;
  for (int64_t i = 0; i < B; i++) l->off[i + 1] = l->off[i] + len[i];
  l->offsets[0] = l->off;
  l->b.B = B;
  l->b.njagged = 1;
  l->b.offsets = l->offsets;
}

static int64_t work(const Batch *b, int64_t from, int64_t to) {
  int64_t w = 0;
  for (int64_t i = from; i < to; i++) w += batch_example_work(b, i);
  return w;
}

// Contiguous shares that cover the batch, at least one example each, and no share more than
// one example's work past an even split.
static void check_split(const Batch *b, int world) {
  int64_t first[17];
  batch_split(b, world, first);
  assert_int_equal(first[0], 0);
  assert_int_equal(first[world], b->B);
  int64_t total = work(b, 0, b->B), most = 0;
  for (int64_t i = 0; i < b->B; i++)
    if (batch_example_work(b, i) > most) most = batch_example_work(b, i);
  for (int r = 0; r < world; r++) {
    assert_true(first[r + 1] > first[r]);
    int64_t w = work(b, first[r], first[r + 1]);
    if (first[r + 1] - first[r] > 1) assert_true(w <= total / world + most);
  }
}

static void test_split_balances_tokens(void **state) {
  (void)state;
  // Two long histories at the front: an even split by examples would give rank 0 nearly all
  // the work.
  const int64_t len[12] = {90, 80, 2, 3, 1, 4, 2, 5, 3, 1, 2, 3};
  Lengths l;
  make_lengths(&l, len, 12);
  int64_t first[3];
  batch_split(&l.b, 2, first);
  assert_int_equal(first[1], 1);  // 91 of 208 units of work for rank 0, 117 for rank 1
  for (int world = 1; world <= 12; world++) check_split(&l.b, world);
  const int64_t even[8] = {5, 5, 5, 5, 5, 5, 5, 5};
  make_lengths(&l, even, 8);
  int64_t four[5];
  batch_split(&l.b, 4, four);
  for (int r = 0; r <= 4; r++) assert_int_equal(four[r], 2 * r);
}

static void test_split_one_example_each(void **state) {
  (void)state;
  const int64_t len[4] = {50, 0, 0, 50};
  Lengths l;
  make_lengths(&l, len, 4);
  int64_t first[5];
  batch_split(&l.b, 4, first);
  for (int r = 0; r <= 4; r++) assert_int_equal(first[r], r);
}

// A ZeRO shard's update of elements [from, from + n) equals those elements of the whole
// update, bit for bit, from a state that holds only that part's moments; the step advances
// with n = 0 too.
static void test_optim_part_equals_whole(void **state) {
  (void)state;
  enum { N = 37, CUT = 15, STEPS = 5 };
  Optim cfg = {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
               .weight_decay = 0.01};
  OptimState whole, lo, hi, none;
  optim_state_init(&whole, cfg, N, 0);
  optim_state_init_part(&lo, cfg, 0, CUT);
  optim_state_init_part(&hi, cfg, CUT, N - CUT);
  optim_state_init_part(&none, cfg, 0, 0);
  assert_int_equal(hi.n, N - CUT);
  assert_int_equal(hi.base, CUT);
  float w[N], wp[N], g[N];
  for (int i = 0; i < N; i++) w[i] = wp[i] = 0.1f * (float)(i - 18);
  for (int s = 0; s < STEPS; s++) {
    for (int i = 0; i < N; i++) g[i] = 0.01f * (float)((i * 7 + s * 3) % 11) - 0.05f;
    optim_step_dense(&whole, w, g, N);
    optim_step_dense_part(&lo, wp, g, 0, CUT);
    optim_step_dense_part(&hi, wp + CUT, g + CUT, CUT, N - CUT);
    optim_step_dense_part(&none, wp + N, g, N, 0);
  }
  assert_memory_equal(w, wp, sizeof w);
  assert_int_equal(none.step, STEPS);
  assert_memory_equal(whole.m, lo.m, CUT * sizeof(float));
  assert_memory_equal(whole.m + CUT, hi.m, (N - CUT) * sizeof(float));
  assert_memory_equal(whole.v + CUT, hi.v, (N - CUT) * sizeof(float));
  optim_state_free(&whole);
  optim_state_free(&lo);
  optim_state_free(&hi);
  optim_state_free(&none);
}

// A world of one: every collective is a copy (or nothing), in place or not.
static void test_comm_self(void **state) {
  (void)state;
  char err[256] = "";
  assert_null(comm_open(COMM_SELF, 0, 2, 10, NULL, err, sizeof err));
  assert_non_null(strstr(err, "a world of 2 ranks needs a communication backend"));
  Comm *c = comm_open(COMM_SELF, 0, 1, 10, NULL, err, sizeof err);
  assert_non_null(c);
  assert_int_equal(comm_world(c), 1);
  assert_string_equal(comm_backend_name(c), "self");
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  CommCall ar = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = a, .recv = b, .count = 4};
  assert_true(comm_run(c, &ar, err, sizeof err));
  assert_memory_equal(a, b, sizeof a);
  ar.recv = a;  // in place
  assert_true(comm_run(c, &ar, err, sizeof err));
  int64_t ids[3] = {7, 8, 9}, got[3] = {0}, three = 3;
  CommCall a2a = {.kind = COMM_ALLTOALL, .dtype = COMM_I64, .send = ids, .recv = got,
                  .send_counts = &three, .recv_counts = &three};
  assert_true(comm_run(c, &a2a, err, sizeof err));
  assert_memory_equal(ids, got, sizeof ids);
  double d = 2.5, e = 0;
  int64_t one = 1;
  CommCall ag = {.kind = COMM_ALLGATHER, .dtype = COMM_F64, .send = &d, .recv = &e,
                 .counts = &one};
  int h = comm_start(c, &ag, err, sizeof err);
  assert_true(h >= 0);
  comm_progress(c);
  assert_true(comm_wait(c, h, err, sizeof err));
  assert_true(e == 2.5);
  assert_false(comm_wait(c, h, err, sizeof err));  // waited for already
  assert_non_null(strstr(err, "not in flight"));
  comm_close(c);
}

// ZeRO-3's sync in a world of one (the rank owns every part): the parts start as the
// parameters' initial values, a gather gives the whole parameter back, and a backward pass
// packs each gradient into its bucket, counting its non-finite values for the divergence
// guard, then releases the executor's buffer.
typedef struct Zero3 {
  DenseSync *d;
  int *index;  // tensor -> place in `params`
  char err[256];
} Zero3;

static void zero3_fill_test(void *ctx, int t, float *whole) {
  Zero3 *z = ctx;
  assert_true(dense_sync_gather(z->d, z->index[t], whole, z->err, sizeof z->err));
}

static void zero3_done(void *ctx, int node) { dense_sync_node_done(((Zero3 *)ctx)->d, node); }

static void test_zero3_world_of_one(void **state) {
  (void)state;
  Loaded *m = load("z3.gem",
                   "model z3 {\n  batch 4; dim 8;\n  dense cnt : f32[3];\n  label click;\n"
                   "  y = mlp(linear(cnt, 8), [8, 1], act = relu);\n  loss bce(y, click);\n}\n");
  Diag d;
  diag_init(&d, &m->src, stderr);
  assert_true(autodiff(&m->ir, &d));
  char err[256];
  Comm *c = comm_open(COMM_SELF, 0, 1, 10, NULL, err, sizeof err);
  assert_non_null(c);
  int params[64], np = 0;
  bool gathered[256] = {0};
  Zero3 z = {.index = calloc((size_t)m->ir.ntensors + 1, sizeof(int))};
  assert_true(m->ir.ntensors <= 256);
  for (int t = 0; t < m->ir.ntensors; t++)
    if (m->ir.tensors[t].kind == TENSOR_PARAM && ir_grad_of(&m->ir, t) >= 0) {
      z.index[t] = np;
      gathered[t] = true;
      params[np++] = t;
    }
  assert_true(np >= 4);
  z.d = dense_sync_new(c, &m->ir, DENSE_ZERO3, 64, params, np);  // small buckets
  assert_true(dense_sync_buckets(z.d) >= 2);
  dense_sync_count_bad(z.d, true);
  CpuExec *whole = cpu_exec_new(&m->ir, EXEC_F32);
  CpuExec *x = cpu_exec_new_parts(&m->ir, EXEC_F32, NULL, gathered);
  cpu_exec_init_params(whole, 4);
  for (int i = 0; i < np; i++) {
    int64_t from, n;
    float *part = dense_sync_shard(z.d, i, &from, &n);
    assert_int_equal(from, 0);  // one rank: all of it
    assert_int_equal(n, cpu_exec_numel(whole, params[i]));
    cpu_init_param_part(&m->ir, params[i], 4, from, n, part);
    float *back = calloc((size_t)n + 1, sizeof *back);
    assert_true(dense_sync_gather(z.d, i, back, err, sizeof err));
    assert_memory_equal(back, cpu_exec_data(whole, params[i]), (size_t)n * sizeof *back);
    free(back);
  }
  cpu_exec_set_param_fill(x, zero3_fill_test, &z);
  cpu_exec_set_backward_hook(x, zero3_done, &z);
  Batch b;
  batch_alloc(&b, &m->s, 4);
  for (int k = 0; k < 12; k++) b.values[schema_find(&m->s, "cnt")][k] = 0.25f * (float)(k % 5);
  for (int k = 0; k < 4; k++) b.values[schema_find(&m->s, "click")][k] = (float)(k & 1);
  // A NaN input makes every gradient downstream of the first linear NaN.
  b.values[schema_find(&m->s, "cnt")][5] = NAN;
  assert_true(cpu_exec_set_batch(x, &b, err, sizeof err));
  assert_true(cpu_exec_set_batch(whole, &b, err, sizeof err));
  cpu_exec_forward(whole);
  cpu_exec_backward(whole);
  dense_sync_begin(z.d, x, 1.0);
  cpu_exec_forward(x);
  int64_t nan = 0, inf = 0;
  assert_false(dense_sync_bad_grad(z.d, 0, &nan, &inf));  // nothing packed yet
  cpu_exec_backward(x);
  assert_true(dense_sync_finish(z.d, err, sizeof err));
  for (int i = 0; i < np; i++) {
    // Packed during the backward (its bucket started), then released.
    assert_null(cpu_exec_grad(x, params[i], NULL, NULL));
    assert_true(dense_sync_bad_grad(z.d, i, &nan, &inf));
    int64_t want_nan = 0, want_inf = 0, n = cpu_exec_numel(whole, params[i]);
    const float *g = cpu_exec_grad(whole, params[i], NULL, NULL);
    for (int64_t e = 0; e < n; e++)
      if (!isfinite(g[e])) isnan(g[e]) ? want_nan++ : want_inf++;
    assert_int_equal(nan, want_nan);
    assert_int_equal(inf, want_inf);
  }
  dense_sync_begin(z.d, x, 1.0);  // a new step forgets them
  assert_false(dense_sync_bad_grad(z.d, 0, &nan, &inf));
  int64_t total_nan = 0;
  for (int i = 0; i < np; i++) {
    const float *g = cpu_exec_grad(whole, params[i], NULL, NULL);
    for (int64_t e = 0; e < cpu_exec_numel(whole, params[i]); e++) total_nan += isnan(g[e]);
  }
  assert_true(total_nan > 0);  // the case has something to count
  batch_free(&b);
  cpu_exec_free(x);
  cpu_exec_free(whole);
  dense_sync_free(z.d);
  free(z.index);
  comm_close(c);
  unload(m);
}

static void test_option_names(void **state) {
  (void)state;
  DenseMode m;
  assert_true(dense_mode_parse("zero2", &m) && m == DENSE_ZERO2);
  assert_true(dense_mode_parse("dp", &m) && m == DENSE_DATA_PARALLEL);
  assert_true(dense_mode_parse("zero3", &m) && m == DENSE_ZERO3);
  assert_false(dense_mode_parse("zero4", &m));
  assert_string_equal(dense_mode_name(DENSE_ZERO3), "zero3");
  assert_string_equal(dense_mode_name(DENSE_ZERO1), "zero1");
  TablePlacement p;
  assert_true(table_placement_parse("row", &p) && p == PLACE_ROW);
  assert_true(table_placement_parse("auto", &p) && p == PLACE_AUTO);
  assert_false(table_placement_parse("column", &p));
  assert_string_equal(table_placement_name(PLACE_TABLE), "table");
  CommCtaPolicy c;
  assert_true(comm_cta_policy_parse("zero", &c) && c == COMM_CTA_ZERO);
  assert_true(comm_cta_policy_parse("default", &c) && c == COMM_CTA_DEFAULT);
  assert_false(comm_cta_policy_parse("none", &c));
  assert_string_equal(comm_cta_policy_name(COMM_CTA_EFFICIENCY), "efficiency");
  CommInit zeroed = {0};
  assert_int_equal(zeroed.nccl_cta_policy, COMM_CTA_DEFAULT);  // unset means NCCL's choice
}

// The GPU ranks' calls (device buffers, PreMulSum scales, grouped buffers) are NCCL's alone:
// a host backend refuses them rather than read device pointers or drop the scale.
static void test_device_calls_need_nccl(void **state) {
  (void)state;
  char err[256];
  Comm *c = comm_open(COMM_SELF, 0, 1, 10, NULL, err, sizeof err);
  assert_non_null(c);
  float v[2] = {1, 2};
  void *bufs[1] = {v};
  int64_t counts[1] = {2};
  CommCall scaled = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = v, .recv = v,
                     .count = 2, .scale = 0.5f, .what = "scaled"};
  assert_int_equal(comm_start(c, &scaled, err, sizeof err), -1);
  assert_non_null(strstr(err, "needs NCCL"));
  CommCall grouped = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .nbufs = 1, .bufs = bufs,
                      .buf_counts = counts, .device = true, .what = "grouped"};
  assert_int_equal(comm_start(c, &grouped, err, sizeof err), -1);
  CommCall device = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = v, .recv = v,
                     .count = 2, .device = true, .what = "device"};
  assert_int_equal(comm_start(c, &device, err, sizeof err), -1);
  assert_non_null(strstr(err, "device buffers (device) on the self backend"));
  CommCall host = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = v, .recv = v, .count = 2,
                   .what = "host"};
  assert_true(comm_run(c, &host, err, sizeof err));
  assert_true(v[0] == 1 && v[1] == 2);
  comm_close(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_balances_tokens),
      cmocka_unit_test(test_split_one_example_each),
      cmocka_unit_test(test_optim_part_equals_whole),
      cmocka_unit_test(test_comm_self),
      cmocka_unit_test(test_zero3_world_of_one),
      cmocka_unit_test(test_option_names),
      cmocka_unit_test(test_device_calls_need_nccl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
