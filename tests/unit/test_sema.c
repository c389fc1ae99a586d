// test_sema.c: semantic analysis, end to end: source text through parse_model and
// sema_lower, then ir_verify and ir_print. One table pins every diagnostic rule (the exact
// message at its exact line:col, and the note that goes with it); the tests after it check
// the lowering itself: the docs/language.md example, each attention shape, precision defaults
// and overrides, value and parameter names, rebinding, and speed on a 10,000-statement model.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "sema.h"

// --- running the front end --------------------------------------------------------------

// One compilation: the source, what sema made of it, and every diagnostic it printed.
typedef struct Run {
  Arena arena;
  SourceFile src;
  Diag d;
  Model *model;
  Ir ir;
  char *diags;  // the diagnostics, as printed
  size_t diags_len;
  bool ok;      // sema_lower's result
} Run;

static Run R;

// Parses `text` (which must parse cleanly) into R.model, capturing diagnostics.
static FILE *parse_text(const char *text) {
  memset(&R, 0, sizeof R);
  source_from_memory(&R.src, "test.gem", text, strlen(text));
  FILE *f = open_memstream(&R.diags, &R.diags_len);
  assert_non_null(f);
  diag_init(&R.d, &R.src, f);
  R.model = parse_model(&R.src, &R.arena, &R.d);
  fflush(f);
  if (!R.model || R.d.errors > 0) {
    print_message("the test source does not parse:\n%s\n%s", text, R.diags);
    fail();
  }
  return f;
}

static void lower_parsed(FILE *f, const char *arch) {
  ir_init(&R.ir, &R.arena);
  R.ok = sema_lower(R.model, arch, &R.d, &R.ir);
  fclose(f);
}

static void compile_arch(const char *text, const char *arch) {
  lower_parsed(parse_text(text), arch);
}
static void compile(const char *text) { compile_arch(text, NULL); }

static void release(void) {
  free(R.diags);
  arena_free(&R.arena);
  memset(&R, 0, sizeof R);
}

static int count_of(const char *haystack, const char *needle) {
  int n = 0;
  for (const char *p = haystack; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

static void assert_printed(const char *want) {
  if (!strstr(R.diags, want)) {
    print_message("expected the diagnostics to contain:\n%s\nbut they were:\n%s", want, R.diags);
    fail();
  }
}

// Sema accepted the model without a diagnostic, and the IR verifies and prints.
static void assert_clean(void) {
  if (!R.ok || R.d.errors || R.d.warnings) {
    print_message("expected a clean compile, got:\n%s", R.diags);
    fail();
  }
  char err[512];
  if (!ir_verify(&R.ir, err, sizeof err)) {
    print_message("ir_verify: %s\n", err);
    fail();
  }
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ir_print(f, &R.ir);
  fclose(f);
  assert_true(len > 0);
  free(text);
}

static const Tensor *tensor(const char *name) {
  int i = ir_find_tensor(&R.ir, name);
  if (i < 0) {
    print_message("no tensor named '%s'\n", name);
    fail();
  }
  return &R.ir.tensors[i];
}

static const Node *producer(const char *name) {
  const Tensor *t = tensor(name);
  assert_true(t->producer >= 0);
  return &R.ir.nodes[t->producer];
}

static void assert_shape(const char *name, Layout layout, const char *jag, int64_t set_k,
                         int64_t width, DType dtype) {
  const Tensor *t = tensor(name);
  assert_int_equal(t->layout, layout);
  if (jag) assert_string_equal(R.ir.jagged[t->jag].name, jag);
  assert_int_equal(t->set_k, set_k);
  assert_int_equal(t->width, width);
  assert_int_equal(t->dtype, dtype);
}

static void assert_fixed(const char *name, TensorKind kind, int64_t d0, int64_t d1, DType dt) {
  const Tensor *t = tensor(name);
  assert_int_equal(t->kind, kind);
  assert_int_equal(t->layout, LAYOUT_FIXED);
  assert_int_equal(t->fixed[0], d0);
  if (d1) assert_int_equal(t->fixed[1], d1);
  assert_int_equal(t->nfixed, d1 ? 2 : 1);
  assert_int_equal(t->dtype, dt);
}

static int count_nodes(OpKind op) {
  int n = 0;
  for (int i = 0; i < R.ir.nnodes; i++) n += R.ir.nodes[i].op == op;
  return n;
}

// --- every diagnostic rule --------------------------------------------------------------
// Each test compiles one source and expects one diagnostic, exactly, at its line:col, and
// the note that goes with it (note_line 0: none). Sources that start with PRELUDE count
// their own lines from 12.

#define PRELUDE                    \
  "model m {\n"                    \
  "  batch 8;\n"                   \
  "  dim 16;\n"                    \
  "  seq hist : id max 10;\n"      \
  "  seq acts : id like hist;\n"   \
  "  sparse ad : id;\n"            \
  "  multihot tags : id max 5;\n"  \
  "  dense cnt : f32[4];\n"        \
  "  label click;\n"               \
  "  table items : rows 100;\n"    \
  "  table tagt : rows 50;\n"

static const char *level_text(DiagLevel level) {
  return level == DIAG_ERROR ? "error" : level == DIAG_WARNING ? "warning" : "note";
}

static void check_case(DiagLevel level, const char *src, int line, int col, const char *msg,
                       int note_line, int note_col, const char *note) {
  compile(src);
  char want[2048];
  snprintf(want, sizeof want, "test.gem:%d:%d: %s: %s\n", line, col, level_text(level), msg);
  assert_printed(want);
  if (note_line) {
    snprintf(want, sizeof want, "test.gem:%d:%d: note: %s\n", note_line, note_col, note);
    assert_printed(want);
  }
  if (level == DIAG_ERROR) {
    assert_false(R.ok);
  } else {
    assert_true(R.ok);
    assert_int_equal(R.d.errors, 0);
  }
  release();
}

static void test_sema_unknown_name_with_suggestion(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  y = linear(histt, 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      14, 14, "unknown name 'histt'; expected an input, a table or a bound name",
      14, 14, "did you mean 'hist'?");
}

static void test_sema_unknown_name(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(qqq, 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "unknown name 'qqq'; expected an input, a table or a bound name",
      0, 0, "");
}

static void test_sema_used_before_bound(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(z, 1);\n"
      "  z = linear(a, 4);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "'z' is used before it is bound; expected a binding above",
      14, 3, "'z' is first bound here");
}

static void test_sema_unknown_op(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = lienar(a, 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 7, "unknown op 'lienar'; expected embed, linear, mlp, rmsnorm, layernorm, silu, "
      "gelu, gelu_taylor, relu, sigmoid, concat, stack, flatten, dot_interact, gdpa, "
      "pma or bce",
      13, 7, "did you mean 'linear'?");
}

static void test_sema_unknown_named_argument(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1, bais = true);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 20, "unknown argument 'bais' to linear; expected x, n or bias",
      13, 20, "did you mean 'bias'?");
}

static void test_sema_duplicate_named_argument(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1, bias = true, bias = false);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 33, "argument 'bias' of linear is given twice",
      13, 20, "first given here");
}

static void test_sema_missing_argument(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 7, "missing argument 'n' in call to linear; expected linear(x, n, bias = true)",
      0, 0, "");
}

static void test_sema_too_many_positional(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1, 2);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 20, "linear takes 2 positional arguments (x, n), found 3; expected linear(x, n, "
      "bias = true)",
      0, 0, "");
}

static void test_sema_wrong_argument_kind(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, a);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 17, "argument 'n' of linear expects an integer, found the name 'a'",
      0, 0, "");
}

static void test_sema_wrong_argument_kind_bool(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1, bias = 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 27, "argument 'bias' of linear expects true or false, found the integer 1",
      0, 0, "");
}

static void test_sema_redefinition_input(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  sparse ad : id;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 10, "redefinition of 'ad'; it is already declared as an input",
      6, 10, "previous definition is here");
}

static void test_sema_redefinition_table(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table items : rows 5;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 9, "redefinition of 'items'; it is already declared as a table",
      10, 9, "previous definition is here");
}

static void test_sema_redefinition_label(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  label click;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 9, "redefinition of 'click'; it is already declared as a label",
      9, 9, "previous definition is here");
}

static void test_sema_rebind_input(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  hist = linear(a, 4);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 3, "cannot rebind input 'hist'; inputs, tables and labels are bound once, expected "
      "a new name",
      4, 7, "'hist' is declared here");
}

static void test_sema_rebind_table(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  items = linear(a, 4);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 3, "cannot rebind table 'items'; inputs, tables and labels are bound once, "
      "expected a new name",
      10, 9, "'items' is declared here");
}

static void test_sema_rebind_label(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  click = linear(a, 4);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 3, "cannot rebind label 'click'; inputs, tables and labels are bound once, "
      "expected a new name",
      9, 9, "'click' is declared here");
}

static void test_sema_duplicate_setting(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  batch 4;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 3, "duplicate 'batch' setting; each setting appears at most once",
      2, 3, "previous 'batch' setting is here");
}

static void test_sema_missing_batch(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  dim 16;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      1, 7, "missing batch: expected a 'batch N;' setting in model 'm'",
      0, 0, "");
}

static void test_sema_missing_dim(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      1, 7, "missing dim: expected a 'dim D;' setting in model 'm'",
      0, 0, "");
}

static void test_sema_batch_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 0;\n"
      "  dim 16;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      2, 9, "batch must be positive, found 0",
      0, 0, "");
}

static void test_sema_dim_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 0;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      3, 7, "dim must be positive, found 0",
      0, 0, "");
}

static void test_sema_huge_batch(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 9_000_000_000;\n"
      "  dim 16;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      2, 9, "batch 9000000000 is too large; expected at most 2147483647",
      0, 0, "");
}

static void test_sema_unknown_target(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  target sm_80;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 10, "unknown target 'sm_80'; expected sm_90a or sm_100a",
      0, 0, "");
}

