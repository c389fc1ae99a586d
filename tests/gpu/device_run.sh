#!/bin/bash
# device_run.sh BUILD OUT: one session on a GPU machine that lacks flex, bison and cmocka (the
# binaries come built from BUILD; if they do not run there, they are rebuilt with the C
# compiler from the sources and BUILD's generated scanner and parser). Runs the GPU tests, then
# trains the models on the cuda backend, and the AOT path; every log goes to OUT.
B=${1:-build}
OUT=${2:-/tmp/gpu-out}
mkdir -p "$OUT"
export GEMC_CACHE_DIR=/tmp/gemc-cache
if ! "$B/gemc" --version >/dev/null 2>&1; then
  echo "== the carried binaries do not run here; rebuilding"
  D=/tmp/devbuild; mkdir -p $D
  DIRS="$(find compiler grammar codegen runtime kernels -type d)"
  FL="-std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -O2 -g $(for d in $DIRS; do printf -- '-I%s ' $d; done) -I$B/grammar -Itests/gpu"
  SRCS="$(find $DIRS -maxdepth 1 -name '*.c' | grep -v driver/main.c) $B/gen/kernels_embedded.c $B/grammar/parser.tab.c $B/grammar/scanner.c"
  mkdir -p $D/tests/gpu
  cc $FL -o $D/gemc compiler/driver/main.c $SRCS -lm -ldl -pthread || exit 1
  cc $FL -o $D/tests/gpu/test_gpu_kernels tests/gpu/test_gpu_kernels.c $SRCS -lm -ldl -pthread || exit 1
  B=$D
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "== tests/gpu/run.sh"
tests/gpu/run.sh "$B" 2>&1 | tee "$OUT/test_gpu.log"
cp "$B/gpu-memcheck.log" "$OUT/" 2>/dev/null
train() {
  m=$1; name=$(basename $m .gem)
  echo "== gemc train $m --backend cuda"
  timeout ${TRAIN_TIMEOUT:-45} "$B/gemc" train $m --backend cuda --steps ${STEPS:-100} \
    --progress plain --eval-every 0 >"$OUT/train_$name.log" 2>&1
  echo "exit $?"
  grep -E "backend|kernels|throughput|MFU|error|note|eval \(|    [a-z]+ +NE" "$OUT/train_$name.log" | head -12
}
train models/gem_tiny.gem
train models/gem_small.gem
echo "== AOT: gemc build models/gem_small.gem, then train from it"
"$B/gemc" build models/gem_small.gem --arch sm_90a,sm_100a -o /tmp/small.gemb 2>&1 | grep -v note
"$B/gemc" train models/gem_small.gem --artifact /tmp/small.gemb --backend cuda --steps 20 \
  --progress plain 2>&1 | grep -E "backend|kernels|throughput|MFU|error"
echo "== the wrong artifact"
"$B/gemc" train models/hstu.gem --artifact /tmp/small.gemb --backend cuda --steps 2 2>&1 | tail -1
train models/hstu.gem
train models/gem_full.gem
