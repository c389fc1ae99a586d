// checkpoint.h: training state on disk, written atomically (temp file, fsync, rename, fsync of
// the directory) and refused with a clear error when corrupt, truncated, or made for another
// model or other shapes. docs/train.md describes the file format.
// defines: CkptEntry, CkptCheck, CkptInfo, CkptFile, checkpoint_save, checkpoint_open,
//          checkpoint_read, checkpoint_close, checkpoint_load, checkpoint_info,
//          checkpoint_save_named, checkpoint_open_named,
//          CHECKPOINT_FILE, CHECKPOINT_LOCK
#ifndef GEMC_CHECKPOINT_H
#define GEMC_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir.h"

#define CHECKPOINT_FILE "checkpoint.gemc"  // the file inside the checkpoint directory
#define CHECKPOINT_LOCK "checkpoint.lock"  // flock'ed by the training that saves there

// What loading checks in an entry's data before any of it reaches the caller: nothing, or
// that it is an array of finite fp32 values (parameters, moments), or of finite values >= 0
// (AdamW's v, Adagrad's row sums).
typedef enum CkptCheck { CKPT_ANY, CKPT_FINITE, CKPT_FINITE_NONNEG } CkptCheck;

// One named blob of the training state: a parameter, a table, an optimizer moment, the RNG...
typedef struct CkptEntry {
  const char *name;
  void *data;
  size_t size;  // bytes
  CkptCheck check;
} CkptEntry;

// Writes DIR/checkpoint.gemc, creating DIR when it does not exist. `model_key` identifies the
// model and its shapes (a hash of the IR text); a load with another key is refused. `model`
// is the model's name, kept for error messages. On failure the previous checkpoint, if any, is
// left untouched and no temporary file remains.
bool checkpoint_save(const char *dir, const char *model, uint64_t model_key, int64_t step,
                     const CkptEntry *e, int n, char *err, size_t err_size);
// The same for DIR/FILE (the shards and the manifest of a distributed checkpoint,
// checkpoint_set.h).
bool checkpoint_save_named(const char *dir, const char *file, const char *model,
                           uint64_t model_key, int64_t step, const CkptEntry *e, int n,
                           char *err, size_t err_size);
// Reads DIR/checkpoint.gemc into the entries' buffers; every entry must be present with its
// exact size, and no other. Returns the step. Nothing is written to the buffers unless the
// whole file checks out (its checksum, its directory, each entry's CkptCheck).
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

// The same in two halves on one open file, for a caller that sizes its buffers from the info
// first: a save that renames a new checkpoint in meanwhile does not change what is read.
// checkpoint_open verifies the file (magic, version, size, checksum, directory, a step the
// file can hold) and fills `info` (may be NULL); checkpoint_read checks the model key, the
// entries and their CkptChecks, then fills the buffers.
typedef struct CkptFile CkptFile;
CkptFile *checkpoint_open(const char *dir, CkptInfo *info, char *err, size_t err_size);
CkptFile *checkpoint_open_named(const char *dir, const char *file, CkptInfo *info, char *err,
                                size_t err_size);
// An entry with data NULL is checked (present, its size, its CkptCheck) but not read.
bool checkpoint_read(CkptFile *f, uint64_t model_key, const CkptEntry *e, int n, char *err,
                     size_t err_size);
// Bytes [offset, offset + size) of one entry (a rank's rows of a table held whole in the file).
bool checkpoint_read_slice(CkptFile *f, const char *name, uint64_t offset, void *data,
                           size_t size, char *err, size_t err_size);
// One entry alone, of exactly `size` bytes (to validate small fields before checkpoint_read).
bool checkpoint_read_entry(CkptFile *f, const char *name, void *data, size_t size, char *err,
                           size_t err_size);
const char *checkpoint_path(const CkptFile *f);  // DIR/checkpoint.gemc
void checkpoint_close(CkptFile *f);              // NULL is fine
void checkpoint_info_free(CkptInfo *info);
// The size of entry `name`, or -1 when the checkpoint has none.
int64_t checkpoint_info_size(const CkptInfo *info, const char *name);

#endif
