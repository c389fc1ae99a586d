// test_gpu_optstate.c: the map between the GPU's optimizer state (Plan.optstate_buffer) and
// the CPU's OptimState that checkpoints on the cuda backend rely on (runtime/gpu/gpu_optstate.h).
// For every model in models/, each trained parameter and table gets the OptimState the
// trainer gives it, and every slot the plan keeps must land in a host array of its length;
// every optimizer the CPU runs with state must have that state on the GPU too. Then the map
// itself, and the refusals of a state that does not match. No GPU needed: plans are built for
// sm_90a on the host. Models are read from the repository root.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_optstate.h"
#include "load_model.h"
#include "optim.h"
#include "lower.h"
#include "plan.h"

typedef struct Model {
  LoadedModel m;
  Plan p;
} Model;

static void model_open(Model *x, const char *path) {
  memset(x, 0, sizeof *x);
  if (!load_model(&x->m, path, NULL, true, true, false)) fail_msg("cannot load %s", path);
  Diag d;
  diag_init(&d, &x->m.src, stderr);
  if (!plan_build(&x->m.ir, "sm_90a", &x->m.arena, &d, &x->p)) fail_msg("no plan for %s", path);
}

// The state runtime/train/train.c gives tensor t (without command-line overrides).
static void state_of(const Ir *ir, int t, OptimState *s) {
  const Tensor *x = &ir->tensors[t];
  int64_t rows = x->fixed[0], dim = x->nfixed > 1 ? x->fixed[1] : 1;
  if (x->kind == TENSOR_TABLE) optim_state_init(s, x->optim, rows, dim);
  else optim_state_init(s, x->optim, rows * dim, 0);
}

static void check_model(const char *path) {
  Model x;
  model_open(&x, path);
  const Ir *ir = &x.m.ir;
  int trained = 0, with_state = 0;
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *tt = &ir->tensors[t];
    if (tt->kind != TENSOR_PARAM && tt->kind != TENSOR_TABLE) {
      for (int slot = 0; slot < GPU_OPTSTATE_SLOTS; slot++)
        assert_int_equal(gpu_optstate_numel(&x.p, t, slot), -1);
      continue;
    }
    trained++;
    OptimState s;
    state_of(ir, t, &s);
    char err[512] = "";
    if (!gpu_optstate_check(&x.p, t, &s, err, sizeof err)) fail_msg("%s: %s", path, err);
    // What the CPU keeps and updates, the GPU keeps too (else a GPU run would lose it).
    for (int slot = 0; slot < GPU_OPTSTATE_SLOTS; slot++) {
      bool host = gpu_optstate_host(&s, slot) != NULL;
      int64_t n = gpu_optstate_numel(&x.p, t, slot);
      if (host && ir_grad_of(ir, t) >= 0 && n != s.n)
        fail_msg("%s: %s keeps %s state slot %d on the CPU (%lld values), the GPU %lld", path,
                 tt->name, optim_name(s.cfg.kind), slot, (long long)s.n, (long long)n);
      with_state += n >= 0;
    }
    optim_state_free(&s);
  }
  assert_true(trained > 0);
  assert_true(with_state > 0);
  loaded_model_free(&x.m);
}

static void test_gpu_optstate_every_model_maps(void **state) {
  (void)state;
  static const char *const models[] = {"models/gem_tiny.gem", "models/gem_small.gem",
                                       "models/hstu.gem", "models/gem_full.gem"};
  for (size_t i = 0; i < sizeof models / sizeof *models; i++) check_model(models[i]);
}

static void test_gpu_optstate_host_arrays(void **state) {
  (void)state;
  Optim adamw = {.kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  Optim adagrad = {.kind = OPTIM_ROWWISE_ADAGRAD, .lr = 0.05, .eps = 1e-8};
  Optim sgd = {.kind = OPTIM_SGD, .lr = 0.1};
  OptimState a, r, g;
  optim_state_init(&a, adamw, 10, 0);
  optim_state_init(&r, adagrad, 7, 4);
  optim_state_init(&g, sgd, 10, 0);
  assert_ptr_equal(gpu_optstate_host(&a, 0), a.m);
  assert_ptr_equal(gpu_optstate_host(&a, 1), a.v);
  assert_ptr_equal(gpu_optstate_host(&r, 0), r.rowsum);
  assert_null(gpu_optstate_host(&r, 1));
  assert_null(gpu_optstate_host(&g, 0));
  assert_null(gpu_optstate_host(&g, 1));
  assert_null(gpu_optstate_host(&a, 2));
  optim_state_free(&a);
  optim_state_free(&r);
  optim_state_free(&g);
}

// A state of the wrong length or the wrong optimizer is refused, naming the tensor.
static void test_gpu_optstate_mismatch_is_refused(void **state) {
  (void)state;
  Model x;
  model_open(&x, "models/gem_tiny.gem");
  const Ir *ir = &x.m.ir;
  int param = -1, table = -1;
  for (int t = 0; t < ir->ntensors; t++) {
    if (param < 0 && gpu_optstate_numel(&x.p, t, 1) > 0) param = t;  // AdamW m and v
    if (table < 0 && ir->tensors[t].kind == TENSOR_TABLE && gpu_optstate_numel(&x.p, t, 0) > 0)
      table = t;  // a rowsum
  }
  assert_true(param >= 0);
  assert_true(table >= 0);
  assert_int_equal(gpu_optstate_numel(&x.p, table, 1), -1);
  assert_int_equal(gpu_optstate_numel(&x.p, table, 0), ir->tensors[table].fixed[0]);
  assert_int_equal(gpu_optstate_numel(&x.p, -1, 0), -1);
  assert_int_equal(gpu_optstate_numel(&x.p, ir->ntensors, 0), -1);
  assert_int_equal(gpu_optstate_numel(&x.p, param, 2), -1);

  OptimState s;
  char err[512];
  state_of(ir, param, &s);
  int64_t n = s.n;
  optim_state_free(&s);
  Optim sgd = {.kind = OPTIM_SGD, .lr = 0.1};
  optim_state_init(&s, sgd, n, 0);
  assert_false(gpu_optstate_check(&x.p, param, &s, err, sizeof err));
  assert_non_null(strstr(err, ir->tensors[param].name));
  assert_non_null(strstr(err, "AdamW m"));
  optim_state_free(&s);

  Optim adamw = {.kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  optim_state_init(&s, adamw, n + 1, 0);
  assert_false(gpu_optstate_check(&x.p, param, &s, err, sizeof err));
  assert_non_null(strstr(err, ir->tensors[param].name));
  optim_state_free(&s);

  state_of(ir, table, &s);
  assert_true(gpu_optstate_check(&x.p, table, &s, err, sizeof err));
  optim_state_free(&s);
  optim_state_init(&s, sgd, ir->tensors[table].fixed[0], 32);
  assert_false(gpu_optstate_check(&x.p, table, &s, err, sizeof err));
  assert_non_null(strstr(err, "rowsum"));
  optim_state_free(&s);
  loaded_model_free(&x.m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_optstate_every_model_maps),
      cmocka_unit_test(test_gpu_optstate_host_arrays),
      cmocka_unit_test(test_gpu_optstate_mismatch_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
