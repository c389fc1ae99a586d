// batch.c: the schema of a model's inputs, and the batches that carry them: allocation,
// copying examples between batches, and the validation every reader of data relies on.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "checked.h"
#include "internal_error.h"

// --- the schema ---------------------------------------------------------------------------

// The fewest rows among the tables that tensor `t` is looked up in (embed and embed_pool
// take the table first and the ids second); 0 when it feeds none.
static int64_t id_limit_of(const Ir *ir, int t, const char **table) {
  int64_t limit = 0;
  *table = NULL;
  for (int i = 0; i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    if ((n->op != OP_EMBED && n->op != OP_EMBED_POOL) || n->nins < 2 || n->ins[1] != t) continue;
    const Tensor *tab = &ir->tensors[n->ins[0]];
    if (limit == 0 || tab->fixed[0] < limit) {
      limit = tab->fixed[0];
      *table = tab->name;
    }
  }
  return limit;
}

void schema_from_ir(const Ir *ir, Schema *out) {
  memset(out, 0, sizeof *out);
  out->ir = ir;
  out->batch = ir->batch;
  out->njagged = ir->njagged;
  int n = 0;
  for (int t = 0; t < ir->ntensors; t++)
    if (ir->tensors[t].kind == TENSOR_INPUT || ir->tensors[t].kind == TENSOR_LABEL) n++;
  out->features = arena_alloc(ir->arena, (size_t)(n ? n : 1) * sizeof *out->features);
  for (int t = 0; t < ir->ntensors; t++) {
    const Tensor *x = &ir->tensors[t];
    if (x->kind != TENSOR_INPUT && x->kind != TENSOR_LABEL) continue;
    Feature *f = &out->features[out->nfeatures++];
    f->name = x->name;
    f->tensor = t;
    if (x->kind == TENSOR_LABEL) f->kind = FEATURE_LABEL;
    else if (x->dtype == DT_I64) f->kind = FEATURE_IDS;
    else f->kind = FEATURE_FLOATS;
    f->jag = x->layout == LAYOUT_JAGGED ? x->jag : -1;
    f->owns_lengths = f->jag >= 0 && strcmp(ir->jagged[f->jag].name, x->name) == 0;
    f->width = f->kind == FEATURE_FLOATS && x->width > 0 ? x->width : 1;
    f->max_len = f->jag >= 0 ? ir->jagged[f->jag].max_len : 0;
    f->id_limit = f->kind == FEATURE_IDS ? id_limit_of(ir, t, &f->id_table) : 0;
  }
}

int schema_find(const Schema *s, const char *name) {
  for (int i = 0; i < s->nfeatures; i++)
    if (strcmp(s->features[i].name, name) == 0) return i;
  return -1;
}

void feature_describe(const Feature *f, const char *jag_name, char *buf, size_t size) {
  const char *per = f->jag >= 0 ? "per position of *" : "per example";
  const char *jag = f->jag >= 0 ? jag_name : "";
  switch (f->kind) {
  case FEATURE_LABEL: snprintf(buf, size, "label"); break;
  case FEATURE_IDS: snprintf(buf, size, "ids, one %s%s", per, jag); break;
  case FEATURE_FLOATS: snprintf(buf, size, "fp32[%" PRId64 "] %s%s", f->width, per, jag); break;
  }
}

// --- allocation ---------------------------------------------------------------------------

// Entries a feature needs for `total` positions (jagged) or B examples.
static int64_t entries_for(const Feature *f, int64_t B, const int64_t *total) {
  return (f->jag >= 0 ? total[f->jag] : B) * f->width;
}

void batch_alloc(Batch *b, const Schema *s, int64_t B) {
  GEMC_ASSERT(B >= 0);
  memset(b, 0, sizeof *b);
  b->B = B;
  b->njagged = s->njagged;
  b->nfeatures = s->nfeatures;
  b->offsets = xcalloc((size_t)(s->njagged ? s->njagged : 1), sizeof *b->offsets);
  b->total = xcalloc((size_t)(s->njagged ? s->njagged : 1), sizeof *b->total);
  for (int j = 0; j < s->njagged; j++) b->offsets[j] = xcalloc((size_t)B + 1, sizeof(int64_t));
  b->ids = xcalloc((size_t)(s->nfeatures ? s->nfeatures : 1), sizeof *b->ids);
  b->values = xcalloc((size_t)(s->nfeatures ? s->nfeatures : 1), sizeof *b->values);
  b->capacity = xcalloc((size_t)(s->nfeatures ? s->nfeatures : 1), sizeof *b->capacity);
  for (int i = 0; i < s->nfeatures; i++) {
    const Feature *f = &s->features[i];
    // Jagged features start with room for 16 positions per example and grow on demand.
    int64_t per_example = f->jag >= 0 ? (f->max_len < 16 ? f->max_len : 16) : 1;
    int64_t n = B * f->width * (per_example > 0 ? per_example : 1);
    b->capacity[i] = n > 0 ? n : 1;
    if (f->kind == FEATURE_IDS) b->ids[i] = xcalloc((size_t)b->capacity[i], sizeof(int64_t));
    else b->values[i] = xcalloc((size_t)b->capacity[i], sizeof(float));
  }
}

