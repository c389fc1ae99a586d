#!/bin/sh
# tests/codegen/recompute_check.sh GEMC: @schedule(recompute = true) changes memory, never
# results. (1) tests/codegen/recompute.gem and recompute_lookups.gem each train 20 CPU steps to
# the very same learning curve and held-out metrics, bit for bit, as their copies without the
# hints (the recomputed copies are the same ops on the same inputs). (2) Its IR has the copies, and no backward node reads a
# value of a marked region that is not a copy. (3) hstu_recompute plans at most 60% of hstu's
# memory at the largest batch, and so does recompute_stack.gem (layers with no residual add).
set -u
cd "$(dirname "$0")/../.." || exit 2
gemc=${1:-build/gemc}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
fail=0
# The curves and the final metrics: the report less what names the file or times the run.
strip() { sed -n '/"curve"/,$p' "$1" | grep -v -E '"(seconds|wall|ms|examples_per|source|model)'; }
for model in tests/codegen/recompute.gem tests/codegen/recompute_lookups.gem; do
  sed 's/ @schedule(recompute = true)//' "$model" >"$tmp/plain.gem"
  for m in "$model" "$tmp/plain.gem"; do
    n=$(basename "$m" .gem)
    "$gemc" train "$m" --backend cpu --steps 20 --seed 3 --eval-every 5 --report "$tmp/$n.json" \
      >"$tmp/$n.log" 2>&1 || { echo "FAIL recompute: training $m"; cat "$tmp/$n.log"; exit 1; }
  done
  strip "$tmp/$(basename "$model" .gem).json" >"$tmp/a" && strip "$tmp/plain.json" >"$tmp/b"
  if [ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"; then
    echo "PASS recompute: $model: the same curve and metrics, bit for bit, with and without the hints"
  else
    echo "FAIL recompute: $model: the curves differ"; diff "$tmp/a" "$tmp/b" | head -20; fail=1
  fi
done
"$gemc" ir tests/codegen/recompute.gem --grad >"$tmp/ir.txt" 2>/dev/null || exit 1
copies=$(grep -c '^%[^ ]*\.re : ' "$tmp/ir.txt")
# A backward line (after the first `_bwd` or `.grad` definition) reading a marked value itself.
marked=$(grep 'recompute=true' "$tmp/ir.txt" | sed 's/ :.*//' | tr '\n' ' ')
stale=0
for v in $marked; do
  awk -v v="$v" 'found && index($0, " = ") { split($0, rhs, " = "); if (index(rhs[2] " ", " " v ",") || index(rhs[2] " ", " " v " ")) bad = 1 }
    /^%[^ ]*\.grad[^ ]* : / { found = 1 } END { exit bad ? 1 : 0 }' "$tmp/ir.txt" || { echo "  backward reads $v"; stale=1; }
done
if [ "$copies" -ge 10 ] && [ "$stale" -eq 0 ]; then
  echo "PASS recompute: $copies recomputed copies; the backward reads no marked forward value"
else
  echo "FAIL recompute: $copies copies, stale reads: $stale"; fail=1
fi
plain=$("$gemc" emit models/hstu.gem --stats 2>&1 >/dev/null | sed -n 's/.*planned \([0-9]*\) bytes.*/\1/p')
re=$("$gemc" emit models/hstu_recompute.gem --stats 2>&1 >/dev/null | sed -n 's/.*planned \([0-9]*\) bytes.*/\1/p')
if [ -n "$plain" ] && [ -n "$re" ] && [ $((re * 10)) -le $((plain * 6)) ]; then
  echo "PASS recompute: hstu plans $plain bytes, hstu_recompute $re"
else
  echo "FAIL recompute: hstu plans ${plain:-?} bytes, hstu_recompute ${re:-?}"; fail=1
fi
sed 's/ @schedule(recompute = true)//' tests/codegen/recompute_stack.gem >"$tmp/stack_plain.gem"
plain=$("$gemc" emit "$tmp/stack_plain.gem" --stats 2>&1 >/dev/null | sed -n 's/.*planned \([0-9]*\) bytes.*/\1/p')
re=$("$gemc" emit tests/codegen/recompute_stack.gem --stats 2>&1 >/dev/null | sed -n 's/.*planned \([0-9]*\) bytes.*/\1/p')
if [ -n "$plain" ] && [ -n "$re" ] && [ $((re * 10)) -le $((plain * 6)) ]; then
  echo "PASS recompute: six stacked layers without residual adds plan $plain bytes, recomputed $re"
else
  echo "FAIL recompute: stacked layers plan ${plain:-?} bytes, recomputed ${re:-?}"; fail=1
fi
exit $fail
