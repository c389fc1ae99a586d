// table_sync.c: the table placements of table_sync.h.
#include "table_sync.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "clock.h"

typedef struct TState {
  int tensor;
  int64_t rows, dim;
  TablePlacement place;     // decided: never PLACE_AUTO
  int owner;                // table-wise: the rank that holds it
  bool dealt;               // table-wise: owner decided
  int *features;            // the schema's id features looked up in it
  int nfeatures;
  // Its group: the tables linked to it through shared id features (itself included), and
  // the id features they read, which make its window (table_sync_windowed).
  int *group_features;
  int ngroup_features;
  int64_t group_rows;       // the most rows of a table of its group: the window's bound
  // The reduced gradient of the rows this rank updates (table_sync_reduce).
  int64_t *ids, n, cap;
  float *g;
  // Windowed (table_sync_windowed): this rank holds only the rows it owns, `own` [nown x dim]
  // (row id at table_sync_local_row), and the executor a window of the batch's rows: the
  // distinct ids `window` of its group's features, ascending, which the bound batch's ids of
  // it index (a window row of an id the table itself does not read is zero, and unread).
  bool windowed;
  int64_t nown;
  float *own;
  int64_t *window;
  int64_t *grad_ids, cap_grad_ids;  // the executor's gradient rows as table ids
  int64_t **rows_of, *cap_rows_of;  // [nfeatures]: the batch's ids of feature k as window rows
} TState;

struct TableSync {
  Comm *c;
  const Ir *ir;
  const Schema *schema;
  TState *t;
  int nt;
  int world, rank;
  int64_t *send_counts, *recv_counts;  // [world] each
  // The batch the executor binds: the fetched batch with windowed tables' ids as window rows
  // (its id arrays are the batch's, or rows_of), so the batch itself is left as it was.
  Batch view;
  int64_t **view_ids;  // [schema->nfeatures]
  double seconds;
  double a2a_bytes, a2a_seconds;  // what this rank's all-to-alls of ids, rows and gradients sent
};

const char *table_placement_name(TablePlacement p) {
  switch (p) {
    case PLACE_TABLE: return "table";
    case PLACE_ROW: return "row";
    case PLACE_AUTO: return "auto";
    default: return "replicate";
  }
}

bool table_placement_parse(const char *s, TablePlacement *out) {
  static const TablePlacement all[] = {PLACE_REPLICATE, PLACE_TABLE, PLACE_ROW, PLACE_AUTO};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(s, table_placement_name(all[i])) == 0) {
      *out = all[i];
      return true;
    }
  return false;
}

// The ids come from batches the data reader checked: in [0, rows). Every rank owns every row
// of a replicated table.
static int owner_of(const TableSync *s, const TState *t, int64_t id) {
  return t->place == PLACE_TABLE ? t->owner
         : t->place == PLACE_ROW ? (int)(id % s->world)
                                 : s->rank;
}

static bool shares_feature(const TState *a, const TState *b) {
  for (int i = 0; i < a->nfeatures; i++)
    for (int j = 0; j < b->nfeatures; j++)
      if (a->features[i] == b->features[j]) return true;
  return false;
}