static void test_sema_unknown_precision_setting(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  precision fp4;\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 13, "unknown precision 'fp4'; expected fp32, bf16, fp16, fp8 or mxfp8",
      0, 0, "");
}

static void test_sema_model_optim_for_tables_only(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  optim rowwise_adagrad(lr = 0.1);\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 9, "optimizer rowwise_adagrad is only for tables; expected adamw or sgd for the "
      "dense parameters",
      0, 0, "");
}

static void test_sema_model_optim_unknown(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  optim adam(lr = 0.1);\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 9, "unknown optimizer 'adam'; expected adamw or sgd",
      4, 9, "did you mean 'adamw'?");
}

static void test_sema_optim_unknown_argument(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  optim adamw(lr = 0.1, beta = 0.9);\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 25, "unknown argument 'beta' to adamw; expected lr, beta1, beta2, eps or "
      "weight_decay",
      4, 25, "did you mean 'beta1'?");
}

static void test_sema_optim_bad_beta(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  optim adamw(beta2 = 1.5);\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 23, "argument 'beta2' of adamw must be a number in [0, 1), found 1.5",
      0, 0, "");
}

static void test_sema_optim_positional_argument(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      "model m {\n"
      "  batch 8;\n"
      "  dim 16;\n"
      "  optim sgd(0.1);\n"
      "  sparse ad : id;\n"
      "  label click;\n"
      "  table items : rows 10;\n"
      "  y = linear(embed(items, ad), 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      4, 13, "optimizer arguments are named (lr = ...); found the number 0.1",
      0, 0, "");
}

static void test_sema_like_non_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  seq s2 : id like ad;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 20, "'like' needs a seq input; 'ad' is a sparse input",
      0, 0, "");
}

static void test_sema_like_unknown(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  seq s2 : id like hst;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 20, "unknown sequence 'hst' in 'like'; expected a seq input",
      12, 20, "did you mean 'hist'?");
}

static void test_sema_like_declared_below(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  seq s2 : id like s3;\n"
      "  seq s3 : id max 4;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 20, "seq 's3' is declared below 's2'; 'like' expects a seq declared above",
      13, 7, "'s3' is declared here");
}

static void test_sema_seq_max_and_like(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  seq s2 : id max 4 like hist;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 26, "seq 's2' has both 'max' and 'like'; expected one of them",
      0, 0, "");
}

static void test_sema_seq_unknown_elem(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  seq v : f64 like hist;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 11, "unknown element type 'f64' in seq 'v'; expected id or f32",
      0, 0, "");
}

static void test_sema_dense_unknown_elem(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  dense d2 : f16[4];\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 14, "unknown element type 'f16' in dense 'd2'; expected f32",
      0, 0, "");
}

static void test_sema_table_unknown_attribute(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, rowz 3;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 22, "unknown table attribute 'rowz'; expected rows, dim, precision, optim or shard",
      12, 22, "did you mean 'rows'?");
}

static void test_sema_table_duplicate_attribute(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, rows 6;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 22, "duplicate table attribute 'rows' in table 't2'",
      12, 14, "previous 'rows' is here");
}

static void test_sema_table_missing_rows(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : dim 16;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 9, "table 't2' needs 'rows N'; found no rows attribute",
      0, 0, "");
}

static void test_sema_table_dim_mismatch(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table acts2 : rows 5, dim 128;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 29, "table 'acts2' has dim 128, but the model dim is 16",
      0, 0, "");
}

static void test_sema_table_storage_mxfp8(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, precision mxfp8;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 32, "storage precision mxfp8 is not legal for table 't2'; expected fp32, bf16, fp16 "
      "or fp8",
      0, 0, "");
}

static void test_sema_table_unknown_precision(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, precision bf61;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 32, "unknown precision 'bf61'; expected fp32, bf16, fp16, fp8 or mxfp8",
      12, 32, "did you mean 'bf16'?");
}

static void test_sema_table_optim_adamw(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, optim adamw(lr = 0.1);\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 28, "optimizer adamw is not legal for tables; expected rowwise_adagrad or sgd",
      0, 0, "");
}

static void test_sema_table_optim_unknown(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, optim adagrad;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 28, "unknown optimizer 'adagrad'; expected rowwise_adagrad or sgd",
      0, 0, "");
}

static void test_sema_table_optim_unknown_argument(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, optim sgd(lr = 0.1, eps = 1);\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 42, "unknown argument 'eps' to sgd; expected lr",
      0, 0, "");
}

static void test_sema_table_optim_zero_lr(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows 5, optim sgd(lr = 0);\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 37, "argument 'lr' of sgd must be a positive number, found 0",
      0, 0, "");
}

static void test_sema_table_rows_kind(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  table t2 : rows many;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 19, "table attribute 'rows' expects an integer, found the name 'many'",
      0, 0, "");
}

static void test_sema_precision_on_non_call(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = a @bf16;\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 10, "'@bf16' must follow an op call; found the name 'a'",
      0, 0, "");
}

static void test_sema_precision_illegal_on_op(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = rmsnorm(a) @mxfp8;\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 19, "precision mxfp8 is not legal on rmsnorm: it has no matmul; expected fp32, bf16 "
      "or fp16",
      0, 0, "");
}

static void test_sema_precision_fp8_on_embed(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad) @fp8;\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 25, "precision fp8 is not legal on embed: it has no matmul; expected fp32, bf16 or "
      "fp16",
      0, 0, "");
}

static void test_sema_unknown_annotation(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @bf61;\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 21, "unknown annotation '@bf61'; expected a precision (fp32, bf16, fp16, fp8 or "
      "mxfp8) or @schedule(...)",
      13, 21, "did you mean 'bf16'?");
}

static void test_sema_duplicate_precision(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @bf16 @fp16;\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 27, "duplicate precision '@fp16'; the op already has '@bf16'",
      13, 21, "first precision is here");
}

static void test_sema_precision_on_bce(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click) @bf16;\n"
      "}\n",
      13, 34, "precision bf16 is not legal on bce: a loss is always computed in fp32; "
      "expected fp32",
      0, 0, "");
}

static void test_sema_mxfp8_note_on_sm90a(void **state) {
  (void)state;
  check_case(DIAG_NOTE,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = linear(a, 16) @mxfp8;\n"
      "  y = linear(b, 1) @mxfp8;\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 22, "mxfp8 on sm_90a is emulated: operands are quantized to E4M3 with E8M0 block "
      "scales, then multiplied in bf16 or fp32 with the same numerics",
      0, 0, "");
}

static void test_sema_schedule_unknown_hint(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @schedule(tile_x = 64);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 30, "unknown schedule hint 'tile_x'; expected tile_q, tile_kv, tile_m, tile_n, "
      "tile_k, stages, zigzag, gelu, deterministic or recompute",
      13, 30, "did you mean 'tile_q'?");
}

static void test_sema_schedule_tile_not_power_of_two(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @schedule(tile_m = 48);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 39, "schedule hint 'tile_m' must be a power of two in 16..256, found 48",
      0, 0, "");
}

static void test_sema_schedule_tile_too_big(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @schedule(tile_n = 512);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 39, "schedule hint 'tile_n' must be a power of two in 16..256, found 512",
      0, 0, "");
}

static void test_sema_schedule_stages_range(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @schedule(stages = 9);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 39, "schedule hint 'stages' must be in 1..8, found 9",
      0, 0, "");
}

static void test_sema_schedule_zigzag_value(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  g = gdpa(h) @schedule(zigzag = maybe);\n"
      "  p = pma(g, seeds = 1);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      13, 34, "schedule hint 'zigzag' expects on or off, found the name 'maybe'",
      0, 0, "");
}

static void test_sema_schedule_gelu_value(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, [4, 1], act = gelu) @schedule(gelu = fast);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 51, "schedule hint 'gelu' expects exact or taylor, found the name 'fast'",
      0, 0, "");
}

static void test_sema_schedule_hint_wrong_op(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @schedule(tile_q = 64);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 30, "schedule hint 'tile_q' does not apply to linear; it applies to gdpa and pma",
      0, 0, "");
}

static void test_sema_schedule_hint_on_norm(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = rmsnorm(a) @schedule(stages = 2);\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 28, "schedule hint 'stages' does not apply to rmsnorm; it applies to linear, mlp, "
      "dot_interact, gdpa and pma",
      0, 0, "");
}

static void test_sema_schedule_gelu_needs_gelu(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, [4, 1]) @schedule(gelu = taylor);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 32, "schedule hint 'gelu' needs an op whose activation is gelu; mlp has act = relu",
      0, 0, "");
}

static void test_sema_schedule_duplicate_hint(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1) @schedule(stages = 2, stages = 3);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 42, "schedule hint 'stages' is given twice",
      13, 30, "first given here");
}

static void test_sema_unknown_activation(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, act = swish);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 21, "unknown activation 'swish'; expected softmax, silu, gelu, gelu_taylor, relu or "
      "sigmoid",
      0, 0, "");
}

static void test_sema_mlp_softmax(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, [4, 1], act = softmax);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 28, "activation 'softmax' is not pointwise; mlp expects silu, gelu, gelu_taylor, "
      "relu, sigmoid or none",
      0, 0, "");
}

static void test_sema_activation_kind(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, act = 3);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 21, "argument 'act' of gdpa expects an activation name, found the integer 3",
      0, 0, "");
}

static void test_sema_heads_must_divide(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, heads = 3);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 23, "heads = 3 does not divide the width of q, jagged[B, *hist, 16]; expected a "
      "divisor of 16",
      0, 0, "");
}

static void test_sema_heads_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, heads = 0);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 23, "argument 'heads' of gdpa must be a positive integer, found 0",
      0, 0, "");
}

static void test_sema_window_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, window = 0);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 24, "argument 'window' of gdpa must be a positive integer, found 0",
      0, 0, "");
}

