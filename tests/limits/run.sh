#!/bin/sh
# tests/limits/run.sh: every count and size limit sema enforces, at the limit and one past it
# (issue 9: no valid model reaches an internal error; sizes are checked). At the limit,
# `gemc check` and `gemc emit` succeed (and NVRTC compiles the CUDA when libnvrtc loads);
# one past it, sema refuses the model with a file:line:col error and exit 1. Models too large
# for memory get exit 1 from `gemc train` with the bytes needed and available, never exit 3.
#   tests/limits/run.sh [GEMC]
set -u
cd "$(dirname "$0")/../.." || exit 2
gemc=${1:-build/gemc}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
failures=0
nvrtc=1
if "$gemc" emit tests/golden/codegen_small.gem --emit=ptx >/dev/null 2>"$tmp/probe"; then :;
elif grep -q "cannot load libnvrtc" "$tmp/probe"; then nvrtc=0; fi

bad() { echo "FAIL $*"; failures=$((failures + 1)); }

# ok NAME: check and emit succeed (and NVRTC compiles it for sm_90a when it loads).
ok() {
  m="$tmp/$1.gem"
  "$gemc" check "$m" 2>"$tmp/err" ||
    { bad "$1: check exit $?"; sed 's/^/    /' "$tmp/err"; return; }
  "$gemc" emit "$m" -o "$tmp/$1.out" 2>"$tmp/err" ||
    { bad "$1: emit exit $?"; sed 's/^/    /' "$tmp/err"; return; }
  if [ $nvrtc = 1 ]; then
    "$gemc" emit "$m" --arch sm_90a --emit=ptx >/dev/null 2>"$tmp/err" ||
      { bad "$1: NVRTC exit $?"; sed 's/^/    /' "$tmp/err" | head -n 20; return; }
  fi
  echo "ok   $1 (at the limit: check, emit$([ $nvrtc = 1 ] && echo ', NVRTC'))"
}

# refused NAME CMD TEXT: `gemc CMD` exits 1 with a file:line:col error containing TEXT.
refused() {
  m="$tmp/$1.gem"
  case $2 in
    build) "$gemc" build "$m" -o "$tmp/$1.gemb" >/dev/null 2>"$tmp/err" ;;
    emit) "$gemc" emit "$m" -o "$tmp/$1.$2" >/dev/null 2>"$tmp/err" ;;
    *) "$gemc" "$2" "$m" >/dev/null 2>"$tmp/err" ;;
  esac
  rc=$?
  if [ $rc != 1 ] || ! grep -q "^$m:[0-9]*:[0-9]*: error: .*$3" "$tmp/err"; then
    bad "$1: gemc $2 exit $rc, expected 1 and an error with '$3':"; sed 's/^/    /' "$tmp/err"
    return
  fi
  [ -e "$tmp/$1.gemb" ] && { bad "$1: gemc build left an artifact"; return; }
  echo "ok   $1 (gemc $2 refuses it: $(grep -m1 'error:' "$tmp/err" | sed 's/.*error: //'))"
}

# train_refused NAME TEXT: `gemc train` exits 1 with TEXT, before allocating.
train_refused() {
  "$gemc" train "$tmp/$1.gem" --steps 1 >/dev/null 2>"$tmp/err"
  rc=$?
  if [ $rc != 1 ] || ! grep -q "$2" "$tmp/err"; then
    bad "$1: gemc train exit $rc, expected 1 and '$2':"; sed 's/^/    /' "$tmp/err"; return
  fi
  echo "ok   $1 (gemc train refuses it: $(grep -m1 'error:' "$tmp/err" | sed 's/.*error: //'))"
}

# model NAME LOOKUPS PARTS ROWS DENSE_WIDTH BATCH [MLP]: a model whose table is looked up
# LOOKUPS times (ids ad0..), whose concat has PARTS parts (LOOKUPS + 1 + extra dense copies).
model() {
  name=$1 lookups=$2 parts=$3 rows=$4 width=$5 batch=$6 mlp=${7:-1}
  {
    echo "model $name {"
    echo "  batch $batch;"
    echo "  dim 8;"
    echo "  precision fp32;"
    i=0; while [ $i -lt "$lookups" ]; do echo "  sparse ad$i : id;"; i=$((i + 1)); done
    echo "  dense x : f32[$width];"
    echo "  label click;"
    echo "  table t : rows $rows;"
    i=0; while [ $i -lt "$lookups" ]; do echo "  e$i = embed(t, ad$i);"; i=$((i + 1)); done
    list=""
    i=0; while [ $i -lt "$lookups" ] && [ $i -lt "$((parts - 1))" ]; do
      list="$list e$i,"; i=$((i + 1))
    done
    while [ $i -lt "$((parts - 1))" ]; do list="$list e0,"; i=$((i + 1)); done
    echo "  z = concat($list x);"
    echo "  y = mlp(z, [$mlp], act = relu);"
    echo "  loss bce(y, click);"
    echo "}"
  } >"$tmp/$name.gem"
}

