// datafile.c: the writer and the validating reader of gemc data files (docs/data.md has the
// byte layout). The writer checks every batch, writes a temporary file next to PATH
// (file_io.h's AtomicFile), and renames it into place after an fsync. The reader checks the
// header against the model's schema, then reads every chunk once at open (its CRC, its
// offsets, every id, float and label), so that a bad file is refused before training starts,
// with an error naming the file, the chunk and the example.
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "crc32.h"
#include "datafile.h"
#include "file_io.h"
#include "float_bits.h"
#include "internal_error.h"

#define DATA_MAGIC "GEMCDATA"
#define CHUNK_MARKER "CHNK"

enum {
  DATA_VERSION = 1,
  MAGIC_BYTES = 8,
  HEADER_FIXED_BYTES = 40,         // magic through nfeatures
  CHUNK_HEAD_BYTES = 16,           // marker, examples, payload bytes
  CHUNK_CRC_BYTES = 4,
  MAX_NAME_BYTES = 255,
  MAX_HEADER_BYTES = 16 << 20,
  MAX_FEATURES = 4096,
};
static const int64_t MAX_CHUNK_EXAMPLES = (int64_t)1 << 24;
static const int64_t MAX_WIDTH = (int64_t)1 << 20;
static const int64_t MAX_FILE_BYTES = (int64_t)1 << 42;  // 4 TiB: the reader's cap

// --- small helpers ------------------------------------------------------------------------

// A growing byte buffer, written little-endian.
typedef struct Bytes {
  unsigned char *p;
  size_t len, cap;
} Bytes;

static unsigned char *bytes_extend(Bytes *b, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n) cap *= 2;
    unsigned char *p = xrealloc(b->p, cap);
    b->p = p;
    b->cap = cap;
  }
  unsigned char *at = b->p + b->len;
  b->len += n;
  return at;
}

static void store_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t load_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void put_uint(Bytes *b, uint64_t v, int n) { store_le(bytes_extend(b, (size_t)n), v, n); }

static void put_name(Bytes *b, const char *s) {
  size_t n = strlen(s);
  put_uint(b, n, 2);
  memcpy(bytes_extend(b, n), s, n);
}

// --- the writer ---------------------------------------------------------------------------

struct DataWriter {
  char *path;
  AtomicFile out;     // the temporary file, renamed over `path` at close
  const Schema *s;
  Bytes header;       // kept to patch the counts and CRC at close
  Bytes chunk;        // scratch for one chunk
  uint64_t examples, chunks;
};

static void encode_header(Bytes *h, const Schema *s) {
  h->len = 0;
  memcpy(bytes_extend(h, MAGIC_BYTES), DATA_MAGIC, MAGIC_BYTES);
  put_uint(h, DATA_VERSION, 4);
  put_uint(h, 0, 4);  // header bytes, patched below
  put_uint(h, 0, 8);  // examples, patched at close
  put_uint(h, 0, 8);  // chunks, patched at close
  put_uint(h, (uint64_t)s->njagged, 4);
  put_uint(h, (uint64_t)s->nfeatures, 4);
  for (int j = 0; j < s->njagged; j++) {
    put_name(h, s->ir->jagged[j].name);
    put_uint(h, (uint64_t)s->ir->jagged[j].max_len, 8);
  }
  for (int i = 0; i < s->nfeatures; i++) {
    const Feature *f = &s->features[i];
    put_name(h, f->name);
    put_uint(h, (uint64_t)f->kind, 1);
    put_uint(h, (uint64_t)(uint32_t)f->jag, 4);
    put_uint(h, (uint64_t)f->width, 8);
  }
  put_uint(h, 0, 4);  // CRC, patched below
  store_le(h->p + 12, h->len, 4);
}

static void seal_header(Bytes *h, uint64_t examples, uint64_t chunks) {
  store_le(h->p + 16, examples, 8);
  store_le(h->p + 24, chunks, 8);
  store_le(h->p + h->len - 4, crc32_update(0, h->p, h->len - 4), 4);
}

static bool write_bytes(DataWriter *w, const void *p, size_t n, char *err, size_t err_size) {
  return atomic_write(&w->out, p, n, err, err_size);
}

