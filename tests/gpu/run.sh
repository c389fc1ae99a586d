#!/bin/sh
# run.sh BUILD: the GPU tests of `make test-gpu`, on a machine with a GPU. Runs the kernel
# comparison and the end-to-end curves (test_gpu_kernels), then compute-sanitizer's memcheck on
# a few training steps of a small model (skipped, with the reason, where the sanitizer cannot use the
# device: gVisor machines refuse it). Exit status: the number of failed parts.
build=${1:-build}
failed=0
export GEMC_CACHE_DIR=${GEMC_CACHE_DIR:-$build/gpu-cache}

echo "== the GDPA kernels, every shape, activation and mask, forward and backward"
"$build/gpu/test_gdpa" || failed=$((failed + 1))

# Each in its own process: a kernel fault leaves the CUDA context unusable for the rest of it.
echo "== gem_tiny end to end: 200 steps on the GPU and on the CPU"
"$build/tests/gpu/test_gpu_kernels" --e2e models/gem_tiny.gem --steps 200 || failed=$((failed + 1))
# The CPU-emulated attention models too (tests/codegen): the one-pass PMA backward, head widths
# 48 and 96, and the mma.sync shapes of attention_bf16_tc, on the real tensor cores.
for m in models/gem_tiny.gem models/gem_small.gem tests/golden/codegen_attention_fp8.gem tests/golden/codegen_hot_table.gem \
         tests/gpu/models/*.gem tests/codegen/pma_one_pass.gem tests/codegen/attention_heads_48_96.gem \
         tests/codegen/attention_bf16_tc.gem tests/codegen/attention_tiny_kv_tc.gem; do
  echo "== every kernel of $m against the CPU executor"
  "$build/tests/gpu/test_gpu_kernels" "$m" || failed=$((failed + 1))
done

# The other GPU test programs (tests/gpu/test_*.c beyond the two above), and the shell checks.
for t in "$build"/tests/gpu/test_*; do
  case "$t" in */test_gpu_kernels|*.d) continue ;; esac
  [ -x "$t" ] || continue
  echo "== $(basename "$t")"
  "$t" || failed=$((failed + 1))
done
for s in tests/gpu/check_*.sh; do
  [ -f "$s" ] || continue
  echo "== $s"
  sh "$s" "$build" || failed=$((failed + 1))
done

# gem_tiny, or the first small model codegen handles when it cannot do gem_tiny yet.
model=models/gem_tiny.gem
for m in models/gem_tiny.gem models/gem_small.gem models/hstu.gem; do
  if "$build/gemc" emit "$m" --emit=plan >/dev/null 2>&1; then model=$m; break; fi
done
echo "== compute-sanitizer --tool memcheck on $model"
if command -v compute-sanitizer >/dev/null 2>&1; then
  log=$build/gpu-memcheck.log
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$build/gemc" train "$model" --backend cuda --steps 3 --batch 4 \
    --eval-examples 4 -q >"$log" 2>&1
  rc=$?
  if grep -q "Device not supported\|not supported on this device" "$log"; then
    echo "SKIP memcheck: the sanitizer cannot use this device"; tail -3 "$log"
  elif [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$log"; then
    echo "PASS memcheck: 0 errors"
  else
    echo "FAIL memcheck (exit $rc)"; tail -30 "$log"; failed=$((failed + 1))
  fi
else
  echo "SKIP memcheck: compute-sanitizer is not on the PATH"
fi
exit $failed
