#!/bin/sh
# tests/codegen/plan_emu.sh: a whole training step of a model's plan, run on the CPU
# (plan_emu.c over cuda_on_cpu.h), compared with the CPU executor: the loss, every gradient and
# every parameter after the optimizer. Skips when no C++20 compiler exists.
#   tests/codegen/plan_emu.sh GEMC MODEL.gem TOLERANCE [ARCH]
# ARCH (default: the model's) picks the kernels: sm_90a runs bf16 and fp16 attention on the
# TMA + wgmma kernels, sm_100a on the mma.sync ones, through the emulator's collectives. GEMC_EMU_SIMT=1 runs fp8 and mxfp8
# attention on the SIMT kernels instead of the tensor-core ones. PLAN_EMU_ISOLATE=1 checks each
# node on the executor's inputs (plan_emu.c).
set -u
cd "$(dirname "$0")/../.." || exit 2
gemc=$1 model=$2 tol=$3 arch=${4:-}
emit_arch= simt=
[ -n "$arch" ] && emit_arch="--arch $arch"
# A model's "# plan_emu skip: NAME[,NAME]" line lists nodes its comment explains as inexact.
skip=$(sed -n 's/^# plan_emu skip: *\([^ ]*\).*/\1/p' "$model" | head -n 1)
[ -n "$skip" ] && export PLAN_EMU_NODE_SKIP="$skip"
[ "${GEMC_EMU_SIMT:-0}" = 1 ] && simt=-DGEMC_EMU_SIMT
CXX=${CXX:-c++}
CC=${CC:-cc}
lib=$(dirname "$gemc")/libgemc.a
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
if ! command -v "$CXX" >/dev/null 2>&1; then echo "plan_emu: SKIP: no C++ compiler ($CXX)"; exit 0; fi
"$gemc" emit $emit_arch "$model" >"$tmp/model.cu" || exit 1
# The kernels without the prelude (prelude_on_cpu.h stands in) and without extern "C".
awk '/^\/\/ prelude.cuh:/ { skip = 1 } skip && /^\/\/ [A-Za-z0-9_.-]+\.gem:[0-9]+:[0-9]+ / { skip = 0 } !skip' "$tmp/model.cu" |
  sed -e 's/extern "C"//' \
      -e 's/extern __shared__ __align__([0-9]*) unsigned char \([a-z0-9_]*\)\[\];/unsigned char *\1 = emu_dynamic_smem;/' \
      -e 's/const __grid_constant__ TmaMap /const TmaMap \&/' \
      >"$tmp/model_kernels.inc"
awk '/__global__/ { getline; sub(/\(.*/, ""); printf "{\"%s\", (void *)&%s},\n", $0, $0 }' "$tmp/model.cu" >"$tmp/kernel_table.inc"
if ! "$CXX" -std=c++20 -O1 -pthread -w $simt -Itests/codegen -I"$tmp" -c -o "$tmp/kernels.o" tests/codegen/plan_emu_kernels.cpp 2>"$tmp/cxx.err"; then
  if grep -q "barrier" "$tmp/cxx.err"; then echo "plan_emu: SKIP: $CXX has no C++20 <barrier>"; exit 0; fi
  head -n 30 "$tmp/cxx.err"; exit 1
fi
"$CC" -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -O1 -w $(make -s --no-print-directory print-includes) \
  -c -o "$tmp/plan_emu.o" tests/codegen/plan_emu.c || exit 1
"$CXX" -pthread -o "$tmp/plan_emu" "$tmp/plan_emu.o" "$tmp/kernels.o" "$lib" -lm -ldl || exit 1
"$tmp/plan_emu" "$model" "$tol" $arch
