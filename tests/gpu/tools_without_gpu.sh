#!/bin/sh
# tools_without_gpu.sh: the GPU machine's helper scripts (tests/gpu/*.sh) checked on a machine
# without a GPU, so that a broken script fails CI instead of a device call: every script parses
# (bash -n); gdpa_draw.sh draws each public cell by its definition; gdpa_ab.sh, run over a
# stand-in gemc that prints bench rows, tabulates every run of both builds per cell, exits 1 when
# a build fails and 2 on a bad option; gdpa_vs_triton.sh keeps Triton's cache between runs;
# run.sh's parts split make test-gpu without losing or repeating a step.
# Exit status: the number of failed checks.
cd "$(dirname "$0")/../.." || exit 2
failed=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
dir=$(mktemp -d) || exit 2
trap 'rm -rf "$dir"' EXIT INT TERM

for s in tests/gpu/*.sh; do
  if bash -n "$s" 2>"$dir/syntax"; then ok "$s parses"; else bad "$s: $(cat "$dir/syntax")"; fi
done

# gdpa_draw.sh: 1152 lines after the comment, each by its cell's definition.
check_draw() {  # CELL AWK-CONDITION-ON-$1-$2 WHAT
  if ! sh tests/gpu/gdpa_draw.sh "$1" "$dir/draw.txt"; then bad "gdpa_draw.sh $1 failed"; return; fi
  n=$(grep -vc '^#' "$dir/draw.txt")
  off=$(awk '!/^#/ && !('"$2"')' "$dir/draw.txt" | wc -l)
  if [ "$n" = 1152 ] && [ "$off" = 0 ]; then ok "gdpa_draw.sh $1: $3"; else
    bad "gdpa_draw.sh $1: $n lines, $off not $3"; fi
}
check_draw self-s1.0-N2048 '$1 == 2048 && $2 == 2048' "lq = lk = N"
check_draw self-s0.5-N1024 '$1 >= 1 && $1 <= 1024 && $2 == 1024' "lq in [1, N], lk = N"
check_draw selfeq-s0.5-N512 '$1 >= 1 && $1 <= 512 && $1 == $2' "lq = lk in [1, N]"
check_draw cross-kv256-N1024 '$1 == 1024 && $2 == 256' "lq = N, lk = 256"
if sh tests/gpu/gdpa_draw.sh self-sX-N 2>/dev/null "$dir/x.txt"; then bad "gdpa_draw.sh took a cell without N"
else ok "gdpa_draw.sh refuses a cell without N"; fi

# gdpa_ab.sh over stand-ins: one prints a row per lengths file, one fails.
cat >"$dir/gemc_ok" <<'STUB'
#!/bin/sh
while [ $# -gt 0 ]; do
  [ "$1" = --lengths ] && echo "| $2 | 1152 | 100 | 1024 | 1024 | self | 400 / 200 | 1 / 2 | 1.0 -> 1.0 (lpt) |"
  shift
done
STUB
printf '#!/bin/sh\necho "gemc: error: no GPU" >&2\nexit 1\n' >"$dir/gemc_fail"
chmod +x "$dir/gemc_ok" "$dir/gemc_fail"
if sh tests/gpu/gdpa_ab.sh "$dir/gemc_ok" "$dir/gemc_ok" --rounds 3 --out "$dir/ab" >"$dir/ab.log" 2>&1; then
  rows=$(grep -c '^[a-z].*  \(old\|new\)  ' "$dir/ab.log")
  runs=$(awk '$2 == "old" || $2 == "new" { print NF - 2 }' "$dir/ab.log" | sort -u)
  # every run's entry is the stand-in's fwd / bwd TFLOP/s
  odd=$(awk '$2 == "old" || $2 == "new" { for (i = 3; i <= NF; i++) if ($i != "400/200") n++ }
             END { print n + 0 }' "$dir/ab.log")
  if [ "$rows" = 8 ] && [ "$runs" = 3 ] && [ "$odd" = 0 ]; then
    ok "gdpa_ab.sh: 4 cells x 2 builds, 3 runs each, every entry the build's fwd / bwd"
  else bad "gdpa_ab.sh: $rows rows, runs per row '$runs', $odd entries not 400/200"; cat "$dir/ab.log"; fi
else
  bad "gdpa_ab.sh failed over working stand-ins"; cat "$dir/ab.log"
fi
sh tests/gpu/gdpa_ab.sh "$dir/gemc_ok" "$dir/gemc_fail" --rounds 1 --out "$dir/ab2" >"$dir/ab2.log" 2>&1
if [ $? = 1 ] && grep -q 'new .* failed' "$dir/ab2.log"; then ok "gdpa_ab.sh: a failing build exits 1, named"
else bad "gdpa_ab.sh: a failing build"; cat "$dir/ab2.log"; fi
# --atomic-dq reaches both sides' bench: this stand-in prints its rows only when it sees it.
cat >"$dir/gemc_atomic" <<'STUB'
#!/bin/sh
case " $* " in *" --atomic-dq "*) ;; *) echo "no --atomic-dq" >&2; exit 1 ;; esac
while [ $# -gt 0 ]; do
  [ "$1" = --lengths ] && echo "| $2 | 1152 | 100 | 1024 | 1024 | self | 400 / 150 | 1 / 2 | 1.0 -> 1.0 (lpt) |"
  shift
done
STUB
chmod +x "$dir/gemc_atomic"
if sh tests/gpu/gdpa_ab.sh "$dir/gemc_atomic" "$dir/gemc_atomic" --rounds 1 --atomic-dq --out "$dir/ab3" \
     >"$dir/ab3.log" 2>&1 && [ "$(grep -c '400/150' "$dir/ab3.log")" = 8 ]; then
  ok "gdpa_ab.sh --atomic-dq: both sides bench with it"
else bad "gdpa_ab.sh --atomic-dq"; cat "$dir/ab3.log"; fi
sh tests/gpu/gdpa_ab.sh "$dir/gemc_ok" "$dir/gemc_ok" --rounds x >/dev/null 2>&1
if [ $? = 2 ]; then ok "gdpa_ab.sh: a bad option exits 2"; else bad "gdpa_ab.sh: --rounds x"; fi

# ab_revs.sh: one gdpa_ab.sh table per candidate, options passed through, failures counted.
mkdir -p "$dir/revs/a" "$dir/revs/b"
cp "$dir/gemc_ok" "$dir/revs/a/gemc" && cp "$dir/gemc_fail" "$dir/revs/b/gemc"
sh tests/gpu/ab_revs.sh "$dir/gemc_ok" "$dir/revs/a/gemc" "$dir/revs/b/gemc" -- --rounds 1 \
  --out "$dir/abr" >"$dir/abr.log" 2>&1
rc=$?
tables=$(grep -c '^fwd / bwd TFLOP/s' "$dir/abr.log")
if [ $rc = 1 ] && [ "$tables" = 2 ] && grep -q '^=== a: ' "$dir/abr.log" && [ -f "$dir/abr/b/ab.tsv" ]; then
  ok "ab_revs.sh: a table per candidate, the failing one counted"
else
  bad "ab_revs.sh: exit $rc, $tables tables"; cat "$dir/abr.log"
fi

# gdpa_vs_triton.sh --triton-cache over a stand-in peer (a python3 first on PATH that draws the
# batches, prints the peer's CSV rows and leaves one file in Triton's cache directory): the
# second run finds the first run's file unpacked, and the packed cache then holds both.
mkdir -p "$dir/bin" "$dir/peers/gdpa_standalone/ads_mkl/ops/oss/gdpa/triton"
: >"$dir/peers/peer_gdpa_public.py"
: >"$dir/peers/gdpa_standalone/ads_mkl/ops/oss/gdpa/triton/triton_generalized_dot_product_attention.py"
cat >"$dir/bin/python3" <<'STUB'
#!/bin/sh
[ "$1" = -c ] && exit 0
out="" cases=""
while [ $# -gt 0 ]; do
  case $1 in --out) out=$2; shift ;; --cases) cases=$2; shift ;; esac
  shift
done
[ "$TRITON_CACHE_AUTOTUNING" = 1 ] && [ -d "$TRITON_CACHE_DIR" ] || exit 3
touch "$TRITON_CACHE_DIR/entry-$(ls "$TRITON_CACHE_DIR" | wc -l)"
for c in $(echo "$cases" | tr , ' '); do
  sh tests/gpu/gdpa_draw.sh "$c" "$out/lengths-$c.txt" || exit 4
  echo "$c,$(awk '!/^#/ { s += $1 } END { print s }' "$out/lengths-$c.txt"),0,0,0,350,0,280"
done
STUB
printf '#!/bin/sh
[ "$1" = --version ] && { echo "gemc stand-in"; exit 0; }
exec "%s" "$@"
' \
  "$dir/gemc_ok" >"$dir/gemc_v"
chmod +x "$dir/bin/python3" "$dir/gemc_v"
for run in 1 2; do
  PATH="$dir/bin:$PATH" bash tests/gpu/gdpa_vs_triton.sh --gemc "$dir/gemc_v" --out "$dir/vs" \
    --peer-dir "$dir/peers" --ns 512 --cases cross-kv256 --triton-cache "$dir/tc.tgz" \
    >"$dir/vs$run.log" 2>&1
done
entries=$(tar -tzf "$dir/tc.tgz" 2>/dev/null | grep -c 'entry-')
if [ "$entries" = 2 ] && grep -q '1 files from' "$dir/vs2.log" &&
   grep -q '| cross-kv256-N512 | the peer.s |.* 350 / 280 |' "$dir/vs2.log"; then
  ok "gdpa_vs_triton.sh --triton-cache: the peer's cache survives between runs, the table has its row"
else
  bad "gdpa_vs_triton.sh --triton-cache: $entries entries packed"; cat "$dir/vs1.log" "$dir/vs2.log"
fi

# run.sh --part K/N: the parts of a split run are disjoint and together run every listed step
# (over an empty build: each step fails at once, which is all this needs).
steps=$(sh tests/gpu/run.sh "$dir/nobuild" --list | wc -l)
for k in 1 2 3; do
  sh tests/gpu/run.sh "$dir/nobuild" --part $k/3 2>/dev/null | sed -n 's/^== \[\([0-9]*\)\].*/\1/p'
done | sort -n >"$dir/ran"
if [ "$steps" -ge 20 ] && [ "$(sort -nu "$dir/ran" | wc -l)" = "$steps" ] &&
   [ "$(wc -l <"$dir/ran")" = "$steps" ]; then
  ok "run.sh --part: 3 parts run each of its $steps steps once"
else
  bad "run.sh --part: $steps steps listed, $(wc -l <"$dir/ran") run over 3 parts"
fi
if sh tests/gpu/run.sh "$dir/nobuild" --part 4/3 >/dev/null 2>&1; then bad "run.sh took --part 4/3"
else ok "run.sh refuses --part 4/3"; fi

[ $failed = 0 ] && echo "gpu tools: all passed" || echo "gpu tools: $failed failed"
exit $failed