DataWriter *datafile_create(const char *path, const Schema *s, char *err, size_t err_size) {
  for (int i = 0; i < s->nfeatures; i++)
    if (strlen(s->features[i].name) > MAX_NAME_BYTES) {
      fail(err, err_size, "cannot write %s: feature name '%s' is too long", path,
           s->features[i].name);
      return NULL;
    }
  DataWriter *w = xcalloc(1, sizeof *w);
  w->path = xstrdup(path);
  w->s = s;
  if (!atomic_begin(&w->out, path, err, err_size)) {
    datafile_abort(w);
    return NULL;
  }
  encode_header(&w->header, s);
  seal_header(&w->header, 0, 0);
  if (!write_bytes(w, w->header.p, w->header.len, err, err_size)) {
    datafile_abort(w);
    return NULL;
  }
  return w;
}

bool datafile_write(DataWriter *w, const Batch *b, char *err, size_t err_size) {
  const Schema *s = w->s;
  if (b->B == 0) return true;
  if (b->B > MAX_CHUNK_EXAMPLES)
    return fail(err, err_size, "cannot write %s: a chunk holds at most %" PRId64 " examples",
                w->path, MAX_CHUNK_EXAMPLES);
  char reason[512];
  if (!batch_validate_from(b, s, (int64_t)w->examples, reason, sizeof reason))
    return fail(err, err_size, "cannot write %s: %s", w->path, reason);
  Bytes *c = &w->chunk;
  c->len = 0;
  memcpy(bytes_extend(c, 4), CHUNK_MARKER, 4);
  put_uint(c, (uint64_t)b->B, 4);
  put_uint(c, 0, 8);  // payload bytes, patched below
  for (int j = 0; j < s->njagged; j++)
    for (int64_t k = 0; k <= b->B; k++) put_uint(c, (uint64_t)b->offsets[j][k], 8);
  for (int i = 0; i < s->nfeatures; i++) {
    const Feature *f = &s->features[i];
    int64_t n = (f->jag >= 0 ? b->total[f->jag] : b->B) * f->width;
    if (f->kind == FEATURE_IDS) {
      unsigned char *p = bytes_extend(c, (size_t)n * 8);
      for (int64_t e = 0; e < n; e++) store_le(p + 8 * e, (uint64_t)b->ids[i][e], 8);
    } else {
      unsigned char *p = bytes_extend(c, (size_t)n * 4);
      for (int64_t e = 0; e < n; e++) store_le(p + 4 * e, float_bits(b->values[i][e]), 4);
    }
  }
  store_le(c->p + 8, c->len - CHUNK_HEAD_BYTES, 8);
  put_uint(c, crc32_update(0, c->p + 4, c->len - 4), 4);
  if (!write_bytes(w, c->p, c->len, err, err_size)) return false;
  w->examples += (uint64_t)b->B;
  w->chunks++;
  return true;
}

static void writer_free(DataWriter *w) {
  free(w->path);
  free(w->header.p);
  free(w->chunk.p);
  free(w);
}

bool datafile_close(DataWriter *w, char *err, size_t err_size) {
  seal_header(&w->header, w->examples, w->chunks);
  bool ok = atomic_write_at(&w->out, w->header.p, w->header.len, 0, err, err_size);
  if (ok) ok = atomic_commit(&w->out, err, err_size);
  else atomic_abort(&w->out);
  writer_free(w);
  return ok;
}

void datafile_abort(DataWriter *w) {
  if (!w) return;
  atomic_abort(&w->out);
  writer_free(w);
}

// --- the reader: the header ---------------------------------------------------------------

typedef struct FileDim {
  char *name;
  int64_t max_len;
  int model;          // the model's jagged dim of that name
} FileDim;

typedef struct FileFeature {
  Feature f;          // as the file declares it (jag indexes the file's dims)
  int model;          // the model's feature of that name
} FileFeature;

typedef struct ChunkInfo {
  int64_t at;         // file offset of its marker
  int64_t first, n;   // its examples
  int64_t payload;    // payload bytes
} ChunkInfo;

