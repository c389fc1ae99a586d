// test_datafile.c: the on-disk format for jagged batches. Round trips (synthetic data written
// and read back bit for bit, windows that span chunks and wrap around, empty sequences);
// atomic writes; every way a file can be bad (wrong magic, unsupported version, truncation
// at every byte, a flipped byte anywhere, CRC mismatches, bad offsets, ids out of range,
// non-finite floats, labels that are not 0/1, a schema that does not match the model), each
// with its own clear error naming the file and the record; and `gemc data convert` from TSV
// and CSV, with an error at file:line:column for each kind of bad record.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena.h"
#include "batch.h"
#include "crc32.h"
#include "datafile.h"
#include "diag.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"
#include "synth.h"

// --- a model and its schema ---------------------------------------------------------------

#include "load_text.h"

// A family of small models for schema tests: the history's max length, the items table's
// rows, the declarations after the history, and what the concat adds for them.
#define MODEL_FMT \
    "model m {\n" \
    "  batch 4;\n" \
    "  dim 8;\n" \
    "  seq history : id max %d;\n" \
    "  seq dwell : f32 like history;\n" \
    "%s" \
    "  label click;\n" \
    "  table items : rows %d;\n" \
    "  h = embed(items, history) + linear(dwell, 8);\n" \
    "  p = pma(h, seeds = 1, heads = 1, act = silu);\n" \
    "  z = concat(flatten(p)%s);\n" \
    "  loss bce(mlp(z, [1]), click);\n" \
    "}\n"
static const char *BASE_DECLS = "  sparse ad : id;\n  dense counters : f32[4];\n";
static const char *BASE_USES = ", embed(items, ad), linear(counters, 8)";

static Loaded *load_variant(int max_len, int rows, const char *decls, const char *uses) {
  char text[2048];
  snprintf(text, sizeof text, MODEL_FMT, max_len, decls, rows, uses);
  return load("m.gem", text);
}

static Loaded *load_base(void) { return load_variant(20, 1000, BASE_DECLS, BASE_USES); }

// Every kind of input: a sequence, ids and floats aligned with it, a candidate id, a multihot
// bag, dense floats, two labels.
static const char *CONV_MODEL =
    "model conv {\n"
    "  batch 4;\n"
    "  dim 8;\n"
    "  seq history : id max 5;\n"
    "  seq actions : id like history;\n"
    "  seq dwell : f32 like history;\n"
    "  sparse ad : id;\n"
    "  multihot tags : id max 3;\n"
    "  dense counters : f32[2];\n"
    "  label click;\n"
    "  label convert;\n"
    "  table items : rows 100;\n"
    "  table acts : rows 4;\n"
    "  table tagt : rows 10;\n"
    "  h = embed(items, history) + embed(acts, actions) + linear(dwell, 8);\n"
    "  p = pma(h, seeds = 1, heads = 1, act = silu);\n"
    "  z = concat(flatten(p), embed(items, ad), embed(tagt, tags), linear(counters, 8));\n"
    "  loss bce(mlp(z, [1]), click) + bce(mlp(z, [1]), convert);\n"
    "}\n";

// --- files --------------------------------------------------------------------------------

static char tmp_dir[64];

static int make_tmp_dir(void **state) {
  (void)state;
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/gemc_test_datafile_XXXXXX");
  return mkdtemp(tmp_dir) ? 0 : -1;
}

static int remove_tmp_dir(void **state) {
  (void)state;
  DIR *d = opendir(tmp_dir);
  if (!d) return -1;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  return rmdir(tmp_dir);
}

// A path in the test's directory (one of 8 rotating buffers).
static const char *tmp_path(const char *name) {
  static char bufs[8][512];
  static int next;
  char *p = bufs[next++ % 8];
  snprintf(p, 512, "%s/%s", tmp_dir, name);
  return p;
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static unsigned char *read_bytes(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)n + 1);
  assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return p;
}

static void write_bytes(const char *path, const void *p, size_t n) {
  unlink(path);  // a fresh file: rewriting one in place makes some file systems flush it
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  fclose(f);
}

static void write_text(const char *path, const char *text) {
  write_bytes(path, text, strlen(text));
}

static uint64_t le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// The byte offset of chunk `index` (its marker), walking from the header.
static size_t chunk_at(const unsigned char *bytes, int index) {
  size_t at = (size_t)le(bytes + 12, 4);
  for (int i = 0; i < index; i++) at += 16 + (size_t)le(bytes + at + 8, 8) + 4;
  return at;
}

// Recomputes the CRC of the chunk at `at` after a test patched its payload.
static void fix_chunk_crc(unsigned char *bytes, size_t at) {
  size_t payload = (size_t)le(bytes + at + 8, 8);
  put_le(bytes + at + 16 + payload, crc32_update(0, bytes + at + 4, 12 + payload), 4);
}

// --- batches ------------------------------------------------------------------------------

static bool batches_equal(const Schema *s, const Batch *x, const Batch *y) {
  if (x->B != y->B) return false;
  for (int j = 0; j < s->njagged; j++) {
    if (x->total[j] != y->total[j]) return false;
    if (memcmp(x->offsets[j], y->offsets[j], (size_t)(x->B + 1) * sizeof(int64_t))) return false;
  }
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    size_t n = (size_t)((ft->jag >= 0 ? x->total[ft->jag] : x->B) * ft->width);
    if (x->ids[f] && memcmp(x->ids[f], y->ids[f], n * sizeof(int64_t))) return false;
    if (x->values[f] && memcmp(x->values[f], y->values[f], n * sizeof(float))) return false;
  }
  return true;
}

