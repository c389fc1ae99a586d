#!/bin/sh
# check_overrides.sh BUILD: the optimizer overrides of `gemc train` (--lr, --table-lr) reach the
# GPU, whose optimizer kernels have the hyper-parameters compiled in (runtime/train/train.c builds the
# plan from the overridden IR). gem_tiny is trained 30 steps on each backend with the model's
# values and with overrides; the GPU must follow the CPU in both (held-out loss within 1e-2, as
# the two backends sum in different orders), and the overrides must change the result (so a
# GPU that ignored them would fail the comparison). Exit status: the number of failures.
build=${1:-build}
gemc=$build/gemc
failed=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gemc-over.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

eval_loss() {
  awk '/"eval": \{/ { on = 1 } on && $1 == "\"loss\":" { sub(/,$/, "", $2); print $2; exit }' "$1"
}
run() {  # NAME BACKEND ARGS...
  name=$1 backend=$2
  shift 2
  "$gemc" train models/gem_tiny.gem -q --backend "$backend" --steps 30 --batch 64 \
    --eval-every 30 --eval-examples 256 --report "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 ||
    { echo "     gemc train --backend $backend $* failed:" >&2; tail -5 "$dir/$name.log" >&2; return; }
  eval_loss "$dir/$name.json"
}
within() {  # A B TOL
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
    exit !(a != "" && b != "" && d <= t * (m > 1e-3 ? m : 1e-3)) }'
}
cpu0=$(run cpu0 cpu) gpu0=$(run gpu0 cuda)
cpu1=$(run cpu1 cpu --lr 0.02 --table-lr 0.5) gpu1=$(run gpu1 cuda --lr 0.02 --table-lr 0.5)
echo "     held-out loss: model's values cpu $cpu0 gpu $gpu0; --lr 0.02 --table-lr 0.5 cpu $cpu1 gpu $gpu1"
if within "$gpu0" "$cpu0" 1e-2 && within "$gpu1" "$cpu1" 1e-2 && ! within "$cpu1" "$cpu0" 1e-3; then
  echo "PASS check_overrides: the GPU follows the CPU with and without --lr/--table-lr"
else
  echo "FAIL check_overrides: the GPU does not follow the CPU (or the overrides changed nothing)"
  failed=$((failed + 1))
fi
exit $failed
