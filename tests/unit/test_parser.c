// test_parser.c: parse_model. Every construct of docs/language.md's example becomes the
// expected tree; syntax errors read as documented and several come out of one run; and no
// input crashes or hangs it: garbage, NUL bytes, 10 MB, 10,000-deep nesting.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "parse.h"

typedef struct Parsed {
  SourceFile src;
  Arena arena;
  Diag d;
  FILE *out;
  char *diag_text;
  size_t diag_size;
  Model *m;
} Parsed;

static Parsed *parse_bytes(const char *text, size_t size) {
  Parsed *p = calloc(1, sizeof *p);
  assert_non_null(p);
  source_from_memory(&p->src, "t.gem", text, size);
  p->out = open_memstream(&p->diag_text, &p->diag_size);
  assert_non_null(p->out);
  diag_init(&p->d, &p->src, p->out);
  p->m = parse_model(&p->src, &p->arena, &p->d);
  fflush(p->out);
  return p;
}

static Parsed *parse(const char *text) { return parse_bytes(text, strlen(text)); }

static void parsed_free(Parsed *p) {
  fclose(p->out);
  free(p->diag_text);
  arena_free(&p->arena);
  free(p);
}

static const char *diags(const Parsed *p) { return p->diag_text ? p->diag_text : ""; }

static void assert_reported(const Parsed *p, const char *text) {
  if (!strstr(diags(p), text)) {
    print_error("expected diagnostic:\n%s\nactual diagnostics:\n%s\n", text, diags(p));
    fail();
  }
}

// Asserts that `text` appears exactly once in the diagnostics.
static void assert_reported_once(const Parsed *p, const char *text) {
  assert_reported(p, text);
  const char *first = strstr(diags(p), text);
  assert_null(strstr(first + 1, text));
}

#define assert_loc(l, l1, c1, l2, c2)          \
  do {                                         \
    assert_int_equal((l).first_line, (l1));    \
    assert_int_equal((l).first_column, (c1));  \
    assert_int_equal((l).last_line, (l2));     \
    assert_int_equal((l).last_column, (c2));   \
  } while (0)

static void assert_name(const Expr *e, const char *name) {
  assert_non_null(e);
  assert_int_equal(e->kind, EXPR_NAME);
  assert_string_equal(e->name, name);
}

static void assert_int_expr(const Expr *e, int64_t v) {
  assert_non_null(e);
  assert_int_equal(e->kind, EXPR_INT);
  assert_true(e->int_value == v);
}

static void assert_call(const Expr *e, const char *callee, int nargs) {
  assert_non_null(e);
  assert_int_equal(e->kind, EXPR_CALL);
  assert_string_equal(e->name, callee);
  assert_int_equal(e->nargs, nargs);
}

static void assert_named_arg(const Arg *a, const char *name) {
  assert_non_null(a->name);
  assert_string_equal(a->name, name);
}

static char *ast_text(const Model *m) {
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  assert_non_null(f);
  ast_print(f, m);
  fclose(f);
  return text;
}

// --- the language reference's example ---------------------------------------------------

static const char example[] =
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
    "  y = mlp(z, [1024, 512, 1], act = gelu) @mxfp8 @schedule(stages = 2);\n"
    "  loss bce(y, click);\n"
    "}\n";

static void test_parser_example_settings(void **state) {
  (void)state;
  Parsed *p = parse(example);
  assert_int_equal(p->d.errors, 0);
  assert_string_equal(diags(p), "");
  Model *m = p->m;
  assert_non_null(m);
  assert_string_equal(m->name, "gem_small");
  assert_loc(m->name_loc, 2, 7, 2, 15);
  assert_loc(m->loc, 2, 1, 31, 1);
  assert_int_equal(m->nstmts, 24);

  Stmt *s = m->stmts;
  assert_int_equal(s[0].kind, STMT_BATCH);
  assert_int_expr(s[0].value, 512);
  assert_loc(s[0].loc, 3, 3, 3, 12);
  assert_loc(s[0].value->loc, 3, 9, 3, 11);
  assert_int_equal(s[1].kind, STMT_DIM);
  assert_int_expr(s[1].value, 256);
  assert_int_equal(s[2].kind, STMT_PRECISION);
  assert_name(s[2].value, "bf16");
  assert_int_equal(s[3].kind, STMT_TARGET);
  assert_name(s[3].value, "sm_90a");
  assert_int_equal(s[4].kind, STMT_OPTIM);
  assert_call(s[4].value, "adamw", 2);
  assert_named_arg(&s[4].value->args[0], "lr");
  assert_int_equal(s[4].value->args[0].value->kind, EXPR_REAL);
  assert_true(s[4].value->args[0].value->real_value == 1e-3);
  assert_loc(s[4].value->args[0].name_loc, 7, 15, 7, 16);
  assert_named_arg(&s[4].value->args[1], "weight_decay");
  parsed_free(p);
}

