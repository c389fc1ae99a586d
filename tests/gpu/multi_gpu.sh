#!/bin/sh
# tests/gpu/multi_gpu.sh BUILD [N]: the NCCL backend on N GPUs of one host (default: every GPU
# nvidia-smi lists), for issue 13 on the nvidia-h200-x2 (or larger) machines: every collective
# of test_comm_nccl checked on N ranks, and the bus bandwidth of a 256 MiB all-reduce and
# all-to-all, through `gemc launch -n N` and through torchrun. NVLink multicast is off on these
# hosts, so NCCL_NVLS_ENABLE=0. With N = 1 it is a dry run of the same commands.
# Exit status: the number of failed runs.
build=${1:-build}
n=${2:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "$n" -ge 1 ] 2>/dev/null || { echo "multi_gpu: SKIP: no GPU"; exit 0; }
export NCCL_NVLS_ENABLE=0
failed=0
echo "== test_comm_nccl on $n GPUs through gemc launch -n $n"
"$build/gemc" launch -n "$n" -- "$build/tests/gpu/test_comm_nccl" || failed=$((failed + 1))
if command -v torchrun >/dev/null 2>&1; then
  echo "== test_comm_nccl on $n GPUs through torchrun"
  torchrun --no-python --nproc-per-node "$n" "$build/tests/gpu/test_comm_nccl" ||
    failed=$((failed + 1))
fi
echo "== the socket transport (inter-node stand-in): NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$build/gemc" launch -n "$n" -- \
  "$build/tests/gpu/test_comm_nccl" || failed=$((failed + 1))
exit $failed