TableSync *table_sync_new(Comm *c, const Ir *ir, const Schema *schema,
                          const TablePlacement *placement) {
  TableSync *s = xcalloc(1, sizeof *s);
  s->c = c;
  s->ir = ir;
  s->schema = schema;
  s->world = comm_world(c);
  s->rank = comm_rank(c);
  s->send_counts = xcalloc((size_t)s->world, sizeof *s->send_counts);
  s->recv_counts = xcalloc((size_t)s->world, sizeof *s->recv_counts);
  s->t = xcalloc((size_t)ir->ntensors + 1, sizeof *s->t);
  s->view_ids = xcalloc((size_t)schema->nfeatures + 1, sizeof *s->view_ids);
  double *load = xcalloc((size_t)s->world, sizeof *load);
  for (int i = 0; i < ir->ntensors; i++) {
    const Tensor *x = &ir->tensors[i];
    if (x->kind != TENSOR_TABLE) continue;
    TState *t = &s->t[s->nt++];
    t->tensor = i;
    t->rows = x->fixed[0];
    t->dim = x->nfixed > 1 ? x->fixed[1] : 1;
    t->place = placement[i];
    if (t->place == PLACE_AUTO)
      t->place = t->rows >= AUTO_ROW_WISE_ROWS ? PLACE_ROW : PLACE_REPLICATE;
    if (s->world == 1) t->place = PLACE_REPLICATE;
    t->features = xcalloc((size_t)schema->nfeatures + 1, sizeof *t->features);
    for (int f = 0; f < schema->nfeatures; f++)
      for (int k = 0; k < ir->nnodes; k++) {
        const Node *n = &ir->nodes[k];
        if ((n->op == OP_EMBED || n->op == OP_EMBED_POOL) && n->nins >= 2 && n->ins[0] == i &&
            n->ins[1] == schema->features[f].tensor) {
          t->features[t->nfeatures++] = f;
          break;
        }
      }
  }
  // Table-wise tables go, largest first, to the rank holding the fewest bytes so far (the
  // order of equal sizes is the IR's, so every rank decides the same).
  for (;;) {
    TState *big = NULL;
    for (int k = 0; k < s->nt; k++)
      if (s->t[k].place == PLACE_TABLE && !s->t[k].dealt &&
          (!big || s->t[k].rows * s->t[k].dim > big->rows * big->dim))
        big = &s->t[k];
    if (!big) break;
    int best = 0;
    for (int r = 1; r < s->world; r++)
      if (load[r] < load[best]) best = r;
    big->owner = best;
    load[best] += (double)(big->rows * big->dim);
    big->dealt = true;
  }
  free(load);
  // Tables that share an id feature read its ids as rows of one window, so they are grouped
  // (linked through shared features, transitively), and a group's window holds the distinct
  // ids of all its features. A group with a sharded table is windowed; a replicated table of
  // it then holds all its rows as its own (every rank owns every row) and fills its window
  // from them.
  int *group = xcalloc((size_t)s->nt + 1, sizeof *group);
  for (int k = 0; k < s->nt; k++) group[k] = k;
  for (bool merged = true; merged;) {  // the smallest index of each linked set
    merged = false;
    for (int k = 0; k < s->nt; k++)
      for (int j = 0; j < s->nt; j++)
        if (group[j] < group[k] && shares_feature(&s->t[k], &s->t[j])) {
          group[k] = group[j];
          merged = true;
        }
  }
  for (int k = 0; k < s->nt; k++) {
    TState *t = &s->t[k];
    t->group_features = xcalloc((size_t)schema->nfeatures + 1, sizeof *t->group_features);
    t->windowed = false;
    for (int j = 0; j < s->nt; j++) {
      if (group[j] != group[k]) continue;
      t->windowed = t->windowed || s->t[j].place != PLACE_REPLICATE;
      if (s->t[j].rows > t->group_rows) t->group_rows = s->t[j].rows;
      for (int a = 0; a < s->t[j].nfeatures; a++) {
        bool seen = false;
        for (int b = 0; b < t->ngroup_features; b++)
          seen = seen || t->group_features[b] == s->t[j].features[a];
        if (!seen) t->group_features[t->ngroup_features++] = s->t[j].features[a];
      }
    }
  }
  free(group);
  for (int k = 0; k < s->nt; k++) {
    TState *t = &s->t[k];
    if (!t->windowed) continue;
    t->nown = t->place == PLACE_REPLICATE ? t->rows
                                          : table_sync_owned_ids(s, t->tensor, s->rank, NULL);
    t->rows_of = xcalloc((size_t)t->nfeatures + 1, sizeof *t->rows_of);
    t->cap_rows_of = xcalloc((size_t)t->nfeatures + 1, sizeof *t->cap_rows_of);
  }
  return s;
}

void table_sync_free(TableSync *s) {
  if (!s) return;
  for (int k = 0; k < s->nt; k++) {
    free(s->t[k].features);
    free(s->t[k].group_features);
    free(s->t[k].ids);
    free(s->t[k].g);
    free(s->t[k].own);
    free(s->t[k].window);
    free(s->t[k].grad_ids);
    for (int f = 0; s->t[k].rows_of && f < s->t[k].nfeatures; f++) free(s->t[k].rows_of[f]);
    free(s->t[k].rows_of);
    free(s->t[k].cap_rows_of);
  }
  free(s->view_ids);
  free(s->t);
  free(s->send_counts);
  free(s->recv_counts);
  free(s);
}

static const TState *find(const TableSync *s, int table) {
  for (int k = 0; k < s->nt; k++)
    if (s->t[k].tensor == table) return &s->t[k];
  return NULL;
}

