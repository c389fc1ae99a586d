#!/bin/sh
# check_launch.sh BUILD: GPU ranks in a world of one, on a GPU machine (docs/distributed.md).
# A launcher's world of one trains through the NCCL backend, on the path a world of several
# takes (the share, the launch hook's buckets, the reductions, the agreements):
#   - the NCCL backend's collectives (test_comm_nccl) through `gemc launch -n 1` and torchrun
#     (when it is on the PATH), as a launcher starts them;
#   - gem_tiny trained 40 steps through `gemc launch -n 1` and torchrun gives, step by step,
#     the losses of a plain `gemc train` (the same bits: the GPU's steps are deterministic and
#     a reduction over one rank changes nothing), and the same held-out loss; so do buckets of
#     10 KB, started one by one from the backward pass;
#   - the report names the NCCL world and its Local MFU, Scaling Ratio and E2E MFU;
#   - NCCL's config (--nccl-cta-policy zero, --nccl-max-ctas 2) is taken, same losses;
#   - --on-nan skip with NaN steps skips the same steps as one process;
#   - a checkpoint set written by the NCCL rank resumes in a plain process, and a plain
#     checkpoint in an NCCL rank, both equal to a straight run;
#   - a collective stuck on the device (GEMC_TEST_COMM_HANG) ends the rank within
#     --comm-timeout, non-zero, naming the rank and the collective;
#   - deferred table updates (a GPU world of several: rows read, merged, written back, then
#     updated by the optimizer's launches), forced in a world of one, train within 1e-5;
#   - ZeRO on GPU ranks, and row-wise tables on GPU ranks of two, are refused before the ranks
#     meet, naming why; a GPU world of two on one GPU fails on rank 1, naming its GPU.
# NCCL_NVLS_ENABLE=0 everywhere: NVLink multicast is off on these hosts. Exit status: the
# number of failures.
build=${1:-build}
gemc=$build/gemc
failed=0
export NCCL_NVLS_ENABLE=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gemc-launch.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

has_torchrun=0
command -v torchrun >/dev/null 2>&1 && has_torchrun=1

if "$gemc" launch -n 1 -- "$build/tests/gpu/test_comm_nccl" >"$dir/nccl1.log" 2>&1; then
  pass "test_comm_nccl through gemc launch -n 1 ($(grep -c '^PASS' "$dir/nccl1.log") checks)"
else
  fail "test_comm_nccl through gemc launch -n 1"; tail -20 "$dir/nccl1.log"
fi
if [ $has_torchrun = 1 ]; then
  if torchrun --no-python --nproc-per-node 1 "$build/tests/gpu/test_comm_nccl" \
       >"$dir/nccl_t.log" 2>&1; then
    pass "test_comm_nccl through torchrun --nproc-per-node 1"
  else
    fail "test_comm_nccl through torchrun"; tail -20 "$dir/nccl_t.log"
  fi
else
  echo "SKIP torchrun: not on the PATH"
fi

losses() {
  awk '/^  "loss": \[/ {on = 1; next} on && /^  \]/ {on = 0} on { gsub(/[ ,]+/, "\n"); print }' \
    "$1" | grep -v '^$'
}
eval_loss() { grep -o '"eval_loss": [^,]*' "$1" | tail -1; }
train() {  # NAME STEPS LAUNCHER... -- TRAIN OPTIONS...
  name=$1 steps=$2
  shift 2
  cmd=""
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmd="$cmd $1"; shift; done
  [ $# -gt 0 ] && shift
  # shellcheck disable=SC2086
  $cmd train models/gem_tiny.gem --backend cuda --steps "$steps" --eval-every 20 \
    --eval-examples 512 -q --report "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 ||
    { fail "$name:$cmd $*"; tail -5 "$dir/$name.log"; return 1; }
  losses "$dir/$name.json" >"$dir/$name.loss"
}
same() {  # A B WHAT
  if [ -s "$dir/$1.loss" ] && cmp -s "$dir/$1.loss" "$dir/$2.loss" &&
     [ "$(eval_loss "$dir/$1.json")" = "$(eval_loss "$dir/$2.json")" ]; then
    pass "$3: the same $(wc -l <"$dir/$1.loss") losses and held-out loss"
  else
    fail "$3 differs"; diff "$dir/$1.loss" "$dir/$2.loss" | head -6
  fi
}

train plain 40 "$gemc"
train launch1 40 "$gemc" launch -n 1
same plain launch1 "gem_tiny through gemc launch -n 1 (NCCL)"
if grep -q '"backend": "nccl"' "$dir/launch1.json" && grep -q '"scaling_ratio"' "$dir/launch1.json"
then
  pass "the launched run's report names its NCCL world: $(grep -o '"local_mfu": [^,]*\|"scaling_ratio": [^,]*\|"e2e_mfu": [^,]*\|"buckets": [^,]*' "$dir/launch1.json" | tr '\n' ' ')"
else
  fail "the launched run's report has no NCCL world"; grep -A4 '"distributed"' "$dir/launch1.json"
fi
if [ $has_torchrun = 1 ]; then
  train torchrun 40 torchrun --no-python --nproc-per-node 1 "$gemc"
  same plain torchrun "gem_tiny through torchrun (NCCL)"
fi
train buckets 40 "$gemc" launch -n 1 -- --bucket-mb 0.01
nb=$(grep -o '"buckets": [0-9]*' "$dir/buckets.json" | grep -o '[0-9]*$')
if [ "${nb:-0}" -gt 1 ]; then
  same plain buckets "gem_tiny in $nb buckets of 10 KB, started from the backward pass"
else
  fail "--bucket-mb 0.01 gave ${nb:-no} buckets"
fi

# The table updates of GPU ranks of several: the rows read off the device, merged (a world of
# one: as they were), written back compact, then updated by the optimizer's launches. The
# same training within 1e-5 (the sum of squares of a row is added in another order).
GEMC_TEST_DEFER_TABLES=1 train defer 40 "$gemc" launch -n 1
worst=$(paste "$dir/plain.loss" "$dir/defer.loss" | awk '{ d = $1 - $2; if (d < 0) d = -d;
  r = d / ($1 < 0 ? -$1 : $1); if (r > m) m = r } END { printf "%.3g", m + 0 }')
if [ -s "$dir/defer.loss" ] && [ "$(wc -l <"$dir/defer.loss")" = "$(wc -l <"$dir/plain.loss")" ] &&
   awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }'; then
  pass "deferred table updates (merged rows, table_rows_apply): losses within $worst of one process"
