// parse_state.h: what the scanner, the grammar's actions and parse_model share while one
// file is parsed: the position in the source, the last tokens seen, the open brackets, and
// the model being built. Private to the grammar; the rest of gemc sees only parse.h.
// defines: ParseState, parse_state_open, parse_state_close, parse_next_token, the tree builders
#ifndef GEMC_PARSE_STATE_H
#define GEMC_PARSE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"       // defines: Arena
#include "ast.h"         // defines: Model, Stmt, Expr, Arg
#include "diag.h"        // defines: Diag, Loc, SourceFile
#include "parser.tab.h"  // defines: YYSTYPE, the token kinds, ExprVal, ArgList

enum {
  PARSE_MAX_NESTING = 256,      // open '(' '[' and pending unary '-' at once
  PARSE_MAX_EXPR_DEPTH = 1024,  // levels of one expression tree (a + b + c ... counts too)
  PARSE_MAX_IDENT = 255,        // characters in an identifier
  PARSE_SNIPPET = 40,           // bytes of source text quoted in a message
};

struct ParseState {
  const SourceFile *file;
  Arena *arena;
  Diag *diag;
  void *scanner;  // the flex scanner (yyscan_t)
  Model *model;   // NULL until the header `model NAME` is parsed
  int stmt_cap;
  Loc lbrace;     // the model's '{', for "missing '}'" notes
  bool stop;      // a limit was hit: the scanner says end of file, the parser says nothing

  // The scanner's position: the next byte to read.
  int line, column;
  size_t offset;

  // The token returned last (the parser's lookahead when it reports an error) and the one
  // before it. Kind 0 is end of file; has_prev is false before the second token.
  int tok_kind;
  Loc tok_loc;
  size_t tok_offset, tok_len;  // its bytes in the source
  int prev_kind;
  Loc prev_loc;
  size_t prev_offset, prev_len;
  bool has_prev;

  // Open brackets and pending unary minuses, innermost last: '(', '[' or '-'.
  char nest[PARSE_MAX_NESTING];
  Loc nest_loc[PARSE_MAX_NESTING];
  int depth;

  // The scanner's work in progress: a string literal or a block comment.
  char *str_buf;
  size_t str_len, str_cap;
  Loc str_start;       // the opening quote
  size_t str_offset;
  Loc comment_start;   // the '/*'
  // An unterminated string or comment swallowed the tokens after it: the syntax errors
  // that follow are its echo, so they are not reported until the next ';'.
  bool swallowed;
};

// --- the scanner side (grammar/parse.c) ---------------------------------------------------

// Prepares `ps` to scan `f`; parse_state_close releases what it holds (not the arena).
void parse_state_open(ParseState *ps, const SourceFile *f, Arena *arena, Diag *d);
void parse_state_close(ParseState *ps);
// The parser's yylex: the next token from the scanner, after checking nesting depth. Returns
// 0 (end of file) once the input ends, a limit is hit, or the error limit is reached.
int parse_next_token(YYSTYPE *value, Loc *loc, ParseState *ps);
// Writes `len` bytes of source text into `out` as a message may quote them: printable ASCII
// and valid UTF-8 as they are, other bytes as \xNN, cut with "..." after PARSE_SNIPPET bytes.
void parse_snippet(char *out, size_t cap, const char *text, size_t len);
// A loc covering `first` through `last`.
Loc loc_span(Loc first, Loc last);

// --- the tree builders (grammar/parse.c), called from the grammar's actions ----------------

ExprVal expr_name(ParseState *ps, const char *name, Loc loc);
ExprVal expr_int(ParseState *ps, int64_t value, Loc loc);
ExprVal expr_real(ParseState *ps, double value, Loc loc);
ExprVal expr_string(ParseState *ps, const char *text, Loc loc);
ExprVal expr_call(ParseState *ps, const char *callee, Loc callee_loc, ArgList args, Loc loc);
ExprVal expr_list(ParseState *ps, ArgList items, Loc loc);
ExprVal expr_binary(ParseState *ps, char op, ExprVal lhs, ExprVal rhs, Loc loc);
ExprVal expr_neg(ParseState *ps, ExprVal operand, Loc loc);
ExprVal expr_annot(ParseState *ps, ExprVal operand, const char *name, Loc name_loc,
                   ArgList args, bool has_parens, Loc loc);
// Reports "expression too deeply nested" and stops the parse when `e` is too deep.
bool expr_too_deep(ParseState *ps, ExprVal e);

ArgList args_add(ParseState *ps, ArgList list, ArgVal arg);
AttrList attrs_add(ParseState *ps, AttrList list, TableAttr attr);

// Starts the model once its header is parsed; `name` is "" when it was missing.
void model_begin(ParseState *ps, const char *name, Loc name_loc, Loc loc);
// Appends a statement of `kind` to the model and returns it, zeroed but for kind and loc.
Stmt *stmt_add(ParseState *ps, StmtKind kind, Loc loc);

#endif
