// load_model.h: one .gem file through the whole front end, for the commands that run a model
// (`gemc train`, `gemc data`): parse, sema, the passes, and autodiff when asked.
// defines: LoadedModel, load_model, loaded_model_free
#ifndef GEMC_LOAD_MODEL_H
#define GEMC_LOAD_MODEL_H

#include <stdbool.h>

#include "arena.h"
#include "diag.h"
#include "ir.h"

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
