// gpu_stage.c: the staging layout of a batch and the staging itself (gpu_stage.h).
#include "gpu_stage.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "gpu_tiles.h"
#include "numerics.h"

static size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

int64_t gpu_dtype_bytes(DType t) {
  switch (t) {
  case DT_F32: return 4;
  case DT_BF16: case DT_FP16: case DT_FP8: case DT_MXFP8: return 2;
  case DT_F64: case DT_I64: return 8;
  case DT_COUNT: break;
  }
  return 4;
}

void gpu_tensor_shape(const Ir *ir, int ti, int64_t B, const int64_t *totals, int64_t *rows,
                      int64_t *width) {
  const Tensor *t = &ir->tensors[ti];
  *width = t->width > 0 ? t->width : 1;
  switch (t->layout) {
  case LAYOUT_DENSE: *rows = B; return;
  case LAYOUT_SET: *rows = B * t->set_k; return;
  case LAYOUT_JAGGED: *rows = totals[t->jag]; return;
  case LAYOUT_FIXED:
    *rows = t->nfixed == 2 ? t->fixed[0] : 1;
    *width = t->nfixed == 2 ? t->fixed[1] : t->fixed[0];
    return;
  case LAYOUT_SCALAR: *rows = 1, *width = 1; return;
  case LAYOUT_ROWS: {
    // Umax: the id occurrences of the table_grad node that writes it.
    const Node *n = t->producer >= 0 ? &ir->nodes[t->producer] : NULL;
    int64_t umax = 0;
    for (int i = 1; n && i + 1 < n->nins; i += 2) {
      int64_t r, w;
      gpu_tensor_shape(ir, n->ins[i], B, totals, &r, &w);
      umax += r * w;
    }
    *rows = umax;
    return;
  }
  }
}

// Two tile lists with equal specs hold the same tiles for every batch. Only a causal mask
// weighs a tile differently from the keys' side (a window alone, |i - k| < w, is symmetric), so
// a self-attention's query and key lists of one tile size are one list unless it is causal.
static bool same_tile_spec(const TileList *a, const TileList *b) {
  bool masked = a->causal;
  return a->q_jag == b->q_jag && a->kv_jag == b->kv_jag && a->q_fixed == b->q_fixed &&
         a->kv_fixed == b->kv_fixed && a->tile_q == b->tile_q && a->tile_kv == b->tile_kv &&
         a->heads == b->heads && a->causal == b->causal && a->window == b->window &&
         a->zigzag == b->zigzag && a->persistent == b->persistent &&
         (!masked || a->key_side == b->key_side);
}

bool staging_layout_init(StagingLayout *l, const Plan *p, int64_t max_batch, int num_sms,
                         char *err, size_t err_size) {
  const Ir *ir = p->ir;
  memset(l, 0, sizeof *l);
  if (ir->njagged > GPU_MAX_JAGGED)
    return fail(err, err_size, "the model has %d jagged dims; the GPU executor handles %d",
                ir->njagged, GPU_MAX_JAGGED);
  l->p = p;
  l->ir = ir;
  l->max_batch = max_batch;
  l->num_sms = num_sms;
  schema_from_ir(ir, &l->schema);
  l->feature_of = xcalloc((size_t)ir->ntensors + 1, sizeof *l->feature_of);
  for (int t = 0; t < ir->ntensors; t++) l->feature_of[t] = -1;
  l->feature_offset = xcalloc((size_t)l->schema.nfeatures + 1, sizeof *l->feature_offset);
  l->offsets_offset = xcalloc((size_t)ir->njagged + 1, sizeof *l->offsets_offset);
  int64_t totals[GPU_MAX_JAGGED];
  for (int j = 0; j < ir->njagged; j++) totals[j] = max_batch * ir->jagged[j].max_len;
  size_t at = 0;
  for (int j = 0; j < ir->njagged; j++) {
    l->offsets_offset[j] = at;
    at = align_up(at + (size_t)(max_batch + 1) * 8);
  }
  for (int f = 0; f < l->schema.nfeatures; f++) {
    int t = l->schema.features[f].tensor;
    l->feature_of[t] = f;
    l->feature_offset[f] = at;
    int64_t rows, width;
    gpu_tensor_shape(ir, t, max_batch, totals, &rows, &width);
    at = align_up(at + (size_t)(rows * width * gpu_dtype_bytes(ir->tensors[t].dtype)));
  }
  l->bytes = at;
  l->tile_alias = xcalloc((size_t)p->ntiles + 1, sizeof *l->tile_alias);
  for (int t = 0; t < p->ntiles; t++) {
    l->tile_alias[t] = t;
    for (int u = 0; u < t; u++)
      if (l->tile_alias[u] == u && same_tile_spec(&p->tiles[u], &p->tiles[t])) {
        l->tile_alias[t] = u;
        break;
      }
  }
  return true;
}

