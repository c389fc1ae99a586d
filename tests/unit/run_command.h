// run_command.h: the unit tests' way to run one `gemc` command function (cmd_bench, cmd_tune,
// ...) in process on a word list, with what it prints to stderr captured. Header-only,
// included by one test file each.
// defines: run_command
#ifndef GEMC_TEST_RUN_COMMAND_H
#define GEMC_TEST_RUN_COMMAND_H

#include <stdio.h>
#include <unistd.h>

#include "cli.h"

// Runs fn on a CliOptions of `command` and the words, stderr captured into err (cap bytes,
// NUL-terminated); returns fn's exit code.
static int run_command(int (*fn)(const CliOptions *), Command command, bool quiet, char *err,
                       size_t cap, int nwords, char **words) {
  CliOptions o = {.command = command, .rest = words, .nrest = nwords, .quiet = quiet};
  fflush(stderr);
  FILE *capture = tmpfile();
  assert_non_null(capture);
  int saved = dup(fileno(stderr));
  assert_true(saved >= 0);
  assert_true(dup2(fileno(capture), fileno(stderr)) >= 0);
  int rc = fn(&o);
  fflush(stderr);
  assert_true(dup2(saved, fileno(stderr)) >= 0);
  close(saved);
  rewind(capture);
  size_t n = fread(err, 1, cap - 1, capture);
  err[n] = '\0';
  fclose(capture);
  return rc;
}

#endif