TablePlacement table_sync_placement(const TableSync *s, int table) {
  const TState *t = find(s, table);
  return t ? t->place : PLACE_REPLICATE;
}

bool table_sync_any_sharded(const TableSync *s) {
  for (int k = 0; k < s->nt; k++)
    if (s->t[k].place != PLACE_REPLICATE) return true;
  return false;
}

void table_sync_describe(const TableSync *s, char *buf, size_t size) {
  size_t at = 0;
  buf[0] = '\0';
  for (int k = 0; k < s->nt && at < size; k++) {
    const TState *t = &s->t[k];
    char where[64];
    if (t->place == PLACE_ROW)
      snprintf(where, sizeof where, "row-wise over %d ranks%s", s->world,
               t->windowed ? ", each holding its rows only" : "");
    else if (t->place == PLACE_TABLE)
      snprintf(where, sizeof where, "table-wise, on rank %d%s", t->owner,
               t->windowed ? " only" : "");
    else snprintf(where, sizeof where, "replicated on every rank");
    int n = snprintf(buf + at, size - at, "%s  %s: %" PRId64 " x %" PRId64 ", %s", at ? "\n" : "",
                     s->ir->tensors[t->tensor].name, t->rows, t->dim, where);
    if (n < 0) break;
    at += (size_t)n;
  }
}

// --- exchanges ---------------------------------------------------------------------------

// All-to-all of this rank's send_counts, so recv_counts says what each rank sends here.
static bool exchange_counts(TableSync *s, const char *what, char *err, size_t err_size) {
  int64_t *ones = xcalloc((size_t)s->world, sizeof *ones);
  for (int r = 0; r < s->world; r++) ones[r] = 1;
  CommCall call = {.kind = COMM_ALLTOALL, .dtype = COMM_I64, .send = s->send_counts,
                   .recv = s->recv_counts, .send_counts = ones, .recv_counts = ones,
                   .what = what};
  bool ok = comm_run(s->c, &call, err, err_size);
  free(ones);
  return ok;
}

// All-to-all with per-peer counts scaled by `width` elements each.
static bool exchange(TableSync *s, CommDtype dtype, const void *send, void *recv,
                     int64_t width, const char *what, char *err, size_t err_size) {
  int64_t *sc = xcalloc((size_t)s->world, sizeof *sc), *rc = xcalloc((size_t)s->world, sizeof *rc);
  for (int r = 0; r < s->world; r++) {
    sc[r] = s->send_counts[r] * width;
    rc[r] = s->recv_counts[r] * width;
  }
  CommCall call = {.kind = COMM_ALLTOALL, .dtype = dtype, .send = send, .recv = recv,
                   .send_counts = sc, .recv_counts = rc, .what = what};
  double t0 = monotonic_seconds();
  bool ok = comm_run(s->c, &call, err, err_size);
  s->a2a_seconds += monotonic_seconds() - t0;
  for (int r = 0; r < s->world; r++)
    if (r != s->rank) s->a2a_bytes += (double)sc[r] * (double)comm_dtype_size(dtype);
  free(sc);
  free(rc);
  return ok;
}

