// table_sync.h: embedding tables across ranks. Each table is one of:
//   - replicated: every rank holds it and applies the same update. The rows' gradients of all
//     ranks are all-gathered and summed per row, in rank order;
//   - table-wise: the whole table belongs to one rank (tables are dealt out by size);
//   - row-wise: row `id` belongs to rank id % world.
// A sharded table's rows are fetched before each forward: this rank's distinct ids of it go
// to their owners (all-to-all), and the rows come back (all-to-all). After the backward the
// rows' gradients go to their owners (all-to-all), which sum them per row in rank order (the
// same order as a replicated table, so both give the same bits) and apply the table's
// row-wise Adagrad or SGD to the rows they own. Rows a rank does not own are only copies
// fetched for a step.
// defines: TablePlacement, TableSync, table_sync_*
#ifndef GEMC_TABLE_SYNC_H
#define GEMC_TABLE_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "comm.h"
#include "cpu_exec.h"
#include "ir.h"
#include "optim.h"

typedef enum TablePlacement { PLACE_REPLICATE, PLACE_TABLE, PLACE_ROW, PLACE_AUTO } TablePlacement;
const char *table_placement_name(TablePlacement p);  // "replicate", "table", "row", "auto"
bool table_placement_parse(const char *s, TablePlacement *out);

// `auto` shards a table row-wise from this many rows on, and replicates smaller ones.
enum { AUTO_ROW_WISE_ROWS = 1 << 20 };

typedef struct TableSync TableSync;

// placement[ir->ntensors]: each table's placement (PLACE_AUTO decided here); other entries
// are ignored.
TableSync *table_sync_new(Comm *c, const Ir *ir, const Schema *schema,
                          const TablePlacement *placement);
void table_sync_free(TableSync *s);
// One line per table: "items  1000 x 32  row-wise over 2 ranks", "ads  ...  on rank 1".
void table_sync_describe(const TableSync *s, char *buf, size_t size);
TablePlacement table_sync_placement(const TableSync *s, int table);  // decided
bool table_sync_any_sharded(const TableSync *s);

// Before a forward on `b` (this rank's examples): the rows of sharded tables that b reads and
// this rank does not own, from their owners, into the executor's tables.
// A windowed table (below) gets the executor rows of b's distinct ids instead. *bound is the
// batch for cpu_exec_set_batch: b, with the ids of windowed tables as window rows (b itself is
// unchanged; *bound lives until the next fetch).
bool table_sync_fetch(TableSync *s, CpuExec *x, const Batch *b, const Batch **bound, char *err,
                      size_t err_size);
// After the backward: the global gradient of the rows this rank updates (share: this rank's
// examples / B). table_sync_grad then gives them for a table.
bool table_sync_reduce(TableSync *s, CpuExec *x, double share, char *err, size_t err_size);
void table_sync_grad(const TableSync *s, int table, const int64_t **ids, const float **g,
                     int64_t *nrows);
// The same for one table from rows the caller holds (GPU ranks, which read them off the
// device): this rank's ids[n] and rows g[n x dim], in ascending id order.
bool table_sync_reduce_rows(TableSync *s, int table, const int64_t *ids, const float *g,
                            int64_t n, double share, char *err, size_t err_size);
// The rows of `table` that `rank` owns, ascending, into ids (NULL: only count them); 0 for a
// replicated table.
int64_t table_sync_owned_ids(const TableSync *s, int table, int rank, int64_t *ids);
// Windowed tables (CPU ranks): a sharded table is held by each rank as its own rows only,
// 1/world of a row-wise table, the whole table on its owner and nothing elsewhere for a
// table-wise one, and the executor gets each batch's rows (cpu_exec_new_windowed). Tables
// that share an id feature share one window (the distinct ids of all their features), so
// they are windowed together when all of them are sharded, and none is when one of them is
// replicated. table_sync_windowed sets windowed[t] for them ([ir->ntensors]).
void table_sync_windowed(const TableSync *s, bool *windowed);
// Allocates each windowed table's own rows and gives them their initial values
// (cpu_init_table_rows, the same values a whole table gets from `seed`).
void table_sync_init_rows(TableSync *s, uint64_t seed);
// A windowed table's own rows ([*nown x dim], row of id at table_sync_local_row); NULL (and
// *nown 0) for any other table.
float *table_sync_own_rows(const TableSync *s, int table, int64_t *nown);
// The row of own rows that holds id; -1 when the table is not windowed or this rank does not
// own id.
int64_t table_sync_local_row(const TableSync *s, int table, int64_t id);
// The rows a windowed table costs this rank at batch B: its own plus the most a batch's
// window can hold; -1 for any other table (held whole).
int64_t table_sync_rows_held(const TableSync *s, int table, int64_t B);
// Seconds this step spent in the table collectives.
double table_sync_seconds(const TableSync *s);
// The sharded tables' all-to-alls so far: the bytes this rank sent to other ranks over the
// time it spent in them, GB/s (0 when there were none).
double table_sync_alltoall_gbps(const TableSync *s);

#endif