static void test_sema_window_needs_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  u = gdpa(q = a, kv = h, window = 4);\n"
      "  loss bce(linear(u, 1), click);\n"
      "}\n",
      14, 36, "window needs a sequence: q is dense[B, 16], expected jagged",
      0, 0, "");
}

static void test_sema_window_needs_one_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(q = h, kv = stack(a, a), window = 4);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 46, "window needs q and kv from one sequence; q is jagged[B, *hist, 16], kv is "
      "set[B, 2, 16]",
      0, 0, "");
}

static void test_sema_causal_needs_one_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(q = h, kv = stack(a, a), mask = causal);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 44, "causal mask needs q and kv from one sequence; q is jagged[B, *hist, 16], kv is "
      "set[B, 2, 16]",
      0, 0, "");
}

static void test_sema_unknown_mask(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, mask = future);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 22, "unknown mask 'future'; expected none or causal",
      0, 0, "");
}

static void test_sema_gdpa_positional_and_q(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, q = h);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 15, "gdpa takes either a positional x or q = and kv =, not both; found x and q =",
      0, 0, "");
}

static void test_sema_gdpa_q_without_kv(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(q = h);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 12, "gdpa needs both q = and kv =; found only q =",
      0, 0, "");
}

static void test_sema_gdpa_self_needs_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  u = gdpa(a);\n"
      "  loss bce(linear(u, 1), click);\n"
      "}\n",
      14, 12, "gdpa(x) is self-attention and needs a sequence: x is dense[B, 16], expected "
      "jagged",
      0, 0, "");
}

static void test_sema_gdpa_needs_a_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  u = gdpa(q = a, kv = stack(a, a));\n"
      "  loss bce(linear(u, 1), click);\n"
      "}\n",
      14, 24, "gdpa needs a sequence on one side: q is dense[B, 16] and kv is set[B, 2, 16], "
      "expected a jagged q or kv",
      0, 0, "");
}

static void test_sema_gdpa_jagged_q_dense_kv(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(q = h, kv = a);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 24, "gdpa with a jagged q needs kv to be a set or a sequence: kv is dense[B, 16], "
      "expected set or jagged",
      0, 0, "");
}

static void test_sema_gdpa_scale_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  g = gdpa(h, scale = 0);\n"
      "  p = pma(g, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 23, "argument 'scale' of gdpa must be a positive number, found 0",
      0, 0, "");
}

static void test_sema_pma_needs_sequence(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  p = pma(a, seeds = 2);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      13, 11, "pma needs a sequence: x is dense[B, 16], expected jagged",
      0, 0, "");
}

static void test_sema_pma_seeds_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  p = pma(h, seeds = 0);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      13, 22, "argument 'seeds' of pma must be a positive integer, found 0",
      0, 0, "");
}

static void test_sema_pma_missing_seeds(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  p = pma(h);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      13, 7, "missing argument 'seeds' in call to pma; expected pma(x, seeds = k, ...)",
      0, 0, "");
}

static void test_sema_pma_no_mask(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  p = pma(h, seeds = 2, mask = causal);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      13, 25, "unknown argument 'mask' to pma; expected x, seeds, heads, act, scale or "
      "hstu_norm",
      0, 0, "");
}

static void test_sema_embed_needs_table(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  e = embed(hist, hist);\n"
      "  p = pma(e, seeds = 1);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      12, 13, "embed expects a table as its first argument, found input 'hist'",
      0, 0, "");
}

static void test_sema_embed_unknown_table(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(itemz, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 13, "unknown name 'itemz'; expected a table",
      12, 13, "did you mean 'items'?");
}

static void test_sema_embed_needs_ids(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, cnt);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 20, "embed expects ids (a seq, sparse or multihot input) as its second argument, "
      "found dense[B, 4]",
      0, 0, "");
}

static void test_sema_embed_pool_on_sparse(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad, pool = sum);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 31, "pool needs a seq or multihot input, found sparse ids dense[B]",
      0, 0, "");
}

static void test_sema_embed_unknown_pool(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, hist, pool = avg);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 33, "unknown pool 'avg'; expected sum or mean",
      0, 0, "");
}

static void test_sema_ids_as_operand(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(hist, 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "linear expects float features, found ids jagged[B, *hist]; look them up with "
      "embed() first",
      0, 0, "");
}

static void test_sema_label_as_tensor(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(click, 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "label 'click' can only be used in bce(); found it used as a tensor",
      0, 0, "");
}

static void test_sema_table_as_tensor(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(items, 1);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "table 'items' can only be the first argument of embed(); found it used as a "
      "tensor",
      0, 0, "");
}

static void test_sema_bce_logit_shape(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 8), click);\n"
      "}\n",
      13, 12, "bce expects a logit of shape dense[B, 1], found dense[B, 8]",
      0, 0, "");
}

static void test_sema_bce_needs_label(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), ad);\n"
      "}\n",
      13, 26, "bce expects a label as its second argument, found input 'ad'",
      0, 0, "");
}

static void test_sema_bce_outside_loss(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = bce(linear(a, 1), click);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 7, "bce can only be used in a loss statement; found it in the binding of 'y'",
      0, 0, "");
}

static void test_sema_bce_name_kind(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click, name = ctr);\n"
      "}\n",
      13, 40, "argument 'name' of bce expects a string, found the name 'ctr'",
      0, 0, "");
}

static void test_sema_second_loss(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      14, 3, "a model has exactly one loss statement; found a second one",
      13, 3, "the first loss statement is here");
}

static void test_sema_loss_term_not_bce(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1);\n"
      "  loss y;\n"
      "}\n",
      14, 8, "a loss term must be bce(...) or w * bce(...); found the name 'y'",
      0, 0, "");
}

static void test_sema_loss_weight_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1);\n"
      "  loss 0 * bce(y, click);\n"
      "}\n",
      14, 8, "a loss weight must be a positive number, found 0",
      0, 0, "");
}

static void test_sema_loss_minus_term(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1);\n"
      "  loss bce(y, click) - bce(y, click);\n"
      "}\n",
      14, 8, "a loss term must be bce(...) or w * bce(...); found a '-' expression",
      0, 0, "");
}

static void test_sema_missing_loss(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 1);\n"
      "}\n",
      1, 7, "missing loss: expected a 'loss' statement in model 'm'",
      0, 0, "");
}

static void test_sema_shape_mismatch_add(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  z = h + a;\n"
      "  p = pma(z, seeds = 1);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 7, "shape mismatch in '+': left is jagged[B, *hist, 16], right is dense[B, 16]",
      0, 0, "");
}

static void test_sema_concat_arity(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  z = concat(a);\n"
      "  loss bce(linear(z, 1), click);\n"
      "}\n",
      13, 7, "concat takes 2 to 16 tensors, found 1",
      0, 0, "");
}

static void test_sema_stack_arity(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  z = stack(a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a);\n"
      "  loss bce(linear(flatten(z), 1), click);\n"
      "}\n",
      13, 7, "stack takes 1 to 16 tensors, found 17",
      0, 0, "");
}

static void test_sema_dot_interact_arity(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  z = dot_interact(a);\n"
      "  loss bce(linear(z, 1), click);\n"
      "}\n",
      13, 7, "dot_interact takes 2 to 16 tensors, found 1",
      0, 0, "");
}

static void test_sema_concat_layout_mismatch(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  z = concat(h, a);\n"
      "  p = pma(z, seeds = 1);\n"
      "  loss bce(linear(flatten(p), 1), click);\n"
      "}\n",
      14, 17, "concat needs one layout and leading dims: argument 1 is jagged[B, *hist, 16], "
      "argument 2 is dense[B, 16]",
      0, 0, "");
}

static void test_sema_stack_width_mismatch(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  z = stack(a, cnt);\n"
      "  loss bce(linear(flatten(z), 1), click);\n"
      "}\n",
      13, 16, "stack needs one width d: argument 1 is dense[B, 16], argument 2 is dense[B, 4]",
      0, 0, "");
}

static void test_sema_stack_needs_dense(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  h = embed(items, hist);\n"
      "  a = embed(items, ad);\n"
      "  z = stack(a, h);\n"
      "  loss bce(linear(flatten(z), 1), click);\n"
      "}\n",
      14, 16, "stack expects dense[B, d] tensors; argument 2 is jagged[B, *hist, 16]",
      0, 0, "");
}

static void test_sema_flatten_needs_set(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  z = flatten(a);\n"
      "  loss bce(linear(z, 1), click);\n"
      "}\n",
      13, 15, "flatten expects a set[B, k, d], found dense[B, 16]",
      0, 0, "");
}

static void test_sema_linear_size_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = linear(a, 0);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 17, "argument 'n' of linear must be a positive integer, found 0",
      0, 0, "");
}

static void test_sema_mlp_empty_list(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, []);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "mlp needs at least one layer size; found []",
      0, 0, "");
}

static void test_sema_mlp_list_of_ints(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, [4, a]);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 18, "mlp layer sizes must be positive integers, found the name 'a'",
      0, 0, "");
}

static void test_sema_mlp_size_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, [4, 0]);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 18, "mlp layer sizes must be in 1..2147483647, found 0",
      0, 0, "");
}

static void test_sema_mlp_needs_list(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  y = mlp(a, 4);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 14, "argument 'sizes' of mlp expects a list of layer sizes such as [1024, 1], found "
      "the integer 4",
      0, 0, "");
}

static void test_sema_norm_eps_positive(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = rmsnorm(a, eps = 0);\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 24, "argument 'eps' of rmsnorm must be positive, found 0",
      0, 0, "");
}

static void test_sema_layernorm_eps_kind(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = layernorm(a, eps = small);\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 26, "argument 'eps' of layernorm expects a number, found the name 'small'",
      0, 0, "");
}

static void test_sema_negation_of_tensor(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = -a;\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 7, "unary '-' applies to numbers only; expected a number, found the name 'a'",
      0, 0, "");
}

