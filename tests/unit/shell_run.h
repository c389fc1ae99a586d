// shell_run.h: what the unit tests that run gemc as a user would share: a shell line run in a
// test's temporary directory, its exit status and what it printed.
// defines: ShellRun, shell_slurp, shell_vrun, shell_run
#ifndef GEMC_TESTS_SHELL_RUN_H
#define GEMC_TESTS_SHELL_RUN_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

typedef struct ShellRun {
  int rc;               // the shell's exit status (128 + N when a command died of signal N)
  char out[1 << 16];    // the line's stdout and stderr, NUL-terminated, cut at 64 KiB
  char err[1 << 16];
} ShellRun;

// The start of file `path` into buf (empty when it cannot be read).
static inline void shell_slurp(const char *path, char *buf, size_t size) {
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (!f) return;
  size_t n = fread(buf, 1, size - 1, f);
  buf[n] = '\0';
  fclose(f);
}

// Runs `cd DIR && { LINE ; }` with its stdout and stderr in DIR/stdout.txt and DIR/stderr.txt,
// and reads them back into the returned (static) ShellRun; rc is -1 when the shell itself
// did not exit.
static inline ShellRun *shell_vrun(const char *dir, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static inline ShellRun *shell_vrun(const char *dir, const char *fmt, va_list ap) {
  static ShellRun run;
  char line[8192], cmd[16384], path[4096];
  vsnprintf(line, sizeof line, fmt, ap);
  snprintf(cmd, sizeof cmd, "cd '%s' && { %s ; } >stdout.txt 2>stderr.txt", dir, line);
  int status = system(cmd);
  run.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  snprintf(path, sizeof path, "%s/stdout.txt", dir);
  shell_slurp(path, run.out, sizeof run.out);
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  shell_slurp(path, run.err, sizeof run.err);
  return &run;
}

static inline ShellRun *shell_run(const char *dir, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline ShellRun *shell_run(const char *dir, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ShellRun *r = shell_vrun(dir, fmt, ap);
  va_end(ap);
  return r;
}

#endif