struct DataReader {
  char *path;
  int fd;
  int64_t size;       // file bytes
  const Schema *s;
  FileDim *dims;
  int ndims;
  FileFeature *feats;
  int nfeats;
  int64_t header_bytes;
  int64_t examples, nchunks;
  ChunkInfo *chunks;
  unsigned char *buf; // one chunk's bytes
  size_t buf_cap;
  Batch cache;        // the decoded chunk `cached`
  int64_t cached;     // -1: none
};

// Reads exactly n bytes at `at`; false on a short read or an I/O error (errno set, or 0 for
// end of file).
static bool read_at(int fd, void *p, size_t n, int64_t at) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, (char *)p + done, n - done, (off_t)at + (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    done += (size_t)r;
  }
  return true;
}

static bool io_error(const DataReader *r, char *err, size_t err_size) {
  if (errno) return fail(err, err_size, "cannot read %s: %s", r->path, strerror(errno));
  return fail(err, err_size, "cannot read %s: the file changed while it was read", r->path);
}

// A bounds-checked walk over the header's bytes.
typedef struct Cursor {
  const unsigned char *p;
  size_t len, at;
  bool ok;
} Cursor;

static uint64_t take(Cursor *c, int n) {
  if (!c->ok || c->len - c->at < (size_t)n) {
    c->ok = false;
    return 0;
  }
  uint64_t v = load_le(c->p + c->at, n);
  c->at += (size_t)n;
  return v;
}

static char *take_name(Cursor *c) {
  size_t n = (size_t)take(c, 2);
  if (!c->ok || n == 0 || n > MAX_NAME_BYTES || c->len - c->at < n) {
    c->ok = false;
    return NULL;
  }
  char *s = xmalloc(n + 1);
  memcpy(s, c->p + c->at, n);
  s[n] = '\0';
  c->at += n;
  for (size_t i = 0; i < n; i++)
    if (s[i] <= ' ' || (unsigned char)s[i] >= 127) {
      free(s);
      c->ok = false;
      return NULL;
    }
  return s;
}

// Parses the file's dims and features (after the fixed fields and the CRC were checked).
static bool parse_header(DataReader *r, const unsigned char *h, size_t len, char *err,
                         size_t err_size) {
  Cursor c = {h, len - CHUNK_CRC_BYTES, HEADER_FIXED_BYTES, true};
  uint64_t ndims = load_le(h + 32, 4), nfeats = load_le(h + 36, 4);
  if (ndims > MAX_FEATURES || nfeats > MAX_FEATURES)
    return fail(err, err_size, "%s: corrupt header: %" PRIu64 " jagged dims and %" PRIu64
                " features", r->path, ndims, nfeats);
  r->dims = xcalloc(ndims, sizeof *r->dims);
  r->feats = xcalloc(nfeats, sizeof *r->feats);
  for (uint64_t j = 0; j < ndims && c.ok; j++) {
    FileDim *d = &r->dims[r->ndims++];
    d->name = take_name(&c);
    d->max_len = (int64_t)take(&c, 8);
    if (c.ok && d->max_len < 1)
      return fail(err, err_size, "%s: corrupt header: *%s has max length %" PRId64, r->path,
                  d->name, d->max_len);
  }
  for (uint64_t i = 0; i < nfeats && c.ok; i++) {
    FileFeature *ff = &r->feats[r->nfeats++];
    ff->f.name = take_name(&c);
    uint64_t kind = take(&c, 1);
    ff->f.jag = (int32_t)(uint32_t)take(&c, 4);
    ff->f.width = (int64_t)take(&c, 8);
    if (!c.ok) break;
    ff->f.kind = (FeatureKind)kind;
    bool sane = kind <= FEATURE_LABEL && ff->f.jag >= -1 && ff->f.jag < (int)ndims &&
                ff->f.width >= 1 && ff->f.width <= MAX_WIDTH &&
                (kind == FEATURE_FLOATS || ff->f.width == 1) &&
                (kind != FEATURE_LABEL || ff->f.jag == -1);
    if (!sane)
      return fail(err, err_size, "%s: corrupt header: feature '%s' has an impossible type",
                  r->path, ff->f.name);
    if (ff->f.jag >= 0) {
      ff->f.max_len = r->dims[ff->f.jag].max_len;
      ff->f.owns_lengths = strcmp(r->dims[ff->f.jag].name, ff->f.name) == 0;
    }
  }
  if (!c.ok || c.at != c.len)
    return fail(err, err_size, "%s: corrupt header: its schema does not fit its %zu bytes",
                r->path, len);
  return true;
}