else
  fail "deferred table updates: worst relative loss difference $worst"
fi

train ctas 40 "$gemc" launch -n 1 -- --nccl-cta-policy zero --nccl-max-ctas 2
same plain ctas "gem_tiny with --nccl-cta-policy zero --nccl-max-ctas 2 (NCCL's config)"

GEMC_TEST_NAN_STEPS=5:2 train nan_plain 20 "$gemc" -- --on-nan skip=3
GEMC_TEST_NAN_STEPS=5:2 train nan_launch 20 "$gemc" launch -n 1 -- --on-nan skip=3
skipped() { tr -d ' \n' <"$1" | grep -o '"skipped_steps":\[[^]]*\]'; }
if [ -n "$(skipped "$dir/nan_plain.json")" ] &&
   [ "$(skipped "$dir/nan_plain.json")" = "$(skipped "$dir/nan_launch.json")" ]; then
  same nan_plain nan_launch "--on-nan skip through NCCL ($(skipped "$dir/nan_launch.json"))"
else
  fail "--on-nan skip: $(skipped "$dir/nan_plain.json") alone, $(skipped "$dir/nan_launch.json") launched"
fi

train half_launch 20 "$gemc" launch -n 1 -- --save "$dir/ck_set"
train resumed_plain 20 "$gemc" -- --resume "$dir/ck_set"
train half_plain 20 "$gemc" -- --save "$dir/ck_one"
train resumed_launch 20 "$gemc" launch -n 1 -- --resume "$dir/ck_one"
if ls "$dir/ck_set"/manifest.gemc >/dev/null 2>&1; then
  pass "the NCCL rank wrote a checkpoint set (shard and manifest)"
else
  fail "the NCCL rank wrote no manifest"; ls "$dir/ck_set"
fi
same plain resumed_plain "the NCCL rank's checkpoint resumed in one process"
same plain resumed_launch "one process's checkpoint resumed in an NCCL rank"

start=$(date +%s)
GEMC_TEST_COMM_HANG=0:3 timeout 200 "$gemc" launch -n 1 train models/gem_tiny.gem \
  --backend cuda --steps 10 -q --comm-timeout 5 >"$dir/hang.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -lt 120 ] &&
   grep -q "rank 0: error: the all-reduce of .* (step 3) did not finish within 5 s" "$dir/hang.log"
then
  pass "a collective stuck on the device ended the rank in ${took} s, exit $rc, naming it"
else
  fail "a stuck collective: exit $rc after ${took} s"; tail -8 "$dir/hang.log"
fi

"$gemc" launch -n 1 train models/gem_tiny.gem --backend cuda --steps 2 -q --dense zero1 \
  >"$dir/zero.log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "zero1 is not built for GPU ranks" "$dir/zero.log"; then
  pass "--dense zero1 on a GPU rank is refused (exit 2)"
else
  fail "--dense zero1 on a GPU rank: exit $rc"; cat "$dir/zero.log"
fi
# A GPU world of two on a machine of one GPU: rank 1 cannot open GPU 1 and says so; launch
# stops rank 0 (waiting at the rendezvous) and returns rank 1's status.
timeout 120 "$gemc" launch -n 2 train models/gem_tiny.gem --backend cuda --steps 2 -q \
  >"$dir/two.log" 2>&1
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "rank 1: error: .*GPU 1 (LOCAL_RANK)" "$dir/two.log"
then
  pass "a GPU world of two on one GPU: rank 1 names its missing GPU, launch exits $rc"
else
  fail "a GPU world of two on one GPU: exit $rc"; cat "$dir/two.log"
fi
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 timeout 120 \
  "$gemc" train models/gem_tiny.gem --backend cuda --steps 2 -q --shard row >"$dir/row.log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "GPU ranks keep every table whole" "$dir/row.log"; then
  pass "row-wise tables on GPU ranks of two are refused before the ranks meet"
else
  fail "row-wise tables on GPU ranks of two: exit $rc"; cat "$dir/row.log"
fi
exit $failed
