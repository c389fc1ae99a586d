#!/bin/sh
# tests/codegen/cuda_on_cpu_check.sh: builds and runs cuda_on_cpu_check.cpp, the emulator's own
# checks (barriers, missing barriers, exits, shuffles, atomics, deadlock). Skips when no C++20
# compiler exists, as plan_emu.sh does.
set -u
cd "$(dirname "$0")/../.." || exit 2
CXX=${CXX:-c++}
if ! command -v "$CXX" >/dev/null 2>&1; then echo "cuda_on_cpu_check: SKIP: no C++ compiler ($CXX)"; exit 0; fi
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
"$CXX" -std=c++20 -O1 -Wall -Itests/codegen -o "$tmp/check" tests/codegen/cuda_on_cpu_check.cpp || exit 1
"$tmp/check"
