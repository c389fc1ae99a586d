#!/bin/sh
# tests/codegen/table_grad_emu.sh: the deterministic table gradient, checked without a GPU.
# Emits tests/golden/codegen_small.gem, extracts the generated apply kernels of
# @tagt, compiles them with kernels/table_grad.cuh over cuda_on_cpu.h (C++20, ucontext fibers)
# and runs them on several batches (one id, none, many duplicates, several 1024-occurrence
# tiles; tables of 16, 50 or 70, 3000, 9000 and 100000 rows: 1, 2 and 3 radix passes);
# every result must equal the CPU reference bit for bit. Skips when no C++20 compiler exists.
#   tests/codegen/table_grad_emu.sh [GEMC]
set -u
cd "$(dirname "$0")/../.." || exit 2
gemc=${1:-build/gemc}
CXX=${CXX:-c++}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
if ! command -v "$CXX" >/dev/null 2>&1; then echo "table_grad_emu: SKIP: no C++ compiler ($CXX)"; exit 0; fi
"$gemc" emit tests/golden/codegen_small.gem >"$tmp/model.cu" || exit 1
lib=$(dirname "$gemc")/libgemc.a  # the CPU executor's rounding functions
sed 's/extern "C"//' kernels/table_grad.cuh >"$tmp/table_grad_kernels.inc"
{ awk '/^table_grad_apply_tagt\(/,/^}/' "$tmp/model.cu"
  awk '/^table_grad_apply_long_tagt\(/,/^}/' "$tmp/model.cu"; } |
  sed 's/^table_grad_\(apply\|apply_long\)_tagt(/void table_grad_\1_tagt(/' >"$tmp/table_grad_generated.inc"
if ! "$CXX" -std=c++20 -O1 -pthread -w -Itests/codegen -I"$tmp" -o "$tmp/emu" tests/codegen/table_grad_emu.cpp "$lib" -lm 2>"$tmp/cxx.err"; then
  if grep -q "barrier" "$tmp/cxx.err"; then echo "table_grad_emu: SKIP: $CXX has no C++20 <barrier>"; exit 0; fi
  cat "$tmp/cxx.err"; exit 1
fi
fail=0
# A fourth number sets the sort's tiles (default: one a 1024 occurrences, at most 128): 3
# tiles over 37 occurrences leave one empty, 5 and 7 split the runs of hot ids over tiles.
for args in "37 50 12" "37 50 12 3" "1 50 12" "0 50 12" "0 50 12 4" "60 9000 12" "100 9000 9000" "1100 70 70" "1100 70 70 5" "300 100000 100000" "40 16 16" "200 3000 3000" "2000 20 20 7" "11000 3000 3000" "40000 100000 100000"; do
  # shellcheck disable=SC2086
  if out=$("$tmp/emu" $args); then echo "PASS table_grad_emu $out"; else echo "FAIL table_grad_emu $out"; fail=1; fi
done
exit $fail
