// batch_pipeline.h: a producer thread that makes the training batches ahead of the step. For
// each cursor c, c + B, c + 2B, ... of the training stream it fills a Batch (synthetic data or
// a data file) and stages it for the GPU (gpu_stage.h: inputs encoded, tile lists dealt), into
// a ring of a few items. The trainer's thread then only takes the item of the cursor it needs,
// copies it into a pinned slot and launches: making and staging the batch leave the step's
// critical path (docs/perf.md, "The host off the critical path").
//
// The stream is a pure function of the cursor, so asking for a cursor other than the next one
// (after an evaluation, a resume, a skipped step) drops what was made and starts again there:
// every batch the trainer gets is the one it would have made itself.
// defines: BatchPipeline, PipelineItem, PipelineProduce, pipeline_new, pipeline_take,
//          pipeline_release, pipeline_pause, pipeline_resume, pipeline_reset,
//          pipeline_free
#ifndef GEMC_BATCH_PIPELINE_H
#define GEMC_BATCH_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "batch.h"
#include "gpu_stage.h"

typedef struct PipelineItem {
  int64_t cursor;
  Batch batch;
  GpuStaged staged;
  bool ok;                // false: err says why (a data file that failed to read, say)
  char err[512];
  double make_s, stage_s; // the producer's time on it: the batch, then its staging
  // The ring's bookkeeping (batch_pipeline.c).
  int state;
  uint64_t generation;
} PipelineItem;

// Makes the batch of `cursor` into b and stages it into st. Runs on the producer thread; it
// must not touch what the trainer's thread uses meanwhile.
typedef bool (*PipelineProduce)(void *ctx, int64_t cursor, Batch *b, GpuStaged *st,
                                double *make_s, double *stage_s, char *err, size_t err_size);

typedef struct BatchPipeline BatchPipeline;

// depth items, each with a batch of B examples for schema s. The producer starts idle: the
// first pipeline_take says where the stream begins. NULL when the thread cannot start.
BatchPipeline *pipeline_new(int depth, const Schema *s, int64_t B, int64_t stride,
                            PipelineProduce produce, void *ctx);

// The item of `cursor`, waiting for it; `wait_s` gets the time waited. The trainer may swap
// the item's batch with its own (same schema and B) before releasing it.
PipelineItem *pipeline_take(BatchPipeline *p, int64_t cursor, double *wait_s);
void pipeline_release(BatchPipeline *p, PipelineItem *it);

// pause: returns once the producer is idle, and keeps it so (the trainer may then use the
// data source itself, as the evaluation does); resume lets it go on.
void pipeline_pause(BatchPipeline *p);
void pipeline_resume(BatchPipeline *p);
// Drops every batch made so far (the data source changed: a resume with another seed); the
// next take starts the stream again.
void pipeline_reset(BatchPipeline *p);

void pipeline_free(BatchPipeline *p);

#endif