static void test_sema_number_as_tensor(void **state) {
  (void)state;
  check_case(DIAG_ERROR,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  b = a + 2;\n"
      "  y = linear(b, 1);\n"
      "  loss bce(y, click);\n"
      "}\n",
      13, 11, "expected a tensor, found the integer 2",
      0, 0, "");
}

static void test_sema_unused_binding(void **state) {
  (void)state;
  check_case(DIAG_WARNING,
      PRELUDE
      "  a = embed(items, ad);\n"
      "  u = linear(a, 4);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      13, 3, "binding 'u' is never used",
      0, 0, "");
}

static void test_sema_unused_input(void **state) {
  (void)state;
  check_case(DIAG_WARNING,
      PRELUDE
      "  sparse geo : id;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 10, "input 'geo' is never used",
      0, 0, "");
}

static void test_sema_unused_table(void **state) {
  (void)state;
  check_case(DIAG_WARNING,
      PRELUDE
      "  table geos : rows 5;\n"
      "  a = embed(items, ad);\n"
      "  loss bce(linear(a, 1), click);\n"
      "}\n",
      12, 9, "table 'geos' is never used",
      0, 0, "");
}

#define DIAG_TESTS(X) \
  X(unknown_name_with_suggestion) \
  X(unknown_name) \
  X(used_before_bound) \
  X(unknown_op) \
  X(unknown_named_argument) \
  X(duplicate_named_argument) \
  X(missing_argument) \
  X(too_many_positional) \
  X(wrong_argument_kind) \
  X(wrong_argument_kind_bool) \
  X(redefinition_input) \
  X(redefinition_table) \
  X(redefinition_label) \
  X(rebind_input) \
  X(rebind_table) \
  X(rebind_label) \
  X(duplicate_setting) \
  X(missing_batch) \
  X(missing_dim) \
  X(batch_positive) \
  X(dim_positive) \
  X(huge_batch) \
  X(unknown_target) \
  X(unknown_precision_setting) \
  X(model_optim_for_tables_only) \
  X(model_optim_unknown) \
  X(optim_unknown_argument) \
  X(optim_bad_beta) \
  X(optim_positional_argument) \
  X(like_non_sequence) \
  X(like_unknown) \
  X(like_declared_below) \
  X(seq_max_and_like) \
  X(seq_unknown_elem) \
  X(dense_unknown_elem) \
  X(table_unknown_attribute) \
  X(table_duplicate_attribute) \
  X(table_missing_rows) \
  X(table_dim_mismatch) \
  X(table_storage_mxfp8) \
  X(table_unknown_precision) \
  X(table_optim_adamw) \
  X(table_optim_unknown) \
  X(table_optim_unknown_argument) \
  X(table_optim_zero_lr) \
  X(table_rows_kind) \
  X(precision_on_non_call) \
  X(precision_illegal_on_op) \
  X(precision_fp8_on_embed) \
  X(unknown_annotation) \
  X(duplicate_precision) \
  X(precision_on_bce) \
  X(mxfp8_note_on_sm90a) \
  X(schedule_unknown_hint) \
  X(schedule_tile_not_power_of_two) \
  X(schedule_tile_too_big) \
  X(schedule_stages_range) \
  X(schedule_sm90_stages_follow_the_default_key_tile) \
  X(schedule_zigzag_value) \
  X(schedule_gelu_value) \
  X(schedule_hint_wrong_op) \
  X(schedule_hint_on_norm) \
  X(schedule_gelu_needs_gelu) \
  X(schedule_duplicate_hint) \
  X(unknown_activation) \
  X(mlp_softmax) \
  X(activation_kind) \
  X(heads_must_divide) \
  X(heads_positive) \
  X(window_positive) \
  X(window_needs_sequence) \
  X(window_needs_one_sequence) \
  X(causal_needs_one_sequence) \
  X(unknown_mask) \
  X(gdpa_positional_and_q) \
  X(gdpa_q_without_kv) \
  X(gdpa_self_needs_sequence) \
  X(gdpa_needs_a_sequence) \
  X(gdpa_jagged_q_dense_kv) \
  X(gdpa_scale_positive) \
  X(pma_needs_sequence) \
  X(pma_seeds_positive) \
  X(pma_missing_seeds) \
  X(pma_no_mask) \
  X(embed_needs_table) \
  X(embed_unknown_table) \
  X(embed_needs_ids) \
  X(embed_pool_on_sparse) \
  X(embed_unknown_pool) \
  X(ids_as_operand) \
  X(label_as_tensor) \
  X(table_as_tensor) \
  X(bce_logit_shape) \
  X(bce_needs_label) \
  X(bce_outside_loss) \
  X(bce_name_kind) \
  X(second_loss) \
  X(loss_term_not_bce) \
  X(loss_weight_positive) \
  X(loss_minus_term) \
  X(missing_loss) \
  X(shape_mismatch_add) \
  X(concat_arity) \
  X(stack_arity) \
  X(dot_interact_arity) \
  X(concat_layout_mismatch) \
  X(stack_width_mismatch) \
  X(stack_needs_dense) \
  X(flatten_needs_set) \
  X(linear_size_positive) \
  X(mlp_empty_list) \
  X(mlp_list_of_ints) \
  X(mlp_size_positive) \
  X(mlp_needs_list) \
  X(norm_eps_positive) \
  X(layernorm_eps_kind) \
  X(negation_of_tensor) \
  X(number_as_tensor) \
  X(unused_binding) \
  X(unused_input) \
  X(unused_table)


// --- rules the grammar cannot reach: the tree is edited after parsing --------------------

static Stmt *stmt_named(const char *name) {
  for (int i = 0; i < R.model->nstmts; i++)
    if (R.model->stmts[i].name && strcmp(R.model->stmts[i].name, name) == 0)
      return &R.model->stmts[i];
  fail_msg("no statement names '%s'", name);
  return NULL;
}

static void test_sema_seq_needs_max_or_like(void **state) {
  (void)state;
  FILE *f = parse_text(PRELUDE "  seq s2 : id like hist;\n  a = embed(items, ad);\n"
                               "  loss bce(linear(a, 1), click);\n}\n");
  stmt_named("s2")->like = NULL;
  lower_parsed(f, NULL);
  assert_false(R.ok);
  assert_printed("test.gem:12:7: error: seq 's2' needs 'max L' or 'like s'; found neither\n");
  release();
}

static void test_sema_dense_width_positive(void **state) {
  (void)state;
  FILE *f = parse_text(PRELUDE "  dense d2 : f32[2];\n  a = embed(items, ad);\n"
                               "  loss bce(linear(a, 1), click);\n}\n");
  stmt_named("d2")->width = 0;
  lower_parsed(f, NULL);
  assert_false(R.ok);
  assert_printed("test.gem:12:14: error: dense 'd2' needs a width in 1..2147483647, found "
                 "f32[0]\n");
  release();
}

// --- the example of docs/language.md ----------------------------------------------------

static const char language_example[] =
    "# GEM-style CTR model sized for one GPU.\n"
    "model gem_small {\n"
    "  batch 512;\n"
    "  dim 256;\n"
    "  precision bf16;                      # default for every op below\n"
    "  target sm_90a;\n"
    "  optim adamw(lr = 1e-3, weight_decay = 0.01);\n"
    "\n"
    "  seq      history  : id max 1024;     # user activity: item ids, jagged\n"
    "  seq      actions  : id like history; # same lengths as history\n"
    "  sparse   ad       : id;\n"
    "  multihot tags     : id max 32;       # a bag of ids, pooled by embed()\n"
    "  dense    counters : f32[16];\n"
    "  label    click;\n"
    "\n"
    "  table items : rows 4_000_000, dim 256, optim rowwise_adagrad(lr = 0.02);\n"
    "  table acts  : rows 64;\n"
    "  table tagt  : rows 100_000, precision fp16;\n"
    "\n"
    "  h = embed(items, history) + embed(acts, actions);        # [B, *history, 256]\n"
    "  a = embed(items, ad);                                     # [B, 256]\n"
    "  t = embed(tagt, tags, pool = mean);                       # [B, 256]\n"
    "  c = linear(counters, 256);                                # [B, 256]\n"
    "\n"
    "  h = h + gdpa(rmsnorm(h), heads = 4, act = silu, mask = causal, window = 256);\n"
    "  x = gdpa(q = rmsnorm(h), kv = stack(a, t, c), heads = 4, act = gelu) @mxfp8;\n"
    "  p = pma(x, seeds = 16, heads = 4, act = gelu_taylor);    # [B, 16, 256]\n"
    "  z = concat(flatten(p), a, t, c);\n"
    "  y = mlp(z, [1024, 512, 1], act = gelu) @mxfp8;\n"
    "  loss bce(y, click);\n"
    "}\n";

