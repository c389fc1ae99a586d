// ast_print.c: the syntax tree as stable, indented text (gemc --emit=ast). One node per
// line: its kind, its fields, and its source range as @line:col-line:col. Children are
// indented two spaces under their parent, in source order:
//   model tiny @1:1-6:1
//     batch @2:3-2:10
//       int 8 @2:9-2:9
//     bind h @5:3-5:35                 h = embed(items, s, pool = mean);
//       call embed @5:7-5:34
//         name items @5:13-5:17
//         name s @5:20-5:20
//         arg pool @5:23-5:26           a named argument: its name, then its value
//           name mean @5:30-5:33
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "ast.h"  // defines: Model, Stmt, Expr, ast_print

static void indent(FILE *out, int level) {
  for (int i = 0; i < level; i++) fputs("  ", out);
}

static void print_loc(FILE *out, Loc loc) {
  fprintf(out, " @%d:%d-%d:%d\n", loc.first_line, loc.first_column, loc.last_line,
          loc.last_column);
}

static const char *or_null(const char *s) { return s ? s : "(null)"; }

// The shortest %g form that reads back as the same double.
static void print_real(FILE *out, double v) {
  char buf[64];
  for (int precision = 15; precision <= 17; precision++) {
    snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (strtod(buf, NULL) == v) break;
  }
  fputs(buf, out);
}

static void print_string(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)or_null(s); *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", out); break;
    case '\\': fputs("\\\\", out); break;
    case '\n': fputs("\\n", out); break;
    case '\t': fputs("\\t", out); break;
    default:
      if (*p < 0x20 || *p == 0x7F)
        fprintf(out, "\\x%02X", *p);
      else
        fputc(*p, out);
    }
  }
  fputc('"', out);
}

static void print_expr(FILE *out, const Expr *e, int level);

// A positional argument prints as its value; a named one as `arg NAME` over its value.
static void print_args(FILE *out, const Arg *args, int n, int level) {
  for (int i = 0; i < n; i++) {
    if (args[i].name) {
      indent(out, level);
      fprintf(out, "arg %s", args[i].name);
      print_loc(out, args[i].name_loc);
      print_expr(out, args[i].value, level + 1);
    } else {
      print_expr(out, args[i].value, level);
    }
  }
}

static void print_expr(FILE *out, const Expr *e, int level) {
  indent(out, level);
  if (!e) {
    fputs("(null)\n", out);
    return;
  }
  switch (e->kind) {
  case EXPR_NAME:
    fprintf(out, "name %s", or_null(e->name));
    print_loc(out, e->loc);
    return;
  case EXPR_INT:
    fprintf(out, "int %" PRId64, e->int_value);
    print_loc(out, e->loc);
    return;
  case EXPR_REAL:
    fputs("real ", out);
    print_real(out, e->real_value);
    print_loc(out, e->loc);
    return;
  case EXPR_STRING:
    fputs("string ", out);
    print_string(out, e->string);
    print_loc(out, e->loc);
    return;
  case EXPR_LIST:
    fputs("list", out);
    print_loc(out, e->loc);
    print_args(out, e->args, e->nargs, level + 1);
    return;
  case EXPR_CALL:
    fprintf(out, "call %s", or_null(e->name));
    print_loc(out, e->loc);
    print_args(out, e->args, e->nargs, level + 1);
    return;
  case EXPR_BINARY:
    fprintf(out, "binary %c", e->op);
    print_loc(out, e->loc);
    print_expr(out, e->lhs, level + 1);
    print_expr(out, e->rhs, level + 1);
    return;
  case EXPR_NEG:
    fputs("neg", out);
    print_loc(out, e->loc);
    print_expr(out, e->lhs, level + 1);
    return;
  case EXPR_ANNOT:
    fprintf(out, "annot %s%s", or_null(e->name), e->has_parens ? "()" : "");
    print_loc(out, e->loc);
    print_expr(out, e->lhs, level + 1);
    print_args(out, e->args, e->nargs, level + 1);
    return;
  }
  fputs("(unknown expression)\n", out);
}

static const char *setting_name(StmtKind kind) {
  switch (kind) {
  case STMT_BATCH: return "batch";
  case STMT_DIM: return "dim";
  case STMT_PRECISION: return "precision";
  case STMT_TARGET: return "target";
  case STMT_OPTIM: return "optim";
  case STMT_LOSS: return "loss";
  default: return NULL;
  }
}

// `seq history : id max 1024`, `dense counters : f32[16]`, `label click`.
static void print_input(FILE *out, const Stmt *s) {
  static const char *const kinds[] = {
      [INPUT_SEQ] = "seq", [INPUT_SPARSE] = "sparse", [INPUT_MULTIHOT] = "multihot",
      [INPUT_DENSE] = "dense", [INPUT_LABEL] = "label"};
  const char *kind = (unsigned)s->input < sizeof kinds / sizeof kinds[0] ? kinds[s->input] : "?";
  fprintf(out, "%s %s", kind, or_null(s->name));
  if (s->elem) {
    fprintf(out, " : %s", s->elem);
    if (s->width) fprintf(out, "[%" PRId64 "]", s->width);
  }
  if (s->max_len) fprintf(out, " max %" PRId64, s->max_len);
  if (s->like) fprintf(out, " like %s", s->like);
}

static void print_stmt(FILE *out, const Stmt *s, int level) {
  indent(out, level);
  const char *setting = setting_name(s->kind);
  if (setting) {
    fputs(setting, out);
    print_loc(out, s->loc);
    print_expr(out, s->value, level + 1);
    return;
  }
  switch (s->kind) {
  case STMT_INPUT:
    print_input(out, s);
    print_loc(out, s->loc);
    return;
  case STMT_TABLE:
  case STMT_PARALLEL:
    if (s->kind == STMT_TABLE) fprintf(out, "table %s", or_null(s->name));
    else fputs("parallel", out);
    print_loc(out, s->loc);
    for (int i = 0; i < s->nattrs; i++) {
      indent(out, level + 1);
      fprintf(out, "attr %s", or_null(s->attrs[i].key));
      print_loc(out, s->attrs[i].key_loc);
      print_expr(out, s->attrs[i].value, level + 2);
    }
    return;
  case STMT_BIND:
    fprintf(out, "bind %s", or_null(s->name));
    print_loc(out, s->loc);
    print_expr(out, s->value, level + 1);
    return;
  default:
    fputs("(unknown statement)", out);
    print_loc(out, s->loc);
    return;
  }
}

void ast_print(FILE *out, const Model *m) {
  if (!m) {
    fputs("(no model)\n", out);
    return;
  }
  fprintf(out, "model %s", or_null(m->name));
  print_loc(out, m->loc);
  for (int i = 0; i < m->nstmts; i++) print_stmt(out, &m->stmts[i], 1);
}
