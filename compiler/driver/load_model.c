// load_model.c: the front end in one call for the commands that run a model. It is the same
// pipeline `gemc check` runs (parse, sema, passes), followed by autodiff for training.
#include "load_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ast.h"       // defines: Model
#include "autodiff.h"  // defines: autodiff
#include "parse.h"     // defines: parse_model
#include "passes.h"    // defines: passes_run
#include "sema.h"      // defines: sema_lower

bool front_end(const SourceFile *src, Arena *arena, Diag *d, const FrontEnd *fe, Model **ast,
               Ir *ir) {
  *ast = parse_model(src, arena, d);
  if (!*ast || d->errors > 0) return false;
  if (fe->parse_only) return true;
  if (!sema_lower(*ast, fe->arch, d, ir) || d->errors > 0) return false;
  if (!passes_run(ir, d, fe->dump_after, fe->dump_after ? fe->dump_out : NULL) || d->errors > 0)
    return false;
  return !fe->with_grad || (autodiff(ir, d) && d->errors == 0);
}

bool load_model(LoadedModel *m, const char *path, const char *arch, bool with_grad, bool quiet,
                bool werror) {
  memset(m, 0, sizeof *m);
  if (!source_read(&m->src, path)) return false;
  Diag d;
  diag_init(&d, &m->src, stderr);
  d.quiet = quiet;
  d.warnings_are_errors = werror;

  ir_init(&m->ir, &m->arena);
  Model *ast = NULL;
  FrontEnd fe = {.arch = arch};
  bool ok = front_end(&m->src, &m->arena, &d, &fe, &ast, &m->ir);
  if (ok && with_grad && m->ir.loss < 0) {
    fprintf(stderr, "gemc: error: %s: model %s has no loss, so there is nothing to train\n",
            path, m->ir.model);
    ok = false;
  }
  ok = ok && (!with_grad || autodiff(&m->ir, &d)) && d.errors == 0;
  // Test hook: the plan of a GPU rank of several (table updates after a merge), for `gemc
  // emit` and the codegen tests; the trainer sets it itself for such ranks.
  const char *defer = getenv("GEMC_TEST_DEFER_TABLES");
  m->ir.defer_table_updates = with_grad && defer && strcmp(defer, "1") == 0;
  return ok && !(werror && d.warnings > 0);
}

void loaded_model_free(LoadedModel *m) {
  arena_free(&m->arena);
  if (m->src.text) source_free(&m->src);
  memset(m, 0, sizeof *m);
}
