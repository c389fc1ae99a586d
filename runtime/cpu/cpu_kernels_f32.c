// cpu_kernels_f32.c: the CPU executor's op kernels over float, for EXEC_F32: fp8/mxfp8 matmul
// operands are quantized here, and cpu_exec.c rounds every node's output to its dtype.
// The kernels themselves are written once, over `real`, in the cpu_*_real.h files.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exec_internal.h"
#include "numerics.h"

typedef float real;
#define K(name) name##_f32
#define EMULATE 1

#include "cpu_common_real.h"
#include "cpu_matmul_real.h"
#include "cpu_forward_real.h"
#include "cpu_attention_real.h"
#include "cpu_backward_real.h"
#include "cpu_kernel_table_real.h"
