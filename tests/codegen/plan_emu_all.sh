#!/bin/sh
# tests/codegen/plan_emu_all.sh GEMC: plan_emu.sh over every model it checks, JOBS at a time
# (default: the cores; each run is a C++ compile, then one fiber per emulated CUDA thread,
# which leaves a core half idle), each one's output printed whole in this order. Exits 1 when
# any failed, naming them.
set -u
cd "$(dirname "$0")/../.." || exit 2
gemc=$1
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
dir=$(mktemp -d) || exit 2
trap 'rm -rf "$dir"' EXIT INT TERM
# MODEL TOLERANCE [ARCH], the slowest first so the pairs finish together. A model prefixed
# defer: builds a deferred-table plan; simt: runs fp8/mxfp8 attention on the SIMT kernels
# (GEMC_EMU_SIMT) instead of the tensor-core ones; isolate: checks every node on the executor's
# inputs within 1e-2 (PLAN_EMU_ISOLATE; TOLERANCE then bounds the step's final comparisons over
# those mixed values). ARCH sm_100a runs bf16 attention on the mma.sync kernels (the emulator's
# ldmatrix and mma), sm_90a on the TMA + wgmma ones (its mbarrier, TMA and wgmma).
cases='isolate:tests/codegen/attention_sm90.gem 1 sm_90a
isolate:tests/gpu/models/attention_atomic_dq.gem 1 sm_90a
tests/codegen/pma_one_pass.gem 1e-2 sm_100a
tests/gpu/models/attention_quantized_tc.gem 1e-3
tests/golden/codegen_attention_tiny_kv.gem 1e-3
isolate:tests/codegen/attention_tiny_kv_tc.gem 1
tests/golden/codegen_attention_fp8.gem 1e-3
simt:tests/golden/codegen_attention_fp8.gem 1e-3
tests/codegen/attention_bf16_tc.gem 2e-2 sm_100a
isolate:tests/codegen/attention_bf16_tc.gem 1 sm_100a
isolate:tests/codegen/attention_heads_48_96.gem 1 sm_100a
tests/gpu/models/interact_fp8.gem 1e-5
tests/golden/codegen_hot_table.gem 1e-5
tests/codegen/table_sort_shared.gem 1e-5
tests/golden/codegen_variants.gem 2e-3
tests/golden/codegen_small.gem 2e-2
tests/codegen/attention_mx_head16.gem 1e-3
tests/codegen/pma_chunks.gem 1e-3
tests/codegen/recompute.gem 1e-4
tests/codegen/recompute_lookups.gem 1e-4
defer:models/gem_tiny.gem 1e-4'
echo "$cases" | awk '{ print NR, $1, $2, ($3 == "" ? "-" : $3) }' |
  xargs -P "$jobs" -n 4 sh -c 'case "$2" in defer:*) export GEMC_TEST_DEFER_TABLES=1 ;; simt:*) export GEMC_EMU_SIMT=1 ;;
      isolate:*) export PLAN_EMU_ISOLATE=1 ;; esac
    arch=$4; [ "$arch" = - ] && arch=
    t0=$(date +%s)
    PLAN_EMU_QUIET=1 tests/codegen/plan_emu.sh "$0" "${2#*:}" "$3" $arch \
    >"'"$dir"'/$1.log" 2>&1; echo $? >"'"$dir"'/$1.rc"
    echo "plan_emu: $2 ${4#-} took $(( $(date +%s) - t0 )) s" >>"'"$dir"'/$1.log"' "$gemc"
i=0
echo "$cases" | while read -r model tol arch; do
  i=$((i + 1))
  cat "$dir/$i.log"
  [ "$(cat "$dir/$i.rc" 2>/dev/null)" = 0 ] || echo "$model" >>"$dir/failed"
done
if [ -s "$dir/failed" ]; then
  echo "plan_emu: FAILED: $(tr '\n' ' ' <"$dir/failed")"
  exit 1
fi
