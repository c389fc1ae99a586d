// target.h: the GPU targets gemc generates code for, and the facts about them that codegen and
// the runtime use (SM count, shared memory, tensor-core generation, datasheet peaks for MFU).
// defines: Target, target_find, target_names
#ifndef GEMC_TARGET_H
#define GEMC_TARGET_H

#include <stdbool.h>

typedef struct Target {
  const char *name;         // "sm_90a"
  const char *gpu;          // the GPU the facts are for
  int sm_version;           // 90, 100
  int num_sms;
  int smem_per_sm;          // bytes of shared memory per SM
  int max_smem_per_block;   // bytes a block may opt in to
  int max_threads_per_block;
  bool wgmma;               // warpgroup MMA (sm_90a)
  bool tcgen05;             // 5th-gen tensor cores with tensor memory (TMEM) (sm_100a)
  bool native_mxfp8;        // block-scaled fp8 MMA in hardware
  bool tma;                 // the tensor memory accelerator
  double peak_tflops_bf16;  // dense, datasheet
  double peak_tflops_fp8;   // dense, datasheet
  double peak_tflops_fp32;  // non-tensor
  double hbm_tb_per_s;
} Target;

// The target named `name`, or NULL.
const Target *target_find(const char *name);
// "sm_90a, sm_100a", for messages.
const char *target_names(void);

#endif