static void test_parser_example_inputs_and_tables(void **state) {
  (void)state;
  Parsed *p = parse(example);
  Stmt *s = p->m->stmts;

  assert_int_equal(s[5].kind, STMT_INPUT);
  assert_int_equal(s[5].input, INPUT_SEQ);
  assert_string_equal(s[5].name, "history");
  assert_loc(s[5].name_loc, 9, 12, 9, 18);
  assert_string_equal(s[5].elem, "id");
  assert_true(s[5].max_len == 1024);
  assert_loc(s[5].max_loc, 9, 26, 9, 33);
  assert_null(s[5].like);

  assert_int_equal(s[6].input, INPUT_SEQ);
  assert_string_equal(s[6].like, "history");
  assert_loc(s[6].like_loc, 10, 31, 10, 37);
  assert_true(s[6].max_len == 0);

  assert_int_equal(s[7].input, INPUT_SPARSE);
  assert_string_equal(s[7].name, "ad");
  assert_string_equal(s[7].elem, "id");
  assert_int_equal(s[8].input, INPUT_MULTIHOT);
  assert_true(s[8].max_len == 32);
  assert_int_equal(s[9].input, INPUT_DENSE);
  assert_string_equal(s[9].elem, "f32");
  assert_true(s[9].width == 16);
  assert_loc(s[9].elem_loc, 13, 23, 13, 29);
  assert_int_equal(s[10].input, INPUT_LABEL);
  assert_string_equal(s[10].name, "click");

  assert_int_equal(s[11].kind, STMT_TABLE);
  assert_string_equal(s[11].name, "items");
  assert_int_equal(s[11].nattrs, 3);
  assert_string_equal(s[11].attrs[0].key, "rows");
  assert_int_expr(s[11].attrs[0].value, 4000000);
  assert_string_equal(s[11].attrs[1].key, "dim");  // a keyword as an attribute name
  assert_loc(s[11].attrs[1].key_loc, 16, 33, 16, 35);
  assert_int_expr(s[11].attrs[1].value, 256);
  assert_string_equal(s[11].attrs[2].key, "optim");
  assert_call(s[11].attrs[2].value, "rowwise_adagrad", 1);
  assert_int_equal(s[12].nattrs, 1);
  assert_string_equal(s[13].attrs[1].key, "precision");
  assert_name(s[13].attrs[1].value, "fp16");
  parsed_free(p);
}

