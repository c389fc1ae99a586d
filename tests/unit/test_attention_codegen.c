// test_attention_codegen.c: the attention emitter and the tile list builder, without a GPU.
// The emitted CUDA of every shape, mask and activation compiles with NVRTC for sm_90a and
// sm_100a (skipped when libnvrtc is not installed); launches and tile lists have the
// documented form; tile lists hold only valid tiles, sorted by work and dealt zigzag.
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
#include "gpu_tiles.h"
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

// Cases that together cover every shape, mask, activation, head dim, forward block shape and
// storage type (the SIMT kernels: fp32, fp16, dh 24).
static const int compiled_cases[] = {0,  7,  9,  10, 11, 14, 15, 16, 17, 18,
                                     19, 20, 21, 22, 23, 24, 25, 26, 27};

static char *all_cases_source(void) {
  StrBuf src = {0};
  for (size_t i = 0; i < sizeof compiled_cases / sizeof compiled_cases[0]; i++) {
    Arena arena = {0};
    GdpaEmitted *e = calloc(1, sizeof *e);
    char prefix[16];
    snprintf(prefix, sizeof prefix, "c%d.", compiled_cases[i]);
    assert_true(gdpa_case_emit(&gdpa_test_cases[compiled_cases[i]], prefix, &arena, &src, e));
    free(e);
    arena_free(&arena);
  }
  return sb_take(&src);
}

static void compiles_for(const char *arch) {
  void *lib = open_nvrtc();
  if (!lib) skip();
  char *src = all_cases_source();
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

static void test_attention_codegen_self_softmax_launches(void **state) {
  (void)state;
  Arena arena = {0};
  StrBuf src = {0};
  GdpaEmitted *e = calloc(1, sizeof *e);
  assert_true(gdpa_case_emit(&gdpa_test_cases[0], "m.", &arena, &src, e));
  // forward; bwd_q: statistics + dQ; bwd_k: dK and dV together; bwd_v: nothing
  assert_int_equal(e->nforward, 1);
  assert_int_equal(e->nlaunches, 4);
  assert_int_equal(e->ntiles, 3);
  const Launch *f = &e->launches[0];
  assert_int_equal(f->grid, GRID_TILES);
  assert_string_equal(f->kernel, "m_attn_fwd");
  assert_int_equal(f->args[0].kind, ARG_TENSOR);
  assert_int_equal(f->args[0].tensor, e->out);
  assert_int_equal(f->args[f->nargs - 1].kind, ARG_TILES);
  assert_int_equal(e->tiles[0].tile_q, 128);
  assert_string_equal(e->launches[1].kernel, "m_attn_bwd_stats");
  assert_string_equal(e->launches[2].kernel, "m_attn_bwd_q");
  assert_string_equal(e->launches[3].kernel, "m_attn_bwd_kv");
  // the statistics workspace is one (tensor, slot) for the launches that share it
  const LaunchArg *ws_stats = &e->launches[1].args[0];
  const LaunchArg *ws_kv = &e->launches[3].args[e->launches[3].nargs - 1];
  assert_int_equal(ws_stats->kind, ARG_WORKSPACE);
  assert_int_equal(ws_kv->kind, ARG_WORKSPACE);
  assert_int_equal(ws_stats->tensor, ws_kv->tensor);
  assert_int_equal(ws_stats->slot, ws_kv->slot);
  assert_non_null(strstr(src.data, "// gdpa_case.gem:1:1 gdpa self softmax (fwd)"));
  assert_non_null(strstr(src.data, "extern \"C\" __global__ void __launch_bounds__(128)"));
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
  // forward; bwd_q: one kernel that sums the examples in order; bwd_k: dK, dV
  assert_int_equal(e->nlaunches, 3);
  assert_int_equal(e->ntiles, 2);  // bwd_q needs no tile list
  const Launch *dq = &e->launches[1];
  assert_int_equal(dq->grid, GRID_FIXED);
  assert_int_equal(dq->size.c, (16 + 63) / 64 * 4);  // seed tiles x heads
  assert_int_equal(dq->args[0].tensor, e->dq);
  assert_int_equal(dq->args[1].kind, ARG_SIZE);       // the batch size
  for (int i = 0; i < e->nlaunches; i++)
    for (int a = 0; a < e->launches[i].nargs; a++)
      assert_int_not_equal(e->launches[i].args[a].kind, ARG_WORKSPACE);
  assert_non_null(strstr(src.data, "const float *__restrict__ q"));  // fp32 seeds
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
  char *src = all_cases_source();
  lines_are_short("the GDPA cases", src);
  free(src);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_codegen_self_softmax_launches),
      cmocka_unit_test(test_attention_codegen_pma_sums_dq_over_examples),
      cmocka_unit_test(test_attention_codegen_refuses_unsupported_head_dim),
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
