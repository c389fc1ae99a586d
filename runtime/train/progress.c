// progress.c: the live progress line of `gemc train` and the result lines above it.
// A live line is redrawn at most ten times a second; before a result line is printed on
// stdout it is erased from stderr, so both streams can share one terminal.
#include "progress.h"
#include "clock.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static bool is_terminal(FILE *f) {
  const char *term = getenv("TERM");
  return isatty(fileno(f)) && !(term && strcmp(term, "dumb") == 0);
}

void progress_format_duration(double seconds, char *buf, size_t size) {
  if (!isfinite(seconds) || seconds < 0) {
    snprintf(buf, size, "--");
    return;
  }
  int64_t s = (int64_t)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%" PRId64 ":%02d:%02d", s / 3600, (int)(s / 60 % 60), (int)(s % 60));
  else
    snprintf(buf, size, "%d:%02d", (int)(s / 60), (int)(s % 60));
}

void progress_begin(Progress *p, FILE *out, FILE *err, bool quiet, int live, int64_t first,
                    int64_t total) {
  memset(p, 0, sizeof *p);
  p->out = quiet ? NULL : out;
  p->err = quiet ? NULL : err;
  p->live = p->err && (live < 0 ? is_terminal(err) : live > 0);
  p->first = first;
  p->total = total;
  p->start = monotonic_seconds();
  p->last_draw = -1;
  p->plain_every = total >= 10 ? total / 10 : 1;
}

static void erase(Progress *p) {
  if (!p->live || p->drawn == 0) return;
  fprintf(p->err, "\r%*s\r", p->drawn, "");
  fflush(p->err);
  p->drawn = 0;
}

void progress_step(Progress *p, int64_t step, double loss, double ne, double examples_per_s,
                   bool shown) {
  if (!p->err) return;
  int64_t done = step - p->first;
  bool last = done >= p->total;
  double now = monotonic_seconds();
  if (p->live) {
    if (!last && p->last_draw >= 0 && now - p->last_draw < 0.1) return;
  } else if (shown || (done % p->plain_every != 0 && !last)) {
    return;
  }
  p->last_draw = now;
  double elapsed = now - p->start;
  double eta = done > 0 ? elapsed / (double)done * (double)(p->total - done) : NAN;
  char eta_text[32], elapsed_text[32];
  progress_format_duration(eta, eta_text, sizeof eta_text);
  progress_format_duration(elapsed, elapsed_text, sizeof elapsed_text);
  char line[256];
  int pct = p->total > 0 ? (int)(100 * done / p->total) : 100;
  int n = snprintf(line, sizeof line,
                   "step %" PRId64 "/%" PRId64 " (%3d%%)  loss %.4f  NE %.4f  %.0f ex/s  "
                   "elapsed %s  ETA %s",
                   step, p->first + p->total, pct, loss, ne, examples_per_s, elapsed_text,
                   eta_text);
  if (n < 0) return;
  if (n >= (int)sizeof line) n = (int)sizeof line - 1;
  if (p->live) {
    int pad = p->drawn > n ? p->drawn - n : 0;
    fprintf(p->err, "\r%s%*s", line, pad, "");
    p->drawn = n;
  } else {
    fprintf(p->err, "%s\n", line);
  }
  fflush(p->err);
}

void progress_line(Progress *p, const char *fmt, ...) {
  if (!p->out) return;
  erase(p);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->out, fmt, ap);
  va_end(ap);
  fputc('\n', p->out);
  fflush(p->out);
}

void progress_note(Progress *p, const char *fmt, ...) {
  if (!p->err) return;
  erase(p);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->err, fmt, ap);
  va_end(ap);
  fputc('\n', p->err);
  fflush(p->err);
}

void progress_end(Progress *p) { erase(p); }
