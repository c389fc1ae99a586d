#!/bin/sh
# tests/bench/bench_frontend.sh: times the front end on generated models.
#   bench_frontend.sh GEMC MODEL.gem...
# For each model, the best of 3 runs of `gemc check` and of `gemc ir >/dev/null`, in
# milliseconds, as a Markdown table. The goal is 1000 ms for a 10,000-layer model.
# `make bench-frontend` generates the models with gen_big_model and runs this.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: bench_frontend.sh GEMC MODEL.gem..." >&2
  exit 2
fi
gemc=$1
shift
goal_ms=1000
runs=3

now_ns() { date +%s%N; }

# best_ms CMD...: the fastest of $runs runs, in ms. A failing run stops the benchmark.
best_ms() {
  best=""
  i=0
  while [ $i -lt $runs ]; do
    start=$(now_ns)
    if ! "$@" >/dev/null 2>&1; then
      echo "bench: '$*' failed:" >&2
      "$@" 2>&1 >/dev/null | head -n 20 >&2
      exit 1
    fi
    ms=$(( ($(now_ns) - start) / 1000000 ))
    if [ -z "$best" ] || [ "$ms" -lt "$best" ]; then best=$ms; fi
    i=$((i + 1))
  done
  echo "$best"
}

echo "| layers | lines | check ms | ir ms | goal ms |"
echo "|---:|---:|---:|---:|---:|"
for model in "$@"; do
  layers=$(sed -n '1s/.*: \([0-9]*\) layers$/\1/p' "$model")
  lines=$(wc -l <"$model" | tr -d ' ')
  check=$(best_ms "$gemc" check "$model")
  ir=$(best_ms "$gemc" ir "$model")
  goal="-"  # the goal is set for 10,000 layers only
  if [ "${layers:-0}" = 10000 ]; then
    if [ "$ir" -le $goal_ms ] && [ "$check" -le $goal_ms ]; then goal="$goal_ms (met)"
    else goal="$goal_ms (MISSED)"; fi
  fi
  echo "| ${layers:-?} | $lines | $check | $ir | $goal |"
done
