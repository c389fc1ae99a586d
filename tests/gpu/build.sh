#!/bin/sh
# build.sh: builds the standalone GPU test and benchmark of the attention kernels into
# $BUILD/gpu (default build/att). Host code only: the kernels are compiled by NVRTC at run
# time (or read from the cubin cache), and the CUDA driver is opened with dlopen, so this
# builds on a machine without a GPU. Needs $BUILD/libatt.a or $BUILD/libgemc.a, which hold
# their harness (runtime/gdpa_gpu.c, gdpa_case.c, gdpa_bench.c).
set -e
BUILD=${BUILD:-build/att}
CUDA=${CUDA:-/usr/local/cuda}
LIB=$BUILD/libgemc.a
[ -f "$BUILD/libatt.a" ] && LIB=$BUILD/libatt.a
mkdir -p "$BUILD/gpu"
CFLAGS="-std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -O2 -g -Wall -Wextra -Werror -Wshadow -Wundef -Wcast-qual \
 -Icompiler -Iruntime -Icodegen -Itests/gpu"
LIBS="$LIB -ldl -lm -pthread"
for prog in ${PROGS:-test_gdpa bench_gdpa}; do
  ${CC:-cc} $CFLAGS -o "$BUILD/gpu/$prog" tests/gpu/$prog.c $LIBS
done