# Lookups of one table: IR_MAX_TABLE_LOOKUPS (15); one table_grad kernel takes them all.
model lookups_15 15 15 1000 4 64; ok lookups_15
model lookups_9 9 9 1000 4 64; ok lookups_9
model lookups_16 16 16 1000 4 64; refused lookups_16 check "at most 15 lookups"
# Parts of one concat (and of every variadic op): 16.
model concat_16 2 16 1000 4 64; ok concat_16
model concat_17 2 17 1000 4 64; refused concat_17 check "expects 2..16\|at most 16\|16"
# wide NAME WIDTH BATCH LAYERS: a dense input of WIDTH into an mlp of LAYERS.
wide() {
  printf 'model %s {\n  batch %s;\n  dim 8;\n  precision fp32;\n  dense x : f32[%s];\n' \
    "$1" "$3" "$2" >"$tmp/$1.gem"
  printf '  label click;\n  y = mlp(x, [%s], act = relu);\n  loss bce(y, click);\n}\n' "$4" \
    >>"$tmp/$1.gem"
}
# Widths and layer sizes: 2^31 - 1.
wide width_max 2147483647 1 1; ok width_max
wide width_over 2147483648 1 1; refused width_over check "width in 1..2147483647"
wide layer_max 1 1 "2147483647, 1"; ok layer_max
wide layer_over 1 1 "2147483648, 1"; refused layer_over check "sizes must be in 1..2147483647"
wide batch_over 1 2147483648 1; refused batch_over check "batch 2147483648 is too large"
# Rows of a table: 2^48 at most; rows x dim x 4 bytes must fit 64 bits.
model rows_2p48 1 2 281474976710656 4 8; ok rows_2p48
model rows_2p48_1 1 2 281474976710657 4 8; refused rows_2p48_1 check "at most 2^48"
model rows_2p63 1 2 9223372036854775807 4 8
refused rows_2p63 check "table 't': rows x dim x 4 bytes .* overflows 64 bits"
refused rows_2p63 emit "overflows 64 bits"
refused rows_2p63 build "overflows 64 bits"
model rows_2p62 1 2 4611686018427387904 4 8; refused rows_2p62 build "overflows 64 bits"
# One tensor at most 2^56 bytes; batch x width x 4 that overflows.
wide bytes_max 2147483647 8388608 1; ok bytes_max
wide bytes_over 2147483647 33554432 1; refused bytes_over check "at most 2^56 bytes"
wide bytes_overflow 2147483647 2147483647 1; refused bytes_overflow emit "overflows 64 bits"

# A head of at most 128 features on the GPU: sema takes any width (the CPU executor does), and
# codegen refuses a wider one by name, with the heads that would do.
for h in 1 2; do
  cat >"$tmp/head_$h.gem" <<EOF
model head_$h {
  batch 4;
  dim 256;
  precision bf16;
  seq hist : id max 40;
  label click;
  table items : rows 50;
  h = embed(items, hist);
  p = pma(h, seeds = 2, heads = $h);
  y = linear(flatten(p), 1);
  loss bce(y, click);
}
EOF
done
refused head_1 emit "a head of d / heads = 256 features .* use heads = 2 or more"
ok head_2

# Too large for memory: refused before allocating, exit 1, never 3.
model rows_2p40 1 2 1099511627776 4 64
train_refused rows_2p40 "needs .* of memory on the CPU .* available"
model mlp_1e5 1 2 1000 100000 64 "100000, 1"
avail=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo 2>/dev/null)
if [ -n "$avail" ] && [ "$avail" -gt 150000000 ]; then
  echo "skip mlp_1e5 (this machine has ${avail} kB available: a 100000x100000 MLP may fit)"
else
  train_refused mlp_1e5 "needs .* of memory on the CPU .* available"
fi

if [ $failures -gt 0 ]; then echo "limits: $failures FAILED"; exit 1; fi
echo "limits: all passed"
