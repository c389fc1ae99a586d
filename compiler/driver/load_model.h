// load_model.h: one .gem file through the whole front end: front_end is the pipeline every
// command runs (parse, sema, the passes, autodiff when asked); load_model wraps it for the
// commands that run a model (`gemc train`, `gemc data`, `gemc emit`, ...).
// defines: FrontEnd, front_end, LoadedModel, load_model, loaded_model_free
#ifndef GEMC_LOAD_MODEL_H
#define GEMC_LOAD_MODEL_H

#include <stdbool.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"
#include "ir.h"

typedef struct Model Model;

// How far front_end goes and what it shows on the way.
typedef struct FrontEnd {
  const char *arch;        // --arch, or NULL for the model's own target
  bool parse_only;         // stop after parsing (--emit=ast)
  const char *dump_after;  // a pass name: print the IR after it to dump_out (NULL: none)
  FILE *dump_out;
  bool with_grad;          // append the backward graph (autodiff)
} FrontEnd;

// Parses src into *ast and (unless parse_only) lowers it into *ir (already ir_init'ed) and
// runs the passes and, when asked, autodiff. Diagnostics go to d. Returns false when an error
// was reported.
bool front_end(const SourceFile *src, Arena *arena, Diag *d, const FrontEnd *fe, Model **ast,
               Ir *ir);

typedef struct LoadedModel {
  SourceFile src;
  Arena arena;
  Ir ir;
} LoadedModel;

// Compiles `path` (with --arch `arch` when not NULL) into m->ir, appending the backward graph
// when `with_grad`. Diagnostics go to stderr (warnings dropped when `quiet`; with `werror`
// they fail the file). Returns false when the file has errors; call loaded_model_free either
// way.
bool load_model(LoadedModel *m, const char *path, const char *arch, bool with_grad, bool quiet,
                bool werror);
void loaded_model_free(LoadedModel *m);

#endif