static void test_parser_example_layers(void **state) {
  (void)state;
  Parsed *p = parse(example);
  Stmt *s = p->m->stmts;

  // h = embed(items, history) + embed(acts, actions);
  assert_int_equal(s[14].kind, STMT_BIND);
  assert_string_equal(s[14].name, "h");
  Expr *e = s[14].value;
  assert_int_equal(e->kind, EXPR_BINARY);
  assert_int_equal(e->op, '+');
  assert_loc(e->loc, 20, 7, 20, 50);
  assert_call(e->lhs, "embed", 2);
  assert_loc(e->lhs->name_loc, 20, 7, 20, 11);
  assert_name(e->lhs->args[0].value, "items");
  assert_null(e->lhs->args[0].name);
  assert_call(e->rhs, "embed", 2);

  // t = embed(tagt, tags, pool = mean);
  e = s[16].value;
  assert_call(e, "embed", 3);
  assert_named_arg(&e->args[2], "pool");
  assert_name(e->args[2].value, "mean");

  // h = h + gdpa(rmsnorm(h), heads = 4, act = silu, mask = causal, window = 256);
  e = s[18].value;
  assert_name(e->lhs, "h");
  assert_call(e->rhs, "gdpa", 5);
  assert_call(e->rhs->args[0].value, "rmsnorm", 1);
  assert_named_arg(&e->rhs->args[4], "window");
  assert_int_expr(e->rhs->args[4].value, 256);

  // x = gdpa(q = rmsnorm(h), kv = stack(a, t, c), heads = 4, act = gelu) @mxfp8;
  e = s[19].value;
  assert_int_equal(e->kind, EXPR_ANNOT);
  assert_string_equal(e->name, "mxfp8");
  assert_false(e->has_parens);
  assert_int_equal(e->nargs, 0);
  assert_loc(e->name_loc, 26, 73, 26, 77);
  assert_loc(e->loc, 26, 7, 26, 77);
  assert_call(e->lhs, "gdpa", 4);
  assert_named_arg(&e->lhs->args[0], "q");
  assert_named_arg(&e->lhs->args[1], "kv");
  assert_call(e->lhs->args[1].value, "stack", 3);

  // y = mlp(z, [1024, 512, 1], act = gelu) @mxfp8 @schedule(stages = 2);
  e = s[22].value;
  assert_int_equal(e->kind, EXPR_ANNOT);
  assert_string_equal(e->name, "schedule");
  assert_true(e->has_parens);
  assert_int_equal(e->nargs, 1);
  assert_named_arg(&e->args[0], "stages");
  assert_int_expr(e->args[0].value, 2);
  assert_int_equal(e->lhs->kind, EXPR_ANNOT);
  assert_string_equal(e->lhs->name, "mxfp8");
  Expr *mlp = e->lhs->lhs;
  assert_call(mlp, "mlp", 3);
  Expr *list = mlp->args[1].value;
  assert_int_equal(list->kind, EXPR_LIST);
  assert_int_equal(list->nargs, 3);
  assert_int_expr(list->args[0].value, 1024);
  assert_int_expr(list->args[2].value, 1);
  assert_loc(list->loc, 29, 14, 29, 27);

  // loss bce(y, click);
  assert_int_equal(s[23].kind, STMT_LOSS);
  assert_call(s[23].value, "bce", 2);
  assert_loc(s[23].loc, 30, 3, 30, 21);
  parsed_free(p);
}

static void test_parser_ast_print_is_stable(void **state) {
  (void)state;
  Parsed *p = parse("model tiny {\n"
                    "  batch 8;\n"
                    "  seq s : f32[4] like h;\n"
                    "  table t : rows 10, dim 4;\n"
                    "  y = -a * 2.5 @bf16 + f(\"a\\\"b\", k = [], l = [1]);\n"
                    "}\n");
  assert_int_equal(p->d.errors, 0);
  char *text = ast_text(p->m);
  assert_string_equal(text, "model tiny @1:1-6:1\n"
                            "  batch @2:3-2:10\n"
                            "    int 8 @2:9-2:9\n"
                            "  seq s : f32[4] like h @3:3-3:24\n"
                            "  table t @4:3-4:27\n"
                            "    attr rows @4:13-4:16\n"
                            "      int 10 @4:18-4:19\n"
                            "    attr dim @4:22-4:24\n"
                            "      int 4 @4:26-4:26\n"
                            "  bind y @5:3-5:50\n"
                            "    binary + @5:7-5:49\n"
                            "      binary * @5:7-5:20\n"
                            "        neg @5:7-5:8\n"
                            "          name a @5:8-5:8\n"
                            "        annot bf16 @5:12-5:20\n"
                            "          real 2.5 @5:12-5:14\n"
                            "      call f @5:24-5:49\n"
                            "        string \"a\\\"b\" @5:26-5:31\n"
                            "        arg k @5:34-5:34\n"
                            "          list @5:38-5:39\n"
                            "        arg l @5:42-5:42\n"
                            "          list @5:46-5:48\n"
                            "            int 1 @5:47-5:47\n");
  free(text);
  parsed_free(p);
}

// --- expressions ------------------------------------------------------------------------

