// target.c: the target table. The numbers are the vendors' datasheet figures for the SXM parts
// (dense tensor throughput, no sparsity); docs/codegen.md lists them with their sources.
#include "target.h"

#include <string.h>

static const Target targets[] = {
    {
        .name = "sm_90a",
        .gpu = "NVIDIA H100/H200 SXM (Hopper)",
        .sm_version = 90,
        .num_sms = 132,
        .smem_per_sm = 228 * 1024,
        .max_smem_per_block = 227 * 1024,
        .max_threads_per_block = 1024,
        .wgmma = true,
        .tcgen05 = false,
        .native_mxfp8 = false,
        .tma = true,
        .peak_tflops_bf16 = 989.4,
        .peak_tflops_fp8 = 1978.9,
        .peak_tflops_fp32 = 66.9,
        .hbm_tb_per_s = 4.8,  // H200 (H100 SXM: 3.35)
    },
    {
        .name = "sm_100a",
        .gpu = "NVIDIA B200 (Blackwell)",
        .sm_version = 100,
        .num_sms = 148,
        .smem_per_sm = 228 * 1024,
        .max_smem_per_block = 227 * 1024,
        .max_threads_per_block = 1024,
        .wgmma = false,
        .tcgen05 = true,
        .native_mxfp8 = true,
        .tma = true,
        .peak_tflops_bf16 = 2250.0,
        .peak_tflops_fp8 = 4500.0,
        .peak_tflops_fp32 = 80.0,
        .hbm_tb_per_s = 8.0,
    },
};

const Target *target_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
    if (strcmp(targets[i].name, name) == 0) return &targets[i];
  return NULL;
}

const char *target_names(void) { return "sm_90a, sm_100a"; }
