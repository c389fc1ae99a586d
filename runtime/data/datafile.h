// datafile.h: the on-disk format for jagged batches (docs/data.md). A file is a header (magic,
// version, the schema it was written for) and a sequence of chunks, each holding some examples
// column by column: offsets for every jagged dim, then every feature's values, with a CRC32.
// The reader validates everything and names the file and the record in its errors.
// defines: DataWriter, DataReader, datafile_*
#ifndef GEMC_DATAFILE_H
#define GEMC_DATAFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "batch.h"

typedef struct DataWriter DataWriter;
typedef struct DataReader DataReader;

// Errors are written to `err` (a human sentence naming the file, and the record when there is
// one) and make the call return NULL/false.
DataWriter *datafile_create(const char *path, const Schema *s, char *err, size_t err_size);
// Appends the examples of `b` as one chunk.
bool datafile_write(DataWriter *w, const Batch *b, char *err, size_t err_size);
// Flushes, fsyncs and renames into place (the file appears whole or not at all).
bool datafile_close(DataWriter *w, char *err, size_t err_size);
void datafile_abort(DataWriter *w);

DataReader *datafile_open(const char *path, const Schema *s, char *err, size_t err_size);
int64_t datafile_examples(const DataReader *r);  // total examples in the file
// Fills `b` with examples [first, first + b->B) (wrapping around at the end of the file).
bool datafile_read(DataReader *r, int64_t first, Batch *b, char *err, size_t err_size);
void datafile_close_reader(DataReader *r);

// gemc data convert: a TSV or CSV file (`sep`; 0: a comma for *.csv, else a tab), first line
// the column names (every input and label of the model; extra columns are an error), id lists
// as space-separated integers, float vectors as space-separated reals.
bool datafile_convert(const char *in_path, const char *out_path, const Schema *s, char sep,
                      char *err, size_t err_size);

#endif