static void test_parser_operator_precedence(void **state) {
  (void)state;
  Parsed *p = parse("model m { x = -a * b + c - d; y = (a + b) * c; z = -w @bf16; }");
  assert_int_equal(p->d.errors, 0);
  Expr *e = p->m->stmts[0].value;  // ((-a * b) + c) - d
  assert_int_equal(e->op, '-');
  assert_name(e->rhs, "d");
  assert_int_equal(e->lhs->op, '+');
  assert_name(e->lhs->rhs, "c");
  assert_int_equal(e->lhs->lhs->op, '*');
  assert_int_equal(e->lhs->lhs->lhs->kind, EXPR_NEG);
  assert_name(e->lhs->lhs->lhs->lhs, "a");

  e = p->m->stmts[1].value;  // (a + b) * c
  assert_int_equal(e->op, '*');
  assert_int_equal(e->lhs->op, '+');
  assert_loc(e->loc, 1, 35, 1, 45);

  e = p->m->stmts[2].value;  // -(w @bf16)
  assert_int_equal(e->kind, EXPR_NEG);
  assert_int_equal(e->lhs->kind, EXPR_ANNOT);
  parsed_free(p);
}

static void test_parser_weighted_multitask_loss(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n"
                    "  loss 1.0 * bce(ctr, click, name = \"ctr\") + 0.5 * bce(cvr, convert, name "
                    "= \"cvr\");\n"
                    "}\n");
  assert_int_equal(p->d.errors, 0);
  Expr *e = p->m->stmts[0].value;
  assert_int_equal(e->op, '+');
  assert_int_equal(e->lhs->op, '*');
  assert_int_equal(e->lhs->lhs->kind, EXPR_REAL);
  assert_call(e->lhs->rhs, "bce", 3);
  assert_int_equal(e->lhs->rhs->args[2].value->kind, EXPR_STRING);
  assert_string_equal(e->lhs->rhs->args[2].value->string, "ctr");
  assert_true(e->rhs->lhs->real_value == 0.5);
  parsed_free(p);
}

static void test_parser_keywords_as_names_and_empty_forms(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n"
                    "  table t : rows 10, max 3, like x;\n"
                    "  x = f(max = 3, id = 1, model = 2, g());\n"
                    "  y = mlp(z, []) @fp8 @schedule() @schedule(tile_m = 64);\n"
                    "  seq a : id max 8 like b;\n"
                    "  seq v : f32 like a;\n"
                    "}\n");
  assert_int_equal(p->d.errors, 0);
  Stmt *s = p->m->stmts;
  assert_string_equal(s[0].attrs[1].key, "max");
  assert_string_equal(s[0].attrs[2].key, "like");
  assert_named_arg(&s[1].value->args[0], "max");
  assert_named_arg(&s[1].value->args[1], "id");
  assert_named_arg(&s[1].value->args[2], "model");
  assert_call(s[1].value->args[3].value, "g", 0);
  Expr *e = s[2].value;
  assert_true(e->has_parens);
  assert_int_equal(e->nargs, 1);
  assert_true(e->lhs->has_parens);
  assert_int_equal(e->lhs->nargs, 0);
  assert_false(e->lhs->lhs->has_parens);
  assert_int_equal(e->lhs->lhs->lhs->args[1].value->kind, EXPR_LIST);
  assert_int_equal(e->lhs->lhs->lhs->args[1].value->nargs, 0);
  assert_true(s[3].max_len == 8);
  assert_string_equal(s[3].like, "b");
  assert_string_equal(s[4].elem, "f32");
  assert_true(s[4].width == 0);
  parsed_free(p);
}

// --- syntax errors ----------------------------------------------------------------------

static void test_parser_recovers_and_reports_several_errors(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n"
                    "  batch 8;\n"
                    "  dim = 16;\n"
                    "  sparse ad : id;\n"
                    "  y = linear(embed(t, ad), 1;\n"
                    "  z = ) ;\n"
                    "  label click;\n"
                    "  loss bce(y, click);\n"
                    "}\n");
  assert_int_equal(p->d.errors, 3);
  assert_reported(p, "t.gem:3:7: error: unexpected '=', expecting an integer\n"
                     "    3 |   dim = 16;\n"
                     "      |       ^\n");
  assert_reported(p, "t.gem:5:29: error: unexpected ';', expecting ')' or ','\n");
  assert_reported(p, "t.gem:5:13: note: to match this '('\n");
  assert_reported(p, "t.gem:6:7: error: unexpected ')', expecting an expression\n");
  // The good statements around the bad ones are all there.
  assert_non_null(p->m);
  assert_int_equal(p->m->nstmts, 4);
  assert_int_equal(p->m->stmts[3].kind, STMT_LOSS);
  parsed_free(p);
}