// Writes examples [0, nchunks * chunk) of a synthetic stream to `path`.
static void write_synth(const Loaded *m, const char *path, int nchunks, int64_t chunk,
                        const SynthConfig *cfg) {
  Synth *g = synth_new(&m->s, cfg);
  Batch b;
  batch_alloc(&b, &m->s, chunk);
  char err[512] = "";
  DataWriter *w = datafile_create(path, &m->s, err, sizeof err);
  if (!w) print_message("%s\n", err);
  assert_non_null(w);
  for (int c = 0; c < nchunks; c++) {
    synth_batch(g, c * chunk, &b);
    if (!datafile_write(w, &b, err, sizeof err)) print_message("%s\n", err);
    assert_true(err[0] == '\0');
  }
  assert_true(datafile_close(w, err, sizeof err));
  batch_free(&b);
  synth_free(g);
}

// The small file most corruption tests start from: 3 chunks of 5 examples of load_base().
static const char *write_small(const Loaded *m, const char *name) {
  SynthConfig cfg;
  synth_config_default(&cfg);
  cfg.lengths = LENGTHS_UNIFORM;
  const char *path = tmp_path(name);
  write_synth(m, path, 3, 5, &cfg);
  return path;
}

static void assert_contains(const char *text, const char *want) {
  if (!strstr(text, want)) {
    print_message("expected the error to contain:\n  %s\nbut it was:\n  %s\n", want, text);
    fail();
  }
}

// Opening `path` for `m` fails, and the error names the file and contains `want`.
static void assert_open_fails(const Loaded *m, const char *path, const char *want) {
  char err[1024] = "";
  DataReader *r = datafile_open(path, &m->s, err, sizeof err);
  if (r) {
    print_message("expected %s to be refused (%s)\n", path, want);
    datafile_close_reader(r);
    fail();
  }
  assert_contains(err, path);
  assert_contains(err, want);
}

static DataReader *open_ok(const Loaded *m, const char *path) {
  char err[1024] = "";
  DataReader *r = datafile_open(path, &m->s, err, sizeof err);
  if (!r) print_message("datafile_open: %s\n", err);
  assert_non_null(r);
  return r;
}

// --- round trips --------------------------------------------------------------------------

// Reads windows of every size and start, including ones that span chunks and wrap around the
// end, and compares each with the same window of the synthetic stream.
static void check_round_trip(const Loaded *m, const SynthConfig *cfg, const char *name) {
  const char *path = tmp_path(name);
  write_synth(m, path, 5, 64, cfg);  // 320 examples
  DataReader *r = open_ok(m, path);
  assert_int_equal(datafile_examples(r), 320);
  Synth *g = synth_new(&m->s, cfg);
  struct Window {
    int64_t first, B;
  } windows[] = {{0, 64}, {64, 64}, {100, 64}, {0, 320}, {319, 1}, {250, 37}, {5, 1}};
  char err[512];
  for (size_t i = 0; i < sizeof windows / sizeof *windows; i++) {
    Batch got, want;
    batch_alloc(&got, &m->s, windows[i].B);
    batch_alloc(&want, &m->s, windows[i].B);
    assert_true(datafile_read(r, windows[i].first, &got, err, sizeof err));
    synth_batch(g, windows[i].first, &want);
    if (!batches_equal(&m->s, &got, &want)) {
      print_message("window [%lld, +%lld) differs\n", (long long)windows[i].first,
                    (long long)windows[i].B);
      fail();
    }
    batch_free(&got);
    batch_free(&want);
  }
  // Wrapping: examples 300..319 then 0..43, and a start past the end.
  Batch got, part, want;
  batch_alloc(&got, &m->s, 64);
  batch_alloc(&want, &m->s, 64);
  batch_alloc(&part, &m->s, 44);
  assert_true(datafile_read(r, 300, &got, err, sizeof err));
  synth_batch(g, 0, &part);
  Batch tail;
  batch_alloc(&tail, &m->s, 20);
  synth_batch(g, 300, &tail);
  batch_copy(&m->s, &want, 0, &tail, 0, 20);
  batch_copy(&m->s, &want, 20, &part, 0, 44);
  assert_true(batches_equal(&m->s, &got, &want));
  assert_true(datafile_read(r, 3 * 320 + 300, &got, err, sizeof err));
  assert_true(batches_equal(&m->s, &got, &want));
  char reason[512];
  assert_true(batch_validate(&got, &m->s, reason, sizeof reason));
  batch_free(&tail);
  batch_free(&got);
  batch_free(&want);
  batch_free(&part);
  synth_free(g);
  datafile_close_reader(r);
}

static void test_datafile_round_trip_every_kind_of_input(void **state) {
  (void)state;
  Loaded *m = load("conv.gem", CONV_MODEL);
  SynthConfig cfg;
  synth_config_default(&cfg);
  cfg.lengths = LENGTHS_HEAVY;
  cfg.empty_fraction = 0.2;
  check_round_trip(m, &cfg, "conv.gemd");
  unload(m);
  m = load("models/gem_full.gem", NULL);
  cfg.lengths = LENGTHS_LOGNORMAL;
  check_round_trip(m, &cfg, "full.gemd");
  unload(m);
}

static void test_datafile_round_trip_empty_sequences(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  SynthConfig cfg;
  synth_config_default(&cfg);
  cfg.empty_fraction = 1.0;
  check_round_trip(m, &cfg, "empty.gemd");
  unload(m);
}

// Whether the directory of `path` holds its temporary file, .NAME.XXXXXX (file_io.h).
static bool temp_exists(const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  *slash = '\0';
  char prefix[512];
  snprintf(prefix, sizeof prefix, ".%s.", slash + 1);
  DIR *d = opendir(dir);
  bool found = false;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strlen(e->d_name) == strlen(prefix) + 6)
      found = true;
  if (d) closedir(d);
  return found;
}

