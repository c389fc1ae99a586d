#!/bin/sh
# tests/dist/run.sh: distributed training with real processes on the CPU executor, through
# OpenMPI (docs/distributed.md). Each run trains gem_tiny; ranks are oversubscribed (4 ranks
# on 2 cores is a slower, still correct run). What must hold:
#   - 2 and 4 ranks compute what 1 rank computes at the same global batch: every step's loss
#     within 1e-5 relative over 50 steps (the order of the sums differs, nothing else), and
#     the held-out loss, which each rank evaluates on its share;
#   - ZeRO-1 and ZeRO-2 equal data parallel, and ZeRO-3 equals ZeRO-2 bit for bit; buckets small
#     enough to overlap the backward do too; dense parameters too large for the memory are
#     refused under data parallel and train under ZeRO-3;
#   - row-wise and table-wise sharded tables equal replicated ones; each rank holds only its
#     own rows of them, so a table larger than the memory trains sharded and is refused
#     replicated (GEMC_TEST_MEMORY_AVAILABLE);
#   - the divergence guard decides for all ranks together (--on-nan skip with NaN steps);
#   - a checkpoint written by 2 ranks (a shard each and a manifest) resumes on 1, and one
#     written by 1 rank on 4, equal to a straight run; a set missing a shard or its manifest is
#     refused, and a save stopped before its manifest leaves the set before it in force;
#   - a stalled rank makes the others abort within --comm-timeout, naming the rank and the
#     collective; a killed rank ends the job, non-zero; gemc launch returns a failed rank's code;
#   - every launcher convention, set by hand, is read (or refused with the reason).
# Skips (exit 0, saying so) when OpenMPI's mpirun or libmpi.so.40 is missing.
#
#   tests/dist/run.sh [GEMC]
set -u
cd "$(dirname "$0")/../.." || exit 2
gemc=${1:-build/gemc}
case "$gemc" in /*) ;; *) gemc=$PWD/$gemc ;; esac
model=$PWD/models/gem_tiny.gem
if ! command -v mpirun >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep -q libmpi.so.40; then
  echo "dist: SKIP: OpenMPI (mpirun, libmpi.so.40) is not installed; apt-get install openmpi-bin"
  exit 0
fi
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 2
# mpirun refuses root without these (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
STEPS=50
TOL=1e-5

fail() { echo "FAIL $*"; fails=$((fails + 1)); }
pass() { echo "ok   $*"; }

# train NAME RANKS [train options]: the run's report is NAME.json, its output NAME.out.
train() {
  name=$1 n=$2
  shift 2
  if [ "$n" = 1 ]; then
    "$gemc" train "$model" --backend cpu --steps $STEPS --eval-every 0 -q --report "$name.json" \
      "$@" >"$name.out" 2>&1
  else
    "$gemc" launch -n "$n" train "$model" --backend cpu --steps $STEPS --eval-every 0 -q \
      --report "$name.json" "$@" >"$name.out" 2>&1
  fi
  rc=$?
  [ $rc = 0 ] || { fail "$name: exit $rc"; sed 's/^/    /' "$name.out" | head -n 20; }
}

# The report's per-step losses, one per line (null for a skipped step).
losses() {
  awk '/^  "loss": \[/ {on = 1; next} on && /^  \]/ {on = 0} on {
         gsub(/[ ,]+/, "\n"); printf "%s", $0 "\n" }' "$1" | grep -v '^$'
}

# same NAME A B [FROM]: A's and B's losses (from step FROM on) agree within TOL relative.
same() {
  what=$1 a=$2 b=$3 from=${4:-1}
  [ -s "$a" ] && [ -s "$b" ] || { fail "$what: a report is missing"; return; }
  losses "$a" | tail -n +"$from" >"$tmp/la"
  losses "$b" >"$tmp/lb"
  r=$(paste -d' ' "$tmp/la" "$tmp/lb" | awk -v tol=$TOL '
      { n++; if ($1 == "null" || $2 == "null") { if ($1 != $2) bad = 1; next }
        d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; r = d / (s > 0 ? s : 1);
        if (r > max) max = r }
      END { if (n == 0) bad = 1; printf "%d %.3g %s\n", n, max, (bad || max > tol) ? "no" : "yes" }')
  set -- $r
  if [ "$3" = yes ]; then pass "$what: $1 steps, largest relative difference $2"
  else fail "$what: $1 steps, largest relative difference $2 (tolerance $TOL)"; fi
}

# The held-out loss, which the ranks compute on their shares of every held-out batch.
eval_loss() {
  awk '/"eval": \{/ { on = 1 } on && $1 == "\"loss\":" { sub(/,$/, "", $2); print $2; exit }' "$1"
}
same_eval() {
  what=$1 a=$(eval_loss "$2") b=$(eval_loss "$3")
  if awk -v a="$a" -v b="$b" -v t=$TOL 'BEGIN { d = a - b; if (d < 0) d = -d;
       exit !(a != "" && b != "" && d <= t * (b < 0 ? -b : b)) }'
  then pass "$what: held-out loss $a against $b"
  else fail "$what: held-out loss $a against $b"; fi
}

echo "== distributed training on CPU ranks (OpenMPI), gem_tiny, $STEPS steps"
train one 1
train dp2 2
train dp4 4
same "2 ranks = 1 rank" dp2.json one.json
same "4 ranks = 1 rank" dp4.json one.json
same_eval "4 ranks evaluate as 1 rank" dp4.json one.json

train buckets2 2 --bucket-mb 0.01
if grep -q '"buckets": [2-9]' buckets2.json; then same "2 ranks, 6 small buckets = 1 rank" buckets2.json one.json
else fail "--bucket-mb 0.01 gave one bucket"; fi

train zero1 2 --dense zero1
train zero2 4 --dense zero2
same "ZeRO-1 = data parallel (2 ranks)" zero1.json dp2.json
same "ZeRO-2 = data parallel (4 ranks)" zero2.json dp4.json
# ZeRO-3 reduces and updates as ZeRO-2 does, whatever the buckets: the same bits. Its ranks
# hold a part of each parameter and gather it for the nodes that read it.
train zero3 4 --dense zero3 --bucket-mb 0.01
if [ -s zero3.json ] && losses zero3.json >z3.l && losses zero2.json >z2.l && cmp -s z3.l z2.l
then pass "ZeRO-3 = ZeRO-2 bit for bit (4 ranks, $(wc -l <z3.l) steps)"
else fail "ZeRO-3's losses are not ZeRO-2's bits"; fi
same_eval "ZeRO-3 evaluates as 1 rank (4 ranks)" zero3.json one.json
# The bus bandwidth is counted for the collective that ran: (n-1)/n of the bytes for ZeRO-2/3's
# reduce-scatter, 2 (n-1)/n for an all-reduce.
if grep -q '"dense_collective": "reduce-scatter"' zero3.json &&
   grep -q '"dense_collective": "reduce-scatter"' zero2.json &&
   grep -q '"dense_collective": "all-reduce"' dp4.json &&
   grep -q '"dense_collective": "all-reduce"' zero1.json
then pass "the report names the dense collective: reduce-scatter under ZeRO-2/3, else all-reduce"
else fail "dense_collective: $(grep -ho '"dense_collective": "[^"]*"' zero3.json zero2.json dp4.json zero1.json | tr '\n' ' ')"; fi

train row2 2 --shard row
train table2 2 --shard table
train mixed4 4 --shard items=row,ads=table --dense zero2 --bucket-mb 0.01
same "row-wise tables = replicated (2 ranks)" row2.json dp2.json
same "table-wise tables = replicated (2 ranks)" table2.json dp2.json
same "row + table-wise tables, ZeRO-2, buckets = 1 rank (4 ranks)" mixed4.json one.json
same_eval "sharded tables evaluate as 1 rank (4 ranks)" mixed4.json one.json
# The synthetic data's teacher scores the held-out examples from their ids, which a windowed
# table's rows must not replace.
ta=$(grep -o '"teacher_ne": [^,}]*' mixed4.json | head -n 1) tb=$(grep -o '"teacher_ne": [^,}]*' one.json | head -n 1)
if [ -n "$ta" ] && [ "$ta" = "$tb" ]; then pass "sharded tables leave the teacher's held-out NE as 1 rank's ($ta)"
else fail "the teacher's held-out NE: '$ta' on 4 sharded ranks, '$tb' on 1 rank"; fi
grep -q 'items: 1000 x 32, row-wise over 4 ranks' mixed4.json &&
  grep -q 'ads: 1000 x 32, table-wise, on rank' mixed4.json &&
  pass "the placement is reported" || fail "mixed4.json does not report the placement"

# The divergence guard: steps 5 and 6 have a NaN loss on every rank; skip them together.
GEMC_TEST_NAN_STEPS=5:2 train nan1 1 --on-nan skip
GEMC_TEST_NAN_STEPS=5:2 train nan2 2 --on-nan skip
same "--on-nan skip: 2 ranks skip the steps 1 rank skips" nan2.json nan1.json
GEMC_TEST_NAN_STEPS=5 "$gemc" launch -n 2 train "$model" --backend cpu --steps 20 -q \
  >nanstop.out 2>&1
rc=$?
if [ $rc != 0 ] && grep -q "rank 0: error: training diverged at step 5" nanstop.out &&
   grep -q "rank 1: error: training diverged at step 5" nanstop.out; then
  pass "--on-nan stop: both ranks stop at step 5 (exit $rc)"
else fail "--on-nan stop: exit $rc"; sed 's/^/    /' nanstop.out | head -n 10; fi

# Gradients that overflow (a huge learning rate): ZeRO-3 releases a gradient once its bucket
# has packed it, and counts its non-finite values then, so the guard names the same tensor
# and counts as under ZeRO-2.
for d in zero2 zero3; do
  "$gemc" launch -n 2 train "$model" --backend cpu --steps 30 -q --dense $d --lr 1e6 --beta1 0 \
    --on-nan skip=3 >"inf_$d.out" 2>&1
done
g2=$(grep -m1 "rank 0: error: training diverged" inf_zero2.out)
g3=$(grep -m1 "rank 0: error: training diverged" inf_zero3.out)
if [ -n "$g2" ] && [ "$g2" = "$g3" ]
then pass "non-finite gradients: ZeRO-3's guard says what ZeRO-2's does ($(echo "$g3" | grep -o 'grad:[^ ]* holds [0-9]* NaN'))"
else fail "non-finite gradients: ZeRO-2 '$g2', ZeRO-3 '$g3'"; fi

# Resharding: 2 ranks save at step 25, 1 rank resumes; 1 rank saves, 4 ranks resume.
STEPS=25
train half2 2 --save ck2
train half1 1 --save ck1
train rest1 1 --resume ck2
train rest4 4 --resume ck1
same "2 ranks save, 1 resumes = a straight run" rest1.json one.json
same "1 rank saves, 4 resume = a straight run" rest4.json one.json
train halfz 2 --save ckz --dense zero2 --shard row
train restz 1 --resume ckz
same "ZeRO-2 + row-wise shards save, 1 rank resumes = a straight run" restz.json one.json
# Each ZeRO rank holds only its parts' moments; 2 ranks' parts resumed as 4 ranks' (other
# cuts of every bucket), and 1 rank's whole state cut into 4.
train restz4 4 --resume ckz --dense zero1
train restz14 4 --resume ck1 --dense zero2
same "ZeRO-2 on 2 ranks saves, ZeRO-1 on 4 resumes = a straight run" restz4.json one.json
same "1 rank saves, ZeRO-2 on 4 resumes = a straight run" restz14.json one.json
# ZeRO-3 saves every rank's part of the values; they resume on 1 rank, as 4 ZeRO-3 ranks'
# parts, and a whole checkpoint resumes as ZeRO-3 parts.
train halfz3 2 --save ckz3 --dense zero3
train restz3 1 --resume ckz3
train restz34 4 --resume ckz3 --dense zero3 --shard row
train restz13 4 --resume ck1 --dense zero3
same "ZeRO-3 on 2 ranks saves, 1 rank resumes = a straight run" restz3.json one.json
same "ZeRO-3 on 2 ranks saves, ZeRO-3 on 4 resumes = a straight run" restz34.json one.json
same "1 rank saves, ZeRO-3 on 4 resumes = a straight run" restz13.json one.json
# Tables that share an id feature share one window: gem_tiny where items also reads `ad`, and
# ads (3000 rows) a second feature ad2 whose ids items has no rows for. Sharded, both hold
# their own rows only and equal 1 rank; with ads replicated, items still does (ads then owns
# all its rows on every rank and fills its window from them), saves, and resumes on 1 rank.
STEPS=30
sed -e 's/^  sparse ad       : id;.*/&\n  sparse ad2      : id;/' \
    -e 's/^  table ads   : rows 1000;/  table ads   : rows 3000;/' \
    -e 's/^  a = embed(ads, ad);/  a = embed(ads, ad) + embed(items, ad) + embed(ads, ad2);/' \
    "$model" >shared.gem
