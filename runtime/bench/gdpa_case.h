// gdpa_case.h: one attention case as a tiny IR (q, k, v, dO inputs, the attention node, its
// three backward ops), emitted through emit_attention into a Lower of its own
// (lower_standalone_begin, kernel_builder.h). Shared by `gemc bench gdpa`
// (gdpa_bench.h), the GPU test tests/gpu/test_gdpa.c and the CPU-only codegen unit test.
// defines: GdpaCase, GdpaEmitted, gdpa_case_emit, gdpa_case_name
#ifndef GEMC_GDPA_CASE_H
#define GEMC_GDPA_CASE_H

#include <stdbool.h>
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

// "self gelu causal w40 dh64 h2" into buf.
void gdpa_case_name(const GdpaCase *c, char *buf, int cap);

#endif
