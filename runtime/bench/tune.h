// tune.h: the attention autotuner (docs/tuning.md). An attention node without @schedule hints
// has a few legal shapes of its forward kernel on a GPU: the key tile and pipeline stages of
// the sm_90a kernel, or the block shape of the mma.sync kernel. The tuner times those
// candidates on the running GPU over a batch drawn like the model's synthetic data and caches
// the winner beside the JIT cache, in one small text file per key: GPU, NVRTC version, op
// signature and length bucket. Hints are constraints, so they always win: only the candidates
// that agree with every hint the user gave are timed, and a node they fix is not tuned.
//
// The first part (candidates, buckets, keys, the cache file, applying a winner) runs without a
// GPU and is what tests/unit/test_tune.c checks; tune_model (tune_gpu.c) times on the GPU.
// defines: TuneKernel, TuneCandidate, TuneOp, tune_op_init, tune_length_bucket, tune_key,
//          tune_cache_path, TuneEntry, TuneLoad, tune_entry_format, tune_entry_parse,
//          tune_cache_load, tune_cache_store, tune_apply, tune_candidate_text, tune_case,
//          tune_lengths,
//          TuneOptions, TuneStatus, tune_model
#ifndef GEMC_TUNE_H
#define GEMC_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gdpa_case.h"  // defines: GdpaCase, GdpaLengths
#include "ir.h"
#include "strbuf.h"

// --- one node's candidates ----------------------------------------------------------------

enum { TUNE_MAX_CANDIDATES = 16, TUNE_FORMAT = 1 };

typedef enum TuneKernel {
  TUNE_SM90,  // attn_forward_sm90: 128 query rows, tile_kv 64 or 128, 2..4 stages that fit
  TUNE_MMA,   // attn_forward (mma.sync): tile_q 64 or 128, tile_m 16 or 32, 64 keys, 2 stages
} TuneKernel;

// One forward schedule, as the kernel runs it: every field is the value in effect (tile_m is 0
// on the sm_90a kernel, which has none), so comparing with a hint is comparing two numbers.
typedef struct TuneCandidate {
  TuneKernel kernel;
  int tile_q, tile_kv, tile_m, stages;
  int smem;  // the forward's dynamic shared memory, bytes
} TuneCandidate;

// One attention node as the tuner sees it.
typedef struct TuneOp {
  int node;              // the forward attention node
  char where[128];       // "gem_small.gem:27:11"
  char name[160];        // "self silu causal w256 dh64 h4 bf16"
  char arch[16];         // the GPU's target: "sm_90a"
  GdpaCase c;            // the case that is timed: the node's form at the bucket lengths
  GdpaEmitOptions x;     // and how it is emitted: for the GPU's target, backward as autodiff's
  int64_t batch;         // examples per batch
  int64_t bucket_q;      // q's length bucket; 0 when q is not jagged
  int64_t bucket_kv;     // kv's; 0 when kv is not jagged
  bool one_dim;          // q and kv on one jagged dim (self, or cross over the same dim)
  Schedule user;         // the hints the user gave (tile_q, tile_kv, tile_m, stages; 0: none)
  TuneCandidate cand[TUNE_MAX_CANDIDATES];
  int ncand;
  int def;               // the compiler's choice: what runs without tuning
  char sig[256];         // the op signature in the key
} TuneOp;

// The length bucket of a jagged dim of max length `max_len`: the smallest power of two at
// least max_len, and at least 16.
int64_t tune_length_bucket(int64_t max_len);

// Describes forward attention node `node` of `ir` for a GPU of `arch`, with `batch` examples,
// and enumerates its candidates: true when there are two or more to time. False with the
// reason in `why` ("the quantized attention kernel has one shape", "the @schedule hints fix
// its shape", ...) when there is nothing to tune; op->where and op->name are filled either way.
bool tune_op_init(const Ir *ir, int node, const char *arch, int64_t batch, TuneOp *op,
                  char *why, size_t why_size);

// "tile_q=128 tile_kv=64 stages=3" or "tile_q=64 tile_m=32" (the values that choose it).
void tune_candidate_text(const TuneCandidate *c, char *buf, size_t cap);

// The key: "gemc-tune 1 | gemc VERSION | gpu NAME | ARCH | nvrtc N | op SIGNATURE | len q.. kv..".
void tune_key(const TuneOp *op, const char *gpu, int nvrtc_version, char *buf, size_t cap);
// The key's file in the cache directory: DIR/tune-<FNV-1a 64 of the key, 16 hex digits>.txt.
void tune_cache_path(const char *dir, const char *key, char *buf, size_t cap);

