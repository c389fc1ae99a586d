// parse.h: the front door of the grammar: source text in, syntax tree out.
// defines: parse_model
#ifndef GEMC_PARSE_H
#define GEMC_PARSE_H

#include "arena.h"
#include "ast.h"
#include "diag.h"

// Parses one .gem file. Reports every lexical and syntax error it finds to `d` (recovering
// at ';' and '}'), and returns the model. Returns NULL only when not even a model header was
// found. The caller checks d->errors before using the tree.
Model *parse_model(const SourceFile *f, Arena *arena, Diag *d);

#endif
