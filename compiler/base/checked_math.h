// checked_math.h: size arithmetic that cannot overflow silently. Every product or sum of sizes
// (elements, bytes, grids) in sema, the plan and the executors goes through these: ck_* report
// an overflow (false), sat_* saturate at INT64_MAX, for a size that is only compared with a
// limit. bytes_text writes a size for a message ("149.0 GiB (160000000000 bytes)").
// defines: ck_mul, ck_add, ck_mul3, sat_mul, sat_add, bytes_text, BytesText, GEMC_MAX_BYTES
#ifndef GEMC_CHECKED_MATH_H
#define GEMC_CHECKED_MATH_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

// *out = a * b; false on overflow (*out then holds INT64_MAX).
static inline bool ck_mul(int64_t a, int64_t b, int64_t *out) {
  if (__builtin_mul_overflow(a, b, out)) {
    *out = INT64_MAX;
    return false;
  }
  return true;
}

// *out = a + b; false on overflow (*out then holds INT64_MAX).
static inline bool ck_add(int64_t a, int64_t b, int64_t *out) {
  if (__builtin_add_overflow(a, b, out)) {
    *out = INT64_MAX;
    return false;
  }
  return true;
}

static inline bool ck_mul3(int64_t a, int64_t b, int64_t c, int64_t *out) {
  return ck_mul(a, b, out) && ck_mul(*out, c, out);
}

// For sizes (never negative): a * b and a + b, INT64_MAX when they overflow.
static inline int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return ck_mul(a, b, &r) ? r : INT64_MAX;
}
static inline int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return ck_add(a, b, &r) ? r : INT64_MAX;
}

// A size for a message: "1.5 GiB (1610612736 bytes)"; INT64_MAX reads "more than 2^63 bytes".
typedef struct BytesText {
  char s[64];
} BytesText;

static inline BytesText bytes_text(int64_t bytes) {
  BytesText t;
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes == INT64_MAX) {
    snprintf(t.s, sizeof t.s, "more than 2^63 bytes");
  } else if (bytes < 1024) {
    snprintf(t.s, sizeof t.s, "%" PRId64 " bytes", bytes);
  } else {
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    snprintf(t.s, sizeof t.s, "%.1f %s (%" PRId64 " bytes)", v, units[u], bytes);
  }
  return t;
}

#endif
