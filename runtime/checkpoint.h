// checkpoint.h: training state on disk, written atomically (temp file, fsync, rename, fsync of
// the directory) and refused with a clear error when corrupt, truncated, or made for another
// model or other shapes.
// defines: checkpoint_save, checkpoint_load
#ifndef GEMC_CHECKPOINT_H
#define GEMC_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir.h"

// One named blob of the training state: a parameter, a table, an optimizer moment, the RNG...
typedef struct CkptEntry {
  const char *name;
  void *data;
  size_t size;  // bytes
} CkptEntry;

// Writes DIR/checkpoint.gemc. `model_key` identifies the model and its shapes (a hash of the
// IR text); a load with another key is refused.
bool checkpoint_save(const char *dir, uint64_t model_key, int64_t step, const CkptEntry *e,
                     int n, char *err, size_t err_size);
// Reads DIR/checkpoint.gemc into the entries' buffers; every entry must be present with its
// exact size, and no other. Returns the step.
bool checkpoint_load(const char *dir, uint64_t model_key, int64_t *step, const CkptEntry *e,
                     int n, char *err, size_t err_size);

#endif
