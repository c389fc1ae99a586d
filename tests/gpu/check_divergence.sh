#!/bin/sh
# check_divergence.sh BUILD: the divergence guard on the cuda backend (run by tests/gpu/run.sh
# on a machine with a GPU; BUILD/gemc is the binary). Prints a PASS or FAIL line per check and
# exits with the number of failures.
#   1. --lr 1e6 stops with exit 1, naming the step and the tensor (counted on the device), and
#      the checkpoint saved before it is left byte for byte; the report records the failure;
#   2. --on-nan skip=3 with a test hook (GEMC_TEST_NAN_STEPS) skips two steps and goes on; three
#      in a row exit 1;
#   3. the default (--on-nan stop) stops at the hooked step;
#   4. --lr 0.3 warns about an exploding loss, once.
build=${1:-build}
gemc=$build/gemc
model=models/gem_tiny.gem
failed=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gemc-div.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

# run NAME WANT_RC ARGS...: one `gemc train --backend cuda`, output in $dir/NAME.log; a FAIL
# line (and the log's tail) unless it exits WANT_RC.
run() {
  name=$1
  want=$2
  shift 2
  "$gemc" train "$model" --backend cuda --batch 64 --eval-examples 256 --progress plain \
    --report "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq "$want" ] && return 0
  fail "gemc train --backend cuda $* (run '$name') exited $rc, not $want:"
  tail -15 "$dir/$name.log"
  return 1
}

# has NAME TEXT WHAT: the log of run NAME contains TEXT.
has() {
  if grep -qF -- "$2" "$dir/$1.log"; then pass "$3"; else fail "$3: no '$2' in:"; tail -8 "$dir/$1.log"; fi
}
json_has() {
  if grep -qF -- "$2" "$dir/$1.json"; then pass "$3"; else fail "$3: no '$2' in $1.json"; fi
}

if [ ! -x "$gemc" ]; then
  fail "no $gemc"
  exit 1
fi

# --- 1: a blow-up stops, the checkpoint stays ------------------------------------------------
if run good 0 --steps 10 --save "$dir/ck"; then
  cp "$dir/ck/checkpoint.gemc" "$dir/before.gemc"
  if run blowup 1 --steps 100 --eval-every 5 --lr 1e6 --resume "$dir/ck" --save "$dir/ck"; then
    has blowup "gemc: error: training diverged" "lr 1e6: exit 1, training diverged"
    has blowup "try a lower --lr (this run's is 1e+06)" "lr 1e6: the message suggests a lower --lr"
    if grep -Eq "holds [0-9]+ NaN and [0-9]+ infinite values|the loss is (NaN|infinite)" \
         "$dir/blowup.log"; then
      pass "lr 1e6: the message names what it found ($(grep -o 'diverged[^;]*' "$dir/blowup.log"))"
    else
      fail "lr 1e6: the message names no tensor"
    fi
    if cmp -s "$dir/before.gemc" "$dir/ck/checkpoint.gemc"; then
      pass "lr 1e6: the earlier checkpoint is byte-identical"
    else
      fail "lr 1e6: the earlier checkpoint changed"
    fi
    json_has blowup '"failure": {' "lr 1e6: the report records the failure"
    json_has blowup '"tensor": "' "lr 1e6: the report's failure names the tensor"
  fi
fi

# --- 2: --on-nan skip --------------------------------------------------------------------------
export GEMC_TEST_NAN_STEPS=3:2
if run skip 0 --steps 8 --on-nan skip=3; then
  has skip "step 3 skipped" "skip=3: step 3 skipped"
  has skip "step 4 skipped" "skip=3: step 4 skipped, and the run went on"
  json_has skip '"failure": null' "skip=3: no failure in the report"
fi
export GEMC_TEST_NAN_STEPS=3:9
if run skip3 1 --steps 8 --on-nan skip=3; then
  has skip3 "training diverged at step 5: the loss is NaN (3 non-finite steps in a row" \
    "skip=3: three bad steps in a row exit 1"
fi
unset GEMC_TEST_NAN_STEPS
# A real blow-up under skip: the loss or a dense gradient turns non-finite (checked on the
# device before the update); every later step is bad too, so skip=3 stops it.
if run skipreal 1 --steps 200 --eval-every 10 --lr 1e6 --on-nan skip=3; then
  has skipreal "training diverged" "lr 1e6 with skip=3: exit 1"
fi

# --- 3: the default stops at the first bad loss ----------------------------------------------
export GEMC_TEST_NAN_STEPS=4
if run stop 1 --steps 8; then
  has stop "training diverged at step 4: the loss is NaN; try a lower --lr" \
    "--on-nan stop: exit 1 at step 4"
fi

unset GEMC_TEST_NAN_STEPS

# --- 4: an exploding loss warns, once --------------------------------------------------------
"$gemc" train "$model" --backend cuda --batch 64 --eval-examples 256 --progress plain \
  --steps 300 --lr 0.3 >"$dir/explode.log" 2>&1
n=$(grep -c "gemc: warning: the .* loss is .* over 100 times" "$dir/explode.log")
if [ "$n" -eq 1 ]; then
  pass "lr 0.3: one exploding-loss warning ($(grep -o 'the [a-z-]* loss is [^,]*' "$dir/explode.log"))"
else
  fail "lr 0.3: $n exploding-loss warnings, not 1:"
  tail -8 "$dir/explode.log"
fi

[ "$failed" -eq 0 ] && echo "PASS check_divergence: all"
exit "$failed"