static void describe_model_feature(const Schema *s, const Feature *f, char *buf, size_t size) {
  feature_describe(f, f->jag >= 0 ? s->ir->jagged[f->jag].name : "", buf, size);
}

// Matches the file's schema with the model's by name: every feature of the model must be in
// the file with the same type, and nothing else may be.
static bool match_schema(DataReader *r, char *err, size_t err_size) {
  const Schema *s = r->s;
  const char *model = s->ir->model ? s->ir->model : "?";
  char want[128], have[128];
  for (int j = 0; j < r->ndims; j++) {
    r->dims[j].model = -1;
    for (int m = 0; m < s->njagged; m++)
      if (strcmp(s->ir->jagged[m].name, r->dims[j].name) == 0) r->dims[j].model = m;
  }
  for (int i = 0; i < r->nfeats; i++) {
    FileFeature *ff = &r->feats[i];
    for (int k = 0; k < i; k++)
      if (strcmp(r->feats[k].f.name, ff->f.name) == 0)
        return fail(err, err_size, "%s: corrupt header: feature '%s' appears twice", r->path,
                    ff->f.name);
    ff->model = schema_find(s, ff->f.name);
    feature_describe(&ff->f, ff->f.jag >= 0 ? r->dims[ff->f.jag].name : "", have, sizeof have);
    if (ff->model < 0)
      return fail(err, err_size,
                  "%s: schema mismatch: the file has a feature '%s' (%s) that model %s does "
                  "not have",
                  r->path, ff->f.name, have, model);
    const Feature *mf = &s->features[ff->model];
    describe_model_feature(s, mf, want, sizeof want);
    bool same_jag = (ff->f.jag < 0) == (mf->jag < 0) &&
                    (ff->f.jag < 0 || r->dims[ff->f.jag].model == mf->jag);
    if (ff->f.kind != mf->kind || ff->f.width != mf->width || !same_jag)
      return fail(err, err_size,
                  "%s: schema mismatch: feature '%s' is %s in the file but %s in model %s",
                  r->path, ff->f.name, have, want, model);
  }
  for (int i = 0; i < s->nfeatures; i++) {
    bool found = false;
    for (int k = 0; k < r->nfeats && !found; k++) found = r->feats[k].model == i;
    if (found) continue;
    describe_model_feature(s, &s->features[i], want, sizeof want);
    return fail(err, err_size,
                "%s: schema mismatch: the file has no feature '%s' (%s), which model %s needs",
                r->path, s->features[i].name, want, model);
  }
  for (int m = 0; m < s->njagged; m++) {
    bool found = false;
    for (int j = 0; j < r->ndims && !found; j++) found = r->dims[j].model == m;
    if (!found)
      return fail(err, err_size,
                  "%s: schema mismatch: the file has no jagged dim *%s, which model %s needs",
                  r->path, s->ir->jagged[m].name, model);
  }
  for (int j = 0; j < r->ndims; j++)
    if (r->dims[j].model < 0)
      return fail(err, err_size,
                  "%s: schema mismatch: the file has a jagged dim *%s that model %s does not "
                  "have",
                  r->path, r->dims[j].name, model);
  return true;
}

