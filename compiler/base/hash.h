// hash.h: FNV-1a 64, the one hash gemc uses for content keys: checkpoint integrity, the model
// key of checkpoints and artifacts, and the JIT cache's file names.
// defines: fnv1a64, FNV1A64_INIT
#ifndef GEMC_HASH_H
#define GEMC_HASH_H

#include <stddef.h>
#include <stdint.h>

#define FNV1A64_INIT 0xcbf29ce484222325ull

// FNV-1a 64 over `n` bytes, continuing from `h` (start with FNV1A64_INIT).
uint64_t fnv1a64(uint64_t h, const void *data, size_t n);

#endif