model_saved=$model
model=$PWD/shared.gem
train shared1 1
train shared2 2 --shard row
train shared4 4 --shard items=table,ads=row
train shared_rep 2 --shard items=row
same "tables sharing an id feature, row-wise, windowed together (2 ranks) = 1 rank" shared2.json shared1.json
same "tables sharing an id feature, table- and row-wise (4 ranks) = 1 rank" shared4.json shared1.json
same "tables sharing an id feature, one replicated (2 ranks) = 1 rank" shared_rep.json shared1.json
if grep -q 'items: 1000 x 32, table-wise, on rank [0-3] only' shared4.json &&
   grep -q 'ads: 3000 x 32, row-wise over 4 ranks, each holding its rows only' shared4.json &&
   grep -q 'items: 1000 x 32, row-wise over 2 ranks, each holding its rows only' shared_rep.json
then pass "tables sharing a feature hold their own rows only, also beside a replicated one"
else fail "the placement of tables sharing a feature: $(grep -o '"tables": .*' shared4.json shared_rep.json)"; fi
STEPS=15
train shared_half 2 --shard items=row --save ckshared
train shared_rest 1 --resume ckshared
same "tables sharing a feature, one replicated, save on 2 ranks and resume on 1 = 1 rank" \
  shared_rest.json shared1.json
