// checkpoint_set.h: the checkpoint of a distributed run: one shard file per rank and a
// manifest (docs/distributed.md, "Checkpoints"). Each rank writes its shard atomically
// (checkpoint_save_named); when every rank has, rank 0 writes the manifest, which makes the
// set valid, then removes what the set replaces. Shards carry their step and the save's id (a
// random number rank 0 draws for each save) in their names, so a save that stops halfway
// never mixes with the set before it, even at the same step.
// defines: CHECKPOINT_MANIFEST, CkptSet, checkpoint_shard_file, checkpoint_set_commit,
//          checkpoint_set_remove, checkpoint_set_find
#ifndef GEMC_CHECKPOINT_SET_H
#define GEMC_CHECKPOINT_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHECKPOINT_MANIFEST "manifest.gemc"

typedef struct CkptSet {
  int64_t step;
  uint64_t id;  // the save's
  int world;
} CkptSet;

// "shard-STEP-ID-R-of-N.gemc" (ID in 16 hex digits)
void checkpoint_shard_file(char *buf, size_t size, const CkptSet *set, int rank);
// The manifest of `set` (every shard must be there; their sizes are recorded), then the
// removal of DIR/checkpoint.gemc and of every other save's shards.
bool checkpoint_set_commit(const char *dir, const char *model, uint64_t model_key,
                           const CkptSet *set, char *err, size_t err_size);
// After a whole checkpoint was written: the set it replaces (manifest and shards) is removed.
void checkpoint_set_remove(const char *dir);
// What --resume DIR reads: 0 for DIR/checkpoint.gemc, 1 for a set (*set; every shard is there
// at its recorded size), the newer when both are there; -1 with a message when there is
// neither, or shards without a manifest, or a manifest whose shard is missing or truncated.
int checkpoint_set_find(const char *dir, CkptSet *set, char *err, size_t err_size);

#endif
