// gdpa_cases.h: the attention cases every GPU test (and the codegen unit test) covers: each
// shape, mask and activation at least once, bf16, dh 32, 64 and 128. Included by one .c file
// per program.
// defines: gdpa_test_cases, GDPA_NUM_TEST_CASES
#ifndef GEMC_GDPA_CASES_H
#define GEMC_GDPA_CASES_H

#include "gdpa_case.h"

static const GdpaCase gdpa_test_cases[] = {
    // self, every activation, non-causal and causal
    {ATTN_SELF, ACT_SOFTMAX, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_SILU, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_GELU, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_GELU_TAYLOR, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_RELU, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_SIGMOID, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_SOFTMAX, true, 0, false, 2, 128, 0, 0, 300, 300, 0.088, 0, 0, 0},
    {ATTN_SELF, ACT_SILU, true, 0, false, 2, 128, 0, 0, 300, 300, 0.088, 0, 0, 0},
    {ATTN_SELF, ACT_GELU, true, 0, false, 2, 128, 0, 0, 300, 300, 0.088, 0, 0, 0},
    // windows, with and without causal; hstu norm
    {ATTN_SELF, ACT_SOFTMAX, true, 40, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_SILU, true, 70, true, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_SOFTMAX, false, 50, false, 4, 32, 0, 0, 300, 300, 0.17, 0, 0, 0},
    {ATTN_SELF, ACT_GELU_TAYLOR, false, 100, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 0},
    // cross: jagged kv on its own dim, and a set kv
    {ATTN_CROSS, ACT_SOFTMAX, false, 0, false, 2, 64, 0, 0, 300, 150, 0.125, 0, 0, 0},
    {ATTN_CROSS, ACT_GELU, false, 0, false, 2, 128, 0, 0, 300, 150, 0.088, 0, 0, 0},
    {ATTN_CROSS, ACT_SILU, false, 0, false, 4, 64, 0, 3, 300, 3, 0.125, 0, 0, 0},
    // pma: seeds over a jagged kv
    {ATTN_PMA, ACT_GELU_TAYLOR, false, 0, false, 4, 64, 16, 0, 0, 300, 0.125, 0, 0, 0},
    {ATTN_PMA, ACT_SOFTMAX, false, 0, false, 2, 64, 5, 0, 0, 300, 0.125, 0, 0, 0},
    // pffn: dense q and set q over a jagged kv
    {ATTN_PFFN, ACT_RELU, false, 0, false, 2, 64, 0, 0, 0, 300, 0.125, 0, 0, 0},
    {ATTN_PFFN, ACT_SOFTMAX, false, 0, false, 2, 64, 4, 0, 0, 300, 0.125, 0, 0, 0},
    {ATTN_PFFN, ACT_SIGMOID, false, 0, true, 2, 64, 4, 0, 0, 300, 0.125, 0, 0, 0},
    // the other forward block shapes: 128 rows of 16 per warp, 64 rows of 16 per warp
    {ATTN_SELF, ACT_SOFTMAX, true, 0, false, 2, 128, 0, 0, 300, 300, 0.088, 128, 16, 0},
    {ATTN_SELF, ACT_GELU, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 64, 16, 0},
    // SIMT kernels: fp32 storage (gem_tiny), fp16 storage (gem_full), dh not a multiple of 16
    {ATTN_SELF, ACT_SILU, true, 0, false, 2, 16, 0, 0, 300, 300, 0.25, 0, 0, 32},
    {ATTN_PMA, ACT_SILU, false, 0, false, 2, 16, 4, 0, 0, 300, 0.25, 0, 0, 32},
    {ATTN_CROSS, ACT_SOFTMAX, false, 0, false, 4, 32, 0, 0, 300, 150, 0.125, 0, 0, 16},
    {ATTN_SELF, ACT_GELU, false, 60, false, 2, 24, 0, 0, 300, 300, 0.2, 0, 0, 0},
    {ATTN_PFFN, ACT_SOFTMAX, false, 0, false, 2, 16, 4, 0, 0, 300, 0.25, 0, 0, 32},
    // fp16 storage on tensor cores (sm_90a forward): dh 64 and 128
    {ATTN_SELF, ACT_SOFTMAX, false, 0, false, 2, 64, 0, 0, 300, 300, 0.125, 0, 0, 16},
    {ATTN_SELF, ACT_SILU, true, 0, false, 2, 128, 0, 0, 300, 300, 0.088, 0, 0, 16},
    // long sequences: many more work items than SMs, so each persistent CTA walks several
    {ATTN_SELF, ACT_SOFTMAX, false, 0, false, 4, 64, 0, 0, 2000, 2000, 0.125, 0, 0, 0},
    {ATTN_SELF, ACT_GELU, true, 0, false, 2, 128, 0, 0, 1500, 1500, 0.088, 0, 0, 0},
    // head dim 128 without a mask, and under a window (test_gdpa also runs every dh 128 case
    // with dQ inside the dK/dV kernel, @schedule(deterministic = false))
    {ATTN_SELF, ACT_GELU, false, 0, false, 2, 128, 0, 0, 700, 700, 0.088, 0, 0, 0},
    {ATTN_SELF, ACT_SOFTMAX, false, 90, false, 2, 128, 0, 0, 300, 300, 0.088, 0, 0, 0},
    {ATTN_CROSS, ACT_SOFTMAX, false, 0, false, 2, 128, 0, 0, 300, 150, 0.088, 0, 0, 16},
    // small key sets: the sm_90a forward's 16- and 32-key tiles (4 Q buffers), a partial one
    {ATTN_CROSS, ACT_SOFTMAX, false, 0, false, 2, 128, 0, 16, 300, 16, 0.088, 0, 0, 0},
    {ATTN_CROSS, ACT_GELU, false, 0, false, 4, 128, 0, 32, 300, 32, 0.088, 0, 0, 0},
    {ATTN_CROSS, ACT_SILU, false, 0, false, 2, 64, 0, 20, 700, 20, 0.125, 0, 0, 0},
    // head widths that are multiples of 16 but not powers of two (mma.sync kernels; rows of 6
    // and 12 chunks: attn_smem_index rotates them), and PMA's one-pass backward at 32 seeds
    {ATTN_SELF, ACT_SILU, true, 0, false, 2, 48, 0, 0, 300, 300, 0.144, 0, 0, 0},
    {ATTN_PMA, ACT_SOFTMAX, false, 0, false, 2, 96, 8, 0, 0, 300, 0.1, 0, 0, 0},
    {ATTN_PMA, ACT_GELU, false, 0, false, 4, 128, 32, 0, 0, 2000, 0.088, 0, 0, 0},
};

enum { GDPA_NUM_TEST_CASES = (int)(sizeof gdpa_test_cases / sizeof gdpa_test_cases[0]) };

#endif
