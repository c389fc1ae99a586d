// gpu_tiles.h: builds an attention tile list (codegen/plan/plan.h TileList) for one batch, on the
// host, from the jagged offsets. Only valid tiles are made, never padding to the longest
// sequence: one tile per (example, row tile, head) for every example with at least one row
// (an example with rows but no keys still gets its tiles: its output rows are written as 0).
// Tiles are sorted by estimated work, largest first, and dealt to the SMs:
//   - a list for a grid of one CTA per tile (GRID_TILES) goes out back and forth (zigzag) in
//     waves of the SM count, so that the last wave is short;
//   - a persistent list (TileList.persistent, GRID_PERSISTENT: CTA c of G walks entries c,
//     c + G, c + 2G, ...) is dealt longest first to the least loaded CTA (LPT), at most twice
//     the even share of tiles per CTA; entry r*G + c is CTA c's r-th tile, and a CTA with fewer
//     tiles than the longest has holes (example -1) there, which the kernel skips.
// A tile is three int32: example, first row, head. gpu_tiles_spread measures a deal: the
// largest and smallest work one CTA of a persistent grid gets from it.
// defines: gpu_tiles_build, gpu_tiles_build_plain, gpu_tiles_work, gpu_tiles_tile_work,
//          gpu_tiles_spread, GPU_TILE_INTS
#ifndef GEMC_GPU_TILES_H
#define GEMC_GPU_TILES_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"

enum { GPU_TILE_INTS = 3 };

// Fills *out (malloc'd, GPU_TILE_INTS ints per tile; the caller frees it) and returns the
// number of entries, or -1 when out of memory. q_offsets / kv_offsets are [B+1] and may be NULL
// when the list's side is not jagged (its fixed count is used). num_sms <= 0 means no zigzag
// and, for a persistent list, no deal (the sorted tiles, no holes). A list that is not
// persistent never holds a hole; a persistent one's entries are its tiles and holes, up to its
// last tile.
int64_t gpu_tiles_build(const TileList *tl, int64_t B, const int64_t *q_offsets,
                        const int64_t *kv_offsets, int num_sms, int32_t **out);

// The same tiles in plain (example, row tile, head) order, neither sorted nor dealt: the
// baseline a deal is measured against (gpu_tiles_spread). Same contract as gpu_tiles_build.
int64_t gpu_tiles_build_plain(const TileList *tl, int64_t B, const int64_t *q_offsets,
                              const int64_t *kv_offsets, int32_t **out);

// The work of rows [i0, i1) of the list against the lk rows of the other side under the list's
// mask: visible pairs. Rows are queries, or keys on a key-side list (a dK/dV list), whose causal
// mask is counted from the keys' side (key k is seen by queries k..; rows and keys are then one
// sequence, so lk is also the list's row count).
int64_t gpu_tiles_work(const TileList *tl, int64_t i0, int64_t i1, int64_t lk);

// What gpu_tiles_build weighs the tile of rows [i0, min(i0 + tile_q, lq)) at, against lk rows
// of the other side:
//   - on a persistent list (the sm_90a kernels), what the kernel spends: it runs every streamed
//     tile of tile_kv rows in the range the tile's mask lets it see (the low end rounded down to
//     a tile), each a whole tile_q x tile_kv block of products, masked, partial or not, plus half
//     a block for the item's resident load and its store. So at Meta's s=0.5 a 10-row item
//     weighs what a full one does, where the pairs would weigh it 10/128 of one;
//   - on any other list (one block per tile, in the hardware's order), gpu_tiles_work + the
//     tile's rows (writing them).
int64_t gpu_tiles_tile_work(const TileList *tl, int64_t i0, int64_t lq, int64_t lk);

// The largest and the smallest work one CTA does when CTA c of a persistent grid takes entries
// c, c + G, c + 2G, ... of `tiles` (n entries, as gpu_tiles_build or gpu_tiles_build_plain
// wrote them for tl and the same offsets). A tile weighs gpu_tiles_tile_work; a hole weighs 0.
// G is min(ctas, n), the grid GRID_PERSISTENT launches; with no entries both loads are 0. False
// when out of memory.
bool gpu_tiles_spread(const TileList *tl, const int64_t *q_offsets, const int64_t *kv_offsets,
                      const int32_t *tiles, int64_t n, int ctas, int64_t *max_load,
                      int64_t *min_load);

#endif
