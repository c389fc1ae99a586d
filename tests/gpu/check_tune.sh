#!/bin/sh
# check_tune.sh BUILD: the attention autotuner on a GPU (docs/tuning.md; run by tests/gpu/run.sh,
# BUILD/gemc is the binary). Prints the tables, a PASS or FAIL line per check, and exits with the
# number of failures. In a cache directory of its own:
#   1. `gemc tune models/gem_small.gem` times its two bf16 attention nodes (the windowed self
#      attention on the sm_90a kernel, the PMA on mma.sync), prints a winner for each and
#      stores two cache entries; the mxfp8 cross attention is "not tuned";
#   2. `gemc train --backend cuda` then reads both winners from the cache ("(cached)"), timing
#      nothing;
#   3. a corrupt entry is a warning, is tuned again by the next `gemc train`, and is rewritten
#      whole;
#   4. `--no-tune` prints no tune line, and the held-out loss of the tuned run is within 2e-2 of
#      the untuned one (a schedule changes the order of the sums, not the function);
#   5. `gemc tune models/hstu.gem` tunes its six identical self-attention layers once.
build=${1:-build}
gemc=$build/gemc
failed=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gemc-tune.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM
export GEMC_CACHE_DIR=$dir/cache

pass() { echo "PASS check_tune: $*"; }
fail() { echo "FAIL check_tune: $*"; failed=$((failed + 1)); }

eval_loss() {
  awk '/"eval": \{/ { on = 1 } on && $1 == "\"loss\":" { sub(/,$/, "", $2); print $2; exit }' "$1"
}
within() {  # A B TOL
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
    exit !(a != "" && b != "" && d <= t * (m > 1e-3 ? m : 1e-3)) }'
}
# train NAME ARGS...: 20 steps of gem_small on the GPU, output in $dir/NAME.log (stdout) and
# $dir/NAME.err, report in $dir/NAME.json.
train() {
  name=$1
  shift
  "$gemc" train models/gem_small.gem --backend cuda --steps 20 --eval-every 20 \
    --eval-examples 512 --progress plain --report "$dir/$name.json" "$@" \
    >"$dir/$name.log" 2>"$dir/$name.err" && return 0
  fail "gemc train $* (run '$name') exited non-zero:"
  tail -n 15 "$dir/$name.log"
  tail -n 15 "$dir/$name.err"
  return 1
}

echo "== gemc tune models/gem_small.gem"
"$gemc" -q tune models/gem_small.gem --reps 5 >"$dir/tune.log" 2>"$dir/tune.err"
rc=$?
cat "$dir/tune.log" "$dir/tune.err"
winners=$(grep -c '^  winner: ' "$dir/tune.log")
entries=$(ls "$dir/cache"/tune-*.txt 2>/dev/null | wc -l)
if [ $rc -eq 0 ] && [ "$winners" -eq 2 ] && [ "$entries" -eq 2 ] &&
   grep -q 'not tuned: the quantized attention kernel' "$dir/tune.log"; then
  pass "gemc tune: 2 winners, 2 cache entries, the mxfp8 node not tuned"
else
  fail "gemc tune: exit $rc, $winners winners, $entries cache entries (want 0, 2, 2)"
fi

echo "== gemc train --backend cuda, from the cache"
if train cached; then
  grep '^  tune ' "$dir/cached.log"
  if [ "$(grep -c '^  tune .*(cached)' "$dir/cached.log")" -eq 2 ] &&
     ! grep -q '^  tune .*timed' "$dir/cached.log"; then
    pass "gemc train took both winners from the cache and timed nothing"
  else
    fail "gemc train did not take both winners from the cache"
  fi
fi

echo "== a corrupt cache entry"
entry=$(ls "$dir/cache"/tune-*.txt 2>/dev/null | head -1)
if [ -z "$entry" ]; then
  fail "no cache entry to corrupt"
elif printf 'format 1\nkey truncated' >"$entry" && train retuned; then
  grep '^  tune ' "$dir/retuned.log"
  if grep -q "warning: tuning cache entry .*tuning again" "$dir/retuned.err" &&
     grep -q '^  tune .*timed' "$dir/retuned.log" && grep -q '^winner ' "$entry"; then
    pass "a corrupt entry is a warning, is tuned again and rewritten"
  else
    fail "a corrupt entry was not reported, re-tuned and rewritten:"
    cat "$dir/retuned.err"; cat "$entry"
  fi
fi

echo "== --no-tune"
if train untuned --no-tune; then
  a=$(eval_loss "$dir/cached.json") b=$(eval_loss "$dir/untuned.json")
  echo "     held-out loss: tuned $a, --no-tune $b"
  if ! grep -q '^  tune ' "$dir/untuned.log" && within "$a" "$b" 2e-2; then
    pass "--no-tune prints no tune line, and the tuned run's loss is the untuned one's"
  else
    fail "--no-tune: tune lines, or held-out losses $a and $b apart"
  fi
fi

echo "== gemc tune models/hstu.gem"
"$gemc" -q tune models/hstu.gem --reps 3 >"$dir/hstu.log" 2>"$dir/hstu.err"
rc=$?
cat "$dir/hstu.log" "$dir/hstu.err"
if [ $rc -eq 0 ] && [ "$(grep -c '^  the same op as node ' "$dir/hstu.log")" -eq 5 ]; then
  pass "hstu: the six identical layers tuned once"
else
  fail "hstu: exit $rc, or its six layers were not tuned once"
fi
exit $failed