static void test_parser_missing_semicolon_hint(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n  batch 8\n  dim 16;\n}\n");
  assert_int_equal(p->d.errors, 1);
  assert_string_equal(diags(p),
                      "t.gem:2:10: error: expected ';' at end of statement, found 'dim' on line 3\n"
                      "    2 |   batch 8\n"
                      "      |          ^\n");
  parsed_free(p);
}

static void test_parser_typical_mistakes(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n"
                    "  table t rows 10;\n"
                    "  x = f(a b);\n"
                    "  y = [1, 2;\n"
                    "  foo bar;\n"
                    "  table u : ;\n"
                    "  seq s : id max 3 max 4;\n"
                    "  dense d : f32[0];\n"
                    "}\n");
  assert_int_equal(p->d.errors, 7);
  assert_reported(p, "t.gem:2:11: error: unexpected identifier 'rows', expecting ':'\n");
  assert_reported(p, "t.gem:3:11: error: unexpected identifier 'b', expecting ')' or ','\n");
  assert_reported(p, "t.gem:4:12: error: unexpected ';', expecting ']' or ','\n");
  assert_reported(p, "t.gem:4:7: note: to match this '['\n");
  assert_reported(p, "t.gem:5:7: error: unexpected identifier 'bar', expecting '='\n");
  assert_reported(p, "t.gem:6:13: error: unexpected ';', expecting an attribute name\n");
  assert_reported(p, "t.gem:7:20: error: 'max' is given twice in one seq declaration\n");
  assert_reported(p, "t.gem:8:17: error: the width must be at least 1, found 0\n");
  parsed_free(p);
}

static void test_parser_unclosed_model(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n  batch 8;\n  dim 16;\n");
  assert_int_equal(p->d.errors, 1);
  assert_string_equal(diags(p),
                      "t.gem:3:10: error: expected '}' at the end of model 'm', found end of file\n"
                      "    3 |   dim 16;\n"
                      "      |          ^\n"
                      "t.gem:1:9: note: to match this '{'\n"
                      "    1 | model m {\n"
                      "      |         ^\n");
  assert_non_null(p->m);
  assert_int_equal(p->m->nstmts, 2);  // what was parsed is kept
  parsed_free(p);
}

static void test_parser_missing_model_and_trailing_garbage(void **state) {
  (void)state;
  Parsed *p = parse("batch 8;\n");
  assert_null(p->m);
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:1:1: error: expected 'model' at the start of the file, found "
                     "'batch'\n");
  parsed_free(p);

  p = parse("model m { batch 8; }\nmodel n { }\n");
  assert_non_null(p->m);
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:2:1: error: expected end of file after the model's closing '}', "
                     "found 'model'\n");
  parsed_free(p);
}

static void test_parser_empty_file_and_bare_header(void **state) {
  (void)state;
  Parsed *p = parse("");
  assert_null(p->m);
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:1:1: error: expected 'model' at the start of the file, found end "
                     "of file\n");
  parsed_free(p);

  p = parse("# only a comment\n\n");
  assert_null(p->m);
  assert_int_equal(p->d.errors, 1);
  parsed_free(p);

  p = parse("model m");
  assert_non_null(p->m);
  assert_string_equal(p->m->name, "m");
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:1:8: error: unexpected end of file, expecting '{'\n");
  parsed_free(p);

  p = parse("model { batch 1; }");  // no name: reported, and the body is still parsed
  assert_non_null(p->m);
  assert_string_equal(p->m->name, "");
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:1:7: error: unexpected '{', expecting an identifier\n");
  assert_int_equal(p->m->nstmts, 1);
  parsed_free(p);

  p = parse("model m { }");
  assert_int_equal(p->d.errors, 0);
  assert_int_equal(p->m->nstmts, 0);
  parsed_free(p);
}

static void test_parser_lexical_error_that_swallows_a_line_reports_once(void **state) {
  (void)state;
  Parsed *p = parse("model m {\n  loss bce(y, click, name = \"ctr);\n}\n");
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:2:29: error: unterminated string");
  parsed_free(p);

  p = parse("model m {\n  batch 8;  /* the batch\n  dim 16;\n}\n");
  assert_int_equal(p->d.errors, 1);
  assert_reported(p, "t.gem:2:13: error: unterminated comment");
  parsed_free(p);

  // The next statement is reported again once a ';' has been seen.
  p = parse("model m {\n  x = \"a;\n  y = 1;\n  z = ;\n}\n");
  assert_int_equal(p->d.errors, 2);
  assert_reported(p, "t.gem:4:7: error: unexpected ';', expecting an expression\n");
  parsed_free(p);
}