static void test_datafile_writer_is_atomic(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  const char *path = tmp_path("atomic.gemd");
  SynthConfig cfg;
  synth_config_default(&cfg);
  Synth *g = synth_new(&m->s, &cfg);
  Batch b;
  batch_alloc(&b, &m->s, 16);
  synth_batch(g, 0, &b);
  char err[512];
  DataWriter *w = datafile_create(path, &m->s, err, sizeof err);
  assert_non_null(w);
  assert_true(datafile_write(w, &b, err, sizeof err));
  assert_false(exists(path));  // nothing at PATH until close
  assert_true(temp_exists(path));
  assert_true(datafile_close(w, err, sizeof err));
  assert_true(exists(path));
  assert_false(temp_exists(path));
  // An aborted rewrite leaves the old file alone and no temp file behind.
  size_t before_size;
  unsigned char *before = read_bytes(path, &before_size);
  w = datafile_create(path, &m->s, err, sizeof err);
  synth_batch(g, 16, &b);
  assert_true(datafile_write(w, &b, err, sizeof err));
  datafile_abort(w);
  assert_false(temp_exists(path));
  size_t after_size;
  unsigned char *after = read_bytes(path, &after_size);
  assert_int_equal(before_size, after_size);
  assert_memory_equal(before, after, before_size);
  free(before);
  free(after);
  // A directory that does not exist.
  assert_null(datafile_create(tmp_path("no/such/dir.gemd"), &m->s, err, sizeof err));
  assert_contains(err, "cannot create a temporary file for");
  assert_contains(err, "no/such/dir.gemd");
  batch_free(&b);
  synth_free(g);
  unload(m);
}

static void test_datafile_writer_refuses_an_invalid_batch(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  const char *path = tmp_path("invalid.gemd");
  SynthConfig cfg;
  synth_config_default(&cfg);
  Synth *g = synth_new(&m->s, &cfg);
  Batch b;
  batch_alloc(&b, &m->s, 8);
  synth_batch(g, 0, &b);
  char err[512];
  DataWriter *w = datafile_create(path, &m->s, err, sizeof err);
  assert_true(datafile_write(w, &b, err, sizeof err));
  b.ids[schema_find(&m->s, "ad")][5] = 1000;
  assert_false(datafile_write(w, &b, err, sizeof err));
  // The second batch starts at example 8 of the file.
  assert_contains(err, path);
  assert_contains(err, "example 13: feature 'ad': id 1000 is out of range: table 'ads' has "
                       "1000 rows");
  datafile_abort(w);
  assert_false(exists(path));
  batch_free(&b);
  synth_free(g);
  unload(m);
}

// --- bad files ----------------------------------------------------------------------------

static void test_datafile_wrong_magic(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "magic.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  bytes[7] = 'X';
  write_bytes(path, bytes, n);
  assert_open_fails(m, path, ": not a gemc data file (wrong magic number: expected \"GEMCDATA\"");
  const char *text = tmp_path("records.gemd");
  write_text(text, "history\tad\n1 2\t3\n");
  assert_open_fails(m, text, "not a gemc data file");
  const char *empty = tmp_path("empty.gemd");
  write_text(empty, "");
  assert_open_fails(m, empty, "the file is empty");
  assert_open_fails(m, tmp_path("missing.gemd"), "cannot open");
  assert_open_fails(m, tmp_dir, "not a regular file");
  free(bytes);
  unload(m);
}

static void test_datafile_unsupported_version(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "version.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  assert_int_equal(le(bytes + 8, 4), 1);
  put_le(bytes + 8, 2, 4);
  write_bytes(path, bytes, n);
  assert_open_fails(m, path, "unsupported data file version 2 (this gemc reads version 1)");
  free(bytes);
  unload(m);
}

static void test_datafile_truncated_at_every_byte(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "whole.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  const char *cut = tmp_path("cut.gemd");
  for (size_t len = 1; len < n; len++) {
    write_bytes(cut, bytes, len);
    char err[1024] = "";
    DataReader *r = datafile_open(cut, &m->s, err, sizeof err);
    if (r || !strstr(err, cut) || !strstr(err, "truncated")) {
      print_message("cut at %zu of %zu bytes: %s\n", len, n, r ? "accepted" : err);
      fail();
    }
  }
  // A cut at a chunk boundary says how many chunks are missing.
  write_bytes(cut, bytes, chunk_at(bytes, 2));
  assert_open_fails(m, cut, "truncated: the header lists 3 chunks but the file ends after "
                            "chunk 1");
  // A cut inside a chunk names it.
  write_bytes(cut, bytes, chunk_at(bytes, 1) + 40);
  assert_open_fails(m, cut, "truncated: chunk 1 (examples 5 to 9) at byte");
  free(bytes);
  unload(m);
}

static void test_datafile_flipped_byte_anywhere_is_refused(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "flip_src.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  const char *flipped = tmp_path("flipped.gemd");
  size_t header = (size_t)le(bytes + 12, 4);
  size_t c1 = chunk_at(bytes, 1), c2 = chunk_at(bytes, 2);
  for (size_t at = 0; at < n; at++) {
    int bit = (int)(at % 8);  // a different bit of each byte
    bytes[at] ^= (unsigned char)(1u << bit);
    write_bytes(flipped, bytes, n);
    bytes[at] ^= (unsigned char)(1u << bit);
    char err[1024] = "";
    DataReader *r = datafile_open(flipped, &m->s, err, sizeof err);
    if (r || !strstr(err, flipped)) {
      print_message("flipping bit %d of byte %zu: %s\n", bit, at, r ? "accepted" : err);
      fail();
    }
    // The schema in the header is covered by the header's CRC, a chunk's payload by its own.
    if (at >= 40 && at < header - 4) assert_contains(err, "header CRC mismatch");
    if (at >= c1 + 16 && at < c2 - 4)
      assert_contains(err, "chunk 1 (examples 5 to 9): CRC mismatch");
  }
  free(bytes);
  unload(m);
}

// Patches one value inside chunk 1 of the small file (fixing the CRC, so the reader's own
// checks must catch it) and expects `want`.
typedef enum Part {
  PART_OFFSETS,
  PART_HISTORY,
  PART_DWELL,
  PART_AD,
  PART_COUNTERS,
  PART_CLICK
} Part;

