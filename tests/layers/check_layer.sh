#!/bin/sh
# tests/layers/check_layer.sh LAYER "CC FLAGS" VISIBLE... -- HIDDEN...
# One layer's include path, as the Makefile compiles it (`make test-layers` runs this for each
# layer): every header of LAYER and of the layers it may use must be found, and no header of any
# other layer may be. The compiler itself answers, through __has_include.
layer=$1; cc=$2; shift 2
probe=$(mktemp /tmp/gemc_layer.XXXXXX.c)
trap 'rm -f "$probe"' EXIT
{
  echo "// probe for $layer"
  for h in "$@"; do
    if [ "$h" = "--" ]; then hidden=1; continue; fi
    n=$(basename "$h")
    if [ -n "$hidden" ]; then
      echo "#if __has_include(\"$n\")"; echo "#error $layer sees $h, a header of a layer it may not use"
    else
      echo "#if !__has_include(\"$n\")"; echo "#error $layer cannot see $h"
    fi
    echo "#endif"
  done
  echo "int gemc_layer_probe;"
} >"$probe"
if out=$($cc -fsyntax-only "$probe" 2>&1); then
  echo "ok $layer"
  exit 0
fi
echo "$out" | grep -o "error: .*" | sed "s/^/layers: /"
exit 1
