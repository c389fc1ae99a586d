// test_attention_codegen.c: the attention emitter and the tile list builder, without a GPU.
// The CUDA emitted for each target (sm_90a: the wgmma forward where it applies; sm_100a: the
// mma.sync kernels) of every shape, mask and activation compiles with NVRTC for that target
// (skipped when libnvrtc is not installed); launches and tile lists have the documented form
// per target; each schedule hint value a kernel takes changes its kernel, and one it does not
// take is refused (docs/schedules.md); tile lists hold only valid tiles, sorted by work and
// dealt zigzag.
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <glob.h>

#include "gdpa_case.h"
#include "../gpu/gdpa_cases.h"
#include "attention.h"
#include "attention_sm90_smem.h"
#include "gpu_tiles.h"
#include "kernels_embedded.h"
#include "load_model.h"
#include "lower.h"

// --- NVRTC, opened with dlopen ------------------------------------------------------------

typedef int (*NvrtcCreate)(void **, const char *, const char *, int, const char *const *,
                           const char *const *);
typedef int (*NvrtcCompile)(void *, int, const char *const *);
typedef int (*NvrtcLogSize)(void *, size_t *);
typedef int (*NvrtcLog)(void *, char *);
typedef int (*NvrtcDestroy)(void **);

static void *open_nvrtc(void) {
  const char *names[] = {"libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13", "libnvrtc.so",
                         "/usr/local/cuda/lib64/libnvrtc.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *lib = dlopen(names[i], RTLD_NOW);
    if (lib) return lib;
  }
  return NULL;
}

// Compiles src for arch; prints the log on failure. Returns the NVRTC result (0: success).
static int nvrtc_compile(void *lib, const char *src, const char *arch) {
  NvrtcCreate create = (NvrtcCreate)(uintptr_t)dlsym(lib, "nvrtcCreateProgram");
  NvrtcCompile compile = (NvrtcCompile)(uintptr_t)dlsym(lib, "nvrtcCompileProgram");
  NvrtcLogSize log_size = (NvrtcLogSize)(uintptr_t)dlsym(lib, "nvrtcGetProgramLogSize");
  NvrtcLog get_log = (NvrtcLog)(uintptr_t)dlsym(lib, "nvrtcGetProgramLog");
  NvrtcDestroy destroy = (NvrtcDestroy)(uintptr_t)dlsym(lib, "nvrtcDestroyProgram");
  assert_non_null(create), assert_non_null(compile), assert_non_null(destroy);
  void *prog = NULL;
  assert_int_equal(create(&prog, src, "attention.cu", 0, NULL, NULL), 0);
  char opt[64];
  snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {opt, "-std=c++17", "-default-device"};
  int r = compile(prog, 3, opts);
  size_t n = 0;
  log_size(prog, &n);
  if (r != 0 && n > 1) {
    char *log = malloc(n);
    get_log(prog, log);
    fprintf(stderr, "%s\n", log);
    free(log);
  }
  destroy(&prog);
  return r;
}

// --- a case emitted for one target -------------------------------------------------------

// Case c's four nodes (the forward, then attention_bwd_q, _k and _v) emitted for `target` into
// src and e, with the forward node's schedule replaced by *sched when sched is not NULL.
// gdpa_case_emit builds the IR (and emits it for sm_90a, which is dropped); this lowers the
// same IR again for the target, as plan_build would. False when emit_attention refuses a node
// (src is then as it was).
static bool emit_case(const GdpaCase *c, const char *target, const Schedule *sched,
                      const char *prefix, Arena *arena, StrBuf *src, GdpaEmitted *e) {
  StrBuf dropped = {0};
  bool ok = gdpa_case_emit(c, prefix, arena, &dropped, e);
  sb_free(&dropped);
  if (!ok) return false;
  Ir *ir = &e->ir;
  assert_int_equal(ir->nodes[0].op, OP_ATTENTION);
  if (sched) ir->nodes[0].sched = *sched;
  Plan p = {.arena = arena, .ir = ir, .target = target};
  Lower L;
  lower_standalone_begin(&L, ir, &p, src);
  LowerMark start = lower_mark(&L);
  e->nforward = 0;
  for (int i = 0; i < ir->nnodes && ok; i++) {
    ok = emit_attention(&L, i);
    if (i == 0) e->nforward = L.nlaunches;
  }
  ok = ok && L.nlaunches <= GDPA_MAX_LAUNCHES && L.ntiles <= 8;
  e->nlaunches = e->ntiles = 0;
  if (ok) {
    memcpy(e->launches, L.launches, (size_t)L.nlaunches * sizeof *L.launches);
    e->nlaunches = L.nlaunches;
    memcpy(e->tiles, L.tiles, (size_t)L.ntiles * sizeof *L.tiles);
    e->ntiles = L.ntiles;
  } else {
    lower_rollback(&L, start);
  }
  lower_standalone_end(&L, src);
  return ok;
}

// Cases that together cover every shape, mask, activation, head dim, forward block shape and
// storage type (the SIMT kernels: fp32, fp16, dh 24).
static const int compiled_cases[] = {0,  7,  9,  10, 11, 14, 15, 16, 17, 18,
                                     19, 20, 21, 22, 23, 24, 25, 26, 27, 36};

// Forward schedules beyond the compiler's choices, on case 0 (dh 64) and case 6 (dh 128): the
// sm_90a kernel's other key tiles and stages, and the mma.sync kernel's 64 rows of 32 a warp.
typedef struct ScheduledCase {
  int c;
  Schedule sched;
} ScheduledCase;
static const ScheduledCase scheduled_cases[] = {
    {0, {.tile_kv = 64, .stages = 3}},  {0, {.tile_kv = 128, .stages = 2}},
    {6, {.tile_kv = 64, .stages = 4}},  {0, {.tile_q = 64, .tile_m = 32}},
    {6, {.tile_q = 128, .tile_m = 16, .tile_kv = 64, .stages = 2}},
    {0, {.tile_kv = 16, .stages = 4}},  {6, {.tile_kv = 32, .stages = 3}},
};

