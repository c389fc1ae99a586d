// progress.h: what `gemc train` shows while it runs. On a terminal, one live line on stderr,
// redrawn in place (step, loss, NE, examples/s, ETA); otherwise a plain line about every 10%
// of the run. Result lines (the learning curve) go to stdout, above the live line. --quiet
// silences both.
// defines: Progress, progress_begin, progress_step, progress_line, progress_note, progress_end
#ifndef GEMC_PROGRESS_H
#define GEMC_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct Progress {
  FILE *out;           // result lines; NULL when quiet
  FILE *err;           // progress; NULL when quiet
  bool live;           // err is a terminal: redraw one line with \r
  int64_t first;       // steps already taken when this run began
  int64_t total;       // steps this run takes
  double start;        // seconds (monotonic) when it began
  double last_draw;
  int drawn;           // characters of the live line on screen
  int64_t plain_every; // not live: a plain line every this many steps
} Progress;

// `live` < 0: decide from whether err is a terminal; 0 or 1 forces it (tests).
void progress_begin(Progress *p, FILE *out, FILE *err, bool quiet, int live, int64_t first,
                    int64_t total);
// After step `step` (counting resumed ones). `shown` says a result line was just printed for
// this step, so a plain progress line would repeat it.
void progress_step(Progress *p, int64_t step, double loss, double ne, double examples_per_s,
                   bool shown);
// Prints one result line (printf-style, newline added) on out, above the live line.
void progress_line(Progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Prints a note (a warning: printf-style, newline added) on err, above the live line.
void progress_note(Progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Erases the live line.
void progress_end(Progress *p);

// "1:05", "2:03:40", "--" for a non-finite or negative time.
void progress_format_duration(double seconds, char *buf, size_t size);

#endif
