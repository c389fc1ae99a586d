#!/bin/sh
# gdpa_ab.sh OLD NEW [--rounds R] [--reps N] [--cells C1,C2,...] [--out DIR] [--atomic-dq]:
# two gemc builds timed on the same GDPA batches in one call on the GPU machine, alternating
# OLD, NEW, NEW, OLD, ... for R rounds, so that a change is judged against its baseline on the
# same machine and clocks (docs/perf.md: a comparison counts only within one call). Each build runs
# `gemc bench gdpa --lengths` over the cells' lengths files (gdpa_draw.sh), and the table gives
# every run's fwd / bwd TFLOP/s per cell.
#   OLD, NEW   gemc binaries (build one from a worktree of the baseline commit)
#   --rounds   pairs of runs (default 2: OLD NEW NEW OLD)
#   --reps     timed runs per cell and run (default 5)
#   --cells    default self-s1.0-N2048,selfeq-s0.5-N512,self-s0.5-N1024,cross-kv256-N1024
#   --out      lengths files and logs (default $OUT, else /tmp/gdpa_ab)
#   --atomic-dq  both sides bench with `@schedule(deterministic = false)` (bench gdpa --atomic-dq)
# Exits 1 when a run failed (no GPU, say), else 0.
set -u
usage() { sed -n '2,/^# Exits/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
OLD=$1 NEW=$2
shift 2
ROUNDS=2 REPS=5 OUTDIR=${OUT:-/tmp/gdpa_ab} BENCH_OPTS=""
CELLS=self-s1.0-N2048,selfeq-s0.5-N512,self-s0.5-N1024,cross-kv256-N1024
while [ $# -gt 0 ]; do
  if [ "$1" = --atomic-dq ]; then BENCH_OPTS=--atomic-dq; shift; continue; fi
  [ $# -ge 2 ] || { echo "gdpa_ab: $1 needs a value" >&2; usage; }
  case $1 in
  --rounds) ROUNDS=$2 ;;
  --reps) REPS=$2 ;;
  --cells) CELLS=$2 ;;
  --out) OUTDIR=$2 ;;
  *) echo "gdpa_ab: unknown option $1" >&2; usage ;;
  esac
  shift 2
done
case $ROUNDS$REPS in *[!0-9]*) echo "gdpa_ab: --rounds and --reps take whole numbers" >&2; exit 2 ;; esac
for g in "$OLD" "$NEW"; do [ -x "$g" ] || { echo "gdpa_ab: $g is not an executable" >&2; exit 2; }; done
mkdir -p "$OUTDIR" || exit 2
ARGS=""
for c in $(echo "$CELLS" | tr ',' ' '); do
  sh "$(dirname "$0")/gdpa_draw.sh" "$c" "$OUTDIR/ab-$c.txt" || exit 2
  ARGS="$ARGS --lengths $OUTDIR/ab-$c.txt"
done
failed=0 r=0
: >"$OUTDIR/ab.tsv"
while [ $r -lt "$ROUNDS" ]; do
  if [ $((r % 2)) = 0 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    g=$OLD; [ $side = new ] && g=$NEW
    # shellcheck disable=SC2086
    if ! "$g" bench gdpa $BENCH_OPTS --reps "$REPS" $ARGS >"$OUTDIR/ab-$side-$r.log" 2>&1; then
      echo "gdpa_ab: $side ($g) failed:"; tail -3 "$OUTDIR/ab-$side-$r.log"; failed=1; continue
    fi
    # rows: | FILE | B | ... | fwd / bwd | ...: the file's cell and the TFLOP/s column
    awk -F'|' -v side=$side -v r=$r '$2 ~ /ab-.*\.txt/ {
      f = $2; sub(/.*ab-/, "", f); sub(/\.txt.*/, "", f); gsub(/ /, "", $8); print f "\t" side "\t" r "\t" $8
    }' "$OUTDIR/ab-$side-$r.log" >>"$OUTDIR/ab.tsv"
  done
  r=$((r + 1))
done
echo "fwd / bwd TFLOP/s, one column a run, in the order they ran (OLD = $OLD, NEW = $NEW)"
awk -F'\t' '{ key = $1 "\t" $2; if (!(key in row)) { order[n++] = key; row[key] = $4 } else row[key] = row[key] "  " $4 }
  END { for (i = 0; i < n; i++) { split(order[i], k, "\t"); printf "%-22s %-4s %s\n", k[1], k[2], row[order[i]] } }' \
  "$OUTDIR/ab.tsv" | sort -s -k1,1
exit $failed
