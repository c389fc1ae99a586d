// ast.h: the syntax tree the parser builds. It mirrors the source exactly; sema gives it
// meaning. Every node carries its source range. All nodes live in one Arena.
// defines: Expr, Arg, Stmt, Model, ast_print
#ifndef GEMC_AST_H
#define GEMC_AST_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"

typedef struct Expr Expr;

// A call or annotation argument: `expr` or `name = expr`.
typedef struct Arg {
  const char *name;  // NULL for a positional argument
  Loc name_loc;
  Expr *value;
} Arg;

typedef enum ExprKind {
  EXPR_NAME,    // history
  EXPR_INT,     // 1024
  EXPR_REAL,    // 1e-3
  EXPR_STRING,  // "ctr"
  EXPR_LIST,    // [1024, 512, 1]
  EXPR_CALL,    // gdpa(x, heads = 4)
  EXPR_BINARY,  // a + b, a - b, a * b
  EXPR_NEG,     // -x
  EXPR_ANNOT,   // x @mxfp8, x @schedule(stages = 2)
} ExprKind;

struct Expr {
  ExprKind kind;
  Loc loc;             // the whole expression
  const char *name;    // NAME: the name; CALL: the callee; ANNOT: the annotation name
  Loc name_loc;        // CALL and ANNOT: the callee or annotation name alone
  int64_t int_value;   // INT
  double real_value;   // REAL
  const char *string;  // STRING, unescaped
  char op;             // BINARY: '+', '-' or '*'
  Expr *lhs, *rhs;     // BINARY; NEG uses lhs; ANNOT: lhs is the annotated expression
  Arg *args;           // CALL and ANNOT arguments; LIST items as positional args
  int nargs;
  int has_parens;      // ANNOT: written with (...), even if empty
};

typedef enum StmtKind {
  STMT_BATCH,      // batch 512;          -> value (INT)
  STMT_DIM,        // dim 256;            -> value (INT)
  STMT_PRECISION,  // precision bf16;     -> value (NAME)
  STMT_TARGET,     // target sm_90a;      -> value (NAME)
  STMT_OPTIM,      // optim adamw(...);   -> value (CALL)
  STMT_INPUT,      // seq / sparse / multihot / dense / label
  STMT_TABLE,      // table items : rows 4000000, dim 256;
  STMT_BIND,       // h = expr;
  STMT_LOSS,       // loss expr;
  STMT_PARALLEL,   // parallel { dense zero2; bucket_mb 25; }  -> attrs
} StmtKind;

typedef enum InputKind {
  INPUT_SEQ,       // seq s : id max L;  seq t : id like s;  seq v : f32[k] like s;
  INPUT_SPARSE,    // sparse a : id;
  INPUT_MULTIHOT,  // multihot m : id max L;
  INPUT_DENSE,     // dense c : f32[k];
  INPUT_LABEL,     // label y;
} InputKind;

// A table attribute: `rows 4000000`, `precision bf16`, `optim rowwise_adagrad(lr = 0.02)`.
typedef struct TableAttr {
  const char *key;
  Loc key_loc;
  Expr *value;  // INT, NAME or CALL
} TableAttr;

typedef struct Stmt {
  StmtKind kind;
  Loc loc;            // the whole statement
  const char *name;   // INPUT, TABLE, BIND: the declared or bound name
  Loc name_loc;
  Expr *value;        // settings, BIND, LOSS
  // INPUT
  InputKind input;
  const char *elem;   // "id", or a dtype name such as "f32" (INPUT_SEQ, INPUT_DENSE)
  Loc elem_loc;
  int64_t width;      // f32[k]: k; 0 when not written
  int64_t max_len;    // `max L`: L; 0 when not written
  Loc max_loc;
  const char *like;   // `like s`: s; NULL when not written
  Loc like_loc;
  // TABLE
  TableAttr *attrs;
  int nattrs;
} Stmt;

typedef struct Model {
  const char *name;
  Loc name_loc;
  Loc loc;
  Stmt *stmts;
  int nstmts;
} Model;

// Prints the tree as stable, indented text (gemc --emit=ast). Each line names the node kind,
// its fields and its source range as line:col-line:col.
void ast_print(FILE *out, const Model *m);

#endif
