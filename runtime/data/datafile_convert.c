// datafile_convert.c: `gemc data convert`: a TSV or CSV file of records into a gemc data file
// for a model's schema (docs/data.md, "Converting text records").
//
// The first line names the columns: every input and label of the model, in any order, each
// once. Every other non-blank line is one example. Within a field, values are separated by
// spaces: an id list, a float vector, or k floats per position. There is no quoting. Errors
// name the file, the line and the byte column of the offending value, gcc-style.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "datafile.h"
#include "file_io.h"
#include "internal_error.h"

enum { CONVERT_CHUNK = 4096 };  // examples per chunk
// The reader's caps: a line (an endless one would grow without bound) and the whole input.
static const size_t MAX_LINE_BYTES = (size_t)64 << 20;         // 64 MiB
static const int64_t MAX_INPUT_BYTES = (int64_t)1 << 40;       // 1 TiB

typedef struct Converter {
  const char *in_path;
  const Schema *s;
  char sep;
  int ncols;
  int *col_feature;    // [ncols]: the feature each column holds
  int *feature_col;    // [nfeatures]: the column of each feature
  int *owner;          // [njagged]: the feature whose field sets the dim's lengths
  Batch batch;         // rows gathered for the next chunk
  int64_t rows;        // rows in `batch`
  int64_t line;        // current line number
  char *err;
  size_t err_size;
} Converter;

// Where a field sits in the current line.
typedef struct Field {
  const char *text;
  size_t len;
  size_t column;       // 1-based byte column of its first byte
} Field;

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

// Splits `line` at the separator into at most `max` fields; returns how many there are (which
// may exceed max: the count goes on).
static int split_fields(const char *line, size_t len, char sep, Field *fields, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && line[i] != sep) continue;
    if (n < max) fields[n] = (Field){line + start, i - start, start + 1};
    n++;
    start = i + 1;
  }
  return n;
}

static bool is_blank(char c) { return c == ' ' || c == '\t'; }

// The next space-separated token of a field from *at on; false when there is none.
static bool next_token(const Field *f, size_t *at, Field *tok) {
  while (*at < f->len && is_blank(f->text[*at])) (*at)++;
  if (*at >= f->len) return false;
  size_t start = *at;
  while (*at < f->len && !is_blank(f->text[*at])) (*at)++;
  *tok = (Field){f->text + start, *at - start, f->column + start};
  return true;
}

static int count_tokens(const Field *f) {
  int n = 0;
  size_t at = 0;
  Field tok;
  while (next_token(f, &at, &tok)) n++;
  return n;
}

