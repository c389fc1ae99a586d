// gpu_tiles.h: builds an attention tile list (codegen/plan/plan.h TileList) for one batch, on the
// host, from the jagged offsets. Only valid tiles are made, never padding to the longest
// sequence: one tile per (example, row tile, head) for every example with at least one row
// (an example with rows but no keys still gets its tiles: its output rows are written as 0).
// Tiles are sorted by estimated work, largest first, and dealt to the SMs back and forth
// (zigzag) so that the last wave is short. A tile is three int32: example, first row, head.
// defines: gpu_tiles_build, GPU_TILE_INTS
#ifndef GEMC_GPU_TILES_H
#define GEMC_GPU_TILES_H

#include <stdint.h>

#include "plan.h"

enum { GPU_TILE_INTS = 3 };

// Fills *out (malloc'd, GPU_TILE_INTS ints per tile; the caller frees it) and returns the
// number of tiles, or -1 when out of memory. q_offsets / kv_offsets are [B+1] and may be NULL
// when the list's side is not jagged (its fixed count is used). num_sms <= 0 means no zigzag.
int64_t gpu_tiles_build(const TileList *tl, int64_t B, const int64_t *q_offsets,
                        const int64_t *kv_offsets, int num_sms, int32_t **out);

// The work of query rows [i0, i1) against lk keys under the list's mask: visible pairs.
int64_t gpu_tiles_work(const TileList *tl, int64_t i0, int64_t i1, int64_t lk);

#endif
