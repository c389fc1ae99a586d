// report_json.h: the JSON report of `gemc train --report FILE.json` (format in docs/train.md):
// the run's settings, the final train and eval metrics per task, throughput, the learning
// curve and the loss of every step.
// defines: ReportRun, report_write_json, JsonWriter, json_*
#ifndef GEMC_REPORT_JSON_H
#define GEMC_REPORT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "train.h"

// What the report says about the run beyond what the trainer and the loop know.
typedef struct ReportRun {
  const char *source;          // the .gem path
  const char *backend;         // "cpu"
  const char *backend_reason;  // why that backend ("--backend cpu", "auto: ...")
  const char *data;            // the data file, or NULL for synthetic data
  const char *lengths;         // synthetic: the length distribution's name
  int64_t resumed_from;        // the step the run resumed at; -1 when it did not resume
  const char *resume_dir;
  const char *save_dir;
  const char *error;           // the loop's error when it failed (the report's "failure")
  const DistSummary *dist;     // a distributed run's numbers (rank 0 writes); NULL: alone
} ReportRun;

// Writes the report to `path` (replaced whole: a temp file, then a rename).
bool report_write_json(const char *path, const Trainer *t, const LoopResult *r,
                       const ReportRun *run, char *err, size_t err_size);

// --- a small JSON writer, also used by tests ----------------------------------------------

typedef struct JsonWriter {
  FILE *f;
  int depth;
  bool need_comma[64];
  bool after_key;
} JsonWriter;

void json_begin_object(JsonWriter *w);
void json_end_object(JsonWriter *w);
void json_begin_array(JsonWriter *w);
void json_end_array(JsonWriter *w);
void json_key(JsonWriter *w, const char *key);
void json_string(JsonWriter *w, const char *s);  // NULL writes null
void json_number(JsonWriter *w, double v);       // NaN and infinities write null
void json_int(JsonWriter *w, int64_t v);
void json_bool(JsonWriter *w, bool v);

#endif