static char *all_cases_source(const char *target) {
  StrBuf src = {0};
  size_t ncases = sizeof compiled_cases / sizeof compiled_cases[0];
  size_t nsched = sizeof scheduled_cases / sizeof scheduled_cases[0];
  for (size_t i = 0; i < ncases + nsched; i++) {
    Arena arena = {0};
    GdpaEmitted *e = calloc(1, sizeof *e);
    char prefix[16];
    int c = i < ncases ? compiled_cases[i] : scheduled_cases[i - ncases].c;
    const Schedule *sched = i < ncases ? NULL : &scheduled_cases[i - ncases].sched;
    snprintf(prefix, sizeof prefix, "%s%d.", i < ncases ? "c" : "s", (int)i);
    bool sm90_only = sched && (sched->stages > 2 || (sched->tile_kv && sched->tile_kv != 64));
    bool ok = emit_case(&gdpa_test_cases[c], target, sched, prefix, &arena, &src, e);
    if (sm90_only && strcmp(target, "sm_90a") != 0) assert_false(ok);  // mma.sync: 64 keys, 2
    else assert_true(ok);
    free(e);
    arena_free(&arena);
  }
  return sb_take(&src);
}

static void compiles_for(const char *arch) {
  void *lib = open_nvrtc();
  if (!lib) skip();
  char *src = all_cases_source(arch);
  // Each target gets its own kernels: wgmma only where it exists.
  if (strcmp(arch, "sm_90a") == 0) assert_non_null(strstr(src, "  attn_forward_sm90<"));
  else assert_null(strstr(src, "wgmma"));
  assert_int_equal(nvrtc_compile(lib, src, arch), 0);
  free(src);
}

static void test_attention_codegen_compiles_sm90a(void **state) {
  (void)state;
  compiles_for("sm_90a");
}

static void test_attention_codegen_compiles_sm100a(void **state) {
  (void)state;
  compiles_for("sm_100a");
}

// --- the emitted launches -----------------------------------------------------------------

// What case 0 (self softmax, dh 64) gets on every target: forward; bwd_q: statistics + dQ;
// bwd_k: dK and dV together; bwd_v: nothing; one statistics workspace for the launches that
// share it.
static void check_self_softmax_backward(const GdpaEmitted *e, const StrBuf *src) {
  assert_int_equal(e->nforward, 1);
  assert_int_equal(e->nlaunches, 4);
  assert_string_equal(e->launches[0].kernel, "m_attn_fwd");
  assert_int_equal(e->launches[0].args[0].kind, ARG_TENSOR);
  assert_int_equal(e->launches[0].args[0].tensor, e->out);
  assert_string_equal(e->launches[1].kernel, "m_attn_bwd_stats");
  assert_string_equal(e->launches[2].kernel, "m_attn_bwd_q");
  assert_string_equal(e->launches[3].kernel, "m_attn_bwd_kv");
  const LaunchArg *ws_stats = &e->launches[1].args[0];
  const LaunchArg *ws_kv = &e->launches[3].args[e->launches[3].nargs - 1];
  assert_int_equal(ws_stats->kind, ARG_WORKSPACE);
  assert_int_equal(ws_kv->kind, ARG_WORKSPACE);
  assert_int_equal(ws_stats->tensor, ws_kv->tensor);
  assert_int_equal(ws_stats->slot, ws_kv->slot);
  assert_non_null(strstr(src->data, "// gdpa_case.gem:1:1 gdpa self softmax (fwd)"));
}

