// batch.h: what a model reads per step. The schema lists the model's inputs as the data layer
// sees them; a batch holds one step's worth of them, jagged features as values plus offsets,
// never padded.
// defines: Feature, Schema, schema_from_ir, Batch, batch_alloc, batch_free, batch_validate,
//          batch_copy
#ifndef GEMC_BATCH_H
#define GEMC_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"

typedef enum FeatureKind {
  FEATURE_IDS,     // int64 ids: seq/multihot (jagged) or sparse (one per example)
  FEATURE_FLOATS,  // fp32 values: dense f32[k] (per example) or seq f32[k] (per position)
  FEATURE_LABEL,   // fp32 0/1, one per example
} FeatureKind;

typedef struct Feature {
  const char *name;    // the input's name in the .gem file
  int tensor;          // its IR tensor index
  FeatureKind kind;
  int jag;             // IR jagged dim index, or -1 for one value (or k values) per example
  bool owns_lengths;   // jagged and the sequence that owns the jagged dim (not `like`)
  int64_t width;       // values per example or per position: k for floats, 1 for ids/labels
  int64_t max_len;     // jagged: the dim's max length
  int64_t id_limit;    // ids: every id must be < id_limit (the fewest rows of the tables it
                       // is looked up in); 0 when it feeds no table
  const char *id_table;  // ids: the table with id_limit rows (for messages); NULL when none
} Feature;

typedef struct Schema {
  const Ir *ir;
  int64_t batch;       // B from the model
  Feature *features;   // in IR tensor order: inputs and labels
  int nfeatures;
  int njagged;         // == ir->njagged
} Schema;

// Builds the schema of a checked IR. Memory comes from ir->arena.
void schema_from_ir(const Ir *ir, Schema *out);
int schema_find(const Schema *s, const char *name);  // feature index or -1

// One step of data. offsets[j] has B+1 entries (offsets[j][0] == 0, non-decreasing,
// offsets[j][b+1] - offsets[j][b] <= max_len); total[j] == offsets[j][B].
// ids[f] / values[f] hold feature f: ids for FEATURE_IDS, values (fp32) otherwise.
// A jagged feature holds total[jag] * width entries, any other B * width.
typedef struct Batch {
  int64_t B;
  int njagged;
  int64_t **offsets;   // [njagged][B+1]
  int64_t *total;      // [njagged]
  int nfeatures;
  int64_t **ids;       // [nfeatures], NULL for float features
  float **values;      // [nfeatures], NULL for id features
  int64_t *capacity;   // [nfeatures] entries allocated (grows on demand)
} Batch;

// Allocates a batch for `s` with B examples (heap memory; batch_free releases it).
void batch_alloc(Batch *b, const Schema *s, int64_t B);
// Makes room for `n` entries of feature f (keeps the contents).
void batch_reserve(Batch *b, int f, int64_t n);
void batch_free(Batch *b);
// Checks every invariant above against the schema; on failure writes err and returns false.
// Messages name the example ("example 17: ...").
bool batch_validate(const Batch *b, const Schema *s, char *err, size_t err_size);
// The same, numbering the examples from `first` (example k of the batch is `first + k`), for
// callers that hold a window of a longer stream (a chunk of a data file).
bool batch_validate_from(const Batch *b, const Schema *s, int64_t first, char *err,
                         size_t err_size);
// Only the offsets and totals part of batch_validate_from (for a reader that checks the
// offsets before it trusts them to size the values).
bool batch_validate_offsets(const Batch *b, const Schema *s, int64_t first, char *err,
                            size_t err_size);

// Copies examples [src_first, src_first + n) of `src` to examples [dst_first, dst_first + n)
// of `dst` (both for the same schema). Examples [0, dst_first) of dst must be filled already:
// their offsets are where the copies go. Sets dst's offsets up to dst_first + n and its totals
// to offsets[j][dst_first + n], growing its buffers as needed.
void batch_copy(const Schema *s, Batch *dst, int64_t dst_first, const Batch *src,
                int64_t src_first, int64_t n);

// Describes a feature's type for messages: "ids, one per position of *history", "fp32[4] per
// example", "label"; `jag_name` names its jagged dim (unused when it has none).
void feature_describe(const Feature *f, const char *jag_name, char *buf, size_t size);

#endif