// "PATH:LINE:COL: column 'name': " followed by the message.
static bool field_error(Converter *c, const Field *where, int f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool field_error(Converter *c, const Field *where, int f, const char *fmt, ...) {
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return fail(c->err, c->err_size, "%s:%" PRId64 ":%zu: column '%s': %s", c->in_path, c->line,
              where->column, c->s->features[f].name, what);
}

static bool parse_id(Converter *c, const Field *tok, int f, int64_t *out) {
  char buf[64];
  const Feature *ft = &c->s->features[f];
  if (tok->len >= sizeof buf)
    return field_error(c, tok, f, "'%.20s...' is not an integer id", tok->text);
  memcpy(buf, tok->text, tok->len);
  buf[tok->len] = '\0';
  char *end;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (end == buf || *end != '\0') return field_error(c, tok, f, "'%s' is not an integer id", buf);
  if (errno == ERANGE) return field_error(c, tok, f, "id %s does not fit in 64 bits", buf);
  if (v < 0) return field_error(c, tok, f, "id %lld is negative", v);
  if (ft->id_limit > 0 && v >= ft->id_limit)
    return field_error(c, tok, f,
                       "id %lld is out of range: table '%s' has %" PRId64
                       " rows (ids must be in [0, %" PRId64 "))",
                       v, ft->id_table ? ft->id_table : "?", ft->id_limit, ft->id_limit);
  *out = (int64_t)v;
  return true;
}

static bool parse_real(Converter *c, const Field *tok, int f, double *out) {
  char buf[128];
  if (tok->len >= sizeof buf)
    return field_error(c, tok, f, "'%.20s...' is not a number", tok->text);
  memcpy(buf, tok->text, tok->len);
  buf[tok->len] = '\0';
  char *end;
  double v = strtod(buf, &end);
  if (end == buf || *end != '\0') return field_error(c, tok, f, "'%s' is not a number", buf);
  if (!isfinite(v) || !isfinite((float)v))
    return field_error(c, tok, f, "'%s' is not a finite fp32 number", buf);
  *out = v;
  return true;
}

// The number of positions example `row` has in jagged dim j, from its owner's field.
static int64_t row_length(const Converter *c, int j) {
  return c->batch.offsets[j][c->rows + 1] - c->batch.offsets[j][c->rows];
}

// Parses feature f's field into row c->rows of the batch (its dim's offsets are set).
static bool parse_field(Converter *c, int f, const Field *field) {
  const Feature *ft = &c->s->features[f];
  Batch *b = &c->batch;
  int n = count_tokens(field);
  int64_t want;  // values the field must hold
  int64_t at;    // where they go
  if (ft->jag >= 0) {
    const char *dim = c->s->ir->jagged[ft->jag].name;
    if (c->owner[ft->jag] == f) {
      if (n % ft->width != 0)
        return field_error(c, field, f, "%d values is not a multiple of %" PRId64, n, ft->width);
      if (n / ft->width > ft->max_len)
        return field_error(c, field, f, "%" PRId64 " positions, more than the max length %"
                           PRId64 " of *%s", n / ft->width, ft->max_len, dim);
      b->offsets[ft->jag][c->rows + 1] = b->offsets[ft->jag][c->rows] + n / ft->width;
    } else if (n != row_length(c, ft->jag) * ft->width) {
      return field_error(c, field, f,
                         "%d values, but '%s' gives *%s %" PRId64 " positions here (expected %"
                         PRId64 ")", n, c->s->features[c->owner[ft->jag]].name, dim,
                         row_length(c, ft->jag), row_length(c, ft->jag) * ft->width);
    }
    want = n;
    at = b->offsets[ft->jag][c->rows] * ft->width;
  } else {
    want = ft->width;
    at = c->rows * ft->width;
    if (n != want) {
      const char *what = ft->kind == FEATURE_IDS ? "id" : ft->kind == FEATURE_LABEL ? "label"
                                                                                     : "value";
      return field_error(c, field, f, "expected %" PRId64 " %s%s, found %d", want, what,
                         want == 1 ? "" : "s", n);
    }
  }
  batch_reserve(b, f, at + want);
  size_t pos = 0;
  Field tok;
  for (int64_t e = 0; e < want && next_token(field, &pos, &tok); e++) {
    if (ft->kind == FEATURE_IDS) {
      if (!parse_id(c, &tok, f, &b->ids[f][at + e])) return false;
      continue;
    }
    double v = 0.0;
    if (!parse_real(c, &tok, f, &v)) return false;
    if (ft->kind == FEATURE_LABEL && v != 0.0 && v != 1.0)
      return field_error(c, &tok, f, "label %.*s must be 0 or 1", (int)tok.len, tok.text);
    b->values[f][at + e] = (float)v;
  }
  return true;
}

static bool read_header_line(Converter *c, char *line, size_t len) {
  const Schema *s = c->s;
  int n = split_fields(line, len, c->sep, NULL, 0);
  Field *fields = xcalloc((size_t)n, sizeof *fields);
  split_fields(line, len, c->sep, fields, n);
  c->ncols = n;
  c->col_feature = xcalloc((size_t)n, sizeof *c->col_feature);
  bool ok = true;
  for (int k = 0; k < n && ok; k++) {
    Field name = fields[k];
    while (name.len && is_blank(name.text[0])) name.text++, name.len--, name.column++;
    while (name.len && is_blank(name.text[name.len - 1])) name.len--;
    int f = -1;
    for (int i = 0; i < s->nfeatures && f < 0; i++)
      if (strlen(s->features[i].name) == name.len &&
          memcmp(s->features[i].name, name.text, name.len) == 0)
        f = i;
    if (f < 0) {
      char list[512] = "";
      for (int i = 0; i < s->nfeatures; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 s->features[i].name);
      ok = fail(c->err, c->err_size,
                "%s:1:%zu: unknown column '%.*s': model %s's inputs and labels are %s",
                c->in_path, name.column, (int)name.len, name.text,
                s->ir->model ? s->ir->model : "?", list);
    } else if (c->feature_col[f] >= 0) {
      ok = fail(c->err, c->err_size, "%s:1:%zu: column '%s' appears twice", c->in_path,
                name.column, s->features[f].name);
    } else {
      c->col_feature[k] = f;
      c->feature_col[f] = k;
    }
  }
  for (int f = 0; f < s->nfeatures && ok; f++) {
    if (c->feature_col[f] >= 0) continue;
    char type[128];
    const Feature *ft = &s->features[f];
    feature_describe(ft, ft->jag >= 0 ? s->ir->jagged[ft->jag].name : "", type, sizeof type);
    ok = fail(c->err, c->err_size, "%s:1: missing column '%s' (%s)", c->in_path, ft->name, type);
  }
  free(fields);
  return ok;
}

// Parses one record into the next row of the batch.
static bool read_record(Converter *c, char *line, size_t len) {
  const Schema *s = c->s;
  Field *fields = xcalloc((size_t)c->ncols, sizeof *fields);
  int n = split_fields(line, len, c->sep, fields, c->ncols);
  bool ok = true;
  if (n != c->ncols)
    ok = fail(c->err, c->err_size, "%s:%" PRId64 ": %d fields, but the header names %d columns",
              c->in_path, c->line, n, c->ncols);
  for (int j = 0; j < s->njagged; j++)  // a dim no column sets stays empty
    if (c->owner[j] < 0) c->batch.offsets[j][c->rows + 1] = c->batch.offsets[j][c->rows];
  // Owners first, in schema order, so every aligned field knows its row's lengths.
  for (int pass = 0; pass < 2 && ok; pass++)
    for (int f = 0; f < s->nfeatures && ok; f++) {
      const Feature *ft = &s->features[f];
      bool owner = ft->jag >= 0 && c->owner[ft->jag] == f;
      if (owner == (pass == 0)) ok = parse_field(c, f, &fields[c->feature_col[f]]);
    }
  free(fields);
  if (!ok) return false;
  c->rows++;
  return true;
}

// Writes the gathered rows as one chunk.
static bool flush_rows(Converter *c, DataWriter *w) {
  if (c->rows == 0) return true;
  Batch chunk;
  batch_alloc(&chunk, c->s, c->rows);
  batch_copy(c->s, &chunk, 0, &c->batch, 0, c->rows);
  bool ok = datafile_write(w, &chunk, c->err, c->err_size);
  batch_free(&chunk);
  c->rows = 0;
  return ok;
}

// Reads one line (its '\n' included) into *line, at most MAX_LINE_BYTES. Returns its length,
// 0 at the end of the input, -1 when the line is too long or the input too large.
static ssize_t read_line(Converter *c, FILE *in, char **line, size_t *cap, int64_t *total) {
  size_t len = 0;
  int ch;
  while ((ch = getc_unlocked(in)) != EOF) {
    if (len + 2 > *cap) {
      *cap = *cap ? 2 * *cap : 1 << 16;
      *line = xrealloc(*line, *cap);
    }
    (*line)[len++] = (char)ch;
    if (len > MAX_LINE_BYTES) {
      fail(c->err, c->err_size, "%s:%" PRId64 ": the line is longer than 64 MiB, the most a "
           "line may be", c->in_path, c->line + 1);
      return -1;
    }
    if (ch == '\n') break;
  }
  *total += (int64_t)len;
  if (*total > MAX_INPUT_BYTES) {
    fail(c->err, c->err_size, "%s: the input is larger than 1 TiB, the most gemc data "
         "convert reads", c->in_path);
    return -1;
  }
  return (ssize_t)len;
}

static bool convert_lines(Converter *c, FILE *in, DataWriter *w, int64_t *records) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int64_t total = 0;
  bool ok = true, header = false;
  while (ok && (got = read_line(c, in, &line, &cap, &total)) > 0) {
    c->line++;
    size_t len = (size_t)got;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    const char *nul = memchr(line, '\0', len);
    if (nul) {
      ok = fail(c->err, c->err_size, "%s:%" PRId64 ":%zu: a NUL byte", c->in_path, c->line,
                (size_t)(nul - line) + 1);
      break;
    }
    if (!header) {
      ok = read_header_line(c, line, len);
      header = true;
      continue;
    }
    size_t k = 0;
    while (k < len && is_blank(line[k])) k++;
    if (k == len) continue;  // a blank line
    ok = read_record(c, line, len);
    if (ok) (*records)++;
    if (ok && c->rows == CONVERT_CHUNK) ok = flush_rows(c, w);
  }
  if (got < 0) ok = false;
  if (ok && ferror(in)) ok = fail(c->err, c->err_size, "cannot read %s: %s", c->in_path,
                                  strerror(errno));
  if (ok && !header)
    ok = fail(c->err, c->err_size, "%s: empty file: the first line must name the columns",
              c->in_path);
  if (ok && *records == 0)
    ok = fail(c->err, c->err_size, "%s: no records after the header line", c->in_path);
  if (ok) ok = flush_rows(c, w);
  free(line);
  return ok;
}