static bool read_header(DataReader *r, char *err, size_t err_size) {
  unsigned char fixed[HEADER_FIXED_BYTES];
  size_t got = r->size < HEADER_FIXED_BYTES ? (size_t)r->size : HEADER_FIXED_BYTES;
  if (!read_at(r->fd, fixed, got, 0)) return io_error(r, err, err_size);
  size_t magic_got = got < MAGIC_BYTES ? got : MAGIC_BYTES;
  if (memcmp(fixed, DATA_MAGIC, magic_got) != 0)
    return fail(err, err_size,
                "%s: not a gemc data file (wrong magic number: expected \"%s\" at byte 0)",
                r->path, DATA_MAGIC);
  if (got < 16)
    return fail(err, err_size, "%s: truncated: the file ends at byte %" PRId64
                " inside the header", r->path, r->size);
  uint32_t version = (uint32_t)load_le(fixed + 8, 4);
  if (version != DATA_VERSION)
    return fail(err, err_size,
                "%s: unsupported data file version %" PRIu32 " (this gemc reads version %d)",
                r->path, version, DATA_VERSION);
  int64_t header_bytes = (int64_t)load_le(fixed + 12, 4);
  if (header_bytes < HEADER_FIXED_BYTES + CHUNK_CRC_BYTES || header_bytes > MAX_HEADER_BYTES)
    return fail(err, err_size, "%s: corrupt header: it claims to be %" PRId64 " bytes long",
                r->path, header_bytes);
  if (r->size < header_bytes)
    return fail(err, err_size,
                "%s: truncated: the header is %" PRId64 " bytes but the file ends at byte %"
                PRId64, r->path, header_bytes, r->size);
  unsigned char *h = xmalloc((size_t)header_bytes);
  if (!read_at(r->fd, h, (size_t)header_bytes, 0)) {
    free(h);
    return io_error(r, err, err_size);
  }
  uint32_t stored = (uint32_t)load_le(h + header_bytes - 4, 4);
  uint32_t computed = crc32_update(0, h, (size_t)header_bytes - 4);
  bool ok = true;
  if (stored != computed)
    ok = fail(err, err_size,
              "%s: header CRC mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32
              "): the header is corrupt", r->path, stored, computed);
  r->header_bytes = header_bytes;
  r->examples = (int64_t)load_le(h + 16, 8);
  r->nchunks = (int64_t)load_le(h + 24, 8);
  if (ok && (r->examples < 0 || r->nchunks < 0 || r->nchunks > r->size / CHUNK_HEAD_BYTES))
    ok = fail(err, err_size, "%s: corrupt header: %" PRId64 " examples in %" PRId64 " chunks",
              r->path, r->examples, r->nchunks);
  ok = ok && parse_header(r, h, (size_t)header_bytes, err, err_size);
  free(h);
  return ok && match_schema(r, err, err_size);
}

// --- the reader: chunks -------------------------------------------------------------------

// "chunk 3 (examples 192 to 255)"
static void chunk_name(const ChunkInfo *c, int64_t index, char *buf, size_t size) {
  if (c->n > 0)
    snprintf(buf, size, "chunk %" PRId64 " (examples %" PRId64 " to %" PRId64 ")", index,
             c->first, c->first + c->n - 1);
  else
    snprintf(buf, size, "chunk %" PRId64, index);
}

// Reads chunk `index`'s 16-byte head at c->at and checks it against the file's size; fills
// c->n and c->payload.
static bool read_chunk_head(DataReader *r, int64_t index, ChunkInfo *c, char *err,
                            size_t err_size) {
  unsigned char head[CHUNK_HEAD_BYTES];
  if (r->size - c->at < CHUNK_HEAD_BYTES)
    return fail(err, err_size,
                "%s: truncated: chunk %" PRId64 " of %" PRId64 " starts at byte %" PRId64
                " but the file ends at byte %" PRId64, r->path, index, r->nchunks, c->at,
                r->size);
  if (!read_at(r->fd, head, sizeof head, c->at)) return io_error(r, err, err_size);
  if (memcmp(head, CHUNK_MARKER, 4) != 0)
    return fail(err, err_size,
                "%s: chunk %" PRId64 " at byte %" PRId64
                ": bad chunk marker (expected \"" CHUNK_MARKER "\"): the file is corrupt",
                r->path, index, c->at);
  c->n = (int64_t)load_le(head + 4, 4);
  c->payload = (int64_t)load_le(head + 8, 8);
  char name[96];
  chunk_name(c, index, name, sizeof name);
  if (c->n < 1 || c->n > MAX_CHUNK_EXAMPLES)
    return fail(err, err_size, "%s: %s at byte %" PRId64 ": corrupt: it claims %" PRId64
                " examples", r->path, name, c->at, c->n);
  int64_t room = r->size - c->at - CHUNK_HEAD_BYTES - CHUNK_CRC_BYTES;
  if (c->payload < 0 || c->payload > room)
    return fail(err, err_size,
                "%s: truncated: %s at byte %" PRId64 " needs %" PRId64
                " bytes but the file ends at byte %" PRId64,
                r->path, name, c->at, CHUNK_HEAD_BYTES + c->payload + CHUNK_CRC_BYTES,
                r->size);
  return true;
}