model=$model_saved
STEPS=25
# Windowed tables (each rank holds its own rows) resumed under another world and placement:
# row-wise parts of 2 ranks into 4 ranks' table-wise and row-wise rows.
train restw4 4 --resume ckz --shard items=table,ads=row
same "row-wise shards of 2 ranks resume as 4 ranks' table- and row-wise ones" restw4.json one.json

# The set's files: each rank's shard and the manifest, and nothing they replace.
if [ "$(ls ck2 | grep -v lock | sed 's/-[0-9a-f]\{16\}-/-ID-/' | sort | tr '\n' ' ')" = \
     "manifest.gemc shard-25-ID-0-of-2.gemc shard-25-ID-1-of-2.gemc " ]
then pass "2 ranks write a shard each and a manifest"
else fail "the files of a 2-rank checkpoint: $(ls ck2 | tr '\n' ' ')"; fi
# A set missing a shard, or its manifest, is refused; one whose save stopped before the
# manifest leaves the set before it in force.
cp -r ck2 ckmiss && rm ckmiss/shard-25-*-1-of-2.gemc
"$gemc" train "$model" --backend cpu --steps 1 -q --resume ckmiss >miss.out 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "is missing shard-25-[0-9a-f]*-1-of-2.gemc: refused" miss.out
then pass "a set missing a shard is refused"; else fail "a set missing a shard: exit $rc"; cat miss.out; fi
cp -r ck2 cknoman && rm cknoman/manifest.gemc
"$gemc" train "$model" --backend cpu --steps 1 -q --resume cknoman >noman.out 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "holds shards of a distributed checkpoint but no manifest.gemc" noman.out
then pass "shards without a manifest are refused"; else fail "no manifest: exit $rc"; cat noman.out; fi
cp -r ck2 ckcrash
GEMC_TEST_CKPT_NO_MANIFEST=1 train crash 2 --resume ckcrash --save ckcrash
ls ckcrash/shard-50-*-1-of-2.gemc >/dev/null 2>&1 || fail "the unfinished save left no step-50 shard"
train after_crash 1 --resume ckcrash
same "a save stopped before its manifest: the step-25 set stays in force" after_crash.json one.json
# Two saves at the same step: the second (another seed) stops before its manifest. The shards
# carry the save's id, so the first set is untouched and still in force.
train same1 2 --save cksame
GEMC_TEST_CKPT_NO_MANIFEST=1 train same2 2 --save cksame --seed 2
train same_rest 1 --resume cksame
same "a second save at the same step, stopped before its manifest, leaves the first in force" \
  same_rest.json one.json
