#!/bin/sh
# ab_revs.sh BASE NEW... [-- GDPA_AB_OPTIONS]: each NEW gemc against BASE on the same GDPA
# batches, one gdpa_ab.sh table each, in one call on the GPU machine (build the candidates with
# build_revs.sh, e.g. BASE build/gemc and NEW build/revs/*/gemc). Options after -- go to every
# gdpa_ab.sh (--rounds, --reps, --cells; each comparison writes under --out DIR/NAME, default
# $OUT or /tmp/ab_revs). Exits with the number of comparisons that failed, 2 on bad arguments.
set -u
[ $# -ge 2 ] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
base=$1
shift
news=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do news="$news $1"; shift; done
[ $# -gt 0 ] && shift  # the --
out=${OUT:-/tmp/ab_revs} opts=""
while [ $# -gt 0 ]; do
  case $1 in
  --out) [ $# -ge 2 ] || { echo "ab_revs: --out needs a value" >&2; exit 2; }; out=$2; shift 2 ;;
  *) opts="$opts $1"; shift ;;
  esac
done
[ -n "$news" ] || { echo "ab_revs: no NEW build" >&2; exit 2; }
failed=0
for new in $news; do
  name=$(echo "$new" | sed 's|/gemc$||; s|.*/||')
  echo "=== $name: $new against $base"
  # shellcheck disable=SC2086
  sh "$(dirname "$0")/gdpa_ab.sh" "$base" "$new" --out "$out/$name" $opts
  rc=$?
  [ $rc = 2 ] && exit 2
  [ $rc = 0 ] || failed=$((failed + 1))
done
exit $failed