// Reads chunk `index` (CRC checked) and decodes it into r->cache, validated against the model.
static bool load_chunk(DataReader *r, int64_t index, char *err, size_t err_size) {
  if (r->cached == index) return true;
  r->cached = -1;
  ChunkInfo *c = &r->chunks[index];
  size_t total = (size_t)(CHUNK_HEAD_BYTES + c->payload + CHUNK_CRC_BYTES);
  if (total > r->buf_cap) {
    free(r->buf);
    r->buf = xmalloc(total);
    r->buf_cap = total;
  }
  if (!read_at(r->fd, r->buf, total, c->at)) return io_error(r, err, err_size);
  char name[96];
  chunk_name(c, index, name, sizeof name);
  uint32_t stored = (uint32_t)load_le(r->buf + total - 4, 4);
  uint32_t computed = crc32_update(0, r->buf + 4, total - 8);
  if (stored != computed)
    return fail(err, err_size,
                "%s: %s: CRC mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32
                "): the chunk is corrupt", r->path, name, stored, computed);
  if ((int64_t)load_le(r->buf + 4, 4) != c->n || (int64_t)load_le(r->buf + 8, 8) != c->payload)
    return fail(err, err_size, "%s: %s: the chunk changed while it was read", r->path, name);

  const Schema *s = r->s;
  Batch *b = &r->cache;
  if (b->B != c->n) {
    batch_free(b);
    batch_alloc(b, s, c->n);
  }
  // The offsets come first; they must be sound before they size anything.
  const unsigned char *p = r->buf + CHUNK_HEAD_BYTES;
  int64_t left = c->payload;
  int64_t offsets_bytes = (int64_t)r->ndims * (c->n + 1) * 8;
  if (offsets_bytes > left)
    return fail(err, err_size, "%s: %s: %" PRId64 " payload bytes cannot hold its offsets",
                r->path, name, c->payload);
  for (int j = 0; j < r->ndims; j++) {
    int64_t *o = b->offsets[r->dims[j].model];
    for (int64_t k = 0; k <= c->n; k++) o[k] = (int64_t)load_le(p + 8 * k, 8);
    b->total[r->dims[j].model] = o[c->n];
    p += 8 * (c->n + 1);
  }
  left -= offsets_bytes;
  char reason[512];
  if (!batch_validate_offsets(b, s, c->first, reason, sizeof reason))
    return fail(err, err_size, "%s: %s: %s", r->path, name, reason);
  for (int i = 0; i < r->nfeats; i++) {
    const Feature *f = &s->features[r->feats[i].model];
    int m = r->feats[i].model;
    int64_t n = (f->jag >= 0 ? b->total[f->jag] : c->n) * f->width;
    int64_t elem = f->kind == FEATURE_IDS ? 8 : 4;
    if (n > left / elem)
      return fail(err, err_size,
                  "%s: %s: the payload ends inside feature '%s' (its offsets promise more "
                  "values than the chunk holds)", r->path, name, f->name);
    batch_reserve(b, m, n);
    if (f->kind == FEATURE_IDS)
      for (int64_t e = 0; e < n; e++) b->ids[m][e] = (int64_t)load_le(p + 8 * e, 8);
    else
      for (int64_t e = 0; e < n; e++) b->values[m][e] = bits_float((uint32_t)load_le(p + 4 * e, 4));
    p += n * elem;
    left -= n * elem;
  }
  if (left != 0)
    return fail(err, err_size,
                "%s: %s: %" PRId64 " bytes left over after the last feature: the chunk is "
                "corrupt", r->path, name, left);
  if (!batch_validate_from(b, s, c->first, reason, sizeof reason))
    return fail(err, err_size, "%s: %s: %s", r->path, name, reason);
  r->cached = index;
  return true;
}

