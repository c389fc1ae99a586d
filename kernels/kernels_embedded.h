// kernels_embedded.h: the hand-written CUDA of kernels/*.cuh, embedded in the binary as C
// strings by the Makefile (build/.../kernels_embedded.c), so gemc needs no files at run time.
// defines: kernel_prelude_cuh, kernel_table_grad_cuh, kernel_attention*_cuh, kernel_gemm_cuh,
//          kernel_fp8_codes_cuh
#ifndef GEMC_KERNELS_EMBEDDED_H
#define GEMC_KERNELS_EMBEDDED_H

extern const char kernel_prelude_cuh[];
extern const char kernel_table_grad_cuh[];
extern const char kernel_attention_cuh[];
extern const char kernel_attention_forward_cuh[];
extern const char kernel_attention_backward_cuh[];
extern const char kernel_attention_pma_backward_cuh[];
extern const char kernel_attention_simt_cuh[];
extern const char kernel_attention_sm90_cuh[];
extern const char kernel_attention_sm90_backward_cuh[];
extern const char kernel_gemm_cuh[];
extern const char kernel_attention_quantized_cuh[];
extern const char kernel_attention_quantized_tc_cuh[];
extern const char kernel_attention_tiny_kv_cuh[];
extern const char kernel_fp8_codes_cuh[];

#endif