bool datafile_convert(const char *in_path, const char *out_path, const Schema *s, char sep,
                      char *err, size_t err_size) {
  if (sep == 0) sep = ends_with(in_path, ".csv") || ends_with(in_path, ".CSV") ? ',' : '\t';
  if (sep == ' ' || sep == '\n' || sep == '\r')
    return fail(err, err_size, "'%c' cannot separate columns: it separates values", sep);
  // A regular file only: a FIFO is refused rather than waited on, and the output may not be
  // the input.
  int fd = file_open_input(in_path, "input", MAX_INPUT_BYTES, NULL, err, err_size);
  if (fd < 0) return false;
  if (!file_refuse_same(out_path, in_path, err, err_size)) {
    close(fd);
    return false;
  }
  FILE *in = fdopen(fd, "r");
  if (!in) {
    close(fd);
    return fail(err, err_size, "cannot open %s: %s", in_path, strerror(errno));
  }
  DataWriter *w = datafile_create(out_path, s, err, err_size);
  if (!w) {
    fclose(in);
    return false;
  }
  Converter c = {.in_path = in_path, .s = s, .sep = sep, .err = err, .err_size = err_size};
  c.feature_col = xcalloc((size_t)s->nfeatures, sizeof *c.feature_col);
  c.owner = xcalloc((size_t)s->njagged, sizeof *c.owner);
  for (int f = 0; f < s->nfeatures; f++) c.feature_col[f] = -1;
  for (int j = 0; j < s->njagged; j++) c.owner[j] = -1;
  for (int f = 0; f < s->nfeatures; f++) {
    const Feature *ft = &s->features[f];
    if (ft->jag >= 0 && (c.owner[ft->jag] < 0 || ft->owns_lengths)) {
      if (c.owner[ft->jag] < 0 || !s->features[c.owner[ft->jag]].owns_lengths)
        c.owner[ft->jag] = f;
    }
  }
  batch_alloc(&c.batch, s, CONVERT_CHUNK);
  int64_t records = 0;
  bool ok = convert_lines(&c, in, w, &records);
  fclose(in);
  if (ok) ok = datafile_close(w, err, err_size);
  else datafile_abort(w);
  batch_free(&c.batch);
  free(c.col_feature);
  free(c.feature_col);
  free(c.owner);
  return ok;
}
