// load_text.h: the unit tests' way to compile a model: from source text in the test (or from
// a file) through the front end and the passes, with its schema; a model that does not compile
// fails the test with its diagnostics. Header-only, included by one test file each.
// defines: Loaded, load, unload
#ifndef GEMC_TEST_LOAD_TEXT_H
#define GEMC_TEST_LOAD_TEXT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "batch.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"

typedef struct Loaded {
  Arena arena;
  SourceFile src;
  char *text;  // an owned copy of the source, or NULL when it came from a file
  Ir ir;
  Schema s;
} Loaded;

// Compiles a model from `text` (named `path` in messages), or from the file `path` when text
// is NULL.
static Loaded *load(const char *path, const char *text) {
  Loaded *m = calloc(1, sizeof *m);
  assert_non_null(m);
  if (text) {
    m->text = strdup(text);
    assert_non_null(m->text);
    source_from_memory(&m->src, path, m->text, strlen(m->text));
  } else {
    assert_true(source_read(&m->src, path));
  }
  char *diags = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&diags, &len);
  Diag d;
  diag_init(&d, &m->src, out);
  Model *model = parse_model(&m->src, &m->arena, &d);
  ir_init(&m->ir, &m->arena);
  bool ok = model && d.errors == 0 && sema_lower(model, NULL, &d, &m->ir) &&
            passes_run(&m->ir, &d, NULL, NULL);
  fclose(out);
  if (!ok) print_message("%s does not compile:\n%s\n%s", path, text ? text : "", diags);
  free(diags);
  assert_true(ok);
  schema_from_ir(&m->ir, &m->s);
  return m;
}

static void unload(Loaded *m) {
  if (m->text) free(m->text);
  else source_free(&m->src);
  arena_free(&m->arena);
  free(m);
}

#endif
