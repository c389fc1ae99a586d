// gpu_stage.h: a batch made ready for upload. Staging encodes a batch's inputs and jagged
// offsets in the layout of a GPU staging slot (bf16/fp16 values, int64 ids and offsets, each
// region 256-byte aligned) and deals its attention tile lists (gpu_tiles.h). It reads only the
// plan and the layout, never the executor's state, so a producer thread can stage batch k+1
// while the GPU runs batch k (runtime/train/batch_pipeline.h); gpu_exec_set_staged then only
// copies the result into pinned memory and enqueues the upload.
//
// Tile lists whose specs are equal (same jagged dims, tiles, heads, mask and deal; only the IR
// node differs, as for hstu's six identical layers and their backward) are built once and
// shared: StagingLayout.tile_alias names the first list of each class.
// defines: StagingLayout, staging_layout_init, staging_layout_free, GpuStaged, gpu_stage_batch,
//          gpu_staged_free, gpu_tensor_shape, gpu_encode_values, gpu_dtype_bytes
#ifndef GEMC_GPU_STAGE_H
#define GEMC_GPU_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "plan.h"

enum { GPU_MAX_JAGGED = 64 };

typedef struct StagingLayout {
  const Plan *p;
  const Ir *ir;
  Schema schema;
  int64_t max_batch;
  int num_sms;               // the SMs tile lists are dealt to (0: no zigzag deal)
  int *feature_of;           // [ntensors]: the schema feature a tensor is, or -1
  size_t *feature_offset;    // [nfeatures]: byte offset of each feature in a slot
  size_t *offsets_offset;    // [njagged]: byte offset of each jagged dim's offsets
  size_t bytes;              // a whole slot, at the largest batch
  int *tile_alias;           // [ntiles]: the first tile list with the same spec
} StagingLayout;

// Lays out a slot for batches of up to max_batch examples. False (with a message) when the
// model has more jagged dims than GPU_MAX_JAGGED.
bool staging_layout_init(StagingLayout *l, const Plan *p, int64_t max_batch, int num_sms,
                         char *err, size_t err_size);
void staging_layout_free(StagingLayout *l);

// A staged batch. Its buffers grow on demand and are kept for the next batch.
typedef struct GpuStaged {
  int64_t B;
  int64_t totals[GPU_MAX_JAGGED];
  unsigned char *image;      // the slot's bytes [0, used)
  size_t used, image_cap;
  int32_t *tiles;            // every distinct tile list, 64-word aligned, back to back
  int64_t tile_words, tile_cap;
  int64_t *tile_count;       // [ntiles]: entries of each list (aliases repeat their class's)
  size_t *tile_offset;       // [ntiles]: word offset of each list in `tiles`
  int ntiles;
} GpuStaged;

// Stages batch b. False with a message when it does not fit the layout (more examples than
// max_batch, a jagged total past B x max length) or memory runs out. Thread-safe for distinct
// GpuStaged objects.
bool gpu_stage_batch(const StagingLayout *l, const Batch *b, GpuStaged *st, char *err,
                     size_t err_size);
void gpu_staged_free(GpuStaged *st);

// Rows and width of tensor t for a batch (a ROWS tensor: the most rows it can have).
void gpu_tensor_shape(const Ir *ir, int t, int64_t B, const int64_t *totals, int64_t *rows,
                      int64_t *width);

// Encodes n fp32 values as a tensor of dtype dt is stored: fp32 as is, fp16, else bf16.
void gpu_encode_values(void *dst, const float *src, int64_t n, DType dt);

// Bytes of one stored element of dtype t (fp8 and mxfp8 are stored as bf16).
int64_t gpu_dtype_bytes(DType t);

#endif
