// tensor_map.h: the TMA tensor map of one packed row-major bf16/fp16 matrix, as the sm_90a
// attention kernels read it (kernels/attention_sm90.cuh): `rows` rows of `width` elements,
// boxes of `box_rows` rows x 64 columns (128 bytes, the 128-byte swizzle's span). A box that
// runs past `rows` reads zeros; rows past a jagged sequence's end but inside the matrix are
// other examples' rows, which the kernels mask.
// defines: tensor_map_encode
#ifndef GEMC_TENSOR_MAP_H
#define GEMC_TENSOR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_driver.h"

// elem_bytes: 2 (fp16 when is_fp16, else bf16). False with a reason for a width that is not a
// multiple of 64, an address not 16-byte aligned, or a driver error.
bool tensor_map_encode(CUtensorMap *map, CUdeviceptr addr, int64_t rows, int64_t width,
                       bool is_fp16, int box_rows, char *err, size_t err_size);

#endif