static void test_sema_language_example_lowers(void **state) {
  (void)state;
  compile(language_example);
  // The diagnostics, notes only: the one on emulated mxfp8, at the first mxfp8 op, and
  // gelu_taylor on pma's x, which no norm bounds (docs/activations.md), with its second note.
  assert_true(R.ok);
  assert_int_equal(R.d.errors, 0);
  assert_int_equal(R.d.warnings, 0);
  assert_int_equal(count_of(R.diags, "note: mxfp8 on sm_90a is emulated"), 1);
  assert_printed("test.gem:26:73: note: mxfp8 on sm_90a is emulated");
  assert_printed("test.gem:27:43: note: gelu_taylor on attention scores that no norm bounds: "
                 "x is not the output of rmsnorm or layernorm (the bound of `gemc check -v` "
                 "holds for any input)\n");
  assert_printed("test.gem:27:11: note: the scores grow with x here");
  char err[512];
  assert_true(ir_verify(&R.ir, err, sizeof err));

  // embed 2 + add, embed, embed_pool, linear; rmsnorm + gdpa 5 + add; rmsnorm + stack +
  // gdpa 5; pma 4; flatten + concat; mlp 3; bce + loss_sum.
  assert_int_equal(R.ir.nnodes, 31);
  assert_int_equal(count_nodes(OP_ATTENTION), 3);
  assert_int_equal(count_nodes(OP_LINEAR), 1 + 4 + 4 + 3 + 3);
  assert_string_equal(R.ir.model, "gem_small");
  assert_string_equal(R.ir.target, "sm_90a");
  assert_int_equal(R.ir.precision, DT_BF16);
  assert_int_equal(R.ir.batch, 512);
  assert_int_equal(R.ir.dim, 256);
  assert_int_equal(R.ir.dense_optim.kind, OPTIM_ADAMW);
  assert_true(R.ir.dense_optim.weight_decay == 0.01);
  assert_true(R.ir.dense_optim.beta2 == 0.999);

  // Two jagged dims: history (actions shares it) and the multihot tags.
  assert_int_equal(R.ir.njagged, 2);
  assert_string_equal(R.ir.jagged[0].name, "history");
  assert_int_equal(R.ir.jagged[0].max_len, 1024);
  assert_string_equal(R.ir.jagged[1].name, "tags");
  assert_int_equal(tensor("actions")->jag, tensor("history")->jag);

  assert_fixed("items", TENSOR_TABLE, 4000000, 256, DT_BF16);
  assert_true(tensor("items")->optim.lr == 0.02);
  assert_int_equal(tensor("items")->optim.kind, OPTIM_ROWWISE_ADAGRAD);
  assert_fixed("acts", TENSOR_TABLE, 64, 256, DT_BF16);
  assert_true(tensor("acts")->optim.lr == 0.01);
  assert_fixed("tagt", TENSOR_TABLE, 100000, 256, DT_FP16);

  assert_shape("h", LAYOUT_JAGGED, "history", 0, 256, DT_BF16);
  assert_shape("h.1", LAYOUT_JAGGED, "history", 0, 256, DT_BF16);
  assert_shape("a", LAYOUT_DENSE, NULL, 0, 256, DT_BF16);
  assert_shape("t", LAYOUT_DENSE, NULL, 0, 256, DT_BF16);
  assert_int_equal(producer("t")->op, OP_EMBED_POOL);
  assert_int_equal(producer("t")->pool, POOL_MEAN);
  assert_shape("x.stack0", LAYOUT_SET, NULL, 3, 256, DT_BF16);
  assert_shape("x", LAYOUT_JAGGED, "history", 0, 256, DT_BF16);
  assert_shape("p", LAYOUT_SET, NULL, 16, 256, DT_BF16);
  assert_shape("z", LAYOUT_DENSE, NULL, 0, 16 * 256 + 3 * 256, DT_BF16);
  assert_shape("y", LAYOUT_DENSE, NULL, 0, 1, DT_BF16);
  assert_shape("loss", LAYOUT_SCALAR, NULL, 0, 0, DT_F32);
  assert_int_equal(R.ir.loss, ir_find_tensor(&R.ir, "loss"));

  const Node *self = producer("h.gdpa0.attn");
  assert_int_equal(self->shape, ATTN_SELF);
  assert_int_equal(self->mask, MASK_CAUSAL);
  assert_int_equal(self->window, 256);
  assert_int_equal(self->act, ACT_SILU);
  assert_int_equal(self->prec, DT_BF16);
  const Node *cross = producer("x.gdpa0.attn");
  assert_int_equal(cross->shape, ATTN_CROSS);
  assert_int_equal(cross->prec, DT_MXFP8);
  assert_int_equal(producer("x.gdpa0.q")->prec, DT_MXFP8);
  assert_int_equal(producer("x.rmsnorm0")->prec, DT_BF16);
  assert_int_equal(producer("p.pma0.attn")->shape, ATTN_PMA);
  assert_fixed("p.pma0.seeds", TENSOR_PARAM, 16, 256, DT_F32);
  assert_fixed("x.gdpa0.wq", TENSOR_PARAM, 256, 256, DT_F32);
  assert_int_equal(producer("y")->prec, DT_MXFP8);
  assert_int_equal(producer("y")->sched.stages, 0);
  assert_int_equal(producer("y.mlp0.l0")->act, ACT_GELU);
  assert_int_equal(producer("y")->act, ACT_NONE);
  assert_shape("y.mlp0.l1", LAYOUT_DENSE, NULL, 0, 512, DT_BF16);
  release();
}

// Every model in models/ lowers cleanly and verifies.
static void test_sema_models_lower(void **state) {
  (void)state;
  static const char *const models[] = {"models/gem_tiny.gem", "models/gem_small.gem",
                                       "models/gem_full.gem", "models/hstu.gem"};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    SourceFile src;
    if (!source_read(&src, models[i])) continue;  // run from elsewhere than the repo root
    char *copy = strndup(src.text, src.size);
    compile(copy);
    if (R.d.errors || R.d.warnings) print_message("%s:\n%s", models[i], R.diags);
    assert_int_equal(R.d.errors, 0);
    assert_int_equal(R.d.warnings, 0);
    char err[512];
    if (!ir_verify(&R.ir, err, sizeof err)) fail_msg("%s: %s", models[i], err);
    assert_true(R.ir.loss >= 0);
    release();
    free(copy);
    source_free(&src);
  }
}

// --- attention shapes -------------------------------------------------------------------

static void test_sema_attention_shapes(void **state) {
  (void)state;
  compile("model att {\n"
          "  batch 4;\n"
          "  dim 16;\n"
          "  seq hist : id max 10;\n"
          "  seq other : id max 3;\n"
          "  sparse ad : id;\n"
          "  label click;\n"
          "  table items : rows 100;\n"
          "  h = embed(items, hist);\n"
          "  o = embed(items, other);\n"
          "  a = embed(items, ad);\n"
          "  s = gdpa(h, heads = 2, mask = causal, window = 4);\n"
          "  t = gdpa(q = rmsnorm(s), kv = s, mask = causal);\n"
          "  c = gdpa(q = t, kv = stack(a, a, a), heads = 4, scale = 0.5);\n"
          "  j = gdpa(q = c, kv = o);\n"
          "  p = pma(j, seeds = 3, heads = 2, act = silu);\n"
          "  f = gdpa(q = a, kv = j, act = sigmoid, hstu_norm = true);\n"
          "  g = gdpa(q = p, kv = j);\n"
          "  loss bce(linear(concat(flatten(g), f), 1), click);\n"
          "}\n");
  assert_clean();
  assert_int_equal(count_nodes(OP_ATTENTION), 7);

  const Node *n = producer("s.gdpa0.attn");
  assert_int_equal(n->shape, ATTN_SELF);
  assert_int_equal(n->heads, 2);
  assert_int_equal(n->mask, MASK_CAUSAL);
  assert_int_equal(n->window, 4);
  assert_int_equal(n->act, ACT_SOFTMAX);
  assert_true(fabs(n->scale - 1.0 / sqrt(8.0)) < 1e-15);
  assert_int_equal(R.ir.nodes[tensor("s.gdpa0.q")->producer].ins[0], ir_find_tensor(&R.ir, "h"));

  n = producer("t.gdpa0.attn");  // q = and kv = on one sequence: self
  assert_int_equal(n->shape, ATTN_SELF);
  assert_true(n->scale == 0.25);

  n = producer("c.gdpa0.attn");
  assert_int_equal(n->shape, ATTN_CROSS);
  assert_true(n->scale == 0.5);
  assert_fixed("c.gdpa0.wk", TENSOR_PARAM, 16, 16, DT_F32);
  assert_shape("c.gdpa0.k", LAYOUT_SET, NULL, 3, 16, DT_F32);
  assert_shape("c", LAYOUT_JAGGED, "hist", 0, 16, DT_F32);

  assert_int_equal(producer("j.gdpa0.attn")->shape, ATTN_CROSS);
  assert_shape("j.gdpa0.k", LAYOUT_JAGGED, "other", 0, 16, DT_F32);

  n = producer("p.pma0.attn");
  assert_int_equal(n->shape, ATTN_PMA);
  assert_int_equal(n->act, ACT_SILU);
  assert_int_equal(n->ins[0], ir_find_tensor(&R.ir, "p.pma0.seeds"));
  assert_fixed("p.pma0.seeds", TENSOR_PARAM, 3, 16, DT_F32);
  assert_shape("p", LAYOUT_SET, NULL, 3, 16, DT_F32);

  n = producer("f.gdpa0.attn");
  assert_int_equal(n->shape, ATTN_PFFN);
  assert_true(n->hstu_norm);
  assert_int_equal(n->act, ACT_SIGMOID);
  assert_shape("f", LAYOUT_DENSE, NULL, 0, 16, DT_F32);

  assert_int_equal(producer("g.gdpa0.attn")->shape, ATTN_PFFN);  // a set q over a sequence
  assert_shape("g", LAYOUT_SET, NULL, 3, 16, DT_F32);
  release();
}

// --- precision --------------------------------------------------------------------------

