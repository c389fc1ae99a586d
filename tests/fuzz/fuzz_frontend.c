// fuzz_frontend.c: libFuzzer over the whole front end. Each input is one .gem file; it goes
// through the parser, sema, every pass, the IR printer and the verifier, exactly as
// `gemc ir` runs them, and the printed IR must read back (ir_read) and print the same bytes.
// Any crash, sanitizer report, leak, hang, internal error (which aborts under GEMC_FUZZING)
// or broken round trip is a bug. Build and run with `make fuzz`; the corpus starts from
// tests/golden and models.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "internal_error.h"
#include "ir.h"
#include "parse.h"
#include "passes.h"
#include "sema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Diagnostics and printed IR go here: the fuzzer checks behaviour, not text.
static FILE *sink(void) {
  static FILE *devnull;
  if (!devnull) devnull = fopen("/dev/null", "w");
  if (!devnull) abort();
  return devnull;
}

// Prints `ir` into a malloc'd string (caller frees).
static char *print_ir(const Ir *ir, size_t *size) {
  char *text = NULL;
  FILE *f = open_memstream(&text, size);
  if (!f) abort();
  ir_print(f, ir);
  fclose(f);
  return text;
}

// docs/ir.md: the text form reads back to an IR that prints identically.
static void check_round_trip(const Ir *ir, Arena *arena) {
  size_t size = 0, size2 = 0;
  char *text = print_ir(ir, &size);
  SourceFile printed;
  source_from_memory(&printed, "fuzz.ir", text, size);
  Diag d;
  diag_init(&d, &printed, stderr);
  Ir back;
  if (!ir_read(&printed, arena, &d, &back)) {
    fprintf(stderr, "fuzz: the printed IR does not read back:\n%s", text);
    abort();
  }
  char *text2 = print_ir(&back, &size2);
  if (size != size2 || memcmp(text, text2, size) != 0) {
    fprintf(stderr, "fuzz: the IR prints differently after ir_read:\n%s\n---\n%s", text, text2);
    abort();
  }
  free(text);
  free(text2);
}

static void run_front_end(const SourceFile *src, Arena *arena, Diag *d) {
  Model *m = parse_model(src, arena, d);
  if (!m || d->errors > 0) return;
  ast_print(sink(), m);

  Ir ir;
  ir_init(&ir, arena);
  if (!sema_lower(m, NULL, d, &ir) || d->errors > 0) return;
  if (!passes_run(&ir, d, NULL, NULL) || d->errors > 0) return;
  char err[512];
  if (!ir_verify(&ir, err, sizeof err)) {
    fprintf(stderr, "fuzz: the final IR fails to verify: %s\n", err);
    abort();
  }
  check_round_trip(&ir, arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // The front end expects the text NUL-terminated after `size` bytes, as source_read gives it.
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';

  SourceFile src;
  source_from_memory(&src, "fuzz.gem", text, size);
  Diag d;
  diag_init(&d, &src, sink());
  Arena arena = {0};
  run_front_end(&src, &arena, &d);
  arena_free(&arena);
  free(text);
  return 0;
}