train single_over 1 --resume ck2 --save ck2
if [ "$(ls ck2 | grep -v lock | tr '\n' ' ')" = "checkpoint.gemc " ]
then pass "a 1-rank save replaces the set it resumed from"
else fail "after a 1-rank save: $(ls ck2 | tr '\n' ' ')"; fi

# The model's own parallel block and table placements: gem_tiny with ZeRO-2, items row-wise and
# ads table-wise declared in the source. The placement is not part of the model's key, so the
# 1-rank checkpoint of plain gem_tiny resumes under it (the additions keep every line where it
# was: the key holds the source locations).
STEPS=50
sed -e 's/^  precision fp32;/  precision fp32; parallel { dense zero2; bucket_mb 1; }/' \
    -e 's/^\(  table items .*\);/\1, shard row;/' -e 's/^\(  table ads .*\);/\1, shard table;/' \
    "$model" >declared.gem
model_saved=$model
model=$PWD/declared.gem
train declared 2
STEPS=25
train declared_rest 2 --resume ck1
model=$model_saved
if grep -q '"dense": "zero2"' declared.json && grep -q 'items: 1000 x 32, row-wise' declared.json &&
   grep -q 'ads: 1000 x 32, table-wise' declared.json
then pass "parallel { dense zero2; } and shard attributes are what the run used"
else fail "the declared placement was not used"; grep -A14 '"distributed"' declared.json; fi
same "declared ZeRO-2 and shards (2 ranks) = 1 rank" declared.json one.json
same "a plain checkpoint resumes under the declared placement" declared_rest.json one.json

