// gpu_tiles.c: attention tile lists, per batch (gpu_tiles.h).
#include "gpu_tiles.h"

#include <stdlib.h>

int64_t gpu_tiles_work(const TileList *tl, int64_t i0, int64_t i1, int64_t lk) {
  int64_t work = 0;
  for (int64_t i = i0; i < i1; i++) {
    int64_t lo = 0, hi = lk;
    if (tl->causal && i + 1 < hi) hi = i + 1;
    if (tl->window > 0) {
      if (i - tl->window + 1 > lo) lo = i - tl->window + 1;
      if (!tl->causal && i + tl->window < hi) hi = i + tl->window;
    }
    if (hi > lo) work += hi - lo;
  }
  return work;
}

typedef struct TileWork {
  int64_t work, index;
  int32_t b, row0, head;
} TileWork;

static int by_work_then_index(const void *x, const void *y) {
  const TileWork *a = x, *b = y;
  if (a->work != b->work) return a->work > b->work ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

int64_t gpu_tiles_build(const TileList *tl, int64_t B, const int64_t *q_offsets,
                        const int64_t *kv_offsets, int num_sms, int32_t **out) {
  const int64_t tile = tl->tile_q > 0 ? tl->tile_q : 64;
  const int64_t heads = tl->heads > 0 ? tl->heads : 1;
  int64_t count = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t lq = q_offsets ? q_offsets[b + 1] - q_offsets[b] : tl->q_fixed;
    count += (lq + tile - 1) / tile * heads;
  }
  *out = malloc((size_t)(count > 0 ? count : 1) * GPU_TILE_INTS * sizeof(int32_t));
  TileWork *w = malloc((size_t)(count > 0 ? count : 1) * sizeof *w);
  if (!*out || !w) {
    free(*out), free(w);
    *out = NULL;
    return -1;
  }
  int64_t n = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t lq = q_offsets ? q_offsets[b + 1] - q_offsets[b] : tl->q_fixed;
    int64_t lk = kv_offsets ? kv_offsets[b + 1] - kv_offsets[b] : tl->kv_fixed;
    for (int64_t i0 = 0; i0 < lq; i0 += tile) {
      int64_t i1 = i0 + tile < lq ? i0 + tile : lq;
      int64_t work = gpu_tiles_work(tl, i0, i1, lk) + (i1 - i0);  // + rows: writing them
      for (int64_t h = 0; h < heads; h++) {
        w[n] = (TileWork){work, n, (int32_t)b, (int32_t)i0, (int32_t)h};
        n++;
      }
    }
  }
  qsort(w, (size_t)n, sizeof *w, by_work_then_index);
  // Deal: wave r of num_sms tiles goes out left to right when r is even, right to left when
  // odd, so the SM that took the biggest tile of one wave takes the smallest of the next.
  int64_t wave = tl->zigzag && num_sms > 0 ? num_sms : n;
  for (int64_t start = 0, r = 0; start < n; start += wave, r++) {
    int64_t end = start + wave < n ? start + wave : n;
    for (int64_t i = start; i < end; i++) {
      const TileWork *t = &w[(r & 1) ? end - 1 - (i - start) : i];
      (*out)[GPU_TILE_INTS * i + 0] = t->b;
      (*out)[GPU_TILE_INTS * i + 1] = t->row0;
      (*out)[GPU_TILE_INTS * i + 2] = t->head;
    }
  }
  free(w);
  return n;
}
