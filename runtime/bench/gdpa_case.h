// gdpa_case.h: one attention case as a tiny IR (q, k, v, dO inputs, the attention node, its
// three backward ops), emitted through emit_attention into a Lower of its own
// (lower_standalone_begin, kernel_builder.h), and the batches it runs on: the (lq, lk) lengths
// of each example, drawn from one of the benchmark's workloads or read from a lengths file.
// Shared by `gemc bench gdpa` (gdpa_bench.h), the GPU test tests/gpu/test_gdpa.c and the
// CPU-only unit tests.
// defines: GdpaCase, GdpaEmitOptions, GdpaEmitted, gdpa_case_emit(_batch, _with), gdpa_case_name,
//          GdpaLengths, GdpaWorkload, gdpa_lengths_*
#ifndef GEMC_GDPA_CASE_H
#define GEMC_GDPA_CASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "ir.h"
#include "plan.h"
#include "strbuf.h"

typedef struct GdpaCase {
  AttnShape shape;
  Act act;
  bool causal;
  int64_t window;
  bool hstu_norm;
  int64_t heads, dh;
  int64_t q_set;     // set q rows (pffn), or PMA seeds; 0: dense q for pffn
  int64_t kv_set;    // cross: kv as set[B, kv_set, d]; 0: jagged kv on its own dim
  int64_t max_q, max_kv;
  double scale;
  int tile_q, tile_m;  // forward schedule hints (0: the compiler's choice)
  int storage;         // 0: bf16 tensors; 32: fp32; 16: fp16 (PMA seeds are always fp32)
} GdpaCase;

// What the autotuner (tune.h) asks of an emission beyond the case (kept out of GdpaCase, whose
// positional initializers in tests/gpu/gdpa_cases.h stay as they are). Zeros: as
// gdpa_case_emit_batch.
typedef struct GdpaEmitOptions {
  int tile_kv, stages;  // more forward schedule hints (0: the compiler's choice)
  bool atomic_dq;       // @schedule(deterministic = false): dQ inside the sm_90a dK/dV kernel
  bool model_backward;  // the backward nodes carry only the gelu hint, as autodiff makes them
                        // (else they copy every hint of the forward node)
  bool forward_only;    // emit the forward node's launches only
  const char *target;   // the target emitted for; NULL: sm_90a
} GdpaEmitOptions;

enum { GDPA_MAX_LAUNCHES = 96 };

typedef struct GdpaEmitted {
  Ir ir;
  int q, k, v, dout, out, dq, dk, dv;  // tensors
  int q_jag, kv_jag;
  Launch launches[GDPA_MAX_LAUNCHES];
  int nlaunches, nforward;            // launches [0, nforward) are the forward
  TileList tiles[8];
  int ntiles;
} GdpaEmitted;

// Builds the IR of case c (tensor names prefixed by `prefix`) and emits its kernels into src.
// Returns false when emit_attention refuses a node (src is then as it was). The launches keep
// their ARG_WORKSPACE arguments (gdpa_gpu.c allocates one buffer per (tensor, slot)).
bool gdpa_case_emit(const GdpaCase *c, const char *prefix, Arena *arena, StrBuf *src,
                    GdpaEmitted *e);
// The same for an IR of batch B (gdpa_case_emit's is 1): what a model of that batch would get
// (PMA's dQ splits the batch into chunks by it).
bool gdpa_case_emit_batch(const GdpaCase *c, int64_t batch, const char *prefix, Arena *arena,
                          StrBuf *src, GdpaEmitted *e);
// The same with the options x (NULL: none).
bool gdpa_case_emit_with(const GdpaCase *c, const GdpaEmitOptions *x, int64_t batch,
                         const char *prefix, Arena *arena, StrBuf *src, GdpaEmitted *e);

// "self gelu causal w40 dh64 h2" into buf.
void gdpa_case_name(const GdpaCase *c, char *buf, int cap);

// --- batches ----------------------------------------------------------------------------

// The lengths of one batch: example b has lq[b] query rows and lk[b] keys. A side that is not
// jagged has its fixed count there (PMA: the seeds; cross over a set: kv_set), so that the
// batch's useful pairs are always sum(lq * lk).
typedef struct GdpaLengths {
  int64_t n;         // examples
  int64_t *lq, *lk;  // [n], malloc'd; gdpa_lengths_free frees them
} GdpaLengths;

// What a lengths file may hold: its size, examples, one length, the rows of either side.
#define GDPA_LENGTHS_MAX_BYTES ((int64_t)64 << 20)
enum {
  GDPA_LENGTHS_MAX_EXAMPLES = 1 << 20,
  GDPA_LENGTHS_MAX_LEN = 1 << 20,
  GDPA_LENGTHS_MAX_ROWS = 1 << 27,
};

// A lengths file: one `lq lk` pair of whole numbers >= 0 a line, '#' to the end of a line a
// comment, blank lines skipped; LF, CRLF or CR line ends. lq > 0 with lk = 0 is legal (those
// rows come out 0), and so is an empty example; a batch without a single pair is not. `name`
// is the file's name in messages. False with the whole message in err, as the driver prints
// it: "NAME:LINE: error: ...", or "NAME: error: ..." for the batch as a whole. *out is set
// only on success.
bool gdpa_lengths_parse(const char *name, const char *text, size_t size, GdpaLengths *out,
                        char *err, size_t err_size);
// Reads and parses the lengths file at `path` (a regular file of at most
// GDPA_LENGTHS_MAX_BYTES); "gemc: error: cannot open lengths file PATH: ..." when unreadable.
bool gdpa_lengths_read(const char *path, GdpaLengths *out, char *err, size_t err_size);
void gdpa_lengths_free(GdpaLengths *l);

double gdpa_lengths_pairs(const GdpaLengths *l);    // sum(lq * lk)
int64_t gdpa_lengths_max_q(const GdpaLengths *l);   // the longest lq (0 for an empty batch)
int64_t gdpa_lengths_max_k(const GdpaLengths *l);
int64_t gdpa_lengths_sum_q(const GdpaLengths *l);
bool gdpa_lengths_self(const GdpaLengths *l);       // lq == lk for every example

// The benchmark's workloads (docs/gdpa_bench.md), for B examples, length scale N, sparsity s
// (0.5 <= s <= 1) and a key or seed count k. U[a, N] is uniform over whole numbers, and
// lo(s) = max(1, (int)((2s - 1) N)).
typedef enum GdpaWorkload {
  GDPA_META_SELF,    // Meta's "self s": lq ~ U[lo(s), N], and lk = N for every example
  GDPA_JAGGED_SELF,  // true jagged self attention: lq = lk ~ U[lo(s), N]
  GDPA_CROSS,        // lq ~ U[lo(s), N], lk = k (a set of k keys per example)
  GDPA_PMA,          // lq = k seeds, lk lognormal (median N/8, sigma 1) clamped to [1, N]
} GdpaWorkload;

// Draws a batch of workload w, the same one for the same arguments (xorshift64 from `seed`).
void gdpa_lengths_make(GdpaWorkload w, int64_t B, int64_t n, double s, int64_t k, uint64_t seed,
                       GdpaLengths *out);

#endif