static void patch_and_expect(const Loaded *m, Part part, int64_t index, uint64_t value,
                             int width, const char *want) {
  const char *path = write_small(m, "patch_src.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  size_t at = chunk_at(bytes, 1);
  unsigned char *p = bytes + at + 16;
  int64_t examples = 5;
  int64_t total = (int64_t)le(p + 8 * examples, 8);
  // Payload order: offsets of *history, then history, dwell, ad, counters, click.
  size_t offset[] = {
      [PART_OFFSETS] = 0,
      [PART_HISTORY] = 8 * (size_t)(examples + 1),
      [PART_DWELL] = 8 * (size_t)(examples + 1) + 8 * (size_t)total,
      [PART_AD] = 8 * (size_t)(examples + 1) + 12 * (size_t)total,
      [PART_COUNTERS] = 8 * (size_t)(examples + 1) + 12 * (size_t)total + 8 * (size_t)examples,
      [PART_CLICK] = 8 * (size_t)(examples + 1) + 12 * (size_t)total + 24 * (size_t)examples,
  };
  put_le(p + offset[part] + (size_t)index * (size_t)width, value, width);
  fix_chunk_crc(bytes, at);
  const char *patched = tmp_path("patched.gemd");
  write_bytes(patched, bytes, n);
  assert_open_fails(m, patched, want);
  free(bytes);
}

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static void test_datafile_bad_offsets(void **state) {
  (void)state;
  Loaded *m = load_base();
  patch_and_expect(m, PART_OFFSETS, 0, 1, 8,
                   "chunk 1 (examples 5 to 9): the offsets of *history start at 1, not 0");
  // Offsets [0, a, b, ...]: make the second smaller than the first.
  patch_and_expect(m, PART_OFFSETS, 2, 0, 8,
                   "chunk 1 (examples 5 to 9): example 6: the offsets of *history are out of "
                   "order");
  patch_and_expect(m, PART_OFFSETS, 5, (uint64_t)-3, 8,
                   "chunk 1 (examples 5 to 9): example 9: the offsets of *history are out of "
                   "order");
  // Extreme values must not overflow anything.
  patch_and_expect(m, PART_OFFSETS, 3, 0x8000000000000000ULL, 8,
                   "chunk 1 (examples 5 to 9): example 7: the offsets of *history are out of "
                   "order");
  patch_and_expect(m, PART_OFFSETS, 5, 0x7fffffffffffffffULL, 8,
                   "chunk 1 (examples 5 to 9): example 9: *history has length ");
  patch_and_expect(m, PART_OFFSETS, 5, 0x7fffffffffffffffULL, 8, ", over its max 20");
  unload(m);
}

// The model reading a file decides the max length: lengths up to 20 in the file are too long
// for a model whose history is at most 3 long.
static void test_datafile_length_over_the_models_max(void **state) {
  (void)state;
  Loaded *writer = load_base();
  const char *path = write_small(writer, "long.gemd");
  Loaded *reader = load_variant(3, 1000, BASE_DECLS, BASE_USES);
  assert_open_fails(reader, path, "chunk 0 (examples 0 to 4): example ");
  assert_open_fails(reader, path, ": *history has length ");
  assert_open_fails(reader, path, ", over its max 3");
  unload(reader);
  unload(writer);
}

static void test_datafile_ids_out_of_range(void **state) {
  (void)state;
  Loaded *m = load_base();
  patch_and_expect(m, PART_AD, 3, 1000, 8,
                   "chunk 1 (examples 5 to 9): example 8: feature 'ad': id 1000 is out of "
                   "range: table 'items' has 1000 rows (ids must be in [0, 1000))");
  patch_and_expect(m, PART_AD, 0, (uint64_t)-7, 8,
                   "chunk 1 (examples 5 to 9): example 5: feature 'ad': id -7 is negative");
  patch_and_expect(m, PART_HISTORY, 0, 123456, 8,
                   "chunk 1 (examples 5 to 9): example 5, position 0: feature 'history': id "
                   "123456 is out of range");
  // The same file read by a model with a smaller table.
  const char *path = write_small(m, "ids.gemd");
  Loaded *small = load_variant(20, 10, BASE_DECLS, BASE_USES);
  assert_open_fails(small, path, "is out of range: table 'items' has 10 rows");
  unload(small);
  unload(m);
}

static void test_datafile_non_finite_floats_and_bad_labels(void **state) {
  (void)state;
  Loaded *m = load_base();
  patch_and_expect(m, PART_COUNTERS, 4 * 2 + 1, bits_of(NAN), 4,
                   "chunk 1 (examples 5 to 9): example 7: feature 'counters': element 1 is "
                   "nan, not a finite number");
  patch_and_expect(m, PART_DWELL, 0, bits_of(INFINITY), 4,
                   "chunk 1 (examples 5 to 9): example 5, position 0: feature 'dwell': element "
                   "0 is inf, not a finite number");
  patch_and_expect(m, PART_CLICK, 4, bits_of(0.5f), 4,
                   "chunk 1 (examples 5 to 9): example 9: label 'click' is 0.5; labels must be "
                   "0 or 1");
  patch_and_expect(m, PART_CLICK, 0, bits_of(-1.0f), 4,
                   "example 5: label 'click' is -1; labels must be 0 or 1");
  unload(m);
}

static void test_datafile_crc_mismatch(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "crc.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  bytes[chunk_at(bytes, 2) + 30] ^= 0x10;
  write_bytes(path, bytes, n);
  assert_open_fails(m, path, "chunk 2 (examples 10 to 14): CRC mismatch (stored 0x");
  assert_open_fails(m, path, "): the chunk is corrupt");
  bytes[chunk_at(bytes, 2) + 30] ^= 0x10;
  bytes[50] ^= 0x01;  // inside the header's schema
  write_bytes(path, bytes, n);
  assert_open_fails(m, path, "header CRC mismatch");
  bytes[50] ^= 0x01;
  bytes[chunk_at(bytes, 1)] = 'X';
  write_bytes(path, bytes, n);
  assert_open_fails(m, path, "chunk 1 at byte");
  assert_open_fails(m, path, "bad chunk marker");
  free(bytes);
  unload(m);
}

// Random damage with the CRCs recomputed, so that only the reader's own checks stand between
// the bytes and the batch: every file is either refused with an error naming it, or reads
// back as batches that validate. (Run under the sanitizers, this is also a memory check.)
static void test_datafile_random_damage_with_valid_crcs(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "damage_src.gemd");
  size_t n;
  unsigned char *clean = read_bytes(path, &n);
  unsigned char *bytes = malloc(n);
  const char *damaged = tmp_path("damaged.gemd");
  size_t header = (size_t)le(clean + 12, 4);
  uint64_t rng = 12345;
  int refused = 0;
  for (int iter = 0; iter < 400; iter++) {
    memcpy(bytes, clean, n);
    bool in_header = iter % 4 == 0;
    size_t lo = in_header ? 16 : chunk_at(clean, 1) + 4;
    size_t hi = in_header ? header - 4 : chunk_at(clean, 2) - 4;
    for (int k = 0; k < 1 + iter % 3; k++) {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      size_t at = lo + (size_t)(rng >> 33) % (hi - lo);
      bytes[at] = (unsigned char)(rng >> 24);
    }
    if (in_header) {
      put_le(bytes + header - 4, crc32_update(0, bytes, header - 4), 4);
    } else {  // the CRC where the undamaged chunk keeps it, over its undamaged extent
      size_t at = chunk_at(clean, 1), payload = (size_t)le(clean + at + 8, 8);
      put_le(bytes + at + 16 + payload, crc32_update(0, bytes + at + 4, 12 + payload), 4);
    }
    write_bytes(damaged, bytes, n);
    char err[1024] = "";
    DataReader *r = datafile_open(damaged, &m->s, err, sizeof err);
    if (!r) {
      assert_contains(err, damaged);
      refused++;
      continue;
    }
    Batch b;
    batch_alloc(&b, &m->s, datafile_examples(r));
    assert_true(datafile_read(r, 0, &b, err, sizeof err));
    char reason[512];
    assert_true(batch_validate(&b, &m->s, reason, sizeof reason));
    batch_free(&b);
    datafile_close_reader(r);
  }
  print_message("random damage: %d of 400 files refused\n", refused);
  assert_true(refused > 200);
  free(bytes);
  free(clean);
  unload(m);
}