void staging_layout_free(StagingLayout *l) {
  free(l->feature_of);
  free(l->feature_offset);
  free(l->offsets_offset);
  free(l->tile_alias);
  memset(l, 0, sizeof *l);
}

void gpu_staged_free(GpuStaged *st) {
  free(st->image);
  free(st->tiles);
  free(st->tile_count);
  free(st->tile_offset);
  memset(st, 0, sizeof *st);
}

void gpu_encode_values(void *dst, const float *src, int64_t n, DType dt) {
  if (dt == DT_F32) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
  uint16_t *h = dst;
  for (int64_t i = 0; i < n; i++)
    h[i] = dt == DT_FP16 ? fp16_encode(src[i]) : bf16_encode(src[i]);
}

// Builds each distinct tile list once into st->tiles; an alias points at its class's list.
static bool stage_tiles(const StagingLayout *l, const Batch *b, GpuStaged *st, char *err,
                        size_t err_size) {
  const Plan *p = l->p;
  if (st->ntiles < p->ntiles) {
    free(st->tile_count);
    free(st->tile_offset);
    st->tile_count = xcalloc((size_t)p->ntiles, sizeof *st->tile_count);
    st->tile_offset = xcalloc((size_t)p->ntiles, sizeof *st->tile_offset);
    st->ntiles = p->ntiles;
  }
  int64_t used = 0;
  for (int t = 0; t < p->ntiles; t++) {
    int a = l->tile_alias[t];
    if (a != t) {
      st->tile_count[t] = st->tile_count[a];
      st->tile_offset[t] = st->tile_offset[a];
      continue;
    }
    const TileList *tl = &p->tiles[t];
    int32_t *words = NULL;
    int64_t n = gpu_tiles_build(tl, b->B, tl->q_jag >= 0 ? b->offsets[tl->q_jag] : NULL,
                                tl->kv_jag >= 0 ? b->offsets[tl->kv_jag] : NULL,
                                tl->zigzag ? l->num_sms : 0, &words);
    if (n < 0) return fail(err, err_size, "out of memory building attention tiles");
    int64_t need = used + n * GPU_TILE_INTS;
    if (need > st->tile_cap) {
      int64_t cap = st->tile_cap ? st->tile_cap : 1 << 16;
      while (cap < need) cap *= 2;
      st->tiles = xrealloc(st->tiles, (size_t)cap * 4);
      st->tile_cap = cap;
    }
    if (n > 0) memcpy(st->tiles + used, words, (size_t)(n * GPU_TILE_INTS) * 4);
    free(words);
    st->tile_count[t] = n;
    st->tile_offset[t] = (size_t)used;
    used = (need + 63) / 64 * 64;
  }
  st->tile_words = used;
  return true;
}

bool gpu_stage_batch(const StagingLayout *l, const Batch *b, GpuStaged *st, char *err,
                     size_t err_size) {
  const Ir *ir = l->ir;
  if (b->B > l->max_batch)
    return fail(err, err_size, "a batch of %" PRId64 " examples; the GPU executor was set up "
                "for at most %" PRId64, b->B, l->max_batch);
  for (int j = 0; j < ir->njagged; j++)
    if (b->offsets[j][b->B] > b->B * ir->jagged[j].max_len)
      return fail(err, err_size, "jagged dim %s: total %" PRId64 " exceeds B x max length",
                  ir->jagged[j].name, b->offsets[j][b->B]);
  if (st->image_cap < l->bytes) {
    free(st->image);
    st->image = xcalloc(l->bytes ? l->bytes : 1, 1);  // the gaps between regions: zeros
    st->image_cap = l->bytes;
  }
  st->B = b->B;
  size_t upto = 0;
  for (int j = 0; j < ir->njagged; j++) {
    st->totals[j] = b->offsets[j][b->B];
    size_t n = (size_t)(b->B + 1) * 8;
    memcpy(st->image + l->offsets_offset[j], b->offsets[j], n);
    if (l->offsets_offset[j] + n > upto) upto = l->offsets_offset[j] + n;
  }
  for (int f = 0; f < l->schema.nfeatures; f++) {
    const Feature *ft = &l->schema.features[f];
    int t = ft->tensor;
    int64_t rows, width;
    gpu_tensor_shape(ir, t, b->B, st->totals, &rows, &width);
    void *dst = st->image + l->feature_offset[f];
    DType dt = ir->tensors[t].dtype;
    if (ft->kind == FEATURE_IDS)
      memcpy(dst, b->ids[f], (size_t)(rows * width) * 8);
    else
      gpu_encode_values(dst, b->values[f], rows * width, dt);
    size_t end = l->feature_offset[f] + (size_t)(rows * width * gpu_dtype_bytes(dt));
    if (end > upto) upto = end;
  }
  st->used = upto;
  return l->p->ntiles == 0 || stage_tiles(l, b, st, err, err_size);
}
