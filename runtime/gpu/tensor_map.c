// tensor_map.c: cuTensorMapEncodeTiled over a packed matrix (tensor_map.h).
#include "tensor_map.h"

#include "checked.h"

bool tensor_map_encode(CUtensorMap *map, CUdeviceptr addr, int64_t rows, int64_t width,
                       bool is_fp16, int box_rows, char *err, size_t err_size) {
  const CudaDriver *d = cuda_driver();
  if (!d || !d->cuTensorMapEncodeTiled) return fail(err, err_size, "no CUDA driver");
  if (width <= 0 || width % 64 != 0)
    return fail(err, err_size, "a tensor map needs a width that is a multiple of 64, not %lld",
                (long long)width);
  if (addr % 16 != 0) return fail(err, err_size, "a tensor map needs a 16-byte aligned address");
  if (box_rows < 1 || box_rows > 256)
    return fail(err, err_size, "a tensor map box of %d rows (1..256)", box_rows);
  // A batch with no rows still gets a valid map; the kernel then loads nothing.
  uint64_t dims[2] = {(uint64_t)width, (uint64_t)(rows > 0 ? rows : 1)};
  uint64_t strides[1] = {(uint64_t)width * 2};
  unsigned box[2] = {64, (unsigned)box_rows}, elem_strides[2] = {1, 1};
  if (!CU_CHECK(d->cuTensorMapEncodeTiled(
          map, is_fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
          (void *)(uintptr_t)addr, dims, strides, box, elem_strides,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)))
    return fail(err, err_size, "%s", cuda_last_error());
  return true;
}
