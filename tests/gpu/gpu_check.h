// gpu_check.h: the PASS/FAIL lines of the GPU test programs (the GPU machine has no cmocka).
// check() prints one line per check and counts the failures; a program exits with
// gpu_check_failures != 0. Include it in one file per program (the counters are static).
// defines: check, gpu_check_failures, gpu_check_count
#ifndef GEMC_GPU_CHECK_H
#define GEMC_GPU_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int gpu_check_failures, gpu_check_count;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  gpu_check_count++;
  if (!ok) gpu_check_failures++;
  fflush(stdout);
}

#endif