// Finds every chunk and validates it.
static bool scan_chunks(DataReader *r, char *err, size_t err_size) {
  r->chunks = xcalloc((size_t)(r->nchunks ? r->nchunks : 1), sizeof *r->chunks);
  int64_t at = r->header_bytes, first = 0;
  for (int64_t i = 0; i < r->nchunks; i++) {
    ChunkInfo *c = &r->chunks[i];
    c->at = at;
    c->first = first;
    if (at == r->size)
      return fail(err, err_size,
                  "%s: truncated: the header lists %" PRId64 " chunks but the file ends after "
                  "chunk %" PRId64 " (byte %" PRId64 ")",
                  r->path, r->nchunks, i - 1, r->size);
    if (!read_chunk_head(r, i, c, err, err_size)) return false;
    if (!load_chunk(r, i, err, err_size)) return false;
    at += CHUNK_HEAD_BYTES + c->payload + CHUNK_CRC_BYTES;
    first += c->n;
  }
  if (at != r->size)
    return fail(err, err_size,
                "%s: %" PRId64 " unexpected bytes after the last chunk (byte %" PRId64
                "): the file is corrupt", r->path, r->size - at, at);
  if (first != r->examples)
    return fail(err, err_size,
                "%s: the header says %" PRId64 " examples but the chunks hold %" PRId64
                ": the file is corrupt", r->path, r->examples, first);
  return true;
}

DataReader *datafile_open(const char *path, const Schema *s, char *err, size_t err_size) {
  DataReader *r = xcalloc(1, sizeof *r);
  r->path = xstrdup(path);
  r->s = s;
  r->cached = -1;
  // Never blocks on a FIFO; a file of more than MAX_FILE_BYTES is refused before reading.
  r->fd = file_open_input(path, "data file", MAX_FILE_BYTES, &r->size, err, err_size);
  if (r->fd < 0) {
    datafile_close_reader(r);
    return NULL;
  }
  if (r->size == 0) {
    fail(err, err_size, "%s: the file is empty (not a gemc data file)", path);
    datafile_close_reader(r);
    return NULL;
  }
  if (!read_header(r, err, err_size) || !scan_chunks(r, err, err_size)) {
    datafile_close_reader(r);
    return NULL;
  }
  return r;
}

int64_t datafile_examples(const DataReader *r) { return r->examples; }

bool datafile_read(DataReader *r, int64_t first, Batch *b, char *err, size_t err_size) {
  const Schema *s = r->s;
  if (b->nfeatures != s->nfeatures || b->njagged != s->njagged)
    return fail(err, err_size, "%s: the batch was not allocated for model %s", r->path,
                s->ir->model ? s->ir->model : "?");
  if (r->examples == 0) return fail(err, err_size, "%s: the file holds no examples", r->path);
  if (first < 0)
    return fail(err, err_size, "%s: cannot read from example %" PRId64, r->path, first);
  int64_t at = first % r->examples, filled = 0;
  for (int j = 0; j < s->njagged; j++) {
    b->offsets[j][0] = 0;
    b->total[j] = 0;
  }
  while (filled < b->B) {
    int64_t lo = 0, hi = r->nchunks - 1;  // the chunk that holds example `at`
    while (lo < hi) {
      int64_t mid = lo + (hi - lo + 1) / 2;
      if (r->chunks[mid].first <= at) lo = mid;
      else hi = mid - 1;
    }
    const ChunkInfo *c = &r->chunks[lo];
    if (!load_chunk(r, lo, err, err_size)) return false;
    int64_t n = c->first + c->n - at;
    if (n > b->B - filled) n = b->B - filled;
    batch_copy(s, b, filled, &r->cache, at - c->first, n);
    filled += n;
    at += n;
    if (at == r->examples) at = 0;
  }
  return true;
}

void datafile_close_reader(DataReader *r) {
  if (!r) return;
  if (r->fd >= 0) close(r->fd);
  for (int j = 0; j < r->ndims; j++) free(r->dims[j].name);
  for (int i = 0; i < r->nfeats; i++) free((char *)(uintptr_t)r->feats[i].f.name);
  free(r->dims);
  free(r->feats);
  free(r->chunks);
  free(r->buf);
  batch_free(&r->cache);
  free(r->path);
  free(r);
}
