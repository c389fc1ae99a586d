// cpu_kernels_f64.c: the CPU executor's op kernels over double, for EXEC_F64: no rounding and
// no quantization, for gradient checks against finite differences.
// The kernels themselves are written once, over `real`, in the cpu_*_real.h files.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exec_internal.h"
#include "numerics.h"

typedef double real;
#define K(name) name##_f64
#define EMULATE 0

#include "cpu_common_real.h"
#include "cpu_matmul_real.h"
#include "cpu_forward_real.h"
#include "cpu_attention_real.h"
#include "cpu_backward_real.h"
#include "cpu_kernel_table_real.h"