static void test_sema_precision_defaults_and_overrides(void **state) {
  (void)state;
  compile("model prec {\n"
          "  batch 4;\n"
          "  dim 16;\n"
          "  precision fp8;\n"
          "  target sm_100a;\n"
          "  sparse ad : id;\n"
          "  label click;\n"
          "  table items : rows 100;\n"
          "  table halfs : rows 10, precision fp16;\n"
          "  a = embed(items, ad);\n"
          "  b = embed(halfs, ad);\n"
          "  n = rmsnorm(a + b);\n"
          "  m = rmsnorm(n) @fp16;\n"
          "  l = linear(m, 8);\n"
          "  k = linear(l, 8) @fp32;\n"
          "  u = silu(k) @bf16;\n"
          "  loss bce(linear(u, 1) @mxfp8, click);\n"
          "}\n");
  assert_clean();
  assert_fixed("items", TENSOR_TABLE, 100, 16, DT_FP8);  // the model precision
  assert_fixed("halfs", TENSOR_TABLE, 10, 16, DT_FP16);
  // Ops without a matmul run in bf16 under an fp8 default.
  assert_int_equal(producer("a")->prec, DT_BF16);
  assert_shape("a", LAYOUT_DENSE, NULL, 0, 16, DT_BF16);
  assert_int_equal(producer("n.add0")->prec, DT_BF16);
  assert_int_equal(producer("n")->prec, DT_BF16);
  // Overrides.
  assert_int_equal(producer("m")->prec, DT_FP16);
  assert_shape("m", LAYOUT_DENSE, NULL, 0, 16, DT_FP16);
  // Matmul ops take the fp8 default and store bf16; parameters stay fp32 masters.
  assert_int_equal(producer("l")->prec, DT_FP8);
  assert_shape("l", LAYOUT_DENSE, NULL, 0, 8, DT_BF16);
  assert_fixed("l.linear0.w", TENSOR_PARAM, 16, 8, DT_F32);
  assert_fixed("m.rmsnorm0.gain", TENSOR_PARAM, 16, 0, DT_F32);
  assert_int_equal(producer("k")->prec, DT_F32);
  assert_shape("k", LAYOUT_DENSE, NULL, 0, 8, DT_F32);
  assert_int_equal(producer("u")->prec, DT_BF16);
  assert_int_equal(producer("loss.linear0")->prec, DT_MXFP8);
  assert_shape("loss.linear0", LAYOUT_DENSE, NULL, 0, 1, DT_BF16);
  assert_int_equal(producer("loss.bce0")->prec, DT_F32);
  assert_shape("loss", LAYOUT_SCALAR, NULL, 0, 0, DT_F32);
  assert_int_equal(count_of(R.diags, "emulated"), 0);  // sm_100a runs mxfp8 natively
  release();
}

static void test_sema_mxfp8_default(void **state) {
  (void)state;
  compile("model mx {\n"
          "  batch 4;\n"
          "  dim 16;\n"
          "  precision mxfp8;\n"
          "  sparse ad : id;\n"
          "  label click;\n"
          "  table items : rows 100;\n"
          "  a = embed(items, ad);\n"
          "  b = linear(a, 16);\n"
          "  c = linear(b, 16);\n"
          "  loss bce(linear(layernorm(c), 1), click);\n"
          "}\n");
  assert_true(R.ok);
  assert_int_equal(R.d.errors, 0);
  assert_fixed("items", TENSOR_TABLE, 100, 16, DT_F32);  // fp32 when the default is mxfp8
  assert_int_equal(producer("a")->prec, DT_BF16);
  assert_int_equal(producer("b")->prec, DT_MXFP8);
  assert_int_equal(producer("loss.layernorm0")->prec, DT_BF16);
  // One note for the whole model, at the setting that asked for mxfp8.
  assert_int_equal(count_of(R.diags, "note: mxfp8 on sm_90a is emulated"), 1);
  assert_printed("test.gem:4:13: note: mxfp8 on sm_90a is emulated: operands are quantized "
                 "to E4M3 with E8M0 block scales, then multiplied in bf16 or fp32 with the same "
                 "numerics\n");
  release();
}

static void test_sema_schedule_hints_reach_nodes(void **state) {
  (void)state;
  compile(PRELUDE
          "  h = embed(items, hist);\n"
          "  g = gdpa(h, act = gelu) @bf16 @schedule(tile_q = 64, tile_m = 16, tile_kv = 64, "
          "zigzag = off, gelu = exact, stages = 2);\n"
          "  p = pma(g, seeds = 2) @schedule(zigzag = on);\n"
          "  a = embed(items, ad);\n"
          "  d = dot_interact(a, a, a) @schedule(tile_m = 16, tile_n = 32, tile_k = 256);\n"
          "  s = gelu(concat(flatten(p), d)) @schedule(gelu = taylor);\n"
          "  e = embed(tagt, tags);\n"
          "  k = embed(items, acts);\n"
          "  n = linear(cnt, 1);\n"
          "  loss bce(linear(concat(s, e), 1) + n, click);\n"
          "}\n");
  assert_true(R.ok);
  const Node *n = producer("g.gdpa0.attn");
  assert_int_equal(n->sched.tile_q, 64);
  assert_int_equal(n->sched.tile_m, 16);
  assert_int_equal(n->sched.tile_kv, 64);
  assert_int_equal(n->sched.zigzag, 2);
  assert_int_equal(n->sched.gelu_taylor, 2);
  assert_int_equal(n->sched.stages, 2);
  assert_int_equal(producer("g.gdpa0.q")->sched.stages, 0);  // projections keep no hints
  assert_int_equal(producer("p.pma0.attn")->sched.zigzag, 1);
  n = producer("d");
  assert_int_equal(n->sched.tile_m, 16);
  assert_int_equal(n->sched.tile_n, 32);
  assert_int_equal(n->sched.tile_k, 256);
  assert_shape("d", LAYOUT_DENSE, NULL, 0, 3, DT_F32);
  assert_int_equal(producer("s")->sched.gelu_taylor, 1);
  char err[512];
  assert_true(ir_verify(&R.ir, err, sizeof err));
  release();
}

// --- names, rebinding, inputs, embed, loss ----------------------------------------------

static void test_sema_value_and_param_names(void **state) {
  (void)state;
  compile("model names {\n"
          "  batch 4;\n"
          "  dim 8;\n"
          "  seq hist : id max 10;\n"
          "  seq acts : id like hist;\n"
          "  dense cnt : f32[4];\n"
          "  label click;\n"
          "  table items : rows 100;\n"
          "  table actt : rows 5;\n"
          "  h = embed(items, hist) + embed(actt, acts);\n"
          "  c = linear(cnt, 8);\n"
          "  y = mlp(concat(flatten(pma(h, seeds = 2)), c), [16, 1], act = gelu)"
          " @schedule(stages = 2, gelu = taylor);\n"
          "  loss bce(y, click);\n"
          "}\n");
  assert_printed("test.gem:12:81: warning: @schedule(stages) has no effect on this op yet\n");
  assert_int_equal(R.d.warnings, 1);
  R.d.warnings = 0;
  assert_clean();
  assert_int_equal(producer("h.embed0")->ins[0], ir_find_tensor(&R.ir, "items"));
  assert_int_equal(producer("h.embed1")->ins[0], ir_find_tensor(&R.ir, "actt"));
  const Node *add = producer("h");
  assert_int_equal(add->op, OP_ADD);
  assert_int_equal(add->ins[0], ir_find_tensor(&R.ir, "h.embed0"));
  assert_int_equal(add->ins[1], ir_find_tensor(&R.ir, "h.embed1"));
  assert_fixed("c.linear0.w", TENSOR_PARAM, 4, 8, DT_F32);
  assert_fixed("c.linear0.b", TENSOR_PARAM, 8, 0, DT_F32);
  assert_shape("y.pma0", LAYOUT_SET, NULL, 2, 8, DT_F32);
  assert_fixed("y.pma0.seeds", TENSOR_PARAM, 2, 8, DT_F32);
  assert_shape("y.flatten0", LAYOUT_DENSE, NULL, 0, 16, DT_F32);
  assert_shape("y.concat0", LAYOUT_DENSE, NULL, 0, 24, DT_F32);
  assert_fixed("y.mlp0.l0.w", TENSOR_PARAM, 24, 16, DT_F32);
  assert_fixed("y.mlp0.l1.b", TENSOR_PARAM, 1, 0, DT_F32);
  const Node *hidden = producer("y.mlp0.l0");
  assert_int_equal(hidden->act, ACT_GELU);
  assert_int_equal(hidden->sched.gelu_taylor, 1);
  assert_int_equal(hidden->sched.stages, 2);
  const Node *last = producer("y");
  assert_int_equal(last->act, ACT_NONE);
  assert_int_equal(last->sched.gelu_taylor, 0);
  assert_int_equal(last->sched.stages, 2);
  assert_int_equal(last->ins[0], ir_find_tensor(&R.ir, "y.mlp0.l0"));
  // One bce term still goes through loss_sum with weight 1.
  const Node *sum = producer("loss");
  assert_int_equal(sum->op, OP_LOSS_SUM);
  assert_int_equal(sum->nins, 1);
  assert_true(sum->weights[0] == 1.0);
  assert_int_equal(sum->ins[0], ir_find_tensor(&R.ir, "loss.bce0"));
  assert_string_equal(producer("loss.bce0")->task, "click");
  release();
}

static void test_sema_rebinding_chain(void **state) {
  (void)state;
  compile(PRELUDE
          "  h = embed(items, hist);\n"
          "  h = h + gdpa(rmsnorm(h), heads = 2);\n"
          "  h = h + gdpa(rmsnorm(h), heads = 2);\n"
          "  h = layernorm(h);\n"
          "  p = pma(h, seeds = 1);\n"
          "  loss bce(linear(flatten(p), 1), click);\n"
          "}\n");
  assert_true(R.ok);
  int h0 = ir_find_tensor(&R.ir, "h"), h1 = ir_find_tensor(&R.ir, "h.1");
  int h2 = ir_find_tensor(&R.ir, "h.2"), h3 = ir_find_tensor(&R.ir, "h.3");
  assert_true(h0 >= 0 && h1 >= 0 && h2 >= 0 && h3 >= 0);
  assert_int_equal(producer("h.1")->ins[0], h0);
  assert_int_equal(producer("h.2")->ins[0], h1);
  assert_int_equal(producer("h.3")->ins[0], h2);
  assert_int_equal(producer("p.pma0.k")->ins[0], h3);
  // Op counters run per name, so each rebinding gets its own parameters.
  assert_fixed("h.gdpa0.wq", TENSOR_PARAM, 16, 16, DT_F32);
  assert_fixed("h.gdpa1.wq", TENSOR_PARAM, 16, 16, DT_F32);
  assert_fixed("h.rmsnorm1.gain", TENSOR_PARAM, 16, 0, DT_F32);
  assert_fixed("h.layernorm0.bias", TENSOR_PARAM, 16, 0, DT_F32);
  assert_int_equal(producer("h.gdpa1.q")->ins[0], ir_find_tensor(&R.ir, "h.rmsnorm1"));
  assert_int_equal(producer("h.rmsnorm1")->ins[0], h1);
  char err[512];
  assert_true(ir_verify(&R.ir, err, sizeof err));
  release();
}

