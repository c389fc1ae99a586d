#!/bin/sh
# run.sh BUILD [--part K/N | --list]: the GPU tests of `make test-gpu`, on a machine with a GPU.
# Runs the GDPA cases (test_gdpa), the kernel comparison and the end-to-end curves
# (test_gpu_kernels), the other GPU test programs and check scripts, then compute-sanitizer's
# memcheck on a few training steps of a small model (skipped, with the reason, where the
# sanitizer cannot use the device: gVisor machines refuse it).
#   --part K/N  only steps K, K + N, K + 2N, ... (1-based): a whole run takes longer than one
#               device call, so `make test-gpu PART=1/2` and `PART=2/2` split it over two
#   --list      the numbered steps, without running them
# Exit status: the number of failed steps.
build=${1:-build}
[ $# -gt 0 ] && shift
part=1 parts=1 list=0
case "${1:-}" in
--part)
  part=${2%%/*} parts=${2##*/}
  case "$part/$parts" in
  */*[!0-9]* | *[!0-9]*/* | /* | */) echo "run.sh: --part takes K/N, got '${2:-}'" >&2; exit 2 ;;
  esac
  if [ "$part" -lt 1 ] || [ "$part" -gt "$parts" ]; then
    echo "run.sh: --part K/N needs 1 <= K <= N, got $part/$parts" >&2; exit 2
  fi ;;
--list) list=1 ;;
'') ;;
*) echo "run.sh: unknown argument '$1' (--part K/N or --list)" >&2; exit 2 ;;
esac
failed=0
export GEMC_CACHE_DIR=${GEMC_CACHE_DIR:-$build/gpu-cache}

step_no=0
# step TITLE COMMAND...: the next numbered step; runs it when it is in this part.
step() {
  step_no=$((step_no + 1))
  title=$1
  shift
  if [ $list = 1 ]; then echo "$step_no $title"; return; fi
  [ $(((step_no - 1) % parts + 1)) = "$part" ] || return 0
  echo "== [$step_no] $title"
  "$@" || failed=$((failed + 1))
}

memcheck() {  # MODEL
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    echo "SKIP memcheck: compute-sanitizer is not on the PATH"; return 0
  fi
  log=$build/gpu-memcheck.log
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$build/gemc" train "$1" --backend cuda --steps 3 --batch 4 \
    --eval-examples 4 -q >"$log" 2>&1
  rc=$?
  if grep -q "Device not supported\|not supported on this device" "$log"; then
    echo "SKIP memcheck: the sanitizer cannot use this device"; tail -3 "$log"
  elif [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$log"; then
    echo "PASS memcheck: 0 errors"
  else
    echo "FAIL memcheck (exit $rc)"; tail -30 "$log"; return 1
  fi
}

step "the GDPA kernels, every shape, activation and mask, forward and backward" \
  "$build/gpu/test_gdpa"
# Each in its own process: a kernel fault leaves the CUDA context unusable for the rest of it.
step "gem_tiny end to end: 200 steps on the GPU and on the CPU" \
  "$build/tests/gpu/test_gpu_kernels" --e2e models/gem_tiny.gem --steps 200
# The CPU-emulated attention models too (tests/codegen): the one-pass PMA backward, head widths
# 48 and 96, and the mma.sync shapes of attention_bf16_tc, on the real tensor cores.
for m in models/gem_tiny.gem models/gem_small.gem tests/golden/codegen_attention_fp8.gem tests/golden/codegen_hot_table.gem \
         tests/gpu/models/*.gem tests/codegen/pma_one_pass.gem tests/codegen/attention_heads_48_96.gem \
         tests/codegen/attention_bf16_tc.gem tests/codegen/attention_tiny_kv_tc.gem; do
  step "every kernel of $m against the CPU executor" "$build/tests/gpu/test_gpu_kernels" "$m"
done

# The other GPU test programs (tests/gpu/test_*.c beyond the two above), and the shell checks.
for t in "$build"/tests/gpu/test_*; do
  case "$t" in */test_gpu_kernels|*.d) continue ;; esac
  [ -x "$t" ] || continue
  step "$(basename "$t")" "$t"
done
for s in tests/gpu/check_*.sh; do
  [ -f "$s" ] || continue
  step "$s" sh "$s" "$build"
done

# gem_tiny, or the first small model codegen handles when it cannot do gem_tiny yet.
model=models/gem_tiny.gem
for m in models/gem_tiny.gem models/gem_small.gem models/hstu.gem; do
  if "$build/gemc" emit "$m" --emit=plan >/dev/null 2>&1; then model=$m; break; fi
done
step "compute-sanitizer --tool memcheck on $model" memcheck "$model"
[ $list = 1 ] || echo "run.sh: part $part/$parts, $failed failed"
exit $failed