// sm_100a: the mma.sync forward, one block per tile of 128 query rows (GRID_TILES).
static void test_attention_codegen_self_softmax_launches_sm100a(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  assert_true(emit_case(&gdpa_test_cases[0], "sm_100a", NULL, "m.", &arena, &src, e));
  check_self_softmax_backward(e, &src);
  assert_int_equal(e->ntiles, 3);
  const Launch *f = &e->launches[0];
  assert_int_equal(f->grid, GRID_TILES);
  assert_int_equal(f->args[f->nargs - 1].kind, ARG_TILES);
  assert_int_equal(e->tiles[f->tiles].tile_q, 128);
  assert_false(e->tiles[f->tiles].persistent);
  assert_non_null(strstr(src.data, "extern \"C\" __global__ void __launch_bounds__(128)"));
  assert_non_null(strstr(src.data, "  attn_forward<64, ATTN_ACT_SOFTMAX, 4, 2>("));
  assert_null(strstr(src.data, "attn_forward_sm90"));
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

// sm_90a: the persistent wgmma forward (GRID_PERSISTENT, 384 threads, one CTA per SM) over TMA
// tensor maps of q, k and v, its tile list dealt for the grid and counted per batch; by default
// 128 keys a tile and 4 stages at dh 64. The backward's dQ and dK/dV kernels are persistent too.
static void test_attention_codegen_self_softmax_launches_sm90a(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  assert_true(emit_case(&gdpa_test_cases[0], "sm_90a", NULL, "m.", &arena, &src, e));
  check_self_softmax_backward(e, &src);
  assert_int_equal(e->ntiles, 4);  // forward, statistics, dQ, dK/dV
  const Launch *f = &e->launches[0];
  assert_int_equal(f->grid, GRID_PERSISTENT);
  assert_int_equal(f->threads, 384);
  const int maps[3] = {e->q, e->k, e->v};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(f->args[1 + i].kind, ARG_TENSOR_MAP);
    assert_int_equal(f->args[1 + i].tensor, maps[i]);
  }
  assert_int_equal(f->args[1].i, 128);  // a Q box: the 128 query rows of a work item
  assert_int_equal(f->args[2].i, 128);  // K and V boxes: the key tile
  assert_int_equal(f->args[f->nargs - 2].kind, ARG_TILES);
  assert_int_equal(f->args[f->nargs - 1].kind, ARG_TILE_COUNT);
  assert_int_equal(f->args[f->nargs - 1].tiles, f->tiles);
  const TileList *t = &e->tiles[f->tiles];
  assert_true(t->persistent);
  assert_int_equal(t->tile_q, 128);
  assert_int_equal(t->tile_kv, 128);
  assert_true(f->smem <= 227 * 1024);
  assert_int_equal(e->launches[2].grid, GRID_PERSISTENT);
  assert_int_equal(e->launches[3].grid, GRID_PERSISTENT);
  assert_non_null(strstr(src.data, "extern \"C\" __global__ void __launch_bounds__(384, 1)"));
  assert_non_null(strstr(src.data, "  attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 128, 4, false>("));
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

static void test_attention_codegen_pma_sums_dq_over_examples(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  assert_true(gdpa_case_emit(&gdpa_test_cases[16], "p.", &arena, &src, e));
  // forward; then dQ, dK and dV in one pass over the keys (attn_backward_pma): at batch 1 and
  // at most 300 keys (5 tiles) one chunk, whose sums are dQ itself (no partials, no sum kernel)
  assert_int_equal(e->nlaunches, 2);
  assert_int_equal(e->ntiles, 1);  // the backward needs no tile list
  const Launch *bwd = &e->launches[1];
  assert_int_equal(bwd->grid, GRID_FIXED);
  assert_int_equal(bwd->size.c, 1 * 4);  // chunks x heads
  assert_int_equal(bwd->args[0].tensor, e->dq);
  assert_int_equal(bwd->args[1].tensor, e->dk);
  assert_int_equal(bwd->args[2].tensor, e->dv);
  assert_int_equal(bwd->args[3].kind, ARG_SIZE);  // the batch size
  for (int i = 0; i < e->nlaunches; i++)
    for (int a = 0; a < e->launches[i].nargs; a++)
      assert_int_not_equal(e->launches[i].args[a].kind, ARG_WORKSPACE);
  assert_non_null(strstr(src.data, "const float *__restrict__ q"));  // fp32 seeds
  // 16 seeds at head dim 64: a 16-row seed tile, dQ over 4 column groups
  assert_non_null(strstr(src.data, "attn_backward_pma<64, ATTN_ACT_GELU_TAYLOR, 16>(dq, dk, dv,"));
  assert_null(strstr(src.data, "_bwd_q_sum"));
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

static void test_attention_codegen_refuses_unsupported_head_dim(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  GdpaCase c = gdpa_test_cases[1];
  c.dh = 256;  // over 128
  assert_false(gdpa_case_emit(&c, "r.", &arena, &src, e));
  assert_true(src.len == 0);  // nothing written
  sb_free(&src);
  arena_free(&arena);
  free(e);
}

// --- schedule hints -----------------------------------------------------------------------

// Case c emitted for target with forward schedule sched: false when refused; else the forward
// kernel's call, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 64, 3, false>" (the first
// "  attn_forward" after the "(fwd)" comment, up to its '('), into call, and the forward
// launch's dynamic shared memory and tile list into *smem and *tiles when not NULL.
static bool scheduled_forward(int c, const char *target, Schedule sched, char call[128],
                              int *smem, TileList *tiles) {
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  bool ok = emit_case(&gdpa_test_cases[c], target, &sched, "s.", &arena, &src, e);
  if (ok) {
    const char *fwd = strstr(src.data, "(fwd)");
    assert_non_null(fwd);
    const char *at = strstr(fwd, "  attn_forward");
    assert_non_null(at);
    size_t n = strcspn(at + 2, "(");
    assert_true(n < 128);
    memcpy(call, at + 2, n);
    call[n] = 0;
    const Launch *f = &e->launches[0];
    if (smem) *smem = f->smem;
    if (tiles) *tiles = e->tiles[f->tiles];
  } else {
    assert_true(src.len == 0);  // nothing written
  }
  sb_free(&src);
  arena_free(&arena);
  free(e);
  return ok;
}

typedef struct ScheduledCall {
  Schedule sched;
  const char *call;
} ScheduledCall;

static void check_calls(int c, const char *target, const ScheduledCall *want, int n) {
  for (int i = 0; i < n; i++) {
    char call[128];
    if (!scheduled_forward(c, target, want[i].sched, call, NULL, NULL))
      fail_msg("case %d on %s: schedule %d refused", c, target, i);
    if (strcmp(call, want[i].call) != 0)
      fail_msg("case %d on %s: schedule %d gives %s, expected %s", c, target, i, call,
               want[i].call);
  }
}

// sm_90a: tile_kv and stages reach the wgmma kernel's template (and its shared memory and key
// tile); tile_q = 128 is its own shape; tile_q = 64 or a tile_m selects the mma.sync kernel.
static void test_attention_codegen_sm90_schedule_changes_kernel(void **state) {
  (void)state;
  const ScheduledCall dh64[] = {  // case 0: self softmax, dh 64
      {{0}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 128, 4, false>"},
      {{.tile_q = 128}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 128, 4, false>"},
      {{.tile_kv = 64}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 64, 4, false>"},
      {{.stages = 2}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 128, 2, false>"},
      {{.stages = 3}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 128, 3, false>"},
      {{.tile_kv = 64, .stages = 3}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 64, 3, false>"},
      {{.zigzag = 2, .tile_kv = 64, .stages = 2},
       "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 64, 2, false>"},
      {{.tile_q = 64}, "attn_forward<64, ATTN_ACT_SOFTMAX, 2, 2>"},
      {{.tile_q = 64, .tile_m = 16}, "attn_forward<64, ATTN_ACT_SOFTMAX, 4, 1>"},
      {{.tile_m = 16}, "attn_forward<64, ATTN_ACT_SOFTMAX, 8, 1>"},
      {{.tile_q = 128, .tile_m = 32, .tile_kv = 64, .stages = 2},
       "attn_forward<64, ATTN_ACT_SOFTMAX, 4, 2>"},
  };
  check_calls(0, "sm_90a", dh64, (int)(sizeof dh64 / sizeof *dh64));
  const ScheduledCall dh128[] = {  // case 6: self softmax causal, dh 128
      {{0}, "attn_forward_sm90<128, ATTN_ACT_SOFTMAX, 128, 2, false>"},
      {{.tile_kv = 64}, "attn_forward_sm90<128, ATTN_ACT_SOFTMAX, 64, 4, false>"},
      {{.tile_kv = 64, .stages = 2}, "attn_forward_sm90<128, ATTN_ACT_SOFTMAX, 64, 2, false>"},
      {{.tile_kv = 32}, "attn_forward_sm90<128, ATTN_ACT_SOFTMAX, 32, 4, false>"},
      {{.tile_kv = 16, .stages = 2}, "attn_forward_sm90<128, ATTN_ACT_SOFTMAX, 16, 2, false>"},
  };
  check_calls(6, "sm_90a", dh128, (int)(sizeof dh128 / sizeof *dh128));
  const ScheduledCall fp16[] = {  // case 28: fp16 storage, dh 64: no mma.sync kernel, SIMT
      {{0}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 128, 4, true>"},
      {{.tile_kv = 64, .stages = 2}, "attn_forward_sm90<64, ATTN_ACT_SOFTMAX, 64, 2, true>"},
      {{.tile_q = 64}, "attn_forward_simt<64, ATTN_ACT_SOFTMAX>"},
  };
  check_calls(28, "sm_90a", fp16, (int)(sizeof fp16 / sizeof *fp16));
  // The launch follows the template: shared memory grows with the stages, the tile list's key
  // tile is tile_kv.
  char call[128];
  int smem2, smem3;
  TileList t;
  assert_true(scheduled_forward(0, "sm_90a", (Schedule){.tile_kv = 64, .stages = 2}, call,
                                &smem2, &t));
  assert_int_equal(t.tile_kv, 64);
  assert_true(t.persistent);
  assert_true(scheduled_forward(0, "sm_90a", (Schedule){.tile_kv = 64, .stages = 3}, call,
                                &smem3, NULL));
  assert_int_equal(smem3 - smem2, 2 * 64 * 64 * 2 + 8 * 4);  // one K and one V tile, 4 barriers
}

// The launches of case c's whole attention (forward and backward) on sm_90a, with or without
// @schedule(deterministic = false), as "kind:kernel" names in order; the fused kernel's call.
static int backward_launches(int c, bool atomic, const char *target, char names[][96], int cap,
                             char call[160], int *fused_smem) {
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  GdpaEmitOptions x = {.atomic_dq = atomic, .target = target};
  assert_true(gdpa_case_emit_with(&gdpa_test_cases[c], &x, 1, "a.", &arena, &src, e));
  int n = 0;
  for (int i = e->nforward; i < e->nlaunches && n < cap; i++, n++) {
    const Launch *l = &e->launches[i];
    snprintf(names[n], 96, "%s", l->kind == LAUNCH_ZERO ? "zero" : l->kernel);
    if (l->kind != LAUNCH_ZERO && strstr(l->kernel, "_bwd_qkv")) *fused_smem = l->smem;
  }
  call[0] = 0;
  const char *at = strstr(src.data, "attn_backward_sm90<128, ATTN_ACT_SOFTMAX, 2, false, true, false, true>");
  if (at) snprintf(call, 160, "%.*s", (int)strcspn(at, "("), at);
  sb_free(&src);
  arena_free(&arena);
  free(e);
  return n;
}

// The sm_90a backward kernels store their bf16 gradients by TMA out of the consumed resident
// tiles: dK/dV (and the fused dQ kernel) pass both gradients' maps, dQ its own; tensor maps of
// 64-row boxes are declared for them.
static void test_attention_codegen_sm90_backward_stores_by_tma(void **state) {
  (void)state;
  for (int atomic = 0; atomic < 2; atomic++) {
    Arena arena = {0};
    StrBuf src = {0};
    GdpaEmitted *e = calloc(1, sizeof *e);
    GdpaEmitOptions x = {.atomic_dq = atomic != 0};
    assert_true(gdpa_case_emit_with(&gdpa_test_cases[6], &x, 1, "a.", &arena, &src, e));
    assert_non_null(strstr(src.data, "(dk, dv, &g1_map, &g2_map,"));
    const char *dq_call = strstr(src.data, "(dq, (bf16_t *)0, &g1_map, nullptr,");
    if (atomic) assert_null(dq_call);  // no dQ kernel: dQ goes through fp32 atomics
    else assert_non_null(dq_call);
    sb_free(&src);
    arena_free(&arena);
    free(e);
  }
}

// The backward kernels' tiles, as the kernel source has them, are the sizes codegen (its tensor
// map boxes, the tile lists' work estimate) and the shared-memory count take.
static void test_attention_codegen_sm90_backward_tiles_agree(void **state) {
  (void)state;
  char want[96];
  snprintf(want, sizeof want, "enum { SM90_BWD_STREAM = %d, SM90_BWD_RESIDENT = %d };",
           (int)SM90_ATTN_BWD_STREAM, (int)SM90_ATTN_BWD_RESIDENT);
  assert_non_null(strstr(kernel_attention_sm90_backward_cuh, want));
}

static int find_launch(char names[][96], int n, const char *suffix) {
  for (int i = 0; i < n; i++) {
    size_t a = strlen(names[i]), b = strlen(suffix);
    if (a >= b && strcmp(names[i] + a - b, suffix) == 0) return i;
  }
  return -1;
}

// @schedule(deterministic = false) at head dim 128 on sm_90a: the backward zeroes an fp32
// workspace, runs one dK/dV kernel that also adds dQ (the DQ template argument, two more dSᵀ
// tiles of shared memory), then casts dQ; no dQ kernel of its own. Elsewhere (head dim 64,
// sm_100a) the hint leaves the deterministic kernels.
static void test_attention_codegen_atomic_dq_fuses_backward(void **state) {
  (void)state;
  char names[16][96], call[160];
  int smem = 0;
  int n = backward_launches(6, false, NULL, names, 16, call, &smem);  // self softmax causal, dh 128
  assert_true(find_launch(names, n, "_bwd_q") >= 0);
  assert_true(find_launch(names, n, "_bwd_kv") >= 0);
  assert_int_equal(find_launch(names, n, "_bwd_qkv"), -1);
  assert_int_equal(find_launch(names, n, "zero"), -1);
  n = backward_launches(6, true, NULL, names, 16, call, &smem);
  int zero = find_launch(names, n, "zero"), fused = find_launch(names, n, "_bwd_qkv");
  int cast = find_launch(names, n, "_bwd_q_cast");
  assert_true(zero >= 0 && zero < fused && fused < cast);
  assert_int_equal(find_launch(names, n, "_bwd_q"), -1);
  assert_int_equal(find_launch(names, n, "_bwd_kv"), -1);
  assert_true(find_launch(names, n, "_bwd_stats") >= 0);  // softmax: its row statistics first
  assert_string_equal(call, "attn_backward_sm90<128, ATTN_ACT_SOFTMAX, 2, false, true, false, true>");
  assert_int_equal(smem, sm90_attn_backward_dq_smem(128, 2));
  assert_int_equal(smem - sm90_attn_backward_smem(128, 2), 2 * 128 * 64 * 2);
  n = backward_launches(0, true, NULL, names, 16, call, &smem);  // dh 64
  assert_int_equal(find_launch(names, n, "_bwd_qkv"), -1);
  assert_true(find_launch(names, n, "_bwd_q") >= 0);
  n = backward_launches(6, true, "sm_100a", names, 16, call, &smem);
  assert_int_equal(find_launch(names, n, "_bwd_qkv"), -1);
  assert_int_equal(find_launch(names, n, "zero"), -1);
}

// The default key tile is the smallest of 16, 32, 64 that holds a set of at most 64 keys, else
// 128; tiles of at most 32 keys get four Q buffers (their items are mostly the Q load).
static void test_attention_codegen_sm90_default_tile_fits_the_set(void **state) {
  (void)state;
  const int64_t sets[] = {0, 1, 3, 16, 17, 32, 33, 64, 65, 256};
  const int want[] = {128, 16, 16, 16, 32, 32, 64, 64, 128, 128};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    assert_int_equal(sm90_attn_default_tile_kv(sets[i]), want[i]);
  assert_int_equal(sm90_attn_forward_q_buffers(16), 4);
  assert_int_equal(sm90_attn_forward_q_buffers(32), 4);
  assert_int_equal(sm90_attn_forward_q_buffers(64), 2);
  assert_int_equal(sm90_attn_forward_smem(128, 16, 4) - sm90_attn_forward_smem(128, 64, 4),
                   2 * 128 * 128 * 2 - 2 * 4 * 48 * 128 * 2 + 8 * 4);
}

// The sm_90a kernel takes a stage count only where its shared memory fits in 227 KB: at dh 128
// with 128 keys a tile only 2 stages do; everything else fits 2, 3 and 4.
static void test_attention_codegen_sm90_stages_fit_shared_memory(void **state) {
  (void)state;
  const struct {
    int c, tile_kv;
    bool fits[3];  // stages 2, 3, 4
  } want[] = {{0, 16, {true, true, true}},
              {6, 32, {true, true, true}},
              {0, 64, {true, true, true}},
              {0, 128, {true, true, true}},
              {6, 64, {true, true, true}},
              {6, 128, {true, false, false}}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    for (int stages = 2; stages <= 4; stages++) {
      char call[128];
      int smem = 0;
      Schedule sched = {.tile_kv = want[i].tile_kv, .stages = stages};
      bool ok = scheduled_forward(want[i].c, "sm_90a", sched, call, &smem, NULL);
      assert_int_equal(ok, want[i].fits[stages - 2]);
      if (ok) {
        assert_true(smem <= 227 * 1024);
        char expect[128];
        snprintf(expect, sizeof expect, "attn_forward_sm90<%d, ATTN_ACT_SOFTMAX, %d, %d, false>",
                 want[i].c == 0 ? 64 : 128, want[i].tile_kv, stages);
        assert_string_equal(call, expect);
      }
    }
  }
}

// sm_100a runs the mma.sync kernels: tile_q (64, 128) and tile_m (16, 32) shape the block, and
// tile_kv = 64, stages = 2 are what it does (the same kernel as without them).
static void test_attention_codegen_mma_schedule_changes_kernel(void **state) {
  (void)state;
  const ScheduledCall jagged[] = {  // case 0: jagged q, by default 128 rows of 32 a warp
      {{0}, "attn_forward<64, ATTN_ACT_SOFTMAX, 4, 2>"},
      {{.tile_q = 64}, "attn_forward<64, ATTN_ACT_SOFTMAX, 2, 2>"},
      {{.tile_m = 16}, "attn_forward<64, ATTN_ACT_SOFTMAX, 8, 1>"},
      {{.tile_q = 64, .tile_m = 16}, "attn_forward<64, ATTN_ACT_SOFTMAX, 4, 1>"},
      {{.tile_q = 128, .tile_m = 32}, "attn_forward<64, ATTN_ACT_SOFTMAX, 4, 2>"},
      {{.tile_kv = 64, .stages = 2}, "attn_forward<64, ATTN_ACT_SOFTMAX, 4, 2>"},
  };
  check_calls(0, "sm_100a", jagged, (int)(sizeof jagged / sizeof *jagged));
  const ScheduledCall dense[] = {  // case 18: pffn, dense q (1 row an example): by default
                                   // 32 rows of 16 a warp (at most 32 fixed rows)
      {{0}, "attn_forward<64, ATTN_ACT_RELU, 2, 1>"},
      {{.tile_q = 64}, "attn_forward<64, ATTN_ACT_RELU, 4, 1>"},
      {{.tile_q = 128}, "attn_forward<64, ATTN_ACT_RELU, 8, 1>"},
      {{.tile_m = 32}, "attn_forward<64, ATTN_ACT_RELU, 1, 2>"},
  };
  check_calls(18, "sm_100a", dense, (int)(sizeof dense / sizeof *dense));
  const ScheduledCall simt[] = {  // case 23: fp32 storage, the SIMT kernel's fixed 64 x 64
      {{0}, "attn_forward_simt<16, ATTN_ACT_SILU>"},
      {{.tile_q = 64, .tile_kv = 64, .stages = 1}, "attn_forward_simt<16, ATTN_ACT_SILU>"},
  };
  check_calls(23, "sm_100a", simt, (int)(sizeof simt / sizeof *simt));
}

// A value the chosen kernel cannot take is refused (sema says why, with the values it takes;
// codegen is the backstop for an IR that skipped it), never silently replaced.
static void test_attention_codegen_refuses_schedule_it_cannot_take(void **state) {
  (void)state;
  const struct {
    int c;
    const char *target;
    Schedule sched;
  } refused[] = {
      {0, "sm_90a", {.tile_kv = 48}},
      {0, "sm_90a", {.tile_kv = 256}},
      {0, "sm_90a", {.stages = 1}},
      {0, "sm_90a", {.stages = 5}},
      {6, "sm_90a", {.stages = 3}},                // 128 keys: 3 stages are over 227 KB
      {0, "sm_90a", {.tile_q = 64, .tile_kv = 128}},  // mma.sync: 64 keys
      {0, "sm_90a", {.tile_m = 16, .stages = 3}},     // mma.sync: double buffered
      {0, "sm_90a", {.tile_q = 256}},
      {0, "sm_100a", {.tile_kv = 128}},
      {0, "sm_100a", {.stages = 3}},
      {0, "sm_100a", {.tile_q = 32}},
      {0, "sm_100a", {.tile_m = 64}},
      {23, "sm_100a", {.tile_q = 128}},  // SIMT: 64 rows
      {23, "sm_100a", {.tile_m = 16}},
      {23, "sm_100a", {.stages = 2}},
      {28, "sm_90a", {.tile_q = 64, .tile_kv = 128}},  // fp16 off the sm_90a kernel: SIMT
  };
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    char call[128];
    if (scheduled_forward(refused[i].c, refused[i].target, refused[i].sched, call, NULL, NULL))
      fail_msg("refused[%zu] was emitted as %s", i, call);
  }
}

// zigzag = off keeps the forward's tiles in sorted order without a deal (TileList.zigzag: the
// runtime's gpu_tiles_build then gets no SM count); on, or unset, deals them.
static void test_attention_codegen_zigzag_reaches_tile_list(void **state) {
  (void)state;
  const char *targets[] = {"sm_90a", "sm_100a"};
  for (int t = 0; t < 2; t++) {
    char call[128];
    TileList tiles;
    assert_true(scheduled_forward(0, targets[t], (Schedule){0}, call, NULL, &tiles));
    assert_true(tiles.zigzag);
    assert_true(scheduled_forward(0, targets[t], (Schedule){.zigzag = 1}, call, NULL, &tiles));
    assert_true(tiles.zigzag);
    assert_true(scheduled_forward(0, targets[t], (Schedule){.zigzag = 2}, call, NULL, &tiles));
    assert_false(tiles.zigzag);
    assert_int_equal(tiles.persistent, t == 0);
  }
}

// --- the generated source's lines -------------------------------------------------------

enum { MAX_GENERATED_LINE = 119 };  // every line of generated CUDA is under 120 characters

// The longest line of src; *where gets its line number.
static size_t longest_line(const char *src, int *where) {
  size_t best = 0;
  int line = 1;
  *where = 0;
  for (const char *p = src; *p; line++) {
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > best) best = n, *where = line;
    if (!end) break;
    p = end + 1;
  }
  return best;
}

static void lines_are_short(const char *name, const char *src) {
  int where;
  size_t n = longest_line(src, &where);
  if (n > MAX_GENERATED_LINE) {
    const char *p = src;
    for (int i = 1; i < where; i++) p = strchr(p, '\n') + 1;
    print_message("%s: line %d has %zu characters: %.*s\n", name, where, n, (int)n, p);
  }
  assert_true(n <= MAX_GENERATED_LINE);
}

// The whole generated source (prelude and pasted kernels/*.cuh included) of every model and
// every codegen golden model, for both targets, and of the GDPA cases.
static void test_generated_lines_are_short(void **state) {
  (void)state;
  const char *patterns[] = {"models/*.gem", "tests/golden/codegen_*.gem"};
  int models = 0;
  for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
    glob_t g;
    if (glob(patterns[i], 0, NULL, &g) != 0) continue;
    for (size_t j = 0; j < g.gl_pathc; j++) {
      const char *targets[] = {"sm_90a", "sm_100a"};
      for (int t = 0; t < 2; t++) {
        LoadedModel m;
        assert_true(load_model(&m, g.gl_pathv[j], NULL, true, true, false));
        Diag d;
        diag_init(&d, &m.src, stderr);
        Plan p;
        assert_true(plan_build(&m.ir, targets[t], &m.arena, &d, &p));
        lines_are_short(g.gl_pathv[j], p.source);
        loaded_model_free(&m);
        models++;
      }
    }
    globfree(&g);
  }
  assert_true(models >= 2 * 6);
  const char *targets[] = {"sm_90a", "sm_100a"};
  for (int t = 0; t < 2; t++) {
    char *src = all_cases_source(targets[t]);
    lines_are_short("the GDPA cases", src);
    free(src);
  }
}

// --- tile lists ---------------------------------------------------------------------------

static void test_gpu_tiles_only_valid_tiles(void **state) {
  (void)state;
  const int64_t off[] = {0, 0, 1, 65, 130, 260};  // lengths 0, 1, 64, 65, 130
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 64, .tile_kv = 64, .heads = 2};
  int32_t *tiles = NULL;
  int64_t n = gpu_tiles_build(&tl, 5, off, off, 0, &tiles);
  assert_int_equal(n, (0 + 1 + 1 + 2 + 3) * 2);
  for (int64_t i = 0; i < n; i++) {
    int32_t b = tiles[3 * i], row0 = tiles[3 * i + 1], h = tiles[3 * i + 2];
    assert_true(b >= 1 && b <= 4);  // example 0 is empty: no tile
    assert_true(row0 < off[b + 1] - off[b]);
    assert_int_equal(row0 % 64, 0);
    assert_true(h == 0 || h == 1);
  }
  free(tiles);
}

static void test_gpu_tiles_sorted_by_work_then_zigzag(void **state) {
  (void)state;
  const int64_t off[] = {0, 10, 40, 100, 110};  // lengths 10, 30, 60, 10: one tile each
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 64, .heads = 1, .zigzag = true};
  int32_t *tiles = NULL;
  // no zigzag: biggest first, ties in example order
  assert_int_equal(gpu_tiles_build(&tl, 4, off, off, 0, &tiles), 4);
  const int32_t sorted[] = {2, 1, 0, 3};
  for (int i = 0; i < 4; i++) assert_int_equal(tiles[3 * i], sorted[i]);
  free(tiles);
  // two SMs: wave 0 left to right (2, 1), wave 1 right to left (3, 0)
  assert_int_equal(gpu_tiles_build(&tl, 4, off, off, 2, &tiles), 4);
  const int32_t dealt[] = {2, 1, 3, 0};
  for (int i = 0; i < 4; i++) assert_int_equal(tiles[3 * i], dealt[i]);
  free(tiles);
}

static void test_gpu_tiles_fixed_rows_for_pma(void **state) {
  (void)state;
  const int64_t kv[] = {0, 0, 5, 9};
  TileList tl = {.q_jag = -1, .kv_jag = 0, .q_fixed = 16, .tile_q = 64, .heads = 4};
  int32_t *tiles = NULL;
  // every example has its 16 seed rows, even the one with no keys (its output is 0)
  assert_int_equal(gpu_tiles_build(&tl, 3, NULL, kv, 0, &tiles), 3 * 4);
  free(tiles);
}

static void test_gpu_tiles_work_follows_the_mask(void **state) {
  (void)state;
  TileList full = {.tile_q = 64}, causal = {.tile_q = 64, .causal = true};
  TileList window = {.tile_q = 64, .causal = true, .window = 8};
  assert_int_equal(gpu_tiles_work(&full, 0, 64, 100), 64 * 100);
  assert_int_equal(gpu_tiles_work(&causal, 0, 64, 64), 64 * 65 / 2);
  // rows 0..7 see i+1 keys, rows 8..63 see 8
  assert_int_equal(gpu_tiles_work(&window, 0, 64, 64), 36 + 56 * 8);
}

// The closed form of gpu_tiles_work against the row-by-row count of the masks, on random
// ranges, key counts and masks (causal, windowed, both, neither).
static int64_t rows_work_reference(const TileList *tl, int64_t i0, int64_t i1, int64_t lk) {
  int64_t work = 0;
  for (int64_t i = i0; i < i1; i++) {
    int64_t lo = 0, hi = lk;
    if (tl->causal && i + 1 < hi) hi = i + 1;
    if (tl->window > 0) {
      if (i - tl->window + 1 > lo) lo = i - tl->window + 1;
      if (!tl->causal && i + tl->window < hi) hi = i + tl->window;
    }
    if (hi > lo) work += hi - lo;
  }
  return work;
}

static void test_gpu_tiles_work_closed_form_matches_rows(void **state) {
  (void)state;
  static const int64_t windows[] = {0, 1, 2, 3, 17, 64, 500};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int trial = 0; trial < 20000; trial++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    TileList tl = {.tile_q = 64, .causal = (x >> 60) & 1, .window = windows[(x >> 40) % 7]};
    int64_t i0 = (int64_t)((x >> 8) % 300), len = (int64_t)((x >> 20) % 140);
    int64_t lk = (int64_t)((x >> 30) % 400);
    int64_t want = rows_work_reference(&tl, i0, i0 + len, lk);
    int64_t got = gpu_tiles_work(&tl, i0, i0 + len, lk);
    if (got != want)
      fail_msg("causal %d window %lld rows [%lld, %lld) keys %lld: %lld, want %lld", tl.causal,
               (long long)tl.window, (long long)i0, (long long)(i0 + len), (long long)lk,
               (long long)got, (long long)want);
  }
}

// On a key-side list of a causal self-attention over L rows, gpu_tiles_work counts the queries
// that see keys [k0, k1): key k is seen by [k, min(L, k + w)).
static void test_gpu_tiles_work_key_side_counts_queries(void **state) {
  (void)state;
  static const int64_t windows[] = {0, 1, 5, 64, 300};
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (int trial = 0; trial < 20000; trial++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    TileList tl = {.tile_q = 64, .causal = true, .window = windows[(x >> 40) % 5],
                   .key_side = true};
    int64_t L = 1 + (int64_t)((x >> 8) % 400), k0 = (int64_t)((x >> 20) % (uint64_t)L);
    int64_t k1 = k0 + (int64_t)((x >> 30) % 140);
    if (k1 > L) k1 = L;
    int64_t want = 0;
    for (int64_t k = k0; k < k1; k++) {
      int64_t hi = tl.window > 0 && k + tl.window < L ? k + tl.window : L;
      want += hi - k;
    }
    int64_t got = gpu_tiles_work(&tl, k0, k1, L);
    if (got != want)
      fail_msg("window %lld keys [%lld, %lld) of %lld: %lld, want %lld", (long long)tl.window,
               (long long)k0, (long long)k1, (long long)L, (long long)got, (long long)want);
  }
}

// A list for a grid of one CTA per tile, without zigzag: the tiles by work, largest first, equal
// works in (example, row tile, head) order (the radix sort is stable).
static void test_gpu_tiles_sorted_by_work_then_order(void **state) {
  (void)state;
  int64_t q[65] = {0};
  uint64_t x = 12345;
  for (int b = 0; b < 64; b++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    q[b + 1] = q[b] + (int64_t)((x >> 33) % 300);
  }
  TileList tl = {.q_jag = 0, .kv_jag = 0, .tile_q = 64, .heads = 2, .causal = true};
  int32_t *tiles = NULL;
  int64_t n = gpu_tiles_build(&tl, 64, q, q, 0, &tiles);
  assert_true(n > 64);
  for (int64_t i = 1; i < n; i++) {
    const int32_t *a = tiles + 3 * (i - 1), *b = tiles + 3 * i;
    int64_t la = q[a[0] + 1] - q[a[0]], lb = q[b[0] + 1] - q[b[0]];
    int64_t wa = gpu_tiles_work(&tl, a[1], a[1] + 64 < la ? a[1] + 64 : la, la);
    int64_t wb = gpu_tiles_work(&tl, b[1], b[1] + 64 < lb ? b[1] + 64 : lb, lb);
    wa += (a[1] + 64 < la ? 64 : la - a[1]), wb += (b[1] + 64 < lb ? 64 : lb - b[1]);
    assert_true(wa >= wb);
    if (wa == wb) {
      int64_t ka = ((int64_t)a[0] * 4096 + a[1]) * 2 + a[2], kb = ((int64_t)b[0] * 4096 + b[1]) * 2 + b[2];
      assert_true(ka < kb);
    }
  }
  free(tiles);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_tiles_work_closed_form_matches_rows),
      cmocka_unit_test(test_gpu_tiles_work_key_side_counts_queries),
      cmocka_unit_test(test_gpu_tiles_sorted_by_work_then_order),
      cmocka_unit_test(test_attention_codegen_self_softmax_launches_sm90a),
      cmocka_unit_test(test_attention_codegen_self_softmax_launches_sm100a),
      cmocka_unit_test(test_attention_codegen_pma_sums_dq_over_examples),
      cmocka_unit_test(test_attention_codegen_refuses_unsupported_head_dim),
      cmocka_unit_test(test_attention_codegen_sm90_schedule_changes_kernel),
      cmocka_unit_test(test_attention_codegen_sm90_default_tile_fits_the_set),
      cmocka_unit_test(test_attention_codegen_sm90_stages_fit_shared_memory),
      cmocka_unit_test(test_attention_codegen_atomic_dq_fuses_backward),
      cmocka_unit_test(test_attention_codegen_sm90_backward_stores_by_tma),
      cmocka_unit_test(test_attention_codegen_sm90_backward_tiles_agree),
      cmocka_unit_test(test_attention_codegen_mma_schedule_changes_kernel),
      cmocka_unit_test(test_attention_codegen_refuses_schedule_it_cannot_take),
      cmocka_unit_test(test_attention_codegen_zigzag_reaches_tile_list),
      cmocka_unit_test(test_generated_lines_are_short),
      cmocka_unit_test(test_gpu_tiles_only_valid_tiles),
      cmocka_unit_test(test_gpu_tiles_sorted_by_work_then_zigzag),
      cmocka_unit_test(test_gpu_tiles_fixed_rows_for_pma),
      cmocka_unit_test(test_gpu_tiles_work_follows_the_mask),
      cmocka_unit_test(test_attention_codegen_compiles_sm90a),
      cmocka_unit_test(test_attention_codegen_compiles_sm100a),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