static int64_t sum_counts(const int64_t *c, int n) {
  int64_t s = 0;
  for (int r = 0; r < n; r++) s += c[r];
  return s;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

// The distinct ids of features[nf] in batch b, ascending; *n of them (caller frees).
static int64_t *feature_ids(const TableSync *s, const int *features, int nf, const Batch *b,
                            int64_t *n) {
  int64_t total = 0;
  for (int k = 0; k < nf; k++) {
    const Feature *f = &s->schema->features[features[k]];
    total += (f->jag >= 0 ? b->total[f->jag] : b->B) * f->width;
  }
  int64_t *ids = xcalloc((size_t)total + 1, sizeof *ids), m = 0;
  for (int k = 0; k < nf; k++) {
    const Feature *f = &s->schema->features[features[k]];
    int64_t cnt = (f->jag >= 0 ? b->total[f->jag] : b->B) * f->width;
    memcpy(ids + m, b->ids[features[k]], (size_t)cnt * sizeof *ids);
    m += cnt;
  }
  qsort(ids, (size_t)m, sizeof *ids, cmp_i64);
  int64_t u = 0;
  for (int64_t i = 0; i < m; i++)
    if (u == 0 || ids[i] != ids[u - 1]) ids[u++] = ids[i];
  *n = u;
  return ids;
}

// The distinct ids of table t that batch b reads, ascending; *n of them (caller frees).
static int64_t *batch_ids(const TableSync *s, const TState *t, const Batch *b, int64_t *n) {
  return feature_ids(s, t->features, t->nfeatures, b, n);
}

// Orders ids[n] (ascending) by owner, each owner's ids still ascending, into out; sets
// send_counts. perm[i]: where ids[i] went (may be NULL).
static void by_owner(TableSync *s, const TState *t, const int64_t *ids, int64_t n,
                     int64_t *out, int64_t *perm) {
  memset(s->send_counts, 0, (size_t)s->world * sizeof *s->send_counts);
  for (int64_t i = 0; i < n; i++) s->send_counts[owner_of(s, t, ids[i])]++;
  int64_t *at = xcalloc((size_t)s->world, sizeof *at);
  for (int r = 1; r < s->world; r++) at[r] = at[r - 1] + s->send_counts[r - 1];
  for (int64_t i = 0; i < n; i++) {
    int64_t to = at[owner_of(s, t, ids[i])]++;
    out[to] = ids[i];
    if (perm) perm[i] = to;
  }
  free(at);
}

// The row of `own` that holds id, which this rank owns.
static int64_t local_row(const TableSync *s, const TState *t, int64_t id) {
  return t->place == PLACE_ROW ? id / s->world : id;
}

// Rows want[m] of table t (ordered by owner, send_counts set by by_owner) from their owners,
// into *got [m x dim] (caller frees); meanwhile this rank answers what the others ask of it,
// from `own` (windowed) or the executor's whole table.
static bool ask_rows(TableSync *s, TState *t, CpuExec *x, const int64_t *want, int64_t m,
                     float **got, char *err, size_t err_size) {
  bool ok = exchange_counts(s, "table row counts", err, err_size);
  int64_t nask = ok ? sum_counts(s->recv_counts, s->world) : 0;
  int64_t *asked = xcalloc((size_t)nask + 1, sizeof *asked);
  ok = ok && exchange(s, COMM_I64, want, asked, 1, "table row ids", err, err_size);
  const float *w = t->windowed ? t->own : cpu_exec_data(x, t->tensor);
  float *give = xcalloc((size_t)(nask * t->dim) + 1, sizeof *give);
  for (int64_t i = 0; ok && i < nask; i++) {
    if (asked[i] < 0 || asked[i] >= t->rows || owner_of(s, t, asked[i]) != s->rank) {
      ok = fail(err, err_size, "internal error: rank %d was asked for row %" PRId64 " of "
                "table '%s', which it does not own", s->rank, asked[i],
                s->ir->tensors[t->tensor].name);
      break;
    }
    int64_t row = t->windowed ? local_row(s, t, asked[i]) : asked[i];
    memcpy(give + i * t->dim, w + row * t->dim, (size_t)t->dim * sizeof *give);
  }
  *got = xcalloc((size_t)(m * t->dim) + 1, sizeof **got);
  // The answers travel back: what this rank was asked is what it sends.
  int64_t *swap = s->send_counts;
  s->send_counts = s->recv_counts;
  s->recv_counts = swap;
  ok = ok && exchange(s, COMM_F32, give, *got, t->dim, "table rows", err, err_size);
  free(asked);
  free(give);
  return ok;
}

// The index of id in ids[n] (ascending, and holding it).
static int64_t index_of(const int64_t *ids, int64_t n, int64_t id) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// A windowed table's window for batch b: the distinct ids of its group's features, the rows
// of those it reads itself in the executor (this rank's own from `own`, the others fetched;
// the rest zero), and b's ids of it as window rows in the view.
static bool fetch_window(TableSync *s, TState *t, CpuExec *x, const Batch *b, char *err,
                         size_t err_size) {
  int64_t n = 0, *all = feature_ids(s, t->group_features, t->ngroup_features, b, &n), m = 0;
  free(t->window);
  t->window = all;
  float *w = cpu_exec_set_table_rows(x, t->tensor, n);
  memset(w, 0, (size_t)(n * t->dim) * sizeof *w);
  int64_t nread = 0, *read = batch_ids(s, t, b, &nread);
  int64_t *pos = xcalloc((size_t)nread + 1, sizeof *pos), *theirs = xcalloc((size_t)nread + 1, sizeof *theirs);
  for (int64_t r = 0; r < nread; r++) {
    int64_t i = index_of(all, n, read[r]);
    if (owner_of(s, t, all[i]) == s->rank) {
      memcpy(w + i * t->dim, t->own + local_row(s, t, all[i]) * t->dim,
             (size_t)t->dim * sizeof *w);
    } else {
      pos[m] = i;
      theirs[m++] = all[i];
    }
  }
  free(read);
  int64_t *want = xcalloc((size_t)m + 1, sizeof *want), *perm = xcalloc((size_t)m + 1, sizeof *perm);
  by_owner(s, t, theirs, m, want, perm);
  float *got = NULL;
  bool ok = ask_rows(s, t, x, want, m, &got, err, err_size);
  for (int64_t i = 0; ok && i < m; i++)
    memcpy(w + pos[i] * t->dim, got + perm[i] * t->dim, (size_t)t->dim * sizeof *w);
  for (int k = 0; ok && k < t->nfeatures; k++) {
    const Feature *f = &s->schema->features[t->features[k]];
    int64_t cnt = (f->jag >= 0 ? b->total[f->jag] : b->B) * f->width;
    if (cnt > t->cap_rows_of[k]) {
      free(t->rows_of[k]);
      t->cap_rows_of[k] = cnt + cnt / 4;
      t->rows_of[k] = xcalloc((size_t)t->cap_rows_of[k] + 1, sizeof *t->rows_of[k]);
    }
    const int64_t *ids = b->ids[t->features[k]];
    for (int64_t r = 0; r < cnt; r++) t->rows_of[k][r] = index_of(all, n, ids[r]);
    s->view_ids[t->features[k]] = t->rows_of[k];
  }
  free(pos);
  free(theirs);
  free(want);
  free(perm);
  free(got);
  return ok;
}

bool table_sync_fetch(TableSync *s, CpuExec *x, const Batch *b, const Batch **bound, char *err,
                      size_t err_size) {
  double t0 = monotonic_seconds();
  bool ok = true;
  s->view = *b;
  for (int f = 0; f < s->schema->nfeatures; f++) s->view_ids[f] = b->ids[f];
  s->view.ids = s->view_ids;
  *bound = &s->view;
  for (int k = 0; ok && k < s->nt; k++) {
    TState *t = &s->t[k];
    if (t->windowed) {
      ok = fetch_window(s, t, x, b, err, err_size);
      continue;
    }
    if (t->place == PLACE_REPLICATE) continue;
    int64_t n = 0, *all = batch_ids(s, t, b, &n), m = 0;
    for (int64_t i = 0; i < n; i++)  // the ids this rank does not own
      if (owner_of(s, t, all[i]) != s->rank) all[m++] = all[i];
    int64_t *want = xcalloc((size_t)m + 1, sizeof *want);
    by_owner(s, t, all, m, want, NULL);
    float *got = NULL;
    ok = ask_rows(s, t, x, want, m, &got, err, err_size);
    float *w = cpu_exec_data(x, t->tensor);
    for (int64_t i = 0; ok && i < m; i++)
      memcpy(w + want[i] * t->dim, got + i * t->dim, (size_t)t->dim * sizeof *got);
    free(all);
    free(want);
    free(got);
  }
  s->seconds += monotonic_seconds() - t0;
  return ok;
}

typedef struct Entry {
  int64_t id, pos;
} Entry;

static int by_id_then_pos(const void *a, const void *b) {
  const Entry *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

// The rows of every rank, in rank order (ids[n], vals[n x dim]), summed per distinct id in
// rank order into t's result.
static void merge(TState *t, const int64_t *ids, const float *vals, int64_t n) {
  Entry *e = xcalloc((size_t)n + 1, sizeof *e);
  for (int64_t i = 0; i < n; i++) e[i] = (Entry){ids[i], i};
  qsort(e, (size_t)n, sizeof *e, by_id_then_pos);
  if (n > t->cap) {
    free(t->ids);
    free(t->g);
    t->cap = n;
    t->ids = xcalloc((size_t)n, sizeof *t->ids);
    t->g = xcalloc((size_t)(n * t->dim), sizeof *t->g);
  }
  t->n = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *v = vals + e[i].pos * t->dim;
    float *dst;
    if (t->n > 0 && t->ids[t->n - 1] == e[i].id) {
      dst = t->g + (t->n - 1) * t->dim;
      for (int64_t d = 0; d < t->dim; d++) dst[d] += v[d];
    } else {
      t->ids[t->n] = e[i].id;
      dst = t->g + t->n * t->dim;
      memcpy(dst, v, (size_t)t->dim * sizeof *dst);
      t->n++;
    }
  }
  free(e);
}

// This rank's rows of table t (ids[n], g[n x dim]) to the ranks that update them, summed there.
static bool reduce_rows(TableSync *s, TState *t, const int64_t *ids, const float *g, int64_t n,
                        double share, char *err, size_t err_size) {
  if (!g) n = 0;
  float *scaled = xcalloc((size_t)(n * t->dim) + 1, sizeof *scaled);
  int64_t *send_ids = xcalloc((size_t)n + 1, sizeof *send_ids), *perm = NULL;
  bool ok;
  if (t->place == PLACE_REPLICATE) {
    // Every rank sends its rows to every rank: an all-to-all with the same data for each.
    memcpy(send_ids, ids, (size_t)n * sizeof *send_ids);
    for (int64_t i = 0; i < n * t->dim; i++) scaled[i] = g[i] * (float)share;
    int64_t *counts = xcalloc((size_t)s->world, sizeof *counts), one = n;
    int64_t *ones = xcalloc((size_t)s->world, sizeof *ones);
    for (int r = 0; r < s->world; r++) ones[r] = 1;
    CommCall cc = {.kind = COMM_ALLGATHER, .dtype = COMM_I64, .send = &one, .recv = counts,
                   .counts = ones, .what = "table gradient row counts"};
    ok = comm_run(s->c, &cc, err, err_size);
    int64_t total = ok ? sum_counts(counts, s->world) : 0;
    int64_t *all_ids = xcalloc((size_t)total + 1, sizeof *all_ids);
    float *all_g = xcalloc((size_t)(total * t->dim) + 1, sizeof *all_g);
    CommCall ci = {.kind = COMM_ALLGATHER, .dtype = COMM_I64, .send = send_ids,
                   .recv = all_ids, .counts = counts, .what = "table gradient ids"};
    ok = ok && comm_run(s->c, &ci, err, err_size);
    for (int r = 0; r < s->world; r++) counts[r] *= t->dim;
    CommCall cg = {.kind = COMM_ALLGATHER, .dtype = COMM_F32, .send = scaled, .recv = all_g,
                   .counts = counts, .what = "table gradient rows"};
    ok = ok && comm_run(s->c, &cg, err, err_size);
    if (ok) merge(t, all_ids, all_g, total);
    free(counts);
    free(ones);
    free(all_ids);
    free(all_g);
  } else {
    perm = xcalloc((size_t)n + 1, sizeof *perm);
    by_owner(s, t, ids, n, send_ids, perm);
    for (int64_t i = 0; i < n; i++)
      for (int64_t d = 0; d < t->dim; d++)
        scaled[perm[i] * t->dim + d] = g[i * t->dim + d] * (float)share;
    ok = exchange_counts(s, "table gradient row counts", err, err_size);
    int64_t total = ok ? sum_counts(s->recv_counts, s->world) : 0;
    int64_t *got_ids = xcalloc((size_t)total + 1, sizeof *got_ids);
    float *got_g = xcalloc((size_t)(total * t->dim) + 1, sizeof *got_g);
    ok = ok && exchange(s, COMM_I64, send_ids, got_ids, 1, "table gradient ids", err, err_size) &&
         exchange(s, COMM_F32, scaled, got_g, t->dim, "table gradient rows", err, err_size);
    if (ok) merge(t, got_ids, got_g, total);
    free(got_ids);
    free(got_g);
  }
  free(scaled);
  free(send_ids);
  free(perm);
  return ok;
}

bool table_sync_reduce(TableSync *s, CpuExec *x, double share, char *err, size_t err_size) {
  double t0 = monotonic_seconds();
  bool ok = true;
  for (int k = 0; ok && k < s->nt; k++) {
    int64_t n = 0;
    const int64_t *ids = NULL;
    TState *t = &s->t[k];
    const float *g = cpu_exec_grad(x, t->tensor, &n, &ids);
    if (g && t->windowed) {  // window rows to table ids (ascending, as the window is)
      if (n > t->cap_grad_ids) {
        free(t->grad_ids);
        t->cap_grad_ids = n;
        t->grad_ids = xcalloc((size_t)n, sizeof *t->grad_ids);
      }
      for (int64_t i = 0; i < n; i++) t->grad_ids[i] = t->window[ids[i]];
      ids = t->grad_ids;
    }
    ok = reduce_rows(s, t, ids, g, n, share, err, err_size);
  }
  s->seconds += monotonic_seconds() - t0;
  return ok;
}

bool table_sync_reduce_rows(TableSync *s, int table, const int64_t *ids, const float *g,
                            int64_t n, double share, char *err, size_t err_size) {
  TState *t = NULL;
  for (int k = 0; k < s->nt; k++)
    if (s->t[k].tensor == table) t = &s->t[k];
  if (!t) return fail(err, err_size, "internal error: %d is not a trained table", table);
  double t0 = monotonic_seconds();
  bool ok = reduce_rows(s, t, ids, g, n, share, err, err_size);
  s->seconds += monotonic_seconds() - t0;
  return ok;
}

void table_sync_grad(const TableSync *s, int table, const int64_t **ids, const float **g,
                     int64_t *nrows) {
  const TState *t = find(s, table);
  *ids = t ? t->ids : NULL;
  *g = t ? t->g : NULL;
  *nrows = t ? t->n : 0;
}

int64_t table_sync_owned_ids(const TableSync *s, int table, int rank, int64_t *ids) {
  const TState *t = find(s, table);
  if (!t || t->place == PLACE_REPLICATE) return 0;
  int64_t n = 0, first = t->place == PLACE_TABLE ? 0 : rank;
  int64_t stride = t->place == PLACE_TABLE ? 1 : s->world;
  if (t->place == PLACE_TABLE && t->owner != rank) return 0;
  for (int64_t id = first; id < t->rows; id += stride, n++)
    if (ids) ids[n] = id;
  return n;
}

void table_sync_windowed(const TableSync *s, bool *windowed) {
  for (int k = 0; k < s->nt; k++) windowed[s->t[k].tensor] = s->t[k].windowed;
}

float *table_sync_own_rows(const TableSync *s, int table, int64_t *nown) {
  const TState *t = find(s, table);
  if (nown) *nown = t && t->windowed ? t->nown : 0;
  return t && t->windowed ? t->own : NULL;
}

int64_t table_sync_local_row(const TableSync *s, int table, int64_t id) {
  const TState *t = find(s, table);
  if (!t || !t->windowed || id < 0 || id >= t->rows || owner_of(s, t, id) != s->rank) return -1;
  return local_row(s, t, id);
}

void table_sync_init_rows(TableSync *s, uint64_t seed) {
  for (int k = 0; k < s->nt; k++) {
    TState *t = &s->t[k];
    if (!t->windowed) continue;
    free(t->own);
    t->own = xcalloc((size_t)(t->nown * t->dim) + 1, sizeof *t->own);
    // In slices, so that the ids cost no more than a slice's rows.
    enum { SLICE = 4096 };
    int64_t ids[SLICE];
    for (int64_t from = 0; from < t->nown; from += SLICE) {
      int64_t n = t->nown - from < SLICE ? t->nown - from : SLICE;
      for (int64_t i = 0; i < n; i++)
        ids[i] = t->place == PLACE_ROW ? (from + i) * s->world + s->rank : from + i;
      cpu_init_table_rows(s->ir, t->tensor, seed, ids, n, t->own + from * t->dim);
    }
  }
}

int64_t table_sync_rows_held(const TableSync *s, int table, int64_t B) {
  const TState *t = find(s, table);
  if (!t || !t->windowed) return -1;
  int64_t most = 0;  // the most distinct ids a batch of B can hold: its occurrences
  for (int k = 0; k < t->ngroup_features; k++) {
    const Feature *f = &s->schema->features[t->group_features[k]];
    int64_t per = f->jag >= 0 ? f->max_len : 1;
    most += B * per * f->width;
    if (most > t->group_rows) break;
  }
  return t->nown + (most < t->group_rows ? most : t->group_rows);
}

double table_sync_seconds(const TableSync *s) { return s->seconds; }
double table_sync_alltoall_gbps(const TableSync *s) {
  return s->a2a_seconds > 0 ? s->a2a_bytes / s->a2a_seconds / 1e9 : 0;
}
