#!/bin/sh
# tests/unit/run.sh: runs the unit test programs, JOBS at a time (default: the cores), and
# prints each one's whole output in the order given, so a failure reads as in a serial run.
# Exits 1 when any failed, naming them.
#
#   tests/unit/run.sh TEST...
set -u
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
dir=$(mktemp -d) || exit 2
trap 'rm -rf "$dir"' EXIT INT TERM
i=0
for t in "$@"; do
  i=$((i + 1))
  printf '%s %s\n' "$i" "$t"
done | xargs -P "$jobs" -n 2 sh -c '"$2" >"$0/$1.log" 2>&1; echo $? >"$0/$1.rc"' "$dir"
i=0 failed=""
for t in "$@"; do
  i=$((i + 1))
  echo "== $t"
  cat "$dir/$i.log"
  [ "$(cat "$dir/$i.rc" 2>/dev/null)" = 0 ] || failed="$failed $t"
done
if [ -n "$failed" ]; then
  echo "unit: FAILED:$failed"
  exit 1
fi