static void test_sema_inputs(void **state) {
  (void)state;
  compile(PRELUDE
          "  seq v : f32[3] like hist;\n"
          "  seq w : f32 like acts;\n"
          "  e = embed(items, hist);\n"
          "  q = concat(e, linear(v, 4), w);\n"
          "  t = embed(tagt, tags);\n"
          "  p = pma(q, seeds = 1);\n"
          "  y = linear(concat(flatten(p), t, embed(items, ad), cnt), 1);\n"
          "  loss bce(y, click);\n"
          "}\n");
  assert_true(R.ok);
  assert_int_equal(R.ir.njagged, 2);  // hist (acts, v and w share it) and tags
  assert_shape("hist", LAYOUT_JAGGED, "hist", 0, 0, DT_I64);
  assert_int_equal(tensor("hist")->kind, TENSOR_INPUT);
  assert_shape("acts", LAYOUT_JAGGED, "hist", 0, 0, DT_I64);
  assert_shape("ad", LAYOUT_DENSE, NULL, 0, 0, DT_I64);
  assert_shape("tags", LAYOUT_JAGGED, "tags", 0, 0, DT_I64);
  assert_int_equal(R.ir.jagged[tensor("tags")->jag].max_len, 5);
  assert_shape("cnt", LAYOUT_DENSE, NULL, 0, 4, DT_F32);
  assert_shape("click", LAYOUT_DENSE, NULL, 0, 0, DT_F32);
  assert_int_equal(tensor("click")->kind, TENSOR_LABEL);
  assert_shape("v", LAYOUT_JAGGED, "hist", 0, 3, DT_F32);
  assert_shape("w", LAYOUT_JAGGED, "hist", 0, 1, DT_F32);
  assert_shape("q", LAYOUT_JAGGED, "hist", 0, 16 + 4 + 1, DT_F32);
  assert_shape("y.concat0", LAYOUT_DENSE, NULL, 0, 21 + 16 + 16 + 4, DT_F32);
  char err[512];
  assert_true(ir_verify(&R.ir, err, sizeof err));
  release();
}

static void test_sema_embed_pooling(void **state) {
  (void)state;
  compile(PRELUDE
          "  t = embed(tagt, tags);\n"
          "  u = embed(tagt, tags, pool = mean);\n"
          "  v = embed(items, hist, pool = sum);\n"
          "  w = embed(items, hist);\n"
          "  x = embed(items, acts, pool = mean);\n"
          "  p = pma(w, seeds = 1);\n"
          "  y = linear(concat(t, u, v, x, flatten(p), cnt, embed(items, ad)), 1);\n"
          "  loss bce(y, click);\n"
          "}\n");
  assert_clean();
  assert_int_equal(producer("t")->op, OP_EMBED_POOL);  // a multihot is pooled, sum by default
  assert_int_equal(producer("t")->pool, POOL_SUM);
  assert_int_equal(producer("u")->pool, POOL_MEAN);
  assert_int_equal(producer("v")->op, OP_EMBED_POOL);
  assert_shape("v", LAYOUT_DENSE, NULL, 0, 16, DT_F32);
  assert_int_equal(producer("w")->op, OP_EMBED);
  assert_shape("w", LAYOUT_JAGGED, "hist", 0, 16, DT_F32);
  assert_int_equal(producer("x")->pool, POOL_MEAN);
  release();
}

static void test_sema_loss_weights_and_tasks(void **state) {
  (void)state;
  compile(PRELUDE
          "  label conv;\n"
          "  a = embed(items, ad);\n"
          "  ctr = linear(a, 1);\n"
          "  cvr = linear(a, 1);\n"
          "  loss 1.0 * bce(ctr, click, name = \"ctr\") + 0.5 * bce(cvr, conv, name = \"cvr\")"
          " + bce(ctr, conv) * 2;\n"
          "}\n");
  assert_true(R.ok);
  const Node *sum = producer("loss");
  assert_int_equal(sum->nins, 3);
  assert_true(sum->weights[0] == 1.0);
  assert_true(sum->weights[1] == 0.5);
  assert_true(sum->weights[2] == 2.0);
  assert_string_equal(producer("loss.bce0")->task, "ctr");
  assert_string_equal(producer("loss.bce1")->task, "cvr");
  assert_string_equal(producer("loss.bce2")->task, "conv");
  assert_int_equal(sum->ins[1], ir_find_tensor(&R.ir, "loss.bce1"));
  char err[512];
  assert_true(ir_verify(&R.ir, err, sizeof err));
  release();
}

static void test_sema_loss_term_limit(void **state) {
  (void)state;
  char src[4096];
  int n = snprintf(src, sizeof src, "%s  a = embed(items, ad);\n  y = linear(a, 1);\n  loss ",
                   PRELUDE);
  for (int i = 0; i < 17; i++)
    n += snprintf(src + n, sizeof src - (size_t)n, "%sbce(y, click)", i ? " + " : "");
  snprintf(src + n, sizeof src - (size_t)n, ";\n}\n");
  compile(src);
  assert_false(R.ok);
  // The 17th term starts after 16 terms of 13 bytes and 16 separators of 3.
  char want[128];
  snprintf(want, sizeof want, "test.gem:14:%d: error: a loss has at most 16 terms; found 17\n",
           8 + 16 * 13 + 16 * 3);
  assert_printed(want);
  release();
}

// --- target and --arch ------------------------------------------------------------------

static const char mxfp8_model[] = PRELUDE
    "  a = embed(items, ad);\n"
    "  loss bce(linear(a, 1) @mxfp8, click);\n"
    "}\n";

static void test_sema_arch_overrides_target(void **state) {
  (void)state;
  compile_arch(mxfp8_model, "sm_100a");
  assert_true(R.ok);
  assert_string_equal(R.ir.target, "sm_100a");
  assert_int_equal(count_of(R.diags, "emulated"), 0);
  release();
  compile(mxfp8_model);
  assert_string_equal(R.ir.target, "sm_90a");  // the default
  assert_int_equal(count_of(R.diags, "emulated"), 1);
  release();
}

static void test_sema_bad_arch_has_no_location(void **state) {
  (void)state;
  compile_arch(mxfp8_model, "sm_75");
  assert_false(R.ok);
  assert_printed("test.gem: error: unknown target 'sm_75' given by --arch; expected sm_90a or "
                 "sm_100a\n");
  release();
}

// --- error recovery ---------------------------------------------------------------------

static void test_sema_one_error_does_not_cascade(void **state) {
  (void)state;
  compile(PRELUDE
          "  a = embed(items, ad);\n"
          "  y = linear(qqq, 4);\n"
          "  z = linear(y, 1) + linear(y, 1);\n"
          "  w = concat(z, mlp(z, [1]), a);\n"
          "  loss bce(linear(w, 1), click);\n"
          "}\n");
  assert_false(R.ok);
  assert_int_equal(R.d.errors, 1);
  assert_int_equal(count_of(R.diags, "binding '"), 0);  // no "never used" echo either
  release();
}

static void test_sema_unknown_op_does_not_cascade(void **state) {
  (void)state;
  compile(PRELUDE
          "  a = embed(items, ad);\n"
          "  y = frobnicate(a, hist, 3);\n"
          "  loss bce(linear(y, 1), click);\n"
          "}\n");
  assert_int_equal(R.d.errors, 1);
  assert_int_equal(count_of(R.diags, "input 'hist' is never used"), 0);
  release();
}

static void test_sema_stops_after_too_many_errors(void **state) {
  (void)state;
  size_t cap = 8192;
  char *src = malloc(cap);
  int n = snprintf(src, cap, "%s", PRELUDE);
  for (int i = 0; i < 40; i++)
    n += snprintf(src + n, cap - (size_t)n, "  y%d = linear(qqq, 1);\n", i);
  snprintf(src + n, cap - (size_t)n, "}\n");
  compile(src);
  assert_false(R.ok);
  assert_true(R.d.too_many);
  assert_int_equal(R.d.errors, DIAG_MAX_ERRORS);
  assert_int_equal(count_of(R.diags, "unknown name 'qqq'"), DIAG_MAX_ERRORS);
  assert_int_equal(count_of(R.diags, "missing loss"), 0);
  release();
  free(src);
}

// --- schedule hints that have no effect yet ----------------------------------------------
// Codegen reads gelu, zigzag, and tile_q (64 or 128 rows, bf16 attention with d / heads a
// multiple of 16); every other hint draws "@schedule(h) has no effect on this op yet".

static void assert_warned(int line, int col, const char *msg) {
  char want[512];
  snprintf(want, sizeof want, "test.gem:%d:%d: warning: %s\n", line, col, msg);
  assert_printed(want);
}