# refused_for_memory NAME BYTES MIB WHAT: 2 ranks of $model (data parallel, tables replicated)
# on a machine of BYTES (MIB MiB) are refused before anything is allocated.
refused_for_memory() {
  GEMC_TEST_MEMORY_AVAILABLE=$2 "$gemc" launch -n 2 train "$model" --backend cpu \
    --steps $STEPS -q >"$1.out" 2>&1
  rc=$?
  if [ $rc = 1 ] && grep -q "error: the model needs .* of memory on the CPU.*this machine has $3 MiB" "$1.out"
  then pass "$4: refused (exit $rc)"
  else fail "$4: exit $rc"; sed 's/^/    /' "$1.out" | head -n 6; fi
}
# peak_below REPORT MIB WHAT WHOSE: the largest peak resident memory of a rank is below MIB.
peak_below() {
  rss=$(awk -F': ' '/"max_rss_mib"/ { sub(/,$/, "", $2); print $2 }' "$1")
  if [ -n "$rss" ] && awk -v r="$rss" -v m="$2" 'BEGIN { exit !(r > 0 && r < m) }'
  then pass "$3, ${rss} MiB, is below $4 $2 MiB"
  else fail "$3: '${rss}' MiB ($4 is $2 MiB)"; fi
}

# A table larger than the memory (GEMC_TEST_MEMORY_AVAILABLE stands for the machine's): 3M
# rows of 32 fp32 values are 366 MiB, and the machine is given 300 MiB. Replicated on each of 2
# ranks it is refused before anything is allocated; row-wise over 2 ranks each holds 183 MiB
# of it, trains, and computes what 1 rank with the whole table computes.
STEPS=10
sed -e 's/^  table items : rows 1000,/  table items : rows 3_000_000,/' "$model" >big.gem
model_saved=$model
model=$PWD/big.gem
train big1 1
refused_for_memory bigrep 314572800 300.0 "a table larger than the memory, replicated"
GEMC_TEST_MEMORY_AVAILABLE=314572800 train bigrow 2 --shard items=row
same "the same table row-wise over 2 ranks trains = 1 rank" bigrow.json big1.json
peak_below bigrow.json 366 "a rank's peak memory" "the whole table's"

# Dense parameters larger than the memory: gem_tiny with a 6-layer MLP of width 2048 has 21.4M
# parameters (82 MiB; with gradients and AdamW moments 328 MiB). Given 280 MiB, data parallel
# is refused; ZeRO-3 over 2 ranks holds half of the values and moments, gathers a layer at a
# time, trains, and computes what 1 rank computes.
STEPS=5
sed -e 's/y = mlp(z, \[64, 1\], act = relu);/y = mlp(z, [2048, 2048, 2048, 2048, 2048, 2048, 1], act = relu);/' \
  "$model_saved" >dense.gem
model=$PWD/dense.gem
train dense1 1
refused_for_memory densedp 293601280 280.0 \
  "dense parameters larger than the memory, data parallel"
GEMC_TEST_MEMORY_AVAILABLE=293601280 train densez3 2 --dense zero3 --bucket-mb 4
same "the same model, ZeRO-3 over 2 ranks, trains = 1 rank" densez3.json dense1.json
peak_below densez3.json 328 "a ZeRO-3 rank's peak memory" "the whole dense state's"
model=$model_saved
STEPS=50