static void test_parser_stops_after_twenty_errors(void **state) {
  (void)state;
  // 100,000 bad statements: 20 are reported, then the parse stops.
  size_t n = 100000;
  char *text = malloc(12 + 4 * n);
  assert_non_null(text);
  strcpy(text, "model m {\n");
  for (size_t i = 0; i < n; i++) strcat(text + 10 + 4 * i, "; ;\n");
  Parsed *p = parse(text);
  assert_int_equal(p->d.errors, DIAG_MAX_ERRORS);
  assert_true(p->d.too_many);
  assert_reported_once(p, "t.gem: error: too many errors (20); stopping\n");
  parsed_free(p);
  free(text);
}

// --- robustness -------------------------------------------------------------------------

// "model m { x = " OPEN*depth "a" CLOSE*depth "; y = 1; }"
static char *nested(const char *open, const char *close, int depth) {
  size_t lo = strlen(open), lc = strlen(close);
  char *text = malloc(64 + (size_t)depth * (lo + lc));
  assert_non_null(text);
  char *p = text + sprintf(text, "model m { x = ");
  for (int i = 0; i < depth; i++, p += lo) memcpy(p, open, lo);
  *p++ = 'a';
  for (int i = 0; i < depth; i++, p += lc) memcpy(p, close, lc);
  strcpy(p, "; y = 1; }");
  return text;
}

static void test_parser_deep_nesting_is_one_error(void **state) {
  (void)state;
  const char *opens[] = {"(", "[", "-", "-(", "f("};
  const char *closes[] = {")", "]", "", ")", ")"};
  for (int k = 0; k < 5; k++) {
    char *text = nested(opens[k], closes[k], 10000);
    Parsed *p = parse(text);
    assert_int_equal(p->d.errors, 1);
    assert_reported_once(p, "error: nesting too deep: more than 256 levels\n");
    assert_non_null(p->m);
    parsed_free(p);
    free(text);
  }

  // 256 levels still parse.
  char *text = nested("(", ")", 256);
  Parsed *p = parse(text);
  assert_int_equal(p->d.errors, 0);
  assert_int_equal(p->m->nstmts, 2);
  parsed_free(p);
  free(text);

  // The error points at the 257th bracket: column 15 is the first.
  text = nested("[", "]", 257);
  p = parse(text);
  assert_reported(p, "t.gem:1:271: error: nesting too deep: more than 256 levels\n");
  parsed_free(p);
  free(text);
}

static void test_parser_long_chains_are_refused_not_overflowed(void **state) {
  (void)state;
  // a + a + ... and a @a @a ... build deep trees without nesting: refused past 1024 levels.
  const char *links[] = {" + a", " @a", " * a"};
  for (int k = 0; k < 3; k++) {
    size_t n = 200000, len = strlen(links[k]);
    char *text = malloc(32 + n * len);
    assert_non_null(text);
    char *q = text + sprintf(text, "model m { x = a");
    for (size_t i = 0; i < n; i++, q += len) memcpy(q, links[k], len);
    strcpy(q, "; }");
    Parsed *p = parse(text);
    assert_int_equal(p->d.errors, 1);
    assert_reported(p, "t.gem:1:15: error: expression too deep: more than 1024 levels; split "
                       "it into several bindings\n");
    parsed_free(p);
    free(text);
  }
  // 1000 terms are fine.
  char text[8000];
  char *q = text + sprintf(text, "model m { x = a");
  for (int i = 0; i < 1000; i++) q += sprintf(q, " + a");
  strcpy(q, "; }");
  Parsed *p = parse(text);
  assert_int_equal(p->d.errors, 0);
  parsed_free(p);
}