static void test_sema_schedule_idle_hints_warn(void **state) {
  (void)state;
  compile(PRELUDE
          "  h = embed(items, hist);\n"
          "  g = gdpa(h) @schedule(tile_kv = 64, stages = 1);\n"  // SIMT (fp32): they act
          "  p = pma(g, seeds = 2) @schedule(stages = 1);\n"
          "  a = embed(items, ad);\n"
          "  d = dot_interact(a, a) @schedule(tile_k = 64);\n"
          "  z = linear(concat(flatten(p), a, d), 8) @schedule(tile_m = 16, tile_n = 32);\n"
          "  y = mlp(z, [4, 1]) @mxfp8 @schedule(stages = 8, tile_k = 256);\n"
          "  loss bce(y, click);\n"
          "}\n");
  assert_true(R.ok);
  assert_int_equal(R.d.errors, 0);
  assert_warned(16, 36, "@schedule(tile_k) has no effect on this op yet");
  assert_warned(17, 53, "@schedule(tile_m) has no effect on this op yet");
  assert_warned(17, 66, "@schedule(tile_n) has no effect on this op yet");
  assert_warned(18, 39, "@schedule(stages) has no effect on this op yet");
  assert_warned(18, 51, "@schedule(tile_k) has no effect on this op yet");
  assert_int_equal(count_of(R.diags, "has no effect on this op yet"), 5);
  // The hints stay in the IR for the later issue that makes them act.
  assert_int_equal(producer("g.gdpa0.attn")->sched.tile_kv, 64);
  assert_int_equal(producer("y")->sched.tile_k, 256);
  release();
}

static void assert_refused(int line, int col, const char *msg) {
  char want[512];
  snprintf(want, sizeof want, "test.gem:%d:%d: error: %s\n", line, col, msg);
  assert_printed(want);
}

// On gdpa and pma a hint either acts or is refused with what the kernel that runs the op takes
// (docs/schedules.md), in source order; the kernel follows the precision and d / heads.
static void test_sema_schedule_attention_hints_checked_against_kernel(void **state) {
  (void)state;
  compile(PRELUDE
          "  h = embed(items, hist);\n"
          "  h = h + gdpa(h) @bf16 @schedule(tile_q = 256, zigzag = off);\n"
          "  h = h + gdpa(h) @schedule(tile_q = 64);\n"
          "  h = h + gdpa(h) @fp16 @schedule(tile_q = 128);\n"
          "  h = h + gdpa(h, heads = 2) @bf16 @schedule(tile_q = 64);\n"
          "  p = pma(h, seeds = 2) @mxfp8 @schedule(tile_q = 128, tile_kv = 16);\n"
          "  loss bce(linear(flatten(p), 1), click);\n"
          "}\n");
  assert_false(R.ok);
  assert_int_equal(R.d.errors, 4);
  assert_int_equal(count_of(R.diags, "warning: @schedule"), 0);  // no hint warns
  assert_refused(13, 35, "schedule hint 'tile_q' takes 64 or 128 on the mma.sync attention "
                 "kernel (the sm_90a kernel takes d / heads = 64 or 128, not 16), found 256");
  assert_refused(15, 35, "schedule hint 'tile_q' takes only 64 on the SIMT attention kernel "
                 "(this gdpa runs at fp16), found 128");
  assert_refused(17, 42, "schedule hint 'tile_q' takes only 64 on the quantized attention "
                 "kernel (this pma runs at mxfp8), found 128");
  assert_refused(17, 56, "schedule hint 'tile_kv' takes only 64 on the quantized attention "
                 "kernel (this pma runs at mxfp8), found 16");
  // In source order, tile_q before tile_kv.
  assert_true(strstr(R.diags, "17:42: error") < strstr(R.diags, "17:56: error"));
  release();
}

// The sm_90a kernel's default key tile is 64 over a set of at most 64 keys, so 3 stages fit at
// dh 128 there (codegen runs that shape), while a jagged kv's 128-key tiles leave room for 2.
static void test_sema_schedule_sm90_stages_follow_the_default_key_tile(void **state) {
  (void)state;
  compile("model m {\n"
          "  batch 8;\n"
          "  dim 256;\n"
          "  target sm_90a;\n"
          "  seq hist : id max 10;\n"
          "  sparse ad : id;\n"
          "  multihot tags : id max 5;\n"
          "  label click;\n"
          "  table items : rows 100;\n"
          "  table tagt : rows 50;\n"
          "  h = embed(items, hist);\n"
          "  a = embed(items, ad);\n"
          "  t = embed(tagt, tags, pool = mean);\n"
          "  h = h + gdpa(q = h, kv = stack(a, t), heads = 2) @bf16 @schedule(stages = 3);\n"
          "  h = h + gdpa(h, heads = 2) @bf16 @schedule(stages = 3);\n"
          "  loss bce(linear(flatten(pma(h, seeds = 1, heads = 2)), 1), click);\n"
          "}\n");
  assert_int_equal(R.d.errors, 1);
  assert_int_equal(count_of(R.diags, "14:"), 0);  // the set of 2 keys: accepted
  assert_true(strstr(R.diags, "test.gem:15:") != NULL);
  assert_true(strstr(R.diags, "tile_kv = 128") != NULL);
  release();
}

static void test_sema_schedule_acting_hints_do_not_warn(void **state) {
  (void)state;
  compile(PRELUDE
          "  h = embed(items, hist) + embed(items, acts);\n"
          "  h = h + gdpa(rmsnorm(h), act = gelu) @bf16 @schedule(tile_q = 64, zigzag = off, "
          "gelu = taylor);\n"
          "  h = h + gdpa(h) @bf16 @schedule(tile_q = 128, zigzag = on);\n"
          "  h = h + gdpa(h) @fp8 @schedule(zigzag = off);\n"
          "  p = pma(h, seeds = 2, act = gelu) @bf16 @schedule(tile_q = 128, gelu = exact);\n"
          "  a = embed(items, ad);\n"
          "  z = gelu(concat(flatten(p), a)) @schedule(gelu = taylor);\n"
          "  y = mlp(z, [4, 1], act = gelu) @schedule(gelu = taylor);\n"
          "  e = embed(tagt, tags);\n"
          "  n = linear(cnt, 1);\n"
          "  loss bce(y + linear(e, 1) + n, click);\n"
          "}\n");
  assert_clean();
  release();
}

// A hint that drew an error draws no warning; the call's other hints still do.
static void test_sema_schedule_error_suppresses_warning(void **state) {
  (void)state;
  compile(PRELUDE
          "  a = embed(items, ad);\n"
          "  b = linear(a, 16) @schedule(stages = 9, tile_m = 64);\n"
          "  c = linear(b, 16) @schedule(tile_n = 96);\n"
          "  d = rmsnorm(c) @schedule(tile_k = 32);\n"
          "  e = linear(d, 16) @schedule(stages = 2, stages = 3);\n"
          "  loss bce(linear(e, 1), click);\n"
          "}\n");
  assert_false(R.ok);
  assert_int_equal(R.d.errors, 4);
  assert_printed("test.gem:13:40: error: schedule hint 'stages' must be in 1..8, found 9\n");
  assert_warned(13, 43, "@schedule(tile_m) has no effect on this op yet");
  assert_int_equal(count_of(R.diags, "@schedule(tile_n)"), 0);
  assert_int_equal(count_of(R.diags, "@schedule(tile_k)"), 0);
  // The first stages is read and warned about; the second is the duplicate error.
  assert_printed("test.gem:16:43: error: schedule hint 'stages' is given twice\n");
  assert_warned(16, 31, "@schedule(stages) has no effect on this op yet");
  assert_int_equal(count_of(R.diags, "has no effect on this op yet"), 2);
  release();
}

// --- speed ------------------------------------------------------------------------------

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// 10,000 statements, each reading the one above it: linear time, no quadratic lookups.
static void test_sema_ten_thousand_statements_are_fast(void **state) {
  (void)state;
  enum { N = 10000 };
  size_t cap = (size_t)N * 64 + 1024;
  char *src = malloc(cap);
  int n = snprintf(src, cap, "model big {\n  batch 8;\n  dim 16;\n  dense cnt : f32[16];\n"
                             "  label click;\n  x0 = linear(cnt, 16);\n");
  for (int i = 1; i < N; i++)
    n += snprintf(src + n, cap - (size_t)n, "  x%d = x%d + linear(x%d, 16);\n", i, i - 1, i - 1);
  snprintf(src + n, cap - (size_t)n, "  loss bce(linear(x%d, 1), click);\n}\n", N - 1);
  double t0 = now();
  compile(src);
  double elapsed = now() - t0;
  assert_clean();
  assert_int_equal(R.ir.nnodes, 1 + 2 * (N - 1) + 3);
  if (elapsed > 2.0) fail_msg("parse and sema of %d statements took %.3f s", N, elapsed);
  release();
  free(src);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define X(name) cmocka_unit_test(test_sema_##name),
      DIAG_TESTS(X)
#undef X
      cmocka_unit_test(test_sema_seq_needs_max_or_like),
      cmocka_unit_test(test_sema_dense_width_positive),
      cmocka_unit_test(test_sema_language_example_lowers),
      cmocka_unit_test(test_sema_models_lower),
      cmocka_unit_test(test_sema_attention_shapes),
      cmocka_unit_test(test_sema_precision_defaults_and_overrides),
      cmocka_unit_test(test_sema_mxfp8_default),
      cmocka_unit_test(test_sema_schedule_hints_reach_nodes),
      cmocka_unit_test(test_sema_value_and_param_names),
      cmocka_unit_test(test_sema_rebinding_chain),
      cmocka_unit_test(test_sema_inputs),
      cmocka_unit_test(test_sema_embed_pooling),
      cmocka_unit_test(test_sema_loss_weights_and_tasks),
      cmocka_unit_test(test_sema_loss_term_limit),
      cmocka_unit_test(test_sema_arch_overrides_target),
      cmocka_unit_test(test_sema_bad_arch_has_no_location),
      cmocka_unit_test(test_sema_one_error_does_not_cascade),
      cmocka_unit_test(test_sema_unknown_op_does_not_cascade),
      cmocka_unit_test(test_sema_stops_after_too_many_errors),
      cmocka_unit_test(test_sema_ten_thousand_statements_are_fast),
      cmocka_unit_test(test_sema_schedule_idle_hints_warn),
      cmocka_unit_test(test_sema_schedule_attention_hints_checked_against_kernel),
      cmocka_unit_test(test_sema_schedule_acting_hints_do_not_warn),
      cmocka_unit_test(test_sema_schedule_error_suppresses_warning),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