void batch_reserve(Batch *b, int f, int64_t n) {
  GEMC_ASSERT(f >= 0 && f < b->nfeatures && n >= 0);
  if (n <= b->capacity[f]) return;
  int64_t cap = b->capacity[f] * 2;
  if (cap < n) cap = n;
  if (b->ids[f]) {
    int64_t *p = xrealloc(b->ids[f], (size_t)cap * sizeof *p);
    b->ids[f] = p;
  } else {
    float *p = xrealloc(b->values[f], (size_t)cap * sizeof *p);
    b->values[f] = p;
  }
  b->capacity[f] = cap;
}

void batch_free(Batch *b) {
  if (b->offsets)
    for (int j = 0; j < b->njagged; j++) free(b->offsets[j]);
  if (b->ids)
    for (int i = 0; i < b->nfeatures; i++) free(b->ids[i]);
  if (b->values)
    for (int i = 0; i < b->nfeatures; i++) free(b->values[i]);
  free(b->offsets);
  free(b->total);
  free(b->ids);
  free(b->values);
  free(b->capacity);
  memset(b, 0, sizeof *b);
}

// --- copying ------------------------------------------------------------------------------

void batch_copy(const Schema *s, Batch *dst, int64_t dst_first, const Batch *src,
                int64_t src_first, int64_t n) {
  GEMC_ASSERT(dst->njagged == s->njagged && src->njagged == s->njagged);
  GEMC_ASSERT(dst->nfeatures == s->nfeatures && src->nfeatures == s->nfeatures);
  GEMC_ASSERT(n >= 0 && dst_first >= 0 && dst_first + n <= dst->B);
  GEMC_ASSERT(src_first >= 0 && src_first + n <= src->B);
  for (int j = 0; j < s->njagged; j++) {
    const int64_t *from = src->offsets[j];
    int64_t *to = dst->offsets[j];
    for (int64_t k = 1; k <= n; k++)
      to[dst_first + k] = to[dst_first] + from[src_first + k] - from[src_first];
    dst->total[j] = to[dst_first + n];
  }
  for (int i = 0; i < s->nfeatures; i++) {
    const Feature *f = &s->features[i];
    // The range of entries to copy: positions for a jagged feature, examples otherwise.
    int64_t from, to, count;
    if (f->jag >= 0) {
      from = src->offsets[f->jag][src_first];
      to = dst->offsets[f->jag][dst_first];
      count = src->offsets[f->jag][src_first + n] - from;
    } else {
      from = src_first;
      to = dst_first;
      count = n;
    }
    from *= f->width;
    to *= f->width;
    count *= f->width;
    batch_reserve(dst, i, to + count);
    if (count == 0) continue;
    if (f->kind == FEATURE_IDS)
      memcpy(dst->ids[i] + to, src->ids[i] + from, (size_t)count * sizeof(int64_t));
    else
      memcpy(dst->values[i] + to, src->values[i] + from, (size_t)count * sizeof(float));
  }
}

// --- validation ---------------------------------------------------------------------------

static bool failf(char *err, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool failf(char *err, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && size) vsnprintf(err, size, fmt, ap);
  va_end(ap);
  return false;
}

// The example whose entries include entry `e` of feature f (binary search over offsets).
static int64_t example_of_entry(const Batch *b, const Feature *f, int64_t e) {
  if (f->jag < 0) return e / f->width;
  int64_t pos = e / f->width;
  const int64_t *o = b->offsets[f->jag];
  int64_t lo = 0, hi = b->B;  // o[lo] <= pos < o[hi]
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (o[mid] <= pos) lo = mid;
    else hi = mid;
  }
  return lo;
}

