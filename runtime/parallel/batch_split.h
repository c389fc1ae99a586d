// batch_split.h: how a global batch is shared among ranks. Each rank trains on one contiguous
// range of the global batch's examples; the ranges are cut so that their work is similar,
// where an example's work is 1 plus its positions over every jagged dim (its tokens). A
// jagged batch split by example counts alone would leave the rank with the long histories
// last to finish every step.
// defines: batch_split, batch_example_work
#ifndef GEMC_BATCH_SPLIT_H
#define GEMC_BATCH_SPLIT_H

#include <stdint.h>

#include "batch.h"

int64_t batch_example_work(const Batch *b, int64_t i);

// first[world + 1]: rank r trains on examples [first[r], first[r + 1]). Every rank gets at
// least one example when b->B >= world (the caller refuses a smaller batch).
void batch_split(const Batch *b, int world, int64_t *first);

#endif