static void test_datafile_trailing_bytes(void **state) {
  (void)state;
  Loaded *m = load_base();
  const char *path = write_small(m, "trailing.gemd");
  size_t n;
  unsigned char *bytes = read_bytes(path, &n);
  unsigned char *longer = calloc(n + 3, 1);
  memcpy(longer, bytes, n);
  write_bytes(path, longer, n + 3);
  assert_open_fails(m, path, "3 unexpected bytes after the last chunk");
  free(longer);
  free(bytes);
  unload(m);
}

static void test_datafile_schema_mismatch(void **state) {
  (void)state;
  Loaded *base = load_base();
  const char *path = write_small(base, "schema.gemd");
  struct {
    const char *decls, *uses, *want;
  } cases[] = {
      // The model needs a feature the file lacks.
      {"  sparse ad : id;\n  dense counters : f32[4];\n  dense more : f32[2];\n",
       ", embed(items, ad), linear(counters, 8), linear(more, 8)",
       "schema mismatch: the file has no feature 'more' (fp32[2] per example), which model m "
       "needs"},
      // The file has a feature the model lacks.
      {"  sparse ad : id;\n", ", embed(items, ad)",
       "schema mismatch: the file has a feature 'counters' (fp32[4] per example) that model m "
       "does not have"},
      // Retyped: another width.
      {"  sparse ad : id;\n  dense counters : f32[5];\n", BASE_USES,
       "schema mismatch: feature 'counters' is fp32[4] per example in the file but fp32[5] per "
       "example in model m"},
      // Retyped: jagged in the model, one per example in the file.
      {"  multihot ad : id max 4;\n  dense counters : f32[4];\n",
       ", embed(items, ad), linear(counters, 8)",
       "schema mismatch: feature 'ad' is ids, one per example in the file but ids, one per "
       "position of *ad in model m"},
      // Retyped: ids in the file, floats in the model.
      {"  dense ad : f32[1];\n  dense counters : f32[4];\n", ", linear(ad, 8), linear(counters, 8)",
       "schema mismatch: feature 'ad' is ids, one per example in the file but fp32[1] per "
       "example in model m"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Loaded *m = load_variant(20, 1000, cases[i].decls, cases[i].uses);
    assert_open_fails(m, path, cases[i].want);
    unload(m);
  }
  // Another model altogether.
  Loaded *tiny = load("models/gem_tiny.gem", NULL);
  assert_open_fails(tiny, path, "schema mismatch");
  unload(tiny);
  unload(base);
}

static void test_datafile_read_errors(void **state) {
  (void)state;
  Loaded *m = load_base();
  Loaded *tiny = load("models/gem_tiny.gem", NULL);
  const char *path = write_small(m, "read.gemd");
  DataReader *r = open_ok(m, path);
  Batch b;
  batch_alloc(&b, &tiny->s, 4);
  char err[512];
  assert_false(datafile_read(r, 0, &b, err, sizeof err));
  assert_contains(err, "the batch was not allocated for model m");
  batch_free(&b);
  batch_alloc(&b, &m->s, 4);
  assert_false(datafile_read(r, -1, &b, err, sizeof err));
  assert_contains(err, "cannot read from example -1");
  assert_true(datafile_read(r, 14, &b, err, sizeof err));  // 14, 0, 1, 2
  datafile_close_reader(r);
  // A file with no examples opens, but has nothing to read.
  const char *none = tmp_path("none.gemd");
  DataWriter *w = datafile_create(none, &m->s, err, sizeof err);
  assert_true(datafile_close(w, err, sizeof err));
  r = open_ok(m, none);
  assert_int_equal(datafile_examples(r), 0);
  assert_false(datafile_read(r, 0, &b, err, sizeof err));
  assert_contains(err, "the file holds no examples");
  datafile_close_reader(r);
  batch_free(&b);
  unload(tiny);
  unload(m);
}

static void test_datafile_crc32_known_values(void **state) {
  (void)state;
  assert_int_equal(crc32_update(0, "123456789", 9), 0xCBF43926u);
  assert_int_equal(crc32_update(0, "", 0), 0);
  uint32_t split = crc32_update(crc32_update(0, "12345", 5), "6789", 4);
  assert_int_equal(split, 0xCBF43926u);
}

// --- convert ------------------------------------------------------------------------------

static void test_datafile_convert_tsv_and_csv(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  char err[512] = "";
  const char *tsv_out = tmp_path("tiny_tsv.gemd"), *csv_out = tmp_path("tiny_csv.gemd");
  if (!datafile_convert("tests/data/gem_tiny_records.tsv", tsv_out, &m->s, 0, err, sizeof err))
    print_message("%s\n", err);
  assert_true(err[0] == '\0');
  assert_true(datafile_convert("tests/data/gem_tiny_records.csv", csv_out, &m->s, 0, err,
                               sizeof err));
  DataReader *r1 = open_ok(m, tsv_out), *r2 = open_ok(m, csv_out);
  assert_int_equal(datafile_examples(r1), 4);
  Batch a, b;
  batch_alloc(&a, &m->s, 4);
  batch_alloc(&b, &m->s, 4);
  assert_true(datafile_read(r1, 0, &a, err, sizeof err));
  assert_true(datafile_read(r2, 0, &b, err, sizeof err));
  assert_true(batches_equal(&m->s, &a, &b));
  int h = schema_find(&m->s, "history"), ad = schema_find(&m->s, "ad");
  int counters = schema_find(&m->s, "counters"), click = schema_find(&m->s, "click");
  int64_t offsets[] = {0, 3, 3, 5, 6}, items[] = {1, 2, 3, 999, 0, 5}, ads[] = {7, 42, 3, 999};
  float clicks[] = {1, 0, 1, 0};
  for (int k = 0; k <= 4; k++) assert_int_equal(a.offsets[0][k], offsets[k]);
  for (int e = 0; e < 6; e++) assert_int_equal(a.ids[h][e], items[e]);
  for (int k = 0; k < 4; k++) {
    assert_int_equal(a.ids[ad][k], ads[k]);
    assert_true(a.values[click][k] == clicks[k]);
  }
  assert_true(a.values[counters][2] == -2.0f && a.values[counters][3] == 3.25f);
  assert_true(a.values[counters][8] == 1e-3f && a.values[counters][15] == -1.0f);
  batch_free(&a);
  batch_free(&b);
  datafile_close_reader(r1);
  datafile_close_reader(r2);
  unload(m);
}

// Every kind of input, with a separator given explicitly.
static void test_datafile_convert_every_kind_of_input(void **state) {
  (void)state;
  Loaded *m = load("conv.gem", CONV_MODEL);
  const char *in = tmp_path("conv.txt"), *out = tmp_path("conv.gemd");
  write_text(in,
             "convert|click|counters|tags|ad|dwell|actions|history\n"
             "0|1|0.5 -0.5|1 2 3|99|1.5 2.5|3 0|10 11\n"
             "1|0|1 1||0|||\n");
  char err[512] = "";
  if (!datafile_convert(in, out, &m->s, '|', err, sizeof err)) print_message("%s\n", err);
  assert_true(err[0] == '\0');
  DataReader *r = open_ok(m, out);
  Batch b;
  batch_alloc(&b, &m->s, 2);
  assert_true(datafile_read(r, 0, &b, err, sizeof err));
  int history = schema_find(&m->s, "history"), actions = schema_find(&m->s, "actions");
  int dwell = schema_find(&m->s, "dwell"), tags = schema_find(&m->s, "tags");
  int hj = m->s.features[history].jag, tj = m->s.features[tags].jag;
  assert_int_equal(b.offsets[hj][1], 2);
  assert_int_equal(b.offsets[hj][2], 2);
  assert_int_equal(b.offsets[tj][1], 3);
  assert_int_equal(b.offsets[tj][2], 3);
  assert_int_equal(b.ids[history][1], 11);
  assert_int_equal(b.ids[actions][0], 3);
  assert_true(b.values[dwell][1] == 2.5f);
  assert_int_equal(b.ids[tags][2], 3);
  assert_true(b.values[schema_find(&m->s, "convert")][1] == 1.0f);
  batch_free(&b);
  datafile_close_reader(r);
  unload(m);
}

static void test_datafile_convert_errors(void **state) {
  (void)state;
  Loaded *m = load("conv.gem", CONV_MODEL);
  static const char *HEADER = "history\tactions\tdwell\tad\ttags\tcounters\tclick\tconvert\n";
  static const char *GOOD = "1 2\t0 1\t0.5 0.5\t7\t1\t0 0\t1\t0\n";
  struct {
    const char *name;  // the input file's name (its extension picks the separator)
    const char *body;  // after the header line, unless it starts with '!' (then the whole file)
    const char *want;  // file:line:column and message, after the path
  } cases[] = {
      {"unknown.tsv", "!history\tactions\tdwell\tad\ttags\tcounters\tclick\tconvert\tcolour\n",
       ":1:54: unknown column 'colour': model conv's inputs and labels are history, actions, "
       "dwell, ad, tags, counters, click, convert"},
      {"missing.tsv", "!history\tactions\tdwell\tad\ttags\tcounters\tclick\n",
       ":1: missing column 'convert' (label)"},
      {"twice.tsv", "!history\tactions\tdwell\tad\ttags\tcounters\tclick\tconvert\tad\n",
       ":1:54: column 'ad' appears twice"},
      {"fields.tsv", "1 2\t0 1\t0.5 0.5\t7\t1\t0 0\t1\n", ":2: 7 fields, but the header names "
                                                      "8 columns"},
      {"notint.tsv", "1 x2\t0 1\t0.5 0.5\t7\t1\t0 0\t1\t0\n",
       ":2:3: column 'history': 'x2' is not an integer id"},
      {"negative.tsv", "1 2\t0 1\t0.5 0.5\t-7\t1\t0 0\t1\t0\n",
       ":2:17: column 'ad': id -7 is negative"},
      {"range2.tsv", "1 2\t0 1\t0.5 0.5\t100\t1\t0 0\t1\t0\n",
       ":2:17: column 'ad': id 100 is out of range: table 'items' has 100 rows (ids must be in "
       "[0, 100))"},
      {"huge.tsv", "1 99999999999999999999\t0 1\t0.5 0.5\t7\t1\t0 0\t1\t0\n",
       ":2:3: column 'history': id 99999999999999999999 does not fit in 64 bits"},
      {"long.tsv", "1 2 3 4 5 6\t0 1 0 1 0 1\t1 1 1 1 1 1\t7\t1\t0 0\t1\t0\n",
       ":2:1: column 'history': 6 positions, more than the max length 5 of *history"},
      {"like.tsv", "1 2\t0 1 2\t0.5 0.5\t7\t1\t0 0\t1\t0\n",
       ":2:5: column 'actions': 3 values, but 'history' gives *history 2 positions here "
       "(expected 2)"},
      {"acts.tsv", "1 2\t0 4\t0.5 0.5\t7\t1\t0 0\t1\t0\n",
       ":2:7: column 'actions': id 4 is out of range: table 'acts' has 4 rows"},
      {"dense.tsv", "1 2\t0 1\t0.5 0.5\t7\t1\t0 0 0\t1\t0\n",
       ":2:21: column 'counters': expected 2 values, found 3"},
      {"sparse.tsv", "1 2\t0 1\t0.5 0.5\t\t1\t0 0\t1\t0\n",
       ":2:17: column 'ad': expected 1 id, found 0"},
      {"nan.tsv", "1 2\t0 1\t0.5 nan\t7\t1\t0 0\t1\t0\n",
       ":2:13: column 'dwell': 'nan' is not a finite fp32 number"},
      {"overflow.tsv", "1 2\t0 1\t0.5 1e39\t7\t1\t0 0\t1\t0\n",
       ":2:13: column 'dwell': '1e39' is not a finite fp32 number"},
      {"notreal.tsv", "1 2\t0 1\t0.5 0.5\t7\t1\t0 zero\t1\t0\n",
       ":2:23: column 'counters': 'zero' is not a number"},
      {"label.tsv", "1 2\t0 1\t0.5 0.5\t7\t1\t0 0\t0.5\t0\n",
       ":2:25: column 'click': label 0.5 must be 0 or 1"},
      {"tags.tsv", "1 2\t0 1\t0.5 0.5\t7\t1 2 3 4\t0 0\t1\t0\n",
       ":2:19: column 'tags': 4 positions, more than the max length 3 of *tags"},
      {"line3.tsv", "1 2\t0 1\t0.5 0.5\t7\t1\t0 0\t1\t0\n1\t0\t0.5\t7\t1\t0 0\t1\t2\n",
       ":3:19: column 'convert': label 2 must be 0 or 1"},
      {"nul.tsv", "1 2\t0 1\t0.5 0.5\t7\t1\t0 0\t1\t0\n1 2\t0 1\t0.5 0.5\t7\t1\t0 0\t1\t0@\n",
       ":3:28: a NUL byte"},
      {"empty.tsv", "!", ": empty file: the first line must name the columns"},
      {"header_only.tsv", "", ": no records after the header line"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *in = tmp_path(cases[i].name), *out = tmp_path("convert_out.gemd");
    char text[1024];
    if (cases[i].body[0] == '!') snprintf(text, sizeof text, "%s", cases[i].body + 1);
    else snprintf(text, sizeof text, "%s%s", HEADER, cases[i].body);
    size_t len = strlen(text);
    char *at = strchr(text, '@');  // stands for a NUL byte
    if (at) *at = '\0';
    write_bytes(in, text, len);
    char err[1024] = "";
    bool ok = datafile_convert(in, out, &m->s, 0, err, sizeof err);
    char want[1024];
    snprintf(want, sizeof want, "%s%s", in, cases[i].want);
    if (ok || !strstr(err, want)) {
      print_message("%s: expected\n  %s\nbut got\n  %s\n", cases[i].name, want,
                    ok ? "success" : err);
      fail();
    }
    assert_false(exists(out));  // nothing written
    assert_false(exists(tmp_path("convert_out.gemd.tmp")));
  }
  // Any name but *.csv is read as TSV.
  const char *dat = tmp_path("records.dat");
  char text[512];
  snprintf(text, sizeof text, "%s%s", HEADER, GOOD);
  write_text(dat, text);
  char err[512] = "";
  if (!datafile_convert(dat, tmp_path("dat.gemd"), &m->s, 0, err, sizeof err))
    print_message("%s\n", err);
  assert_true(err[0] == '\0');
  assert_false(datafile_convert(dat, tmp_path("dat.gemd"), &m->s, ',', err, sizeof err));
  assert_contains(err, "records.dat:1:1: unknown column 'history\tactions");
  assert_false(datafile_convert(tmp_path("nonesuch.tsv"), tmp_path("x.gemd"), &m->s, 0, err,
                                sizeof err));
  assert_contains(err, "cannot open");
  assert_contains(err, "nonesuch.tsv");
  unload(m);
}

// Random records under the right header, mostly well formed and sometimes not (a wrong
// count, a junk token, a NUL byte, a stray separator): every file converts and reads back, or
// is refused with an error naming it; never a crash.
static uint64_t next_random(uint64_t *rng) {
  *rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return *rng >> 33;
}

// Writes a field of about `count` tokens to buf; returns its length (it may hold a NUL).
static size_t random_field(char *buf, size_t size, uint64_t *rng, int count) {
  static const char *JUNK[] = {"x", "-1", "1e40", "nan", "0.5", "99999999999999999999", "+", "",
                               "\t", ",", "7"};
  size_t n = 0;
  buf[0] = '\0';
  if (next_random(rng) % 10 == 0) count += (int)(next_random(rng) % 3) - 1;  // a wrong count
  for (int k = 0; k < count && n + 32 < size; k++) {
    const char *tok = next_random(rng) % 12 == 0 ? JUNK[next_random(rng) % 11]
                                                 : (next_random(rng) % 2 ? "1" : "0");
    n += (size_t)snprintf(buf + n, size - n, "%s%s", k ? " " : "", tok);
  }
  if (next_random(rng) % 50 == 0 && n + 1 < size) buf[n++] = '\0';
  return n;
}

static void test_datafile_convert_random_records(void **state) {
  (void)state;
  Loaded *m = load("conv.gem", CONV_MODEL);
  const char *in = tmp_path("random.tsv"), *out = tmp_path("random.gemd");
  uint64_t rng = 99;
  int converted = 0;
  for (int iter = 0; iter < 300; iter++) {
    FILE *f = fopen(in, "wb");
    assert_non_null(f);
    fprintf(f, "history\tactions\tdwell\tad\ttags\tcounters\tclick\tconvert\n");
    int rows = 1 + (int)(next_random(&rng) % 4);
    for (int r = 0; r < rows; r++) {
      int len = (int)(next_random(&rng) % 4);
      int counts[8] = {len, len, len, 1, (int)(next_random(&rng) % 4), 2, 1, 1};
      for (int c = 0; c < 8; c++) {
        char field[256];
        fwrite(field, 1, random_field(field, sizeof field, &rng, counts[c]), f);
        fputc(c == 7 ? '\n' : '\t', f);
      }
    }
    fclose(f);
    char err[1024] = "";
    if (datafile_convert(in, out, &m->s, 0, err, sizeof err)) {
      converted++;
      DataReader *r = open_ok(m, out);
      assert_int_equal(datafile_examples(r), rows);
      datafile_close_reader(r);
    } else {
      assert_contains(err, in);
    }
  }
  print_message("random records: %d of 300 files converted\n", converted);
  assert_true(converted > 10 && converted < 290);
  unload(m);
}

// Many records become several chunks, and read back in order.
static void test_datafile_convert_many_records(void **state) {
  (void)state;
  Loaded *m = load("models/gem_tiny.gem", NULL);
  const char *in = tmp_path("many.csv"), *out = tmp_path("many.gemd");
  FILE *f = fopen(in, "w");
  assert_non_null(f);
  fprintf(f, "history,ad,counters,click\n");
  enum { N = 10000 };
  for (int i = 0; i < N; i++) {
    for (int p = 0; p < i % 7; p++) fprintf(f, "%s%d", p ? " " : "", (i + p) % 1000);
    fprintf(f, ",%d,%d 0 0 %g,%d\n", i % 1000, i, 0.5 * i, i % 3 == 0);
  }
  fclose(f);
  char err[512] = "";
  if (!datafile_convert(in, out, &m->s, 0, err, sizeof err)) print_message("%s\n", err);
  assert_true(err[0] == '\0');
  DataReader *r = open_ok(m, out);
  assert_int_equal(datafile_examples(r), N);
  Batch b;
  batch_alloc(&b, &m->s, 100);
  assert_true(datafile_read(r, 4050, &b, err, sizeof err));  // spans the first chunk's end
  int h = schema_find(&m->s, "history"), ad = schema_find(&m->s, "ad");
  int counters = schema_find(&m->s, "counters"), click = schema_find(&m->s, "click");
  for (int k = 0; k < 100; k++) {
    int i = 4050 + k;
    assert_int_equal(b.offsets[0][k + 1] - b.offsets[0][k], i % 7);
    if (i % 7) assert_int_equal(b.ids[h][b.offsets[0][k]], i % 1000);
    assert_int_equal(b.ids[ad][k], i % 1000);
    assert_true(b.values[counters][4 * k] == (float)i);
    assert_true(b.values[click][k] == (float)(i % 3 == 0));
  }
  batch_free(&b);
  datafile_close_reader(r);
  unload(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_datafile_round_trip_every_kind_of_input),
      cmocka_unit_test(test_datafile_round_trip_empty_sequences),
      cmocka_unit_test(test_datafile_writer_is_atomic),
      cmocka_unit_test(test_datafile_writer_refuses_an_invalid_batch),
      cmocka_unit_test(test_datafile_wrong_magic),
      cmocka_unit_test(test_datafile_unsupported_version),
      cmocka_unit_test(test_datafile_truncated_at_every_byte),
      cmocka_unit_test(test_datafile_flipped_byte_anywhere_is_refused),
      cmocka_unit_test(test_datafile_bad_offsets),
      cmocka_unit_test(test_datafile_length_over_the_models_max),
      cmocka_unit_test(test_datafile_ids_out_of_range),
      cmocka_unit_test(test_datafile_non_finite_floats_and_bad_labels),
      cmocka_unit_test(test_datafile_crc_mismatch),
      cmocka_unit_test(test_datafile_random_damage_with_valid_crcs),
      cmocka_unit_test(test_datafile_trailing_bytes),
      cmocka_unit_test(test_datafile_schema_mismatch),
      cmocka_unit_test(test_datafile_read_errors),
      cmocka_unit_test(test_datafile_crc32_known_values),
      cmocka_unit_test(test_datafile_convert_tsv_and_csv),
      cmocka_unit_test(test_datafile_convert_every_kind_of_input),
      cmocka_unit_test(test_datafile_convert_errors),
      cmocka_unit_test(test_datafile_convert_random_records),
      cmocka_unit_test(test_datafile_convert_many_records),
  };
  return cmocka_run_group_tests(tests, make_tmp_dir, remove_tmp_dir);
}
