#!/bin/sh
# check_launch.sh BUILD: the world-of-one launches on a GPU machine (docs/distributed.md):
#   - the NCCL backend's collectives (test_comm_nccl) through `gemc launch -n 1` and through
#     torchrun (when it is on the PATH), as a launcher starts them;
#   - gem_tiny trained 40 steps on the GPU through `gemc launch -n 1` and torchrun gives, step
#     by step, the losses of a plain `gemc train` (the same bits: a world of one trains as one
#     process, and the GPU's steps are deterministic);
#   - a GPU world of two is refused before any work, naming NCCL.
# NCCL_NVLS_ENABLE=0 everywhere: NVLink multicast is off on these hosts. Exit status: the
# number of failures.
build=${1:-build}
gemc=$build/gemc
failed=0
export NCCL_NVLS_ENABLE=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gemc-launch.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

has_torchrun=0
command -v torchrun >/dev/null 2>&1 && has_torchrun=1

if "$gemc" launch -n 1 -- "$build/tests/gpu/test_comm_nccl" >"$dir/nccl1.log" 2>&1; then
  echo "PASS test_comm_nccl through gemc launch -n 1"
else
  echo "FAIL test_comm_nccl through gemc launch -n 1"; tail -20 "$dir/nccl1.log"; failed=$((failed + 1))
fi
if [ $has_torchrun = 1 ]; then
  if torchrun --no-python --nproc-per-node 1 "$build/tests/gpu/test_comm_nccl" \
       >"$dir/nccl_t.log" 2>&1; then
    echo "PASS test_comm_nccl through torchrun --nproc-per-node 1"
  else
    echo "FAIL test_comm_nccl through torchrun"; tail -20 "$dir/nccl_t.log"; failed=$((failed + 1))
  fi
else
  echo "SKIP torchrun: not on the PATH"
fi

losses() {
  awk '/^  "loss": \[/ {on = 1; next} on && /^  \]/ {on = 0} on { gsub(/[ ,]+/, "\n"); print }' \
    "$1" | grep -v '^$'
}
train() {  # NAME LAUNCHER...
  name=$1
  shift
  "$@" train models/gem_tiny.gem --backend cuda --steps 40 --eval-every 0 -q \
    --report "$dir/$name.json" >"$dir/$name.log" 2>&1 ||
    { echo "FAIL $name: $*"; tail -5 "$dir/$name.log"; failed=$((failed + 1)); return; }
  losses "$dir/$name.json" >"$dir/$name.loss"
}
train plain "$gemc"
train launch1 "$gemc" launch -n 1
if cmp -s "$dir/plain.loss" "$dir/launch1.loss" && [ -s "$dir/plain.loss" ]; then
  echo "PASS gem_tiny through gemc launch -n 1: the same 40 losses as gemc train"
else
  echo "FAIL gem_tiny through gemc launch -n 1 differs"; failed=$((failed + 1))
fi
if [ $has_torchrun = 1 ]; then
  train torchrun torchrun --no-python --nproc-per-node 1 "$gemc"
  if cmp -s "$dir/plain.loss" "$dir/torchrun.loss"; then
    echo "PASS gem_tiny through torchrun: the same 40 losses as gemc train"
  else
    echo "FAIL gem_tiny through torchrun differs"; failed=$((failed + 1))
  fi
fi
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "$gemc" train models/gem_tiny.gem --backend cuda --steps 2 -q \
  >"$dir/two.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "distributed training on GPUs (NCCL) is not built yet" "$dir/two.log"; then
  echo "PASS a GPU world of two is refused before any work"
else
  echo "FAIL a GPU world of two: exit $rc"; cat "$dir/two.log"; failed=$((failed + 1))
fi
exit $failed