static void test_parser_survives_garbage(void **state) {
  (void)state;
  // Random bytes, then random tokens: no crash, no hang, between 1 and 20 errors.
  uint32_t seed = 12345;
  static const char *const words[] = {"model", "m", "{", "}", "(", ")", "[", "]", ";", ":",
                                      ",", "=", "+", "-", "*", "@", "1", "2.5", "\"s\"",
                                      "seq", "table", "loss", "x", "f", "id", "max", "/*",
                                      "#", "\n", "\"", "\xff", "\xc3", "\0"};
  size_t nwords = sizeof words / sizeof words[0];
  char buf[4096];
  for (int run = 0; run < 400; run++) {
    size_t len = 0;
    if (run % 2 == 0) {
      for (; len < sizeof buf; len++) {
        seed = seed * 1103515245u + 12345u;
        buf[len] = (char)(seed >> 16);
      }
    } else {
      memcpy(buf, "model m {", 9);
      len = 9;
      while (len + 8 < sizeof buf) {
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % nwords];
        size_t wl = *w ? strlen(w) : 1;  // "\0" is one NUL byte
        memcpy(buf + len, w, wl);
        len += wl;
        buf[len++] = ' ';
      }
    }
    Parsed *p = parse_bytes(buf, len);
    assert_true(p->d.errors >= 1);
    assert_true(p->d.errors <= DIAG_MAX_ERRORS);
    if (p->m) free(ast_text(p->m));
    parsed_free(p);
  }
}

static void test_parser_nul_bytes_and_huge_literals(void **state) {
  (void)state;
  const char text[] = "model m {\n  batch 8;\0\n  dim 99999999999999999999;\n}\n";
  Parsed *p = parse_bytes(text, sizeof text - 1);
  assert_int_equal(p->d.errors, 2);
  assert_reported(p, "t.gem:2:11: error: unexpected NUL byte\n");
  assert_reported(p, "t.gem:3:7: error: integer literal too large: '99999999999999999999' "
                     "exceeds 9223372036854775807\n");
  assert_int_equal(p->m->nstmts, 2);
  parsed_free(p);
}

static void test_parser_ten_megabytes_in_well_under_two_seconds(void **state) {
  (void)state;
  const char *layer = "  h = h + gdpa(rmsnorm(h), heads = 4, act = silu, mask = causal) @bf16;\n";
  size_t ll = strlen(layer), target = 10 * 1024 * 1024;
  size_t layers = target / ll;
  char *text = malloc(target + 256);
  assert_non_null(text);
  char *q = text + sprintf(text, "model big {\n  batch 8;\n  dim 64;\n");
  for (size_t i = 0; i < layers; i++, q += ll) memcpy(q, layer, ll);
  strcpy(q, "  loss bce(h, y);\n}\n");
  size_t size = strlen(text);
  assert_true(size >= target - ll);

  // CPU time, not wall time, so that a busy machine does not fail the test.
  clock_t t0 = clock();
  Parsed *p = parse_bytes(text, size);
  double seconds = (double)(clock() - t0) / CLOCKS_PER_SEC;
  assert_int_equal(p->d.errors, 0);
  assert_int_equal(p->m->nstmts, (int)layers + 3);
  assert_int_equal(p->m->stmts[p->m->nstmts - 1].kind, STMT_LOSS);
  print_message("parsed %zu bytes in %.3f s of CPU time\n", size, seconds);
  assert_true(seconds < 2.0);
  parsed_free(p);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parser_example_settings),
      cmocka_unit_test(test_parser_example_inputs_and_tables),
      cmocka_unit_test(test_parser_example_layers),
      cmocka_unit_test(test_parser_ast_print_is_stable),
      cmocka_unit_test(test_parser_operator_precedence),
      cmocka_unit_test(test_parser_weighted_multitask_loss),
      cmocka_unit_test(test_parser_keywords_as_names_and_empty_forms),
      cmocka_unit_test(test_parser_recovers_and_reports_several_errors),
      cmocka_unit_test(test_parser_missing_semicolon_hint),
      cmocka_unit_test(test_parser_typical_mistakes),
      cmocka_unit_test(test_parser_unclosed_model),
      cmocka_unit_test(test_parser_missing_model_and_trailing_garbage),
      cmocka_unit_test(test_parser_empty_file_and_bare_header),
      cmocka_unit_test(test_parser_lexical_error_that_swallows_a_line_reports_once),
      cmocka_unit_test(test_parser_stops_after_twenty_errors),
      cmocka_unit_test(test_parser_deep_nesting_is_one_error),
      cmocka_unit_test(test_parser_long_chains_are_refused_not_overflowed),
      cmocka_unit_test(test_parser_survives_garbage),
      cmocka_unit_test(test_parser_nul_bytes_and_huge_literals),
      cmocka_unit_test(test_parser_ten_megabytes_in_well_under_two_seconds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
