#!/bin/sh
# tests/golden/run.sh: the golden tests. Each tests/golden/NAME.gem comes with at least one
# expectation next to it:
#   NAME.ir   `gemc ir NAME.gem` exits 0 and prints exactly this on stdout
#   NAME.ast  `gemc ir --emit=ast NAME.gem` exits 0 and prints exactly this on stdout
#   NAME.grad `gemc ir --grad NAME.gem` exits 0 and prints exactly this on stdout (the forward
#             and backward graph, docs/autodiff.md)
#   NAME.err  `gemc check NAME.gem` prints exactly this on stderr, and exits 1 when it holds
#             an error (0 when it holds only warnings and notes)
#   NAME.cu   `gemc emit NAME.gem` exits 0 and prints exactly this CUDA C on stdout
#             (docs/codegen.md)
# Run from anywhere; paths are relative to the repository root so messages are stable.
#
#   tests/golden/run.sh [GEMC] [--update] [NAME...]
#     GEMC      the compiler to test (default build/gemc)
#     --update  rewrite the expectations from what gemc prints now, and create one for a
#               new NAME.gem (.err if check fails, else .grad for grad_*, else .ir); review
#               the diff!
#     NAME      run only these cases
set -u

gemc=""
update=0
only=""
for arg in "$@"; do
  case "$arg" in
    --update) update=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    /*) gemc=$arg ;;
    */*) gemc=$PWD/$arg ;;
    *) only="$only $arg" ;;
  esac
done
cd "$(dirname "$0")/../.." || exit 2
[ -n "$gemc" ] || gemc=$PWD/build/gemc
if [ ! -x "$gemc" ]; then
  echo "golden: no compiler at $gemc (run make first)" >&2
  exit 2
fi

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0
fail=0
failed=""

report() {  # report NAME KIND OK [DETAIL]
  if [ "$3" = 1 ]; then
    pass=$((pass + 1))
    echo "PASS $1 ($2)"
  else
    fail=$((fail + 1))
    failed="$failed $1.$2"
    echo "FAIL $1 ($2)${4:+: $4}"
  fi
}

# compare NAME KIND EXPECTED ACTUAL RC WANT_RC: one expectation against one run.
compare() {
  if [ "$update" = 1 ]; then
    if [ "$5" = "$6" ]; then
      cp "$4" "$3"
    else
      echo "golden: not updating $3: exit code $5, expected $6" >&2
    fi
  fi
  if [ "$5" != "$6" ]; then
    report "$1" "$2" 0 "exit code $5, expected $6"
    sed 's/^/    /' "$tmp/stderr" | head -n 20
  elif ! cmp -s "$3" "$4"; then
    report "$1" "$2" 0 "output differs"
    diff -u -L "$3" -L "gemc $2 output" "$3" "$4" | sed 's/^/    /' | head -n 60
  else
    report "$1" "$2" 1
  fi
}

for gem in tests/golden/*.gem; do
  [ -e "$gem" ] || continue  # no cases yet
  name=${gem%.gem}
  base=$(basename "$name")
  if [ -n "$only" ]; then
    case " $only " in *" $base "*) ;; *) continue ;; esac
  fi
  found=0
  if [ -f "$name.ir" ]; then
    found=1
    "$gemc" ir "$gem" >"$tmp/stdout" 2>"$tmp/stderr"
    compare "$base" ir "$name.ir" "$tmp/stdout" $? 0
  fi
  if [ -f "$name.ast" ]; then
    found=1
    "$gemc" ir --emit=ast "$gem" >"$tmp/stdout" 2>"$tmp/stderr"
    compare "$base" ast "$name.ast" "$tmp/stdout" $? 0
  fi
  if [ -f "$name.grad" ]; then
    found=1
    "$gemc" ir --grad "$gem" >"$tmp/stdout" 2>"$tmp/stderr"
    compare "$base" grad "$name.grad" "$tmp/stdout" $? 0
  fi
  if [ -f "$name.cu" ]; then
    found=1
    "$gemc" emit "$gem" >"$tmp/stdout" 2>"$tmp/stderr"
    compare "$base" cu "$name.cu" "$tmp/stdout" $? 0
  fi
  if [ -f "$name.err" ]; then
    found=1
    "$gemc" check "$gem" >"$tmp/stdout" 2>"$tmp/stderr"
    rc=$?
    cp "$tmp/stderr" "$tmp/actual_err"
    want=0
    grep -q ': error: ' "$name.err" && want=1
    compare "$base" err "$name.err" "$tmp/actual_err" $rc $want
  fi
  if [ "$found" = 0 ] && [ "$update" = 1 ]; then
    # A new case: an error case when check fails, an IR case when it passes.
    if "$gemc" check "$gem" >/dev/null 2>"$tmp/stderr"; then
      if [ -s "$tmp/stderr" ]; then
        cp "$tmp/stderr" "$name.err" && echo "golden: created $name.err (warnings)"
      elif [ "${base#codegen_}" != "$base" ]; then
        "$gemc" emit "$gem" >"$name.cu" 2>/dev/null && echo "golden: created $name.cu"
      elif [ "${base#grad_}" != "$base" ]; then
        "$gemc" ir --grad "$gem" >"$name.grad" 2>/dev/null && echo "golden: created $name.grad"
      else
        "$gemc" ir "$gem" >"$name.ir" 2>/dev/null && echo "golden: created $name.ir"
      fi
    elif [ $? = 1 ]; then
      cp "$tmp/stderr" "$name.err" && echo "golden: created $name.err"
    fi
  elif [ "$found" = 0 ]; then
    report "$base" gem 0 "no expectation: add $base.ir, $base.ast, $base.grad, $base.cu or $base.err"
  fi
done

# An expectation whose .gem is gone is a test that silently stopped running.
for exp in tests/golden/*.ir tests/golden/*.ast tests/golden/*.grad tests/golden/*.err tests/golden/*.cu; do
  [ -e "$exp" ] || continue
  if [ ! -f "${exp%.*}.gem" ]; then
    report "$(basename "${exp%.*}")" "${exp##*.}" 0 "expectation without ${exp%.*}.gem"
  fi
done

echo "golden: $pass passed, $fail failed"
if [ "$fail" -gt 0 ]; then
  echo "golden: failed:$failed"
  exit 1
fi
exit 0
