// checkpoint.h: training state on disk, written atomically (temp file, fsync, rename, fsync of
// the directory) and refused with a clear error when corrupt, truncated, or made for another
// model or other shapes. docs/train.md describes the file format.
// defines: CkptEntry, CkptInfo, checkpoint_save, checkpoint_load, checkpoint_info,
//          CHECKPOINT_FILE
#ifndef GEMC_CHECKPOINT_H
#define GEMC_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir.h"

#define CHECKPOINT_FILE "checkpoint.gemc"  // the file inside the checkpoint directory

// One named blob of the training state: a parameter, a table, an optimizer moment, the RNG...
typedef struct CkptEntry {
  const char *name;
  void *data;
  size_t size;  // bytes
} CkptEntry;

// Writes DIR/checkpoint.gemc, creating DIR when it does not exist. `model_key` identifies the
// model and its shapes (a hash of the IR text); a load with another key is refused. `model`
// is the model's name, kept for error messages. On failure the previous checkpoint, if any, is
// left untouched and no temporary file remains.
bool checkpoint_save(const char *dir, const char *model, uint64_t model_key, int64_t step,
                     const CkptEntry *e, int n, char *err, size_t err_size);
// Reads DIR/checkpoint.gemc into the entries' buffers; every entry must be present with its
// exact size, and no other. Returns the step. Nothing is written to the buffers unless the
// whole file checks out.
bool checkpoint_load(const char *dir, uint64_t model_key, int64_t *step, const CkptEntry *e,
                     int n, char *err, size_t err_size);

// What a checkpoint holds, read and verified (magic, size, checksum) without loading it; the
// caller sizes variable-length entries (the loss history) from it.
typedef struct CkptInfo {
  char model[128];
  uint64_t model_key;
  int64_t step;
  int nentries;
  char **names;   // [nentries]
  size_t *sizes;  // [nentries]
} CkptInfo;
bool checkpoint_info(const char *dir, CkptInfo *info, char *err, size_t err_size);
void checkpoint_info_free(CkptInfo *info);
// The size of entry `name`, or -1 when the checkpoint has none.
int64_t checkpoint_info_size(const CkptInfo *info, const char *name);

#endif