// "example 17", or "example 17, position 3" for an entry of a jagged feature.
static void locate(const Batch *b, const Feature *f, int64_t first, int64_t e, char *buf,
                   size_t size) {
  int64_t ex = example_of_entry(b, f, e);
  if (f->jag >= 0)
    snprintf(buf, size, "example %" PRId64 ", position %" PRId64, first + ex,
             e / f->width - b->offsets[f->jag][ex]);
  else
    snprintf(buf, size, "example %" PRId64, first + ex);
}

bool batch_validate_offsets(const Batch *b, const Schema *s, int64_t first, char *err,
                            size_t size) {
  if (b->njagged != s->njagged)
    return failf(err, size, "the batch has %d jagged dims; the schema has %d", b->njagged,
                 s->njagged);
  for (int j = 0; j < s->njagged; j++) {
    const JaggedDim *dim = &s->ir->jagged[j];
    const int64_t *o = b->offsets[j];
    if (o[0] != 0)
      return failf(err, size, "the offsets of *%s start at %" PRId64 ", not 0", dim->name, o[0]);
    for (int64_t k = 0; k < b->B; k++) {
      // o[k] is in [0, k * max_len] here, so the difference cannot overflow.
      if (o[k + 1] < o[k])
        return failf(err, size,
                     "example %" PRId64 ": the offsets of *%s are out of order (%" PRId64
                     " then %" PRId64 ")",
                     first + k, dim->name, o[k], o[k + 1]);
      int64_t len = o[k + 1] - o[k];
      if (len > dim->max_len)
        return failf(err, size,
                     "example %" PRId64 ": *%s has length %" PRId64 ", over its max %" PRId64,
                     first + k, dim->name, len, dim->max_len);
    }
    if (b->total[j] != o[b->B])
      return failf(err, size, "the total of *%s is %" PRId64 " but its offsets end at %" PRId64,
                   dim->name, b->total[j], o[b->B]);
  }
  return true;
}

static bool validate_feature(const Batch *b, const Schema *s, int i, int64_t first, char *err,
                             size_t size) {
  const Feature *f = &s->features[i];
  int64_t n = entries_for(f, b->B, b->total);
  if (n > b->capacity[i])
    return failf(err, size, "feature '%s' needs %" PRId64 " entries but holds %" PRId64, f->name,
                 n, b->capacity[i]);
  char where[96];
  if (f->kind == FEATURE_IDS) {
    const int64_t *ids = b->ids[i];
    for (int64_t e = 0; e < n; e++) {
      int64_t id = ids[e];
      if (id >= 0 && (f->id_limit == 0 || id < f->id_limit)) continue;
      locate(b, f, first, e, where, sizeof where);
      if (id < 0)
        return failf(err, size, "%s: feature '%s': id %" PRId64 " is negative", where, f->name,
                     id);
      return failf(err, size,
                   "%s: feature '%s': id %" PRId64 " is out of range: table '%s' has %" PRId64
                   " rows (ids must be in [0, %" PRId64 "))",
                   where, f->name, id, f->id_table ? f->id_table : "?", f->id_limit,
                   f->id_limit);
    }
    return true;
  }
  const float *v = b->values[i];
  for (int64_t e = 0; e < n; e++) {
    float x = v[e];
    if (f->kind == FEATURE_LABEL) {
      if (x == 0.0f || x == 1.0f) continue;
      locate(b, f, first, e, where, sizeof where);
      return failf(err, size, "%s: label '%s' is %g; labels must be 0 or 1", where, f->name,
                   (double)x);
    }
    if (isfinite(x)) continue;
    locate(b, f, first, e, where, sizeof where);
    return failf(err, size, "%s: feature '%s': element %" PRId64 " is %g, not a finite number",
                 where, f->name, e % f->width, (double)x);
  }
  return true;
}

bool batch_validate_from(const Batch *b, const Schema *s, int64_t first, char *err,
                         size_t err_size) {
  if (b->njagged != s->njagged || b->nfeatures != s->nfeatures)
    return failf(err, err_size,
                 "the batch has %d features and %d jagged dims; the schema has %d and %d",
                 b->nfeatures, b->njagged, s->nfeatures, s->njagged);
  if (b->B < 0) return failf(err, err_size, "the batch size is negative (%" PRId64 ")", b->B);
  if (!batch_validate_offsets(b, s, first, err, err_size)) return false;
  for (int i = 0; i < s->nfeatures; i++)
    if (!validate_feature(b, s, i, first, err, err_size)) return false;
  return true;
}

bool batch_validate(const Batch *b, const Schema *s, char *err, size_t err_size) {
  return batch_validate_from(b, s, 0, err, err_size);
}
