#!/bin/sh
# gdpa_draw.sh CELL FILE: one public GDPA batch as a lengths file (one "lq lk" pair a line), by
# Meta's definitions (docs/gdpa_bench.md) with awk's random numbers (seed 2025), not torch's:
#   self-s<s>-N<N>     lq ~ U[max(1,(2s-1)N), N], lk = N
#   selfeq-s<s>-N<N>   the same lq, lk = lq (jagged self)
#   cross-kv256-N<N>   lq = N, lk = 256
# B = 1152. Used by gdpa_vs_triton.sh (cells the peer did not write) and gdpa_ab.sh.
cell=$1
out=$2
[ -n "$cell" ] && [ -n "$out" ] || { echo "usage: gdpa_draw.sh CELL FILE" >&2; exit 2; }
n=${cell##*-N}
case $cell in
self-s*) kind=self; s=${cell#self-s}; s=${s%-N*} ;;
selfeq-s*) kind=selfeq; s=${cell#selfeq-s}; s=${s%-N*} ;;
cross-kv256-N*) kind=cross; s=1.0 ;;
*) echo "gdpa_draw: unknown cell '$cell' (self-sS-NN, selfeq-sS-NN or cross-kv256-NN)" >&2; exit 2 ;;
esac
case $n in
'' | *[!0-9]*) echo "gdpa_draw: '$cell' has no whole N" >&2; exit 2 ;;
esac
awk -v B=1152 -v N="$n" -v S="$s" -v K="$kind" 'BEGIN {
  srand(2025); lo = int((2 * S - 1) * N); if (lo < 1) lo = 1
  print "# " K " s=" S " N=" N ", B=" B ": drawn by gdpa_draw.sh (awk), not by the peer"
  for (b = 0; b < B; b++) {
    lq = lo + int(rand() * (N - lo + 1)); if (lq > N) lq = N
    if (K == "self") print lq, N; else if (K == "selfeq") print lq, lq; else print N, 256
  }
}' > "$out"