// --- the cache file -----------------------------------------------------------------------

// What a cache file holds beside its key: the winner and what was measured.
typedef struct TuneEntry {
  TuneCandidate winner;
  double fwd_ms, bwd_ms;  // the winner's forward and the node's backward, per run
  double default_fwd_ms;  // the compiler's choice's forward
  int ncand;              // candidates timed
} TuneEntry;

typedef enum TuneLoad {
  TUNE_CACHE_MISS,  // no file: tune
  TUNE_CACHE_HIT,   // *winner is set
  TUNE_CACHE_BAD,   // unreadable, corrupt, another key, or a winner this gemc no longer has:
                    // `why` says which; tune again (and overwrite it)
} TuneLoad;

// The text of an entry: "name value" lines (docs/tuning.md).
void tune_entry_format(const char *key, const TuneEntry *e, StrBuf *out);
// Parses an entry's text for `key`, and finds its winner among op's candidates (*winner).
TuneLoad tune_entry_parse(const char *text, size_t size, const char *key, const TuneOp *op,
                          int *winner, TuneEntry *e, char *why, size_t why_size);
// Reads the entry of `key` from the cache directory.
TuneLoad tune_cache_load(const char *dir, const char *key, const TuneOp *op, int *winner,
                         TuneEntry *e, char *why, size_t why_size);
// Writes it atomically (compiler/base/file_io.h). False with the reason.
bool tune_cache_store(const char *dir, const char *key, const TuneEntry *e, char *err,
                      size_t err_size);

// Writes candidate `winner` of op into the schedule s of its node: only the fields the user
// left at 0, and nothing at all when the winner is the compiler's own choice (the plan is then
// exactly the untuned one).
void tune_apply(Schedule *s, const TuneOp *op, int winner);

// Candidate i as the harness's case (gdpa_case_emit_with): the compiler's choice with its
// backward and the user's hints alone, as the model's node has them (so what is timed as the
// default is what runs untuned, even where its values are not hints one could give: 32 PMA
// rows), every other candidate its forward alone with its values.
void tune_case(const TuneOp *op, int i, GdpaCase *c, GdpaEmitOptions *x);

// The batch the candidates are timed on: op->batch examples, each jagged side lognormal with
// median bucket/8 and sigma 1, clamped to [1, bucket], 2% of examples empty, as the synthetic
// data draws them (runtime/data/synth.c); the same for the same op. A side that is not jagged
// has its fixed count (PMA seeds, a set's k, 1 for dense q).
void tune_lengths(const TuneOp *op, GdpaLengths *out);

// --- on the GPU (tune_gpu.c) --------------------------------------------------------------

typedef struct TuneOptions {
  int reps;               // timed runs per candidate and round, after a warm-up
  int64_t batch;          // examples per batch; 0: the model's
  bool force;             // time even where the cache has an entry (gemc tune)
  const char *cache_dir;  // the JIT cache directory; NULL: nothing is read or stored
  const char *arch;       // when not NULL, the GPU must be of this arch (gemc tune --arch)
  const char *compile_only;  // an arch: emit and compile every candidate for it, time nothing
                             // and store nothing (no GPU needed; gemc tune --compile-only)
  const char *source;     // the model's file, for the table's title
  FILE *log;              // one line per attention node (gemc train); NULL: none
  FILE *table;            // every candidate's times (gemc tune); NULL: none
} TuneOptions;

typedef enum TuneStatus {
  TUNE_OK,
  TUNE_NO_GPU,   // no driver or no device: `err` says which
  TUNE_FAILED,   // a CUDA call or every compile failed: `err` says which
} TuneStatus;

// Tunes every forward attention node of ir on the GPU. sched has ir->nnodes entries, each
// the node's schedule on entry (the caller copies ir->nodes[i].sched); the winners are written
// into those of the tuned nodes (tune_apply). A node whose candidates fail to compile keeps
// its schedule, with a warning on stderr. *tuned counts the nodes given a schedule that is
// not the compiler's own (may be NULL).
TuneStatus tune_model(const Ir *ir, const TuneOptions *o, Schedule *sched, int *tuned, char *err,
                      size_t err_size);

#endif