# Faults.
start=$(date +%s)
GEMC_TEST_COMM_STALL=1:5 "$gemc" launch -n 2 train "$model" --backend cpu --steps 20 -q \
  --comm-timeout 2 >stall.out 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc != 0 ] && [ $took -le 30 ] &&
   grep -q "rank 0: error: the all-reduce of the loss (step 5) did not finish within 2 s" stall.out
then pass "a stalled rank: rank 0 aborts the job after the 2 s timeout (exit $rc, ${took} s)"
else fail "a stalled rank: exit $rc after ${took} s"; sed 's/^/    /' stall.out | head -n 10; fi

start=$(date +%s)
GEMC_TEST_COMM_DIE=1:5 "$gemc" launch -n 2 train "$model" --backend cpu --steps 20 -q \
  --comm-timeout 5 >die.out 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc != 0 ] && [ $took -le 30 ]; then
  pass "a killed rank: the job ends, exit $rc, in ${took} s"
else fail "a killed rank: exit $rc after ${took} s"; sed 's/^/    /' die.out | head -n 10; fi

# An error on one rank alone (rank 0 cannot write its report) ends the job at once, not after
# the other ranks' --comm-timeout.
start=$(date +%s)
"$gemc" launch -n 2 train "$model" --backend cpu --steps 20 -q --comm-timeout 60 \
  --report "$tmp/no/such/dir/r.json" >alone.out 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc != 0 ] && [ $took -le 20 ] && grep -q "rank 0: error\|gemc: error" alone.out &&
   grep -q "r.json" alone.out
then pass "one rank's own error ends the job in ${took} s (exit $rc), not after the 60 s timeout"
else fail "one rank's error: exit $rc after ${took} s"; sed 's/^/    /' alone.out | head -n 8; fi

# gemc launch --via env: torchrun's variables, and the failed rank's exit code.
"$gemc" launch -n 3 -- sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR:$MASTER_PORT"' \
  2>&1 | sort >env.out
printf '%s\n' "0 3 0 127.0.0.1:29500" "1 3 1 127.0.0.1:29500" "2 3 2 127.0.0.1:29500" >env.want
if cmp -s env.out env.want; then pass "gemc launch sets torchrun's variables"
else fail "gemc launch's variables:"; cat env.out; fi
start=$(date +%s)
"$gemc" launch -n 3 -- sh -c '[ "$RANK" = 2 ] && exit 7; sleep 60' >code.out 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc = 7 ] && [ $took -le 20 ]; then pass "gemc launch returns rank 2's exit code 7 and stops the others (${took} s)"
else fail "gemc launch returned $rc after ${took} s"; cat code.out; fi

# Launcher conventions set by hand, beside the launchers themselves.
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "$gemc" train "$model" --backend cpu --steps 2 -q >torchrun.out 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "started by torchrun's variables, but the CPU executor's ranks meet through OpenMPI" torchrun.out
then pass "torchrun's variables on the cpu backend: refused with the reason"
else fail "torchrun's variables: exit $rc"; cat torchrun.out; fi
SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_JOB_NODELIST='node[07-08]' "$gemc" train "$model" \
  --backend cpu --steps 2 -q >slurm.out 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "rank 1: error: the launcher says rank 1 of 2, but MPI says rank 0 of 1" slurm.out
then pass "Slurm's variables without srun's PMIx: refused, naming both worlds"
else fail "Slurm's variables: exit $rc"; cat slurm.out; fi
mpirun -n 2 --oversubscribe --bind-to none "$gemc" train "$model" --backend cpu --steps 10 \
  --eval-every 0 >mpirun.out 2>&1
rc=$?
if [ $rc = 0 ] && [ "$(grep -c 'Local MFU' mpirun.out)" = 1 ] &&
   grep -q "Scaling Ratio" mpirun.out && grep -q "E2E MFU" mpirun.out
then pass "mpirun itself: OpenMPI's variables; rank 0 alone prints Local MFU, Scaling Ratio, E2E MFU"
else fail "mpirun: exit $rc"; sed 's/^/    /' mpirun.out | tail -n 12; fi

echo
if [ $fails -gt 0 ]; then
  echo "dist: $fails FAILED"
  exit 1
fi
echo "dist: all passed"
